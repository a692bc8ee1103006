"""Decoding BaikalDB binlog entries: payloads, mutations and row bytes.

A row (``insert_rows[j]`` / ``deleted_rows[j]`` of a ``TableMutation``) is the
protobuf serialisation of a per-table dynamic message whose field numbers are
the table's ``field_id``s. **A field that is absent is NULL**; a present 0, ""
or false is a value (never replaced by the column default). Values:

* INT8/16/32 ``sint32`` and INT64 ``sint64`` (zigzag varints); UINT8..UINT64
  plain varints (UINT64 up to 2^64-1); BOOL a varint, given as 0/1;
* FLOAT ``float`` (32-bit), DOUBLE ``double`` (BaikalDB keeps DECIMAL as DOUBLE);
* STRING and JSON: bytes in the table charset (UTF8 or GBK), given as text, or as
  bytes when they do not decode (binary data in a STRING column);
  HLL/BITMAP/TDIGEST: bytes;
* DATETIME ``fixed64`` packed (year*13+month)<<46 | day<<41 | hour<<36 |
  minute<<30 | second<<24 | microsecond -> ``datetime``; DATE ``fixed32``
  (year*13+month)<<5 | day -> ``date``; TIME ``sfixed32`` sign + hour<<12 |
  minute<<6 | second -> ``timedelta``; TIMESTAMP ``fixed32`` Unix seconds ->
  ``datetime`` in UTC. Zero or impossible dates are NULL, as MySQL regions give them.

Field numbers the table version does not know are reported to the caller (a
newer schema: refetch it); numbers of dropped columns are skipped.

``RowPlan.decode`` is the specification; ``capturer/_native/``
(``baikal_rows``) is the same decoder in C, used when it was built.
"""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass
from typing import Any

from capturer.model import RowChange
from capturer.model.changes import make_change, make_changes

# the C build (setup.py builds it where a compiler is present); None without it
from capturer.model.encode import _fastrows
from capturer.regions.baikaldb.schema import (
    K_BOOL,
    K_BYTES,
    K_DATE,
    K_DATETIME,
    K_DOUBLE,
    K_FLOAT,
    K_SINT32,
    K_SINT64,
    K_TEXT,
    K_TIME,
    K_TIMESTAMP,
    K_UINT,
    WIRE,
    TableDef,
)

_F = struct.Struct("<f").unpack_from
_D = struct.Struct("<d").unpack_from
_Q = struct.Struct("<Q").unpack_from
_I = struct.Struct("<I").unpack_from
_i = struct.Struct("<i").unpack_from
_EPOCH = dt.datetime(1970, 1, 1)


class RowDecodeError(ValueError):
    """Row bytes that are not a valid protobuf message."""


def _varint(d: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(d):
            raise RowDecodeError("truncated varint")
        b = d[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, i
        shift += 7
        if shift > 63:
            raise RowDecodeError("varint longer than 10 bytes")



def unpack_datetime(v: int) -> dt.datetime | None:
    ym = (v >> 46) & 0x1FFFF
    year, month = divmod(ym, 13)
    day = (v >> 41) & 0x1F
    try:
        return dt.datetime(year, month, day, (v >> 36) & 0x1F, (v >> 30) & 0x3F, (v >> 24) & 0x3F,
                           v & 0xFFFFFF)
    except ValueError:  # zero date (0000-00-00) or impossible values
        return None


def unpack_date(v: int) -> dt.date | None:
    ym = (v >> 5) & 0x1FFFF
    year, month = divmod(ym, 13)
    try:
        return dt.date(year, month, v & 0x1F)
    except ValueError:
        return None


def unpack_time(v: int) -> dt.timedelta:
    neg = v < 0
    if neg:
        v = -v
    td = dt.timedelta(hours=(v >> 12) & 0x3FF, minutes=(v >> 6) & 0x3F, seconds=v & 0x3F)
    return -td if neg else td


def unpack_timestamp(v: int) -> dt.datetime | None:
    if v <= 0:
        return None
    return _EPOCH + dt.timedelta(seconds=v)


def _convert(kind: int, raw: Any, encoding: str) -> Any:
    if kind in (K_SINT64, K_SINT32):
        return (raw >> 1) ^ -(raw & 1)
    if kind == K_UINT:
        return raw
    if kind == K_TEXT:
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            return raw
    if kind == K_BYTES:
        return raw
    if kind == K_DOUBLE:
        return _D(raw)[0]
    if kind == K_FLOAT:
        return _F(raw)[0]
    if kind == K_DATETIME:
        return unpack_datetime(_Q(raw)[0])
    if kind == K_DATE:
        return unpack_date(_I(raw)[0])
    if kind == K_TIME:
        return unpack_time(_i(raw)[0])
    if kind == K_TIMESTAMP:
        return unpack_timestamp(_I(raw)[0])
    if kind == K_BOOL:
        return 1 if raw else 0
    raise AssertionError(kind)  # pragma: no cover


def _by_wire(wt: int, raw: Any, encoding: str) -> Any:
    """A value whose wire type does not match its column's type (a type change
    left older rows in the old encoding): taken as the wire gives it."""
    if wt == 0:
        return raw
    if wt == 1:
        return _Q(raw)[0]
    if wt == 5:
        return _I(raw)[0]
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError:
        return raw


class RowPlan:
    """How to decode the rows of one table version."""

    def __init__(self, tdef: TableDef):
        self.tdef = tdef
        self.names = tuple(f.name for f in tdef.live)
        self.fields = {f.field_id: (f.name, f.kind, WIRE[f.kind]) for f in tdef.live}
        self.known = tdef.known_ids
        self.encoding = tdef.encoding
        self.mismatches = 0  # values whose wire type did not match their column's type
        self._c = None
        if _fastrows is not None and hasattr(_fastrows, "baikal_plan"):
            spec = tuple((f.field_id, f.name, f.kind) for f in tdef.live)
            self._c = _fastrows.baikal_plan(spec, tuple(sorted(self.known)), self.encoding)

    def decode(self, data: bytes) -> tuple[dict[str, Any], tuple[int, ...]]:
        """(column -> value for every live column, field numbers this version does not know)."""
        if self._c is not None:
            try:
                row, unknown, mism = self._c.row(data)
            except ValueError as exc:
                raise RowDecodeError(str(exc)) from None
            if mism:
                self.mismatches += mism
            return row, unknown
        return self.decode_py(data)

    def decode_py(self, data: bytes) -> tuple[dict[str, Any], tuple[int, ...]]:
        out: dict[str, Any] = dict.fromkeys(self.names)
        unknown: list[int] = []
        fields, enc, n, i = self.fields, self.encoding, len(data), 0
        raw: int | bytes  # a field's value as on the wire: varint or bytes
        while i < n:
            tag, i = _varint(data, i)
            fno, wt = tag >> 3, tag & 7
            if fno == 0:
                raise RowDecodeError("field number 0")
            if wt == 0:
                raw, i = _varint(data, i)
            elif wt == 2:
                ln, i = _varint(data, i)
                if i + ln > n:
                    raise RowDecodeError("truncated length-delimited field")
                raw = data[i:i + ln]
                i += ln
            elif wt == 1:
                if i + 8 > n:
                    raise RowDecodeError("truncated 64-bit field")
                raw = data[i:i + 8]
                i += 8
            elif wt == 5:
                if i + 4 > n:
                    raise RowDecodeError("truncated 32-bit field")
                raw = data[i:i + 4]
                i += 4
            else:
                raise RowDecodeError(f"unsupported wire type {wt} (field {fno})")
            f = fields.get(fno)
            if f is None:
                if fno not in self.known:
                    unknown.append(fno)
                continue
            name, kind, wire = f
            if wt != wire:
                self.mismatches += 1
                out[name] = _by_wire(wt, raw, enc)
            else:
                out[name] = _convert(kind, raw, enc)
        return out, tuple(unknown)


@dataclass
class Entry:
    """One entry of a binlog region: a committed transaction's prewrite payload
    (one partition's part of it) or a FAKE heartbeat."""

    ts: int  # BaikalDB commit TSO
    region_id: int
    fake: bool
    txn_id: int = 0
    start_ts: int = 0
    mutations: Any = ()  # repeated TableMutation
    partition_key: int = 0


def parse_entry(pb: Any, payload: bytes, ts: int, region_id: int) -> Entry:
    """A ``binlogs[i]`` element (a serialized ``StoreReq``) with its commit_ts."""
    req = pb.StoreReq()
    try:
        req.ParseFromString(payload)
    except Exception as exc:
        raise RowDecodeError(f"binlog payload at commit_ts {ts} is not a StoreReq: {exc}") from None
    b = req.binlog
    if b.type == 4 or req.op_type == 64:  # FAKE
        return Entry(ts, region_id, True)
    if b.type != 0:
        raise RowDecodeError(f"binlog entry at commit_ts {ts} has type {b.type}, expected PREWRITE or FAKE")
    desc = req.binlog_desc
    return Entry(ts, region_id, False, int(desc.txn_id), int(desc.start_ts or b.start_ts),
                 b.prewrite_value.mutations, int(b.partition_key))


class UnpairedUpdate(ValueError):
    """An UPDATE mutation whose old and new row counts differ."""


def mutation_changes(plan: RowPlan, mut: Any, split_unpaired: bool) -> tuple[list[RowChange], tuple[int, ...]]:
    """The row changes of one ``TableMutation`` and the unknown field numbers met.

    INSERT: ``insert_rows``; DELETE: ``deleted_rows``; UPDATE: old images in
    ``deleted_rows``, new ones in ``insert_rows``. Old and new are paired by
    primary key first (an unchanged key is an update of that row), and what is
    left by position (a primary-key change, e.g. ``SET id = id + 1``). With
    unequal counts (REPLACE / ON DUPLICATE KEY UPDATE can write those) the
    unpaired old rows become deletes and the unpaired new rows inserts when
    ``split_unpaired``; otherwise ``UnpairedUpdate`` is raised."""
    schema = plan.tdef.schema
    seq = set(mut.sequence)
    if len(seq) > 1:
        raise ValueError(f"mutation of {plan.tdef.name} has mixed kinds {sorted(seq)}")
    if mut.update_rows:
        raise ValueError(f"mutation of {plan.tdef.name} uses update_rows, which BaikalDB writers never set")
    kind = seq.pop() if seq else (1 if mut.insert_rows and mut.deleted_rows else 0 if mut.insert_rows else 2)
    unknown: list[int] = []

    def dec(rows: Any) -> list[dict[str, Any]]:
        out = []
        for r in rows:
            row, unk = plan.decode(r)
            if unk:
                unknown.extend(unk)
            out.append(row)
        return out

    if kind == 0:
        if mut.deleted_rows:
            raise ValueError(f"INSERT mutation of {plan.tdef.name} carries deleted rows")
        return make_changes(schema, 1, dec(mut.insert_rows)), tuple(unknown)
    if kind == 2:
        if mut.insert_rows:
            raise ValueError(f"DELETE mutation of {plan.tdef.name} carries inserted rows")
        return make_changes(schema, 2, dec(mut.deleted_rows)), tuple(unknown)
    old, new = dec(mut.deleted_rows), dec(mut.insert_rows)
    return pair_update(schema, old, new, split_unpaired, plan.tdef.name), tuple(unknown)


def pair_update(schema: Any, old: list[dict[str, Any]], new: list[dict[str, Any]], split_unpaired: bool,
                name: str) -> list[RowChange]:
    pk = schema.pk
    if len(old) != len(new) and not split_unpaired:
        raise UnpairedUpdate(f"UPDATE of {name} has {len(old)} old and {len(new)} new row images")
    pairs: dict[int, int] = {}  # old index -> new index
    if pk:
        by_key: dict[tuple[Any, ...], list[int]] = {}
        for j, r in enumerate(new):
            by_key.setdefault(tuple(r.get(c) for c in pk), []).append(j)
        for i, r in enumerate(old):
            js = by_key.get(tuple(r.get(c) for c in pk))
            if js:
                pairs[i] = js.pop(0)
    left_old = [i for i in range(len(old)) if i not in pairs]
    used = set(pairs.values())
    left_new = [j for j in range(len(new)) if j not in used]
    if len(left_old) == len(left_new):
        pairs.update(zip(left_old, left_new))
        return [make_change(schema, "update", old[i], new[pairs[i]]) for i in range(len(old))]
    out = [RowChange(schema, "delete", old[i], None) for i in left_old]
    out += [RowChange(schema, "update", old[i], new[j]) for i, j in sorted(pairs.items())]
    out += [RowChange(schema, "insert", None, new[j]) for j in left_new]
    return out
