"""A PostgreSQL region with hostile identifiers and values through every sender: the file,
a MySQL target, Kafka and a Delta lake (``table_format=delta``; skipped where the Delta
runtime cannot run here, as in test_spark_delta.py).

Schema, table and column names hold spaces, double quotes, dots, commas, semicolons,
backquotes, upper case, non-ASCII and reserved words; values hold quotes, backslashes,
newlines, emoji and bytea that is not UTF-8. Rows are copied by the snapshot and then
streamed with a primary-key change, a rollback, deletes and, mid-load, ALTER TABLE ADD
COLUMN with defaults (also one renamed before the capturer reads it), DROP COLUMN,
RENAME COLUMN and RENAME TO. ``verify`` must find every sink equal to the source, and
the MySQL target is also compared by hand. The region synthesizes MySQL DDL from
pgoutput's relation messages, so every one of those identifiers passes through that DDL
and each sender's reading of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, shared_broker, wait_for

from capturer.model import parse_lsn
from devtools.local_mariadb import MariaDBInstance
from devtools.local_postgres import PostgresInstance
from devtools.pg_workload import mysql_rows, pg_rows, qpg
from integration.test_postgresql import config, covered, pg_region
from integration.test_type_edges import _lake, _stopped_cleanly
from integration.test_verify import by_table, run_verify

pytestmark = pytest.mark.integration

# (MySQL takes any character of the BMP but NUL in a quoted name, and none ending in a space)
SCHEMA = 'Sch "q".d,c;`ü'
TABLE = 'Tab le."x",;`Ä'
ITEMS, ITEMS_RENAMED = "Order Items", 'Order "Lines".v2'
KEYLESS = 'key.less "T"'  # (REPLICA IDENTITY FULL, no key: the MySQL sender keeps its progress by name)
KEY, SEL, ABC, TICK, UNI, ORDER, UPPER, RAW = "Key.Col", 'sel"ect', "a,b;c", "tick`q", "Ünï", "order", "UPPER", "raw data"
TICK2 = "tick`q re.named"
T = f"{qpg(SCHEMA)}.{qpg(TABLE)}"
ITEMS_Q = f"{qpg(SCHEMA)}.{qpg(ITEMS)}"
KL = f"{qpg(SCHEMA)}.{qpg(KEYLESS)}"
TEXTS = ["q'uote \"dq\" `bt`", "back\\slash \\n not a newline", "new\nline\ttab\r\n", "emoji 😀 ünï",
         "", "semi; -- comment /* c */", "%s %% {}"]
RAWS = [b"\xff\xfe\x00\x80", b"", b"\xc3\x28 not utf-8", b"\\x00'\""]


def _insert(c: object, ids: range) -> None:
    for i in ids:
        c.execute(f"INSERT INTO {T} ({qpg(KEY)}, {qpg(SEL)}, {qpg(ABC)}, {qpg(TICK)}, {qpg(UNI)}, {qpg(ORDER)}, "  # type: ignore[attr-defined]
                  f"{qpg(UPPER)}, {qpg(RAW)}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                  (i, TEXTS[i % 7], TEXTS[(i + 1) % 7], TEXTS[(i + 2) % 7], TEXTS[(i + 3) % 7],
                   None if i % 4 == 0 else TEXTS[(i + 4) % 7], i * 10, RAWS[i % 4]))
        c.execute(f"INSERT INTO {ITEMS_Q} VALUES (%s, 1, %s), (%s, 2, %s)", (i, i, i, -i))  # type: ignore[attr-defined]


def _copied(tmp: Path) -> int:
    """The snapshot's rows in the file."""
    path = tmp / "out" / "changes.jsonl"
    return path.read_text().count('"op": "read"') if path.exists() else 0


def _equal(cfg: Path, *senders: str) -> dict[tuple[str, str], dict[str, Any]]:
    """``verify`` of these senders: every table equal (else what differs, each example whole)."""
    args = [a for s in senders for a in ("--sender", s)]
    code, report = run_verify(cfg, "--wait", "60", *args)
    tables = by_table(report)
    bad = {k: v for k, v in tables.items() if v["status"] != "equal"}
    assert code == 0 and not bad, "\n".join(
        f"{s}/{t}: {v['status']} ({v['missing']} missing, {v['extra']} extra, {v['different']} different) "
        f"{v.get('note') or ''}\n    " + "\n    ".join(e[:400] for e in v["examples"][:3])
        for (s, t), v in bad.items()) or json.dumps(report, default=str)[:4000]
    assert {s for s, _ in tables} == set(senders), sorted(tables)
    return tables


def test_hostile_postgresql_reaches_every_sender_equal(tmp_path: Path) -> None:
    lake = _lake("delta")
    pg = PostgresInstance().start()
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    broker = shared_broker()
    try:
        with pg.connect() as c:
            c.execute(f"CREATE SCHEMA {qpg(SCHEMA)}")
            c.execute(f"CREATE TABLE {T} ({qpg(KEY)} int PRIMARY KEY, {qpg(SEL)} text, {qpg(ABC)} varchar(60), "
                      f"{qpg(TICK)} text, {qpg(UNI)} text, {qpg(ORDER)} text, {qpg(UPPER)} bigint, {qpg(RAW)} bytea)")
            c.execute(f"CREATE TABLE {ITEMS_Q} ({qpg('Id')} int, {qpg('line no')} int, qty int, "
                      f"PRIMARY KEY ({qpg('Id')}, {qpg('line no')}))")
            _insert(c, range(1, 5))
            c.execute(f'CREATE TABLE {KL} ("a b" int, "V" text)')
            c.execute(f"ALTER TABLE {KL} REPLICA IDENTITY FULL")
            c.execute(f"INSERT INTO {KL} VALUES (1, 'x'), (1, 'x'), (2, 'y')")
        senders = ("[global]\ntype=local,mysql,kafka,spark\n"
                   f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=2\n"
                   f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
                   f"[spark]\nwarehouse={tmp_path / 'wh'}\n{lake}batch_interval=1\nbatch_rows=500\n"
                   "compaction_interval=0\nmaster=local[1]\nconf.spark.driver.memory=512m\n"
                   "conf.spark.sql.shuffle.partitions=2\n")
        cfg = config(tmp_path, pg_region("pg", pg, "snapshot=initial\n"), senders)
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        try:
            cap.wait_ready()
            # (the file has the copy: the others, Spark's MERGEs above all, catch up while the load goes on)
            wait_for(lambda: _copied(tmp_path) == 15, 120, "the snapshot of the first rows in the file")
            with pg.connect() as c:
                _insert(c, range(5, 9))
                c.execute(f"UPDATE {T} SET {qpg(KEY)} = 100 WHERE {qpg(KEY)} = 1")  # a key change
                c.execute(f"UPDATE {ITEMS_Q} SET {qpg('line no')} = 3 WHERE {qpg('Id')} = 2 AND {qpg('line no')} = 2")
                c.execute(f"UPDATE {T} SET {qpg(SEL)} = %s, {qpg(RAW)} = %s WHERE {qpg(KEY)} = 2",
                          ("upd'ated\\ \"x\" 😀\n", b"\x80\x81"))
                c.execute(f"DELETE FROM {T} WHERE {qpg(KEY)} = 3")
                c.execute(f"DELETE FROM {ITEMS_Q} WHERE {qpg('Id')} = 3")
                c.execute(f"INSERT INTO {KL} VALUES (3, 'z'), (3, 'z')")
                c.execute(f"DELETE FROM {KL} WHERE ctid = (SELECT min(ctid) FROM {KL} WHERE \"a b\" = 3)")
                c.execute(f"UPDATE {KL} SET \"V\" = 'y''\\' WHERE \"a b\" = 2")
            with pg.connect() as c, c.transaction(force_rollback=True):  # a rollback: none of it may arrive
                c.execute(f"DELETE FROM {T} WHERE {qpg(KEY)} = 4")
                c.execute(f"INSERT INTO {T} ({qpg(KEY)}, {qpg(SEL)}) VALUES (50, 'rolled back')")
                c.execute(f"UPDATE {ITEMS_Q} SET qty = 999")
            with pg.connect() as c:
                # the rows there get the defaults without a logged change
                c.execute(f"ALTER TABLE {T} ADD COLUMN {qpg('new col;2')} int DEFAULT 7")
                c.execute(f"ALTER TABLE {T} ADD COLUMN {qpg('Dflt Tëxt')} text DEFAULT 'it''s \\ \"d\" `b`;'")
                c.execute(f"ALTER TABLE {T} ADD COLUMN {qpg('Bläh;b')} bytea DEFAULT '\\xff00'")
                _insert(c, range(9, 11))
                c.execute(f"ALTER TABLE {T} DROP COLUMN {qpg(ABC)}")
                c.execute(f"ALTER TABLE {T} RENAME COLUMN {qpg(TICK)} TO {qpg(TICK2)}")
                c.execute(f"UPDATE {T} SET {qpg(TICK2)} = 'renamed ''ok''', {qpg('new col;2')} = 8 "
                          f"WHERE {qpg(KEY)} = 6")
                # a column added with a default and renamed before the capturer reads the change after it
                c.execute(f"ALTER TABLE {ITEMS_Q} ADD COLUMN {qpg('Later')} int DEFAULT 5")
                c.execute(f"INSERT INTO {ITEMS_Q} VALUES (20, 1, 20, 21)")
                c.execute(f"ALTER TABLE {ITEMS_Q} RENAME COLUMN {qpg('Later')} TO {qpg('Later, renamed')}")
                c.execute(f"ALTER TABLE {ITEMS_Q} RENAME TO {qpg(ITEMS_RENAMED)}")
                c.execute(f"INSERT INTO {qpg(SCHEMA)}.{qpg(ITEMS_RENAMED)} VALUES (21, 1, 21, 22)")
                c.execute(f"DELETE FROM {qpg(SCHEMA)}.{qpg(ITEMS_RENAMED)} WHERE {qpg('Id')} = 4")
                c.execute(f"DELETE FROM {T} WHERE {qpg(KEY)} = 8")
                end = parse_lsn(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
            wait_for(lambda: covered(tmp_path, "pg", end), 180, "every sender to have every change")
            # the file, the target, Kafka and the lake, the rows there before each ALTER untouched since (verify
            # with the capturer running: nothing changes meanwhile); Kafka's last message of such a row has the
            # columns of then, and the renamed table's older rows are in the old name's topic: verify brings them
            # through the DDL of the schema topic (before 2026-11-29 they were "different" and "missing")
            tables = _equal(cfg, "local", "mysql", "kafka", "spark")
            rows = {f"{SCHEMA}.{TABLE}": 8, f"{SCHEMA}.{ITEMS_RENAMED}": 18, f"{SCHEMA}.{KEYLESS}": 4}
            assert {t for _, t in tables} == set(rows), sorted(tables)
            assert all(v["rows"] == rows[t] for (_, t), v in tables.items()), {k: v["rows"] for k, v in tables.items()}
            for table in (TABLE, ITEMS_RENAMED, KEYLESS):  # the target by hand, every value
                want, got = pg_rows(pg, SCHEMA, table), mysql_rows(target, SCHEMA, table)
                assert got == want, (table, sorted(set(want) - set(got))[:3], sorted(set(got) - set(want))[:3])
            conn = target.connect()
            try:
                with conn.cursor() as cur:  # the keyless table's progress under a key no other table can have
                    cur.execute("SELECT tbl FROM _capturer.applied")
                    assert [r[0] for r in cur.fetchall()] == ["`Sch \"q\".d,c;``ü`.`key.less \"T\"`"]
            finally:
                conn.close()
            # every row changed once more: Kafka again, each key's last message now in the current columns
            with pg.connect() as c:
                c.execute(f"UPDATE {T} SET {qpg(UPPER)} = {qpg(UPPER)} + 1")
                c.execute(f"UPDATE {qpg(SCHEMA)}.{qpg(ITEMS_RENAMED)} SET qty = qty + 1")
                end = parse_lsn(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
            wait_for(lambda: covered(tmp_path, "pg", end), 180, "every sender to have every change")
        finally:
            _stopped_cleanly(cap, tmp_path)
        tables = _equal(cfg, "kafka")
        assert len(tables) == 3 and all(v["rows"] == rows[t] for (_, t), v in tables.items())
        assert "rolled back" not in (tmp_path / "out" / "changes.jsonl").read_text()
    finally:
        broker.kill()
        target.stop()
        pg.destroy()


def test_columns_differing_only_in_case_stop_the_mysql_sender_naming_them(tmp_path: Path) -> None:
    """PostgreSQL keeps ``"ID"`` and ``"id"`` apart; a MySQL target compares column names
    case-insensitively. Before: its CREATE TABLE failed with "Duplicate column name", which the
    sender took for a statement applied before and went on, and the rows then failed with an
    error about another statement. Now the sender stops (the capturer with it, exit 1) with an
    error naming the table and both columns; nothing is merged into one column."""
    pg = PostgresInstance().start()
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    try:
        with pg.connect() as c:
            c.execute('CREATE TABLE public."Mixed `Case.x" ("ID" int PRIMARY KEY, "id" int, "Ünï" text, "üNï" text)')
            c.execute('INSERT INTO public."Mixed `Case.x" VALUES (1, 2, %s, %s)', ("upper", "lower"))
        senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=2\n")
        cfg = config(tmp_path, pg_region("pg", pg, "snapshot=initial\n"), senders)
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        try:
            wait_for(lambda: cap.proc is not None and cap.proc.poll() is not None, 120, "the capturer to stop")
        finally:
            code = cap.stop()
        log = (tmp_path / "capturer.log").read_text(errors="replace")
        assert code == 1, log[-3000:]
        stop = [ln for ln in log.splitlines() if "stopping: sender mysql" in ln]
        assert stop and "`public`.`Mixed ``Case.x`" in stop[0] and "`ID`" in stop[0] and "`id`" in stop[0] \
            and "differ only in case" in stop[0], log[-3000:]
        conn = target.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.columns WHERE table_name = 'Mixed `Case.x'")
                assert cur.fetchone()[0] == 0  # no table where the two became one
        finally:
            conn.close()
    finally:
        target.stop()
        pg.destroy()
