"""A faster row decoder for binlog rows events, planned once per table map.

python-mysql-replication decodes every column through a chain of method calls
on a packet wrapper (about 55 us per 10-column row on CPython). Here, the
library still does the framing (events, table maps, positions); for a rows
event we take the remaining event bytes in one read and decode them with a
per-table plan: one small function per column, chosen when the table map is
first seen, working on offsets into one ``bytes`` object.

The output is the library's output, value for value (an integration test
compares both on every column type), with two deliberate differences that
``normalise_library_row`` applies to the library path too: an empty SET is
``set()``, not ``None`` (the library cannot tell it from NULL otherwise), and
an empty binary string is ``b""``, not ``""``.

``capturer/_native/`` is the same decoder in C, used when it was built
(``Plan.rows``); this module's Python functions are its fallback and its
specification.

A table with a column type the plan does not know (MySQL's binary JSON, the
pre-5.6 temporal types) returns ``None``: the caller then uses the library.
"""

from __future__ import annotations

import codecs
import datetime as dt
import decimal
import struct
from collections.abc import Callable
from typing import Any

from pymysql.charset import charset_by_name
from pymysqlreplication.constants import FIELD_TYPE as T

# the C build of this decoder (capturer/_native/, where setup.py could build it); None without it
from capturer.model.encode import _fastrows

Decoder = Callable[[bytes, int], tuple[Any, int]]

_EPOCH = dt.datetime(1970, 1, 1)
_DIG2BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]


def _struct(fmt: str) -> Decoder:
    s = struct.Struct(fmt)
    unpack, size = s.unpack_from, s.size

    def dec(d: bytes, o: int) -> tuple[Any, int]:
        return unpack(d, o)[0], o + size

    return dec


def _int24(unsigned: bool) -> Decoder:
    def dec(d: bytes, o: int) -> tuple[Any, int]:
        v = d[o] | (d[o + 1] << 8) | (d[o + 2] << 16)
        if not unsigned and v & 0x800000:
            v -= 0x1000000
        return v, o + 3

    return dec


def _year(d: bytes, o: int) -> tuple[Any, int]:
    """YEAR is stored as year - 1900, and 0 for the zero year '0000' (which the
    library reads as 1900, a value YEAR cannot hold)."""
    return (d[o] + 1900 if d[o] else 0), o + 1


# MySQL's UTF-16/UTF-32/UCS-2 are big-endian without a BOM: pymysql knows none of them, and Python's codecs of
# those names ('utf16', 'utf32') read a little-endian text (a utf32 value failed the region; a utf16 one
# arrived as other characters) and it has no 'ucs2' (its values arrived as bytes)
_WIDE = {"utf16": "utf-16-be", "utf32": "utf-32-be", "ucs2": "utf-16-be", "utf16le": "utf-16-le"}


def _encoding(column: Any) -> str | None:
    """The Python codec the library would decode with; None = keep bytes."""
    name = column.character_set_name
    if name is None:
        return "utf-8"
    if name.lower() in _WIDE:
        return _WIDE[name.lower()]
    cs = charset_by_name(name)
    enc = cs.encoding if cs else name
    try:
        codecs.lookup(enc)
    except LookupError:
        return None
    return enc


def _mysql_latin1(exc: UnicodeError) -> tuple[str, int]:
    """MySQL's latin1 is cp1252 with the five bytes cp1252 leaves undefined
    (0x81, 0x8D, 0x8F, 0x90, 0x9D) mapped to the same code points; Python's
    cp1252 codec (which pymysql picks for latin1) refuses them."""
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    bad = exc.object[exc.start:exc.end]
    return "".join(chr(b) for b in bad), exc.end


codecs.register_error("capturer-mysql-latin1", _mysql_latin1)


def _errors(enc: str | None) -> str:
    return "capturer-mysql-latin1" if enc == "cp1252" else "strict"


def _lenstr(prefix: int, enc: str | None) -> Decoder:
    errors = _errors(enc)
    if prefix == 1:
        def dec(d: bytes, o: int) -> tuple[Any, int]:
            n = d[o]
            o += 1
            raw = d[o:o + n]
            return (raw.decode(enc, errors) if enc else raw), o + n
        return dec
    fmt = {2: "<H", 3: None, 4: "<I"}.get(prefix)

    def dec2(d: bytes, o: int) -> tuple[Any, int]:
        if fmt is None:
            n = d[o] | (d[o + 1] << 8) | (d[o + 2] << 16)
        else:
            n = struct.unpack_from(fmt, d, o)[0]
        o += prefix
        raw = d[o:o + n]
        return (raw.decode(enc, errors) if enc else raw), o + n
    return dec2


def _be_signed(b: bytes | bytearray) -> int:
    return int.from_bytes(b, "big", signed=True)


def _fsp_reader(fsp: int) -> tuple[int, Callable[[bytes, int], int]]:
    """(bytes, fn) reading the fractional seconds as the library does."""
    nbytes = (fsp + 1) // 2
    if nbytes == 0:
        return 0, lambda d, o: 0
    scale = 10 ** (6 - fsp)
    odd = fsp % 2

    def read(d: bytes, o: int) -> int:
        v = _be_signed(d[o:o + nbytes])
        if odd:
            v = int(v / 10)
        return v * scale

    return nbytes, read


def _datetime2(fsp: int) -> Decoder:
    nf, frac = _fsp_reader(fsp)

    def dec(d: bytes, o: int) -> tuple[Any, int]:
        v = int.from_bytes(d[o:o + 5], "big")
        ym = (v >> 22) & 0x1FFFF
        try:
            t = dt.datetime(ym // 13, ym % 13, (v >> 17) & 31, (v >> 12) & 31, (v >> 6) & 63, v & 63)
        except ValueError:
            return None, o + 5 + nf
        us = frac(d, o + 5)
        return (t.replace(microsecond=us) if us > 0 else t), o + 5 + nf

    return dec


def _timestamp2(fsp: int) -> Decoder:
    nf, frac = _fsp_reader(fsp)

    def dec(d: bytes, o: int) -> tuple[Any, int]:
        # unsigned seconds, as the server reads them: MariaDB 11.5+ keeps TIMESTAMP up to 2106-02-07 06:28:15
        # UTC, past 2^31 s (read signed: 1901-1969)
        secs = struct.unpack_from(">I", d, o)[0]
        t = _EPOCH + dt.timedelta(seconds=secs)
        us = frac(d, o + 4)
        if secs == 0 and us <= 999999:
            # the zero TIMESTAMP ('0000-00-00 00:00:00' is stored as 0 s: 1970-01-01 00:00:00 UTC is below
            # the type's range) is a date no calendar has: None, as a zero DATETIME (docs/limits.md)
            return None, o + 4 + nf
        return (t.replace(microsecond=us) if us > 0 else t), o + 4 + nf

    return dec


def time2_packed(d: bytes, o: int, fsp: int) -> int:
    """MySQL's packed TIME (``intpart << 24 | microseconds``, signed) of a TIME2
    value, as the server reads it (``my_time_packed_from_binary``). A negative
    time with a fraction stores its integer part rounded up and the fraction as
    a negative complement, which python-mysql-replication does not undo (it reads
    '-01:00:00.25' as -00:59:59.75)."""
    if fsp >= 5:
        return int.from_bytes(d[o:o + 6], "big") - 0x800000000000
    intpart = int.from_bytes(d[o:o + 3], "big") - 0x800000
    if fsp == 0:
        return intpart << 24
    nb, unit, span = (1, 10000, 0x100) if fsp <= 2 else (2, 100, 0x10000)
    frac = int.from_bytes(d[o + 3:o + 3 + nb], "big")
    if intpart < 0 and frac:
        intpart += 1
        frac -= span
    return (intpart << 24) + frac * unit


def _time2(fsp: int) -> Decoder:
    nf = (fsp + 1) // 2

    def dec(d: bytes, o: int) -> tuple[Any, int]:
        if o + 3 + nf > len(d):
            raise IndexError("TIME2 value truncated")
        packed = time2_packed(d, o, fsp)
        a = -packed if packed < 0 else packed
        ip = a >> 24
        us = ((((ip >> 12) & 0x3FF) * 60 + ((ip >> 6) & 63)) * 60 + (ip & 63)) * 1_000_000 + (a & 0xFFFFFF)
        return dt.timedelta(microseconds=-us if packed < 0 else us), o + 3 + nf

    return dec


def _date(d: bytes, o: int) -> tuple[Any, int]:
    v = d[o] | (d[o + 1] << 8) | (d[o + 2] << 16)
    if v == 0:
        return None, o + 3
    y, m, day = (v >> 9) & 0x7FFF, (v >> 5) & 15, v & 31
    if y == 0 or m == 0 or day == 0:
        return None, o + 3
    try:
        return dt.date(y, m, day), o + 3
    except ValueError:  # e.g. 2020-02-30 under ALLOW_INVALID_DATES: like a zero date
        return None, o + 3


def _decimal(precision: int, scale: int) -> Decoder:
    intg = precision - scale
    intg0, intg0x = divmod(intg, 9)
    frac0, frac0x = divmod(scale, 9)
    lead, tail = _DIG2BYTES[intg0x], _DIG2BYTES[frac0x]
    size = lead + intg0 * 4 + frac0 * 4 + tail

    def dec(d: bytes, o: int) -> tuple[Any, int]:
        b = bytearray(d[o:o + size])
        negative = not (b[0] & 0x80)
        b[0] ^= 0x80
        mask = -1 if negative else 0
        parts = ["-"] if negative else []
        p = 0
        if lead:
            parts.append(str(_be_signed(b[p:p + lead]) ^ mask))
            p += lead
        for _ in range(intg0):
            parts.append(f"{struct.unpack_from('>i', b, p)[0] ^ mask:09d}")
            p += 4
        parts.append(".")
        for _ in range(frac0):
            parts.append(f"{struct.unpack_from('>i', b, p)[0] ^ mask:09d}")
            p += 4
        if tail:
            parts.append(f"{_be_signed(b[p:p + tail]) ^ mask:0{frac0x}d}")
        return decimal.Decimal("".join(parts)), o + size

    return dec


def _enum(size: int, values: list[str] | None) -> Decoder:
    def dec(d: bytes, o: int) -> tuple[Any, int]:
        idx = int.from_bytes(d[o:o + size], "little")
        return (values[idx] if values else None), o + size

    return dec


def _set(size: int, values: list[str] | None) -> Decoder:
    def dec(d: bytes, o: int) -> tuple[Any, int]:
        mask = int.from_bytes(d[o:o + size], "little")
        if not values:
            return None, o + size
        return {v for i, v in enumerate(values) if mask & (1 << i)}, o + size

    return dec


def _bit(nbits: int, nbytes: int) -> Decoder:
    def dec(d: bytes, o: int) -> tuple[Any, int]:
        v = int.from_bytes(d[o:o + nbytes], "big") & ((1 << nbits) - 1)
        return format(v, f"0{nbits}b"), o + nbytes

    return dec


_INT_SIZES = {T.TINY: 1, T.SHORT: 2, T.INT24: 3, T.LONG: 4, T.LONGLONG: 8}


def column_spec(c: Any) -> tuple[Any, ...] | None:
    """The column as the C decoder's spec (kinds as in capturer/_native/mysql_rows.c); None = unknown type."""
    t = c.type
    if t in _INT_SIZES:
        return (1, _INT_SIZES[t], int(bool(c.unsigned)))
    simple = {T.FLOAT: 2, T.DOUBLE: 3, T.YEAR: 4, T.DATE: 10}
    if t in simple:
        return (simple[t],)
    if t in (T.VARCHAR, T.STRING):
        enc = _encoding(c)
        return (5, 2 if c.max_length > 255 else 1, enc, _errors(enc))
    if t == T.BLOB:
        enc = _encoding(c)
        return (5, c.length_size, enc, _errors(enc))
    if t == T.GEOMETRY:
        return (5, c.length_size, None)
    if t == T.NEWDECIMAL:
        return (6, c.precision, c.decimals)
    if t in (T.DATETIME2, T.TIMESTAMP2, T.TIME2):
        return ({T.DATETIME2: 7, T.TIMESTAMP2: 8, T.TIME2: 9}[t], c.fsp)
    if t in (T.ENUM, T.SET):
        values = c.enum_values if t == T.ENUM else c.set_values
        return (11 if t == T.ENUM else 12, c.size, tuple(values) if values else None)
    if t == T.BIT:
        return (13, c.bits, c.bytes)
    return None


def column_decoder(c: Any) -> Decoder | None:
    t, u = c.type, c.unsigned
    if t == T.TINY:
        return _struct("<B" if u else "<b")
    if t == T.SHORT:
        return _struct("<H" if u else "<h")
    if t == T.LONG:
        return _struct("<I" if u else "<i")
    if t == T.LONGLONG:
        return _struct("<Q" if u else "<q")
    if t == T.INT24:
        return _int24(u)
    if t == T.FLOAT:
        return _struct("<f")
    if t == T.DOUBLE:
        return _struct("<d")
    if t == T.YEAR:
        return _year
    if t in (T.VARCHAR, T.STRING):
        return _lenstr(2 if c.max_length > 255 else 1, _encoding(c))
    if t == T.BLOB:
        return _lenstr(c.length_size, _encoding(c))
    if t == T.GEOMETRY:
        return _lenstr(c.length_size, None)
    if t == T.NEWDECIMAL:
        return _decimal(c.precision, c.decimals)
    if t == T.DATETIME2:
        return _datetime2(c.fsp)
    if t == T.TIMESTAMP2:
        return _timestamp2(c.fsp)
    if t == T.TIME2:
        return _time2(c.fsp)
    if t == T.DATE:
        return _date
    if t == T.ENUM:
        return _enum(c.size, c.enum_values)
    if t == T.SET:
        return _set(c.size, c.set_values)
    if t == T.BIT:
        return _bit(c.bits, c.bytes)
    return None  # JSON (MySQL binary), DATETIME/TIME/TIMESTAMP (pre-5.6), ...


class TablePlan:
    def __init__(self, columns: list[Any], use_c: bool = True):
        self.names = [c.name for c in columns]
        decs = [column_decoder(c) for c in columns]
        self.ok = all(d is not None for d in decs) and all(self.names)
        self.decoders: list[Decoder] = [d for d in decs if d is not None]
        self.n = len(columns)
        self.null_bytes = (self.n + 7) // 8
        # the C decoder, when built, does the same work on the same plan
        self.c: Any = None
        if self.ok and use_c and _fastrows is not None:
            specs = [column_spec(c) for c in columns]
            if all(sp is not None for sp in specs):
                self.c = _fastrows.Plan(tuple(self.names), tuple(specs))

    def rows(self, data: bytes, update: bool) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        if self.c is not None:
            return self.c.rows(data, update)
        out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        o, end = 0, len(data)
        if data and not self.n:  # a row of no columns takes no bytes: it would never end
            raise ValueError("row bytes for a plan without columns")
        row = self.row
        if update:
            while o < end:
                before, o = row(data, o)
                after, o = row(data, o)
                out.append((before, after))
        else:
            while o < end:
                image, o = row(data, o)
                out.append((image, None))
        if o > end:  # a value ran past the end (slicing gave it fewer bytes): as the C decoder, an error
            raise ValueError(f"rows event truncated at byte {end}")
        return out

    def row(self, d: bytes, o: int) -> tuple[dict[str, Any], int]:
        nb = d[o:o + self.null_bytes]
        o += self.null_bytes
        vals: list[Any] = []
        append = vals.append
        for i, dec in enumerate(self.decoders):
            if nb[i >> 3] & (1 << (i & 7)):
                append(None)
            else:
                v, o = dec(d, o)
                append(v)
        return dict(zip(self.names, vals)), o


_plans: dict[tuple[int, bool], tuple[Any, TablePlan, tuple[Any, ...]]] = {}


def plan_for(ev: Any, use_c: bool = True) -> TablePlan | None:
    table = ev.table_map.get(ev.table_id)
    if table is None:
        return None
    hit = _plans.get((ev.table_id, use_c))
    if hit is not None and hit[0] is table:
        return hit[1]
    # the library makes a new Table for every table map (one per transaction):
    # reuse the plan when the columns are the same
    sig = _signature(table.columns)
    if hit is not None and hit[2] == sig:
        _plans[(ev.table_id, use_c)] = (table, hit[1], sig)
        return hit[1]
    plan = TablePlan(list(table.columns), use_c)
    if len(_plans) > 10_000:
        _plans.clear()
    _plans[(ev.table_id, use_c)] = (table, plan, sig)
    return plan


_SIG_ATTRS = ("type", "name", "unsigned", "character_set_name", "max_length", "length_size", "precision",
              "decimals", "fsp", "size", "bits", "bytes")


def _signature(columns: list[Any]) -> tuple[Any, ...]:
    return tuple((tuple(getattr(c, a, None) for a in _SIG_ATTRS),
                  tuple(c.enum_values or ()), tuple(c.set_values or ())) for c in columns)


def _full(bitmap: bytes, n: int) -> bool:
    return all(bitmap[i >> 3] & (1 << (i & 7)) for i in range(n))


def fast_rows(ev: Any, update: bool, use_c: bool = True) -> list[tuple[dict[str, Any], dict[str, Any] | None]] | None:
    """Rows of a rows event as (image, after-image-or-None); None when this event
    must go through the library (unknown type, partial row image). ``use_c``:
    the C decoder where it is built (False: the Python one, for comparisons)."""
    if not getattr(ev, "complete", True) or not getattr(ev, "_processed", True):
        return None
    plan = plan_for(ev, use_c)
    if plan is None or not plan.ok or ev.number_of_columns != plan.n:
        return None
    if not _full(ev.columns_present_bitmap, plan.n):
        return None
    if update and not _full(ev.columns_present_bitmap2, plan.n):
        return None
    data = bytes(ev.packet.read(ev.event_size - ev.packet.read_bytes))
    return plan.rows(data, update)


def c_decoder_built() -> bool:
    return _fastrows is not None


def binary_columns(columns: list[Any]) -> frozenset[str]:
    return frozenset(c.name for c in columns if str(c.character_set_name or "").lower() == "binary")


_WRAP = dt.timedelta(seconds=1 << 32)


def normalise_library_row(values: dict[str, Any], none_sources: dict[str, Any],
                          binary: frozenset[str] = frozenset(), stamps: frozenset[str] = frozenset()) -> dict[str, Any]:
    """An empty SET is set(), not None (the library reports it in none_sources);
    an empty binary string is b"", not "" (``b"".decode("binary")`` gives "");
    a TIMESTAMP (``stamps``) past 2038 (MariaDB 11.5+ keeps them up to 2106), which the
    library reads as signed seconds (a 1901-1969 date, which no TIMESTAMP is), moved
    back by 2^32 s to the value the server holds (as the fast decoder reads it)."""
    for col, why in none_sources.items():
        if why == "empty set" and values.get(col) is None:
            values[col] = set()
    for col in binary:
        if values.get(col) == "":
            values[col] = b""
    for col in stamps:
        v = values.get(col)
        if isinstance(v, dt.datetime) and v.year < 1970:
            values[col] = v + _WRAP
    return values
