"""The process's lease, as every writer checks it (high availability; capturer/ha).

Without HA nothing is armed and ``check`` costs one attribute read. With HA the
active capturer arms the guard with its epoch (the fencing token) and extends it
after every lease renewal with the time until which the lease is certainly still
its own (measured on the monotonic clock from *before* the renewal was sent, so a
pause of the process, SIGSTOP or a long GC, counts against it). Every sender checks
it before it opens its destination and before each batch, the checkpoint before
each write: a capturer paused past its lease writes nothing once it runs again.
The destinations that can check a token themselves (the MySQL target's fence row,
the checkpoint's compare-and-put in etcd, the file and lake locks) fence what a
pause between this check and the write would let through.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from pathlib import Path
from typing import Protocol

from capturer.errors import Fenced


class LeaseSource(Protocol):
    """Where the lease's renewals land when another process makes them (capturer/ha/keeper.py):
    (valid until on the monotonic clock, 0 or why it is lost)."""

    def read(self) -> tuple[float, int]: ...


_LAYOUT = struct.Struct("<dqq")  # valid until (monotonic, less the margin), state (0: held), renewals

#: why a lease is lost, by the state the keeper writes
LOST = {
    1: "etcd says its lease expired",
    2: "the leader key is gone or another capturer's",
    3: "etcd unreachable for the lease's length",
    4: "the lease keeper process stopped",
}


class SharedLease:
    """The file the lease keeper (capturer/ha/keeper.py) writes and the guards read: 24 bytes,
    mapped by the capturer, its keeper and its senders' processes (``process = true``)."""

    def __init__(self, path: Path, create: bool = False):
        self.path = path
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, _LAYOUT.size)
            self._map = mmap.mmap(fd, _LAYOUT.size)
        finally:
            os.close(fd)

    def read(self) -> tuple[float, int]:
        until, state, _ = _LAYOUT.unpack_from(self._map, 0)
        return float(until), int(state)

    def renewals(self) -> int:
        return int(_LAYOUT.unpack_from(self._map, 0)[2])

    def write(self, until: float, state: int = 0, renewals: int | None = None) -> None:
        if renewals is None:
            renewals = self.renewals()
        _LAYOUT.pack_into(self._map, 0, until, state, renewals)

    def close(self) -> None:
        self._map.close()


class LeaseGuard:
    def __init__(self) -> None:
        self.armed = False
        self.epoch = 0
        self._valid_until = 0.0
        self._lost = ""  # why the lease is gone ("" while it is held)
        self._lock = threading.Lock()
        self._source: LeaseSource | None = None
        self._reasons: dict[int, str] = {}

    def attach(self, source: LeaseSource | None, reasons: dict[int, str] | None = None) -> None:
        """Read renewals (and a loss) from ``source`` at every check, as well as ``extend``."""
        self._source, self._reasons = source, dict(reasons or {})

    def _sync(self) -> None:
        src = self._source
        if src is None:
            return
        until, state = src.read()
        if until > self._valid_until and not self._lost:
            self._valid_until = until
        if state and self.armed and not self._lost:
            self._lost = self._reasons.get(state, f"lost ({state})")

    @property
    def lost(self) -> str:
        """Why the lease is gone ("" while it is held)."""
        self._sync()
        return self._lost

    @lost.setter
    def lost(self, why: str) -> None:
        self._lost = why

    def arm(self, epoch: int, valid_until: float) -> None:
        with self._lock:
            self.armed, self.epoch, self._valid_until, self._lost = True, epoch, valid_until, ""

    def extend(self, valid_until: float) -> None:
        with self._lock:
            if not self._lost:
                self._valid_until = max(self._valid_until, valid_until)

    def lose(self, why: str) -> None:
        with self._lock:
            if self.armed and not self._lost:
                self._lost = why

    def disarm(self) -> None:
        with self._lock:
            self.armed, self.epoch, self._lost = False, 0, ""
            self._source = None

    def remaining(self) -> float:
        self._sync()
        return self._valid_until - time.monotonic()

    def check(self, what: str) -> None:
        """Raise Fenced if this process may no longer write (``what``: who asks)."""
        if not self.armed:
            return
        self._sync()
        if self._lost:
            raise Fenced(f"{what}: not written: this capturer is no longer the active one ({self._lost})")
        if time.monotonic() >= self._valid_until:
            self._lost = "its lease ran out before it could be renewed"
            raise Fenced(f"{what}: not written: this capturer's lease (epoch {self.epoch}) ran out")


GUARD = LeaseGuard()


def follow(epoch: int, lease_file: str) -> None:
    """Arm this process's guard from the capturer's lease file: a sender's own process
    (``process = true``) checks the same lease as the capturer that started it. The file is
    renewed only while the capturer runs: a capturer frozen (SIGSTOP) past its lease leaves
    its sender processes, which run on in sessions of their own, refusing every write, as
    its own threads would."""
    GUARD.arm(epoch, 0.0)
    GUARD.attach(SharedLease(Path(lease_file)), LOST)


def check(what: str) -> None:
    GUARD.check(what)
