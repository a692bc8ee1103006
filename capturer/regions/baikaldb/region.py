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

Here: the region's state, the schemas in use, the merge and what leaves it
(transactions, schema switches' DDL, heartbeats). Beside it: ``discovery``
(the meta: binlog table, linked tables, regions, starts, the background
refresh), ``reader`` (one binlog region's reader thread), ``decode`` (a
transaction's parts -> row changes and the switch it needs), ``epochs`` (the
schema journal, switches and their DDL).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from capturer.errors import SourceError
from capturer.model import Ddl, TsPosition, Txn, protogen
from capturer.regions.baikaldb import discovery, reader
from capturer.regions.baikaldb.client import MetaClient, PeerFailure, StoreRegionInfo
from capturer.regions.baikaldb.decode import Prepared, journaled_switch, prepare
from capturer.regions.baikaldb.epochs import Epoch, SchemaJournal, Switch, ddl_statements
from capturer.regions.baikaldb.rows import Entry, RowPlan
from capturer.regions.baikaldb.schema import TableDef
from capturer.regions.baikaldb.tso import describe, from_unix_ms, to_commit_ts, unix_ms, unix_seconds
from capturer.regions.base import Region, RegionContext, require_start_kind
from capturer.util.bqueue import WeightedQueue

log = logging.getLogger(__name__)

# parts of one transaction across partitions have commit_ts from one TSO batch
JOIN_GAP = 64


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
        discovery.discover(self)
        self._stream()

    def _on_exit(self) -> None:
        self.meta.close()

    def checkpointed(self, position: Any) -> None:
        if isinstance(position, TsPosition) and position.epoch:
            self.journal.prune(position.epoch)

    # --- discovery (discovery.py) and the schemas in use ------------------------
    def _now_tso(self, meta: MetaClient | None = None) -> int:
        tso = (meta or self.meta).gen_tso()
        return tso if tso else from_unix_ms(int(time.time() * 1000))

    def _linked(self, meta: MetaClient | None = None) -> tuple[Any, dict[int, TableDef], int]:
        """(the binlog table's SchemaInfo, the source tables linked to it, the partitions)."""
        return discovery.linked(self, meta)

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
        switch happens in stream order (``decode.prepare``). A version never goes back:
        a meta follower that lags answers with older schemas, which are ignored."""
        for tid, d in defs.items():
            if d.version <= self._newest_version(tid):
                continue
            cur = self.tables.get(tid)
            self.pending[tid] = (d, obs)
            log.info("%s: %s: schema version %s -> %d seen at TSO %s", self.where, d.name,
                     cur.version if cur else "new table", d.version, describe(obs))

    def _first_ddl(self, at: int) -> None:
        """CREATE DATABASE / TABLE IF NOT EXISTS for every source table, as preludes
        at TSO ``at`` (the start). All but the last name epoch 0 ("the first start is
        not done"), so a restart from between them sends them all again, the same."""
        if not self.cfg.create_tables:
            return
        stmts = ddl_statements({tid: (None, d) for tid, d in self.tables.items()}, self.tables,
                               self.cfg.create_tables, set())
        self._emit_preludes(stmts, at, at, 0, self.epoch)

    def _position(self, ts: int, epoch: int | None = None) -> TsPosition:
        return TsPosition(ts, tuple(sorted(self._starts.items())), self.epoch if epoch is None else epoch)

    # --- reading (a reader thread per binlog region: reader.py) --------------------
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
            t = threading.Thread(target=reader.fetch, args=(self, sr, q, wake, stop, start), daemon=True,
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
                            self._starts[rid] = discovery.new_region_start(self, self.stores[rid], resume)
                            add(rid)
                if time.monotonic() - self._last_refresh > self.cfg.schema_refresh:
                    discovery.start_refresh(self)
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

    def _on_new_regions(self, infos: list[Any]) -> None:
        with self._lock:
            self._new_regions.extend(infos)

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
            self._offer(prepare(self, [g[0] for g in group]))
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

    # --- transactions (decoded in decode.py) and schema switches ----------------
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

    def _apply_switch(self, sw: Switch, at: int, from_ts: int) -> None:
        """Journal the switch, emit its DDL as preludes at TSO ``at``, and decode
        with the new versions from now on."""
        tables = {**self.tables, **{tid: new for tid, (_, new) in sw.changes.items()}}
        stmts = ddl_statements(sw.changes, self.tables, self.cfg.create_tables)
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
        journaled = journaled_switch(self, h + 1)
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
