"""Unchanged TOASTed values of a PostgreSQL table under REPLICA IDENTITY DEFAULT
(read back from the table by the region) under CPU load, where PostgreSQL sends a
transaction before other sessions can see it (issue 44): no value is ever left out
of a row that exists, and no sink makes one up."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, verify_equal, wait_for

from capturer.app import check_root, load_config
from capturer.ops.check import run_check
from devtools.local_mariadb import MariaDBInstance
from devtools.local_postgres import PostgresInstance
from devtools.pg_workload import file_rows, mysql_rows, pg_rows
from integration.test_postgresql import checkpoint, config, covered, current_lsn, pg_region, streaming
from senders.local.replay import read_changes, rebuild

pytestmark = pytest.mark.integration

TABLE = ("public", "toasted")
MOVE = 10_000_000  # a key change: id -> id + MOVE
PACE = 0.003  # seconds between transactions of the paced writer (the capturer keeps up)


@pytest.fixture
def pg() -> Iterator[PostgresInstance]:
    """A server that commits as PostgreSQL does by default (``synchronous_commit = on``:
    the commit record is flushed, and so can be sent, before the transaction is
    visible; the tests' other servers commit asynchronously, which hides that)."""
    p = PostgresInstance(settings={"synchronous_commit": "on"}).start()
    yield p
    p.destroy()


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two CPU-busy processes beside the test (the window between a transaction's
    commit record and its visibility only opens under load)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()


def big_text(rng: random.Random) -> str:
    """9 KB of text stored out of line (storage EXTERNAL: no compression)."""
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=9000))


def test_unchanged_toast_values_under_load_with_the_capturer_caught_up_and_behind(
        tmp_path: Path, pg: PostgresInstance, target: MariaDBInstance, cpu_load: None,
        capturer_running: Any) -> None:
    """1,200 key changes of rows with a 9 KB value, one per transaction, written at
    the pace the capturer keeps up with, then 1,200 more written as fast as possible
    (the capturer behind), with inserts updated in their own transaction and updates
    of other columns between them, two CPU-busy processes beside: every update line
    in the file carries the value, the file and the MySQL target equal the source,
    and ``toast_missing`` is 0 (every row exists)."""
    rng = random.Random(44)
    n = 1200
    with pg.connect() as c:
        c.execute("CREATE TABLE public.toasted (id int PRIMARY KEY, n int NOT NULL, t text)")
        c.execute("ALTER TABLE public.toasted ALTER COLUMN t SET STORAGE EXTERNAL")
    senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")
    cfg = config(tmp_path, pg_region("pg", pg), senders)
    with capturer_running(cfg) as cap:
        streaming(cap)
        with pg.connect() as c:
            for lo in range(1, n + 1, 100):
                with c.transaction():
                    for i in range(lo, lo + 100):
                        c.execute("INSERT INTO public.toasted VALUES (%s, 0, %s)", (i, big_text(rng)))
        region = cap.regions[0]
        wait_for(lambda: covered(tmp_path, "pg", current_lsn(pg)), 60, "the inserts to be captured")
        with pg.connect() as c:
            # caught up: each transaction waits until the region has decoded the one before
            for i in range(1, n + 1):
                if i % 4 == 0:  # a row inserted and updated in one transaction: nobody saw it before
                    with c.transaction():
                        c.execute("INSERT INTO public.toasted VALUES (%s, 0, %s)", (3 * MOVE + i, big_text(rng)))
                        c.execute("UPDATE public.toasted SET n = n + 1 WHERE id = %s", (3 * MOVE + i,))
                c.execute("UPDATE public.toasted SET id = id + %s, n = n + 1 WHERE id = %s", (MOVE, i))
                time.sleep(PACE)
            caught_up = dict(region.status())
            # behind: as fast as the source takes them
            for i in range(1, n + 1):
                c.execute("UPDATE public.toasted SET id = id + %s, n = n + 1 WHERE id = %s", (MOVE, MOVE + i))
                if i % 3 == 0:
                    c.execute("UPDATE public.toasted SET n = n + 1 WHERE id = %s", (3 * MOVE + i + (-i % 4),))
        end = current_lsn(pg)
        wait_for(lambda: covered(tmp_path, "pg", end), 120, "the checkpoint to pass the source's last change")
        st = region.status()
    lines = [d for d in read_changes(tmp_path / "out" / "changes.jsonl") if d.get("op") == "update"]
    lacking = [d["after"]["id"] for d in lines if "t" not in d["after"]]
    want = pg_rows(pg, *TABLE)
    assert len(want) == n + n // 4
    got_file = file_rows(rebuild(read_changes(tmp_path / "out" / "changes.jsonl")), *TABLE)
    got_mysql = mysql_rows(target, *TABLE)
    print(f"caught up: {caught_up}\nend: {st}")
    assert len(lines) >= 2 * n + n // 4 + n // 3
    assert not lacking, f"{len(lacking)} of {len(lines)} update lines lack the TOASTed value, e.g. {lacking[:5]}"
    assert st["toast_missing"] == 0, st
    assert st["toast_filled"] >= 2 * n + n // 4 + n // 3, st
    assert got_file == want, f"file: {len(set(want) - set(got_file))} source rows differ"
    assert got_mysql == want, f"MySQL target: {len(set(want) - set(got_mysql))} source rows differ"
    assert st["toast_wait_timeouts"] == 0, st
    assert json.loads(want[0])["t"] is not None


class HeldCommit(threading.Thread):
    """One statement in its own transaction while ``synchronous_standby_names`` names a
    standby that never answers: PostgreSQL flushes its commit record (the walsender
    sends the transaction) but keeps it invisible to other sessions until the standby
    is dropped from the setting (``release``)."""

    def __init__(self, pg: PostgresInstance, sql: str):
        super().__init__(daemon=True)
        self.pg, self.sql = pg, sql
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.pg.connect() as c:
                c.execute(self.sql)
        except BaseException as exc:
            self.error = exc


def hold_commits(pg: PostgresInstance, standby: str) -> None:
    with pg.connect() as c:
        c.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{standby}'")
        c.execute("SELECT pg_reload_conf()")

    def loaded() -> bool:  # (the reload reaches every process a moment later)
        with pg.connect() as c:
            return bool(c.execute("SHOW synchronous_standby_names").fetchone()[0] == standby)

    wait_for(loaded, 10, "the setting to be loaded")
    # whether commits wait for a standby is decided by a flag in shared memory that the checkpointer sets
    # when it has read the reloaded setting, which a new session seeing it does not prove (under load the
    # checkpointer may not have run yet: a commit went through unheld). A CHECKPOINT is done by the
    # checkpointer after it handled the reload signal sent before it, so the flag is set once it returns.
    with pg.connect() as c:
        c.execute("CHECKPOINT")


def test_a_transaction_delivered_before_it_is_visible_is_waited_for(
        tmp_path: Path, pg: PostgresInstance, target: MariaDBInstance, capturer_running: Any) -> None:
    """A key change of a row with a 9 KB value, delivered while its commit waits for a
    synchronous standby (so it is not visible to other sessions yet): the region's fill
    waits until it is (``toast_waits``, ``toast_wait_ms``) and the change carries the
    value. One held longer than ``toast_wait_ms`` is read anyway (``toast_wait_timeouts``,
    ``toast_missing``): the change leaves the column out, and no sink makes it up (the
    MySQL target and the file's rows keep the value they had)."""
    rng = random.Random(7)
    with pg.connect() as c:
        c.execute("CREATE TABLE public.toasted (id int PRIMARY KEY, n int NOT NULL, t text)")
        c.execute("ALTER TABLE public.toasted ALTER COLUMN t SET STORAGE EXTERNAL")
    senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=2\n")
    cfg = config(tmp_path, pg_region("pg", pg, "toast_wait_ms=1500\n"), senders)
    try:
        with capturer_running(cfg) as cap:
            streaming(cap)
            region = cap.regions[0]
            with pg.connect() as c:
                for i in (1, 2, 3):
                    c.execute("INSERT INTO public.toasted VALUES (%s, 0, %s)", (i, big_text(rng)))
            wait_for(lambda: covered(tmp_path, "pg", current_lsn(pg)), 60, "the inserts to be captured")
            for i, hold_s in ((1, 0.6), (2, 3.0)):
                done, waits = region.txns, region.status().get("toast_waits", 0)
                hold_commits(pg, "ghost")
                writer = HeldCommit(pg, f"UPDATE public.toasted SET id = id + {MOVE}, n = n + 1 WHERE id = {i}")
                writer.start()
                # delivered (and either decoded already, or its fill waiting for it)
                wait_for(lambda: region.txns > done or region.status().get("toast_waits", 0) > waits, 30,
                         "the held transaction to arrive")
                time.sleep(hold_s)
                assert writer.is_alive(), "the commit was not held"
                hold_commits(pg, "")
                writer.join(30)
                assert writer.error is None, writer.error
                wait_for(lambda: region.txns > done, 30, "the transaction to be decoded")
                st = dict(region.status())
                if i == 1:  # released before toast_wait_ms: waited for, then filled
                    assert st["toast_missing"] == 0, st
                    assert st["toast_waits"] == 1 and 400 <= st["toast_wait_ms"] < 1500, st
                else:  # held past toast_wait_ms: read anyway, the row not at its new key yet
                    assert st["toast_missing"] == 1, st
                    assert st["toast_waits"] == 2 and st["toast_wait_timeouts"] == 1, st
            end = current_lsn(pg)
            wait_for(lambda: covered(tmp_path, "pg", end), 60, "the checkpoint to pass the source's last change")
    finally:
        hold_commits(pg, "")
    lines = [d for d in read_changes(tmp_path / "out" / "changes.jsonl") if d.get("op") == "update"]
    assert [(d["after"]["id"], "t" in d["after"]) for d in lines] == [(1 + MOVE, True), (2 + MOVE, False)]
    want = pg_rows(pg, *TABLE)
    assert len(want) == 3
    assert file_rows(rebuild(read_changes(tmp_path / "out" / "changes.jsonl")), *TABLE) == want
    assert mysql_rows(target, *TABLE) == want


def test_check_connect_advises_replica_identity_full_for_toastable_tables(tmp_path: Path,
                                                                         pg: PostgresInstance) -> None:
    """``--check --connect`` names the published tables whose unchanged TOASTed values
    must be read back (REPLICA IDENTITY DEFAULT, a TOASTable column), not the others."""
    with pg.connect() as c:
        c.execute("CREATE TABLE public.toasted (id int PRIMARY KEY, t text)")
        c.execute("CREATE TABLE public.full_ident (id int PRIMARY KEY, t text)")
        c.execute("ALTER TABLE public.full_ident REPLICA IDENTITY FULL")
        c.execute("CREATE TABLE public.narrow (id int PRIMARY KEY, n bigint)")
        c.execute("CREATE PUBLICATION capturer_pg FOR ALL TABLES")
    (tmp_path / "out").mkdir()
    report = run_check(load_config(config(tmp_path, pg_region("pg", pg))), check_root(), connect=True)
    advice = [n for n in report.notes if "REPLICA IDENTITY DEFAULT" in n]
    assert len(advice) == 1, (report.notes, report.problems)
    assert "public.toasted:" in advice[0] and "REPLICA IDENTITY FULL" in advice[0], advice
    assert "full_ident" not in advice[0] and "narrow" not in advice[0], advice
    assert not report.problems, report.problems


def test_rows_moved_behind_a_snapshot_under_load_keep_their_values(
        tmp_path: Path, pg: PostgresInstance, target: MariaDBInstance, cpu_load: None,
        capturer_running: Any) -> None:
    """``snapshot = initial`` in 200-row chunks of 4,000 rows, 500 of them with a 9 KB
    value; while the copy runs, those rows move, the ones furthest ahead of the copy
    first, to keys behind it (``id -> -id``), two CPU-busy processes beside: the MySQL
    target (where an update finding no row at its old key once upserted a partial
    image: NULLs for good) and the file equal the source, ``toast_missing`` 0."""
    rng = random.Random(45)
    with pg.connect() as c:
        c.execute("CREATE TABLE public.toasted (id int PRIMARY KEY, n int NOT NULL, t text)")
        c.execute("ALTER TABLE public.toasted ALTER COLUMN t SET STORAGE EXTERNAL")
        with c.transaction():
            for i in range(1, 4001):
                c.execute("INSERT INTO public.toasted VALUES (%s, 0, %s)",
                          (i, big_text(rng) if i % 8 == 0 else f"small {i}"))
    senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")
    cfg = config(tmp_path, pg_region("pg", pg, "snapshot=initial\nsnapshot_chunk_rows=200\nsnapshot_workers=1\n"),
                 senders)
    with capturer_running(cfg) as cap:
        streaming(cap)
        region = cap.regions[0]
        with pg.connect() as c:
            for i in range(4000, 0, -8):
                c.execute("UPDATE public.toasted SET id = -id, n = n + 1 WHERE id = %s", (i,))
                time.sleep(PACE)
        end = current_lsn(pg)
        wait_for(lambda: covered(tmp_path, "pg", end) and not checkpoint(tmp_path)["regions"]["pg"].get("snapshot"),
                 120, "the checkpoint to pass the last change and the snapshot")
        st = region.status()
    print(f"end: {st}")
    want = pg_rows(pg, *TABLE)
    assert len(want) == 4000
    assert sum(1 for r in want if json.loads(r)["id"] < 0) == 500
    got_mysql = mysql_rows(target, *TABLE)
    nulls = [json.loads(r)["id"] for r in got_mysql if json.loads(r)["t"] is None]
    assert not nulls, f"MySQL target: {len(nulls)} rows whose value is NULL (none in the source), e.g. {nulls[:5]}"
    assert got_mysql == want, f"MySQL target: {len(set(want) - set(got_mysql))} source rows differ, e.g. " \
        f"{[json.loads(r)['id'] for r in sorted(set(want) - set(got_mysql))[:5]]}"
    got_file = file_rows(rebuild(read_changes(tmp_path / "out" / "changes.jsonl")), *TABLE)
    assert got_file == want, f"file: {len(set(want) - set(got_file))} source rows differ"
    assert st["toast_missing"] == 0, st


class Mover(threading.Thread):
    """Moves rows ``id -> -id`` one per transaction, highest first, at a steady pace."""

    def __init__(self, pg: PostgresInstance, ids: list[int]):
        super().__init__(daemon=True)
        self.pg, self.ids = pg, ids
        self.moved = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.pg.connect() as c:
                for i in self.ids:
                    c.execute("UPDATE public.toasted SET id = -id, n = n + 1 WHERE id = %s", (i,))
                    self.moved += 1
                    time.sleep(0.01)
        except BaseException as exc:
            self.error = exc


def test_rows_moved_behind_a_snapshot_with_kill9_every_sink_equal_and_verify(
        tmp_path: Path, pg: PostgresInstance, target: MariaDBInstance, cpu_load: None) -> None:
    """The snapshot case with the capturer (its own process) killed -9 in the middle of
    the copy and started again while rows with a 9 KB value move behind the copy: no
    update line lacks the value, the file and the MySQL target equal the source and
    ``python -m capturer verify`` says so (exit 0)."""
    rng = random.Random(46)
    rows = 8000
    with pg.connect() as c:
        c.execute("CREATE TABLE public.toasted (id int PRIMARY KEY, n int NOT NULL, t text)")
        c.execute("ALTER TABLE public.toasted ALTER COLUMN t SET STORAGE EXTERNAL")
        with c.transaction():
            for i in range(1, rows + 1):
                c.execute("INSERT INTO public.toasted VALUES (%s, 0, %s)",
                          (i, big_text(rng) if i % 8 == 0 else f"small {i}"))
    senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")
    cfg = config(tmp_path, pg_region("pg", pg, "snapshot=initial\nsnapshot_chunk_rows=50\nsnapshot_workers=1\n"),
                 senders)
    log = tmp_path / "capturer.log"
    p = CapturerProcess(cfg, log).start()
    p.wait_ready(180)
    mover = Mover(pg, list(range(rows, 0, -8)))
    mover.start()

    def copied() -> bool:
        """Part of the copy acknowledged (or all of it: a fast copy can end between two looks)."""
        pos = checkpoint(tmp_path).get("regions", {}).get("pg")
        return pos is not None and (not pos.get("snapshot") or sum(t["rows"] for t in pos["snapshot"]) >= 500)

    wait_for(copied, 180, "part of the snapshot to be acknowledged")
    p.kill9()
    p = CapturerProcess(cfg, log).start()
    p.wait_ready(180)
    mover.join(120)
    assert mover.error is None and mover.moved == rows // 8, mover.error
    end = current_lsn(pg)
    wait_for(lambda: covered(tmp_path, "pg", end) and not checkpoint(tmp_path)["regions"]["pg"].get("snapshot"),
             240, "the checkpoint to pass the last change and the snapshot")
    assert p.stop() == 0
    lines = [d for d in read_changes(tmp_path / "out" / "changes.jsonl") if d.get("op") == "update"]
    lacking = [d["after"]["id"] for d in lines if "t" not in d["after"]]
    # (a move before the slot existed reaches the file as the copy's row)
    assert len(lines) >= rows // 10 and not lacking, f"{len(lacking)} update lines lack the value: {lacking[:5]}"
    want = pg_rows(pg, *TABLE)
    assert mysql_rows(target, *TABLE) == want
    assert file_rows(rebuild(read_changes(tmp_path / "out" / "changes.jsonl")), *TABLE) == want
    verify_equal(cfg, ["local", "mysql"], wait=120)
