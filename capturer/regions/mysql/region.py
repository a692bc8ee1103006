"""A MySQL/MariaDB region: the row-based binlog over the replication protocol.

Reads with python-mysql-replication from a ``(file, pos)`` at a transaction
boundary (the library's MySQL dump path: with ``is_mariadb=True`` it would
ignore ``log_file/log_pos``), assembles whole committed transactions (GTID ...
XID or COMMIT), and emits them with a commit_ts from ``RegionClock``. While
idle the server sends heartbeat events every ``heartbeat_ms``; each becomes a
``Heartbeat`` so that the merge never stalls. Rolled-back InnoDB work is never
written to the binlog, so it never leaves the region.

Each position carries the source's GTID state (``gtid.py``). With ``replicas``
configured the region reads the primary (``read_only=OFF``) among its servers;
on a server whose binlog is not the position's (a promoted replica, a moved VIP)
it starts the dump from that GTID state instead (``auto_position``), or stops
with an error naming the server and the GTIDs when the server does not hold
them (docs/regions-mysql.md#failover).

The setup at each connect (where to read from) is prepare.py; the servers, GTIDs
and failovers failover.py; the events and rows events made row changes binlog.py.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from capturer.errors import FatalSourceError, SourceError
from capturer.model import Ddl, Position, PreparedXa, RowChange, TableProgress, TableSchema, Txn
from capturer.model.ddl import ddl_target, is_data_ddl, is_ignorable, names_several_tables
from capturer.model.encode import qualified, quote_ident
from capturer.regions.base import ClockedRegion, RegionContext, close_quietly, require_start_kind
from capturer.regions.clock import RegionClock
from capturer.regions.mysql import failover, prepare, tablemap, versioning, xa
from capturer.regions.mysql.binlog import (
    COMPRESSED_EVENTS,
    EVENTS,
    TxnAssembler,
    column_info,
    compressed_event_error,
    fast_changes,
    group_start,
    library_changes,
    pad_binary,
    savepoint_statement,
    xa_decision,
    xid_key,
)
from capturer.regions.mysql.gtid import GtidTracker
from capturer.regions.mysql.keys import RegionConfig
from capturer.regions.mysql.rowdecode import fast_rows
from capturer.regions.mysql.snapshot import MySQLSnapshotter, base_tables, index_rows, promote_key
from capturer.regions.snaphost import SnapshotHostMixin
from capturer.regions.snapshot import Snapshotter
from capturer.regions.snapshot_plan import TablePlan
from capturer.util import failpoints, mysqlconn

log = logging.getLogger(__name__)


class MySQLRegion(SnapshotHostMixin, ClockedRegion):
    # always a binlog position: make_region refuses a checkpoint's position of another kind
    position: Position | None
    # (set up by ClockedRegion) the snapshot's items take their commit_ts from it too: extra(), next()
    clock: RegionClock

    def __init__(self, cfg: RegionConfig, ctx: RegionContext):
        require_start_kind(ctx, cfg.name, cfg.type, Position)
        super().__init__(cfg.name, ctx)
        # the configured servers: host first, then the replicas (failover, docs/regions-mysql.md#failover);
        # self.cfg is the configuration as applied to the server read now (its host and port)
        self.config = cfg
        self.servers = [(cfg.host, cfg.port)] + [(h.rsplit(":", 1)[0].strip("[]"), int(h.rsplit(":", 1)[1]))
                                                 for h in cfg.replicas]
        self.cfg = cfg
        self.where = f"region {cfg.name} ({cfg.host}:{cfg.port})"
        self.mariadb = True  # the server's flavour (MariaDB GTIDs, or MySQL GTID sets), known once connected
        self.gtid = GtidTracker(True)  # the GTID state of the stream (Position.gtid)
        self._gtid_start = ""  # set: the stream starts from this GTID state (on a server the file:pos is not of)
        self._server_seen: tuple[str, int, str] | None = None  # (host, port, server identity) last read
        self.failovers: list[dict[str, Any]] = []  # the last changes of server: when, from, to, at which GTIDs
        self.failover_count = 0
        self._clock_offset_ms = 0.0
        self._schemas: dict[tuple[str, str, tuple[str, ...]], TableSchema] = {}
        self._ukeys: dict[tuple[str, str], tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = {}
        # system-versioned tables (versioning.py): a table definition's current-rows schema and period columns
        self._current: dict[tuple[str, str, tuple[str, ...]], tuple[TableSchema, str, str] | None] = {}
        self._meta: pymysql.connections.Connection | None = None
        self.fast_events = 0
        self.library_events = 0
        # XA transactions prepared and not decided yet: their rows, held until XA COMMIT or XA ROLLBACK (xa.py)
        self.xa = xa.Prepared()
        self.xa_unknown = 0  # decisions on XA transactions prepared before the region could read them
        self._init_snapshot_host(ctx.start.snapshot if isinstance(ctx.start, Position) else ())
        self._snap_method = ""  # resolved snapshot_method (consistent | watermark), once the server is known
        # the server snapshot chunks are read on: the one the stream settled on (set with the snapshot
        # generation, under the lock; self.cfg also moves while _connect_primary tries the servers)
        self._snap_cfg: RegionConfig | None = None
        self._snap_seen: tuple[str, int, str] | None = None

    # --- connection ---------------------------------------------------------
    def _conn_settings(self) -> dict[str, Any]:
        return {
            "host": self.cfg.host,
            "port": self.cfg.port,
            "user": self.cfg.user,
            "passwd": self.cfg.password,
            "connect_timeout": self.cfg.connect_timeout,
            "read_timeout": max(30.0, self.cfg.heartbeat_ms / 1000 * 20),
            **self.cfg.tls(),
        }

    def _connect(self) -> pymysql.connections.Connection:
        try:
            return mysqlconn.connect(
                host=self.cfg.host, port=self.cfg.port, user=self.cfg.user,
                password=self.cfg.password, charset="utf8mb4", autocommit=True,
                connect_timeout=self.cfg.connect_timeout, read_timeout=30,
                sql_mode="",  # SHOW CREATE TABLE and parameters read the same whatever the server's mode
                **self.cfg.tls(),
            )
        except pymysql.err.OperationalError as exc:
            code = exc.args[0] if exc.args else 0
            tls = mysqlconn.explain_tls(exc, f"{self.where} [region:{self.name}]", self.cfg.ssl_mode, self.cfg.ssl_ca)
            if tls is not None:
                raise FatalSourceError(tls) from None  # (a wrong CA or mode does not heal by retrying)
            if code in (1045, 1044):  # access denied
                raise FatalSourceError(f"{self.where}: {exc.args[1]}") from None
            raise SourceError(f"{self.where}: cannot connect: {exc}") from exc

    # where to read from, checked at each connect (prepare.py)
    _prepare = prepare.prepare
    _binlog_end = prepare.binlog_end_at

    # --- servers, GTIDs and failover (failover.py) ------------------------------
    _use_server = failover.use_server
    _connect_primary = failover.connect_primary
    _identify = failover.identify
    _gtid_at = failover.gtid_at
    _start_gtid = failover.start_gtid
    _gtid_problem = failover.gtid_problem
    _note_server = failover.note_server
    # a snapshot across a change of server: its chunks read where the stream reads
    _settle_snapshot_server = failover.settle_snapshot_server
    _rebase = failover.rebase
    snapshot_server = failover.snapshot_server

    # --- table metadata -----------------------------------------------------
    def _keys_from_server(self, db: str, table: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
        """(primary key, unique keys) from SHOW INDEX, cached until a DDL. A table
        without a primary key is keyed by its first NOT NULL unique key in the
        server's order, as InnoDB itself does (``promote_key``, shared with snapshots)."""
        key = (db, table)
        if key in self._ukeys:
            return self._ukeys[key]
        try:
            if self._meta is None:
                self._meta = self._connect()
            with self._meta.cursor() as cur:
                cur.execute(f"SHOW INDEX FROM {qualified(db, table)}")
                rows = index_rows(list(cur.fetchall()))
        except (pymysql.err.MySQLError, SourceError) as exc:
            log.warning("%s: cannot read keys of %s.%s: %s", self.where, db, table, exc)
            self._meta = None
            rows = []
        pk, uk_list = promote_key(rows)
        res = (pk, uk_list)
        self._ukeys[key] = res
        return res

    def _forget(self, db: str, table: str, sql: str) -> None:
        """Drop cached table metadata after a DDL: of that table, of a whole
        database, or everything when the statement renames (it names two tables)."""
        if not db or names_several_tables(sql):  # (a RENAME after a newline or a tab too)
            self._schemas.clear()
            self._ukeys.clear()
            self._current.clear()
            return
        caches: tuple[dict[Any, Any], ...] = (self._schemas, self._ukeys, self._current)
        for cache in caches:
            for k in [k for k in cache if k[0] == db and (not table or k[1] == table)]:
                del cache[k]

    def _schema(self, ev: Any) -> TableSchema:
        cols = tuple(c.name for c in ev.columns)
        key = (ev.schema, ev.table, cols)
        s = self._schemas.get(key)
        if s is None:
            pk_raw = ev.primary_key
            pk: tuple[str, ...]
            if isinstance(pk_raw, str):
                pk = (pk_raw,) if pk_raw else ()
            else:
                pk = tuple(pk_raw or ())
            srv_pk, uks = self._keys_from_server(ev.schema, ev.table)
            if not pk:
                pk = tuple(c for c in srv_pk if c in cols)
            elif len(pk) > 1 and sorted(pk) == sorted(srv_pk):
                # the key's own column order: the library flags a table map's key columns in the
                # table's column order, while a snapshot (and SHOW INDEX) name them in the key's
                # order; one table's changes must carry one key order (a consumer keys rows by it)
                pk = tuple(srv_pk)
            uks = tuple(u for u in uks if all(c in cols for c in u))
            info = column_info(ev.columns)
            s = TableSchema(ev.schema, ev.table, cols, pk, uks, tuple(c.type for c in ev.columns), info)
            self._schemas[key] = s
        return s

    # --- the loop -----------------------------------------------------------
    RETRYABLE = (SourceError, pymysql.err.MySQLError, OSError, EOFError, struct.error)

    def _on_exit(self) -> None:
        if self.snapshotter is not None:
            self.snapshotter.close()

    def _after_attempt(self) -> None:
        close_quietly(self._meta)  # (opened on demand for table keys)
        self._meta = None

    def _connect_and_stream(self) -> None:
        start = self._prepare()
        self.position = start
        xa.restore(self, start)  # the XA transactions prepared before start and not decided there
        self._stream(start)

    def _source_now_ms(self) -> int:
        """The source's clock now, minus the heartbeat lag: what a heartbeat promises."""
        return int(time.time() * 1000 + self._clock_offset_ms) - self.cfg.heartbeat_lag_ms

    def _extra_ts(self) -> int:
        """(under the lock) The commit_ts of an item the region inserts where timing
        decides (snapshot rows, a table copy's CREATE/TRUNCATE): above everything the
        region ever sent, also by a process before a crash (``RegionClock.extra``):
        the source's clock itself (not minus the heartbeat lag) and a millisecond
        more. Everything sent before was at most the source's clock when it was sent:
        a transaction's source second plus a counter (below 2^18 per second, one
        millisecond's worth), a heartbeat's promise, a lift above them."""
        return self.clock.extra(int(time.time() * 1000 + self._clock_offset_ms) + 1, self.position)

    def _heartbeat(self, here: Position | None = None) -> None:
        now_ms = self._source_now_ms()
        with self._lock:
            self._apply_requests()
            if here is not None and (self.position is None or (here.file, here.pos) > (self.position.file,
                                                                                       self.position.pos)):
                self.position = Position(here.file, here.pos, here.gtid, self.snap_progress, here.xa)
            self._clock_heartbeat(now_ms, self.position)
            self._lock.notify_all()

    def status(self) -> dict[str, Any]:
        d = super().status()
        d["server"] = f"{self.cfg.host}:{self.cfg.port}"
        d["servers"] = [f"{h}:{p}" for h, p in self.servers]
        d["gtid"] = self.gtid.state
        d["failovers"] = self.failover_count
        d["failover_history"] = list(self.failovers)
        d["xa_prepared"] = len(self.xa)
        d["xa_unknown"] = self.xa_unknown
        snap = self.snapshot_status()
        if snap is not None:
            d["snapshot"] = snap
        return d

    def table_exists(self, db: str, table: str) -> bool:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
                            "AND TABLE_TYPE = 'BASE TABLE'", (db, table))
                return cur.fetchone() is not None
        finally:
            conn.close()

    def tables_info(self, tables: list[tuple[str, str]]) -> dict[tuple[str, str], bool]:
        """Which of ``tables`` this region captures (base tables on its server that
        the filter selects), each with whether it is keyless."""
        tables = [t for t in tables if self.ctx.table_selected(*t)]
        if not tables:
            return {}
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                def execute(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
                    cur.execute(sql, params)
                    return list(cur.fetchall())
                return base_tables(execute, "%s", tables)
        except pymysql.err.MySQLError as exc:
            raise SourceError(f"{self.where}: cannot list tables: {exc}") from None
        finally:
            conn.close()

    def source_tables(self, selected: Callable[[str, str], bool]) -> list[tuple[str, str]]:
        """The base tables on this region's server that ``selected`` chooses (the rules
        of a filter about to be loaded: which tables a reload adds)."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                            "WHERE TABLE_TYPE = 'BASE TABLE'")
                return sorted((str(db), str(t)) for db, t in cur.fetchall() if selected(str(db), str(t)))
        except pymysql.err.MySQLError as exc:
            raise SourceError(f"{self.where}: cannot list tables: {exc}") from None
        finally:
            conn.close()

    # --- snapshots ----------------------------------------------------------
    # where a connect starts a snapshot, its tables' CREATEs first (prepare.py)
    _start_snapshot = prepare.start_snapshot
    _upfront_creates = prepare.upfront_creates

    @property
    def snap_method(self) -> str:
        """How chunks are made exact on this server (snapshot.py): ``consistent``
        (MariaDB's consistent-snapshot position) or ``watermark`` (a locking read and
        the binlog position read while its locks are held)."""
        return self._snap_method or ("watermark" if self.cfg.snapshot_method == "watermark" else "consistent")

    def _resolve_snap_method(self, cur: Any) -> str:
        """``snapshot_method`` for this server (auto: MariaDB's position where the
        server reports it, else the watermark); ValueError for ``consistent`` on a
        server without it."""
        want = self.cfg.snapshot_method
        if want == "watermark":
            self._snap_method = "watermark"
            return self._snap_method
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_file'")
        has = cur.fetchone() is not None
        if want == "consistent" and not has:
            raise ValueError(
                f"{self.where}: snapshot_method=consistent needs MariaDB's consistent-snapshot binlog position "
                "(binlog_snapshot_file), which this server does not report (MySQL?); set snapshot_method=watermark "
                f"(or auto) in [region:{self.name}]")
        method = "consistent" if has else "watermark"
        if method != self._snap_method:
            log.info("%s: snapshots use the %s method%s", self.where, method,
                     "" if has else " (the server reports no consistent-snapshot binlog position: a locking read "
                     "per chunk with the binlog position read while its locks are held)")
        self._snap_method = method
        return method

    def check_snapshot_support(self) -> None:
        """ValueError when this server cannot take a snapshot the way
        ``snapshot_method`` asks (``consistent`` on a server without MariaDB's
        consistent-snapshot position)."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                self._resolve_snap_method(cur)
        finally:
            conn.close()

    def request_snapshot(self, tables: list[tuple[str, str]], truncate: bool) -> str:
        """Copy these tables again while streaming (on demand). ValueError when the
        server cannot give a consistent-snapshot binlog position (not MariaDB)."""
        self.check_snapshot_support()
        return self.start_snapshot_request(tables, truncate)

    # --- the snapshot host's hooks (capturer/regions/snaphost.py) ---------------
    def _pkey(self, pos: Any) -> tuple[Any, ...]:
        return (pos.file, pos.pos)

    def _stamped(self, pos: Any, progress: tuple[TableProgress, ...]) -> Position:
        return Position(pos.file, pos.pos, pos.gtid, progress, getattr(pos, "xa", ()))

    def _start_statements(self, plan: TablePlan, create: Any, truncate: bool) -> list[tuple[str, str, str]]:
        stmts: list[tuple[str, str, str]] = []
        if create:
            stmts += [(plan.db, f"CREATE DATABASE IF NOT EXISTS {quote_ident(plan.db)}", ""),
                      (plan.db, str(create), plan.table)]
        if truncate:
            stmts.append((plan.db, f"TRUNCATE TABLE {qualified(plan.db, plan.table)}", plan.table))
        return stmts

    def _new_snapshotter(self) -> Snapshotter:
        return MySQLSnapshotter(self, self.cfg.snapshot_workers, self.cfg.snapshot_chunk_rows)

    def _stream(self, start: Position) -> None:
        stream = BinLogStreamReader(
            connection_settings=self._conn_settings(),
            server_id=self.cfg.server_id,
            resume_stream=True,
            blocking=True,
            # a position of this server: its (file, pos); another server's: after its GTID state (failover)
            log_file=None if self._gtid_start else start.file,
            log_pos=None if self._gtid_start else start.pos,
            auto_position=self._gtid_start or None,
            only_events=EVENTS,
            filter_non_implemented_events=False,  # (a compressed event must be seen: COMPRESSED_EVENTS)
            slave_heartbeat=self.cfg.heartbeat_ms / 1000,
            is_mariadb=bool(self._gtid_start) and self.mariadb,
            enable_logging=False,
            # decoder=fast: table maps parsed once per definition too; library: the library's own, unchanged
            pymysql_wrapper=tablemap.connect if self.cfg.decoder == "fast" else mysqlconn.connect,
        )
        self.state = "streaming"
        log.info("%s: reading from %s", self.where, f"after GTID {self._gtid_start}" if self._gtid_start else start)
        # a first heartbeat at the floor tells the merger this region is alive
        with self._lock:
            self._alive(self.position)
        txn = TxnAssembler(self.ctx.spill_rows, self.ctx.spill_dir, self.where)
        started = threading.Event()  # the dump's first event arrived
        threading.Thread(target=self._free_dump, args=(stream, started), name=f"free-dump-{self.name}",
                         daemon=True).start()
        try:
            for ev in stream:
                if not started.is_set():
                    started.set()
                if self.ctx.stop.is_set():
                    break
                if isinstance(ev, HeartbeatLogEvent):
                    if not txn.open:
                        # the server has sent everything: the stream position is at a
                        # transaction boundary, past any trailing non-transaction events
                        self._heartbeat(Position(str(stream.log_file), int(stream.log_pos), self.gtid.state, (),
                                                 self.xa.marks()))
                    continue
                if type(ev) is NotImplementedEvent:
                    if ev.event_type in COMPRESSED_EVENTS:
                        raise compressed_event_error(self.where, ev.event_type, f"{stream.log_file}:{stream.log_pos}")
                    continue
                if ev.timestamp:
                    self.last_source_time = float(ev.timestamp)
                if isinstance(ev, (MariadbGtidEvent, GtidEvent)):
                    txn.begin(str(getattr(ev, "gtid", "")), (str(stream.log_file), group_start(ev)))
                elif isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                    txn.add(self._changes(ev, self._schema(ev)), f"at {stream.log_file}:{stream.log_pos}")
                elif isinstance(ev, XidEvent):
                    self._commit(stream, ev.timestamp, *txn.finish())
                elif isinstance(ev, XAPrepareEvent):
                    if ev.one_phase:  # (MySQL's XA COMMIT ... ONE PHASE: an ordinary commit)
                        self._commit(stream, ev.timestamp, *txn.finish())
                    else:
                        self._xa_prepared(stream, txn, xid_key(ev.xid_format_id, ev.xid_gtrid, ev.xid_bqual))
                elif isinstance(ev, QueryEvent):
                    self._query(stream, ev, txn)
        except pymysql.err.OperationalError as exc:
            if self._gtid_start and exc.args and exc.args[0] == 1236:
                # the server's own check of a GTID start (strict mode): not in its binlog, or diverged
                raise FatalSourceError(
                    f"region {self.name}: server {self.cfg.host}:{self.cfg.port} refuses to send its binlog after "
                    f"the region's GTID position {self._gtid_start}: {exc.args[1] if len(exc.args) > 1 else exc}. "
                    "Rows would be lost or passed on twice; re-seed the destinations and delete the checkpoint "
                    "to start over (or set snapshot = when_needed in this region to copy every table again "
                    "and go on from the current position)") from None
            raise
        finally:
            started.set()
            stream.close()

    def _free_dump(self, stream: Any, started: threading.Event) -> None:
        """End the older binlog dumps that hold this one back, until its first event arrives.

        A dump with the region's ``server_id`` makes MariaDB end the older dump of that
        ``server_id``, but only by marking it killed (``KILL_SLAVE_SAME_ID``), which does not
        close its socket, and the new dump waits (state ``starting``) until that one is gone.
        A dump whose reader is alive but does not read (a capturer frozen by SIGSTOP or a
        paused VM: with ``[ha]``, the deposed active; a frozen host whose TCP stays up) stays
        blocked writing into its full socket until the server's ``net_write_timeout`` (and for
        the whole freeze while its host acknowledges nothing more): the new reader got nothing
        for that long (a takeover measured at 60 s instead of the lease). ``KILL CONNECTION``
        closes the socket: such a dump ends at once. So, when no event came within 2 s, every
        second until one does: the connections of this region's user that the server already
        marked killed (``Command = 'Killed'``, never this dump's own) are ended. A user may end
        its own connections without any privilege; MySQL ends the older dump itself."""
        if started.wait(2.0):
            return
        ended: set[int] = set()
        while not started.is_set() and not self.ctx.stop.is_set():
            conn = getattr(stream, "_stream_connection", None)
            mine = getattr(conn, "server_thread_id", None) if conn is not None else None
            if mine:
                try:
                    side = self._connect()
                except (SourceError, FatalSourceError):
                    side = None
                if side is not None:
                    try:
                        with side.cursor() as cur:
                            cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND = 'Killed' "
                                        "AND USER = SUBSTRING_INDEX(USER(), '@', 1) AND ID <> %s AND ID <> "
                                        "CONNECTION_ID()", (int(mine[0]),))
                            for (tid,) in cur.fetchall():
                                if tid in ended:
                                    continue
                                try:
                                    cur.execute(f"KILL CONNECTION {int(tid)}")
                                    ended.add(tid)
                                    log.warning("%s: ended connection %d: a binlog dump of an earlier reader (same "
                                                "server_id or user) the server had marked killed; it was not reading "
                                                "(a frozen capturer?) and held this dump back", self.where, tid)
                                except pymysql.err.MySQLError:
                                    pass  # gone meanwhile, or not ours
                    except pymysql.err.MySQLError as exc:
                        log.debug("%s: looking for older dumps: %s", self.where, exc)
                    finally:
                        close_quietly(side)
            started.wait(1.0)

    def _query(self, stream: BinLogStreamReader, ev: Any, txn: TxnAssembler) -> None:
        """A Query event: BEGIN, the COMMIT of a non-transactional group, the ROLLBACK of undone rows, an XA
        decision, a statement inside a transaction (ignored), or a statement of its own (DDL ...)."""
        q = ev.query if isinstance(ev.query, str) else ev.query.decode("utf-8", "replace")
        head = q.strip().upper()
        if head == "BEGIN":
            txn.open = True
        elif head == "COMMIT":
            # COMMIT ends a group of non-transactional (e.g. MyISAM, Aria) changes
            self._commit(stream, ev.timestamp, *txn.finish())
        elif head == "ROLLBACK":
            # A group that ends in ROLLBACK holds rows the source undid. In row-based logging a
            # non-transactional table's rows never go into a transaction's group (they are logged at
            # once, as a group of their own ending in COMMIT), so its rows are all transactional ones:
            # the server writes them with ROLLBACK when the transaction also changed a
            # non-transactional table and rolls back (MySQL), or rolls back to a savepoint set before
            # its first logged change (MariaDB, MySQL: no SAVEPOINT in the group). Dropped; the
            # position and GTID state move past the group.
            if txn.rows:
                log.debug("%s: %d row(s) rolled back at %s:%s: not passed on", self.where, txn.rows,
                          stream.log_file, stream.log_pos)
            gtid = txn.finish_empty()
            self._commit(stream, ev.timestamp, gtid, (), None)
        elif (decided := xa_decision(q)) is not None:
            self._xa_decided(stream, ev.timestamp, txn, *decided)
        elif (sp := savepoint_statement(q)) is not None:
            txn.savepoint(*sp)
        elif is_ignorable(q):
            return
        elif not is_data_ddl(q):
            # GRANT, CREATE USER, FLUSH ...: nothing to replicate, but the
            # position moves on (an empty transaction)
            log.debug("%s: not passing on %r", self.where, q[:80])
            gtid = txn.finish_empty()
            self._commit(stream, ev.timestamp, gtid, (), None)
        else:
            schema_db = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) else str(ev.schema or "")
            db, table = ddl_target(q, schema_db)
            self._forget(db, table, q)
            gtid = txn.finish_empty()
            self._commit(stream, ev.timestamp, gtid, (), Ddl(db, q, table, schema_db))

    def _xa_prepared(self, stream: BinLogStreamReader, txn: TxnAssembler, xid: str) -> None:
        """An XA transaction's group ends with its prepare: its rows are held (not sent) until
        its decision; the GTID state moves past the group."""
        start = txn.start or (str(stream.log_file), 4)  # (no GTID event before it: read again from the file's start)
        gtid, rows, _, spilled = txn.finish()
        with self._lock:
            self.gtid.advance(gtid)
            self.xa.hold(PreparedXa(xid, start[0], start[1], gtid), rows, spilled)
        log.debug("%s: XA transaction %s prepared at %s:%d: %d row(s) held until its decision", self.where, xid,
                  start[0], start[1], len(rows))

    def _xa_decided(self, stream: BinLogStreamReader, source_ts: int, txn: TxnAssembler, what: str, xid: str,
                    one_phase: bool) -> None:
        """``XA COMMIT`` (the rows held since its prepare leave here, in the order of the commits)
        or ``XA ROLLBACK`` (they are dropped) of a transaction prepared earlier: a group of its own."""
        gtid = txn.finish_empty()
        held = self.xa.take(xid)
        if what == "ROLLBACK" or (held is None and one_phase):
            self._commit(stream, source_ts, gtid, (), None)
            return
        if held is None:
            self.xa_unknown += 1
            log.error("%s: XA COMMIT of %s at %s:%s, a transaction prepared before the region's start (or its "
                      "checkpoint was written by a version that did not hold XA transactions): its rows are not "
                      "in the stream; copy its tables again (POST /snapshot)", self.where, xid, stream.log_file,
                      stream.log_pos)
            self._commit(stream, source_ts, gtid, (), None)
            return
        _, rows, spilled = held
        self._commit(stream, source_ts, gtid, rows, None, spilled)

    def _changes(self, ev: Any, schema: TableSchema) -> list[RowChange]:
        """Row changes of a rows event: the fast decoder where it can, else the library;
        BINARY(n) values padded back to n bytes (``pad_binary``); a system-versioned
        table's as its current rows (``versioning.py``)."""
        changes = self._decode(ev, schema)
        if any(ci.length for ci in schema.column_info):
            pad_binary(changes, schema)
        current = self._current_rows(schema)
        if current is not None:
            changes = versioning.current_changes(changes, *current)
        return changes

    def _current_rows(self, schema: TableSchema) -> tuple[TableSchema, str, str] | None:
        """(the current rows' schema, row start, row end) of a system-versioned table, else None;
        read once per table definition (until a DDL)."""
        key = (schema.db, schema.table, schema.columns)
        if key in self._current:
            return self._current[key]
        try:
            if self._meta is None:
                self._meta = self._connect()
            with self._meta.cursor() as cur:
                period = versioning.period_columns(cur, schema.db, schema.table)
        except (pymysql.err.MySQLError, SourceError) as exc:
            self._meta = None
            if "row_end" in schema.columns and "row_start" in schema.columns:
                raise SourceError(f"{self.where}: cannot tell whether {schema.db}.{schema.table} is system-versioned: "
                                  f"{exc}") from exc
            period = None  # (a table dropped since: its rows are read as they are)
        res = None
        if period is not None and all(c in schema.columns for c in period):
            res = (versioning.current_schema(schema, *period), *period)
            log.info("%s: %s.%s is system-versioned: its current rows are passed on, without %s and %s",
                     self.where, schema.db, schema.table, *period)
        self._current[key] = res
        return res

    def _decode(self, ev: Any, schema: TableSchema) -> list[RowChange]:
        fast = fast_rows(ev, isinstance(ev, UpdateRowsEvent)) if self.cfg.decoder == "fast" else None
        if fast is not None:
            self.fast_events += 1
            return fast_changes(ev, schema, fast)
        self.library_events += 1
        return library_changes(ev, schema)

    def _commit(self, stream: BinLogStreamReader, source_ts: int, gtid: str,
                rows: Any, ddl: Ddl | None, spilled: bool = False) -> None:
        """The transaction that ends here leaves, with ``rows`` (a tuple, or spilled)."""
        if spilled:
            self.spilled_txns += 1
        with self._lock:
            self._apply_requests()
            pos = Position(str(stream.log_file), int(stream.log_pos), self.gtid.advance(gtid), self.snap_progress,
                           self.xa.marks())
            self.clock.at(pos)  # (items a run before a crash inserted before this point raised the clock)
            ts = self.clock.commit(int(source_ts), pos)
            txn = Txn(self.name, ts, pos, rows, ddl, int(source_ts), gtid)
            if ddl is not None:
                failpoints.hit("region.ddl")
                self._note_ddl(ddl, pos)
            elif self.recorders:
                self._record(txn)
            self._deliver(txn)
            self._lock.notify_all()

    def _note_ddl(self, d: Ddl, pos: Position) -> None:
        """(under the lock) Which tables a DDL may have changed, for the snapshot's
        check that a chunk's columns are still the table's: its table; or every
        table of its database for a statement naming several (DROP TABLE a, b;
        RENAME) or none; or every table when the database is unknown. Names are kept
        in lower case; entries pruned away leave their newest position as a floor
        (any table: a chunk described before it is read again)."""
        many = names_several_tables(d.sql)
        if not d.db:
            key = ("", "")
        elif not d.table or many:
            key = (d.db.lower(), "")
        else:
            key = (d.db.lower(), d.table.lower())
        self._note_ddl_key(key, self._pkey(pos))


