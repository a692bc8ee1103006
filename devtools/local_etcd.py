"""Private etcd servers for the high-availability tests, the chaos suite and the bench:
Debian's ``etcd`` (package etcd-server, 3.4), one member or a cluster of three, each
on free ports of 127.0.0.1 with a data directory of its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from devtools.local_mariadb import free_port


def etcd_binary() -> str | None:
    return shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)


class EtcdMember:
    def __init__(self, name: str, base: Path):
        self.name = name
        self.dir = base / name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = base / f"{name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, initial_cluster: str, state: str = "new") -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd not found: install Debian's etcd-server (sh tests/run.sh does)")
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [binary, "--name", self.name, "--data-dir", str(self.dir),
                 "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                 "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                 "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
                 "--initial-cluster-token", f"capturer-test-{os.getpid()}",
                 "--heartbeat-interval", "100", "--election-timeout", "1000"],
                stdout=log, stderr=subprocess.STDOUT, env=env)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                return bool(json.loads(r.read()).get("health") in ("true", True))
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def pause(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)


class EtcdCluster:
    """``size`` members (1 or 3); ``endpoints`` for [ha] endpoints=."""

    def __init__(self, base: Path, size: int = 1):
        self.base = base
        self.members = [EtcdMember(f"m{i}", base) for i in range(size)]

    @property
    def endpoints(self) -> str:
        return ",".join(m.url for m in self.members)

    def _initial(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def start(self, timeout: float = 60) -> EtcdCluster:
        for m in self.members:
            m.start(self._initial())
        self.wait(timeout)
        return self

    def wait(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(m.healthy() for m in self.members if m.proc is not None):
                return
            time.sleep(0.1)
        logs = "; ".join(f"{m.log}: {m.log.read_text(errors='replace')[-500:]}" for m in self.members
                         if m.log.exists())
        raise RuntimeError(f"etcd did not become healthy in {timeout:.0f} s ({logs})")

    def restart(self, member: int = 0, down: float = 0.0) -> None:
        """Kill a member and start it again (its data kept) after ``down`` seconds."""
        m = self.members[member]
        m.kill()
        time.sleep(down)
        m.start(self._initial(), state="existing" if len(self.members) > 1 else "new")
        self.wait()

    def stop(self) -> None:
        for m in self.members:
            m.kill()
