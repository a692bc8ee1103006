"""Fuzzing the C module (capturer/_native/) against its Python specifications.

What is fuzzed, each from VALID inputs that are then mutated:

* ``Plan.rows`` (MySQL/MariaDB rows-event bodies). Bodies are written by a small
  encoder below for every column type the plan knows (ints of each width, signed
  and unsigned; FLOAT/DOUBLE; DECIMAL of many precisions/scales; DATE, YEAR,
  DATETIME2/TIMESTAMP2/TIME2 with fsp 0..6; VARCHAR/CHAR/BINARY/TEXT/BLOB with
  1-, 2-, 3- and 4-byte lengths in utf8mb4, latin1, gbk and binary; GEOMETRY;
  ENUM/SET of 1..8 bytes; BIT(1..64)) with NULL bitmaps, single images and
  update pairs. A valid body must decode to the values it was written from (C
  and Python). A mutated body (bit flips, truncation, byte insertion/deletion,
  length prefixes set to huge values, fields set to 0x00/0xFF, NULL-bitmap
  flips, splices, random bytes, the update flag toggled, a plan with a column
  more, less or of another type) must give the SAME rows from C and from the
  Python decoder (``TablePlan(use_c=False)``), or make both raise; C may raise
  only ValueError (UnicodeDecodeError included), IndexError (ENUM index) or
  ArithmeticError (decimal.InvalidOperation of a corrupt DECIMAL).
* ``Plan(names, specs)`` with mutated specs (no Python reference): the
  constructor accepts only specs it can decode safely, and raises
  ValueError/TypeError/OverflowError otherwise; an accepted plan decodes random
  bytes with a clean exception or a result.
* ``baikal_plan(...).row`` (BaikalDB protobuf rows, written by a small encoder
  below) against ``RowPlan.decode_py``: same row, unknown field numbers and
  wire-type mismatch count, or both raise (C ValueError, Python RowDecodeError);
  and ``baikal_plan`` with mutated specs.
* ``json_dumps`` on random values (lone surrogates, NUL and control characters,
  huge ints, Decimal NaN/Infinity/-0/exponents, bytes/bytearray/memoryview,
  datetimes/dates/timedeltas at their min/max, aware datetimes, times, sets,
  nested dicts/lists/tuples, dict/int/str/float subclasses, enums, objects only
  ``str()`` can write): the text must equal ``json.dumps(obj,
  ensure_ascii=False, default=encode._fallback)`` (and its UTF-8 bytes), with
  the base64-encoded columns of the row images listed; or C raises
  TypeError/ValueError/UnicodeError, which its callers answer with the Python
  path, and only where the input has something C does not write (a non-str
  dict key, a lone surrogate, nesting deeper than 64) or Python raises too.
  ``encode_line_bytes``/``dumps_compact`` (C, with that fallback) must give the
  Python path's bytes exactly, or both raise the same exception.
* ``json_lines`` (the file sender's batch renderer) against the per-line
  reference, and with mutated arguments (negative/huge/non-int seq numbers,
  wrong types for every argument, callbacks that raise, return junk or mutate
  the sequence being rendered): a clean exception, never a crash.
* ``kafka_json`` (the Kafka sender's json messages) against the sender's Python
  path (``row_messages``), slice by slice on random and wild rows (keys that
  move, vanish or repeat, keyless tables, snapshot marks, tombstones), and whole
  batches through the sender with and without it (slices, spilled
  transactions, flushes, DDL, transaction records); mutated arguments and
  callbacks that mutate the list.
* the minimal input of every bug this fuzzing found (``regressions``).

Per run: about 21k MySQL bodies, 4k plan specs (18k decodes), 12.7k BaikalDB
rows, 3k BaikalDB specs (5.7k decodes), 13k JSON values/lines, 3k mutated
argument sets, 400+800 hypothesis examples; about 20 s on two cores. The slow
variant (``--runslow``) runs each section with two other seeds and 10-20x more.

Every C call runs in a child process (``python test_fuzz_c.py SECTION SEED N
TRACE``): the case about to run is written to TRACE first, so a segfault or a
hang is reported as a failure with the offending input in hex instead of
killing pytest. The child's address space is capped, so a runaway loop ends in
MemoryError (a finding) rather than exhausting the machine.

Disagreements that are accepted, by design (callers rely on them):
* the exception TYPES of C and Python may differ on bad input (C says
  ValueError "truncated" where Python gets IndexError/struct.error);
* ``Plan``/``baikal_plan`` specs outside what a table map can describe are
  refused by C; the Python decoders are not compared there;
* ``json_dumps``/``json_lines`` refuse (TypeError/ValueError/UnicodeError) where
  stdlib json would write non-str keys, lone surrogates (not UTF-8) or nesting
  deeper than 64; every caller then takes the Python path, which the
  ``encode_line_bytes`` and ``txn_blocks_json`` checks cover;
* ``json_lines`` refuses negative seq0/txn_rows (a transaction has neither);
* a line given to ``encode_line`` is a plain dict without a "b64" field of its
  own (the Python path copies it with ``dict()`` and sets "b64" in place).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import faulthandler
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _p in (str(ROOT), str(ROOT / "tests")):
    if _p not in sys.path:  # the child process runs this file as a script
        sys.path.insert(0, _p)

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from pymysqlreplication.constants import FIELD_TYPE as T

from capturer.model import (
    Ddl,
    Position,
    RowChange,
    SnapshotMark,
    TableSchema,
    Txn,
    encode,
)
from capturer.model.spill import SpillWriter
from capturer.regions.baikaldb import schema as bks
from capturer.regions.baikaldb.rows import RowDecodeError, RowPlan
from capturer.regions.mysql import rowdecode

try:
    from capturer import _fastrows
except ImportError:  # pragma: no cover - depends on the build
    _fastrows = None

pytestmark = pytest.mark.skipif(_fastrows is None, reason="capturer._fastrows not built")


class Finding(AssertionError):
    """What was run, on which input, and how C misbehaved."""


class Trace:
    """The case about to run, where the parent reads it if this process dies."""

    def __init__(self, path: str | None):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600) if path else None

    def __call__(self, what: str) -> None:
        if self.fd is not None:
            os.pwrite(self.fd, what.replace("\n", "\\n").encode("utf-8", "backslashreplace") + b"\n", 0)


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except Exception as exc:
        return "err", exc


def short(x: Any, n: int = 600) -> str:
    try:
        s = repr(x)
    except Exception as exc:
        s = f"<{type(x).__name__}: repr raised {type(exc).__name__}>"
    return s if len(s) <= n else s[:n] + f"...({len(s)} chars)"


def describe(o: tuple[str, Any]) -> str:
    return f"returned {short(o[1])}" if o[0] == "ok" else f"raised {type(o[1]).__name__}: {short(str(o[1]), 200)}"


# =============================================================================================
# MySQL rows events: columns, a body encoder, mutations
# =============================================================================================

def col(t: int, **kw: Any) -> SimpleNamespace:
    base = {"type": t, "unsigned": False, "name": "c", "character_set_name": "utf8mb4", "max_length": 20, "length_size": 2,
                "precision": 10, "decimals": 2, "fsp": 0, "size": 1, "enum_values": None, "set_values": None, "bits": 8, "bytes": 1}
    base.update(kw)
    return SimpleNamespace(**base)


def catalog() -> list[SimpleNamespace]:
    cols = [col(t, unsigned=u) for t in (T.TINY, T.SHORT, T.INT24, T.LONG, T.LONGLONG) for u in (False, True)]
    cols += [col(T.FLOAT), col(T.DOUBLE), col(T.YEAR), col(T.DATE)]
    for fsp in range(7):
        cols += [col(T.DATETIME2, fsp=fsp), col(T.TIMESTAMP2, fsp=fsp), col(T.TIME2, fsp=fsp)]
    for p, s in ((1, 0), (5, 0), (4, 2), (9, 9), (10, 9), (12, 2), (18, 9), (19, 1), (20, 6), (38, 38), (65, 0),
                 (65, 30), (65, 38)):
        cols.append(col(T.NEWDECIMAL, precision=p, decimals=s))
    cols += [
        col(T.VARCHAR, max_length=40), col(T.VARCHAR, max_length=400),  # utf8mb4, 1- and 2-byte lengths
        col(T.STRING, max_length=30, character_set_name="latin1"),  # CHAR latin1 (cp1252 + 5 bytes)
        col(T.VARCHAR, max_length=300, character_set_name="latin1"),
        col(T.VARCHAR, max_length=60, character_set_name="gbk"),
        col(T.STRING, max_length=16, character_set_name="binary"),  # BINARY(16)
        col(T.VARCHAR, max_length=300, character_set_name="binary"),  # VARBINARY(300)
    ]
    for n in (1, 2, 3, 4):  # TINY/-/MEDIUM/LONG BLOB and TEXT (MariaDB's JSON is a LONGTEXT)
        cols += [col(T.BLOB, length_size=n, character_set_name="binary"), col(T.BLOB, length_size=n)]
    cols += [
        col(T.GEOMETRY, length_size=4, character_set_name="binary"),
        col(T.ENUM, size=1, enum_values=["", "a", "b", "c"]),
        col(T.ENUM, size=2, enum_values=[""] + [f"v{i}" for i in range(300)]),
        col(T.ENUM, size=1, enum_values=None),  # values unknown to the table map
        col(T.SET, size=1, set_values=["x", "y", "z"]),
        col(T.SET, size=2, set_values=[f"s{i}" for i in range(12)]),
        col(T.SET, size=8, set_values=[f"b{i}" for i in range(64)]),
        col(T.SET, size=1, set_values=None),
    ]
    cols += [col(T.BIT, bits=b, bytes=(b + 7) // 8) for b in (1, 9, 17, 64)]
    return cols


CATALOG = catalog()
DIG2BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
EPOCH = dt.datetime(1970, 1, 1)
LATIN1_HOLES = {0x81, 0x8D, 0x8F, 0x90, 0x9D}  # undefined in cp1252, code points in MySQL's latin1

TEXT_POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ",
    "".join(map(chr, range(32))) + "\x7f\"\\/'`",
    "éüßñçÅ€ÿ", "中文字符测试", "😀🎉𝄞", "\u2028\u2029\ufeff\uffff\U0010ffff",
]
GBK_POOL = "abcXYZ019 中文字符测试"


def rand_text(rng: random.Random, n: int, pools: list[str] = TEXT_POOLS) -> str:
    return "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randrange(n + 1)))


def pick(rng: random.Random, edges: list[Any], gen: Callable[[], Any], p_edge: float = 0.3) -> Any:
    return rng.choice(edges) if rng.random() < p_edge else gen()


def latin1_text(raw: bytes) -> str:
    return "".join(chr(b) if b in LATIN1_HOLES else bytes([b]).decode("cp1252") for b in raw)


def frac_digits(rng: random.Random, fsp: int) -> int:
    """Microseconds with only ``fsp`` significant digits."""
    us = pick(rng, [0, 999999, 1, 500000], lambda: rng.randrange(10**6))
    return us - us % 10 ** (6 - fsp)


def frac_bytes(us: int, fsp: int) -> bytes:
    nb = (fsp + 1) // 2
    return (us // 10 ** (6 - 2 * nb)).to_bytes(nb, "big") if nb else b""


def enc_time2(neg: bool, h: int, m: int, s: int, us: int, fsp: int) -> bytes:
    """MySQL's my_time_packed_to_binary (TIMEF_INT_OFS/TIMEF_OFS; the fraction
    of a negative time is a C remainder, stored as its two's complement)."""
    nr = (((h << 12) | (m << 6) | s) << 24) + us
    if neg:
        nr = -nr
    if fsp >= 5:
        return (nr + 0x800000000000).to_bytes(6, "big")
    out = ((nr >> 24) + 0x800000).to_bytes(3, "big")  # the fraction: nr % (1 << 24) in C, i.e. -us if neg
    if fsp in (1, 2):
        out += ((-(us // 10000) if neg else us // 10000) & 0xFF).to_bytes(1, "big")
    elif fsp in (3, 4):
        out += ((-(us // 100) if neg else us // 100) & 0xFFFF).to_bytes(2, "big")
    return out


def enc_decimal(rng: random.Random, p: int, s: int) -> tuple[bytes, decimal.Decimal]:
    intg = p - s
    style = rng.random()
    if style < 0.15:
        ints, fracs = "9" * intg, "9" * s
    elif style < 0.3:
        ints, fracs = "0" * intg, "0" * s
    else:
        ints = "".join(rng.choice("0123456789") for _ in range(intg))
        fracs = "".join(rng.choice("0123456789") for _ in range(s))
    neg = rng.random() < 0.5
    out = bytearray()
    lead = intg % 9
    if lead:
        out += int(ints[:lead]).to_bytes(DIG2BYTES[lead], "big")
    for i in range(lead, intg, 9):
        out += int(ints[i:i + 9]).to_bytes(4, "big")
    for i in range(0, s - s % 9, 9):
        out += int(fracs[i:i + 9]).to_bytes(4, "big")
    if s % 9:
        out += int(fracs[s - s % 9:]).to_bytes(DIG2BYTES[s % 9], "big")
    if neg:
        out = bytearray(b ^ 0xFF for b in out)
    out[0] ^= 0x80
    text = ("-" if neg else "") + (ints or "0") + ("." + fracs if s else "")
    return bytes(out), decimal.Decimal(text)


Segs = list[tuple[bytes, str]]  # (bytes, what: "bitmap" / "len1".."len4" / "val")


def enc_value(rng: random.Random, c: Any) -> tuple[Segs, Any]:
    """One value of column ``c`` as the binlog writes it, and what it decodes to."""
    t = c.type
    ints = {T.TINY: 1, T.SHORT: 2, T.INT24: 3, T.LONG: 4, T.LONGLONG: 8}
    if t in ints:
        n = ints[t]
        lo, hi = (0, 2 ** (8 * n) - 1) if c.unsigned else (-(2 ** (8 * n - 1)), 2 ** (8 * n - 1) - 1)
        v = pick(rng, [lo, hi, 0, 1, max(lo, -1)], lambda: rng.randint(lo, hi))
        return [((v % 2 ** (8 * n)).to_bytes(n, "little"), "val")], v
    if t in (T.FLOAT, T.DOUBLE):
        fmt, bits = ("<f", 32) if t == T.FLOAT else ("<d", 64)
        raw = pick(rng, [struct.pack(fmt, x) for x in (0.0, -0.0, 1.5, math.inf, -math.inf, math.nan, 1e-40)],
                   lambda: rng.getrandbits(bits).to_bytes(bits // 8, "little"))
        return [(raw, "val")], struct.unpack(fmt, raw)[0]
    if t == T.YEAR:
        v = pick(rng, [0, 1901, 2155], lambda: rng.randint(1901, 2155))
        return [(bytes([v - 1900 if v else 0]), "val")], v
    if t == T.DATE:
        r = rng.random()
        if r < 0.1:
            y, m, d, exp = 0, 0, 0, None  # the zero date
        elif r < 0.2:
            y, m, d, exp = 2020, 2, 30, None  # ALLOW_INVALID_DATES
        elif r < 0.25:
            y, m, d, exp = 2020, 0, 5, None
        else:
            day = pick(rng, [dt.date(1, 1, 1), dt.date(9999, 12, 31)],
                       lambda: dt.date(1, 1, 1) + dt.timedelta(days=rng.randrange(3652058)))
            y, m, d, exp = day.year, day.month, day.day, day
        return [(((y << 9) | (m << 5) | d).to_bytes(3, "little"), "val")], exp
    if t == T.DATETIME2:
        us = frac_digits(rng, c.fsp)
        r = rng.random()
        if r < 0.08:
            ymd, exp = (0, 0, 0), None  # zero datetime
        elif r < 0.14:
            ymd, exp = (2021, 2, 29), None
        else:
            v = pick(rng, [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59)],
                     lambda: dt.datetime(1, 1, 1) + dt.timedelta(seconds=rng.randrange(315537897600)))
            ymd, exp = (v.year, v.month, v.day), v.replace(microsecond=us)
        hms = (exp.hour, exp.minute, exp.second) if exp else (0, 0, 0)
        packed = (1 << 39) | ((ymd[0] * 13 + ymd[1]) << 22) | (ymd[2] << 17) | (hms[0] << 12) | (hms[1] << 6) | hms[2]
        return [(packed.to_bytes(5, "big") + frac_bytes(us if exp else 0, c.fsp), "val")], exp
    if t == T.TIMESTAMP2:
        secs = pick(rng, [0, 1, 2**31 - 1, 2**31, 2**32 - 1], lambda: rng.randrange(2**32))
        us = frac_digits(rng, c.fsp)
        # 0 s: the zero TIMESTAMP ('0000-00-00 00:00:00'), a date no calendar has: None, as a zero DATETIME
        return [(secs.to_bytes(4, "big") + frac_bytes(us, c.fsp), "val")], \
            (EPOCH + dt.timedelta(seconds=secs, microseconds=us) if secs else None)
    if t == T.TIME2:
        us = frac_digits(rng, c.fsp)
        h, m, s = pick(rng, [(838, 59, 59), (0, 0, 0), (0, 0, 1)],
                       lambda: (rng.randrange(839), rng.randrange(60), rng.randrange(60)))
        neg = rng.random() < 0.4
        total = ((h * 60 + m) * 60 + s) * 10**6 + us
        return [(enc_time2(neg, h, m, s, us, c.fsp), "val")], dt.timedelta(microseconds=-total if neg else total)
    if t == T.NEWDECIMAL:
        raw, v = enc_decimal(rng, c.precision, c.decimals)
        return [(raw, "val")], v
    if t in (T.VARCHAR, T.STRING, T.BLOB, T.GEOMETRY):
        prefix = c.length_size if t in (T.BLOB, T.GEOMETRY) else (2 if c.max_length > 255 else 1)
        cs = "binary" if t == T.GEOMETRY else c.character_set_name
        longest = min(2 ** (8 * prefix) - 1, 700)
        n = rng.choice([0, 1, rng.randrange(60), rng.randrange(longest + 1)])
        if cs == "binary":
            raw = bytes(rng.getrandbits(8) for _ in range(n))
            exp: Any = raw
        elif cs == "latin1":
            raw = bytes(rng.getrandbits(8) for _ in range(n))
            exp = latin1_text(raw)
        else:
            exp = rand_text(rng, max(n // 4, 1), [GBK_POOL] if cs == "gbk" else TEXT_POOLS)
            raw = exp.encode("gbk" if cs == "gbk" else "utf-8")
            while len(raw) > longest:
                exp = exp[:len(exp) // 2]
                raw = exp.encode("gbk" if cs == "gbk" else "utf-8")
        return [(len(raw).to_bytes(prefix, "little"), f"len{prefix}"), (raw, "val")], exp
    if t == T.ENUM:
        values = c.enum_values
        idx = rng.randrange(len(values)) if values else rng.randrange(4)
        return [(idx.to_bytes(c.size, "little"), "val")], (values[idx] if values else None)
    if t == T.SET:
        values = c.set_values
        nbits = min(len(values), 8 * c.size) if values else 8 * c.size
        mask = pick(rng, [0, 2**nbits - 1], lambda: rng.getrandbits(nbits))
        exp = {v for i, v in enumerate(values) if mask >> i & 1} if values else None
        return [(mask.to_bytes(c.size, "little"), "val")], exp
    if t == T.BIT:
        v = pick(rng, [0, 2**c.bits - 1], lambda: rng.getrandbits(c.bits))
        return [(v.to_bytes(c.bytes, "big"), "val")], format(v, f"0{c.bits}b")
    raise AssertionError(f"no encoder for type {t}")


def enc_image(rng: random.Random, cols: list[Any], p_null: float = 0.15) -> tuple[Segs, dict[str, Any]]:
    nulls = [rng.random() < p_null for _ in cols]
    bitmap = bytearray((len(cols) + 7) // 8)
    segs: Segs = []
    image: dict[str, Any] = {}
    for i, (c, isnull) in enumerate(zip(cols, nulls)):
        if isnull:
            bitmap[i >> 3] |= 1 << (i & 7)
            image[c.name] = None
        else:
            s, v = enc_value(rng, c)
            segs += s
            image[c.name] = v
    return [(bytes(bitmap), "bitmap")] + segs, image


@dataclasses.dataclass
class Body:
    data: bytes
    update: bool
    fields: list[tuple[int, int, str]]  # (offset, length, what)
    expected: list[tuple[dict[str, Any], dict[str, Any] | None]]


def enc_body(rng: random.Random, cols: list[Any], update: bool) -> Body:
    segs: Segs = []
    expected = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        s1, img = enc_image(rng, cols)
        segs += s1
        after = None
        if update:
            s2, after = enc_image(rng, cols)
            segs += s2
        expected.append((img, after))
    data, fields = b"", []
    for raw, what in segs:
        fields.append((len(data), len(raw), what))
        data += raw
    return Body(data, update, fields, expected)


def canon_value(v: Any) -> Any:
    if isinstance(v, (set, frozenset)):
        return ("set", sorted(v))
    return (type(v).__name__, repr(v))


def canon(rows: Any) -> Any:
    return [None if img is None else [(k, canon_value(v)) for k, v in img.items()] for pair in rows for img in pair]


@dataclasses.dataclass
class Table:
    cols: list[Any]
    c: rowdecode.TablePlan
    py: rowdecode.TablePlan
    label: str


def make_table(cols: list[Any]) -> Table:
    cols = [SimpleNamespace(**{**vars(c), "name": f"c{i}"}) for i, c in enumerate(cols)]
    c, py = rowdecode.TablePlan(cols, use_c=True), rowdecode.TablePlan(cols, use_c=False)
    assert c.c is not None and py.c is None, "every catalog column must have a C and a Python decoder"
    label = repr(tuple(rowdecode.column_spec(x) for x in cols))
    return Table(cols, c, py, label)


def rand_table(rng: random.Random) -> Table:
    return make_table([rng.choice(CATALOG) for _ in range(rng.choice([1, 2, 3, 5, 8, 12, 17]))])


# --- mutations (each takes and returns bytes; `fields` locates the length prefixes) -----------------

def m_flip(rng: random.Random, d: bytes, fields: Any, other: bytes) -> bytes:
    b = bytearray(d)
    for _ in range(rng.choice([1, 1, 2, 4])):
        if b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def m_truncate(rng: random.Random, d: bytes, fields: Any, other: bytes) -> bytes:
    return d[:rng.randrange(len(d))] if d else d


def m_insert(rng: random.Random, d: bytes, fields: Any, other: bytes) -> bytes:
    i = rng.randrange(len(d) + 1)
    return d[:i] + bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 1, 2, 3, 8]))) + d[i:]


def m_delete(rng: random.Random, d: bytes, fields: Any, other: bytes) -> bytes:
    if not d:
        return d
    i = rng.randrange(len(d))
    return d[:i] + d[i + rng.choice([1, 1, 2, 5]):]


def live(fields: list[tuple[int, int, str]], d: bytes) -> list[tuple[int, int, str]]:
    """The fields still inside ``d`` (an earlier mutation may have cut it)."""
    return [f for f in fields if f[0] + f[1] <= len(d)]


def m_length(rng: random.Random, d: bytes, fields: list[tuple[int, int, str]], other: bytes) -> bytes:
    """A length prefix (or, without one, any field) set to a huge, off-by-one or random value."""
    fields = live(fields, d)
    lens = [f for f in fields if f[2].startswith("len")] or fields
    if not lens:
        return m_flip(rng, d, fields, other)
    off, n, _ = rng.choice(lens)
    cur = int.from_bytes(d[off:off + n], "little")
    v = rng.choice([2 ** (8 * n) - 1, 2 ** (8 * n - 1), cur + 1, cur + 2, max(cur - 1, 0), 0,
                    rng.getrandbits(8 * n), len(d), len(d) - off])
    return d[:off] + (v % 2 ** (8 * n)).to_bytes(n, "little") + d[off + n:]


def m_extreme(rng: random.Random, d: bytes, fields: list[tuple[int, int, str]], other: bytes) -> bytes:
    """One field's bytes all 0xFF, all 0x00, 0x7F.. or random."""
    fields = live(fields, d)
    if not fields:
        return m_flip(rng, d, fields, other)
    off, n, _ = rng.choice(fields)
    fill = rng.choice([b"\xff", b"\x00", b"\x7f", None])
    new = bytes(rng.getrandbits(8) for _ in range(n)) if fill is None else fill * n
    return d[:off] + new + d[off + n:]


def m_bitmap(rng: random.Random, d: bytes, fields: list[tuple[int, int, str]], other: bytes) -> bytes:
    maps = [f for f in live(fields, d) if f[2] == "bitmap" and f[1]]
    if not maps:
        return m_flip(rng, d, fields, other)
    off, n, _ = rng.choice(maps)
    b = bytearray(d)
    b[off + rng.randrange(n)] ^= 1 << rng.randrange(8)
    return bytes(b)


def m_splice(rng: random.Random, d: bytes, fields: Any, other: bytes) -> bytes:
    r = rng.random()
    if r < 0.3:
        return d + d  # rows repeated
    if r < 0.6:
        return d[:rng.randrange(len(d) + 1)] + other[rng.randrange(len(other) + 1):]
    i, j = sorted(rng.randrange(len(d) + 1) for _ in range(2))
    return d[:j] + d[i:j] + d[j:]  # a slice duplicated


def m_garbage(rng: random.Random, d: bytes, fields: Any, other: bytes) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 2, 5, 17, 64, 300])))


MUTATIONS = [m_flip, m_truncate, m_insert, m_delete, m_length, m_length, m_extreme, m_bitmap, m_splice, m_garbage]

C_DECODE_ERRORS = (ValueError, IndexError, ArithmeticError)  # UnicodeDecodeError, decimal.InvalidOperation
PY_DECODE_ERRORS = C_DECODE_ERRORS + (struct.error,)


def check_rows(tab: Table, data: bytes, update: bool, where: str = "") -> str:
    """C and Python decode ``data`` alike, or both raise (C only clean errors)."""
    c = outcome(lambda: canon(tab.c.rows(data, update)))
    p = outcome(lambda: canon(tab.py.rows(data, update)))
    ctx = f"[{where}] plan specs={tab.label} update={update} data={data.hex()}"
    if c[0] == "err" and not isinstance(c[1], C_DECODE_ERRORS):
        raise Finding(f"C decoder raised {type(c[1]).__name__}: {c[1]} {ctx}")
    if p[0] == "err" and not isinstance(p[1], PY_DECODE_ERRORS):
        raise Finding(f"Python decoder raised {type(p[1]).__name__}: {p[1]} {ctx}")
    if c[0] != p[0]:
        raise Finding(f"C {describe(c)} but Python {describe(p)} {ctx}")
    if c[0] == "ok":
        if c[1] != p[1]:
            raise Finding(f"C and Python decode differently: C {short(c[1])} Python {short(p[1])} {ctx}")
        return "same rows"
    return f"both raise ({type(c[1]).__name__} / {type(p[1]).__name__})"


def check_roundtrip(tab: Table, body: Body) -> None:
    want = canon(body.expected)
    for name, plan in (("C", tab.c), ("Python", tab.py)):
        got = outcome(lambda: canon(plan.rows(body.data, body.update)))
        if got != ("ok", want):
            raise Finding(f"{name} decoder does not give back the encoded rows: {describe(got)}; "
                          f"want {short(want)}; plan specs={tab.label} update={body.update} data={body.data.hex()}")


def fuzz_mysql(seed_: int, n: int, trace: Trace) -> dict[str, Any]:
    rng = random.Random(seed_)
    stats: Counter[str] = Counter()
    tables = [make_table(CATALOG)] + [rand_table(rng) for _ in range(40)]
    bodies: list[tuple[Table, Body]] = []
    for tab in tables:  # valid bodies decode to what was encoded, on both paths
        for update in (False, True):
            for _ in range(4):
                body = enc_body(rng, tab.cols, update)
                trace(f"mysql roundtrip specs={tab.label} update={update} data={body.data.hex()}")
                check_roundtrip(tab, body)
                stats["valid bodies round-tripped"] += 1
                bodies.append((tab, body))
    full = [b for b in bodies if b[0] is tables[0]]
    for tab, body in full[:1] + full[-1:]:  # every truncation of two bodies of the all-types table
        for cut in range(len(body.data)):
            trace(f"mysql truncated specs={tab.label} update={body.update} data={body.data[:cut].hex()}")
            stats[check_rows(tab, body.data[:cut], body.update, f"truncated at {cut}")] += 1
            stats["inputs"] += 1
    variants: dict[int, Table] = {}
    for i in range(n):
        tab, body = rng.choice(bodies)
        data = body.data
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            data = rng.choice(MUTATIONS)(rng, data, body.fields, rng.choice(bodies)[1].data)
        update = body.update if rng.random() < 0.9 else not body.update
        plan = tab
        r = rng.random()
        if r < 0.05:
            plan = rng.choice(tables)  # another table's plan
        elif r < 0.12:  # the same columns but one more, one less or one of another type
            key = rng.randrange(10**9)
            cols = list(tab.cols)
            how = rng.randrange(3)
            if how == 0 or len(cols) == 1:
                cols.insert(rng.randrange(len(cols) + 1), rng.choice(CATALOG))
            elif how == 1:
                cols.pop(rng.randrange(len(cols)))
            else:
                cols[rng.randrange(len(cols))] = rng.choice(CATALOG)
            plan = variants.setdefault(key, make_table(cols))
            if len(variants) > 200:
                variants.clear()
        trace(f"mysql mutation #{i} specs={plan.label} update={update} data={data.hex()}")
        stats[check_rows(plan, data, update, f"mutation #{i}")] += 1
        stats["inputs"] += 1
    return dict(stats)


# --- Plan specs outside what a table map can describe (no Python reference) --------------------

SPEC_INTS = [-2**63, -2**31 - 1, -2**31, -1000, -5, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 30, 38, 64, 65, 66,
             144, 255, 256, 2**31 - 1, 2**31, 2**63, 2**64]
SPEC_JUNK = ["utf-8", "utf8", "cp1252", "latin1", "gbk", "utf-16", "hex", "nonexistent-codec", "strict",
             "capturer-mysql-latin1", "ignore", None, 1.5, b"utf-8", ("a", "b"), ("a", ["unhashable"]), (), ("",),
             tuple(f"v{i}" for i in range(70)), ["x"], object()]


def rand_spec(rng: random.Random) -> Any:
    if rng.random() < 0.03:
        return rng.choice([None, 5, "spec", [1, 1, 0]])
    kind = rng.choice(list(range(-1, 15)) + [99, 2**31, 2**64, "1", None, 1.0])
    params = [rng.choice(SPEC_INTS) if rng.random() < 0.6 else rng.choice(SPEC_JUNK)
              for _ in range(rng.choice([0, 1, 2, 2, 3, 3, 4, 5]))]
    return (kind, *params)


def spec_is_safe(spec: tuple[Any, ...]) -> bool:
    """What a plan may accept: the ranges a table map can describe."""
    kind, a = spec[0], spec[1] if len(spec) > 1 else None
    if kind == 1:
        return 1 <= a <= 8
    if kind == 6:
        return 1 <= a <= 65 and 0 <= spec[2] <= a
    if kind == 13:
        return 1 <= a <= 64 and 1 <= spec[2] <= 8
    return True  # the others were range-checked already


PLAN_API_ERRORS = (ValueError, TypeError, OverflowError)
C_DECODE_ANY_SPEC = C_DECODE_ERRORS + (TypeError, LookupError)  # unhashable SET values; unknown codecs


def fuzz_mysql_specs(seed_: int, n: int, trace: Trace) -> dict[str, Any]:
    rng = random.Random(seed_)
    stats: Counter[str] = Counter()
    blobs = [bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 3, 9, 40, 200]))) for _ in range(50)]
    for _i in range(n):
        k = rng.choice([0, 1, 1, 2, 3, 6])
        names: Any = tuple(f"c{j}" for j in range(k))
        specs: Any = tuple(rand_spec(rng) for _ in range(k))
        r = rng.random()
        if r < 0.03:
            names = names + ("extra",)  # a count mismatch
        elif r < 0.06 and k:
            names = (1,) + names[1:]
        elif r < 0.08:
            names, specs = list(names), list(specs)
        trace(f"Plan({short(names, 3000)}, {short(specs, 3000)})")
        made = outcome(lambda: _fastrows.Plan(names, specs))
        if made[0] == "err":
            if not isinstance(made[1], PLAN_API_ERRORS):
                raise Finding(f"Plan{short((names, specs), 3000)} raised {type(made[1]).__name__}: {made[1]}")
            stats["specs refused"] += 1
            continue
        plan = made[1]
        unsafe = [s for s in specs if not spec_is_safe(s)]
        if unsafe:
            raise Finding(f"Plan accepted specs it cannot decode safely: {short(unsafe)} in {short(specs, 3000)}")
        stats["specs accepted"] += 1
        for data in rng.sample(blobs, 4) + [bytes((k + 7) // 8) + rng.choice(blobs)]:
            update = rng.random() < 0.3
            trace(f"Plan({short(names, 3000)}, {short(specs, 3000)}).rows({data.hex()}, {update})")
            got = outcome(lambda: plan.rows(data, update))
            if got[0] == "err" and not isinstance(got[1], C_DECODE_ANY_SPEC):
                raise Finding(f"Plan{short((names, specs), 3000)}.rows({data.hex()}, {update}) "
                              f"raised {type(got[1]).__name__}: {got[1]}")
            stats["inputs"] += 1
            stats["rows decoded" if got[0] == "ok" else "rows refused"] += 1
    # a plan whose __init__ never ran, and one initialised twice
    bare = _fastrows.Plan.__new__(_fastrows.Plan)
    for data in (b"", b"\x00", b"\x00" * 100):
        trace(f"uninitialised Plan.rows({data.hex()})")
        got = outcome(lambda: bare.rows(data, False))
        if got != ("ok", []) and not (got[0] == "err" and isinstance(got[1], ValueError)):
            raise Finding(f"an uninitialised Plan {describe(got)} on {data.hex()}")
        stats["inputs"] += 1
    twice = _fastrows.Plan(("a", "b"), ((1, 4, 0), (5, 1, "utf-8")))
    for spec in (((1, 1, 0),), ((6, 10, 2), (7, 6)), ((99,),), ((1, 0, 0),), ((6, -5, 0),)):
        names = tuple(f"n{j}" for j in range(len(spec)))
        trace(f"Plan.__init__ again with {spec!r}")
        again = outcome(lambda: twice.__init__(names, spec))
        # refused, the plan left as it was (a second __init__ used to install a half-checked plan: ((6, -5, 0),)
        # read DIG2BYTES[-5] and memcpy'd a garbage size, a bus error)
        if again[0] != "err" or not isinstance(again[1], TypeError):
            raise Finding(f"Plan.__init__ again with {spec!r}: {describe(again)}")
        for data in blobs[:10]:
            got = outcome(lambda: twice.rows(data, False))
            if got[0] == "err" and not isinstance(got[1], C_DECODE_ANY_SPEC):
                raise Finding(f"re-initialised Plan raised {type(got[1]).__name__} on {data.hex()}")
            stats["inputs"] += 1
    return dict(stats)


# =============================================================================================
# BaikalDB rows: protobuf messages whose field numbers are field ids
# =============================================================================================

BK_TYPES = [bks.BOOL, bks.NULL_TYPE, bks.INT8, bks.INT16, bks.INT32, bks.INT64, bks.UINT8, bks.UINT16, bks.UINT32,
            bks.UINT64, bks.FLOAT, bks.DOUBLE, bks.STRING, bks.DATETIME, bks.TIMESTAMP, bks.DATE, bks.HLL, bks.TIME,
            bks.HEX, bks.BITMAP, bks.TDIGEST, bks.JSON]


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def bk_text(raw: bytes, enc: str) -> Any:
    try:
        return raw.decode(enc)
    except UnicodeDecodeError:
        return raw


def bk_payload(rng: random.Random, kind: int, enc: str) -> tuple[int, bytes, Any]:
    """(wire type, payload after the tag, decoded value) of one value of ``kind``."""
    if kind in (bks.K_SINT32, bks.K_SINT64):
        w = 32 if kind == bks.K_SINT32 else 64
        lo, hi = -(2 ** (w - 1)), 2 ** (w - 1) - 1
        v = pick(rng, [0, -1, 1, lo, hi], lambda: rng.randint(lo, hi))
        return 0, varint(((v << 1) ^ (v >> (w - 1))) & (2**w - 1)), v
    if kind == bks.K_UINT:
        v = pick(rng, [0, 1, 2**32, 2**64 - 1], lambda: rng.getrandbits(rng.choice([8, 16, 32, 64])))
        return 0, varint(v), v
    if kind == bks.K_BOOL:
        v = rng.choice([0, 1, 2, 2**63])
        return 0, varint(v), 1 if v else 0
    if kind in (bks.K_FLOAT, bks.K_DOUBLE):
        fmt, bits = ("<f", 32) if kind == bks.K_FLOAT else ("<d", 64)
        raw = pick(rng, [struct.pack(fmt, x) for x in (0.0, -0.0, math.inf, math.nan, 1.5)],
                   lambda: rng.getrandbits(bits).to_bytes(bits // 8, "little"))
        return (5 if bits == 32 else 1), raw, struct.unpack(fmt, raw)[0]
    if kind in (bks.K_TEXT, bks.K_BYTES):
        if kind == bks.K_TEXT and rng.random() < 0.8:
            raw = rand_text(rng, 20, [GBK_POOL] if enc == "gbk" else TEXT_POOLS).encode(enc)
        else:
            raw = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 5, 40, 200])))
        return 2, varint(len(raw)) + raw, (bk_text(raw, enc) if kind == bks.K_TEXT else raw)
    if kind == bks.K_DATETIME:
        if rng.random() < 0.15:
            v = rng.choice([0, (2021 * 13 + 2) << 46 | 29 << 41, rng.getrandbits(64)])
            return 1, struct.pack("<Q", v), bks_unpack_datetime(v)
        t = dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randrange(315537897600 * 10**6))
        v = ((t.year * 13 + t.month) << 46 | t.day << 41 | t.hour << 36 | t.minute << 30 | t.second << 24
             | t.microsecond)
        return 1, struct.pack("<Q", v), t
    if kind == bks.K_DATE:
        if rng.random() < 0.15:
            v = rng.choice([0, (2021 * 13 + 2) << 5 | 29, rng.getrandbits(32)])
            return 5, struct.pack("<I", v), bks_unpack_date(v)
        d = dt.date(1, 1, 1) + dt.timedelta(days=rng.randrange(3652058))
        return 5, struct.pack("<I", (d.year * 13 + d.month) << 5 | d.day), d
    if kind == bks.K_TIME:
        h, m, s = rng.randrange(1024), rng.randrange(60), rng.randrange(60)
        neg = rng.random() < 0.4
        v = (h << 12) | (m << 6) | s
        td = dt.timedelta(hours=h, minutes=m, seconds=s)
        return 5, struct.pack("<i", -v if neg else v), (-td if neg else td)
    if kind == bks.K_TIMESTAMP:
        v = pick(rng, [0, 1, 2**32 - 1], lambda: rng.getrandbits(32))
        return 5, struct.pack("<I", v), (EPOCH + dt.timedelta(seconds=v) if v else None)
    raise AssertionError(kind)


def bks_unpack_datetime(v: int) -> Any:
    ym = (v >> 46) & 0x1FFFF
    try:
        return dt.datetime(ym // 13, ym % 13, (v >> 41) & 31, (v >> 36) & 31, (v >> 30) & 63, (v >> 24) & 63,
                           v & 0xFFFFFF)
    except ValueError:
        return None


def bks_unpack_date(v: int) -> Any:
    ym = (v >> 5) & 0x1FFFF
    try:
        return dt.date(ym // 13, ym % 13, v & 31)
    except ValueError:
        return None


def by_wire(wt: int, payload: bytes, enc: str) -> Any:
    if wt == 0:
        v, sh = 0, 0
        for b in payload:
            v |= (b & 0x7F) << sh
            sh += 7
        return v & (2**64 - 1)
    if wt == 1:
        return struct.unpack("<Q", payload)[0]
    if wt == 5:
        return struct.unpack("<I", payload)[0]
    n, i = 0, 0
    sh = 0
    while True:
        b = payload[i]
        n |= (b & 0x7F) << sh
        i += 1
        sh += 7
        if b < 0x80:
            break
    return bk_text(payload[i:], enc)


@dataclasses.dataclass
class BkTable:
    tdef: bks.TableDef
    plan: RowPlan
    label: str


def rand_bk_table(rng: random.Random) -> BkTable:
    ids = sorted(rng.sample(range(1, 60), rng.choice([1, 2, 4, 8, 12])))
    fields = tuple(bks.FieldDef(fid, f"f{fid}", rng.choice(BK_TYPES), deleted=rng.random() < 0.15) for fid in ids)
    if all(f.deleted for f in fields):
        fields = (dataclasses.replace(fields[0], deleted=False),) + fields[1:]
    tdef = bks.TableDef(7, "NS", "db", "t", 1, fields, charset=rng.choice([0, 0, 1]))
    plan = RowPlan(tdef)
    assert plan._c is not None
    return BkTable(tdef, plan, repr([(f.field_id, f.mysql_type, f.deleted) for f in fields]) + f" {tdef.encoding}")


def bk_row(rng: random.Random, tab: BkTable) -> tuple[bytes, list[tuple[int, int, str]], tuple[Any, ...]]:
    """A row (protobuf bytes), where its length fields are, and (values, unknown ids, mismatches)."""
    enc = tab.tdef.encoding
    parts: list[tuple[bytes, bytes, int]] = []  # (tag, payload, wire)
    events: list[tuple[str, Any, Any]] = []
    for f in tab.tdef.fields:
        if rng.random() < 0.2:
            continue  # absent: NULL
        kind = f.kind
        wt, payload, v = bk_payload(rng, kind, enc)
        if rng.random() < 0.08:  # a value still in an older type's encoding
            other = rng.choice([k for k in range(1, 13) if bks.WIRE[k] != bks.WIRE[kind]])
            wt, payload, _ = bk_payload(rng, other, enc)
            v = by_wire(wt, payload, enc)
            events.append(("mismatch", f, v))
        else:
            events.append(("value", f, v))
        parts.append((varint(f.field_id << 3 | wt), payload, wt))
    for _ in range(rng.choice([0, 0, 0, 1, 2])):  # fields of a newer version
        fid = rng.randrange(60, 300)
        wt, payload, _ = bk_payload(rng, rng.randrange(1, 13), enc)
        parts.append((varint(fid << 3 | wt), payload, wt))
        events.append(("unknown", fid, None))
    order = list(range(len(parts)))
    if rng.random() < 0.3:
        rng.shuffle(order)
    values = dict.fromkeys(f.name for f in tab.tdef.live)
    unknown: list[int] = []
    mism = 0
    data, fields = b"", []
    for i in order:
        tag, payload, wt = parts[i]
        what, f, v = events[i]
        fields.append((len(data), len(tag), "tag"))
        if wt == 2:  # the length varint
            fields.append((len(data) + len(tag), next(j for j, b in enumerate(payload) if b < 0x80) + 1, "len"))
        data += tag + payload
        if what == "unknown":
            unknown.append(f)
        elif not f.deleted:
            values[f.name] = v
            mism += what == "mismatch"
    return data, fields, (values, tuple(unknown), mism)


def canon_bk(res: tuple[dict[str, Any], tuple[int, ...], int]) -> Any:
    row, unknown, mism = res
    return [(k, canon_value(v)) for k, v in row.items()], tuple(unknown), mism


def check_bk(tab: BkTable, data: bytes, where: str = "") -> str:
    plan = tab.plan
    c = outcome(lambda: canon_bk(plan._c.row(data)))

    def py() -> Any:
        before = plan.mismatches
        row, unknown = plan.decode_py(data)
        return canon_bk((row, unknown, plan.mismatches - before))

    p = outcome(py)
    ctx = f"[{where}] fields={tab.label} data={data.hex()}"
    if c[0] == "err" and type(c[1]) is not ValueError:
        raise Finding(f"C BaikalDB decoder raised {type(c[1]).__name__}: {c[1]} {ctx}")
    if p[0] == "err" and not isinstance(p[1], RowDecodeError):
        raise Finding(f"Python BaikalDB decoder raised {type(p[1]).__name__}: {p[1]} {ctx}")
    if c[0] != p[0] or (c[0] == "ok" and c[1] != p[1]):
        raise Finding(f"C {describe(c)} but Python {describe(p)} {ctx}")
    if c[0] == "err":  # the product's entry point turns it into RowDecodeError
        d = outcome(lambda: plan.decode(data))
        if d[0] != "err" or not isinstance(d[1], RowDecodeError):
            raise Finding(f"RowPlan.decode {describe(d)} where the C decoder raised {ctx}")
        return "both raise"
    return "same row"


def fuzz_baikal(seed_: int, n: int, trace: Trace) -> dict[str, Any]:
    rng = random.Random(seed_)
    stats: Counter[str] = Counter()
    tables = [rand_bk_table(rng) for _ in range(40)]
    corpus = []
    for tab in tables:
        for _ in range(5):
            data, fields, want = bk_row(rng, tab)
            trace(f"baikal roundtrip fields={tab.label} data={data.hex()}")
            got = outcome(lambda: canon_bk(tab.plan._c.row(data)))
            if got != ("ok", canon_bk(want)):
                raise Finding(f"C BaikalDB decoder does not give back the encoded row: {describe(got)}; want "
                              f"{short(canon_bk(want))}; fields={tab.label} data={data.hex()}")
            stats[check_bk(tab, data, "valid")] += 1
            stats["valid rows round-tripped"] += 1
            corpus.append((tab, data, fields))
    for tab, data, _ in corpus[:6]:
        for cut in range(len(data)):
            trace(f"baikal truncated fields={tab.label} data={data[:cut].hex()}")
            stats[check_bk(tab, data[:cut], f"truncated at {cut}")] += 1
            stats["inputs"] += 1
    for i in range(n):
        tab, data, fields = rng.choice(corpus)
        for _ in range(rng.choice([1, 1, 2, 3])):
            if rng.random() < 0.15 and live(fields, data):  # a varint (tag or length) made huge / over-long
                off, ln, _ = rng.choice(live(fields, data))
                ln = max(ln, 1)
                data = data[:off] + rng.choice([b"\xff" * 9 + b"\x01", b"\xff" * 10 + b"\x01", b"\x80" * 11,
                                                varint(2**63), varint(len(data)), b"\x00"]) + data[off + ln:]
            else:
                data = rng.choice(MUTATIONS)(rng, data, fields, rng.choice(corpus)[1])
        plan_tab = tab if rng.random() < 0.9 else rng.choice(tables)
        trace(f"baikal mutation #{i} fields={plan_tab.label} data={data.hex()}")
        stats[check_bk(plan_tab, data, f"mutation #{i}")] += 1
        stats["inputs"] += 1
    return dict(stats)


def fuzz_baikal_specs(seed_: int, n: int, trace: Trace) -> dict[str, Any]:
    rng = random.Random(seed_)
    stats: Counter[str] = Counter()
    ids = [-1, 0, 1, 2, 7, 63, 2**22, 2**22 + 1, 2**31, 2**64, "3", None, 1.5]
    kinds = list(range(-1, 15)) + [2**40, None, "7"]
    encs = ["utf-8", "utf8", "gbk", "latin-1", "nonexistent-codec", "hex", "utf-16"]
    blobs = [bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 4, 12, 60]))) for _ in range(40)]
    for _i in range(n):
        spec: Any = tuple(
            (rng.choice(ids) if rng.random() < 0.3 else rng.randrange(1, 40),
             rng.choice(["a", "b", "c", 5, None]) if rng.random() < 0.1 else f"f{j}",
             rng.choice(kinds) if rng.random() < 0.3 else rng.randrange(1, 13))
            if rng.random() < 0.95 else rng.choice([(1, "a"), (1, "a", 1, 2), None, "x"])
            for j in range(rng.choice([0, 1, 2, 4, 7])))
        known: Any = tuple(rng.choice(ids) if rng.random() < 0.2 else rng.randrange(1, 40)
                           for _ in range(rng.choice([0, 1, 3])))
        enc: Any = rng.choice(encs) if rng.random() < 0.95 else rng.choice([None, 5, b"utf-8", "a\x00b"])
        if rng.random() < 0.05:
            spec, known = list(spec), list(known)
        trace(f"baikal_plan({short(spec, 3000)}, {short(known)}, {enc!r})")
        made = outcome(lambda: _fastrows.baikal_plan(spec, known, enc))
        if made[0] == "err":
            if not isinstance(made[1], PLAN_API_ERRORS):
                raise Finding(f"baikal_plan{short((spec, known, enc), 3000)} raised {type(made[1]).__name__}")
            stats["specs refused"] += 1
            continue
        stats["specs accepted"] += 1
        for data in rng.sample(blobs, 5):
            trace(f"baikal_plan({short(spec, 3000)}, {short(known)}, {enc!r}).row({data.hex()})")
            got = outcome(lambda: made[1].row(data))
            if got[0] == "err" and not isinstance(got[1], (ValueError, LookupError)):
                raise Finding(f"baikal_plan{short((spec, known, enc), 3000)}.row({data.hex()}) raised "
                              f"{type(got[1]).__name__}: {got[1]}")
            stats["inputs"] += 1
    return dict(stats)


# =============================================================================================
# JSON: json_dumps, encode_line_bytes, dumps_compact, json_lines
# =============================================================================================

class Color(enum.IntEnum):
    RED = 1


class Name(str, enum.Enum):
    A = "a\u00e9\x00"


class MyInt(int):
    def __repr__(self) -> str:
        return "MyInt!"


class MyFloat(float):
    def __repr__(self) -> str:
        return "MyFloat!"


class MyStr(str):
    pass


class MyBytes(bytes):
    pass


class MyDate(dt.date):
    pass


class ReversedItems(dict):  # type: ignore[type-arg]
    def items(self):  # type: ignore[no-untyped-def]
        return list(reversed(list(super().items())))


class BadStr:
    def __str__(self) -> str:
        raise RuntimeError("no text for this value")


class SurrogateStr:
    def __str__(self) -> str:
        return "x\udc80"


Point = collections.namedtuple("Point", "x y")
UTC = dt.timezone.utc


def moved_odict() -> collections.OrderedDict[str, Any]:
    od = collections.OrderedDict([("a", 1), ("b", b"\x01"), ("c", [1.5])])
    od.move_to_end("a")
    return od


def surrogate_text(rng: random.Random) -> str:
    s = rand_text(rng, 6)
    i = rng.randrange(len(s) + 1)
    return s[:i] + chr(rng.choice([0xD800, 0xDBFF, 0xDC00, 0xDFFF, rng.randrange(0xD800, 0xE000)])) + s[i:]


def edge_scalars() -> list[Any]:
    return [
        None, True, False, 0, 1, -1, 2**31, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(2**64), 10**30,
        -(10**30), 10**4299, 10**4300, Color.RED, MyInt(7), MyInt(2**80),
        0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, 1.7976931348623157e308, 1e16, 1e-7, 0.1, MyFloat(2.5),
        MyFloat(math.nan),
        "", "\x00", "a\x00b", "\x01\x1f\x7f", "\"\\/", "\n\r\t\b\f", "é", "😀", "\u2028\u2029", "\ufeff\uffff",
        "\U0010ffff", "\ud800", "a\udfffb", "\ud83d\ude00", MyStr("sub\x00"), Name.A, "x" * 5000,
        decimal.Decimal("NaN"), decimal.Decimal("-NaN"), decimal.Decimal("sNaN"), decimal.Decimal("NaN123"),
        decimal.Decimal("Infinity"), decimal.Decimal("-Infinity"), decimal.Decimal("-0"), decimal.Decimal("0E-30"),
        decimal.Decimal("-0.000"), decimal.Decimal("1E+999999999"), decimal.Decimal("1E-999999999"),
        decimal.Decimal("-1.5E+10"), decimal.Decimal("123456789012345678901234567890.123456789"),
        dt.datetime.min, dt.datetime.max, dt.datetime(1, 1, 1, 0, 0, 0, 1), dt.datetime(999, 12, 31),
        dt.datetime(2020, 2, 29, 23, 59, 59, 999999), dt.datetime(2020, 1, 1, tzinfo=UTC),
        dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-23, minutes=-59))),
        dt.datetime(2021, 3, 4, 5, 6, 7, fold=1), dt.date.min, dt.date.max, MyDate(2020, 1, 2),
        dt.time.min, dt.time.max, dt.time(1, 2, 3, 4), dt.time(0, tzinfo=UTC),
        dt.timedelta.min, dt.timedelta.max, dt.timedelta(0), -dt.timedelta(microseconds=1),
        dt.timedelta(days=106751), dt.timedelta(days=-106752), dt.timedelta(days=100000, seconds=1),
        dt.timedelta(days=-100001), dt.timedelta(hours=838, minutes=59, seconds=59), -dt.timedelta(hours=838),
        dt.timedelta(days=3, microseconds=5),
        b"", b"\x00", b"\xff" * 5, bytearray(b"ab"), bytearray(), memoryview(b"abc"), memoryview(b"abcdef")[::2],
        memoryview(b""), MyBytes(b"\x01\x02"),
        set(), {"a", "b"}, frozenset({"x"}), {1, "1"}, {"\ud800"},
        uuid.UUID(int=5), complex(1, 2), BadStr(), SurrogateStr(), Point(1, b"\x00"),
    ]


EDGES = edge_scalars()


def rand_scalar(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.35:
        return rng.choice(EDGES)
    if r < 0.5:
        return rand_text(rng, 12)
    if r < 0.55:
        return surrogate_text(rng)
    if r < 0.65:
        return rng.choice([rng.getrandbits(64) - 2**63, rng.getrandbits(rng.choice([8, 70, 200]))])
    if r < 0.72:
        return struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
    if r < 0.8:
        return decimal.Decimal(rng.randrange(-10**20, 10**20)).scaleb(rng.randrange(-40, 40))
    if r < 0.85:
        return dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randrange(315537897600 * 10**6))
    if r < 0.9:
        return dt.timedelta(microseconds=rng.randrange(-10**17, 10**17))
    return bytes(rng.getrandbits(8) for _ in range(rng.randrange(9)))


def rand_key(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.05:
        return rng.choice([1, 1.5, True, None, b"k", (1, 2), Color.RED, MyStr("k"), "\ud800"])
    return rng.choice(["id", "a", "b", "c", "é", "", "\x00", "😀", "b64", "before"]) if r < 0.5 else rand_text(rng, 5)


def rand_json(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth < 4 and r < 0.25:
        k = rng.randrange(5)
        kids = [rand_json(rng, depth + 1) for _ in range(k)]
        shape = rng.random()
        if shape < 0.35:
            return kids
        if shape < 0.45:
            return tuple(kids)
        if shape < 0.9:
            return {rand_key(rng): v for v in kids}
        return rng.choice([moved_odict(), ReversedItems(a=1, b=b"\x02", c="x"), collections.defaultdict(int, z=1)])
    if r < 0.26:  # deeper than the C encoder goes
        o: Any = rng.choice([[], {}, "leaf"])
        for _ in range(rng.choice([63, 64, 65, 70])):
            o = [o] if rng.random() < 0.5 else {"k": o}
        return o
    return rand_scalar(rng)


def rand_row(rng: random.Random) -> Any:
    if rng.random() < 0.15:
        return None
    return {rand_key(rng) if rng.random() < 0.1 else f"c{i}": rand_json(rng, 2) for i in range(rng.randrange(6))}


def rand_line(rng: random.Random) -> dict[str, Any]:
    line: dict[str, Any] = {"region": rand_text(rng, 4), "commit_ts": rng.getrandbits(63), "seq": rng.randrange(9),
                            "db": rand_text(rng, 4), "op": rng.choice(["insert", "update", "delete", "read"]),
                            "before": rand_row(rng), "after": rand_row(rng)}
    if rng.random() < 0.3:
        line["position"] = {"file": "f.000001", "pos": rng.randrange(10**9)}
    if rng.random() < 0.2:
        line["extra"] = rand_json(rng, 1)
    if rng.random() < 0.05:
        line["op"] = rand_scalar(rng)
    return line


ROWS = ("before", "after")
FALLBACK_ERRORS = (TypeError, ValueError, UnicodeError)  # what every caller answers with the Python path


def py_dumps(obj: Any, compact: bool) -> str:
    return json.dumps(obj, ensure_ascii=False, default=encode._fallback, separators=(",", ":") if compact else None)


def has_surrogate(s: str) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in s)


_NATIVE = (type(None), bool, int, float, str, bytes, bytearray, memoryview, decimal.Decimal)


def refusal(o: Any, depth: int = 0) -> str | None:
    """Why C may refuse what json.dumps writes: walks ``o`` as C does."""
    if depth > 64:
        return "nesting deeper than 64"
    if isinstance(o, str):
        return "a lone surrogate" if has_surrogate(o) else None
    if isinstance(o, dict):
        for k, v in list(o.items()):
            if not isinstance(k, str):
                return "a non-str key"
            if has_surrogate(k):
                return "a lone surrogate in a key"
            why = refusal(v, depth + 1)
            if why:
                return why
        return None
    if isinstance(o, (list, tuple)):
        for x in o:
            why = refusal(x, depth + 1)
            if why:
                return why
        return None
    if isinstance(o, _NATIVE):
        return None
    if type(o) in (dt.datetime, dt.date, dt.timedelta) and not getattr(o, "tzinfo", None):
        return None
    try:
        r = encode._fallback(o)
    except Exception:
        return None
    return refusal(r, depth + 1)


def expected_b64(obj: Any, rows: tuple[str, ...]) -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in rows and isinstance(v, dict):
                out.update(ck for ck, cv in v.items() if isinstance(cv, (bytes, bytearray, memoryview)))
    return out


def check_json(obj: Any, compact: bool) -> str:
    """json_dumps (text and bytes) against json.dumps; encode_line_bytes and dumps_compact against Python."""
    ref_text = outcome(lambda: py_dumps(obj, compact))
    ref_bytes = outcome(lambda: ref_text[1].encode("utf-8")) if ref_text[0] == "ok" else ref_text
    why = refusal(obj)
    verdict = ""
    for as_bytes, ref in ((False, ref_text), (True, ref_bytes)):
        b64: set[str] = set()
        c = outcome(lambda: _fastrows.json_dumps(obj, encode._fallback, b64, compact, as_bytes, ROWS))
        ctx = f"json_dumps(compact={compact}, as_bytes={as_bytes}) of {short(obj, 3000)}"
        if c[0] == "ok":
            if ref[0] != "ok":
                raise Finding(f"C wrote {short(c[1])} where Python {describe(ref)}: {ctx}")
            if c[1] != ref[1]:
                raise Finding(f"C wrote {short(c[1], 2000)}\n Python {short(ref[1], 2000)}\n {ctx}")
            want = expected_b64(obj, ROWS)
            if b64 != want:
                raise Finding(f"C listed base64 columns {sorted(b64, key=repr)}, expected {sorted(want)}: {ctx}")
            verdict = "same text"
        elif ref[0] == "ok":
            if not why or not isinstance(c[1], FALLBACK_ERRORS):
                raise Finding(f"C raised {type(c[1]).__name__}: {c[1]} where Python writes {short(ref[1])} "
                              f"(no documented reason): {ctx}")
            verdict = f"C refuses ({why})"
        else:
            verdict = verdict or "both raise"
    if type(obj) is dict and "b64" not in obj:  # a line: a plain dict without a "b64" field of its own
        line = {**obj}
        c = outcome(lambda: encode.encode_line_bytes(line, compact=compact, use_c=True))
        p = outcome(lambda: encode.encode_line(line, compact=compact, use_c=False).encode("utf-8"))
        same = c == p if c[0] == "ok" else p[0] == "err" and type(c[1]) is type(p[1])
        if not same:
            raise Finding(f"encode_line_bytes: C path {describe(c)}, Python path {describe(p)}; "
                          f"line {short(line, 3000)} compact={compact}")
    c = outcome(lambda: encode.dumps_compact(obj))
    p = outcome(lambda: py_dumps(obj, True))
    same = c == p if c[0] == "ok" else p[0] == "err" and type(c[1]) is type(p[1])
    if not same:
        raise Finding(f"dumps_compact: C path {describe(c)}, Python {describe(p)}; value {short(obj, 3000)}")
    return verdict


def ref_piece(schema: TableSchema) -> tuple[bytes, bytes]:
    """senders/local/sender.py's _schema_piece on the Python path."""
    a = encode.encode_line({"db": schema.db, "table": schema.table, "op": ""}, use_c=False).encode()
    b = encode.encode_line({"pk": list(schema.pk), "before": None}, use_c=False).encode()
    return a[1:a.rindex(b'""')], b", " + b[1:-5]


def ref_lines(prefix: bytes, changes: Any, seq0: int, total: int) -> bytes:
    """The file sender's per-line reference: prefix + the line's fields, each line ending in a newline."""
    out = []
    for i, ch in enumerate(changes):
        d = {"seq": seq0 + i, "db": ch.schema.db, "table": ch.schema.table, "op": ch.op, "pk": list(ch.schema.pk),
             "before": ch.before, "after": ch.after, "txn_rows": total, "last": seq0 + i == total - 1}
        out.append(prefix + encode.encode_line(d, use_c=False).encode("utf-8")[1:] + b"\n")
    return b"".join(out)


def rand_schema(rng: random.Random) -> TableSchema:
    names = tuple(rand_text(rng, 3) or "id" for _ in range(rng.randrange(3)))
    db = surrogate_text(rng) if rng.random() < 0.03 else rand_text(rng, 5)
    return TableSchema(db, rand_text(rng, 5), names, names)


def rand_changes(rng: random.Random, schemas: list[TableSchema]) -> list[RowChange]:
    out = []
    for _ in range(rng.choice([0, 1, 2, 5, 12])):
        op = rng.choice(["insert", "update", "delete", "read"]) if rng.random() < 0.95 else rand_scalar(rng)
        before, after = rand_row(rng), rand_row(rng)
        if rng.random() < 0.03:
            before = rand_scalar(rng)  # not a row image at all
        out.append(RowChange(rng.choice(schemas), op, before, after))
    return out


def check_json_lines(prefix: bytes, changes: list[RowChange], seq0: int, total: int) -> str:
    c = outcome(lambda: _fastrows.json_lines(prefix, changes, ref_piece, encode._fallback, seq0, total))
    r = outcome(lambda: ref_lines(prefix, changes, seq0, total))
    ctx = f"json_lines(prefix={prefix!r}, changes={short(changes, 3000)}, seq0={seq0}, txn_rows={total})"
    if c[0] == "ok":
        if r != c:
            raise Finding(f"json_lines wrote {short(c[1], 2000)}\n reference {describe(r)}\n {ctx}")
        return "same lines"
    if r[0] == "ok":
        why = refusal([[ch.op, ch.before, ch.after] for ch in changes])
        if not why or not isinstance(c[1], FALLBACK_ERRORS):
            raise Finding(f"json_lines raised {type(c[1]).__name__}: {c[1]} where the reference writes (no "
                          f"documented reason): {ctx}")
        return f"C refuses ({why})"
    return "both raise"


def clean_call(name: str, args: list[Any], returns: type) -> None:
    """A C function on mutated arguments: a clean exception or a result of its type, never a crash."""
    got = outcome(lambda: getattr(_fastrows, name)(*args))
    if got[0] == "err" and isinstance(got[1], (SystemError, MemoryError)):
        raise Finding(f"{name} raised {type(got[1]).__name__}: {got[1]} on {short(args, 3000)}")
    if got[0] == "ok" and not isinstance(got[1], returns):
        raise Finding(f"{name} returned {type(got[1]).__name__} on {short(args, 3000)}")


class Evil:
    """A change whose attributes run code: mutates the list being rendered, etc."""

    def __init__(self, victim: list[Any], schema: TableSchema, how: str):
        self.victim, self._schema, self.how = victim, schema, how
        self.op, self.before, self.after = "insert", None, {"a": 1}

    @property
    def schema(self) -> TableSchema:
        if self.how == "clear":
            self.victim.clear()
        elif self.how == "grow" and len(self.victim) < 500:  # (growing forever would never end in Python either)
            self.victim.extend([self] * 50)
        elif self.how == "raise":
            raise KeyError("schema is gone")
        return self._schema


def fuzz_json(seed_: int, n: int, trace: Trace) -> dict[str, Any]:
    rng = random.Random(seed_)
    stats: Counter[str] = Counter()
    values = [rand_json(rng) for _ in range(n)] + [rand_line(rng) for _ in range(n // 2)] + EDGES
    values += [{"before": {"c": v}, "after": None} for v in EDGES]
    for i, obj in enumerate(values):
        for compact in (False, True):
            trace(f"json value #{i} compact={compact}: {short(obj, 5000)}")
            stats[check_json(obj, compact)] += 1
            stats["inputs"] += 1
    # json_lines against the per-line reference
    schemas = [rand_schema(rng) for _ in range(6)]
    for i in range(n // 4):
        prefix = rng.choice([b"{", b'{"region": "r", "commit_ts": 5, ', b"{\x00\xff", b""])
        changes = rand_changes(rng, schemas)
        seq0 = rng.choice([0, 0, 1, 7, 2**62, sys.maxsize - len(changes), sys.maxsize])
        total = rng.choice([len(changes), min(seq0 + len(changes), sys.maxsize), 0, 1, sys.maxsize])
        trace(f"json_lines #{i}: {short((prefix, changes, seq0, total), 5000)}")
        stats[check_json_lines(prefix, changes, seq0, total)] += 1
        stats["inputs"] += 1
    # the file sender end to end: batch renderer == per-line path
    from senders.local import sender as local

    for i in range(n // 20):
        changes = rand_changes(rng, schemas)
        txn = Txn(rand_text(rng, 4), rng.getrandbits(63), Position("bin.000001", 4), tuple(changes),
                  gtid="0-1-2", source_ts=7, snapshot=SnapshotMark("run", 3, True) if rng.random() < 0.3 else None)
        trace(f"txn_blocks_json #{i}: {short(txn, 5000)}")
        a = outcome(lambda: b"".join(local.txn_blocks_json(txn)))
        b = outcome(lambda: b"".join(line + b"\n" for line in local.txn_lines_json(txn)))
        if not (a == b if a[0] == "ok" else b[0] == "err" and type(a[1]) is type(b[1])):
            raise Finding(f"txn_blocks_json {describe(a)} but txn_lines_json {describe(b)}: {short(txn, 5000)}")
        stats["txns rendered"] += 1
        stats["inputs"] += 1
    # json_lines and json_dumps with mutated arguments: a clean exception or bytes, never a crash
    good_schema = schemas[0]
    argsets = {
        "prefix": [b"{", "{", None, bytearray(b"{"), memoryview(b"{"), 5],
        "changes": [None, 5, "str", (), [5], [None], [SimpleNamespace(schema=good_schema)],
                    [SimpleNamespace(schema=None, op="x", before=None, after=None)], iter([]),
                    (RowChange(good_schema, "insert", None, {"a": 1}),)],
        "piece": [ref_piece, None, 5, lambda s: (b"a",), lambda s: (b"a", "b"), lambda s: "ab",
                  lambda s: (b"a", b"b", b"c"), lambda s: 1 / 0, lambda s: [b"a", b"b"]],
        "fallback": [encode._fallback, None, lambda v: v, lambda v: 1 / 0, lambda v: b"\x00", lambda v: object(),
                     lambda v: "\ud800", lambda v: {"k": v}, str],
        "seq": [0, 1, -1, -(2**63), 2**63 - 1, 2**63, 2**64, 10**30, 1.5, "3", None, True, Color.RED],
    }
    row = {"a": 1, "b": uuid.UUID(int=1), "c": b"\x01"}
    for i in range(n // 2):
        args = [rng.choice(argsets["prefix"]) if rng.random() < 0.3 else b"{",
                rng.choice(argsets["changes"]) if rng.random() < 0.3 else
                [RowChange(good_schema, "update", dict(row), {"x": rand_scalar(rng)})] * rng.randrange(4),
                rng.choice(argsets["piece"]) if rng.random() < 0.3 else ref_piece,
                rng.choice(argsets["fallback"]) if rng.random() < 0.3 else encode._fallback,
                rng.choice(argsets["seq"]), rng.choice(argsets["seq"])]
        trace(f"json_lines mutated args #{i}: {short(args, 5000)}")
        clean_call("json_lines", args, bytes)
        stats["json_lines mutated-argument calls"] += 1
        stats["inputs"] += 1
        dargs = [rand_json(rng), rng.choice(argsets["fallback"]),
                 rng.choice([None, set(), [], {"a"}, frozenset()]), rng.choice([True, False, 0, "x", None]),
                 rng.choice([True, False, 2]), rng.choice([ROWS, None, (), ("before",), ["before"], "before", 5])]
        dargs = dargs[:rng.choice([1, 2, 3, 4, 5, 6, 6, 6, 7])] + ([None] if rng.random() < 0.05 else [])
        trace(f"json_dumps mutated args #{i}: {short(dargs, 5000)}")
        got = outcome(lambda: _fastrows.json_dumps(*dargs))
        if got[0] == "err" and isinstance(got[1], (SystemError, MemoryError)):
            raise Finding(f"json_dumps raised {type(got[1]).__name__}: {got[1]} on {short(dargs, 3000)}")
        stats["json_dumps mutated-argument calls"] += 1
        stats["inputs"] += 1
    # callbacks that mutate what is being rendered
    for how in ("clear", "grow", "raise"):
        victim: list[Any] = []
        victim += [Evil(victim, good_schema, how) for _ in range(5)] + \
            [RowChange(good_schema, "insert", None, {"a": 1})] * 5
        trace(f"json_lines with changes whose .schema does {how!r} to the list")
        got = outcome(lambda: _fastrows.json_lines(b"{", victim, ref_piece, encode._fallback, 0, 10))
        if got[0] == "err" and isinstance(got[1], (SystemError, MemoryError)):
            raise Finding(f"json_lines with a mutating change ({how}) raised {type(got[1]).__name__}")
        stats["hostile callbacks survived"] += 1
    for how in ("clear", "grow"):
        box: list[Any] = [uuid.UUID(int=i) for i in range(100)]
        d: dict[str, Any] = {f"k{i}": uuid.UUID(int=i) for i in range(50)}

        def fb(v: Any, box: list[Any] = box, d: dict[str, Any] = d, how: str = how) -> Any:
            if how == "clear":
                box.clear()
                d.clear()
            else:
                box.extend(range(10))
                d[f"new{len(d)}"] = 1
            return str(v)

        for target in ([box], box, d, {"before": d, "after": None}):
            trace(f"json_dumps with a fallback that does {how!r} to the container being written")
            got = outcome(lambda: _fastrows.json_dumps(target, fb, set(), False, True, ROWS))
            if got[0] == "err" and isinstance(got[1], (SystemError, MemoryError)):
                raise Finding(f"json_dumps with a mutating fallback ({how}) raised {type(got[1]).__name__}")
            trace(f"json_lines with a fallback that does {how!r} to a row being written")
            ch = [RowChange(good_schema, "update", d, {"b": box})]
            got = outcome(lambda: _fastrows.json_lines(b"{", ch, ref_piece, fb, 0, 1))
            if got[0] == "err" and isinstance(got[1], (SystemError, MemoryError)):
                raise Finding(f"json_lines with a mutating fallback ({how}) raised {type(got[1]).__name__}")
            stats["hostile callbacks survived"] += 1
    return dict(stats)


class RecordingKafka:
    """A Kafka client that records what the sender produces (the section compares
    encoders; the broker's side is tests/integration's). Partitions per topic are
    fixed by the topic's name."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def partitions(self, topic: str) -> int:
        return 1 + zlib.crc32(topic.encode()) % 7

    def create_topic(self, topic: str, partitions: int, replication: int) -> None:
        raise AssertionError("every topic exists")

    def learn(self, topic: str) -> None:
        pass

    def produce(self, topic: str, partition: int, key: Any, value: Any, headers: Any) -> None:
        self.sent.append((topic, partition, key, value, headers))

    def produce_all(self, messages: list[Any]) -> None:
        self.sent.extend(messages)

    def flush(self, timeout: float) -> list[str]:
        self.sent.append("flush")
        return []

    def close(self) -> None:
        pass


def kafka_sender(**opts: Any) -> Any:
    from senders.kafka.sender import KafkaSender

    options = {k.name: k.default for k in KafkaSender.KEYS}
    options.update(servers="127.0.0.1:9", process=False, **opts)
    sender = KafkaSender("k", options)
    sender.client = RecordingKafka()
    return sender


def rand_kafka_changes(rng: random.Random, schemas: list[TableSchema], n: int, wild: bool = True) -> list[RowChange]:
    """Row changes with keys that move, keep, vanish (None images) and repeat; ``wild``:
    with rand_changes' too (any value, not a row image, not an op)."""
    out = rand_changes(rng, schemas) if wild else []
    for _ in range(n):
        s = rng.choice(schemas)
        key = {c: rng.choice([1, 2, "k", None, b"\x00", decimal.Decimal("1.0"), 1.0]) for c in s.pk}
        key2 = {c: rng.choice([1, 2, "k", None]) for c in s.pk} if rng.random() < 0.5 else dict(key)
        row = {c: rand_scalar(rng) if wild else rng.choice([None, 1, "x\u00e9\n", b"\x00\xff", 2.5,
                                                            decimal.Decimal("-1.20"), dt.date(2024, 2, 29)])
               for c in s.columns if c not in s.pk}
        op = rng.choice(["insert", "update", "update", "delete", "read"])
        before = {**key, **row} if op in ("update", "delete") and rng.random() < 0.95 else None
        after = {**key2, **row, "extra": rand_scalar(rng) if wild else "x"} if op != "delete" else None
        out.insert(rng.randrange(len(out) + 1), RowChange(s, op, before, after))
    return out


def check_kafka_json(sender: Any, txn: Txn, seq0: int, part: Any, tomb: bool, now_ms: int) -> str:
    from senders.kafka import format as kformat

    pieces = kformat.json_txn_pieces(txn, now_ms)
    hbase = (("region", txn.region.encode()), ("commit_ts", str(txn.commit_ts).encode()))
    c = outcome(lambda: _fastrows.kafka_json(part, seq0, len(txn.changes), pieces,
                                             lambda s: sender.json_table(txn.region, s), encode._fallback, hbase,
                                             tomb))
    r = outcome(lambda: sender.row_messages(txn, part, seq0, sender.encoder(now_ms)))
    ctx = f"kafka_json(seq0={seq0}, tombstones={tomb}) of {short(txn, 3000)}"
    if c[0] == "ok":
        if r != c:
            got, want = c[1], r[1] if r[0] == "ok" else []
            j = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            raise Finding(f"kafka_json's message {j} of {len(got)} is {short(got[j:j + 1], 2000)}\n reference "
                          f"{short(want[j:j + 1], 2000) if r[0] == 'ok' else describe(r)}\n {ctx}")
        return "same messages"
    if not isinstance(c[1], FALLBACK_ERRORS) and not (r[0] == "err" and type(r[1]) is type(c[1])):
        raise Finding(f"kafka_json raised {type(c[1]).__name__}: {c[1]} (the sender has no fallback for it, and "
                      f"the reference {describe(r)}): {ctx}")
    if r[0] == "ok":
        why = refusal([[ch.op, ch.before, ch.after] for ch in part])
        if not why and any(type(ch.op) is not str or any(i is not None and type(i) is not dict
                                                             for i in (ch.before, ch.after)) for ch in part):
            why = "not a row image or op"
        if not why:
            raise Finding(f"kafka_json raised {type(c[1]).__name__}: {c[1]} where the reference writes (no "
                          f"documented reason): {ctx}")
        return f"C refuses ({why})"
    return "both raise"


def fuzz_kafka(seed_: int, n: int, trace: Trace) -> dict[str, Any]:
    """The Kafka sender's json messages: the C encoder (``kafka_json``) against the
    Python path (``row_messages``: json_envelope, change_events, key_bytes,
    partition_for), slice by slice; then whole batches through the sender with the C
    encoder and without it (its per-row loop); then mutated arguments."""
    import time as time_mod

    from senders.kafka import sender as ks

    rng = random.Random(seed_)
    stats: Counter[str] = Counter()
    schemas = [rand_schema(rng) for _ in range(5)] + [
        TableSchema("d`b", "t.x", ("id", "v"), ("id",)), TableSchema("d", "keyless", ("a",), ()),
        TableSchema("d", "two", ("a", "b", "v"), ("a", "b"))]
    for i in range(n):
        changes = rand_kafka_changes(rng, schemas, rng.choice([0, 1, 3, 8]))
        mark = SnapshotMark("run", 3, rng.random() < 0.5) if rng.random() < 0.2 else None
        txn = Txn(rand_text(rng, 4) or "r", rng.getrandbits(rng.choice([8, 63])), Position("bin.000001", 4),
                  tuple(changes), gtid=rng.choice(["", "0-1-2"]), snapshot=mark)
        tomb = rng.random() < 0.3
        sender = kafka_sender(topic=rng.choice(["capturer.{db}.{table}", "one", "{region}-{table}"]), tombstones=tomb)
        seq0 = rng.randrange(len(changes) + 1)
        trace(f"kafka_json #{i}: seq0={seq0} tomb={tomb} {short(txn, 5000)}")
        stats[check_kafka_json(sender, txn, seq0, changes[seq0:], tomb, rng.getrandbits(41))] += 1
        stats["inputs"] += 1
    # whole batches through the sender: the C encoder's messages == the per-row loop's, flushes included
    real_time = time_mod.time
    time_mod.time = lambda: 1_700_000_000.25  # type: ignore[assignment]  # (the envelope's ts_ms)
    try:
        for i in range(max(n // 40, 3)):
            batch = []
            for t in range(rng.randrange(1, 5)):
                rows = rng.choice([1, 5, ks.SLICE_ROWS + 3, 2 * ks.SLICE_ROWS]) if t == 0 else rng.randrange(6)
                changes = rand_kafka_changes(rng, schemas[5:], rows, wild=rng.random() < 0.2)
                batch.append(Txn("r1", 1000 + t, Position("bin.000001", t), tuple(changes), gtid="0-1-2"))
                if rng.random() < 0.2:
                    batch.append(Txn("r1", 1000 + t, Position("bin.000001", t),
                                     ddl=Ddl("d", "TRUNCATE TABLE keyless", "keyless")))
            if rng.random() < 0.3:  # a spilled transaction: the encoder reads it a chunk at a time
                w = SpillWriter(chunk_rows=rng.choice([7, 1000]))
                w.add(rand_kafka_changes(rng, schemas[5:], 2500, wild=False))
                batch.append(Txn("r2", 2000, Position("bin.000002", 4), w.finish()))
            opts = {"tombstones": rng.random() < 0.5, "txn_topic": rng.choice(["", "txns"])}
            trace(f"kafka batch #{i}: {opts} {short(batch, 3000)}")
            fast, slow = kafka_sender(**opts), kafka_sender(**opts)
            fast_client, slow_client = fast.client, slow.client  # (send() drops its client when it fails)
            a = outcome(lambda: fast.send(batch))
            real_c, ks._kafka_json = ks._kafka_json, None
            try:
                b = outcome(lambda: slow.send(batch))
            finally:
                ks._kafka_json = real_c
            if a[0] != b[0] or (a[0] == "err" and str(a[1]) != str(b[1])):
                raise Finding(f"with the C encoder send() {describe(a)}, without it {describe(b)}: {short(batch, 3000)}")
            if a[0] == "err":
                stats["batches refused both ways"] += 1
                continue
            if fast_client.sent != slow_client.sent:
                diff = next(j for j, (x, y) in enumerate(zip(fast_client.sent, slow_client.sent)) if x != y) \
                    if len(fast_client.sent) == len(slow_client.sent) else "length"
                raise Finding(f"the sender's messages differ with the C encoder (first at {diff}): {short(batch, 3000)}")
            stats["batches sent both ways"] += 1
            stats["messages compared"] += len(fast_client.sent)
    finally:
        time_mod.time = real_time  # type: ignore[assignment]
    # mutated arguments: a clean exception or a list, never a crash
    from senders.kafka import format as kformat

    good = TableSchema("d", "t", ("id",), ("id",))
    txn = Txn("r", 5, Position("f", 4), (RowChange(good, "insert", None, {"id": 1}),))
    pieces = kformat.json_txn_pieces(txn, 7)
    sender = kafka_sender()
    table = lambda s: sender.json_table("r", s)  # noqa: E731
    argsets: dict[str, list[Any]] = {
        "changes": [None, 5, "str", (), [5], [None], [SimpleNamespace(schema=good)], iter([]),
                    [SimpleNamespace(schema=good, op=5, before=None, after={"id": 1})],
                    [RowChange(good, "update", {"id": 1}, {"id": 2})] * 3],
        "seq": [0, 1, -1, 2**63 - 1, 2**63, 1.5, "3", None, True],
        "pieces": [pieces, pieces[:4], (b"",) * 5, ("a",) * 5, None, [b""] * 5],
        "table": [table, None, lambda s: 1 / 0, lambda s: ("t", 0, b"", (), b""), lambda s: ("t", 3, b"", ("id",)),
                  lambda s: ("t", 3, b"", (5,), b""), lambda s: ("t", 2**70, b"", (), b""),
                  lambda s: ("t", 3, "", (), b""), lambda s: ("t", -1, b"", (), b"")],
        "fallback": [encode._fallback, None, lambda v: v, lambda v: 1 / 0],
        "hbase": [(("region", b"r"), ("commit_ts", b"5")), (), None, ((1, 2), (3, 4)), ("a", "b")],
        "tomb": [True, False, 0, "x", None],
    }
    for i in range(n // 2):
        args = [rng.choice(v) if rng.random() < 0.25 else v[0] for v in argsets.values()]
        args.insert(2, rng.choice(argsets["seq"]))
        trace(f"kafka_json mutated args #{i}: {short(args, 5000)}")
        clean_call("kafka_json", args, list)
        stats["kafka_json mutated-argument calls"] += 1
    for how in ("clear", "grow", "raise"):
        victim: list[Any] = []
        victim += [Evil(victim, good, how) for _ in range(5)] + [RowChange(good, "insert", None, {"id": 1})] * 5
        trace(f"kafka_json with changes whose .schema does {how!r} to the list")
        got = outcome(lambda: _fastrows.kafka_json(victim, 0, 10, pieces, table, encode._fallback,
                                                   (("region", b"r"), ("commit_ts", b"5")), False))
        if got[0] == "err" and isinstance(got[1], (SystemError, MemoryError)):
            raise Finding(f"kafka_json with a mutating change ({how}) raised {type(got[1]).__name__}")
        stats["hostile callbacks survived"] += 1
    return dict(stats)


# =============================================================================================
# hypothesis-driven variants (shrinking to a minimal input), also run in the child process
# =============================================================================================

json_leaves = st.one_of(
    st.integers(0, len(EDGES) - 1).map(lambda i: EDGES[i]),  # (sampled_from would repr 10**4300)
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=12),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.datetimes(timezones=st.none() | st.just(UTC)), st.dates(), st.times(), st.timedeltas(),
    st.binary(max_size=12), st.binary(max_size=6).map(bytearray), st.binary(max_size=6).map(memoryview),
    st.frozensets(st.text(max_size=3), max_size=3).map(set),
)
json_keys = st.text(max_size=6) | st.sampled_from(["before", "after", "b64", "\ud800", 1, 2.5, None, True])
json_values = st.recursive(json_leaves, lambda kids: st.lists(kids, max_size=4) | st.tuples(kids, kids)
                           | st.dictionaries(json_keys, kids, max_size=4), max_leaves=12)
row_images = st.none() | st.dictionaries(st.text(max_size=4), json_values, max_size=5)


def hyp_json(seed_: int, n: int, trace: Trace) -> dict[str, Any]:
    stats: Counter[str] = Counter()

    @seed(seed_)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(obj=json_values | st.fixed_dictionaries({"before": row_images, "after": row_images},
                                                  optional={"x": json_values}), compact=st.booleans())
    def prop(obj: Any, compact: bool) -> None:
        trace(f"hypothesis json compact={compact}: {short(obj, 5000)}")
        stats[check_json(obj, compact)] += 1
        stats["inputs"] += 1

    prop()
    return dict(stats)


OP_NAMES = ["flip", "truncate", "insert", "delete", "length", "extreme", "bitmap", "splice", "garbage"]


def apply_ops(data: bytes, fields: Any, other: bytes, ops: list[tuple[int, int]]) -> bytes:
    for op, arg in ops:
        data = MUTATIONS[op % len(MUTATIONS)](random.Random(arg), data, fields, other)
    return data


def hyp_rows(seed_: int, n: int, trace: Trace) -> dict[str, Any]:
    stats: Counter[str] = Counter()
    rng0 = random.Random(seed_)
    tables = [make_table(CATALOG)] + [rand_table(rng0) for _ in range(20)]
    bk_tables = [rand_bk_table(rng0) for _ in range(20)]

    @seed(seed_)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(t=st.integers(0, len(tables) - 1), body_seed=st.integers(0, 2**32), update=st.booleans(),
           ops=st.lists(st.tuples(st.integers(0, 99), st.integers(0, 2**32)), max_size=3), flip_update=st.booleans())
    def mysql_prop(t: int, body_seed: int, update: bool, ops: list[tuple[int, int]], flip_update: bool) -> None:
        tab = tables[t]
        body = enc_body(random.Random(body_seed), tab.cols, update)
        if not ops:
            trace(f"hypothesis mysql roundtrip specs={tab.label} update={update} data={body.data.hex()}")
            check_roundtrip(tab, body)
        data = apply_ops(body.data, body.fields, body.data[::-1], ops)
        trace(f"hypothesis mysql specs={tab.label} update={update ^ flip_update} data={data.hex()}")
        stats[check_rows(tab, data, update ^ flip_update, "hypothesis")] += 1
        stats["inputs"] += 1

    @seed(seed_)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(t=st.integers(0, len(bk_tables) - 1), row_seed=st.integers(0, 2**32),
           ops=st.lists(st.tuples(st.integers(0, 99), st.integers(0, 2**32)), max_size=3))
    def baikal_prop(t: int, row_seed: int, ops: list[tuple[int, int]]) -> None:
        tab = bk_tables[t]
        data, fields, _ = bk_row(random.Random(row_seed), tab)
        data = apply_ops(data, fields, data[::-1], ops)
        trace(f"hypothesis baikal fields={tab.label} data={data.hex()}")
        stats[check_bk(tab, data, "hypothesis")] += 1
        stats["inputs"] += 1

    mysql_prop()
    baikal_prop()
    return dict(stats)


# =============================================================================================
# the inputs that found each bug, minimal (several of them crashed the process before the fix)
# =============================================================================================

def regressions(seed_: int, n: int, trace: Trace) -> dict[str, Any]:
    stats: Counter[str] = Counter()

    def refused(label: str, fn: Callable[[], Any], exc: type[BaseException]) -> None:
        trace(label)
        got = outcome(fn)
        if got[0] != "err" or not isinstance(got[1], exc):
            raise Finding(f"{label}: {describe(got)}, expected {exc.__name__}")
        stats["regressions"] += 1

    # Plan specs: an INT of width -1000 read before the event (segfault); a BIT of -5 bytes moved the
    # offset backwards (endless loop); DECIMAL(1,5) indexed DIG2BYTES[-4] and memcpy'd a negative size;
    # -2**63 was truncated to an int (0) and accepted
    refused("Plan INT(-1000)", lambda: _fastrows.Plan(("a", "b"), ((1, -1000, 0), (1, 4, 0))), ValueError)
    refused("Plan BIT bytes=-5", lambda: _fastrows.Plan(("a",), ((13, 1, -5),)), ValueError)
    refused("Plan DECIMAL(1,5)", lambda: _fastrows.Plan(("a",), ((6, 1, 5),)), ValueError)
    refused("Plan DECIMAL(145,0)", lambda: _fastrows.Plan(("a",), ((6, 145, 0),)), ValueError)
    refused("Plan INT(2**32+4)", lambda: _fastrows.Plan(("a",), ((1, 2**32 + 4, 0),)), OverflowError)
    refused("Plan DECIMAL(65,-2**63)", lambda: _fastrows.Plan(("a",), ((6, 65, -(2**63)),)), OverflowError)
    # a plan without columns looped forever (and without bound in memory) on any bytes, in C and Python
    refused("Plan((), ()).rows(00)", lambda: _fastrows.Plan((), ()).rows(b"\x00", False), ValueError)
    refused("TablePlan([]).rows(00)", lambda: rowdecode.TablePlan([], use_c=False).rows(b"\x00", False), ValueError)
    # the Python decoder read a VARCHAR cut short as a shorter string (C: "truncated")
    tab = make_table([col(T.VARCHAR, max_length=40)])
    trace("VARCHAR length 5 with 2 bytes")
    if not check_rows(tab, bytes.fromhex("00056162"), False).startswith("both raise"):
        raise Finding("a truncated VARCHAR decodes")
    stats["regressions"] += 1
    # JSON values C wrote differently from json.dumps / encode_line
    for obj in ({"before": {"t": dt.timedelta.max}, "after": None},  # int64 overflow: "-1620477880:09:07.758081"
                {"before": {"t": dt.timedelta(days=-999999999)}, "after": None},
                {"before": {"m": memoryview(b"ab")}, "after": None},  # base64 but not listed in "b64"
                {"before": {"j": {"x": b"ab"}}, "after": None},  # "x" listed: not a column
                {"extra": b"ab", "before": None, "after": None},  # "extra" listed: not a column
                {"before": moved_odict(), "after": None},  # OrderedDict in dict order, not its own
                {"before": {"b": b"1"}}):  # the Python path added "after": null
        trace(f"regression json {short(obj)}")
        for compact in (False, True):
            if not check_json(obj, compact).startswith("same"):
                raise Finding(f"{short(obj)} is not written by C")
        stats["regressions"] += 1
    # a fallback that empties the list being written: C read past its end (segfault)
    box: list[Any] = [uuid.UUID(int=i) for i in range(1000)]

    def emptying(v: Any) -> Any:
        box.clear()
        return str(v)

    trace("json_dumps with a fallback that empties the list")
    got = outcome(lambda: _fastrows.json_dumps([box], emptying))
    if got[0] == "err":
        raise Finding(f"json_dumps with an emptying fallback {describe(got)}")
    stats["regressions"] += 1
    # a change whose .schema empties the changes list: C kept reading its old items (segfault)
    schema = TableSchema("d", "t", ("a",), ("a",))
    victim: list[Any] = []
    victim += [Evil(victim, schema, "clear")] + [RowChange(schema, "insert", None, {"a": 1})] * 20
    trace("json_lines with a change that empties the list")
    got = outcome(lambda: _fastrows.json_lines(b"{", victim, ref_piece, encode._fallback, 0, 21))
    if got[0] == "err":
        raise Finding(f"json_lines with an emptying change {describe(got)}")
    stats["regressions"] += 1
    # seq0 + i overflowed a signed Py_ssize_t (right only thanks to -fwrapv)
    chs = [RowChange(schema, "insert", None, {"a": 1})] * 2
    trace("json_lines at seq0 = sys.maxsize")
    if check_json_lines(b"{", chs, sys.maxsize, sys.maxsize) != "same lines":
        raise Finding("json_lines at seq0 = sys.maxsize")
    stats["regressions"] += 1
    return dict(stats)


SECTIONS: dict[str, Callable[[int, int, Trace], dict[str, Any]]] = {
    "mysql": fuzz_mysql, "mysql_specs": fuzz_mysql_specs, "baikal": fuzz_baikal, "baikal_specs": fuzz_baikal_specs,
    "json": fuzz_json, "kafka": fuzz_kafka, "hyp_json": hyp_json, "hyp_rows": hyp_rows, "regressions": regressions,
}


def child_main(argv: list[str]) -> int:
    section, seed_, n, trace_path = argv[0], int(argv[1]), int(argv[2]), argv[3]
    faulthandler.enable()
    try:
        import resource

        cap = 3 << 30  # a runaway loop ends in MemoryError, not in the machine swapping
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, ValueError, OSError):
        pass
    trace = Trace(trace_path)
    try:
        stats = SECTIONS[section](seed_, n, trace)
    except Finding as f:
        print(f"FINDING: {f}", flush=True)
        return 1
    print(json.dumps(stats, sort_keys=True), flush=True)
    return 0


def run_child(section: str, seed_: int, n: int, timeout: float = 240) -> dict[str, Any]:
    """Run a section in a child process; a crash or hang fails with the input it was on."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "case"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
               "PYTHONHASHSEED": "0"}
        cmd = [sys.executable, str(Path(__file__).resolve()), section, str(seed_), str(n), str(trace)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
        except subprocess.TimeoutExpired as exc:
            case = trace.read_text(errors="replace").split("\n", 1)[0] if trace.exists() else "?"
            pytest.fail(f"{section} (seed {seed_}) hung for {timeout} s on: {case}\n{exc.stderr or ''}"[-20000:])
        case = trace.read_text(errors="replace").split("\n", 1)[0] if trace.exists() else "?"
        if proc.returncode < 0:
            pytest.fail(f"{section} (seed {seed_}): the process died of signal {-proc.returncode} on: {case}\n"
                        f"stderr: {proc.stderr[-6000:]}")
        if proc.returncode != 0:
            pytest.fail(f"{section} (seed {seed_}) failed (exit {proc.returncode}) on: {case}\n"
                        f"{proc.stdout[-8000:]}\n{proc.stderr[-8000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


# =============================================================================================
# the tests
# =============================================================================================

def test_mysql_rows_c_equals_python_on_mutated_bodies() -> None:
    stats = run_child("mysql", 20240611, 12000)
    assert stats["inputs"] >= 12000
    assert stats["valid bodies round-tripped"] >= 300
    assert stats.get("same rows", 0) >= 2000, stats  # mutations that keep a decodable body are compared too
    assert sum(v for k, v in stats.items() if k.startswith("both raise")) >= 5000, stats


def test_mysql_plan_specs_are_checked() -> None:
    stats = run_child("mysql_specs", 7, 4000)
    assert stats["specs accepted"] >= 300 and stats["specs refused"] >= 1000, stats


def test_baikaldb_rows_c_equals_python_on_mutated_rows() -> None:
    stats = run_child("baikal", 99, 12000)
    assert stats["valid rows round-tripped"] == 200
    assert stats.get("same row", 0) >= 1500 and stats.get("both raise", 0) >= 2000, stats


def test_baikaldb_plan_specs_are_checked() -> None:
    stats = run_child("baikal_specs", 3, 3000)
    assert stats["specs accepted"] >= 300 and stats["specs refused"] >= 300, stats


def test_json_c_equals_python_on_random_values_and_json_lines_arguments() -> None:
    stats = run_child("json", 1234, 3000)
    assert stats["same text"] >= 3000 and stats["same lines"] >= 200 and stats["txns rendered"] == 150, stats
    assert any(k.startswith("C refuses") for k in stats), stats
    assert stats["hostile callbacks survived"] == 11, stats


def test_kafka_json_c_equals_python() -> None:
    stats = run_child("kafka", 77, 1500)
    assert stats["same messages"] >= 700 and stats["batches sent both ways"] >= 15, stats
    assert stats["messages compared"] >= 20_000 and stats["hostile callbacks survived"] == 3, stats
    assert any(k.startswith("C refuses") for k in stats), stats


def test_hypothesis_json() -> None:
    stats = run_child("hyp_json", 5, 400)
    assert stats["inputs"] >= 300, stats


def test_hypothesis_rows() -> None:
    stats = run_child("hyp_rows", 5, 400)
    assert stats["inputs"] >= 600, stats


def test_regressions_found_by_fuzzing() -> None:
    assert run_child("regressions", 0, 0)["regressions"] == 19


def test_mysql_json_columns_take_the_library_path() -> None:
    """MySQL's binary JSON has no plan decoder (C or Python): such tables go through the library."""
    assert not rowdecode.TablePlan([col(T.JSON, name="j")]).ok


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("section,n", [("mysql", 300000), ("mysql_specs", 60000), ("baikal", 200000),
                                       ("baikal_specs", 50000), ("json", 20000), ("kafka", 20000), ("hyp_json", 3000),
                                       ("hyp_rows", 4000)])
def test_extended_fuzz(section: str, n: int) -> None:
    for s in (1, 2):
        run_child(section, 1000 + s, n, timeout=3000)


# --- the oracle can fail: each check flags a wrong answer ------------------------------------------

def test_checks_flag_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    tab = make_table([col(T.LONG), col(T.VARCHAR, max_length=40)])
    body = enc_body(random.Random(1), tab.cols, False)
    check_roundtrip(tab, body)
    assert check_rows(tab, body.data, False) == "same rows"

    class Wrong:
        def __init__(self, result: Any):
            self.result = result

        def rows(self, data: bytes, update: bool) -> Any:
            if isinstance(self.result, Exception):
                raise self.result
            return self.result

    bad = dataclasses.replace(tab, c=Wrong([({"c0": 1, "c1": "x"}, None)]))
    with pytest.raises(Finding, match="decode differently"):
        check_rows(bad, body.data, False)
    with pytest.raises(Finding, match="does not give back"):
        check_roundtrip(bad, body)
    with pytest.raises(Finding, match="SystemError"):
        check_rows(dataclasses.replace(tab, c=Wrong(SystemError("bad"))), body.data, False)
    with pytest.raises(Finding, match="but Python returned"):
        check_rows(dataclasses.replace(tab, c=Wrong(ValueError("truncated"))), body.data, False)
    assert not spec_is_safe((1, 0, 0)) and not spec_is_safe((6, 1, 5)) and not spec_is_safe((13, 1, -5))
    assert spec_is_safe((1, 8, 1)) and spec_is_safe((6, 65, 38)) and spec_is_safe((13, 64, 8))
    # JSON: a wrong text, a wrong base64 listing, a refusal without a reason
    real = _fastrows

    class FakeJson:
        def __init__(self, how: str):
            self.how = how

        def json_dumps(self, obj: Any, fb: Any, b64: Any = None, compact: bool = False, as_bytes: bool = False,
                       rows: Any = None) -> Any:
            out = real.json_dumps(obj, fb, b64, compact, as_bytes, rows)
            if self.how == "text":
                return out + (b" " if as_bytes else " ")
            if self.how == "b64":
                b64.add("id")
                return out
            raise TypeError("refused")

    line = {"before": {"id": 1, "b": b"\x00"}, "after": None}
    assert check_json(dict(line), False) == "same text"
    for how, msg in (("text", "C wrote"), ("b64", "listed base64"), ("refuse", "no documented reason")):
        monkeypatch.setitem(globals(), "_fastrows", FakeJson(how))
        with pytest.raises(Finding, match=msg):
            check_json(dict(line), False)
    monkeypatch.setitem(globals(), "_fastrows", real)
    # BaikalDB: a wrong row, a wrong exception
    bk = rand_bk_table(random.Random(3))
    data, _, _ = bk_row(random.Random(4), bk)
    assert check_bk(bk, data) == "same row"
    for fake in (lambda d: ({}, (), 0), lambda d: (_ for _ in ()).throw(SystemError("x"))):
        monkeypatch.setattr(bk.plan, "_c", SimpleNamespace(row=fake))
        with pytest.raises(Finding):
            check_bk(bk, data)
    assert refusal({1: "x"}) and refusal(["\ud800"]) and refusal(json.loads("[" * 70 + "]" * 70)) is not None
    assert refusal({"a": [1, "x", b"y", dt.datetime(2020, 1, 1)]}) is None
    assert expected_b64({"before": {"a": b"1", "b": {"c": b"2"}}, "x": {"d": b"3"}}, ROWS) == {"a"}


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
