"""Values at the edges of every MySQL/MariaDB type, through every sender (issue 49 item 4).

A MariaDB source under a permissive ``sql_mode`` holds zero dates and zero-in-date
values, datetimes before 1970 and in the year 9999, ``TIME`` at +/-838:59:59 with
fractions, ``DECIMAL(65,30)`` at its limits, ``BIT(64)`` all ones, ``FLOAT``/``DOUBLE``
at their limits and negative zero, ``ENUM``/``SET`` with odd labels, latin1 text and
binary columns holding bytes that are not UTF-8, ``JSON`` with big numbers and deep
nesting. Half the rows exist before the capturer starts (the snapshot reads them), the
other half are written after (the binlog carries them), then every row is updated and
one deleted. The file, the MySQL target, Kafka and the lake must each equal the source
(``verify``), and the target and the file are also compared by hand, value by value.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, checkpoint_covers, shared_broker, start_servers, wait_for

from devtools.local_mariadb import MariaDBInstance, free_port
from integration.test_verify import by_table, run_verify, write_config

pytestmark = pytest.mark.integration

EDGES = """CREATE TABLE d.edges (
    id INT PRIMARY KEY,
    dz DATE, dzi DATE, dtz DATETIME, dtzi DATETIME(3), dt_old DATETIME(6), dt_1969 DATETIME, dt_max DATETIME(6),
    ts_min TIMESTAMP(6) NULL, ts_max TIMESTAMP(6) NULL,
    t_max TIME(6), t_min TIME(6), t_neg_frac TIME(6), t0 TIME,
    dec_max DECIMAL(65,30), dec_min DECIMAL(65,30), dec_tiny DECIMAL(65,30), dec_int DECIMAL(65,0),
    b64 BIT(64), b1 BIT(1),
    f FLOAT, fneg0 FLOAT, dmax DOUBLE, dmin DOUBLE, dneg0 DOUBLE,
    u64 BIGINT UNSIGNED, i64 BIGINT, y YEAR,
    e ENUM(' ', 'a,b', 'É', 'x''y'), s SET('q r', 'é', 'z'),
    l1 VARCHAR(20) CHARACTER SET latin1, bin VARBINARY(20), blb BLOB, ch BINARY(4),
    j JSON, tx TEXT CHARACTER SET utf8mb4
) DEFAULT CHARSET=utf8mb4"""

DEEP = "[" * 30 + "1" + "]" * 30  # (MariaDB's JSON_VALID takes at most 32 levels)
ROW = ("({id}, '0000-00-00', '2024-00-10', '0000-00-00 00:00:00', '2024-02-00 10:11:12.345', "
       "'1000-01-01 00:00:00.000001', '1969-12-31 23:59:59', '9999-12-31 23:59:59.999999', "
       "'1970-01-01 00:00:01.000000', '2038-01-19 03:14:07.999999', "
       "'838:59:59.000000', '-838:59:59.000000', '-00:00:00.000001', '00:00:00', "
       "'99999999999999999999999999999999999.999999999999999999999999999999', "
       "'-99999999999999999999999999999999999.999999999999999999999999999999', "
       "'0.000000000000000000000000000001', '99999999999999999999999999999999999999999999999999999999999999999', "
       "b'1111111111111111111111111111111111111111111111111111111111111111', b'1', "
       "3.40282e38, -0.0, 1.7976931348623157e308, 4.9406564584124654e-324, -0.0, "
       "18446744073709551615, -9223372036854775808, {year}, "
       "{enum}, {set}, "
       "0x{latin1}, 0x{binary}, 0x00ff80fe, 0x41, "
       "'{json}', {text})")


def _row(i: int) -> str:
    # 'not a label' is stored as '' (index 0: the error value a permissive sql_mode stores)
    enums = ["'not a label'", "' '", "'a,b'", "'É'", "'x''y'"]
    sets = ["''", "'q r'", "'é,z'", "'q r,é,z'", "'z'"]
    latin1 = ["e9e8", "ff", "80", "c0ffee", "41"][i % 5]  # latin1 bytes (é è, ÿ, €-slot, ...)
    binary = ["fffe00", "c328", "80", "00", "e282"][i % 5]  # not UTF-8
    js = json.dumps({"big": 12345678901234567890123456789, "neg": -1e-300, "deep": "D", "s": "é😀",
                     "n": None, "i": i}).replace('"D"', DEEP).replace("'", "''")
    text = ["'é😀'", "''", "'a\\\\b\\'c'", "NULL", "'\\t\\n'"][i % 5]
    return ROW.format(id=i, year=[1901, 2155, 0, 2000, 1999][i % 5], enum=enums[i % 5], set=sets[i % 5],
                      latin1=latin1, binary=binary, json=js, text=text)


def _snapshot_done(tmp: Path) -> bool:
    cp = tmp / "checkpoint.json"
    if not cp.exists():
        return False
    d = json.loads(cp.read_text())
    return d.get("commit_ts", 0) > 0 and not any(x.get("snapshot") for x in d["regions"].values())


def _source_rows(m: MariaDBInstance) -> int:
    conn = m.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM d.edges")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def _lake(table_format: str) -> str:
    """The [spark] section's format keys: the Parquet changelog (Arrow writer), or Delta tables kept by MERGE
    (skipped where the Delta runtime cannot run here, as in test_spark_delta.py)."""
    if table_format == "changelog":
        return "writer=arrow\n"
    from senders.spark import deltajars

    pytest.importorskip("deltalake")
    if deltajars.incompatible():
        pytest.skip(deltajars.incompatible())
    return "table_format=delta\n"


@pytest.mark.parametrize("snapshot_driver,table_format", [("mariadb", "changelog"), ("mariadb", "delta")])
def test_type_edges_reach_every_sender_equal(tmp_path: Path, snapshot_driver: str, table_format: str) -> None:
    lake = _lake(table_format)
    (m,) = start_servers(tmp_path, 1)
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    broker = shared_broker()
    try:
        m.execute("SET GLOBAL sql_mode = ''", "CREATE DATABASE d", EDGES)
        m.execute("SET SESSION sql_mode = ''", "INSERT INTO d.edges VALUES " + ", ".join(_row(i) for i in range(5)),
                  # a BINARY(n) key whose values end in zero bytes (the binlog leaves them out)
                  "CREATE TABLE d.bk (id BINARY(4) PRIMARY KEY, v INT)",
                  "INSERT INTO d.bk VALUES (0x41000000, 1), (0x4200, 2), (0x00, 3), (0x41424344, 4)")
        (tmp_path / "senderConfig.cfg").write_text(
            "[global]\ntype=local,mysql,kafka,spark\n"
            f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=2\n"
            f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
            f"[spark]\nwarehouse={tmp_path / 'wh'}\n{lake}batch_interval=1\nbatch_rows=500\n"
            "compaction_interval=0\nmaster=local[1]\n")
        region = (f"\n[region:r1]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\npassword=capturer\n"
                  f"server_id=800\nheartbeat_ms=200\nsnapshot=initial\nsnapshot_driver={snapshot_driver}\n")
        cfg = write_config(tmp_path, region, free_port())
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        try:
            cap.wait_ready()
            wait_for(lambda: _snapshot_done(tmp_path), 120, "the snapshot of the first rows")
            m.execute("SET SESSION sql_mode = ''",
                      "INSERT INTO d.edges VALUES " + ", ".join(_row(i) for i in range(5, 10)),
                      # every row changed (the before images carry the edges too), one deleted
                      "UPDATE d.edges SET tx = CONCAT(COALESCE(tx, ''), '+'), i64 = i64 + id",
                      "DELETE FROM d.edges WHERE id = 7",
                      "INSERT INTO d.bk VALUES (0x43000000, 5), (0x4400, 6), (0x45, 7)",
                      "UPDATE d.bk SET v = v + 10", "DELETE FROM d.bk WHERE id IN (0x41000000, 0x42000000, 0x00000000)",
                      "UPDATE d.bk SET id = 0x46 WHERE id = 0x43000000")
            assert _source_rows(m) == 9
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 120, "every sender to have every change")
        finally:
            _stopped_cleanly(cap, tmp_path)
        tables = _every_sink_equal(cfg)
        assert {t for _, t in tables} == {"d.edges", "d.bk"}
        rows = {"d.edges": 9, "d.bk": 4}
        assert all(v["rows"] == rows[t] for (_, t), v in tables.items()), {k: v["rows"] for k, v in tables.items()}
        _target_equals_source(m, target)
    finally:
        broker.kill()
        for srv in (m, target):
            srv.stop()


def _stopped_cleanly(cap: CapturerProcess, tmp: Path) -> None:
    log = (tmp / "capturer.log").read_text(errors="replace")
    assert cap.stop() == 0, log[-4000:]
    assert "Traceback" not in log, log[-4000:]


def _every_sink_equal(cfg: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """``verify`` of all four senders: every table equal (else each sink's differing columns)."""
    code, report = run_verify(cfg, "--wait", "30")
    tables = by_table(report)
    bad = {"/".join(k): v for k, v in tables.items() if v["status"] != "equal"}
    assert code == 0 and not bad, _differences(bad) or json.dumps(report, indent=1, default=str)[:6000]
    assert {s for s, _ in tables} == {"local", "mysql", "kafka", "spark"}
    return tables


def _differences(bad: dict[str, Any]) -> str:
    """Each sink's differing columns, once each: ``column: source value -> sink value``."""
    out = []
    for name, t in bad.items():
        cols: dict[str, str] = {}
        for e in t["examples"]:
            for m in re.finditer(r"(\w+): source (.*?), sink (.*?)(?=; \w+: source |$)", e.split("): ", 1)[-1]):
                cols.setdefault(m.group(1), f"{m.group(2)[:80]} -> {m.group(3)[:80]}")
        out.append(f"{name} ({t['status']}, {t['missing']} missing, {t['extra']} extra, {t['different']} different): "
                   + "; ".join(f"{c}: {v}" for c, v in cols.items()))
    return "\n".join(out)


def _select(srv: MariaDBInstance) -> list[tuple[Any, ...]]:
    conn = srv.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute("SELECT * FROM d.edges ORDER BY id")
            return list(cur.fetchall())
    finally:
        conn.close()


def _mapped(v: Any) -> Any:
    """The documented mapping (docs/limits.md): a date no calendar has (pymysql gives it as its text: a
    zero date, a zero month or day) arrives as NULL."""
    if isinstance(v, str) and re.match(r"\d{4}-\d{2}-\d{2}", v):
        try:
            dt.date(int(v[0:4]), int(v[5:7]), int(v[8:10]))
        except ValueError:
            return None
    return v


def _target_equals_source(m: MariaDBInstance, target: MariaDBInstance) -> None:
    """The target, value by value as the server returns it (the same client on both sides)."""
    want, got = _select(m), _select(target)
    assert len(want) == len(got) == 9
    diffs = [(w[0], i, w[i], g[i]) for w, g in zip(want, got) for i in range(len(w)) if _mapped(w[i]) != g[i]]
    assert not diffs, diffs[:12]
    assert sum(w[i] != g[i] for w, g in zip(want, got) for i in range(len(w))) == 9 * 4  # (the 4 such columns)


PG_EDGES = [
    "CREATE TYPE mood AS ENUM ('sad', 'o k', 'x''y')",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    """CREATE TABLE public.pedges (
        id int PRIMARY KEY, n numeric, n52 numeric(5,2), big numeric(60,30),
        ts timestamp, tstz timestamptz, d date, t time(6), i interval,
        f8 float8, f4 real, arr int[], tarr text[], arr2 int[][],
        dom posint, en mood, r int4range, tr tsrange,
        b bytea, j jsonb, u uuid, bv bit varying(70), c char(5), tx text)""",
]
PG_ROWS = [
    "(1, 'NaN', 999.99, '123456789012345678901234567890.123456789012345678901234567891', 'infinity', '-infinity', "
    "'infinity', '24:00:00', 'P1Y2M3DT4H5M6.000007S', 'NaN', 'Infinity', '{1,NULL,3}', '{\"a,b\",\"c\\\"d\",NULL}', "
    "'{{1,2},{3,4}}', 1, 'o k', '[1,5)', '[2020-01-01,2020-02-01)', '\\xfffe00', "
    "'{\"big\": 123456789012345678901234567890, \"d\": [[[[[[[[[[1]]]]]]]]]]}', "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', B'1', 'ab', E'é\\t😀')",
    "(2, '-Infinity', -999.99, '-0.000000000000000000000000000001', '0044-03-15 12:00:00 BC', "
    "'9999-12-31 23:59:59.999999+00', '0001-01-01', '00:00:00', '-178000000 years', '-0', '-Infinity', '{}', '{}', "
    "'{}', 2147483647, 'x''y', 'empty', '(,)', '\\x', '[]', '00000000-0000-0000-0000-000000000000', "
    "B'1111111111111111111111111111111111111111111111111111111111111111111111', '', '')",
    "(3, '1e-20', 0, 0, '1970-01-01 00:00:00', '1969-12-31 23:59:59.999999-01', '1969-12-31', '23:59:59.999999', "
    "'0', 5e-324, 1.17549435e-38, '{2147483647,-2147483648}', '{\"\"}', '{{NULL}}', NULL, NULL, '(,5]', "
    "'[2020-01-01 00:00:00.000001,infinity)', NULL, 'null', NULL, NULL, NULL, NULL)",
]


def test_postgresql_type_edges_reach_every_sender_equal(tmp_path: Path) -> None:
    """PostgreSQL's edges (numeric NaN and infinities, timestamp infinity and BC dates,
    arrays, domains, enums, ranges, intervals, float specials, bytea that is not UTF-8,
    bit varying, char padding, jsonb) through the file, a MySQL target, Kafka and the
    lake, copied by the snapshot and read from the slot: verify finds every sink equal
    to the source (what MySQL has no value for arrives as NULL: docs/regions-postgresql.md
    "Types"; verify compares it so)."""
    from devtools.local_postgres import PostgresInstance
    from integration.test_postgresql import config, pg_region

    pg = PostgresInstance().start()
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    broker = shared_broker()
    try:
        with pg.connect() as c:
            for sql in PG_EDGES:
                c.execute(sql)
            c.execute("INSERT INTO public.pedges VALUES " + PG_ROWS[0])
        senders = ("[global]\ntype=local,mysql,kafka,spark\n"
                   f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=2\n"
                   f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
                   f"[spark]\nwarehouse={tmp_path / 'wh'}\nwriter=arrow\nbatch_interval=1\nbatch_rows=500\n"
                   "compaction_interval=0\nmaster=local[1]\n")
        cfg = config(tmp_path, pg_region("pg", pg, "snapshot=initial\n"), senders)
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        try:
            cap.wait_ready()
            wait_for(lambda: _snapshot_done(tmp_path), 120, "the snapshot of the first row")
            with pg.connect() as c:
                c.execute("INSERT INTO public.pedges VALUES " + ", ".join(PG_ROWS[1:]))
                c.execute("UPDATE public.pedges SET tx = coalesce(tx, '') || '+'")
                c.execute("INSERT INTO public.pedges (id) VALUES (4)")
                c.execute("DELETE FROM public.pedges WHERE id = 4")
                # (the insert position: with synchronous_commit off, pg_current_wal_lsn can lag the commits)
                end = c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
            from capturer.model import parse_lsn
            from integration.test_postgresql import covered

            wait_for(lambda: covered(tmp_path, "pg", parse_lsn(end)), 120, "every sender to have every change")
        finally:
            _stopped_cleanly(cap, tmp_path)
        tables = _every_sink_equal(cfg)
        assert all(v["rows"] == 3 for v in tables.values()), {k: v["rows"] for k, v in tables.items()}
    finally:
        broker.kill()
        target.stop()
        pg.destroy()
