"""The C paths that leave per-row objects untracked by the cyclic collector (a region's
RowChanges, the fast decoder's pairs, the MySQL sender's Ops): the same objects as the
Python paths, untracked only where they hold nothing the collector must see."""

from __future__ import annotations

import datetime as dt
import decimal
import gc

import pytest
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from capturer.model import ColumnInfo, RowChange, TableSchema
from capturer.model import changes as base
from capturer.model.encode import _fastrows
from capturer.regions.mysql import binlog

pytestmark = pytest.mark.skipif(getattr(_fastrows, "row_changes", None) is None, reason="the C build is not built")

SCHEMA = TableSchema("d", "t", ("id", "v", "j"), ("id",), (3, 15, 245), (ColumnInfo(3),) * 3)


def _event(cls: type) -> object:
    return cls.__new__(cls)  # (only its class is looked at)


def _rows() -> list[tuple[object, object]]:
    plain = {"id": 1, "v": "a", "j": decimal.Decimal("1.5")}
    when = {"id": 2, "v": dt.datetime(2026, 1, 1), "j": b"\x00\xff"}
    nested = {"id": 3, "v": None, "j": {"k": [1, 2]}}  # (a JSON value: a container the collector tracks)
    return [(plain, when), (when, plain), (nested, plain), (plain, nested)]


@pytest.mark.parametrize("cls", [UpdateRowsEvent, WriteRowsEvent, DeleteRowsEvent])
def test_row_changes_match_python(cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows()
    c = binlog.fast_changes(_event(cls), SCHEMA, rows)
    with monkeypatch.context() as m:
        m.setattr(base, "_ROW_CHANGES", None)
        py = binlog.fast_changes(_event(cls), SCHEMA, rows)
    assert c == py
    assert [type(x) for x in c] == [RowChange] * len(rows)
    for ch in c:
        atomic = all(img is None or not gc.is_tracked(img) for img in (ch.before, ch.after))
        assert gc.is_tracked(ch) is not atomic, ch
    assert all(gc.is_tracked(ch) for ch in py) and not all(gc.is_tracked(ch) for ch in c)
    if cls is WriteRowsEvent:
        assert [ch.before for ch in c] == [None] * 4 and c[0].after is rows[0][0]
    if cls is DeleteRowsEvent:
        assert [ch.after for ch in c] == [None] * 4 and c[1].before is rows[1][0]


@pytest.mark.parametrize("kind", [1, 2])
def test_make_changes_of_bare_images(kind: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """BaikalDB's inserts and deletes: images without pairs; the same changes as the Python path."""
    images = [img for img, _ in _rows()]
    c = base.make_changes(SCHEMA, kind, images)
    with monkeypatch.context() as m:
        m.setattr(base, "_ROW_CHANGES", None)
        py = base.make_changes(SCHEMA, kind, images)
    assert c == py and len(c) == 4
    assert [gc.is_tracked(ch) for ch in c] == [False, False, True, False]
    assert all(gc.is_tracked(ch) for ch in py)  # (the Python path's are: the check above can fail)


def test_make_change_one() -> None:
    """PostgreSQL's per-message path: one change, equal to RowChange(...), untracked where atomic."""
    plain, when, nested, _ = (img for img, _ in _rows())
    for args in [("insert", None, plain), ("delete", when, None), ("update", plain, when), ("update", plain, nested)]:
        ch = base.make_change(SCHEMA, *args)
        assert ch == RowChange(SCHEMA, *args) and type(ch) is RowChange
        assert gc.is_tracked(ch) is (args[2] is nested)
        assert ch.schema is SCHEMA and ch.before is args[1] and ch.after is args[2]


def test_row_changes_bad_input() -> None:
    with pytest.raises(ValueError, match="pair"):
        _fastrows.row_changes(RowChange, SCHEMA, "insert", [({},)], 1)
    with pytest.raises(ValueError, match="pair"):
        _fastrows.row_changes(RowChange, SCHEMA, "update", [{"id": 1}], 0)  # (an update needs both images)
    with pytest.raises(TypeError):
        _fastrows.row_change(RowChange, SCHEMA, "insert", None)
    with pytest.raises(ValueError, match="kind"):
        _fastrows.row_changes(RowChange, SCHEMA, "insert", [], 3)


def test_untracked_change_is_freed() -> None:
    """An untracked RowChange is freed by reference counting: its images are released with it."""
    import sys

    img = {"id": 1}
    before = sys.getrefcount(img)
    changes = _fastrows.row_changes(RowChange, SCHEMA, "insert", [(img, None)] * 50, 1)
    assert not any(gc.is_tracked(ch) for ch in changes)
    assert sys.getrefcount(img) == before + 50
    del changes
    assert sys.getrefcount(img) == before


def test_mysql_ops_untracked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MySQL sender's C placing leaves its Ops, their identities and units untracked (the
    placing itself is compared with the Python path in test_fuzz_mysql_placing); they are freed
    by reference counting once applied."""
    import random
    import sys
    from concurrent.futures import Future

    import senders.mysql.sender as ms
    from tests.unit.test_fuzz_mysql_placing import batch, run

    seen: list[tuple[bool, bool, bool]] = []
    real_submit = __import__("tests.unit.test_fuzz_mysql_placing", fromlist=["Recorder"]).Recorder.submit

    def submit(self: object, units: list[list[ms.Op]], atomic: bool, mark: object = None) -> Future[int]:
        seen.extend((gc.is_tracked(u), gc.is_tracked(op), gc.is_tracked(op.ident)) for u in units for op in u)
        return real_submit(self, units, atomic, mark)  # type: ignore[no-any-return]

    monkeypatch.setattr("tests.unit.test_fuzz_mysql_placing.Recorder.submit", submit)
    txns = [t for t in batch(random.Random(3), 40) if t.ddl is None and type(t.changes) is tuple]
    ch = txns[0].changes[0]
    refs = sys.getrefcount(ch)
    run(txns, (0, 0), 3, 50, True, "", c=True, monkeypatch=monkeypatch)
    assert len(seen) == sum(len(t.changes) for t in txns)
    assert seen == [(False, False, False)] * len(seen)
    assert sys.getrefcount(ch) == refs  # every Op that held it is gone
    seen.clear()
    run(txns, (0, 0), 3, 50, True, "", c=False, monkeypatch=monkeypatch)
    assert all(op for _, op, _ in seen)  # (the Python path's Ops are tracked: the check above can fail)
