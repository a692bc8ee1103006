"""capturer/model/ddl.py against the DDL forms the outside checks run mid-load: hostile identifiers
(doubled backquotes, spaces, dots, commas, parentheses, quotes, ``#``, ``--``, ``/*``, unicode, reserved
words, mixed case), string DEFAULTs and COMMENTs holding commas, parentheses, quotes and backslashes,
CHECK constraints, generated columns, ENUM/SET with hostile members, comments of every kind inside the
statement (``/* */``, ``-- ``, ``#``) and executable comments (``/*!50100 ... */``). One splitter reads
them all (``strip_comments`` then ``split_top``): the lake, the file's replay, Kafka's verify and the MySQL
sender read the same answer."""

from __future__ import annotations

import pytest

from capturer.model.ddl import (
    added_if_not_exists,
    alter_columns,
    apply_row_steps,
    constant_default,
    create_columns,
    ddl_target,
    dropped_tables,
    is_data_ddl,
    names_several_tables,
    renamed_tables,
    row_steps,
    split_top,
    statement_head,
    strip_comments,
    table_renames,
    unknown_adds,
)

T = "ALTER TABLE `we\"ird db`.`t ``x``, (y)` "


def test_strip_comments_keeps_quoted_text_and_executable_comments() -> None:
    assert strip_comments("a /* x */ b -- c\nd # e\nf") == "a   b  \nd  \nf"
    # inside quotes and backquotes nothing is a comment
    assert strip_comments("`a#b` '/* x */' \"-- y\" `c--`") == "`a#b` '/* x */' \"-- y\" `c--`"
    assert strip_comments("'it\\'s # not' # yes") == "'it\\'s # not'  "
    # an executable comment is SQL the server runs (MariaDB's /*M!...*/ too); "--" needs a blank after it
    assert strip_comments("ALTER TABLE t /*!50100 ADD c INT */") == "ALTER TABLE t   ADD c INT  "
    assert strip_comments("x /*M!100100 ADD c INT*/ y") == "x   ADD c INT  y"
    assert strip_comments("SELECT 1--1") == "SELECT 1--1"
    assert strip_comments("a -- b") == "a  "


def test_split_top_respects_quotes_parentheses_and_comments() -> None:
    assert split_top("a, b(1, 2), 'c,d', `e,f`, \"g,'h\", 'i\\',j'") == [
        "a", " b(1, 2)", " 'c,d'", " `e,f`", " \"g,'h\"", " 'i\\',j'"]
    assert split_top("`a``,b`, c") == ["`a``,b`", " c"]
    assert split_top("'a'',b', c") == ["'a'',b'", " c"]


def test_alter_columns_with_hostile_names_defaults_and_comments() -> None:
    sql = (T + "ADD COLUMN `a,b` VARCHAR(20) DEFAULT 'x, (y) ''q'' \\\\' COMMENT 'c, (d)', "
           "ADD COLUMN IF NOT EXISTS `SELECT` INT NOT NULL DEFAULT 3 FIRST, "
           "DROP COLUMN IF EXISTS `gone)`, CHANGE COLUMN `old name` `new.name` BIGINT AFTER `a,b`, "
           "MODIFY `m` TEXT, RENAME COLUMN `ü ñ` TO `Ünï`")
    assert [(w, a) for w, a, _ in alter_columns(sql)] == [
        ("add", "a,b"), ("add", "SELECT"), ("drop", "gone)"), ("rename", "old name", "new.name")[:2],
        ("rename", "ü ñ")]
    assert alter_columns(sql)[3] == ("rename", "old name", "new.name")
    assert alter_columns(sql)[4] == ("rename", "ü ñ", "Ünï")
    assert row_steps(sql)[:2] == [("add", "a,b", "x, (y) 'q' \\"), ("add", "SELECT", 3)]


def test_alter_columns_across_comments_of_every_kind() -> None:
    sql = ("alter table t -- why\n\tADD c1 INT /* , ADD junk INT */, # more\n add `c#2` INT DEFAULT 5,\n"
           "/*!50100 ADD COLUMN c3 INT DEFAULT 6 */, drop `x--y`")
    assert row_steps(sql) == [("add", "c1", None), ("add", "c#2", 5), ("add", "c3", 6), ("drop", "x--y", None)]
    # a leading comment before the statement
    assert row_steps("/* pre */ -- line\nALTER TABLE t ADD c INT DEFAULT 1") == [("add", "c", 1)]
    assert row_steps("# pre\nALTER TABLE t DROP c") == [("drop", "c", None)]


def test_add_several_columns_in_parentheses() -> None:
    sql = T + "ADD (a INT DEFAULT 1, `b)` VARCHAR(5) DEFAULT 'x,y', INDEX (a), CONSTRAINT ck CHECK (a > 0))"
    assert row_steps(sql) == [("add", "a", 1), ("add", "b)", "x,y")]
    assert row_steps("ALTER TABLE t ADD COLUMN (c INT)") == [("add", "c", None)]


def test_reserved_and_keyword_like_names_after_column() -> None:
    # with the COLUMN keyword the name is a column's, whatever it reads like
    assert row_steps("ALTER TABLE t ADD COLUMN `key` INT DEFAULT 1, ADD COLUMN `primary` INT, "
                     "DROP COLUMN `index`, ADD COLUMN system INT") == [
        ("add", "key", 1), ("add", "primary", None), ("drop", "index", None), ("add", "system", None)]
    # without it those words start an index or a constraint, not a column
    assert row_steps("ALTER TABLE t ADD KEY k (a), ADD UNIQUE (a), ADD PRIMARY KEY (a), ADD CONSTRAINT c CHECK (a>0),"
                     " DROP INDEX k, DROP PRIMARY KEY, DROP CONSTRAINT c, DROP CHECK c, DROP FOREIGN KEY f, "
                     "ADD PERIOD FOR p(a, b), ADD SYSTEM VERSIONING, ADD FULLTEXT (a), ADD PARTITION (PARTITION p1)"
                     ) == []


def test_constant_default_is_read_outside_strings_and_parentheses() -> None:
    # a COMMENT, an ENUM member or a CHECK that holds the word DEFAULT is not the column's default
    assert constant_default("INT COMMENT 'DEFAULT 9'") is None
    assert constant_default("ENUM('DEFAULT 1', 'b') NOT NULL DEFAULT 'b'") == "'b'"
    assert constant_default("INT CHECK (x <> 'DEFAULT 4') DEFAULT 5") == "5"
    assert constant_default("VARCHAR(9) DEFAULT 'a''b' COMMENT 'DEFAULT 9'") == "'a''b'"
    assert constant_default("INT DEFAULT (7)") == "7"
    assert constant_default("INT DEFAULT(7)") == "7"
    assert constant_default("DATETIME DEFAULT CURRENT_TIMESTAMP") is None
    assert constant_default("INT DEFAULT (1 + 2)") is None
    assert constant_default("INT DEFAULT -3") == "-3"
    assert constant_default("VARCHAR(5) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT _utf8mb4'x'") == "'x'"


def test_not_null_without_default_takes_the_implied_default() -> None:
    """ADD COLUMN x <type> NOT NULL without DEFAULT: the source fills the older rows with the type's implied
    default (0, '', the first ENUM member, zero dates), and so must the lake, the replay and Kafka's verify."""
    sql = ("ALTER TABLE t ADD a INT NOT NULL, ADD b VARCHAR(5) NOT NULL, ADD c ENUM('x,y', 'z') NOT NULL, "
           "ADD d DECIMAL(5,2) NOT NULL, ADD e INT NULL, ADD f DOUBLE NOT NULL, ADD g SET('p','q') NOT NULL,"
           " ADD h BLOB NOT NULL")
    steps = {a: v for w, a, v in row_steps(sql) if w == "add"}
    assert steps["a"] == 0 and steps["b"] == "" and steps["c"] == "x,y" and steps["f"] == 0
    assert str(steps["d"]) in ("0", "0.00") and steps["e"] is None and steps["g"] == "" and steps["h"] == b""


def test_case_of_column_names_does_not_matter() -> None:
    """MySQL's column names are case-insensitive: DROP COLUMN ID drops `id`."""
    row = {"id": 1, "Name": "x", "v": 2}
    assert apply_row_steps(row, row_steps("ALTER TABLE t DROP COLUMN NAME, CHANGE V w INT")) == {"id": 1, "w": 2}
    assert apply_row_steps(row, row_steps("ALTER TABLE t ADD COLUMN NAME INT DEFAULT 3")) == row  # (IF NOT EXISTS)


def test_create_columns_of_hostile_tables() -> None:
    sql = ("CREATE TABLE `a(b`.`c``,d` ( -- cols\n `ID` INT NOT NULL, # x, y\n `x,y` ENUM('a)', 'b,c') DEFAULT 'a)',"
           " `g` INT AS (`ID` + 1) VIRTUAL, `s` VARCHAR(5) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin COMMENT 'a, (b)',"
           " CONSTRAINT `ck` CHECK (`ID` > 0), CHECK (g < 9), PRIMARY KEY (`ID`), KEY `k(` (`g`)) /*!50100 PARTITION "
           "BY HASH (ID) */")
    assert create_columns(sql) == ["ID", "x,y", "g", "s"]
    assert create_columns("CREATE TABLE t2 LIKE `t(1)`") == []
    assert create_columns("CREATE TABLE t3 AS SELECT f(a, b) AS c FROM t") == []
    assert create_columns("CREATE TABLE t4 (a INT) AS SELECT 1 AS a") == ["a"]
    assert create_columns("/* x */ create table `t5`(`SELECT` INT, `key` INT)") == ["SELECT", "key"]


def test_targets_and_renames_under_comments_and_hostile_names() -> None:
    assert ddl_target("/* a */ -- b\n# c\nALTER TABLE `d#1`.`t--2` ADD c INT", "cur") == ("d#1", "t--2")
    assert ddl_target("/*!40000 ALTER TABLE `x` DISABLE KEYS */", "cur") == ("cur", "x")
    assert is_data_ddl("-- note\nCREATE TABLE t (a INT)")
    assert renamed_tables("RENAME TABLE `a,b` TO `c d`, /* , */ x.`e``f` TO `y`.`g#h` -- end", "cur") == [
        (("cur", "a,b"), ("cur", "c d")), (("x", "e`f"), ("y", "g#h"))]
    assert table_renames("ALTER TABLE t ADD c INT, RENAME TO `u,v`", "d", "t") == [(("d", "t"), ("d", "u,v"))]
    assert dropped_tables("DROP TABLE `a,b`, `c#d` -- x", "cur") == [("cur", "a,b"), ("cur", "c#d")]
    assert statement_head("/* x */ -- y\n  drop TABLE t") == "DROP"
    assert statement_head("/*!40000 ALTER TABLE t */") == "ALTER"


@pytest.mark.parametrize("sql", [
    "ALTER TABLE t ADD COLUMN g INT AS (a + 1) STORED",
    "ALTER TABLE t ADD COLUMN g INT GENERATED ALWAYS AS (a + 1) VIRTUAL",
    "ALTER TABLE t ADD COLUMN ts DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP",
    "ALTER TABLE t ADD COLUMN u INT DEFAULT (a * 2)",
    "ALTER TABLE t ADD COLUMN i INT NOT NULL AUTO_INCREMENT",
])
def test_an_added_column_whose_older_values_only_the_source_knows(sql: str) -> None:
    """Older rows of a generated column or a non-constant default take values only the source computes:
    ``unknown_adds`` names them (the lake warns naming the statement; docs/limits.md)."""
    assert row_steps(sql)[0][2] is None
    assert unknown_adds(sql) == [row_steps(sql)[0][1]]
    assert unknown_adds("ALTER TABLE t ADD COLUMN a INT DEFAULT 3, ADD b INT NOT NULL, ADD c TEXT") == []


def test_columns_added_if_not_exists() -> None:
    """The Delta lake sets an added column's default on every row there: not on a column that was there."""
    assert added_if_not_exists("ALTER TABLE t ADD COLUMN IF NOT EXISTS `a,b` INT DEFAULT 1, ADD c INT, "
                               "ADD IF NOT EXISTS (d INT, `e f` INT, INDEX (d)) -- x") == {"a,b", "d", "e f"}
    assert added_if_not_exists("CREATE TABLE t (a INT)") == set()


def test_statements_naming_several_tables() -> None:
    """The MySQL region forgets its cached table definitions (keys) of every table such a statement may
    change: before, only " RENAME " between spaces was seen, so an ALTER TABLE a\n\tRENAME TO b kept a's key."""
    for sql in ("ALTER TABLE a\n\tRENAME TO b", "alter table a rename\tb", "RENAME TABLE a TO b, c TO d",
                "/* x */ drop table a, b", "ALTER TABLE a ADD c INT,\nRENAME AS b"):
        assert names_several_tables(sql), sql
    for sql in ("ALTER TABLE a ADD c INT -- rename later", "CREATE TABLE a (b INT)", "ALTER TABLE a RENAME COLUMN"[:14]):
        assert not names_several_tables(sql), sql


@pytest.mark.parametrize("clauses,want", [
    # MySQL renames at once: a swap, a chain, a DROP of the name a rename gives (the column of before)
    ("CHANGE a b INT, CHANGE b a INT", {"id": 1, "b": "A", "a": "B", "c": "C"}),
    ("RENAME COLUMN a TO b, RENAME COLUMN b TO c, RENAME COLUMN c TO a", {"id": 1, "b": "A", "c": "B", "a": "C"}),
    ("CHANGE a b INT, CHANGE b c INT, DROP COLUMN c", {"id": 1, "b": "A", "c": "B"}),
    ("CHANGE `a` `B` INT, CHANGE b `A` INT, ADD COLUMN d INT DEFAULT 4", {"id": 1, "B": "A", "A": "B", "c": "C",
                                                                           "d": 4}),
    ("DROP COLUMN a, CHANGE b a INT", {"id": 1, "a": "B", "c": "C"}),
])
def test_renames_in_one_alter_happen_at_once(clauses: str, want: dict[str, object]) -> None:
    """The file's replay and Kafka's verify apply an ALTER to the rows from before it step by step; MySQL
    applies the clauses to the table as it was (the server's own result checked on MariaDB 10.11: ``CHANGE a b,
    CHANGE b a`` swaps the two). Before, the swap lost a column (``{'a': 'A'}``: b renamed over a, then a
    over nothing), and a chain moved a value onto the wrong name."""
    row = {"id": 1, "a": "A", "b": "B", "c": "C"}
    assert apply_row_steps(row, row_steps(T + clauses)) == want
