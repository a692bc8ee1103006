"""Initial and on-demand snapshots of PostgreSQL tables, consistent with the slot's
stream, chunked by key, resumable, lock-free.

How a chunk is made exact
-------------------------
A worker reads one chunk (``snapshot_chunk_rows`` rows in key order after the
last key delivered; a table without a key: the whole table) in a ``REPEATABLE
READ READ ONLY`` transaction whose first statement takes its snapshot S and
reports it (``pg_current_snapshot()``: xmin, xmax, the transactions in progress).
After the rows it reads the WAL insert position P: every transaction S sees has
its commit record before P. The region delivers the chunk once its stream has
passed P (at X >= P), so every transaction S saw was delivered before it.

Which transactions S did *not* see is known exactly, by transaction id (pgoutput
gives each transaction's id at BEGIN). They are the stream's transactions after
the chunk began (B: where the stream was when the worker started the chunk) that
are not visible in S, and the chunk takes them into account: a keyed chunk
drops every key a transaction after B changed (that transaction, delivered with
full rows, carries a state at least as new), a keyless table's rows are
corrected by the rows those unseen transactions deleted and inserted (a
multiset). A transaction delivered *before* B but not visible in S (PostgreSQL
writes a commit record before it makes the transaction visible; a synchronous
standby can hold it there for long: then it is in S's in-progress list, or at
or past S's xmax) would escape both rules: the worker checks S against the
transaction ids the stream delivered (the newest 100,000) and, if one of them is
not visible, reads the chunk again a moment later.

Why not the snapshot the slot exports when it is created: it is exact only for
the first copy, only while the connection that created the slot stays open (a
crash loses it, and a resumed copy could not use it), and never for a copy
asked for later or for ``when_needed``. The rule here holds for all of them, and
chunks of different tables (each its own S) are read by several workers at once.

Values are read in their type's text output form (as pgoutput sends them) and
parsed by the region's own parsers, so a snapshot row equals the row the stream
would have given. A table's run starts with its CREATE TABLE (the region's own
MySQL DDL for the relation, recorded in its relation journal as if the stream
had seen it), and with a TRUNCATE for ``when_needed`` and ``truncate`` runs.
Progress (last key as text, chunks, rows) travels in the region's positions, so
the checkpoint holds it and a restart resumes after the last acknowledged chunk.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from capturer.errors import SourceError
from capturer.model import LsnPosition, RowChange, TableProgress, parse_lsn
from capturer.model.spill import DEFAULT_CHUNK_ROWS, SpillWriter
from capturer.regions.postgresql.types import parse_value
from capturer.regions.snapshot import ColumnsChanged, Snapshotter, TableGone
from capturer.regions.snapshot_plan import Chunk, Column, TablePlan, split_key

log = logging.getLogger(__name__)

# SQLSTATE -> the MySQL error number the snapshotter's rules know
_CODES = {"42501": 1142, "42P01": 1146, "42703": 1054, "3F000": 1146}
_RETRIES = 50  # chunk reads made again in a row because a delivered transaction was not visible yet


def quote_pg(name: str, params: bool = True) -> str:
    """An identifier; ``params``: in SQL run with parameters (``%`` doubled)."""
    q = '"' + name.replace('"', '""') + '"'
    return q.replace("%", "%%") if params else q


@dataclass(frozen=True)
class PgSnapshot:
    """A transaction snapshot (``pg_current_snapshot()``), with 64-bit ids."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> PgSnapshot:
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def full(self, xid: int) -> int:
        """A 32-bit transaction id (as pgoutput gives it) as the 64-bit one nearest to
        ``xmax`` (PostgreSQL keeps every live id within 2^31 of the next one)."""
        diff = (xid - self.xmax) & 0xFFFFFFFF
        if diff >= 1 << 31:
            diff -= 1 << 32
        return self.xmax + diff

    def visible(self, xid: int) -> bool:
        """Whether a transaction that committed (it was delivered) is seen by this snapshot."""
        v = self.full(xid)
        if v < self.xmin:
            return True
        if v >= self.xmax:
            return False
        return v not in self.xip

    def in_progress32(self) -> set[int]:
        return {x & 0xFFFFFFFF for x in self.xip}


class PgReader:
    """One connection for reading chunks (psycopg 3), values loaded as text."""

    kind = "psycopg"
    method = "xid"

    def __init__(self, region: Any):  # (a PostgresRegion: region.py imports this module)
        import psycopg

        self.where = region.where
        self._errors: tuple[type[BaseException], ...] = (psycopg.Error,)
        try:
            self.conn = psycopg.connect(region.conninfo(), autocommit=True)
        except psycopg.OperationalError as exc:
            raise SourceError(f"{self.where}: snapshot connection failed: {str(exc).strip()}") from None
        (version,), = self.execute("SELECT current_setting('server_version_num')::int")
        # pg_current_snapshot() is PostgreSQL 13's name for txid_current_snapshot()
        self.snapshot_fn = "pg_current_snapshot()" if int(version) >= 130000 else "txid_current_snapshot()"

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []

    def text_cursor(self, oids: list[int], name: str = "") -> Any:
        """A cursor that loads the values of these types as their text output (the form
        pgoutput sends and the region parses); ``name``: a server-side cursor."""
        from psycopg.types.string import TextLoader

        cur = self.conn.cursor(name=name) if name else self.conn.cursor()
        for oid in oids:
            cur.adapters.register_loader(oid, TextLoader)
        return cur

    def begin(self) -> PgSnapshot:
        self.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        (text,), = self.execute(f"SELECT {self.snapshot_fn}::text")  # the first statement: S is taken here
        return PgSnapshot.parse(str(text))

    def insert_lsn(self) -> int:
        (lsn,), = self.execute("SELECT pg_current_wal_insert_lsn()::text")
        return parse_lsn(str(lsn))

    def end(self) -> None:
        try:
            self.execute("COMMIT")
        except Exception:
            pass

    def is_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self._errors)

    def errno(self, exc: BaseException) -> int:
        return _CODES.get(str(getattr(exc, "sqlstate", "") or ""), 0)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


class PgSnapshotter(Snapshotter):
    """The snapshot workers of one PostgreSQL region (the scheduling, retries and
    delivery are the MySQL snapshotter's; the reads are here)."""

    region: Any  # a PostgresRegion

    def _new_reader(self) -> PgReader:
        return PgReader(self.region)

    def _describe_table(self, reader: Any, db: str, table: str) -> TablePlan:
        rel = self.region.catalog_reldef(reader.execute, db, table)
        if rel is None:
            raise TableGone(f"{db}.{table}")
        rows = reader.execute(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "COALESCE(co.collname::text, '') FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation "
            "AND a.attcollation <> 0 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (rel.relid,))
        by = {str(r[0]): r for r in rows}
        columns = []
        for c, t in zip(rel.columns, rel.types):
            _, fmt, notnull, coll = by.get(c.name, (c.name, "text", False, ""))
            columns.append(Column(c.name, str(fmt), str(fmt), 0, 0, t.binary, not notnull, str(coll)))
        (est,), = reader.execute("SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = %s", (rel.relid,))
        return TablePlan(db, table, columns, rel.pk, rel.schema, int(est or 0), source=rel)

    def _begin_at(self, reader: Any, plan: TablePlan) -> tuple[Any, Any]:
        # the relation as described goes out first (CREATE TABLE), once the stream has passed
        # the WAL position read after the describe (a change of it seen before: read again)
        return plan.source, LsnPosition(self.region.record_boundary(reader.insert_lsn()))

    def _read(self, reader: Any, plan: TablePlan, p: TableProgress, token: int = 0) -> Chunk:
        low = self.region.chunk_low(plan, token)
        for _ in range(_RETRIES):
            try:
                chunk = self._read_pg(reader, plan, p, low)
            except Exception as exc:
                if reader.is_error(exc) and reader.errno(exc) == 1146:
                    raise TableGone(plan.name) from None
                if reader.is_error(exc) and reader.errno(exc) == 1054:  # a column went since it was described
                    raise ColumnsChanged(plan.name) from None
                raise
            if chunk is not None:
                return chunk
            self.lock_retries += 1
            if self.stop.wait(0.05):
                break
        raise SourceError(f"{self.region.where}: snapshot of {plan.name}: transactions the stream delivered "
                          f"stayed invisible to {_RETRIES} reads in a row (a synchronous standby that does not "
                          "answer?)")

    def _read_pg(self, reader: PgReader, plan: TablePlan, p: TableProgress, low: tuple[Any, ...]) -> Chunk | None:

        rel = plan.source
        types = rel.types
        names = [c.name for c in plan.columns]
        oids = sorted({c.type_oid for c in rel.columns})
        gen = self.region.snapshot_generation()
        table = f"{quote_pg(plan.db)}.{quote_pg(plan.table)}"
        cols = ", ".join(quote_pg(n) for n in names)
        snap = reader.begin()
        try:
            if self.region.delivered_unseen(snap, low):
                return None  # a transaction the stream delivered before the chunk began is not visible yet

            def make(raw: tuple[Any, ...]) -> dict[str, Any]:
                return {n: (None if v is None else parse_value(t, v)) for n, t, v in zip(names, types, raw)}

            if not plan.key:
                ctx = self.region.ctx
                spill = SpillWriter(ctx.spill_dir or None, min(ctx.spill_rows or DEFAULT_CHUNK_ROWS, DEFAULT_CHUNK_ROWS))
                with reader.text_cursor(oids, name=f"capturer_snap_{id(self) & 0xffff:x}") as cur:
                    cur.execute(f"SELECT {cols} FROM {table}", ())  # (with parameters: %% reads as %)
                    while True:
                        batch = cur.fetchmany(5000)
                        if not batch:
                            break
                        spill.add([RowChange(plan.schema, "read", None, make(r)) for r in batch])
                at = LsnPosition(self.region.record_boundary(reader.insert_lsn()))
                return Chunk(plan, at, [], None, True, p.chunks, p.run, True, spill.finish(), gen=gen,
                             drop_after=low, visible=snap.visible)
            key_idx = [names.index(k) for k in plan.key]
            fmt = {c.name: c.column_type for c in plan.columns}
            sql = f"SELECT {cols} FROM {table}"
            params: tuple[Any, ...] = ()
            _, values = split_key(p.last_key)
            if values is not None:
                lhs = ", ".join(quote_pg(k) for k in plan.key)
                rhs = ", ".join(f"%s::{fmt[k]}" for k in plan.key)
                sql += f" WHERE ({lhs}) > ({rhs})"
                params = tuple(values)
            sql += " ORDER BY " + ", ".join(quote_pg(k) for k in plan.key) + f" LIMIT {self.chunk_rows}"
            with reader.text_cursor(oids) as cur:
                raw = cur.execute(sql, params).fetchall()
            rows = [make(r) for r in raw]
            last_key = (plan.key_signature(), *(raw[-1][i] for i in key_idx)) if raw else p.last_key
            at = LsnPosition(self.region.record_boundary(reader.insert_lsn()))
            return Chunk(plan, at, rows, last_key, len(rows) < self.chunk_rows, p.chunks, p.run, False, gen=gen,
                         drop_after=low, visible=snap.visible)
        finally:
            reader.end()

