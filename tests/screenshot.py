"""Refresh the README's screenshot of the status page (docs/status-page.png) with what the
page shows today: two MariaDB regions under load, an [ha] group of two capturers (one
active, one standing by, a private etcd), two senders (a MariaDB target with its work in
a process of its own, and the file, paused: its backlog grows on disk while the other goes
on), and the result of a ``verify`` started from the page's control API.

    .venv/bin/python tests/screenshot.py            # writes docs/status-page.png (~2 min)
    .venv/bin/python tests/screenshot.py OUT.png    # anywhere else

Everything it starts is private (ports, data directories under a temporary directory) and
stopped at the end. Not a test: tests/integration/test_status_page.py checks the page."""

from __future__ import annotations

import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from browser import Browser
from helpers import ROOT, CapturerProcess, start_servers, wait_for, write_config
from workload import SCHEMA, Workload

from devtools.local_etcd import EtcdCluster
from devtools.local_mariadb import MariaDBInstance, free_port

TOKEN = "screenshot-token"


def main(out: Path) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="capturer-screenshot-"))
    etcd = EtcdCluster(tmp / "etcd", 1).start()
    servers = start_servers(tmp, 2)
    target = MariaDBInstance(tmp / "target", server_id=99, binlog=False).start()
    caps: list[CapturerProcess] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        for m in servers:
            m.execute(*SCHEMA)
        senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\nprocess=true\n")
        cfg = write_config(tmp, servers, senders=senders, filter_text="# every table\n",
                           extra_global=f"controlToken={TOKEN}\n")
        cfg.write_text(cfg.read_text() + f"\n[ha]\nendpoints={etcd.endpoints}\nname=shop\nleaseSeconds=5\n")
        port = int(re.search(r"httpPort=(\d+)", cfg.read_text()).group(1))  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}"
        # the standby: the same config with a port of its own
        cfg_b = tmp / "config-b.cfg"
        cfg_b.write_text(re.sub(r"httpPort=\d+", f"httpPort={free_port()}", cfg.read_text()))
        caps.append(CapturerProcess(cfg, tmp / "capturer-a.log").start())
        wait_for(lambda: _role(url) == "active", 120, "the first capturer to be active")
        caps.append(CapturerProcess(cfg_b, tmp / "capturer-b.log").start())
        loads = [Workload(m, i + 1, 70 + i) for i, m in enumerate(servers)]

        def run(w: Workload) -> None:
            while not stop.is_set():
                w.step()
                time.sleep(0.01)

        threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in loads]
        for t in threads:
            t.start()
        # the page open from the start: its chart keeps the history it has seen
        with Browser(url + "/", width=1400, height=1000) as b:
            b.wait("document.getElementById('conn').textContent === 'live'", 30, "the live badge")
            time.sleep(45)  # a chart with some history
            auth = {"Authorization": f"Bearer {TOKEN}"}
            requests.post(url + "/verify", headers=auth, json={}, timeout=30).raise_for_status()
            wait_for(lambda: (requests.get(url + "/status", timeout=10).json().get("verify") or {}).get("last")
                     is not None, 300, "verify's result")
            requests.post(url + "/senders/local/pause", headers=auth, json={}, timeout=30).raise_for_status()
            time.sleep(30)  # the paused sender falls behind while the other goes on
            shot = b.screenshot(out)
        print(f"screenshot: {shot}")
        return 0
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for c in caps:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
        etcd.stop()
        for m in [*servers, target]:
            m.stop()


def _role(url: str) -> str:
    try:
        return str((requests.get(url + "/status", timeout=5).json().get("ha") or {}).get("role", ""))
    except (OSError, ValueError):
        return ""


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "status-page.png"))
