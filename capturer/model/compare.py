"""What ``verify`` (capturer/ops/verify.py) compares, shared with the kinds that read
for it: one canonical form per column kind (``canon``), a source table as compared
(``TableMeta``), the contract of a sink's reader (``SinkReader``, implemented in
senders/<kind>/verify.py) and the base of a source's reader (``SqlSource``,
implemented in capturer/regions/<kind>/verify.py)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import hashlib
import json
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from capturer.model.encode import format_timedelta
from capturer.util.perthread import PerThread

# information_schema DATA_TYPE -> how its values are compared
KINDS = {
    **dict.fromkeys(("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"), "int"),
    **dict.fromkeys(("decimal", "numeric"), "decimal"),
    "float": "float32",  # single precision: compared as the float32 the binlog holds, not its shortest text
    **dict.fromkeys(("double", "real"), "float"),
    **dict.fromkeys(("datetime", "timestamp"), "datetime"),
    "date": "date", "time": "time", "bit": "bit", "set": "set", "json": "json",
    **dict.fromkeys(("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"), "bytes"),
    # spatial values are bytes too (the server's WKB with its SRID): JSON sinks carry them as base64
    **dict.fromkeys(("geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
                     "multipolygon", "geometrycollection"), "bytes"),
}


_ZERO = decimal.Decimal(0)


class _Absent:
    """A column the sink's row does not have at all (not the same as NULL)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


_FLOAT32 = struct.Struct("<f")


_DATE_SHAPE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _no_calendar_date(text: str) -> bool:
    """A MySQL date text (``YYYY-MM-DD...``) of a date no calendar has."""
    if not _DATE_SHAPE.match(text):
        return False
    try:
        dt.date(int(text[0:4]), int(text[5:7]), int(text[8:10]))
        return False
    except ValueError:
        return True


def canon(v: Any, kind: str) -> Any:
    """One hashable form for equal values of a column of this ``kind`` (see KINDS;
    anything else is text), whichever sink they came from."""
    if v is None or v is ABSENT:
        return v
    try:
        if kind == "int":
            return int(v)
        if kind == "decimal":
            d = (v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v))).normalize()
            return _ZERO if d.is_zero() else d  # (-0, -0.00: the one 0, as == takes them, not repr: see float)
        # (+ 0.0: -0.0 is 0.0, in the digest of the first pass as in the re-checks' ==: a MySQL/MariaDB column
        # stores no negative zero, so a PostgreSQL source's -0 is 0 at a MySQL target, and a row that differed in
        # nothing else was "different" in the first pass, its re-check waiting for a sender past the source's
        # position, which a PostgreSQL server moves without any commit: "not caught up" after the capturer stopped)
        if kind == "float":
            return float(v) + 0.0
        if kind == "float32":
            return _FLOAT32.unpack(_FLOAT32.pack(float(v)))[0] + 0.0
        if kind in ("datetime", "date") and isinstance(v, str) and _no_calendar_date(v):
            return None  # a date no calendar has (a zero date or month or day, 2020-02-30, the year 0) arrives
            # as NULL in every sink (docs/limits.md); a MySQL source gives it as its text
        if kind == "datetime":
            v = dt.datetime.fromisoformat(v) if isinstance(v, str) else v
            return v.astimezone(dt.UTC).replace(tzinfo=None) if isinstance(v, dt.datetime) and v.tzinfo else v
        if kind == "date":
            return dt.date.fromisoformat(v) if isinstance(v, str) else v
        if kind == "time":
            return format_timedelta(v) if isinstance(v, dt.timedelta) else str(v)
        if kind == "bytes":
            # JSON sinks carry binary values as base64 (listed in the message's "b64")
            return base64.b64decode(v, validate=True) if isinstance(v, str) else bytes(v)
        if kind == "bit":
            if isinstance(v, (bytes, bytearray)):
                return int.from_bytes(v, "big")
            n = int(v, 2) if isinstance(v, str) else int(v)  # JSON: the bit string
            return n + (1 << 64) if n < 0 else n  # (the lake keeps a BIT(64) in a bigint: its 64-bit pattern)
        if kind == "set":
            items = v if isinstance(v, (set, frozenset)) else (str(v).split(",") if v else [])
            return ",".join(sorted(str(x) for x in items))
        if kind == "json":
            return json.dumps(json.loads(v) if isinstance(v, (str, bytes)) else v, sort_keys=True)
    except (ValueError, TypeError, ArithmeticError, binascii.Error):
        return ("not a value of its type", repr(v))  # never equal to a source value
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def show_value(v: Any) -> str:
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, bytes):
        return "0x" + v.hex()
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, dt.date):
        return v.isoformat()
    return repr(v)


@dataclass
class TableMeta:
    """A source table as verify compares it: columns in order, their kinds, its key."""

    db: str
    table: str
    columns: list[str]
    kinds: dict[str, str]
    pk: list[str]
    pg_types: dict[str, str] = field(default_factory=dict)  # PostgreSQL: column -> format_type

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    def canon_row(self, row: dict[str, Any]) -> tuple[Any, ...]:
        """The row's values in column order, canonical; columns the source does not
        have (with a value) make it differ from every source row."""
        extra = tuple(sorted(c for c in row if c not in self.kinds and row[c] is not None))
        vals = tuple(canon(row.get(c, ABSENT), self.kinds[c]) for c in self.columns)
        return vals + ((("extra columns",) + extra,) if extra else ())

    def canon_key(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(canon(row.get(c, ABSENT), self.kinds[c]) for c in self.pk)

    def show(self, row: tuple[Any, ...] | None) -> str:
        if row is None:
            return "(none)"
        names = self.columns + ["?"] * (len(row) - len(self.columns))
        text = ", ".join(f"{c}={show_value(v)}" for c, v in zip(names, row))
        return "{" + (text if len(text) <= 300 else text[:297] + "...") + "}"

    def show_diff(self, want: tuple[Any, ...], got: tuple[Any, ...]) -> str:
        """The columns that differ: ``col: source X, sink Y``."""
        names = self.columns + ["?"] * (max(len(want), len(got)) - len(self.columns))
        out = [f"{c}: source {show_value(a)}, sink {show_value(b)}"
               for c, a, b in zip(names, want + (None,) * len(names), got + (None,) * len(names)) if a != b]
        text = "; ".join(out)
        return text if len(text) <= 400 else text[:397] + "..."

    def show_key(self, key: tuple[Any, ...]) -> str:
        return "(" + ", ".join(f"{c}={show_value(v)}" for c, v in zip(self.pk, key)) + ")"


def digest(row: tuple[Any, ...]) -> bytes:
    """A 16-byte digest of a canonical row (its repr is deterministic: ints, Decimals,
    datetimes, bytes, strings, None)."""
    return hashlib.blake2b(repr(row).encode("utf-8", "surrogatepass"), digest_size=16).digest()


# --- what verify needs of a sink (implemented in senders/<kind>/verify.py) ---

class SinkReader(Protocol):
    """A sender's destination, read back. ``rows`` gives a destination table's rows as
    ``{column: value}`` (None: the table does not exist there); ``refresh`` makes the
    next reads see what was written since. Optional (the MySQL target):
    ``checksum(dest, columns, where, args)``, ``select(dest, columns, where, args)``
    and ``keys_rows(dest, columns, pk, keys)``."""

    name: str
    kind: str

    def destination(self, db: str, table: str) -> tuple[str, str]: ...

    def where(self, dest: tuple[str, str]) -> str: ...

    def refresh(self) -> None: ...

    def rows(self, dest: tuple[str, str], columns: Sequence[str]) -> Iterable[dict[str, Any]] | None: ...

    def close(self) -> None: ...


ReaderFactory = Callable[[str, dict[str, Any], list[tuple[str, str, str]]], SinkReader]


# --- what verify needs of a source (capturer/regions/<kind>/verify.py) ---

class SourceUnreachable(Exception):
    pass


class SqlSource:
    """A region's server read over SQL: a connection per thread (``_connect``), all
    closed by ``close``."""

    _conns: PerThread

    def _connect(self) -> Any:
        raise NotImplementedError

    def _conn(self) -> Any:
        return self._conns.get()

    def close(self) -> None:
        self._conns.close()
