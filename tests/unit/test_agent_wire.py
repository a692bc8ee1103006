"""The agent stream's items (capturer/model/wire.py): every value type round-trips,
a big transaction is cut in chunks and put together again, malformed batches are
a WireError, and a remote region assembles, spills and re-stamps what it reads."""

from __future__ import annotations

import datetime as dt
import decimal
import threading

import pytest

from capturer.model import (
    ChunkMark,
    ColumnInfo,
    Ddl,
    Heartbeat,
    Position,
    RowChange,
    SnapshotMark,
    TableSchema,
    TsPosition,
    Txn,
    wire,
)
from capturer.model.spill import DEFAULT_CHUNK_ROWS, SpillWriter
from capturer.regions.base import RegionContext
from capturer.regions.clock import LiftJournal
from capturer.regions.remote.keys import RemoteRegionConfig
from capturer.regions.remote.region import RemoteRegion
from capturer.util.bqueue import WeightedQueue

S = TableSchema("d`b", "t.1", ("id", "v", "w"), ("id",), (("v",),), (3, 15, 246),
                (ColumnInfo(3), ColumnInfo(15, binary=True), ColumnInfo(246, precision=10, scale=2)))

VALUES = [None, True, 0, -1, (1 << 64) - 1, -(1 << 63), 1 << 70, -(1 << 70), 1.5, float("inf"), "", "Bé😀",
          "bad \udcff surrogate", b"\x00\xff", decimal.Decimal("-12.30"), decimal.Decimal("1E+30"),
          dt.datetime(2026, 1, 2, 3, 4, 5, 6), dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc), dt.date(1000, 1, 1),
          dt.time(23, 59, 59, 1), dt.timedelta(days=-1, seconds=5, microseconds=7), {"a", "b"}, {"k": [1, "x", None]},
          [1, [2.5]]]


def reader_of(r: RemoteRegion) -> wire.TxnReader:
    """The remote region's reading of a stream: transactions to its queue, spilled past its spillRows."""
    return wire.TxnReader(wire.Decoder("r"), r.ctx.spill_rows, r.ctx.spill_dir, r._txn, r._heartbeat)


def roundtrip(items: list) -> list:  # type: ignore[type-arg]
    enc = wire.Encoder()
    data = b"".join(p for it in items for p, _ in enc.item(it))
    r = RemoteRegion(RemoteRegionConfig("r", "remote", ("127.0.0.1:1",)),
                     RegionContext(WeightedQueue(10_000_000), None, 0, LiftJournal(None), threading.Event(),
                                   spill_rows=0))
    reader = reader_of(r)
    reader.feed(wire.unpacker(data))
    assert not reader.inside
    out = []
    while len(r.ctx.out):
        out.append(r.ctx.out.get(0))
    return out


# (a set's repr follows the process's hash seed: ids must not, or pytest-xdist's workers collect different tests)
@pytest.mark.parametrize("v", VALUES, ids=[repr(sorted(v) if isinstance(v, set) else v)[:30] for v in VALUES])
def test_every_value_round_trips(v: object) -> None:
    t = Txn("r", 5, Position("b.000001", 100), (RowChange(S, "insert", None, {"id": 1, "v": v, "w": None}),))
    (got,) = roundtrip([t])
    assert got.changes[0].after == {"id": 1, "v": v, "w": None}
    assert type(got.changes[0].after["v"]) is type(v) or isinstance(v, (list, tuple))


def test_transactions_heartbeats_and_images_with_other_columns() -> None:
    pos = Position("b.000002", 400, "0-1-9")
    items = [
        Heartbeat("agent-name", 3, None),
        Txn("agent-name", 7, pos, (RowChange(S, "update", {"id": 1, "v": "a", "w": None}, {"w": 2, "id": 1}),
                                   RowChange(S, "delete", {"id": 2, "v": None, "w": None}, None),
                                   RowChange(S, "read", None, {"id": 3, "v": "c", "w": decimal.Decimal("1.00")})),
            source_ts=123, gtid="0-1-9", snapshot=SnapshotMark("run1", 4, True)),
        Txn("agent-name", 9, TsPosition(99, ((7, 120),), 3), ddl=Ddl("db", "ALTER TABLE t ADD c INT", "t", "db", -1)),
        Heartbeat("agent-name", 9, TsPosition(120, (), 3)),
    ]
    hb0, t1, t2, hb1 = roundtrip(items)
    assert isinstance(hb0, Heartbeat) and hb0.region == "r" and hb0.commit_ts == 3 and hb0.position is None
    assert t1.region == "r" and t1.commit_ts == 7 and t1.position == pos and t1.position.gtid == "0-1-9"
    assert [c.op for c in t1.changes] == ["update", "delete", "read"]
    assert t1.changes[0].after == {"w": 2, "id": 1} and list(t1.changes[0].after) == ["w", "id"]
    assert t1.changes[0].schema == S and t1.source_ts == 123 and t1.snapshot == SnapshotMark("run1", 4, True)
    assert t2.ddl == Ddl("db", "ALTER TABLE t ADD c INT", "t", "db", -1) and t2.changes == ()
    assert t2.position == TsPosition(99, ((7, 120),), 3)
    assert hb1.position == TsPosition(120, (), 3)


def test_a_chunks_snapshot_mark_keeps_its_table_and_read_position() -> None:
    """A snapshot chunk's mark (run, chunk, last, db, table, read_at: what the file's ``snapshot`` and Kafka's
    ``snapshot_chunk`` show) arrives whole through the wire format: the backlog, sender processes and agents
    carried only (run, chunk, last) until 2026-11-29, so a file sender with process=true, or one reading the
    backlog, wrote lines without db, table and read_at."""
    from capturer.model import LsnPosition

    marks = [ChunkMark("run1", 3, True, "d`b", "t.1", Position("b.000001", 120)),
             ChunkMark("run2", 0, False, "public", "t", LsnPosition(0x16B3748)), ChunkMark("run3", 1, False, "d", "t")]
    items = [Txn("r", 5 + i, Position("b.000001", 200), (RowChange(S, "read", None, {"id": 1, "v": "x", "w": None}),),
                 snapshot=m) for i, m in enumerate(marks)]
    got = roundtrip(items)
    assert [t.snapshot for t in got] == marks
    assert [t.snapshot.to_json() for t in got] == [m.to_json() for m in marks]
    assert got[0].snapshot.to_json() == {"run": "run1", "chunk": 3, "last": True, "db": "d`b", "table": "t.1",
                                         "read_at": {"file": "b.000001", "pos": 120}}


def test_big_transaction_in_chunks_and_spilled_on_arrival() -> None:
    n = 2 * wire.CHUNK_ROWS + 17
    changes = [RowChange(S, "insert", None, {"id": i, "v": f"x{i}", "w": None}) for i in range(n)]
    w = SpillWriter(None, 1000)
    w.add(changes)
    spilled = w.finish()
    enc = wire.Encoder()
    pieces = list(enc.item(Txn("a", 11, Position("b.000001", 9), spilled)))
    assert sum(r for _, r in pieces) == n and len(pieces) > 3  # schema + header + continuation chunks
    r = RemoteRegion(RemoteRegionConfig("r", "remote", ("127.0.0.1:1",)),
                     RegionContext(WeightedQueue(10_000_000), None, 0, LiftJournal(None), threading.Event(),
                                   spill_rows=500))
    reader = reader_of(r)
    for i, (p, _) in enumerate(pieces):  # one piece per batch: a transaction spans batches
        reader.feed(wire.unpacker(p))
        assert reader.inside == (0 < i < len(pieces) - 1)  # piece 0 is the schema
    assert not reader.inside
    (txn,) = [r.ctx.out.get(0)]
    assert r.spilled_txns == 1 and hasattr(txn.changes, "chunks") and len(txn.changes) == n
    assert [c.after["id"] for c in txn.changes] == list(range(n))
    assert txn.weight < n  # held on disk, not in memory


def test_a_transaction_known_to_be_big_is_spilled_from_its_first_rows() -> None:
    # the header gives the row count: past spillRows, no more than a spill chunk is ever held
    # in memory (not spillRows rows first, as when the size is learnt on the way)
    n, spill_rows = 60_017, 25_000
    changes = [RowChange(S, "insert", None, {"id": i, "v": None, "w": None}) for i in range(n)]
    pieces = list(wire.Encoder().item(Txn("a", 11, Position("b.000001", 9), tuple(changes))))
    r = RemoteRegion(RemoteRegionConfig("r", "remote", ("127.0.0.1:1",)),
                     RegionContext(WeightedQueue(10_000_000), None, 0, LiftJournal(None), threading.Event(),
                                   spill_rows=spill_rows))
    reader = reader_of(r)
    held = []
    for p, _ in pieces:
        reader.feed(wire.unpacker(p))
        held.append(len(reader._rows))
    assert max(held) < DEFAULT_CHUNK_ROWS < spill_rows
    (txn,) = [r.ctx.out.get(0)]
    assert r.spilled_txns == 1 and [c.after["id"] for c in txn.changes] == list(range(n))


@pytest.mark.parametrize("data", [
    wire.packb(["x", 1]),
    wire.packb(["c", []]),  # rows of no transaction
    wire.packb(["t", 1, None, 0, "", None, None, 1, [[99, 0, None, [1]]]]),  # unknown schema
    wire.packb(["h", "nope", None]),
    wire.packb(["t", 1, {"file": "", "pos": 1}, 0, "", None, None, 0, []]),  # bad position
    b"\xc1",  # not msgpack
    wire.packb({"a": 1}),
])
def test_malformed_batches_are_wire_errors(data: bytes) -> None:
    r = RemoteRegion(RemoteRegionConfig("r", "remote", ("127.0.0.1:1",)),
                     RegionContext(WeightedQueue(100), None, 0, LiftJournal(None), threading.Event()))
    with pytest.raises(wire.WireError):
        reader_of(r).feed(wire.unpacker(data))


def test_position_identity_is_kept_for_the_checkpoint_floor() -> None:
    """A heartbeat at the position of the last transaction is that position (the
    checkpoint's region_ts stays the transaction's commit_ts, as for a local region)."""
    pos = Position("b.000001", 500)
    hb0, t, hb = roundtrip([Heartbeat("a", 1, None), Txn("a", 5, pos, ()), Heartbeat("a", 8, pos)])
    assert hb.position is t.position


@pytest.mark.skipif(wire._fast is None, reason="the C build of capturer/_native/ is not here")
def test_the_c_build_writes_and_reads_exactly_what_the_python_path_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """wire_rows / wire_unrows / wire_ext (capturer/_native/) against the Python path:
    the same bytes for every value type and odd image shapes, the same values back."""
    import random

    rng = random.Random(7)
    s2 = TableSchema("x", "y", ("a", "b"), ("a",))
    more = [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.time(0, 0),
            dt.datetime(2026, 1, 1, fold=1), dt.time(1, 2, tzinfo=dt.timezone.utc), 127, 128, 255, 256, 65535, 65536,
            -32, -33, -128, -129, -32768, -32769, 2**31, -(2**31) - 1, 2**32, "x" * 31, "x" * 32, "y" * 300,
            "z" * 70000, b"b" * 300, b"b" * 70000, decimal.Decimal("NaN"), float("nan"), (1, 2), {"n": {"m": 1}}]
    pool = VALUES + more
    changes = []
    for _ in range(400):
        s = rng.choice([S, s2])
        img = {c: rng.choice(pool) for c in s.columns}
        if rng.random() < 0.2:
            img = dict(reversed(list(img.items())))  # keys in another order: a map on the wire
        if rng.random() < 0.1:
            img.pop(s.columns[-1])
        op = rng.choice(["insert", "update", "delete", "read"])
        changes.append(RowChange(s, op, img if op in ("update", "delete") else None,
                                 img if op != "delete" else None))
    txn = Txn("r", 5, Position("bin.000001", 100), tuple(changes))

    def encoded() -> bytes:
        return b"".join(p for p, _ in wire.Encoder().item(txn))

    fast = encoded()
    monkeypatch.setattr(wire, "_fast", None)
    slow = encoded()
    assert fast == slow

    def decoded() -> list[RowChange]:
        got: list[RowChange] = []
        reader = wire.TxnReader(wire.Decoder("r"), 0, "", lambda f, ch, _s: got.extend(ch))
        reader.feed(wire.unpacker(fast))
        return got

    py_rows = decoded()
    monkeypatch.undo()
    monkeypatch.setattr(wire, "_EXT_HOOK", wire._ext_hook)
    monkeypatch.setattr(wire, "_fast", wire._fastrows)
    c_rows_py_ext = decoded()
    monkeypatch.undo()
    c_rows = decoded()

    def norm(rows: list[RowChange]) -> list[str]:  # NaN != NaN: compare their repr
        return [repr((r.schema, r.op, r.before, r.after)) for r in rows]

    assert norm(c_rows) == norm(py_rows) == norm(c_rows_py_ext)
    assert all(type(r) is RowChange for r in c_rows)
    with pytest.raises(wire.WireError):
        wire.Decoder("r").rows([[99, 0, None, [1]]])  # an unknown schema
    d = wire.Decoder("r")
    d.schema(wire.unpackb(wire.packb(["s", 1, "x", "y", ["a", "b"], ["a"], [], [], []])))
    with pytest.raises(wire.WireError):
        d.rows([[1, 0, None, [1]]])  # an image that does not match its columns
    with pytest.raises(wire.WireError):
        d.rows([[1, 9, None, [1, 2]]])  # an unknown op


@pytest.mark.skipif(wire._fast is None, reason="the C build of capturer/_native/ is not here")
def test_the_c_reader_reads_what_msgpack_reads_and_refuses_what_it_refuses() -> None:
    """wire_unpack against msgpack.unpackb (with the wire's hook) on random values, and on
    them cut short or with bytes changed: the same value, or both refuse (never a crash)."""
    import random

    import msgpack

    rng = random.Random(11)

    def value(depth: int = 0) -> object:
        r = rng.random()
        if depth < 3 and r < 0.15:
            return [value(depth + 1) for _ in range(rng.randrange(0, 20))]
        if depth < 3 and r < 0.25:
            return {rng.choice(["a", "bé", "", "k" * 40, 5]): value(depth + 1) for _ in range(rng.randrange(0, 18))}
        return rng.choice(VALUES + [rng.randrange(-(2**63), 2**64), rng.random() * 1e300, "s" * rng.randrange(300),
                                    b"b" * rng.randrange(70_000), -rng.randrange(2**31)])

    def slow(data: bytes) -> object:
        return msgpack.unpackb(data, ext_hook=wire._ext_hook, unicode_errors="surrogatepass", raw=False,
                               strict_map_key=False)

    def outcome(fn: object, data: bytes) -> tuple[str, str]:
        try:
            return "ok", repr(fn(data))  # type: ignore[operator]
        except (ValueError, TypeError, wire.WireError, ArithmeticError) as exc:
            return "error", type(exc).__name__
        except RecursionError:
            return "error", "deep"

    for i in range(3000):
        data = wire.packb(value())
        if i % 3 == 1:
            data = data[:rng.randrange(len(data) + 1)]
        elif i % 3 == 2:
            b = bytearray(data)
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            data = bytes(b)
        fast, want = outcome(wire._fast.wire_unpack, data), outcome(slow, data)
        assert fast[0] == want[0], (data[:80], fast, want)
        if fast[0] == "ok":
            assert fast[1] == want[1], data[:80]


@pytest.mark.skipif(wire._fast is None, reason="the C build of capturer/_native/ is not here")
def test_the_c_packer_writes_what_msgpack_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """wire.packb in C (wire_pack: no msgpack Packer and its 256 KiB buffer per call) against the
    msgpack path on random values: the same bytes, or both refuse; nesting past C's depth goes to msgpack."""
    import random

    rng = random.Random(17)

    class Sub(dict):  # type: ignore[type-arg]
        pass

    def value(depth: int = 0) -> object:
        r = rng.random()
        if depth < 3 and r < 0.15:
            return [value(depth + 1) for _ in range(rng.randrange(0, 20))]
        if depth < 3 and r < 0.2:
            return tuple(value(depth + 1) for _ in range(rng.randrange(0, 5)))
        if depth < 3 and r < 0.3:
            d = {rng.choice(["a", "bé", "", "k" * 40, 5, None, 2.5]): value(depth + 1) for _ in range(rng.randrange(18))}
            return Sub(d) if r < 0.22 else d
        return rng.choice(VALUES + [rng.randrange(-(2**63), 2**64), rng.random() * 1e300, "s" * rng.randrange(300),
                                    b"b" * rng.randrange(70_000), -rng.randrange(2**31), bytearray(b"ab"),
                                    memoryview(b"cd"), 1 << 64, -(1 << 63) - 1, frozenset({1}), object()])

    def outcome(v: object) -> tuple[str, object]:
        try:
            return "ok", wire.packb(v)
        except (TypeError, ValueError) as exc:
            return "error", type(exc).__name__

    for _ in range(3000):
        v = value()
        fast = outcome(v)
        with monkeypatch.context() as m:
            m.setattr(wire, "_fast", None)
            want = outcome(v)
        assert fast == want, repr(v)[:200]
    deep: list[object] = []
    for _ in range(100):
        deep = [deep]
    assert wire.packb(deep) == wire._packb(deep)
