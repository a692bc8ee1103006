"""The C build (capturer._fastrows) against its Python specification.

* ``json_dumps`` must give exactly the text of the Python path of
  ``encode_line`` (stdlib json with ``json_value``) for every value a row can hold;
* ``Plan.rows`` must give exactly what the Python ``TablePlan`` gives on any
  bytes both accept, and must never crash on bytes that are not a valid event
  (random and truncated input).
The golden comparison with the library on a real server is in
tests/integration/test_rowdecode.py.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import random
import struct
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysqlreplication.constants import FIELD_TYPE as T

from capturer.model import encode
from capturer.regions.mysql import rowdecode

pytestmark = pytest.mark.skipif(not rowdecode.c_decoder_built(), reason="capturer._fastrows not built")

# --- encoder -----------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30),
    st.decimals(allow_nan=False, allow_infinity=False, places=None),
    st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),
    st.dates(), st.times(),
    st.timedeltas(min_value=-dt.timedelta(days=40), max_value=dt.timedelta(days=40)),
    st.binary(max_size=20),
    st.frozensets(st.sampled_from(["a", "b", "c"])).map(set),
)
names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
rows = st.dictionaries(names, scalars, max_size=8)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=st.one_of(st.none(), rows), after=st.one_of(st.none(), rows), compact=st.booleans(),
       seq=st.integers(0, 10**6), extra=st.lists(scalars, max_size=3))
def test_c_json_equals_python(before: Any, after: Any, compact: bool, seq: int, extra: list[Any]) -> None:
    line = {"region": "r\"1\n", "commit_ts": 2**62 + seq, "position": {"file": "f.000001", "pos": seq},
            "seq": seq, "db": "d`b", "op": "update", "pk": ["id"], "before": before, "after": after,
            "extra": [v for v in extra if not isinstance(v, (bytes, set))], "last": seq % 2 == 0}
    c = encode.encode_line(line, compact=compact, use_c=True)
    py = encode.encode_line(line, compact=compact, use_c=False)
    assert c == py
    assert encode.encode_line_bytes(line, compact=compact, use_c=True) == py.encode()


def test_c_json_edge_values() -> None:
    line = {"before": {"nan": math.nan, "inf": -math.inf, "big": 2**64 - 1, "neg": -(2**63), "ctl": "\x00\x1f\x7f\"\\é😀",
                       "zero_dec": decimal.Decimal("0.000000000"), "tz": dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
                       "neg_td": -dt.timedelta(microseconds=1), "b": b"\x00\xff", "e": b""},
            "after": None}
    assert encode.encode_line(line, use_c=True) == encode.encode_line(line, use_c=False)
    assert '"b64": ["b", "e"]' in encode.encode_line(line, use_c=True)


# --- decoder -----------------------------------------------------------------

def col(t: int, **kw: Any) -> Any:
    base = {"type": t, "unsigned": False, "name": "c", "character_set_name": "utf8mb4", "max_length": 20, "length_size": 2,
                "precision": 10, "decimals": 2, "fsp": 0, "size": 1, "enum_values": None, "set_values": None, "bits": 8, "bytes": 1}
    base.update(kw)
    return SimpleNamespace(**base)


COLUMNS = [
    col(T.TINY), col(T.TINY, unsigned=True), col(T.SHORT), col(T.INT24), col(T.INT24, unsigned=True), col(T.LONG),
    col(T.LONGLONG, unsigned=True), col(T.LONGLONG), col(T.FLOAT), col(T.DOUBLE), col(T.YEAR),
    col(T.VARCHAR, max_length=40), col(T.VARCHAR, max_length=400), col(T.STRING, character_set_name="latin1"),
    col(T.BLOB, length_size=1, character_set_name="binary"), col(T.BLOB, length_size=3),
    col(T.NEWDECIMAL, precision=12, decimals=2), col(T.NEWDECIMAL, precision=65, decimals=30),
    col(T.NEWDECIMAL, precision=5, decimals=0), col(T.DATETIME2, fsp=0), col(T.DATETIME2, fsp=3),
    col(T.DATETIME2, fsp=6), col(T.TIMESTAMP2, fsp=2), col(T.TIME2, fsp=0), col(T.TIME2, fsp=5), col(T.DATE),
    col(T.ENUM, size=1, enum_values=["", "a", "b", "c"]), col(T.SET, size=1, set_values=["x", "y", "z"]),
    col(T.BIT, bits=9, bytes=2), col(T.GEOMETRY, length_size=4),
]
for i, c in enumerate(COLUMNS):
    c.name = f"c{i}"


def plans(cols: list[Any]) -> tuple[rowdecode.TablePlan, rowdecode.TablePlan]:
    c, py = rowdecode.TablePlan(cols, use_c=True), rowdecode.TablePlan(cols, use_c=False)
    assert c.c is not None and py.c is None
    return c, py


def frac_bytes(rng: random.Random, fsp: int) -> bytes:
    n = (fsp + 1) // 2
    return (rng.randrange(10**fsp) * (10 if fsp % 2 else 1)).to_bytes(n, "big") if n else b""


def encode_value(rng: random.Random, c: Any) -> bytes:
    """A plausible binlog encoding of one value of column ``c``."""
    t = c.type
    if t in (T.TINY, T.SHORT, T.INT24, T.LONG, T.LONGLONG):
        n = {T.TINY: 1, T.SHORT: 2, T.INT24: 3, T.LONG: 4, T.LONGLONG: 8}[t]
        return rng.getrandbits(8 * n).to_bytes(n, "little")
    if t == T.FLOAT:
        return struct.pack("<f", rng.uniform(-1e30, 1e30))
    if t == T.DOUBLE:
        return struct.pack("<d", rng.uniform(-1e300, 1e300))
    if t == T.YEAR:
        return bytes([rng.randrange(256)])
    if t in (T.VARCHAR, T.STRING, T.BLOB, T.GEOMETRY):
        s = rng.choice(["", "abc", "é😀", "a\x00b"]).encode("utf-8") if c.character_set_name == "utf8mb4" \
            else bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
        prefix = c.length_size if t in (T.BLOB, T.GEOMETRY) else (2 if c.max_length > 255 else 1)
        return len(s).to_bytes(prefix, "little") + s
    if t == T.NEWDECIMAL:  # MySQL's packed decimal: digit groups, sign in the top bit, negatives inverted
        intg, frac = c.precision - c.decimals, c.decimals
        d2b = rowdecode._DIG2BYTES
        out = b""
        if intg % 9:
            out += rng.randrange(10 ** (intg % 9)).to_bytes(d2b[intg % 9], "big")
        out += b"".join(rng.randrange(10**9).to_bytes(4, "big") for _ in range(intg // 9 + frac // 9))
        if frac % 9:
            out += rng.randrange(10 ** (frac % 9)).to_bytes(d2b[frac % 9], "big")
        b = bytearray(out)
        b[0] |= 0x80
        if rng.random() < 0.5:
            b = bytearray(x ^ 0xFF for x in b)
        return bytes(b)
    if t == T.DATETIME2:
        v = (rng.randrange(1, 9999 * 13) << 22) | (rng.randrange(1, 29) << 17) | (rng.randrange(24) << 12) \
            | (rng.randrange(60) << 6) | rng.randrange(60)
        return v.to_bytes(5, "big") + frac_bytes(rng, c.fsp)
    if t == T.TIMESTAMP2:
        return rng.getrandbits(32).to_bytes(4, "big") + frac_bytes(rng, c.fsp)
    if t == T.TIME2:
        return rng.getrandbits(24).to_bytes(3, "big") + frac_bytes(rng, c.fsp)
    if t == T.DATE:
        v = (rng.randrange(0, 9999) << 9) | (rng.randrange(0, 13) << 5) | rng.randrange(0, 32)
        return v.to_bytes(3, "little")
    if t in (T.ENUM, T.SET):
        return bytes([rng.randrange(4) if t == T.ENUM else rng.randrange(8)])
    if t == T.BIT:
        return rng.getrandbits(16).to_bytes(2, "big")
    raise AssertionError(t)


def canon(rows: Any) -> Any:
    return [[(k, type(v).__name__, repr(v)) for k, v in (r or {}).items()] for pair in rows for r in pair]


def both(c: rowdecode.TablePlan, py: rowdecode.TablePlan, data: bytes, update: bool) -> tuple[Any, Any]:
    out = []
    for p in (c, py):
        try:
            out.append(("ok", canon(p.rows(data, update))))
        except Exception as e:
            out.append(("err", type(e).__name__))
    return out[0], out[1]


def test_c_decoder_equals_python_on_generated_rows() -> None:
    rng = random.Random(11)
    c, py = plans(COLUMNS)
    compared = 0
    for update in (False, True):
        for _ in range(300):
            data = b""
            for _ in range(rng.randrange(1, 4) * (2 if update else 1)):
                nulls = [rng.random() < 0.2 for _ in COLUMNS]
                bitmap = bytearray((len(COLUMNS) + 7) // 8)
                for i, isnull in enumerate(nulls):
                    if isnull:
                        bitmap[i >> 3] |= 1 << (i & 7)
                data += bytes(bitmap) + b"".join(encode_value(rng, col_) for col_, isnull in zip(COLUMNS, nulls)
                                                  if not isnull)
            rc, rp = both(c, py, data, update)
            if rp[0] == "ok":
                assert rc == rp
                compared += 1
            else:  # an impossible value fails in both
                assert rc[0] == "err"
    assert compared == 600  # the generator makes valid encodings only


def test_c_decoder_never_crashes_on_garbage() -> None:
    rng = random.Random(5)
    c, py = plans(COLUMNS)
    good = b""
    for _ in range(3):
        good += bytes((len(COLUMNS) + 7) // 8) + b"".join(encode_value(rng, x) for x in COLUMNS)
    for cut in range(len(good)):  # every truncation: an error or the rows before it, never a crash
        try:
            c.c.rows(good[:cut], False)
        except (ValueError, IndexError, UnicodeDecodeError, ArithmeticError):
            pass
    for _ in range(3000):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        try:
            c.c.rows(junk, rng.random() < 0.5)
        except (ValueError, IndexError, UnicodeDecodeError, ArithmeticError):
            pass
    assert c.c.rows(good, False) and canon(c.rows(good, False)) == canon(py.rows(good, False))


def test_timestamp_past_2038_on_both_paths() -> None:
    """A TIMESTAMP's 4 bytes are unsigned seconds (the server reads them so): MariaDB 11.5+ keeps
    values up to 2106-02-07 06:28:15.999999 UTC, the period end of a system-versioned table's current
    rows among them. Read as signed, they were 1901-1969 dates, and every current row of such a table
    was taken for history (versioning.is_current) and dropped."""
    from capturer.regions.mysql import versioning

    c, py = plans([col(T.TIMESTAMP2, fsp=6)])
    for secs, us, want in ((2**31 - 1, 0, dt.datetime(2038, 1, 19, 3, 14, 7)),
                           (2**31, 5, dt.datetime(2038, 1, 19, 3, 14, 8, 5)),
                           (2**32 - 1, 999999, dt.datetime(2106, 2, 7, 6, 28, 15, 999999))):
        data = b"\x00" + secs.to_bytes(4, "big") + us.to_bytes(3, "big")
        for p in (c, py):
            ((row, _),) = p.rows(data, False)
            assert list(row.values()) == [want], (p, secs)
    assert versioning.is_current(dt.datetime(2106, 2, 7, 6, 28, 15, 999999))


def test_invalid_date_is_null_on_both_paths() -> None:
    c, py = plans([col(T.DATE)])
    feb30 = ((2020 << 9) | (2 << 5) | 30).to_bytes(3, "little")
    assert c.rows(b"\x00" + feb30, False) == py.rows(b"\x00" + feb30, False) == [({"c": None}, None)]


def test_c_murmur2_equals_python() -> None:
    from capturer._fastrows import murmur2 as c_murmur2
    from senders.kafka.sender import murmur2

    rng = random.Random(3)
    for _ in range(5000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        assert c_murmur2(data) == murmur2(data)


def test_c_sql_literals_equal_pymysql() -> None:
    """FastCursor's escaping gives pymysql's exact text for every value type,
    with and without NO_BACKSLASH_ESCAPES (no server needed: defer_connect)."""
    import pymysql

    from senders.mysql.worker import _NO_BACKSLASH, FastCursor

    conn = pymysql.connect(defer_connect=True, charset="utf8mb4")
    values: list[Any] = [
        None, True, False, 0, -1, 2**64 - 1, -(2**63), 10**30, 1.5, -0.0, 1e300, 5e-324, 123456789.0,
        "", "plain", "it's \"q\" \\ \n \r \x00 \x1a %s %% é😀", "\x81\x9d",
        b"", b"\x00'\\\xff", bytearray(b"ab"),
        decimal.Decimal("0.000000000"), decimal.Decimal("-12345678901234567890.123456789"), decimal.Decimal("1E+5"),
        dt.datetime(1, 1, 1), dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.date(9999, 12, 31),
        dt.timedelta(0), -dt.timedelta(microseconds=1), dt.timedelta(hours=838, minutes=59, seconds=59),
        -dt.timedelta(hours=838, minutes=59, seconds=58, microseconds=5), dt.time(1, 2, 3, 4),
        dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
    ]
    rng = random.Random(9)
    for _ in range(300):
        values.append("".join(chr(rng.choice([0, 10, 13, 26, 34, 39, 92, 65, 233, 0x1F600])) for _ in range(8)))
        # longer texts with a special character here and there (the 8-bytes-at-a-time scan, its tail)
        values.append("".join(chr(rng.choice([0, 9, 10, 13, 26, 31, 32, 34, 39, 92, 127, 0xE9]) if rng.random() < 0.05
                                  else rng.choice([97, 98, 122, 48, 32, 0x1F600])) for _ in range(rng.randrange(60))))
        values.append(decimal.Decimal(rng.randrange(-10**12, 10**12)).scaleb(rng.randrange(-40, 10)))
    for status in (0, _NO_BACKSLASH):
        conn.server_status = status
        cur = FastCursor(conn)
        plain = pymysql.cursors.Cursor(conn)
        q = ", ".join(["%s"] * len(values))
        assert cur._mogrify(q, values) == plain._mogrify(q, values)
        for bad in (float("nan"), float("inf"), decimal.Decimal("NaN")):  # pymysql's own error, not ours
            with pytest.raises(pymysql.err.ProgrammingError):
                cur._mogrify("%s", [bad])


# --- the file sender's batch renderer ------------------------------------------

tables = st.builds(
    lambda db, table, pk: __import__("capturer.model", fromlist=["TableSchema"]).TableSchema(
        db, table, tuple(pk), tuple(pk)),
    names, names, st.lists(names, max_size=3))
ops = st.sampled_from(["insert", "update", "delete", "read"])
any_text = st.text(max_size=6)
changes_st = st.lists(st.tuples(tables, ops, st.one_of(st.none(), rows),
                                st.one_of(st.none(), rows, st.dictionaries(names, any_text, max_size=2))),
                      max_size=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=changes_st, snapshot=st.booleans(), spill=st.booleans(), slice_rows=st.integers(1, 7))
def test_file_blocks_equal_lines(changes: list[Any], snapshot: bool, spill: bool, slice_rows: int) -> None:
    """The C batch renderer of the file sender writes byte for byte what the
    reference per-line path writes, for every value, name, slice and spill."""
    from capturer.model import Position, RowChange, SnapshotMark, Txn
    from capturer.model.spill import SpillWriter
    from senders.local import sender as local

    rc = tuple(RowChange(s, op, b, a) for s, op, b, a in changes)
    body: Any = rc
    if spill and rc:
        w = SpillWriter(None, chunk_rows=3)
        w.add(list(rc))
        body = w.finish()
    txn = Txn("r\"1", 2**62 + 5, Position("bin.000001", 4), body, gtid="0-1-2", source_ts=7,
              snapshot=SnapshotMark("run-1", 3, True) if snapshot else None)
    expect = b"".join(line + b"\n" for line in local.txn_lines_json(txn))
    old = local.SLICE_ROWS
    local.SLICE_ROWS = slice_rows
    try:
        got = b"".join(local.txn_blocks_json(txn))
    finally:
        local.SLICE_ROWS = old
    assert got == expect
    assert got.count(b"\n") == len(rc)


def test_c_sql_tuples_equal_pymysql() -> None:
    """The MySQL sender's multi-row VALUES text in one C call is what pymysql's
    mogrify writes for the same rows as parameters (every type, both escaping
    modes, the fallback for a type it does not know), and a missing column is a
    KeyError as with ``row[c]``."""
    import pymysql

    from capturer._fastrows import sql_tuples
    from senders.mysql.worker import _NO_BACKSLASH

    conn = pymysql.connect(defer_connect=True, charset="utf8mb4")
    pool: list[Any] = [
        None, True, 0, -(2**63), 10**30, 1.5, -0.0, "", "it's \"q\" \\ \n \r \x00 \x1a %s %% é😀", b"\x00'\\\xff",
        bytearray(b"ab"), decimal.Decimal("-12345678901234567890.123456789"), decimal.Decimal("1E+5"),
        dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.date(9999, 12, 31), -dt.timedelta(microseconds=1),
        dt.time(1, 2, 3, 4), frozenset({"a", "b'"}), ("x", 1),  # the last two: pymysql's escape (the fallback)
    ]
    rng = random.Random(11)
    cols = ["a", "b c", "`d`", "%s"]
    for status in (0, _NO_BACKSLASH):
        conn.server_status = status
        plain = pymysql.cursors.Cursor(conn)
        for nrows in (0, 1, 2, 7, 50):
            rows = [{c: rng.choice(pool) for c in reversed(cols)} for _ in range(nrows)]
            for use in (cols, cols[:1], cols[2:]):
                want = plain._mogrify(", ".join(["(" + ", ".join(["%s"] * len(use)) + ")"] * nrows),
                                      [r[c] for r in rows for c in use])
                assert sql_tuples(rows, use, bool(status), conn.escape) == want
    with pytest.raises(KeyError):
        sql_tuples([{"a": 1}, {"b": 2}], ["a"], False, conn.escape)
    with pytest.raises(TypeError):
        sql_tuples([{"a": object()}], ["a"], False, lambda v: 5)  # a fallback must give str
    # a fallback that empties the caller's lists: the rows and columns taken at the call are used
    rows2, cols2 = [{"a": frozenset(), "b": 1}, {"a": 2, "b": 3}], ["a", "b"]

    def clear(v: Any) -> str:
        rows2.clear()
        cols2.clear()
        return "X"

    assert sql_tuples(rows2, cols2, False, clear) == "(X, 1), (2, 3)"


def test_wide_character_sets_are_read_big_endian_as_mysql_stores_them() -> None:
    """MySQL's utf16, utf32 and ucs2 are big-endian without a BOM (utf16le little-endian): a VARCHAR of each
    reads as its text in both decoders. Python's 'utf16'/'utf32' codecs (what the charset names gave) read
    little-endian: a utf32 value failed the region, a utf16 one arrived as other characters, ucs2 as bytes."""
    text = "é😀a\x00" 
    cases = [("utf16", "utf-16-be", text), ("utf32", "utf-32-be", text), ("ucs2", "utf-16-be", "éπa\x00"),
             ("utf16le", "utf-16-le", text)]
    cols = [col(T.VARCHAR, max_length=80, character_set_name=cs) for cs, _, _ in cases]
    for i, cc in enumerate(cols):
        cc.name = f"w{i}"
    data = bytes((len(cols) + 7) // 8)
    for _, enc, t in cases:
        b = t.encode(enc)
        data += bytes([len(b)]) + b
    c, py = plans(cols)
    want = [{f"w{i}": t for i, (_, _, t) in enumerate(cases)}]
    for p in (c, py):
        assert [r for pair in p.rows(data, False) for r in pair if isinstance(r, dict)] == want
