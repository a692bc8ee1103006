"""The merged stream as the senders read it: a window in memory, and a backlog on
disk for senders that fall behind.

Every item of the merged, filtered stream gets an **offset**, increasing, kept
across restarts by the backlog. Each sender reads through a ``Cursor`` of its own,
at its own pace, and acknowledges offsets. While every sender keeps up, items live
only in memory (the window, ``queueRows`` rows) and leave it once every sender has
acknowledged them. When the window is full, its oldest items leave it anyway: an
item some sender has not acknowledged yet is first appended to the **backlog**'s
segment files, from which that sender reads it later, at its own pace. So a slow,
failing, paused or hung sender holds back nobody, until the backlog reaches
``backlogMaxMB``; then the policy decides (``block``: the stream waits for it, as
when there is no backlog; ``detach``: it is detached, its position kept, and the
others go on).

The backlog on disk (its segment files, their records and readers) is
``capturer/pipeline/segments.py``.
"""


from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from capturer.model import AnyPosition, Heartbeat, Item, StreamKey, Txn, stream_key
from capturer.pipeline.segments import Backlog, BacklogError, BacklogMark, SegmentReader
from capturer.util.bqueue import Closed

log = logging.getLogger(__name__)

STALL_S = 1.0  # a sender that took nothing for this long has stopped reading (StreamLog._spill_helps)
READ_AHEAD_ROWS = 50_000  # at most this many rows read ahead (ReadAhead): a hung sender's batch is not held twice


@dataclass
class Cut:
    """Where each region's stream stands after some item of the merged stream: the
    position after the region's last item up to there, and ``region_ts``: the
    commit_ts of the first item that reached that position (the region's clock
    resumes above it, so an item read again gets its commit_ts again)."""

    positions: dict[str, AnyPosition] = field(default_factory=dict)
    region_ts: dict[str, int] = field(default_factory=dict)

    def copy(self) -> Cut:
        return Cut(dict(self.positions), dict(self.region_ts))

    def add(self, region: str, commit_ts: int, position: AnyPosition | None, samepos: bool) -> None:
        if position is None:
            return
        if not samepos or region not in self.region_ts:
            self.region_ts[region] = commit_ts
        self.positions[region] = position


class ReadAhead:
    """One cursor's reads of the backlog, one read ahead: as soon as a read returns, the
    next one (from where it ended, up to what was on disk then) starts in a thread of its
    own, and the cursor's next read takes its result. Decoding what was read back is most
    of a behind sender's cost of the backlog; this way it overlaps with the sender's own
    waits (a Kafka flush, a MySQL phase being committed) instead of following them. The
    reader is used by one thread at a time: the cursor's, or the read ahead's while the
    cursor waits for it. Items are the same objects either way (read from the same records). A read ahead
    takes at most ``READ_AHEAD_ROWS`` rows (a sender asking for more gets a smaller batch then), so that a
    sender with big batches that hangs holds at most that much more in memory."""

    def __init__(self, name: str, new_reader: Callable[[], SegmentReader]):
        self.name = name
        self._new_reader = new_reader
        self.reader = new_reader()
        self._pending: tuple[int, Future[list[tuple[int, int, Item, bool]]]] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.hits = 0  # reads served by a read ahead

    def read(self, start: int, upto: int, max_weight: int) -> list[tuple[int, int, Item, bool]]:
        got: list[tuple[int, int, Item, bool]] | None = None
        p, self._pending = self._pending, None
        if p is not None:
            if p[0] == start:
                got = p[1].result()  # (raises what the read raised: as reading it here would)
                self.hits += 1
            else:  # (not the way the cursor went on: the reader is elsewhere now; a fresh one finds start)
                with contextlib.suppress(Exception):
                    p[1].result()
                self.reader = self._new_reader()
        if got is None:
            got = self.reader.read(start, upto, max_weight)
        nxt = got[-1][0] + 1 if got else start
        if nxt < upto and not self._closed:  # more is on disk (written and flushed before this read): decode it
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"backlog-{self.name}")
            try:
                self._pending = (nxt, self._pool.submit(self.reader.read, nxt, upto, min(max_weight, READ_AHEAD_ROWS)))
            except RuntimeError:  # closed meanwhile (the stream's end, or the cursor attached again)
                self._pending = None
        return got

    def close(self) -> None:
        """No more reads ahead (one running ends on its own; its result is dropped). From any thread."""
        self._closed = True
        self._pending = None
        pool = self._pool
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class Cursor:
    """One sender's way through the stream (what ``Sender.queue`` is once the
    SenderManager attached it): ``get_many`` hands out ``(offset, item)`` pairs in
    stream order, from memory or from the backlog; the sender acknowledges by
    setting its ``acked_seq`` to an offset it handed out.

    A transaction at or below ``skip_key`` (the sender's position: it has it
    already) is handed out as a heartbeat instead: acknowledged, not sent again."""

    def __init__(self, stream: StreamLog, name: str, start: int, skip_key: StreamKey | None, cut: Cut,
                 acked: Callable[[], int], detached: bool = False):
        self.stream = stream
        self.name = name
        self.next = start
        self.skip_key = skip_key
        self.key = skip_key  # the last transaction acknowledged (or skipped)
        self.detached = detached
        self.cut = cut  # as of the acknowledged offset
        self.acked_offset = start - 1
        self._acked = acked
        self.rows_at_next = stream.rows  # running row count at ``next`` (lag in rows)
        self.skipped_txns = 0
        self.read_from_backlog = 0  # items read from disk
        # handed out, not acknowledged yet: (offset, region, commit_ts, position, samepos, key or None)
        self._inflight: collections.deque[tuple[int, str, int, Any, bool, StreamKey | None]] = collections.deque()
        self._ahead: ReadAhead | None = None  # its reads of the backlog
        self.capacity = stream.capacity
        self.last_take = time.monotonic()  # when it last took items (StreamLog._spill_helps)

    # WeightedQueue's face, for the sender loop and its status
    def __len__(self) -> int:
        return 0 if self.detached else max(0, self.stream.next - self.next)

    @property
    def weight(self) -> int:
        return 0 if self.detached else max(0, self.stream.rows - self.rows_at_next)

    def close(self) -> None:
        self.stream.close()

    def acked(self) -> int:
        """The offset the sender acknowledged last (its ``acked_seq``)."""
        return max(self._acked(), self.acked_offset)

    @property
    def behind(self) -> bool:
        """Reading the backlog: what it needs next has left memory."""
        return not self.detached and self.next < self.stream.base

    def skip_through(self, key: StreamKey | None) -> None:
        """The destination holds every transaction up to ``key``: skip them too."""
        if key is not None and (self.skip_key is None or key > self.skip_key):
            log.info("sender %s: its destination holds the stream up to %s: skipping up to there", self.name, key)
            self.skip_key = key

    def get_many(self, max_weight: int, timeout: float | None = None) -> list[tuple[int, Item]]:
        got = self.stream._take(self, max_weight, timeout)
        if not got:
            return []
        out: list[tuple[int, Item]] = []
        skip = self.skip_key
        for off, key, item, samepos, rows_at in got:
            txn_key: StreamKey | None = None
            if isinstance(item, Txn):
                txn_key = key
                if skip is not None and key <= skip:
                    self.skipped_txns += 1
                    item = Heartbeat(item.region, item.commit_ts, item.position)
            self._inflight.append((off, item.region, item.commit_ts, item.position, samepos, txn_key))
            out.append((off, item))
            self.rows_at_next = rows_at
        self.next = out[-1][0] + 1
        return out

    def next_ts(self) -> int | None:
        """The commit_ts of the first item handed out and not acknowledged (None: none)."""
        q = self._inflight
        return q[0][2] if q else None

    def settle(self) -> int:
        """Move the cut and key to what the sender has acknowledged; the acknowledged offset."""
        acked = self.acked()
        q = self._inflight
        cut = self.cut
        while q and q[0][0] <= acked:
            _off, region, ts, pos, samepos, key = q.popleft()
            cut.add(region, ts, pos, samepos)
            if key is not None and (self.key is None or key > self.key):
                self.key = key
        self.acked_offset = acked
        return acked


class StreamLog:
    """The merged stream: ``append`` (the SenderManager, in stream order) and the
    cursors' reads. Bounded: at most ``capacity`` rows in memory; beyond that the
    oldest items go to the backlog (those a sender still needs) or the appender
    waits (no backlog, or a full one under ``block``)."""

    def __init__(self, capacity: int, backlog: Backlog | None, start: int, cut: Cut, full_policy: str = "block",
                 spill_rows: int = 0, spill_dir: str = "", start_rows: int = 0):
        self.capacity = max(1, capacity)
        self.backlog = backlog
        self.full_policy = full_policy
        self.spill_rows, self.spill_dir = spill_rows, spill_dir
        self.next = start  # offset of the next item
        self.base = start  # offset of the oldest item in memory
        self.rows = start_rows  # running row count (weights) of the stream
        # (offset, key, item, weight, samepos, running rows before it)
        self._mem: collections.deque[tuple[int, StreamKey, Item, int, bool, int]] = collections.deque()
        self._weight = 0
        self._cond = threading.Condition()
        self._closed = False
        self.cursors: list[Cursor] = []
        self.evicted_cut = cut.copy()  # after the last item that left memory
        self.head_cut = cut.copy()  # after the newest item
        self._last_pos: dict[str, Any] = {}
        self.evicted_to_disk = 0
        self.waits = 0  # times the appender waited (memory full, no room on disk)
        self.paced_waits = 0  # times it waited for the senders to read what memory holds (_spill_helps)
        self._pacing = False
        self.waiting_since = 0.0  # monotonic time the appender began to wait (0: not waiting)
        self.detach_log: list[str] = []

    # -- set-up --
    def cursor(self, name: str, start: int, skip_key: StreamKey | None, cut: Cut, acked: Callable[[], int],
               detached: bool = False) -> Cursor:
        c = Cursor(self, name, start, skip_key, cut, acked, detached)
        with self._cond:
            self.cursors.append(c)
        return c

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for c in self.cursors:
            if c._ahead is not None:
                c._ahead.close()

    # -- writing --
    def append(self, key: StreamKey, item: Item, stop: threading.Event | None = None) -> int:
        weight = item.weight if isinstance(item, Txn) else 1
        with self._cond:
            if self._closed:
                raise Closed()
            region, pos = item.region, item.position
            samepos = pos is not None and pos is self._last_pos.get(region)
            if pos is not None:
                self._last_pos[region] = pos
            off = self.next
            self._mem.append((off, key, item, weight, samepos, self.rows))
            self.next += 1
            self.rows += weight
            self._weight += weight
            self.head_cut.add(region, item.commit_ts, pos, samepos)
            self._release_locked()
            while self._weight > self.capacity and len(self._mem) > 1:
                if self._evict_locked():
                    continue
                if self._pacing:  # every sender busy with what memory holds: the stream goes at their pace
                    self.paced_waits += 1
                else:
                    self.waits += 1
                    self.waiting_since = self.waiting_since or time.monotonic()
                if stop is not None and stop.is_set():
                    raise Closed()
                self._cond.wait(0.05)
                if self._closed:
                    raise Closed()
                self._release_locked()
            self.waiting_since = 0.0
            self._pacing = False
            self._cond.notify_all()
            return off

    def _attached(self) -> list[Cursor]:
        return [c for c in self.cursors if not c.detached]

    def _min_acked(self) -> int:
        cs = self._attached()
        return min(c.acked() for c in cs) if cs else self.next - 1

    def _drop_locked(self) -> tuple[int, StreamKey, Item, int, bool, int]:
        e = self._mem.popleft()
        self._weight -= e[3]
        self.base = e[0] + 1
        item = e[2]
        self.evicted_cut.add(item.region, item.commit_ts, item.position, e[4])
        return e

    def _release_locked(self) -> None:
        """Let go of what every attached sender has acknowledged."""
        if not self._mem:
            return
        low = self._min_acked()
        released = False
        while self._mem and self._mem[0][0] <= low:
            self._drop_locked()
            released = True
        if released and self.backlog is not None and self.backlog.segments:
            self.backlog.release(low + 1)
        if released:
            self._cond.notify_all()

    def _evict_locked(self) -> bool:
        """Move the oldest item out of memory (to disk if a sender still needs it).
        False if that cannot be done now (then the appender waits)."""
        off, key, item, weight, samepos, rows_at = self._mem[0]
        needed = any(c.acked() < off for c in self._attached())
        if not needed:
            self._drop_locked()
            return True
        b = self.backlog
        if b is None:
            return False
        self._pacing = not self._spill_helps(off)
        if self._pacing:
            return False
        if b.full():
            b.release(self._min_acked() + 1)
            if b.full():
                if self.full_policy != "detach":
                    return False
                self._detach_furthest_behind()
                return True
        b.append(off, rows_at, key, item, samepos)
        self.evicted_to_disk += 1
        self._drop_locked()
        return True

    def _spill_helps(self, off: int) -> bool:
        """Whether writing the oldest item (``off``) to the backlog serves anyone: a
        sender that is past it (it acknowledged it: the stream must go on for it) or one
        that has stopped reading (paused, hung, failing: nothing taken for ``STALL_S``),
        which the stream must not wait for. While every sender still needs it and is
        busy reading (one sender, or all of them slower than the sources), writing it
        out would only add the cost of writing and reading it back: the appender waits
        instead, as without a backlog, until a sender passes it or stalls."""
        now = time.monotonic()
        return any(c.acked() >= off or now - c.last_take > STALL_S for c in self._attached())

    def _detach_furthest_behind(self) -> None:
        cs = self._attached()
        if not cs:
            return
        low = min(c.acked() for c in cs)
        for c in cs:
            if c.acked() == low:
                c.detached = True
                msg = (f"sender {c.name} detached: the backlog reached backlogMaxMB "
                       f"({self.backlog.max_bytes >> 20 if self.backlog else 0} MB) while it was "
                       f"{self.next - 1 - low} items behind; its position is kept; attach it again with "
                       f"POST /senders/{c.name}/attach (it goes on from the stream's head: copy its tables "
                       "again with an on-demand snapshot)")
                log.error("%s", msg)
                self.detach_log.append(msg)
        if self.backlog is not None:
            self.backlog.release(self._min_acked() + 1)

    def attach(self, c: Cursor) -> None:
        """A detached cursor goes on from the stream's head."""
        with self._cond:
            c.detached = False
            c._inflight.clear()
            c.next = self.next
            c.acked_offset = self.next - 1
            c.cut = self.head_cut.copy()
            c.rows_at_next = self.rows
            if c._ahead is not None:
                c._ahead.close()
                c._ahead = None
            self._cond.notify_all()

    # -- reading --
    def _take(self, c: Cursor, max_weight: int, timeout: float | None) -> list[tuple[int, StreamKey, Item, bool, int]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._release_locked()
            if self._pacing:  # (it may have acknowledged what the appender waits on)
                self._cond.notify_all()
            while True:
                if c.detached or c.next >= self.next:
                    if self._closed:
                        raise Closed()
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return []
                    self._cond.wait(remaining if remaining is not None else 0.5)
                    continue
                if c.next >= self.base:
                    i = c.next - self.base
                    mem = self._mem
                    out: list[tuple[int, StreamKey, Item, bool, int]] = []
                    taken = 0
                    n = len(mem)
                    while i < n:
                        e = mem[i]
                        if out and taken + e[3] > max_weight:
                            break
                        out.append((e[0], e[1], e[2], e[4], e[5] + e[3]))
                        taken += e[3]
                        i += 1
                    c.last_take = time.monotonic()
                    return out
                # on disk: read it without holding the stream up
                upto = self.base
                b = self.backlog
                if b is None:
                    raise BacklogError(f"sender {c.name}: item {c.next} left memory and there is no backlog")
                if b.flushed_to < upto - 1:
                    b.flush(upto - 1)
                break
        ahead = c._ahead
        if ahead is None:
            ahead = c._ahead = ReadAhead(c.name, lambda: SegmentReader(b, self.spill_rows, self.spill_dir))
        got = ahead.read(c.next, upto, max_weight)
        c.last_take = time.monotonic()
        c.read_from_backlog += len(got)
        return [(off, stream_key(item), item, samepos, rows + (item.weight if isinstance(item, Txn) else 1))
                for off, rows, item, samepos in got]

    # -- checkpoints --
    def mark(self) -> tuple[BacklogMark, Cut, int]:
        """For a checkpoint: the backlog's mark (what was written, fsync'd before this
        returns), the cut after the last item that left memory, and its offset + 1."""
        fd = -1
        with self._cond:
            base = self.base
            cut = self.evicted_cut.copy()
            b = self.backlog
            mark = BacklogMark(base, rows=self.rows_at(base))
            if b is not None:
                b.flush(base - 1)
                if b.segments:
                    seg = b.segments[-1]
                    mark = BacklogMark(base, seg.path.name, seg.size, mark.rows)
                    if b._file is not None:
                        fd = os.dup(b._file.fileno())
        if fd >= 0:  # fsync outside the lock (it covers at least what the mark names)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return mark, cut, base

    def commit_ts_at(self, offset: int) -> int | None:
        """The commit_ts of the item at ``offset`` if it is in memory."""
        with self._cond:
            if self._mem and self._mem[0][0] <= offset < self.next:
                return self._mem[offset - self._mem[0][0]][2].commit_ts
        return None

    def rows_at(self, offset: int) -> int:
        """The running row count before ``offset`` (held in memory: the oldest item's, else the head's)."""
        if self._mem and self._mem[0][0] <= offset:
            i = offset - self._mem[0][0]
            if i < len(self._mem):
                return self._mem[i][5]
        return self.rows

    def status(self) -> dict[str, Any]:
        b = self.backlog
        return {
            "memory_rows": self._weight,
            "memory_capacity_rows": self.capacity,
            "memory_items": len(self._mem),
            "next_offset": self.next,
            "oldest_in_memory": self.base,
            "backlog_bytes": b.bytes if b is not None else 0,
            "backlog_max_bytes": b.max_bytes if b is not None else 0,
            "backlog_segments": len(b.segments) if b is not None else 0,
            "backlog_dir": str(b.dir) if b is not None else "",
            "evicted_to_disk": self.evicted_to_disk,
            "waits": self.waits,
            "paced_waits": self.paced_waits,
            "policy": self.full_policy if b is not None else "none",
        }

    def holding(self) -> list[str]:
        """While the appender waits: the attached senders furthest behind (what it waits for)."""
        if not self.waiting_since:
            return []
        cs = self._attached()
        if not cs:
            return []
        low = min(c.acked() for c in cs)
        return [c.name for c in cs if c.acked() == low]

    def bytes_held(self, c: Cursor) -> int:
        """Backlog bytes that ``c`` still needs (segments with items past its acknowledgement)."""
        b = self.backlog
        if b is None or c.detached:
            return 0
        acked = c.acked_offset
        return sum(s.size for s in list(b.segments) if s.last > acked)
