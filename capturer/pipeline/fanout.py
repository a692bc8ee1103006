"""The SenderManager: fans the merged, filtered stream out to every sender and
computes the checkpoint from their acknowledgements.

Each sender has its own bounded queue and thread, so senders drain in
parallel; a slow sender throttles the stream once its queue is full
(back-pressure, not unbounded buffering).

Every item handed out gets a dispatch number (its index in the merged stream)
and senders acknowledge numbers, not commit_ts: two regions can commit at the
same commit_ts, and a sender that has taken the first of them but not the
second must not let the second region's position into the checkpoint. A
region's position in the checkpoint is the one after its last item that every
sender acknowledged, with that item's commit_ts (the region's clock resumes
above it); the checkpoint's commit_ts is the newest commit_ts at or below
which every item is acknowledged.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from capturer.model import AnyPosition, Item, Txn
from capturer.pipeline.checkpoint import Checkpoint
from capturer.util.bqueue import Closed, WeightedQueue

log = logging.getLogger(__name__)


class Drain(Protocol):
    """What the manager needs of a sender (``senders.base.Sender`` is one; the
    pipeline does not import the senders: only app.py names both)."""

    name: str
    queue: WeightedQueue[tuple[int, Item]]
    acked_ts: int
    acked_seq: int
    error: BaseException | None

    def start(self, acked_ts: int) -> None: ...

    def stop(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def status(self) -> dict[str, Any]: ...


class SenderManager:
    def __init__(self, senders: Sequence[Drain], start: Checkpoint, stop: threading.Event):
        if not senders:
            raise ValueError("at least one sender is needed")
        self.senders = list(senders)
        self.stop_event = stop
        self.checkpoint = start
        self._positions: dict[str, AnyPosition] = dict(start.regions)
        self._region_ts: dict[str, int] = dict(start.region_ts)
        # (dispatch number, commit_ts, region, position) of items not yet acknowledged by every sender
        self._pending: collections.deque[tuple[int, int, str, AnyPosition | None]] = collections.deque()
        self._seq = 0
        self._lock = threading.Lock()
        self.dispatched_ts = start.commit_ts
        self.dispatched_txns = 0
        self.dispatched_rows = 0
        self.ddl_pending_ts = 0  # checkpoint soon after a DDL is acknowledged

    def start(self) -> None:
        for s in self.senders:
            s.start(self.checkpoint.commit_ts)

    def dispatch(self, item: Item) -> None:
        """Hand one item to every sender, in stream order (blocks when a sender is full)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._pending.append((seq, item.commit_ts, item.region, item.position))
            self.dispatched_ts = item.commit_ts
        weight = 1
        if isinstance(item, Txn):
            weight = item.weight
            self.dispatched_txns += 1
            self.dispatched_rows += len(item.changes)
            if item.ddl is not None:
                self.ddl_pending_ts = item.commit_ts
        for s in self.senders:
            try:
                s.queue.put((seq, item), weight, stop=self.stop_event)
            except Closed:
                return

    def acked_ts(self) -> int:
        return min(s.acked_ts for s in self.senders)

    def acked_seq(self) -> int:
        return min(s.acked_seq for s in self.senders)

    def advance(self) -> Checkpoint:
        """The checkpoint as of now (never below the previous one)."""
        acked = self.acked_seq()
        with self._lock:
            last_ts = None
            while self._pending and self._pending[0][0] <= acked:
                _, last_ts, region, pos = self._pending.popleft()
                if pos is not None:
                    # the floor is the commit_ts of the first item that reached this
                    # position: items sent again at it after a restart (a region's
                    # statements in front of its first transaction) then get their
                    # commit_ts again
                    if pos is not self._positions.get(region):
                        self._region_ts[region] = last_ts
                    self._positions[region] = pos
            if last_ts is None:
                return self.checkpoint
            if self._pending and self._pending[0][1] <= last_ts:
                # another region's item at the same commit_ts is still on its way
                last_ts = self._pending[0][1] - 1
            ts = max(last_ts, self.checkpoint.commit_ts)
            self.checkpoint = Checkpoint(ts, dict(self._positions), dict(self._region_ts))
            return self.checkpoint

    def pin(self, region: str, position: AnyPosition, floor: int) -> Checkpoint | None:
        """Give a region that has no position yet its start position (nothing of it
        was dispatched) and the floor its clock started from: the checkpoint to
        write now, or None if it has one."""
        with self._lock:
            if region in self._positions:
                return None
            self._positions[region] = position
            self._region_ts[region] = floor
            cur = self.checkpoint
            self.checkpoint = Checkpoint(cur.commit_ts, {**cur.regions, region: position}, dict(self._region_ts))
            return self.checkpoint

    def failed(self) -> Drain | None:
        return next((s for s in self.senders if s.error is not None), None)

    def stop(self) -> None:
        for s in self.senders:
            s.stop()

    def join(self, timeout: float = 30.0) -> None:
        for s in self.senders:
            s.join(timeout)

    def status(self) -> dict[str, Any]:
        return {s.name: s.status() for s in self.senders}
