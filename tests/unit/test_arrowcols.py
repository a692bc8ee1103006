"""The Spark sender's Arrow columns in C (capturer/_native/arrowcols.c: arrow_columns) against their Python
specification (senders/spark/sender.py lake_table(native=False): lists, lake.lake_value, pa.Table.from_pydict):
the same schema, the same values and nulls, the same Parquet bytes; a column with a value the C path does not
take exactly as pyarrow would falls back to the Python path (and fails there as it did)."""

from __future__ import annotations

import datetime as dt
import io
import math
import random
from decimal import Decimal
from typing import Any

import pytest

from capturer.model.encode import _fastrows
from senders.spark.sender import _kind, _Rows, lake_table

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

pytestmark = pytest.mark.skipif(_fastrows is None or not hasattr(_fastrows, "arrow_columns"),
                                reason="the C extension is not built")

I64 = (1 << 63) - 1
COLS = [["i", "bigint"], ["i32", "int"], ["s", "string"], ["b", "binary"], ["f", "double"], ["d", "date"],
        ["t", "timestamp_ntz"], ["m", "decimal(38,2)"], ["m0", "decimal(38,0)"], ["m10", "decimal(38,10)"]]
IMGS: list[dict[str, Any]] = [
    {"i": 1, "i32": 7, "s": "héllo wörld ✓ 𝄞", "b": b"\x00\xff\x00", "f": 1.5, "d": dt.date(2024, 2, 29),
     "t": dt.datetime(1969, 12, 31, 23, 59, 59, 999999), "m": Decimal("123.45"), "m0": Decimal("1E+3"),
     "m10": Decimal("-0.0000000001")},
    {"i": -I64 - 1, "i32": -(1 << 31), "s": "", "b": b"", "f": float("nan"), "d": dt.date(1, 1, 1),
     "t": dt.datetime(1, 1, 1), "m": Decimal("-0.10"), "m0": Decimal("-0"), "m10": Decimal("0E-20")},
    {"i": I64, "i32": (1 << 31) - 1, "s": None, "b": None, "f": float("-inf"), "d": dt.date(9999, 12, 31),
     "t": dt.datetime(9999, 12, 31, 23, 59, 59, 999999), "m": Decimal("999999999999999999999999999999999999.99"),
     "m0": Decimal("-99999999999999999999999999999999999999"), "m10": Decimal("1.000")},
    {},  # every column missing: nulls
    {"i": 0, "s": "a\x00b", "f": -0.0, "d": dt.date(1970, 1, 1), "t": dt.datetime(2026, 1, 2, 3, 4, 5, 6),
     "m": Decimal("1.5"), "m0": Decimal("12.0"), "m10": Decimal("-1.2E-5"), "extra": "not a column"},
    {"i": None, "i32": None, "s": "x" * 1000, "b": bytes(range(256)), "f": float("inf"), "d": None, "t": None,
     "m": Decimal("-1E+2"), "m0": None, "m10": Decimal("3.1415926535")},
    {"i": -1, "i32": 0, "s": "日本語", "b": b"\xe6\x97\xa5", "f": 5e-324, "d": dt.date(2000, 3, 1),
     "t": dt.datetime(2000, 2, 29, 12), "m": Decimal("0.01"), "m0": Decimal("123456789012345678901234567890"),
     "m10": Decimal("9999999999999999999999999999.9999999999")},
]


def rows_of(imgs: list[dict[str, Any]], seqs: list[int] | None = None) -> _Rows:
    rows = _Rows()
    for k, img in enumerate(imgs):
        rows.add("iud"[k % 3], (1 << 40) + k // 3, "r0" if k % 2 else "région-1", seqs[k] if seqs else k, k % 2,
                 None, img)  # type: ignore[arg-type]
    return rows


def parquet(table: Any) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, compression="snappy")
    return out.getvalue()


def same(v: Any, w: Any) -> bool:
    if isinstance(v, float) and isinstance(w, float):
        return repr(v) == repr(w)  # (NaN is NaN, -0.0 is not 0.0)
    return type(v) is type(w) and v == w


def assert_same_tables(rows: _Rows, cols: list[list[str]]) -> Any:
    c, py = lake_table(rows, cols, native=True), lake_table(rows, cols, native=False)
    assert c.schema.equals(py.schema, check_metadata=True)
    assert c.num_rows == py.num_rows == len(rows.ops)
    for name in py.column_names:
        got, want = c[name].to_pylist(), py[name].to_pylist()
        assert len(got) == len(want)
        for i, (v, w) in enumerate(zip(got, want)):
            assert same(v, w), (name, i, v, w)
        assert c[name].null_count == py[name].null_count, name
    assert parquet(c) == parquet(py)
    return c


def built(imgs: list[dict[str, Any]], cols: list[list[str]]) -> list[bool]:
    """Whether the C path built each column (rather than leaving it to the Python path)."""
    specs = [(c, *k) for c, t in cols if (k := _kind(t)) is not None]
    assert len(specs) == len(cols)
    return [b is not None for b in _fastrows.arrow_columns(imgs, specs)]


def test_every_lake_type_is_built_in_c_as_the_python_path_builds_it() -> None:
    assert built(IMGS, COLS) == [True] * len(COLS)
    meta = rows_of(IMGS)
    for vals, kind in ((meta.ops, 3), (meta.ts, 0), (meta.regions, 3), (meta.seqs, 1), (meta.subs, 1)):
        assert _fastrows.arrow_columns(vals, [(None, kind, 0)])[0] is not None
    t = assert_same_tables(rows_of(IMGS), COLS)
    assert t["i"].to_pylist()[:3] == [1, -I64 - 1, I64]
    assert t["m"].to_pylist()[2] == Decimal("999999999999999999999999999999999999.99")
    assert t["t"].to_pylist()[0] == dt.datetime(1969, 12, 31, 23, 59, 59, 999999)
    assert t["s"].to_pylist()[:4] == ["héllo wörld ✓ 𝄞", "", None, None]


def test_no_rows_and_all_nulls() -> None:
    assert_same_tables(rows_of([]), COLS)
    assert_same_tables(rows_of([{}] * 9), COLS)
    assert_same_tables(rows_of([{c: None for c, _ in COLS}] * 17), COLS)


def test_random_rows_of_every_type() -> None:
    rng = random.Random(50)
    gens = {
        "i": lambda: rng.choice([rng.randrange(-I64 - 1, I64 + 1), rng.randrange(-9, 9)]),
        "i32": lambda: rng.randrange(-(1 << 31), 1 << 31),
        "s": lambda: "".join(rng.choice("aé✓𝄞\x00z ") for _ in range(rng.randrange(0, 12))),
        "b": lambda: rng.randbytes(rng.randrange(0, 9)),
        "f": lambda: rng.choice([rng.uniform(-1e300, 1e300), float("nan"), math.inf, rng.random()]),
        "d": lambda: dt.date.fromordinal(rng.randrange(1, dt.date.max.toordinal() + 1)),
        "t": lambda: dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rng.randrange(0, 315537897600 * 10**6)),
        "m": lambda: Decimal(rng.randrange(-10**38 + 1, 10**38)).scaleb(-2),
        "m0": lambda: Decimal(rng.randrange(-10**20, 10**20)).scaleb(rng.randrange(0, 5)),
        "m10": lambda: Decimal(rng.randrange(-10**12, 10**12)).scaleb(-rng.randrange(0, 11)),
    }
    imgs = [{c: (None if rng.random() < 0.2 else g()) for c, g in gens.items() if rng.random() < 0.9}
            for _ in range(1001)]
    assert built(imgs, COLS) == [True] * len(COLS)
    assert_same_tables(rows_of(imgs), COLS)


class Str(str):
    pass


UTC = dt.timezone.utc
REFUSED_TOO: list[tuple[str, Any]] = [("bigint", True), ("int", True)]  # (pyarrow: "Expected integer, got bool")
# a column with one value the C path does not take: the whole column takes the Python path, same table
FALLBACK: list[tuple[str, Any]] = [
    ("bigint", True),  # a bool (an int subclass; lake_value keeps it)
    ("bigint", "101"),  # a BIT value (lake_value: its number)
    ("bigint", "1" * 64),  # BIT(64) with its top bit set: negative
    ("int", True),
    ("double", 3),  # an int in a double column
    ("string", b"caf\xc3\xa9"),  # bytes in a string column (lake_value decodes)
    ("string", Decimal("1.50")),
    ("string", dt.timedelta(hours=-1, seconds=1)),
    ("string", {"b", "a"}),
    ("string", 42),
    ("string", Str("a str subclass")),
    ("binary", "é as text"),  # str in a binary column (lake_value encodes)
    ("binary", bytearray(b"\x01")),
    ("date", dt.datetime(2026, 1, 2, 3, 4)),  # a datetime (a date subclass) in a date column
    ("timestamp_ntz", dt.datetime(2026, 1, 2, 3, 4, tzinfo=UTC)),  # tz-aware
    ("timestamp_ntz", dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=5)))),
    ("decimal(38,2)", 5),  # an int in a decimal column
    ("decimal(38,2)", Decimal("0E+5")),  # a zero with a positive exponent: pyarrow's own precision rules
    ("decimal(38,2)", Decimal("0E-1000000")),
]


@pytest.mark.parametrize(("stype", "odd"), FALLBACK, ids=[f"{t}-{type(v).__name__}-{i}" for i, (t, v) in
                                                           enumerate(FALLBACK)])
def test_a_column_with_an_unexpected_value_takes_the_python_path(stype: str, odd: Any) -> None:
    typical = {"bigint": 5, "int": 5, "double": 1.25, "string": "s", "binary": b"b", "date": dt.date(2026, 1, 1),
               "timestamp_ntz": dt.datetime(2026, 1, 1), "decimal(38,2)": Decimal("1.25")}[stype]
    cols = [["x", stype], ["ok", "bigint"]]
    imgs = [{"x": typical, "ok": 1}, {"x": None, "ok": 2}, {"x": odd, "ok": 3}, {"ok": 4}]
    assert built(imgs, cols) == [False, True]
    assert built(imgs[:2], cols) == [True, True]
    try:
        lake_table(rows_of(imgs), cols, native=False)
    except Exception as exc:  # pyarrow refuses it (a bool in an integer column): the C path fails the same way
        assert (stype, odd) in REFUSED_TOO, exc
        with pytest.raises(type(exc)):
            lake_table(rows_of(imgs), cols, native=True)
        return
    assert (stype, odd) not in REFUSED_TOO
    assert_same_tables(rows_of(imgs), cols)


# values the Python path refuses (pyarrow's error): the C path leaves them to it, so the batch fails the same way
REFUSED: list[tuple[str, Any]] = [
    ("bigint", 1 << 63),
    ("bigint", -(1 << 63) - 1),
    ("int", 1 << 31),
    ("string", "lone \udc80 surrogate"),
    ("decimal(38,2)", Decimal("1.234")),  # would lose a digit
    ("decimal(38,2)", Decimal("1E+36")),  # 39 digits at scale 2
    ("decimal(38,0)", Decimal("NaN")),
    ("decimal(38,0)", Decimal("-Infinity")),
]


@pytest.mark.parametrize(("stype", "bad"), REFUSED, ids=[f"{t}-{i}" for i, (t, _) in enumerate(REFUSED)])
def test_a_value_the_python_path_refuses_fails_the_same_way(stype: str, bad: Any) -> None:
    cols = [["x", stype]]
    imgs = [{"x": None}, {"x": bad}]
    assert built(imgs, cols) == [False]
    with pytest.raises(Exception) as py_err:
        lake_table(rows_of(imgs), cols, native=False)
    with pytest.raises(type(py_err.value)):
        lake_table(rows_of(imgs), cols, native=True)


def test_a_metadata_column_out_of_range_takes_the_python_path() -> None:
    rows = rows_of([{"x": 1}, {"x": 2}], seqs=[0, 1 << 31])
    assert _fastrows.arrow_columns(rows.seqs, [(None, 1, 0)]) == [None]
    with pytest.raises(Exception) as py_err:
        lake_table(rows, [["x", "bigint"]], native=False)
    with pytest.raises(type(py_err.value)):
        lake_table(rows, [["x", "bigint"]], native=True)


def test_random_decimals_are_built_exactly_when_pyarrow_takes_them_and_as_it_does() -> None:
    rng = random.Random(4)
    taken = refused = left = 0
    for _ in range(4000):
        scale = rng.choice([0, 1, 2, 3, 10, 37, 38])
        digits = "".join(rng.choice("0123456789") for _ in range(rng.choice([rng.randrange(1, 12), rng.randrange(1, 42)])))
        text = f"{rng.choice(['', '-'])}{digits}E{rng.randrange(-45, 45)}"
        v = Decimal(text)
        (col,) = _fastrows.arrow_columns([v], [(None, 7, scale)])
        try:
            want = pa.array([v], pa.decimal128(38, scale))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            assert col is None, (text, scale)
            refused += 1
            continue
        if col is None:  # (a value the C path leaves to pyarrow: zeros with a positive exponent, 39+ digits)
            left += 1
            continue
        got = pa.Array.from_buffers(pa.decimal128(38, scale), 1, [None, pa.py_buffer(col[2])])
        assert got.equals(want), (text, scale, got, want)
        taken += 1
    assert taken > 1000 and refused > 1000 and left < 100, (taken, refused, left)


def test_the_buffers_are_arrows() -> None:
    (col,) = _fastrows.arrow_columns([{"s": "ab"}, {}, {"s": "é"}], [("s", 3, 0)])
    assert col == (1, b"\x05", b"ab\xc3\xa9", b"\x00\x00\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00\x04\x00\x00\x00")
    (col,) = _fastrows.arrow_columns([1, 2], [(None, 1, 0)])
    assert col == (0, None, b"\x01\x00\x00\x00\x02\x00\x00\x00", None)
    with pytest.raises(ValueError):
        _fastrows.arrow_columns([1], [(None, 99, 0)])


@pytest.mark.parametrize("scale", [39, 40, 76])
def test_a_decimal_scale_past_38_takes_the_python_path(scale: int) -> None:
    """decimal(38, s) with s > 38 (no source type maps to one: spark_type caps the scale at 38): pyarrow refuses
    values the C path would take (0, -0.00001: more digits than 38 at that scale), so the C path leaves the
    column to it and the batch fails as its Python path does."""
    for v in (Decimal(0), Decimal("-0.00001"), Decimal("1E-39")):
        assert _fastrows.arrow_columns([v], [(None, 7, scale)]) == [None]
    cols = [["x", f"decimal(38,{scale})"]]
    imgs = [{"x": Decimal(0)}, {"x": None}]
    with pytest.raises(Exception) as py_err:
        lake_table(rows_of(imgs), cols, native=False)
    with pytest.raises(type(py_err.value)):
        lake_table(rows_of(imgs), cols, native=True)
