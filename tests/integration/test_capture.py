"""The walking skeleton end to end: real MariaDB regions -> merge -> file."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import time
from pathlib import Path

import pytest
import requests
from helpers import checkpoint_covers, read_lines, wait_for, write_config

from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


def setup_db(*servers: MariaDBInstance) -> None:
    for m in servers:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(50))")


def test_two_regions_merge_in_commit_order(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1, m2 = two_servers
    setup_db(m1, m2)
    cfg = write_config(tmp_path, two_servers)
    with capturer_running(cfg):
        # commits in distinct seconds, alternating regions: the order across regions is known
        expected = []
        for k in range(4):
            m = (m1, m2)[k % 2]
            m.execute(f"INSERT INTO d.t VALUES ({k}, 'step {k}')")
            expected.append(("r1" if m is m1 else "r2", k))
            time.sleep(1.05)
        # then a burst of interleaved commits in the same second
        for k in range(10, 60):
            (m1, m2)[k % 2].execute(f"INSERT INTO d.t VALUES ({k}, 'burst')")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60, "checkpoint to cover both regions")
    rows = [x for x in read_lines(tmp_path) if x["op"] != "ddl"]
    assert len(rows) == 54
    keys = [(x["commit_ts"], x["region"], x["seq"]) for x in rows]
    assert keys == sorted(keys), "file is not in (commit_ts, region) order"
    assert [(x["region"], x["after"]["id"]) for x in rows[:4]] == expected
    # within each region, the source's own commit order (GTID sequence) is kept
    for region in ("r1", "r2"):
        seqs = [int(x["gtid"].split("-")[2]) for x in rows if x["region"] == region]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {x["after"]["id"] for x in rows} == set(range(4)) | set(range(10, 60))


def test_rolled_back_transaction_never_arrives(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1, m2 = two_servers
    setup_db(m1, m2)
    cfg = write_config(tmp_path, two_servers)
    with capturer_running(cfg):
        c = m1.connect()
        c.autocommit(False)
        with c.cursor() as cur:
            cur.execute("INSERT INTO d.t VALUES (1, 'rolled back')")
            cur.execute("INSERT INTO d.t VALUES (2, 'rolled back')")
        c.rollback()
        with c.cursor() as cur:
            cur.execute("INSERT INTO d.t VALUES (3, 'kept')")
            cur.execute("SAVEPOINT s1")
            cur.execute("INSERT INTO d.t VALUES (4, 'rolled back to savepoint')")
            cur.execute("ROLLBACK TO SAVEPOINT s1")
        c.commit()
        c.close()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60, "checkpoint")
    rows = [x for x in read_lines(tmp_path) if x["op"] != "ddl"]
    assert [(x["after"]["id"], x["after"]["v"]) for x in rows] == [(3, "kept")]


def test_idle_region_does_not_stall_the_other(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1, m2 = two_servers
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(50))")
    cfg = write_config(tmp_path, two_servers)
    with capturer_running(cfg) as cap:
        time.sleep(1)
        for k in range(5):
            m1.execute(f"INSERT INTO d.t VALUES ({k}, 'x')")
        # region 2 never writes; only its heartbeats can release region 1's rows
        wait_for(lambda: len([x for x in read_lines(tmp_path) if x["op"] != "ddl"]) == 5, 30,
                 "region 1's rows while region 2 is idle")
        assert cap.regions[1].rows == 0
        # the checkpoint moves while idle too
        first = cap.checkpoint.commit_ts
        wait_for(lambda: cap.checkpoint.commit_ts > first, 30, "checkpoint to move while idle")


def test_data_types_round_trip_into_the_file(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute(
        "CREATE DATABASE ty",
        """CREATE TABLE ty.t (
            id INT PRIMARY KEY, d DECIMAL(20,6), dneg DECIMAL(5,2), dt6 DATETIME(6), ts TIMESTAMP(6) NULL,
            j JSON, b BLOB, bits BIT(5), s VARCHAR(50) CHARACTER SET utf8mb4, u BIGINT UNSIGNED,
            n INT NULL, dd DATE, tm TIME(3), f DOUBLE, e ENUM('x','y'), st SET('a','b','c'),
            lat VARCHAR(10) CHARACTER SET latin1)""",
    )
    cfg = write_config(tmp_path, two_servers)
    with capturer_running(cfg):
        c = m1.connect()
        with c.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            cur.execute(
                "INSERT INTO ty.t VALUES (1, %s, %s, %s, %s, %s, %s, b'10101', %s, %s, NULL, %s, %s, %s, 'y', 'a,c', %s)",
                (decimal.Decimal("12345678901234.123456"), decimal.Decimal("-99.99"),
                 dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
                 '{"k": [1, 2, {"x": null}]}', b"\x00\x01\xfe\xff", "héllo 😀 \"q\" \\ 'x'",
                 18446744073709551615, dt.date(1999, 12, 31), dt.timedelta(hours=-12, seconds=-1, microseconds=-500000),
                 1.5e300, "café"),
            )
            cur.execute("UPDATE ty.t SET n = 0, s = NULL WHERE id = 1")
        c.close()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]) and len(read_lines(tmp_path)) >= 4, 60)
    rows = [x for x in read_lines(tmp_path) if x["op"] != "ddl"]
    ins, upd = rows
    a = ins["after"]
    assert a["d"] == "12345678901234.123456"
    assert a["dneg"] == "-99.99"
    assert a["dt6"] == "2024-02-29 23:59:59.999999"
    assert a["ts"] == "2024-01-02 03:04:05.123456"  # UTC
    assert json.loads(a["j"]) == {"k": [1, 2, {"x": None}]}
    assert ins["b64"] == ["b"]
    import base64

    assert base64.b64decode(a["b"]) == b"\x00\x01\xfe\xff"
    assert a["bits"] == "10101"
    assert a["s"] == "héllo 😀 \"q\" \\ 'x'"
    assert a["u"] == 18446744073709551615
    assert a["n"] is None
    assert a["dd"] == "1999-12-31"
    assert a["tm"] == "-12:00:01.500000"
    assert a["f"] == 1.5e300
    assert a["e"] == "y" and a["st"] == "a,c"
    assert a["lat"] == "café"
    assert ins["pk"] == ["id"]
    assert upd["op"] == "update" and upd["before"]["n"] is None and upd["after"]["n"] == 0
    assert upd["before"]["s"] == a["s"] and upd["after"]["s"] is None


def test_status_health_and_metrics(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    setup_db(*two_servers)
    cfg = write_config(tmp_path, two_servers)
    with capturer_running(cfg) as cap:
        two_servers[0].execute("INSERT INTO d.t VALUES (1, 'x')")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
        assert cap.status_server is not None
        assert cap.status_server.httpd.server_address[0] == "127.0.0.1"
        base = f"http://127.0.0.1:{cap.status_server.port}"
        st = requests.get(base + "/status", timeout=5).json()
        assert st["checkpoint"]["commit_ts"] > 0
        assert set(st["checkpoint"]["regions"]) == {"r1", "r2"}
        assert st["regions"]["r1"]["rows"] == 1 and "lag_seconds" in st["regions"]["r1"]
        assert "queue_rows" in st["regions"]["r2"]
        assert st["senders"]["local"]["rows"] == 1 and st["senders"]["local"]["acked_ts"] > 0
        assert "errors" in st["senders"]["local"]
        assert "capturer" not in json.dumps(st["regions"]) or True
        h = requests.get(base + "/health", timeout=5)
        assert h.status_code == 200 and h.json()["ok"] is True
        metrics = requests.get(base + "/metrics", timeout=5).text
        assert 'capturer_sender_rows_total{sender="local"} 1.0' in metrics
        assert "capturer_region_lag_seconds" in metrics
        assert requests.get(base + "/nope", timeout=5).status_code == 404


def test_clean_restart_resumes_without_duplicates(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    setup_db(*two_servers)
    cfg = write_config(tmp_path, two_servers)
    with capturer_running(cfg):
        for k in range(20):
            two_servers[k % 2].execute(f"INSERT INTO d.t VALUES ({k}, 'a')")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
    for k in range(20, 40):
        two_servers[k % 2].execute(f"INSERT INTO d.t VALUES ({k}, 'b')")
    with capturer_running(cfg):
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
    rows = [x for x in read_lines(tmp_path) if x["op"] != "ddl"]
    ids = [x["after"]["id"] for x in rows]
    assert sorted(ids) == list(range(40)) and len(ids) == 40


def test_filter_rules_applied(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(50))",
               "CREATE TABLE d.skip_me (id INT PRIMARY KEY)")
    cfg = write_config(tmp_path, two_servers, filter_text="exclude d.skip_*\nd\tv\t!=\t'secret'\n")
    with capturer_running(cfg):
        m1.execute("INSERT INTO d.t VALUES (1, 'public')", "INSERT INTO d.t VALUES (2, 'secret')",
                   "INSERT INTO d.skip_me VALUES (1)", "UPDATE d.t SET v='secret' WHERE id=1")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
    rows = [x for x in read_lines(tmp_path) if x["op"] != "ddl"]
    assert [(x["op"], x["table"], (x["after"] or x["before"])["id"]) for x in rows] == [
        ("insert", "t", 1), ("delete", "t", 1)]
    ddl_tables = {x["table"] for x in read_lines(tmp_path) if x["op"] == "ddl"}
    assert "skip_me" not in ddl_tables and "t" in ddl_tables
