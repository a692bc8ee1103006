"""MySQL -> MySQL: parallel apply with conflict detection against real MariaDB."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers import CapturerProcess, checkpoint_covers, wait_for, write_config
from workload import SCHEMA, Workload, assert_target_equals_sources, rows_of

from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


def mysql_senders(target: MariaDBInstance, **extra: object) -> str:
    opts = {"host": "127.0.0.1", "port": target.port, "user": "root", "password": "", "threadnum": 8}
    opts.update(extra)
    return "[global]\ntype=mysql\n[mysql]\n" + "".join(f"{k}={v}\n" for k, v in opts.items())


def run_workload(servers: list[MariaDBInstance], steps: int, seed: int = 1) -> list[Workload]:
    loads = [Workload(m, i + 1, seed + i) for i, m in enumerate(servers)]
    threads = [w.thread(steps) for w in loads]
    for t in threads:
        t.join()
    for w in loads:
        assert not w.errors, w.errors
    return loads


@pytest.mark.parametrize("atomic", [False, True], ids=["rows", "txn_atomic"])
def test_random_workload_target_equals_sources(tmp_path: Path, two_servers, target, capturer_running, atomic: bool) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute(*SCHEMA)
    cfg = write_config(tmp_path, two_servers, senders=mysql_senders(target, txn_atomic=str(atomic).lower()))
    with capturer_running(cfg) as cap:
        loads = run_workload(two_servers, 600)
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 120, "target to catch up")
        st = cap.senders[0].status()
    assert sum(w.rows for w in loads) > 1000
    assert_target_equals_sources(two_servers, target)
    assert st["errors"] == 0, st
    print(f"mysql sender status: {st}")


def test_ddl_mid_stream_and_database_mapping(tmp_path: Path, two_servers, target, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE src", "CREATE TABLE src.t (id INT PRIMARY KEY, v VARCHAR(10))")
    cfg = write_config(tmp_path, two_servers[:1], senders=mysql_senders(target, database="merged"))
    target.execute("CREATE DATABASE merged")
    with capturer_running(cfg):
        m1.execute("INSERT INTO src.t VALUES (1,'a'),(2,'b')",
                   "ALTER TABLE src.t ADD COLUMN extra INT NOT NULL DEFAULT 7",
                   "INSERT INTO src.t VALUES (3,'c',30)",
                   "UPDATE src.t SET extra = extra + 1 WHERE id < 3",
                   "USE src",
                   )
        c = m1.connect(db="src")
        with c.cursor() as cur:
            cur.execute("CREATE TABLE u (k VARCHAR(5) PRIMARY KEY)")
            cur.execute("INSERT INTO u VALUES ('x'),('y')")
            cur.execute("RENAME TABLE u TO u2")
            cur.execute("INSERT INTO u2 VALUES ('z')")
            cur.execute("CREATE TABLE gone (id INT)")
            cur.execute("DROP TABLE gone")
            cur.execute("TRUNCATE TABLE t")
            cur.execute("INSERT INTO t VALUES (9, 'after', 1)")
        c.close()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 60)
    assert rows_of(target, "merged", "t") == rows_of(m1, "src", "t") == [(9, "after", 1)]
    assert rows_of(target, "merged", "u2") == [("x",), ("y",), ("z",)]
    c = target.connect()
    with c.cursor() as cur:
        cur.execute("SHOW DATABASES")
        assert "src" not in {r[0] for r in cur.fetchall()}
        cur.execute("SHOW TABLES FROM merged")
        assert {r[0] for r in cur.fetchall()} == {"t", "u2"}
    c.close()


def test_target_restart_during_load(tmp_path: Path, two_servers, target, capturer_running) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute(*SCHEMA)
    cfg = write_config(tmp_path, two_servers, senders=mysql_senders(target))
    with capturer_running(cfg) as cap:
        loads = [Workload(m, i + 1, 10 + i) for i, m in enumerate(two_servers)]
        threads = [w.thread(800) for w in loads]
        time.sleep(1.5)
        target.stop()
        sender = cap.senders[0]
        wait_for(lambda: sender.state == "retrying", 30, "the sender to notice the outage")
        time.sleep(1)  # let a checkpoint of what was acknowledged before the outage be written
        cp_during = cap.checkpoint.commit_ts
        time.sleep(2)
        assert cap.checkpoint.commit_ts == cp_during, "checkpoint moved while the target was down"
        assert cap.health()[0] is False
        target.start()
        for t in threads:
            t.join()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 120, "catch-up after target restart")
        st = sender.status()
    assert st["retries"] > 0 and st["last_error"]
    assert_target_equals_sources(two_servers, target)


def test_kill9_during_load_target_still_equals_sources(tmp_path: Path, two_servers, target) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute(*SCHEMA)
    cfg = write_config(tmp_path, two_servers, senders=mysql_senders(target))
    log = tmp_path / "capturer.log"
    loads = [Workload(m, i + 1, 20 + i) for i, m in enumerate(two_servers)]
    threads = [w.thread(1500) for w in loads]
    proc = CapturerProcess(cfg, log).start()
    time.sleep(3)
    proc.kill9()
    time.sleep(0.5)
    proc = CapturerProcess(cfg, log).start()
    time.sleep(2)
    proc.kill9()  # twice, for good measure
    proc = CapturerProcess(cfg, log).start()
    for t in threads:
        t.join()
    wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 120, "catch-up after kill -9")
    assert proc.stop() == 0
    assert_target_equals_sources(two_servers, target)


def test_types_round_trip_to_target(tmp_path: Path, two_servers, target, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute(
        "CREATE DATABASE ty",
        """CREATE TABLE ty.t (
            id INT PRIMARY KEY, d DECIMAL(20,6), dt6 DATETIME(6), ts TIMESTAMP(6) NULL, j JSON, b BLOB,
            bits BIT(5), s VARCHAR(50), u BIGINT UNSIGNED, n INT NULL, dd DATE, tm TIME(3), f DOUBLE,
            e ENUM('x','y'), st SET('a','b','c'), lat VARCHAR(10) CHARACTER SET latin1, y YEAR,
            bin BINARY(4), zero INT NOT NULL)""",
        "CREATE TABLE ty.`we``ird tbl` (`k%s` INT PRIMARY KEY, `v``x` TEXT)",
    )
    cfg = write_config(tmp_path, two_servers[:1], senders=mysql_senders(target))
    with capturer_running(cfg):
        m1.execute(
            "SET time_zone='+05:00'",
            """INSERT INTO ty.t VALUES (0, -12345678901234.123456, '2024-02-29 23:59:59.999999',
               '2024-01-02 03:04:05.123456', '{"k": [1, "😀"]}', X'0001feff', b'10101', 'héllo 😀 \\' "',
               18446744073709551615, NULL, '1999-12-31', '-838:59:59.000', -1.5e-300, 'y', 'a,c', 'café',
               2155, X'00ff0000', 0)""",
            "INSERT INTO ty.t (id, zero) VALUES (2, 5)",
            "INSERT INTO ty.t (id, zero, lat) VALUES (3, 0, X'41819D8F')",  # bytes cp1252 leaves undefined
            "UPDATE ty.t SET n = 1, bits = b'00001' WHERE id = 0",
            "INSERT INTO ty.`we``ird tbl` VALUES (1, '%s %% `` \\\\ ''')",
        )
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 60)
    assert rows_of(target, "ty", "t") == rows_of(m1, "ty", "t")
    assert rows_of(target, "ty", "we`ird tbl") == rows_of(m1, "ty", "we`ird tbl") == [(1, "%s %% `` \\ '")]


def test_zero_dates_in_not_null_columns_reach_the_target_as_zero_dates(tmp_path: Path, two_servers, target, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """Legacy schemas: ``NOT NULL`` DATE/DATETIME/TIMESTAMP columns holding zero dates (a source whose
    ``sql_mode`` allows them). They travel as NULL (no calendar has them); the target's ``NOT NULL``
    column got that NULL: a row inserted alone was refused (1048, the MySQL sender stopped), rows inserted
    together got the implicit default (the current time in a ``TIMESTAMP``). The sender writes the zero
    date back where the target's column is ``NOT NULL``: equal to the source row for row, also a keyless
    table's update and delete (matched by every column), and after an ADD COLUMN; a nullable column keeps
    the NULL (the documented mapping)."""
    m1 = two_servers[0]
    m1.execute(
        "SET SESSION sql_mode=''",
        "CREATE DATABASE zd",
        """CREATE TABLE zd.t (id INT PRIMARY KEY, d DATE NOT NULL DEFAULT '0000-00-00',
            dt DATETIME NOT NULL DEFAULT '0000-00-00 00:00:00',
            ts TIMESTAMP NOT NULL DEFAULT '0000-00-00 00:00:00', n DATETIME NULL)""",
        "CREATE TABLE zd.k (v INT, dt DATETIME NOT NULL)",
    )
    cfg = write_config(tmp_path, two_servers[:1], senders=mysql_senders(target))
    with capturer_running(cfg) as cap:
        c = m1.connect()
        with c.cursor() as cur:
            cur.execute("SET SESSION sql_mode=''")
            cur.execute("INSERT INTO zd.t (id) VALUES (1)")  # a row alone, its zero dates the defaults: refused before
            c.commit()
            cur.execute("INSERT INTO zd.t VALUES (2, '2024-01-02', '2024-01-02 03:04:05', '2024-01-02 03:04:05', "
                        "NULL), (3, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00', NULL), "
                        "(4, '0000-00-00', '2020-05-06 07:08:09', '0000-00-00 00:00:00', '2020-01-01')")
            c.commit()
            cur.execute("UPDATE zd.t SET d = '0000-00-00', ts = '0000-00-00 00:00:00' WHERE id = 2")
            cur.execute("INSERT INTO zd.k VALUES (1, '0000-00-00 00:00:00'), (2, '2021-01-01'), "
                        "(3, '0000-00-00 00:00:00')")
            c.commit()
            cur.execute("UPDATE zd.k SET v = 10 WHERE v = 1")  # found at the target by its zero date
            cur.execute("DELETE FROM zd.k WHERE v = 3")
            cur.execute("ALTER TABLE zd.t ADD COLUMN later DATE NOT NULL DEFAULT '0000-00-00'")
            cur.execute("INSERT INTO zd.t (id) VALUES (5)")
            c.commit()
        c.close()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 60)
        st = cap.senders[0].status()
    assert st["errors"] == 0 and st["state"] != "failed", st
    assert rows_of(target, "zd", "t") == rows_of(m1, "zd", "t")
    assert sorted(rows_of(target, "zd", "k")) == sorted(rows_of(m1, "zd", "k"))
    assert rows_of(target, "zd", "t")[0][4] is None  # the nullable column: NULL, as documented
    from helpers import verify_equal

    verify_equal(cfg, ["mysql"], 30)  # verify agrees


def test_a_column_rename_replayed_after_a_crash_goes_on(tmp_path: Path, target) -> None:  # type: ignore[no-untyped-def]
    """A crash between a DDL's commit at the target and its position's row (two transactions: MySQL
    commits a DDL on its own) applies the DDL again after the restart. For CHANGE COLUMN and RENAME
    COLUMN the second run finds no column of the old name (1054): already applied, not a failure. Before,
    the MySQL sender stopped there for good (seen in CI: the hostile applier test, kill -9 mid-load)."""
    from capturer.model import Ddl, Position, Txn
    from senders.mysql.sender import MySQLSender

    target.execute("CREATE DATABASE rc", "CREATE TABLE rc.t (id INT PRIMARY KEY, `order` INT, sel INT)")
    from capturer import config
    from senders import CATALOG

    p = tmp_path / "senderConfig.cfg"
    p.write_text(mysql_senders(target, threadnum=2))
    (sc,) = config.load_sender_config(p, CATALOG)
    ddls = ["ALTER TABLE rc.t CHANGE COLUMN `order` `Order2` BIGINT",
            "ALTER TABLE rc.t\nRENAME COLUMN sel TO `re.named`"]
    txns = [Txn("r1", (i + 1) << 18, Position("bin.000001", 100 + i), ddl=Ddl("rc", sql, "t", "rc", 0))
            for i, sql in enumerate(ddls)]
    # the crash's effect: the DDL at the target, its position not (a second sender, whose position rows
    # are its own, has none: it runs each DDL again, as the restarted one would)
    first, again = MySQLSender("mysql", sc.options), MySQLSender("mysql_after_crash", sc.options)
    for s in (first, again):
        s.open()
        try:
            for t in txns:
                s.send([t])
        finally:
            s.close()
    c = target.connect()
    with c.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA='rc' AND TABLE_NAME='t' "
                    "ORDER BY ORDINAL_POSITION")
        assert [r[0] for r in cur.fetchall()] == ["id", "Order2", "re.named"]
    c.close()


def test_big_transaction_is_spilled_and_arrives_whole(tmp_path: Path, two_servers, target, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """A transaction past spillRows goes to disk in chunks; the filter, the file
    sender and the MySQL sender read it from there. Everything arrives, in order,
    as one transaction, and the spill directory is left empty."""
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE big", "CREATE TABLE big.t (id INT PRIMARY KEY, v VARCHAR(20), u INT UNIQUE)",
               "CREATE TABLE big.skip (id INT PRIMARY KEY)")
    spill_dir = tmp_path / "spill"
    senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               + mysql_senders(target).split("\n", 2)[2])
    cfg = write_config(tmp_path, two_servers[:1], senders=senders, filter_text="exclude big.skip\ninclude big.*\n",
                       extra_global=f"spillRows=1000\nspillDir={spill_dir}\n")
    with capturer_running(cfg) as cap:
        c = m1.connect()
        c.autocommit(False)
        with c.cursor() as cur:
            cur.executemany("INSERT INTO big.t VALUES (%s, %s, %s)", [(i, f"v{i}", i) for i in range(6000)])
            cur.executemany("INSERT INTO big.skip VALUES (%s)", [(i,) for i in range(1500)])
            cur.execute("UPDATE big.t SET id = id + 100000, u = -u WHERE id % 2 = 0")  # PK and UK changes
            cur.execute("DELETE FROM big.t WHERE id % 5 = 1")
        c.commit()
        c.close()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 120, "the big transaction")
        assert cap.regions[0].status()["spilled_txns"] == 1
    assert rows_of(target, "big", "t") == rows_of(m1, "big", "t")
    from helpers import read_lines

    lines = [x for x in read_lines(tmp_path) if x["op"] != "ddl"]
    txn = [x for x in lines if x["txn_rows"] > 1000]
    assert len(txn) == 6000 + 3000 + 1200 == txn[0]["txn_rows"]
    assert [x["seq"] for x in txn] == list(range(len(txn)))
    assert len({x["commit_ts"] for x in txn}) == 1 and txn[-1]["last"]
    assert {x["table"] for x in txn} == {"t"}  # big.skip filtered out of the spilled rows
    assert os.listdir(spill_dir) == []
