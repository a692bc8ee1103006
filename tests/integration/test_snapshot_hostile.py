"""Snapshots under the workloads users' checks run: hostile identifiers, composite keys whose
columns are in another order than the table's, writes on the rows being copied (real MariaDB
source and target)."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from helpers import CapturerProcess, checkpoint_covers, read_lines, start_servers, wait_for, write_config

from capturer.model.encode import json_row, qualified, quote_ident
from devtools.local_mariadb import MariaDBInstance
from senders.local.replay import read_changes, rebuild

pytestmark = pytest.mark.integration

DB = 'we`ird "db".x;ü'
TABLE = 'Ta ble.;"ü`'


def rows_of(m: MariaDBInstance, db: str, table: str) -> list[str]:
    c = m.connect()
    try:
        with c.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            cur.execute(f"SELECT * FROM {qualified(db, table)}")
            cols = [d[0] for d in cur.description]
            return sorted(json.dumps(json_row(dict(zip(cols, r)), set()), sort_keys=True) for r in cur.fetchall())
    finally:
        c.close()


def file_rows(tmp: Path, db: str, table: str) -> list[str]:
    state = rebuild(read_changes(tmp / "out" / "changes.jsonl"))
    return sorted(json.dumps(r, sort_keys=True) for r in state.get((db, table), {}).values())


def snapshot_done(cap) -> bool:  # type: ignore[no-untyped-def]
    snap = cap.snapshot()["regions"]["r1"].get("snapshot")
    return bool(snap) and all(t["state"] in ("done", "dropped") for t in snap["tables"].values())


def test_a_composite_key_in_another_order_than_the_columns_is_one_key_order(
        tmp_path: Path, target: MariaDBInstance, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """PRIMARY KEY (`K.1``, `Kë y;2`) on a table whose columns run (..., `Kë y;2`, `K.1``): the
    snapshot's rows and the binlog's changes carry the same ``pk`` (the key's order). Before,
    the binlog's changes named the key in the table's column order: a consumer keying rows by
    ``pk`` saw each copied row twice, and the MySQL sender took a read and a later update of one
    row for two rows (placed apart, applied out of order: the target diverged)."""
    (m,) = start_servers(tmp_path, 1)
    q = qualified(DB, TABLE)
    try:
        m.execute(f"CREATE DATABASE {quote_ident(DB)}",
                  f"CREATE TABLE {q} (`v al\"` VARCHAR(40), `Kë y;2` INT NOT NULL, "
                  "`K.1``` VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL, `where` INT, "
                  "PRIMARY KEY (`K.1```, `Kë y;2`))")
        c = m.connect()
        with c.cursor() as cur:
            cur.executemany(f"INSERT INTO {q} VALUES (%s, %s, %s, %s)",
                            [(f"v{i}`\"';", i % 13 - 6, ("a" if i % 2 else "A") + str(i // 13), i) for i in range(600)])
        c.commit()
        m.execute("FLUSH BINARY LOGS", "PURGE BINARY LOGS BEFORE NOW() + INTERVAL 1 DAY")
        senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")
        cfg = write_config(tmp_path, [m], senders=senders,
                           region_extra="snapshot=initial\nsnapshot_chunk_rows=20\nsnapshot_read_ahead=true\n")
        with capturer_running(cfg) as cap:
            with c.cursor() as cur:  # every row changed while the chunks go, again and again
                for _ in range(2000):
                    if snapshot_done(cap):
                        break
                    cur.execute(f"UPDATE {q} SET `where` = `where` + 1")
                    c.commit()
            for _ in range(3):
                with c.cursor() as cur:
                    cur.execute(f"UPDATE {q} SET `where` = `where` + 1")
                c.commit()
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 120, "every sender to catch up")
        c.close()
        lines = [x for x in read_lines(tmp_path) if x.get("table") == TABLE and x["op"] != "ddl"]
        assert {x["op"] for x in lines} >= {"read", "update"}
        assert {tuple(x["pk"]) for x in lines} == {("K.1`", "Kë y;2")}
        want = rows_of(m, DB, TABLE)
        assert len(want) == 600
        assert file_rows(tmp_path, DB, TABLE) == want
        assert rows_of(target, DB, TABLE) == want
    finally:
        m.stop()



def test_a_chunks_floor_outlives_a_kill9_with_the_region_in_a_worker_process(
        tmp_path: Path, target: MariaDBInstance, monkeypatch: pytest.MonkeyPatch) -> None:
    """``process = true``: the region runs in a worker process (an agent) whose lift journal is the
    capturer's, relayed. A snapshot chunk's commit_ts T is the source's clock (ms); the floor that
    keeps a replay's transactions after the chunk above T was kept in the worker's memory only. So
    after kill -9 a transaction the first run had not delivered, replayed, took its own time (the
    second it committed in, below T) and the file sender, which held T, skipped it as held (a
    hostile run lost 280 transactions in a row this way). Here: a MySQL target that hangs (a global
    read lock) keeps the checkpoint before the copy; the worker freezes at a DDL right after a
    marker transaction the file has; kill -9. Now floors go to the capturer's journal like lifts,
    and back to the worker when it starts again."""
    (m,) = start_servers(tmp_path, 1)
    hold = target.connect()
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)",
                  "CREATE TABLE d.w (id INT PRIMARY KEY, v INT)",
                  "INSERT INTO d.t SELECT seq, seq FROM d.seq_0_to_19999")
        m.execute("FLUSH BINARY LOGS", "PURGE BINARY LOGS BEFORE NOW() + INTERVAL 1 DAY")
        with hold.cursor() as cur:
            cur.execute("FLUSH TABLES WITH READ LOCK")  # the MySQL sender hangs: nothing is checkpointed
        senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=2\n")
        cfg = write_config(tmp_path, [m], senders=senders,
                           region_extra="snapshot=initial\nsnapshot_chunk_rows=10\nprocess=true\n")
        log = tmp_path / "capturer.log"
        monkeypatch.setenv("CAPTURER_FAILPOINTS", "region.ddl=stop@1")  # (the worker inherits it)
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        wait_for(lambda: sum(x["op"] == "read" for x in read_lines(tmp_path)) >= 200, 120, "the copy to be going")
        c = m.connect()
        with c.cursor() as cur:  # one after the other, while chunks go out: in the second of the last ones
            cur.execute("INSERT INTO d.w VALUES (1, 1)")
            c.commit()
            cur.execute("CREATE TABLE d.late (id INT PRIMARY KEY)")  # the worker stops here
            cur.execute("INSERT INTO d.late VALUES (1), (2)")
            cur.execute("INSERT INTO d.w VALUES (2, 2)")
            c.commit()
        wait_for(lambda: any(x["op"] == "insert" and x["table"] == "w" for x in read_lines(tmp_path)), 60,
                 "the file to hold the marker before the DDL")
        worker = int(re.findall(r"worker pid (\d+)", log.read_text())[-1])
        p.kill9()
        os.kill(worker, signal.SIGKILL)
        monkeypatch.delenv("CAPTURER_FAILPOINTS")
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        with hold.cursor() as cur:
            cur.execute("UNLOCK TABLES")
        wait_for(lambda: "snapshot of d.t done" in log.read_text(errors="replace"), 180, "the copy")
        wait_for(lambda: checkpoint_covers(tmp_path, [m]), 180, "every sender to catch up")
        assert p.stop() == 0
        c.close()
        for t in ("t", "w", "late"):
            want = rows_of(m, "d", t)
            assert file_rows(tmp_path, "d", t) == want, f"file: d.{t}"
            assert rows_of(target, "d", t) == want, f"target: d.{t}"
    finally:
        hold.close()
        m.stop()
