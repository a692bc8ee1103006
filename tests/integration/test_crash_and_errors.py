"""kill -9 and restart, bad configs, bad servers, a corrupt checkpoint, start.sh/stop.sh."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT, CapturerProcess, checkpoint_covers, read_lines, wait_for, write_config

from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


class Load(threading.Thread):
    """Inserts, updates (some changing the primary key) and deletes, in transactions."""

    def __init__(self, m: MariaDBInstance, seed: int, base: int):
        super().__init__(daemon=True)
        self.m, self.rng, self.next = m, random.Random(seed), base
        self.ids: list[int] = []
        self.rows = 0
        self.stop = threading.Event()

    def run(self) -> None:
        c = self.m.connect()
        c.autocommit(False)
        while not self.stop.is_set():
            n = 0
            with c.cursor() as cur:
                for _ in range(self.rng.randint(1, 5)):
                    r = self.rng.random()
                    if r < 0.5 or len(self.ids) < 10:
                        self.next += 1
                        n += cur.execute("INSERT INTO d.t VALUES (%s, %s)", (self.next, "v" * self.rng.randint(0, 30)))
                        self.ids.append(self.next)
                    elif r < 0.75:
                        n += cur.execute("UPDATE d.t SET v = CONCAT(v, 'u') WHERE id = %s", (self.rng.choice(self.ids),))
                    elif r < 0.85:
                        old = self.rng.choice(self.ids)
                        self.next += 1
                        n += cur.execute("UPDATE d.t SET id = %s WHERE id = %s", (self.next, old))
                        self.ids[self.ids.index(old)] = self.next
                    else:
                        victim = self.ids.pop(self.rng.randrange(len(self.ids)))
                        n += cur.execute("DELETE FROM d.t WHERE id = %s", (victim,))
            c.commit()
            self.rows += n
        c.close()


def source_rows(m: MariaDBInstance) -> dict[int, str]:
    c = m.connect()
    with c.cursor() as cur:
        cur.execute("SELECT id, v FROM d.t")
        out = {int(i): str(v) for i, v in cur.fetchall()}
    c.close()
    return out


def test_kill9_then_restart_loses_nothing(tmp_path: Path, two_servers) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(200))")
    cfg = write_config(tmp_path, two_servers)
    log = tmp_path / "capturer.log"
    loads = [Load(m, seed=i, base=(i + 1) * 1_000_000) for i, m in enumerate(two_servers)]
    for ld in loads:
        ld.start()
    proc = CapturerProcess(cfg, log).start()
    time.sleep(4)
    wait_for(lambda: (tmp_path / "checkpoint.json").exists(), 30, "a first checkpoint")
    proc.kill9()  # mid-load, mid-batch
    before = len(read_lines(tmp_path))
    time.sleep(1)
    proc = CapturerProcess(cfg, log).start()
    time.sleep(3)
    for ld in loads:
        ld.stop.set()
        ld.join()
    wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 90, "checkpoint to cover the load")
    assert proc.stop() == 0
    lines = [x for x in read_lines(tmp_path) if x["op"] != "ddl"]
    assert before > 0
    # duplicates are allowed after a crash, but must be identical under their identity
    by_id: dict[tuple[str, int, int], dict] = {}
    dups = 0
    for x in lines:
        ident = (x["region"], x["commit_ts"], x["seq"])
        if ident in by_id:
            dups += 1
            assert by_id[ident] == x, f"duplicate {ident} differs"
        else:
            by_id[ident] = x
    assert len(by_id) == sum(ld.rows for ld in loads), "row changes missing or extra"
    # replaying the deduplicated stream gives exactly each source's table
    for i, m in enumerate(two_servers):
        state: dict[int, str] = {}
        for x in sorted(by_id.values(), key=lambda x: (x["commit_ts"], x["seq"])):
            if x["region"] != f"r{i + 1}":
                continue
            if x["before"] is not None:
                state.pop(x["before"]["id"], None)
            if x["after"] is not None:
                state[x["after"]["id"]] = x["after"]["v"]
        assert state == source_rows(m)
    print(f"kill -9 test: {len(lines)} lines, {dups} duplicates after restart")


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "capturer", *args], capture_output=True,
                          text=True, env=env, cwd=str(cwd), timeout=120)


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, [])
    cfg.write_text(cfg.read_text() + "[region:a]\nhost=h\nuser=u\nserver_id=1\nport=99999\n")
    r = run_cli("--config", str(cfg))
    assert r.returncode == 2
    assert f"{cfg}:" in r.stderr and "[region:a] port" in r.stderr
    assert not (tmp_path / "checkpoint.json").exists()


def test_bad_filter_line_exits_2_naming_the_line(tmp_path: Path, two_servers) -> None:  # type: ignore[no-untyped-def]
    cfg = write_config(tmp_path, two_servers, filter_text="include d.*\n\ninclude /(/\n")
    r = run_cli("--config", str(cfg))
    assert r.returncode == 2
    assert f"{tmp_path / 'filter_rule.txt'}:3:" in r.stderr and "bad regex" in r.stderr


def test_corrupt_checkpoint_refuses_to_start(tmp_path: Path, two_servers) -> None:  # type: ignore[no-untyped-def]
    cfg = write_config(tmp_path, two_servers)
    (tmp_path / "checkpoint.json").write_text('{"version": 1, "commit_ts": 12')
    r = run_cli("--config", str(cfg))
    assert r.returncode == 2
    assert "checkpoint.json" in r.stderr and "not valid JSON" in r.stderr
    assert (tmp_path / "checkpoint.json").read_text() == '{"version": 1, "commit_ts": 12'
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "extra,needle",
    [({"binlog_format": "STATEMENT"}, "binlog_format=STATEMENT (need binlog_format=ROW)"),
     ({"binlog_row_image": "MINIMAL"}, "binlog_row_image=MINIMAL"),
     ({"binlog_row_metadata": "MINIMAL"}, "binlog_row_metadata=MINIMAL")],
)
def test_wrong_server_settings_are_refused(tmp_path: Path, extra: dict[str, str], needle: str) -> None:
    m = MariaDBInstance(tmp_path / "bad", server_id=7, extra=extra).start()
    try:
        m.create_capture_user()
        cfg = write_config(tmp_path, [m])
        r = run_cli("--config", str(cfg))
        assert r.returncode == 1
        assert needle in r.stderr and "region r1" in r.stderr
    finally:
        m.stop()


def test_binlog_off_is_refused(tmp_path: Path) -> None:
    m = MariaDBInstance(tmp_path / "nobin", server_id=8, binlog=False).start()
    try:
        m.create_capture_user()
        cfg = write_config(tmp_path, [m])
        r = run_cli("--config", str(cfg))
        assert r.returncode == 1 and "log_bin=OFF (need log_bin=ON)" in r.stderr
    finally:
        m.stop()


def test_start_sh_background_and_stop_sh(tmp_path: Path, two_servers) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(50))")
    cfg = write_config(tmp_path, two_servers)
    r = subprocess.run(["sh", "start.sh", "--config", str(cfg)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    pid = int((ROOT / "log" / "capturer.pid").read_text())
    try:
        two_servers[0].execute("INSERT INTO d.t VALUES (1, 'via start.sh')")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
    finally:
        s = subprocess.run(["sh", "stop.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert s.returncode == 0 and "stopped" in s.stdout
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert [x["after"]["v"] for x in read_lines(tmp_path) if x["op"] == "insert"] == ["via start.sh"]
    # a bad config is refused in the foreground with exit code 2
    cfg.write_text(cfg.read_text().replace("checkpointInterval=0.5", "checkpointInterval=soon"))
    r = subprocess.run(["sh", "start.sh", "--config", str(cfg)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 2 and "checkpointInterval" in r.stderr


def test_demo_once(tmp_path: Path) -> None:
    r = run_cli("--demo", "--once", "--demo-dir", str(tmp_path / "demo"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: file replay equals the sources" in r.stdout
    lines = (tmp_path / "demo" / "out" / "changes.jsonl").read_text().splitlines()
    assert any(json.loads(x)["op"] == "delete" for x in lines)


def test_demo_baikaldb_once(tmp_path: Path) -> None:
    r = run_cli("--demo", "baikaldb", "--once", "--demo-dir", str(tmp_path / "demo"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "OK: file replay equals the double's tables" in r.stdout
    lines = (tmp_path / "demo" / "out" / "changes.jsonl").read_text().splitlines()
    assert any('"op": "ddl"' in x and "ADD COLUMN `extra`" in x for x in lines)


def test_demo_postgresql_once(tmp_path: Path) -> None:
    r = run_cli("--demo", "postgresql", "--once", "--demo-dir", str(tmp_path / "demo"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "OK: file replay equals both sources" in r.stdout
    lines = [json.loads(x) for x in (tmp_path / "demo" / "out" / "changes.jsonl").read_text().splitlines()]
    assert {"shard1", "pg"} <= {d["region"] for d in lines}
    assert [d["commit_ts"] for d in lines] == sorted(d["commit_ts"] for d in lines)
