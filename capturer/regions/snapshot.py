"""The snapshot engine every region kind that copies tables shares (MySQL/MariaDB
and PostgreSQL regions): the snapshotter's workers (scheduling, retries,
read-ahead, the copy of a table chunk by chunk) and chunk marks; its data (the
plan of a table, chunks, the recorder of what the stream changed while chunks
are in flight) is ``capturer/regions/snapshot_plan.py``.
How a chunk is read, and why it is exact, is each kind's own
(``capturer/regions/mysql/snapshot.py``, ``capturer/regions/postgresql/snapshot.py``);
the stream's side of a copy is ``capturer/regions/snaphost.py``."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from capturer.errors import FatalSourceError, SourceError
from capturer.model import ChunkMark, Position, SnapshotMark, TableProgress
from capturer.regions.snapshot_plan import KEY_SIG, Chunk, TablePlan, key_matches, split_key
from capturer.util import failpoints

if TYPE_CHECKING:
    from capturer.regions.base import RegionContext

log = logging.getLogger(__name__)

MODES = ("never", "initial", "when_needed")


class SnapshotHost(Protocol):
    """What a snapshot needs of its region (``MySQLRegion`` is the one): the stream's
    side of the copy. The region imports this module; this module only knows the
    protocol, so the two never import each other."""

    name: str
    where: str
    cfg: Any  # RegionConfig, PostgresRegionConfig
    ctx: RegionContext

    def add_snapshot_progress(self, progress: tuple[TableProgress, ...], wait: bool = False) -> None: ...

    def update_snapshot_progress(self, p: TableProgress) -> None: ...

    def snapshot_failed(self, exc: BaseException) -> None: ...

    def check_truncate(self, db: str, table: str, why: str) -> None: ...

    def chunk_begin(self, plan: TablePlan) -> int: ...

    def chunk_end(self, plan: TablePlan, token: int) -> None: ...

    def chunk_low(self, plan: TablePlan, token: int) -> tuple[Any, ...]: ...

    def emit_chunk(self, chunk: Chunk) -> TableProgress | str: ...

    def emit_begin(self, plan: TablePlan, run: str, at: Any, create: Any,
                   truncate: bool, gen: int | None = None) -> TableProgress | str: ...

    def position_now(self) -> Any: ...

    def snapshot_generation(self) -> int: ...

    @property
    def snap_method(self) -> str: ...  # consistent | watermark, as resolved for this server

    def copy_together(self, snapshotter: Snapshotter, plan: TablePlan, p: TableProgress,
                      others: list[str]) -> TableProgress | str: ...


class ServerChanged(SourceError):
    """The region reads another server now (a failover) or its log started over: a
    reader connected before reads again on a new connection, at once (its chunks
    would be void)."""


class TableGone(Exception):
    """The table was dropped (or renamed away) while it was being snapshotted."""


class ColumnsChanged(Exception):
    """A column the plan names is gone: describe the table again."""


@dataclass
class TableTask:
    """A table to copy (live state of its snapshot in this run)."""

    progress: TableProgress
    estimated: int = 0
    started: float = 0.0
    rows_read: int = 0  # in this process (for the rate)
    error: str = ""

    @property
    def name(self) -> str:
        return f"{self.progress.db}.{self.progress.table}"


class ReadAhead:
    """A chunk read on a worker's second connection, in a thread, while the chunk
    before it is delivered (its start is that chunk's last key; at most one ahead, so
    a worker holds at most two chunks). Registered with the region's recorder before
    its read starts, like any chunk."""

    def __init__(self, snapshotter: Snapshotter, reader: Any, plan: TablePlan, p: TableProgress, token: int):
        self.plan, self.p, self.token = plan, p, token
        self._chunk: Chunk | None = None
        self._exc: BaseException | None = None
        self._t = threading.Thread(target=self._run, args=(snapshotter, reader), daemon=True,
                                   name=f"snapshot-ahead-{plan.table}"[:40])
        self._t.start()

    def _run(self, snapshotter: Snapshotter, reader: Any) -> None:
        try:
            self._chunk = snapshotter._read(reader, self.plan, self.p, self.token)
        except BaseException as exc:
            self._exc = exc

    def follows(self, plan: TablePlan, p: TableProgress) -> bool:
        """Whether this is the chunk the table's copy needs next."""
        return (plan is self.plan and p.run == self.p.run and p.chunks == self.p.chunks
                and p.last_key == self.p.last_key)

    def result(self) -> Chunk:
        self._t.join()
        if self._exc is not None:
            raise self._exc
        assert self._chunk is not None
        return self._chunk


class Snapshotter:
    """The snapshot workers of one region: scheduling, retries, read-ahead, and the
    copy of each table chunk by chunk. A region kind's subclass reads its source
    (``_new_reader``, ``_describe_table``, ``_begin_at``, ``_read``)."""

    def __init__(self, region: SnapshotHost, workers: int, chunk_rows: int):
        self.region = region
        self.workers = max(1, workers)
        self.chunk_rows = max(1, chunk_rows)
        self.tasks: dict[tuple[str, str], TableTask] = {}
        self.todo: queue.Queue[tuple[str, str]] = queue.Queue()
        self.busy: set[tuple[str, str]] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.driver = ""
        self.last_log = 0.0
        self.lock_retries = 0  # (watermark) chunk reads made again because a writer held a lock
        self.read_ahead = bool(getattr(region.cfg, "snapshot_read_ahead", False))
        self._local = threading.local()  # per worker: its second connection and the chunk read ahead
        # why each run of this process started (status); a run not here started with the region
        # (snapshot=initial/when_needed) or was resumed from the checkpoint: "start"
        self.reasons: dict[str, str] = {}

    # --- scheduling -------------------------------------------------------------------
    def load(self, progress: tuple[TableProgress, ...]) -> None:
        """Tables of a snapshot in progress (from the checkpoint or a new run). A
        table being copied by another run is superseded: its worker stops at its
        next chunk, and the table is queued again for the new run."""
        with self.lock:
            for p in progress:
                key = (p.db, p.table)
                self.tasks[key] = TableTask(p)
                if p.state in ("pending", "running"):
                    self.todo.put(key)
            self._start_workers()

    def request(self, tables: list[tuple[str, str]], truncate: bool = False, reason: str = "on demand") -> str:
        """Copy these tables (again); returns the run id. ``reason``: why the run
        started, as /status shows it ("on demand", "filter reload")."""
        run = uuid.uuid4().hex[:12]
        self.reasons[run] = reason
        progress = tuple(TableProgress(db, t, run, "pending", truncate=truncate) for db, t in tables)
        self.region.add_snapshot_progress(progress)
        self.load(progress)
        return run

    def ensure_started(self) -> None:
        with self.lock:
            self._start_workers()

    def _start_workers(self) -> None:
        """(under the lock) Workers for what is queued; a worker leaves only under
        the lock too, so a request never waits on a worker that is leaving."""
        self.threads = [t for t in self.threads if t.is_alive()]
        if self.todo.empty():
            return
        while len(self.threads) < self.workers:
            t = threading.Thread(target=self._work, name=f"snapshot-{self.region.name}-{len(self.threads)}",
                                 daemon=True)
            self.threads.append(t)
            t.start()

    def active(self) -> bool:
        with self.lock:
            return any(t.progress.state in ("pending", "running") for t in self.tasks.values())

    def _take(self) -> tuple[tuple[str, str], TableTask] | None:
        """The next table to copy, or None when this worker should leave."""
        while not self.stop.is_set() and not self.region.ctx.stop.is_set():
            try:
                key = self.todo.get(timeout=0.5)
            except queue.Empty:
                with self.lock:
                    if self.todo.empty():
                        me = threading.current_thread()
                        self.threads = [t for t in self.threads if t is not me]
                        return None
                continue
            with self.lock:
                task = self.tasks.get(key)
                if task is None or task.progress.state not in ("pending", "running"):
                    continue
                if key in self.busy:  # another worker still finishes an older run of it
                    self.todo.put(key)
                    busy = True
                else:
                    self.busy.add(key)
                    return key, task
            if busy:
                time.sleep(0.05)
        return None

    # --- status -----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        out = {}
        with self.lock:
            tasks = list(self.tasks.values())
        for t in tasks:
            p = t.progress
            elapsed = time.time() - t.started if t.started else 0.0
            rate = t.rows_read / elapsed if elapsed > 0 else 0.0
            est = max(t.estimated, p.rows)
            eta = round((est - p.rows) / rate, 1) if rate > 0 and p.state == "running" else None
            out[t.name] = {"state": p.state, "run": p.run, "rows": p.rows, "estimated_rows": est,
                           "chunks": p.chunks, "rows_per_s": round(rate), "eta_seconds": eta,
                           "error": t.error, "reason": self.reasons.get(p.run, "start")}
        return out

    def log_progress(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last_log < 5:
            return
        self.last_log = now
        for name, s in self.status().items():
            if s["state"] == "running":
                pct = f" ({100 * s['rows'] / s['estimated_rows']:.0f}%)" if s["estimated_rows"] else ""
                eta = f", ETA {s['eta_seconds']:.0f}s" if s["eta_seconds"] is not None else ""
                log.info("snapshot %s: %s %d/~%d rows%s, %d rows/s%s", self.region.name, name, s["rows"],
                         s["estimated_rows"], pct, s["rows_per_s"], eta)

    # --- work -------------------------------------------------------------------------
    def _work(self) -> None:
        reader: Any = None
        delay = 0.5
        try:
            while True:
                taken = self._take()
                if taken is None:
                    return
                key, task = taken
                try:
                    while not self.stop.is_set() and not self.region.ctx.stop.is_set():
                        try:
                            if reader is None:
                                reader = self._new_reader()
                                self.driver = reader.kind
                            self._copy(reader, key, task)
                            delay = 0.5
                            break
                        except FatalSourceError:
                            raise
                        except ServerChanged as exc:
                            log.info("%s: snapshot of %s: %s; reading on a new connection", self.region.where,
                                     task.name, exc)
                            if reader is not None:
                                reader.close()
                            reader = None
                            self._close_second()
                            delay = 0.5
                            continue
                        except (SourceError, OSError) as exc:
                            self._retry(task, exc, delay)
                        except Exception as exc:
                            if reader is None or not reader.is_error(exc):
                                raise
                            if reader.errno(exc) in (1142, 1143, 1227):
                                raise FatalSourceError(f"{self.region.where}: snapshot of {task.name}: no "
                                                       f"privilege to read it ({exc})") from None
                            self._retry(task, exc, delay)
                        if reader is not None:
                            reader.close()
                        reader = None
                        self._close_second()
                        gen = self.region.snapshot_generation()
                        if self._pause(delay, gen):
                            break
                        # (a change of server, e.g. a failover the stream made meanwhile, cuts the wait short)
                        delay = min(delay * 2, 30) if self.region.snapshot_generation() == gen else 0.5
                finally:
                    with self.lock:
                        self.busy.discard(key)
        except BaseException as exc:
            self.region.snapshot_failed(exc)
        finally:
            if reader is not None:
                reader.close()
            self._close_second()
            with self.lock:
                me = threading.current_thread()
                self.threads = [t for t in self.threads if t is not me]

    def _pause(self, delay: float, gen: int) -> bool:
        """Wait ``delay`` seconds before a retry, less if the region's snapshot generation
        moves on from ``gen`` meanwhile (it reads another server now: try that one at
        once); True if stopping."""
        end = time.monotonic() + delay
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            if self.stop.wait(min(left, 0.25)) or self.region.ctx.stop.is_set():
                return True
            if self.region.snapshot_generation() != gen:
                return False

    def check_reader(self, reader: Any) -> int:
        """The snapshot generation a read with ``reader`` belongs to; ServerChanged when
        the reader was connected in an earlier one (to the server read before a
        failover, or before the log started over): it reads on a new connection."""
        gen = self.region.snapshot_generation()
        was = getattr(reader, "gen", None)
        if was is not None and was != gen:
            raise ServerChanged(f"the region reads {self.region.where.rpartition('(')[2].rstrip(')')} now "
                                f"(snapshot generation {gen}, the connection was made in {was})")
        return gen

    def _retry(self, task: TableTask, exc: BaseException, delay: float) -> None:
        task.error = f"{type(exc).__name__}: {exc}"
        log.warning("%s: snapshot of %s: %s; retrying in %.1fs", self.region.where, task.name, task.error, delay)

    def _current(self, key: tuple[str, str], task: TableTask) -> bool:
        """Whether ``task`` is still the table's run (a newer request supersedes it)."""
        with self.lock:
            return self.tasks.get(key) is task

    def _copy(self, reader: Any, key: tuple[str, str], task: TableTask) -> None:
        try:
            self._copy_table(reader, key, task)
        finally:
            if self._ahead is not None:  # (left when the copy stopped, was redone or failed)
                self._drop(self._ahead)
                self._ahead = None

    @property
    def _ahead(self) -> ReadAhead | None:
        return getattr(self._local, "ahead", None)

    @_ahead.setter
    def _ahead(self, v: ReadAhead | None) -> None:
        self._local.ahead = v

    def _second_reader(self) -> Any:
        """This worker's second connection (read-ahead), made when first needed."""
        r = getattr(self._local, "reader2", None)
        if r is None:
            r = self._local.reader2 = self._new_reader()
        return r

    def _close_second(self) -> None:
        r = getattr(self._local, "reader2", None)
        self._local.reader2 = None
        if r is not None:
            r.close()

    def _drop(self, ahead: ReadAhead) -> None:
        """A chunk read ahead that will not be delivered (its read is waited for)."""
        try:
            ahead.result()
        except Exception:
            pass
        self.region.chunk_end(ahead.plan, ahead.token)

    def _copy_table(self, reader: Any, key: tuple[str, str], task: TableTask) -> None:
        db, table = key
        try:
            plan = self._describe(reader, db, table)
        except TableGone:
            self._gone(task)
            return
        task.estimated = plan.estimated
        if not task.started:
            task.started = time.time()
        log.info("%s: snapshot of %s starts (key %s, ~%d rows, %s)", self.region.where, plan.name,
                 ",".join(plan.key) or "none: one consistent read of the whole table", plan.estimated,
                 reader.kind)
        others: list[str] | None = None  # the other regions that deliver the table (asked when it matters)
        while not self.stop.is_set() and not self.region.ctx.stop.is_set():
            p = task.progress
            if p.state not in ("pending", "running") or not self._current(key, task):
                return
            if plan.key and not key_matches(plan, p.last_key):
                self._key_changed(task, plan)
                continue
            nxt: TablePlan | None
            if not plan.key or p.truncate:
                # a copy that empties the table downstream: with other regions delivering it, one
                # coordinated step of them all (capturer/regions/snaphost.py)
                if others is None:
                    others = self.region.ctx.tables_elsewhere(self.region.name, [(db, table)]).get((db, table), [])
                if others:
                    nxt = self._copy_together(reader, plan, p, others, task)
                    if nxt is None:
                        return
                    plan = nxt
                    continue
            if p.state == "pending":
                nxt = self._begin_run(reader, plan, p, task)
            else:
                nxt = self._copy_chunk(reader, key, plan, p, task)
            if nxt is None:
                return
            plan = nxt

    def _copy_together(self, reader: Any, plan: TablePlan, p: TableProgress, others: list[str],
                       task: TableTask) -> TablePlan | None:
        """The table copied in one step with the other regions that deliver it: the plan to go on with
        (described again), or None when the copy is over (done, stopped, superseded, gone)."""
        kind, got = self._step(partial(self.region.copy_together, self, plan, p, others), reader, task)
        if kind == "redo":
            return got
        if kind == "done":
            task.progress = got
            task.rows_read += got.rows
            self.log_progress()
        return None

    def _begin_run(self, reader: Any, plan: TablePlan, p: TableProgress, task: TableTask) -> TablePlan | None:
        """The run's start (CREATE, TRUNCATE) in stream order, before chunk 0 is read: the plan to go on
        with, or None when the copy is over."""
        kind, got = self._step(partial(self._begin, reader, plan, p), reader, task)
        if kind == "end":
            return None
        if kind == "redo":
            return got
        task.progress = got
        return plan

    def _copy_chunk(self, reader: Any, key: tuple[str, str], plan: TablePlan, p: TableProgress,
                    task: TableTask) -> TablePlan | None:
        """The next chunk read (or taken from the read-ahead) and delivered: the plan to go on with (described
        again when the table changed shape), or None when the copy is over (the last chunk, stopped, gone)."""
        if not plan.key:
            self.region.check_truncate(plan.db, plan.table, "it has no key: its copy starts with a TRUNCATE")
        took = self._ahead
        self._ahead = None
        if took is not None and not took.follows(plan, p):
            self._drop(took)
            took = None
        token = took.token if took is not None else self.region.chunk_begin(plan)
        outcome: Any
        try:
            try:
                chunk = took.result() if took is not None else self._read(reader, plan, p, token)
            except ColumnsChanged:
                outcome = "redo"
            except TableGone:
                self._gone(task)
                return None
            else:
                failpoints.hit("snapshot.chunk_read")  # read, not delivered yet
                if self.read_ahead and plan.key and not chunk.last:
                    # the next chunk is read on a second connection while this one is delivered
                    nxt = dataclasses.replace(p, last_key=chunk.last_key, chunks=p.chunks + 1)
                    self._ahead = ReadAhead(self, self._second_reader(), plan, nxt, self.region.chunk_begin(plan))
                outcome = self.region.emit_chunk(chunk)
        finally:
            self.region.chunk_end(plan, token)
        task.error = ""
        if outcome == "redo":  # the table changed shape (or the binlog restarted): read it again
            try:
                return self._describe(reader, *key)
            except TableGone:
                self._gone(task)
                return None
        if isinstance(outcome, str):  # stopped, or superseded by a newer run of the table
            return None
        task.rows_read += len(chunk.rows) if chunk.spilled is None else len(chunk.spilled)
        task.progress = outcome
        self.log_progress()
        if chunk.last:
            log.info("%s: snapshot of %s done: %d rows in %d chunks", self.region.where, plan.name,
                     task.progress.rows, task.progress.chunks)
            return None
        return plan

    def _step(self, step: Callable[[], TableProgress | str], reader: Any,
              task: TableTask) -> tuple[str, Any]:
        """One step of a table's copy and what follows from it: ("done", its progress);
        ("redo", the table described again: its shape changed, or the log restarted);
        ("end", None): stopped, superseded, or the table is gone (marked so)."""
        try:
            outcome = step()
        except ColumnsChanged:
            outcome = "redo"
        except TableGone:
            self._gone(task)
            return "end", None
        task.error = ""
        if outcome == "redo":
            try:
                return "redo", self._describe(reader, task.progress.db, task.progress.table)
            except TableGone:
                self._gone(task)
                return "end", None
        if isinstance(outcome, str):
            return "end", None
        return "done", outcome

    def _key_changed(self, task: TableTask, plan: TablePlan) -> None:
        """The table's key is not the one its last key was taken with (it changed
        during the copy, or between a crash and the restart): copy it again from the
        start. A run that truncates starts over with its TRUNCATE (state pending);
        otherwise the rows already delivered are upserted again by the new key."""
        p = task.progress
        sig, _ = split_key(p.last_key)
        log.warning("%s: snapshot of %s: its key changed since chunk %d (was %s, now %s): copying it again from "
                    "the start%s", self.region.where, plan.name, p.chunks, (sig or "?")[len(KEY_SIG):],
                    plan.key_signature()[len(KEY_SIG):], " with a TRUNCATE first" if p.truncate else "")
        self._set(task, dataclasses.replace(p, last_key=None, state="pending" if p.truncate else p.state))

    def _describe(self, reader: Any, db: str, table: str) -> TablePlan:
        at = self.region.position_now()
        plan = self._describe_table(reader, db, table)
        plan.described_at = at
        return plan

    def _set(self, task: TableTask, p: TableProgress) -> None:
        task.progress = p
        self.region.update_snapshot_progress(p)

    def _gone(self, task: TableTask) -> None:
        log.warning("%s: snapshot of %s: the table no longer exists (dropped or renamed); its DROP/RENAME is "
                    "in the binlog stream; moving on", self.region.where, task.name)
        self._set(task, dataclasses.replace(task.progress, state="dropped"))

    def _begin(self, reader: Any, plan: TablePlan, p: TableProgress) -> TableProgress | str:
        """A run's start for one table: its CREATE TABLE IF NOT EXISTS (snapshot_ddl)
        and, when the run truncates a keyed table, its TRUNCATE, delivered in stream
        order at a point the chunks are all read after."""
        truncate = p.truncate and bool(plan.key)
        if truncate:
            self.region.check_truncate(plan.db, plan.table, "the snapshot run truncates it")
        gen = self.check_reader(reader)
        create, at = self._begin_at(reader, plan)
        return self.region.emit_begin(plan, p.run, at, create, truncate, gen)

    # --- what a region kind's snapshotter supplies ----------------------------------------
    def _new_reader(self) -> Any:
        """A connection for reading chunks: ``is_error(exc)``, ``errno(exc)`` (MySQL's
        numbers: 1146 gone, 1054 column gone, 1142/1143/1227 no privilege), ``kind``,
        ``close()``."""
        raise NotImplementedError

    def _describe_table(self, reader: Any, db: str, table: str) -> TablePlan:
        raise NotImplementedError

    def _begin_at(self, reader: Any, plan: TablePlan) -> tuple[Any, Any]:
        """(what the table's run starts with downstream: its CREATE; a position of the
        log at or after every definition change that reflects)."""
        raise NotImplementedError

    def _read(self, reader: Any, plan: TablePlan, p: TableProgress, token: int = 0) -> Chunk:
        """The chunk after ``p.last_key`` (a keyless plan: the whole table), as of a
        position of the log (see the region kind's module)."""
        raise NotImplementedError

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(2)


def chunk_mark(chunk: Chunk) -> SnapshotMark:
    return ChunkMark(chunk.run, chunk.index, chunk.last, chunk.plan.db, chunk.plan.table,
                     Position(chunk.at.file, chunk.at.pos) if isinstance(chunk.at, Position) else chunk.at)
