"""A MySQL/MariaDB region's source, read over SQL by ``verify`` (capturer/ops/verify.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from capturer.model import Position, rowsum
from capturer.model.compare import KINDS, SourceUnreachable, SqlSource, TableMeta
from capturer.model.encode import quote_ident
from capturer.regions.mysql.keys import RegionConfig
from capturer.util import mysqlconn
from capturer.util.binlogpos import binlog_end
from capturer.util.perthread import PerThread


def source(r: RegionConfig) -> MySQLSource:
    """``verify``'s reader of region ``r``'s server."""
    return MySQLSource(r.name, r.host, r.port, r.user, r.password, r.connect_timeout, r.tls())


class MySQLSource(SqlSource):
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
