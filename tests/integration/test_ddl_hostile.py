"""DDL with hostile identifiers mid-load, from a real MariaDB source through every sender: the file,
a MariaDB target (which applies the DDL text), Apache Kafka with its schema topic (in CI), and the
lake: the Parquet changelog and Delta tables (with ``--runslow``: Spark's start is most of their time).

Names hold doubled backquotes, spaces, dots, commas, parentheses, quotes, ``#``, ``--``, unicode,
reserved words and mixed case; string DEFAULTs and COMMENTs hold commas, parentheses, quotes and
backslashes (and the word DEFAULT); ENUM/SET members are hostile; a CHECK constraint, CHARACTER
SET/COLLATE. The ALTERs have several clauses (ADD COLUMN ... FIRST / AFTER, ADD COLUMN IF NOT EXISTS,
DROP COLUMN IF EXISTS, CHANGE, MODIFY, RENAME COLUMN, ``ADD (a ..., b ...)``, ``ADD ... NOT NULL``
without a DEFAULT, a DROP COLUMN naming the column in another case), comments of every kind inside
(``/* */``, ``-- ``, ``#``, an executable ``/*!50100 ... */``), lower-case keywords, tabs and
newlines; then RENAME TABLE of two pairs, ALTER ... RENAME TO, CREATE TABLE ... LIKE and CREATE
TABLE ... AS SELECT, and two columns swapped by one ALTER. Rows are written before and after each
DDL, to the new and renamed columns too.

``verify`` must find every sink equal to the source (the file's replay, Kafka through the schema
topic, the lake), and the target's columns and rows are compared with the source's by hand.
Before capturer/model/ddl.py read DDL with one quote- and comment-aware scanner, the rows from
before these ALTERs diverged in the file's replay, Kafka's verify and the lake (a clause after a
``-- `` comment or an executable comment lost, ``ADD (a, b)`` not read, a COMMENT's 'DEFAULT 9'
taken for the default, the implied default of a NOT NULL column read as NULL, ``DROP COLUMN MIXED``
missing ``Mixed``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, checkpoint_covers, shared_broker, start_servers, wait_for

from devtools.local_mariadb import MariaDBInstance, free_port
from integration.test_type_edges import _lake, _stopped_cleanly
from integration.test_verify import by_table, run_verify, write_config

pytestmark = pytest.mark.integration

DB = 'h"o st,d(b)'
QDB = "`h\"o st,d(b)`"
T1 = "`T ``x``, (y) #1`"
T2 = "`o.ther -- 2`"


def _create() -> list[str]:
    return [
        f"CREATE DATABASE {QDB}",
        f"""create table {QDB}.{T1} (
\t`Id` INT PRIMARY KEY, -- the key
\t`v,(w)` VARCHAR(40) DEFAULT 'a, (b) ''c'' \\\\d' COMMENT 'x, (y) -- z, DEFAULT 9',
\t`select` INT, # a reserved word
\t`gone)` INT,
\t`old name` INT,
\t`Mixed` VARCHAR(10),
\t`e n` ENUM('a,b', 'c)d', 'e''f') DEFAULT 'c)d',
\t`s et` SET('p', 'q)r', 's''t'),
\t`cs` VARCHAR(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
\tCONSTRAINT `ck, (1)` CHECK (`Id` >= 0)
) /*!50100 COMMENT = 'a table, (hostile)' */""",
        f"CREATE TABLE {QDB}.{T2} (id INT PRIMARY KEY, `ü ñ` VARCHAR(10))",
        # two tables of the same columns and other keys, swapped by one RENAME (its keyword on a line of its own)
        f"CREATE TABLE {QDB}.`k 1` (a INT PRIMARY KEY, b INT)",
        f"CREATE TABLE {QDB}.`k 2` (a INT, b INT PRIMARY KEY)",
        f"INSERT INTO {QDB}.`k 1` VALUES (1, 5), (2, 5)",
        f"INSERT INTO {QDB}.`k 2` VALUES (7, 10), (7, 20)",
    ]


def _row1(i: int) -> str:
    return (f"INSERT INTO {QDB}.{T1} (`Id`, `v,(w)`, `select`, `gone)`, `old name`, `Mixed`, `e n`, `s et`, `cs`) "
            f"VALUES ({i}, 'v{i}, (x)', {i * 3}, {i}, {i * 10}, 'M{i}', 'e''f', 'p,q)r', 'Cs{i}')")


# (DDL, rows after it): each DDL comes after rows written under the columns before it
STEPS: list[tuple[str, list[str]]] = [
    (f"ALTER TABLE {QDB}.{T1}\n\tADD COLUMN `n,ew` VARCHAR(20) DEFAULT 'd, (e) ''f'' \\\\' COMMENT 'DEFAULT 9' "
     "AFTER `v,(w)`, -- a comment, ADD COLUMN junk INT\n"
     "\tADD COLUMN IF NOT EXISTS `k#ey` INT NOT NULL FIRST, # another, DROP `select`\n"
     "\tDROP COLUMN IF EXISTS `gone)`",
     [f"INSERT INTO {QDB}.{T1} (`Id`, `n,ew`, `k#ey`) VALUES (100, 'after 1', 5)",
      f"UPDATE {QDB}.{T1} SET `n,ew` = 'upd' WHERE `Id` = 2"]),
    (f"alter table {QDB}.{T1} change column `old name` `new.name` BIGINT /* , DROP `Id` */, "
     "modify `select` BIGINT, rename column `cs` to `Ünï`",
     [f"INSERT INTO {QDB}.{T1} (`Id`, `new.name`, `Ünï`) VALUES (101, 7, 'ü')",
      f"UPDATE {QDB}.{T1} SET `new.name` = `new.name` + 1 WHERE `Id` = 3"]),
    (f"ALTER TABLE {QDB}.{T1} ADD (`a1` INT DEFAULT 1, `a 2` VARCHAR(5) DEFAULT 'x,y', INDEX `i(1)` (`a1`))",
     [f"INSERT INTO {QDB}.{T1} (`Id`, `a1`, `a 2`) VALUES (102, 2, 'z')"]),
    (f"ALTER TABLE {QDB}.{T1} /*!50100 ADD COLUMN `ex` INT DEFAULT 6 */, "
     "ADD COLUMN IF NOT EXISTS `N,EW` VARCHAR(20) DEFAULT 'not set: the column is there'",
     [f"INSERT INTO {QDB}.{T1} (`Id`, `ex`) VALUES (103, 60)"]),
    (f"ALTER TABLE {QDB}.{T1} DROP COLUMN MIXED, ADD COLUMN `nn` INT NOT NULL, ADD COLUMN `ns` VARCHAR(5) NOT NULL, "
     "ADD COLUMN `ne` ENUM('z,1', 'y') NOT NULL",
     [f"INSERT INTO {QDB}.{T1} (`Id`, `nn`, `ns`) VALUES (104, 4, 'n')"]),
    (f"RENAME TABLE {QDB}.{T1} TO {QDB}.`T1 re.named`, {QDB}.{T2} TO {QDB}.`o2 ``re``named`",
     [f"INSERT INTO {QDB}.`T1 re.named` (`Id`) VALUES (105)",
      f"INSERT INTO {QDB}.`o2 ``re``named` VALUES (50, 'after')"]),
    (f"ALTER TABLE {QDB}.`o2 ``re``named` ADD COLUMN `z)` INT DEFAULT 9, CHANGE id `I.d` INT, "  # (the key)
     f"RENAME TO {QDB}.`o3, final`",
     [f"INSERT INTO {QDB}.`o3, final` (`I.d`) VALUES (51)",
      f"UPDATE {QDB}.`o3, final` SET `z)` = 10 WHERE `I.d` = 1"]),
    # a column dropped and added again in one ALTER: the rows there take the new column's default (the lake
    # applied the ADD first, found the column there, then dropped it: the column was gone from the lake)
    (f"ALTER TABLE {QDB}.`o3, final` DROP COLUMN `z)`, ADD COLUMN `z)` INT DEFAULT 4 FIRST",
     [f"INSERT INTO {QDB}.`o3, final` (`I.d`) VALUES (52)"]),
    # (a swap of two tables of the same columns and other keys, its RENAME on a line of its own: every sink
    # keeps each table's rows under its own key)
    (f"RENAME\nTABLE {QDB}.`k 1` TO {QDB}.`k tmp`, {QDB}.`k 2` TO {QDB}.`k 1`, {QDB}.`k tmp` TO {QDB}.`k 2`",
     [f"UPDATE {QDB}.`k 2` SET b = 6 WHERE a = 1", f"UPDATE {QDB}.`k 1` SET a = 8 WHERE b = 10"]),
    (f"CREATE TABLE {QDB}.`li ke` LIKE {QDB}.`T1 re.named`",
     [f"INSERT INTO {QDB}.`li ke` (`Id`, `n,ew`) VALUES (1, 'like')"]),
    (f"CREATE TABLE {QDB}.`as sel` (PRIMARY KEY (`Id`)) AS SELECT `Id`, `v,(w)` FROM {QDB}.`T1 re.named` "
     "WHERE `Id` < 4",
     [f"INSERT INTO {QDB}.`as sel` VALUES (9, 'nine')"]),
    # two columns swapped by one ALTER (MySQL renames at once): the readers that apply an ALTER to the rows
    # from before it (the file's replay, Kafka's verify, the lake) swap them too; one after another, the
    # swap lost a column (the file, Kafka) or was skipped (the lake)
    (f"ALTER TABLE {QDB}.`T1 re.named` CHANGE `n,ew` `v,(w)` VARCHAR(40), CHANGE `v,(w)` `n,ew` VARCHAR(40)",
     [f"UPDATE {QDB}.`T1 re.named` SET `n,ew` = 'swapped' WHERE `Id` = 1"]),
]
# a rename that changes only the case (the changelog lake stops on it, naming it: tests/unit/test_lake_columns.py)
CASE_ONLY = (f"ALTER TABLE {QDB}.`T1 re.named` CHANGE COLUMN ex EX INT DEFAULT 6",
             [f"UPDATE {QDB}.`T1 re.named` SET EX = 61 WHERE `Id` = 104"])
EXTRA = [
    (f"ALTER ONLINE TABLE {QDB}.`T1 re.named` ADD COLUMN `x(1)` INT DEFAULT 3 AFTER `Id`, ALGORITHM=INPLACE, LOCK=NONE", []),
    (f"alter ignore table {QDB}.`T1 re.named` add column `e2` enum('q,r', 'b') not null, convert to character set utf8mb4",
     [f"INSERT INTO {QDB}.`T1 re.named` (`Id`, e2) VALUES (300, 'b')"]),
    (f"/* pre */ TRUNCATE /* mid */ TABLE {QDB}.`li ke`", [f"INSERT INTO {QDB}.`li ke` (`Id`) VALUES (2)"]),
    (f"CREATE TABLE {QDB}.`d1` (a INT PRIMARY KEY)", [f"INSERT INTO {QDB}.`d1` VALUES (1)"]),
    (f"-- x\nDROP TABLE /* y */ {QDB}.`d1`, {QDB}.`as sel` # z", []),
]
TABLES = {"T1 re.named": 11, "o3, final": 7, "li ke": 1, "as sel": 4, "k 1": 2, "k 2": 2}


def _source(m: MariaDBInstance, sql: str) -> list[tuple[Any, ...]]:
    conn = m.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def _columns(m: MariaDBInstance, table: str) -> list[tuple[Any, ...]]:
    return _source(m, "SELECT column_name, column_type, is_nullable, column_default FROM information_schema.columns "
                      f"WHERE table_schema = '{DB.replace(chr(39), chr(39) * 2)}' AND table_name = "
                      f"'{table.replace(chr(39), chr(39) * 2)}' ORDER BY ordinal_position")


def _rows(m: MariaDBInstance, table: str) -> list[tuple[Any, ...]]:
    return _source(m, f"SELECT * FROM {QDB}.`{table.replace('`', '``')}` ORDER BY 1")


def _run(tmp_path: Path, table_format: str | None) -> None:
    """``table_format`` None: no lake (the file, the target and Kafka only: the CI case, no Spark)."""
    lake = _lake(table_format) if table_format else ""
    senders = ("local", "mysql", "kafka", "spark") if table_format else ("local", "mysql", "kafka")
    (m,) = start_servers(tmp_path, 1)
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    broker = shared_broker()
    try:
        m.execute(*_create(), *[_row1(i) for i in range(1, 6)],
                  *[f"INSERT INTO {QDB}.{T2} VALUES ({i}, 'ü{i}')" for i in range(1, 5)])
        (tmp_path / "senderConfig.cfg").write_text(
            f"[global]\ntype={','.join(senders)}\n"
            f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=2\n"
            f"[kafka]\nservers={broker.servers}\nclient=confluent\nschema_topic=ddl.schema\n"
            f"[spark]\nwarehouse={tmp_path / 'wh'}\n{lake}batch_interval=1\nbatch_rows=500\n"
            "compaction_interval=0\nmaster=local[1]\nconf.spark.driver.memory=512m\n"
            "conf.spark.sql.shuffle.partitions=2\n")
        region = (f"\n[region:r1]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\npassword=capturer\n"
                  "server_id=800\nheartbeat_ms=200\nstart=earliest\n")
        cfg = write_config(tmp_path, region, free_port())
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        try:
            cap.wait_ready()
            for ddl, after in [*STEPS, *([] if table_format else [CASE_ONLY, *EXTRA])]:  # (the rows after one DDL are the rows before the next)
                m.execute("SET SESSION sql_mode = ''", ddl, *after)  # (the NOT NULL columns left out: implied)
            # (Delta's ALTERs and MERGEs take minutes on a loaded machine: 250 s at load 14)
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 600 if table_format == "delta" else 240,
                     "every sender to have every change")
        finally:
            _stopped_cleanly(cap, tmp_path)
        code, report = run_verify(cfg, "--wait", "30")
        tables = by_table(report)
        bad = {k: v for k, v in tables.items() if v["status"] != "equal"}
        assert code == 0 and not bad, "\n".join(
            f"{s}/{t}: {v['status']} ({v['missing']} missing, {v['extra']} extra, {v['different']} different) "
            f"{v.get('note') or ''}\n    " + "\n    ".join(e[:500] for e in v["examples"][:3])
            for (s, t), v in bad.items()) or json.dumps(report, default=str)[:4000]
        tables_now = dict(TABLES) if table_format else {**TABLES, "T1 re.named": 12, "li ke": 1}
        if not table_format:
            del tables_now["as sel"]
        want = {(s, f"{DB}.{t}"): n for s in senders for t, n in tables_now.items()}
        assert {k: v["rows"] for k, v in tables.items()} == want
        for t in tables_now:  # the target by hand: its table definitions (the DDL text it applied) and rows
            assert _columns(target, t) == _columns(m, t), t
            assert _rows(target, t) == _rows(m, t), t
    finally:
        broker.kill()
        for srv in (m, target):
            srv.stop()


def test_hostile_ddl_mid_load_reaches_every_sender_equal(tmp_path: Path) -> None:
    _run(tmp_path, None)


@pytest.mark.slow
@pytest.mark.parametrize("table_format", ["changelog", "delta"])
def test_hostile_ddl_mid_load_reaches_the_lake_equal(tmp_path: Path, table_format: str) -> None:
    """The same through the lake too (~90 s for the changelog, ~250 s for Delta at load 14: --runslow; the
    changelog lake's DROP / RENAME COLUMN has a unit test in CI, tests/unit/test_lake_columns.py)."""
    _run(tmp_path, table_format)
