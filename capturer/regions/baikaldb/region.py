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
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model import Ddl, RowChange, TsPosition, Txn, protogen
from capturer.model.encode import qualified, quote_ident
from capturer.model.spill import DEFAULT_CHUNK_ROWS, SpillWriter
from capturer.regions.baikaldb.client import BinlogPurged, MetaClient, PeerFailure, StoreClient, StoreRegionInfo
from capturer.regions.baikaldb.rows import Entry, RowDecodeError, RowPlan, UnpairedUpdate, mutation_changes, parse_entry
from capturer.regions.baikaldb.schema import TableDef, alter_table_sql, create_table_sql, linked_binlog_tables
from capturer.regions.baikaldb.tso import describe, from_unix_ms, to_commit_ts, unix_ms, unix_seconds
from capturer.regions.base import PositionJournal, Region, RegionContext, require_start_kind
from capturer.util.bqueue import Closed, WeightedQueue

log = logging.getLogger(__name__)

# parts of one transaction across partitions have commit_ts from one TSO batch
JOIN_GAP = 64


@dataclass
class Epoch:
    """The source tables' schemas in effect from a point of the stream on.

    ``from_ts``: the schemas apply to entries after this TSO; ``at_ts``: the
    commit TSO the switch's DDL preludes were given (the transaction they
    precede, or the heartbeat's TSO); ``first``: the first start's CREATE
    statements. None for the schemas a region started with."""

    tables: dict[int, TableDef]
    from_ts: int | None = None
    at_ts: int | None = None
    first: bool = False


class SchemaJournal(PositionJournal[int, Epoch]):
    """``epoch -> Epoch``: the schemas in effect at each position of this region
    (the position names its epoch; a line is fsync'd before any item names the
    epoch). A switch is journaled before its DDL leaves, with where it applies, so
    that a restart from before it makes the same switch at the same point with the
    same statements. Epochs are written in increasing order."""

    what = "schema journal"

    def parse(self, d: Any) -> tuple[int, Epoch]:
        tables = {int(k): TableDef.from_json(v) for k, v in d["tables"].items()}
        f, a = d.get("from_ts"), d.get("at_ts")
        return int(d["epoch"]), Epoch(tables, None if f is None else int(f), None if a is None else int(a),
                                      bool(d.get("first")))

    def dump(self, key: int, value: Epoch) -> dict[str, Any]:
        d: dict[str, Any] = {"epoch": key, "tables": {str(k): v.to_json() for k, v in value.tables.items()}}
        if value.from_ts is not None:
            d["from_ts"] = value.from_ts
        if value.at_ts is not None:
            d["at_ts"] = value.at_ts
        if value.first:
            d["first"] = True
        return d

    def epoch(self, epoch: int) -> Epoch | None:
        return self.lookup(epoch)

    def next_epoch(self) -> int:
        return max((e for e, _ in self.items()), default=0) + 1

    def write(self, epoch: int, ep: Epoch) -> None:
        self.put(epoch, ep)

    def scheduled_after(self, epoch: int, ts: int) -> list[tuple[int, Epoch]]:
        """Switches journaled after ``epoch`` that apply at or after ``ts``, in order."""
        return sorted((e, ep) for e, ep in self.items()
                      if e > epoch and ep.from_ts is not None and ep.from_ts >= ts and not ep.first)

    def first_start(self) -> tuple[int, Epoch] | None:
        return next(((e, ep) for e, ep in sorted(self.items(), key=lambda x: x[0]) if ep.first), None)

    def prune(self, keep_from: int) -> None:
        """Forget the epochs before ``keep_from`` (the checkpoint's)."""
        self.forget(lambda epochs: [e for e in epochs if e < keep_from])


@dataclass
class Switch:
    """A schema switch to make in front of a transaction (or at a heartbeat):
    ``changes`` tid -> (version in use or None for a new table, next version)."""

    changes: dict[int, tuple[TableDef | None, TableDef]]
    epoch: int | None = None  # a journaled switch being made again: its epoch number ...
    at: int | None = None  # ... the TSO its preludes had ...
    from_ts: int | None = None  # ... and the TSO after which its schemas apply


@dataclass
class Prepared:
    """A transaction decoded and ready to leave."""

    ts: int  # BaikalDB commit TSO (the last part's)
    entries: list[Entry]
    changes: Any = ()  # tuple[RowChange, ...] or SpilledChanges
    switch: Switch | None = None

    @property
    def first(self) -> int:
        """The first part's commit TSO (a position in front of it must stay below it)."""
        return self.entries[0].ts

    @property
    def txn_id(self) -> int:
        return self.entries[0].txn_id


class BaikalRegion(Region):
    def __init__(self, cfg: Any, ctx: RegionContext):
        super().__init__(cfg.name, ctx)
        require_start_kind(ctx, cfg.name, "baikaldb", TsPosition)
        self.cfg = cfg
        self.where = f"region {cfg.name} (BaikalDB binlog table {cfg.binlogTableID})"
        self.pb = protogen.load("baikaldb")
        self.meta = MetaClient(list(cfg.metaServer), cfg.connect_timeout, cfg.request_timeout, self.where)
        self.journal = SchemaJournal(self.state_file("baikaldb"))
        self.tables: dict[int, TableDef] = {}
        self.plans: dict[int, RowPlan] = {}
        # newer versions the meta showed, not switched to yet, with a TSO taken after they were read
        self.pending: dict[int, tuple[TableDef, int]] = {}
        self.epoch = 0
        self.scheduled: list[tuple[int, Epoch]] = []  # switches journaled before a restart, to make again
        self._initialised = False
        self.stores: dict[int, StoreRegionInfo] = {}
        self.partitions = 1
        self.binlog_table = ""
        self.last_emitted = 0  # TSO of the last item that left (txn, DDL or heartbeat)
        self.watermark = 0
        self._starts: dict[int, int] = {}
        self._fatal: BaseException | None = None
        self._new_regions: list[Any] = []
        self._lock = threading.Lock()
        self._refreshed: tuple[dict[int, TableDef], int] | None = None  # from the refresher thread
        self._refreshing = False
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

    def _on_exit(self) -> None:
        self.meta.close()

    def checkpointed(self, position: Any) -> None:
        if isinstance(position, TsPosition) and position.epoch:
            self.journal.prune(position.epoch)

    # --- discovery ----------------------------------------------------------
    def _now_tso(self, meta: MetaClient | None = None) -> int:
        tso = (meta or self.meta).gen_tso()
        return tso if tso else from_unix_ms(int(time.time() * 1000))

    def _linked(self, meta: MetaClient | None = None) -> tuple[Any, dict[int, TableDef], int]:
        """(the binlog table's SchemaInfo, the source tables linked to it, the partitions)."""
        schemas = (meta or self.meta).query_schemas()
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
        return binlog, defs, max(1, int(binlog.partition_num or 1))

    def _discover(self) -> None:
        self.meta.find_leader()
        _, defs, parts = self._linked()
        if not self._initialised:
            self._init_schemas(defs)
            self._initialised = True
        else:
            self._note_versions(defs, self._now_tso())
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
        self._set_partitions(parts, regions)
        for r in regions:
            rid = int(r.region_id)
            if rid in self.stores:
                self.stores[rid].update_from_pb(r)
            else:
                self.stores[rid] = StoreRegionInfo.from_pb(r)
        self._last_refresh = time.monotonic()
        if not self._starts:
            self._choose_starts()

    def _set_partitions(self, partition_num: int, regions: list[Any]) -> None:
        """Partitions only grow (joining the parts of a transaction must not switch
        off because one answer lacked ``partition_num``)."""
        self.partitions = max(self.partitions, partition_num, len({int(r.partition_id) for r in regions}))

    def _init_schemas(self, defs: dict[int, TableDef]) -> None:
        pos = self.ctx.start
        if isinstance(pos, TsPosition):
            if pos.epoch == 0:  # stopped within the first start's CREATE statements
                first = self.journal.first_start()
                if first is not None:
                    self.tables, self.epoch = dict(first[1].tables), first[0]
                    self._schedule_journaled(pos.ts)
                    self._note_versions(defs, self._now_tso())
                    self.plans = {tid: RowPlan(d) for tid, d in self.tables.items()}
                    return
            known = self.journal.epoch(pos.epoch)
            if known is None:
                if pos.epoch:
                    log.warning("%s: the schema journal has no epoch %d; decoding with the current schemas",
                                self.where, pos.epoch)
                self.tables = dict(defs)
                self.epoch = self.journal.next_epoch()
                self.journal.write(self.epoch, Epoch(self.tables))
            else:
                self.tables = dict(known.tables)
                self.epoch = pos.epoch
                self._schedule_journaled(pos.ts)
                self._note_versions(defs, self._now_tso())
        else:
            self.tables = dict(defs)
            self.epoch = self.journal.next_epoch()
            self.journal.write(self.epoch, Epoch(self.tables))
        self.plans = {tid: RowPlan(d) for tid, d in self.tables.items()}

    def _schedule_journaled(self, ts: int) -> None:
        """Switches journaled after the epoch the restart resumes in: they are made
        again at the same points (before the meta's newer versions count)."""
        self.scheduled = self.journal.scheduled_after(self.epoch, ts)

    def _newest_version(self, tid: int) -> int:
        v = [self.tables[tid].version] if tid in self.tables else []
        if tid in self.pending:
            v.append(self.pending[tid][0].version)
        v += [ep.tables[tid].version for _, ep in self.scheduled if tid in ep.tables]
        return max(v, default=-1)

    def _note_versions(self, defs: dict[int, TableDef], obs: int) -> None:
        """Remember tables whose version is newer than every one known here; the
        switch happens in stream order (``_prepare``). A version never goes back:
        a meta follower that lags answers with older schemas, which are ignored."""
        for tid, d in defs.items():
            if d.version <= self._newest_version(tid):
                continue
            cur = self.tables.get(tid)
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
                    starts[rid] = client.oldest_ts(sr)
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
        if self.cfg.create_tables:
            # the schemas the CREATE statements are made from, named by the last of them
            self.epoch = self.journal.next_epoch()
            self.journal.write(self.epoch, Epoch(dict(self.tables), first, first, first=True))
        # durable before anything leaves: a crash before the first checkpoint resumes
        # from these starts (start=latest or a time is not chosen again); epoch 0 while
        # the first start's CREATE statements are still to be sent
        self.ctx.pin_start(self.name, self._position(first, 0 if self.cfg.create_tables else None))
        self._first_ddl(first)

    def _first_ddl(self, at: int) -> None:
        """CREATE DATABASE / TABLE IF NOT EXISTS for every source table, as preludes
        at TSO ``at`` (the start). All but the last name epoch 0 ("the first start is
        not done"), so a restart from between them sends them all again, the same."""
        if not self.cfg.create_tables:
            return
        stmts = self._ddl_statements({tid: (None, d) for tid, d in self.tables.items()}, set())
        self._emit_preludes(stmts, at, at, 0, self.epoch)

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
        self._promise(to_commit_ts(resume), self._position(resume), caught_up=False)
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
                    refreshed, self._refreshed = self._refreshed, None
                if refreshed is not None:
                    self._note_versions(*refreshed)
                if new:
                    resume = self.last_emitted
                    for r in new:
                        rid = int(r.region_id)
                        if rid not in self.stores and (not self.cfg.binlogRegionID or rid in self.cfg.binlogRegionID):
                            self.stores[rid] = StoreRegionInfo.from_pb(r)
                            self._starts[rid] = self._new_region_start(self.stores[rid], resume)
                            add(rid)
                if time.monotonic() - self._last_refresh > self.cfg.schema_refresh:
                    self._start_refresh()
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

    def _new_region_start(self, sr: StoreRegionInfo, resume: int) -> int:
        """Where a binlog region that appeared while streaming is read from: the point
        the stream has reached, or its oldest binlog if that is later (a region made
        after that point holds nothing before it)."""
        client = StoreClient(self.where, self.cfg.connect_timeout, self.cfg.request_timeout, 1e9)
        try:
            oldest = client.oldest_ts(sr)
        except (SourceError, FatalSourceError, PeerFailure) as exc:
            log.warning("%s: new binlog region %d: its oldest binlog is unknown (%s); reading it from TSO %s",
                        self.where, sr.region_id, exc, describe(resume))
            return resume
        finally:
            client.close()
        start = max(resume, oldest)
        log.info("%s: new binlog region %d (partition %d): reading it from TSO %s%s", self.where, sr.region_id,
                 sr.partition_id, describe(start), " (where its binlog begins)" if oldest > resume else "")
        return start

    def _start_refresh(self) -> None:
        """Schemas and regions from the meta, in a thread of its own: a slow or dead
        meta never holds up the merge (nor, through it, the other regions)."""
        self._last_refresh = time.monotonic()
        if self._refreshing:
            return
        self._refreshing = True
        threading.Thread(target=self._refresh, name=f"baikaldb-{self.name}-refresh", daemon=True).start()

    def _refresh(self) -> None:
        meta = MetaClient(list(self.cfg.metaServer), self.cfg.connect_timeout, self.cfg.request_timeout, self.where)
        try:
            _, defs, parts = self._linked(meta)
            obs = self._now_tso(meta)
            regions = meta.query_regions(self.cfg.binlogTableID)
            with self._lock:
                self._refreshed = (defs, obs)
                self._set_partitions(parts, regions)
                for r in regions:
                    rid = int(r.region_id)
                    if rid in self.stores:
                        self.stores[rid].update_from_pb(r, trust_leader=False)
                    elif not self.cfg.binlogRegionID or rid in self.cfg.binlogRegionID:
                        self._new_regions.append(r)
        except (SourceError, FatalSourceError, PeerFailure) as exc:
            # a meta that answers oddly for a while is no reason to stop: the stream goes on
            # with what it knows, and the next refresh tries again
            self.counters["refresh_failures"] += 1
            log.warning("%s: schema/region refresh failed: %s", self.where, exc)
        except Exception:
            self.counters["refresh_failures"] += 1
            log.exception("%s: schema/region refresh failed", self.where)
        finally:
            meta.close()
            self._refreshing = False

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
                elif isinstance(exc, BinlogPurged) and self.ctx.start is None and self.cfg.start == "earliest" \
                        and next_ts == sr.start_ts:
                    exc = BinlogPurged(
                        f"{exc} (This was the first read, at the oldest binlog the store reported: its first "
                        "transaction's prewrite is already purged. Set start to a later TSO or time in this "
                        "[region:...] section.)")
                self._fatal = exc
                wake.set()
        except BaseException as exc:
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
        # heartbeat: everything below the watermark has left, except parts waiting to
        # join (the head): promise what is below both
        h = w - 1
        head = smallest()
        if head is not None:
            h = min(h, head[0].ts - 1)
        if h > self.last_emitted:
            self._switch_at_heartbeat(h)
            self.last_emitted = h
            self._promise(to_commit_ts(h), self._position(h))

    def _due(self, ts: int) -> dict[int, tuple[TableDef | None, TableDef]]:
        return {tid: (self.tables.get(tid), d) for tid, (d, obs) in self.pending.items() if ts > obs}

    # --- transactions -------------------------------------------------------
    def _refresh_for_evidence(self) -> None:
        """Read the schemas again because a row showed a newer one (at most once a
        second; rows of tables that are not linked any more must not turn every
        transaction into a full schema query). A failure is raised (the stream reads
        again from what was delivered, after a backoff): rows are never delivered
        without the columns they carry."""
        if time.monotonic() - self._last_evidence_refresh < 1.0:
            return
        self._last_evidence_refresh = time.monotonic()
        _, defs, _ = self._linked()
        self._note_versions(defs, self._now_tso())

    def _journaled_switch(self, upto: int) -> Switch | None:
        """The next journaled switch (a restart making it again), if it applies to
        entries at or below ``upto``."""
        if not self.scheduled or self.scheduled[0][1].from_ts is None or self.scheduled[0][1].from_ts >= upto:
            return None
        epoch, ep = self.scheduled[0]
        changes = {tid: (self.tables.get(tid), d) for tid, d in ep.tables.items()
                   if self.tables.get(tid) != d}
        return Switch(changes, epoch, ep.at_ts, ep.from_ts)

    def _prepare(self, entries: list[Entry]) -> Prepared:
        p = Prepared(entries[-1].ts, entries)
        journaled = self._journaled_switch(p.first)
        if journaled is not None:
            # made before a restart: the same switch again, whatever the meta says now
            p.switch = journaled
            p.changes = self._decode(p)
            return p
        p.switch = Switch(self._due(p.ts))
        muts = [m for e in entries for m in e.mutations]
        touched = {int(m.table_id) for m in muts}
        unknown_tables = touched - set(self.tables) - set(p.switch.changes)
        if unknown_tables:
            self._refresh_for_evidence()
            p.switch.changes = self._due(p.ts)
            for tid in unknown_tables:
                if tid in self.pending and tid not in p.switch.changes:
                    p.switch.changes[tid] = (self.tables.get(tid), self.pending[tid][0])
        known = set(p.switch.changes)
        p.changes = self._decode(p)
        if set(p.switch.changes) != known:
            # a row showed a newer schema half way: read the whole transaction with it
            p.changes = self._decode(p)
        if not p.switch.changes:
            p.switch = None
        return p

    def _plan(self, tid: int, p: Prepared) -> RowPlan | None:
        if p.switch is not None and tid in p.switch.changes:
            new = p.switch.changes[tid][1]
            plan = self.plans.get(-tid)
            if plan is None or plan.tdef is not new:
                plan = self.plans[-tid] = RowPlan(new)  # the next version's plan, kept apart
            return plan
        return self.plans.get(tid)

    def _decode(self, p: Prepared) -> Any:
        """The row changes of a prepared transaction (spilled past spill_rows)."""
        spill_rows = self.ctx.spill_rows
        total = sum(len(m.insert_rows) + len(m.deleted_rows) for e in p.entries for m in e.mutations)
        spill: SpillWriter | None = None
        if spill_rows and total > spill_rows:
            spill = SpillWriter(self.ctx.spill_dir or None, min(spill_rows, DEFAULT_CHUNK_ROWS))
        out: list[RowChange] = []
        split = self.cfg.unpaired_update == "split"
        for e in p.entries:
            for m in e.mutations:
                tid = int(m.table_id)
                plan = self._plan(tid, p)
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
                if unknown:
                    changes = self._unknown_fields(p, tid, m, unknown, split)
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

    def _unknown_fields(self, p: Prepared, tid: int, m: Any, unknown: tuple[int, ...],
                        split: bool) -> list[RowChange]:
        """Rows with field numbers this table version does not know: a newer schema."""
        assert p.switch is not None
        if p.switch.epoch is None:  # (a journaled switch is made exactly as before)
            self._last_evidence_refresh = 0.0
            self._refresh_for_evidence()
            pend = self.pending.get(tid)
            if pend is not None and set(unknown) <= pend[0].known_ids and tid not in p.switch.changes:
                p.switch.changes[tid] = (self.tables.get(tid), pend[0])
                changes, _ = mutation_changes(self._plan(tid, p), m, split)  # type: ignore[arg-type]
                return changes
        self.counters["unknown_fields"] += len(unknown)
        cur = p.switch.changes.get(tid, (None, self.tables.get(tid)))[1]
        raise SourceError(
            f"{self.where}: {cur.name if cur else tid}: transaction {p.txn_id} (TSO {describe(p.ts)}) carries field "
            f"numbers {sorted(set(unknown))} that the meta's schema (version {cur.version if cur else '?'}) does not "
            "know yet; reading it again once the meta knows them")

    def _offer(self, c: Prepared) -> None:
        """Emit a transaction, after the DDL of a schema switch it needs. The DDL
        statements take the transaction's own commit_ts as preludes (seq -k..-1), so
        a switch never needs a free commit_ts, however close the transactions."""
        sw = c.switch
        if sw is not None:
            if sw.epoch is not None and sw.at is not None and sw.from_ts is not None:
                self._apply_switch(sw, at=sw.at, from_ts=sw.from_ts)  # where it was made before
            else:
                # the position of a prelude resumes reading in front of the transaction
                self._apply_switch(sw, at=c.ts, from_ts=c.first - 1)
        self._emit_txn(c)

    def _ddl_statements(self, switches: dict[int, tuple[TableDef | None, TableDef]],
                        known_dbs: set[str] | None = None) -> list[tuple[str, str, str]]:
        """(db, table, sql) of the DDL that brings a target to the switched versions:
        CREATE DATABASE/TABLE for new tables (``create_tables``), RENAME TABLE for a
        table that was renamed, ALTER TABLE for changed columns."""
        if known_dbs is None:
            known_dbs = {d.db for d in self.tables.values()}
        out = []
        creates = sorted((d for old, d in switches.values() if old is None), key=lambda d: d.name)
        renamed = [(old, new) for old, new in switches.values() if old is not None and old.name != new.name]
        if self.cfg.create_tables:
            new_dbs = {d.db for d in creates} | {new.db for _, new in renamed}
            for db in sorted(new_dbs - known_dbs):
                out.append((db, "", f"CREATE DATABASE IF NOT EXISTS {quote_ident(db)}"))
            out += [(d.db, d.table, create_table_sql(d)) for d in creates]
        for old, new in sorted(renamed, key=lambda x: x[1].name):
            out.append((new.db, new.table, f"RENAME TABLE {qualified(old.db, old.table)} TO "
                                           f"{qualified(new.db, new.table)}"))
        for tid in sorted(switches):
            was, new = switches[tid]
            if was is not None:
                sql = alter_table_sql(was, new)
                if sql is not None:
                    out.append((new.db, new.table, sql))
        return out

    def _apply_switch(self, sw: Switch, at: int, from_ts: int) -> None:
        """Journal the switch, emit its DDL as preludes at TSO ``at``, and decode
        with the new versions from now on."""
        tables = {**self.tables, **{tid: new for tid, (_, new) in sw.changes.items()}}
        stmts = self._ddl_statements(sw.changes)
        if sw.epoch is not None:  # made again after a restart: same epoch, same statements
            epoch = sw.epoch
            self.scheduled = [x for x in self.scheduled if x[0] != epoch]
        else:
            epoch = self.journal.next_epoch()
            self.journal.write(epoch, Epoch(tables, from_ts, at))  # first: a failed write changes nothing
            self.scheduled = []  # (stale: a new switch was needed before them)
        self._emit_preludes(stmts, at, from_ts, self.epoch, epoch)
        self.tables, self.epoch = tables, epoch
        for tid, (_, new) in sw.changes.items():
            plan = self.plans.pop(-tid, None)
            self.plans[tid] = plan if plan is not None and plan.tdef is new else RowPlan(new)
            if tid in self.pending and self.pending[tid][0].version <= new.version:
                del self.pending[tid]
        self.counters["schema_switches"] += len(sw.changes)

    def _switch_at_heartbeat(self, h: int) -> None:
        """A switch due by time (committed after it was seen) with no transaction to
        carry it: made at the heartbeat, its preludes at the heartbeat's TSO."""
        journaled = self._journaled_switch(h + 1)
        if journaled is not None:
            if journaled.at is not None and journaled.at == journaled.from_ts and journaled.at <= h:
                self._apply_switch(journaled, at=journaled.at, from_ts=journaled.at)
            return  # (a switch made in front of a transaction waits for that transaction)
        due = self._due(h)
        if due:
            self._apply_switch(Switch(due), at=h, from_ts=h)

    def _emit_preludes(self, stmts: list[tuple[str, str, str]], at: int, from_ts: int, old_epoch: int,
                       new_epoch: int) -> None:
        """The statements at commit TSO ``at``, seq -k..-1. Every one but the last
        names the old epoch: a restart from between them makes the switch again and
        sends all of them again, with the same identities."""
        k = len(stmts)
        for i, (db, table, sql) in enumerate(stmts):
            last = i == k - 1
            self.counters["ddl"] += 1
            log.info("%s: DDL at TSO %d: %s", self.where, at, sql.replace("\n", " "))
            pos = self._position(from_ts, new_epoch if last else old_epoch)
            self._emit(Txn(self.name, to_commit_ts(at), pos, (), Ddl(db, sql, table, db, i - k), unix_seconds(at)))
            self.position = pos
        self.last_emitted = max(self.last_emitted, from_ts)

    def _emit_txn(self, p: Prepared) -> None:
        pos = self._position(p.ts)
        if len(p.entries) > 1:
            self.counters["multi_partition_txns"] += 1
        if hasattr(p.changes, "memory_rows"):
            self.spilled_txns += 1
        txn = Txn(self.name, to_commit_ts(p.ts), pos, p.changes, None, unix_seconds(p.ts), f"txn-{p.txn_id}")
        self._deliver(txn)
        self.last_emitted = p.ts

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
            "store_regions": {str(rid): sr.status() for rid, sr in sorted(self.stores.items())},
        })
        return d
