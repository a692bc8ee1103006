"""A PostgreSQL region: a logical replication slot read with the ``pgoutput`` plugin.

How it reads:

* **Connections.** A replication connection (``replication=database``) speaks
  the streaming replication protocol through libpq (psycopg 3's low-level
  ``pq`` API: psycopg 3 has no replication layer, and this keeps every
  status update under the region's control, which psycopg2's
  ``ReplicationCursor`` does not: it confirms positions on its own when idle).
  A second, ordinary connection checks the setup, reads keys from the catalog,
  and fills unchanged TOASTed values.
* **Setup checks** (fatal, naming what to change): ``wal_level`` must be
  ``logical``; the publication must exist (``create_publication`` creates it);
  the slot must exist (``create_slot`` creates it on a first start) and use
  ``pgoutput`` in this database; and the slot must not have been confirmed past
  the checkpoint's LSN (changes in between would be gone).
* **Whole transactions.** pgoutput sends a transaction when it commits,
  between BEGIN and COMMIT, so rolled-back work never arrives. A transaction
  is assembled (spilled to disk past ``spillRows``, like MySQL ones) and sent
  at COMMIT with ``commit_ts`` from its commit time (microseconds: the
  millisecond part is the TSO's physical part, the rest its logical part) made
  strictly increasing by the region clock. Its position is the commit's end
  LSN: a restart asks the slot for what committed after it.
* **The slot moves only behind the checkpoint.** The region confirms (status
  update ``flush``) only LSNs the capturer's checkpoint holds, so the server
  keeps every change the sinks have not acknowledged.
* **Heartbeats.** Every ``heartbeat_ms`` out of a transaction, the region reads
  the server's WAL insert position and clock on the ordinary connection and
  asks the walsender for a keepalive; once the stream has passed that position
  everything that committed before that clock minus ``heartbeat_lag_ms`` has
  arrived, and the heartbeat promises it. An idle slot's position moves with
  the keepalives (nothing is in flight there), so its WAL is released too.
* **Schemas.** Relation messages describe each table before its first change
  in a session and after it changes. The region compares them with what it
  last sent downstream (journaled in ``<checkpoint>.postgresql.<region>`` with
  the LSN they apply from) and sends MySQL DDL for the difference: CREATE
  TABLE on first sight, ALTER TABLE ADD/DROP/MODIFY COLUMN, a rename of one
  column in place (same position and type) as CHANGE COLUMN, RENAME TABLE.
  TRUNCATE goes out as TRUNCATE TABLE, in its place in the transaction.
"""

from __future__ import annotations

import logging
import re
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model import (
    Ddl,
    LsnPosition,
    TableProgress,
    Txn,
    format_lsn,
    make_ts,
    wal_record_end,
)
from capturer.model.encode import qualified, sql_literal
from capturer.regions.base import (
    ClockedRegion,
    RegionContext,
    close_quietly,
    require_start_kind,
)
from capturer.regions.postgresql import pgoutput as po
from capturer.regions.postgresql import toast
from capturer.regions.postgresql.prepare import prepare
from capturer.regions.postgresql.publication import PublicationWatch
from capturer.regions.postgresql.relations import (
    RelationJournal,
    RelDef,
    align_attnums,
    base_columns,
    ddl_for,
    quote_pg,
)
from capturer.regions.postgresql.snapshot import PgSnapshot, PgSnapshotter
from capturer.regions.postgresql.stream import PgStream
from capturer.regions.postgresql.txn import TxnBuilder, fast_change, row_image
from capturer.regions.postgresql.types import Unrepresentable, pg_time_to_unix_us
from capturer.regions.snaphost import SnapshotHostMixin
from capturer.util import fencing

log = logging.getLogger(__name__)

# fixed text forms of values on both connections (types.py parses them)
SESSION_OPTIONS = "-c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=iso_8601 -c extra_float_digits=3 " \
                  "-c bytea_output=hex"
_FEEDBACK = struct.Struct(">cQQQqB")
_TxnBuilder = TxnBuilder  # (its name here before txn.py)


def now_pg_us() -> int:
    return int(time.time() * 1_000_000) - 946_684_800_000_000


def commit_tso(pg_commit_time: int) -> int:
    """A PostgreSQL commit time (µs since 2000) as a TSO: ms in the physical part,
    the microseconds within it scaled into the logical part (order kept)."""
    us = pg_time_to_unix_us(pg_commit_time)
    return make_ts(us // 1000, (us % 1000) << 8)


class PostgresRegion(SnapshotHostMixin, ClockedRegion):
    def __init__(self, cfg: Any, ctx: RegionContext):
        # a checkpoint position of another kind is refused at start, not when the slot is first read
        require_start_kind(ctx, cfg.name, "postgresql", LsnPosition, remedy="")
        super().__init__(cfg.name, ctx)
        self.cfg = cfg
        self.where = f"region {cfg.name} (postgresql {cfg.host}:{cfg.port}/{cfg.dbname}, slot {cfg.slot})"
        self.relations = RelationJournal(self.state_file("postgresql"))
        # (commit LSN of a transaction, relid) -> the definition its relation message was given (``_reldef``)
        self.seen = RelationJournal(self.state_file("postgresql-seen"))
        self.confirmed = 0  # the LSN the slot may be confirmed to (the checkpoint's)
        self.slot_confirmed = ""  # what the server said at connect
        self.unrepresentable = 0
        self.toast_filled = 0
        self.toast_missing = 0
        self.toast_waits = 0  # transactions whose fill waited for them to become visible
        self.toast_wait_ms = 0.0  # how long those waits took, in all
        self.toast_wait_timeouts = 0  # waits given up after toast_wait_ms (the fill read anyway)
        # WAL the server keeps for the slot (insert position - restart_lsn), as the newest heartbeat probe read it
        self.slot_wal_held: int | None = None
        # the visibility of the transaction being decoded, checked once for all its fills (_await_visible)
        self._snapshot_fn = "pg_current_snapshot()"
        self._last_snap: PgSnapshot | None = None
        self._xid_checked: int | None = None
        self.ddl_sent = 0
        self._warned: set[tuple[str, str]] = set()
        self.rels_known: dict[int, RelDef] = {}  # relid -> the definition the targets were given
        self.pubwatch = PublicationWatch(self)  # tables added to the publication: copied live
        self._side: Any = None
        self._repl: Any = None
        self._block, self._segment = 8192, 16 << 20  # WAL page and segment sizes (read at connect)
        self._init_snapshot_host(ctx.start.snapshot if isinstance(ctx.start, LsnPosition) else ())
        # transaction id -> commit end LSN of the newest ones delivered (a snapshot chunk checks that
        # what the stream delivered before it began is visible to its read: snapshot.py)
        self._recent_xids: dict[int, int] = {}
        try:
            import psycopg
        except ImportError:
            raise FatalSourceError(f"{self.where}: PostgreSQL regions need psycopg 3: pip install 'psycopg[binary]' "
                                   "(the project's 'postgresql' extra; start.sh installs it)") from None
        # a broken connection (a server restart, a network cut) is retried from the last position
        self.RETRYABLE = (SourceError, OSError, psycopg.OperationalError)

    RETRYABLE: tuple[type[BaseException], ...] = (SourceError, OSError)

    # --- connections ------------------------------------------------------------
    def _conninfo(self, replication: bool) -> str:
        from psycopg.conninfo import make_conninfo

        kw: dict[str, Any] = {"host": self.cfg.host, "port": self.cfg.port, "user": self.cfg.user,
                                  "dbname": self.cfg.dbname, "connect_timeout": max(1, int(self.cfg.connect_timeout)),
                                  "application_name": f"capturer-{self.name}"[:63], "options": SESSION_OPTIONS,
                                  "client_encoding": "UTF8",
                                  "sslmode": self.cfg.sslmode}
        if self.cfg.password:
            kw["password"] = self.cfg.password
        if replication:
            kw["replication"] = "database"
        return make_conninfo("", **kw)

    def conninfo(self) -> str:
        """The ordinary connection's settings (snapshot readers use them too)."""
        return self._conninfo(False)

    def _query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            with self._side.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description else []
        except psycopg.OperationalError as exc:
            raise SourceError(f"{self.where}: {exc}".strip()) from None

    def _connect_side(self) -> None:
        import psycopg

        try:
            self._side = psycopg.connect(self._conninfo(False), autocommit=True)
        except psycopg.OperationalError as exc:
            raise SourceError(f"{self.where}: cannot connect: {str(exc).strip()}") from None

    def _after_attempt(self) -> None:
        close_quietly(self._repl, self._side)
        self._repl = self._side = None

    # --- setup ------------------------------------------------------------------
    def _prepare(self) -> int:
        """Check the server, publication and slot; the LSN to start after (prepare.py)."""
        return prepare(self)

    def _keys(self, relid: int, cols: tuple[po.Column, ...], replident: str,
              query: Any = None) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
        names = {c.name for c in cols}
        rows = (query or self._query)(
            "SELECT i.indisprimary, array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i "
            "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL "
            "GROUP BY i.indexrelid, i.indisprimary ORDER BY i.indisprimary DESC, i.indexrelid", (relid,))
        pk: tuple[str, ...] = ()
        uks: list[tuple[str, ...]] = []
        for primary, keycols in rows:
            kc = tuple(keycols)
            if not all(c in names for c in kc):
                continue
            if primary:
                pk = kc
            else:
                uks.append(kc)
        flagged = tuple(c.name for c in cols if c.key)
        if replident in ("d", "i") and flagged and set(flagged) != set(pk):
            # the replica identity is the key the log carries (the catalog's order when the same columns)
            if pk:
                uks.insert(0, pk)
            pk = next((u for u in uks if set(u) == set(flagged)), flagged)
        uks = [u for u in uks if u != pk]
        return pk, tuple(uks)

    # --- the stream --------------------------------------------------------------
    def _connect_and_stream(self) -> None:
        from psycopg import pq

        self.state = "connecting"
        self._connect_side()
        start = self._prepare()
        with self._lock:
            self._apply_requests()
            if not isinstance(self.position, LsnPosition) or self.position.lsn != start:
                self.position = LsnPosition(start, self.snap_progress)
            self._restamp()
        self.confirmed = max(self.confirmed, start)
        conn = pq.PGconn.connect(self._conninfo(True).encode())
        self._repl = conn
        if conn.status != pq.ConnStatus.OK:
            raise SourceError(f"{self.where}: replication connection: "
                              f"{conn.error_message.decode('utf-8', 'replace').strip()}")
        pubs = "'" + quote_pg(self.cfg.publication).replace("'", "''") + "'"
        cmd = (f"START_REPLICATION SLOT {quote_pg(self.cfg.slot)} LOGICAL {format_lsn(start)} "
               f"(proto_version '1', publication_names {pubs})")
        res = conn.exec_(cmd.encode())
        if res.status != pq.ExecStatus.COPY_BOTH:
            msg = (res.error_message or b"").decode("utf-8", "replace").strip()
            if "does not exist" in msg and "publication" in msg:
                raise FatalSourceError(f"{self.where}: {msg}")
            held = re.search(r"is active for PID (\d+)", msg)
            if held and fencing.GUARD.armed and not fencing.GUARD.lost and fencing.GUARD.remaining() > 0:
                # high availability: a deposed capturer (paused, cut off) still holds the slot; the lease is
                # this one's, so its replication connection goes (else it would hold until wal_sender_timeout)
                self._query("SELECT pg_terminate_backend(%s)", (int(held.group(1)),))
                log.warning("%s: replication slot %r was held by backend %s (a capturer that lost its lease): "
                            "terminated", self.where, self.cfg.slot, held.group(1))
            raise SourceError(f"{self.where}: START_REPLICATION: {msg}")
        log.info("%s: streaming from %s", self.where, format_lsn(start))
        self.pubwatch.start()
        self._stream(conn, start)

    def _send_status(self, conn: Any, received: int, reply: bool = False) -> None:
        flush = self.confirmed
        msg = _FEEDBACK.pack(b"r", max(received, flush), flush, flush, now_pg_us(), 1 if reply else 0)
        if conn.put_copy_data(msg) != 1 or conn.flush() != 0:
            raise SourceError(f"{self.where}: cannot send a status update to the server")

    def _stream(self, conn: Any, start: int) -> None:
        self.rels_known = self.relations.state_at(start)  # what the targets were given
        stream = PgStream(self, conn, start)
        self.state = "streaming"
        with self._lock:
            self._alive(self.position)
        stream.run()

    def _record_boundary(self, insert_lsn: int) -> int:
        """The insert position as the end of the last record (``wal_record_end``)."""
        return wal_record_end(insert_lsn, self._block, self._segment)

    def _reldef(self, m: po.Relation, since: int = 0) -> RelDef:
        """The definition of relation message ``m`` (of the transaction committed at ``since``). Its
        columns' attnums come from the catalog as it is now (``align_attnums``), which may be later than
        the message; a transaction read again (after a kill -9 or a reconnection) gets what its message
        was given the first time (``seen``, journaled at its commit): read again against a newer catalog,
        a message sent before a column was dropped and added again under its name took the new column's
        attnum, its DROP and ADD went out with that transaction (before rows that still had the old
        column's values) and the transaction's rows under new identities (sent again), and the later
        transaction that did see the new column sent no DDL."""
        pk, uks = self._keys(m.relid, m.columns, m.replident)
        rel = RelDef(m.relid, m.namespace, m.name, m.replident, base_columns(self._query, m.columns), pk, uks)
        then = self.seen.lookup((since, m.relid)) if since else None
        if then is not None and then.attnums and then.same_shape(rel):
            attnums = then.attnums
        else:
            # (generated columns: never in a relation message, as if they were not there)
            catalog = self._query("SELECT attnum, attname::text, attisdropped, atttypid FROM pg_attribute WHERE "
                                  "attrelid = %s AND attnum > 0 AND attgenerated = '' ORDER BY attnum", (m.relid,))
            # (the definition before: aligned closer to the message's time, it decides between alignments)
            attnums = align_attnums(m.columns, [(int(n), str(a), bool(d), int(t)) for n, a, d, t in catalog],
                                    self.rels_known.get(m.relid))
        rel = RelDef(rel.relid, rel.db, rel.table, rel.replident, rel.columns, pk, uks, attnums)
        if uks and m.replident != "f" and (rel.db, rel.table) not in self._warned:
            self._warned.add((rel.db, rel.table))
            log.warning("%s: table %s.%s has unique keys besides its primary key but REPLICA IDENTITY %s: old values "
                        "of those keys are not in the log, so conflicts on them cannot be detected downstream; "
                        "ALTER TABLE ... REPLICA IDENTITY FULL fixes that", self.where, rel.db, rel.table,
                        {"d": "DEFAULT", "i": "USING INDEX", "n": "NOTHING"}.get(m.replident, m.replident))
        return rel

    def _heartbeat(self, clock_ms: int, observed: int) -> None:
        with self._lock:
            self._apply_requests()
            if self.position is None or observed > self.position.lsn:
                self.position = LsnPosition(observed, self.snap_progress)
            self.last_source_time = max(self.last_source_time, clock_ms / 1000.0)
            self._clock_heartbeat(clock_ms - self.cfg.heartbeat_lag_ms, self.position)
            self._lock.notify_all()

    def _commit(self, b: TxnBuilder, c: po.Commit) -> None:
        parts = b.finish()
        unix_us = pg_time_to_unix_us(c.commit_time)
        source_s = unix_us // 1_000_000
        with self._lock:
            self._apply_requests()
            end = LsnPosition(c.end_lsn, self.snap_progress)
            self.clock.at(end)  # (items a run before a crash inserted before this point raised the clock)
            self.seen.put_many(((b.begin.final_lsn, r.relid), r) for r in b.seen_relations)
            for lsn_rel in b.new_relations:
                self.relations.record(c.end_lsn, lsn_rel)
                # a chunk of it described before reads again (its columns may have changed)
                self._note_ddl_key((lsn_rel.db.lower(), lsn_rel.table.lower()), (c.end_lsn,))
            if not parts:  # nothing selected: the position moves on, behind a heartbeat
                self._alive(end)
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                ts = self.clock.commit(int(source_s), end, commit_tso(c.commit_time)) if i == 0 else self.clock.next()
                pos = end if last else (self.position or LsnPosition(0, self.snap_progress))
                if isinstance(part, Ddl):
                    txn = Txn(self.name, ts, pos, (), part, int(source_s))
                    self.ddl_sent += 1
                    if part.table:  # a TRUNCATE: a chunk read before it must not bring its rows back
                        self._note_ddl_key((part.db.lower(), part.table.lower()), (c.end_lsn,))
                else:
                    txn = Txn(self.name, ts, pos, part, None, int(source_s))
                    self.rows += len(part)
                    if self.recorders:
                        self._record(Txn(self.name, ts, end, part, None, 0), b.begin.xid)
                self._emit(txn)
                self.last_commit_ts = ts
            self.position = end
            self._recent_xids[b.begin.xid] = c.end_lsn
            if len(self._recent_xids) > 100_000:
                for x in list(self._recent_xids)[:25_000]:
                    del self._recent_xids[x]
            self._lock.notify_all()
        self.txns += 1
        self.last_source_time = unix_us / 1e6

    def _extra_ts(self) -> int:
        """(under the lock) The commit_ts of an item the region inserts where timing
        decides (a snapshot chunk, a table copy's CREATE/TRUNCATE): above everything
        it ever sent (``RegionClock.extra``), at this machine's clock."""
        return self.clock.extra(int(time.time() * 1000) + 1, self.position)

    # --- snapshots (capturer/regions/postgresql/snapshot.py) ----------------------
    def _pkey(self, pos: Any) -> tuple[Any, ...]:
        return (pos.lsn,)

    def _stamped(self, pos: Any, progress: tuple[TableProgress, ...]) -> LsnPosition:
        return LsnPosition(pos.lsn, progress)

    @property
    def snap_method(self) -> str:
        return "xid"

    def _new_snapshotter(self) -> Any:
        return PgSnapshotter(self, self.cfg.snapshot_workers, self.cfg.snapshot_chunk_rows)

    def _start_statements(self, plan: Any, create: Any, truncate: bool) -> list[tuple[str, str, str]]:
        """A table's run starts with its definition as the stream would have sent it
        (recorded as sent, so the stream does not send it again), and its TRUNCATE."""
        stmts: list[tuple[str, str, str]] = []
        rel = create
        if isinstance(rel, RelDef):
            known = self.rels_known.get(rel.relid)
            if known is None or not known.same_shape(rel):
                if self.cfg.ddl:
                    stmts += ddl_for(known, rel)
                self.rels_known[rel.relid] = rel
                at = self.position.lsn if isinstance(self.position, LsnPosition) else 0
                self.relations.record(at, rel)
            elif self.cfg.ddl:
                # known to the stream, but maybe never sent (the filter left the table out until a
                # reload added it): its CREATE ... IF NOT EXISTS again, as a MySQL region's copy starts
                stmts += ddl_for(None, rel)
        if truncate:
            stmts.append((plan.db, f"TRUNCATE TABLE {qualified(plan.db, plan.table)}", plan.table))
        return stmts

    def record_boundary(self, insert_lsn: int) -> int:
        return self._record_boundary(insert_lsn)

    def delivered_unseen(self, snap: Any, low: tuple[Any, ...]) -> bool:
        """Whether a transaction the stream delivered at or before ``low`` is not visible
        to snapshot ``snap`` (its commit record written, the transaction not visible yet:
        in the snapshot's in-progress list, or at or past its xmax when no transaction
        completed after it, e.g. every commit held by a synchronous standby)."""
        with self._lock:
            delivered = list(self._recent_xids.items())  # (copied: checked outside the emission lock)
        lsn = low[0] if low else 0
        lo = snap.xmin & 0xFFFFFFFF  # (below the snapshot's xmin every transaction is visible: skipped cheaply)
        return any(at <= lsn and ((x - lo) & 0xFFFFFFFF) < 0x80000000 and not snap.visible(x) for x, at in delivered)

    def catalog_reldef(self, query: Any, db: str, table: str) -> RelDef | None:
        """A table's definition from the catalog, as its relation message would give it
        (columns, their replica-identity flags, keys); None if it is not a table."""
        rows = query("SELECT c.oid, c.relreplident::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                     "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')", (db, table))
        if not rows:
            return None
        relid, ident = int(rows[0][0]), str(rows[0][1])
        keyset: set[int] = set()
        if ident in ("d", "i"):
            got = query("SELECT indkey::int2[] FROM pg_index WHERE indrelid = %s AND "
                        + ("indisprimary" if ident == "d" else "indisreplident"), (relid,))
            keyset = {int(x) for x in got[0][0]} if got else set()
        # (generated columns: pgoutput leaves them out of its relation messages and rows)
        cols = query("SELECT attnum, attname::text, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s AND "
                     "attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum", (relid,))
        columns = tuple(po.Column(str(name), int(oid), int(mod), ident == "f" or int(num) in keyset)
                        for num, name, oid, mod in cols)
        pk, uks = self._keys(relid, columns, ident, query)
        columns = base_columns(query, columns)
        return RelDef(relid, db, table, ident, columns, pk, uks, tuple(int(c[0]) for c in cols))

    def _forget_start(self) -> None:
        """(when_needed) The checkpoint's position is of no use: start over."""
        with self._lock:
            self.position = None
            self.snap_progress = ()
            self._snap_gen += 1  # chunks in flight were read against the old stream

    def _start_snapshot(self, fresh: bool, at: int = 0, truncate: bool = False) -> None:
        """On a first start (``fresh``) with snapshot=initial/when_needed: every table
        of the publication the filter selects (``truncate``: each emptied downstream
        first), from ``at``; on a restart: the snapshot in progress in the checkpoint."""
        if fresh:
            published = self._published()
            tables = sorted(published)
            cut = [t for t in tables if truncate or published[t]]
            self.refuse_outside_peers(cut, truncate)
            run = uuid.uuid4().hex[:12]
            progress = tuple(TableProgress(db, t, run, truncate=truncate) for db, t in tables)
            start = LsnPosition(at, progress)
            # durable before anything is emitted: a crash before the first checkpoint resumes
            # this run from this position (so changes made meanwhile are delivered)
            self.ctx.pin_start(self.name, start)
            with self._lock:
                self.snap_progress = progress
                self.position = start
                self._apply_requests()
            log.info("%s: snapshot=%s: copying %d table(s)%s while reading the slot from %s", self.where,
                     self.cfg.snapshot, len(tables), " (each emptied downstream first)" if truncate else "",
                     format_lsn(at))
        with self._snap_lock:
            if fresh or self.snapshotter is None:
                with self._lock:
                    self._apply_requests()
                    pending = tuple(p for p in self.snap_progress if p.state in ("pending", "running"))
                if pending:
                    if self.snapshotter is None:
                        self.snapshotter = self._new_snapshotter()
                    self.snapshotter.load(pending)

    def check_snapshot_support(self) -> None:
        """(every PostgreSQL server this region reads can be copied)"""

    def request_snapshot(self, tables: list[tuple[str, str]], truncate: bool) -> str:
        return self.start_snapshot_request(tables, truncate)

    def _on_exit(self) -> None:
        if self.snapshotter is not None:
            self.snapshotter.close()

    # --- values -------------------------------------------------------------------
    # (functions of their modules, called as methods: row images and the fast path in txn.py, the TOAST fill in
    # toast.py)
    image = row_image
    _fast_change = fast_change
    _await_visible = toast.await_visible
    fill_toast = toast.fill_toast

    def added_defaults(self, old: RelDef, new: RelDef) -> dict[str, str]:
        """For columns ``new`` adds: the value rows already there have (PostgreSQL's
        "missing value" of a column added with a constant default), as a SQL literal."""
        have = {c.name for c in old.columns}
        olds = {n for n in old.attnums if n}
        out: dict[str, str] = {}
        for c, t, num in zip(new.columns, new.types, new.attnums or (0,) * len(new.columns)):
            if (num in olds) if num and olds else c.name in have:
                continue
            # (by its attnum where known: the column may have been renamed since the message was sent)
            where = "attnum = %s" if num else "attname = %s"
            try:
                got = self._query("SELECT (attmissingval::text::text[])[1] FROM pg_attribute WHERE attrelid = %s "
                                  f"AND {where} AND atthasmissing", (new.relid, num or c.name))
            except SourceError:
                raise
            except Exception:
                got = []
            if got and got[0][0] is not None:
                try:
                    out[c.name] = sql_literal(t.parse(got[0][0]), t.code)
                except (Unrepresentable, ValueError):
                    pass
        return out

    def tables_info(self, tables: list[tuple[str, str]]) -> dict[tuple[str, str], bool]:
        """Which of ``tables`` (schema, table) this region captures (in its publication and
        selected by the filter), each with whether it has no primary key."""
        tables = [t for t in tables if self.ctx.table_selected(*t)]
        if not tables:
            return {}
        want = set(tables)
        return {k: v for k, v in self._published().items() if k in want}

    def source_tables(self, selected: Callable[[str, str], bool]) -> list[tuple[str, str]]:
        """The publication's tables that ``selected`` chooses (the rules of a filter
        about to be loaded: which tables a reload adds)."""
        import psycopg

        try:
            with psycopg.connect(self._conninfo(False), autocommit=True) as c:
                rows = c.execute("SELECT schemaname::text, tablename::text FROM pg_publication_tables "
                                 "WHERE pubname = %s", (self.cfg.publication,)).fetchall()
        except psycopg.Error as exc:
            raise SourceError(f"{self.where}: cannot list tables: {str(exc).strip()}") from None
        return sorted((str(db), str(t)) for db, t in rows if selected(str(db), str(t)))

    def _published(self) -> dict[tuple[str, str], bool]:
        """Every table of the publication the filter selects, each with whether it has
        no primary key."""
        import psycopg

        try:
            with psycopg.connect(self._conninfo(False), autocommit=True) as c:
                rows = c.execute(
                    "SELECT t.schemaname::text, t.tablename::text, NOT EXISTS (SELECT 1 FROM pg_index i WHERE "
                    "i.indrelid = format('%%I.%%I', t.schemaname, t.tablename)::regclass AND i.indisprimary) "
                    "FROM pg_publication_tables t WHERE t.pubname = %s", (self.cfg.publication,)).fetchall()
        except psycopg.Error as exc:
            raise SourceError(f"{self.where}: cannot list tables: {str(exc).strip()}") from None
        return {(str(db), str(t)): bool(keyless) for db, t, keyless in rows if self.ctx.table_selected(str(db), str(t))}

    def heartbeat_note(self) -> str:
        held = "" if self.slot_wal_held is None else f", the server keeps {self.slot_wal_held / 1048576:.1f} MiB of WAL for it"
        return f"; slot {self.cfg.slot} confirmed to {format_lsn(self.confirmed) if self.confirmed else '-'}{held}"

    def checkpointed(self, position: Any) -> None:
        if isinstance(position, LsnPosition):
            self.confirmed = max(self.confirmed, position.lsn)
            self.relations.prune(position.lsn)
            self.seen.forget(lambda entries: [k for k in entries if k[0] < position.lsn])

    def status(self) -> dict[str, Any]:
        d = super().status()
        d.update({
            "kind": "postgresql",
            "slot": self.cfg.slot,
            "publication": self.cfg.publication,
            "confirmed_lsn": format_lsn(self.confirmed) if self.confirmed else "",
            "slot_wal_held_bytes": self.slot_wal_held,
            "unrepresentable_values": self.unrepresentable,
            "toast_filled": self.toast_filled,
            "toast_missing": self.toast_missing,
            "toast_waits": self.toast_waits,
            "toast_wait_ms": round(self.toast_wait_ms, 1),
            "toast_wait_timeouts": self.toast_wait_timeouts,
            "ddl_sent": self.ddl_sent,
            "publication_watch": self.pubwatch.status(),
        })
        snap = self.snapshot_status()
        if snap is not None:
            d["snapshot"] = snap
        return d
