"""The Spark sender: a Parquet changelog per source table, appended through
Arrow, with a merge-on-read current state and periodic compaction
(layout and SQL in ``senders.spark.lake``).

* A batch is grouped by table; each table's rows become one Arrow table,
  written as a Parquet file for ``<warehouse>/<name>/changelog``.
* Each batch is committed once, whole (``senders.spark.commits``): its files
  (every table's) are staged and fsync'd, one fdatasync'd line of the lake's
  commit log commits them with the stream key of the batch's last transaction,
  then they are renamed into the changelogs. Only then is the batch
  acknowledged. After a crash (kill -9 anywhere) or a failed attempt, the
  sender brings the lake to its last committed batch (staged files of a
  committed batch are published, the others deleted) and reports that batch's
  key as its position (``resume_key``): nothing at or below it is written
  again, so a changelog holds every change identity
  ``(_region, _commit_ts, _seq, _sub)`` once. Readers (Spark, the views,
  compaction) see committed batches only.
* ADD COLUMN (and new tables) just work: the changelog schema is merged. A
  column whose type changes incompatibly stops the sender with an error that
  says what to do.
* Runs on ``local[*]`` by default and on a cluster with ``master=spark://...``
  (the warehouse must then be on storage every executor can reach).
"""

from __future__ import annotations

import datetime as dt
import decimal
import importlib
import importlib.util
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path
from typing import Any, ClassVar

from capturer.errors import SinkError
from capturer.model import Ddl, RowChange, StreamKey, TableSchema, Txn, key_from_json, key_to_json, stream_key
from capturer.model.ddl import RENAME_TMP, clean, dropped_tables, table_renames
from capturer.model.encode import _fastrows
from capturer.util import failpoints
from capturer.util.ini import Key, p_bool, p_choice, p_float, p_int, p_nonempty, p_str
from senders.base import Sender
from senders.spark import commits, lake
from senders.sqlbuild import name_clash

log = logging.getLogger(__name__)

_INCOMPATIBLE_HELP = (
    "The Parquet changelog cannot hold both types. Way out: stop the capturer, move the "
    "table's directory {dir} aside, then re-create the table's history in the lake, e.g. "
    "by re-copying the source table (CREATE TABLE t2 LIKE t; INSERT INTO t2 SELECT * FROM t; "
    "RENAME ...) or by starting this sender from a checkpoint before the table existed."
)


def arrow_type(stype: str) -> Any:
    import pyarrow as pa

    m = re.match(r"decimal\((\d+),(\d+)\)", stype)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    return {
        "bigint": pa.int64(), "int": pa.int32(), "double": pa.float64(), "string": pa.string(),
        "binary": pa.binary(), "date": pa.date32(), "timestamp_ntz": pa.timestamp("us"),
    }[stype]


class _Rows:
    """One table's rows of a batch as the lake's columns take them: a list per column
    (the metadata columns, each row's schema and image), appended row by row; no
    object made per row."""

    __slots__ = ("ops", "ts", "regions", "seqs", "subs", "schemas", "imgs")

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.ts: list[int] = []
        self.regions: list[str] = []
        self.seqs: list[int] = []
        self.subs: list[int] = []
        self.schemas: list[TableSchema] = []
        self.imgs: list[dict[str, Any]] = []

    def add(self, op: str, ts: int, region: str, seq: int, sub: int, schema: TableSchema,
            img: dict[str, Any]) -> None:
        self.ops.append(op)
        self.ts.append(ts)
        self.regions.append(region)
        self.seqs.append(seq)
        self.subs.append(sub)
        self.schemas.append(schema)
        self.imgs.append(img)


def add_row(by_table: dict[tuple[str, str], _Rows], ts: int, region: str, seq: int, ch: RowChange) -> None:
    """One change (``seq``: its index in its transaction) as the lake's rows of its table: an insert (or a
    snapshot's read) is an 'i' of its new image, a delete a 'd' of its old one, an update a 'u' of its new
    one, or, where the table has no primary key or the update changed it, a 'd' of the old image and an 'i'
    (``_sub`` 1) of the new one."""
    s = ch.schema
    rows = by_table.get((s.db, s.table))
    if rows is None:
        rows = by_table[(s.db, s.table)] = _Rows()
    op = ch.op
    if op == "insert" or op == "read":
        rows.add("i", ts, region, seq, 0, s, ch.after or {})
        return
    if op == "delete":
        rows.add("d", ts, region, seq, 0, s, ch.before or {})
        return
    pk = s.pk
    before, after = ch.before or {}, ch.after or {}
    if not pk or any(before.get(c) != after.get(c) for c in pk):
        rows.add("d", ts, region, seq, 0, s, before)
        rows.add("i", ts, region, seq, 1, s, after)
    else:
        rows.add("u", ts, region, seq, 0, s, after)


def group_rows(changes: Sequence[RowChange], ts: int, region: str, by_table: dict[tuple[str, str], _Rows],
               rows_type: type[_Rows] = _Rows, ops: tuple[str, str, str] = ("i", "u", "d")) -> None:
    """A transaction's changes as the lake's rows of their tables (``add_row`` each): the specification of
    the C ``lake_rows`` (tests/unit/test_arrowcols.py compares both), used where it is not built; takes its
    arguments (``rows_type`` and ``ops`` are what ``add_row`` uses)."""
    for seq, ch in enumerate(changes):
        add_row(by_table, ts, region, seq, ch)


_OPS = ("i", "u", "d")
_group_rows: Any = getattr(_fastrows, "lake_rows", None) or group_rows


# value types Arrow takes as they are for each lake type (lake_value would return them unchanged)
_AS_IS: dict[str, set[type]] = {
    "bigint": {int, type(None)}, "int": {int, type(None)}, "double": {float, type(None)},
    "string": {str, type(None)}, "binary": {bytes, type(None)}, "date": {dt.date, type(None)},
    "timestamp_ntz": {dt.datetime, type(None)}, "decimal": {decimal.Decimal, type(None)},
}


# the C build of the columns (capturer/_native/arrowcols.c) where it was built: its column kinds per lake type
_arrow_columns = getattr(_fastrows, "arrow_columns", None)
_KINDS = {"bigint": 0, "int": 1, "double": 2, "string": 3, "binary": 4, "date": 5, "timestamp_ntz": 6}
_META_KINDS = (("_op", 3), ("_commit_ts", 0), ("_region", 3), ("_seq", 1), ("_sub", 1))


def _kind(stype: str) -> tuple[int, int] | None:
    """(kind, scale) of the C columns for a lake type, None for a type they do not build."""
    k = _KINDS.get(stype)
    if k is not None:
        return k, 0
    m = re.fullmatch(r"decimal\(38,(\d+)\)", stype)
    return (7, int(m.group(1))) if m else None


def lake_table(rows: _Rows, columns: list[list[str]], native: bool = True) -> Any:
    """One table's rows of a batch as the Arrow table of its changelog file: the metadata columns, then
    ``columns`` ([name, lake type], the images' values; a missing key is null).

    The Python path (``native=False``, or where the C extension is not built) is the specification: a
    list per column, values Arrow takes as they are (``_AS_IS``) passed unchanged, any other column's
    values through ``lake.lake_value``, and ``pa.Table.from_pydict``. With the C extension, each column
    whose values all are of exactly those types (and fit: an int64, a decimal(38, s) without rounding)
    is built as Arrow's buffers in one pass over the rows (``arrow_columns``) and wrapped without a copy;
    the others take the Python path (tests/unit/test_arrowcols.py: the same tables)."""
    import pyarrow as pa

    fields = [pa.field("_op", pa.string()), pa.field("_commit_ts", pa.int64()),
              pa.field("_region", pa.string()), pa.field("_seq", pa.int32()),
              pa.field("_sub", pa.int32())]
    fields += [pa.field(c, arrow_type(t)) for c, t in columns]
    data: dict[str, Any] = {
        "_op": rows.ops, "_commit_ts": rows.ts, "_region": rows.regions, "_seq": rows.seqs,
        "_sub": rows.subs,
    }
    done: set[str] = set()
    if native and _arrow_columns is not None:
        n = len(rows.ops)
        specs = [(c, *k) for c, t in columns if (k := _kind(t)) is not None]
        built = [(name, b) for name, kind in _META_KINDS for b in _arrow_columns(data[name], [(None, kind, 0)])]
        built += zip([c for c, _, _ in specs], _arrow_columns(rows.imgs, specs))
        types = {f.name: f.type for f in fields}
        buf = pa.py_buffer
        for name, b in built:
            if b is None:
                continue
            nulls, validity, values, offsets = b
            bufs = [None if validity is None else buf(validity), buf(values)]
            if offsets is not None:
                bufs.insert(1, buf(offsets))
            data[name] = pa.Array.from_buffers(types[name], n, bufs, null_count=nulls)
            done.add(name)
    imgs = rows.imgs
    get = dict.get
    for c, t in columns:  # column by column (map: the loop in C); values Arrow takes as they are skip lake_value
        if c in done:
            continue
        vals = list(map(get, imgs, repeat(c)))
        if not set(map(type, vals)) <= _AS_IS.get(t if not t.startswith("decimal") else "decimal", set()):
            vals = [lake.lake_value(v, t) for v in vals]
        data[c] = vals
    return pa.Table.from_pydict(data, schema=pa.schema(fields))


class SparkSender(Sender):
    KEYS: ClassVar[list[Key]] = [
        Key("table_format", p_choice("changelog", "delta"), "changelog",
            doc="changelog = a Parquet changelog per table read through our merge-on-read views; delta = one "
                "Delta Lake table per source table holding its current state, kept by MERGE "
                "(senders/spark/deltasink.py; needs the delta extra)"),
        Key("master", p_nonempty, "local[*]", doc="Spark master: local[*], local[N] or spark://host:port"),
        Key("warehouse", p_nonempty, "./data/spark-warehouse", doc="where the lake tables live"),
        Key("database", p_nonempty, "cdc", doc="catalog database of the lake tables"),
        Key("batch_rows", p_int(1, 10_000_000), 50_000, doc="rows per append (bigger = faster)"),
        Key("writer", p_choice("arrow", "spark"), "arrow",
            doc="how changelog files are written: arrow = pyarrow in this process (no Spark job per append; "
                "the warehouse must be a local or mounted path), spark = a Spark write per append"),
        Key("batch_interval", p_float(0, 3600), 2.0, doc="seconds to wait for a batch to fill"),
        Key("compaction_interval", p_float(0, 86_400 * 7), 300.0,
            doc="seconds between compactions; 0 = never (table_format=delta: between the upkeep rounds, each an "
                "OPTIMIZE then a VACUUM of every table written since the last one)"),
        Key("change_data_feed", p_bool, False,
            doc="table_format=delta: the tables keep Delta's change data feed (delta.enableChangeDataFeed, set on "
                "existing tables at open; turning it off leaves the property on the tables)"),
        Key("vacuum_retention_hours", p_float(0, 24 * 365 * 10), 168.0,
            doc="table_format=delta: the VACUUM of an upkeep round keeps the files removed in the last N hours "
                "(168 = Delta's default; below it, Delta's retentionDurationCheck is turned off in the sender's "
                "session and time travel, a change data feed read or a long query older than N hours may fail)"),
        Key("upkeep_budget", p_float(1, 86_400), 60.0,
            doc="table_format=delta: seconds an upkeep round may take; the tables left are done in the next one"),
        Key("app_name", p_str, "binlog-capturer"),
        Key("conf.*", p_str, doc="any Spark setting, e.g. conf.spark.driver.memory=2g"),
    ]

    def __new__(cls, name: str, options: dict[str, Any], queue_rows: int = 100_000) -> SparkSender:
        # table_format=delta: the Delta Lake sender (a subclass, imported only then)
        if cls is SparkSender and options.get("table_format", "changelog") == "delta":
            # loaded by name, as the registry loads a sender (senders/__init__.py): the Delta sender is a
            # subclass of this one, so this module does not import it
            delta: type[SparkSender] = importlib.import_module("senders.spark.deltasink").DeltaSender
            return super().__new__(delta)
        return super().__new__(cls)

    def __init__(self, name: str, options: dict[str, Any], queue_rows: int = 100_000):
        super().__init__(name, options, max(queue_rows, int(options["batch_rows"]) * 2))
        self.batch_rows = int(options["batch_rows"])
        self.linger = float(options["batch_interval"])
        self.database = options["database"]
        self.warehouse = Path(options["warehouse"]).resolve()
        self.spark: Any = None
        self._opened = False
        self._session_thread: threading.Thread | None = None
        self._session_lock = threading.Lock()
        self._session_error: BaseException | None = None  # of the last start, kept until the next one
        self._closed = False
        self._views_retry_at = 0.0  # a persistent catalog's session that failed: tried again then
        self.housekeeping_error = ""  # the last compaction (or view session) that could not run, "" once one ran
        self.tables: dict[tuple[str, str], lake.TableState] = {}
        self._renamed: set[tuple[str, str, StreamKey | None, int]] = set()  # RENAME pairs done (``_rename_dir``)
        # the commit log, and the lake's last committed batch and its key (read back from the lake)
        self._commits = commits.CommitLog(self.warehouse)
        self._batch = 0
        self._key: StreamKey | None = None
        self._attempt_failed = False  # an attempt at a batch failed after it began: recover before the next
        # the batch being written: its staged files per lake table, their directories, rows, name parts
        self._staged: dict[str, list[str]] = {}
        self._stage_dirs: set[Path] = set()
        self._stages_synced: set[Path] = set()  # staging directories whose parents were fsync'd (by a commit)
        self._staged_rows = 0
        self._token = ""
        self._n = 0
        self._last_compaction = time.monotonic()
        self.appends = 0
        self.compactions = 0
        self.last_compaction_seconds = 0.0

    def status(self) -> dict[str, Any]:
        st = super().status()
        st.update({"appends": self.appends, "compactions": self.compactions,
                   "last_compaction_seconds": round(self.last_compaction_seconds, 2),
                   "tables": len(self.tables), "warehouse": str(self.warehouse),
                   "lake_batch": self._batch, "lake_key": key_to_json(self._key),
                   "writer": self.options["writer"], "housekeeping_error": self.housekeeping_error,
                   "session": ("ready" if self.spark is not None else
                               "starting" if self._session_thread is not None and self._session_thread.is_alive()
                               else "failed" if self._session_error is not None
                               else "not started" if self._session_at_open() or not self._opened
                               else "on demand")})
        return st

    # --- lifecycle ----------------------------------------------------------
    # With writer=arrow, changelog files are written without Spark. The session
    # (a JVM: seconds of start-up and ~15 CPU-seconds, taken from the capture
    # when it starts with it) is then started only when something needs it: a
    # compaction coming due, or a caller of session(). Views are registered in it
    # once it runs. It starts with the sender when the views are of use to other
    # sessions (a persistent catalog: conf.spark.sql.catalogImplementation=hive)
    # and with writer=spark, which needs it for every append (open() waits).
    def _session_at_open(self) -> bool:
        conf = self.options.get("conf.*") or {}
        return (self.options["writer"] == "spark"
                or str(conf.get("spark.sql.catalogImplementation", "in-memory")).strip().lower() != "in-memory")

    def open(self) -> None:
        if self._opened:
            return
        try:
            import pyarrow  # noqa: F401

            if importlib.util.find_spec("pyspark") is None:  # (not imported before its session is needed)
                raise ImportError("No module named 'pyspark'")
        except ImportError as exc:
            raise SinkError(f"the spark sender needs pyspark and pyarrow: {exc}; sh start.sh installs them "
                            "(or: .venv/bin/pip install -e '.[spark]')", retriable=False) from exc
        if (self._session_at_open() or float(self.options["compaction_interval"])) and not _java_found():
            # found now rather than when the first compaction comes due
            raise SinkError("the spark sender needs Java (17) for its Spark session: none on PATH and no "
                            "JAVA_HOME; sh start.sh installs it (apt-get install openjdk-17-jre-headless)",
                            retriable=False)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        if not self._commits.lock():
            raise SinkError(f"the lake {self.warehouse} is being written by another process (pid "
                            f"{self._commits.holder()}: another capturer, or this sender's previous process "
                            "still exiting); waiting for it", poll=0.2)  # (as the file's lock: freed at once
            # when its writer stops; a takeover must not then sit in a growing back-off)
        try:
            self._recover()
        except BaseException:
            self._commits.unlock()
            raise
        self._renamed = set()
        self._finish_renames()
        for st in lake.list_tables(self.warehouse):
            self.tables[(st.db, st.table)] = st
            st._dirty = True  # type: ignore[attr-defined]
            for db, table, k, i in st.renamed_from:
                self._renamed.add((db, table, key_from_json(k), i))
        self._closed = False
        if self._session_at_open():
            self._session(wait=self.options["writer"] == "spark")  # (its failure: open is tried again)
        self._opened = True

    def _finish_renames(self) -> None:
        """A directory whose manifest names another table: a RENAME (``_rename_dir``) that a crash cut
        between writing the manifest and moving the directory. The move is done now."""
        for d in sorted(self.warehouse.iterdir()):
            st = lake.TableState.load(d) if d.is_dir() and not d.name.startswith(".") else None
            if st is None or st.name == d.name:
                continue
            want = self.warehouse / st.name
            if want.exists():
                raise SinkError(f"lake table {d} was being renamed to {want} ({st.db}.{st.table}), which exists: "
                                "move one of them aside", retriable=False)
            os.replace(d, want)
            lake.fsync_dir(self.warehouse)
            log.warning("sender %s: %s: its RENAME TABLE to %s.%s finished (a crash came between its two steps)",
                        self.name, d.name, st.db, st.table)

    def _start_session(self) -> None:
        try:
            from pyspark import SparkContext

            # a Spark context that already runs in this process (a notebook, a test module)
            # is shared, and left running on close
            self._own_session = SparkContext._active_spark_context is None
            self.spark = build_session(self.options, self.warehouse)
        except BaseException as exc:
            self._session_error = threading.current_thread().error = exc  # type: ignore[attr-defined]

    def _session(self, wait: bool = True) -> Any:
        """The Spark session, started if none runs or is starting (after a failed
        start, this is the next attempt); None if it is still starting and ``wait``
        is false. A failed start raises SinkError in every caller that waited for it."""
        with self._session_lock:  # (the sender's thread and a session() caller)
            t = self._session_thread
            if t is None and self.spark is None:
                if self._closed:
                    raise SinkError("the spark sender is closed: no session is started")
                self._session_error = None
                t = self._session_thread = threading.Thread(target=self._start_session,
                                                            name=f"{self.name}-spark-start", daemon=True)
                t.start()
        if t is not None and t.is_alive():
            if not wait:
                return None
            t.join()
        with self._session_lock:
            if self._session_thread is t:
                self._session_thread = None
        exc = getattr(t, "error", None)  # (this start's, whatever a later one did meanwhile)
        if exc is not None:
            raise SinkError(f"cannot start Spark ({self.options['master']}): {exc}") from exc
        return self.spark

    def session(self) -> Any:
        """The sender's Spark session (started now if it was not), for a caller in the
        same process (a notebook, a test). The lake tables are registered in it at the
        sender's next batch, or by ``lake.register_tables``."""
        return self._session()

    def _register_dirty(self, wait: bool) -> None:
        """Register (or refresh) the views of tables whose manifest changed: in the
        session, waited for (writer=spark needs it anyway), or else only if it runs
        (starting it, or its failure, is housekeeping's business: an append never
        fails for a view)."""
        # (a table whose first batch is not committed yet has no changelog: registered later)
        dirty = [st for st in self.tables.values() if getattr(st, "_dirty", True)
                 and (self.warehouse / st.name / "changelog").is_dir()]
        if not dirty:
            return
        spark = self._session() if wait else self.spark
        if spark is None:
            return
        for st in dirty:
            lake.register(spark, st, self.database, self.warehouse)
            st._dirty = False  # type: ignore[attr-defined]

    def close(self) -> None:
        with self._session_lock:
            self._closed = True  # session() no longer starts one
            t = self._session_thread
        if t is not None and t.is_alive():
            t.join()  # a session still starting is stopped once it is up
        self._session_thread = None
        self._opened = False
        self._session_error = None
        self._commits.unlock()
        if self.spark is not None:
            if getattr(self, "_own_session", True):
                try:
                    self.spark.stop()
                except Exception:
                    pass
            self.spark = None

    # --- positions ----------------------------------------------------------
    def _recover(self) -> None:
        """Bring the lake to its last committed batch (``CommitLog.recover``) and take
        that batch's number and key."""
        last = self._commits.recover()
        self._batch, self._key = (last.batch, last.key) if last is not None else (0, None)
        self._attempt_failed = False

    def resume_key(self) -> StreamKey | None:
        """The key of the last transaction of the lake's last committed batch, read from
        the commit log after bringing the lake to that batch (every transaction at or
        below it is in the changelogs, whole; nothing after it is there); None if no
        batch was committed yet (a new lake, or one written before the commit log)."""
        if not self._opened:
            return None
        self._recover()
        return self._key

    # --- sending ------------------------------------------------------------
    flush_rows = 100_000

    def send(self, batch: list[Txn]) -> None:
        """Write the batch as one commit (all its tables or none). Transactions at or
        below the lake's position are dropped first: a sender process started again
        after its predecessor committed a batch but died before answering gets that
        batch once more."""
        if not self._opened:
            self.open()
        if not batch:
            return
        if self._attempt_failed:
            self._recover()
        if self._key is not None and stream_key(batch[-1]) <= self._key:
            log.info("sender %s: the lake has this batch already (up to %s)", self.name, self._key)
            return
        if self._key is not None and stream_key(batch[0]) <= self._key:
            key = self._key
            kept = [t for t in batch if stream_key(t) > key]
            log.info("sender %s: the lake has %d transaction(s) of this batch already (up to %s)", self.name,
                     len(batch) - len(kept), key)
            batch = kept
        self._attempt_failed = True
        self._staged, self._stage_dirs, self._staged_rows = {}, set(), 0
        self._token, self._n = uuid.uuid4().hex[:8], 0
        by_table: dict[tuple[str, str], _Rows] = {}
        pending = 0
        prev: StreamKey | None = None  # the key of the transaction before this one
        for txn in batch:
            if txn.ddl is not None:
                self._flush(by_table)
                by_table = {}
                if prev is not None and self._staged and _renames(txn.ddl):
                    # a RENAME moves a table's directory: what is staged in it is committed first
                    self._commit(prev)
                    self._staged, self._stage_dirs, self._staged_rows = {}, set(), 0
                    self._token, self._n = uuid.uuid4().hex[:8], 0
                self._ddl(txn)
                prev = stream_key(txn)
                continue
            prev = stream_key(txn)
            ts, region, changes = txn.commit_ts, txn.region, txn.changes
            # the whole transaction at once (in C where built), held in memory (not read from its spill)
            if isinstance(changes, tuple) and pending + len(changes) <= self.flush_rows:
                pending += len(changes)
                _group_rows(changes, ts, region, by_table, _Rows, _OPS)
                continue
            for seq, ch in enumerate(changes):  # a big transaction (read from its spill): bounded memory
                pending += 1
                if pending > self.flush_rows:
                    self._flush(by_table)
                    by_table, pending = {}, 0
                add_row(by_table, ts, region, seq, ch)
        self._flush(by_table)
        self._commit(stream_key(batch[-1]))
        self._attempt_failed = False
        self._register_dirty(wait=self.options["writer"] == "spark")

    def housekeeping(self) -> None:
        """A compaction when one is due: its session is started then, in the
        background, and the compaction runs between the batches once it is up (the
        stream is not held up by the JVM's start). A persistent catalog's session
        that failed to start is started again a minute later. Neither ever holds up
        the appends: a failure is logged, shown (status ``housekeeping_error``) and
        tried again one ``compaction_interval`` later."""
        now = time.monotonic()
        interval = float(self.options["compaction_interval"])
        due = bool(interval) and now - self._last_compaction >= interval
        views = (self.spark is None and self.options["writer"] == "arrow" and self._session_at_open()
                 and now >= self._views_retry_at)
        if not (due or views):
            return
        try:
            if self._session(wait=False) is None:
                return  # starting
            self._register_dirty(wait=False)
            if due:
                self.compact_all()
            self.housekeeping_error = ""
        except Exception as exc:
            self.housekeeping_error = str(exc)
            if due:
                self._last_compaction = now
            self._views_retry_at = now + 60
            log.warning("sender %s: %s; the appends go on, tried again in %.0f s", self.name, exc,
                        interval if due else 60)

    def _state_for(self, schema: TableSchema, columns: list[list[str]]) -> lake.TableState:
        key = (schema.db, schema.table)
        st = self.tables.get(key)
        if st is None:
            name = lake.table_name(schema.db, schema.table)
            st = lake.TableState.load(self.warehouse / name) or lake.TableState(
                schema.db, schema.table, name, list(schema.pk), [])
            self.tables[key] = st
        clash = [c for c, _ in columns if c in lake.META_COLS]
        if clash:
            raise SinkError(
                f"{schema.db}.{schema.table}: column {clash[0]!r} has the name of a lake metadata column "
                f"({', '.join(lake.META_COLS)}); rename it on the source or exclude the table "
                "(filter_rule.txt) to use the spark sender", retriable=False)
        known = dict(st.columns)
        # (a column the stream dropped or renamed away, in rows from before it staged again after a crash)
        columns = [[c, t] for c, t in columns if c in known or c not in st.gone]
        pair = name_clash([*known, *(c for c, _ in columns if c not in known)])
        if pair is not None:
            raise SinkError(lake.case_clash_error(schema.db, schema.table, pair), retriable=False)
        changed = False
        for c, t in columns:
            if c not in known:
                st.columns.append([c, t])
                changed = True
            elif known[c] != t:
                raise SinkError(
                    f"lake table {self.database}.{st.name} ({schema.db}.{schema.table}): column {c!r} "
                    f"changed type from {known[c]} to {t}. "
                    + _INCOMPATIBLE_HELP.format(dir=self.warehouse / st.name), retriable=False)
        if list(schema.pk) != st.pk and schema.pk:
            st.pk = list(schema.pk)
            changed = True
        if changed:
            st.save(self.warehouse / st.name)
            st._dirty = True  # type: ignore[attr-defined]
        return st

    def _flush(self, by_table: dict[tuple[str, str], _Rows]) -> None:
        for rows in by_table.values():
            if not rows.ops:
                continue
            # the columns of this batch, in source order, as the newest schema has them
            schema = rows.schemas[-1]
            info = dict(zip(schema.columns, schema.column_info))
            seen: dict[str, str] = {}
            schemas_done: set[int] = set()  # schemas whose every column is in ``seen``
            imgs = rows.imgs
            for s, img in zip(rows.schemas, imgs):
                if id(s) in schemas_done:
                    continue
                cinfo = dict(zip(s.columns, s.column_info))
                for c in img:
                    if c not in seen:
                        seen[c] = lake.spark_type(cinfo.get(c) or info.get(c))
                if len(img) == len(s.columns):  # (an image may hold only the key: a PostgreSQL old key)
                    schemas_done.add(id(s))
            columns = [[c, t] for c, t in seen.items()]
            st = self._state_for(schema, columns)
            table = lake_table(rows, columns)
            stage = self.warehouse / st.name / commits.STAGING
            try:
                if stage not in self._stages_synced:  # its name made durable with the first batch it holds
                    stage.mkdir(parents=True, exist_ok=True)
                    self._stage_dirs.update((stage.parent, self.warehouse))
                self._stage_dirs.add(stage)
                if self.options["writer"] == "arrow":
                    names = [self._stage_arrow(table, stage)]
                else:
                    names = self._stage_spark(table, stage)
                self._staged.setdefault(st.name, []).extend(names)
                self._staged_rows += table.num_rows
                failpoints.hit("spark.stage")
            except OSError as exc:
                raise SinkError(f"append to {self.warehouse / st.name / 'changelog'} failed: {exc}") from exc
            self.appends += 1

    def _next_name(self) -> str:
        name = commits.part_name(self._batch + 1, self._n, self._token)
        self._n += 1
        return name

    def _stage_arrow(self, table: Any, stage: Path) -> str:
        """One file of the batch, written by pyarrow into ``stage`` and fsync'd; its name."""
        import pyarrow.parquet as pq

        name = self._next_name()
        pq.write_table(table, stage / name, compression="snappy")
        fd = os.open(stage / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return name

    def _stage_spark(self, table: Any, stage: Path) -> list[str]:
        """The batch's rows of one table, written by a Spark job into a directory of
        ``stage``, fsync'd, and its files moved up into ``stage``; their names."""
        import shutil

        out = stage / commits.spark_dir_name(self._batch + 1, self._n, self._token)
        try:
            df = self._session().createDataFrame(table)
            df.coalesce(1).write.mode("overwrite").parquet(str(out))
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(f"append to {stage.parent / 'changelog'} failed: {exc}") from exc
        lake.fsync_tree(out, set())
        names = []
        for part in sorted(out.glob("part-*.parquet")):
            name = self._next_name()
            os.replace(part, stage / name)
            names.append(name)
        shutil.rmtree(out, ignore_errors=True)
        return names

    def _commit(self, key: StreamKey) -> None:
        """Make the staged batch the lake's next one: its staging directories (and, at
        their first use, their parents) fsync'd, its line appended to the commit log
        (the commit point), then its files renamed into the changelogs. A failure
        before the commit point leaves the batch uncommitted (its files are deleted by
        the next recovery); after it, committed (its files are published by the next
        recovery, the retry finds it there). The changelog directories are not
        fsync'd after the renames: a rename lost to a power failure is done again by
        the recovery at the next start."""
        try:
            for d in sorted(self._stage_dirs):
                lake.fsync_dir(d)
            self._stages_synced.update(d for d in self._stage_dirs if d.name == commits.STAGING)
            failpoints.hit("spark.commit")
        except OSError as exc:
            raise SinkError(f"cannot commit to the lake {self.warehouse}: {exc}") from exc
        c = commits.Commit(self._batch + 1, key, self._staged, self._staged_rows)
        self._commits.append(c)
        self._batch, self._key = c.batch, c.key
        try:
            failpoints.hit("spark.committed")
            for name, files in self._staged.items():
                stage, cl = self.warehouse / name / commits.STAGING, self.warehouse / name / "changelog"
                cl.mkdir(parents=True, exist_ok=True)
                for f in files:
                    os.replace(stage / f, cl / f)
        except OSError as exc:
            raise SinkError(f"batch {c.batch} is committed to the lake {self.warehouse}, but publishing its "
                            f"files failed: {exc}") from exc

    def _ddl(self, txn: Txn) -> None:
        """TRUNCATE and DROP TABLE empty the current state; ADD COLUMN is noted with
        its default (older rows read it); other DDL shows in the rows that follow."""
        ddl = txn.ddl
        assert ddl is not None
        head = clean(ddl.sql).upper()
        if ddl.table and head.startswith("ALTER"):
            self._alter_columns(txn)
        if head.startswith("DROP"):
            # every table of the statement (DROP TABLE a, b), or of the database (DROP DATABASE)
            for db, table in dropped_tables(ddl.sql, ddl.session_db or ddl.db):
                for t in [table] if table else self._lake_tables_of(db):
                    self._reset((db, t), txn.commit_ts)
        elif ddl.table and head.startswith("TRUNCATE"):
            self._reset((ddl.db, ddl.table), txn.commit_ts)
        for i, (old, new) in enumerate(_renames(ddl)):  # RENAME TABLE, ALTER TABLE ... RENAME (after its columns)
            self._rename_dir(old, new, stream_key(txn), i)

    def _rename_dir(self, old: tuple[str, str], new: tuple[str, str], key: StreamKey, i: int) -> None:
        """Pair ``i`` of a RENAME TABLE (or ALTER TABLE ... RENAME) at ``key``: the old table's
        directory (changelog, snapshots, manifest) becomes the new table's, so its history
        goes with it. Its manifest names the new table first (a crash before the move: the
        next open finishes it) and keeps the pair, so a replayed RENAME finds it done. A
        directory of the new name is a table dropped before (the source refuses a RENAME
        onto a live one): removed."""
        ident = (old[0], old[1], key, i)
        if ident in self._renamed:
            return
        src, dst = self.warehouse / lake.table_name(*old), self.warehouse / lake.table_name(*new)
        st = self.tables.get(old) or lake.TableState.load(src)
        if st is None or not src.is_dir():
            return  # the lake has no rows of it: the new name starts at its first rows
        try:
            if dst.exists():
                aside = dst.with_name(f".{dst.name}.replaced.{uuid.uuid4().hex[:6]}")
                os.replace(dst, aside)
                shutil.rmtree(aside, ignore_errors=True)
            moved = lake.TableState(**{**st.to_json(), "db": new[0], "table": new[1], "name": dst.name,
                                       "renamed_from": [*st.renamed_from, [old[0], old[1], key_to_json(key), i]]})
            moved.save(src)
            failpoints.hit("spark.rename")
            os.replace(src, dst)
            lake.fsync_dir(self.warehouse)
        except OSError as exc:
            raise SinkError(f"the lake {self.warehouse}: RENAME of {old[0]}.{old[1]} to {new[0]}.{new[1]} "
                            f"({src.name} -> {dst.name}) failed: {exc}") from exc
        self.tables.pop(old, None)
        self.tables.pop(new, None)
        self.tables[new] = moved
        moved._dirty = True  # type: ignore[attr-defined]
        self._renamed.add(ident)
        log.info("sender %s: %s.%s renamed to %s.%s: lake table %s is now %s", self.name, old[0], old[1], new[0],
                 new[1], src.name, dst.name)
        if self.spark is not None:  # the old name's views (a view of the new name comes with the next batch)
            try:
                self.spark.sql(f"DROP VIEW IF EXISTS {lake.q(self.database)}.{lake.q(src.name)}")
                self.spark.sql(f"DROP TABLE IF EXISTS {lake.q(self.database)}.{lake.q(src.name + '_changelog')}")
            except Exception as exc:
                log.warning("sender %s: dropping the views of %s failed: %s", self.name, src.name, exc)

    def _lake_tables_of(self, db: str) -> list[str]:
        """The tables of source database ``db`` the lake holds (loaded or not)."""
        names = {t for d, t in self.tables if d == db}
        if self.warehouse.is_dir():
            for tdir in self.warehouse.iterdir():
                st = lake.TableState.load(tdir) if tdir.is_dir() else None
                if st is not None and st.db == db:
                    names.add(st.table)
        return sorted(names)

    def _reset(self, name: tuple[str, str], commit_ts: int) -> None:
        """TRUNCATE or DROP TABLE: the table's rows at or below ``commit_ts`` are gone."""
        st = self.tables.get(name)
        if st is None:
            st = lake.TableState.load(self.warehouse / lake.table_name(*name))
            if st is None:
                return
            self.tables[name] = st
        st.reset_ts = commit_ts
        st.save(self.warehouse / st.name)
        st._dirty = True  # type: ignore[attr-defined]

    def _alter_columns(self, txn: Txn) -> None:
        """An ALTER TABLE's column clauses, in their order (DROP c, ADD c in one statement: the column
        added again). ADD COLUMN: the column joins the table's state with its default for the rows
        from before (``added``; a column there already: IF NOT EXISTS, left alone). DROP COLUMN: the
        column leaves the state (its values stay in the changelog files, read by no view). RENAME
        COLUMN (CHANGE to another name): rows older than the ALTER read the column under its old name
        (``moved``). Names matched regardless of case, as the source matches them. The state is saved
        at once with the ALTER's key (``altered``): the same ALTER handed again after a crash (its
        batch not committed) is skipped, a later one applied."""
        ddl = txn.ddl
        assert ddl is not None
        changes = [c for c in lake.alter_columns(ddl.sql) if c[0] in ("add", "drop", "rename")]
        if not changes:
            return
        lake.warn_unknown_adds(log, self.name, ddl.db, ddl.table, ddl.sql)
        st = self.tables.get((ddl.db, ddl.table)) or lake.TableState.load(
            self.warehouse / lake.table_name(ddl.db, ddl.table))
        if st is None:
            return  # no rows yet: the table starts with the columns of its first rows
        self.tables[(ddl.db, ddl.table)] = st
        key = stream_key(txn)
        last = key_from_json(st.altered) if st.altered is not None else None
        if last is not None and key <= last:
            return  # applied before a crash (its batch not committed): handed again
        ts = txn.commit_ts
        adds = iter(lake.parse_add_columns(ddl.sql))  # (its ADDs, in the same order)
        for what, a, b in changes:
            if what == "add":
                col, stype, default = next(adds)
                if lake.column_named(col, st.columns) is not None:
                    continue  # (ADD COLUMN IF NOT EXISTS of a column there)
                if col in st.gone:  # added again: its older values are the dropped column's, never this one's
                    del st.gone[col]
                    st.added[col] = [ts, default or "NULL"]
                elif default is not None and default.upper() != "NULL":
                    st.added[col] = [ts, default]
                if stype is not None:
                    st.columns.append([col, stype])
                continue
            have = lake.column_named(a, st.columns)
            if have is None:
                continue
            if what == "drop":
                if have in st.pk:
                    raise SinkError(f"lake table {self.database}.{st.name} ({ddl.db}.{ddl.table}): the DDL "
                                    f"{ddl.sql[:300]!r} drops its primary-key column {have!r}, which the lake cannot "
                                    "follow (its rows are kept by that key)", retriable=False)
                st.columns = [c for c in st.columns if c[0] != have]
                st.added.pop(have, None)
                st.moved.pop(have, None)
                st.gone[have] = ts
            elif b.lower() == have.lower():
                if b != have:  # (Spark reads the files' columns case-insensitively: "ex" and "EX" are one)
                    raise SinkError(f"lake table {self.database}.{st.name} ({ddl.db}.{ddl.table}): the DDL "
                                    f"{ddl.sql[:300]!r} renames column {have!r} to {b!r}, a change of case only, "
                                    "which the Parquet changelog cannot follow (Spark compares its files' column "
                                    "names case-insensitively); table_format=delta can, or move the table's "
                                    "directory aside and copy the table again", retriable=False)
            elif lake.column_named(b, st.columns) is None:
                st.columns = [[b if c == have else c, t] for c, t in st.columns]
                st.pk = [b if c == have else c for c in st.pk]
                if have in st.added:
                    st.added[b] = st.added.pop(have)
                st.moved[b] = [*st.moved.pop(have, []), [ts, have, st.generation]]
                st.gone[have] = ts
                st.gone.pop(b, None)
        # (a swap's temporary names, capturer/model/ddl.py RENAME_TMP: no file has a column of that name)
        moved = {c: [h for h in hist if not str(h[1]).startswith(RENAME_TMP)] for c, hist in st.moved.items()}
        st.moved = {c: hist for c, hist in moved.items() if hist}
        st.gone = {c: t for c, t in st.gone.items() if not c.startswith(RENAME_TMP)}
        st.altered = key_to_json(key)
        st.save(self.warehouse / st.name)
        st._dirty = True  # type: ignore[attr-defined]

    def compact_all(self) -> None:
        """A new snapshot generation of every table, from the committed changelog files
        (staged files are in no changelog directory); between batches only."""
        t0 = time.monotonic()
        if self._attempt_failed:
            self._recover()
        spark = self._session()
        self._register_dirty(wait=True)  # compaction reads the registered changelog
        for key, st in list(self.tables.items()):
            if not (self.warehouse / st.name / "changelog").is_dir():
                continue
            try:
                new = lake.compact(spark, st, self.database, self.warehouse)
                new._dirty = getattr(st, "_dirty", True) and new is st  # type: ignore[attr-defined]
                self.tables[key] = new
            except Exception as exc:
                raise SinkError(f"compaction of {st.name} failed: {exc}") from exc
        self.compactions += 1
        self.last_compaction_seconds = time.monotonic() - t0
        self._last_compaction = time.monotonic()


def _renames(ddl: Ddl) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """The ``((db, old), (db, new))`` pairs a DDL renames: a RENAME TABLE's, or an ALTER TABLE's
    RENAME [TO|AS] clause (also among other clauses)."""
    return table_renames(ddl.sql, ddl.db, ddl.table, ddl.session_db)


def _java_found() -> bool:
    """Whether Spark's launcher can find a Java (JAVA_HOME or java on PATH)."""
    import shutil

    home = os.environ.get("JAVA_HOME")
    if home:  # Spark's launcher then uses it, not PATH
        return os.path.exists(os.path.join(home, "bin", "java"))
    return shutil.which("java") is not None


def build_session(options: dict[str, Any], warehouse: Path) -> Any:
    """A SparkSession as the sender, the CLI and the tests use it."""
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    master = str(options.get("master", "local[*]"))
    if master.startswith("local") or "://127.0.0.1" in master or "://localhost" in master:
        # stay on the loopback interface when everything runs on this machine
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(options.get("master", "local[*]"))
         .appName(options.get("app_name") or "binlog-capturer")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.timestampType", "TIMESTAMP_NTZ")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.sql.warehouse.dir", str(warehouse / "_catalog"))
         .config("spark.sql.shuffle.partitions", "8")
         .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={warehouse / '_derby'}"))
    for k, v in (options.get("conf.*") or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
