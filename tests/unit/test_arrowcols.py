"""The Spark sender's batch in C (capturer/_native/arrowcols.c) against its Python specification
(senders/spark/sender.py): arrow_columns against lake_table(native=False) (lists, lake.lake_value,
pa.Table.from_pydict): the same schema, the same values and nulls, the same Parquet bytes; a column with a value
the C path does not take exactly as pyarrow would falls back to the Python path (and fails there as it did);
lake_rows against group_rows (a transaction's changes as the rows of their tables)."""

from __future__ import annotations

import datetime as dt
import io
import math
import random
from decimal import Decimal
from typing import Any

import pytest

from capturer.model import RowChange, TableSchema
from capturer.model.encode import _fastrows
from senders.spark.sender import _kind, _Rows, group_rows, lake_table

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
# --- a transaction's changes into the batch's rows per table (lake_rows against group_rows) --------------

T1 = TableSchema("d", "t1", ("id", "v"), ("id",))
T1_NEW = TableSchema("d", "t1", ("id", "v", "w"), ("id",))  # a newer version of the same table
T2 = TableSchema("d", "t2", ("a", "b"), ("a", "b"))
KEYLESS = TableSchema("e", "log", ("x",), ())


class Odd:
    """A value whose != raises (as a broken comparison would)."""

    def __ne__(self, other: object) -> bool:
        raise ValueError("no comparing me")

    __hash__ = object.__hash__


def by_table_of(fn: Any, changes: list[RowChange], by_table: dict[Any, _Rows] | None = None) -> dict[Any, _Rows]:
    out = {} if by_table is None else by_table
    fn(tuple(changes), 1 << 41, "région", out, _Rows, ("i", "u", "d"))
    return out


def assert_same_rows(a: dict[Any, _Rows], b: dict[Any, _Rows]) -> None:
    assert list(a) == list(b)
    for key in a:
        ra, rb = a[key], b[key]
        for attr in ("ops", "ts", "regions", "seqs", "subs"):
            assert getattr(ra, attr) == getattr(rb, attr), (key, attr)
        assert all(x is y for x, y in zip(ra.schemas, rb.schemas)) and len(ra.schemas) == len(rb.schemas)
        assert ra.imgs == rb.imgs
        # the images themselves where the change has one (a new {} only for a missing or empty one)
        assert [type(x) for x in ra.imgs] == [type(y) for y in rb.imgs]


def changes_mix() -> list[RowChange]:
    return [
        RowChange(T1, "insert", None, {"id": 1, "v": "a"}),
        RowChange(T2, "read", None, {"a": 1, "b": 2}),
        RowChange(T1, "update", {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),  # key kept: 'u'
        RowChange(T1, "update", {"id": 1, "v": "b"}, {"id": 2, "v": "b"}),  # key changed: 'd' + 'i'
        RowChange(T1_NEW, "update", {"id": 2}, {"id": 2, "v": "c", "w": 1}),  # an old key only (PostgreSQL)
        RowChange(T2, "update", {"a": 1, "b": 2}, {"a": 1, "b": 3}),  # the second key column changed
        RowChange(T2, "update", {"a": 1, "b": 3}, {"a": 1.0, "b": 3}),  # equal values of another type: kept
        RowChange(KEYLESS, "update", {"x": 1}, {"x": 2}),  # no key: 'd' + 'i'
        RowChange(T1, "delete", {"id": 2, "v": "c"}, None),
        RowChange(T1, "insert", None, None),  # no image: {}
        RowChange(T1, "delete", None, None),
        RowChange(T1, "update", None, {"id": 3}),  # no old image: {} (its key reads None: changed)
        RowChange(T1, "update", {"id": 3}, None),
        RowChange(T1, "insert", None, {}),
        RowChange(T2, "truncate-ish", {"a": 5, "b": 5}, {"a": 5, "b": 5}),  # an unknown op: an update
        RowChange(KEYLESS, "delete", {"x": None}, None),
    ] + [RowChange(T1, "insert", None, {"id": 100 + i, "v": "x" * i}) for i in range(300)]  # seq > 256


def test_lake_rows_groups_a_transaction_as_group_rows_does() -> None:
    assert_same_rows(by_table_of(_fastrows.lake_rows, changes_mix()), by_table_of(group_rows, changes_mix()))
    got = by_table_of(_fastrows.lake_rows, changes_mix())
    assert got[("d", "t1")].ops[:5] == ["i", "u", "d", "i", "u"] and got[("d", "t1")].subs[:5] == [0, 0, 0, 1, 0]
    assert got[("e", "log")].ops == ["d", "i", "d"] and got[("d", "t2")].ops == ["i", "d", "i", "u", "u"]
    assert got[("d", "t1")].seqs[-1] == len(changes_mix()) - 1
    imgs = [c.after for c in changes_mix()]
    assert got[("d", "t1")].imgs[-1] == imgs[-1]


def test_lake_rows_appends_to_the_rows_a_batch_already_has() -> None:
    first, second = changes_mix()[:5], changes_mix()[5:9]
    a = by_table_of(_fastrows.lake_rows, second, by_table_of(_fastrows.lake_rows, first))
    b = by_table_of(group_rows, second, by_table_of(group_rows, first))
    assert_same_rows(a, b)
    assert a[("d", "t1")].seqs == [0, 2, 3, 3, 4, 3]  # (each transaction's own indexes)
    assert by_table_of(_fastrows.lake_rows, []) == {}


def test_lake_rows_keeps_the_images_themselves() -> None:
    ch = RowChange(T1, "insert", None, {"id": 1})
    (rows,) = by_table_of(_fastrows.lake_rows, [ch]).values()
    assert rows.imgs[0] is ch.after and rows.schemas[0] is T1 and rows.regions[0] == "région"


def test_a_comparison_that_raises_fails_both_ways() -> None:
    bad = [RowChange(T1, "update", {"id": Odd()}, {"id": 1})]
    with pytest.raises(ValueError, match="no comparing me"):
        by_table_of(group_rows, bad)
    with pytest.raises(ValueError, match="no comparing me"):
        by_table_of(_fastrows.lake_rows, bad)


def test_a_key_that_is_not_equal_to_itself_is_a_changed_key_both_ways() -> None:
    """group_rows asks before.get(c) != after.get(c): one NaN object in both images (a float or a Decimal
    key, the same object: as a filter or a merge of images may leave it) is a changed key, a 'd' and an
    'i'; lake_rows asked PyObject_RichCompareBool, which takes an object for equal to itself, and wrote a
    'u' (fails before the fix)."""
    for nan in (float("nan"), Decimal("NaN")):
        bad = [RowChange(T1, "update", {"id": nan, "v": 1}, {"id": nan, "v": 2}),
               RowChange(T2, "update", {"a": 1, "b": nan}, {"a": 1, "b": nan}),
               RowChange(T1, "update", {"id": nan, "v": 1}, {"id": float("nan"), "v": 2})]
        a, b = by_table_of(_fastrows.lake_rows, bad), by_table_of(group_rows, bad)
        assert_same_rows(a, b)
        assert a[("d", "t1")].ops == ["d", "i", "d", "i"] and a[("d", "t2")].ops == ["d", "i"]


def test_the_sender_groups_a_big_transaction_in_flushes(tmp_path: Any, monkeypatch: Any) -> None:
    """A transaction bigger than flush_rows still goes row by row (bounded memory); smaller ones whole."""
    from capturer.model import Position, Txn
    from senders.spark import sender as sp

    flushed: list[list[str]] = []
    opts = {k.name: k.default for k in sp.SparkSender.KEYS}
    opts.update({"warehouse": str(tmp_path), "compaction_interval": 0, "conf.*": {}})
    s = sp.SparkSender("spark", opts)
    monkeypatch.setattr(s, "flush_rows", 10)
    monkeypatch.setattr(s, "_flush", lambda by_table: flushed.append(
        [op for r in by_table.values() for op in r.ops]))
    monkeypatch.setattr(s, "_commit", lambda key: None)
    monkeypatch.setattr(s, "_register_dirty", lambda wait: None)
    s._opened = True
    ins = [RowChange(T1, "insert", None, {"id": i}) for i in range(25)]
    s.send([Txn("r0", 10, Position("b.1", 4), tuple(ins[:6])), Txn("r0", 11, Position("b.1", 5), tuple(ins)),
            Txn("r0", 12, Position("b.1", 6), tuple(ins[:3]))])
    # (the row that overflows a flush counts as none of the next: flushes of flush_rows + 1 after the first)
    assert [len(f) for f in flushed] == [10, 11, 11, 2]


def test_a_spilled_transaction_goes_row_by_row(tmp_path: Any, monkeypatch: Any) -> None:
    """Changes read from a spill file (not a tuple) are not gathered into one list for the C call."""
    from capturer.model import Position, Txn
    from senders.spark import sender as sp

    class Spilled:  # (as capturer.model.spill.SpilledChanges: a length and an iterator)
        def __init__(self, items: list[RowChange]) -> None:
            self.items = items

        def __len__(self) -> int:
            return len(self.items)

        def __iter__(self) -> Any:
            return iter(self.items)

    calls: list[int] = []
    monkeypatch.setattr(sp, "_group_rows", lambda changes, *a: calls.append(len(changes)))
    got: list[list[int]] = []
    opts = {k.name: k.default for k in sp.SparkSender.KEYS}
    opts.update({"warehouse": str(tmp_path), "compaction_interval": 0, "conf.*": {}})
    s = sp.SparkSender("spark", opts)
    monkeypatch.setattr(s, "_flush", lambda by_table: got.append([x for r in by_table.values() for x in r.seqs]))
    monkeypatch.setattr(s, "_commit", lambda key: None)
    monkeypatch.setattr(s, "_register_dirty", lambda wait: None)
    s._opened = True
    ins = [RowChange(T1, "insert", None, {"id": i}) for i in range(5)]
    s.send([Txn("r0", 10, Position("b.1", 4), Spilled(ins)), Txn("r0", 11, Position("b.1", 5), tuple(ins))])  # type: ignore[arg-type]
    assert calls == [5] and got == [[0, 1, 2, 3, 4]]


def test_decimals_at_the_edges_of_exponent_digits_and_scale_are_built_as_pyarrow_builds_them() -> None:
    """Zeros and ones with exponents up to the six digits the C path reads (and past them), 37 to 39 digits,
    at every scale pyarrow's own rules could treat apart: built exactly as pa.array builds them, or left to it
    (never taken where it refuses). Catches a pyarrow whose precision rules move under the C path."""
    exps = [*range(-45, 46), -999, -99999, -999999, -1000000, 999999, 1000000]
    coefs = ["0", "-0", "1", "-1", "10", "9" * 37, "9" * 38, "1" + "0" * 37, "1" * 39, "-" + "9" * 38]
    cases = [Decimal(f"{c}E{e}") for c in coefs for e in exps]
    cases += [Decimal(s) for s in ("0.000", "-0.000", "0." + "0" * 50, "0." + "0" * 40 + "1", "1." + "0" * 37)]
    taken = 0
    for scale in (0, 1, 2, 18, 30, 37, 38):
        cols = _fastrows.arrow_columns(cases, [(None, 7, scale)])  # (one column: any value left -> None)
        assert cols == [None]
        for v in cases:
            (col,) = _fastrows.arrow_columns([v], [(None, 7, scale)])
            try:
                want = pa.array([v], pa.decimal128(38, scale))
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                assert col is None, (str(v), scale)
                continue
            if col is not None:
                got = pa.Array.from_buffers(pa.decimal128(38, scale), 1, [None, pa.py_buffer(col[2])])
                assert got.equals(want), (str(v), scale, got, want)
                taken += 1
    assert taken > 500
