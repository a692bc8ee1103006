"""The active capturer's lease, kept alive by a small process of its own.

A capturer's interpreter can be busy for seconds at a time on a loaded host: CPU-bound
threads of its own hold the GIL, other processes hold the cores. A lease renewed from
one of its threads then lapses although the capturer is alive and well (issue 45: 12
epochs in 196 s where 4 were caused, with two CPU-busy processes beside it), and each
lapse is a stall while a standby takes over. So the renewals come from a child process
that does nothing else (``python -m capturer.ha.keeper``, at a higher scheduling
priority where the user may raise it):

* every ``lease / 4`` it renews the lease and checks that the leader key is still its
  capturer's epoch, then writes, into a small file both processes map
  (``SharedLease``), until when (monotonic clock, shared by every process of the
  machine) the lease is surely held, less the margin; the capturer's lease guard
  (capturer/util/fencing.py) reads it there at every check: no thread of the busy
  capturer has to run for its lease to be extended;
* it renews **only while the capturer runs**: a capturer that is stopped (SIGSTOP: its
  state in ``/proc`` is ``T``) gets no renewal, so its lease runs out as before and a
  standby takes over; one that is gone (``kill -9``: the keeper's parent changes)
  ends the keeper, and the lease runs out by itself (it is not revoked: a sender
  process of the dead capturer may still be finishing a write);
* a lost lease (etcd says it expired, the leader key is another's, etcd unreachable
  for the lease's length) is written into the file as a state: the guard refuses
  every write from then on, and the capturer's watcher steps it down.

A frozen machine freezes both processes: the lease runs out, as it must.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from capturer.ha.coord import CoordinationError, Coordinator
from capturer.util.fencing import LOST, SharedLease

__all__ = ["LOST", "LeaseKeeper", "SharedLease", "run"]

log = logging.getLogger("capturer.ha.keeper")


class LeaseKeeper:
    """The capturer's side: starts the keeper process, hands the guard its file, stops it."""

    def __init__(self, endpoints: tuple[str, ...], name: str, lease_seconds: int, lease: int, epoch: int,
                 margin: float, valid_until: float):
        shm = Path("/dev/shm")
        self.path = (shm if shm.is_dir() else Path(tempfile.gettempdir())) / f"capturer-lease-{os.getpid()}"
        self.shared = SharedLease(self.path, create=True)
        self.shared.write(valid_until, 0, 0)
        self.args = {"ppid": os.getpid(), "path": str(self.path), "lease": lease, "epoch": epoch, "margin": margin,
                     "lease_seconds": lease_seconds, "endpoints": list(endpoints), "name": name}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "capturer.ha.keeper", json.dumps(self.args)],
                                     stdin=subprocess.DEVNULL, env=env, cwd=root)
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            self.path.unlink()
        except OSError:
            pass


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger): its state in /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] in ("T", "t")


def run(args: dict[str, Any]) -> int:
    """The keeper's loop (see the module docstring); ``args`` as ``LeaseKeeper`` passes them."""
    ppid = int(args["ppid"])
    shared = SharedLease(Path(args["path"]))
    lease, epoch, margin = int(args["lease"]), int(args["epoch"]), float(args["margin"])
    lease_seconds = int(args["lease_seconds"])
    try:
        os.nice(-10)  # (as root: ahead of the busy processes beside it; else as it is)
    except OSError:
        pass
    ka = Coordinator(tuple(args["endpoints"]), str(args["name"]), lease_seconds)
    ka.epoch = epoch
    every = max(0.2, lease_seconds / 4)
    next_renewal = 0.0
    while True:
        if os.getppid() != ppid:
            return 0  # the capturer is gone: the lease runs out by itself
        now = time.monotonic()
        if now >= next_renewal and not _stopped(ppid):
            until, _ = shared.read()
            try:
                got_until = ka.refresh(lease)
                if got_until is None:
                    shared.write(until, 1)
                    return 0
                got = ka.leader()
                if got is None or got[1] != epoch:
                    shared.write(until, 2)
                    return 0
                shared.write(max(until, got_until - margin), 0, shared.renewals() + 1)
                next_renewal = now + every
            except CoordinationError as exc:
                if time.monotonic() >= until:
                    shared.write(until, 3)
                    return 0
                log.warning("renewing the lease: %s (it holds %.1f s more)", exc, until - time.monotonic())
                next_renewal = time.monotonic() + min(every, 0.5)
        time.sleep(0.05)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    sys.exit(run(json.loads(sys.argv[1])))
