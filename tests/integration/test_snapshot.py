"""Initial and on-demand snapshots (real MariaDB sources and target, Apache Kafka, local Spark)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import (
    ROOT,
    CapturerProcess,
    checkpoint_covers,
    consume_all,
    read_lines,
    shared_broker,
    start_servers,
    verify_equal,
    wait_for,
    write_config,
)
from workload import SCHEMA, TABLES, Workload, assert_target_equals_sources

from capturer.model.encode import json_row, quote_ident
from devtools.local_mariadb import MariaDBInstance
from senders.local.replay import read_changes, rebuild

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, params=["consistent", "watermark"])
def snapshot_method(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs with each snapshot method (``snapshot_method=`` in every
    region write_config writes): MariaDB's consistent-snapshot position, and the
    watermark method MySQL servers need, forced on MariaDB. Without --runslow the
    watermark runs only the cases marked ``every_method`` (the races, the crashes,
    the types, the coordinated copy): the others test what both methods share."""
    import helpers

    if (request.param != "consistent" and request.node.get_closest_marker("every_method") is None
            and not (request.config.getoption("--runslow") or os.environ.get("RUN_SLOW") == "1")):
        pytest.skip("slow: the other snapshot method of a case both share (--runslow runs it)")
    monkeypatch.setattr(helpers, "SNAPSHOT_METHOD", request.param)
    return str(request.param)

EXTRA = [
    # hostile names, a table keyed only by a NOT NULL unique key, an empty table
    "CREATE DATABASE `we``ird db`",
    "CREATE TABLE `we``ird db`.`ta ble%s` (`i d` INT PRIMARY KEY, `v``al` VARCHAR(30), `%s` TEXT)",
    "CREATE TABLE app.ukonly (code VARCHAR(20) NOT NULL, v INT, UNIQUE KEY uk (code))",
    "CREATE TABLE app.empty (id INT PRIMARY KEY)",
]


def fill_extra(m: MariaDBInstance, n: int = 300) -> None:
    c = m.connect()
    with c.cursor() as cur:
        cur.executemany("INSERT INTO `we``ird db`.`ta ble%%s` VALUES (%s, %s, %s)",
                        [(i, f"v`'\"\\{i}", "%s %d" if i % 3 else None) for i in range(n)])
        cur.executemany("INSERT INTO app.ukonly VALUES (%s, %s)", [(f"c{i}", i) for i in range(n)])
    c.commit()
    c.close()


def churn_extra(m: MariaDBInstance, rounds: int) -> None:
    c = m.connect()
    with c.cursor() as cur:
        for i in range(rounds):
            cur.execute("UPDATE `we``ird db`.`ta ble%%s` SET `v``al` = CONCAT(`v``al`, '+') WHERE `i d` = %s", (i * 7 % 300,))
            cur.execute("UPDATE app.ukonly SET v = v + 1000 WHERE code = %s", (f"c{i * 11 % 300}",))
            if i % 10 == 0:
                cur.execute("DELETE FROM app.ukonly WHERE code = %s", (f"c{i}",))
            c.commit()
    c.close()


def source_rows(m: MariaDBInstance, db: str, table: str) -> list[str]:
    c = m.connect()
    try:
        with c.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            cur.execute(f"SELECT * FROM {quote_ident(db)}.{quote_ident(table)}")
            cols = [d[0] for d in cur.description]
            return sorted(json.dumps(json_row(dict(zip(cols, r)), set()), sort_keys=True) for r in cur.fetchall())
    finally:
        c.close()


ALL = [("app", t) for t in TABLES] + [("we`ird db", "ta ble%s"), ("app", "ukonly"), ("app", "empty")]


def assert_file_equals_source(tmp: Path, m: MariaDBInstance) -> None:
    state = rebuild(read_changes(tmp / "out" / "changes.jsonl"))
    for db, t in ALL:
        got = sorted(json.dumps(r, sort_keys=True) for r in state.get((db, t), {}).values())
        want = source_rows(m, db, t)
        assert got == want, f"file: {db}.{t}: {len(got)} rows vs {len(want)} in the source"


def complete_read_lines(tmp: Path) -> int:
    """Snapshot rows in the file output now (complete lines only: a torn last line
    is cut when the file sender starts again)."""
    from senders.local.replay import output_files

    n = 0
    for f in output_files(tmp / "out" / "changes.jsonl"):
        n += sum(b'"op": "read"' in line for line in f.read_bytes().split(b"\n")[:-1])
    return n


def snapshot_done(cap: Any, region: str = "r1") -> bool:
    snap = cap.snapshot()["regions"][region].get("snapshot")
    return bool(snap) and all(t["state"] in ("done", "dropped") for t in snap["tables"].values())


def rebuild_kafka(records: list[Any]) -> dict[tuple[str, str], list[str]]:
    """Every table's rows from the topics: keyed tables by key; keyless ones as a
    multiset in commit order. A TRUNCATE empties a table: its truncate event
    (``op: "t"``) on the table's own topic, or its DDL on the schema topic (either
    is enough; both name the same commit_ts)."""
    seen = set()
    events: dict[str, list[tuple[int, int, dict[str, Any], Any]]] = defaultdict(list)
    truncates: dict[tuple[str, str], set[int]] = defaultdict(set)
    for r in records:
        if r.value is None:
            continue
        h = {k: v.decode() for k, v in r.headers}
        if r.topic == "capturer.schema_changes":
            d = json.loads(r.value)
            if d["ddl"].startswith("TRUNCATE"):
                truncates[(d["source"]["db"], d["source"]["table"])].add(int(h["commit_ts"]))
            continue
        d = json.loads(r.value)
        if d.get("op") == "t":  # (one per partition of the topic)
            truncates[(d["source"]["db"], d["source"]["table"])].add(int(h["commit_ts"]))
            continue
        ident = (h["region"], h["commit_ts"], h["seq"], h["op"])
        if ident in seen:
            continue
        seen.add(ident)
        events[r.topic].append((int(h["commit_ts"]), int(h["seq"]), d, r.key))
    out: dict[tuple[str, str], list[str]] = {}
    for _topic, evs in events.items():
        evs.sort(key=lambda e: (e[0], e[1]))
        db, table = evs[0][2]["source"]["db"], evs[0][2]["source"]["table"]
        cuts = sorted(truncates.get((db, table), set()))
        keyed: dict[Any, dict[str, Any]] = {}
        keyless: list[dict[str, Any]] = []
        for ts, _, d, key in evs:
            while cuts and cuts[0] < ts:
                keyless.clear()
                keyed.clear()
                cuts.pop(0)
            if key is None:
                if d["op"] in ("c", "r"):
                    keyless.append(d["after"])
                elif d["op"] == "d" and d["before"] in keyless:  # (a row from before the copy: not seen)
                    keyless.remove(d["before"])
                continue
            if d["op"] in ("c", "u", "r"):
                keyed[key] = d["after"]
            else:
                keyed.pop(key, None)
        if cuts:  # emptied after its last change
            keyed.clear()
            keyless.clear()
        rows = list(keyed.values()) + keyless
        out[(db, table)] = sorted(json.dumps(x, sort_keys=True) for x in rows)
    return out


@pytest.mark.every_method
def test_initial_snapshot_with_concurrent_writes_every_sender(tmp_path: Path, target: MariaDBInstance,
                                                              capturer_running, snapshot_method: str) -> None:  # type: ignore[no-untyped-def]
    """Tables with history that is no longer in the binlog are copied while writes go
    on; file, MySQL, Kafka and Spark end up equal to the source."""
    pytest.importorskip("pyspark")
    from senders.spark.lakecli import verify

    (m,) = start_servers(tmp_path, 1)
    broker = shared_broker()
    wh = tmp_path / "wh"
    try:
        m.execute(*SCHEMA, *EXTRA)
        w = Workload(m, 1, 77)
        w.run(400)
        fill_extra(m)
        m.execute("FLUSH BINARY LOGS", "PURGE BINARY LOGS BEFORE NOW() + INTERVAL 1 DAY")  # history: only tables
        senders = (f"[global]\ntype=local,mysql,kafka,spark\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n"
                   f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
                   f"[spark]\nmaster=local[2]\nwarehouse={wh}\nbatch_interval=0.3\ncompaction_interval=0\n")
        cfg = write_config(tmp_path, [m], senders=senders,
                           region_extra="snapshot=initial\nsnapshot_chunk_rows=60\nsnapshot_workers=2\n"
                                        "snapshot_read_ahead=true\n")
        with capturer_running(cfg) as cap:
            t = w.thread(300)  # concurrent writes during the snapshot
            churn_extra(m, 150)
            t.join()
            assert not w.errors
            wait_for(lambda: snapshot_done(cap), 180, "the snapshot to finish")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 180, "every sender to catch up")
            st = cap.snapshot()
            for table in TABLES + ["ukonly"]:  # (a table that never had a row has no lake table)
                r = verify(cap.senders[3]._session(), wh, "cdc", "app", table,  # type: ignore[attr-defined]
                           [{"host": "127.0.0.1", "port": m.port, "user": "root", "password": ""}])
                assert r["equal"], r
        assert st["regions"]["r1"]["snapshot"]["method"] == snapshot_method
        snap = st["regions"]["r1"]["snapshot"]["tables"]
        assert snap["app.users"]["state"] == "done" and snap["app.users"]["chunks"] > 5
        assert snap["app.empty"]["rows"] == 0 and snap["app.empty"]["state"] == "done"
        assert_file_equals_source(tmp_path, m)
        assert_target_equals_sources([m], target, tables=TABLES + ["ukonly", "empty"])
        assert source_rows(m, "we`ird db", "ta ble%s") == source_rows(target, "we`ird db", "ta ble%s")
        kafka = rebuild_kafka(consume_all(broker.servers))
        for db, t in ALL:
            if t == "empty":
                continue
            assert kafka[(db, t)] == source_rows(m, db, t), f"kafka {db}.{t}"
        lines = read_lines(tmp_path)
        reads = [x for x in lines if x["op"] == "read"]
        assert reads and all(x["snapshot"]["run"] for x in reads)
        assert {x["table"] for x in reads} >= {"users", "pairs", "log", "ta ble%s", "ukonly"}
        # the snapshot's rows are spread over the stream, between binlog transactions
        ops = [x["op"] for x in lines]
        first_read, last_read = ops.index("read"), len(ops) - 1 - ops[::-1].index("read")
        assert any(o in ("insert", "update", "delete") for o in ops[first_read:last_read])
    finally:
        broker.kill()
        m.stop()


@pytest.mark.every_method
def test_kill9_mid_snapshot_resumes_after_the_last_acknowledged_chunk(tmp_path: Path) -> None:
    N = 150_000
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE big", "CREATE TABLE big.t (id INT PRIMARY KEY, v VARCHAR(40), n INT)")
        c = m.connect()
        with c.cursor() as cur:
            for s in range(0, N, 5000):
                cur.executemany("INSERT INTO big.t VALUES (%s, %s, %s)",
                                [(i, f"row-{i}", i % 97) for i in range(s, s + 5000)])
        c.commit()
        cfg = write_config(tmp_path, [m], region_extra="snapshot=initial\nsnapshot_chunk_rows=500\nsnapshot_workers=1\n"
                                                      "snapshot_read_ahead=true\n")
        log = tmp_path / "capturer.log"
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()

        def acked_rows() -> int:
            try:
                cp = json.loads((tmp_path / "checkpoint.json").read_text())
            except (OSError, ValueError):
                return 0
            return sum(t["rows"] for t in cp["regions"]["r1"].get("snapshot", []))

        wait_for(lambda: acked_rows() >= 3000, 120, "part of the snapshot to be acknowledged")
        with c.cursor() as cur:  # writes while it copies
            cur.execute("UPDATE big.t SET v = 'changed' WHERE id % 1000 = 3")
            cur.execute("DELETE FROM big.t WHERE id % 1000 = 5")
        c.commit()
        p.kill9()
        before = acked_rows()
        assert 0 < before < N
        delivered = complete_read_lines(tmp_path)  # (more than acknowledged: the checkpoint lags)
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        with c.cursor() as cur:
            cur.execute("UPDATE big.t SET n = -1 WHERE id % 1000 = 7")
        c.commit()
        wait_for(lambda: "snapshot of big.t done" in log.read_text(), 120, "the snapshot to finish")
        wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        assert p.stop() == 0
        c.close()
        state = rebuild(read_changes(tmp_path / "out" / "changes.jsonl"))
        got = sorted(json.dumps(r, sort_keys=True) for r in state[("big", "t")].values())
        assert got == source_rows(m, "big", "t")
        reads = [x for x in read_lines(tmp_path) if x["op"] == "read"]
        # resumed after the acknowledged chunks, not from zero (that would read N - 150 rows again)
        assert len(reads) - delivered <= N - before, (len(reads), delivered, before)
        last = [x["snapshot"] for x in reads][-1]
        assert last["last"] and sorted({x["snapshot"]["chunk"] for x in reads}) == list(range(last["chunk"] + 1))
    finally:
        m.stop()


def test_on_demand_resnapshot_repairs_a_target(tmp_path: Path, target: MariaDBInstance, capturer_running) -> None:  # type: ignore[no-untyped-def]
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute(*SCHEMA)
        token = "s3cret-token-for-tests"
        cfg = write_config(tmp_path, [m], extra_global=f"controlToken={token}\n",
                           senders=f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\n"
                                   "user=root\npassword=\nthreadnum=4\n")
        with capturer_running(cfg) as cap:
            w = Workload(m, 1, 5)
            w.run(200)
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            assert_target_equals_sources([m], target)
            # someone damages the target
            target.execute("DELETE FROM app.users WHERE id % 3 = 0", "UPDATE app.users SET name = 'damaged'",
                           "INSERT INTO app.users (id, email) VALUES (-1, 'not-in-the-source')")
            url = f"http://127.0.0.1:{cap.status_server.port}"  # type: ignore[union-attr]
            # refused without the token, or with a wrong one; GET stays read-only
            assert requests.post(url + "/snapshot", json={"tables": ["app.users"]}, timeout=10).status_code == 401
            assert requests.post(url + "/snapshot", json={"tables": ["app.users"]}, timeout=10,
                                 headers={"Authorization": "Bearer wrong"}).status_code == 401
            bad = requests.post(url + "/snapshot", json={"tables": ["nodb.notable"]}, timeout=10,
                                headers={"Authorization": f"Bearer {token}"})
            assert bad.status_code == 404 and "nodb.notable" in bad.json()["error"]
            # the CLI, as an operator runs it (with --truncate: rows the source lacks go too)
            r = subprocess.run([sys.executable, "-m", "capturer", "snapshot", "app.users", "--truncate",
                                "--config", str(cfg), "--url", url], cwd=ROOT, capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
            assert r.returncode == 0, r.stderr
            assert "snapshot run" in r.stdout
            t = w.thread(100)  # writes go on meanwhile
            t.join()
            wait_for(lambda: snapshot_done(cap), 60, "the re-snapshot")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            st = requests.get(url + "/status", timeout=10).json()
            metrics = requests.get(url + "/metrics", timeout=10).text
        assert_target_equals_sources([m], target)
        assert st["regions"]["r1"]["snapshot"]["tables"]["app.users"]["state"] == "done"
        assert 'capturer_snapshot_rows{region="r1",table="app.users"}' in metrics
    finally:
        m.stop()


def test_control_endpoint_is_off_without_a_token(tmp_path: Path, capturer_running) -> None:  # type: ignore[no-untyped-def]
    (m,) = start_servers(tmp_path, 1)
    try:
        cfg = write_config(tmp_path, [m])
        with capturer_running(cfg) as cap:
            url = f"http://127.0.0.1:{cap.status_server.port}"  # type: ignore[union-attr]
            r = requests.post(url + "/snapshot", json={"tables": ["app.users"]}, timeout=10,
                              headers={"Authorization": "Bearer anything"})
            assert r.status_code == 403 and "controlToken" in r.json()["error"]
            r = subprocess.run([sys.executable, "-m", "capturer", "snapshot", "app.users", "--config", str(cfg),
                                "--url", url], cwd=ROOT, capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
            assert r.returncode == 2 and "controlToken" in r.stderr
    finally:
        m.stop()


def test_table_dropped_during_its_snapshot(tmp_path: Path, capturer_running) -> None:  # type: ignore[no-untyped-def]
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.gone (id INT PRIMARY KEY, v TEXT)",
                  "CREATE TABLE d.stays (id INT PRIMARY KEY)")
        c = m.connect()
        with c.cursor() as cur:
            for s in range(0, 40000, 5000):
                cur.executemany("INSERT INTO d.gone VALUES (%s, %s)", [(i, "x" * 200) for i in range(s, s + 5000)])
            cur.executemany("INSERT INTO d.stays VALUES (%s)", [(i,) for i in range(50)])
        c.commit()
        c.close()
        cfg = write_config(tmp_path, [m], region_extra="snapshot=initial\nsnapshot_chunk_rows=200\nsnapshot_workers=1\n")
        with capturer_running(cfg) as cap:
            wait_for(lambda: (cap.snapshot()["regions"]["r1"].get("snapshot") or {}).get("rows", 0) > 400, 60)
            m.execute("DROP TABLE d.gone")
            wait_for(lambda: snapshot_done(cap), 60, "the snapshot to end")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            snap = cap.snapshot()["regions"]["r1"]["snapshot"]["tables"]
            assert cap.failure == ""
        assert snap["d.gone"]["state"] == "dropped"
        assert snap["d.stays"]["state"] == "done" and snap["d.stays"]["rows"] == 50
        state = rebuild(read_changes(tmp_path / "out" / "changes.jsonl"))
        assert not state.get(("d", "gone"))  # emptied by the DROP TABLE that follows its rows
        assert len(state[("d", "stays")]) == 50
    finally:
        m.stop()


@pytest.mark.every_method
@pytest.mark.parametrize("driver", ["mariadb", "pymysql"])
def test_snapshot_values_equal_binlog_values_for_every_type(tmp_path: Path, driver: str) -> None:
    """A row read by a snapshot is, value for value and schema for schema, what the
    binlog decoder gives for the same row (so sinks cannot tell them apart)."""
    import random

    from capturer.app import Capturer, load_config
    from integration.test_rowdecode import COLS, GOLDEN, rand_row

    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE g", GOLDEN)
        rng = random.Random(11)
        c = m.connect()
        with c.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            ph = ", ".join(["%s"] * (len(COLS) + 1))
            for i in range(200):
                cur.execute(f"INSERT INTO g.t (id, {', '.join(COLS)}) VALUES ({ph})", [i, *rand_row(rng, i)])
            cur.execute("UPDATE g.t SET g = POINT(1.5, -2), s = '', t6 = '-00:00:00.000001' WHERE id < 5")
            cur.execute("INSERT INTO g.t (id, dt0, da, ts0, y) VALUES (1000, '0000-00-00', '0000-00-00', 0, 0)")
            cur.execute("INSERT INTO g.t (id) VALUES (1001)")
        c.commit()
        c.close()
        runs = {}
        for mode in ("binlog", "snapshot"):
            d = tmp_path / mode
            d.mkdir()
            if driver == "mariadb":
                pytest.importorskip("mariadb")
            extra = f"snapshot=initial\nsnapshot_driver={driver}\n" if mode == "snapshot" else "start=earliest\n"
            cfg = write_config(d, [m], region_extra=extra)
            cap = Capturer(load_config(cfg))
            cap.start()
            want = b'"op": "read"' if mode == "snapshot" else b'"op": "insert"'
            out = d / "out" / "changes.jsonl"

            def done(c: Any) -> bool:  # (complete lines only: the file is being written)
                if not out.exists() or c.manager.acked_ts() == 0:
                    return False
                return sum(want in line for line in out.read_bytes().split(b"\n")[:-1]) >= 202

            t0 = time.monotonic()
            cap.run(until=lambda c: done(c) or time.monotonic() - t0 > 120)
            runs[mode] = rebuild(read_changes(d / "out" / "changes.jsonl"))[("g", "t")]
            if mode == "binlog":
                (binlog_schema,) = [x for k, x in cap.regions[0]._schemas.items() if k[:2] == ("g", "t")]
            else:
                from capturer.regions.mysql.snapshot import Reader, describe

                reader = Reader(cap.regions[0])  # type: ignore[arg-type]
                assert reader.kind == driver
                snap_schema = describe(reader, "g", "t").schema
                reader.close()
        # the same TableSchema (types, keys): sinks (the lake's column types) cannot tell them apart
        assert snap_schema == binlog_schema
        diffs = {(k, c): (v.get(c), runs["snapshot"][k].get(c)) for k, v in runs["binlog"].items()
                 for c in v if v.get(c) != runs["snapshot"].get(k, {}).get(c)}
        assert not diffs, list(diffs.items())[:6]
        assert runs["binlog"] == runs["snapshot"]
    finally:
        m.stop()


def _file_state(tmp: Path, db: str, tables: list[str]) -> dict[str, list[str]]:
    state = rebuild(read_changes(tmp / "out" / "changes.jsonl"))
    return {t: sorted(json.dumps(r, sort_keys=True) for r in state.get((db, t), {}).values()) for t in tables}


def test_odd_keys_unique_key_order_and_uuid_keys(tmp_path: Path, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """Chunk keys that compare unlike they print (ENUM, BIT, zero dates), a table
    keyed by the server's first NOT NULL unique key (not the first by name), and a
    UUID key changed while chunks are in flight: every row, once, in every case."""
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d",
                  "CREATE TABLE d.e (e ENUM('z','a') NOT NULL, id INT NOT NULL, PRIMARY KEY (e, id))",
                  "INSERT INTO d.e SELECT 'z', seq FROM d.seq_1_to_25",
                  "INSERT INTO d.e SELECT 'a', seq FROM d.seq_1_to_25",
                  "CREATE TABLE d.b (b BIT(8) NOT NULL PRIMARY KEY, v INT)",
                  "INSERT INTO d.b SELECT seq, seq FROM d.seq_1_to_40",
                  "CREATE TABLE d.s (s SET('x','y','z') NOT NULL, id INT NOT NULL, PRIMARY KEY (s, id))",
                  "INSERT INTO d.s SELECT ELT(1 + seq % 4, '', 'x', 'y,z', 'x,y,z'), seq FROM d.seq_1_to_40",
                  "CREATE TABLE d.u (a INT NOT NULL, b INT NOT NULL, v INT, UNIQUE KEY z_key (b), UNIQUE KEY a_key (a))",
                  "INSERT INTO d.u SELECT seq, 1000 - seq, seq FROM d.seq_1_to_40",
                  "CREATE TABLE d.g (id UUID PRIMARY KEY, ip INET6, v INT)",
                  "INSERT INTO d.g SELECT UUID(), CONCAT('2001:db8::', HEX(seq)), seq FROM d.seq_1_to_60")
        c = m.connect()
        with c.cursor() as cur:
            cur.execute("SET SESSION sql_mode=''")
            cur.execute("CREATE TABLE d.z (dt DATETIME NOT NULL, id INT NOT NULL, PRIMARY KEY (dt, id))")
            cur.execute("INSERT INTO d.z SELECT '0000-00-00 00:00:00', seq FROM d.seq_1_to_25")
            cur.execute("INSERT INTO d.z SELECT '2020-01-01', seq FROM d.seq_1_to_25")
        c.commit()
        tables = ["e", "b", "s", "u", "g", "z"]
        m.execute("FLUSH BINARY LOGS", "PURGE BINARY LOGS BEFORE NOW() + INTERVAL 1 DAY")
        cfg = write_config(tmp_path, [m], region_extra="snapshot=initial\nsnapshot_chunk_rows=10\nsnapshot_workers=2\n")
        with capturer_running(cfg) as cap:
            with c.cursor() as cur:  # changes while the chunks go
                for i in range(30):
                    cur.execute("UPDATE d.g SET v = v + 100 WHERE v %% 7 = %s", (i % 7,))
                    cur.execute("DELETE FROM d.g WHERE v = %s", (i,))
                    cur.execute("UPDATE d.u SET v = -v WHERE a = %s", (i,))
                    c.commit()
            wait_for(lambda: snapshot_done(cap), 60, "the snapshot")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            snap = cap.snapshot()["regions"]["r1"]["snapshot"]["tables"]
        c.close()
        assert all(v["state"] == "done" for v in snap.values()), snap
        # the source read back in the values the binlog gives: BIT as a bit string, a zero
        # date as NULL, UUID/INET6 as their 16 bytes
        exprs = {"b": "LPAD(BIN(b), 8, '0') AS b, v",
                 "z": "NULLIF(CAST(dt AS CHAR), '0000-00-00 00:00:00') AS dt, id",
                 "g": "CAST(id AS BINARY) AS id, CAST(ip AS BINARY) AS ip, v"}
        want = {}
        c = m.connect()
        with c.cursor() as cur:
            for t in tables:
                cur.execute(f"SELECT {exprs.get(t, '*')} FROM d.{t}")
                cols = [x[0] for x in cur.description]
                want[t] = sorted(json.dumps(json_row(dict(zip(cols, r)), set()), sort_keys=True) for r in cur.fetchall())
        c.close()
        assert _file_state(tmp_path, "d", tables) == want
        pks = {(x["table"], tuple(x["pk"])) for x in read_lines(tmp_path) if x["op"] in ("read", "update", "insert")}
        assert ("u", ("b",)) in pks and ("u", ("a",)) not in pks  # the server's first unique key, both paths
    finally:
        m.stop()


@pytest.mark.every_method
def test_ddl_between_and_during_chunks(tmp_path: Path, target: MariaDBInstance, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """Columns added and dropped while a table is being copied: the copy goes on with
    the new columns, and the target ends equal to the source."""
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, a VARCHAR(20), b INT)",
                  "INSERT INTO d.t SELECT seq, CONCAT('a', seq), seq FROM d.seq_1_to_3000")
        cfg = write_config(tmp_path, [m], senders=(
            f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n"),
            region_extra="snapshot=initial\nsnapshot_chunk_rows=50\nsnapshot_workers=1\n")
        with capturer_running(cfg) as cap:
            wait_for(lambda: (cap.snapshot()["regions"]["r1"].get("snapshot") or {}).get("rows", 0) > 200, 60)
            m.execute("ALTER TABLE d.t ADD COLUMN c INT NOT NULL DEFAULT 7",
                      "UPDATE d.t SET c = id WHERE id % 10 = 0")
            m.execute("ALTER TABLE d.t DROP COLUMN a")
            m.execute("UPDATE d.t SET b = -b WHERE id % 13 = 0")
            wait_for(lambda: snapshot_done(cap), 60, "the snapshot")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            snap = cap.snapshot()["regions"]["r1"]["snapshot"]["tables"]
        assert snap["d.t"]["state"] == "done"
        assert source_rows(target, "d", "t") == source_rows(m, "d", "t")
    finally:
        m.stop()


def test_on_demand_requests_racing(tmp_path: Path, target: MariaDBInstance, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """Two requests for a table in quick succession (the second supersedes the first),
    a request while workers are leaving, and bad request bodies."""
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)",
                  "INSERT INTO d.t SELECT seq, seq FROM d.seq_1_to_5000")
        token = "t0k3n-racing-requests"
        cfg = write_config(tmp_path, [m], extra_global=f"controlToken={token}\n",
                           senders=f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\n"
                                   "user=root\npassword=\nthreadnum=4\n",
                           region_extra="snapshot_chunk_rows=100\nsnapshot_workers=2\n")
        target.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)")
        with capturer_running(cfg) as cap:
            url = f"http://127.0.0.1:{cap.status_server.port}/snapshot"  # type: ignore[union-attr]
            auth = {"Authorization": f"Bearer {token}"}
            for body, code in (({"tables": ["d.t"], "truncate": "false"}, 400), ({"tables": "d.t"}, 400),
                               ({"tables": ["d.t"], "region": 5}, 400), ({"tables": ["d"]}, 400),
                               ({"tables": ["d.missing"]}, 404), ({"tables": ["d.t"], "region": "r9"}, 404)):
                r = requests.post(url, json=body, headers=auth, timeout=10)
                assert r.status_code == code, (body, r.status_code, r.text)
            runs = [requests.post(url, json={"tables": ["d.t"]}, headers=auth, timeout=10).json() for _ in range(2)]
            assert runs[0]["regions"]["r1"]["run"] != runs[1]["regions"]["r1"]["run"]
            wait_for(lambda: snapshot_done(cap), 60, "the snapshot")
            time.sleep(1.5)  # the workers leave
            m.execute("UPDATE d.t SET v = -v WHERE id % 3 = 0")
            target.execute("DELETE FROM d.t WHERE id > 4000")
            assert requests.post(url, json={"tables": ["d.t"]}, headers=auth, timeout=10).status_code == 202
            wait_for(lambda: snapshot_done(cap), 60, "the third snapshot")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            st = cap.snapshot()["regions"]["r1"]["snapshot"]["tables"]["d.t"]
        assert st["state"] == "done" and st["run"] not in (runs[0]["regions"]["r1"]["run"],)
        assert source_rows(target, "d", "t") == source_rows(m, "d", "t")
    finally:
        m.stop()


# --- deterministic interleavings ---------------------------------------------------------

class Pause:
    """Holds the capturer (in this process) at the ``nth`` pass through failpoint
    ``name`` until ``release()``: the test acts while, e.g., a chunk is read and
    not yet delivered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, nth: int = 1):
        import capturer.util.failpoints as fp

        self.reached = threading.Event()
        self._go = threading.Event()
        orig, count = fp.hit, [0]

        def hit(point: str) -> None:
            if point == name:
                count[0] += 1
                if count[0] == nth:
                    self.reached.set()
                    self._go.wait(300)
            orig(point)

        monkeypatch.setattr(fp, "hit", hit)

    def wait(self, what: str) -> None:
        wait_for(self.reached.is_set, 120, what)

    def release(self) -> None:
        self._go.set()


def stream_passed(cap: Any, m: MariaDBInstance, region: int = 0) -> bool:
    """The region's stream has read everything the server has written so far."""
    p = cap.regions[region].position
    return p is not None and (p.file, p.pos) >= m.master_position()


def file_tables(tmp: Path) -> dict[tuple[str, str], list[str]]:
    state = rebuild(read_changes(tmp / "out" / "changes.jsonl"))
    return {k: sorted(json.dumps(r, sort_keys=True) for r in v.values()) for k, v in state.items()}


def ddl_lines(tmp: Path, head: str, db: str, table: str) -> list[dict[str, Any]]:
    return [x for x in read_lines(tmp) if x["op"] == "ddl" and x["sql"].startswith(head)
            and (x["db"], x["table"]) == (db, table)]


FILE_AND_MYSQL = ("[global]\ntype=local,mysql\n[local]\nfilepath={out}\n"
                  "[mysql]\nhost=127.0.0.1\nport={port}\nuser=root\npassword=\nthreadnum=4\n")


@pytest.mark.every_method
def test_truncating_run_keeps_the_changes_made_while_a_chunk_waits(tmp_path: Path, target: MariaDBInstance,
                                                                  capturer_running, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``truncate``: rows changed, deleted and inserted again between a chunk's read
    and its delivery are dropped from the chunk (their transactions carry them):
    the TRUNCATE must come before the chunk is read, or it wipes those transactions.
    The file and the MySQL target end equal to the source; the stray row the target
    had goes."""
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(20))",
                  "INSERT INTO d.t SELECT seq, CONCAT('v', seq) FROM d.seq_1_to_500")
        token = "t0k3n-truncate"
        cfg = write_config(tmp_path, [m], extra_global=f"controlToken={token}\n",
                           senders=FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port),
                           region_extra="start=earliest\nsnapshot_chunk_rows=100\nsnapshot_workers=1\n")
        pause = Pause(monkeypatch, "snapshot.chunk_read", 1)
        with capturer_running(cfg) as cap:
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            target.execute("INSERT INTO d.t VALUES (-1, 'not in the source')", "UPDATE d.t SET v = 'bad'")
            url = f"http://127.0.0.1:{cap.status_server.port}/snapshot"  # type: ignore[union-attr]
            r = requests.post(url, json={"tables": ["d.t"], "truncate": True},
                              headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert r.status_code == 202, r.text
            pause.wait("chunk 0 to be read")
            # chunk 0 (ids 1..100) is read and waits: its keys change meanwhile
            m.execute("UPDATE d.t SET v = 'updated' WHERE id IN (1, 2, 3)",
                      "DELETE FROM d.t WHERE id IN (10, 11)",
                      "DELETE FROM d.t WHERE id = 20", "INSERT INTO d.t VALUES (20, 'inserted again')",
                      "UPDATE d.t SET id = 1000 WHERE id = 30",  # a key moves out of the chunk
                      "UPDATE d.t SET id = 0, v = 'moved in' WHERE id = 450")  # and one into its range
            wait_for(lambda: stream_passed(cap, m), 60, "the stream to read the changes")
            pause.release()
            wait_for(lambda: snapshot_done(cap), 60, "the snapshot")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        want = source_rows(m, "d", "t")
        assert source_rows(target, "d", "t") == want
        assert file_tables(tmp_path)[("d", "t")] == want
        lines = read_lines(tmp_path)
        cut = [i for i, x in enumerate(lines) if x["op"] == "ddl" and x["sql"].startswith("TRUNCATE")]
        reads = [i for i, x in enumerate(lines) if x["op"] == "read"]
        assert len(cut) == 1 and reads and cut[0] < reads[0]
        # the changes made while chunk 0 waited come after the TRUNCATE, before the chunk's rows
        changed = [i for i, x in enumerate(lines) if x["op"] in ("update", "delete", "insert") and i > cut[0]]
        assert changed and max(changed) < reads[0]
        # each snapshot line names its table and the position its chunk was read at (<= where it is)
        for x in (lines[i] for i in reads):
            mark = x["snapshot"]
            assert (mark["db"], mark["table"]) == ("d", "t")
            assert (mark["read_at"]["file"], mark["read_at"]["pos"]) <= (x["position"]["file"], x["position"]["pos"])
    finally:
        m.stop()


def test_truncate_is_done_once_across_kill9(tmp_path: Path, target: MariaDBInstance, monkeypatch) -> None:
    """A run's TRUNCATE is part of its progress: killed before it was sent, the
    restart truncates (the stray row goes); killed after it and two chunks were
    acknowledged, the restart does not truncate again (it would wipe those chunks)."""
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(20))",
                  "INSERT INTO d.t SELECT seq, CONCAT('v', seq) FROM d.seq_1_to_1000")
        token = "t0k3n-kill"
        cfg = write_config(tmp_path, [m], extra_global=f"controlToken={token}\n",
                           senders=FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port),
                           region_extra="start=earliest\nsnapshot_chunk_rows=100\nsnapshot_workers=1\n")
        log = tmp_path / "capturer.log"

        def progress() -> dict[str, Any]:
            try:
                cp = json.loads((tmp_path / "checkpoint.json").read_text())
            except (OSError, ValueError):
                return {}
            return next((t for t in cp["regions"]["r1"].get("snapshot", []) if t["table"] == "t"), {})

        # 1. the TRUNCATE cannot be sent (the start step fails and is retried): killed before it
        monkeypatch.setenv("CAPTURER_FAILPOINTS", "snapshot.begin=eio@1-")
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        target.execute("INSERT INTO d.t VALUES (-1, 'not in the source')")
        port = int(re.search(r"httpPort=(\d+)", cfg.read_text()).group(1))  # type: ignore[union-attr]
        r = requests.post(f"http://127.0.0.1:{port}/snapshot", json={"tables": ["d.t"], "truncate": True},
                          headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r.status_code == 202, r.text
        wait_for(lambda: progress().get("state") == "pending", 60, "the request in the checkpoint")
        p.kill9()
        assert not ddl_lines(tmp_path, "TRUNCATE", "d", "t")
        # 2. the restart sends it, then chunks 0 and 1; chunk 2 fails again and again: killed there
        monkeypatch.setenv("CAPTURER_FAILPOINTS", "snapshot.chunk_read=eio@3-")
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        m.execute("UPDATE d.t SET v = 'changed' WHERE id % 7 = 0", "DELETE FROM d.t WHERE id % 11 = 0")
        wait_for(lambda: progress().get("state") == "running" and progress().get("chunks") == 2, 60,
                 "two chunks acknowledged")
        p.kill9()
        assert len(ddl_lines(tmp_path, "TRUNCATE", "d", "t")) == 1
        # 3. no failure: the copy goes on after chunk 1, without truncating again
        monkeypatch.delenv("CAPTURER_FAILPOINTS")
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        m.execute("UPDATE d.t SET v = 'again' WHERE id % 13 = 0")
        wait_for(lambda: "snapshot of d.t done" in log.read_text(), 120, "the snapshot")
        wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        assert p.stop() == 0
        want = source_rows(m, "d", "t")
        assert source_rows(target, "d", "t") == want
        assert file_tables(tmp_path)[("d", "t")] == want
        assert len(ddl_lines(tmp_path, "TRUNCATE", "d", "t")) == 1
    finally:
        m.stop()


class ShardWriter(threading.Thread):
    """Writes to both shards' keyed and keyless tables at a steady pace."""

    def __init__(self, servers: list[MariaDBInstance]):
        super().__init__(daemon=True)
        self.servers, self.done, self.n, self.error = servers, threading.Event(), 0, None

    def run(self) -> None:
        conns = [m.connect() for m in self.servers]
        try:
            while not self.done.wait(0.01):
                self.n += 1
                i = self.n % len(conns)
                with conns[i].cursor() as cur:
                    base = i * 100_000
                    cur.execute("INSERT INTO d.k VALUES (%s, %s)", (f"w{self.n}", i))
                    if self.n % 3 == 0:
                        cur.execute("DELETE FROM d.k WHERE n = %s LIMIT 1", (i,))
                    cur.execute("INSERT INTO d.t VALUES (%s, %s) ON DUPLICATE KEY UPDATE v = v + 1",
                                (base + self.n % 400, self.n))
                    if self.n % 7 == 0:
                        cur.execute("DELETE FROM d.t WHERE id = %s", (base + (self.n * 13) % 400,))
                conns[i].commit()
        except BaseException as exc:
            self.error = exc
        finally:
            for c in conns:
                c.close()

    def stop(self) -> None:
        self.done.set()
        self.join(60)
        assert self.error is None, self.error


def union_rows(servers: list[MariaDBInstance], db: str, table: str) -> list[str]:
    return sorted(r for m in servers for r in source_rows(m, db, table))


@pytest.mark.every_method
def test_tables_several_regions_deliver_are_copied_in_one_step(tmp_path: Path, target: MariaDBInstance,
                                                                 monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two shards with the same tables, a keyless one among them: ``snapshot=initial``
    copies the keyless table (and, asked with ``truncate``, a keyed one) in one
    coordinated step of both regions (one TRUNCATE, then both regions' rows) while both
    shards are written; killed -9 in the middle of the step, the restart does it again.
    The file, the MySQL target, Kafka and the lake end equal to the union of the shards."""
    pytest.importorskip("pyspark")
    servers = start_servers(tmp_path, 2)
    broker = shared_broker()
    try:
        for i, m in enumerate(servers):
            m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)",
                      "CREATE TABLE d.k (msg VARCHAR(20), n INT)",
                      f"INSERT INTO d.t SELECT seq + {i * 100_000}, seq FROM d.seq_1_to_3000",
                      f"INSERT INTO d.k SELECT CONCAT('m', seq % 50), {i} FROM d.seq_1_to_2000")
        token = "t0k3n-shards"
        senders = (FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port)
                   .replace("type=local,mysql", "type=local,mysql,kafka,spark")
                   + f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
                   f"[spark]\nmaster=local[1]\nwarehouse={tmp_path / 'wh'}\nbatch_interval=0.3\ncompaction_interval=0\n")
        cfg = write_config(tmp_path, servers, senders=senders, extra_global=f"controlToken={token}\n",
                           region_extra="snapshot=initial\nsnapshot_chunk_rows=500\n")
        log = tmp_path / "capturer.log"
        writer = ShardWriter(servers)
        writer.start()
        # killed right after the step's TRUNCATE went out, before the rows
        monkeypatch.setenv("CAPTURER_FAILPOINTS", "snapshot.group=kill@1")
        p = CapturerProcess(cfg, log).start()
        wait_for(lambda: p.proc is not None and p.proc.poll() is not None, 120, "the kill at the coordinated step")
        monkeypatch.delenv("CAPTURER_FAILPOINTS")
        p = CapturerProcess(cfg, log).start()
        p.wait_ready(120)
        wait_for(lambda: "d.k copied in one step with region(s)" in log.read_text(), 120, "the coordinated copy")
        port = re.search(r"httpPort=(\d+)", cfg.read_text()).group(1)  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}"
        target.execute("INSERT INTO d.t VALUES (-1, -1)")  # a stray row a truncating copy removes
        r = requests.post(url + "/snapshot", json={"tables": ["d.t"], "truncate": True},
                          headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r.status_code == 202 and set(r.json()["regions"]) == {"r1", "r2"}, r.text
        wait_for(lambda: log.read_text().count("d.t copied in one step with region(s)") >= 1, 120, "the truncating copy")
        time.sleep(1)
        writer.stop()
        assert writer.n > 20
        wait_for(lambda: checkpoint_covers(tmp_path, servers) and not any(
            x.get("snapshot") for x in json.loads((tmp_path / "checkpoint.json").read_text())["regions"].values()),
            180, "every sender to catch up")
        assert p.stop() == 0
        for table in ("t", "k"):
            assert source_rows(target, "d", table) == union_rows(servers, "d", table), table
            assert file_tables(tmp_path)[("d", table)] == union_rows(servers, "d", table), table
        verify_equal(cfg, ["local", "mysql", "kafka", "spark"], wait=120)
        lines = read_lines(tmp_path)
        assert any(x["op"] == "ddl" and x["sql"].startswith("TRUNCATE") and x["table"] == "t" for x in lines)
    finally:
        broker.kill()
        for m in servers:
            m.stop()


@pytest.mark.parametrize("driver", ["mariadb", "pymysql"])
def test_float_and_char_keys_sql_mode_and_named_system_tables(tmp_path: Path, driver: str,
                                                              capturer_running) -> None:  # type: ignore[no-untyped-def]
    """A FLOAT in the key with more rows sharing one value than a chunk holds (its
    shortest text is not the stored value: rows skipped or a chunk read forever),
    a CHAR key read under the server's PAD_CHAR_TO_FULL_LENGTH, an ENUM key, and a
    table in the `mysql` schema that a filter rule names: every row arrives, once."""
    if driver == "mariadb":
        pytest.importorskip("mariadb")
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d",
                  "CREATE TABLE d.f (f FLOAT NOT NULL, id INT NOT NULL, v INT, PRIMARY KEY (f, id))",
                  "INSERT INTO d.f SELECT 0.7, seq, seq FROM d.seq_1_to_35",
                  "INSERT INTO d.f SELECT 1.1, seq, seq FROM d.seq_1_to_25",
                  "INSERT INTO d.f SELECT seq / 3, seq, seq FROM d.seq_1_to_20",
                  "CREATE TABLE d.c (c CHAR(10) NOT NULL PRIMARY KEY, v INT)",
                  "INSERT INTO d.c SELECT CONCAT('k', seq), seq FROM d.seq_1_to_30",
                  "CREATE TABLE d.e (e ENUM('zz','Aa','m') NOT NULL, id INT NOT NULL, PRIMARY KEY (e, id))",
                  "INSERT INTO d.e SELECT ELT(1 + seq MOD 3, 'zz', 'Aa', 'm'), seq FROM d.seq_1_to_40",
                  "CREATE TABLE mysql.capt_snap (id INT PRIMARY KEY, v VARCHAR(10))",
                  "INSERT INTO mysql.capt_snap VALUES (1, 'a'), (2, 'b')",
                  "FLUSH BINARY LOGS", "PURGE BINARY LOGS BEFORE NOW() + INTERVAL 1 DAY",
                  "SET GLOBAL sql_mode = CONCAT(@@GLOBAL.sql_mode, ',PAD_CHAR_TO_FULL_LENGTH')")
        cfg = write_config(tmp_path, [m], filter_text="include d.*\ninclude mysql.capt_snap\n",
                           region_extra=f"snapshot=initial\nsnapshot_driver={driver}\nsnapshot_chunk_rows=10\n"
                                        "snapshot_workers=2\n")
        with capturer_running(cfg) as cap:
            wait_for(lambda: snapshot_done(cap), 60, "the snapshot")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            snap = cap.snapshot()["regions"]["r1"]["snapshot"]["tables"]
        assert {t: s["state"] for t, s in snap.items()} == dict.fromkeys(("d.f", "d.c", "d.e", "mysql.capt_snap"), "done")
        c = m.connect()
        want = {}
        with c.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")
            for db, t, cols in (("d", "f", "CAST(f AS DOUBLE) AS f, id, v"), ("d", "c", "*"), ("d", "e", "*"),
                                ("mysql", "capt_snap", "*")):
                cur.execute(f"SELECT {cols} FROM {db}.{t}")
                names = [x[0] for x in cur.description]
                want[(db, t)] = sorted(json.dumps(json_row(dict(zip(names, r)), set()), sort_keys=True)
                                       for r in cur.fetchall())
        c.close()
        got = file_tables(tmp_path)
        for k, rows in want.items():
            assert got.get(k) == rows, k
        reads: dict[tuple[str, str], list[str]] = defaultdict(list)
        for x in read_lines(tmp_path):
            if x["op"] == "read":
                reads[(x["db"], x["table"])].append(json.dumps(x["after"], sort_keys=True))
        for k, rows in want.items():  # each row exactly once: none skipped, none read twice
            assert sorted(reads[k]) == rows, k
    finally:
        try:
            m.execute("SET GLOBAL sql_mode = DEFAULT")
        finally:
            m.stop()


@pytest.mark.every_method
def test_key_changed_during_the_copy(tmp_path: Path, target: MariaDBInstance, capturer_running,
                                     monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The primary key changes while chunks are being delivered: the last key taken
    with the old key means nothing for the new one, so the table is copied again
    from its start (by its new key), and the target ends equal to the source."""
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT NOT NULL, v INT NOT NULL, w VARCHAR(10), "
                                       "PRIMARY KEY (id))",
                  "INSERT INTO d.t SELECT seq, 1000 - seq, 'x' FROM d.seq_1_to_300")
        cfg = write_config(tmp_path, [m],
                           senders=FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port),
                           region_extra="snapshot=initial\nsnapshot_chunk_rows=50\nsnapshot_workers=1\n")
        pause = Pause(monkeypatch, "snapshot.chunk_read", 3)
        with capturer_running(cfg) as cap:
            pause.wait("chunk 2 to be read")
            m.execute("ALTER TABLE d.t DROP PRIMARY KEY, ADD PRIMARY KEY (v, id)",
                      "UPDATE d.t SET w = 'after' WHERE id % 9 = 0", "DELETE FROM d.t WHERE id % 10 = 0")
            wait_for(lambda: stream_passed(cap, m), 60, "the stream to read the ALTER")
            pause.release()
            wait_for(lambda: snapshot_done(cap), 60, "the snapshot")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        assert source_rows(target, "d", "t") == source_rows(m, "d", "t")
        reads = [x for x in read_lines(tmp_path) if x["op"] == "read"]
        new_key = [x for x in reads if x["pk"] == ["v", "id"]]
        assert {x["after"]["id"] for x in new_key} == {i for i in range(1, 301) if i % 10}  # again from the start
    finally:
        m.stop()


def test_crash_before_the_first_checkpoint_resumes_the_same_start(tmp_path: Path, monkeypatch) -> None:
    """kill -9 after chunks reached the file but before any checkpoint was written:
    the restart must read the binlog from the snapshot's own start (written before
    anything was sent), so rows deleted meanwhile are deleted in the file too,
    instead of starting a new snapshot from a later position."""
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(20))",
                  "INSERT INTO d.t SELECT seq, CONCAT('v', seq) FROM d.seq_1_to_1000")
        cfg = write_config(tmp_path, [m], region_extra="snapshot=initial\nsnapshot_ddl=false\n"
                                                       "snapshot_chunk_rows=100\nsnapshot_workers=1\n")
        # no checkpoint on a timer: only what the capturer writes at start
        cfg.write_text(cfg.read_text().replace("checkpointInterval=0.5", "checkpointInterval=3600"))
        log = tmp_path / "capturer.log"
        monkeypatch.setenv("CAPTURER_FAILPOINTS", "local.write=kill@3")  # two blocks written, then killed
        p = CapturerProcess(cfg, log).start()
        assert p.proc is not None
        out = tmp_path / "out" / "changes.jsonl"
        wait_for(lambda: p.proc.poll() is not None or (out.exists() and b"\n" in out.read_bytes()), 120,  # type: ignore[union-attr]
                 "chunk 0 in the file")
        if p.proc.poll() is None:  # a copy fast enough to reach the file in fewer blocks: killed here (no checkpoint yet)
            p.kill9()
        assert p.proc.returncode == -9
        first = [json.loads(x)["after"]["id"] for x in out.read_text().split("\n")[:-1]]  # (complete lines)
        assert first and min(first) == 1  # chunk 0 reached the file
        cp = json.loads((tmp_path / "checkpoint.json").read_text())  # only the start was written
        assert cp["commit_ts"] == 0 and [t["state"] for t in cp["regions"]["r1"]["snapshot"]] == ["pending"]
        m.execute("DELETE FROM d.t WHERE id <= 150", "UPDATE d.t SET v = 'later' WHERE id % 7 = 0")
        monkeypatch.delenv("CAPTURER_FAILPOINTS")
        cfg.write_text(cfg.read_text().replace("checkpointInterval=3600", "checkpointInterval=0.5"))
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        wait_for(lambda: "snapshot of d.t done" in log.read_text(), 120, "the snapshot")
        wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        assert p.stop() == 0
        assert file_tables(tmp_path)[("d", "t")] == source_rows(m, "d", "t")
        runs = {x["snapshot"]["run"] for x in read_lines(tmp_path) if x["op"] == "read"}
        assert len(runs) == 1  # the same run, resumed
    finally:
        m.stop()


def test_when_needed_after_a_purge_removes_rows_deleted_in_the_gap(tmp_path: Path, target: MariaDBInstance,
                                                                   capturer_running) -> None:  # type: ignore[no-untyped-def]
    """snapshot=when_needed and the resume position purged: every table is copied
    again, emptied downstream first, so rows deleted while the binlog was lost go."""
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(20))",
                  "CREATE TABLE d.k (msg VARCHAR(20))",
                  "INSERT INTO d.t SELECT seq, CONCAT('v', seq) FROM d.seq_1_to_300",
                  "INSERT INTO d.k SELECT CONCAT('m', seq MOD 4) FROM d.seq_1_to_12")
        cfg = write_config(tmp_path, [m],
                           senders=FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port),
                           region_extra="snapshot=when_needed\nsnapshot_chunk_rows=50\n")
        with capturer_running(cfg) as cap:
            wait_for(lambda: snapshot_done(cap), 60, "the first copy")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        # stopped: rows go, and the binlog that says so is purged
        m.execute("DELETE FROM d.t WHERE id % 3 = 0", "UPDATE d.t SET v = 'gap' WHERE id % 5 = 0",
                  "DELETE FROM d.k WHERE msg = 'm1' LIMIT 2", "FLUSH BINARY LOGS")
        resume = json.loads((tmp_path / "checkpoint.json").read_text())["regions"]["r1"]["file"]

        def purged() -> bool:  # (a binlog still open by the old dump thread is kept: again until it went)
            m.execute("PURGE BINARY LOGS BEFORE NOW() + INTERVAL 1 DAY")
            c = m.connect()
            with c.cursor() as cur:
                cur.execute("SHOW BINARY LOGS")
                names = [str(r[0]) for r in cur.fetchall()]
            c.close()
            return resume not in names

        wait_for(purged, 60, "the resume position to be purged")
        with capturer_running(cfg) as cap:
            wait_for(lambda: snapshot_done(cap), 60, "the copy after the purge")
            m.execute("DELETE FROM d.t WHERE id = 1")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        for t in ("t", "k"):
            want = source_rows(m, "d", t)
            assert source_rows(target, "d", t) == want, t
            assert file_tables(tmp_path)[("d", t)] == want, t
    finally:
        m.stop()


def test_create_tables_first_even_when_show_create_failed_once(tmp_path: Path, target: MariaDBInstance,
                                                               capturer_running, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """SHOW CREATE TABLE fails part-way through the up-front CREATEs of an initial
    snapshot: the retry still sends every table's CREATE before anything else, so a
    change to a table whose copy has not started finds it on the (new) target."""
    import capturer.util.failpoints as fp

    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", *[f"CREATE TABLE d.{t} (id INT PRIMARY KEY, v INT)" for t in "abc"],
                  *[f"INSERT INTO d.{t} SELECT seq, seq FROM d.seq_1_to_30" for t in "abc"],
                  "FLUSH BINARY LOGS", "PURGE BINARY LOGS BEFORE NOW() + INTERVAL 1 DAY")
        cfg = write_config(tmp_path, [m],
                           senders=FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port),
                           region_extra="snapshot=initial\nsnapshot_chunk_rows=10\nsnapshot_workers=1\n")
        monkeypatch.setattr(fp, "_RULES", {"snapshot.create": ("eio", 2, 2)})  # the 2nd SHOW CREATE fails
        monkeypatch.setattr(fp, "_COUNTS", {})
        pause = Pause(monkeypatch, "snapshot.chunk_read", 1)  # the first chunk (of d.a) waits
        with capturer_running(cfg) as cap:
            pause.wait("the first chunk")
            m.execute("INSERT INTO d.c VALUES (100, 100)", "UPDATE d.b SET v = -v WHERE id = 5")
            wait_for(lambda: stream_passed(cap, m), 60)
            pause.release()
            wait_for(lambda: snapshot_done(cap), 60, "the snapshot")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            assert cap.regions[0].reconnects >= 1  # (the failure did happen)
        for t in "abc":
            assert source_rows(target, "d", t) == source_rows(m, "d", t), t
        lines = read_lines(tmp_path)
        for t in "bc":
            create = next(i for i, x in enumerate(lines) if x["op"] == "ddl" and x["table"] == t)
            change = next(i for i, x in enumerate(lines) if x["op"] in ("insert", "update") and x["table"] == t)
            assert create < change, t
    finally:
        m.stop()


def test_kill9_during_an_initial_snapshot_keeps_every_identity(tmp_path: Path, target: MariaDBInstance,
                                                               monkeypatch) -> None:
    """An initial snapshot with its CREATE statements sent first (snapshot_ddl, the
    default), a keyed and a keyless table written to all along, kill -9 before the
    first checkpoint and again later: every binlog transaction sent again after a
    restart has the commit_ts it had (one identity per source transaction: a
    keyless table would otherwise get its rows twice), and the file and the MySQL
    target equal the source."""
    (m,) = start_servers(tmp_path, 1)
    stop = threading.Event()
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(20))",
                  "CREATE TABLE d.k (msg VARCHAR(20), n INT)",
                  "INSERT INTO d.t SELECT seq, CONCAT('v', seq) FROM d.seq_1_to_2000",
                  "INSERT INTO d.k SELECT 'old', seq % 5 FROM d.seq_1_to_300",
                  # more tables, so that some are still to be copied at each kill (their CREATE
                  # statements were sent first, and must not be sent again in front of a replay)
                  *[f"CREATE TABLE d.p{i} (id INT PRIMARY KEY) SELECT seq AS id FROM d.seq_1_to_400" for i in range(6)])
        cfg = write_config(tmp_path, [m],
                           senders=FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port),
                           region_extra="snapshot=initial\nsnapshot_chunk_rows=100\nsnapshot_workers=1\n")
        cfg.write_text(cfg.read_text().replace("checkpointInterval=0.5", "checkpointInterval=3600"))
        log = tmp_path / "capturer.log"

        def writes() -> None:
            c = m.connect()
            c.autocommit(True)
            i = 0
            with c.cursor() as cur:
                while not stop.is_set():
                    i += 1
                    cur.execute("UPDATE d.t SET v = %s WHERE id = %s", (f"w{i}", (i * 37) % 2000 + 1))
                    cur.execute("INSERT INTO d.k VALUES (%s, %s)", (f"n{i % 3}", i % 5))
                    if i % 4 == 0:
                        cur.execute("DELETE FROM d.k WHERE n = %s LIMIT 1", (i % 5,))
                    time.sleep(0.005)
            c.close()

        w = threading.Thread(target=writes, daemon=True)
        w.start()
        # 1. killed at the 6th chunk read (binlog changes already in the file, tables still to
        # copy), before any checkpoint but the pinned start
        monkeypatch.setenv("CAPTURER_FAILPOINTS", "snapshot.chunk_read=kill@6")
        p = CapturerProcess(cfg, log).start()
        assert p.proc is not None and p.proc.wait(120) == -9
        # 2. again, after checkpoints
        cfg.write_text(cfg.read_text().replace("checkpointInterval=3600", "checkpointInterval=0.5"))
        p = CapturerProcess(cfg, log).start()
        assert p.proc is not None and p.proc.wait(120) == -9
        monkeypatch.delenv("CAPTURER_FAILPOINTS")
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        wait_for(lambda: all(f"snapshot of d.{x} done" in log.read_text() for x in ("t", "k", "p5")),
                 180, "every copy")
        stop.set()
        w.join()
        wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        assert p.stop() == 0
        lines = read_lines(tmp_path)
        at: dict[str, set[int]] = {}
        for x in lines:
            if x["op"] not in ("ddl", "read") and x.get("gtid"):
                at.setdefault(x["gtid"], set()).add(x["commit_ts"])
        moved = {g: sorted(t) for g, t in at.items() if len(t) > 1}
        assert not moved, f"{len(moved)} transactions sent again under another commit_ts, e.g. {list(moved.items())[:3]}"
        seen: dict[tuple[Any, ...], str] = {}
        for x in lines:
            if x["op"] == "read":
                continue
            k = (x["region"], x["commit_ts"], x["seq"])
            body = json.dumps({a: b for a, b in x.items() if a != "snapshot"}, sort_keys=True)
            assert seen.setdefault(k, body) == body, f"two changes share {k}"
        files = file_tables(tmp_path)
        for t in ("t", "k", "p0", "p5"):
            want = source_rows(m, "d", t)
            assert files[("d", t)] == want, t
            assert source_rows(target, "d", t) == want, t
    finally:
        stop.set()
        m.stop()


@pytest.mark.every_method
def test_watermark_read_waits_out_a_writers_lock(tmp_path: Path, capturer_running, snapshot_method: str) -> None:  # type: ignore[no-untyped-def]
    """The watermark method reads a chunk with shared locks and NOWAIT: a writer that
    holds a row of the chunk (its transaction open) makes the read fail and be made
    again, never wait while holding locks; once the writer commits, the chunk goes
    out with the row as committed (or without it, as the stream delivers it) and the
    file equals the source."""
    if snapshot_method != "watermark":
        pytest.skip("the watermark method's locking read")
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(20))",
                  "INSERT INTO d.t SELECT seq, CONCAT('v', seq) FROM d.seq_1_to_300",
                  "CREATE TABLE d.nokey (a INT, b VARCHAR(10))",
                  "INSERT INTO d.nokey SELECT seq % 7, 'x' FROM d.seq_1_to_50")
        cfg = write_config(tmp_path, [m], region_extra="start=latest\nsnapshot_chunk_rows=100\nsnapshot_workers=1\n")
        with capturer_running(cfg) as cap:
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
            writer = m.connect()
            writer.autocommit(False)
            with writer.cursor() as cur:  # a writer holds row 150 (chunk 1) and a row of the keyless table
                cur.execute("UPDATE d.t SET v = 'held' WHERE id = 150")
                cur.execute("UPDATE d.nokey SET b = 'held' WHERE a = 3")
            cap.request_snapshot(["d.t", "d.nokey"])
            region = cap.regions[0]
            wait_for(lambda: region.snapshotter is not None and region.snapshotter.lock_retries >= 2, 60,
                     "the locking read to meet the writer's lock")
            assert cap.snapshot()["regions"]["r1"]["snapshot"]["method"] == "watermark"
            time.sleep(0.5)
            writer.commit()
            writer.close()
            m.execute("UPDATE d.t SET v = 'after' WHERE id IN (149, 151)")
            wait_for(lambda: snapshot_done(cap), 60, "the snapshot")
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 60)
        got = file_tables(tmp_path)
        assert got[("d", "t")] == source_rows(m, "d", "t")
        assert sorted(r for r in got[("d", "nokey")]) == source_rows(m, "d", "nokey")
        assert any(x["op"] == "read" and x["table"] == "t" for x in read_lines(tmp_path))
    finally:
        m.stop()


@pytest.mark.every_method
@pytest.mark.parametrize("driver", ["mariadb", "pymysql"])
def test_a_locking_read_stopped_by_a_lock_is_made_again_never_cut_short(tmp_path: Path, snapshot_method: str,
                                                                        driver: str) -> None:
    """A keyless table is one locking read of the whole table, streamed. A writer's
    lock on its last row stops that read with an error in the middle of the rows;
    MariaDB Connector/Python's unbuffered cursor reads that error as the end of the
    rows, silently: the copy missed the row and every row after it, and a writer that
    committed before the position read next lost its row (seen in CI: one row of a
    keyless table missing downstream). Here the stream raises the lock error, the
    read is made again, and once the writer commits the copy has every row."""
    if snapshot_method != "watermark":
        pytest.skip("the watermark method's locking read")
    if driver == "mariadb":
        pytest.importorskip("mariadb")
    from capturer.app import Capturer, load_config
    from capturer.regions.mysql.snapshot import LOCK_ERRORS, MySQLSnapshotter, Reader, describe
    from capturer.regions.snapshot import TableProgress

    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.k (msg VARCHAR(20), n INT)",
                  "INSERT INTO d.k SELECT CONCAT('m', seq), 0 FROM d.seq_1_to_20000")
        cfg = write_config(tmp_path, [m], region_extra=f"snapshot_driver={driver}\n")
        region = Capturer(load_config(cfg)).regions[0]
        writer = m.connect()
        writer.autocommit(False)
        with writer.cursor() as cur:
            cur.execute("INSERT INTO d.k VALUES ('last', 1)")  # uncommitted: its row is locked
        reader = Reader(region)  # type: ignore[arg-type]
        assert reader.kind == driver and reader.method == "watermark"
        reader.execute("START TRANSACTION")
        with pytest.raises(Exception) as got:
            n = sum(len(b) for b in reader.stream("SELECT msg, n FROM d.k" + reader.lock_clause(0), (), 5000))
            pytest.fail(f"the locking read met the writer's lock and returned {n} rows without an error")
        assert reader.is_error(got.value) and reader.errno(got.value) in LOCK_ERRORS, repr(got.value)
        reader.execute("COMMIT")
        # the snapshotter's read of the whole table makes the read again until the lock is gone
        threading.Timer(1.0, writer.commit).start()
        plan = describe(reader, "d", "k")
        snap = MySQLSnapshotter(region, 1, 1000)  # type: ignore[arg-type]
        chunk = snap._read(reader, plan, TableProgress("d", "k", "run"))
        rows = [ch.after for part in chunk.spilled.chunks() for ch in part]  # type: ignore[union-attr]
        assert len(rows) == 20001 and {"msg": "last", "n": 1} in rows
        assert snap.lock_retries >= 1
        reader.close()
        writer.close()
    finally:
        m.stop()
