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
"""

from __future__ import annotations

import dataclasses
import logging
import re
import struct
import time
import uuid
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
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from capturer.errors import FatalSourceError, SourceError
from capturer.model import (
    ColumnInfo,
    Ddl,
    Position,
    RowChange,
    TableProgress,
    TableSchema,
    Txn,
    ts_physical_ms,
)
from capturer.model.encode import qualified, quote_ident
from capturer.regions.base import ChangeBuffer, ClockedRegion, RegionContext, close_quietly, require_start_kind
from capturer.regions.clock import RegionClock
from capturer.regions.ddl import ddl_target, is_data_ddl, is_ignorable
from capturer.regions.mysql import tablemap
from capturer.regions.mysql.gtid import (
    GtidTracker,
    maria_behind,
    maria_contains,
    maria_purged,
    mysql_behind,
    mysql_purged,
)
from capturer.regions.mysql.keys import RegionConfig
from capturer.regions.mysql.rowdecode import fast_rows, normalise_library_row
from capturer.regions.mysql.snapshot import (
    MySQLSnapshotter,
    base_tables,
    create_table_sql,
    index_rows,
    promote_key,
)
from capturer.regions.snaphost import SnapshotHostMixin
from capturer.regions.snapshot import Snapshotter, TablePlan
from capturer.util import failpoints, mysqlconn
from capturer.util.binlogpos import binlog_end

log = logging.getLogger(__name__)

_EVENTS = [
    GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent, RotateEvent, HeartbeatLogEvent,
    WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
    NotImplementedEvent,  # (looked at for one thing: a compressed event, never skipped silently)
]

#: MariaDB's compressed events (log_bin_compress=ON): QUERY_COMPRESSED, and WRITE/UPDATE/DELETE_ROWS_COMPRESSED
#: v1 and v2. python-mysql-replication does not read them; skipped, they would lose their rows without a word.
COMPRESSED_EVENTS = frozenset(range(165, 172))


_T_STRING = 254  # MYSQL_TYPE_STRING: CHAR(n) and BINARY(n) in a table map


def binary_length(type_code: int, charset: str, max_length: Any) -> int:
    """A column's ``ColumnInfo.length``: n for a BINARY(n) (a fixed-length string without a
    character set), else 0."""
    if type_code != _T_STRING or charset.lower() != "binary":
        return 0
    try:
        return max(0, int(max_length or 0))
    except (TypeError, ValueError):
        return 0


def pad_binary(changes: list[RowChange], schema: TableSchema) -> None:
    """BINARY(n) values padded with zero bytes to n, in place. The binlog leaves a
    fixed-length binary value's trailing zero bytes out; the server stores, returns and
    compares it with them (a BINARY(16) key ending in 0x00 written without them matches
    no row of a target, and a consumer would get 15 bytes)."""
    cols = [(c, ci.length) for c, ci in zip(schema.columns, schema.column_info) if ci.length]
    for ch in changes:
        for img in (ch.before, ch.after):
            if img is None:
                continue
            for c, n in cols:
                v = img.get(c)
                if isinstance(v, (bytes, bytearray)) and len(v) < n:
                    img[c] = bytes(v).ljust(n, b"\x00")


def compressed_event_error(where: str, event_type: int, at: str) -> FatalSourceError:
    return FatalSourceError(
        f"{where}: a compressed binlog event (type {event_type}) at {at}: the server writes its binlog with "
        "log_bin_compress=ON, which this capturer cannot read (its rows would be lost). Set log_bin_compress=OFF "
        "on the server (SET GLOBAL log_bin_compress=OFF, and in its config file); events written while it was ON "
        "stay compressed: start after them (a new checkpoint from start=latest) and copy the tables again "
        "(snapshot=initial on a fresh checkpoint, or POST /snapshot)")

REQUIRED = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}


def check_server(variables: dict[str, str], where: str) -> None:
    """Refuse a server whose binlog cannot give full row changes with column names."""
    problems = []
    for name, want in REQUIRED.items():
        if name not in variables:
            if name == "binlog_row_metadata":
                continue  # older servers: names then come from information_schema
            problems.append(f"{name} is not reported by the server")
            continue
        have = variables[name].upper()
        if have != want:
            problems.append(f"{name}={variables[name]} (need {name}={want})")
    if variables.get("log_bin_compress", "OFF").upper() == "ON":
        problems.append("log_bin_compress=ON (need log_bin_compress=OFF: compressed binlog events cannot be read; "
                        "SET GLOBAL log_bin_compress=OFF)")
    if problems:
        raise FatalSourceError(
            f"{where}: server settings do not allow row capture: {'; '.join(problems)}. "
            "Set them in the server's config file ([mariadbd] / [mysqld] section: "
            "log_bin=<basename>, binlog_format=ROW, binlog_row_image=FULL, "
            "binlog_row_metadata=FULL) and restart it; binlog_format/binlog_row_image/"
            "binlog_row_metadata can also be changed with SET GLOBAL."
        )


class TxnAssembler:
    """The transaction being read: its GTID and row changes (a ``ChangeBuffer``:
    moved to disk in chunks once it grows past ``spill_rows``, 0 = never). ``open``
    is true between its first event and its end (a heartbeat then is not at a
    transaction boundary)."""

    def __init__(self, spill_rows: int, spill_dir: str, where: str):
        self.spill_rows = spill_rows
        self.spill_dir = spill_dir
        self.where = where
        self._reset()

    def _reset(self) -> None:
        self.gtid = ""
        self.buf = ChangeBuffer(self.spill_rows, self.spill_dir, self.where)
        self.open = False

    @property
    def rows(self) -> int:
        return self.buf.rows

    def begin(self, gtid: str) -> None:
        """A GTID event: a new transaction (anything unfinished before it is dropped)."""
        self._reset()
        self.gtid = gtid
        self.open = True

    def add(self, changes: list[RowChange], at: str) -> None:
        """Changes read at ``at`` (named in the log line if the transaction spills)."""
        self.open = True
        self.buf.extend(changes, at)

    def finish(self) -> tuple[str, Any, None, bool]:
        """(gtid, its changes: in memory or spilled, no DDL, whether they were spilled)
        of the transaction that ends; then empty."""
        rows, spilled = self.buf.take()
        out = (self.gtid, rows, None, spilled)
        self._reset()
        return out

    def finish_empty(self) -> str:
        """A statement that is a transaction of its own (DDL, GRANT ...): its gtid; the state is emptied."""
        gtid = self.gtid
        self._reset()
        return gtid


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
        self._meta: pymysql.connections.Connection | None = None
        self.fast_events = 0
        self.library_events = 0
        self._init_snapshot_host(ctx.start.snapshot if isinstance(ctx.start, Position) else ())
        self._snap_method = ""  # resolved snapshot_method (consistent | watermark), once the server is known

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

    def _use_server(self, i: int) -> None:
        host, port = self.servers[i]
        self.cfg = dataclasses.replace(self.config, host=host, port=port)
        self.where = f"region {self.name} ({host}:{port})"

    def _connect_primary(self) -> pymysql.connections.Connection:
        """A connection to the server to read: the one read last if it is still
        reachable and (with replicas configured) the primary, else the first of the
        others that is. The primary is the server with ``read_only=OFF`` (a promoted
        replica has it turned off; a replica keeps it on). Without replicas the one
        host is used as it is (a VIP: whatever server it leads to)."""
        if len(self.servers) == 1:
            return self._connect()
        cur_host = (self.cfg.host, self.cfg.port)
        first = self.servers.index(cur_host) if cur_host in self.servers else 0
        tried: list[str] = []
        for k in range(len(self.servers)):
            i = (first + k) % len(self.servers)
            self._use_server(i)
            try:
                conn = self._connect()
            except FatalSourceError:
                raise
            except SourceError as exc:
                tried.append(f"{self.servers[i][0]}:{self.servers[i][1]}: unreachable ({exc.__cause__ or exc})")
                continue
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT @@GLOBAL.read_only")
                    ro = str(cur.fetchone()[0]).upper() in ("1", "ON")
            except pymysql.err.MySQLError as exc:
                close_quietly(conn)
                tried.append(f"{self.servers[i][0]}:{self.servers[i][1]}: {exc}")
                continue
            if not ro:
                return conn
            close_quietly(conn)
            tried.append(f"{self.servers[i][0]}:{self.servers[i][1]}: read_only=ON (a replica)")
        self._use_server(first)
        raise SourceError(f"region {self.name}: no primary among its servers ({'; '.join(tried)}); "
                          "waiting for one (a replica promoted: read_only=OFF)")

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

    def _prepare(self) -> Position:
        """Check the server, measure its clock, and decide where to read from."""
        conn = self._connect_primary()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                    "('log_bin','binlog_format','binlog_row_image','binlog_row_metadata','log_bin_compress')"
                )
                check_server({k.lower(): str(v) for k, v in cur.fetchall()}, self.where)
                t0 = time.time()
                cur.execute("SELECT UNIX_TIMESTAMP(NOW(6))")
                server = float(cur.fetchone()[0])
                t1 = time.time()
                self._clock_offset_ms = (server - (t0 + t1) / 2) * 1000
                try:
                    cur.execute("SHOW BINARY LOGS")
                except pymysql.err.MySQLError as exc:
                    raise FatalSourceError(
                        f"{self.where}: SHOW BINARY LOGS failed ({exc}); the user needs the "
                        "BINLOG MONITOR (MariaDB) or REPLICATION CLIENT (MySQL) privilege"
                    ) from None
                logs = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
                if not logs:
                    raise FatalSourceError(f"{self.where}: the server lists no binary logs")
                ident = self._identify(cur)
                self._gtid_start = ""
                if self.position is not None:
                    names = dict(logs)
                    here = self._gtid_at(cur, self.position) if self.position.file in names else None
                    if self.position.file in names and (not self.mariadb or not self.position.gtid
                                                        or (here is not None and maria_contains(here, self.position.gtid))):
                        # this server's own file:pos (MariaDB: its binlog has our GTIDs right there)
                        self.gtid.reset(here if here is not None else self.position.gtid)
                        self._note_server(ident, by_gtid=False)
                        self._start_snapshot(cur, fresh=False)
                        return self.position
                    lost = self._gtid_problem(cur, logs, self.position.gtid) if self.position.gtid else ""
                    if self.position.gtid and not lost:
                        # another server (a promoted replica, a VIP moved): it holds our GTIDs, go on after them
                        if any(p.state in ("pending", "running") for p in self.snap_progress):
                            raise FatalSourceError(
                                f"{self.where}: the region changed server (to {self.cfg.host}:{self.cfg.port}) "
                                "while a snapshot was running, which is not supported yet; restart the "
                                "capturer with snapshot=when_needed after deleting the checkpoint, or finish "
                                "the snapshot on the old server")
                        self._gtid_start = self.position.gtid
                        self.gtid.reset(self.position.gtid)
                        self._note_server(ident, by_gtid=True)
                        return self.position
                    if not lost:
                        lost = (f"{self.where}: resume position {self.position} is no longer on the "
                                f"server (purged?); the oldest binlog is {logs[0][0]}. Rows between "
                                "would be lost")
                    if self.cfg.snapshot != "when_needed":
                        raise FatalSourceError(
                            f"{lost}; re-seed the destinations and delete the checkpoint "
                            "to start over (or set snapshot = when_needed in this region to copy "
                            "every table again and go on from the current position)."
                        )
                    log.warning("%s; snapshot=when_needed: copying every selected table again (each emptied "
                                "downstream first: rows deleted in the gap go too) and reading the binlog "
                                "from its current end", lost)
                    self._note_server(ident, by_gtid=True)
                    with self._lock:
                        self.position = None
                        self.snap_progress = ()
                        self._snap_gen += 1  # chunks in flight were read against the old binlog
                    purged = True
                else:
                    purged = False
                if not purged:
                    self._note_server(ident, by_gtid=False)
                if self.cfg.snapshot in ("initial", "when_needed"):
                    self._start_snapshot(cur, fresh=True, at=self._binlog_end(cur), truncate=purged)
                    assert self.position is not None  # the snapshot's start, set by _start_snapshot
                    return self.position
                start = self.cfg.start
                if start == "earliest":
                    pos = Position(logs[0][0], 4)
                elif start == "latest":
                    pos = self._binlog_end(cur)
                else:
                    file, _, off = start.rpartition(":")
                    pos = Position(file, int(off))
                pos = Position(pos.file, pos.pos, self._start_gtid(cur, pos))
                self.gtid.reset(pos.gtid)
                # durable before anything is emitted: a crash before the first checkpoint
                # resumes here, not from a new "latest" (changes between would be lost)
                self.ctx.pin_start(self.name, pos)
                return pos
        finally:
            conn.close()

    def _binlog_end(self, cur: Any) -> Position:
        """The position the server writes next (SHOW MASTER STATUS, or MySQL 8.4's
        SHOW BINARY LOG STATUS)."""
        def query(sql: str) -> list[tuple[Any, ...]]:
            cur.execute(sql)
            return list(cur.fetchall())
        got = binlog_end(query)
        if got is None:
            raise FatalSourceError(f"{self.where}: the server reports no binlog position (is log_bin on?)")
        pos = Position(*got)
        return Position(pos.file, pos.pos, self._start_gtid(cur, pos, at_end=True))

    # --- GTIDs and failover -------------------------------------------------
    def _identify(self, cur: Any) -> str:
        """The server's flavour (``self.mariadb``) and identity (server_id, and MySQL's server_uuid)."""
        cur.execute("SELECT VERSION(), @@GLOBAL.server_id")
        version, sid = cur.fetchone()
        self.mariadb = "mariadb" in str(version).lower()
        self.gtid.mariadb = self.mariadb
        ident = f"server_id {sid}"
        if not self.mariadb:
            try:
                cur.execute("SELECT @@GLOBAL.server_uuid")
                ident += f", server_uuid {cur.fetchone()[0]}"
            except pymysql.err.MySQLError:
                pass
        return ident

    def _gtid_at(self, cur: Any, pos: Position) -> str | None:
        """MariaDB: the GTID state of this server's binlog at ``pos`` (BINLOG_GTID_POS);
        None where it has none there (not a position of this server's binlog), or on MySQL."""
        if not self.mariadb:
            return None
        try:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (pos.file, pos.pos))
            row = cur.fetchone()
        except pymysql.err.MySQLError:
            return None
        return None if row is None or row[0] is None else str(row[0])

    def _start_gtid(self, cur: Any, pos: Position, at_end: bool = False) -> str:
        """The GTID state at a first start's position: MariaDB's BINLOG_GTID_POS; MySQL's
        gtid_executed where the position is the binlog's end, else unknown ('')."""
        if self.mariadb:
            return self._gtid_at(cur, pos) or ""
        if not at_end:
            return ""
        try:
            cur.execute("SELECT @@GLOBAL.gtid_executed")
            row = cur.fetchone()
        except pymysql.err.MySQLError:
            return ""
        return "" if row is None or row[0] is None else str(row[0]).replace("\n", "")

    def _gtid_problem(self, cur: Any, logs: list[tuple[str, int]], ours: str) -> str:
        """Why this server cannot go on right after the GTID state ``ours`` ('' when it
        can): it has not reached it (it was behind when it was promoted), or it purged
        the binlogs after it. (``_identify`` first: the flavour.)"""
        server = f"{self.cfg.host}:{self.cfg.port}"
        if self.mariadb:
            cur.execute("SELECT @@GLOBAL.gtid_binlog_pos, @@GLOBAL.gtid_binlog_state")
            theirs, state = (str(x or "") for x in cur.fetchone())
            behind = maria_behind(ours, theirs, state)
            if behind:
                return (f"region {self.name}: server {server} does not hold the region's GTID position {ours} "
                        f"(its binlog lacks {', '.join(behind)}: its gtid_binlog_pos is {theirs or 'empty'}, "
                        f"gtid_binlog_state {state or 'empty'}; it was behind when it was promoted, and may have "
                        "written transactions of its own in their place). Transactions the region already passed "
                        "on are not in its history")
            oldest = self._gtid_at(cur, Position(logs[0][0], 4)) or ""
            gone = maria_purged(ours, oldest)
            if gone:
                return (f"region {self.name}: server {server} no longer has the binlogs after the region's GTID "
                        f"position {ours} (its oldest binlog {logs[0][0]} starts at {oldest}: purged). Rows "
                        "between would be lost")
            return ""
        cur.execute("SELECT @@GLOBAL.gtid_executed, @@GLOBAL.gtid_purged")
        executed, purged = (str(x or "").replace("\n", "") for x in cur.fetchone())
        missing = mysql_behind(ours, executed)
        if missing:
            return (f"region {self.name}: server {server} does not hold the region's GTID position {ours} "
                    f"(it lacks {missing}: its gtid_executed is {executed or 'empty'}; it was behind when it was "
                    "promoted). Transactions the region already passed on are not in its history")
        unread = mysql_purged(ours, purged)
        if unread:
            return (f"region {self.name}: server {server} purged GTIDs the region has not read ({unread}; its "
                    f"gtid_purged is {purged}). Rows between would be lost")
        return ""

    def _note_server(self, ident: str, by_gtid: bool) -> None:
        """The region reads this server now: a failover when it is not the one read before."""
        now = (self.cfg.host, self.cfg.port, ident)
        before, self._server_seen = self._server_seen, now
        if before is None and not by_gtid:
            return
        if before == now:
            return
        came = f"{before[0]}:{before[1]} ({before[2]})" if before else "the checkpoint's server"
        entry = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "from": came,
                 "to": f"{now[0]}:{now[1]} ({ident})",
                 "gtid": self.position.gtid if self.position is not None else ""}
        self.failovers.append(entry)
        del self.failovers[:-20]
        self.failover_count += 1
        log.warning("%s: failover: reading %s now (was %s), resuming after GTID %s", self.where, entry["to"],
                    came, entry["gtid"] or "-")

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
        if not db or " RENAME " in f" {sql.upper()} ":
            self._schemas.clear()
            self._ukeys.clear()
            return
        caches: tuple[dict[Any, Any], ...] = (self._schemas, self._ukeys)
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
            uks = tuple(u for u in uks if all(c in cols for c in u))
            info = tuple(
                ColumnInfo(c.type, bool(c.unsigned), int(getattr(c, "precision", 0) or 0),
                           int(getattr(c, "decimals", 0) or 0),
                           str(c.character_set_name or "").lower() == "binary",
                           binary_length(c.type, str(c.character_set_name or ""), getattr(c, "max_length", 0)))
                for c in ev.columns
            )
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
                self.position = Position(here.file, here.pos, here.gtid, self.snap_progress)
            self._clock_heartbeat(now_ms, self.position)
            self._lock.notify_all()

    def status(self) -> dict[str, Any]:
        d = super().status()
        d["server"] = f"{self.cfg.host}:{self.cfg.port}"
        d["servers"] = [f"{h}:{p}" for h, p in self.servers]
        d["gtid"] = self.gtid.state
        d["failovers"] = self.failover_count
        d["failover_history"] = list(self.failovers)
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
    def _start_snapshot(self, cur: Any, fresh: bool, at: Position | None = None, truncate: bool = False) -> None:
        """On a first start (``fresh``) with snapshot=initial/when_needed: every table
        the filter selects (``truncate``: each emptied downstream first), from ``at``;
        on a restart: the snapshot in progress in the checkpoint. Tables whose copy has
        not started get their CREATE TABLE IF NOT EXISTS first (again after a restart),
        so that binlog changes to them find them on a new target."""
        if fresh or self.snap_progress:
            try:
                self._resolve_snap_method(cur)
            except ValueError as exc:
                raise FatalSourceError(str(exc)) from None
        if fresh:
            assert at is not None
            cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = "
                        "'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
            # the filter decides, system schemas included (left out unless a rule names them)
            tables = [(str(db), str(t)) for db, t in cur.fetchall() if self.ctx.table_selected(str(db), str(t))]

            def execute(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
                cur.execute(sql, params)
                return list(cur.fetchall())
            keyless = base_tables(execute, "%s", tables)
            # a copy that truncates must be the only source of its table downstream
            cut = [t for t in tables if truncate or keyless.get(t)]
            self.refuse_outside_peers(cut, truncate)
            run = uuid.uuid4().hex[:12]
            progress = tuple(TableProgress(db, t, run, truncate=truncate) for db, t in tables)
            start = Position(at.file, at.pos, at.gtid, progress)
            # durable before anything is emitted: a crash before the first checkpoint resumes
            # this run from this position (so changes made meanwhile are delivered)
            self.ctx.pin_start(self.name, start)
            with self._lock:
                self.snap_progress = progress
                self.position = start
                self._apply_requests()  # (after: a request made meanwhile is kept)
            log.info("%s: snapshot=%s: copying %d table(s)%s while reading the binlog from %s",
                     self.where, self.cfg.snapshot, len(tables), " (each emptied downstream first)" if truncate
                     else "", self.position)
        if self.cfg.snapshot_ddl:
            self._upfront_creates(cur)
        with self._snap_lock:
            if fresh or self.snapshotter is None:
                pending = tuple(p for p in self.snap_progress if p.state in ("pending", "running"))
                if pending:
                    if self.snapshotter is None:
                        self.snapshotter = self._new_snapshotter()
                    self.snapshotter.load(pending)

    def _upfront_creates(self, cur: Any) -> None:
        """Every pending table's CREATE TABLE IF NOT EXISTS, as the binlog would have
        given it, before anything else of the region: binlog changes to a table whose
        copy has not started then find it on a new target. They take the commit_ts
        right after the region's floor and only the last one's position marks them
        sent (``created``): a restart before that was acknowledged sends them again
        with the same identities (the floor is the one pinned with the start), and a
        restart after it does not send them again (which would lift every replayed
        transaction above them, to new identities)."""
        with self._lock:
            self._apply_requests()
            todo = [(p.run, p.db, p.table) for p in self.snap_progress
                    if p.state == "pending" and not p.created and (p.run, p.db, p.table) not in self._creates_done]
        if not todo:
            return
        stmts: list[tuple[str, str, str]] = []
        for db in sorted({db for _, db, _ in todo}):
            stmts.append((db, "", f"CREATE DATABASE IF NOT EXISTS {quote_ident(db)}"))
        for _, db, t in todo:
            failpoints.hit("snapshot.create")
            try:
                cur.execute(f"SHOW CREATE TABLE {qualified(db, t)}")
            except pymysql.err.MySQLError as exc:
                if exc.args and exc.args[0] == 1146:  # dropped since: its copy will say so
                    continue
                raise
            row = cur.fetchone()
            sql = create_table_sql(db, t, str(row[1])) if row else ""
            if sql:
                stmts.append((db, t, sql))
        with self._lock:
            self._apply_requests()
            done = set(todo)
            progress = tuple(dataclasses.replace(p, created=True) if (p.run, p.db, p.table) in done else p
                             for p in self.snap_progress)
            here = self.position
            assert here is not None
            after = Position(here.file, here.pos, here.gtid, progress)
            for i, (db, t, sql) in enumerate(stmts):
                ts = self.clock.next()
                self._emit(Txn(self.name, ts, after if i == len(stmts) - 1 else here, (),
                               Ddl(db, sql, t, db), ts_physical_ms(ts) // 1000, ""))
                self.last_commit_ts = ts
            self.snap_progress = progress
            self.position = after
            self._creates_done.update(todo)

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
        return Position(pos.file, pos.pos, pos.gtid, progress)

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
            only_events=_EVENTS,
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
        try:
            for ev in stream:
                if self.ctx.stop.is_set():
                    break
                if isinstance(ev, HeartbeatLogEvent):
                    if not txn.open:
                        # the server has sent everything: the stream position is at a
                        # transaction boundary, past any trailing non-transaction events
                        self._heartbeat(Position(str(stream.log_file), int(stream.log_pos), self.gtid.state))
                    continue
                if type(ev) is NotImplementedEvent:
                    if ev.event_type in COMPRESSED_EVENTS:
                        raise compressed_event_error(self.where, ev.event_type, f"{stream.log_file}:{stream.log_pos}")
                    continue
                if ev.timestamp:
                    self.last_source_time = float(ev.timestamp)
                if isinstance(ev, (MariadbGtidEvent, GtidEvent)):
                    txn.begin(str(getattr(ev, "gtid", "")))
                elif isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                    txn.add(self._changes(ev, self._schema(ev)), f"at {stream.log_file}:{stream.log_pos}")
                elif isinstance(ev, XidEvent):
                    self._commit(stream, ev.timestamp, *txn.finish())
                elif isinstance(ev, QueryEvent):
                    q = ev.query if isinstance(ev.query, str) else ev.query.decode("utf-8", "replace")
                    head = q.strip().upper()
                    if head == "BEGIN":
                        txn.open = True
                    elif head in ("COMMIT", "ROLLBACK"):
                        # COMMIT ends a group of non-transactional (e.g. MyISAM) changes;
                        # ROLLBACK here means they were applied anyway and cannot be undone
                        if head == "ROLLBACK" and txn.rows:
                            log.warning("%s: non-transactional changes before ROLLBACK at %s:%s "
                                        "were applied by the source; passing them on",
                                        self.where, stream.log_file, stream.log_pos)
                        self._commit(stream, ev.timestamp, *txn.finish())
                    elif is_ignorable(q):
                        continue
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
            stream.close()

    def _changes(self, ev: Any, schema: TableSchema) -> list[RowChange]:
        """Row changes of a rows event: the fast decoder where it can, else the library;
        BINARY(n) values padded back to n bytes (``pad_binary``)."""
        changes = self._decode(ev, schema)
        if any(ci.length for ci in schema.column_info):
            pad_binary(changes, schema)
        return changes

    def _decode(self, ev: Any, schema: TableSchema) -> list[RowChange]:
        upd = isinstance(ev, UpdateRowsEvent)
        fast = fast_rows(ev, upd) if self.cfg.decoder == "fast" else None
        if fast is not None:
            self.fast_events += 1
            if upd:
                return [RowChange(schema, "update", b, a) for b, a in fast]
            if isinstance(ev, WriteRowsEvent):
                return [RowChange(schema, "insert", None, img) for img, _ in fast]
            return [RowChange(schema, "delete", img, None) for img, _ in fast]
        self.library_events += 1
        binary = frozenset(c for c, ci in zip(schema.columns, schema.column_info) if ci.binary)
        if upd:
            return [RowChange(schema, "update",
                              normalise_library_row(r["before_values"], r["before_none_sources"], binary),
                              normalise_library_row(r["after_values"], r["after_none_sources"], binary))
                    for r in ev.rows]
        if isinstance(ev, WriteRowsEvent):
            return [RowChange(schema, "insert", None,
                              normalise_library_row(r["values"], r["none_sources"], binary)) for r in ev.rows]
        return [RowChange(schema, "delete", normalise_library_row(r["values"], r["none_sources"], binary), None)
                for r in ev.rows]

    def _commit(self, stream: BinLogStreamReader, source_ts: int, gtid: str,
                rows: Any, ddl: Ddl | None, spilled: bool = False) -> None:
        """The transaction that ends here leaves, with ``rows`` (a tuple, or spilled)."""
        if spilled:
            self.spilled_txns += 1
        with self._lock:
            self._apply_requests()
            pos = Position(str(stream.log_file), int(stream.log_pos), self.gtid.advance(gtid), self.snap_progress)
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
        head = re.sub(r"/\*.*?\*/", " ", d.sql, flags=re.S).strip().upper()
        many = head.startswith("DROP") or bool(re.search(r"\bRENAME\b", head))
        if not d.db:
            key = ("", "")
        elif not d.table or many:
            key = (d.db.lower(), "")
        else:
            key = (d.db.lower(), d.table.lower())
        self._note_ddl_key(key, self._pkey(pos))


