"""Initial and on-demand snapshots of MySQL/MariaDB tables, consistent with the
binlog stream, chunked, lock-free, resumable.

How a chunk is made exact (MariaDB)
-----------------------------------
A worker reads one chunk (``snapshot_chunk_rows`` rows in primary-key order,
after the last key delivered) inside ``START TRANSACTION WITH CONSISTENT
SNAPSHOT``, and MariaDB tells the binlog position that snapshot is consistent
with (``binlog_snapshot_file`` / ``binlog_snapshot_pos``): the chunk is the
table's state at binlog position P, exactly, without any lock.

The region's binlog stream delivers the chunk once it has itself passed P (at a
transaction boundary X >= P): every key that a transaction between P and X
changed (old or new image) is dropped from the chunk, since that transaction,
already delivered with full row images, carries a newer state; every other row
is unchanged between P and X, so the chunk rows are the state at X. They go out
as one transaction of ``read`` changes right after X. Any number of workers may
read chunks of different tables at once (each with its own P), and a table can
be snapshotted again while streaming: the same rule holds. This is the DBLog
watermark idea with the watermarks read from MariaDB instead of written into the
source (the capturer needs no write access to the source).

A DDL on the table between P and X makes the chunk void: it is read again. A
table without a primary key uses a NOT NULL unique key; without either, the
whole table is read in one consistent snapshot (streamed to disk past
``spillRows``) and delivered as ``TRUNCATE`` plus its rows, corrected by the
rows that changes between P and X deleted and inserted (a multiset), so a target
ends up with exactly the source's rows.

Progress (per table: last key delivered, chunks, rows) travels in the region's
positions, so the checkpoint holds it: after ``kill -9`` the snapshot resumes
after the last acknowledged chunk.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..encode import quote_ident
from ..errors import FatalSourceError, SourceError
from ..model import ColumnInfo, Position, SnapshotMark, TableProgress, TableSchema

if TYPE_CHECKING:
    from .mysql import MySQLRegion

log = logging.getLogger(__name__)

MODES = ("never", "initial", "when_needed")
SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")

# information_schema DATA_TYPE -> the binlog table map's type code (as python-mysql-replication
# reports it), so snapshot rows carry the same TableSchema as binlog rows
_TYPE_CODE = {
    "tinyint": 1, "smallint": 2, "mediumint": 9, "int": 3, "integer": 3, "bigint": 8, "float": 4, "double": 5,
    "decimal": 246, "datetime": 18, "timestamp": 17, "time": 19, "date": 10, "year": 13, "char": 254,
    "varchar": 15, "tinytext": 252, "text": 252, "mediumtext": 252, "longtext": 252, "tinyblob": 252,
    "blob": 252, "mediumblob": 252, "longblob": 252, "binary": 254, "varbinary": 15, "enum": 247, "set": 248,
    "bit": 16, "json": 252, "uuid": 254, "inet6": 254, "inet4": 254,
}
# kept as their binary form, as the binlog carries them
_RAW_BINARY = {"uuid", "inet6", "inet4"}
_GEOMETRY = {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
             "geometrycollection"}
_STRINGISH = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob",
              "longblob", "binary", "varbinary", "enum", "set", "json", "uuid", "inet6", "inet4"}
_NUMERIC_KEY = {"enum", "set", "bit"}  # compared and kept as their number in a chunk key
_TEMPORAL = {"datetime", "date", "timestamp", "time"}  # kept as text in a chunk key (zero dates too)


class TableGone(Exception):
    """The table was dropped (or renamed away) while it was being snapshotted."""


class ColumnsChanged(Exception):
    """A column the plan names is gone: describe the table again."""


@dataclass
class Column:
    name: str
    data_type: str
    column_type: str
    precision: int
    scale: int
    binary: bool
    nullable: bool

    @property
    def code(self) -> int:
        return 255 if self.data_type in _GEOMETRY else _TYPE_CODE.get(self.data_type, 15)

    @property
    def bits(self) -> int:
        return self.precision if self.data_type == "bit" else 0


@dataclass
class TablePlan:
    """How to read one table: its columns, chunk key and the schema its rows carry."""

    db: str
    table: str
    columns: list[Column]
    key: tuple[str, ...]  # primary key, or a NOT NULL unique key; () = keyless
    schema: TableSchema
    estimated: int = 0
    described_at: Position | None = None  # the region's position when the columns were read

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    def key_columns(self) -> list[Column]:
        by = {c.name: c for c in self.columns}
        return [by[k] for k in self.key]

    def key_select(self, ident: Callable[[str], str] = quote_ident) -> str:
        """The chunk key as SELECT returns it for comparisons: ENUM/SET/BIT as their
        number, dates as text (a zero date is a key too), the rest as stored."""
        out = []
        for c in self.key_columns():
            q = ident(c.name)
            if c.data_type in _NUMERIC_KEY:
                out.append(f"CAST({q} AS UNSIGNED)")
            elif c.data_type in _TEMPORAL:
                out.append(f"CAST({q} AS CHAR)")
            elif c.data_type in _RAW_BINARY:
                out.append(f"CAST({q} AS BINARY)")
            else:
                out.append(q)
        return ", ".join(out)

    def key_compare(self, ident: Callable[[str], str] = quote_ident) -> list[str]:
        """Per key column, what ``> ?`` / ``= ?`` compares (matching ``key_select``)."""
        return [f"CAST({ident(c.name)} AS UNSIGNED)" if c.data_type in _NUMERIC_KEY else ident(c.name)
                for c in self.key_columns()]

    def select_list(self, ident: Callable[[str], str] = quote_ident, alias: bool = False) -> str:
        """The columns as SELECT reads them; ``alias``: each named as its column."""
        out = []
        for c in self.columns:
            q = ident(c.name)
            if c.data_type in _RAW_BINARY:
                e = f"CAST({q} AS BINARY)"
            elif c.data_type == "float":
                e = f"CAST({q} AS DOUBLE)"  # the float's exact value, as the binlog has it
            elif c.data_type == "timestamp":
                e = f"UNIX_TIMESTAMP({q})"  # independent of time zones; 0 for the zero timestamp
            elif c.data_type == "year":
                e = f"CAST({q} AS UNSIGNED)"  # (MariaDB Connector/Python fails on the year 0000)
            else:
                e = q
            out.append(f"{e} AS {q}" if alias and e != q else e)
        return ", ".join(out)

    def key_read_as_selected(self) -> bool:
        """Whether every key column reads in ``select_list`` as ``key_select`` reads
        it (then a chunk's last key is taken from its last row as read)."""
        return all(c.data_type not in _NUMERIC_KEY and c.data_type not in _TEMPORAL
                   and c.data_type not in ("float", "year") for c in self.key_columns())


def _epoch_value(v: Any) -> Any:
    if v is None:
        return None
    return dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(round(v * 1_000_000)) if not isinstance(v, int)
                                                  else v * 1_000_000)


def normalizers(plan: TablePlan, driver: str = "pymysql") -> list[Callable[[Any], Any] | None]:
    """Per column: what turns a value read by SELECT into the value the binlog
    decoder gives for it (None: the same already). MariaDB Connector/Python
    already gives zero dates as None, text as str and binary as bytes."""
    out: list[Callable[[Any], Any] | None] = []
    typed = driver == "mariadb"
    for c in plan.columns:
        t = c.data_type
        if typed and (t in ("datetime", "date", "year") or t in _GEOMETRY or (t in _STRINGISH and t not in (
                "set", "binary"))):
            out.append(None)
            continue
        if t == "timestamp":
            out.append(_epoch_value)
        elif t == "set":
            out.append(lambda v: None if v is None else (set(v.split(",")) if v else set()))
        elif t == "bit":
            width = c.bits

            def bit(v: Any, width: int = width) -> Any:
                if v is None:
                    return None
                n = int.from_bytes(v, "big") if isinstance(v, (bytes, bytearray)) else int(v)
                return format(n, f"0{width}b")
            out.append(bit)
        elif t in ("datetime", "date"):
            out.append(lambda v: None if isinstance(v, str) else v)  # pymysql gives zero dates as text
        elif t == "year":
            out.append(lambda v: None if v is None else int(v))
        elif t == "binary":
            # BINARY(n) reads back padded with zero bytes; the binlog carries it without them
            out.append(lambda v: None if v is None else bytes(v).rstrip(b"\x00"))
        elif t in _STRINGISH and c.binary:
            out.append(lambda v: None if v is None else (v.encode("utf-8") if isinstance(v, str) else bytes(v)))
        elif t in _GEOMETRY:
            out.append(lambda v: None if v is None else bytes(v))
        elif t in _STRINGISH:
            out.append(lambda v: None if v is None else (v.decode("utf-8", "replace")
                                                         if isinstance(v, (bytes, bytearray)) else v))
        else:
            out.append(None)
    return out


# --- drivers --------------------------------------------------------------------------

class Reader:
    """One connection for reading chunks: MariaDB Connector/Python where it is
    installed (a C client, several times faster), else pymysql."""

    def __init__(self, region: "MySQLRegion"):
        cfg = region.cfg
        self.where = region.where
        mariadb: Any = None
        if cfg.snapshot_driver != "pymysql":
            try:
                import mariadb  # type: ignore[import-not-found,no-redef]
            except ImportError:
                if cfg.snapshot_driver == "mariadb":
                    raise FatalSourceError(f"{self.where}: snapshot_driver=mariadb, but MariaDB Connector/Python "
                                           "is not installed (pip install mariadb; it needs libmariadb-dev)") from None
        if mariadb is not None:
            self.kind, self.ph = "mariadb", "?"
            self._errors: tuple[type[BaseException], ...] = (mariadb.Error,)
            try:
                self.conn: Any = mariadb.connect(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                                                 connect_timeout=int(max(1, cfg.connect_timeout)), autocommit=True)
            except mariadb.Error as exc:
                raise SourceError(f"{self.where}: snapshot connection failed: {exc}") from None
        else:
            import pymysql

            self.kind, self.ph = "pymysql", "%s"
            self._errors = (pymysql.err.MySQLError,)
            try:
                self.conn = pymysql.connect(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                                            charset="utf8mb4", autocommit=True, connect_timeout=cfg.connect_timeout)
            except pymysql.err.MySQLError as exc:
                raise SourceError(f"{self.where}: snapshot connection failed: {exc}") from None
        self.execute("SET time_zone = '+00:00'")
        self.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def ident(self, name: str) -> str:
        """A quoted identifier for SQL run with parameters (pymysql formats with
        ``%``, so a ``%`` in a name is doubled there)."""
        q = quote_ident(name)
        return q.replace("%", "%%") if self.kind == "pymysql" else q

    def table(self, db: str, table: str) -> str:
        return f"{self.ident(db)}.{self.ident(table)}"

    def lit(self, sql: str) -> str:
        """SQL text with a literal ``%`` (pymysql formats every statement here)."""
        return sql.replace("%", "%%") if self.kind == "pymysql" else sql

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` (identifiers made with ``ident``; placeholders ``self.ph``)."""
        cur = self.conn.cursor()
        try:
            if self.kind == "pymysql":
                cur.execute(sql, params)  # always formatted, so that %% in identifiers is read as %
            elif params:
                cur.execute(sql, params)
            else:
                cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []
        finally:
            cur.close()

    def fetch_dicts(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        """(MariaDB Connector/Python) the rows of ``sql`` as dicts keyed by its
        column names, made by the C client, read as they arrive."""
        cur = self.conn.cursor(buffered=True, dictionary=True)
        try:
            if params:
                cur.execute(sql, params)
            else:
                cur.execute(sql)
            return cur.fetchall()
        finally:
            cur.close()

    def stream(self, sql: str, params: tuple[Any, ...], batch: int) -> Any:
        """Rows of a big result, ``batch`` at a time, without holding them all."""
        if self.kind == "mariadb":
            cur = self.conn.cursor(buffered=False)
        else:
            import pymysql.cursors

            cur = self.conn.cursor(pymysql.cursors.SSCursor)
        try:
            if self.kind == "pymysql" or params:
                cur.execute(sql, params)
            else:
                cur.execute(sql)
            while True:
                rows = cur.fetchmany(batch)
                if not rows:
                    break
                yield rows
        finally:
            cur.close()

    def errno(self, exc: BaseException) -> int:
        for attr in ("errno",):
            v = getattr(exc, attr, None)
            if isinstance(v, int):
                return v
        args = getattr(exc, "args", ())
        return args[0] if args and isinstance(args[0], int) else 0

    def is_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self._errors)

    def snapshot_position(self) -> Position:
        rows = self.execute(self.lit("SHOW STATUS LIKE 'binlog_snapshot_%'"))
        d = {str(k).lower(): str(v) for k, v in rows}
        if "binlog_snapshot_file" not in d or "binlog_snapshot_position" not in d:
            raise FatalSourceError(
                f"{self.where}: the server reports no binlog_snapshot_file / binlog_snapshot_position (these are "
                "MariaDB's); a consistent snapshot needs a MariaDB source. Set snapshot=never in this region")
        return Position(d["binlog_snapshot_file"], int(d["binlog_snapshot_position"]))

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


def list_tables(reader: Reader, selected: Callable[[str, str], bool]) -> list[tuple[str, str]]:
    rows = reader.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                          "WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
    return [(str(db), str(t)) for db, t in rows
            if str(db).lower() not in SYSTEM_SCHEMAS and selected(str(db), str(t))]


def describe(reader: Reader, db: str, table: str) -> TablePlan:
    ph = reader.ph
    cols = reader.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, CHARACTER_SET_NAME, "
        f"IS_NULLABLE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {ph} AND TABLE_NAME = {ph} "
        "ORDER BY ORDINAL_POSITION", (db, table))
    if not cols:
        raise TableGone(f"{db}.{table}")
    columns = []
    for name, dtype, ctype, prec, scale, cs, nullable in cols:
        dtype = str(dtype).lower()
        columns.append(Column(str(name), dtype, str(ctype).lower(), int(prec or 0), int(scale or 0),
                              (cs is None and dtype in _STRINGISH | _GEOMETRY) or dtype in _RAW_BINARY,
                              str(nullable).upper() == "YES"))
    try:
        idx = reader.execute(f"SHOW INDEX FROM {reader.table(db, table)}")
    except Exception as exc:  # noqa: BLE001
        if reader.is_error(exc) and reader.errno(exc) == 1146:
            raise TableGone(f"{db}.{table}") from None
        raise
    pk, uks = promote_key(index_rows(idx))
    key = pk
    info = tuple(ColumnInfo(c.code, "unsigned" in c.column_type or c.data_type == "year",
                            c.precision if c.data_type == "decimal" else 0,
                            c.scale if c.data_type == "decimal" else 0, c.binary) for c in columns)
    names = tuple(c.name for c in columns)
    schema = TableSchema(db, table, names, pk, tuple(u for u in uks if all(x in names for x in u)),
                         tuple(i.type for i in info), info)
    est = reader.execute(f"SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = {ph} AND "
                         f"TABLE_NAME = {ph}", (db, table))
    return TablePlan(db, table, columns, key, schema, int(est[0][0] or 0) if est else 0)


def create_table_sql(db: str, table: str, show_create: str) -> str:
    """``CREATE TABLE IF NOT EXISTS db.table ...`` from SHOW CREATE TABLE's text
    (which names the table without its database); "" if it does not look like one."""
    head = f"CREATE TABLE {quote_ident(table)}"
    if not show_create.startswith(head):
        return ""
    return f"CREATE TABLE IF NOT EXISTS {quote_ident(db)}.{quote_ident(table)}" + show_create[len(head):]


def index_rows(show_index: list[tuple[Any, ...]]) -> list[tuple[str, str, bool, bool, bool]]:
    """SHOW INDEX rows as (index, column, unique, nullable, prefix), in the server's
    own index order."""
    out = []
    for r in show_index:
        non_unique, key_name, column, sub_part, null = r[1], r[2], r[4], r[7], r[9]
        out.append((str(key_name), str(column), int(non_unique) == 0, str(null or "").upper() == "YES",
                    sub_part is not None))
    return out


def promote_key(rows: list[tuple[str, str, bool, bool, bool]]) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(key, other unique keys) from ``index_rows``: the primary key, or else the first
    unique index (in the server's order, as InnoDB and the binlog's table map pick a
    table's identity) whose columns are all NOT NULL and whole; a table with
    neither is keyless. The other unique keys are sorted by index name."""
    keys: dict[str, list[str]] = collections.OrderedDict()
    unfit: set[str] = set()
    for iname, cname, unique, nullable, prefix in rows:
        if not unique:
            continue
        keys.setdefault(iname, []).append(cname)
        if nullable or prefix:
            unfit.add(iname)
    if "PRIMARY" in keys:
        pk = tuple(keys.pop("PRIMARY"))
    else:
        name = next((n for n in keys if n not in unfit), None)
        pk = tuple(keys.pop(name)) if name is not None else ()
    return pk, tuple(tuple(v) for _, v in sorted(keys.items()))


def keyset_where(exprs: list[str], ph: str) -> str:
    """``(k1, k2, ...) > (?, ?, ...)`` written so that an index range is used."""
    ors = []
    for i in range(len(exprs)):
        parts = [f"{e} = {ph}" for e in exprs[:i]] + [f"{exprs[i]} > {ph}"]
        ors.append("(" + " AND ".join(parts) + ")")
    return " OR ".join(ors)


def keyset_params(last: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    for i in range(len(last)):
        out.extend(last[:i + 1])
    return tuple(out)


@dataclass
class Chunk:
    plan: TablePlan
    at: Position  # the binlog position the rows are consistent with
    rows: list[dict[str, Any]]  # (keyed tables) or a SpilledChanges-backed list (keyless: see spill)
    last_key: tuple[Any, ...] | None
    last: bool
    index: int
    run: str
    truncate: bool = False
    spilled: Any = None  # keyless tables: the rows as a SpilledChanges of "read" changes
    create_sql: str = ""  # first chunk of a run: the table's CREATE TABLE (IF NOT EXISTS), sent first
    gen: int = 0  # the region's snapshot generation when it was read (a binlog reset voids it)


def row_key(row: dict[str, Any], key: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(_hashable(row.get(c)) for c in key)


def _hashable(v: Any) -> Any:
    if isinstance(v, (set, frozenset)):
        return frozenset(v)
    if isinstance(v, bytearray):
        return bytes(v)
    return v


def image_key(row: dict[str, Any], cols: tuple[str, ...]) -> tuple[Any, ...]:
    """A whole row as a multiset element (keyless tables)."""
    return tuple(_hashable(row.get(c)) for c in cols)


@dataclass
class Recorder:
    """What the binlog changed in one table while chunks of it are in flight."""

    key: tuple[str, ...]
    columns: tuple[str, ...]
    changed: dict[tuple[Any, ...], Position] = field(default_factory=dict)  # keyed: key -> last change
    # keyless: (pos, -1 deleted / +1 inserted, row as a tuple, row)
    events: list[tuple[Position, int, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    lows: dict[int, Position] = field(default_factory=dict)  # in-flight chunk -> lower bound of its P

    def record(self, pos: Position, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        if self.key:
            for img in (before, after):
                if img is not None:
                    self.changed[row_key(img, self.key)] = pos
        else:
            if before is not None:
                self.events.append((pos, -1, image_key(before, self.columns), before))
            if after is not None:
                self.events.append((pos, 1, image_key(after, self.columns), after))

    def prune(self) -> None:
        if not self.lows:
            self.changed.clear()
            self.events.clear()
            return
        low = min((p.file, p.pos) for p in self.lows.values())
        self.changed = {k: p for k, p in self.changed.items() if (p.file, p.pos) > low}
        self.events = [e for e in self.events if (e[0].file, e[0].pos) > low]


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


class Snapshotter:
    """The snapshot workers of one MySQL/MariaDB region."""

    def __init__(self, region: "MySQLRegion", workers: int, chunk_rows: int):
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

    def request(self, tables: list[tuple[str, str]], truncate: bool = False) -> str:
        """Copy these tables (again); returns the run id."""
        run = uuid.uuid4().hex[:12]
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
                           "error": t.error}
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
        reader: Reader | None = None
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
                                reader = Reader(self.region)
                                self.driver = reader.kind
                            self._copy(reader, key, task)
                            delay = 0.5
                            break
                        except FatalSourceError:
                            raise
                        except (SourceError, OSError) as exc:
                            self._retry(task, exc, delay)
                        except Exception as exc:  # noqa: BLE001 - driver errors
                            if reader is None or not reader.is_error(exc):
                                raise
                            if reader.errno(exc) in (1142, 1143, 1227):
                                raise FatalSourceError(f"{self.region.where}: snapshot of {task.name}: no "
                                                       f"privilege to read it ({exc})") from None
                            self._retry(task, exc, delay)
                        if reader is not None:
                            reader.close()
                        reader = None
                        if self.stop.wait(delay):
                            break
                        delay = min(delay * 2, 30)
                finally:
                    with self.lock:
                        self.busy.discard(key)
        except BaseException as exc:  # noqa: BLE001 - the region reports it
            self.region.snapshot_failed(exc)
        finally:
            if reader is not None:
                reader.close()
            with self.lock:
                me = threading.current_thread()
                self.threads = [t for t in self.threads if t is not me]

    def _retry(self, task: TableTask, exc: BaseException, delay: float) -> None:
        task.error = f"{type(exc).__name__}: {exc}"
        log.warning("%s: snapshot of %s: %s; retrying in %.1fs", self.region.where, task.name, task.error, delay)

    def _current(self, key: tuple[str, str], task: TableTask) -> bool:
        """Whether ``task`` is still the table's run (a newer request supersedes it)."""
        with self.lock:
            return self.tasks.get(key) is task

    def _copy(self, reader: Reader, key: tuple[str, str], task: TableTask) -> None:
        db, table = key
        try:
            plan = self._describe(reader, db, table)
        except TableGone:
            self._gone(task)
            return
        task.estimated = plan.estimated
        if not task.started:
            task.started = time.time()
        if task.progress.state == "pending":
            self._set(task, dataclasses.replace(task.progress, state="running"))
        log.info("%s: snapshot of %s starts (key %s, ~%d rows, %s)", self.region.where, plan.name,
                 ",".join(plan.key) or "none: one consistent read of the whole table", plan.estimated,
                 reader.kind)
        while not self.stop.is_set() and not self.region.ctx.stop.is_set():
            p = task.progress
            if p.state != "running" or not self._current(key, task):
                return
            token = self.region.chunk_begin(plan)
            try:
                try:
                    chunk = self._read(reader, plan, p)
                except ColumnsChanged:
                    outcome: Any = "redo"
                except TableGone:
                    self._gone(task)
                    return
                else:
                    outcome = self.region.emit_chunk(chunk)
            finally:
                self.region.chunk_end(plan, token)
            task.error = ""
            if outcome == "redo":  # the table changed shape (or the binlog restarted): read it again
                try:
                    plan = self._describe(reader, db, table)
                except TableGone:
                    self._gone(task)
                    return
                continue
            if isinstance(outcome, str):  # stopped, or superseded by a newer run of the table
                return
            task.rows_read += len(chunk.rows) if chunk.spilled is None else len(chunk.spilled)
            task.progress = outcome
            self.log_progress()
            if chunk.last:
                log.info("%s: snapshot of %s done: %d rows in %d chunks", self.region.where, plan.name,
                         task.progress.rows, task.progress.chunks)
                return

    def _describe(self, reader: Reader, db: str, table: str) -> TablePlan:
        at = self.region.position_now()
        plan = describe(reader, db, table)
        plan.described_at = at
        return plan

    def _set(self, task: TableTask, p: TableProgress) -> None:
        task.progress = p
        self.region.update_snapshot_progress(p)

    def _gone(self, task: TableTask) -> None:
        log.warning("%s: snapshot of %s: the table no longer exists (dropped or renamed); its DROP/RENAME is "
                    "in the binlog stream; moving on", self.region.where, task.name)
        self._set(task, dataclasses.replace(task.progress, state="dropped"))

    def _read(self, reader: Reader, plan: TablePlan, p: TableProgress) -> Chunk:
        ph = reader.ph
        norm = normalizers(plan, reader.kind)
        names = [c.name for c in plan.columns]
        make = row_maker(names, norm)
        gen = self.region.snapshot_generation()
        reader.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        try:
            at = reader.snapshot_position()
            create = self._create_sql(reader, plan) if p.chunks == 0 else ""
            if not plan.key:
                chunk = self._read_keyless(reader, plan, p, at, names, norm)
                chunk.create_sql, chunk.gen = create, gen
                return chunk
            order = ", ".join(reader.ident(c) for c in plan.key)
            nk = len(plan.key)
            # rows straight as dicts from the C client where the key is read as it is selected
            as_dicts = reader.kind == "mariadb" and plan.key_read_as_selected()
            if as_dicts:
                sql = f"SELECT {plan.select_list(reader.ident, alias=True)} FROM {reader.table(plan.db, plan.table)}"
            else:
                sql = (f"SELECT {plan.select_list(reader.ident)}, {plan.key_select(reader.ident)} "
                       f"FROM {reader.table(plan.db, plan.table)}")
            params: tuple[Any, ...] = ()
            if p.last_key is not None:
                sql += f" WHERE {keyset_where(plan.key_compare(reader.ident), ph)}"
                params = keyset_params(p.last_key)
            sql += f" ORDER BY {order} LIMIT {self.chunk_rows}"
            try:
                if as_dicts:
                    rows = reader.fetch_dicts(sql, params)
                    last_key = tuple(rows[-1][k] for k in plan.key) if rows else p.last_key
                    fix_rows(rows, names, norm)
                else:
                    raw = reader.execute(sql, params)
                    rows = [make(r) for r in raw]
                    last_key = tuple(raw[-1][-nk:]) if raw else p.last_key
            except Exception as exc:  # noqa: BLE001
                if reader.is_error(exc) and reader.errno(exc) == 1146:
                    raise TableGone(plan.name) from None
                if reader.is_error(exc) and reader.errno(exc) == 1054:  # a column went since it was described
                    raise ColumnsChanged(plan.name) from None
                raise
            return Chunk(plan, at, rows, last_key, len(rows) < self.chunk_rows, p.chunks, p.run,
                         p.truncate and p.chunks == 0, create_sql=create, gen=gen)
        finally:
            reader.execute("COMMIT")

    def _create_sql(self, reader: Reader, plan: TablePlan) -> str:
        """``CREATE TABLE IF NOT EXISTS db.table ...`` as the source has it (so that a
        new target gets the table before its rows, as the binlog would have given it)."""
        if not self.region.cfg.snapshot_ddl:
            return ""
        try:
            rows = reader.execute(f"SHOW CREATE TABLE {reader.table(plan.db, plan.table)}")
        except Exception as exc:  # noqa: BLE001
            if reader.is_error(exc) and reader.errno(exc) == 1146:
                raise TableGone(plan.name) from None
            raise
        return create_table_sql(plan.db, plan.table, str(rows[0][1])) if rows else ""

    def _read_keyless(self, reader: Reader, plan: TablePlan, p: TableProgress, at: Position, names: list[str],
                      norm: list[Callable[[Any], Any] | None]) -> Chunk:
        make = row_maker(names, norm)
        from ..model import RowChange
        from ..spill import DEFAULT_CHUNK_ROWS, SpillWriter

        ctx = self.region.ctx
        spill = SpillWriter(ctx.spill_dir or None, min(ctx.spill_rows or DEFAULT_CHUNK_ROWS, DEFAULT_CHUNK_ROWS))
        sql = f"SELECT {plan.select_list(reader.ident)} FROM {reader.table(plan.db, plan.table)}"
        try:
            for batch in reader.stream(sql, (), 5000):
                spill.add([RowChange(plan.schema, "read", None, make(r)) for r in batch])
        except Exception as exc:  # noqa: BLE001
            if reader.is_error(exc) and reader.errno(exc) == 1146:
                raise TableGone(plan.name) from None
            if reader.is_error(exc) and reader.errno(exc) == 1054:
                raise ColumnsChanged(plan.name) from None
            raise
        return Chunk(plan, at, [], None, True, p.chunks, p.run, True, spill.finish())

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(2)


def row_maker(names: list[str], norm: list[Callable[[Any], Any] | None]) -> Callable[[tuple[Any, ...]], dict[str, Any]]:
    """``raw row -> dict``: one C-level dict(zip()) and only the columns that need it fixed."""
    fixes = [(n, f) for n, f in zip(names, norm) if f is not None]
    if not fixes:
        return lambda raw: dict(zip(names, raw))

    def make(raw: tuple[Any, ...]) -> dict[str, Any]:
        d = dict(zip(names, raw))
        for n, f in fixes:
            d[n] = f(d[n])
        return d
    return make


def fix_rows(rows: list[dict[str, Any]], names: list[str], norm: list[Callable[[Any], Any] | None]) -> None:
    """``norm`` applied in place to rows read as dicts."""
    fixes = [(n, f) for n, f in zip(names, norm) if f is not None]
    if fixes:
        for d in rows:
            for n, f in fixes:
                d[n] = f(d[n])


def chunk_mark(chunk: Chunk) -> SnapshotMark:
    return SnapshotMark(chunk.run, chunk.index, chunk.last)
