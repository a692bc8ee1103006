"""Every form of DDL applied again after a crash between its commit at the target and its
position's row (MySQL commits a DDL on its own): the MySQL sender goes on, and the target ends
as one run of the DDL leaves it (senders/mysql/ddlstate.py). Before, some forms stopped the
sender for good (RENAME INDEX: 1176, DROP/REORGANIZE PARTITION: 1507, DROP VIEW: 4092, DROP
SEQUENCE: 4091, CREATE TRIGGER: 1359, a named FOREIGN KEY: 1005) and some changed the schema
again (a RENAME swap swapped back, so did a column swap; an unnamed FOREIGN KEY or CHECK was added
twice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capturer.util import failpoints
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration

SETUP = [
    "CREATE TABLE t (id INT PRIMARY KEY, a INT, b INT, c VARCHAR(10) DEFAULT 'x', KEY ka (a), UNIQUE KEY ub (b))",
    "CREATE TABLE u (id INT PRIMARY KEY, a INT, b INT, c VARCHAR(10) DEFAULT 'x', KEY ka (a), UNIQUE KEY ub (b))",
    "CREATE TABLE p (id INT PRIMARY KEY, d INT) PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN (10), "
    "PARTITION p1 VALUES LESS THAN (20), PARTITION pmax VALUES LESS THAN MAXVALUE)",
    "CREATE TABLE par (id INT PRIMARY KEY)",
    "CREATE TABLE ch (id INT PRIMARY KEY, pid INT, KEY kp (pid))",
    "CREATE VIEW v0 AS SELECT id FROM t",
    "CREATE SEQUENCE sq0",
    "INSERT INTO t VALUES (1, 1, 1, 'in t'), (2, 2, 2, 'in t')",
    "INSERT INTO u VALUES (7, 7, 7, 'in u')",
    "INSERT INTO p VALUES (1, 1), (15, 15), (30, 30)",
]

FORMS = [
    # not idempotent: a second run succeeds and changes the schema again
    "RENAME TABLE t TO tmp, u TO t, tmp TO u",
    "ALTER TABLE ch ADD FOREIGN KEY (pid) REFERENCES par (id)",
    "ALTER TABLE t ADD CHECK (a >= 0)",
    "ALTER TABLE t CHANGE a b INT, CHANGE b a INT",  # a swap of two columns (MySQL renames at once)
    # a second run fails with a code that is not "already there"
    "ALTER TABLE t RENAME INDEX ka TO ka2",
    "ALTER TABLE p DROP PARTITION p1",
    "ALTER TABLE p REORGANIZE PARTITION p0 INTO (PARTITION p0a VALUES LESS THAN (5), PARTITION p0b VALUES LESS THAN (10))",
    "ALTER TABLE ch ADD CONSTRAINT fk1 FOREIGN KEY (pid) REFERENCES par (id)",
    "DROP VIEW v0",
    "DROP SEQUENCE sq0",
    "CREATE TRIGGER tr BEFORE INSERT ON t FOR EACH ROW SET NEW.a = 1",
    # "already there" (the error list) or idempotent: these went on before too
    "ALTER TABLE t ADD COLUMN e INT, DROP COLUMN c",
    "ALTER TABLE t DROP COLUMN a, ADD COLUMN a INT",
    "RENAME TABLE t TO t2, t2 TO t3",
    "TRUNCATE TABLE t",
]


def dump(conn: Any, db: str) -> dict[str, Any]:
    """What a DDL can change in ``db``: each table's definition and rows, views, sequences, triggers."""
    out: dict[str, Any] = {}
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                    "ORDER BY 1", (db,))
        for name, kind in cur.fetchall():
            q = f"`{db}`.`{name}`"
            if kind == "BASE TABLE":
                cur.execute(f"SHOW CREATE TABLE {q}")
                out[name] = cur.fetchone()[1]
                cur.execute(f"SELECT * FROM {q} ORDER BY 1")
                out[name + " rows"] = cur.fetchall()
            elif kind == "VIEW":
                cur.execute("SELECT VIEW_DEFINITION FROM information_schema.VIEWS WHERE TABLE_SCHEMA = %s AND "
                            "TABLE_NAME = %s", (db, name))
                out[name] = cur.fetchone()[0].replace(f"`{db}`.", "")
            else:
                out[name] = kind
        cur.execute("SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = %s "
                    "ORDER BY 1", (db,))
        out["triggers"] = cur.fetchall()
    return out


def test_every_ddl_form_replayed_after_a_crash_leaves_one_run(tmp_path: Path, target: MariaDBInstance) -> None:
    from capturer import config
    from capturer.model import Ddl, Position, Txn
    from senders import CATALOG
    from senders.mysql.sender import MySQLSender

    p = tmp_path / "senderConfig.cfg"
    p.write_text(f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\n"
                 "threadnum=2\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    conn = target.connect()
    conn.autocommit(True)
    wrong: list[str] = []
    for i, sql in enumerate(FORMS):
        ref, rep = f"ref{i}", f"rep{i}"
        with conn.cursor() as cur:
            for db in (ref, rep):
                cur.execute(f"CREATE DATABASE {db}")
                cur.execute(f"USE {db}")
                for s in SETUP:
                    cur.execute(s)
            cur.execute(f"USE {ref}")
            cur.execute(sql)  # one run: what the target must end as
        txn = Txn("r1", (i + 1) << 18, Position("bin.000001", 100 + i), ddl=Ddl(rep, sql, "", rep, 0))
        name = f"mysql{i}"
        failpoints.set_rules("mysql.ddl=eio@1")  # the crash: the DDL committed, its position not written
        try:
            s = MySQLSender(name, sc.options)
            s.open()
            try:
                s.resume_key()
                with pytest.raises(Exception, match="injected at failpoint mysql.ddl"):
                    s.send([txn])
            finally:
                s.close()
        finally:
            failpoints.set_rules("")
        again = MySQLSender(name, sc.options)  # the restart: the DDL is handed again
        again.open()
        try:
            assert again.resume_key() is None
            again.send([txn])
            assert again.resume_key() == (txn.commit_ts, "r1", 0)
        except Exception as exc:
            wrong.append(f"{sql}: the replay failed: {exc}")
            continue
        finally:
            again.close()
        want, got = dump(conn, ref), dump(conn, rep)
        if got != want:
            diff = {k: (want.get(k), got.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
            wrong.append(f"{sql}: the target differs from one run: {diff}")
    conn.close()
    assert not wrong, "\n".join(wrong)


def test_a_ddl_that_never_ran_before_the_crash_runs_at_the_replay(tmp_path: Path, target: MariaDBInstance) -> None:
    """The other side: the intent written, the crash before the DDL ran (or a retried one that
    never reached the target): the replay finds the schema it started from, and runs it."""
    from capturer import config
    from capturer.model import Ddl, Position, Txn
    from senders import CATALOG
    from senders.mysql import ddlstate
    from senders.mysql.sender import MySQLSender

    p = tmp_path / "senderConfig.cfg"
    p.write_text(f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    target.execute("CREATE DATABASE nr", "CREATE TABLE nr.t (id INT PRIMARY KEY)", "CREATE TABLE nr.u (id INT PRIMARY KEY)",
                   "INSERT INTO nr.t VALUES (1)", "INSERT INTO nr.u VALUES (2)")
    sql = "RENAME TABLE t TO tmp, u TO t, tmp TO u"
    txn = Txn("r1", 1 << 18, Position("bin.000001", 100), ddl=Ddl("nr", sql, "", "nr", 0))
    s = MySQLSender("mysql", sc.options)
    s.open()
    try:
        # the intent as the crashed run wrote it, just before its DDL
        c = s.workers[0].connect()
        with c.cursor() as cur:
            state = s._schema.state(cur, ddlstate.scope(txn.ddl, sql, "nr", mapped=False))
            cur.execute(ddlstate.write_sql("_capturer"), ("mysql", ddlstate.key_text((1 << 18, "r1", 0)),
                                                          ddlstate.stmt_digest(sql), state))
        c.commit()
        s.send([txn])
        assert s.counters["ddl_replays_skipped"] == 0
    finally:
        s.close()
    c = target.connect()
    with c.cursor() as cur:
        cur.execute("SELECT id FROM nr.t")
        assert cur.fetchall() == ((2,),)  # swapped once
    c.close()


def test_a_refused_ddl_runs_again_once_the_target_is_mended(tmp_path: Path, target: MariaDBInstance) -> None:
    """A DDL the target refuses stops the sender; an operator mends the target (creates what it
    lacked) and starts it again: the DDL runs then. Its intent row went with the refusal: the
    mended schema (another state than the one the DDL started from) is not taken for its effect."""
    from capturer import config
    from capturer.errors import SinkError
    from capturer.model import Ddl, Position, Txn
    from senders import CATALOG
    from senders.mysql.sender import MySQLSender

    p = tmp_path / "senderConfig.cfg"
    p.write_text(f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    target.execute("CREATE DATABASE md", "CREATE TABLE md.t (id INT PRIMARY KEY)")
    sql = "CREATE VIEW vv AS SELECT id FROM missing"
    txn = Txn("r1", 1 << 18, Position("bin.000001", 100), ddl=Ddl("md", sql, "", "md", 0))
    s = MySQLSender("mysql", sc.options)
    s.open()
    try:
        with pytest.raises(SinkError, match="1146") as e:
            s.send([txn])
        assert not e.value.retriable
    finally:
        s.close()
    target.execute("CREATE TABLE md.missing (id INT PRIMARY KEY)", "INSERT INTO md.missing VALUES (5)")
    s = MySQLSender("mysql", sc.options)
    s.open()
    try:
        assert s.resume_key() is None
        s.send([txn])
    finally:
        s.close()
    c = target.connect()
    with c.cursor() as cur:
        cur.execute("SELECT id FROM md.vv")
        assert cur.fetchall() == ((5,),)
    c.close()


def test_a_swap_replayed_after_a_crash_without_the_process_privilege(tmp_path: Path, target: MariaDBInstance) -> None:
    """A sender's user without PROCESS cannot read InnoDB's table ids; a RENAME swap of two tables
    of one definition is then told by the tables' CREATE_TIME (a RENAME sets it, to the second):
    replayed after a crash, it is not run again (before: swapped back)."""
    from helpers import wait_for

    from capturer import config
    from capturer.model import Ddl, Position, Txn
    from senders import CATALOG
    from senders.mysql.sender import MySQLSender

    target.execute("CREATE USER 'lim'@'127.0.0.1' IDENTIFIED BY 'pw'", "GRANT ALL ON `sw`.* TO 'lim'@'127.0.0.1'",
                   "GRANT ALL ON `_capturer`.* TO 'lim'@'127.0.0.1'", "CREATE DATABASE sw",
                   "CREATE TABLE sw.t (id INT PRIMARY KEY, a INT)", "CREATE TABLE sw.u (id INT PRIMARY KEY, a INT)",
                   "INSERT INTO sw.t VALUES (1, 1)", "INSERT INTO sw.u VALUES (2, 2)")
    c = target.connect()

    def later() -> bool:  # the server's clock past the second the tables were made in
        with c.cursor() as cur:
            cur.execute("SELECT NOW() > MAX(CREATE_TIME) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'sw'")
            return bool(cur.fetchone()[0])

    wait_for(later, 30, "a second after the tables' creation")
    p = tmp_path / "senderConfig.cfg"
    p.write_text(f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=lim\npassword=pw\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    sql = "RENAME TABLE t TO tmp, u TO t, tmp TO u"
    txn = Txn("r1", 1 << 18, Position("bin.000001", 100), ddl=Ddl("sw", sql, "", "sw", 0))
    failpoints.set_rules("mysql.ddl=eio@1")
    try:
        s = MySQLSender("mysql", sc.options)
        s.open()
        try:
            with pytest.raises(Exception, match="injected at failpoint mysql.ddl"):
                s.send([txn])
            assert s._schema.ids_query is None  # (no PROCESS: the ids are not read)
        finally:
            s.close()
    finally:
        failpoints.set_rules("")
    s = MySQLSender("mysql", sc.options)
    s.open()
    try:
        assert s.resume_key() is None
        s.send([txn])
        assert s.counters["ddl_replays_skipped"] == 1
    finally:
        s.close()
    with c.cursor() as cur:
        cur.execute("SELECT id FROM sw.t")
        assert cur.fetchall() == ((2,),)  # swapped once
    c.close()


def test_a_ddl_that_timed_out_on_a_lock_runs_at_the_retry(tmp_path: Path, target: MariaDBInstance) -> None:
    """A DDL that waited for a lock at the target and gave up (1205: retried) did not run; its
    intent is no evidence of that run. Another session (an operator, another sender writing the
    same target) changes the table's definition before the retry: the retry still runs the DDL
    (before: the changed schema was taken for the DDL's effect, the DDL skipped, the column it
    adds missing at the target)."""
    from capturer import config
    from capturer.errors import SinkError
    from capturer.model import Ddl, Position, Txn
    from senders import CATALOG
    from senders.mysql.sender import MySQLSender

    p = tmp_path / "senderConfig.cfg"
    p.write_text(f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    target.execute("CREATE DATABASE lk", "CREATE TABLE lk.t (id INT PRIMARY KEY, a INT)", "INSERT INTO lk.t VALUES (1, 1)")
    sql = "ALTER TABLE t ADD COLUMN b INT"
    txn = Txn("r1", 1 << 18, Position("bin.000001", 100), ddl=Ddl("lk", sql, "t", "lk", 0))
    other = target.connect()
    other.autocommit(True)
    s = MySQLSender("mysql", sc.options)
    s.open()
    try:
        for w in s.workers:  # (the lock wait given up after 1 s, not the server's default)
            with w.connect().cursor() as cur:
                cur.execute("SET SESSION lock_wait_timeout = 1")
        with other.cursor() as cur:
            cur.execute("LOCK TABLES lk.t WRITE")
        with pytest.raises(SinkError, match="1205") as e:
            s.send([txn])
        assert e.value.retriable
    finally:
        s.close()
    with other.cursor() as cur:  # the definition changed by the other session, then the lock let go
        cur.execute("ALTER TABLE lk.t COMMENT = 'changed by another session'")
        cur.execute("UNLOCK TABLES")
    other.close()
    s = MySQLSender("mysql", sc.options)  # the retry
    s.open()
    try:
        s.send([txn])
        assert s.counters["ddl_replays_skipped"] == 0
    finally:
        s.close()
    c = target.connect()
    with c.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'lk' AND TABLE_NAME = 't' "
                    "ORDER BY ORDINAL_POSITION")
        assert [r[0] for r in cur.fetchall()] == ["id", "a", "b"]
    c.close()
