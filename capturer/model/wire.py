"""The items of an agent's stream, as bytes (the ``items`` field of a ``Batch``).

A batch's ``items`` is a concatenation of msgpack values, read in order:

* ``["s", sid, db, table, columns, pk, unique_keys, column_types, column_info]``: a
  table schema, sent once per stream before the first row that uses it.
* ``["t", commit_ts, position, source_ts, gtid, ddl, snapshot, nrows, rows]``: a
  transaction (``snapshot``: nil, ``[run, chunk, last]``, or a chunk's ``[run, chunk, last,
  db, table, read_at]``). ``rows`` holds its first row changes; when it holds fewer than
  ``nrows``, ``["c", rows]`` values follow (in this batch or the next ones) until
  ``nrows`` are read: a big transaction never makes one big message.
* ``["h", commit_ts, position]``: a heartbeat.

A row change is ``[sid, op, before, after]``: ``op`` 0..3 (insert, update, delete,
read), an image a list of values in the schema's column order (a map when its
columns differ from the schema's), or nil. Values are msgpack's own types plus
extension types for Decimal, datetime, date, time, timedelta, set and integers
beyond 64 bits. Positions are their checkpoint JSON (``position_from_json``).

Why msgpack inside protobuf: the frame (``proto/agent.proto``) is protobuf, the
rows are msgpack because one protobuf message per value costs about a microsecond
per column in Python, which would cap a 10-column stream near 100k rows/s on each
side (``bench/bench.py agent`` measures the transport). msgpack is safe to read from
a peer (no code is run, unlike pickle): a malformed batch is an error, not an exploit.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgpack

from capturer.model import (
    ChunkMark,
    ColumnInfo,
    Ddl,
    Heartbeat,
    Item,
    Op,
    RowChange,
    SnapshotMark,
    TableSchema,
    position_from_json,
)
from capturer.model.encode import _fastrows
from capturer.model.spill import DEFAULT_CHUNK_ROWS, SpillWriter

PROTOCOL = 1
OPS: tuple[Op, ...] = ("insert", "update", "delete", "read")
_OP_CODE = {op: i for i, op in enumerate(OPS)}
CHUNK_ROWS = 2000  # rows per "t"/"c" value
BATCH_BYTES = 1 << 20  # a batch is sent once its items pass this size

_EXT_DECIMAL, _EXT_DATETIME, _EXT_DATE, _EXT_TIME, _EXT_TIMEDELTA, _EXT_SET, _EXT_BIGINT = range(1, 8)


class WireError(ValueError):
    """A batch that does not follow this format (a bug or a foreign peer)."""


def _default(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(v).encode())
    if isinstance(v, dt.datetime):
        return msgpack.ExtType(_EXT_DATETIME, v.isoformat().encode())
    if isinstance(v, dt.date):
        return msgpack.ExtType(_EXT_DATE, v.isoformat().encode())
    if isinstance(v, dt.time):
        return msgpack.ExtType(_EXT_TIME, v.isoformat().encode())
    if isinstance(v, dt.timedelta):
        return msgpack.ExtType(_EXT_TIMEDELTA, _packb([v.days, v.seconds, v.microseconds]))
    if isinstance(v, (set, frozenset)):
        return msgpack.ExtType(_EXT_SET, _packb(sorted(v, key=repr)))
    if isinstance(v, int):  # beyond 64 bits (msgpack raises OverflowError before asking)
        return msgpack.ExtType(_EXT_BIGINT, str(v).encode())
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"cannot send a value of type {type(v).__name__} to the capturer")


def _ext_hook(code: int, data: bytes) -> Any:
    # the common ones first: one Python call per value (the backlog reads millions)
    if code == _EXT_DECIMAL:
        return _Decimal(data.decode())
    if code == _EXT_DATETIME:
        return _fromisoformat(data.decode())
    if code == _EXT_DATE:
        return dt.date.fromisoformat(data.decode())
    if code == _EXT_TIME:
        return dt.time.fromisoformat(data.decode())
    if code == _EXT_TIMEDELTA:
        d, sec, us = unpackb(data)
        return dt.timedelta(days=d, seconds=sec, microseconds=us)
    if code == _EXT_SET:
        return set(unpackb(data))
    if code == _EXT_BIGINT:
        return int(data.decode())
    raise WireError(f"unknown msgpack extension type {code}")


_Decimal = decimal.Decimal
_fromisoformat = dt.datetime.fromisoformat

# the C build (capturer/_native/) packs and unpacks rows and the common extension values
# (the same bytes and values as the Python path below: tests/unit/test_agent_wire.py compares them)
_fast: Any = _fastrows if _fastrows is not None and hasattr(_fastrows, "wire_rows") else None
_EXT_HOOK: Any = _ext_hook
if _fast is not None:
    _fast.wire_setup(msgpack.ExtType, _ext_hook)
    _EXT_HOOK = _fast.wire_ext


_unpack_item: Any = getattr(_fast, "wire_unpack_item", None) if _fast is not None else None
# msgpack.packb makes a Packer with a 256 KiB buffer per call: past the capturer's malloc mmap threshold
# (capturer/util/memory.py) an mmap and an munmap each time; the C packer grows a small buffer instead
_pack: Any = getattr(_fast, "wire_pack", None) if _fast is not None else None


def _packb(v: Any) -> bytes:
    return msgpack.packb(v, default=_default, unicode_errors="surrogatepass", use_bin_type=True)


def _big_ints(v: Any) -> Any:
    """``v`` with integers beyond 64 bits made extension values (the slow path)."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v if -(1 << 63) <= v < 1 << 64 else msgpack.ExtType(_EXT_BIGINT, str(v).encode())
    if isinstance(v, dict):
        return {k: _big_ints(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_big_ints(x) for x in v]
    return v


def packb(v: Any) -> bytes:
    if _pack is not None and _fast is not None:  # the same bytes (tests/unit/test_agent_wire.py compares them)
        try:
            return _pack(v, _default)
        except ValueError:  # nested deeper than C goes: msgpack's own answer
            pass
    try:
        return _packb(v)
    except OverflowError:
        return _packb(_big_ints(v))


def unpackb(data: bytes) -> Any:
    if _fast is not None:
        return _fast.wire_unpack(data)
    return msgpack.unpackb(data, ext_hook=_EXT_HOOK, unicode_errors="surrogatepass", raw=False,
                           strict_map_key=False)


def unpack_item(data: bytes, decoder: Decoder, max_rows: int) -> list[Any] | None:
    """The values of one msgpack array (a backlog record's payload) with the rows of its "t" and "c"
    values already made ``RowChange`` objects (``decoder``'s schemas), in C: None where the C build is
    missing, or when a transaction holds more than ``max_rows`` rows (> 0). ValueError (TypeError,
    KeyError) for data that is not that: the caller's reference path (``unpackb`` and ``TxnReader``)
    reads it again and says what is wrong."""
    if _unpack_item is None or _fast is None:
        return None
    return _unpack_item(data, decoder.schemas, RowChange, OPS, max_rows)


def position_json(pos: Any) -> Any:
    if pos is None:
        return None
    return getattr(pos, "checkpoint_json", pos.to_json)()


def read_position(d: Any) -> Any:
    if d is None:
        return None
    try:
        return position_from_json(d)
    except ValueError as exc:
        raise WireError(f"bad position {d!r}: {exc}") from None


_C_HEAD = b"\x92\xa1c"  # a packed 2-element array and "c": ["c", rows] is this, then the rows


class Encoder:
    """Items -> msgpack values, for one stream (it remembers which schemas it sent)."""

    def __init__(self) -> None:
        self._sent: dict[int, tuple[int, TableSchema]] = {}  # id(schema) -> (sid, schema kept alive)

    def _sid(self, schema: TableSchema, out: list[bytes]) -> int:
        hit = self._sent.get(id(schema))
        if hit is not None and hit[1] is schema:
            return hit[0]
        sid = len(self._sent) + 1
        self._sent[id(schema)] = (sid, schema)
        out.append(packb(["s", sid, schema.db, schema.table, list(schema.columns), list(schema.pk),
                          [list(u) for u in schema.unique_keys], list(schema.column_types),
                          [[c.type, c.unsigned, c.precision, c.scale, c.binary] for c in schema.column_info]]))
        return sid

    def _rows(self, changes: Any, out: list[bytes]) -> list[Any]:
        rows = []
        cols_of: dict[int, tuple[int, tuple[str, ...]]] = {}
        for ch in changes:
            s = ch.schema
            hit = cols_of.get(id(s))
            if hit is None:
                hit = cols_of[id(s)] = (self._sid(s, out), s.columns)
            sid, cols = hit
            b, a = ch.before, ch.after
            if b is not None:
                b = list(b.values()) if tuple(b) == cols else b
            if a is not None:
                a = list(a.values()) if tuple(a) == cols else a
            rows.append([sid, _OP_CODE[ch.op], b, a])
        return rows

    def _rows_packed(self, changes: Any, out: list[bytes]) -> bytes:
        """``packb(self._rows(changes, out))``, in C where it was built."""
        if _fast is not None:
            return _fast.wire_rows(changes, lambda schema: self._sid(schema, out), _OP_CODE, _default)
        return packb(self._rows(changes, out))

    def item(self, item: Item) -> Iterator[tuple[bytes, int]]:
        """(msgpack value, rows in it) pieces for ``item``, in order."""
        if isinstance(item, Heartbeat):
            yield packb(["h", item.commit_ts, position_json(item.position)]), 0
            return
        ddl = item.ddl
        d = None if ddl is None else [ddl.db, ddl.sql, ddl.table, ddl.session_db, ddl.seq]
        m = item.snapshot
        # a chunk's mark with its table and the position it was read at (what the file's and Kafka's lines show)
        snap = None if m is None else [m.run, m.chunk, m.last] if not isinstance(m, ChunkMark) else \
            [m.run, m.chunk, m.last, m.db, m.table, position_json(m.read_at)]
        changes = item.changes
        n = len(changes)
        chunks = changes.chunks() if hasattr(changes, "chunks") else \
            (changes[i:i + CHUNK_ROWS] for i in range(0, n, CHUNK_ROWS))
        first = True
        for chunk in chunks:
            for i in range(0, len(chunk), CHUNK_ROWS):
                pre: list[bytes] = []
                part = chunk[i:i + CHUNK_ROWS]
                rows = self._rows_packed(part, pre)
                if first:  # ["t", ..., rows]: the head packed, then the rows' packed array
                    head = packb(["t", item.commit_ts, position_json(item.position), item.source_ts, item.gtid, d,
                                  snap, n, None])
                    v = head[:-1] + rows  # (the placeholder nil is the last byte)
                    first = False
                else:
                    v = _C_HEAD + rows
                for p in pre:
                    yield p, 0
                yield v, len(part)
        if first:
            yield packb(["t", item.commit_ts, position_json(item.position), item.source_ts, item.gtid, d, snap,
                         0, []]), 0


class Decoder:
    """msgpack values -> schemas, row changes, transaction headers and heartbeats,
    for one stream (the caller puts a transaction together, on disk when big)."""

    def __init__(self, region: str) -> None:
        self.region = region
        self.schemas: dict[int, tuple[TableSchema, tuple[str, ...]]] = {}
        # the backlog's readers: a position equal to the last one read is that object again (a heartbeat
        # after its transaction); off for the agents' streams, whose regions tell a new position by identity
        self.reuse_positions = False
        self._last_pos_json: Any = None
        self._last_pos: Any = None

    def schema(self, v: list[Any]) -> None:
        try:
            _, sid, db, table, cols, pk, uks, types, infos = v
            s = TableSchema(db, table, tuple(cols), tuple(pk), tuple(tuple(u) for u in uks), tuple(types),
                            tuple(ColumnInfo(*c) for c in infos))
        except (TypeError, ValueError) as exc:
            raise WireError(f"bad schema {v!r}: {exc}") from None
        self.schemas[sid] = (s, s.columns)

    def rows(self, rows: list[Any]) -> list[RowChange]:
        if _fast is not None and rows.__class__ is list:
            try:
                return _fast.wire_unrows(rows, self.schemas, RowChange, OPS)
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise WireError(f"bad row change: {exc!r}") from None
        out = []
        schemas = self.schemas
        try:
            for sid, op, b, a in rows:
                s, cols = schemas[sid]
                if b.__class__ is list:
                    b = dict(zip(cols, b))
                if a.__class__ is list:
                    a = dict(zip(cols, a))
                out.append(RowChange(s, OPS[op], b, a))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise WireError(f"bad row change: {exc!r}") from None
        return out

    def header(self, v: list[Any]) -> tuple[dict[str, Any], int, list[RowChange]]:
        """A "t" value: (the Txn's fields but changes, rows in all, its first row changes)."""
        fields, n = self.fields(v)
        return fields, n, self.rows(v[8])

    def fields(self, v: list[Any]) -> tuple[dict[str, Any], int]:
        """A "t" value's header: (the Txn's fields but changes, rows in all)."""
        try:
            _, commit_ts, pos, source_ts, gtid, d, snap, n, _rows = v
            fields = {"region": self.region, "commit_ts": int(commit_ts), "position": self._position(pos),
                      "source_ts": int(source_ts), "gtid": str(gtid),
                      "ddl": None if d is None else Ddl(d[0], d[1], d[2], d[3], int(d[4])),
                      "snapshot": self._mark(snap)}
            return fields, int(n)
        except (TypeError, ValueError, IndexError) as exc:
            raise WireError(f"bad transaction header: {exc!r}") from None

    def _mark(self, snap: Any) -> SnapshotMark | None:
        """A snapshot mark: [run, chunk, last], or a chunk's [run, chunk, last, db, table, read_at]."""
        if snap is None:
            return None
        if len(snap) >= 6:
            return ChunkMark(str(snap[0]), int(snap[1]), bool(snap[2]), str(snap[3]), str(snap[4]),
                             read_position(snap[5]))
        return SnapshotMark(str(snap[0]), int(snap[1]), bool(snap[2]))

    def _position(self, d: Any) -> Any:
        """``read_position(d)``; with ``reuse_positions``, the same object again for the same value
        as the last one (positions are immutable)."""
        if not self.reuse_positions:
            return read_position(d)
        if d is not None and d == self._last_pos_json:
            return self._last_pos
        pos = read_position(d)
        self._last_pos_json, self._last_pos = d, pos
        return pos

    def heartbeat(self, v: list[Any]) -> Heartbeat:
        try:
            _, ts, pos = v
            return Heartbeat(self.region, int(ts), self._position(pos))
        except (TypeError, ValueError) as exc:
            raise WireError(f"bad heartbeat {v!r}: {exc}") from None


class TxnReader:
    """Puts transactions together from a stream's values (``"s"``, ``"t"``, ``"c"``,
    ``"h"``, in order, across as many ``feed`` calls as they come in): each whole one
    goes to ``on_txn(fields, changes, spilled)``, its rows on disk once it has more
    than ``spill_rows`` (0 = never), each heartbeat to ``on_heartbeat``."""

    def __init__(self, decoder: Decoder, spill_rows: int, spill_dir: str,
                 on_txn: Callable[[dict[str, Any], Any, bool], None],
                 on_heartbeat: Callable[[Heartbeat], None] | None = None):
        self.decoder = decoder
        self.spill_rows = spill_rows
        self.spill_dir = spill_dir or None
        self.on_txn = on_txn
        self.on_heartbeat = on_heartbeat
        # the transaction being read: its fields, rows in all, rows in memory, its spill, rows so far
        self._fields: dict[str, Any] | None = None
        self._total = self._count = 0
        self._rows: list[RowChange] = []
        self._spill: SpillWriter | None = None

    @property
    def inside(self) -> bool:
        """A transaction was started and not finished."""
        return self._fields is not None

    def feed(self, values: Iterable[list[Any]]) -> None:
        decoder = self.decoder
        for v in values:
            tag = v[0]
            if tag == "c":
                if self._fields is None:
                    raise WireError("rows of a transaction that was not started")
                self._more(decoder.rows(v[1]))
            elif tag == "t":
                if self._fields is not None:
                    raise WireError("a transaction started before the previous one ended")
                fields, total, rows = decoder.header(v)
                self._fields, self._total, self._count, self._rows, self._spill = fields, total, 0, [], None
                self._more(rows)
            elif tag == "h":
                if self._fields is not None:
                    raise WireError("a heartbeat inside a transaction")
                if self.on_heartbeat is None:
                    raise WireError("a heartbeat where none is expected")
                self.on_heartbeat(decoder.heartbeat(v))
            elif tag == "s":
                decoder.schema(v)
            else:
                raise WireError(f"unknown item {tag!r}")
            if self._fields is not None and self._count >= self._total:
                fields, rows, w = self._fields, self._rows, self._spill
                self._fields, self._rows, self._spill = None, [], None
                self.on_txn(fields, w.finish() if w is not None else tuple(rows), w is not None)

    def _more(self, rows: list[RowChange]) -> None:
        self._count += len(rows)
        if self._count > self._total:
            raise WireError(f"a transaction has more rows than its header said ({self._total})")
        self._rows.extend(rows)
        # the header gave the size: a transaction that will be spilled is, from its first rows
        if self._spill is None and self.spill_rows and self._total > self.spill_rows:
            self._spill = SpillWriter(self.spill_dir, min(self.spill_rows, DEFAULT_CHUNK_ROWS))
        w = self._spill
        if w is not None and (len(self._rows) >= w.chunk_rows or self._count == self._total):
            w.add(self._rows)
            self._rows = []

    def discard(self) -> None:
        """Forget a transaction read in part (the stream broke off; its spill file,
        a temporary file, goes with it)."""
        self._fields, self._rows, self._spill = None, [], None


def new_unpacker(file_like: Any = None, max_buffer_size: int = 1 << 20) -> Any:
    """A msgpack Unpacker that reads this format (its extension types, lone surrogates),
    fed by hand or reading ``file_like``."""
    return msgpack.Unpacker(file_like, ext_hook=_EXT_HOOK, unicode_errors="surrogatepass", raw=False,
                            strict_map_key=False, max_buffer_size=max_buffer_size)


def unpacker(data: bytes) -> Iterator[Any]:
    u = new_unpacker(max_buffer_size=max(len(data), 1 << 20))
    u.feed(data)
    try:
        for v in u:
            if not isinstance(v, list) or not v:
                raise WireError(f"bad item {v!r:.80}")
            yield v
    except (msgpack.UnpackException, ValueError) as exc:
        if isinstance(exc, WireError):
            raise
        raise WireError(f"bad batch: {exc}") from None

