"""The MySQL sender's target, read back for ``verify`` (capturer/ops/verify.py).

The same SQL as on the sources (capturer/model/rowsum.py): chunk checksums are
computed by the target server; only the rows of chunks that differ travel. The
target table of a source ``db.table`` is the sender's: ``database=`` (when set)
in place of ``db``. TIMESTAMPs are read in UTC, as the sender writes them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from capturer.model import rowsum
from capturer.model.encode import quote_ident
from capturer.util import mysqlconn
from capturer.util.perthread import PerThread

NO_TABLE = (1146, 1049)  # table / database does not exist


class MySQLTargetReader:
    kind = "mysql"

    def __init__(self, name: str, options: dict[str, Any], regions: list[tuple[str, str, str]]):
        self.name = name
        self.o = options
        self.target_db = options.get("database") or ""
        self._conns = PerThread(self._connect)

    def _connect(self) -> Any:
        o = self.o
        return mysqlconn.connect_utc(host=o["host"], port=o["port"], user=o["user"], password=o["password"],
                                     charset="utf8mb4", autocommit=True, connect_timeout=o["connect_timeout"],
                                     read_timeout=o["timeout"],
                                     **mysqlconn.tls_kwargs(o.get("ssl_mode", "preferred"), o.get("ssl_ca", ""),
                                                            o.get("ssl_cert", ""), o.get("ssl_key", "")))

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._conns.get().cursor() as cur:
            cur.execute(sql, tuple(args))
            return list(cur.fetchall())

    def destination(self, db: str, table: str) -> tuple[str, str]:
        return (self.target_db or db, table)

    def where(self, dest: tuple[str, str]) -> str:
        return f"mysql {self.o['host']}:{self.o['port']} " + (f"{quote_ident(dest[0])}.{quote_ident(dest[1])}"
                                                            if dest[1] else "")

    def refresh(self) -> None:
        pass

    def exists(self, dest: tuple[str, str]) -> bool:
        return bool(self._query("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s",
                                dest))

    def _types(self, dest: tuple[str, str]) -> dict[str, str]:
        """The target's columns, each with its DATA_TYPE."""
        return {str(r[0]): str(r[1]).lower() for r in self._query(
            "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s",
            dest)}

    def _columns(self, dest: tuple[str, str], columns: Sequence[str]) -> list[str]:
        """The columns the target has, of those asked (a missing one reads as absent)."""
        have = self._types(dest)
        return [c for c in columns if c in have]

    def _select(self, dest: tuple[str, str], columns: Sequence[str], where: str,
                args: Sequence[Any]) -> list[dict[str, Any]]:
        import pymysql

        types = self._types(dest)
        cols = [c for c in columns if c in types]
        if not cols:
            return []
        # a FLOAT as its exact value (its text has 6 digits: 1.1754944e-38 reads back as 1.17549e-38)
        select = ", ".join(f"CAST({quote_ident(c)} AS DOUBLE)" if types[c] == "float" else quote_ident(c)
                           for c in cols)
        try:
            got = self._query(f"SELECT {select} FROM {quote_ident(dest[0])}.{quote_ident(dest[1])} WHERE {where}",
                              args)
        except pymysql.err.ProgrammingError as exc:
            if exc.args and exc.args[0] in NO_TABLE:
                return []
            raise
        return [dict(zip(cols, r)) for r in got]

    def rows(self, dest: tuple[str, str], columns: Sequence[str]) -> list[dict[str, Any]] | None:
        if not self.exists(dest):
            return None
        return self._select(dest, columns, "1=1", ())

    def checksum(self, dest: tuple[str, str], columns: Sequence[str], where: str,
                 args: Sequence[Any]) -> tuple[int, int]:
        if self._columns(dest, columns) != list(columns):
            return (-1, -1)  # a column is missing: the rows will say which
        got = self._query(rowsum.checksum_sql(f"{quote_ident(dest[0])}.{quote_ident(dest[1])}", columns, where),
                          args)
        return int(got[0][0]), int(got[0][1])

    def select(self, dest: tuple[str, str], columns: Sequence[str], where: str,
               args: Sequence[Any]) -> list[dict[str, Any]]:
        return self._select(dest, columns, where, args)

    def keys_rows(self, dest: tuple[str, str], columns: Sequence[str], pk: Sequence[str],
                  keys: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(0, len(keys), 500):
            where, args = rowsum.keys_sql(pk, keys[i:i + 500])
            out += self._select(dest, columns, where, args)
        return out

    def close(self) -> None:
        self._conns.close()
