"""PostgreSQL regions (type = postgresql) against real PostgreSQL servers started
by the tests (private data directories, free ports, wal_level = logical)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, start_servers, wait_for

from capturer.model import parse_lsn
from devtools.local_mariadb import MariaDBInstance, free_port
from devtools.local_postgres import PostgresInstance, committed_lsn
from devtools.pg_workload import (
    HOSTILE,
    HOSTILE_SCHEMA,
    HOSTILE_TABLE,
    ROLLBACK_MARKER,
    TABLES,
    Workload,
    apply_schema,
    file_rows,
    mysql_rows,
    pg_rows,
)
from senders.local.replay import read_changes, rebuild

pytestmark = pytest.mark.integration


@pytest.fixture
def pg() -> Iterator[PostgresInstance]:
    p = PostgresInstance().start()
    yield p
    p.destroy()


def pg_region(name: str, p: PostgresInstance, extra: str = "") -> str:
    return (f"\n[region:{name}]\ntype=postgresql\nhost=127.0.0.1\nport={p.port}\nuser=postgres\ndbname=postgres\n"
            f"create_publication=all\nheartbeat_ms=200\nstatus_interval=1\n{extra}")


def config(tmp: Path, regions: str, senders: str = "", extra_global: str = "") -> Path:
    (tmp / "filter_rule.txt").write_text("")
    (tmp / "senderConfig.cfg").write_text(
        senders or f"[global]\ntype=local\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n")
    cfg = tmp / "config.cfg"
    cfg.write_text(f"[global]\nbinlogCheckPointPath={tmp / 'checkpoint.json'}\nsenderConfig={tmp / 'senderConfig.cfg'}\n"
                   f"filterRuleDict={tmp / 'filter_rule.txt'}\nhttpPort={free_port()}\ncheckpointInterval=0.5\n"
                   f"{extra_global}{regions}")
    return cfg


def streaming(cap: Any) -> None:
    """Until every region streams (a first start captures what commits after its slot exists)."""
    wait_for(lambda: all(r.state == "streaming" for r in cap.regions), 60, "regions to stream")


def file_and_mysql(tmp: Path, target: MariaDBInstance) -> str:
    return (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")


def checkpoint(tmp: Path) -> dict[str, Any]:
    try:
        return json.loads((tmp / "checkpoint.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {}


def current_lsn(p: PostgresInstance) -> int:
    with p.connect() as c:
        return committed_lsn(c)


def covered(tmp: Path, region: str, lsn: int) -> bool:
    """Every attached sender has acknowledged the region up to ``lsn`` (the checkpoint's
    own ``regions`` is where the source resumes: with a sender behind and the backlog on
    disk holding what it still needs, that is ahead of the sender, so it is not enough)."""
    cp = checkpoint(tmp)
    pos = cp.get("regions", {}).get(region)
    if pos is None or parse_lsn(pos["lsn"]) < lsn:
        return False
    for sp in cp.get("senders", {}).values():
        if sp.get("detached"):
            continue
        mine = sp.get("regions", {}).get(region)
        if mine is None or parse_lsn(mine["lsn"]) < lsn:
            return False
    return True


def slot_confirmed(p: PostgresInstance, slot: str) -> int:
    with p.connect() as c:
        row = c.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                        (slot,)).fetchone()
    return parse_lsn(row[0]) if row and row[0] else 0


def assert_equal(p: PostgresInstance, target: MariaDBInstance | None, tmp: Path) -> None:
    path = tmp / "out" / "changes.jsonl"
    # (the marker is plain ASCII: in a line's JSON text exactly where it is in one of its values)
    assert ROLLBACK_MARKER.encode() not in path.read_bytes(), "rolled-back work arrived"
    state = rebuild(read_changes(path))
    for db, table in TABLES:
        want = pg_rows(p, db, table)
        if target is not None:
            got = mysql_rows(target, db, table)
            assert got == want, f"MySQL target {db}.{table}: {len(want)} source rows, {len(got)} target rows; " \
                f"only in the source: {sorted(set(want) - set(got))[:2]}; only in the target: " \
                f"{sorted(set(got) - set(want))[:2]}"
        got_file = file_rows(state, db, table)
        assert got_file == want, f"file {db}.{table}: {len(want)} source rows, {len(got_file)} rebuilt; " \
            f"only in the source: {sorted(set(want) - set(got_file))[:2]}; only in the file: " \
            f"{sorted(set(got_file) - set(want))[:2]}"


def test_hostile_workload_to_file_and_mysql(tmp_path: Path, pg: PostgresInstance, target: MariaDBInstance,
                                            capturer_running) -> None:  # type: ignore[no-untyped-def]
    """Every common type, hostile names, NULLs, key changes, rollbacks, a keyless
    table, TOASTed values left unchanged, a spilled transaction with a key change of
    every row, schema changes and TRUNCATE: the file and the MySQL target equal the
    source, and no rolled-back row ever arrives."""
    apply_schema(pg)
    cfg = config(tmp_path, pg_region("pg", pg), file_and_mysql(tmp_path, target), "spillRows=500\n")
    with capturer_running(cfg) as cap:
        streaming(cap)
        w = Workload(pg, seed=11)
        for _ in range(150):
            with pg.connect(autocommit=False) as c:
                w.step(c)
        w.big_txn(2000)
        with pg.connect() as c:  # schema changes between rows
            c.execute(f"ALTER TABLE {HOSTILE} ADD COLUMN added int DEFAULT 42")
            c.execute("ALTER TABLE public.multi ADD COLUMN note text")
            c.execute("ALTER TABLE public.multi DROP COLUMN v")
            c.execute("ALTER TABLE public.uk RENAME COLUMN v TO v2")
            c.execute("ALTER TABLE public.toasty ALTER COLUMN n TYPE bigint")
        for _ in range(60):
            with pg.connect(autocommit=False) as c:
                try:
                    w.step(c)
                except Exception:
                    c.rollback()
                    c.execute(f"UPDATE {HOSTILE} SET added = added + 1 WHERE id % 2 = 0")
                    c.execute("INSERT INTO public.multi VALUES (99, 'after', 'note é') ON CONFLICT DO NOTHING")
                    c.execute("UPDATE public.uk SET v2 = coalesce(v2, 0) + 5")
                    c.commit()
        with pg.connect(autocommit=False) as c:  # TRUNCATE in the middle of a transaction
            c.execute("INSERT INTO public.keyless VALUES (7, 'before truncate')")
            c.execute("TRUNCATE public.keyless")
            c.execute("INSERT INTO public.keyless VALUES (8, 'after truncate'), (8, 'after truncate')")
            c.commit()
        end = current_lsn(pg)
        wait_for(lambda: covered(tmp_path, "pg", end), 120, "the checkpoint to pass the source's last change")
        st = cap.regions[0].status()
    assert st["spilled_txns"] >= 1 and st["toast_filled"] >= 1 and st["ddl_sent"] >= 8, st
    assert st["unrepresentable_values"] > 0, st  # NaN, infinity, BC dates went out as NULL (documented)
    assert_equal(pg, target, tmp_path)
    # the slot was confirmed only up to what the checkpoint holds
    assert slot_confirmed(pg, "capturer_pg") <= parse_lsn(checkpoint(tmp_path)["regions"]["pg"]["lsn"])
    tables = {(d["db"], d["table"]) for d in read_changes(tmp_path / "out" / "changes.jsonl")}
    assert (HOSTILE_SCHEMA, HOSTILE_TABLE) in tables


def test_merged_with_mariadb_in_commit_order_and_idle_never_stalls(tmp_path: Path, pg: PostgresInstance,
                                                                   capturer_running) -> None:  # type: ignore[no-untyped-def]
    """A PostgreSQL and a MariaDB region in one stream: changes written alternately,
    more than a second apart (MariaDB's clock has whole seconds), leave in the order
    they were written; while one source is idle the other's changes still arrive."""
    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute("CREATE DATABASE app")
        m.execute("CREATE TABLE app.seq (n INT PRIMARY KEY)")
        pg.sql("CREATE TABLE public.seq (n int PRIMARY KEY)")
        regions = (f"\n[region:my]\ntype=mariadb\nhost=127.0.0.1\nport={m.port}\nuser=capturer\npassword=capturer\n"
                   f"server_id=801\nheartbeat_ms=200\n" + pg_region("pg", pg))
        cfg = config(tmp_path, regions)
        with capturer_running(cfg) as cap:
            streaming(cap)
            order = []
            for n in range(8):
                if n % 2:
                    m.execute(f"INSERT INTO app.seq VALUES ({n})")
                else:
                    pg.sql(f"INSERT INTO public.seq VALUES ({n})")
                order.append(n)
                time.sleep(1.1)

            def arrived() -> list[int]:
                return [d["after"]["n"] for d in read_changes(tmp_path / "out" / "changes.jsonl", dedupe=False)
                        if d.get("table") == "seq" and d["op"] == "insert"]

            wait_for(lambda: len(arrived()) == 8, 30, "all 8 rows")
            assert arrived() == order
            # PostgreSQL idle: MariaDB's changes still flow, and the reverse (a stall never ends: the
            # waits are generous for a loaded machine, not a speed check)
            for n, (write, src) in enumerate([(m.execute, "app"), (pg.sql, "public")] * 2, start=100):
                write(f"INSERT INTO {src}.seq VALUES ({n})")
                wait_for(lambda n=n: n in arrived(), 60, f"row {n} while the other region is idle")
            # the idle region's lag does not grow: it comes back under 5 s (its keepalives move it)
            wait_for(lambda: {r.name: r.status() for r in cap.regions}["pg"]["lag_seconds"] < 5, 60,
                     "the idle PostgreSQL region's lag under 5 s")
    finally:
        m.stop()


def test_kill9_and_restart_lose_nothing_and_slot_stays_behind_checkpoint(tmp_path: Path, pg: PostgresInstance,
                                                                         target: MariaDBInstance) -> None:
    """Under load: kill -9 of the capturer process twice, restart: the file and the
    MySQL target equal the source; the slot was never confirmed past the checkpoint
    (checked right after each kill)."""
    apply_schema(pg)
    cfg = config(tmp_path, pg_region("pg", pg), file_and_mysql(tmp_path, target), "spillRows=500\n")
    log = tmp_path / "capturer.log"
    proc = CapturerProcess(cfg, log).start()
    proc.wait_ready()
    wait_for(lambda: "pg" in checkpoint(tmp_path).get("regions", {}), 60, "the slot's start in the checkpoint")
    w = Workload(pg, seed=5).start()
    try:
        for i in range(2):
            if i:
                proc = CapturerProcess(cfg, log).start()
                proc.wait_ready()
            time.sleep(3)
            proc.kill9()
            cp = parse_lsn(checkpoint(tmp_path)["regions"]["pg"]["lsn"])
            assert slot_confirmed(pg, "capturer_pg") <= cp
        proc = CapturerProcess(cfg, log).start()
        proc.wait_ready()
        time.sleep(2)
    finally:
        w.stop()
    assert w.txns > 20 and w.rollbacks > 0
    end = current_lsn(pg)
    wait_for(lambda: covered(tmp_path, "pg", end), 120, "the checkpoint to pass the source's last change")
    assert proc.stop() == 0
    assert_equal(pg, target, tmp_path)
    assert "Traceback" not in log.read_text()


def test_setup_errors_name_the_setting(tmp_path: Path) -> None:
    """wal_level not logical, a missing publication, and a slot gone while the
    checkpoint needs it: the capturer stops (exit 1) naming what to change."""
    import subprocess
    import sys

    from helpers import ROOT

    def run(cfg: Path) -> str:
        r = subprocess.run([sys.executable, "-m", "capturer", "--config", str(cfg)], capture_output=True, text=True,
                           cwd=str(ROOT), timeout=120)
        assert r.returncode != 0
        return r.stdout + r.stderr

    replica = PostgresInstance(wal_level="replica").start()
    try:
        out = run(config(tmp_path, pg_region("pg", replica)))
        assert "wal_level is 'replica'" in out and "wal_level = logical" in out, out[-2000:]
    finally:
        replica.destroy()
    p = PostgresInstance().start()
    try:
        out = run(config(tmp_path, pg_region("pg", p).replace("create_publication=all", "publication=nope")))
        assert "publication 'nope' does not exist" in out, out[-2000:]
        # a checkpoint that needs a slot that is not there
        (tmp_path / "checkpoint.json").write_text(json.dumps(
            {"version": 1, "commit_ts": 1 << 40, "regions": {"pg": {"kind": "postgresql", "lsn": "0/1000000"}}}))
        out = run(config(tmp_path, pg_region("pg", p)))
        assert "replication slot 'capturer_pg' does not exist" in out, out[-2000:]
        # a slot another consumer moved past the checkpoint's LSN
        with p.connect() as c:
            start = c.execute("SELECT lsn::text FROM pg_create_logical_replication_slot('capturer_pg', 'pgoutput')"
                              ).fetchone()[0]
            c.execute("CREATE TABLE moved (n int)")
            c.execute("INSERT INTO moved VALUES (1)")
            # (the advance stops at what is flushed: under load it may take a second try to pass ``start``)
            deadline = time.monotonic() + 30
            while True:
                c.execute("SELECT pg_replication_slot_advance('capturer_pg', pg_current_wal_lsn())")
                moved = c.execute("SELECT confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots "
                                  "WHERE slot_name = 'capturer_pg'", (start,)).fetchone()[0]
                if moved or time.monotonic() > deadline:
                    break
                c.execute("SELECT pg_switch_wal()")
                time.sleep(0.5)
            assert moved, "the test could not move the slot past its start"
        (tmp_path / "checkpoint.json").write_text(json.dumps(
            {"version": 1, "commit_ts": 1 << 40, "regions": {"pg": {"kind": "postgresql", "lsn": start}}}))
        out = run(config(tmp_path, pg_region("pg", p)))
        assert "replication slot 'capturer_pg' was confirmed up to" in out and f"LSN {start}" in out, out[-2000:]
    finally:
        p.destroy()


def test_every_sender_with_the_region_in_a_worker_process(tmp_path: Path, pg: PostgresInstance,
                                                          target: MariaDBInstance, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """process=true (the region decoded in a worker process, through the agent code):
    file, MySQL, Kafka and Spark all equal the source, including a column added
    mid-stream (the lake's schema evolution), and the status port shows the region."""
    pytest.importorskip("pyspark")
    import requests
    from chaos.harness import consume_fast
    from helpers import shared_broker

    from integration.test_snapshot import rebuild_kafka
    from senders.spark.lakecli import verify
    from senders.spark.sender import build_session

    apply_schema(pg)
    broker = shared_broker()
    wh = tmp_path / "wh"
    senders = (f"[global]\ntype=local,mysql,kafka,spark\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n"
               f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
               f"[spark]\nmaster=local[2]\nwarehouse={wh}\nbatch_interval=0.3\ncompaction_interval=0\n")
    cfg = config(tmp_path, pg_region("pg", pg, "process=true\n"), senders)
    try:
        with capturer_running(cfg) as cap:
            streaming(cap)
            w = Workload(pg, seed=23)
            for i in range(120):
                if i == 60:
                    pg.sql("ALTER TABLE public.multi ADD COLUMN added text DEFAULT 'dflt'")
                    pg.sql(f"ALTER TABLE {HOSTILE} ADD COLUMN added2 bigint")
                with pg.connect(autocommit=False) as c:
                    w.step(c)
            end = current_lsn(pg)
            wait_for(lambda: covered(tmp_path, "pg", end), 180, "the checkpoint to pass the source's last change")
            st = requests.get(f"http://127.0.0.1:{cap.status_server.port}/status", timeout=5).json()
            r = st["regions"]["pg"]
            assert r["state"] == "streaming" and r["rows"] > 0 and r["agent"]["region_status"]["kind"] == "postgresql", r
            assert all(s["errors"] == 0 for s in st["senders"].values()), st["senders"]
        assert_equal(pg, target, tmp_path)
        state_k = rebuild_kafka(consume_fast(broker.servers))
        def without_added(rows: list[str]) -> list[str]:
            # a row not changed since ADD COLUMN has no message with the new column (consumers apply the
            # schema topic's DDL to such rows): the added column is compared in MySQL and Spark
            return sorted(json.dumps({k: v for k, v in json.loads(r).items() if k != "added"}, sort_keys=True)
                          for r in rows)

        for db, table in TABLES[1:]:  # (the hostile table's BIT travels as a bit string: compared in MySQL)
            got = without_added(state_k.get((db, table), []))
            want = without_added(pg_rows(pg, db, table))
            assert got == want, f"Kafka {db}.{table}: {len(want)} source rows, {len(got)} from the topics"
        spark = build_session({"master": "local[1]"}, tmp_path / "sparkhome")
        try:
            src = [{"host": "127.0.0.1", "port": target.port, "user": "root", "password": ""}]
            for db, table in TABLES:
                if not mysql_rows(target, db, table):
                    continue
                res = verify(spark, wh, "cdc", db, table, src)  # the target equals the source (above)
                assert res["equal"], json.dumps(res, default=str)[:3000]
        finally:
            spark.stop()
    finally:
        broker.kill()


def test_server_restarts_and_lost_connections_resume_without_duplicates(tmp_path: Path, pg: PostgresInstance,
                                                                        capturer_running) -> None:  # type: ignore[no-untyped-def]
    """The walsender terminated, killed -9 (the server then restarts every backend)
    and the server restarted, while the capturer runs: each time the region
    reconnects from where it got to. Every insert arrives exactly once (no change
    sent again under a new identity), and an UPDATE read after its table was renamed
    (its unchanged TOASTed value can no longer be looked up) is delivered without it."""
    import os
    import signal

    pg.sql("CREATE TABLE public.seq (n int PRIMARY KEY, big text)")
    cfg = config(tmp_path, pg_region("pg", pg))
    n = 0

    def write(k: int) -> None:
        nonlocal n
        for _ in range(k):
            n += 1
            pg.sql(f"INSERT INTO public.seq VALUES ({n}, NULL)")

    def walsender() -> int:
        with pg.connect() as c:
            row = c.execute("SELECT pid FROM pg_stat_replication").fetchone()
        return int(row[0]) if row else 0

    def inserts() -> list[int]:
        return [d["after"]["n"] for d in read_changes(tmp_path / "out" / "changes.jsonl", dedupe=False)
                if d.get("table") == "seq" and d["op"] == "insert"]

    with capturer_running(cfg) as cap:
        streaming(cap)
        write(20)
        wait_for(lambda: len(inserts()) == n, 30, "the first rows")
        wait_for(lambda: covered(tmp_path, "pg", current_lsn(pg)), 30, "a checkpoint")
        for fault in ("terminate", "kill9", "restart"):
            wait_for(lambda: walsender() != 0, 60, "the region to stream")
            if fault == "terminate":
                pg.sql(f"SELECT pg_terminate_backend({walsender()})")
            elif fault == "kill9":
                os.kill(walsender(), signal.SIGKILL)  # the postmaster resets every backend
            else:
                pg.restart()
            time.sleep(1)
            for _ in range(60):  # the server may still be recovering
                try:
                    write(15)
                    break
                except Exception:
                    time.sleep(0.5)
            wait_for(lambda: len(inserts()) >= n, 90, f"the rows written after the {fault}")
        assert cap.regions[0].state == "streaming" and cap.regions[0].reconnects >= 3, cap.regions[0].status()
    got = inserts()
    assert sorted(got) == list(range(1, n + 1)), f"{len(got)} inserts for {n} rows (duplicates or gaps)"

    # an UPDATE that left a TOASTed value unchanged, read after its table was renamed
    pg.sql("INSERT INTO public.seq SELECT 1000, string_agg(md5(random()::text), '') FROM generate_series(1, 400)")
    with capturer_running(cfg) as cap:
        wait_for(lambda: 1000 in inserts(), 30, "the big row")
    pg.sql("UPDATE public.seq SET n = 1001 WHERE n = 1000")
    pg.sql("ALTER TABLE public.seq RENAME TO seq2")
    pg.sql("INSERT INTO public.seq2 VALUES (1002, 'after the rename')")
    with capturer_running(cfg) as cap:
        wait_for(lambda: any((d.get("after") or {}).get("n") == 1002
                             for d in read_changes(tmp_path / "out" / "changes.jsonl")), 60, "rows after the rename")
        assert cap.regions[0].state == "streaming" and cap.regions[0].status()["toast_missing"] >= 1
    upd = [d for d in read_changes(tmp_path / "out" / "changes.jsonl") if d["op"] == "update"
           and d["after"].get("n") == 1001]
    assert len(upd) == 1 and "big" not in upd[0]["after"], upd  # left as it is downstream, never NULL
    assert any(d["op"] == "ddl" and "RENAME TABLE" in d["sql"] for d in read_changes(tmp_path / "out" / "changes.jsonl"))
