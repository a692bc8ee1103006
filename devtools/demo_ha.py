"""``sh start.sh --demo ha``: high availability on one machine. A private etcd, two
private MariaDB shards with the shop workload, and **two capturers with the same
config** (an ``[ha]`` group, the file sender): one runs, one stands by. Midway the
active one is killed (kill -9) and the standby takes over; later the new active hands
over to the restarted one (``POST /handover``). The terminal shows who is active.

With ``--once`` it ends when the file holds every committed change and exits 0 only if
replaying the file gives exactly the source tables (nothing lost, nothing twice)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from devtools.demo import SCHEMA, FileSink, Workload, _write_conf, shop_sources
from devtools.local_etcd import EtcdCluster
from devtools.local_mariadb import MariaDBInstance

ROOT = Path(__file__).resolve().parents[1]
LEASE = 3


class Member:
    def __init__(self, cfg: Path, log: Path):
        self.cfg, self.log = cfg, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Member:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "capturer", "--config", str(self.cfg)], stdout=out,
                                         stderr=subprocess.STDOUT, cwd=str(ROOT))
        return self

    def port(self) -> int:
        ports = re.findall(r"status on http://127\.0\.0\.1:(\d+)", self.log.read_text(errors="replace"))
        return int(ports[-1]) if ports else 0

    def status(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port()}/status", timeout=3) as r:
                d: dict[str, Any] = json.loads(r.read())
                return d
        except (OSError, ValueError):
            return {}

    def role(self) -> str:
        return str((self.status().get("ha") or {}).get("role", "starting"))

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def post(self, path: str, token: str) -> int:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port()}{path}", data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0


def _wait(pred: Any, timeout: float, stop: threading.Event) -> float | None:
    t0 = time.monotonic()
    while not stop.is_set() and time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def run_ha_demo(basedir: Path, once: bool = False, steps: int = 600, stop: threading.Event | None = None) -> int:
    basedir = basedir.resolve()
    if basedir.exists():
        shutil.rmtree(basedir)
    basedir.mkdir(parents=True)
    stop = stop if stop is not None else threading.Event()
    print(f"demo ha: starting a private etcd and two MariaDB regions under {basedir} ...", flush=True)
    etcd = EtcdCluster(basedir / "etcd", 1)
    servers = [MariaDBInstance(basedir / f"region{i + 1}", server_id=i + 1) for i in range(2)]
    members: list[Member] = []
    try:
        etcd.start()
        for m in servers:
            m.start()
            m.create_capture_user()
            m.execute(*SCHEMA)
        cfg = _write_conf(basedir, servers)
        cfg.write_text(cfg.read_text() + f"\n[ha]\nendpoints={etcd.endpoints}\nname=demo\nleaseSeconds={LEASE}\n")
        token = re.search(r"controlToken=(\S+)", cfg.read_text()).group(1)  # type: ignore[union-attr]
        members = [Member(cfg, basedir / f"capturer-{x}.log").start() for x in "ab"]
        print(f"demo ha: two capturers with the same config {cfg} (logs {basedir}/capturer-a.log, -b.log)", flush=True)
        if _wait(lambda: sorted(m.role() for m in members) == ["active", "standby"], 120, stop) is None:
            print("demo ha: the capturers did not start (see their logs)", flush=True)
            return 1

        def show(what: str) -> None:
            parts = []
            for mem, x in zip(members, "ab"):
                ha = mem.status().get("ha") or {}
                parts.append(f"{x}: {ha.get('role', 'down')} (port {mem.port()}, epoch {ha.get('epoch', '-')})")
            print(f"demo ha: {what:28s} " + "   ".join(parts), flush=True)

        show("started")
        loads = [Workload(m, i + 1, seed=42 + i) for i, m in enumerate(servers)]
        i = 0
        events = {steps // 3: "kill", 2 * steps // 3: "handover"}
        while not stop.is_set() and (not once or i < steps):
            loads[i % 2].step()
            i += 1
            time.sleep(0.01)
            ev = events.get(i if once else i % steps)
            if ev == "kill":
                active = next(m for m in members if m.role() == "active")
                other = next(m for m in members if m is not active)
                active.kill9()
                show("killed the active (kill -9)")
                took = _wait(lambda other=other: other.role() == "active", 60, stop)
                show(f"standby took over in {took:.1f}s" if took is not None else "no takeover")
                active.start()
            elif ev == "handover":
                if _wait(lambda: sorted(m.role() for m in members) == ["active", "standby"], 60, stop) is None:
                    continue
                active = next(m for m in members if m.role() == "active")
                other = next(m for m in members if m is not active)
                code = active.post("/handover", token)
                took = _wait(lambda other=other: other.role() == "active", 60, stop)
                show(f"handover (HTTP {code}) in {took:.1f}s" if took is not None else f"handover (HTTP {code})")
            elif i % 100 == 0:
                show(f"{sum(w.rows for w in loads)} source rows")
        if not once or stop.is_set():
            print("demo ha: stopped", flush=True)
            return 0
        targets = [w.m.master_position() for w in loads]
        sink = FileSink(basedir / "out" / "changes.jsonl")

        def caught_up() -> bool:
            st = next((m.status() for m in members if m.role() == "active"), {})
            senders = (st.get("checkpoint") or {}).get("senders") or {}
            local = (senders.get("local") or {}).get("regions") or {}
            return all(f"shard{k + 1}" in local and (local[f"shard{k + 1}"]["file"], local[f"shard{k + 1}"]["pos"])
                       >= t for k, t in enumerate(targets))

        reached = _wait(caught_up, 300, stop) is not None
        for mem in members:
            mem.post("/stop", token)
        for mem in members:
            if mem.proc is not None:
                mem.proc.wait(120)
        committed = sum(w.rows for w in loads)
        check = sink.check(shop_sources(servers), committed)
        print("\n== demo ha summary ==")
        print(f"row changes committed:  {committed} over 2 regions, one kill -9 of the active capturer, one handover")
        print(f"file:                   {'EQUAL' if check.equal else 'DIFFERENT'}: {check.tables} tables, "
              f"{check.rows} rows; {check.note}")
        for p in check.problems:
            print(f"MISMATCH: {p}")
        ok = reached and check.equal
        print("result:                 " + ("OK: the file equals the sources across the takeovers" if ok else "FAILED"))
        return 0 if ok else 1
    finally:
        for mem in members:
            mem.kill9()
        for srv in servers:
            srv.stop()
        etcd.stop()
