"""``verify`` (issue 31) with real servers: two MariaDB sources under load, a MariaDB
target, an Apache Kafka broker, the file and the lake; the capturer as ``python -m capturer``.

* every sink equal: exit 0, every table of every sender "equal";
* then one planted difference of each kind in each sink (a missing row, an extra row,
  a row under an old primary key, a changed value in a column of each type family)
  is found and named with its table and key: exit 1;
* a paused sender is "not caught up" (exit 3), never "different";
* ``POST /verify`` runs it in the capturer: progress and result on /status and /metrics;
* a PostgreSQL region (keyed, and keyless under REPLICA IDENTITY FULL) against the file.

The independent comparison (tests/workload.py's, by hand) is run beside it in the
first test, so verify itself is checked against something that is not verify.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import ROOT, CapturerProcess, checkpoint_covers, shared_broker, start_servers, wait_for
from workload import SCHEMA, assert_target_equals_sources, file_state_equals

from devtools.local_mariadb import MariaDBInstance, free_port
from integration.test_independent_senders import Load

pytestmark = pytest.mark.integration
TOKEN = "t0ken-verify"

TYPES = [
    """CREATE TABLE IF NOT EXISTS app.types (
        id INT PRIMARY KEY, i BIGINT, d DECIMAL(12,3), f DOUBLE, dt DATETIME(3), ts TIMESTAMP(0) NULL,
        dd DATE, tm TIME, b VARBINARY(16), bt BIT(10), st SET('a','b','c'), j JSON, t TEXT)""",
]
# one column of each type family, and a value it is changed to in the target
FAMILIES = {"i": 77, "d": "1.001", "f": 2.5, "dt": "2001-02-03 04:05:06.789", "ts": "2002-03-04 05:06:07",
            "dd": "2003-04-05", "tm": "01:02:03", "b": b"\x00zz", "bt": 5, "st": "a", "j": '{"k": 9}', "t": "changed"}


def query(m: MariaDBInstance, sql: str) -> list[tuple[Any, ...]]:
    conn = m.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def run_verify(cfg: Path, *args: str, timeout: float = 600) -> tuple[int, dict[str, Any]]:
    p = subprocess.run([sys.executable, "-m", "capturer", "verify", "--config", str(cfg), "--json", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert p.returncode in (0, 1, 3), (p.returncode, p.stdout[-3000:], p.stderr[-3000:], json.loads(p.stdout)["errors"] if p.stdout.startswith("{") else "")
    return p.returncode, json.loads(p.stdout)


def write_config(tmp: Path, regions: str, port: int | None = None, extra: str = "") -> Path:
    """config.cfg (and an empty filter) next to the test's senderConfig.cfg."""
    (tmp / "filter_rule.txt").write_text("")
    cfg = tmp / "config.cfg"
    cfg.write_text(f"[global]\nbinlogCheckPointPath={tmp / 'checkpoint.json'}\nsenderConfig={tmp / 'senderConfig.cfg'}\n"
                   f"filterRuleDict={tmp / 'filter_rule.txt'}\nhttpPort={port or free_port()}\ncheckpointInterval=0.5\n"
                   f"{extra}{regions}")
    return cfg


def by_table(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(t["sender"], t["table"]): t for t in report["tables"]}


@pytest.fixture()
def rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    sources = start_servers(tmp_path, 2)
    for i, m in enumerate(sources):
        m.execute(*SCHEMA, *TYPES)
        base = 1000 * (i + 1)
        m.execute(*[f"INSERT INTO app.types VALUES ({base + k}, {k} * 1000000007, {k}.125, {k} / 3, "
                    f"'2026-11-2{k % 9} 10:11:12.345', '2026-01-0{1 + k % 9} 01:02:03', '2026-02-0{1 + k % 9}', "
                    f"'-12:34:56', 0x00ff{k:02x}, b'101{k % 2}', 'b,c', '{{\"a\": [1, {k}]}}', 'ünï {k}')"
                    for k in range(8)])
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    broker = shared_broker()
    port = free_port()
    (tmp_path / "senderConfig.cfg").write_text(
        "[global]\ntype=local,mysql,kafka,spark\n"
        f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
        f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n"
        f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
        f"[spark]\nwarehouse={tmp_path / 'wh'}\nwriter=arrow\nbatch_interval=1\nbatch_rows=500\n"
        "compaction_interval=0\nmaster=local[1]\n")
    regions = "".join(
        f"\n[region:r{i + 1}]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\npassword=capturer\n"
        f"server_id={800 + i}\nheartbeat_ms=200\n" for i, m in enumerate(sources))
    cfg = write_config(tmp_path, regions, port, f"controlToken={TOKEN}\n")
    cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    rig = {"sources": sources, "target": target, "broker": broker, "tmp": tmp_path, "cfg": cfg, "cap": cap,
           "url": f"http://127.0.0.1:{port}"}
    try:
        cap.wait_ready()
        yield rig
    finally:
        cap.stop()
        broker.kill()
        for srv in [*sources, target]:
            try:
                srv.stop()
            except Exception:
                pass


def post(rig: dict[str, Any], path: str, body: dict[str, Any] | None = None) -> requests.Response:
    return requests.post(rig["url"] + path, headers={"Authorization": f"Bearer {TOKEN}"}, json=body or {},
                         timeout=10)


def _caught_up(rig: dict[str, Any]) -> None:
    wait_for(lambda: checkpoint_covers(rig["tmp"], rig["sources"]), 180, "every sender caught up")


def test_every_sink_equal_then_each_planted_difference_named(rig: dict[str, Any]) -> None:
    sources, target, tmp = rig["sources"], rig["target"], rig["tmp"]
    with Load(sources, pace=0.02) as load:
        time.sleep(4)
        # while the load runs: a lagging sender gives no false alarm (exit 0 or 3, never 1)
        code, report = run_verify(rig["cfg"], "--sender", "mysql", "--wait", "30")
        assert code in (0, 3), report
        assert not [t for t in report["tables"] if t["status"] == "different"], report
    assert load.rows > 100
    _caught_up(rig)
    # the independent comparison, by hand
    assert_target_equals_sources(sources, target)
    file_state_equals(tmp, sources)
    code, report = run_verify(rig["cfg"], "--wait", "20")
    assert code == 0, json.dumps(report, indent=1)[:4000]
    tables = by_table(report)
    for sender in ("local", "mysql", "kafka", "spark"):
        for t in ("app.users", "app.pairs", "app.log", "app.types"):
            assert tables[(sender, t)]["status"] == "equal", tables[(sender, t)]
            assert tables[(sender, t)]["rows"] > 0
    assert tables[("mysql", "app.users")]["method"] == "chunk checksums"
    assert tables[("local", "app.users")]["rows"] == tables[("mysql", "app.users")]["rows"]

    # --- planted differences in the MySQL target --------------------------------------
    ids = sorted(r[0] for r in query(target, "SELECT id FROM app.users"))
    gone, changed = ids[0], ids[1]
    target.execute(f"DELETE FROM app.users WHERE id={gone}",
                   f"UPDATE app.users SET name='planted' WHERE id={changed}",
                   # a row under an old primary key (the source moved it: here it never existed)
                   "INSERT INTO app.users (id, email, name) SELECT id + 900000, CONCAT('old-', email), name "
                   f"FROM app.users WHERE id={ids[2]}",
                   "INSERT INTO app.log (msg) VALUES ('planted extra')")
    type_ids = sorted(r[0] for r in query(target, "SELECT id FROM app.types"))
    conn = target.connect()
    with conn.cursor() as cur:
        cur.execute("SET time_zone='+00:00'")
        for (col, val), tid in zip(FAMILIES.items(), type_ids):
            cur.execute(f"UPDATE app.types SET `{col}`=%s WHERE id=%s", (val, tid))
    conn.commit()
    conn.close()
    code, report = run_verify(rig["cfg"], "--sender", "mysql", "--wait", "10")
    assert code == 1, report
    t = by_table(report)
    users = t[("mysql", "app.users")]
    assert users["status"] == "different" and (users["missing"], users["extra"], users["different"]) == (1, 1, 1), users
    text = " ".join(users["examples"])
    assert f"id={gone}" in text and f"id={changed}" in text and f"id={ids[2] + 900000}" in text, users
    assert "planted" in text
    types = t[("mysql", "app.types")]
    assert types["different"] == len(FAMILIES), types
    assert t[("mysql", "app.log")]["extra"] == 1 and t[("mysql", "app.log")]["status"] == "different"
    assert t[("mysql", "app.pairs")]["status"] == "equal"

    # --- the file: a forged update and a forged insert (identities no real change has) -------
    from senders.local.replay import read_changes, rebuild

    last = [d for d in read_changes(tmp / "out" / "changes.jsonl") if d.get("table") == "users" and d.get("after")][-1]
    live = max(rebuild(read_changes(tmp / "out" / "changes.jsonl"))[("app", "users")].values(), key=lambda r: r["id"])
    forged = dict(last, commit_ts=last["commit_ts"] + 10**12, seq=0, op="update", before=live,
                  after=dict(live, name="forged"))
    extra = dict(last, commit_ts=last["commit_ts"] + 10**12 + 1, seq=0, op="insert", before=None,
                 after=dict(last["after"], id=777777))
    with open(tmp / "out" / "changes.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(forged) + "\n" + json.dumps(extra) + "\n")
    # --- Kafka: a forged value for a key of app.pairs ----------------------------------
    from confluent_kafka import Consumer, Producer, TopicPartition

    c = Consumer({"bootstrap.servers": rig["broker"].servers, "group.id": "t", "auto.offset.reset": "earliest",
                  "enable.partition.eof": True})
    c.assign([TopicPartition("capturer.app.pairs", p, 0) for p in range(3)])
    msg = None
    for _ in range(40):
        for m in c.consume(100, 0.5):
            if m.error() is None and m.value() and json.loads(m.value())["op"] in ("c", "u", "r"):
                msg = m
        if msg is not None:
            break
    c.close()
    assert msg is not None
    body = json.loads(msg.value())
    body["after"] = dict(body["after"], note="forged in kafka") if "note" in body["after"] else \
        {k: (v if k in ("a", "b") else "forged") for k, v in body["after"].items()}
    hdrs = [(k, v) for k, v in (msg.headers() or []) if k != "commit_ts"] + [("commit_ts", b"1")]
    p = Producer({"bootstrap.servers": rig["broker"].servers})
    p.produce("capturer.app.pairs", key=msg.key(), value=json.dumps(body).encode(), partition=msg.partition(),
              headers=hdrs)
    p.flush(10)
    # --- the lake: a delete of one key, committed as a changelog file -------------------
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((tmp / "wh").glob("app__users/changelog/**/*.parquet"))
    live = set()
    for m in rig["sources"]:  # a key the source still has (the newest change may be a delete)
        c = m.connect()
        with c.cursor() as cur:
            cur.execute("SELECT id FROM app.users")
            live |= {r[0] for r in cur.fetchall()}
        c.close()
    for f in reversed(files):
        tab = pq.read_table(f)
        cands = [r for r in tab.to_pylist() if r["_op"] != "d" and r["id"] in live]
        if cands:
            row = cands[-1]
            break
    row.update(_op="d", _commit_ts=row["_commit_ts"] + 10**12)
    pq.write_table(pa.Table.from_pylist([row], schema=tab.schema), f.parent / "zz-planted.parquet")
    lake_key = row["id"]

    code, report = run_verify(rig["cfg"], "--wait", "10")
    assert code == 1, report
    t = by_table(report)
    fu = t[("local", "app.users")]
    assert (fu["different"], fu["extra"]) == (1, 1) and "forged" in " ".join(fu["examples"]), fu
    assert "id=777777" in " ".join(fu["examples"])
    kp = t[("kafka", "app.pairs")]
    assert kp["status"] == "different" and kp["different"] == 1, kp
    lu = t[("spark", "app.users")]
    assert lu["status"] == "different" and lu["missing"] == 1 and f"id={lake_key}" in " ".join(lu["examples"]), lu
    assert t[("kafka", "app.users")]["status"] == "equal" and t[("spark", "app.pairs")]["status"] == "equal"


def test_a_paused_sender_is_not_caught_up_and_post_verify_reports_on_status(rig: dict[str, Any]) -> None:
    sources = rig["sources"]
    _caught_up(rig)
    assert post(rig, "/senders/local/pause").status_code == 200
    sources[0].execute("INSERT INTO app.users (id, email, name) VALUES (4242, 'x@y', 'after the pause')")
    code, report = run_verify(rig["cfg"], "--sender", "local", "--wait", "3")
    assert code == 3, report
    users = by_table(report)[("local", "app.users")]
    assert users["status"] == "not caught up" and "behind" in users["note"], users
    assert not [t for t in report["tables"] if t["status"] == "different"], report
    assert post(rig, "/senders/local/resume").status_code == 200

    # the running capturer verifies itself
    r = post(rig, "/verify", {"senders": ["mysql", "local"], "wait": 30})
    assert r.status_code == 202, r.text
    assert post(rig, "/verify", {}).status_code == 409  # one at a time
    assert post(rig, "/verify", {"senders": ["nope"]}).status_code in (400, 409)
    assert requests.post(rig["url"] + "/verify", json={}, timeout=5).status_code in (401, 403)  # token
    wait_for(lambda: requests.get(rig["url"] + "/status", timeout=5).json()["verify"]["state"] == "idle", 300,
             "POST /verify to finish")
    v = requests.get(rig["url"] + "/status", timeout=5).json()["verify"]
    assert v["last"]["exit_code"] == 0, v
    assert {t["sender"] for t in v["last"]["tables"]} == {"mysql", "local"}
    metrics = requests.get(rig["url"] + "/metrics", timeout=5).text
    assert 'capturer_verify_equal{sender="mysql",table="app.users"} 1.0' in metrics
    assert "capturer_verify_exit_code 0.0" in metrics
    # a difference found by the running capturer
    rig["target"].execute("DELETE FROM app.users WHERE id=4242")
    assert post(rig, "/verify", {"senders": ["mysql"], "tables": ["app.users"], "wait": 10}).status_code == 202
    time.sleep(0.5)
    wait_for(lambda: requests.get(rig["url"] + "/status", timeout=5).json()["verify"]["state"] == "idle", 300,
             "POST /verify to finish")
    last = requests.get(rig["url"] + "/status", timeout=5).json()["verify"]["last"]
    assert last["exit_code"] == 1 and last["tables"][0]["missing"] == 1, last
    assert "id=4242" in " ".join(last["tables"][0]["examples"])


def test_unreachable_destination_and_bad_arguments(rig: dict[str, Any]) -> None:
    p = subprocess.run([sys.executable, "-m", "capturer", "verify", "--config", str(rig["cfg"]), "--sender", "nope"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no sender nope" in p.stderr, p.stderr
    _caught_up(rig)
    os.kill(rig["target"].proc.pid, signal.SIGKILL)
    rig["target"].proc.wait()
    p = subprocess.run([sys.executable, "-m", "capturer", "verify", "--config", str(rig["cfg"]), "--sender", "mysql",
                        "--wait", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "sender mysql" in p.stdout and "Can't connect" in p.stdout or "OperationalError" in p.stdout, p.stdout
    assert "password" not in p.stdout.lower()


def test_postgresql_region_every_type_and_a_keyless_table(tmp_path: Path) -> None:
    """A PostgreSQL region (the hostile schema: every common type, hostile names, a keyless
    table under REPLICA IDENTITY FULL, TOAST) -> the file and a MySQL target: equal, then a
    row deleted in the target and one duplicated in the keyless table are named."""
    from devtools.local_postgres import PostgresInstance
    from devtools.pg_workload import TABLES as PG_TABLES
    from devtools.pg_workload import Workload as PgWorkload
    from devtools.pg_workload import apply_schema

    pg = PostgresInstance().start()
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    try:
        apply_schema(pg)
        (tmp_path / "senderConfig.cfg").write_text(
            f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")
        cfg = write_config(tmp_path, f"\n[region:pg]\ntype=postgresql\nhost=127.0.0.1\nport={pg.port}\n"
                           "user=postgres\ndbname=postgres\ncreate_publication=all\nheartbeat_ms=200\nstatus_interval=1\n")
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        try:
            cap.wait_ready()
            time.sleep(2)
            w = PgWorkload(pg, seed=5)
            for _ in range(80):
                with pg.connect(autocommit=False) as c:
                    w.step(c)
            code, report = run_verify(cfg, "--wait", "60")
            assert code == 0, json.dumps([x for x in report["tables"] if x["status"] != "equal"], indent=1)[:6000]
            t = by_table(report)
            names = {f"{db}.{table}" for db, table in PG_TABLES}
            for sender in ("local", "mysql"):
                for n in names:
                    assert t[(sender, n)]["status"] == "equal", t[(sender, n)]
            assert t[("mysql", "public.keyless")]["method"] == "rows"
            with target.connect() as conn, conn.cursor() as cur:
                cur.execute("SELECT a, b FROM public.multi ORDER BY a, b LIMIT 1")
                ga, gb = cur.fetchone()
                cur.execute("DELETE FROM public.multi WHERE a=%s AND b=%s", (ga, gb))
                cur.execute("INSERT INTO public.keyless SELECT * FROM public.keyless LIMIT 1")
                conn.commit()
            code, report = run_verify(cfg, "--sender", "mysql", "--wait", "10")
            assert code == 1, report
            t = by_table(report)
            assert t[("mysql", "public.multi")]["missing"] == 1, t[("mysql", "public.multi")]
            assert f"a={ga}" in " ".join(t[("mysql", "public.multi")]["examples"])
            assert t[("mysql", "public.keyless")]["extra"] == 1, t[("mysql", "public.keyless")]
        finally:
            cap.stop()
    finally:
        target.stop()
        pg.destroy()


@pytest.mark.parametrize("fmt", ["canal", "protobuf"])
def test_kafka_canal_and_protobuf_formats_and_the_file_in_sql_format(tmp_path: Path, fmt: str) -> None:
    """format=canal and format=protobuf topics are read back as json ones are (every type
    family of app.types); a file in format=sql is "cannot check" (exit 3), not "equal"."""
    [src] = start_servers(tmp_path, 1)
    src.execute(*SCHEMA, *TYPES)
    broker = shared_broker()
    try:
        (tmp_path / "senderConfig.cfg").write_text(
            "[global]\ntype=kafka,local\n"
            f"[kafka]\nservers={broker.servers}\nclient=confluent\nformat={fmt}\ntopic={fmt}.{{db}}.{{table}}\n"
            f"[local]\nfilepath={tmp_path / 'out.sql'}\nformat=sql\n")
        cfg = write_config(tmp_path, f"\n[region:r1]\ntype=mysql\nhost=127.0.0.1\nport={src.port}\nuser=capturer\n"
                           "password=capturer\nserver_id=801\nheartbeat_ms=200\n")
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        try:
            cap.wait_ready()
            with Load([src], pace=0.01):
                src.execute(*[f"INSERT INTO app.types VALUES ({k}, {k} * 1000000007, {k}.125, {k} / 3, "
                              f"'2026-11-2{k} 10:11:12.345', '2026-01-0{1 + k} 01:02:03', '2026-02-0{1 + k}', "
                              f"'-12:34:56', 0x00ff{k:02x}, b'101{k % 2}', 'b,c', '{{\"a\": [1, {k}]}}', 'ünï {k}')"
                              for k in range(1, 6)], "UPDATE app.types SET d = d + 1, t = NULL WHERE id = 2",
                            "DELETE FROM app.types WHERE id = 3", "UPDATE app.types SET id = 30 WHERE id = 4")
                time.sleep(3)
            code, report = run_verify(cfg, "--wait", "60")
        finally:
            cap.stop()
    finally:
        broker.kill()
        src.stop()
    assert code == 3, report
    t = by_table(report)
    for name in ("app.users", "app.pairs", "app.log", "app.types"):
        assert t[("kafka", name)]["status"] == "equal" and t[("kafka", name)]["rows"] > 0, t[("kafka", name)]
        assert t[("local", name)]["status"] == "cannot check" and "format=sql" in t[("local", name)]["note"]


def test_both_kafka_clients_read_the_same_topics_back() -> None:
    """verify reads with confluent-kafka where installed, kafka-python otherwise: both see
    every message of every partition, also what was appended after a first read."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from senders.kafka.client import ConfluentTopicReader, KafkaMessage, KafkaPythonTopicReader

    broker = shared_broker()
    try:
        admin = AdminClient({"bootstrap.servers": broker.servers})
        admin.create_topics([NewTopic("vt", 3, 1)])["vt"].result(30)
        p = Producer({"bootstrap.servers": broker.servers, "linger.ms": 20})

        def produce(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                p.produce("vt", key=str(i).encode(), value=json.dumps({"i": i}).encode(), partition=i % 3)
            p.flush(30)
        produce(0, 300)
        readers = [ConfluentTopicReader(broker.servers), KafkaPythonTopicReader(broker.servers)]
        seen: list[list[KafkaMessage]] = [[], []]
        for r, out in zip(readers, seen):
            r.read(["vt"], out.append, 60)
        produce(300, 450)
        for r, out in zip(readers, seen):
            r.read(["vt"], out.append, 60)
            r.close()
        for out in seen:
            assert sorted(json.loads(m.value or b"{}")["i"] for m in out) == list(range(450))
    finally:
        broker.kill()
