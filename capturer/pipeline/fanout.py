"""The SenderManager: fans the merged, filtered stream out to every sender, each
at its own pace, and computes the checkpoint from where each one stands.

Every item of the stream is appended once to the ``StreamLog``
(capturer/pipeline/backlog.py) and gets an offset; each sender reads it through
a cursor of its own and acknowledges offsets. Nobody waits for a slow sender:
what it has not read yet leaves memory for the backlog on disk when memory is
needed, and it reads it from there (the stream waits only when the backlog is
full under ``backlogFull = block``, or when there is no backlog).

Positions: each sender's cut (the regions' positions after its acknowledged
offset) and the key of the last transaction it acknowledged go into the
checkpoint. The sources resume from the sender furthest behind, or from where the
backlog ends when the backlog holds what that sender needs (see
capturer/pipeline/checkpoint.py). At a restart each sender starts at its own
offset (reading the backlog if it was behind) and is handed nothing at or below
its key: a sender that was ahead receives nothing twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from capturer.model import AnyPosition, Item, StreamKey, Txn, key_to_json, stream_key, ts_physical_ms
from capturer.pipeline.backlog import Cursor, Cut, StreamLog
from capturer.pipeline.checkpoint import Checkpoint, SenderPosition
from capturer.util.bqueue import Closed

log = logging.getLogger(__name__)


class Drain(Protocol):
    """What the manager needs of a sender (``senders.base.Sender`` is one; the
    pipeline does not import the senders: only app.py names both)."""

    name: str
    queue: Any  # its inbox: the manager attaches a Cursor
    acked_ts: int
    acked_seq: int
    error: BaseException | None
    state: str
    resume_state: dict[str, Any] | None

    @property
    def paused(self) -> bool: ...

    def attach(self, inbox: Any) -> None: ...

    def start(self, acked_ts: int) -> None: ...

    def stop(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def ack_state(self) -> dict[str, Any] | None: ...


def _acked_of(s: Drain) -> Callable[[], int]:
    return lambda: s.acked_seq


class SenderManager:
    def __init__(self, senders: Sequence[Drain], start: Checkpoint, stop: threading.Event,
                 stream: StreamLog | None = None):
        """``stream``: the StreamLog with its backlog (app.py opens it); without one, a
        memory window as large as the senders' queues and no backlog."""
        if not senders:
            raise ValueError("at least one sender is needed")
        if stream is None:
            stream = StreamLog(max(getattr(s.queue, "capacity", 1) for s in senders), None,
                               start.backlog.next if start.backlog else 1, Cut(dict(start.regions),
                                                                             dict(start.region_ts)))
        self.senders = list(senders)
        self.stop_event = stop
        self.stream = stream
        self.checkpoint = start
        self._lock = threading.Lock()
        self.dispatched_ts = start.commit_ts
        self.dispatched_txns = 0
        self.dispatched_rows = 0
        self.ddl_pending_ts = 0  # checkpoint soon after a DDL is acknowledged
        self._resume_cut = Cut(dict(start.regions), dict(start.region_ts))
        self.cursors: dict[str, Cursor] = {}
        self.new_senders: list[str] = []
        for s in self.senders:
            sp = start.senders.get(s.name)
            if sp is None:
                if start.senders:
                    self.new_senders.append(s.name)
                    log.warning("sender %s is new (the checkpoint has no position for it): it starts where the "
                                "sources resume; what the others received before is not sent to it (fill it "
                                "with an on-demand snapshot)", s.name)
                begin, cut, skip, detached = stream.next, self._resume_cut.copy(), None, False
            else:
                begin = min(sp.offset + 1, stream.next)
                # behind the backlog's end: it reads the backlog from its own cut; else the sources are read
                # again from the resume point and it skips what it has by key
                cut = Cut(dict(sp.regions), dict(sp.region_ts)) if sp.offset + 1 < stream.next \
                    else self._resume_cut.copy()
                skip, detached = sp.key, sp.detached
                s.acked_ts = sp.commit_ts
                s.resume_state = sp.state
                if detached:
                    log.error("sender %s is detached (the backlog limit was reached while it was behind): it "
                              "receives nothing until an operator attaches it again (POST /senders/%s/attach)",
                              s.name, s.name)
            cursor = stream.cursor(s.name, begin, skip, cut, _acked_of(s), detached)
            s.attach(cursor)
            self.cursors[s.name] = cursor
        gone = sorted(set(start.senders) - {s.name for s in self.senders})
        for name in gone:
            log.warning("the checkpoint has a position for sender %s, which senderConfig no longer has: "
                        "dropped (what the backlog kept for it is released)", name)

    def start(self) -> None:
        for s in self.senders:
            s.start(s.acked_ts or self.checkpoint.commit_ts)

    def dispatch(self, item: Item, key: StreamKey | None = None) -> None:
        """Append one item to the stream (blocks only when memory and the backlog are full)."""
        if key is None:
            key = stream_key(item)
        try:
            self.stream.append(key, item, self.stop_event)
        except Closed:
            return
        self.dispatched_ts = item.commit_ts
        if isinstance(item, Txn):
            self.dispatched_txns += 1
            self.dispatched_rows += len(item.changes)
            if item.ddl is not None:
                self.ddl_pending_ts = item.commit_ts

    def attached(self) -> list[Drain]:
        return [s for s in self.senders if not self.cursors[s.name].detached]

    def acked_ts(self) -> int:
        live = self.attached()
        return min(s.acked_ts for s in live) if live else self.dispatched_ts

    def ddl_acknowledged(self) -> bool:
        """True once (then cleared) when every attached sender acknowledged past the
        last DDL handed out: the checkpoint is then written at once (a restart must
        not replay a DDL the destinations applied). The keeper's commit policy asks it."""
        due = bool(self.ddl_pending_ts) and self.acked_ts() >= self.ddl_pending_ts
        if due:
            self.ddl_pending_ts = 0
        return due

    def advance(self) -> Checkpoint:
        """The checkpoint as of now: the backlog fsync'd, every sender's position, and
        where the sources resume."""
        mark, evicted, base = self.stream.mark()
        senders: dict[str, SenderPosition] = {}
        slowest: tuple[int, Cut] | None = None
        for s in self.senders:
            c = self.cursors[s.name]
            with self._lock:
                acked = c.settle()
                cut = c.cut.copy()
            state = s.ack_state()
            senders[s.name] = SenderPosition(acked, c.key, self._safe_ts(c, s.acked_ts), cut.positions,
                                             cut.region_ts, state, c.detached)
            if not c.detached and (slowest is None or acked < slowest[0]):
                slowest = (acked, cut)
        if slowest is None or base - 1 > slowest[0]:
            # the backlog holds what the senders behind still need: the sources resume where it ends
            resume = evicted
        else:
            resume = slowest[1]
        with self._lock:
            # a region pinned after the cuts were taken keeps its pin
            for r, p in self._resume_cut.positions.items():
                resume.positions.setdefault(r, p)
                resume.region_ts.setdefault(r, self._resume_cut.region_ts.get(r, 0))
            self._resume_cut = resume.copy()
        live = [sp for sp in senders.values() if not sp.detached]
        ts = min((sp.commit_ts for sp in live), default=self.checkpoint.commit_ts)
        cp = Checkpoint(max(ts, self.checkpoint.commit_ts) if live else self.checkpoint.commit_ts,
                        dict(resume.positions), dict(resume.region_ts), senders, mark)
        self.checkpoint = cp
        return cp

    def _safe_ts(self, c: Cursor, acked_ts: int) -> int:
        """The newest commit_ts at or below which the sender has every item: its
        acknowledged ts, unless the item after its offset shares it (two regions
        can commit at the same commit_ts), then one below."""
        nxt = c.next_ts()
        if nxt is None:
            nxt = self.stream.commit_ts_at(c.acked_offset + 1)
        if nxt is None and c.acked_offset + 1 < self.stream.next:
            return max(0, acked_ts - 1)  # the next item is on disk: do not claim its ts
        if nxt is not None and nxt <= acked_ts:
            return max(0, nxt - 1)
        return acked_ts

    def rebuild_cut(self) -> Cut:
        """The cut of the attached sender furthest behind (from where the sources must
        be read again if the backlog were lost)."""
        cs = [c for c in self.cursors.values() if not c.detached]
        if not cs:
            return self._resume_cut.copy()
        return min(cs, key=lambda c: c.acked_offset).cut.copy()

    def pin(self, region: str, position: AnyPosition, floor: int) -> bool:
        """Give a region that has no position yet its start position (nothing of it
        was dispatched) and the floor its clock started from; True if it had none
        (the checkpoint is to be written now)."""
        with self._lock:
            if region in self._resume_cut.positions:
                return False
            for cut in [self._resume_cut, self.stream.evicted_cut, self.stream.head_cut] + \
                    [c.cut for c in self.cursors.values()]:
                if region not in cut.positions:
                    cut.positions[region] = position
                    cut.region_ts[region] = floor
            return True

    def failed(self) -> Drain | None:
        return next((s for s in self.senders if s.error is not None), None)

    def stop(self) -> None:
        for s in self.senders:
            s.stop()
        self.stream.close()

    def join(self, timeout: float = 30.0) -> None:
        for s in self.senders:
            s.join(timeout)

    def attach(self, name: str) -> bool:
        """A detached sender goes on from the stream's head; False if it was not detached."""
        c = self.cursors[name]
        if not c.detached:
            return False
        self.stream.attach(c)
        log.warning("sender %s attached again: it goes on from the stream's head; what it missed while detached "
                    "is not sent to it (copy its tables again with an on-demand snapshot)", name)
        return True

    def stream_state(self, s: Drain) -> str:
        c = self.cursors[s.name]
        if c.detached:
            return "detached"
        if s.paused:
            return "paused"
        if s.state in ("retrying", "failed"):
            return "failing"
        if c.behind:
            return "catching up"
        return "live"

    def status(self) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        out = {}
        for s in self.senders:
            c = self.cursors[s.name]
            st = s.status()
            acked = s.acked_ts
            st.update({
                "stream_state": self.stream_state(s),
                "offset": c.acked(),
                "key": key_to_json(c.key),
                "lag_seconds": round(max(0, now_ms - ts_physical_ms(acked)) / 1000, 3) if ts_physical_ms(acked) else None,
                "lag_items": len(c),
                "lag_rows": c.weight,
                "backlog_bytes": self.stream.bytes_held(c),
                "read_from_backlog": c.read_from_backlog,
                "skipped_txns": c.skipped_txns,
                "detached": c.detached,
            })
            out[s.name] = st
        return out
