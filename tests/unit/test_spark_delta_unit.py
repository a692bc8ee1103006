"""table_format=delta without Spark: the DDL parser, the position read back from a Delta log,
the choice of sender and reader by table_format, and the PySpark/Delta version check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from senders.spark import deltajars
from senders.spark.deltasink import DeltaSender, read_position
from senders.spark.lake import parse_add_columns, parse_alter
from senders.spark.sender import SparkSender
from senders.spark.verify import DeltaReader, LakeReader


def test_parse_alter() -> None:
    assert parse_alter("ALTER TABLE t DROP COLUMN a, DROP INDEX i, DROP `b c`") == [("drop", "a", ""),
                                                                                   ("drop", "b c", "")]
    assert parse_alter("alter table d.t rename column x to y") == [("rename", "x", "y")]
    assert parse_alter("ALTER TABLE t CHANGE old new VARCHAR(10), CHANGE same same INT") == [("rename", "old", "new")]
    assert parse_alter("ALTER TABLE t RENAME TO u") == [("rename_table", "", "u")]
    assert parse_alter("ALTER TABLE t ADD COLUMN c INT, MODIFY d BIGINT") == []
    assert parse_alter("ALTER TABLE t /* x */ DROP PRIMARY KEY") == []


# a table name with spaces, dots, a semicolon, a slash or a backquote (all legal when backquoted): the clauses
# after it were not read at all (the name was taken as everything up to the first space), so a DROP / RENAME
# COLUMN was not applied to the lake table and the rows from before an ADD COLUMN ... DEFAULT kept NULL
HOSTILE = "ALTER TABLE `we\"ird-db \u00fc`.`t a;b/c``d` "


def test_parse_alter_after_a_hostile_table_name() -> None:
    assert parse_alter(HOSTILE + "DROP COLUMN `c d`, RENAME COLUMN `e``f` TO `g h`, RENAME TO `x y`.`z w`") == [
        ("drop", "c d", ""), ("rename", "e`f", "g h"), ("rename_table", "", "`x y`.`z w`")]
    assert parse_alter("ALTER TABLE `a b` RENAME `n m`") == [("rename_table", "", "`n m`")]
    assert parse_alter("ALTER IGNORE TABLE IF EXISTS db.`t` DROP c") == [("drop", "c", "")]
    assert parse_alter("CREATE TABLE `a b` (id INT)") == []


def test_parse_add_columns_after_a_hostile_table_name() -> None:
    assert parse_add_columns(HOSTILE + "ADD COLUMN `new col;2` INT DEFAULT 7, ADD `y, z` TEXT") == [
        ("new col;2", "bigint", "7"), ("y, z", "string", None)]
    assert parse_add_columns("ALTER TABLE`x`ADD c INT DEFAULT 3") == [("c", "bigint", "3")]
    assert parse_add_columns("ALTER TABLE ty.t ADD COLUMN added VARCHAR(10) DEFAULT 'dflt'") == [
        ("added", "string", "'dflt'")]


def _commit(logdir: Path, n: int, *actions: dict[str, object]) -> None:
    logdir.mkdir(parents=True, exist_ok=True)
    (logdir / f"{n:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def test_read_position_takes_the_newest_commit_of_the_app(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    assert read_position(tmp_path, "a") == (0, None, True)
    _commit(log, 0, {"commitInfo": {"operation": "CREATE TABLE"}})
    _commit(log, 1, {"commitInfo": {"userMetadata": json.dumps({"capturer_key": [5, "r1", 0]})}},
            {"txn": {"appId": "a", "version": 5}})
    _commit(log, 2, {"commitInfo": {"userMetadata": json.dumps({"capturer_key": [9, "r2", 0]})}},
            {"txn": {"appId": "a", "version": 9}})
    _commit(log, 3, {"commitInfo": {"operation": "OPTIMIZE"}})  # someone else's commit
    _commit(log, 4, {"txn": {"appId": "b", "version": 100}})
    assert read_position(tmp_path, "a") == (9, (9, "r2", 0), True)
    assert read_position(tmp_path, "b") == (100, None, False)  # no key: not exact
    assert read_position(tmp_path, "c") == (0, None, True)


def _opts(tmp_path: Path, fmt: str) -> dict[str, object]:
    return {"table_format": fmt, "warehouse": str(tmp_path), "database": "cdc", "batch_rows": 10,
            "batch_interval": 0, "compaction_interval": 0, "writer": "arrow", "master": "local[1]"}


def test_table_format_chooses_the_sender_and_the_reader(tmp_path: Path) -> None:
    assert type(SparkSender("s", _opts(tmp_path, "changelog"))) is SparkSender
    d = SparkSender("s", _opts(tmp_path, "delta"))
    assert isinstance(d, DeltaSender) and d.app_id("db__t") == "binlog-capturer/s/db__t"
    assert d.resume_key() is None
    assert type(LakeReader("s", _opts(tmp_path, "changelog"), [])) is LakeReader
    assert type(LakeReader("s", _opts(tmp_path, "delta"), [])) is DeltaReader


def test_a_pyspark_the_delta_release_does_not_run_on_is_named() -> None:
    assert deltajars.incompatible(deltajars.SPARK_MINOR + ".1") == ""
    why = deltajars.incompatible("4.3.0")
    assert "PySpark 4.3.0" in why and f"Spark {deltajars.SPARK_MINOR}" in why and "[delta]" in why


def test_open_refuses_an_incompatible_pyspark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from capturer.errors import SinkError

    monkeypatch.setattr(deltajars, "incompatible", lambda: "table_format=delta: no")
    s = SparkSender("s", _opts(tmp_path, "delta"))
    with pytest.raises(SinkError, match="table_format=delta: no") as e:
        s.open()
    assert not e.value.retriable


def test_dropped_tables() -> None:
    from capturer.model.ddl import dropped_tables

    assert dropped_tables("DROP TABLE o.d1, o.d2", "cur") == [("o", "d1"), ("o", "d2")]
    assert dropped_tables("drop table if exists `a b`, x.`c,d` /* c */ RESTRICT", "cur") == [("cur", "a b"),
                                                                                             ("x", "c,d")]
    assert dropped_tables("DROP TABLE t WAIT 5", "cur") == [("cur", "t")]
    assert dropped_tables("DROP DATABASE `we ird`", "cur") == [("we ird", "")]
    assert dropped_tables("DROP SCHEMA IF EXISTS s", "cur") == [("s", "")]
    # a session's temporary table is not the lake's table of the same name; other statements drop nothing
    for sql in ("DROP TEMPORARY TABLE t", "DROP INDEX i ON t", "DROP VIEW v", "CREATE TABLE x (a INT)"):
        assert dropped_tables(sql, "cur") == [], sql


def test_hostile_string_defaults_reach_the_lake_and_the_file_as_their_values() -> None:
    """A DEFAULT whose text holds ``\\'`` (the escape the PostgreSQL region and MySQL write), ``''``, ``\\"``,
    a comma or a backquote. Before: the clause splitter took ``\\'`` as the end of the string, so a comma after
    it cut the clause (the next ADD COLUMN lost, its default never set: older rows NULL), Spark read ``''`` as
    two literals run together ('it''s' -> "its"), and the file's replay kept ``\\"`` as two characters."""
    from senders.local.replay import _literal
    from senders.spark.lake import _split_top

    sql = ("ALTER TABLE `s`.`t a` ADD COLUMN `a` LONGTEXT NULL DEFAULT 'it\\'s, \\\\ \\\"d\\\" `b`;', "
           "ADD COLUMN `n` INT NULL DEFAULT 7, ADD c VARCHAR(9) DEFAULT 'x''y,z'")
    assert len(_split_top(sql)) == 3
    got = parse_add_columns(sql)
    assert got == [("a", "string", "'it\\'s, \\\\ \"d\" `b`;'"), ("n", "bigint", "7"), ("c", "string", "'x\\'y,z'")]
    assert [_literal(d) for _, _, d in got] == ["it's, \\ \"d\" `b`;", 7, "x'y,z"]
    assert _literal("'\\0\\n\\t\\Z\\%\\_'") == "\0\n\t\x1a\\%\\_"


def test_the_file_replay_follows_a_renamed_table() -> None:
    """RENAME TABLE / ALTER TABLE ... RENAME TO with names that need backquotes: the rows move to the new
    name (before, the rebuild kept them under the old one, and verify found the renamed table's rows missing)."""
    from senders.local.replay import rebuild

    def row(table: str, i: int) -> dict[str, object]:
        return {"db": 'S "q".d', "table": table, "op": "insert", "pk": ["id"], "before": None, "after": {"id": i}}

    def ddl(table: str, sql: str) -> dict[str, object]:
        return {"db": 'S "q".d', "table": table, "op": "ddl", "sql": sql}

    state = rebuild(iter([
        row("Order Items", 1), row("b", 2),
        ddl('Order "Lines".v2', 'RENAME TABLE `S "q".d`.`Order Items` TO `S "q".d`.`Order "Lines".v2`'),
        row('Order "Lines".v2', 3),
        ddl("c`d", "ALTER TABLE `S \"q\".d`.`b` RENAME TO `c``d`")]))
    assert sorted(state) == [('S "q".d', 'Order "Lines".v2'), ('S "q".d', "c`d")]
    assert len(state[('S "q".d', 'Order "Lines".v2')]) == 2 and len(state[('S "q".d', "c`d")]) == 1


def test_a_binary_default_reaches_the_lake_and_the_file() -> None:
    """A bytea column added with a default (the PostgreSQL region writes it X'...'). Before: the lake did not
    read the literal (the older rows NULL in the lake), and the file's replay failed on it (ValueError)."""
    from senders.local.replay import _literal

    got = parse_add_columns("ALTER TABLE `s`.`t` ADD COLUMN `b;x` LONGBLOB NULL DEFAULT X'ff00', ADD `e` BLOB DEFAULT ''")
    assert got == [("b;x", "binary", "X'ff00'"), ("e", "binary", "''")]
    assert _literal("X'ff00'") == "/wA=" and _literal("''") == ""
