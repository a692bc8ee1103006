"""A PostgreSQL region's source, read over SQL by ``verify`` (capturer/ops/verify.py)."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator, Sequence
from typing import Any

from capturer.model import LsnPosition, parse_lsn, wal_record_end
from capturer.model.compare import SourceUnreachable, SqlSource, TableMeta
from capturer.regions.postgresql.keys import PostgresRegionConfig
from capturer.regions.postgresql.types import parse_value, pg_type, resolve_domains
from capturer.util.perthread import PerThread


def source(r: PostgresRegionConfig) -> PostgresSource:
    """``verify``'s reader of region ``r``'s database."""
    from psycopg.conninfo import make_conninfo

    ci = make_conninfo("", host=r.host, port=r.port, user=r.user, password=r.password or None,
                       dbname=r.dbname, sslmode=r.sslmode, connect_timeout=int(max(1, r.connect_timeout)))
    return PostgresSource(r.name, ci, f"{r.host}:{r.port}/{r.dbname}", r.publication)


_PG_CODE_KINDS = {1: "int", 2: "int", 3: "int", 8: "int", 4: "float32", 5: "float", 246: "decimal", 10: "date",
                  18: "datetime", 19: "time", 245: "json", 16: "bit"}


class PostgresSource(SqlSource):
    """A PostgreSQL region's database. Values are read in their text form and parsed by
    the region's own parsers, so they are what the region delivers (bool as 1/0,
    timestamptz as UTC, ...)."""

    kind = "postgresql"

    def __init__(self, region: str, conninfo: str, where: str, publication: str = ""):
        self.region = region
        self.publication = publication
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
        """The tables the region reads: its publication's (a partitioned table's partitions, or the
        table itself under ``publish_via_partition_root``, as the stream names their changes; no table
        left out of a publication of some tables). Before the publication exists (created at the
        region's first start): every table with rows of its own, as FOR ALL TABLES publishes them."""
        if self.publication and self.query("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)):
            return [(str(s), str(t)) for s, t in self.query(
                "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = %s",
                (self.publication,))]
        return [(str(s), str(t)) for s, t in self.query(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND n.nspname !~ '^pg_'")]

    def meta(self, db: str, table: str) -> TableMeta | None:

        rows = self.query(
            "SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), "
            "COALESCE(a.attnum = ANY(i.indkey), false), "
            "CASE WHEN i.indkey IS NULL THEN 0 ELSE array_position(i.indkey::int2[], a.attnum) END "
            "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "AND a.attgenerated = '' ORDER BY a.attnum",  # (generated columns: pgoutput never sends them)
            (db, table))
        if not rows:
            return None
        # (a domain as its base type, as the region carries it; its values come back in the base type's OID)
        bases = resolve_domains(self.query, [(int(r[1]), int(r[2])) for r in rows])
        types = [pg_type(oid, mod) for oid, mod in bases]
        self._types[(db, table)] = types
        self._oids[(db, table)] = sorted({int(r[1]) for r in rows} | {oid for oid, _ in bases})
        kinds = {}
        for r, t in zip(rows, types):
            kinds[str(r[0])] = "bytes" if t.binary else _PG_CODE_KINDS.get(t.code, "text")
        pk = [str(r[0]) for r in sorted((r for r in rows if r[4]), key=lambda r: int(r[5] or 0))]
        return TableMeta(db, table, [str(r[0]) for r in rows], kinds, pk,
                         pg_types={str(r[0]): str(r[3]) for r in rows})

    def _select(self, meta: TableMeta, where: str, args: Sequence[Any], limit: int = 0,
                ordered: bool = True) -> list[dict[str, Any]]:

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
        """The end of the last WAL record written: every commit that has returned is below
        it. Not ``pg_current_wal_lsn()``: with ``synchronous_commit = off`` that write
        position can lag commits whose rows a read already sees (a sender found past it
        could still miss them). At a page's start the insert position is after the page
        header, which the stream never reports (as the region's heartbeat probe)."""
        (lsn, block, segment), = self.query(
            "SELECT pg_current_wal_insert_lsn()::text, current_setting('wal_block_size')::bigint, "
            "pg_size_bytes(current_setting('wal_segment_size'))")
        return LsnPosition(wal_record_end(parse_lsn(str(lsn)), int(block), int(segment)))



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
