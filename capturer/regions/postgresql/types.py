"""PostgreSQL column types as the rest of the pipeline sees them.

pgoutput sends every value in PostgreSQL's text output form (the replication
connection sets ``DateStyle=ISO``, ``TimeZone=UTC``, ``IntervalStyle=iso_8601``
and ``extra_float_digits=3``, so that form is fixed). Each type maps to a MySQL
type code (so that every sender treats the column as it treats the MySQL
column of the same meaning) and to a parser from text to the Python value the
MySQL region gives for that code:

==================== ============= ==========================================
PostgreSQL           as MySQL      value
==================== ============= ==========================================
bool                 TINYINT(1)    1 / 0
int2, int4, int8     SMALLINT ...  int
oid                  INT UNSIGNED  int
float4, float8       FLOAT/DOUBLE  float (NaN and +-Infinity: NULL, counted)
numeric(p,s)         DECIMAL(p,s)  Decimal (exact; NaN/Infinity: NULL);
                                   unconstrained numeric (or p > 65, s > 30):
                                   LONGTEXT in MySQL, its exact decimal text
text, varchar, char  LONGTEXT,     str (char(n) keeps PostgreSQL's padding:
                     VARCHAR(n)    VARCHAR(n) in MySQL, not CHAR)
bytea                LONGBLOB      bytes (base64 in JSON, as for BLOB)
date                 DATE          date (infinity and BC dates: NULL)
time                 TIME(6)       timedelta
timestamp            DATETIME(6)   datetime
timestamptz          DATETIME(6)   datetime in UTC (naive, as MySQL TIMESTAMP)
json, jsonb          JSON          the JSON text (jsonb: PostgreSQL's normal form)
uuid                 CHAR(36)      str
bit(n), n <= 64      BIT(n)        the bit string, as MySQL BIT values travel
anything else        LONGTEXT      the text form: arrays ``{1,2}``, enums,
                                   interval (ISO 8601), timetz, inet, money ...
a domain             its base type's (``resolve_domains``)
==================== ============= ==========================================

A key column of a text-like type becomes ``VARCHAR(255)`` in the MySQL DDL (a
MySQL key needs a length); a bytea key column ``VARBINARY(255)``. ``varchar(n)``
and ``char(n)`` are ``VARCHAR(n)`` up to 255, LONGTEXT beyond (MySQL's row size
limit).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capturer.model import ColumnInfo

# type OIDs (src/include/catalog/pg_type.dat)
BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, XML, FLOAT4, FLOAT8, MONEY, BPCHAR, VARCHAR = 114, 142, 700, 701, 790, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1082, 1083, 1114, 1184, 1186, 1266
BIT, VARBIT, NUMERIC, UUID, JSONB = 1560, 1562, 1700, 2950, 3802

# MySQL type codes (capturer/model/encode.py)
M_TINY, M_SHORT, M_LONG, M_FLOAT, M_DOUBLE, M_LONGLONG = 1, 2, 3, 4, 5, 8
M_DATE, M_BIT, M_DATETIME2, M_TIME2, M_JSON, M_NEWDECIMAL = 10, 16, 18, 19, 245, 246
M_BLOB, M_VARCHAR = 252, 15

_EPOCH_2000_US = 946_684_800_000_000  # PostgreSQL's epoch (2000-01-01 UTC) in Unix microseconds


def pg_time_to_unix_us(pg_us: int) -> int:
    """A PostgreSQL timestamp (microseconds since 2000-01-01 UTC) as Unix microseconds."""
    return pg_us + _EPOCH_2000_US


class Unrepresentable(ValueError):
    """A value with no equivalent in the target types (NaN, infinity, a BC date): sent as NULL."""


def _bool(t: str) -> int:
    return 1 if t == "t" else 0


def _float(t: str) -> float:
    v = float(t)
    if math.isnan(v) or math.isinf(v):
        raise Unrepresentable(t)
    return v


def _numeric(t: str) -> decimal.Decimal:
    if t in ("NaN", "Infinity", "-Infinity"):
        raise Unrepresentable(t)
    return decimal.Decimal(t)


def _bytea(t: str) -> bytes:
    if t.startswith("\\x"):
        return bytes.fromhex(t[2:])
    # the old 'escape' output (bytea_output = escape): octal escapes and doubled backslashes
    out = bytearray()
    i = 0
    while i < len(t):
        c = t[i]
        if c == "\\":
            if t[i + 1] == "\\":
                out.append(0x5C)
                i += 2
            else:
                out.append(int(t[i + 1:i + 4], 8))
                i += 4
        else:
            out.extend(c.encode("utf-8"))
            i += 1
    return bytes(out)


def _date(t: str) -> dt.date:
    if t.endswith(" BC") or "infinity" in t:
        raise Unrepresentable(t)
    try:
        return dt.date.fromisoformat(t)
    except ValueError:
        raise Unrepresentable(t) from None  # a year past 9999


_TS_TAIL = re.compile(r"(\.\d{1,6})?([+-]\d\d)?(:?\d\d)?(:?\d\d)?$")


def _iso_for_310(t: str) -> str:
    """Python 3.10's fromisoformat takes 3 or 6 fraction digits and +HH:MM offsets only:
    PostgreSQL's other forms (".5", "+00", "+05:53:28") made into those."""
    m = _TS_TAIL.search(t, 19)
    if m is None or m.start() != 19:
        return t
    frac, hh, mm, ss = m.groups()
    out = t[:19] + ((frac + "000000")[:7] if frac else "")
    if hh:
        out += hh + ":" + (mm or "00").lstrip(":") + (":" + ss.lstrip(":") if ss else "")
    return out


def _timestamp(t: str) -> dt.datetime:
    if t.endswith(" BC") or "infinity" in t:
        raise Unrepresentable(t)
    if sys.version_info < (3, 11):
        t = _iso_for_310(t)
    try:
        v = dt.datetime.fromisoformat(t)
    except ValueError:
        raise Unrepresentable(t) from None
    if v.tzinfo is not None:  # timestamptz: UTC (the session's TimeZone), kept naive like MySQL TIMESTAMP
        v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return v


def _time(t: str) -> dt.timedelta:
    hms, _, frac = t.partition(".")
    h, m, s = hms.split(":")
    us = int((frac + "000000")[:6]) if frac else 0
    return dt.timedelta(hours=int(h), minutes=int(m), seconds=int(s), microseconds=us)


def _text(t: str) -> str:
    return t


@dataclass(frozen=True)
class PgType:
    code: int  # MySQL type code
    parse: Callable[[str], Any]
    sql: str  # MySQL column type
    key_sql: str = ""  # as a key column, when it differs
    unsigned: bool = False
    precision: int = 0
    scale: int = 0
    binary: bool = False

    def column_info(self) -> ColumnInfo:
        return ColumnInfo(self.code, self.unsigned, self.precision, self.scale, self.binary)


_FIXED: dict[int, PgType] = {
    BOOL: PgType(M_TINY, _bool, "TINYINT(1)"),
    INT2: PgType(M_SHORT, int, "SMALLINT"),
    INT4: PgType(M_LONG, int, "INT"),
    INT8: PgType(M_LONGLONG, int, "BIGINT"),
    OID: PgType(M_LONG, int, "INT UNSIGNED", unsigned=True),
    FLOAT4: PgType(M_FLOAT, _float, "FLOAT"),
    FLOAT8: PgType(M_DOUBLE, _float, "DOUBLE"),
    BYTEA: PgType(M_BLOB, _bytea, "LONGBLOB", "VARBINARY(255)", binary=True),
    DATE: PgType(M_DATE, _date, "DATE"),
    TIME: PgType(M_TIME2, _time, "TIME(6)"),
    TIMESTAMP: PgType(M_DATETIME2, _timestamp, "DATETIME(6)"),
    TIMESTAMPTZ: PgType(M_DATETIME2, _timestamp, "DATETIME(6)"),
    JSON: PgType(M_JSON, _text, "LONGTEXT", "VARCHAR(255)"),
    JSONB: PgType(M_JSON, _text, "LONGTEXT", "VARCHAR(255)"),
    UUID: PgType(M_VARCHAR, _text, "CHAR(36)"),
    CHAR: PgType(M_VARCHAR, _text, "VARCHAR(4)"),
    NAME: PgType(M_VARCHAR, _text, "VARCHAR(64)"),
}
_TEXT = PgType(M_VARCHAR, _text, "LONGTEXT", "VARCHAR(255)")


def pg_type(oid: int, typmod: int) -> PgType:
    """How a column of type ``oid`` (with its ``atttypmod``) is carried."""
    t = _FIXED.get(oid)
    if t is not None:
        return t
    if oid == NUMERIC:
        if typmod >= 4:
            p, s = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
            if 0 < p <= 65 and 0 <= s <= min(p, 30):  # (MySQL's DECIMAL: 65 digits, scale 30)
                return PgType(M_NEWDECIMAL, _numeric, f"DECIMAL({p},{s})", precision=p, scale=s)
        # unconstrained (or wider than MySQL's DECIMAL): kept exact as decimal text
        return PgType(M_NEWDECIMAL, _numeric, "LONGTEXT", "VARCHAR(255)")
    if oid in (VARCHAR, BPCHAR) and typmod >= 4:
        n = typmod - 4
        if n <= 255:  # char(n) too: a MySQL CHAR would drop the padding PostgreSQL keeps
            sql = f"VARCHAR({n})"
            return PgType(M_VARCHAR, _text, sql, sql)
        # wider: LONGTEXT (stored off the row: a few VARCHAR(5000) would pass MySQL's 64 kB row limit)
    if oid == BIT and 0 < typmod <= 64:
        return PgType(M_BIT, _text, f"BIT({typmod})")
    return _TEXT


FIRST_USER_OID = 10000  # (FirstGenbkiObjectId: every type below it is built in, none a domain)


def resolve_domains(query: Callable[..., Any], types: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each ``(type oid, typmod)`` with a domain replaced by its base type (and the typmod the
    domain gives it, as PostgreSQL's getBaseTypeAndTypmod): a domain's values are its base type's
    (the same output form), so they are carried as the base type's (a domain over boolean as 1/0,
    over bytea as bytes, over numeric(12,2) as DECIMAL(12,2)), not as text. ``query(sql, args)``
    reads the catalog; nothing is asked when no type is user-defined."""
    step: dict[int, tuple[int, int]] = {}
    todo = sorted({o for o, _ in types if o >= FIRST_USER_OID})
    for _ in range(32):  # (domains over domains: a chain, never a cycle)
        todo = [o for o in todo if o not in step]
        if not todo:
            break
        rows = query("SELECT oid::bigint, typbasetype::bigint, typtypmod FROM pg_type "
                     "WHERE typtype = 'd' AND oid = ANY(%s::oid[])", (todo,))
        for oid, base, mod in rows:
            step[int(oid)] = (int(base), int(mod))
        todo = [b for b, _ in step.values() if b >= FIRST_USER_OID]
    out = []
    for oid, mod in types:
        seen = 0
        while oid in step and seen < 32:
            oid, dmod = step[oid]
            if dmod != -1:
                mod = dmod
            seen += 1
        out.append((oid, mod))
    return out


def parse_value(t: PgType, text: str) -> Any:
    """The value of ``text`` (None when it has no equivalent: see ``Unrepresentable``)."""
    try:
        return t.parse(text)
    except Unrepresentable:
        return None
