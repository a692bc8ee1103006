"""The C encoder of the Kafka sender's json messages (``kafka_json``, capturer/_native/kafka.c and json.c)
against its specification, the sender's Python ``row_messages``, on the inputs its shortcuts meet:

* the column names' texts kept per call (``KeyCache``): more names than its slots, names whose slots
  collide, names that need escaping, names too long to keep, str subclasses, the same names in nested
  dicts (a JSON column) and in the key;
* strings escaped a word (8 bytes) at a time: a character to escape at every place of a word, at the
  ends, in long runs, beside non-ASCII text;
* dates and datetimes written from a two-digit table: the ends of their ranges, every field's bounds;
* the previous row's table kept without a look-up: rows alternating between tables, tables repeated.

Each case asserts that the C encoder wrote the messages itself (it refuses some inputs, and the sender
then takes the Python path: a comparison through the sender alone could not fail on them).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import string
from typing import Any

import pytest

from capturer.model import LsnPosition, Position, RowChange, SnapshotMark, TableSchema, Txn, ts_physical_ms
from capturer.model.encode import _fallback, _fastrows, json_value
from senders.kafka import format as kformat

kafka_json = getattr(_fastrows, "kafka_json", None)
pytestmark = pytest.mark.skipif(kafka_json is None, reason="the C extension is not built")


class Client:
    """Partitions per topic; records nothing (the messages are compared as the encoders return them)."""

    def partitions(self, topic: str) -> int:
        return 5

    def learn(self, topic: str) -> None:
        pass


def sender(tombstones: bool = False) -> Any:
    from senders.kafka.sender import KafkaSender

    options = {k.name: k.default for k in KafkaSender.KEYS}
    options.update(servers="127.0.0.1:9", format="json", tombstones=tombstones)
    s = KafkaSender("k", options)
    s.client = Client()  # type: ignore[assignment]
    return s


def both(changes: list[RowChange], tombstones: bool = False, seq0: int = 0,
         txn: Txn | None = None) -> tuple[list[Any], list[Any]]:
    """(the C encoder's messages, row_messages') of a transaction of ``changes`` from ``seq0`` on."""
    s = sender(tombstones)
    if txn is None:
        txn = Txn("r1", 7 << 20, Position("bin.000001", 4, "0-1-2"), tuple(changes), gtid="0-1-2")
    now_ms = 1_700_000_000_123
    hbase = (("region", txn.region.encode()), ("commit_ts", str(txn.commit_ts).encode()))
    part = changes[seq0:]
    c = kafka_json(part, seq0, len(changes), kformat.json_txn_pieces(txn, now_ms),
                   lambda schema: s.json_table(txn.region, schema), _fallback, hbase, tombstones)
    assert isinstance(c, list)  # (written by C: it raised nothing)
    return c, s.row_messages(txn, part, seq0, s.encoder(now_ms))


def assert_same(changes: list[RowChange], **kw: Any) -> list[Any]:  # kw: both()'s
    c, py = both(changes, **kw)
    assert len(c) == len(py)
    for j, (a, b) in enumerate(zip(c, py)):
        assert a == b, f"message {j}: C {a!r}\n Python {b!r}"
    return c


class Name(str):
    """A column name of a str subclass (the key texts are kept for exact str only)."""


def test_many_column_names_colliding_escaped_long_and_subclassed() -> None:
    rng = random.Random(11)
    odd = ["a\"b", "back\\slash", "tab\there", "nl\n", "\x00zero", "\x1f", "é", "日本", "😀x", "x" * 44,
           "y" * 45, "z" * 46, "w" * 47, "q" * 200, "", "\x7f", Name("sub"), Name("su\"b")]
    cols = tuple([f"c{i}" for i in range(150)] + odd)
    schema = TableSchema("d", "wide", ("id", *cols), ("id", "q" * 200, "a\"b"))
    changes = []
    for i in range(60):
        row: dict[str, Any] = {"id": i}
        # each row its own subset in its own order: slots are taken over and given back in every order
        for c in rng.sample(cols, rng.randrange(1, len(cols))):
            row[c] = rng.choice([None, i, "v\"\\\n", b"\x00\x01", {"nested": {c: 1, "a\"b": [c]}}, [c, {c: c}]])
        row.setdefault("q" * 200, "k")
        row.setdefault("a\"b", i)
        op = rng.choice(["insert", "update", "delete", "read"])
        before = dict(row) if op in ("update", "delete") else None
        after = {**row, "c0": i + 1} if op != "delete" else None
        changes.append(RowChange(schema, op, before, after))
    out = assert_same(changes)
    # the texts the cache kept are the texts of the names (not of another name that had the slot)
    assert any(b'"q' + b"q" * 199 + b'":"k"' in m[2] for m in out if m[2])
    assert any(b'"su\\"b":' in m[3] for m in out if m[3])


def test_names_that_are_freed_and_made_again_between_calls() -> None:
    """A name's text is kept only while the call holds the name: names made anew per row (dicts built
    from fresh strings, as a decoder makes them) at addresses an earlier name had."""
    schema = TableSchema("d", "t", ("id", "v"), ("id",))
    for n in range(30):
        changes = [RowChange(schema, "insert", None, {"id": i, "".join(["v", str(n)]): i, "".join(["w", "x" * (i % 9)]): 1})
                   for i in range(40)]
        assert_same(changes)


def test_strings_escaped_at_every_place_of_a_word() -> None:
    schema = TableSchema("d", "s", ("id", "v"), ("id",))
    specials = ["\"", "\\", "\n", "\x00", "\x1f", "\x7f", "é", "\u2028", " ", "~", "!", "\x80", "\u07ff"]
    changes = []
    i = 0
    for n in range(26):
        for at in range(n):
            for sp in specials:
                v = "a" * at + sp + "b" * (n - at - 1)
                changes.append(RowChange(schema, "insert", None, {"id": i, "v": v, v: v}))
                i += 1
    rng = random.Random(3)
    alphabet = string.printable + "\"\\\x00\x01\x1f\x7fé日😀"
    for _ in range(500):
        v = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        changes.append(RowChange(schema, "insert", None, {"id": i, "v": v}))
        i += 1
    assert_same(changes)
    for ch in changes:  # and the JSON writer alone, as json.dumps writes it
        v = ch.after["v"]  # type: ignore[index]
        assert _fastrows.json_dumps(v, _fallback) == json.dumps(v, ensure_ascii=False)


def test_dates_and_datetimes_at_their_bounds() -> None:
    schema = TableSchema("d", "dt", ("id", "a", "b"), ("id",))
    values: list[Any] = [dt.datetime.min, dt.datetime.max, dt.date.min, dt.date.max, dt.datetime(1, 1, 1, 0, 0, 0, 1),
                         dt.datetime(999, 9, 9, 9, 9, 9, 99999), dt.datetime(1000, 10, 10, 10, 10, 10, 100000),
                         dt.datetime(2026, 12, 31, 23, 59, 59, 999999), dt.date(99, 1, 31), dt.date(2000, 2, 29)]
    rng = random.Random(8)
    values += [dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randrange(315537897600 * 10**6))
               for _ in range(400)]
    values += [dt.date(1, 1, 1) + dt.timedelta(days=rng.randrange(3652058)) for _ in range(200)]
    changes = [RowChange(schema, "insert", None, {"id": i, "a": v, "b": decimal.Decimal(i) / 7})
               for i, v in enumerate(values)]
    assert_same(changes)
    for v in values:
        assert _fastrows.json_dumps(v, _fallback) == json.dumps(json_value(v)[0])


@pytest.mark.parametrize("tombstones", [False, True])
def test_rows_alternating_between_tables(tombstones: bool) -> None:
    a = TableSchema("d", "a", ("id", "v"), ("id",))
    b = TableSchema("d", "b", ("k1", "k2", "v"), ("k1", "k2"))
    keyless = TableSchema("d", "keyless", ("v",), ())
    a2 = TableSchema("d", "a", ("id", "v"), ("id",))  # an equal table, another object
    rng = random.Random(5)
    changes = []
    for i in range(300):
        s = rng.choice([a, a, b, keyless, a2])
        key = {c: rng.choice([i, i + 1, "k"]) for c in s.pk}
        op = rng.choice(["insert", "update", "delete"])
        before = {**key, "v": i} if op != "insert" else None
        moved = {c: rng.choice([i, i + 2]) for c in s.pk} if rng.random() < 0.5 else key
        after = {**moved, "v": i + 1} if op != "delete" else None
        changes.append(RowChange(s, op, before, after))
        if rng.random() < 0.2:  # runs of one table
            changes.extend(RowChange(s, "insert", None, {**key, "v": j}) for j in range(3))
    for seq0 in (0, 1, 77):
        assert_same(changes, tombstones=tombstones, seq0=seq0)


class FakeProducer:
    """confluent-kafka's Producer as produce_all calls it: records each produce's arguments; refuses the
    calls numbered in ``full`` with BufferError (a full queue)."""

    def __init__(self, full: set[int]) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.full = set(full)
        self.n = 0
        self.polls = 0

    def produce(self, *args: Any, **kw: Any) -> None:
        self.n += 1
        if self.n in self.full:
            self.full.discard(self.n)
            raise BufferError("Local: Queue full")
        self.calls.append((args, kw))

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0


@pytest.mark.parametrize("full", [set(), {1}, {3, 4}, {7}, {2, 3, 4, 5}])
def test_produce_all_in_c_makes_the_calls_of_the_python_loop(monkeypatch: pytest.MonkeyPatch, full: set[int]) -> None:
    """ConfluentClient.produce_all through the C loop (kafka_produce_each) and through its Python loop: the
    same produce calls, in the same order, with the same arguments; a full queue (BufferError) waits and
    goes on with the message it refused, each message produced once."""
    from senders.kafka import client as kc

    if getattr(_fastrows, "kafka_produce_each", None) is None:
        pytest.skip("the C extension has no kafka_produce_each")
    msgs = [("t", i % 3, None if i == 2 else b"k%d" % i, None if i == 4 else b"v%d" % i,
             [("region", b"r"), ("seq", str(i).encode())]) for i in range(7)]
    made = []
    for each in (kc._produce_each, None):
        monkeypatch.setattr(kc, "_produce_each", each)
        c = kc.ConfluentClient.__new__(kc.ConfluentClient)
        c.producer, c._since_poll = FakeProducer(full), 0
        c.produce_all(list(msgs))
        assert not c.producer.full  # (every refusal happened, and the refused message went again)
        made.append(c.producer.calls)
    assert made[0] == made[1]
    assert made[0] == [((t, v, k, p, None, None, 0, h), {}) for t, p, k, v, h in msgs]


def test_produce_each_raises_what_is_not_a_full_queue() -> None:
    each = getattr(_fastrows, "kafka_produce_each", None)
    if each is None:
        pytest.skip("the C extension has no kafka_produce_each")

    def produce(*args: Any) -> None:
        if args[1] == b"bad":
            raise ValueError("refused")

    msgs = [("t", 0, b"k", b"ok", []), ("t", 0, b"k", b"bad", [])]
    with pytest.raises(ValueError, match="refused"):
        each(produce, msgs, 0)
    assert each(produce, msgs, 2) == 2
    assert each(produce, msgs[:1], 0) == 1
    for bad in ([("t", 0)], (("t", 0, b"k", b"v", []),)):
        with pytest.raises(TypeError):
            each(produce, bad, 0)
    with pytest.raises(ValueError):
        each(produce, msgs, -1)


def pieces_before(txn: Txn, now_ms: int) -> tuple[bytes, ...]:
    """json_txn_pieces as it was written before it took shortcuts (every part through json, the last row's
    tail made whatever the transaction): what it must still give."""
    def j(v: Any) -> bytes:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode()

    def tail(seq: int) -> bytes:
        return b"," + j(kformat.snapshot_fields(txn, seq))[1:-1] + b'},"transaction":{"id":' + \
            j(f"{txn.region}:{txn.commit_ts}") + b',"total_order":'

    n = len(txn.changes)
    head = b',"ts_ms":' + j(now_ms) + b',"source":{"region":' + j(txn.region) + b","
    mid = (b'"commit_ts":' + j(txn.commit_ts) + b',"ts_ms":' + j(ts_physical_ms(txn.commit_ts)) + b',"position":'
           + j(txn.position.to_json()) + b',"gtid":' + j(txn.gtid) + b',"seq":')
    return head, mid, tail(0), tail(n - 1), b',"rows":' + j(n) + b"}"


class Ts(int):
    """A commit timestamp of an int subclass (its digits all the same)."""


def test_transaction_pieces_snapshot_marks_and_their_rows() -> None:
    schema = TableSchema("d", "t", ("id", "v"), ("id",))
    rng = random.Random(2)
    for n in (1, 2, 3, 50):
        for mark in (None, SnapshotMark("run-1", 4, False), SnapshotMark("r\"ü", 0, True)):
            for ts in (7 << 20, Ts(123456789 << 18), 0):
                for pos in (Position("bin.000001", 4, "0-1-2"), LsnPosition(12345)):
                    changes = [RowChange(schema, "insert", None, {"id": i, "v": rng.random()}) for i in range(n)]
                    region = rng.choice(["r\u00e9", 'a"b\\c\n', "", "r1"])
                    txn = Txn(region, ts, pos, tuple(changes), gtid=rng.choice(["", "0-1-2"]), snapshot=mark)
                    now_ms = rng.choice([0, 1_700_000_000_123])
                    assert kformat.json_txn_pieces(txn, now_ms) == pieces_before(txn, now_ms)
                    for seq0 in {0, n - 1}:
                        assert_same(changes, seq0=seq0, txn=txn)
