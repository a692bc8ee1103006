"""A BaikalDB region: every binlog region of one binlog table, merged into one
stream of committed transactions in commit_ts order.

How it reads (shared/reference/baikaldb-protocol.md §4-§10):

* **Discovery** through the meta servers: ``QUERY_SCHEMA`` gives the binlog
  table and the source tables linked to it (``binlog_info`` or
  ``binlog_infos``: their fields, types, keys), ``QUERY_REGION`` the binlog
  table's regions across all partitions (or only ``binlogRegionID``). Both are
  refreshed every ``schema_refresh`` seconds, when a row carries a field number
  or a table id the current schema does not know, and when a store answers
  ``VERSION_OLD``.
* **One reader thread per binlog region** polls ``OP_READ_BINLOG`` from that
  region's resume ts (strictly after it: the store excludes ``ts == binlog_ts``,
  so the next read starts at the last commit_ts of the previous answer, fakes
  included), following leaders, skipping dead peers, reading followers when the
  leader lags (``client.StoreClient``).
* **The merge** (the C++ capturer's rule): watermark W = min over regions of the
  newest ts each has handed over; every entry below W is final (a region only
  answers up to its check point, and each later entry has a larger ts), so
  entries below W leave in commit_ts order. FAKE entries (about one per second
  per region leader) only move W, so an idle region never stalls the merge.
  The region's heartbeats carry W to the capturer's own merge.
* A SQL transaction that wrote to several partitions arrives as one entry per
  partition with the same ``txn_id`` and consecutive commit_ts; they are joined
  into one transaction (committed at the last part's commit_ts).
* commit_ts = the BaikalDB TSO shifted to the Unix epoch (``tso.to_commit_ts``):
  exact and order preserving, so BaikalDB and MySQL regions merge in one order.

Schema changes: BaikalDB writes no DDL into its binlog. When a source table's
version changes, the region switches its decoder at the first transaction that
needs the new version (a row with a new field number) or that committed after
the change was seen, and sends the MySQL DDL that makes the difference (ADD /
DROP / CHANGE COLUMN; CREATE TABLE for a new table) as its own transaction just
before it. Each schema state is journaled (``<checkpoint>.baikaldb.<region>``)
and the position names it (``epoch``), so a restart decodes as before the crash.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import protogen
from ...bqueue import Closed, WeightedQueue
from ...durable import append_line, rewrite_lines
from ...encode import quote_ident
from ...errors import CheckpointError, FatalSourceError, SourceError
from ...model import Ddl, Heartbeat, RowChange, TsPosition, Txn
from ...spill import DEFAULT_CHUNK_ROWS, SpillWriter
from ..base import Region, RegionContext
from .client import MetaClient, PeerFailure, StoreClient, StoreRegionInfo
from .rows import Entry, RowDecodeError, RowPlan, UnpairedUpdate, mutation_changes, parse_entry
from .schema import TableDef, alter_table_sql, create_table_sql, linked_binlog_tables, transition_def
from .tso import describe, from_unix_ms, to_commit_ts, unix_ms, unix_seconds

log = logging.getLogger(__name__)

# heartbeats trail the watermark by this many TSO ticks, so that a DDL can
# always be given a commit_ts of its own in front of the next transaction
RESERVE = 16
# parts of one transaction across partitions have commit_ts from one TSO batch
JOIN_GAP = 64
# transactions are held while their commit_ts are this close, up to MAX_RUN of them
MIN_GAP = 16
MAX_RUN = 1000


class SchemaJournal:
    """``epoch -> {table_id: TableDef}``: the schemas in effect at each position
    of this region (JSON lines, fsync'd before a position names the epoch)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.lock = threading.Lock()  # the region appends while the app's checkpoint prunes
        self.epochs: dict[int, dict[int, TableDef]] = {}
        if path is None or not path.exists():
            return
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                self.epochs[int(d["epoch"])] = {int(k): TableDef.from_json(v) for k, v in d["tables"].items()}
            except (ValueError, KeyError, TypeError) as exc:
                if n == len(lines):  # a torn last line after kill -9: never referenced by a position
                    log.warning("%s:%d: ignoring torn last line", path, n)
                    continue
                raise CheckpointError(f"{path}:{n}: corrupt schema journal: {exc}") from None

    def next_epoch(self) -> int:
        with self.lock:
            return max(self.epochs, default=0) + 1

    def write(self, epoch: int, tables: dict[int, TableDef]) -> None:
        with self.lock:
            if self.path is not None:
                append_line(self.path, self._line(epoch, tables))
            self.epochs[epoch] = dict(tables)

    @staticmethod
    def _line(epoch: int, tables: dict[int, TableDef]) -> str:
        return json.dumps({"epoch": epoch, "tables": {str(k): v.to_json() for k, v in tables.items()}})

    def prune(self, keep_from: int) -> None:
        with self.lock:
            old = [e for e in self.epochs if e < keep_from]
            if not old:
                return
            for e in old:
                del self.epochs[e]
            if self.path is not None:
                rewrite_lines(self.path, [self._line(e, t) for e, t in sorted(self.epochs.items())])


@dataclass
class Prepared:
    """A transaction decoded and ready to leave, not yet emitted."""

    ts: int  # BaikalDB commit TSO (the last part's)
    entries: list[Entry]

    @property
    def first(self) -> int:
        """The first part's commit TSO (a DDL or a position must stay below it)."""
        return self.entries[0].ts
    changes: Any  # tuple[RowChange, ...] or SpilledChanges
    switches: dict[int, tuple[TableDef | None, TableDef]] = field(default_factory=dict)

    @property
    def txn_id(self) -> int:
        return self.entries[0].txn_id


class BaikalRegion(Region):
    def __init__(self, cfg: Any, ctx: RegionContext):
        super().__init__(cfg.name, ctx)
        if ctx.start is not None and not isinstance(ctx.start, TsPosition):
            raise CheckpointError(
                f"checkpoint: regions.{cfg.name} is a {getattr(ctx.start, 'kind', '?')} position, but "
                f"[region:{cfg.name}] is type=baikaldb; remove that entry from the checkpoint to start this "
                "region from its 'start' setting")
        self.cfg = cfg
        self.where = f"region {cfg.name} (BaikalDB binlog table {cfg.binlogTableID})"
        self.pb = protogen.load("baikaldb")
        self.meta = MetaClient(list(cfg.metaServer), cfg.connect_timeout, cfg.request_timeout, self.where)
        jpath = None
        if ctx.state_path is not None:
            jpath = ctx.state_path.with_name(f"{ctx.state_path.name}.baikaldb.{cfg.name}")
        self.journal = SchemaJournal(jpath)
        self.tables: dict[int, TableDef] = {}
        self.plans: dict[int, RowPlan] = {}
        self.pending: dict[int, tuple[TableDef, int]] = {}  # newer versions seen, with the TSO when seen
        self.epoch = 0
        self.stores: dict[int, StoreRegionInfo] = {}
        self.partitions = 1
        self.binlog_table = ""
        self.last_emitted = 0  # TSO of the last item that left (txn, DDL or heartbeat)
        self.held: list[Prepared] = []  # decoded, not emitted yet: a run of close commit_ts
        self.watermark = 0
        self._starts: dict[int, int] = {}
        self._fatal: BaseException | None = None
        self._new_regions: list[Any] = []
        self._lock = threading.Lock()
        self._warned: set[Any] = set()
        self._last_refresh = 0.0
        self._last_evidence_refresh = 0.0
        self.counters = collections.Counter()  # type: ignore[var-annotated]
        pos = ctx.start
        if isinstance(pos, TsPosition):
            self.last_emitted = pos.ts
            self.position = pos

    # --- lifecycle ----------------------------------------------------------
    RETRYABLE = (SourceError, PeerFailure, OSError)

    def _connect_and_stream(self) -> None:
        self._discover()
        self._stream()

    def _run(self) -> None:
        try:
            super()._run()
        finally:
            self.meta.close()

    def checkpointed(self, position: Any) -> None:
        if isinstance(position, TsPosition) and position.epoch:
            self.journal.prune(position.epoch)

    # --- discovery ----------------------------------------------------------
    def _now_tso(self) -> int:
        tso = self.meta.gen_tso()
        return tso if tso else from_unix_ms(int(time.time() * 1000))

    def _linked(self) -> tuple[Any, dict[int, TableDef]]:
        """(the binlog table's SchemaInfo, the source tables linked to it)."""
        schemas = self.meta.query_schemas()
        tid = self.cfg.binlogTableID
        binlog = next((s for s in schemas if int(s.table_id) == tid), None)
        if binlog is None:
            raise FatalSourceError(f"{self.where}: the meta servers know no table with id {tid}; check "
                                   "binlogTableID (QUERY_SCHEMA lists every table's table_id)")
        if binlog.engine != 4 and not binlog.is_binlog:  # Engine BINLOG
            raise FatalSourceError(f"{self.where}: table {tid} ({binlog.database}.{binlog.table_name}) is not a "
                                   "binlog table (ENGINE=Binlog); binlogTableID must name the binlog table")
        targets = set(binlog.binlog_info.target_table_ids) if binlog.HasField("binlog_info") else set()
        defs = {}
        for s in schemas:
            if s.deleted or int(s.table_id) == tid:
                continue
            if tid in linked_binlog_tables(s) or int(s.table_id) in targets:
                d = TableDef.from_schema_info(s)
                defs[d.table_id] = d
        self.binlog_table = f"{binlog.database}.{binlog.table_name}"
        self.partitions = max(1, int(binlog.partition_num or 1))
        return binlog, defs

    def _discover(self) -> None:
        self.meta.find_leader()
        _, defs = self._linked()
        if not self.tables:
            self._init_schemas(defs)
        else:
            self._note_versions(defs)
        regions = self.meta.query_regions(self.cfg.binlogTableID)
        if self.cfg.binlogRegionID:
            want = set(self.cfg.binlogRegionID)
            missing = want - {int(r.region_id) for r in regions}
            if missing:
                raise FatalSourceError(f"{self.where}: binlogRegionID {sorted(missing)} is not a region of binlog "
                                       f"table {self.cfg.binlogTableID} (it has "
                                       f"{sorted(int(r.region_id) for r in regions)})")
            regions = [r for r in regions if int(r.region_id) in want]
        if not regions:
            raise SourceError(f"{self.where}: the meta servers list no region of binlog table {self.cfg.binlogTableID}")
        self.partitions = max(self.partitions, len({int(r.partition_id) for r in regions}))
        for r in regions:
            rid = int(r.region_id)
            if rid in self.stores:
                self.stores[rid].update_from_pb(r)
            else:
                self.stores[rid] = StoreRegionInfo.from_pb(r)
        self._last_refresh = time.monotonic()
        if not self._starts:
            self._choose_starts()

    def _init_schemas(self, defs: dict[int, TableDef]) -> None:
        pos = self.ctx.start
        if isinstance(pos, TsPosition):
            known = self.journal.epochs.get(pos.epoch)
            if known is None:
                if pos.epoch:
                    log.warning("%s: the schema journal has no epoch %d; decoding with the current schemas",
                                self.where, pos.epoch)
                self.tables = dict(defs)
                self.epoch = self.journal.next_epoch()
                self.journal.write(self.epoch, self.tables)
            else:
                self.tables = dict(known)
                self.epoch = pos.epoch
                self._note_versions(defs)
        else:
            self.tables = dict(defs)
            self.epoch = self.journal.next_epoch()
            self.journal.write(self.epoch, self.tables)
        self.plans = {tid: RowPlan(d) for tid, d in self.tables.items()}

    def _note_versions(self, defs: dict[int, TableDef]) -> None:
        """Remember tables whose current version differs from the one in use; the
        switch happens in stream order (``_prepare``)."""
        obs = 0
        for tid, d in defs.items():
            cur = self.tables.get(tid)
            if cur is not None and cur.version == d.version and cur == d:
                self.pending.pop(tid, None)
                continue
            pend = self.pending.get(tid)
            if pend is not None and pend[0] == d:
                continue
            obs = obs or self._now_tso()
            self.pending[tid] = (d, obs)
            log.info("%s: %s: schema version %s -> %d seen at TSO %s", self.where, d.name,
                     cur.version if cur else "new table", d.version, describe(obs))

    def _choose_starts(self) -> None:
        pos = self.ctx.start
        if isinstance(pos, TsPosition):
            self._starts = {rid: pos.resume_ts(rid) for rid in self.stores}
            if pos.epoch == 0:  # stopped within the first start's CREATE statements
                self._first_ddl(pos.ts)
            return
        start = self.cfg.start
        starts: dict[int, int] = {}
        if start == "earliest":
            client = StoreClient(self.where, self.cfg.connect_timeout, self.cfg.request_timeout, 1e9)
            try:
                for rid, sr in self.stores.items():
                    info = client.query_binlog(sr)
                    if not info or not isinstance(info.get("oldest_ts"), int) or info["oldest_ts"] <= 0:
                        raise SourceError(f"{self.where}: binlog region {rid}: no peer answered OP_QUERY_BINLOG "
                                          "with its oldest_ts (needed for start=earliest)")
                    starts[rid] = int(info["oldest_ts"])
            finally:
                client.close()
        elif start == "latest":
            starts = dict.fromkeys(self.stores, self._now_tso())
        elif start.isdigit():
            starts = dict.fromkeys(self.stores, int(start))
        else:
            import datetime as dt

            ms = int(dt.datetime.fromisoformat(start).timestamp() * 1000)
            starts = dict.fromkeys(self.stores, from_unix_ms(ms))
        self._starts = starts
        first = min(self._starts.values())
        self.last_emitted = first
        log.info("%s: first start at TSO %s (start=%s)", self.where, describe(first), start)
        self._first_ddl(first)

    def _first_ddl(self, last: int) -> None:
        """CREATE DATABASE / TABLE IF NOT EXISTS for every source table, at TSOs ending
        at ``last``. All but the last name epoch 0 ("the first start is not done"),
        so a restart from between them sends them all again."""
        if not self.cfg.create_tables:
            return
        stmts = self._ddl_statements({tid: (None, d) for tid, d in self.tables.items()}, set())
        for i, ((db, table, sql), ts) in enumerate(zip(stmts, range(last - len(stmts) + 1, last + 1))):
            self._emit_ddl(ts, db, table, sql, None if i == len(stmts) - 1 else 0)

    def _position(self, ts: int, epoch: int | None = None) -> TsPosition:
        return TsPosition(ts, tuple(sorted(self._starts.items())), self.epoch if epoch is None else epoch)

    # --- reading ------------------------------------------------------------
    def _stream(self) -> None:
        stop = threading.Event()
        wake = threading.Event()
        queues: dict[int, WeightedQueue[Entry]] = {}
        threads = []
        self._fatal = None
        # each region resumes after what has left this region (a reconnect drops what was only buffered)
        self.held = []
        resume = self.last_emitted
        latest: dict[int, int] = {}
        buffers: dict[int, collections.deque[Entry]] = {}

        def add(rid: int) -> None:
            sr = self.stores[rid]
            start = max(self._starts.setdefault(rid, resume), resume)
            sr.next_ts = sr.start_ts = start
            sr.latest_ts = start
            latest[rid] = start
            buffers[rid] = collections.deque()
            q: WeightedQueue[Entry] = WeightedQueue(self.cfg.region_buffer)
            queues[rid] = q
            t = threading.Thread(target=self._fetch, args=(sr, q, wake, stop, start), daemon=True,
                                 name=f"baikaldb-{self.name}-{rid}")
            threads.append(t)
            t.start()

        for rid in sorted(self.stores):
            add(rid)
        self.state = "streaming"
        self.last_error = ""
        log.info("%s: reading %d binlog region(s) of %s (%d partition(s)) from TSO %s", self.where,
                 len(self.stores), self.binlog_table, self.partitions, describe(resume))
        # a first heartbeat at the resume point: this region is alive
        self._emit(Heartbeat(self.name, to_commit_ts(resume), self._position(resume)))
        try:
            while not self.ctx.stop.is_set():
                wake.wait(0.1)
                wake.clear()
                if self._fatal is not None:
                    raise self._fatal
                for rid, q in queues.items():
                    buf = buffers[rid]
                    # at most region_buffer entries per region: one that runs ahead waits in its queue
                    while len(buf) < self.cfg.region_buffer:
                        e = q.get(timeout=0)
                        if e is None:
                            break
                        buf.append(e)
                        latest[rid] = e.ts
                        self.stores[rid].latest_ts = e.ts
                with self._lock:
                    new, self._new_regions = self._new_regions, []
                if new:
                    self._flush_held()
                    resume = self.last_emitted
                    for r in new:
                        if int(r.region_id) not in self.stores and (
                                not self.cfg.binlogRegionID or int(r.region_id) in self.cfg.binlogRegionID):
                            self.stores[int(r.region_id)] = StoreRegionInfo.from_pb(r)
                            log.info("%s: new binlog region %d (from TSO %s)", self.where, int(r.region_id),
                                     describe(resume))
                            add(int(r.region_id))
                if time.monotonic() - self._last_refresh > self.cfg.schema_refresh:
                    self._refresh()
                w = min(latest.values())
                if w > self.watermark:
                    self.watermark = w
                    self.last_source_time = unix_ms(w) / 1000
                self._advance(buffers, w)
        finally:
            stop.set()
            for q in queues.values():
                q.close()  # a reader of this attempt still in a call: its entries go nowhere
            for t in threads:
                t.join(0.5)

    def _refresh(self) -> None:
        self._last_refresh = time.monotonic()
        try:
            _, defs = self._linked()
            self._note_versions(defs)
            for r in self.meta.query_regions(self.cfg.binlogTableID):
                rid = int(r.region_id)
                if rid in self.stores:
                    self.stores[rid].update_from_pb(r, trust_leader=False)
                elif not self.cfg.binlogRegionID or rid in self.cfg.binlogRegionID:
                    with self._lock:
                        self._new_regions.append(r)
        except SourceError as exc:
            self.counters["refresh_failures"] += 1
            log.warning("%s: schema/region refresh failed: %s", self.where, exc)

    def _on_new_regions(self, infos: list[Any]) -> None:
        with self._lock:
            self._new_regions.extend(infos)

    def _fetch(self, sr: StoreRegionInfo, q: WeightedQueue[Entry], wake: threading.Event,
               stop: threading.Event, next_ts: int) -> None:
        """One binlog region's reader for one attempt of ``_stream``. Its read
        position is its own (``next_ts``): a reader of an earlier attempt that is
        still inside a call cannot move it; shared state is written only while this
        attempt is on (``stop`` not set)."""
        cfg = self.cfg
        client = StoreClient(self.where, cfg.connect_timeout, cfg.request_timeout, cfg.follower_read_after,
                             self._on_new_regions)
        meta = MetaClient(list(cfg.metaServer), cfg.connect_timeout, cfg.request_timeout, self.where)
        delay, fails = 0.2, 0
        sr.state = "streaming"
        try:
            while not stop.is_set() and not self.ctx.stop.is_set():
                try:
                    res = client.read(sr, next_ts, cfg.read_batch)
                except PeerFailure as exc:
                    if stop.is_set():
                        break
                    fails += 1
                    sr.retries += 1
                    sr.state = "retrying"
                    sr.last_error = str(exc)
                    if fails == 1 or fails % 10 == 0:
                        log.warning("%s: binlog region %d: %s (attempt %d; retrying in %.1fs)", self.where,
                                    sr.region_id, exc, fails, delay)
                    if exc.refresh or fails % 3 == 0:
                        self._refresh_region(sr, meta)
                    if stop.wait(delay):
                        break
                    delay = min(delay * 2, 5.0)
                    continue
                if stop.is_set():
                    break
                if fails:
                    log.info("%s: binlog region %d: reading again (from %s)", self.where, sr.region_id, res.peer)
                delay, fails = 0.2, 0
                sr.state = "streaming"
                sr.serving_peer = res.peer
                sr.reads += 1
                if not res.entries:
                    stop.wait(cfg.poll_ms / 1000)
                    continue
                for ts, payload in res.entries:
                    e = parse_entry(self.pb, payload, ts, sr.region_id)
                    if e.fake:
                        sr.fakes += 1
                    else:
                        sr.entries += 1
                    q.put(e, 1, stop=stop)
                    wake.set()
                next_ts = res.entries[-1][0]
                sr.next_ts = next_ts
        except Closed:
            pass
        except (FatalSourceError, RowDecodeError) as exc:
            if not stop.is_set():
                sr.state = "failed"
                sr.last_error = str(exc)
                if isinstance(exc, RowDecodeError):
                    exc = FatalSourceError(f"{self.where}: binlog region {sr.region_id}: {exc}")
                self._fatal = exc
                wake.set()
        except BaseException as exc:  # noqa: BLE001
            if not stop.is_set():
                sr.state = "failed"
                sr.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("%s: binlog region %d reader failed", self.where, sr.region_id)
                self._fatal = exc
                wake.set()
        finally:
            client.close()
            meta.close()
            if sr.state != "failed" and stop.is_set():
                sr.state = "stopped"

    def _refresh_region(self, sr: StoreRegionInfo, meta: MetaClient) -> None:
        """Peers and leader of one region from the meta (after repeated failures;
        each reader has its own meta client, so a dead meta holds up only it)."""
        try:
            found = meta.query_regions(self.cfg.binlogTableID, [sr.region_id])
        except (SourceError, FatalSourceError) as exc:
            log.warning("%s: binlog region %d: meta refresh failed: %s", self.where, sr.region_id, exc)
            return
        sr.meta_refreshes += 1
        for r in found:
            if int(r.region_id) == sr.region_id:
                sr.update_from_pb(r)
                sr.dead_until.clear()

    # --- the merge ------------------------------------------------------------
    def _advance(self, buffers: dict[int, collections.deque[Entry]], w: int) -> None:
        """Everything below the watermark ``w`` leaves, in commit_ts order."""
        heads = buffers

        def smallest() -> collections.deque[Entry] | None:
            best = None
            for buf in heads.values():
                if buf and (best is None or buf[0].ts < best[0].ts):
                    best = buf
            return best

        while True:
            buf = smallest()
            if buf is None or buf[0].ts >= w:
                break
            e = buf.popleft()
            if e.fake:
                continue
            group = [(e, buf)]
            complete = True
            if self.partitions > 1 and e.txn_id:
                # the parts of one transaction on other partitions: the same txn_id, commit_ts
                # from one TSO batch (consecutive, though parts in other binlog tables may
                # sit in between), next to each other in this table's commit order
                while True:
                    last = group[-1][0]
                    nb = smallest()
                    if nb is not None and nb[0].ts < w and nb[0].txn_id == e.txn_id and not nb[0].fake \
                            and nb[0].ts - last.ts <= JOIN_GAP:
                        group.append((nb.popleft(), nb))
                        continue
                    if last.ts + JOIN_GAP >= w:  # a part may still come
                        complete = False
                    break
            if not complete:
                for ent, b in reversed(group):
                    b.appendleft(ent)
                break
            self._offer(self._prepare([g[0] for g in group]))
        # heartbeat: trail the watermark so that a later DDL finds a free commit_ts, and
        # never pass an entry not delivered yet (a held transaction, parts waiting to join)
        h = w - RESERVE
        head = smallest()
        if head is not None:
            h = min(h, head[0].ts - RESERVE)
        if self.held and self.held[-1].ts <= h:
            self._flush_held()
        if self.held:
            h = min(h, self.held[0].first - RESERVE)
        due = self._due(h)
        if due:
            self._switch_at_heartbeat(due, h)
        if h > self.last_emitted:
            self.last_emitted = h
            self.position = self._position(h)
            self.caught_up_at = time.time()
            self._emit(Heartbeat(self.name, to_commit_ts(h), self.position))

    def _due(self, ts: int) -> dict[int, tuple[TableDef | None, TableDef]]:
        return {tid: (self.tables.get(tid), d) for tid, (d, obs) in self.pending.items() if ts > obs}

    # --- transactions -------------------------------------------------------
    def _refresh_for_evidence(self) -> None:
        """Read the schemas again because a row showed a newer one. A failure is
        raised (the stream reads again from what was delivered, after a backoff):
        rows are never delivered without the columns they carry."""
        self._last_evidence_refresh = time.monotonic()
        _, defs = self._linked()
        self._note_versions(defs)

    def _prepare(self, entries: list[Entry]) -> Prepared:
        ts = entries[-1].ts
        switches = self._due(ts)
        muts = [m for e in entries for m in e.mutations]
        touched = {int(m.table_id) for m in muts}
        unknown_tables = touched - set(self.tables) - set(switches)
        if unknown_tables:
            self._refresh_for_evidence()
            switches = self._due(ts)
            for tid in unknown_tables:
                if tid in self.pending and tid not in switches:
                    switches[tid] = (self.tables.get(tid), self.pending[tid][0])
        p = Prepared(ts, entries, (), switches)
        known = set(p.switches)
        p.changes = self._decode(p, {})
        if set(p.switches) != known:
            # a row showed a newer schema half way: read the whole transaction with it
            p.changes = self._decode(p, {})
        return p

    def _plan(self, tid: int, switches: dict[int, tuple[TableDef | None, TableDef]],
              override: dict[int, RowPlan]) -> RowPlan | None:
        if tid in override:
            return override[tid]
        if tid in switches:
            new = switches[tid][1]
            plan = self.plans.get(-tid)
            if plan is None or plan.tdef is not new:
                plan = self.plans[-tid] = RowPlan(new)  # the next version's plan, kept apart
            return plan
        return self.plans.get(tid)

    def _decode(self, p: Prepared, override: dict[int, RowPlan]) -> Any:
        """The row changes of a prepared transaction (spilled past spill_rows)."""
        spill_rows = self.ctx.spill_rows
        total = sum(len(m.insert_rows) + len(m.deleted_rows) for e in p.entries for m in e.mutations)
        spill: SpillWriter | None = None
        if spill_rows and total > spill_rows:
            spill = SpillWriter(self.ctx.spill_dir or None, min(spill_rows, DEFAULT_CHUNK_ROWS))
            self.spilled_txns += 1
        out: list[RowChange] = []
        split = self.cfg.unpaired_update == "split"
        for e in p.entries:
            for m in e.mutations:
                tid = int(m.table_id)
                plan = self._plan(tid, p.switches, override)
                if plan is None:
                    self.counters["skipped_mutations"] += 1
                    if ("table", tid) not in self._warned:
                        self._warned.add(("table", tid))
                        log.warning("%s: skipping mutations of table id %d: it is not linked to binlog table %d "
                                    "(dropped or unlinked?)", self.where, tid, self.cfg.binlogTableID)
                    continue
                try:
                    changes, unknown = mutation_changes(plan, m, split)
                except UnpairedUpdate as exc:
                    raise FatalSourceError(
                        f"{self.where}: {exc} in transaction {e.txn_id} (commit_ts TSO {describe(p.ts)}, binlog "
                        f"region {e.region_id}). BaikalDB writes such an UPDATE for REPLACE and INSERT ... ON "
                        "DUPLICATE KEY UPDATE; set unpaired_update=split in this [region:...] section to apply its "
                        "old rows as deletes and its new rows as inserts, then start again") from None
                except (RowDecodeError, ValueError) as exc:
                    raise FatalSourceError(f"{self.where}: transaction {e.txn_id} at TSO {describe(p.ts)}, binlog "
                                           f"region {e.region_id}: {exc}") from None
                if unknown and not override:
                    changes = self._unknown_fields(p, tid, m, unknown, changes, split)
                if len(set(map(len, (m.insert_rows, m.deleted_rows)))) > 1 and m.insert_rows and m.deleted_rows:
                    self.counters["unpaired_updates_split"] += 1
                out.extend(changes)
                if spill is not None and len(out) >= spill.chunk_rows:
                    spill.add(out)
                    out = []
        if spill is not None:
            if out:
                spill.add(out)
            return spill.finish()
        return tuple(out)

    def _unknown_fields(self, p: Prepared, tid: int, m: Any, unknown: tuple[int, ...], changes: list[RowChange],
                        split: bool) -> list[RowChange]:
        """Rows with field numbers this table version does not know: a newer schema."""
        self._refresh_for_evidence()
        pend = self.pending.get(tid)
        if pend is not None and set(unknown) <= pend[0].known_ids and tid not in p.switches:
            p.switches[tid] = (self.tables.get(tid), pend[0])
            changes, _ = mutation_changes(self._plan(tid, p.switches, {}), m, split)  # type: ignore[arg-type]
            return changes
        self.counters["unknown_fields"] += len(unknown)
        cur = p.switches.get(tid, (None, self.tables.get(tid)))[1]
        raise SourceError(
            f"{self.where}: {cur.name if cur else tid}: transaction {p.txn_id} (TSO {describe(p.ts)}) carries field "
            f"numbers {sorted(set(unknown))} that the meta's schema (version {cur.version if cur else '?'}) does not "
            "know yet; reading it again once the meta knows them")

    def _offer(self, c: Prepared) -> None:
        """Hold transactions while their commit_ts follow each other closely (a run),
        and emit the run once a gap opens, so that a schema change's DDL always finds
        free commit_ts of its own: in front of ``c``, or in front of the run (whose
        transactions were written before the change and are read again with the
        columns both versions have)."""
        run = self.held
        if c.switches:
            stmts = self._ddl_statements(c.switches)
            k = len(stmts)
            if run and run[-1].ts + k < c.first:
                self._flush_held()
                self._apply_switches(c.switches, stmts, range(c.first - k, c.first))
            elif run and self.last_emitted + k < run[0].first:
                override = {tid: RowPlan(transition_def(old, new)) for tid, (old, new) in c.switches.items()
                            if old is not None}
                for p in run:
                    if override and any(int(m.table_id) in override for e in p.entries for m in e.mutations):
                        p.changes = self._decode(p, override)
                self._apply_switches(c.switches, stmts, range(run[0].first - k, run[0].first))
                self._flush_held()
            elif not run and self.last_emitted + k < c.first:
                self._apply_switches(c.switches, stmts, range(c.first - k, c.first))
            else:
                # a run of transactions on consecutive TSOs longer than MAX_RUN around a schema
                # change: no commit_ts is free; this one is read without the new columns
                self.counters["ddl_late"] += 1
                log.error("%s: no free commit_ts for the DDL of %s before TSO %d; transaction %d is delivered "
                          "without its new columns", self.where,
                          ", ".join(d.name for _, d in c.switches.values()), c.ts, c.txn_id)
                override = {tid: RowPlan(transition_def(old, new)) for tid, (old, new) in c.switches.items()
                            if old is not None}
                for tid, (_, new) in c.switches.items():
                    self.pending[tid] = (new, c.ts)
                c.switches = {}
                c.changes = self._decode(c, override)
                self._flush_held()
            self.held = [c]
            return
        if run and (c.first - run[-1].ts > MIN_GAP or len(run) >= MAX_RUN):
            self._flush_held()
        self.held.append(c)

    def _ddl_statements(self, switches: dict[int, tuple[TableDef | None, TableDef]],
                        known_dbs: set[str] | None = None) -> list[tuple[str, str, str]]:
        """(db, table, sql) of the DDL that brings a target to the switched versions:
        CREATE DATABASE/TABLE for new tables (``create_tables``), else ALTER TABLE."""
        if known_dbs is None:
            known_dbs = {d.db for d in self.tables.values()}
        out = []
        creates = sorted((d for old, d in switches.values() if old is None), key=lambda d: d.name)
        if self.cfg.create_tables:
            for db in sorted({d.db for d in creates} - known_dbs):
                out.append((db, "", f"CREATE DATABASE IF NOT EXISTS {quote_ident(db)}"))
            out += [(d.db, d.table, create_table_sql(d)) for d in creates]
        for tid in sorted(switches):
            old, new = switches[tid]
            if old is not None:
                sql = alter_table_sql(old, new)
                if sql is not None:
                    out.append((new.db, new.table, sql))
        return out

    def _apply_switches(self, switches: dict[int, tuple[TableDef | None, TableDef]],
                        stmts: list[tuple[str, str, str]], slots: range) -> None:
        tables = {**self.tables, **{tid: new for tid, (_, new) in switches.items()}}
        epoch = self.journal.next_epoch()
        self.journal.write(epoch, tables)  # first: a failed write changes nothing (it is retried)
        # every statement but the last names the old epoch: a restart from between them
        # sees the schema change as not yet made and sends its DDL again (idempotent)
        old_epoch = self.epoch
        for i, ((db, table, sql), ts) in enumerate(zip(stmts, slots)):
            self._emit_ddl(ts, db, table, sql, epoch if i == len(stmts) - 1 else old_epoch)
        self.tables, self.epoch = tables, epoch
        for tid, (_, new) in switches.items():
            plan = self.plans.pop(-tid, None)
            self.plans[tid] = plan if plan is not None and plan.tdef is new else RowPlan(new)
            self.pending.pop(tid, None)
        self.counters["schema_switches"] += len(switches)

    def _switch_at_heartbeat(self, due: dict[int, tuple[TableDef | None, TableDef]], h: int) -> None:
        stmts = self._ddl_statements(due)
        k = len(stmts)
        if not self.held and self.last_emitted + k < h + 1:
            self._apply_switches(due, stmts, range(h - k + 1, h + 1))

    def _emit_ddl(self, ts: int, db: str, table: str, sql: str, epoch: int | None = None) -> None:
        self.counters["ddl"] += 1
        log.info("%s: DDL at TSO %d: %s", self.where, ts, sql.replace("\n", " "))
        pos = self._position(ts, epoch)
        self._emit(Txn(self.name, to_commit_ts(ts), pos, (), Ddl(db, sql, table, db), unix_seconds(ts)))
        self.last_emitted = ts
        self.position = pos

    def _flush_held(self) -> None:
        run, self.held = self.held, []
        for p in run:
            self._emit_txn(p)

    def _emit_txn(self, p: Prepared) -> None:
        pos = self._position(p.ts)
        if len(p.entries) > 1:
            self.counters["multi_partition_txns"] += 1
        txn = Txn(self.name, to_commit_ts(p.ts), pos, p.changes, None, unix_seconds(p.ts), f"txn-{p.txn_id}")
        self._emit(txn)
        self.last_emitted = p.ts
        self.position = pos
        self.last_commit_ts = txn.commit_ts
        self.txns += 1
        self.rows += len(p.changes)

    def _emit(self, item: Txn | Heartbeat) -> None:
        weight = item.weight if isinstance(item, Txn) else 1
        self.ctx.out.put(item, weight, stop=self.ctx.stop)

    # --- status -------------------------------------------------------------
    def lag_seconds(self) -> float:
        if not self.watermark:
            return 0.0
        return max(0.0, time.time() - unix_ms(self.watermark) / 1000)

    def status(self) -> dict[str, Any]:
        d = super().status()
        d.update({
            "kind": "baikaldb",
            "binlog_table": f"{self.binlog_table} (id {self.cfg.binlogTableID})",
            "partitions": self.partitions,
            "watermark_tso": self.watermark,
            "schema_epoch": self.epoch,
            "tables": {d.name: {"table_id": tid, "version": d.version} for tid, d in sorted(self.tables.items())},
            "pending_schema_changes": {d.name: d.version for d, _ in self.pending.values()},
            "counters": dict(self.counters),
            "store_regions": {str(rid): sr.status() for rid, sr in sorted(list(self.stores.items()))},
        })
        return d
