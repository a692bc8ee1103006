"""Snapshots of PostgreSQL regions (real PostgreSQL, MariaDB target, Apache Kafka, local Spark):
existing rows copied while writes go on, kill -9 in the middle, on demand, and
when the slot lost what the checkpoint needs."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import CapturerProcess, shared_broker, verify_equal, wait_for

from devtools.local_mariadb import MariaDBInstance
from devtools.local_postgres import PostgresInstance
from devtools.pg_workload import HOSTILE, TABLES, Workload, apply_schema, pg_rows
from integration.test_postgresql import (
    assert_equal,
    checkpoint,
    config,
    covered,
    current_lsn,
    file_and_mysql,
    pg,
    pg_region,
)
from senders.local.replay import read_changes

pytestmark = pytest.mark.integration
__all__ = ["pg"]  # (the fixture, imported)


def snapshot_rows(tmp: Path, region: str = "pg") -> int:
    """Rows of the snapshot in progress that the checkpoint holds as delivered."""
    return sum(t["rows"] for t in checkpoint(tmp).get("regions", {}).get(region, {}).get("snapshot", []))


def read_lines(tmp: Path) -> list[dict[str, Any]]:
    return list(read_changes(tmp / "out" / "changes.jsonl"))


class Writer(threading.Thread):
    """The workload's transactions at a steady pace while the copy runs (an unthrottled
    writer outruns four senders on two cores, and the copy waits for the stream)."""

    def __init__(self, pg: PostgresInstance, seed: int, first_id: int, per_s: float = 25):
        super().__init__(daemon=True)
        self.w = Workload(pg, seed=seed)
        self.w.next_id = first_id
        self.pg, self.pause = pg, 1 / per_s
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.pg.connect(autocommit=False) as c:
                while not self.done.wait(self.pause):
                    self.w.step(c)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> int:
        self.done.set()
        self.join(60)
        if self.error is not None:
            raise self.error
        return self.w.txns


def fill(pg: PostgresInstance, steps: int, seed: int) -> Workload:
    """History the slot will never see: rows written before it exists."""
    w = Workload(pg, seed=seed)
    for _ in range(steps):
        with pg.connect(autocommit=False) as c:
            w.step(c)
    w.big_txn(3000)
    return w


def test_initial_snapshot_under_writes_and_kill9_every_sender(tmp_path: Path, pg: PostgresInstance,
                                                              target: MariaDBInstance) -> None:
    """Existing rows of every type (hostile names, TOAST, a keyless REPLICA IDENTITY
    FULL table, a composite key) are copied in small chunks while a workload writes,
    the capturer is killed -9 in the middle and started again: the file, the MySQL
    target, Kafka and the lake equal the source (``python -m capturer verify`` and
    an independent comparison), the copy resumed after what was acknowledged, and
    nothing rolled back arrived."""
    pytest.importorskip("pyspark")
    apply_schema(pg)
    w = fill(pg, 200, seed=21)
    broker = shared_broker()
    try:
        senders = (file_and_mysql(tmp_path, target) + f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
                   f"[spark]\nmaster=local[1]\nwarehouse={tmp_path / 'wh'}\nbatch_interval=0.3\ncompaction_interval=0\n")
        senders = senders.replace("type=local,mysql", "type=local,mysql,kafka,spark")
        cfg = config(tmp_path, pg_region("pg", pg, "snapshot=initial\nsnapshot_chunk_rows=200\nsnapshot_workers=2\n"
                                           "snapshot_read_ahead=true\n"),
                     senders, "spillRows=500\n")
        log = tmp_path / "capturer.log"
        p = CapturerProcess(cfg, log).start()
        p.wait_ready(180)
        writer = Writer(pg, 22, w.next_id + 100_000)
        writer.start()
        # the kill -9 is meant to fall mid-copy, after some chunks were acknowledged; on a loaded machine the
        # senders (Spark's first batch) can be slow enough that the whole copy is acknowledged at once, then
        # the kill falls after it, and the restart must copy nothing again (checked below all the same)
        def acked_or_done() -> bool:
            if snapshot_rows(tmp_path) >= 600:
                return True
            pos = checkpoint(tmp_path).get("regions", {}).get("pg")
            return (pos is not None and not pos.get("snapshot")
                    and "snapshot of public.big done" in log.read_text())

        wait_for(acked_or_done, 180, "part of the snapshot to be acknowledged")
        p.kill9()
        before = snapshot_rows(tmp_path)
        mid_copy = bool(checkpoint(tmp_path)["regions"]["pg"].get("snapshot"))
        assert before > 0 or not mid_copy
        p = CapturerProcess(cfg, log).start()
        p.wait_ready(180)
        wait_for(lambda: "snapshot of public.big done" in log.read_text(), 240, "the snapshot to finish")
        assert writer.stop() > 5
        end = current_lsn(pg)
        wait_for(lambda: covered(tmp_path, "pg", end) and not checkpoint(tmp_path)["regions"]["pg"].get("snapshot"),
                 240, "the checkpoint to pass the last change and the snapshot")
        assert p.stop() == 0
        assert_equal(pg, target, tmp_path)
        report = verify_equal(cfg, ["local", "mysql", "kafka", "spark"], wait=120)
        assert {t["table"] for t in report["tables"]} >= {f"{db}.{t}" for db, t in TABLES}
        reads = [x for x in read_lines(tmp_path) if x["op"] == "read"]
        # every table was copied to its end (rows the writer changed meanwhile came by the stream instead)
        text = log.read_text()
        assert all(f"snapshot of {db}.{t} done" in text for db, t in TABLES), text[-3000:]
        assert reads
        # resumed after the acknowledged chunks: big (3000 rows) was not read twice over
        big = [x for x in reads if x["table"] == "big"]
        assert len(big) < 2 * 3000
    finally:
        broker.kill()


def test_on_demand_and_when_needed(tmp_path: Path, pg: PostgresInstance, target: MariaDBInstance,
                                   capturer_running) -> None:  # type: ignore[no-untyped-def]
    """POST /snapshot copies a PostgreSQL table again (``truncate``: the target's stray
    rows go), with progress on the status port; after the slot is dropped while the
    capturer is down, ``snapshot=when_needed`` creates it again and copies every table,
    emptied first: rows deleted in the gap are gone downstream too."""
    apply_schema(pg)
    fill(pg, 60, seed=31)
    with pg.connect() as c:  # a keyless table and a column named with % (read whole, without parameters)
        c.execute('CREATE TABLE public."pct%s t" (a int, "b%%d" text)')
        c.execute('ALTER TABLE public."pct%s t" REPLICA IDENTITY FULL')
        c.execute('INSERT INTO public."pct%s t" VALUES (1, \'x\'), (1, \'x\'), (2, NULL)')
    token = "pg-t0ken"
    region = pg_region("pg", pg, "snapshot=when_needed\nsnapshot_chunk_rows=100\n")
    cfg = config(tmp_path, region, file_and_mysql(tmp_path, target), f"controlToken={token}\n")
    with capturer_running(cfg) as cap:
        wait_for(lambda: cap.snapshot()["regions"]["pg"].get("snapshot", {}).get("tables") and all(
            t["state"] == "done" for t in cap.snapshot()["regions"]["pg"]["snapshot"]["tables"].values()), 180,
            "the initial snapshot")
        end = current_lsn(pg)
        wait_for(lambda: covered(tmp_path, "pg", end), 120)
        target.execute("INSERT INTO public.multi VALUES (777, 'stray', 1)", "UPDATE public.uk SET v = -5")
        url = f"http://127.0.0.1:{cap.status_server.port}/snapshot"  # type: ignore[union-attr]
        r = requests.post(url, json={"tables": ["public.multi", "public.uk"], "truncate": True},
                          headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r.status_code == 202, r.text
        assert r.json()["regions"]["pg"]["tables"] == ["public.multi", "public.uk"]
        bad = requests.post(url, json={"tables": ["public.nope"]}, headers={"Authorization": f"Bearer {token}"},
                            timeout=30)
        assert bad.status_code == 404, bad.text
        wait_for(lambda: all(t["state"] == "done" for t in cap.snapshot()["regions"]["pg"]["snapshot"]["tables"].values()),
                 120, "the on-demand snapshot")
        st = cap.snapshot()["regions"]["pg"]["snapshot"]
        assert st["method"] == "xid" and st["tables"]["public.uk"]["rows"] == len(pg_rows(pg, "public", "uk"))
        assert st["tables"]["public.pct%s t"]["rows"] == 3
        end = current_lsn(pg)
        wait_for(lambda: covered(tmp_path, "pg", end), 120)
    assert_equal(pg, target, tmp_path)
    # the slot goes while the capturer is down, and rows are deleted and written meanwhile
    with pg.connect() as c:
        c.execute("SELECT pg_drop_replication_slot('capturer_pg')")
        c.execute(f"DELETE FROM {HOSTILE} WHERE id % 2 = 0")
        c.execute("INSERT INTO public.keyless VALUES (123, 'in the gap')")
    with capturer_running(cfg) as cap:
        wait_for(lambda: cap.snapshot()["regions"]["pg"].get("snapshot", {}).get("tables") and all(
            t["state"] == "done" for t in cap.snapshot()["regions"]["pg"]["snapshot"]["tables"].values()), 180,
            "the snapshot after the slot was lost")
        end = current_lsn(pg)
        wait_for(lambda: covered(tmp_path, "pg", end), 120)
    assert_equal(pg, target, tmp_path)
    truncates = [x for x in read_lines(tmp_path) if x["op"] == "ddl" and x["sql"].startswith("TRUNCATE")]
    assert {(x["db"], x["table"]) for x in truncates} >= {(db, t) for db, t in TABLES}
