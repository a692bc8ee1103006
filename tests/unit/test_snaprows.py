"""A snapshot chunk's rows in C (capturer/_native/snaprows.c: dict_rows, read_changes)
against their Python specification (make_rows' dict(zip()), RowChange(...))."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from functools import partial
from typing import Any

import pytest

from capturer.model import RowChange, TableSchema
from capturer.model.encode import _fastrows
from capturer.regions import snaphost
from capturer.regions.mysql import snapshot as mysnap

pytestmark = pytest.mark.skipif(_fastrows is None or not hasattr(_fastrows, "dict_rows"),
                                reason="the C extension is not built")

NAMES = ["id", "name", "price", "at", "blob", "n"]
RAW: list[tuple[Any, ...]] = [
    (1, "a", Decimal("1.50"), dt.datetime(2026, 1, 2, 3, 4, 5, 6), b"\x00\xff", None),
    (2, "ünï", None, None, b"", 2**70),
    (3, "", Decimal("-0"), dt.datetime(1970, 1, 1), None, -1, "the key again"),  # an extra key column
]


def test_dict_rows_is_dict_zip_in_column_order() -> None:
    got = _fastrows.dict_rows(tuple(NAMES), RAW)
    want = [dict(zip(NAMES, r)) for r in RAW]
    assert got == want and [list(d) for d in got] == [list(d) for d in want]
    assert all(a[k] is b[k] for a, b in zip(got, want) for k in NAMES)  # the values themselves, not copies
    assert mysnap.make_rows(RAW, NAMES, [None] * len(NAMES)) == want
    assert mysnap.make_rows(list(map(list, RAW)), NAMES, [None] * len(NAMES)) == want  # (lists too)
    assert mysnap.make_rows(tuple(RAW), NAMES, [None] * len(NAMES)) == want  # (not a list: Python)
    assert _fastrows.dict_rows(tuple(NAMES), []) == []


def test_dict_rows_refuses_a_short_row_or_a_bad_name() -> None:
    with pytest.raises(ValueError):
        _fastrows.dict_rows(tuple(NAMES), [(1, 2)])
    with pytest.raises(ValueError):
        _fastrows.dict_rows(tuple(NAMES), ["abcdef"])
    with pytest.raises(TypeError):
        _fastrows.dict_rows((1, "b"), [(1, 2)])


def test_read_changes_are_the_dataclass_s_own() -> None:
    schema = TableSchema("d", "t", tuple(NAMES), ("id",), (), ())
    rows = [dict(zip(NAMES, r)) for r in RAW]
    got = snaphost.read_changes(rows, schema)
    want = tuple(map(partial(RowChange, schema, "read", None), rows))
    assert type(got) is tuple and got == want
    assert all(type(c) is RowChange and c.schema is schema and c.after is r and c.before is None
               for c, r in zip(got, rows))
    assert got[0].absent == () and got[1].db == "d"
    assert snaphost.read_changes([], schema) == ()
    assert snaphost.read_changes(iter(rows), schema) == want  # type: ignore[arg-type]  # (not a list: Python)


def test_read_changes_of_atomic_rows_are_not_tracked_by_the_collector() -> None:
    """A change whose row holds only atomic values cannot be in a cycle: left untracked (a chunk's
    changes are not walked by every young collection); one whose row holds a container stays tracked,
    and a cycle through it is still collected."""
    import gc
    import weakref

    schema = TableSchema("d", "t", tuple(NAMES), ("id",), (), ())
    rows = [dict(zip(NAMES, r)) for r in RAW]
    assert not any(gc.is_tracked(r) for r in rows)
    got = snaphost.read_changes(rows, schema)
    assert not any(gc.is_tracked(c) for c in got)
    assert got == tuple(map(partial(RowChange, schema, "read", None), rows))

    class Holder(list):  # (weak-referenceable; a container: the row's dict is tracked)
        pass

    h = Holder()
    boxed = snaphost.read_changes([{"id": 1, "box": h}], schema)
    assert gc.is_tracked(boxed[0])
    h.append(boxed)  # a cycle: change -> row -> holder -> the changes' tuple -> change
    ref = weakref.ref(h)
    del h, boxed
    gc.collect()
    assert ref() is None
