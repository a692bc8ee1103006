"""``verify``: does every sink hold what its sources hold? Checked while capture goes on.

``python -m capturer verify --config conf/config.cfg [--sender NAME] [--table db.table] [--json]``
and ``POST /verify`` (the running capturer, behind ``controlToken``, runs that command in
a child process) compare, table by
table, each sender's destination with the sources (docs/verify.md):

* **Sources**: the MySQL/MariaDB and PostgreSQL regions (read over SQL); a table that
  several regions deliver to one destination table is compared as their union. Only
  tables the filter selects, only rows its row rules keep. BaikalDB regions and
  regions served by agents have no SQL front end here: their tables are "cannot check".
* **Sinks** (readers in ``senders/<kind>/verify.py``, handed in by the composition
  root): the MySQL target (chunk checksums computed in both databases, then only the
  chunks that differ row by row), the file (replayed), Kafka (the newest value per
  key), the lake (its merged views).
* **Values, not text**: every value is brought to one form by the *source* column's
  type (``canon``): DECIMAL ``"19.990"`` equals ``19.99``, a base64 string equals its
  bytes, a TIMESTAMP is compared in UTC.
* **While the stream moves**: a first pass finds the keys that differ; each is then
  re-checked: read from the sources, the sources' positions taken, the sender given
  time to acknowledge past those positions (its position in the checkpoint), the sink
  read, the sources read again. A key whose sink value is neither source reading and
  whose source did not change in between is *different*; one whose source changed is
  read again next round (*unsettled* after the last); a sender that does not
  acknowledge past the positions in ``wait`` seconds is *not caught up*: paused, failing
  or lagging, and not a difference. Exit codes: 0 equal, 1 different, 2 bad config or
  an unreachable source or destination, 3 could not settle (not caught up, unsettled,
  cannot check).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime as dt
import decimal
import hashlib
import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from capturer.model import AnyPosition, LsnPosition, Position
from capturer.model.encode import format_timedelta, quote_ident
from capturer.util import mysqlconn, rowsum
from capturer.util.binlogpos import binlog_end
from capturer.util.perthread import PerThread

log = logging.getLogger(__name__)

# information_schema DATA_TYPE -> how its values are compared
KINDS = {
    **dict.fromkeys(("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"), "int"),
    **dict.fromkeys(("decimal", "numeric"), "decimal"),
    **dict.fromkeys(("float", "double", "real"), "float"),
    **dict.fromkeys(("datetime", "timestamp"), "datetime"),
    "date": "date", "time": "time", "bit": "bit", "set": "set", "json": "json",
    **dict.fromkeys(("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"), "bytes"),
}


class _Absent:
    """A column the sink's row does not have at all (not the same as NULL)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


def canon(v: Any, kind: str) -> Any:
    """One hashable form for equal values of a column of this ``kind`` (see KINDS;
    anything else is text), whichever sink they came from."""
    if v is None or v is ABSENT:
        return v
    try:
        if kind == "int":
            return int(v)
        if kind == "decimal":
            return (v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v))).normalize()
        if kind == "float":
            return float(v)
        if kind == "datetime":
            v = dt.datetime.fromisoformat(v) if isinstance(v, str) else v
            return v.astimezone(dt.UTC).replace(tzinfo=None) if isinstance(v, dt.datetime) and v.tzinfo else v
        if kind == "date":
            return dt.date.fromisoformat(v) if isinstance(v, str) else v
        if kind == "time":
            return format_timedelta(v) if isinstance(v, dt.timedelta) else str(v)
        if kind == "bytes":
            # JSON sinks carry binary values as base64 (listed in the message's "b64")
            return base64.b64decode(v, validate=True) if isinstance(v, str) else bytes(v)
        if kind == "bit":
            if isinstance(v, (bytes, bytearray)):
                return int.from_bytes(v, "big")
            return int(v, 2) if isinstance(v, str) else int(v)  # JSON: the bit string
        if kind == "set":
            items = v if isinstance(v, (set, frozenset)) else (str(v).split(",") if v else [])
            return ",".join(sorted(str(x) for x in items))
        if kind == "json":
            return json.dumps(json.loads(v) if isinstance(v, (str, bytes)) else v, sort_keys=True)
    except (ValueError, TypeError, ArithmeticError, binascii.Error):
        return ("not a value of its type", repr(v))  # never equal to a source value
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def show_value(v: Any) -> str:
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, bytes):
        return "0x" + v.hex()
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, dt.date):
        return v.isoformat()
    return repr(v)


@dataclass
class TableMeta:
    """A source table as verify compares it: columns in order, their kinds, its key."""

    db: str
    table: str
    columns: list[str]
    kinds: dict[str, str]
    pk: list[str]
    pg_types: dict[str, str] = field(default_factory=dict)  # PostgreSQL: column -> format_type

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    def canon_row(self, row: dict[str, Any]) -> tuple[Any, ...]:
        """The row's values in column order, canonical; columns the source does not
        have (with a value) make it differ from every source row."""
        extra = tuple(sorted(c for c in row if c not in self.kinds and row[c] is not None))
        vals = tuple(canon(row.get(c, ABSENT), self.kinds[c]) for c in self.columns)
        return vals + ((("extra columns",) + extra,) if extra else ())

    def canon_key(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(canon(row.get(c, ABSENT), self.kinds[c]) for c in self.pk)

    def show(self, row: tuple[Any, ...] | None) -> str:
        if row is None:
            return "(none)"
        names = self.columns + ["?"] * (len(row) - len(self.columns))
        text = ", ".join(f"{c}={show_value(v)}" for c, v in zip(names, row))
        return "{" + (text if len(text) <= 300 else text[:297] + "...") + "}"

    def show_diff(self, want: tuple[Any, ...], got: tuple[Any, ...]) -> str:
        """The columns that differ: ``col: source X, sink Y``."""
        names = self.columns + ["?"] * (max(len(want), len(got)) - len(self.columns))
        out = [f"{c}: source {show_value(a)}, sink {show_value(b)}"
               for c, a, b in zip(names, want + (None,) * len(names), got + (None,) * len(names)) if a != b]
        text = "; ".join(out)
        return text if len(text) <= 400 else text[:397] + "..."

    def show_key(self, key: tuple[Any, ...]) -> str:
        return "(" + ", ".join(f"{c}={show_value(v)}" for c, v in zip(self.pk, key)) + ")"


def digest(row: tuple[Any, ...]) -> bytes:
    """A 16-byte digest of a canonical row (its repr is deterministic: ints, Decimals,
    datetimes, bytes, strings, None)."""
    return hashlib.blake2b(repr(row).encode("utf-8", "surrogatepass"), digest_size=16).digest()


# --- what verify needs of a sink (implemented in senders/<kind>/verify.py) ------------

class SinkReader(Protocol):
    """A sender's destination, read back. ``rows`` gives a destination table's rows as
    ``{column: value}`` (None: the table does not exist there); ``refresh`` makes the
    next reads see what was written since. Optional (the MySQL target):
    ``checksum(dest, columns, where, args)``, ``select(dest, columns, where, args)``
    and ``keys_rows(dest, columns, pk, keys)``."""

    name: str
    kind: str

    def destination(self, db: str, table: str) -> tuple[str, str]: ...

    def where(self, dest: tuple[str, str]) -> str: ...

    def refresh(self) -> None: ...

    def rows(self, dest: tuple[str, str], columns: Sequence[str]) -> Iterable[dict[str, Any]] | None: ...

    def close(self) -> None: ...


ReaderFactory = Callable[[str, dict[str, Any], list[tuple[str, str, str]]], SinkReader]


# --- sources --------------------------------------------------------------------------

class SourceUnreachable(Exception):
    pass


class _Source:
    """A region's server read over SQL: a connection per thread (``_connect``), all
    closed by ``close``."""

    _conns: PerThread

    def _connect(self) -> Any:
        raise NotImplementedError

    def _conn(self) -> Any:
        return self._conns.get()

    def close(self) -> None:
        self._conns.close()


class MySQLSource(_Source):
    """A MySQL/MariaDB region's server, read over SQL (UTC, consistent reads per statement)."""

    kind = "mysql"

    def __init__(self, region: str, host: str, port: int, user: str, password: str, timeout: float = 10.0,
                 tls: dict[str, Any] | None = None):
        self.region = region
        self._args = {"host": host, "port": port, "user": user, "password": password, "charset": "utf8mb4",
                      "connect_timeout": timeout, "autocommit": True, **(tls or {})}
        self.where = f"{host}:{port}"
        self._conns = PerThread(self._connect)

    def _connect(self) -> Any:
        try:
            return mysqlconn.connect_utc(**self._args)
        except Exception as exc:
            raise SourceUnreachable(f"region {self.region} ({self.where}): {exc}") from exc

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._conn().cursor() as cur:
            cur.execute(sql, tuple(args))
            return list(cur.fetchall())

    def tables(self) -> list[tuple[str, str]]:
        return [(str(d), str(t)) for d, t in self.query(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE='BASE TABLE' "
            "AND TABLE_SCHEMA NOT IN ('mysql','information_schema','performance_schema','sys')")]

    def meta(self, db: str, table: str) -> TableMeta | None:
        rows = self.query("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_KEY FROM information_schema.COLUMNS "
                          "WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s ORDER BY ORDINAL_POSITION", (db, table))
        if not rows:
            return None
        pk = [str(r[0]) for r in self.query(
            "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s "
            "AND CONSTRAINT_NAME='PRIMARY' ORDER BY ORDINAL_POSITION", (db, table))]
        return TableMeta(db, table, [str(r[0]) for r in rows],
                         {str(r[0]): KINDS.get(str(r[1]).lower(), "text") for r in rows}, pk)

    def _select(self, meta: TableMeta, where: str, args: Sequence[Any], limit: int = 0,
                ordered: bool = True) -> list[dict[str, Any]]:
        sql = rowsum.select_sql(f"{quote_ident(meta.db)}.{quote_ident(meta.table)}", meta.columns, where,
                                meta.pk if ordered else (), limit)
        return [dict(zip(meta.columns, r)) for r in self.query(sql, args)]

    def chunks(self, meta: TableMeta, size: int) -> Iterator[list[dict[str, Any]]]:
        if not meta.pk:  # no key: the whole table, streamed
            import pymysql.cursors

            with self._conn().cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(rowsum.select_sql(f"{quote_ident(meta.db)}.{quote_ident(meta.table)}",
                                              meta.columns, "1=1"))
                while True:
                    got = cur.fetchmany(size)
                    if not got:
                        return
                    yield [dict(zip(meta.columns, r)) for r in got]
        last: list[Any] | None = None
        while True:
            where, args = rowsum.range_sql(meta.pk, last, None)
            rows = self._select(meta, where, args, size)
            if not rows:
                return
            yield rows
            if len(rows) < size:
                return
            last = [rows[-1][c] for c in meta.pk]

    def rows_for_keys(self, meta: TableMeta, keys: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(0, len(keys), 500):
            where, args = rowsum.keys_sql(meta.pk, keys[i:i + 500])
            out += self._select(meta, where, args, ordered=False)
        return out

    def position(self) -> Position:
        try:
            got = binlog_end(self.query)  # (MySQL 8.4 has only SHOW BINARY LOG STATUS)
        except Exception:
            got = None
        if got is not None:
            return Position(*got)
        raise SourceUnreachable(f"region {self.region} ({self.where}): no binlog position (is the binlog on, "
                                "and has the user BINLOG MONITOR / REPLICATION CLIENT?)")

    # the chunked checksum path (both ends MySQL)
    def boundary(self, meta: TableMeta, lo: Sequence[Any] | None, step: int) -> list[Any] | None:
        where, args = rowsum.range_sql(meta.pk, lo, None)
        got = self.query(rowsum.boundary_sql(f"{quote_ident(meta.db)}.{quote_ident(meta.table)}", meta.pk, where,
                                             step), args)
        return list(got[0]) if got else None

    def checksum(self, meta: TableMeta, where: str, args: Sequence[Any]) -> tuple[int, int]:
        got = self.query(rowsum.checksum_sql(f"{quote_ident(meta.db)}.{quote_ident(meta.table)}", meta.columns,
                                             where), args)
        return int(got[0][0]), int(got[0][1])

    def select(self, meta: TableMeta, where: str, args: Sequence[Any]) -> list[dict[str, Any]]:
        return self._select(meta, where, args, ordered=False)



# PostgreSQL: the MySQL type code a column travels as (capturer/regions/postgresql/types.py) -> kind
_PG_CODE_KINDS = {1: "int", 2: "int", 3: "int", 8: "int", 4: "float", 5: "float", 246: "decimal", 10: "date",
                  18: "datetime", 19: "time", 245: "json", 16: "bit"}


class PostgresSource(_Source):
    """A PostgreSQL region's database. Values are read in their text form and parsed by
    the region's own parsers, so they are what the region delivers (bool as 1/0,
    timestamptz as UTC, ...)."""

    kind = "postgresql"

    def __init__(self, region: str, conninfo: str, where: str):
        self.region = region
        self._conninfo = conninfo
        self.where = where
        self._conns = PerThread(self._connect)
        self._types: dict[tuple[str, str], list[Any]] = {}
        self._oids: dict[tuple[str, str], list[int]] = {}

    def _connect(self) -> Any:
        import psycopg

        try:
            conn = psycopg.connect(self._conninfo, autocommit=True)
        except Exception as exc:
            raise SourceUnreachable(f"region {self.region} ({self.where}): {exc}") from exc
        conn.execute("SET DateStyle=ISO; SET TimeZone=UTC; SET IntervalStyle=iso_8601; SET extra_float_digits=3")
        return conn

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self._conn().execute(sql, tuple(args)).fetchall())

    def tables(self) -> list[tuple[str, str]]:
        return [(str(s), str(t)) for s, t in self.query(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_type='BASE TABLE' "
            "AND table_schema NOT IN ('pg_catalog', 'information_schema')")]

    def meta(self, db: str, table: str) -> TableMeta | None:
        from capturer.regions.postgresql.types import pg_type

        rows = self.query(
            "SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), "
            "COALESCE(a.attnum = ANY(i.indkey), false), "
            "CASE WHEN i.indkey IS NULL THEN 0 ELSE array_position(i.indkey::int2[], a.attnum) END "
            "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (db, table))
        if not rows:
            return None
        types = [pg_type(int(r[1]), int(r[2])) for r in rows]
        self._types[(db, table)] = types
        self._oids[(db, table)] = sorted({int(r[1]) for r in rows})
        kinds = {}
        for r, t in zip(rows, types):
            kinds[str(r[0])] = "bytes" if t.binary else _PG_CODE_KINDS.get(t.code, "text")
        pk = [str(r[0]) for r in sorted((r for r in rows if r[4]), key=lambda r: int(r[5] or 0))]
        return TableMeta(db, table, [str(r[0]) for r in rows], kinds, pk,
                         pg_types={str(r[0]): str(r[3]) for r in rows})

    def _select(self, meta: TableMeta, where: str, args: Sequence[Any], limit: int = 0,
                ordered: bool = True) -> list[dict[str, Any]]:
        from capturer.regions.postgresql.types import parse_value

        types = self._types.get((meta.db, meta.table)) or []
        q = _pg_ident
        # every value in its type's text output, as pgoutput sends it (a cast to text is not
        # always that: boolean 'true', char(n) trimmed, inet without /32): loaded as text
        from psycopg.types.string import TextLoader

        cur = self._conn().cursor()
        for oid in self._oids.get((meta.db, meta.table), ()):
            cur.adapters.register_loader(oid, TextLoader)  # this cursor's only
        cols = ", ".join(q(c) for c in meta.columns)
        sql = f"SELECT {cols} FROM {q(meta.db)}.{q(meta.table)} WHERE {where}"
        if ordered and meta.pk:
            sql += " ORDER BY " + ", ".join(q(c) for c in meta.pk)
        if limit:
            sql += f" LIMIT {int(limit)}"
        out = []
        for r in cur.execute(sql, tuple(args)).fetchall():
            out.append({c: (None if v is None else parse_value(t, v)) for c, t, v in zip(meta.columns, types, r)})
        return out

    def _key_cond(self, meta: TableMeta) -> str:
        return "(" + ", ".join(_pg_ident(c) for c in meta.pk) + ")"

    def _key_args(self, meta: TableMeta) -> str:
        return "(" + ", ".join(f"%s::{meta.pg_types[c]}" for c in meta.pk) + ")"

    def chunks(self, meta: TableMeta, size: int) -> Iterator[list[dict[str, Any]]]:
        last: tuple[Any, ...] | None = None
        offset = 0
        while True:
            if not meta.pk:  # no key: pages of the whole table (REPLICA IDENTITY FULL tables)
                rows = self._select(meta, "true", (), 0, ordered=False) if offset == 0 else []
                if rows:
                    for i in range(0, len(rows), size):
                        yield rows[i:i + size]
                return
            if last is None:
                rows = self._select(meta, "true", (), size)
            else:
                rows = self._select(meta, f"{self._key_cond(meta)} > {self._key_args(meta)}",
                                    [_pg_arg(v) for v in last], size)
            if not rows:
                return
            yield rows
            if len(rows) < size:
                return
            last = tuple(rows[-1][c] for c in meta.pk)

    def rows_for_keys(self, meta: TableMeta, keys: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(0, len(keys), 500):
            part = keys[i:i + 500]
            where = f"{self._key_cond(meta)} IN ({', '.join([self._key_args(meta)] * len(part))})"
            out += self._select(meta, where, [_pg_arg(v) for k in part for v in k], ordered=False)
        return out

    def position(self) -> LsnPosition:
        from capturer.model import parse_lsn

        return LsnPosition(parse_lsn(str(self.query("SELECT pg_current_wal_lsn()::text")[0][0])))



def _pg_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _pg_arg(v: Any) -> Any:
    """A key value as a text parameter (cast to the column's type in the SQL)."""
    if v is None:
        return None
    if isinstance(v, bytes):
        return "\\x" + v.hex()
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    return str(v)


# --- results --------------------------------------------------------------------------

EQUAL, DIFFERENT, NOT_CAUGHT_UP, UNSETTLED, MISSING_TABLE, CANNOT = (
    "equal", "different", "not caught up", "unsettled", "missing table", "cannot check")


@dataclass
class TableResult:
    sender: str
    table: str  # the source table(s): db.table (several names joined by +)
    destination: str  # where in the sink
    status: str = EQUAL
    rows: int = 0  # source rows compared
    sink_rows: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    unsettled: int = 0
    examples: list[str] = field(default_factory=list)
    note: str = ""
    method: str = ""
    checked_at: float = 0.0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}

    def line(self) -> str:
        head = f"{self.sender:8s} {self.table} -> {self.destination}: {self.status}"
        counts = (f" ({self.rows} source rows, {self.sink_rows} in the sink: {self.missing} missing, "
                  f"{self.extra} extra, {self.different} different"
                  + (f", {self.unsettled} unsettled" if self.unsettled else "") + ")")
        return head + (counts if self.status != CANNOT else "") + (f"; {self.note}" if self.note else "")


@dataclass
class Report:
    started: float
    finished: float = 0.0
    results: list[TableResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # a source or destination that could not be read

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        if any(r.status in (DIFFERENT, MISSING_TABLE) for r in self.results):
            return 1
        if any(r.status != EQUAL for r in self.results):
            return 3
        return 0

    def summary(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.results))

    def to_json(self) -> dict[str, Any]:
        return {"started": round(self.started, 3), "finished": round(self.finished, 3),
                "seconds": round(self.finished - self.started, 3), "exit_code": self.exit_code,
                "summary": self.summary(), "errors": self.errors,
                "tables": [r.to_json() for r in self.results]}


# --- the comparison -------------------------------------------------------------------

@dataclass
class _Group:
    """The source tables (region, db, table) one destination table is compared with."""

    dest: tuple[str, str]
    sources: list[tuple[str, str, str]]
    meta: TableMeta | None = None

    @property
    def label(self) -> str:
        names = sorted({f"{d}.{t}" for _, d, t in self.sources})
        return "+".join(names)


Acked = Callable[[], dict[str, dict[str, AnyPosition]]]


@dataclass
class Options:
    senders: list[str] | None = None  # None: every sender
    tables: list[tuple[str, str]] | None = None  # None: every captured table
    wait: float = 60.0  # seconds a sender is given to acknowledge past the sources' positions
    rounds: int = 3
    chunk_rows: int = 10_000
    recheck_cap: int = 100_000  # keys re-checked one by one; beyond, the table is compared again whole
    examples: int = 5


class Verifier:
    """Runs one comparison of every selected sender with the sources (``run``)."""

    def __init__(self, sources: dict[str, Any], readers: dict[str, SinkReader], table_selected: Callable[..., bool],
                 row_keep: Callable[[str, str, dict[str, Any]], bool], row_rules: Callable[[str, str], bool],
                 acked: Acked, options: Options, unreadable_regions: dict[str, str] | None = None,
                 progress: Callable[[dict[str, Any]], None] | None = None, stop: threading.Event | None = None):
        self.sources = sources  # region -> MySQLSource | PostgresSource
        self.readers = readers
        self.table_selected = table_selected
        self.row_keep = row_keep
        self.has_row_rules = row_rules
        self.acked = acked
        self.o = options
        self.unreadable_regions = unreadable_regions or {}
        self.progress = progress or (lambda d: None)
        self.stop = stop or threading.Event()
        self._executor: Any = None
        self._stalled: set[str] = set()  # senders found behind their sources in this run

    def _pool(self) -> Any:
        """Threads for the chunk checksums (one query per server at once), kept for the run."""
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=len(self.sources) + 1, thread_name_prefix="verify")
        return self._executor

    # -- discovery --
    def _source_tables(self) -> dict[tuple[str, str], list[str]]:
        found: dict[tuple[str, str], list[str]] = {}
        for region, src in self.sources.items():
            for db, table in src.tables():
                if self.o.tables is not None and (db, table) not in self.o.tables:
                    continue
                if self.table_selected(db, table):
                    found.setdefault((db, table), []).append(region)
        return found

    def _groups(self, reader: SinkReader, found: dict[tuple[str, str], list[str]]) -> list[_Group]:
        groups: dict[tuple[str, str], _Group] = {}
        for (db, table), regions in sorted(found.items()):
            dest = reader.destination(db, table)
            g = groups.setdefault(dest, _Group(dest, []))
            g.sources += [(r, db, table) for r in regions]
        return list(groups.values())

    # -- run --
    def run(self) -> Report:
        report = Report(time.time())
        try:
            found = self._source_tables()
        except SourceUnreachable as exc:
            report.errors.append(str(exc))
            report.finished = time.time()
            return report
        for db, table in self.o.tables or []:
            if (db, table) not in found:
                report.errors.append(f"table {db}.{table}: in no region read here, or not selected by the filter")
        names = [n for n in self.readers if self.o.senders is None or n in self.o.senders]
        plan = [(n, g) for n in names for g in self._groups(self.readers[n], found)]
        for i, (name, g) in enumerate(plan):
            if self.stop.is_set():
                report.errors.append("stopped before the end")
                break
            self.progress({"tables_done": i, "tables_total": len(plan), "current": f"{name}: {g.label}"})
            t0 = time.time()
            try:
                res = self._check(self.readers[name], g)
            except SourceUnreachable as exc:
                report.errors.append(str(exc))
                continue
            except Exception as exc:  # a destination that cannot be read: named, the rest goes on
                log.warning("verify %s %s: %s", name, g.label, exc, exc_info=True)
                report.errors.append(f"sender {name}, {g.label} ({self.readers[name].where(g.dest)}): "
                                     f"{type(exc).__name__}: {exc}")
                continue
            res.checked_at, res.seconds = time.time(), time.time() - t0
            report.results.append(res)
            log.info("verify: %s", res.line())
        for name in names:
            for region, why in sorted(self.unreadable_regions.items()):
                report.results.append(TableResult(
                    name, f"tables of region {region}", self.readers[name].where(("", "")), CANNOT,
                    note=f"{why}: its tables are not compared (a table it shares with a region read here "
                         "shows its rows as extra)", checked_at=time.time()))
        for name in self.o.senders or []:
            if name not in self.readers:
                report.errors.append(f"no sender {name!r} (configured: {', '.join(self.readers) or 'none'})")
        self.progress({"tables_done": len(plan), "tables_total": len(plan), "current": ""})
        report.finished = time.time()
        return report

    def _meta(self, g: _Group) -> TableMeta:
        metas = []
        for region, db, table in g.sources:
            m = self.sources[region].meta(db, table)
            if m is not None:
                metas.append(m)
        if not metas:
            raise SourceUnreachable(f"{g.label}: no longer in the sources")
        return metas[0]

    def _check(self, reader: SinkReader, g: _Group) -> TableResult:
        res = TableResult(reader.name, g.label, reader.where(g.dest))
        if getattr(reader, "cannot", ""):
            res.status, res.note = CANNOT, reader.cannot  # type: ignore[attr-defined]
            return res
        meta = self._meta(g)
        g.meta = meta
        reader.refresh()
        use_sums = bool(hasattr(reader, "checksum") and meta.pk
                        and all(self.sources[r].kind == "mysql" for r, _, _ in g.sources)
                        and not any(self.has_row_rules(d, t) for _, d, t in g.sources))
        res.method = "chunk checksums" if use_sums else "rows"
        diff = self._first_pass(reader, g, res)
        self._settle(reader, g, res, diff)
        if res.status == DIFFERENT and not _exists(reader, g.dest):
            res.status = MISSING_TABLE
        if res.status == EQUAL and res.rows == 0 and not _exists(reader, g.dest):
            res.note = _join(res.note, "the destination has no such table; the source table is empty")
        return res

    def _first_pass(self, reader: SinkReader, g: _Group, res: TableResult) -> _Diff:
        if res.method == "chunk checksums" and _exists(reader, g.dest):
            return self._sums_pass(reader, g, res)
        return self._rows_pass(reader, g, res)

    # -- positions --
    def _positions(self, g: _Group) -> dict[str, AnyPosition]:
        return {r: self.sources[r].position() for r in sorted({r for r, _, _ in g.sources})}

    def _behind(self, sender: str, want: dict[str, AnyPosition]) -> str:
        """'' when the sender has acknowledged past ``want`` in every region, else where it is."""
        have = self.acked().get(sender, {})
        lag = []
        for region, pos in want.items():
            got = have.get(region)
            if got is None or type(got) is not type(pos) or got < pos:  # type: ignore[operator]
                lag.append(f"{region} at {got if got is not None else 'nothing acknowledged'}, source at {pos}")
        return "; ".join(lag)

    def _wait(self, sender: str, want: dict[str, AnyPosition]) -> str:
        """Until the sender is past ``want`` ('') or ``wait`` seconds passed (where it is).
        A sender found behind once is not waited for again in this run (a paused one
        would cost ``wait`` per table): later tables only look whether it caught up."""
        deadline = time.monotonic() + (0 if sender in self._stalled else self.o.wait)
        while True:
            lag = self._behind(sender, want)
            if not lag or time.monotonic() >= deadline or self.stop.is_set():
                if lag:
                    self._stalled.add(sender)
                else:
                    self._stalled.discard(sender)
                return lag
            time.sleep(0.25)

    # -- the first pass --
    def _source_chunks(self, g: _Group) -> Iterator[list[dict[str, Any]]]:
        assert g.meta is not None
        for region, db, table in g.sources:
            m = TableMeta(db, table, g.meta.columns, g.meta.kinds, g.meta.pk, g.meta.pg_types)
            src = self.sources[region]
            if src.kind == "postgresql":
                src.meta(db, table)  # its parsers
            for chunk in src.chunks(m, self.o.chunk_rows):
                yield [r for r in chunk if self.row_keep(db, table, r)]

    def _rows_pass(self, reader: SinkReader, g: _Group, res: TableResult) -> _Diff:
        meta = g.meta
        assert meta is not None
        got = reader.rows(g.dest, meta.columns) or []
        if not meta.pk:
            return self._multiset_pass(got, g, res)
        sink: dict[tuple[Any, ...], bytes] = {}
        dup = 0
        for row in got:
            k = meta.canon_key(row)
            if k in sink:
                dup += 1
            sink[k] = digest(meta.canon_row(row))
        res.sink_rows = len(sink) + dup
        diff = _Diff()
        for chunk in self._source_chunks(g):
            for row in chunk:
                res.rows += 1
                k = meta.canon_key(row)
                d = sink.pop(k, None)
                if d is None:
                    diff.keys.add(k)
                    res.missing += 1
                elif d != digest(meta.canon_row(row)):
                    diff.keys.add(k)
                    res.different += 1
        res.extra = len(sink)
        diff.keys.update(sink)
        if dup:
            res.note = _join(res.note, f"{dup} keys appear more than once in the sink")
            res.extra += dup
            diff.whole = True
        return diff

    def _multiset_pass(self, got: Iterable[dict[str, Any]], g: _Group, res: TableResult) -> _Diff:
        meta = g.meta
        assert meta is not None
        sink = Counter(meta.canon_row(r) for r in got)
        res.sink_rows = sum(sink.values())
        src: Counter[tuple[Any, ...]] = Counter()
        for chunk in self._source_chunks(g):
            res.rows += len(chunk)
            src.update(meta.canon_row(r) for r in chunk)
        lost, more = src - sink, sink - src
        res.missing, res.extra, res.different = sum(lost.values()), sum(more.values()), 0
        diff = _Diff(whole=bool(lost or more))
        for row in list(lost)[:self.o.examples]:
            diff.examples.append(f"missing {meta.show(row)}")
        for row in list(more)[:self.o.examples]:
            diff.examples.append(f"extra {meta.show(row)}")
        return diff

    def _sums_pass(self, reader: Any, g: _Group, res: TableResult) -> _Diff:
        """Chunk by chunk over key ranges: the sources' COUNT/SUM(CRC32) against the
        target's, both computed in the servers; a chunk that differs row by row."""
        meta = g.meta
        assert meta is not None
        # the chunk boundaries: from the region with the most rows (any boundaries cover every row)
        regions = [(r, TableMeta(d, t, meta.columns, meta.kinds, meta.pk)) for r, d, t in g.sources]
        lead = max(regions, key=lambda x: self.sources[x[0]].query(
            "SELECT COALESCE(MAX(TABLE_ROWS), 0) FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s AND "
            "TABLE_NAME=%s", (x[1].db, x[1].table))[0][0])
        diff = _Diff()
        lo: list[Any] | None = None
        pool = self._pool()
        while True:
            hi = self.sources[lead[0]].boundary(lead[1], lo, self.o.chunk_rows)
            where, args = rowsum.range_sql(meta.pk, lo, hi)
            futs = [pool.submit(self.sources[r].checksum, m, where, args) for r, m in regions]
            tfut = pool.submit(reader.checksum, g.dest, meta.columns, where, args)
            sums = [f.result() for f in futs]
            want = (sum(s[0] for s in sums), sum(s[1] for s in sums))
            have = tfut.result()
            res.rows += want[0]
            res.sink_rows += have[0]
            if want != have:
                self._chunk_rows(reader, g, regions, where, args, res, diff)
            if hi is None or self.stop.is_set():
                break
            lo = hi
        return diff

    def _chunk_rows(self, reader: Any, g: _Group, regions: list[tuple[str, TableMeta]], where: str,
                    args: Sequence[Any], res: TableResult, diff: _Diff) -> None:
        meta = g.meta
        assert meta is not None
        src: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for r, m in regions:
            for row in self.sources[r].select(m, where, args):
                src[meta.canon_key(row)] = meta.canon_row(row)
        sink = {}
        for row in reader.select(g.dest, meta.columns, where, args):
            sink[meta.canon_key(row)] = meta.canon_row(row)
        for k, row in src.items():
            s = sink.pop(k, None)
            if s is None:
                res.missing += 1
                diff.keys.add(k)
            elif s != row:
                res.different += 1
                diff.keys.add(k)
        res.extra += len(sink)
        diff.keys.update(sink)

    # -- re-checks --
    def _read_keys(self, reader: SinkReader, g: _Group, keys: list[tuple[Any, ...]],
                   source: bool) -> dict[tuple[Any, ...], list[tuple[Any, ...]]]:
        meta = g.meta
        assert meta is not None
        out: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        if source:
            for region, db, table in g.sources:
                m = TableMeta(db, table, meta.columns, meta.kinds, meta.pk, meta.pg_types)
                src = self.sources[region]
                if src.kind == "postgresql":
                    src.meta(db, table)
                for row in src.rows_for_keys(m, keys):
                    if self.row_keep(db, table, row):
                        out.setdefault(meta.canon_key(row), []).append(meta.canon_row(row))
            return out
        want = set(keys)
        if hasattr(reader, "keys_rows"):
            rows: Iterable[dict[str, Any]] = reader.keys_rows(g.dest, meta.columns, meta.pk, keys)
        else:
            reader.refresh()
            rows = reader.rows(g.dest, meta.columns) or []
        for row in rows:
            k = meta.canon_key(row)
            if k in want:
                out.setdefault(k, []).append(meta.canon_row(row))
        return out

    def _settle(self, reader: SinkReader, g: _Group, res: TableResult, diff: _Diff) -> None:
        """Re-check what the first pass found (see the module docstring); sets ``res.status``."""
        meta = g.meta
        assert meta is not None
        examples: list[str] = list(diff.examples)
        for rnd in range(self.o.rounds):
            if diff.empty():
                break
            if diff.whole or len(diff.keys) > self.o.recheck_cap:
                # no key (or too many keys): once the sender is past where the sources are, all again
                lag = self._wait(reader.name, self._positions(g))
                if lag:
                    res.status, res.note = NOT_CAUGHT_UP, _join(res.note, f"sender {reader.name} behind: {lag}")
                    res.examples = examples[:self.o.examples]
                    return
                reader.refresh()
                fresh = TableResult(res.sender, res.table, res.destination, method=res.method)
                diff = self._first_pass(reader, g, fresh)
                for k in ("rows", "sink_rows", "missing", "extra", "different"):
                    setattr(res, k, getattr(fresh, k))
                res.note = _join(res.note, fresh.note)
                examples = list(diff.examples)
                continue
            keys = sorted(diff.keys, key=repr)
            first = self._read_keys(reader, g, keys, True)
            lag = self._wait(reader.name, self._positions(g))
            if lag:
                res.status, res.note = NOT_CAUGHT_UP, _join(res.note, f"sender {reader.name} behind: {lag}")
                res.examples = examples[:self.o.examples]
                return
            sink = self._read_keys(reader, g, keys, False)
            second = self._read_keys(reader, g, keys, True)
            missing = extra = different = unsettled = 0
            left: set[tuple[Any, ...]] = set()
            examples = []
            for key in keys:
                s = sorted(sink.get(key, []), key=repr)
                a, b = sorted(first.get(key, []), key=repr), sorted(second.get(key, []), key=repr)
                if s in (a, b):
                    continue
                left.add(key)
                if a != b:
                    unsettled += 1
                    continue
                if not s:
                    missing += 1
                    what = f"missing {meta.show(a[0])}"
                elif not a:
                    extra += 1
                    what = f"extra {meta.show(s[0])}" + (f" ({len(s)} rows with this key)" if len(s) > 1 else "")
                else:
                    different += 1
                    what = (f"key {meta.show_key(key)}: {meta.show_diff(a[0], s[0])}"
                            + (f" ({len(s)} rows with this key in the sink)" if len(s) > 1 else ""))
                if len(examples) < self.o.examples:
                    examples.append(what)
            res.missing, res.extra, res.different, res.unsettled = missing, extra, different, unsettled
            diff = _Diff(keys=left)
            if not unsettled and (rnd >= 1 or self.o.rounds == 1):
                break  # every key left is stable in the sources and differs in the sink
        res.examples = examples[:self.o.examples]
        if diff.empty():
            res.status = EQUAL
            res.missing = res.extra = res.different = res.unsettled = 0
        elif res.missing or res.extra or res.different:
            res.status = DIFFERENT
        else:
            res.status = UNSETTLED
            res.note = _join(res.note, "rows kept changing in the sources while they were compared")


@dataclass
class _Diff:
    keys: set[tuple[Any, ...]] = field(default_factory=set)
    whole: bool = False  # compare the whole table again (no key, or keys repeated in the sink)
    examples: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not self.keys and not self.whole


def _exists(reader: Any, dest: tuple[str, str]) -> bool:
    """Whether the destination table exists (sinks without tables of their own: always)."""
    return bool(reader.exists(dest)) if hasattr(reader, "exists") else True


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else (a or b)


# --- building a Verifier from the config ------------------------------------------------

def build(cfg: Any, factories: dict[str, ReaderFactory], acked: Acked, options: Options,
          filt: Any = None, progress: Callable[[dict[str, Any]], None] | None = None,
          stop: threading.Event | None = None) -> tuple[Verifier, list[SinkReader]]:
    """A Verifier for ``cfg`` (an AppConfig): its regions as sources, its senders' readers."""
    from capturer.config import PostgresRegionConfig, RegionConfig
    from capturer.pipeline.filter import load_filter

    filt = filt if filt is not None else load_filter(cfg.filter_path)
    sources: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for r in cfg.regions:
        if isinstance(r, RegionConfig):
            sources[r.name] = MySQLSource(r.name, r.host, r.port, r.user, r.password, r.connect_timeout, r.tls())
        elif isinstance(r, PostgresRegionConfig):
            from psycopg.conninfo import make_conninfo

            ci = make_conninfo("", host=r.host, port=r.port, user=r.user, password=r.password or None,
                               dbname=r.dbname, sslmode=r.sslmode, connect_timeout=int(max(1, r.connect_timeout)))
            sources[r.name] = PostgresSource(r.name, ci, f"{r.host}:{r.port}/{r.dbname}")
        else:
            unreadable[r.name] = (f"a {r.type} region" + (": no SQL front end" if r.type == "baikaldb"
                                                          else ": its source is reached through an agent"))
    readers: dict[str, SinkReader] = {}
    for s in cfg.senders:
        if options.senders is not None and s.name not in options.senders:
            continue
        f = factories.get(s.name)
        if f is None:
            continue
        readers[s.name] = f(s.name, s.options, [(r.name, r.type, "") for r in cfg.regions])

    def keep(db: str, table: str, row: dict[str, Any]) -> bool:
        rules = filt._rules_for(db, table)
        return not rules or filt._row_ok(rules, row)

    v = Verifier(sources, readers, filt.table_selected, keep, lambda d, t: bool(filt._rules_for(d, t)), acked,
                 options, unreadable, progress, stop)
    return v, list(readers.values())


def close_all(v: Verifier, readers: Iterable[SinkReader]) -> None:
    """Close what ``build`` opened (never raises)."""
    if v._executor is not None:
        v._executor.shutdown(wait=True)
    for r in readers:
        try:
            r.close()
        except Exception:
            pass
    for src in v.sources.values():
        src.close()


def checkpoint_acked(path: Any, ha: Any = None) -> Acked:
    """Each sender's acknowledged positions as the checkpoint file holds them (with
    ``[ha]``, ``ha``: as the active capturer last wrote them to etcd)."""
    from capturer.pipeline.checkpoint import load_checkpoint

    def acked() -> dict[str, dict[str, AnyPosition]]:
        try:
            cp = load_checkpoint(path) if ha is None else _ha_checkpoint(ha)
        except Exception:
            return {}
        if cp is None:
            return {}
        return {n: dict(sp.regions) for n, sp in cp.senders.items()}
    return acked


def _ha_checkpoint(hc: Any) -> Any:
    """The checkpoint the active capturer of an [ha] group last wrote to etcd (None: none yet)."""
    import tempfile
    from pathlib import Path

    from capturer.ha.coord import Coordinator, unpack_state
    from capturer.pipeline.checkpoint import load_checkpoint

    got = Coordinator(hc.endpoints, hc.name, hc.lease_seconds).get("state")
    if got is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "checkpoint.json"
        p.write_text(json.dumps(unpack_state(got[0])["checkpoint"]))
        return load_checkpoint(p)


def parse_tables(items: Sequence[str]) -> list[tuple[str, str]]:
    from capturer.pipeline.filter import split_table_name

    return [split_table_name(t) for t in items]


def print_report(report: Report, out: Any = sys.stdout) -> None:
    for r in report.results:
        print(r.line(), file=out)
        for e in r.examples:
            print(f"    {e}", file=out)
    for e in report.errors:
        print(f"error: {e}", file=out)
    s = report.summary()
    verdict = {0: "all equal", 1: "DIFFERENT", 2: "could not read everything", 3: "not settled"}[report.exit_code]
    print(f"verify: {verdict}: " + (", ".join(f"{n} {k}" for k, n in sorted(s.items())) or "no table")
          + f" in {report.finished - report.started:.1f}s", file=out)


def verify_cli(argv: list[str], load_config: Callable[[Any], Any], factories: dict[str, ReaderFactory]) -> int:
    ap = argparse.ArgumentParser(prog="capturer verify",
                                 description="Compare every sender's destination with the sources, while capture "
                                             "goes on. Exit: 0 equal, 1 different, 2 bad config or unreachable, "
                                             "3 not settled (a sender not caught up, rows that kept changing).")
    ap.add_argument("--config", default="conf/config.cfg")
    ap.add_argument("--sender", action="append", help="only this sender (repeat)")
    ap.add_argument("--table", action="append", help="only this db.table (repeat; backticks quote dots)")
    ap.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    ap.add_argument("--wait", type=float, default=60.0,
                    help="seconds a sender is given to acknowledge past the sources' positions (default 60)")
    ap.add_argument("--rounds", type=int, default=3, help="re-checks of rows that differ (default 3)")
    ap.add_argument("--chunk-rows", type=int, default=10_000)
    ap.add_argument("--progress", action="store_true",
                    help='progress as {"progress": {...}} JSON lines on stderr (POST /verify reads them)')
    args = ap.parse_args(argv)
    from pathlib import Path

    from capturer.errors import ConfigError

    try:
        cfg = load_config(Path(args.config))
        tables = parse_tables(args.table) if args.table else None
    except (ConfigError, ValueError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    unknown = [s for s in args.sender or [] if s not in {c.name for c in cfg.senders}]
    if unknown:
        print(f"config error: {cfg.sender_config_path}: no sender {', '.join(unknown)} "
              f"(configured: {', '.join(c.name for c in cfg.senders)})", file=sys.stderr)
        return 2
    opts = Options(senders=args.sender, tables=tables, wait=args.wait, rounds=max(1, args.rounds),
                   chunk_rows=max(100, args.chunk_rows))
    try:
        def progress(d: dict[str, Any]) -> None:
            print(json.dumps({"progress": d}), file=sys.stderr, flush=True)

        v, readers = build(cfg, factories, checkpoint_acked(cfg.checkpoint_path, cfg.ha), opts,
                           progress=progress if args.progress else None)
    except (ConfigError, OSError, ImportError) as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return 2
    try:
        report = v.run()
    finally:
        close_all(v, readers)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print_report(report)
    return report.exit_code
