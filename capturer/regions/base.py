"""What every region kind shares: its context, lifecycle and status; the clock
set-up and heartbeats of kinds that number their own transactions; closing what
an attempt or a run held; the row buffer that spills a big transaction to disk;
and the journal keyed by position (``PositionJournal``, from ``journal.py``) a
kind keeps next to the checkpoint."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capturer.errors import CheckpointError, FatalSourceError, SourceError
from capturer.model import AnyPosition, Heartbeat, Item, RowChange, Txn
from capturer.model.spill import DEFAULT_CHUNK_ROWS, SpilledChanges, SpillWriter
from capturer.regions.clock import LiftJournal, RegionClock
from capturer.regions.journal import PositionJournal as PositionJournal  # (for the kinds: they import base)
from capturer.util.bqueue import Closed, WeightedQueue

log = logging.getLogger(__name__)


@dataclass
class RegionContext:
    out: WeightedQueue[Item]
    start: AnyPosition | None  # from the checkpoint; None on a first start
    floor: int  # every emitted commit_ts is above this (the checkpoint's commit_ts)
    journal: LiftJournal
    stop: threading.Event
    spill_rows: int = 50_000  # a bigger transaction goes to disk (capturer/model/spill.py); 0 = never
    spill_dir: str = ""
    state_path: Path | None = None  # the checkpoint file: a region keeps its own state files next to it
    table_selected: Callable[[str, str], bool] = lambda db, table: True  # the filter's table rules
    # makes a region's first start durable before it emits anything: the app writes the
    # checkpoint with this position for the region if the checkpoint has none for it yet
    pin_start: Callable[[str, Any], None] = lambda region, position: None
    # (region, tables) -> {table: [other regions that deliver a table of that name]}
    tables_elsewhere: Callable[[str, list[tuple[str, str]]], dict[tuple[str, str], list[str]]] = \
        lambda region, tables: {}
    # served by an agent to a capturer that already passed on a heartbeat at this ts: the region's
    # clock stays above it (its own floor is the commit_ts of the item at ``start``)
    promised: int = 0
    # the region object of that name in this process, when it can take part in a coordinated
    # copy of a table several regions deliver (capturer/regions/snaphost.py); None otherwise
    peer: Callable[[str], Any] = lambda name: None
    filter_path: Path | None = None  # filterRuleDict (sent to agents along with a subscription)
    config_path: Path | None = None  # the capturer's config.cfg (a worker process reads it: process=true)
    # (region, tables, reason): tables that came to a region's source to be copied live (a PostgreSQL table added
    # to the publication) as snapshotNewTables says; raises (ValueError, LookupError, SourceError) when refused.
    # None: this process copies nothing of the kind (an agent, a worker process: as on a filter reload)
    copy_new: Callable[[str, list[tuple[str, str]], str], None] | None = None


class Region:
    """Lifecycle: ``start()``, ``stop()``, ``join()``. A fatal problem is kept in
    ``error`` and the thread ends; the app then stops the whole pipeline."""

    name: str

    def __init__(self, name: str, ctx: RegionContext):
        self.name = name
        self.ctx = ctx
        self.error: BaseException | None = None
        self.state = "new"
        self.last_error = ""
        self.reconnects = 0
        self.txns = 0
        self.rows = 0
        self.spilled_txns = 0  # transactions kept on disk (past spill_rows)
        self.position: AnyPosition | None = ctx.start
        self.last_commit_ts = ctx.floor
        self.last_source_time = 0.0  # source clock (s) of the newest event seen
        self.caught_up_at = 0.0  # local time when the source last said "nothing more"
        self.heartbeats = 0  # heartbeats passed on (each a promise; most move the position too)
        self.last_heartbeat_at = 0.0  # local time of the newest one
        self._heartbeats_logged = (0.0, 0)  # (when the last "heartbeats" line was logged, the count then)
        self._thread = threading.Thread(target=self._run, name=f"region-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.ctx.stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    #: a line "heartbeats: N in the last S s, position P" at INFO at most this often (the first one at once)
    HEARTBEAT_LOG_SECONDS = 60.0

    #: errors that mean "try again from the last position" (a kind adds its driver's)
    RETRYABLE: tuple[type[BaseException], ...] = (SourceError, OSError)
    where: str = ""

    def _connect_and_stream(self) -> None:
        """One attempt: connect, then read until stopped or an error."""
        raise NotImplementedError

    def _run(self) -> None:
        """Run attempts until stopped; retryable errors back off (0.5 s doubling to
        30 s) and retry from the last position; anything else is fatal. After each
        attempt ``_after_attempt``, when the thread ends ``_on_exit``."""
        try:
            self._attempts()
        finally:
            self._on_exit()

    def _attempts(self) -> None:
        delay = 0.5
        while not self.ctx.stop.is_set():
            try:
                self.state = "connecting"
                self._connect_and_stream()
                delay = 0.5
            except Closed:
                break
            except FatalSourceError as exc:
                self._fail(exc)
                log.error("%s", exc)
                return
            except self.RETRYABLE as exc:
                self.reconnects += 1
                self.state = "reconnecting"
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: %s; reconnecting in %.1fs", self.where or self.name, self.last_error, delay)
                if self.ctx.stop.wait(delay):
                    break
                delay = min(delay * 2, 30.0)
            except BaseException as exc:
                self._fail(exc, f"{type(exc).__name__}: {exc}")
                log.exception("%s: failed", self.where or self.name)
                return
            finally:
                self._after_attempt()
        self.state = "stopped"

    def _emit(self, item: Item) -> None:
        """Hand ``item`` to the merge (blocks while the region's queue is full; Closed when stopping)."""
        weight = item.weight if isinstance(item, Txn) else 1
        self.ctx.out.put(item, weight, stop=self.ctx.stop)

    def _deliver(self, txn: Txn) -> None:
        """Emit a transaction and account for it: its position (when it has one)
        becomes the region's, its commit_ts the last one sent, its rows counted."""
        self._emit(txn)
        if txn.position is not None:
            self.position = txn.position
        self.last_commit_ts = txn.commit_ts
        self.txns += 1
        self.rows += len(txn.changes)

    def _promise(self, ts: int, position: AnyPosition | None, caught_up: bool = True) -> None:
        """Emit a heartbeat: no later item of this region has a commit_ts at or below
        ``ts``. ``position`` (when given) becomes the region's: the stream has passed
        everything before it. ``caught_up``: the source has said it has nothing more
        for now (the lag then reads 0 for a while)."""
        if position is not None:
            self.position = position
        now = time.time()
        if caught_up:
            self.caught_up_at = now
        self._emit(Heartbeat(self.name, ts, position))
        self.heartbeats += 1
        self.last_heartbeat_at = now
        logged_at, logged = self._heartbeats_logged
        if now - logged_at >= self.HEARTBEAT_LOG_SECONDS:
            self._heartbeats_logged = (now, self.heartbeats)
            span = f"in the last {now - logged_at:.0f} s" if logged_at else "since the start"
            log.info("%s: heartbeats: %d %s, position %s%s", self.where or f"region {self.name}",
                     self.heartbeats - logged, span, self.position if self.position is not None else "-",
                     self.heartbeat_note())

    def heartbeat_note(self) -> str:
        """What the periodic heartbeats line adds for this kind (e.g. how far the
        PostgreSQL slot is confirmed): "" or text starting with "; "."""
        return ""

    def state_file(self, kind: str) -> Path | None:
        """Where this region keeps a state file of its own: next to the checkpoint, as
        ``<checkpoint>.<kind>.<region>``; None without a checkpoint path (state in memory only)."""
        cp = self.ctx.state_path
        return None if cp is None else cp.with_name(f"{cp.name}.{kind}.{self.name}")

    def _after_attempt(self) -> None:
        """Release what one attempt held (connections: ``close_quietly``)."""

    def _on_exit(self) -> None:
        """Release what the region held for its whole run (clients, workers): called
        once, when its thread ends, however it ends."""

    def _fail(self, exc: BaseException, text: str = "") -> None:
        self.error = exc
        self.state = "failed"
        self.last_error = text or str(exc)

    def checkpointed(self, position: Any) -> None:
        """The checkpoint now holds ``position`` for this region (state older than it
        may go: a kind prunes its ``PositionJournal`` here)."""

    def lag_seconds(self) -> float:
        now = time.time()
        if self.caught_up_at and now - self.caught_up_at < 5:
            return 0.0
        if not self.last_source_time:
            return 0.0
        return max(0.0, now - self.last_source_time)

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "position": self.position.to_json() if self.position else None,
            "position_text": str(self.position) if self.position else "",
            "last_commit_ts": self.last_commit_ts,
            "lag_seconds": round(self.lag_seconds(), 3),
            "txns": self.txns,
            "rows": self.rows,
            "queue_items": len(self.ctx.out),
            "queue_rows": self.ctx.out.weight,
            "reconnects": self.reconnects,
            "heartbeats": self.heartbeats,
            "heartbeat_age_seconds": round(time.time() - self.last_heartbeat_at, 3) if self.last_heartbeat_at else None,
            "spilled_txns": self.spilled_txns,
            "decoded_fast": getattr(self, "fast_events", 0),
            "decoded_library": getattr(self, "library_events", 0),
            "last_error": self.last_error,
        }


class ClockedRegion(Region):
    """A region that numbers its own transactions with a ``RegionClock``: source
    times made strictly increasing, lifts above what was promised journaled in
    ``ctx.journal``, so that a replay from the same position with the same floor
    gives the same commit_ts. The clock starts at ``ctx.floor`` (the checkpoint's
    commit_ts for the region) and never promises at or below ``ctx.promised`` (what
    a capturer already passed on of a region an agent serves again)."""

    def __init__(self, name: str, ctx: RegionContext):
        super().__init__(name, ctx)
        self.clock = RegionClock(name, ctx.floor, ctx.journal, ctx.promised)

    def _alive(self, position: AnyPosition | None) -> None:
        """A heartbeat that promises nothing new (the clock's newest ts): the region is
        alive (the first item of an attempt), or its position moved past something
        it passes nothing on of."""
        self._promise(self.clock.last_emitted, position, caught_up=False)

    def _clock_heartbeat(self, source_now_ms: int, position: AnyPosition | None) -> None:
        """A heartbeat at the source's clock ``source_now_ms`` (already less the
        heartbeat lag), never below what the region already sent: the source has
        nothing more before ``position``."""
        self._promise(self.clock.heartbeat(source_now_ms), position)


def require_start_kind(ctx: RegionContext, name: str, region_type: str, kind: type,
                       remedy: str = "remove that entry from the checkpoint to start this region from its "
                                     "'start' setting") -> None:
    """CheckpointError when the checkpoint holds a position for region ``name`` that
    is not a ``kind`` (the region was configured as another type since)."""
    if ctx.start is not None and not isinstance(ctx.start, kind):
        raise CheckpointError(
            f"checkpoint: regions.{name} is a {getattr(ctx.start, 'kind', '?')} position, but "
            f"[region:{name}] is type={region_type}" + (f"; {remedy}" if remedy else ""))


def close_quietly(*resources: Any) -> None:
    """Close each resource that is not None (``finish()`` for a libpq connection,
    else ``close()``), ignoring its errors: at the end of an attempt a broken
    connection has nothing left to say."""
    for r in resources:
        if r is None:
            continue
        try:
            r.finish() if hasattr(r, "finish") else r.close()
        except Exception as exc:
            log.debug("closing %r: %s", r, exc)


class ChangeBuffer:
    """The row changes of the transaction being read. Once they reach ``spill_rows``
    (0 = never) they go to disk (``SpillWriter``, in ``spill_dir``) in chunks of
    ``min(spill_rows, DEFAULT_CHUNK_ROWS)``; ``take`` hands over what was added, in
    order, in memory or spilled, and empties the buffer."""

    def __init__(self, spill_rows: int, spill_dir: str, where: str):
        self.spill_rows = spill_rows
        self.spill_dir = spill_dir or None
        self.where = where
        self.changes: list[RowChange] = []
        self.spill: SpillWriter | None = None
        self._limit = spill_rows

    @property
    def rows(self) -> int:
        return len(self.changes) + (self.spill.rows if self.spill is not None else 0)

    @property
    def empty(self) -> bool:
        return not self.changes and self.spill is None

    def append(self, change: RowChange, txn: object) -> None:
        """One change of transaction ``txn`` (named in the log line when it spills)."""
        self.changes.append(change)
        if self.spill_rows and len(self.changes) >= self._limit:
            self._spill(txn)

    def extend(self, changes: list[RowChange], txn: object) -> None:
        self.changes.extend(changes)
        if self.spill_rows and len(self.changes) >= self._limit:
            self._spill(txn)

    def _spill(self, txn: object) -> None:
        if self.spill is None:
            self.spill = SpillWriter(self.spill_dir, min(self.spill_rows, DEFAULT_CHUNK_ROWS))
            self._limit = self.spill.chunk_rows
            log.info("%s: transaction %s has more than %d rows: spilling it to disk", self.where, txn,
                     self.spill_rows)
        self.spill.add(self.changes)
        self.changes = []

    def truncate(self, rows: int) -> None:
        """Keep only the first ``rows`` changes added (a ``ROLLBACK TO SAVEPOINT``)."""
        if rows >= self.rows:
            return
        spilled = self.spill.rows if self.spill is not None else 0
        if rows >= spilled:
            del self.changes[rows - spilled:]
            return
        assert self.spill is not None
        self.spill.truncate(rows)
        self.changes = []

    def take(self) -> tuple[tuple[RowChange, ...] | SpilledChanges, bool]:
        """(the changes added since the last ``take``, whether they were spilled); then empty."""
        spill, changes = self.spill, self.changes
        self.spill, self.changes, self._limit = None, [], self.spill_rows
        if spill is None:
            return tuple(changes), False
        if changes:
            spill.add(changes)
        return spill.finish(), True
