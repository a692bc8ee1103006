"""A MySQL/MariaDB region: the row-based binlog over the replication protocol.

Reads with python-mysql-replication from a ``(file, pos)`` at a transaction
boundary (the library's MySQL dump path: with ``is_mariadb=True`` it would
ignore ``log_file/log_pos``), assembles whole committed transactions (GTID ...
XID or COMMIT), and emits them with a commit_ts from ``RegionClock``. While
idle the server sends heartbeat events every ``heartbeat_ms``; each becomes a
``Heartbeat`` so that the merge never stalls. Rolled-back InnoDB work is never
written to the binlog, so it never leaves the region.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from ..bqueue import Closed
from ..config import RegionConfig
from ..errors import FatalSourceError, SourceError
from ..model import ColumnInfo, Ddl, Heartbeat, Position, RowChange, TableSchema, Txn
from ..tso import RegionClock
from .base import Region, RegionContext
from .ddl import ddl_target, is_data_ddl, is_ignorable
from ..spill import DEFAULT_CHUNK_ROWS, SpillWriter
from .rowdecode import fast_rows, normalise_library_row

log = logging.getLogger(__name__)

_EVENTS = [
    GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent, RotateEvent, HeartbeatLogEvent,
    WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
]

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
    if problems:
        raise FatalSourceError(
            f"{where}: server settings do not allow row capture: {'; '.join(problems)}. "
            "Set them in the server's config file ([mariadbd] / [mysqld] section: "
            "log_bin=<basename>, binlog_format=ROW, binlog_row_image=FULL, "
            "binlog_row_metadata=FULL) and restart it; binlog_format/binlog_row_image/"
            "binlog_row_metadata can also be changed with SET GLOBAL."
        )


class MySQLRegion(Region):
    def __init__(self, cfg: RegionConfig, ctx: RegionContext):
        super().__init__(cfg.name, ctx)
        self.cfg = cfg
        self.where = f"region {cfg.name} ({cfg.host}:{cfg.port})"
        self.clock = RegionClock(cfg.name, ctx.floor, ctx.journal)
        self._clock_offset_ms = 0.0
        self._schemas: dict[tuple[str, str, tuple[str, ...]], TableSchema] = {}
        self._ukeys: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._meta: pymysql.connections.Connection | None = None
        self.fast_events = 0
        self.library_events = 0

    # --- connection ---------------------------------------------------------
    def _conn_settings(self) -> dict[str, Any]:
        return {
            "host": self.cfg.host,
            "port": self.cfg.port,
            "user": self.cfg.user,
            "passwd": self.cfg.password,
            "connect_timeout": self.cfg.connect_timeout,
            "read_timeout": max(30.0, self.cfg.heartbeat_ms / 1000 * 20),
        }

    def _connect(self) -> pymysql.connections.Connection:
        try:
            return pymysql.connect(
                host=self.cfg.host, port=self.cfg.port, user=self.cfg.user,
                password=self.cfg.password, charset="utf8mb4", autocommit=True,
                connect_timeout=self.cfg.connect_timeout, read_timeout=30,
            )
        except pymysql.err.OperationalError as exc:
            code = exc.args[0] if exc.args else 0
            if code in (1045, 1044):  # access denied
                raise FatalSourceError(f"{self.where}: {exc.args[1]}") from None
            raise SourceError(f"{self.where}: cannot connect: {exc}") from exc

    def _prepare(self) -> Position:
        """Check the server, measure its clock, and decide where to read from."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                    "('log_bin','binlog_format','binlog_row_image','binlog_row_metadata')"
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
                if self.position is not None:
                    names = {n: size for n, size in logs}
                    if self.position.file not in names:
                        raise FatalSourceError(
                            f"{self.where}: resume position {self.position} is no longer on the "
                            f"server (purged?); the oldest binlog is {logs[0][0]}. Rows between "
                            "would be lost; re-seed the destinations and delete the checkpoint "
                            "to start over."
                        )
                    return self.position
                start = self.cfg.start
                if start == "earliest":
                    return Position(logs[0][0], 4)
                if start == "latest":
                    cur.execute("SHOW MASTER STATUS")
                    row = cur.fetchone()
                    return Position(str(row[0]), int(row[1]))
                file, _, pos = start.rpartition(":")
                return Position(file, int(pos))
        finally:
            conn.close()

    # --- table metadata -----------------------------------------------------
    def _keys_from_server(self, db: str, table: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
        """(primary key, unique keys) from information_schema, cached until a DDL."""
        key = (db, table)
        if key in self._ukeys:
            return self._ukeys[key]  # type: ignore[return-value]
        pk: tuple[str, ...] = ()
        uks: dict[str, list[str]] = {}
        try:
            if self._meta is None:
                self._meta = self._connect()
            with self._meta.cursor() as cur:
                cur.execute(
                    "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
                    "WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s AND NON_UNIQUE=0 "
                    "ORDER BY INDEX_NAME, SEQ_IN_INDEX",
                    (db, table),
                )
                for idx, col in cur.fetchall():
                    uks.setdefault(str(idx), []).append(str(col))
        except (pymysql.err.MySQLError, SourceError) as exc:
            log.warning("%s: cannot read keys of %s.%s: %s", self.where, db, table, exc)
            self._meta = None
        if "PRIMARY" in uks:
            pk = tuple(uks.pop("PRIMARY"))
        res = (pk, tuple(tuple(v) for _, v in sorted(uks.items())))
        self._ukeys[key] = res  # type: ignore[assignment]
        return res

    def _forget(self, db: str, table: str, sql: str) -> None:
        """Drop cached table metadata after a DDL: of that table, of a whole
        database, or everything when the statement renames (it names two tables)."""
        if not db or " RENAME " in f" {sql.upper()} ":
            self._schemas.clear()
            self._ukeys.clear()
            return
        for cache in (self._schemas, self._ukeys):
            for k in [k for k in cache if k[0] == db and (not table or k[1] == table)]:
                del cache[k]  # type: ignore[attr-defined]

    def _schema(self, ev: Any) -> TableSchema:
        cols = tuple(c.name for c in ev.columns)
        key = (ev.schema, ev.table, cols)
        s = self._schemas.get(key)
        if s is None:
            pk_raw = ev.primary_key
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
                           str(c.character_set_name or "").lower() == "binary")
                for c in ev.columns
            )
            s = TableSchema(ev.schema, ev.table, cols, pk, uks, tuple(c.type for c in ev.columns), info)
            self._schemas[key] = s
        return s

    # --- the loop -----------------------------------------------------------
    def _run(self) -> None:
        delay = 0.5
        while not self.ctx.stop.is_set():
            try:
                self.state = "connecting"
                start = self._prepare()
                self.position = start
                self._stream(start)
                delay = 0.5
            except Closed:
                break
            except FatalSourceError as exc:
                self.error = exc
                self.state = "failed"
                self.last_error = str(exc)
                log.error("%s", exc)
                return
            except (SourceError, pymysql.err.MySQLError, OSError, EOFError, struct.error) as exc:
                self.reconnects += 1
                self.state = "reconnecting"
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: %s; reconnecting in %.1fs", self.where, self.last_error, delay)
                if self.ctx.stop.wait(delay):
                    break
                delay = min(delay * 2, 30.0)
            except BaseException as exc:  # noqa: BLE001 - reported to the app
                self.error = exc
                self.state = "failed"
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("%s: failed", self.where)
                return
        self.state = "stopped"

    def _emit(self, item: Txn | Heartbeat) -> None:
        weight = item.weight if isinstance(item, Txn) else 1
        self.ctx.out.put(item, weight, stop=self.ctx.stop)

    def _heartbeat(self) -> None:
        now_ms = int(time.time() * 1000 + self._clock_offset_ms) - self.cfg.heartbeat_lag_ms
        ts = self.clock.heartbeat(now_ms)
        self.caught_up_at = time.time()
        self._emit(Heartbeat(self.name, ts, self.position))

    def _stream(self, start: Position) -> None:
        stream = BinLogStreamReader(
            connection_settings=self._conn_settings(),
            server_id=self.cfg.server_id,
            resume_stream=True,
            blocking=True,
            log_file=start.file,
            log_pos=start.pos,
            only_events=_EVENTS,
            slave_heartbeat=self.cfg.heartbeat_ms / 1000,
            is_mariadb=False,
            enable_logging=False,
        )
        self.state = "streaming"
        log.info("%s: reading from %s", self.where, start)
        # a first heartbeat at the floor tells the merger this region is alive
        self._emit(Heartbeat(self.name, self.clock.last_emitted, self.position))
        changes: list[RowChange] = []
        spill: SpillWriter | None = None  # the transaction so far, when it grew past spill_rows
        spill_rows = self.ctx.spill_rows
        gtid = ""
        in_txn = False
        try:
            for ev in stream:
                if self.ctx.stop.is_set():
                    break
                if isinstance(ev, HeartbeatLogEvent):
                    if not in_txn:
                        # the server has sent everything: the stream position is at a
                        # transaction boundary, past any trailing non-transaction events
                        here = Position(str(stream.log_file), int(stream.log_pos),
                                        self.position.gtid if self.position else "")
                        if self.position is None or (here.file, here.pos) > (self.position.file, self.position.pos):
                            self.position = here
                        self._heartbeat()
                    continue
                if ev.timestamp:
                    self.last_source_time = float(ev.timestamp)
                if isinstance(ev, (MariadbGtidEvent, GtidEvent)):
                    gtid = str(getattr(ev, "gtid", ""))
                    changes, spill = [], None
                    in_txn = True
                elif isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                    in_txn = True
                    schema = self._schema(ev)
                    changes.extend(self._changes(ev, schema))
                    if spill_rows and len(changes) >= (spill.chunk_rows if spill else spill_rows):
                        if spill is None:
                            spill = SpillWriter(self.ctx.spill_dir or None, min(spill_rows, DEFAULT_CHUNK_ROWS))
                            log.info("%s: transaction at %s:%s has more than %d rows: spilling it to disk",
                                     self.where, stream.log_file, stream.log_pos, spill_rows)
                        spill.add(changes)
                        changes = []
                elif isinstance(ev, XidEvent):
                    self._commit(stream, ev.timestamp, gtid, changes, None, spill)
                    changes, spill, gtid, in_txn = [], None, "", False
                elif isinstance(ev, QueryEvent):
                    q = ev.query if isinstance(ev.query, str) else ev.query.decode("utf-8", "replace")
                    head = q.strip().upper()
                    if head == "BEGIN":
                        in_txn = True
                    elif head in ("COMMIT", "ROLLBACK"):
                        # COMMIT ends a group of non-transactional (e.g. MyISAM) changes;
                        # ROLLBACK here means they were applied anyway and cannot be undone
                        if head == "ROLLBACK" and changes:
                            log.warning("%s: non-transactional changes before ROLLBACK at %s:%s "
                                        "were applied by the source; passing them on",
                                        self.where, stream.log_file, stream.log_pos)
                        self._commit(stream, ev.timestamp, gtid, changes, None, spill)
                        changes, spill, gtid, in_txn = [], None, "", False
                    elif is_ignorable(q):
                        continue
                    elif not is_data_ddl(q):
                        # GRANT, CREATE USER, FLUSH ...: nothing to replicate, but the
                        # position moves on (an empty transaction)
                        log.debug("%s: not passing on %r", self.where, q[:80])
                        self._commit(stream, ev.timestamp, gtid, [], None)
                        changes, gtid, in_txn = [], "", False
                    else:
                        schema_db = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) else str(ev.schema or "")
                        db, table = ddl_target(q, schema_db)
                        self._forget(db, table, q)
                        self._commit(stream, ev.timestamp, gtid, [], Ddl(db, q, table, schema_db))
                        changes, gtid, in_txn = [], "", False
        finally:
            stream.close()
            if self._meta is not None:
                try:
                    self._meta.close()
                except Exception:  # noqa: BLE001
                    pass
                self._meta = None

    def _changes(self, ev: Any, schema: TableSchema) -> list[RowChange]:
        """Row changes of a rows event: the fast decoder where it can, else the library."""
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
                changes: list[RowChange], ddl: Ddl | None, spill: SpillWriter | None = None) -> None:
        pos = Position(str(stream.log_file), int(stream.log_pos), gtid)
        ts = self.clock.commit(int(source_ts), pos)
        rows: Any
        if spill is None:
            rows = tuple(changes)
        else:
            if changes:
                spill.add(changes)
            rows = spill.finish()
            self.spilled_txns += 1
        txn = Txn(self.name, ts, pos, rows, ddl, int(source_ts), gtid)
        self._emit(txn)
        self.position = pos
        self.last_commit_ts = ts
        self.txns += 1
        self.rows += len(rows)

