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

import threading
import time

from capturer.errors import Fenced


class LeaseGuard:
    def __init__(self) -> None:
        self.armed = False
        self.epoch = 0
        self._valid_until = 0.0
        self.lost = ""  # why the lease is gone ("" while it is held)
        self._lock = threading.Lock()

    def arm(self, epoch: int, valid_until: float) -> None:
        with self._lock:
            self.armed, self.epoch, self._valid_until, self.lost = True, epoch, valid_until, ""

    def extend(self, valid_until: float) -> None:
        with self._lock:
            if not self.lost:
                self._valid_until = max(self._valid_until, valid_until)

    def lose(self, why: str) -> None:
        with self._lock:
            if self.armed and not self.lost:
                self.lost = why

    def disarm(self) -> None:
        with self._lock:
            self.armed, self.epoch, self.lost = False, 0, ""

    def remaining(self) -> float:
        return self._valid_until - time.monotonic()

    def check(self, what: str) -> None:
        """Raise Fenced if this process may no longer write (``what``: who asks)."""
        if not self.armed:
            return
        if self.lost:
            raise Fenced(f"{what}: not written: this capturer is no longer the active one ({self.lost})")
        if time.monotonic() >= self._valid_until:
            self.lost = "its lease ran out before it could be renewed"
            raise Fenced(f"{what}: not written: this capturer's lease (epoch {self.epoch}) ran out")


GUARD = LeaseGuard()


def check(what: str) -> None:
    GUARD.check(what)
