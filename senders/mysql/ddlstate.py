"""A DDL applied again after a crash, told from one that never ran: the schema state
it started from, kept in the target before it runs (``<meta_database>.ddl_intents``).

MySQL commits a DDL on its own, so the MySQL sender commits it and then its position
(worker 0's row of ``lanes``) in a transaction after it: a crash in between hands the
DDL again after the restart. Many forms fail on their second run with an error that
says "already there" (``DDL_ALREADY_DONE``), but many do not: some fail with another
code (``RENAME INDEX``, ``DROP PARTITION``, ``REORGANIZE PARTITION``, ``DROP VIEW``,
``DROP SEQUENCE``, ``CREATE TRIGGER``, a named ``FOREIGN KEY``), and some succeed and
change the schema again: ``RENAME TABLE a TO tmp, b TO a, tmp TO b`` swaps back, an
unnamed ``ADD FOREIGN KEY`` or ``ADD CHECK`` adds a second one (surveyed on MariaDB
10.11: docs/limits.md).

So before it runs a DDL the sender writes, in a transaction of its own, the DDL's
stream key, a digest of its text and a digest of the **schema state** of the databases
it changes (``fingerprint``: their tables, columns, indexes, constraints, partitions,
views, triggers, routines and, where the sender's user may read them, InnoDB's table
ids, which a RENAME keeps: a swap of two tables of one definition shows). A DDL handed
again finds its own intent row: if the schema state differs from the one it started
from, the DDL ran (nothing else changes those databases between the intent and the
position: the sender applies nothing after a DDL before its position is written) and
it is not run again; if it is the same, the DDL did not run (or ran without changing
anything a second run would change), and it runs.

A statement of the crashed run may still be running at the target (the server has not
noticed its client died): the replay waits for it first (``twin_running``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Iterable
from typing import Any

import pymysql

from capturer.model import Ddl, StreamKey
from capturer.model.ddl import ddl_target, dropped_tables, names_several_tables, renamed_tables
from capturer.model.encode import quote_ident
from senders.sqlbuild import param_ident

log = logging.getLogger(__name__)

TABLE = "ddl_intents"
#: the fingerprint's version: an intent of another version is no evidence either way
VERSION = "v1"


def create_sql(meta_db: str) -> str:
    return (f"CREATE TABLE IF NOT EXISTS {quote_ident(meta_db)}.`{TABLE}` ("
            "sender VARCHAR(200) NOT NULL PRIMARY KEY, ddl_key VARCHAR(400) NOT NULL, "
            "stmt CHAR(64) NOT NULL, state VARCHAR(80) NOT NULL, "
            "updated TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)) "
            "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin")


def read_sql(meta_db: str) -> str:
    return f"SELECT ddl_key, stmt, state FROM {param_ident(meta_db)}.`{TABLE}` WHERE sender = %s"


def write_sql(meta_db: str) -> str:
    return (f"INSERT INTO {param_ident(meta_db)}.`{TABLE}` (sender, ddl_key, stmt, state) VALUES (%s, %s, %s, %s) "
            "ON DUPLICATE KEY UPDATE ddl_key=VALUES(ddl_key), stmt=VALUES(stmt), state=VALUES(state)")


def clear_sql(meta_db: str) -> str:
    """A refused DDL's intent made no evidence (an UPDATE: the sender's grant has no DELETE)."""
    return f"UPDATE {param_ident(meta_db)}.`{TABLE}` SET state = 'refused' WHERE sender = %s AND ddl_key = %s"


def key_text(key: StreamKey) -> str:
    return json.dumps([key[0], key[1], key[2]], separators=(",", ":"))


def stmt_digest(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8", "surrogatepass")).hexdigest()


class Scope:
    """What a DDL may change: whole databases, and tables by name (``(db, table)``)."""

    def __init__(self, dbs: Iterable[str] = (), tables: Iterable[tuple[str, str]] = (), renames: bool = False):
        self.dbs = sorted({d for d in dbs if d})
        self.tables = sorted({(d, t) for d, t in tables if d and t and d not in self.dbs})
        self.renames = renames  # it may rename tables

    def __repr__(self) -> str:
        return f"Scope({self.dbs!r}, {self.tables!r}, renames={self.renames})"


def scope(ddl: Ddl, sql: str, use: str | None, mapped: bool) -> Scope:
    """What ``sql`` (run with ``use`` current; ``mapped``: every source database goes into
    ``use``) may change: the tables it names where they are known (an ALTER, CREATE, DROP,
    TRUNCATE or RENAME TABLE, CREATE/DROP INDEX), else its databases whole (a view, a
    trigger, a sequence, a routine, a database, an ALTER that renames among other clauses)."""
    cur = use or ddl.session_db or ddl.db or ""
    dbs = {cur} if mapped else {cur, ddl.db, ddl.session_db}
    try:
        db, table = ddl_target(sql, cur)
        renamed = renamed_tables(sql, cur)
        dropped = dropped_tables(sql, cur)
        several = names_several_tables(sql)
        renames = bool(renamed) or (several and not dropped)
        if not table or any(not t for _, t in dropped) or (several and not renamed and not dropped):
            return Scope(dbs | {db} | {d for d, _ in dropped} | {d for pair in renamed for d, _ in pair},
                         renames=renames)
        tables = {(db, table)} | set(dropped) | {n for pair in renamed for n in pair}
        return Scope((), tables, renames=renames)
    except Exception:  # (best effort: the statement's own database whole)
        log.debug("scope of %r", sql[:200], exc_info=True)
    return Scope(dbs, renames=True)


# per part of the schema state: (name, columns, view, its schema column, its table column or None: whole
# databases only, order); statistics that move with the data (rows, lengths, AUTO_INCREMENT, times) are
# left out
_PARTS: list[tuple[str, str, str, str, str | None, str]] = [
    ("schemata", "SCHEMA_NAME, DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME", "SCHEMATA", "SCHEMA_NAME", None,
     "1"),
    ("tables", "TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE, ENGINE, ROW_FORMAT, TABLE_COLLATION, CREATE_OPTIONS, "
               "TABLE_COMMENT", "TABLES", "TABLE_SCHEMA", "TABLE_NAME", "1, 2"),
    ("columns", "TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, "
                "CHARACTER_SET_NAME, COLLATION_NAME, EXTRA, COLUMN_COMMENT, GENERATION_EXPRESSION", "COLUMNS",
     "TABLE_SCHEMA", "TABLE_NAME", "1, 2, 3"),
    ("indexes", "TABLE_SCHEMA, TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, NON_UNIQUE, SUB_PART, INDEX_TYPE",
     "STATISTICS", "TABLE_SCHEMA", "TABLE_NAME", "1, 2, 3, 4"),
    ("constraints", "CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, CONSTRAINT_TYPE", "TABLE_CONSTRAINTS",
     "TABLE_SCHEMA", "TABLE_NAME", "1, 2, 3, 4"),
    ("checks", "CONSTRAINT_SCHEMA, CONSTRAINT_NAME, CHECK_CLAUSE", "CHECK_CONSTRAINTS", "CONSTRAINT_SCHEMA", None,
     "1, 2, 3"),
    ("references", "CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, REFERENCED_TABLE_NAME, UPDATE_RULE, DELETE_RULE",
     "REFERENTIAL_CONSTRAINTS", "CONSTRAINT_SCHEMA", "TABLE_NAME", "1, 2, 3"),
    ("partitions", "TABLE_SCHEMA, TABLE_NAME, PARTITION_NAME, SUBPARTITION_NAME, PARTITION_ORDINAL_POSITION, "
                   "PARTITION_METHOD, PARTITION_EXPRESSION, PARTITION_DESCRIPTION", "PARTITIONS", "TABLE_SCHEMA",
     "TABLE_NAME", "1, 2, 5, 3, 4"),
    ("views", "TABLE_SCHEMA, TABLE_NAME, VIEW_DEFINITION", "VIEWS", "TABLE_SCHEMA", "TABLE_NAME", "1, 2"),
    ("triggers", "TRIGGER_SCHEMA, TRIGGER_NAME, EVENT_OBJECT_TABLE, ACTION_TIMING, EVENT_MANIPULATION, "
                 "ACTION_STATEMENT", "TRIGGERS", "TRIGGER_SCHEMA", "EVENT_OBJECT_TABLE", "1, 2"),
    ("routines", "ROUTINE_SCHEMA, ROUTINE_NAME, ROUTINE_TYPE, ROUTINE_DEFINITION", "ROUTINES", "ROUTINE_SCHEMA", None,
     "1, 2, 3"),
]

#: InnoDB's table ids (kept by a RENAME; new at each rebuild, TRUNCATE, CREATE): MariaDB, then MySQL 8
_IDS = ("SELECT NAME, TABLE_ID FROM information_schema.INNODB_SYS_TABLES",
        "SELECT NAME, TABLE_ID FROM information_schema.INNODB_TABLES")
_PLAIN = re.compile(r"^[0-9A-Za-z_]+$")  # a name InnoDB's file-name encoding keeps as it is


class Fingerprint:
    """Digests of the schema state of a ``Scope`` (one per sender: it remembers which
    queries this target answers)."""

    def __init__(self) -> None:
        self.ids_query: str | None = _IDS[0]  # None: the user may not read InnoDB's tables (PROCESS)
        self.skipped: set[str] = set()  # parts this server does not have

    def _rows(self, cur: Any, name: str, q: str, args: list[str]) -> list[Any] | None:
        if name in self.skipped:
            return None
        try:
            cur.execute(q, args)
        except pymysql.err.MySQLError as exc:
            # an older server without the view or a column of it (MySQL 5.7: CHECK_CONSTRAINTS)
            if exc.args and exc.args[0] in (1054, 1109, 1146):
                self.skipped.add(name)
                return None
            raise
        return list(cur.fetchall())

    def _part(self, cur: Any, h: Any, where: Scope, name: str, cols: str, view: str, scol: str, tcol: str | None,
              order: str) -> None:
        rows: list[Any] = []
        if where.dbs:
            q = f"SELECT {cols} FROM information_schema.{view} WHERE {scol} IN ({', '.join(['%s'] * len(where.dbs))}) "
            got = self._rows(cur, name, q + f"ORDER BY {order}", where.dbs)
            if got is None:
                return
            rows += got
        if tcol is not None:
            for db, table in where.tables:  # (one lookup per table: the server opens that table only)
                got = self._rows(cur, name, f"SELECT {cols} FROM information_schema.{view} WHERE {scol} = %s "
                                            f"AND {tcol} = %s ORDER BY {order}", [db, table])
                if got is None:
                    return
                rows.append(("\0table", db, table))
                rows += got
        h.update(f"\0{name}\0".encode())
        for row in rows:
            h.update(repr(tuple(_norm(v) for v in row)).encode("utf-8", "surrogatepass"))

    def _ids(self, cur: Any, where: Scope) -> bytes | None:
        """InnoDB's table ids of the scope's tables, or None where they cannot be read."""
        prefixes = tuple(f"{d}/" for d in where.dbs if _PLAIN.match(d))
        names = {f"{d}/{t}" for d, t in where.tables if _PLAIN.match(d) and _PLAIN.match(t)}
        if len(prefixes) < len(where.dbs) or len(names) < len(where.tables):
            return None  # (a name InnoDB writes encoded)
        # only the scope's rows from the server (a table's partitions: t#P#p0), not every table of the target:
        # with thousands of tables, reading them all cost each DDL tens of ms (a snapshot's CREATE TABLEs: the
        # square of the table count). LIKE may take more rows than those (_ matches any character, and case):
        # the filter below keeps the scope's, so the digest is the one the whole list gave.
        likes = [f"{p}%" for p in prefixes] + sorted(names) + [f"{n}#%" for n in sorted(names)]
        cond = " WHERE " + (" OR ".join(["NAME LIKE %s"] * len(likes)) if likes else "FALSE")
        while self.ids_query is not None:
            try:
                cur.execute(self.ids_query + cond, likes)
            except pymysql.err.MySQLError as exc:
                code = exc.args[0] if exc.args else 0
                if code in (1109, 1146) and self.ids_query == _IDS[0]:
                    self.ids_query = _IDS[1]
                    continue
                if code in (1054, 1109, 1146, 1227, 1142, 1044):  # no such view; PROCESS not granted
                    log.info("InnoDB's table ids cannot be read (%s): a RENAME swap of two tables of one "
                             "definition, replayed after a crash, is told from one that never ran by the tables' "
                             "CREATE_TIME only (to the second)", exc)
                    self.ids_query = None
                    break
                raise
            out = []
            for nm, tid in sorted((_norm(r[0]), int(r[1])) for r in cur.fetchall()):
                if isinstance(nm, str):
                    base = re.split(r"#[Pp]#", nm, maxsplit=1)[0]  # (a partition's table: t#P#p0)
                    if nm.startswith(prefixes) or base in names:
                        out.append(f"{nm}={tid};")
            return "".join(out).encode("utf-8", "surrogatepass")
        return None

    def state(self, cur: Any, where: Scope, mode: str | None = None) -> str | None:
        """The digest of ``where``'s schema state, made the ``mode`` way (as a state read
        before was: ``state_mode``) or the best way this target allows (None); None if it
        cannot be made that way now. ``ids``: with InnoDB's table ids; ``ctime``: with the
        tables' CREATE_TIME (a RENAME; the ids not readable: the user lacks PROCESS);
        ``plain``: definitions only."""
        ids = self._ids(cur, where) if mode in (None, "ids") else None
        if mode is None:
            mode = "ids" if ids is not None else ("ctime" if where.renames else "plain")
        elif mode not in ("ids", "ctime", "plain") or (mode == "ids" and ids is None):
            return None
        h = hashlib.sha256(f"{VERSION}:{mode}".encode())
        for part in _PARTS:
            self._part(cur, h, where, *part)
        if mode == "ctime":
            self._part(cur, h, where, "created", "TABLE_SCHEMA, TABLE_NAME, CREATE_TIME", "TABLES", "TABLE_SCHEMA",
                       "TABLE_NAME", "1, 2")
        elif ids is not None:
            h.update(b"\0ids\0" + ids)
        return f"{VERSION}:{mode}:{h.hexdigest()}"


def state_mode(state: str) -> str | None:
    """How a recorded state was made (``Fingerprint.state``), or None: another version's."""
    parts = state.split(":")
    return parts[1] if len(parts) == 3 and parts[0] == VERSION else None


def _norm(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "surrogateescape")
    return v


def twin_running(cur: Any, stmt: str) -> int | None:
    """The id of another connection running ``stmt`` now (the crashed run's DDL, still at
    work at the target), or None."""
    try:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND INFO = %s "
                    "LIMIT 1", (stmt,))
        row = cur.fetchone()
    except pymysql.err.MySQLError:
        return None
    return int(row[0]) if row else None


def wait_for_twin(cur: Any, stmt: str, name: str, poll: float = 0.5) -> None:
    """Wait while the crashed run's statement still runs at the target (logged every 30 s)."""
    t0 = time.monotonic()
    shown = t0 - 30
    while (tid := twin_running(cur, stmt)) is not None:
        now = time.monotonic()
        if now - shown >= 30:
            log.warning("sender %s: the DDL of the run before still runs at the target (connection %s, %.0f s): "
                        "waiting for it before telling whether it applied: %s", name, tid, now - t0, stmt[:200])
            shown = now
        time.sleep(poll)
