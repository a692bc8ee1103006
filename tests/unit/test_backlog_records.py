"""The backlog's records (capturer/pipeline/segments.py): what the writer puts on disk stays what the
msgpack path wrote (segments of an older version are read, and this version's by an older one), and the
reader's one-pass C decoding (``wire.unpack_item``) gives exactly what the reference path
(``wire.unpackb`` + ``TxnReader``) gives, or leaves the record to it."""

from __future__ import annotations

import datetime as dt
import decimal
import gc
import random
import zlib
from pathlib import Path
from typing import Any

import pytest

from capturer.model import Ddl, Heartbeat, Item, Position, RowChange, SnapshotMark, TableSchema, Txn, stream_key, wire
from capturer.pipeline import segments
from capturer.pipeline.segments import HEADER, Backlog, BacklogError, SegmentReader

S = TableSchema("d", "t", ("id", "name", "price", "at", "note"), ("id",))
S2 = TableSchema("d", "u", ("k", "v"), ("k",))
VALUES = [None, True, 0, -1, (1 << 64) - 1, -(1 << 63), 1 << 70, 1.5, "", "Bé😀", "bad \udcff surrogate", b"\x00\xff",
          decimal.Decimal("-12.30"), dt.datetime(2026, 1, 2, 3, 4, 5, 6), dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc),
          dt.date(1000, 1, 1), dt.time(23, 59, 59, 1), dt.timedelta(days=-1, seconds=5), {"a", "b"},
          {"k": [1, "x", None]}, [1, [2.5]], "y" * 300]


def items(rng: random.Random) -> list[Item]:
    """Transactions of two tables (whole, partial and reordered images; a big one in chunks; an empty
    one, a DDL, a snapshot chunk) and heartbeats (at their transaction's position, or none)."""
    def img(s: TableSchema) -> dict[str, Any]:
        d = {c: rng.choice(VALUES) for c in s.columns}
        r = rng.random()
        if r < 0.1:
            d = dict(reversed(list(d.items())))
        elif r < 0.2:
            d.pop(s.columns[-1])
        return d

    def change() -> RowChange:
        s = rng.choice([S, S, S2])
        op = rng.choice(["insert", "update", "delete", "read"])
        return RowChange(s, op, img(s) if op in ("update", "delete") else None, img(s) if op != "delete" else None)

    out: list[Item] = []
    for k in range(1, 40):
        pos = Position("bin.000001", 100 * k, f"0-1-{k}")
        n = 2 * wire.CHUNK_ROWS + 7 if k == 20 else rng.randrange(0, 60)
        out.append(Txn("r", k * 10, pos, tuple(change() for _ in range(n)), source_ts=k, gtid=f"0-1-{k}",
                       snapshot=SnapshotMark("run", k, k % 2 == 0) if k % 7 == 0 else None))
        if k % 5 == 0:
            out.append(Heartbeat("r", k * 10 + 1, pos))
        if k % 9 == 0:
            out.append(Txn("r", k * 10 + 2, pos, (), Ddl("d", "ALTER TABLE t ADD c INT", "t", "d", 0)))
            out.append(Heartbeat("q", k * 10 + 3, None))
    return out


def old_records(its: list[Item]) -> bytes:
    """The records as the writer made them before it wrote them piece by piece (one segment; the
    msgpack path, without the C build)."""
    enc = wire.Encoder()
    out = []
    last: dict[str, Any] = {}
    for off, it in enumerate(its, 1):
        samepos = it.position is not None and it.position is last.get(it.region)
        if it.position is not None:
            last[it.region] = it.position
        key = stream_key(it)
        head = wire.packb(["k", key[0], key[1], key[2]])
        pieces, schemas = [], []
        for data, _rows in enc.item(it):
            (schemas if data[:3] == segments._SCHEMA_PREFIX else pieces).append(data)
        for s in schemas:
            out += [HEADER.pack(len(s), zlib.crc32(s), off, 0, segments.F_SCHEMA), s]
        payload = segments._array_header(1 + len(pieces)) + head + b"".join(pieces)
        out += [HEADER.pack(len(payload), zlib.crc32(payload), off, 0,
                            segments.F_ITEM | (segments.F_SAMEPOS if samepos else 0)), payload]
    return b"".join(out)


def write(tmp: Path, its: list[Item], segment_bytes: int = 1 << 30) -> Backlog:
    b = Backlog(tmp, 1 << 40, segment_bytes)
    b.open(None, None)
    last: dict[str, Any] = {}
    for off, it in enumerate(its, 1):
        samepos = it.position is not None and it.position is last.get(it.region)
        if it.position is not None:
            last[it.region] = it.position
        b.append(off, 0, stream_key(it), it, samepos)
    b.flush(len(its))
    return b


def read_all(b: Backlog, n: int, spill_rows: int = 0, spill_dir: str = "") -> list[tuple[int, Item, bool]]:
    r = SegmentReader(b, spill_rows, spill_dir)
    got = [(off, it, same) for off, _rows, it, same in r.read(1, n + 1, 1 << 40)]
    r.close()
    return got


def test_the_records_on_disk_are_what_the_msgpack_path_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    its = items(random.Random(3))
    b = write(tmp_path / "new", its)
    b.close()
    (seg,) = sorted((tmp_path / "new").glob("*.seg"))
    monkeypatch.setattr(wire, "_fast", None)  # the reference: msgpack and the Python rows
    assert seg.read_bytes() == old_records(its)


def test_the_c_reader_gives_what_the_reference_reader_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    its = items(random.Random(5))
    b = write(tmp_path / "b", its, segment_bytes=64 << 10)  # a few segments: each read from its start
    assert len(b.segments) > 3
    fast = read_all(b, len(its))
    b._decoded.clear()
    monkeypatch.setattr(segments.wire, "_unpack_item", None)
    slow = read_all(b, len(its))
    b._decoded.clear()
    monkeypatch.setattr(segments.wire, "_fast", None)
    python = read_all(b, len(its))
    assert [o for o, _, _ in fast] == list(range(1, len(its) + 1))
    assert fast == slow == python
    assert [it for _, it, _ in fast] == its
    assert [s for _, _, s in fast] == [s for _, _, s in python]
    if wire._fast is not None:  # read in C: its changes are out of the cyclic collector's sight
        big = next(it for _, it, _ in fast if isinstance(it, Txn) and len(it.changes) > wire.CHUNK_ROWS)
        assert not gc.is_tracked(big.changes[0]) and gc.is_tracked(RowChange(S, "insert", None, {}))
        assert all(type(c) is RowChange for _, it, _ in fast if isinstance(it, Txn) for c in it.changes)


def test_a_transaction_past_spill_rows_is_read_to_disk_as_before(tmp_path: Path) -> None:
    its = items(random.Random(7))
    b = write(tmp_path / "b", its)
    got = read_all(b, len(its), spill_rows=500, spill_dir=str(tmp_path))
    big = [it for _, it, _ in got if isinstance(it, Txn) and len(it.changes) > 500]
    assert len(big) == 1 and hasattr(big[0].changes, "chunks") and big[0].weight <= 501
    assert list(big[0].changes) == list(next(t for t in its if isinstance(t, Txn) and len(t.changes) > 500).changes)
    assert [it for _, it, _ in got if it is not big[0]] == [it for it in its if not (isinstance(it, Txn) and len(it.changes) > 500)]
    # (one segment, one reader) a heartbeat at its transaction's position has that position object back
    pairs = [(a, h) for (_, a, _), (_, h, same) in zip(got, got[1:]) if isinstance(h, Heartbeat) and same]
    assert len(pairs) >= 5 and all(h.position is a.position for a, h in pairs)


@pytest.mark.skipif(wire._fast is None, reason="the C build of capturer/_native/ is not here")
def test_a_damaged_record_reads_as_the_reference_path_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes changed or cut in records (past their checksum: as if written so): the C reader never
    crashes and never gives something the reference path would not (the same item, or an error)."""
    its = items(random.Random(9))[:30]
    b = write(tmp_path / "b", its)
    b.close()
    (seg,) = b.segments
    recs = list(segments._records(seg.path))
    rng = random.Random(13)

    def outcome(reader: SegmentReader, payload: bytes) -> tuple[str, str]:
        try:
            return "ok", repr(reader._decode(payload))
        except (BacklogError, wire.WireError, ValueError, TypeError, KeyError, IndexError, ArithmeticError) as exc:
            return "error", type(exc).__name__

    fast, slow = SegmentReader(b), SegmentReader(b)
    for _off, _rows, flags, payload in recs:
        if flags & segments.F_SCHEMA:
            for v in wire.unpacker(payload):
                fast._decoder.schema(v)
                slow._decoder.schema(v)
    items_p = [p for _o, _r, f, p in recs if f & segments.F_ITEM]
    seen = {"ok": 0, "error": 0}
    # well-formed msgpack that is not what the writer makes: row counts that do not match, a chunk
    # after the last row, values in another order, a transaction value in an array16
    crafted = []
    for p in items_p:
        vals = wire.unpackb(p)
        if vals[1][0] != "t":
            continue
        for delta in (-1, 1):
            v = [vals[0], list(vals[1]), *vals[2:]]
            v[1][7] += delta
            crafted.append(v)
        crafted.append([*vals, ["c", []]])
        crafted.append([*vals, ["c", vals[1][8][:1]]])
        crafted.append([vals[1], vals[0], *vals[2:]])
        crafted.append([vals[0], vals[1], ["h", 1, None]])
    assert len(crafted) > 20
    for v in crafted:
        data = wire.packb(v)
        got = outcome(fast, data)
        with monkeypatch.context() as m:
            m.setattr(segments.wire, "_unpack_item", None)
            assert got == outcome(slow, data), v[:2]
        assert got[0] == "error", v[:2]
    vals = next(v for v in map(wire.unpackb, items_p) if v[1][0] == "t" and len(v) == 2 and v[1][8])
    t16 = b"\x92" + wire.packb(vals[0]) + b"\xdc\x00\x09" + wire.packb(vals[1])[1:]
    got = outcome(fast, t16)
    with monkeypatch.context() as m:
        m.setattr(segments.wire, "_unpack_item", None)
        assert got == outcome(slow, t16) and got[0] == "ok"
    for i in range(3000):
        data = bytearray(rng.choice(items_p))
        if i % 2:
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        else:
            del data[rng.randrange(len(data)):]
        got = outcome(fast, bytes(data))
        with monkeypatch.context() as m:
            m.setattr(segments.wire, "_unpack_item", None)
            want = outcome(slow, bytes(data))
        assert got == want, (bytes(data[:60]), got, want)
        seen[got[0]] += 1
    assert seen["ok"] > 100 and seen["error"] > 100
    with pytest.raises(BacklogError, match=str(seg.path)):
        fast._seg = seg
        fast._decode(b"\x92\xc1")
