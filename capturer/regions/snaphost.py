"""The stream's side of a snapshot, for every region kind that copies tables
(MySQL/MariaDB binlog regions, PostgreSQL slot regions).

A snapshot worker (``capturer.regions.snapshot.Snapshotter`` and its
PostgreSQL reader) reads a chunk as of a position P of the region's log; the
region delivers it once its stream has passed P, at a transaction boundary X,
without the keys a transaction between P and X changed (those transactions,
delivered with their row images, carry a newer state). This mixin holds that
rule and everything around it that does not depend on the log's kind: the
snapshot progress carried in the region's positions (so the checkpoint holds
it), runs requested while streaming, recorders of what the stream changed
while chunks are in flight, and the emission of a run's start (CREATE,
TRUNCATE) and of its chunks under the region's emission lock.

A region kind supplies how its positions compare (``_pkey``), how a position
carries the progress (``_stamped``), the statements a table's run starts with
(``_start_statements``), what a DDL in its stream may have changed
(``_note_ddl_at``) and its snapshotter (``_new_snapshotter``)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from capturer.errors import FatalSourceError
from capturer.model import Ddl, RowChange, TableProgress, Txn, ts_physical_ms
from capturer.model.encode import _fastrows, qualified
from capturer.model.spill import SpillWriter
from capturer.regions.snapshot import TableGone, chunk_mark
from capturer.regions.snapshot_plan import Recorder, image_key, row_key, truncate_conflict
from capturer.util import failpoints

if TYPE_CHECKING:
    from capturer.regions.snapshot import Snapshotter
    from capturer.regions.snapshot_plan import Chunk, Recorder, TablePlan

log = logging.getLogger(__name__)


class SnapshotHostMixin:
    """(mixed into a ``ClockedRegion``) See the module. Attributes it uses of the
    region: ``name``, ``where``, ``cfg``, ``ctx``, ``position``, ``clock``,
    ``error``, ``last_commit_ts``, ``_emit``, ``_fail``, ``_extra_ts``."""

    # provided by the region class this is mixed into
    name: str
    where: str
    cfg: Any
    ctx: Any
    position: Any
    clock: Any
    error: BaseException | None
    last_commit_ts: int

    if TYPE_CHECKING:  # (the region's own: never defined here, the mixin comes first in the MRO)
        def _emit(self, item: Any) -> None: ...
        def _fail(self, exc: BaseException, text: str = "") -> None: ...
        def _extra_ts(self) -> int: ...

    def _init_snapshot_host(self, progress: tuple[TableProgress, ...]) -> None:
        # emission order: the log's transactions, heartbeats and snapshot chunks leave under
        # this lock, which also guards the position, the clock and the snapshot recorders
        self._lock = threading.Condition()
        self.snap_progress: tuple[TableProgress, ...] = progress
        self.recorders: dict[tuple[str, str], Recorder] = {}
        self._tokens = itertools.count(1)
        self.snapshotter: Snapshotter | None = None
        self.snapshot_rows = 0
        self.snapshot_txns = 0
        # (db, table) / (db, "") / ("", "") -> last DDL, names in lower case (lower_case_table_names
        # may fold them), newest last; _ddl_floor: the newest DDL of entries pruned away
        self._ddl_seen: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._ddl_floor: tuple[Any, ...] | None = None
        self._snap_gen = 0  # bumped when the log starts over (chunks read before are void)
        self._snap_lock = threading.Lock()
        # on-demand runs not yet in snap_progress: a request never waits for the emission lock
        # (held while the region is blocked on a full queue); applied at its next use
        self._requests: list[tuple[TableProgress, ...]] = []
        self._req_lock = threading.Lock()
        self._creates_done: set[tuple[str, str, str]] = set()  # (run, db, table) up-front CREATE emitted
        # (db, table) -> the commit_ts from which this region's changes to it follow its copy's start
        self.opened_from: dict[tuple[str, str], int] = {}

    # --- what a region kind supplies ------------------------------------------------
    def tables_info(self, tables: list[tuple[str, str]]) -> dict[tuple[str, str], bool]:
        """Which of ``tables`` the region captures, each with whether it is keyless."""
        raise NotImplementedError

    def source_tables(self, selected: Callable[[str, str], bool]) -> list[tuple[str, str]]:
        """The tables this region's source has (that it could capture) which ``selected``
        chooses; SourceError if the source does not answer."""
        raise NotImplementedError

    def check_snapshot_support(self) -> None:
        """ValueError when the source cannot be copied as the configuration asks."""

    def _pkey(self, pos: Any) -> tuple[Any, ...]:
        """A position as a comparable tuple (later is greater)."""
        raise NotImplementedError

    def _stamped(self, pos: Any, progress: tuple[TableProgress, ...]) -> Any:
        """``pos`` carrying ``progress`` (what the checkpoint keeps with it)."""
        raise NotImplementedError

    def _start_statements(self, plan: TablePlan, create: Any, truncate: bool) -> list[tuple[str, str, str]]:
        """(under the lock) (db, sql, table) of a table run's start, in order."""
        raise NotImplementedError

    def _new_snapshotter(self) -> Snapshotter:
        raise NotImplementedError

    # --- progress ---------------------------------------------------------------------
    def start_snapshot_request(self, tables: list[tuple[str, str]], truncate: bool, reason: str = "on demand") -> str:
        """Copy these tables again while streaming (checked by the caller); returns the
        run id. Never waits for the emission lock."""
        with self._snap_lock:
            if self.snapshotter is None:
                self.snapshotter = self._new_snapshotter()
            return self.snapshotter.request(tables, truncate, reason)

    def _opened(self, db: str, table: str) -> None:
        """(under the lock) ``db.table``'s copy starts in this region's stream here (its
        CREATE/TRUNCATE go next; or a coordinated copy delivered it; or it is gone):
        every change to it the region emits from now on (commit_ts at or above the
        value kept) is newer than what the copy covers. A table newly selected by a
        filter reload is held back until then (capturer/regions/group.py)."""
        self.opened_from[(db, table)] = self.clock.last_emitted + 1

    def add_snapshot_progress(self, progress: tuple[TableProgress, ...], wait: bool = False) -> None:
        """A new run's tables: into the positions now if the emission lock is free (or
        ``wait``), else at the lock's next use (it may be held by an emission waiting
        for room in a full queue: an HTTP request must not wait for that)."""
        with self._req_lock:
            self._requests.append(progress)
        if self._lock.acquire(blocking=wait):
            try:
                self._apply_requests()
            finally:
                self._lock.release()

    def _apply_requests(self) -> None:
        """(under the lock) Runs requested since the lock was last held, in order."""
        if not self._requests:
            return
        with self._req_lock:
            reqs, self._requests = self._requests, []
        for progress in reqs:
            names = {(p.db, p.table) for p in progress}
            kept = tuple(p for p in self.snap_progress if (p.db, p.table) not in names)
            # a run whose every table left to copy went to the new run is complete: it leaves the
            # positions as when its last table is done (else its done tables stayed there for good)
            unfinished = {p.run for p in kept if p.state not in ("done", "dropped")}
            self.snap_progress = tuple(p for p in kept if p.run in unfinished) + progress
        self._restamp()

    def update_snapshot_progress(self, p: TableProgress) -> None:
        """A table's state (running, dropped) for its run; a run whose tables are all
        done or dropped leaves the positions."""
        with self._lock:
            self._apply_requests()
            if not any((x.db, x.table, x.run) == (p.db, p.table, p.run) for x in self.snap_progress):
                return  # superseded by a newer run of the table
            if p.state not in ("pending", "running"):
                self._opened(p.db, p.table)
            progress = tuple(p if (x.db, x.table) == (p.db, p.table) else x for x in self.snap_progress)
            if all(x.state in ("done", "dropped") for x in progress if x.run == p.run):
                progress = tuple(x for x in progress if x.run != p.run)
            self.snap_progress = progress
            self._restamp()

    def snapshot_run_open(self, run: str) -> bool:
        """Whether ``run`` still has a table to copy here (asked for, pending or running):
        a run leaves the positions once every table of it is done (capturer/regions/copies.py)."""
        with self._req_lock:
            if any(p.run == run for req in self._requests for p in req):
                return True
        return any(p.run == run for p in self.snap_progress)

    def table_progress(self, db: str, table: str) -> TableProgress | None:
        with self._lock:
            self._apply_requests()
            return next((p for p in self.snap_progress if (p.db, p.table) == (db, table)), None)

    def _restamp(self) -> None:
        """The current position carries the current snapshot progress (under the lock)."""
        p = self.position
        if p is not None and getattr(p, "snapshot", ()) is not self.snap_progress:
            self.position = self._stamped(p, self.snap_progress)

    def snapshot_status(self) -> dict[str, Any] | None:
        s = self.snapshotter
        if s is None:
            return None
        return {"driver": s.driver, "method": self.snap_method, "rows": self.snapshot_rows,
                "chunks": self.snapshot_txns, "lock_retries": s.lock_retries, "tables": s.status()}

    @property
    def snap_method(self) -> str:
        return "consistent"

    # --- coordinated copies (below) ------------------------------------------------------
    def copy_together(self, snapshotter: Snapshotter, plan: TablePlan, p: TableProgress,
                      others: list[str]) -> TableProgress | str:
        """One coordinated copy of ``plan``'s table with the regions ``others``."""
        return copy_together(self, snapshotter, plan, p, others)

    def cfg_snapshot_ddl(self) -> bool:
        """Whether a table's copy starts with its CREATE TABLE IF NOT EXISTS."""
        return bool(getattr(self.cfg, "snapshot_ddl", getattr(self.cfg, "ddl", True)))

    def group_snapshotter(self) -> Snapshotter:
        """This region's snapshotter (made, without workers, if it has none): a
        coordinated copy another region leads reads this region's rows with it."""
        try:
            self.check_snapshot_support()  # (resolves how this server's reads are made exact)
        except ValueError as exc:
            raise FatalSourceError(str(exc)) from None
        with self._snap_lock:
            if self.snapshotter is None:
                self.snapshotter = self._new_snapshotter()
            return self.snapshotter

    def group_done(self, db: str, table: str) -> None:
        """(under the lock) A coordinated copy led by another region delivered this
        region's rows of ``db.table``: its runs of the table are done."""
        key = (db, table)
        self._opened(db, table)
        progress = tuple(dataclasses.replace(x, state="done") if (x.db, x.table) == key and x.state in (
            "pending", "running") else x for x in self.snap_progress)
        for run in {x.run for x in progress if (x.db, x.table) == key}:
            if all(x.state in ("done", "dropped") for x in progress if x.run == run):
                progress = tuple(x for x in progress if x.run != run)
        self.snap_progress = progress
        self._restamp()
        s = self.snapshotter
        task = s.tasks.get(key) if s is not None else None
        if task is not None and task.progress.state in ("pending", "running"):
            task.progress = dataclasses.replace(task.progress, state="done")

    # --- chunks in flight -------------------------------------------------------------
    def chunk_begin(self, plan: TablePlan) -> int:
        """A worker is about to read a chunk of ``plan``'s table: from now on the log's
        changes to it are recorded (its P is at or after this point)."""
        with self._lock:
            rec = self.recorders.get((plan.db, plan.table))
            cols = tuple(c.name for c in plan.columns)
            if rec is None:
                rec = self.recorders[(plan.db, plan.table)] = Recorder(
                    plan.key, cols, spill_rows=self.ctx.spill_rows, spill_dir=self.ctx.spill_dir)
            token = next(self._tokens)
            if plan.key:  # (a whole read, key (), leaves a keyed chunk's key in place: both are recorded)
                rec.key = plan.key
            else:
                rec.whole.add(token)
            rec.columns = cols
            rec.lows[token] = self._pkey(self.position) if self.position is not None else ()
            return token

    def chunk_low(self, plan: TablePlan, token: int) -> tuple[Any, ...]:
        """Where the stream was when chunk ``token`` began."""
        with self._lock:
            rec = self.recorders.get((plan.db, plan.table))
            return rec.lows.get(token, ()) if rec is not None else ()

    def chunk_end(self, plan: TablePlan, token: int) -> None:
        with self._lock:
            rec = self.recorders.get((plan.db, plan.table))
            if rec is not None:
                rec.lows.pop(token, None)
                rec.prune()
                if not rec.lows:
                    del self.recorders[(plan.db, plan.table)]

    def _record(self, txn: Txn, tag: int = 0) -> None:
        """(under the lock) Changes to tables with chunks in flight; ``tag``: the
        source's transaction id where a chunk's visibility is told by it."""
        recs = self.recorders
        at = self._pkey(txn.position)
        for ch in txn.changes:
            rec = recs.get((ch.schema.db, ch.schema.table))
            if rec is not None:
                rec.record(at, ch.before, ch.after, tag)

    def check_truncate(self, db: str, table: str, why: str) -> None:
        """Refuse (FatalSourceError) to TRUNCATE ``db.table`` downstream when another
        region also delivers a table of that name: its rows would go too."""
        others = self.ctx.tables_elsewhere(self.name, [(db, table)]).get((db, table))
        if others:
            raise FatalSourceError(f"{self.where}: snapshot refused: "
                                   + truncate_conflict(db, table, [self.name, *others], why))

    def refuse_outside_peers(self, tables: list[tuple[str, str]], truncate: bool) -> None:
        """(a first start's copy) FatalSourceError when one of ``tables`` (copies that
        empty the table downstream) is also delivered by a region that cannot take
        part in the coordinated copy (served by an agent, or BaikalDB): its rows would
        go with the TRUNCATE."""
        found = self.ctx.tables_elsewhere(self.name, tables) if tables else {}
        clash = {k: v for k, v in ((k, [o for o in others if self.ctx.peer(o) is None])
                                   for k, others in found.items()) if v}
        if not clash:
            return
        (db, t), others = sorted(clash.items())[0]
        why = ("snapshot=when_needed empties every table first" if truncate else
               "it has no key, so its copy starts with a TRUNCATE") + \
            ", and a region served by an agent cannot take part in the coordinated copy that needs"
        more = f" ({len(clash) - 1} more such table(s): {', '.join(f'{d}.{x}' for d, x in sorted(clash)[1:6])})" \
            if len(clash) > 1 else ""
        raise FatalSourceError(f"{self.where}: snapshot={self.cfg.snapshot} refused: "
                               + truncate_conflict(db, t, [self.name, *others], why) + more)

    def snapshot_failed(self, exc: BaseException) -> None:
        log.error("%s: snapshot failed: %s", self.where, exc)
        if self.error is None:
            self._fail(exc)

    def _wait_past(self, at: tuple[Any, ...], gen: int | None = None) -> bool:
        """(under the lock) Until the stream has passed ``at``; False if stopping. With
        ``gen`` (the snapshot generation ``at`` was read in): also True as soon as the
        generation is another one (the caller then finds the read void): after a change
        of server ``at`` is a position of another binlog, which the stream's positions
        say nothing about."""
        while True:
            if self.ctx.stop.is_set() or self.error is not None:
                return False
            if gen is not None and gen != self._snap_gen:
                return True
            if self.position is not None and self._pkey(self.position) >= at:
                return True
            self._lock.wait(0.25)

    def _void_chunks(self, new_log: bool) -> None:
        """(under the lock) Every chunk read so far is void (read again, on the server the
        region reads now, from its table's last delivered key): the generation moves on.
        ``new_log``: the stream's positions from now on are of another binlog (a change of
        server resumed by GTID), not comparable with those before: what the recorders hold
        and the DDLs seen, kept by position, go (every table is described again, as every
        chunk in flight is read again), and the chunks in flight record from the current
        position (what their next reads need: changes after it)."""
        self._snap_gen += 1
        if not new_log:
            return
        low = self._pkey(self.position) if self.position is not None else ()
        for rec in self.recorders.values():
            rec.changed.clear()
            rec.events.clear()
            if rec.spill is not None:
                rec.spill.close()
                rec.spill = None
            for token in rec.lows:
                rec.lows[token] = low
        self._ddl_seen.clear()
        self._ddl_floor = None

    def position_now(self) -> Any:
        with self._lock:
            return self.position

    def snapshot_generation(self) -> int:
        with self._lock:
            return self._snap_gen

    # --- DDL seen while chunks are in flight -----------------------------------------
    def _note_ddl_key(self, key: tuple[str, str], at: tuple[Any, ...]) -> None:
        """(under the lock) A DDL at ``at`` may have changed ``key``: (db, table), or
        (db, "") every table of a database, or ("", "") every table; names in lower
        case. Entries pruned away leave their newest position as a floor."""
        self._ddl_seen.pop(key, None)  # newest last
        self._ddl_seen[key] = at
        if len(self._ddl_seen) > 10_000:  # old entries only matter for chunks in flight
            items = list(self._ddl_seen.items())
            dropped = max(p for _, p in items[:-1000])
            if self._ddl_floor is None or dropped > self._ddl_floor:
                self._ddl_floor = dropped
            self._ddl_seen = dict(items[-1000:])

    def _last_ddl(self, db: str, table: str) -> tuple[Any, ...] | None:
        """(under the lock) The newest DDL that may have changed ``db.table`` (names
        compared without case: lower_case_table_names may fold them, and a needless
        re-read is safe)."""
        db, table = db.lower(), table.lower()
        cands = [self._ddl_seen.get(k) for k in ((db, table), (db, ""), ("", ""))] + [self._ddl_floor]
        found = [x for x in cands if x is not None]
        return max(found) if found else None

    def _ddl_since(self, plan: TablePlan) -> bool:
        """(under the lock) Whether a DDL that may have changed ``plan``'s table was
        read after the table was described."""
        ddl = self._last_ddl(plan.db, plan.table)
        described = plan.described_at
        return ddl is not None and (described is None or ddl > self._pkey(described))

    # --- emission ---------------------------------------------------------------------
    def emit_begin(self, plan: TablePlan, run: str, at: Any, create: Any,
                   truncate: bool, gen: int | None = None) -> TableProgress | str:
        """A table's run starts: once the stream has passed ``at`` (after its
        definition was read), its CREATE (if any) and TRUNCATE (if ``truncate``) go
        out as transactions of their own, and the table becomes ``running``: every
        chunk of it is read after this point of the stream. Returns its progress,
        or "redo" / "superseded" / "stopped" as ``emit_chunk`` (``gen``: the snapshot
        generation ``at`` was read in; "redo" when it is over)."""
        key = (plan.db, plan.table)
        with self._lock:
            if not self._wait_past(self._pkey(at), gen):
                return "stopped"
            self._apply_requests()
            prev = next((x for x in self.snap_progress if (x.db, x.table) == key), None)
            if prev is None or prev.run != run:
                return "superseded"
            if gen is not None and gen != self._snap_gen:
                return "redo"
            if self._ddl_since(plan):
                return "redo"
            p = dataclasses.replace(prev, state="running")
            progress = tuple(p if (x.db, x.table) == key else x for x in self.snap_progress)
            here = self.position
            assert here is not None
            before = self._stamped(here, self.snap_progress)
            after = self._stamped(here, progress)
            stmts = self._start_statements(plan, create, truncate)
            self._opened(plan.db, plan.table)
            failpoints.hit("snapshot.begin")
            # only the last statement says the start was delivered: a restart before it does it again
            for i, (db, sql, table) in enumerate(stmts):
                ts = self._extra_ts()
                self._emit(Txn(self.name, ts, after if i == len(stmts) - 1 else before, (),
                               Ddl(db, sql, table, db), ts_physical_ms(ts) // 1000, ""))
                self.last_commit_ts = ts
            self.snap_progress = progress
            self.position = after
            self._creates_done.add((run, plan.db, plan.table))
            self._lock.notify_all()
            return p

    def emit_chunk(self, chunk: Chunk) -> TableProgress | str:
        """Deliver a chunk once the stream has passed the position it is consistent
        with (returns the table's progress after it); "redo" if its table changed
        shape since it was described, or the log was restarted meanwhile;
        "superseded" if a newer run of the table was requested; "stopped"."""
        at = self._pkey(chunk.at)
        # changes after this point make a chunk's row stale (P; or, where the reader tells
        # visibility by transaction id, where the stream was when the chunk began)
        newer_than = chunk.drop_after if chunk.drop_after is not None else at
        plan = chunk.plan
        key = (plan.db, plan.table)
        with self._lock:
            if not self._wait_past(at, chunk.gen):
                return "stopped"
            self._apply_requests()
            prev = next((x for x in self.snap_progress if (x.db, x.table) == key), None)
            if prev is None or prev.run != chunk.run:
                return "superseded"
            if chunk.gen != self._snap_gen:
                return "redo"
            if self._ddl_since(plan):
                return "redo"
            rec = self.recorders.get(key)
            changes: Any
            keyless = chunk.spilled is not None
            if not keyless:
                rows = chunk.rows
                if rec is not None and rec.changed:
                    newer = {k for k, p in rec.changed.items() if p > newer_than}
                    if newer:
                        rows = [r for r in rows if row_key(r, plan.key) not in newer]
                changes = read_changes(rows, plan.schema)
            else:
                changes = self._keyless_rows(chunk, rec, newer_than)
            p = TableProgress(plan.db, plan.table, chunk.run, "done" if chunk.last else "running", chunk.last_key,
                              chunk.index + 1, prev.rows + len(changes), prev.truncate)
            progress = tuple(p if (x.db, x.table) == key else x for x in self.snap_progress)
            if chunk.last and all(x.state in ("done", "dropped") for x in progress if x.run == chunk.run):
                # the run is complete: later positions need not carry it
                progress = tuple(x for x in progress if x.run != chunk.run)
            here = self.position
            assert here is not None
            # a keyless table's TRUNCATE carries the progress as it was: only the rows
            # transaction says the copy was delivered, so a restart between them reads it again.
            # (A keyed table's TRUNCATE was its run's start, before its first chunk was read.)
            before = self._stamped(here, self.snap_progress)
            after = self._stamped(here, progress)
            if keyless and chunk.truncate:
                ts = self._extra_ts()
                self._emit(Txn(self.name, ts, before, (), Ddl(plan.db, f"TRUNCATE TABLE {qualified(plan.db, plan.table)}",
                                                                plan.table, plan.db), ts_physical_ms(ts) // 1000, ""))
            ts = self._extra_ts()
            txn = Txn(self.name, ts, after, changes, None, ts_physical_ms(ts) // 1000, "", chunk_mark(chunk))
            self._emit(txn)
            self.snap_progress = progress
            self.position = after
            self.last_commit_ts = txn.commit_ts
            self.snapshot_txns += 1
            self.snapshot_rows += len(changes)
            return p

    def _keyless_rows(self, chunk: Chunk, rec: Recorder | None, after: tuple[Any, ...]) -> Any:
        """A keyless table: its rows as read, plus what later changes inserted, minus
        what they deleted (a multiset), i.e. its rows at the stream's position. The
        later changes: those after P; or, where the reader tells visibility by
        transaction id (``chunk.visible``), those after the chunk began that its
        read did not see. Only the deleted rows are held in memory (counted by
        value); the rows read and the rows inserted stream from disk to disk."""
        cols = tuple(c.name for c in chunk.plan.columns)
        visible = chunk.visible
        remove: Counter[tuple[Any, ...]] = Counter()

        def later() -> Any:
            if rec is None:
                return
            for sign, row, tag in rec.keyless_events(after):
                if visible is None or not visible(tag):
                    yield sign, row

        for sign, row in later():
            if sign < 0:
                remove[image_key(row, cols)] += 1

        def keep(row: dict[str, Any]) -> bool:
            if remove:
                k = image_key(row, cols)
                n = remove.get(k, 0)
                if n > 0:
                    if n == 1:
                        del remove[k]
                    else:
                        remove[k] = n - 1
                    return False
            return True

        spilled = chunk.spilled
        out = SpillWriter(spilled.directory, spilled.chunk_rows)
        for part in spilled.chunks():
            kept = [ch for ch in part if keep(ch.after or {})]
            if kept:
                out.add(kept)
        batch: list[RowChange] = []
        for sign, row in later():
            if sign > 0 and keep(row):
                batch.append(RowChange(chunk.plan.schema, "read", None, row))
                if len(batch) >= out.chunk_rows:
                    out.add(batch)
                    batch = []
        if batch:
            out.add(batch)
        return out.finish()


_READ_CHANGES = getattr(_fastrows, "read_changes", None)


def read_changes(rows: list[dict[str, Any]], schema: Any) -> tuple[RowChange, ...]:
    """``RowChange(schema, "read", None, row)`` of each row of a chunk (in C where built:
    the dataclass's ``__init__`` only assigns its four slots)."""
    if _READ_CHANGES is not None and type(rows) is list:
        return _READ_CHANGES(rows, schema, RowChange, "read")
    return tuple(map(partial(RowChange, schema, "read", None), rows))


# --- tables several regions deliver: one coordinated copy ------------------------------
#
# A copy that empties a table downstream (a keyless table's copy, a ``truncate`` run)
# would, done by one region, also empty the rows the other regions delivered to the
# same table. Such a table is copied in one coordinated step instead: each region that
# delivers it reads it whole at its own P (spilled to disk: memory stays bounded), and
# once every region's stream has passed its P, under every region's emission lock, one
# region (the leader) sends a TRUNCATE and then each region's rows corrected to where
# its stream is (the keyless rule: later deletes out, later inserts in). Every region's
# clock is lifted above the last of them, so nothing a region sends after its rows
# falls before them in the merged order. The leader's progress says the table is done
# only on its last transaction; any region whose entry for the table is not done after
# a restart does the whole step again (the TRUNCATE makes that safe).

_groups: dict[tuple[str, str], threading.Event] = {}
_groups_lock = threading.Lock()


def copy_together(host: SnapshotHostMixin, snapshotter: Snapshotter, plan: TablePlan, p: TableProgress,
                  others: list[str]) -> TableProgress | str:
    """The coordinated copy of ``plan``'s table with the regions ``others`` (see above).
    Returns the host's progress for the table, or "redo" / "superseded" / "stopped"."""
    key = (plan.db.lower(), plan.table.lower())
    with _groups_lock:
        running = _groups.get(key)
        if running is None:
            _groups[key] = threading.Event()
    if running is not None:  # another region's worker leads it: its step covers this region's rows too
        while not running.wait(0.5):
            if host.ctx.stop.is_set():
                return "stopped"
        got = host.table_progress(plan.db, plan.table)
        if got is None or got.run != p.run:
            return "superseded"
        # the step covered this region's rows only if it marked the entry done; else (it stopped,
        # or was superseded) this region's worker does the step again
        return got if got.state not in ("pending", "running") else "redo"
    try:
        members: list[Any] = [host]
        for name in others:
            peer = host.ctx.peer(name)
            if peer is None:
                raise FatalSourceError(
                    f"{host.where}: snapshot refused: " + truncate_conflict(
                        plan.db, plan.table, [host.name, *others],
                        f"region {name} (served by an agent, or not a MySQL/MariaDB or PostgreSQL region) cannot "
                        "take part in the coordinated copy such a table needs"))
            members.append(peer)
        return _copy_group(host, snapshotter, plan, p, members)
    finally:
        with _groups_lock:
            ev = _groups.pop(key, None)
        if ev is not None:
            ev.set()


def _copy_group(host: SnapshotHostMixin, snapshotter: Snapshotter, plan: TablePlan, p: TableProgress,
                members: list[Any]) -> TableProgress | str:
    readers: dict[str, Any] = {}
    tokens: dict[str, tuple[Any, TablePlan, int]] = {}
    chunks: dict[str, Chunk] = {}
    try:
        create = _group_read(host, snapshotter, plan, p, members, readers, tokens, chunks)
        if not _group_wait_past(chunks, tokens):
            return "stopped"
        ordered = sorted((tokens[n][0] for n in chunks), key=lambda m: m.name)
        held: list[Any] = []
        try:
            if not _group_lock_all(ordered, held):
                return "stopped"
            got = _group_step(host, plan, p, create, chunks, tokens, ordered, held)
            if isinstance(got, str):
                return got
            done, rows = got
        finally:
            for m in reversed(held):
                m._lock.release()
        log.info("%s: %s copied in one step with region(s) %s: TRUNCATE, then %d rows", host.where, plan.name,
                 ", ".join(m.name for m in ordered if m is not host) or "-", rows)
        return done
    finally:
        for m, whole, token in tokens.values():
            m.chunk_end(whole, token)
        for r in readers.values():
            r.close()


def _group_read(host: SnapshotHostMixin, snapshotter: Snapshotter, plan: TablePlan, p: TableProgress,
                members: list[Any], readers: dict[str, Any], tokens: dict[str, tuple[Any, TablePlan, int]],
                chunks: dict[str, Chunk]) -> Any:
    """Each member's rows of the table, read whole (``readers``, ``tokens`` and ``chunks`` are filled as it
    goes, for the caller to end and close whatever happens); the host's CREATE statement when it sends DDL."""
    create: Any = None
    for m in members:
        snap = snapshotter if m is host else m.group_snapshotter()
        reader = readers[m.name] = snap._new_reader()
        try:
            mplan = plan if m is host else snap._describe(reader, plan.db, plan.table)
        except TableGone:
            if m is host:
                raise
            continue  # gone from that region since: nothing of it to copy
        if m is host and host.cfg_snapshot_ddl():
            create, _ = snap._begin_at(reader, mplan)
        whole = dataclasses.replace(mplan, key=())  # read whole, corrected as a multiset
        tokens[m.name] = (m, whole, m.chunk_begin(whole))
        try:
            chunks[m.name] = snap._read(reader, whole, TableProgress(plan.db, plan.table, p.run),
                                        tokens[m.name][2])
        except TableGone:
            if m is host:
                raise
            m.chunk_end(whole, tokens.pop(m.name)[2])  # gone from that region meanwhile: nothing to copy
    return create


def _group_wait_past(chunks: dict[str, Chunk], tokens: dict[str, tuple[Any, TablePlan, int]]) -> bool:
    """Each member's stream past where its rows were read; False when one stopped."""
    for name, chunk in chunks.items():
        m = tokens[name][0]
        with m._lock:
            if not m._wait_past(m._pkey(chunk.at), chunk.gen):
                return False
    return True


def _group_lock_all(ordered: list[Any], held: list[Any]) -> bool:
    """Every region's emission lock (in name order: two steps never wait on each other), into ``held``;
    False (none held) when one of them stops or fails meanwhile. Held only while nothing is emitted: the
    step is decided under them all, then the other regions go on (their clocks above it) while the
    leader, still under its own, sends it."""
    delay = 0.001
    while True:  # every lock or none: never wait for one while holding another (a region's
        # stream holds its own while its emission waits for room in a full queue)
        for m in ordered:
            if not m._lock.acquire(blocking=False):
                break
            held.append(m)
        else:
            return True
        for m in reversed(held):
            m._lock.release()
        held.clear()
        if any(m.ctx.stop.is_set() or m.error is not None for m in ordered):
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _group_step(host: SnapshotHostMixin, plan: TablePlan, p: TableProgress, create: Any, chunks: dict[str, Chunk],
                tokens: dict[str, tuple[Any, TablePlan, int]], ordered: list[Any],
                held: list[Any]) -> tuple[TableProgress, int] | str:
    """Under every member's lock: the step decided (or "superseded", "redo"), the other members let go, and
    the host sends it (the DDL, the TRUNCATE, each member's rows); the table's progress done and its rows."""
    key = (plan.db, plan.table)
    for m in ordered:
        m._apply_requests()
    prev = next((x for x in host.snap_progress if (x.db, x.table) == key), None)
    if prev is None or prev.run != p.run:
        return "superseded"
    for name, chunk in chunks.items():
        m, whole, _ = tokens[name]
        if chunk.gen != m._snap_gen or m._ddl_since(whole):
            return "redo"
    stmts = host._start_statements(plan, create, False) if create is not None else []
    stmts.append((plan.db, f"TRUNCATE TABLE {qualified(plan.db, plan.table)}", plan.table))
    rows = 0
    parts = []
    for name, chunk in chunks.items():  # each region's rows as of where its stream is
        m, whole, _ = tokens[name]
        after = chunk.drop_after if chunk.drop_after is not None else m._pkey(chunk.at)
        changes = m._keyless_rows(chunk, m.recorders.get(key), after)
        rows += len(changes)
        parts.append((chunk, changes))
    # one clock for the step: above everything any of them sent; the others' clocks above it
    host._opened(plan.db, plan.table)
    host.clock.lift_to(max(m.clock.last_emitted for m in ordered))
    stamps = [host._extra_ts() for _ in range(len(stmts) + len(parts))]
    here = host.position
    before = host._stamped(here, host.snap_progress)
    done = TableProgress(plan.db, plan.table, p.run, "done", None, len(parts), rows, prev.truncate,
                         prev.created)
    progress = tuple(done if (x.db, x.table) == key else x for x in host.snap_progress)
    if all(x.state in ("done", "dropped") for x in progress if x.run == p.run):
        progress = tuple(x for x in progress if x.run != p.run)
    after_pos = host._stamped(here, progress)
    _group_let_go(host, plan, ordered, held, stamps[-1])
    _group_emit(host, stmts, parts, stamps, before, after_pos)
    host.last_commit_ts = stamps[-1]
    host.snap_progress = progress
    host.position = after_pos
    host._lock.notify_all()
    return done, rows


def _group_let_go(host: SnapshotHostMixin, plan: TablePlan, ordered: list[Any], held: list[Any], top: int) -> None:
    """The other members' clocks above the step (``top``), and their locks released: they go on."""
    for m in ordered:
        if m is not host:
            m.clock.lift_to(top + 1, m.position)
            m.group_done(plan.db, plan.table)  # (its next positions, after the step, say so)
    for m in reversed(ordered):
        if m is not host:
            held.remove(m)
            m._lock.notify_all()
            m._lock.release()


def _group_emit(host: SnapshotHostMixin, stmts: list[tuple[str, str, str]], parts: list[tuple[Chunk, Any]],
                stamps: list[int], before: Any, after_pos: Any) -> None:
    """The step, by the host: the statements, then each member's rows (the last one moves the position)."""
    ts_iter = iter(stamps)
    for db, sql, table in stmts:
        ts = next(ts_iter)
        host._emit(Txn(host.name, ts, before, (), Ddl(db, sql, table, db), ts_physical_ms(ts) // 1000, ""))
    failpoints.hit("snapshot.group")  # (the TRUNCATE sent, the rows not yet)
    for i, (chunk, changes) in enumerate(parts):
        ts = next(ts_iter)
        host._emit(Txn(host.name, ts, after_pos if i == len(parts) - 1 else before, changes, None,
                       ts_physical_ms(ts) // 1000, "", chunk_mark(dataclasses.replace(chunk, index=i,
                                                                                 last=i == len(parts) - 1))))
        host.snapshot_txns += 1
        host.snapshot_rows += len(changes)
