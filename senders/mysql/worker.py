"""The MySQL sender's workers: one target connection each, used from its own thread,
applying chunks of row operations (``Op``) as multi-row SQL, committing with the
lane's position row (``LaneMark``) in the same transaction; and how a MySQL error is
classified (retriable or not). The sender (senders/mysql/sender.py) plans which
worker gets what; a worker knows the sender only through ``WorkerHost``."""

from __future__ import annotations

import logging
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Protocol

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT, SERVER_STATUS

from capturer.errors import SinkError
from capturer.model import RowChange
from capturer.model.encode import _fastrows, quote_ident
from capturer.util import failpoints, mysqlconn
from senders.sqlbuild import Render, Stmt, Table, case_clash, converted, param_ident, skip_partial

log = logging.getLogger(__name__)


Ident = tuple[int, str, int]  # (commit_ts, region, seq): merged-stream order


class WorkerHost(Protocol):
    """What a worker needs of its sender (MySQLSender)."""

    name: str
    options: dict[str, Any]
    idle_limit: float
    sessions_kept: bool
    commit_rows: int  # rows per chunk (one target transaction)
    stmt_rows: int  # rows per statement
    meta_db: str  # the replay-protection database ("" for none)
    lane_commit_sql: str  # the lane's position row, written before each COMMIT
    progress: dict[str, Ident]  # per table without a key: the last change applied
    progress_after_commit: dict[str, Ident]

    def register_session(self, cur: Any) -> None: ...

    def fence_check(self, conn: pymysql.connections.Connection) -> None: ...

    def count(self, what: str, n: int = 1) -> None: ...


# errors worth retrying: the target is down, restarting, overloaded or deadlocked
RETRIABLE = {
    1040, 1053, 1077, 1078, 1079, 1080, 1152, 1153, 1154, 1155, 1156, 1157, 1158, 1159, 1160,
    1161, 1184, 1205, 1213, 1290, 1836, 1927, 2002, 2003, 2004, 2005, 2006, 2013, 2014, 2026,
    2027, 2055, 4031,
}
# DDL that was already applied (a replay after a crash): fine to skip
DDL_ALREADY_DONE = {1007, 1008, 1050, 1051, 1060, 1061, 1068, 1091, 1826}
ER_NO_SUCH_TABLE = 1146
ER_DUP_FIELDNAME = 1060
ER_DUP_ENTRY = 1062



def _zeroed(image: dict[str, Any] | None, cols: dict[str, str]) -> dict[str, Any] | None:
    """``image`` with ``cols``' zero date where it holds None (the same dict when none does)."""
    if image is None:
        return None
    out = None
    for c, zero in cols.items():
        if c in image and image[c] is None:
            if out is None:
                out = dict(image)
            out[c] = zero
    return image if out is None else out


@dataclass(slots=True)
class Op:
    ident: Ident
    ch: RowChange
    db: str  # target database
    table: str
    pos: int = -1  # its place in its lane's share of the phase (senders/mysql/position.py); -1: none kept

    @property
    def keyed(self) -> bool:
        return bool(self.ch.schema.pk or self.ch.schema.unique_keys)


@dataclass(frozen=True, slots=True)
class LaneMark:
    """What a worker writes with every chunk of a lane's share: the lane's row of
    ``<meta_database>.lanes`` (the phase, how many of the share are committed, and
    the phase's manifest with the lane's first chunk)."""

    phase: int
    lane: int
    manifest: bytes


# the C build of pymysql's escaping (capturer/_fastrows.c) where it was built
_sql_literals = getattr(_fastrows, "sql_literals", None)
_sql_tuples = getattr(_fastrows, "sql_tuples", None)

_NO_BACKSLASH = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES


class FastCursor(pymysql.cursors.Cursor):
    """A pymysql cursor whose parameters are escaped by the C build of pymysql's
    own escaping: the same SQL text (a unit test compares them on every value
    type; types it does not know go through pymysql's ``Connection.escape``)."""

    def _mogrify(self, query: str, args: Any) -> str:
        if _sql_literals is None or not isinstance(args, (list, tuple)):
            return super()._mogrify(query, args)
        conn = self._get_db()
        lits = _sql_literals(args, bool(conn.server_status & _NO_BACKSLASH), conn.escape)
        try:
            return query % lits
        except TypeError as exc:
            raise pymysql.err.ProgrammingError(str(exc)) from exc


def _overlapping(run: list[Op]) -> bool:
    """Whether updates of ``run`` touch one primary key twice (old or new key)."""
    seen: set[tuple[Any, ...]] = set()
    for op in run:
        pk = op.ch.schema.pk
        keys = {tuple(repr(img.get(c)) for c in pk) for img in (op.ch.before, op.ch.after) if img}
        if keys & seen:
            return True
        seen |= keys
    return False


def _kind(ch: RowChange) -> str:
    """How a change is applied: ``upsert`` (a multi-row ``INSERT ... ON DUPLICATE KEY
    UPDATE``), ``delete`` or ``update`` (``UPDATE ... WHERE <old key>``).

    An update that keeps its primary key and carries the whole new row (a full row
    image) is an upsert too: where the row is there it sets the same columns to the
    same values as the ``UPDATE``; where it is not (a replay, a target that lost it)
    it inserts the new image, which is what ``_update`` falls back to when its
    ``UPDATE`` matched nothing. A collision on another unique key takes the insert's
    REPLACE path. Key changes, tables without a primary key and partial images
    (``binlog_row_image=MINIMAL``) keep the ``UPDATE``."""
    op = ch.op
    if op == "insert" or op == "read":
        return "upsert"
    if op == "delete":
        return "delete"
    s, before, after = ch.schema, ch.before, ch.after
    if (s.pk and before is not None and after is not None and len(after) == len(s.columns)
            and all(c in after and c in before and before[c] == after[c] for c in s.pk)):
        return "upsert"
    return "update"


@lru_cache(maxsize=4096)
def applied_key(db: str, table: str) -> str:
    """A keyless table's row in ``<meta_db>.applied``: ``db.table`` as ever where neither name
    holds a dot or a backquote, else both quoted (which no plain key can be): ``"a.b" + "c"`` and
    ``"a" + "b.c"`` were one key, so a crash could have one table's rows skipped or applied twice
    by the other's progress."""
    if "." in db or "." in table or "`" in db or "`" in table:
        return f"{quote_ident(db)}.{quote_ident(table)}"
    return f"{db}.{table}"


def _classify(exc: BaseException, what: str) -> SinkError:
    if isinstance(exc, SinkError):
        return exc
    code = exc.args[0] if getattr(exc, "args", None) and isinstance(exc.args[0], int) else 0
    retriable = isinstance(exc, (pymysql.err.InterfaceError, OSError)) or code in RETRIABLE
    return SinkError(f"{what}: {exc}", retriable=retriable)


class Worker:
    """One target connection, used only from its own thread."""

    def __init__(self, sender: WorkerHost, index: int):
        self.s = sender
        self.index = index
        self.conn: pymysql.connections.Connection | None = None
        self.used = 0.0  # (monotonic) when the connection was last handed out
        # what the connection is doing at the target now and since when (monotonic): a statement or the
        # commit of a chunk, a DDL; None between them. The sender's status says what it waits for from it
        self.doing: tuple[float, str] | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"mysql-w{index}")

    # --- connection ---------------------------------------------------------
    def connect(self) -> pymysql.connections.Connection:
        idle = self.s.idle_limit
        if self.conn is not None and idle and time.monotonic() - self.used > idle:
            self.drop()  # (the server has closed it by now: wait_timeout, below)
        self.used = time.monotonic()
        if self.conn is None:
            o = self.s.options
            try:
                conn = mysqlconn.connect(
                    host=o["host"], port=o["port"], user=o["user"], password=o["password"],
                    charset="utf8mb4", autocommit=False, connect_timeout=o["connect_timeout"],
                    read_timeout=o["timeout"], write_timeout=o["timeout"],
                    client_flag=CLIENT.MULTI_STATEMENTS | CLIENT.FOUND_ROWS, cursorclass=FastCursor,
                    **mysqlconn.tls_kwargs(o["ssl_mode"], o["ssl_ca"], o["ssl_cert"], o["ssl_key"]),
                )
                with conn.cursor() as cur:
                    # binlog TIMESTAMPs are UTC; keep 0 in an AUTO_INCREMENT column; allow what
                    # the source allowed; rows of different tables may arrive out of FK order
                    cur.execute("SET time_zone='+00:00', sql_mode='NO_AUTO_VALUE_ON_ZERO,"
                                "NO_ENGINE_SUBSTITUTION', foreign_key_checks=0")
                    # workers touch disjoint rows; READ COMMITTED avoids the gap locks
                    # that would make them deadlock on neighbouring keys
                    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    if self.s.idle_limit:
                        # high availability: a capturer frozen in a chunk's transaction (SIGSTOP, a frozen VM)
                        # holds the fence row in share mode; the server closes its connection after this,
                        # so the new active's claim waits that long at most, not the default 8 hours
                        cur.execute(f"SET SESSION wait_timeout = {int(self.s.idle_limit) + 5}, "
                                    "innodb_lock_wait_timeout = 10")
                    if self.s.sessions_kept:
                        self.s.register_session(cur)
                conn.commit()
            except pymysql.err.MySQLError as exc:
                tls = mysqlconn.explain_tls(exc, f"sender {self.s.name} ({o['host']}:{o['port']}, [{self.s.name}])",
                                            o["ssl_mode"], o["ssl_ca"])
                if tls is not None:
                    raise SinkError(tls, retriable=False) from exc  # (a wrong CA or mode does not heal by retrying)
                raise _classify(exc, f"connect to {o['host']}:{o['port']}") from exc
            self.conn = conn
        return self.conn

    def drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None

    # --- applying -----------------------------------------------------------
    def submit(self, units: list[list[Op]], atomic: bool, mark: LaneMark | None = None) -> Future[int]:
        return self.pool.submit(self.apply, units, atomic, mark)

    def apply(self, units: list[list[Op]], atomic: bool, mark: LaneMark | None = None) -> int:
        """Apply and commit, in chunks (with ``atomic`` whole units, as many as fit in
        ``commit_rows`` rows, a bigger one alone; else ``commit_rows`` rows); a deadlock or lock timeout is retried here, at once: the chunk that failed
        was rolled back, and the chunks committed before it are not applied again.
        ``mark``: the lane's row, written in the transaction of every chunk (how much of
        the lane's share is committed: exactly what the target holds)."""
        if atomic:
            # whole source transactions only: consecutive units together up to commit_rows rows (a bigger
            # one alone), so that small transactions do not cost a target commit (and a lane row) each
            chunks: list[list[Op]] = []
            for unit in units:
                if chunks and len(chunks[-1]) + len(unit) <= self.s.commit_rows:
                    chunks[-1].extend(unit)
                else:
                    chunks.append(list(unit))
        else:
            ops = [op for unit in units for op in unit]
            chunks = [ops[i : i + self.s.commit_rows] for i in range(0, len(ops), self.s.commit_rows)]
        committed = [0, 0]  # chunks, rows
        for attempt in range(1, 9):
            try:
                self._apply(chunks, committed, mark)
                return committed[1]
            except SinkError as exc:
                cause = exc.__cause__
                code = cause.args[0] if cause is not None and cause.args else 0
                if code not in (1213, 1205) or attempt == 8:
                    raise
                self.s.count("deadlock_retries")
                time.sleep(random.uniform(0.005, 0.05) * attempt)
        raise AssertionError("unreachable")

    def _apply(self, chunks: list[list[Op]], committed: list[int], mark: LaneMark | None = None) -> None:
        """Apply ``chunks`` from ``committed[0]`` on, each in its own target
        transaction; ``committed`` counts the chunks and rows committed. Each chunk's
        transaction also writes ``mark`` (the lane's row; the manifest with the first).
        Failpoint ``mysql.commit``: before each chunk's commit (``eio``: the chunk is
        rolled back, the batch fails while other workers may have committed theirs)."""
        conn = self.connect()
        try:
            while committed[0] < len(chunks):
                self.s.fence_check(conn)  # high availability: a deposed capturer's chunk is rolled back
                chunk = chunks[committed[0]]
                done = self._apply_ops(conn, chunk)
                failpoints.hit("mysql.commit")  # a chunk is about to be committed (the others' may be already)
                self.doing = (time.monotonic(), f"COMMIT of {len(chunk)} change(s)")
                if mark is not None and self.s.meta_db and chunk and chunk[-1].pos >= 0:
                    # the lane's row and the commit in one round trip (a statement each would cost a
                    # transaction per source transaction with txn_atomic a third more time)
                    with conn.cursor() as cur:
                        cur.execute(self.s.lane_commit_sql, (self.s.name, mark.lane, mark.phase, chunk[-1].pos + 1,
                                                             mark.manifest if committed[0] == 0 else None))
                        while cur.nextset():
                            pass
                else:
                    conn.commit()
                committed[0] += 1
                committed[1] += done
        except BaseException as exc:
            err = _classify(exc, f"worker {self.index}")
            try:
                conn.rollback()
            except Exception:
                pass
            inner = exc.__cause__ if isinstance(exc, SinkError) else exc
            code = inner.args[0] if inner is not None and getattr(inner, "args", None) else 0
            if err.retriable and code not in (1213, 1205):
                self.drop()
            raise err from inner
        finally:
            self.doing = None

    def _apply_ops(self, conn: pymysql.connections.Connection, ops: list[Op]) -> int:
        """Apply ``ops`` in the open transaction (not committed here): their statements
        and the ``applied`` identities of tables without keys; the number of rows
        applied (replays skipped). (``_apply`` writes the lane's row with the commit:
        ``done`` = the place of the chunk's last change + 1.)"""
        progress: dict[str, Ident] = {}
        todo = []
        for op in ops:
            if not op.keyed and self.s.meta_db:
                tkey = applied_key(op.db, op.table)
                seen = self.s.progress.get(tkey)
                if seen is not None and op.ident <= seen:
                    self.s.count("replayed_skips")
                    continue  # applied before a crash: replaying would duplicate it
                progress[tkey] = op.ident
            todo.append(op)
        i, n = 0, len(todo)
        kinds = [_kind(op.ch) for op in todo]
        with conn.cursor() as cur:
            todo = self._zero_dates(cur, todo)
            while i < n:
                # a run: consecutive changes of one table and kind whose images have the same columns
                head = todo[i]
                kind, schema, cols = kinds[i], head.ch.schema, head.ch.image.keys()
                j, end = i + 1, min(n, i + self.s.stmt_rows)
                while j < end:
                    op = todo[j]
                    if (kinds[j] != kind or op.table != head.table or op.db != head.db
                            or (op.ch.schema is not schema and op.keyed != head.keyed)
                            or op.ch.image.keys() != cols):
                        break
                    j += 1
                run = todo[i:j]
                what = f"{head.ch.op} into {quote_ident(head.db)}.{quote_ident(head.table)}"
                self.doing = (time.monotonic(), f"{what} ({j - i} row(s))")
                clash = case_clash(schema)
                if clash is not None:
                    raise SinkError(f"{what}: the source table {quote_ident(schema.db)}.{quote_ident(schema.table)} "
                                    f"has columns {quote_ident(clash[0])} and {quote_ident(clash[1])}, whose names "
                                    "differ only in case: a MySQL target compares column names case-insensitively, "
                                    "so it cannot keep them apart (rename one at the source, or exclude the table in "
                                    "the filter)", retriable=False)
                try:
                    if kinds[i] == "upsert":
                        self._insert(cur, run)
                    elif kinds[i] == "delete":
                        self._delete(cur, run)
                    else:
                        self._update(cur, run)
                except pymysql.err.MySQLError as exc:
                    raise _classify(exc, what) from exc
                i = j
            if progress:
                self.doing = (time.monotonic(), f"the progress rows of tables without keys in "
                                                f"{quote_ident(self.s.meta_db)}.`applied`")
            for tkey, ident in progress.items():
                cur.execute(
                    f"INSERT INTO {param_ident(self.s.meta_db)}.`applied` (tbl, commit_ts, region, seq) "
                    "VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE commit_ts=VALUES(commit_ts), "
                    "region=VALUES(region), seq=VALUES(seq)",
                    (tkey, ident[0], ident[1], ident[2]),
                )
        for tkey, ident in progress.items():
            self.s.progress_after_commit[tkey] = ident
        return len(todo)

    def _zero_dates(self, cur: Any, todo: list[Op]) -> list[Op]:
        """``todo`` with the zero date written back where a ``NOT NULL`` date column of the target has
        NULL: the sources' zero dates (``0000-00-00``) arrive as NULL (no calendar has them), which such a
        column refuses (error 1048 for a row inserted alone) or replaces by its implicit default (the
        current time for a ``TIMESTAMP``). The source's column is ``NOT NULL`` too (the target's was made
        from its definition), so its NULL there can only have been a zero date. The target's columns are
        read once a table (``zero_date_columns``, forgotten at every DDL the sender applies)."""
        known: dict[tuple[str, str], dict[str, str]] | None = getattr(self.s, "zero_date_columns", None)
        if known is None:
            return todo
        out: list[Op] | None = None
        for k, op in enumerate(todo):
            cols = known.get((op.db, op.table))
            if cols is None:
                cur.execute("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s "
                            "AND TABLE_NAME=%s AND IS_NULLABLE='NO' AND DATA_TYPE IN ('date','datetime','timestamp')",
                            (op.db, op.table))
                cols = {str(c): "0000-00-00" if str(t).lower() == "date" else "0000-00-00 00:00:00"
                        for c, t in cur.fetchall()}
                known[(op.db, op.table)] = cols
            if not cols:
                continue
            ch = op.ch
            before, after = _zeroed(ch.before, cols), _zeroed(ch.after, cols)
            if before is ch.before and after is ch.after:
                continue
            if out is None:
                out = list(todo)
            out[k] = Op(op.ident, replace(ch, before=before, after=after), op.db, op.table, op.pos)
        return todo if out is None else out

    @staticmethod
    def _render(cur: Any, run: list[Op]) -> Render | None:
        """The values of ``run`` as SQL text in one C call (pymysql's escaping: the same
        text as with parameters), where built and no value needs ``sql_param``."""
        if _sql_tuples is None or any(converted(op.ch.schema) for op in run):
            return None
        conn = cur.connection
        no_backslash, escape = bool(conn.server_status & _NO_BACKSLASH), conn.escape
        return lambda rows, cols: _sql_tuples(rows, cols, no_backslash, escape)

    @staticmethod
    def _execute(cur: Any, t: Table, stmt: Stmt) -> int:
        # a literal statement has no parameters: pymysql sends it as it is (no % expansion)
        return int(cur.execute(stmt[0], None if t.literal else stmt[1]))

    def _insert(self, cur: Any, run: list[Op], verb: str = "INSERT") -> None:
        head = run[0]
        upsert = verb == "INSERT" and head.keyed
        render = self._render(cur, run)
        t = Table(head.db, head.table, literal=render is not None)
        try:
            self._execute(cur, t, t.insert([op.ch for op in run], verb, upsert, render))
        except pymysql.err.IntegrityError as exc:
            if exc.args[0] != ER_DUP_ENTRY or not upsert:
                raise
            if len(run) > 1:
                # (the failed statement was rolled back whole) one row at a time: only
                # a row that collides is replaced, the others stay upserts
                for op in run:
                    self._insert(cur, [op])
                return
            # the new row collides with a *different* row on a unique key: only
            # possible when replaying; REPLACE removes the stale row and converges
            self.s.count("replace_fallbacks", 1)
            self._insert(cur, run, verb="REPLACE")

    def _delete(self, cur: Any, run: list[Op]) -> None:
        head = run[0]
        pk = head.ch.schema.pk
        if pk and all(c in (op.ch.before or {}) for op in run for c in pk):
            render = self._render(cur, run)
            tk = Table(head.db, head.table, literal=render is not None)
            self._execute(cur, tk, tk.delete_keys([op.ch for op in run], render))
            return
        t = Table(head.db, head.table)
        self._multi(cur, [t.delete(op.ch) for op in run])

    def _update(self, cur: Any, run: list[Op]) -> None:
        head = run[0]
        if head.keyed and _overlapping(run):
            # two updates of one row (a source may log an update that changes nothing, then a key
            # change): an upsert for a row found missing must come before the next one, not after
            self._update_one_by_one(cur, run)
            return
        t = Table(head.db, head.table)
        try:
            counts = self._multi(cur, [t.update(op.ch) for op in run])
        except pymysql.err.IntegrityError as exc:
            if exc.args[0] != ER_DUP_ENTRY or not head.keyed:
                raise
            self._drain(cur)
            self._update_one_by_one(cur, run)
            return
        if head.keyed:
            missing = [op for op, n in zip(run, counts)
                       if n == 0 and not skip_partial(op.ch, self.s.count, "found no row at its old key")]
            if missing:
                # no row at the old key: the target is ahead (a replay) or lost it;
                # upserting the new image converges either way (a whole one: a partial one is skipped)
                self.s.count("upsert_fallbacks", len(missing))
                self._insert(cur, missing)

    def _update_one_by_one(self, cur: Any, run: list[Op]) -> None:
        """Slow path after a unique-key collision: statement by statement."""
        t = Table(run[0].db, run[0].table)
        for op in run:
            try:
                n = cur.execute(*t.update(op.ch))
            except pymysql.err.IntegrityError as exc:
                if exc.args[0] != ER_DUP_ENTRY:
                    raise
                if skip_partial(op.ch, self.s.count, "its new key is taken"):
                    continue  # (the target holds a row there already: never replaced by a partial one)
                self.s.count("replace_fallbacks", 1)
                cur.execute(*t.delete(op.ch))
                self._insert(cur, [op], verb="REPLACE")
                continue
            if n == 0 and not skip_partial(op.ch, self.s.count, "found no row at its old key"):
                self.s.count("upsert_fallbacks", 1)
                self._insert(cur, [op])

    @staticmethod
    def _multi(cur: Any, stmts: list[Stmt]) -> list[int]:
        """Several statements in one round trip; the matched-row count of each."""
        counts = [cur.execute(";\n".join(sql for sql, _ in stmts), [p for _, ps in stmts for p in ps])]
        while len(counts) < len(stmts):
            if not cur.nextset():
                break
            counts.append(cur.rowcount)
        return counts

    @staticmethod
    def _drain(cur: Any) -> None:
        try:
            while cur.nextset():
                pass
        except pymysql.err.MySQLError:
            pass

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.drop()
