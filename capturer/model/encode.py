"""How row values leave the capturer: JSON values and SQL text.

JSON (file lines, Kafka messages):
  DECIMAL -> string (exact); DATETIME/TIMESTAMP -> "YYYY-MM-DD HH:MM:SS[.ffffff]"
  (TIMESTAMP in UTC); DATE -> "YYYY-MM-DD"; TIME -> "[-]HH:MM:SS[.ffffff]";
  BLOB/BINARY -> base64, and the column is listed in the line's ``b64`` field;
  BIT -> the bit string as the binlog gives it ("10101"); SET -> "a,b";
  JSON -> the JSON text as stored; NULL -> null; integers exact (also BIGINT
  UNSIGNED max).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import importlib
import json
import threading
from typing import Any, overload

from pymysql.converters import escape_string

# MySQL column type codes (include/mysql_com.h) that need care
T_BIT = 16
T_TIMESTAMP = 7
T_TIMESTAMP2 = 17
_TYPE_NAMES = {
    0: "decimal", 1: "tinyint", 2: "smallint", 3: "int", 4: "float", 5: "double", 6: "null",
    7: "timestamp", 8: "bigint", 9: "mediumint", 10: "date", 11: "time", 12: "datetime",
    13: "year", 14: "newdate", 15: "varchar", 16: "bit", 17: "timestamp", 18: "datetime",
    19: "time", 245: "json", 246: "decimal", 247: "enum", 248: "set", 249: "tinyblob",
    250: "mediumblob", 251: "longblob", 252: "blob", 253: "varchar", 254: "char", 255: "geometry",
}


def type_name(code: int) -> str:
    return _TYPE_NAMES.get(code, str(code))


def format_timedelta(td: dt.timedelta) -> str:
    total_us = (td.days * 86400 + td.seconds) * 1_000_000 + td.microseconds
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    secs, us = divmod(total_us, 1_000_000)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    out = f"{sign}{h:02d}:{m:02d}:{s:02d}"
    return out + (f".{us:06d}" if us else "")


def decimal_text(v: decimal.Decimal) -> str:
    """Plain notation, exact: ``0.00000000000000000001``, not ``1E-20`` (a value whose
    exponent is beyond +-20000, which no source column holds, keeps its exponent)."""
    t = str(v)
    if "E" not in t or not v.is_finite() or not -20000 <= int(t.rsplit("E", 1)[1]) <= 20000:
        return t
    return format(v, "f")


def json_value(v: Any) -> tuple[Any, bool]:
    """(JSON-safe value, whether it was base64-encoded)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v, False
    if isinstance(v, decimal.Decimal):
        return decimal_text(v), False
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" "), False
    if isinstance(v, dt.date):
        return v.isoformat(), False
    if isinstance(v, dt.timedelta):
        return format_timedelta(v), False
    if isinstance(v, dt.time):
        return v.isoformat(), False
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii"), True
    if isinstance(v, (set, frozenset)):
        return ",".join(sorted(str(x) for x in v)), False
    if isinstance(v, (list, tuple)):
        return [json_value(x)[0] for x in v], False
    if isinstance(v, dict):
        return {str(k): json_value(x)[0] for k, x in v.items()}, False
    return str(v), False


_seen = threading.local()  # did the encode in this thread meet a binary value?


def _default(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        _seen.bytes = True
    return json_value(v)[0]


_ENCODER = json.JSONEncoder(ensure_ascii=False, default=_default)
_ENCODER_COMPACT = json.JSONEncoder(ensure_ascii=False, default=_default, separators=(",", ":"))

try:  # the C extension (capturer/_native/: encoder, row decoders, SQL escaping, murmur2),
    # built by setup.py where a compiler is present; everything that uses it takes it from here
    _fastrows: Any = importlib.import_module("capturer._fastrows")
except ImportError:  # pragma: no cover - depends on the build
    _fastrows = None


def _fallback(v: Any) -> Any:
    return json_value(v)[0]


def dumps_row_line(d: dict[str, Any], compact: bool = False) -> str | None:
    """JSON text of a line whose row images hold raw values (the fast path: no
    per-value Python work for ints and strings); None if a binary value was met,
    and the caller takes the exact path that lists base64 columns."""
    _seen.bytes = False
    text = (_ENCODER_COMPACT if compact else _ENCODER).encode(d)
    return None if _seen.bytes else text


def dumps_compact(obj: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))`` with values
    written as ``json_value`` writes them (bytes as base64, not listed anywhere)."""
    if _fastrows is not None:
        try:
            return _fastrows.json_dumps(obj, _fallback, None, True)
        except (TypeError, ValueError, UnicodeError):
            pass
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=_fallback)


def encode_line_bytes(d: dict[str, Any], rows: tuple[str, ...] = ("before", "after"), compact: bool = False,
                      use_c: bool = True) -> bytes:
    """``encode_line(...).encode()``: the C encoder's UTF-8 output where it was built."""
    if use_c and _fastrows is not None:
        b64: set[str] = set()
        try:
            data = _fastrows.json_dumps(d, _fallback, b64, compact, True, tuple(rows))
        except (TypeError, ValueError, UnicodeError):
            data = None  # e.g. a lone surrogate: the Python path decides
        if data is not None:
            if not b64:
                return data
            tail = json.dumps(sorted(b64), ensure_ascii=False, separators=(",", ":") if compact else None)
            return data[:-1] + (("," if compact else ", ") + '"b64"' + (":" if compact else ": ") + tail + "}").encode()
    return encode_line(d, rows, compact, use_c=False).encode()


def encode_line(d: dict[str, Any], rows: tuple[str, ...] = ("before", "after"), compact: bool = False,
                use_c: bool = True) -> str:
    """``json.dumps(d, ensure_ascii=False)`` of a message whose ``rows`` fields are
    row images with raw values (see the module doc for how values are written).
    Binary values are base64 and their columns are listed, sorted, in a ``b64``
    field added last. The C encoder is used where it was built; the result is
    the same text either way (a unit test compares them)."""
    if use_c and _fastrows is not None:
        return encode_line_bytes(d, rows, compact).decode("utf-8")
    text = dumps_row_line(d, compact)
    if text is not None:
        return text
    b64: set[str] = set()
    exact = dict(d)
    for k in rows:
        if k in exact:  # an absent row field stays absent, as on the C path
            exact[k] = json_row(exact[k], b64)
    if b64:
        exact["b64"] = sorted(b64)
    return json.dumps(exact, ensure_ascii=False, separators=(",", ":") if compact else None, default=_fallback)


@overload
def json_row(row: dict[str, Any], b64: set[str]) -> dict[str, Any]: ...
@overload
def json_row(row: None, b64: set[str]) -> None: ...
def json_row(row: dict[str, Any] | None, b64: set[str]) -> dict[str, Any] | None:
    if not isinstance(row, dict):  # None (or not a row image: written as any value)
        return row
    out = {}
    for k, v in row.items():
        jv, is_b64 = json_value(v)
        if is_b64:
            b64.add(k)
        out[k] = jv
    return out


def quote_ident(name: str) -> str:
    """A MySQL identifier in backticks; a backtick inside is doubled."""
    return "`" + name.replace("`", "``") + "`"


def qualified(db: str, table: str) -> str:
    return f"{quote_ident(db)}.{quote_ident(table)}"


def sql_param(v: Any, type_code: int | None = None) -> Any:
    """A value as a pymysql query parameter for the column's type."""
    if type_code == T_BIT and isinstance(v, str):
        return int(v, 2) if v else 0
    if isinstance(v, (set, frozenset)):
        return ",".join(sorted(str(x) for x in v))
    return v


def sql_literal(v: Any, type_code: int | None = None) -> str:
    """A value as SQL text (for ``format=sql`` output; the MySQL sender uses parameters)."""
    v = sql_param(v, type_code)
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, decimal.Decimal):
        return decimal_text(v)
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        return "X'" + b.hex() + "'" if b else "''"
    if isinstance(v, dt.datetime):
        return "'" + v.isoformat(sep=" ") + "'"
    if isinstance(v, dt.date):
        return "'" + v.isoformat() + "'"
    if isinstance(v, dt.timedelta):
        return "'" + format_timedelta(v) + "'"
    return "'" + escape_string(str(v)) + "'"
