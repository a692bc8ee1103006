"""Resource faults: a full disk under the file sender or the spill directory,
and a binlog purged while the capturer was down.

A full disk is a real small tmpfs where this runs as root (it does in CI);
elsewhere the same ENOSPC is injected at the write (``CAPTURER_FAILPOINTS``),
and the test says which in its output.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import start_servers, wait_for
from workload import SCHEMA, Workload

from senders.local.replay import read_changes, rebuild

from .harness import Capturer, covers, source_json

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[bool]:
    """A tmpfs of ``size`` at ``path``; yields False (and mounts nothing) where that is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    ok = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                             capture_output=True).returncode == 0
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def grow(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True, capture_output=True)


def config(tmp: Path, servers: list[Any], out: Path, spill_dir: Path, spill_rows: int = 0,
           http_port: int = 0) -> Path:
    from devtools.local_mariadb import free_port

    (tmp / "senderConfig.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={out}\n")
    (tmp / "filter_rule.txt").write_text("")
    regions = "".join(
        f"\n[region:r{i + 1}]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\npassword=capturer\n"
        f"server_id={800 + i}\nheartbeat_ms=200\n" for i, m in enumerate(servers))
    cfg = tmp / "config.cfg"
    cfg.write_text(f"[global]\nbinlogCheckPointPath={tmp / 'checkpoint.json'}\nsenderConfig={tmp / 'senderConfig.cfg'}\n"
                   f"filterRuleDict={tmp / 'filter_rule.txt'}\nhttpPort={http_port or free_port()}\n"
                   f"checkpointInterval=0.5\nspillRows={spill_rows}\nspillDir={spill_dir}\n" + regions)
    return cfg


def status(cfg: Path) -> dict[str, Any]:
    port = next(line.split("=", 1)[1] for line in cfg.read_text().splitlines() if line.startswith("httpPort="))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
        return json.loads(r.read())


def try_status(cfg: Path) -> dict[str, Any] | None:
    try:
        return status(cfg)
    except OSError:
        return None


def file_equals_sources(out: Path, servers: list[Any], tables: list[str]) -> None:
    state = rebuild(read_changes(out))
    for t in tables:
        got = sorted(json.dumps(r, sort_keys=True) for r in state.get(("app", t), {}).values())
        want = source_json(servers, t)
        assert got == want, f"app.{t}: {len(got)} rows in the file vs {len(want)} in the sources"


def test_file_sender_disk_full_acks_nothing_unwritten_and_resumes(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    servers = start_servers(tmp_path, 2)
    disk = tmp_path / "disk"
    cap = None
    try:
        with small_disk(disk, "256k") as real:
            for m in servers:
                m.execute(*SCHEMA)
            out = disk / "changes.jsonl"
            cfg = config(tmp_path, servers, out, tmp_path / "spill")
            cap = Capturer(cfg, tmp_path / "capturer.log").start("" if real else "local.write=enospc@4-")
            loads = [Workload(m, i + 1, 300 + i) for i, m in enumerate(servers)]
            for t in [w.thread(400) for w in loads]:  # far more than 256 kB of JSON
                t.join()

            def stuck() -> bool:
                s = try_status(cfg)
                return bool(s) and "No space left on device" in (s["senders"]["local"]["last_error"] or "")

            wait_for(stuck, 120, "the file sender to report the full disk")
            s = status(cfg)
            assert str(out) in s["senders"]["local"]["last_error"] and s["senders"]["local"]["state"] == "retrying"
            assert not covers(tmp_path / "checkpoint.json", servers)  # nothing unwritten acknowledged...
            cap.kill9()  # ... proven by a crash now: what the checkpoint skips must be in the file
            if real:
                grow(disk, "64m")
            cap.start()
            wait_for(lambda: covers(tmp_path / "checkpoint.json", servers), 180, "catch-up once space returned")
            assert cap.stop() == 0
            file_equals_sources(out, servers, ["users", "pairs", "log"])
        with capsys.disabled():
            print(f"\n[disk full] {'tmpfs 256k, then remounted 64m' if real else 'injected ENOSPC'}: "
                  f"{sum(w.rows for w in loads)} rows, file equals sources after kill -9 while full")
    finally:
        if cap is not None:
            cap.kill9()
        for m in servers:
            m.stop()


def test_spill_dir_full_is_retried_with_a_clear_error(tmp_path: Path) -> None:
    servers = start_servers(tmp_path, 1)
    m = servers[0]
    spill = tmp_path / "spill"
    cap = None
    try:
        with small_disk(spill, "64k") as real:
            m.execute(*SCHEMA, "CREATE TABLE app.big (id INT PRIMARY KEY, v VARCHAR(100))")
            out = tmp_path / "out" / "changes.jsonl"
            cfg = config(tmp_path, servers, out, spill, spill_rows=200)
            cap = Capturer(cfg, tmp_path / "capturer.log").start("" if real else "spill.write=enospc@1-6")
            c = m.connect()
            with c.cursor() as cur:
                cur.execute("BEGIN")
                cur.executemany("INSERT INTO app.big VALUES (%s, %s)", [(i, "x" * 90) for i in range(5000)])
                cur.execute("COMMIT")
            c.close()

            def reported() -> bool:
                s = try_status(cfg)
                err = (s or {}).get("regions", {}).get("r1", {}).get("last_error") or ""
                return "No space left on device" in err and str(spill) in err

            wait_for(reported, 120, "the region to report the full spill directory")
            assert not covers(tmp_path / "checkpoint.json", servers)
            if real:
                grow(spill, "64m")
            wait_for(lambda: covers(tmp_path / "checkpoint.json", servers), 180, "the retry once space returned")
            assert cap.stop() == 0
            file_equals_sources(out, servers, ["big"])
            assert "spilling it to disk" in (tmp_path / "capturer.log").read_text()
    finally:
        if cap is not None:
            cap.kill9()
        for x in servers:
            x.stop()


def test_binlog_purged_while_down_is_fatal_naming_region_and_positions(tmp_path: Path) -> None:
    servers = start_servers(tmp_path, 1)
    m = servers[0]
    try:
        m.execute(*SCHEMA, "INSERT INTO app.log VALUES ('a', 1)")
        out = tmp_path / "out" / "changes.jsonl"
        cfg = config(tmp_path, servers, out, tmp_path / "spill")
        cap = Capturer(cfg, tmp_path / "capturer.log").start()
        wait_for(lambda: covers(tmp_path / "checkpoint.json", servers), 120)
        assert cap.stop() == 0
        cp_before = (tmp_path / "checkpoint.json").read_bytes()
        resume = json.loads(cp_before)["regions"]["r1"]
        m.execute("INSERT INTO app.log VALUES ('lost?', 2)", "FLUSH BINARY LOGS")

        def purged() -> bool:  # the server keeps a log until InnoDB has checkpointed it: retry
            m.execute("FLUSH BINARY LOGS", "PURGE BINARY LOGS BEFORE NOW() + INTERVAL 1 DAY")
            c = m.connect()
            with c.cursor() as cur:
                cur.execute("SHOW BINARY LOGS")
                names = [str(r[0]) for r in cur.fetchall()]
            c.close()
            logs[:] = names
            return resume["file"] not in names

        logs: list[str] = []
        wait_for(purged, 60, "the server to purge the resume file")
        oldest = logs[0]
        r = subprocess.run([*cap.argv()], capture_output=True, text=True, timeout=120, env=cap.env(), cwd=cap.cwd())
        text = r.stdout + r.stderr + (tmp_path / "capturer.log").read_text()
        assert r.returncode == 1, text[-3000:]
        assert "r1" in text and resume["file"] in text and str(resume["pos"]) in text and oldest in text
        assert "snapshot = when_needed" in text and "delete the checkpoint" in text  # the documented ways out
        assert (tmp_path / "checkpoint.json").read_bytes() == cp_before  # not moved past the gap
    finally:
        for x in servers:
            x.stop()
