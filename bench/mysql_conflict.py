"""Micro-bench of the MySQL sender's per-row placing (issue 50, item 3): no server, one process.

    .venv/bin/python bench/mysql_conflict.py [--rows 200000] [--repeat 5] [--non-ascii 0.1] [--txn-rows 100] [--json OUT]

Over ``--rows`` realistic row changes (60 % inserts, 30 % updates with both images, 10 % deletes) of four
tables (an int primary key; a composite (int, varchar) primary key; an int primary key and a unique
varchar key; a varchar primary key), the varchar keys in mixed case, about one in ten (``--non-ascii``)
with accents or other non-ASCII letters, some with trailing spaces, it times, per row, with the Python specification
(``senders.mysql.causality``'s ``*_py`` functions) and with the C path (``capturer._fastrows``) where
it is built:

* ``keys``: ``conflict_keys(ch, db, table)`` alone;
* ``place``: ``conflict_keys`` + ``Causality.place`` + ``stable_hash(group) % 8``, the sender's per-row
  placing (a barrier resets the groups, as the sender's flush does);
* ``sender``: ``MySQLSender.send`` of the rows in 100-row transactions (``--txn-rows``) with 8 workers that apply
  nothing (their futures complete at once), ``meta_database`` on (the position's manifest built):
  everything the sender's thread does per row but the SQL. ``c`` places the changes of a run of
  transactions in one C call (``place_txns``); ``c_each`` (``sender_c_each``) each change through the
  C twins one by one, as before it (``sender_run_speedup``: c_each / c).

The process takes the capturer's malloc and garbage-collector settings (``capturer.util.memory.tune``).
Each figure is CPU time (``time.process_time``: the machine's load does not count in it, the wait for a
core does not), the best of ``--repeat`` runs, Python and C alternated (the machine is shared); the ratio C/Python is what to read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import random
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capturer.model import RowChange, TableSchema, Txn
from capturer.util.memory import tune
from senders.mysql import causality

ACCENTED = ["José", "Müller", "ÅSA", "crème", "Straße", "Łukasz", "Ǆemal", "ﬁn", "Ñandú", "Zoë"]
WORDS = ["alpha", "Bravo", "CHARLIE", "delta", "Echo", "foxtrot", "Golf", "hotel", "India", "juliet"]

T_INT = TableSchema("shop", "orders", ("id", "amount", "note"), ("id",))
T_COMP = TableSchema("shop", "lines", ("order_id", "sku", "qty"), ("order_id", "sku"))
T_UK = TableSchema("shop", "users", ("id", "email", "name"), ("id",), (("email",),))
T_STR = TableSchema("shop", "codes", ("code", "label"), ("code",))


#: the share of the varchar keys with a non-ASCII letter (--non-ascii)
NON_ASCII = 0.1
#: rows per transaction in the sender's part (--txn-rows)
TXN_ROWS = 100


def word(rng: random.Random, i: int) -> str:
    base = rng.choice(ACCENTED) if rng.random() < NON_ASCII else rng.choice(WORDS)
    s = f"{base}{i}"
    if rng.random() < 0.3:
        s = s.upper() if rng.random() < 0.5 else s.title()
    if rng.random() < 0.05:
        s += "  "
    return s


def workload(n: int, seed: int = 1) -> list[RowChange]:
    rng = random.Random(seed)
    out: list[RowChange] = []
    for i in range(n):
        t = rng.random()
        k = rng.randrange(max(1, i // 2 + 1))  # updates and deletes hit earlier keys
        if t < 0.4:
            s = T_INT
            img: dict[str, Any] = {"id": k, "amount": rng.randrange(10**6), "note": "x" * rng.randrange(20)}
        elif t < 0.6:
            s = T_COMP
            img = {"order_id": k // 4, "sku": word(rng, k % 97), "qty": rng.randrange(100)}
        elif t < 0.85:
            s = T_UK
            img = {"id": k, "email": word(rng, k) + "@Example.com", "name": word(rng, k)}
        else:
            s = T_STR
            img = {"code": word(rng, k), "label": dt.datetime(2026, 1, 1) + dt.timedelta(seconds=k)}
        r = rng.random()
        if r < 0.6:
            out.append(RowChange(s, "insert", None, img))
        elif r < 0.9:
            after = dict(img)
            first = s.columns[0]
            if s is T_UK and rng.random() < 0.3:  # the unique key changes
                after["email"] = word(rng, k + 1) + "@example.com"
            elif rng.random() < 0.1 and type(img[first]) is int:  # the primary key changes
                after[first] = img[first] + 1
            out.append(RowChange(s, "update", img, after))
        else:
            out.append(RowChange(s, "delete", img, None))
    return out


def use(impl: str) -> tuple[Any, Any, Any]:
    """(conflict_keys, Causality, stable_hash) of ``impl``: "py" (the specification) or "c"."""
    if impl == "py":
        return causality.conflict_keys_py, causality.CausalityPy, causality.stable_hash_py
    return causality.conflict_keys, causality.Causality, causality.stable_hash


def time_keys(rows: list[RowChange], impl: str) -> float:
    keys, _, _ = use(impl)
    t0 = time.process_time()
    for ch in rows:
        keys(ch, "tgt", ch.schema.table)
    return time.process_time() - t0


def time_place(rows: list[RowChange], impl: str) -> float:
    keys, causality_cls, h = use(impl)
    c = causality_cls()
    place = c.place
    lanes: list[int] = [0] * 8
    t0 = time.process_time()
    for i, ch in enumerate(rows):
        if i % 10_000 == 0:
            c.reset()
        k = keys(ch, "tgt", ch.schema.table)
        group = place(k)
        if group is None:
            c.reset()
            group = place(k)
        lanes[h(group) % 8] += 1
    return time.process_time() - t0


def time_sender(rows: list[RowChange], impl: str) -> float:
    import senders.mysql.sender as ms

    keys, causality_cls, h = use("py" if impl == "py" else "c")
    saved = ms.conflict_keys, ms.Causality, ms.stable_hash, ms._place_txns
    ms.conflict_keys, ms.Causality, ms.stable_hash = keys, causality_cls, h
    if impl != "c":  # "c_each": each change through the C twins one by one (round 4's first step)
        ms._place_txns = None

    class Idle:
        def submit(self, units: Any, atomic: bool, mark: Any) -> Future[int]:
            f: Future[int] = Future()
            f.set_result(len(units))  # (what it returns is not looked at by the placing)
            return f

        def close(self) -> None:
            pass

    opts = {k.name: k.default for k in ms.MySQLSender.KEYS}
    opts.update(host="h", user="u", threadnum=8)
    s = ms.MySQLSender("m", opts)
    s.workers = [Idle() for _ in range(8)]  # type: ignore[misc]
    s._progress_loaded = True
    batch = [Txn("r", 1000 + i // TXN_ROWS, None, tuple(rows[i:i + TXN_ROWS])) for i in range(0, len(rows), TXN_ROWS)]
    try:
        t0 = time.process_time()
        s._send(batch)
        return time.process_time() - t0
    finally:
        ms.conflict_keys, ms.Causality, ms.stable_hash, ms._place_txns = saved


def main() -> None:
    global NON_ASCII, TXN_ROWS
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--non-ascii", type=float, default=NON_ASCII, help="share of the varchar keys with a non-ASCII letter")
    ap.add_argument("--txn-rows", type=int, default=TXN_ROWS, help="rows per transaction (the sender's part)")
    ap.add_argument("--json")
    a = ap.parse_args()
    NON_ASCII, TXN_ROWS = a.non_ascii, a.txn_rows
    tune()  # the malloc and garbage-collector settings of every capturer process
    rows = workload(a.rows)
    impls = ["py"] + (["c"] if causality.conflict_keys is not causality.conflict_keys_py else [])
    out: dict[str, Any] = {"rows": a.rows, "repeat": a.repeat, "non_ascii": a.non_ascii, "txn_rows": a.txn_rows, "c_built": "c" in impls}
    import senders.mysql.sender as ms

    for part, fn in (("keys", time_keys), ("place", time_place), ("sender", time_sender)):
        each = part == "sender" and "c" in impls and getattr(ms, "_place_txns", None) is not None
        these = impls + (["c_each"] if each else [])
        best = dict.fromkeys(these, float("inf"))
        for _ in range(a.repeat):  # alternated, each after a full collection: the load moves under us
            for impl in these:
                gc.collect()
                best[impl] = min(best[impl], fn(rows, impl))
        for impl in these:
            out[f"{part}_{impl}_us_per_row"] = round(best[impl] / a.rows * 1e6, 3)
        if "c" in impls:
            out[f"{part}_speedup"] = round(out[f"{part}_py_us_per_row"] / out[f"{part}_c_us_per_row"], 2)
        if each:
            out[f"{part}_run_speedup"] = round(out[f"{part}_c_each_us_per_row"] / out[f"{part}_c_us_per_row"], 2)
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
