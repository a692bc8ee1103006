"""The MySQL sender's position in the target (senders/mysql/position.py): after ``kill -9``
the restart skips what the target has, a batch retried after some workers committed
applies no row of a table without keys twice, and nothing is lost."""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, checkpoint_covers, start_servers, wait_for, write_config
from workload import SCHEMA, Workload, assert_target_equals_sources, rows_of

from capturer.model import StreamKey
from capturer.util import failpoints
from devtools.local_mariadb import MariaDBInstance
from senders.mysql import position

pytestmark = pytest.mark.integration


@pytest.fixture
def one_server(tmp_path: Path) -> Iterator[MariaDBInstance]:
    (m,) = start_servers(tmp_path, 1)
    yield m
    m.stop()


def mysql_senders(target: MariaDBInstance, **extra: object) -> str:
    opts = {"host": "127.0.0.1", "port": target.port, "user": "root", "password": "", "threadnum": 4}
    opts.update(extra)
    return "[global]\ntype=mysql\n[mysql]\n" + "".join(f"{k}={v}\n" for k, v in opts.items())


def target_position(target: MariaDBInstance, sender: str = "mysql") -> StreamKey | None:
    """The sender's position as its rows in ``_capturer.position`` say."""
    c = target.connect()
    try:
        with c.cursor() as cur:
            cur.execute(position.select_sql("_capturer"), (sender,))
            return position.Resume.read(cur.fetchall()).key
    finally:
        c.close()


def status(cfg: Path) -> dict[str, Any]:
    port = int(re.search(r"httpPort=(\d+)", cfg.read_text()).group(1))  # type: ignore[union-attr]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def sender_status(cfg: Path) -> dict[str, Any]:
    try:
        return status(cfg)["senders"]["mysql"]  # type: ignore[no-any-return]
    except OSError:
        return {}


class KeylessLoad(threading.Thread):
    """Transactions of several rows into the table without keys (inserts, some updates
    and deletes of one row), so that a row applied twice shows as a duplicate."""

    def __init__(self, m: MariaDBInstance, seed: int):
        super().__init__(daemon=True)
        self.m, self.rng = m, random.Random(seed)
        self.stop = threading.Event()
        self.txns = 0
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            c = self.m.connect()
            c.autocommit(False)
            with c.cursor() as cur:
                while not self.stop.is_set():
                    rows = [(f"k{self.rng.randrange(30)}", self.rng.randrange(5)) for _ in range(self.rng.randint(5, 40))]
                    cur.executemany("INSERT INTO app.log VALUES (%s, %s)", rows)
                    if self.rng.random() < 0.3:
                        cur.execute("UPDATE app.log SET n = n + 10 WHERE msg = %s LIMIT 1", (rows[0][0],))
                    if self.rng.random() < 0.3:
                        cur.execute("DELETE FROM app.log WHERE msg = %s LIMIT 1", (rows[-1][0],))
                    c.commit()
                    self.txns += 1
                    time.sleep(0.01)
            c.close()
        except BaseException as exc:
            self.errors.append(exc)


def test_kill9_mid_load_restarts_from_the_targets_position(tmp_path: Path, two_servers, target) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute(*SCHEMA)
    cfg = write_config(tmp_path, two_servers, senders=mysql_senders(target))
    # the checkpoint lags the target by seconds: what the restart skips is the target's doing
    cfg.write_text(cfg.read_text().replace("checkpointInterval=0.5", "checkpointInterval=4"))
    log = tmp_path / "capturer.log"
    loads = [Workload(m, i + 1, 40 + i) for i, m in enumerate(two_servers)]
    threads = [w.thread(100_000) for w in loads]
    keyless = [KeylessLoad(m, 50 + i) for i, m in enumerate(two_servers)]
    for k in keyless:
        k.start()
    proc = CapturerProcess(cfg, log).start()
    proc.wait_ready()
    wait_for(lambda: (tmp_path / "checkpoint.json").exists(), 60, "a first checkpoint")
    restarts: list[dict[str, Any]] = []
    rng = random.Random(7)
    for _ in range(3):
        time.sleep(rng.uniform(2.0, 4.0))
        proc.kill9()
        cp = json.loads((tmp_path / "checkpoint.json").read_text())
        cp_key = cp["senders"]["mysql"]["key"]
        at_target = target_position(target)
        proc = CapturerProcess(cfg, log).start()
        proc.wait_ready()
        # the restart read the position back and skipped, without sending, what the target had
        wait_for(lambda: sender_status(cfg).get("state") == "running", 60, "the sender to open")
        if at_target is not None and cp_key is not None and list(at_target) > cp_key:
            wait_for(lambda: sender_status(cfg).get("skipped_txns", 0) > 0, 60, "the restart to skip")
        st = sender_status(cfg)
        restarts.append({"checkpoint": cp_key, "target": at_target, "resumed_at": st.get("resumed_at"),
                         "skipped_txns": st.get("skipped_txns")})
    for w in loads:
        w.stop.set()
    for k in keyless:
        k.stop.set()
    for t in threads:
        t.join()
    for k in keyless:
        k.join()
    assert not any(w.errors for w in loads) and not any(k.errors for k in keyless)
    wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 180, "catch-up after kill -9")
    final = sender_status(cfg)
    assert proc.stop() == 0
    print(f"restarts: {restarts}")
    # every restart resumed at the position the target held (read from it, not remembered; a commit
    # the killed process had sent may land after the test read it, hence >=)
    for r in restarts:
        assert r["target"] is not None and r["resumed_at"] >= list(r["target"]), r
    # and at least one was ahead of the checkpoint: the transactions in between were skipped, not sent again
    assert any(r["skipped_txns"] for r in restarts), restarts
    assert sum(k.txns for k in keyless) > 100 and sum(w.txns for w in loads) > 500
    # row by row; the table without keys as a multiset (a row applied twice is a duplicate there)
    assert_target_equals_sources(two_servers, target)
    assert target_position(target) == tuple(final["key"])
    # the last restart applied nothing twice: no row converged by a fallback, none skipped as a replay
    assert final["replayed_skips"] == final["upsert_fallbacks"] == final["replace_fallbacks"] == 0, final
    assert "the target holds the stream up to" in log.read_text()


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_a_batch_failing_after_some_workers_committed_is_retried_without_doubling(
        tmp_path: Path, one_server, target, capturer_running, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
        process: bool) -> None:
    """One source transaction of 12,000 rows without keys then 4,000 keyed rows: the
    first phase (10,000 rows without keys, one worker, two commits of 5,000) commits
    whole; the third commit (the first of the second phase, which spreads over the
    four workers) fails once *after* committing (failpoint ``mysql.commit``). The
    retry starts from the target's position (the transaction before the big one: the
    phases so far ended inside it), applies the keyed rows again (they converge) and
    skips the rows without keys that are there already (``<meta>.applied``)."""
    m = one_server
    m.execute("CREATE DATABASE d",
              "CREATE TABLE d.log (msg VARCHAR(20), n INT)",
              "CREATE TABLE d.k (id INT PRIMARY KEY, v VARCHAR(20), u INT, UNIQUE KEY (u))")
    c = m.connect()
    c.autocommit(False)
    with c.cursor() as cur:
        cur.executemany("INSERT INTO d.log VALUES (%s, %s)", [(f"m{i % 97}", i % 7) for i in range(12_000)])
        cur.executemany("INSERT INTO d.k VALUES (%s, %s, %s)", [(i, f"v{i}", i) for i in range(4_000)])
    c.commit()
    with c.cursor() as cur:  # then small transactions: key changes, deletes, rows without keys
        for i in range(60):
            cur.execute("UPDATE d.k SET id = id + 100000 WHERE id = %s", (i,))
            cur.execute("DELETE FROM d.k WHERE id = %s", (1000 + i,))
            cur.execute("INSERT INTO d.log VALUES (%s, %s)", (f"late{i}", i))
            if i % 5 == 0:
                cur.execute("DELETE FROM d.log WHERE msg = 'm3' LIMIT 1")
            c.commit()
    c.close()
    rule = "mysql.commit=eio@3"
    if process:
        monkeypatch.setenv(failpoints.ENV, rule)  # the sender's process reads it when it starts
    else:
        failpoints.set_rules(rule)
    try:
        cfg = write_config(tmp_path, [m], senders=mysql_senders(
            target, **({"process": "true"} if process else {})))
        with capturer_running(cfg) as cap:
            wait_for(lambda: checkpoint_covers(tmp_path, [m]), 180, "the target to catch up")
            st = cap.senders[0].status()
            key = cap.manager.cursors["mysql"].key
    finally:
        failpoints.set_rules("")
    print(f"mysql sender status: {st}")
    assert st["retries"] == 1 and "injected at failpoint mysql.commit" in st["last_error"]
    for t in ("k", "log"):  # "log" as a multiset: a row applied twice would show
        got, want = rows_of(target, "d", t), rows_of(m, "d", t)
        assert len(got) == len(want) and got == want, (t, len(got), len(want))
    # the retry started before the big transaction: its 10,000 rows without keys of the first
    # phase (and what the workers that had committed the failed phase's share held) were skipped
    # by the target's lane rows, exactly: nothing was applied again
    assert st["resume_skips"] >= 10_000 and st["resume_applied"] > 0
    assert st["replayed_skips"] == st["upsert_fallbacks"] == st["replace_fallbacks"] == 0, st
    assert target_position(target) == key
