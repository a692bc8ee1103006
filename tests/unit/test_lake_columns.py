"""The changelog lake (table_format=changelog) follows DROP COLUMN and RENAME COLUMN (CHANGE to another
name), names matched regardless of case, without Spark: the table's manifest and the state SQL its views
and verify read. Before, it followed only ADD COLUMN: a dropped column stayed in the lake's view with the
values of the rows from before (verify: "extra columns"), and a renamed column read NULL on those rows
(the end-to-end case: tests/integration/test_ddl_hostile.py, --runslow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capturer.errors import SinkError
from capturer.model import Ddl, Position, TableSchema, Txn
from senders.spark import lake
from senders.spark import sender as sp

DB, TABLE = 'h"o st', "T ``x``, (y)"
QT = "`h\"o st`.`T ````x````, (y)`"


def _sender(tmp_path: Path) -> sp.SparkSender:
    opts = {k.name: k.default for k in sp.SparkSender.KEYS}
    opts.update({"warehouse": str(tmp_path), "compaction_interval": 0, "conf.*": {}})
    return sp.SparkSender("spark", opts)


def _alter(s: sp.SparkSender, ts: int, clauses: str) -> None:
    s._ddl(Txn("r1", ts, Position("b.000001", ts), (), Ddl(DB, f"ALTER TABLE {QT} {clauses}", TABLE, DB)))


def _state(s: sp.SparkSender) -> lake.TableState:
    st = lake.TableState.load(tmp := s.warehouse / lake.table_name(DB, TABLE))
    assert st is not None, tmp
    return st


def test_drop_and_rename_column_reach_the_changelog_lake(tmp_path: Path) -> None:
    s = _sender(tmp_path)
    cols = [["Id", "bigint"], ["Mixed", "string"], ["old name", "bigint"], ["cs", "string"], ["a", "bigint"]]
    s._state_for(TableSchema(DB, TABLE, tuple(c for c, _ in cols), ("Id",)), cols)
    _alter(s, 100, "DROP COLUMN MIXED, CHANGE COLUMN `old name` `new.name` BIGINT -- x\n, RENAME COLUMN CS TO `Ünï`")
    _alter(s, 200, "RENAME COLUMN `new.name` TO nn, ADD COLUMN `Mixed` VARCHAR(5), /*!50100 DROP a */")
    st = _state(s)
    assert st.columns == [["Id", "bigint"], ["nn", "bigint"], ["Ünï", "string"], ["Mixed", "string"]]
    assert st.moved == {"nn": [[100, "old name", 0], [200, "new.name", 0]], "Ünï": [[100, "cs", 0]]}
    # the dropped column added again: the rows from before read NULL, never the dropped column's values
    assert st.added == {"Mixed": [200, "NULL"]} and set(st.gone) == {"old name", "new.name", "cs", "a"}
    sql = lake.changes_sql(st, "db", False, tmp_path)
    assert ("CASE WHEN _commit_ts < 100 THEN `old name` WHEN _commit_ts < 200 THEN `new.name` ELSE `nn` END AS `nn`"
            in sql), sql
    assert "CASE WHEN _commit_ts < 100 THEN `cs` ELSE `Ünï` END AS `Ünï`" in sql
    assert "CASE WHEN _commit_ts < 200 THEN CAST(NULL AS string) ELSE `Mixed` END AS `Mixed`" in sql
    assert "`a`" not in sql

    # replayed after a crash (the batch's ALTERs again, in order): the rows from before them staged again do
    # not bring the old names back, and the state comes out the same
    s2 = _sender(tmp_path)
    s2._state_for(TableSchema(DB, TABLE, tuple(c for c, _ in cols), ("Id",)), cols)
    _alter(s2, 100, "DROP COLUMN MIXED, CHANGE COLUMN `old name` `new.name` BIGINT, RENAME COLUMN CS TO `Ünï`")
    _alter(s2, 200, "RENAME COLUMN `new.name` TO nn, ADD COLUMN `Mixed` VARCHAR(5), /*!50100 DROP a */")
    again = _state(s2)
    assert (again.columns, again.moved, again.added, again.gone) == (st.columns, st.moved, st.added, st.gone)


def test_a_snapshot_made_after_a_rename_has_the_new_name(tmp_path: Path) -> None:
    """A compaction writes the state with the renames applied: its rows are not renamed again."""
    st = lake.TableState("d", "t", "d__t", ["id"], [["id", "bigint"], ["b", "bigint"]], generation=2,
                         snapshot_columns=[["id", "bigint"], ["b", "bigint"]],
                         moved={"b": [[100, "a", 1]]})
    sql = lake.changes_sql(st, "db", True, tmp_path)
    changelog, snapshot = sql.split(" UNION ALL ")
    assert "WHEN _commit_ts < 100 THEN `a`" in changelog and "`a`" not in snapshot
    # a snapshot made before the rename (its generation then): its rows have the old name
    st = lake.TableState("d", "t", "d__t", ["id"], [["id", "bigint"], ["b", "bigint"]], generation=1,
                         snapshot_columns=[["id", "bigint"], ["a", "bigint"]], moved={"b": [[100, "a", 1]]})
    assert "WHEN _commit_ts < 100 THEN `a`" in lake.changes_sql(st, "db", True, tmp_path).split(" UNION ALL ")[1]


def test_dropping_a_key_column_stops_the_lake_naming_it(tmp_path: Path) -> None:
    s = _sender(tmp_path)
    s._state_for(TableSchema(DB, TABLE, ("Id", "v"), ("Id",)), [["Id", "bigint"], ["v", "string"]])
    with pytest.raises(SinkError, match=r"primary-key column 'Id'") as e:
        _alter(s, 100, "DROP COLUMN id")
    assert not e.value.retriable


def test_an_added_column_only_the_source_computes_is_named_in_a_warning(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    s = _sender(tmp_path)
    s._state_for(TableSchema(DB, TABLE, ("Id",), ("Id",)), [["Id", "bigint"]])
    with caplog.at_level("WARNING"):
        _alter(s, 100, "ADD COLUMN `g (1)` INT AS (`Id` * 2) STORED, ADD d INT DEFAULT 4")
    assert "'g (1)'" in caplog.text and "ADD COLUMN `g (1)`" in caplog.text and "'d'" not in caplog.text


def test_a_rename_of_case_only_stops_the_changelog_lake_naming_it(tmp_path: Path) -> None:
    """CHANGE ex EX: the Parquet changelog's files would hold "ex" and "EX", which Spark reads as one column (the
    rows written after it read NULL there: a silent difference). It stops, naming the table and the DDL."""
    s = _sender(tmp_path)
    s._state_for(TableSchema(DB, TABLE, ("Id", "ex"), ("Id",)), [["Id", "bigint"], ["ex", "bigint"]])
    with pytest.raises(SinkError, match=r"CHANGE ex EX INT.*renames column 'ex' to 'EX'") as e:
        _alter(s, 100, "CHANGE ex EX INT")
    assert not e.value.retriable
    _alter(s, 101, "CHANGE ex ex BIGINT")  # (the same name: a type change, no rename)


def test_a_column_dropped_and_added_again_in_one_alter_is_there_with_its_default(tmp_path: Path) -> None:
    """DROP COLUMN c, ADD COLUMN c ... DEFAULT 4 in one ALTER: before, the ADD was applied first (the column there:
    left alone), then the DROP: the column was gone from the lake while the source has it, 4 on every row."""
    s = _sender(tmp_path)
    s._state_for(TableSchema(DB, TABLE, ("Id", "z)"), ("Id",)), [["Id", "bigint"], ["z)", "bigint"]])
    _alter(s, 100, "DROP COLUMN `z)`, ADD COLUMN `z)` INT DEFAULT 4 FIRST")
    st = _state(s)
    assert st.columns == [["Id", "bigint"], ["z)", "bigint"]] and st.added == {"z)": [100, "4"]}
    assert "CASE WHEN _commit_ts < 100 THEN CAST(4 AS bigint) ELSE `z)` END AS `z)`" in lake.changes_sql(
        st, "db", False, tmp_path)


def test_an_alter_handed_again_after_a_crash_is_applied_once(tmp_path: Path) -> None:
    """The state is saved at the ALTER, before its batch commits: a crash in between hands the same ALTER
    again. ``DROP COLUMN a, CHANGE b a`` applied a second time dropped the renamed column (the values of
    ``b``) for good; the state now keeps the last ALTER's key and the replay skips it."""
    s = _sender(tmp_path)
    cols = [["id", "bigint"], ["a", "string"], ["b", "string"]]
    s._state_for(TableSchema(DB, TABLE, tuple(c for c, _ in cols), ("id",)), cols)
    _alter(s, 100, "DROP COLUMN a, CHANGE b a VARCHAR(15)")
    once = _state(s)
    assert once.columns == [["id", "bigint"], ["a", "string"]] and once.moved == {"a": [[100, "b", 0]]}
    again = _sender(tmp_path)  # the restart: the batch (and its ALTER) handed again
    _alter(again, 100, "DROP COLUMN a, CHANGE b a VARCHAR(15)")
    st = _state(again)
    assert (st.columns, st.moved, st.added, st.gone) == (once.columns, once.moved, once.added, once.gone)
    _alter(again, 200, "ADD COLUMN c INT")  # a later ALTER is applied
    assert [c for c, _ in _state(again).columns] == ["id", "a", "c"]


def test_a_swap_of_two_columns_in_one_alter_reaches_the_changelog_lake(tmp_path: Path) -> None:
    """``CHANGE a b ..., CHANGE b a ...`` swaps the two at once (MySQL applies an ALTER's renames to the table as
    it was). Before, each rename found its new name taken and was skipped: the rows from before kept their
    values under the old names (a view read b's old values as the new b)."""
    s = _sender(tmp_path)
    cols = [["id", "bigint"], ["a", "string"], ["b", "string"]]
    s._state_for(TableSchema(DB, TABLE, tuple(c for c, _ in cols), ("id",)), cols)
    _alter(s, 100, "CHANGE a b VARCHAR(5), CHANGE b a VARCHAR(5)")
    st = _state(s)
    assert st.columns == [["id", "bigint"], ["b", "string"], ["a", "string"]]
    assert st.moved == {"b": [[100, "a", 0]], "a": [[100, "b", 0]]} and st.gone == {}
    sql = lake.changes_sql(st, "db", False, tmp_path)
    assert "CASE WHEN _commit_ts < 100 THEN `a` ELSE `b` END AS `b`" in sql, sql
    assert "CASE WHEN _commit_ts < 100 THEN `b` ELSE `a` END AS `a`" in sql, sql
    assert "__capturer_renaming_" not in sql
