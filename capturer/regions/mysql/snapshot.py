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

How a chunk is made exact without MariaDB's position (MySQL; ``snapshot_method``)
----------------------------------------------------------------------------------
MySQL 5.7/8.x report no consistent-snapshot binlog position, and a position read
next to a lock-free read is not exact: a transaction is written to the binlog
*before* InnoDB makes it visible, so a lock-free SELECT made after ``SHOW MASTER
STATUS`` can still miss a transaction the binlog had before that position (the
window the watermark method of Flink CDC leaves open; DBLog closes it by writing
its watermarks into a table of the source, which needs write access there).

``snapshot_method=watermark`` reads a chunk with a *locking* read instead:
``START TRANSACTION; SELECT ... ORDER BY key LIMIT n LOCK IN SHARE MODE NOWAIT;
SHOW MASTER STATUS; COMMIT`` (``FOR SHARE NOWAIT`` on MySQL 8.0+). The shared next-key locks (REPEATABLE READ) cover
every row and gap of the chunk's key range, so while the locks are held no
transaction can change that range, and every transaction that changed it before
has committed (it held its row locks until InnoDB committed it, after its binlog
write). The binlog position read while the locks are held (the high watermark)
is therefore a P at which the chunk is the range's state, exactly, and the rest
is the MariaDB rule above: delivered at X >= P, without the keys that changed
between P and X. ``NOWAIT`` makes the read fail at once where a row is locked by a
writer, so the snapshot never waits while holding locks (it cannot take part in a
deadlock, and a writer waits for it at most for one chunk's read): the chunk is
read again after a short pause, and after ``_NOWAIT_TRIES`` failures it waits for
the locks like any reader (``innodb_lock_wait_timeout`` of its session set to a
few seconds). MySQL 5.7 has no NOWAIT: there it waits from the start. A keyless
table is one such read of the whole table (writers to it wait for that read).
``snapshot_method=auto`` uses MariaDB's position where the server reports it and
the watermark otherwise.

The start of a table's run (its ``CREATE TABLE IF NOT EXISTS``, and for
``truncate`` its ``TRUNCATE``) is a step of its own, delivered in stream order
at a point X0 *before* chunk 0 is read: every chunk is then read at a P >= X0,
so every binlog transaction after the TRUNCATE (delivered after it) survives
it. The step moves the table from ``pending`` to ``running`` in the positions,
so a restart after it was acknowledged never truncates again, and one before it
does it again.

Progress (per table: last key delivered, chunks, rows) travels in the region's
positions, so the checkpoint holds it: after ``kill -9`` the snapshot resumes
after the last acknowledged chunk. The last key is stored with the key it is a
value of (``key=<columns and types>`` as its first element): a table whose key
changed since is copied again from its start.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import re
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model import ColumnInfo, Position, RowChange, TableProgress, TableSchema
from capturer.model.encode import _fastrows, quote_ident
from capturer.model.spill import DEFAULT_CHUNK_ROWS, SpillWriter
from capturer.regions.snapshot import ColumnsChanged, SnapshotHost, Snapshotter, TableGone
from capturer.regions.snapshot_plan import Chunk, Column, TablePlan, split_key
from capturer.util import mysqlconn
from capturer.util.binlogpos import binlog_end
from capturer.util.memory import gc_paused
from capturer.util.mysqlconn import mariadb_tls_kwargs

log = logging.getLogger(__name__)


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
_NUMERIC_KEY = {"enum", "set", "bit"}  # kept as their number in a chunk key
_TEMPORAL = {"datetime", "date", "timestamp", "time"}  # kept as text in a chunk key (zero dates too)
_INTEGER = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint"}


def _zerofill_int(c: Column) -> bool:
    """An integer column with ZEROFILL: MariaDB Connector/Python 1.1 fails on its values (a SystemError,
    "returned a result with an exception set", on 0 and some others), so it is read as CAST(... AS UNSIGNED)
    (ZEROFILL implies UNSIGNED: the same number)."""
    return c.data_type in _INTEGER and "zerofill" in c.column_type.lower()


def type_code(c: Column) -> int:
    """The binlog table map's type code of a column (as python-mysql-replication reports it)."""
    return 255 if c.data_type in _GEOMETRY else _TYPE_CODE.get(c.data_type, 15)


class MySQLPlan(TablePlan):
    """A MySQL/MariaDB table's plan: how its chunk key and columns are read."""

    def key_select(self, ident: Callable[[str], str] = quote_ident) -> str:
        """The chunk key as SELECT returns it for comparisons: ENUM/SET/BIT as their
        number, dates as text (a zero date is a key too), FLOAT as its exact double
        (its shortest text would not compare equal to the stored value), the rest as
        stored."""
        out = []
        for c in self.key_columns():
            q = ident(c.name)
            if c.data_type in _NUMERIC_KEY:
                out.append(f"CAST({q} AS UNSIGNED)")
            elif c.data_type in _TEMPORAL:
                out.append(f"CAST({q} AS CHAR)")
            elif c.data_type in _RAW_BINARY:
                out.append(f"CAST({q} AS BINARY)")
            elif c.data_type == "float":
                out.append(f"CAST({q} AS DOUBLE)")
            elif _zerofill_int(c):
                out.append(f"CAST({q} AS UNSIGNED)")
            else:
                out.append(q)
        return ", ".join(out)

    def key_where(self, values: tuple[Any, ...], ident: Callable[[str], str], ph: str) -> tuple[str, tuple[Any, ...]]:
        """``(k1, k2, ...) > values`` (values as ``key_select`` reads them), written so
        that an index range is used: ``(k1 > ?) OR (k1 = ? AND k2 > ?) ...``. Each
        column is compared as stored (an index range), with what is exact for it:
        FLOAT with its exact double, BIT with its number, ENUM by member names
        (``IN (...)`` for "after"), SET with its number but as a number for "after"
        (no range: a SET key scans the index up to the last key for each chunk)."""
        cols = self.key_columns()
        ors: list[str] = []
        params: list[Any] = []
        for i in range(len(cols)):
            parts = []
            for j in range(i):
                sql, ps = _key_cmp(cols[j], "=", values[j], ident, ph)
                parts.append(sql)
                params.extend(ps)
            sql, ps = _key_cmp(cols[i], ">", values[i], ident, ph)
            parts.append(sql)
            params.extend(ps)
            ors.append("(" + " AND ".join(parts) + ")")
        return " OR ".join(ors), tuple(params)

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
            elif c.data_type == "year" or _zerofill_int(c):
                e = f"CAST({q} AS UNSIGNED)"  # (MariaDB Connector/Python fails on the year 0000, and on ZEROFILL)
            elif c.data_type in ("datetime", "date"):
                # a date no calendar has (zero dates, a zero month or day, 2020-02-30 under ALLOW_INVALID_DATES,
                # the year 0) as NULL, as the binlog decoder gives it: MariaDB Connector/Python 1.1 crashes the
                # process (SIGSEGV) on some of them (a DATETIME(3) of 2024-02-00), and pymysql gives them as text
                e = f"IF({q} = DATE_ADD({q}, INTERVAL 0 DAY), {q}, NULL)"
            else:
                e = q
            out.append(f"{e} AS {q}" if alias and e != q else e)
        return ", ".join(out)

    def key_read_as_selected(self) -> bool:
        """Whether every key column reads in ``select_list`` as ``key_select`` reads
        it (then a chunk's last key is taken from its last row as read)."""
        return all(c.data_type not in _NUMERIC_KEY and c.data_type not in _TEMPORAL
                   and c.data_type not in ("float", "year") for c in self.key_columns())


def _key_cmp(c: Column, op: str, v: Any, ident: Callable[[str], str], ph: str) -> tuple[str, list[Any]]:
    """One key column compared (``=`` or ``>``) with ``v`` as ``key_select`` read it."""
    q = ident(c.name)
    if c.data_type == "enum":
        members = c.enum_members()
        if members is not None and v is not None and 1 <= int(v) <= len(members):
            if op == "=":
                return f"{q} = {ph}", [members[int(v) - 1]]
            after = members[int(v):]
            if not after:
                return "0 = 1", []
            return f"{q} IN ({', '.join([ph] * len(after))})", after
        if members is not None and v is not None and int(v) == 0 and op == ">":  # '' (an invalid value) is first
            return f"{q} IN ({', '.join([ph] * len(members))})", list(members)
        return f"CAST({q} AS UNSIGNED) {op} {ph}", [v]
    if c.data_type == "set":
        return (f"{q} = {ph}" if op == "=" else f"CAST({q} AS UNSIGNED) > {ph}"), [v]
    return f"{q} {op} {ph}", [v]


def _epoch_value(v: Any) -> Any:
    if v is None or v == 0:  # (0: the zero TIMESTAMP, None as the binlog decoder gives it)
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
            width = c.precision

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
            # BINARY(n) reads back padded with zero bytes to n, as the region pads the binlog's values
            out.append(lambda v: None if v is None else bytes(v))
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

    def __init__(self, region: SnapshotHost):
        # the server the region's stream reads (after a failover: the new primary), and the
        # snapshot generation that choice belongs to (a read of a later one needs a new connection)
        target = getattr(region, "snapshot_server", None)
        if target is not None:
            self.gen, cfg, self.where = target()
        else:
            self.gen, cfg, self.where = None, region.cfg, region.where
        self.method = region.snap_method  # consistent | watermark (resolved by the region)
        self.nowait = True  # (watermark) a locking read that fails at once on a lock, where the server has it
        self.share = " LOCK IN SHARE MODE"  # MariaDB's and MySQL 5.7's; MySQL 8 takes NOWAIT only after FOR SHARE
        mariadb: Any = None
        if cfg.snapshot_driver != "pymysql":
            try:
                import mariadb  # type: ignore[no-redef]
            except ImportError:
                if cfg.snapshot_driver == "mariadb":
                    raise FatalSourceError(f"{self.where}: snapshot_driver=mariadb, but MariaDB Connector/Python "
                                           "is not installed (pip install mariadb; it needs libmariadb-dev)") from None
        if mariadb is not None:
            self.kind, self.ph = "mariadb", "?"
            self._errors: tuple[type[BaseException], ...] = (mariadb.Error, StreamCutShort)
            try:
                self.conn: Any = mariadb.connect(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                                                 connect_timeout=int(max(1, cfg.connect_timeout)), autocommit=True,
                                                 **mariadb_tls_kwargs(cfg.ssl_mode, cfg.ssl_ca, cfg.ssl_cert,
                                                                      cfg.ssl_key))
            except mariadb.Error as exc:
                raise SourceError(f"{self.where}: snapshot connection failed: {exc}") from None
        else:
            import pymysql


            self.kind, self.ph = "pymysql", "%s"
            self._errors = (pymysql.err.MySQLError,)
            try:
                self.conn = mysqlconn.connect(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                                            charset="utf8mb4", autocommit=True, connect_timeout=cfg.connect_timeout,
                                            **cfg.tls())
            except pymysql.err.MySQLError as exc:
                raise SourceError(f"{self.where}: snapshot connection failed: {exc}") from None
        self.execute("SET time_zone = '+00:00'")
        # the server's sql_mode must not change what is read: PAD_CHAR_TO_FULL_LENGTH pads CHAR
        # values (keys too), ANSI_QUOTES / NO_BACKSLASH_ESCAPES change how statements are read
        self.execute("SET SESSION sql_mode = ''")
        self.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # (next-key locks: watermark)
        if self.method == "watermark":
            self.execute("SET SESSION innodb_lock_wait_timeout = 5")
            self.share, self.nowait = share_clause(str(self.execute("SELECT VERSION()")[0][0]))

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
            if self.kind == "mariadb":
                self._raise_cut_short()
        finally:
            cur.close()

    def _raise_cut_short(self) -> None:
        """(MariaDB Connector/Python) Raise the error that ended an unbuffered result.
        Its unbuffered cursor (1.1) reads an error the server sends in the middle of
        the rows (a lock wait timeout or a locking read's NOWAIT, a KILL QUERY,
        max_statement_time) as the end of the rows, silently: a copy would miss every
        row after it (and under the watermark method, rows whose transactions are
        before the position read next would be lost). The server still has the
        statement's errors in its diagnostics area: SHOW ERRORS reads them."""
        rows = self.execute("SHOW ERRORS")
        if rows:
            level, code, message = rows[0][0], int(rows[0][1]), str(rows[0][2])
            raise StreamCutShort(code, f"{level} {code}: {message} (the rows read stopped there)")

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

    def binlog_position(self) -> Position:
        """The binlog position the server writes next (the watermark method's high
        watermark: read while the chunk's locks are held)."""
        got = binlog_end(lambda sql: self.execute(sql))
        if got is None:
            raise FatalSourceError(f"{self.where}: the server reports no binlog position (is log_bin on?)")
        return Position(*got)

    def begin_read(self) -> Position | None:
        """Open a chunk's transaction: MariaDB's consistent snapshot and its binlog
        position; or (watermark) a plain transaction whose position is read after
        the locking SELECT (None here)."""
        if self.method == "watermark":
            self.execute("START TRANSACTION")
            return None
        self.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        return self.snapshot_position()

    def lock_clause(self, tries: int) -> str:
        """(watermark) How a chunk's SELECT locks what it reads: shared, without
        waiting while the chunk is young in tries, then waiting (see the module)."""
        if self.method != "watermark":
            return ""
        return self.share + (" NOWAIT" if self.nowait and tries < _NOWAIT_TRIES else "")

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


def share_clause(version: str) -> tuple[str, bool]:
    """(the shared locking clause, whether NOWAIT can follow it) for a server's
    ``VERSION()``: MariaDB (10.3+) ``LOCK IN SHARE MODE NOWAIT``; MySQL 8.0+ ``FOR
    SHARE NOWAIT`` (it refuses NOWAIT after LOCK IN SHARE MODE); MySQL 5.7 ``LOCK IN
    SHARE MODE`` without NOWAIT (it has none)."""
    if "mariadb" in version.lower():
        return " LOCK IN SHARE MODE", True
    try:
        major = int(version.split(".", 1)[0])
    except ValueError:
        return " LOCK IN SHARE MODE", False
    return (" FOR SHARE", True) if major >= 8 else (" LOCK IN SHARE MODE", False)


# (watermark) a chunk is read with NOWAIT this many times before its read waits for locks
_NOWAIT_TRIES = 5
# errors of a locking read that only mean "read it again": lock wait timeout, deadlock,
# NOWAIT found a lock (MySQL 3572; MariaDB reports 1205 for it)
LOCK_ERRORS = (1205, 1213, 3572)


class StreamCutShort(Exception):
    """The server ended a streamed result with an error (``errno``) that the client
    library did not raise (see ``Reader._raise_cut_short``)."""

    def __init__(self, errno: int, message: str):
        super().__init__(errno, message)
        self.errno = errno


def list_tables(reader: Reader, selected: Callable[[str, str], bool]) -> list[tuple[str, str]]:
    """Every base table the filter selects (the filter's own rules decide on the
    system schemas: left out unless a rule names them)."""
    rows = reader.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                          "WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
    return [(str(db), str(t)) for db, t in rows if selected(str(db), str(t))]


def base_tables(execute: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]], ph: str,
                tables: list[tuple[str, str]]) -> dict[tuple[str, str], bool]:
    """Which of ``tables`` exist as base tables, each with whether it is keyless (no
    primary key and no NOT NULL unique key without prefix): ``{(db, table): keyless}``.
    ``execute(sql, params)`` runs a statement with ``ph`` placeholders."""
    out: dict[tuple[str, str], bool] = {}
    for start in range(0, len(tables), 200):
        part = tables[start:start + 200]
        cond = " OR ".join([f"(TABLE_SCHEMA = {ph} AND TABLE_NAME = {ph})"] * len(part))
        params = tuple(x for pair in part for x in pair)
        have = {(str(db), str(t)) for db, t in execute(
            f"SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
            f"AND ({cond})", params)}
        idx: dict[tuple[str, str], list[tuple[str, str, bool, bool, bool]]] = {}
        for db, t, iname, cname, non_unique, nullable, sub_part in execute(
                "SELECT TABLE_SCHEMA, TABLE_NAME, INDEX_NAME, COLUMN_NAME, NON_UNIQUE, NULLABLE, SUB_PART "
                f"FROM information_schema.STATISTICS WHERE ({cond}) ORDER BY TABLE_SCHEMA, TABLE_NAME, INDEX_NAME, "
                "SEQ_IN_INDEX", params):
            idx.setdefault((str(db), str(t)), []).append(
                (str(iname), str(cname), int(non_unique) == 0, str(nullable or "").upper() == "YES",
                 sub_part is not None))
        for db, t in part:
            hit = next(((hd, ht) for hd, ht in have if hd == db and ht == t), None) or next(
                ((hd, ht) for hd, ht in have if hd.lower() == db.lower() and ht.lower() == t.lower()), None)
            if hit is not None:
                out[(db, t)] = promote_key(idx.get(hit, []))[0] == ()
    return out


def _binary_length(c: Column) -> int:
    """n for a BINARY(n) column (``ColumnInfo.length``, as the binlog region sets it), else 0."""
    if c.data_type != "binary":
        return 0
    m = re.match(r"\s*binary\s*\(\s*(\d+)\s*\)", c.column_type, re.I)
    return int(m.group(1)) if m else 1  # (BINARY alone is BINARY(1))


def describe(reader: Reader, db: str, table: str) -> TablePlan:
    ph = reader.ph
    cols = reader.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, CHARACTER_SET_NAME, "
        f"IS_NULLABLE, COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {ph} AND "
        f"TABLE_NAME = {ph} ORDER BY ORDINAL_POSITION", (db, table))
    if not cols:
        raise TableGone(f"{db}.{table}")
    columns = []
    for name, dtype, ctype, prec, scale, cs, nullable, coll in cols:
        dtype = str(dtype).lower()
        columns.append(Column(str(name), dtype, str(ctype), int(prec or 0), int(scale or 0),
                              (cs is None and dtype in _STRINGISH | _GEOMETRY) or dtype in _RAW_BINARY,
                              str(nullable).upper() == "YES", str(coll or "")))
    try:
        idx = reader.execute(f"SHOW INDEX FROM {reader.table(db, table)}")
    except Exception as exc:
        if reader.is_error(exc) and reader.errno(exc) == 1146:
            raise TableGone(f"{db}.{table}") from None
        raise
    pk, uks = promote_key(index_rows(idx))
    key = pk
    info = tuple(ColumnInfo(type_code(c), "unsigned" in c.column_type.lower() or c.data_type == "year",
                            c.precision if c.data_type == "decimal" else 0,
                            c.scale if c.data_type == "decimal" else 0, c.binary, _binary_length(c))
                 for c in columns)
    names = tuple(c.name for c in columns)
    schema = TableSchema(db, table, names, pk, tuple(u for u in uks if all(x in names for x in u)),
                         tuple(i.type for i in info), info)
    est = reader.execute(f"SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = {ph} AND "
                         f"TABLE_NAME = {ph}", (db, table))
    return MySQLPlan(db, table, columns, key, schema, int(est[0][0] or 0) if est else 0)


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


class MySQLSnapshotter(Snapshotter):
    """The snapshot workers of one MySQL/MariaDB region: chunks read as the module
    says (MariaDB's consistent snapshot, or the watermark's locking read)."""

    def _new_reader(self) -> Any:
        """A connection for reading chunks (a region kind's snapshotter overrides the
        four methods around the source: this, ``_describe_table``, ``_begin_at`` and
        ``_read``)."""
        return Reader(self.region)

    def _describe_table(self, reader: Any, db: str, table: str) -> TablePlan:
        return describe(reader, db, table)

    def _begin_at(self, reader: Any, plan: TablePlan) -> tuple[Any, Any]:
        """(what the table's run starts with downstream: its CREATE; a position of the
        log at or after every DDL that reflects)."""
        create = self._create_sql(reader, plan)
        # a binlog position at or after every DDL SHOW CREATE TABLE reflects: the CREATE
        # goes out once the stream has passed it (a DDL after the describe: read again)
        if reader.method == "watermark":
            return create, reader.binlog_position()
        reader.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        try:
            return create, reader.snapshot_position()
        finally:
            reader.execute("COMMIT")

    def _read(self, reader: Any, plan: TablePlan, p: TableProgress, token: int = 0) -> Chunk:
        """A chunk (or a keyless table) as of a binlog position P. With the watermark
        method a read that met a writer's lock is made again (see the module)."""
        tries = 0
        while True:
            try:
                return self._read_once(reader, plan, p, tries)
            except Exception as exc:
                if reader.method != "watermark" or not reader.is_error(exc):
                    raise
                code = reader.errno(exc)
                if code == 1064 and reader.nowait and tries < _NOWAIT_TRIES:  # (MySQL 5.7: no NOWAIT)
                    reader.nowait = False
                    continue
                if code not in LOCK_ERRORS or self.stop.is_set() or self.region.ctx.stop.is_set():
                    raise
                tries += 1
                self.lock_retries += 1
                if tries > _NOWAIT_TRIES + 20:
                    raise SourceError(f"{self.region.where}: snapshot of {plan.name}: the locking read of a chunk "
                                      f"failed {tries} times in a row ({exc})") from None
                time.sleep(min(0.02 * (2 ** min(tries, 6)), 1.0))

    def _read_once(self, reader: Reader, plan: TablePlan, p: TableProgress, tries: int) -> Chunk:
        assert isinstance(plan, MySQLPlan)
        ph = reader.ph
        norm = normalizers(plan, reader.kind)
        names = [c.name for c in plan.columns]
        gen = self.check_reader(reader)
        at = reader.begin_read()
        try:
            if not plan.key:
                chunk = self._read_keyless(reader, plan, p, at, names, norm, reader.lock_clause(tries))
                chunk.gen = gen
                return chunk
            sig = plan.key_signature()
            _, values = split_key(p.last_key)
            order = ", ".join(reader.ident(c) for c in plan.key)
            nk = len(plan.key)
            # where the key reads in the select list as key_select reads it, the chunk's last key is
            # taken from its last row's key columns; else the key is selected again after the columns
            kpos = [names.index(k) for k in plan.key] if plan.key_read_as_selected() else None
            sql = f"SELECT {plan.select_list(reader.ident)}"
            if kpos is None:
                sql += f", {plan.key_select(reader.ident)}"
            sql += f" FROM {reader.table(plan.db, plan.table)}"
            params: tuple[Any, ...] = ()
            if values is not None:
                where, params = plan.key_where(values, reader.ident, ph)
                sql += f" WHERE {where}"
            sql += f" ORDER BY {order} LIMIT {self.chunk_rows}" + reader.lock_clause(tries)
            try:
                # rows as tuples (the C client's fastest result: dicts made by its dictionary cursor cost
                # about twice the read's time), made dicts once, with the names in column order
                # (no cyclic collection in between: the tuples are freed before one could walk them)
                with gc_paused():
                    raw = reader.execute(sql, params)
                    rows = make_rows(raw, names, norm)
                    if not raw:
                        last_key = p.last_key
                    elif kpos is None:
                        last_key = (sig, *raw[-1][-nk:])
                    else:
                        last_key = (sig, *(raw[-1][i] for i in kpos))
                    del raw
            except Exception as exc:
                if reader.is_error(exc) and reader.errno(exc) == 1146:
                    raise TableGone(plan.name) from None
                if reader.is_error(exc) and reader.errno(exc) == 1054:  # a column went since it was described
                    raise ColumnsChanged(plan.name) from None
                raise
            if at is None:  # (watermark) the high watermark, read while the chunk's locks are held
                at = reader.binlog_position()
            return Chunk(plan, at, rows, last_key, len(rows) < self.chunk_rows, p.chunks, p.run, False, gen=gen)
        finally:
            reader.execute("COMMIT")

    def _create_sql(self, reader: Reader, plan: TablePlan) -> str:
        """``CREATE TABLE IF NOT EXISTS db.table ...`` as the source has it (so that a
        new target gets the table before its rows, as the binlog would have given it)."""
        if not self.region.cfg.snapshot_ddl:
            return ""
        try:
            rows = reader.execute(f"SHOW CREATE TABLE {reader.table(plan.db, plan.table)}")
        except Exception as exc:
            if reader.is_error(exc) and reader.errno(exc) == 1146:
                raise TableGone(plan.name) from None
            raise
        return create_table_sql(plan.db, plan.table, str(rows[0][1])) if rows else ""

    def _read_keyless(self, reader: Reader, plan: TablePlan, p: TableProgress, at: Position | None,
                      names: list[str], norm: list[Callable[[Any], Any] | None], lock: str = "") -> Chunk:
        assert isinstance(plan, MySQLPlan)
        make = row_maker(names, norm)

        ctx = self.region.ctx
        spill = SpillWriter(ctx.spill_dir or None, min(ctx.spill_rows or DEFAULT_CHUNK_ROWS, DEFAULT_CHUNK_ROWS))
        sql = f"SELECT {plan.select_list(reader.ident)} FROM {reader.table(plan.db, plan.table)}{lock}"
        try:
            for batch in reader.stream(sql, (), 5000):
                spill.add([RowChange(plan.schema, "read", None, make(r)) for r in batch])
        except Exception as exc:
            if reader.is_error(exc) and reader.errno(exc) == 1146:
                raise TableGone(plan.name) from None
            if reader.is_error(exc) and reader.errno(exc) == 1054:
                raise ColumnsChanged(plan.name) from None
            raise
        if at is None:  # (watermark) read while the whole table's locks are held
            at = reader.binlog_position()
        return Chunk(plan, at, [], None, True, p.chunks, p.run, True, spill.finish())


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


def make_rows(raw: list[tuple[Any, ...]], names: list[str],
              norm: list[Callable[[Any], Any] | None]) -> list[dict[str, Any]]:
    """Rows read as tuples (``names`` in column order, then maybe more) as dicts of
    the columns, each fixed by ``norm``: C-level ``dict(zip())`` per row where none
    needs a fix."""
    if all(f is None for f in norm):
        if _DICT_ROWS is not None and type(raw) is list:
            return _DICT_ROWS(tuple(names), raw)  # (the same in C: one presized dict per row)
        return list(map(dict, map(partial(zip, names), raw)))
    return list(map(row_maker(names, norm), raw))


_DICT_ROWS = getattr(_fastrows, "dict_rows", None)
