"""Fuzzing the MySQL sender's placing of a batch's transactions in C (``place_txns`` in
capturer/_native/causality.c, used by ``_Phases.place_txns``) against the Python path it replaces
(``MySQLSender._send``'s loop, ``_place_each`` over ``_Phases.place``: the specification).

Random batches of transactions (1 to 40 changes; inserts, updates, deletes; the key changing in some
updates) over random tables (int, composite, unique and non-ASCII string keys, a table without keys) with
key values from small domains, so that changes link causal groups (barriers) often, go through
``MySQLSender._send`` twice, once per path, with workers that record what they are handed: every
submission (the lane, its units, each Op's ident, change, target db and table, position, whether atomic,
and the lane's mark: phase, lane, manifest) and the counters (phases, barriers), the phase numbering and the
position must be the same. Phases of a few rows to many, 1-8 workers, with and without ``meta_database``
(the position's ``Placer`` numbering), with and without a target ``database``, batches started in the
middle of a transaction (``start``), a DDL (skipped) and a transaction for the Python path (its changes not
a plain tuple or list, as a spilled one's) now and then.
"""

from __future__ import annotations

import random
from concurrent.futures import Future
from typing import Any

import pytest

import senders.mysql.sender as ms
from capturer.model import Ddl, RowChange, TableSchema, Txn
from tests.unit.test_fuzz_causality import rand_str

pytestmark = pytest.mark.skipif(ms._place_txns is None, reason="capturer._fastrows not built, or without place_txns")


class Recorder:
    """A worker that applies nothing: it records what it is handed, in order."""

    def __init__(self, log: list[Any], lane: int):
        self.log, self.lane = log, lane

    def submit(self, units: list[list[ms.Op]], atomic: bool, mark: Any = None) -> Future[int]:
        got = [[(type(op), op.ident, id(op.ch), op.db, op.table, op.pos) for op in unit] for unit in units]
        m = None if mark is None else (mark.phase, mark.lane, mark.manifest)
        self.log.append((self.lane, got, atomic, m))
        f: Future[int] = Future()
        f.set_result(sum(len(u) for u in units))
        return f

    def close(self) -> None:
        pass


class Spilled(tuple):  # type: ignore[type-arg]
    """Changes that are not a plain tuple or list (as a spilled transaction's): the Python path places them."""


def schemas(rng: random.Random) -> list[TableSchema]:
    return [
        TableSchema("shop", "orders", ("id", "v"), ("id",)),
        TableSchema("shop", "lines", ("oid", "sku", "v"), ("oid", "sku")),
        TableSchema("shop", "users", ("id", "email", "v"), ("id",), (("email",),)),
        TableSchema("shop", "codes", ("code", "v"), ("code",)),
        TableSchema("shop", "pairs", ("a", "b", "c"), ("a",), (("b", "c"), ("c",))),
        TableSchema("shop", "log", ("x", "y"), ()),
        TableSchema("магазин", "名前", ("ключ", "v"), ("ключ",)),
    ]


STRS = ["a", "A", "a ", "é", "E\u0301", "Straße", "STRASSE", "ﬁn", "FIN", "Zoë", "zoe", "名", "😀", "\ud800"]


def value(rng: random.Random, col: str) -> Any:
    r = rng.random()
    if col in ("id", "oid", "a", "x"):
        return rng.randrange(12) if r < 0.95 else None
    if r < 0.6:
        return rng.choice(STRS)
    if r < 0.9:
        return rand_str(rng)
    return rng.choice([None, rng.randrange(5), b"\x00a"])


def change(rng: random.Random, s: TableSchema) -> RowChange:
    img = {c: value(rng, c) for c in s.columns if rng.random() < 0.97}
    op = rng.choice(["insert", "insert", "update", "update", "delete"])
    if op == "insert":
        return RowChange(s, op, None, img)
    if op == "delete":
        return RowChange(s, op, img, None)
    after = dict(img)
    for c in s.columns:
        if rng.random() < 0.3:  # a key column too now and then: the key changes
            after[c] = value(rng, c)
    return RowChange(s, op, img, after)


def batch(rng: random.Random, n_txns: int) -> list[Txn]:
    ss = schemas(rng)
    out: list[Txn] = []
    for t in range(n_txns):
        if rng.random() < 0.03:
            out.append(Txn("r", 1000 + t, None, (), ddl=Ddl("shop", "ALTER TABLE orders ADD c INT", "shop")))
            continue
        size = rng.choice([1, 1, 2, 3, 5, 8, 13, 40])
        tables = rng.sample(ss, rng.randrange(1, 4))
        changes = tuple(change(rng, rng.choice(tables)) for _ in range(size))
        r = rng.random()
        held: Any = list(changes) if r < 0.2 else Spilled(changes) if r < 0.3 else changes
        out.append(Txn(rng.choice(["r", "r2"]), 1000 + t, None, held))
    return out


def run(txns: list[Txn], start: tuple[int, int], n: int, phase_rows: int, meta: bool, database: str,
        c: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    opts = {k.name: k.default for k in ms.MySQLSender.KEYS}
    opts.update(host="h", user="u", threadnum=n, meta_database="_capturer" if meta else "", database=database,
                ddl="skip")
    s = ms.MySQLSender("m", opts)
    log: list[Any] = []
    s.workers = [Recorder(log, i) for i in range(n)]  # type: ignore[misc]
    s.phase_rows = phase_rows
    s._progress_loaded = True
    with monkeypatch.context() as m:
        if not c:
            m.setattr(ms, "_place_txns", None)
        s._send(txns, start)
    return log, {k: v for k, v in s.counters.items() if v}, s._phase, s._whole


@pytest.mark.parametrize("seed", range(6))
def test_one_c_call_per_transaction_places_as_the_python_path(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    barriers = flushes = 0
    for _ in range(25):
        txns = batch(rng, rng.randrange(1, 60))
        ti = rng.randrange(len(txns))
        start = (ti, rng.randrange(len(txns[ti].changes))) if rng.random() < 0.3 and txns[ti].changes else (0, 0)
        args = (txns, start, rng.choice([1, 2, 3, 8]), rng.choice([1, 3, 7, 50, 10_000]), rng.random() < 0.7,
                rng.choice(["", "", "tgt", "ünï"]))
        want = run(*args, c=False, monkeypatch=monkeypatch)
        got = run(*args, c=True, monkeypatch=monkeypatch)
        assert got == want, (seed, args[1:])
        barriers += want[1].get("barriers", 0)
        flushes += want[1].get("phases", 0)
    # the comparison above covered barriers and many phases
    assert barriers > 5 and flushes > 50


def test_the_python_path_is_the_specification_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above compares two different paths: without the C run, the sender places each change in Python."""
    calls: list[int] = []
    real = ms._Phases.place

    def spy(self: Any, *a: Any) -> None:
        calls.append(1)
        real(self, *a)

    monkeypatch.setattr(ms._Phases, "place", spy)
    txns = batch(random.Random(1), 5)
    run(txns, (0, 0), 3, 50, True, "", c=True, monkeypatch=monkeypatch)
    assert not calls
    run(txns, (0, 0), 3, 50, True, "", c=False, monkeypatch=monkeypatch)
    assert len(calls) == sum(len(t.changes) for t in txns)
