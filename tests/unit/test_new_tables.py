"""Tables a filter reload adds (capturer/regions/group.py): a region's changes to them are
held back until the region's copy of them starts in its stream, and only until then."""

from __future__ import annotations

from typing import Any

from capturer.model import Ddl, Position, RowChange, TableProgress, TableSchema, Txn
from capturer.regions.group import RegionGroup
from tests.unit.test_snapshot_unit import commit, drain, make_region, plan_of

NEW = TableSchema("d", "t", ("id", "v"), ("id",), (), (3, 3))
OLD = TableSchema("d", "kept", ("id", "v"), ("id",), (), (3, 3))


def ins(schema: TableSchema, i: int) -> RowChange:
    return RowChange(schema, "insert", None, {"id": i, "v": 0})


def tables(txn: Txn) -> list[str]:
    return [ch.table for ch in txn.changes]


def setup() -> tuple[Any, Any, RegionGroup]:
    r, q = make_region()
    g = RegionGroup()
    g.regions = [r]
    return r, q, g


def test_changes_before_the_copy_starts_are_held_back_and_after_it_pass() -> None:
    r, q, g = setup()
    g.hold({"r1": [("d", "t")]})
    assert g.held() == {"r1": ["d.t"]}
    commit(r, 110, ins(NEW, 1), ins(OLD, 1))  # emitted before the copy's start...
    r.add_snapshot_progress((TableProgress("d", "t", "run1", "pending"),), wait=True)
    commit(r, 120, ins(NEW, 2))
    assert r.emit_begin(plan_of(NEW), "run1", Position("f.000001", 100), "CREATE TABLE `d`.`t` (id int)",
                        truncate=False) != "stopped"
    commit(r, 130, ins(NEW, 3), ins(OLD, 2))
    items = [it for it in drain(q) if isinstance(it, Txn)]
    # ... and merged after it: still held back (the copy's chunks, all read after the start, hold them)
    out = [g.strip_held(it) for it in items]
    ddl = [t.ddl.sql for t in out if t.ddl is not None]
    assert ddl and all(s.startswith("CREATE") for s in ddl)  # DDL is never held back
    assert [tables(t) for t in out if t.ddl is None] == [["kept"], [], ["t", "kept"]]
    assert g.held() == {}  # let go at the first transaction after the start


def test_a_later_hold_is_not_let_go_by_an_earlier_copy_start() -> None:
    r, q, g = setup()
    r.add_snapshot_progress((TableProgress("d", "t", "run1", "pending"),), wait=True)
    r.emit_begin(plan_of(NEW), "run1", Position("f.000001", 100), "", truncate=False)
    drain(q)
    g.hold({"r1": [("d", "t")]})  # the table is added (again) by a reload: its earlier start does not count
    commit(r, 140, ins(NEW, 1))
    assert [tables(g.strip_held(it)) for it in drain(q) if isinstance(it, Txn)] == [[]]
    assert g.held() == {"r1": ["d.t"]}


def test_a_table_gone_before_its_copy_started_is_let_go() -> None:
    r, q, g = setup()
    g.hold({"r1": [("d", "t")]})
    r.add_snapshot_progress((TableProgress("d", "t", "run1", "pending"),), wait=True)
    r.update_snapshot_progress(TableProgress("d", "t", "run1", "dropped"))
    commit(r, 150, ins(NEW, 1))  # created again at the source: its rows come through the log
    assert [tables(g.strip_held(it)) for it in drain(q) if isinstance(it, Txn)] == [["t"]]
    assert g.held() == {}


def test_unhold_and_other_regions() -> None:
    r, q, g = setup()
    g.hold({"r1": [("d", "t"), ("d", "u")], "nosuch": [("d", "t")]})
    assert g.held() == {"r1": ["d.t", "d.u"]}  # a region that copies no table here holds nothing
    g.unhold(lambda region, t: t != ("d", "u"))
    assert g.held() == {"r1": ["d.t"]}
    other = Txn("r2", 5, Position("f.000001", 1), (ins(NEW, 1),))
    assert g.strip_held(other) is other


def test_ddl_of_a_held_table_before_its_copy_starts() -> None:
    """An ALTER before the copy starts is left out (the copy's CREATE, described after it,
    has its effect; a sink without the table could not apply it); a DROP passes; DDL of
    other tables passes."""
    r, q, g = setup()
    g.hold({"r1": [("d", "t")]})
    pos = Position("f.000001", 120)
    alter = Txn("r1", 10, pos, (), Ddl("d", "ALTER TABLE t ADD c INT", "t", "d"))
    drop = Txn("r1", 11, pos, (), Ddl("d", "DROP TABLE t", "t", "d"))
    other = Txn("r1", 12, pos, (), Ddl("d", "ALTER TABLE kept ADD c INT", "kept", "d"))
    assert g.strip_held(alter).ddl is None
    assert g.strip_held(drop) is drop and g.strip_held(other) is other
    assert g.held() == {"r1": ["d.t"]}
