"""``process = true``: a local region read and decoded in a worker process.

The worker is a region agent (``python -m capturer.agent --capturer-config ...
--region NAME``) serving that one region on a Unix socket, started and watched
by this region; the capturer reads it like any remote region (``remote.py``), so
the checkpoint, lifts, pins and merge order work exactly as with agents on other
hosts. The worker reads the capturer's own config (no password on a command
line), keeps a BaikalDB region's state files where the in-process region would,
and exits when the capturer does (even after ``kill -9``: it watches its
parent). A worker that dies is started again and the region resumes from the
last item it passed on.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.regions.base import RegionContext
from capturer.regions.remote.keys import RemoteRegionConfig
from capturer.regions.remote.region import RemoteRegion

log = logging.getLogger(__name__)
PACKAGE_ROOT = Path(__file__).resolve().parents[3]


class WorkerRegion(RemoteRegion):
    def __init__(self, cfg: Any, ctx: RegionContext):
        if ctx.config_path is None:
            raise FatalSourceError(f"region {cfg.name}: process=true needs the capturer's config file")
        self._dir = Path(tempfile.mkdtemp(prefix="capturer-worker-"))
        self.socket = self._dir / "region.sock"
        remote = RemoteRegionConfig(cfg.name, "remote", (f"unix:{self.socket}",), cfg.name,
                                    connect_timeout=20.0, idle_timeout=15.0)
        super().__init__(remote, ctx)
        self.local_cfg = cfg
        self.where = f"region {cfg.name} (worker process)"
        self.proc: subprocess.Popen[bytes] | None = None
        self.worker_starts = 0

    def _spawn(self) -> None:
        if self.proc is not None:
            code = self.proc.poll()
            if code is None:
                return
            log.warning("%s: the worker exited with code %s; starting it again", self.where, code)
        self.socket.unlink(missing_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
        argv = [sys.executable, "-m", "capturer.agent", "--capturer-config", str(self.ctx.config_path),
                "--region", self.name, "--listen", f"unix:{self.socket}", "--parent-pid", str(os.getpid())]
        try:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise SourceError(f"{self.where}: cannot start the worker: {exc}") from None
        self.worker_starts += 1
        log.info("%s: worker pid %d", self.where, self.proc.pid)

    def _connect_and_stream(self) -> None:
        self._spawn()
        super()._connect_and_stream()

    def _on_exit(self) -> None:
        super()._on_exit()
        self._stop_worker()

    def _stop_worker(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        d = super().status()
        d["worker"] = {"pid": self.proc.pid if self.proc is not None else None, "starts": self.worker_starts}
        d["agent"].pop("address", None)
        return d
