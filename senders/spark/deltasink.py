"""The Spark sender's ``table_format=delta``: one Delta Lake table per captured table,
holding its current state, kept by one MERGE by primary key per table per batch.

Layout: ``<warehouse>/<db>__<table>`` (``lake.table_name``), a path-based Delta table
(no catalog needed: ``delta.`<path>``` in Spark SQL, ``DeltaTable(path)`` in delta-rs).
Created at the table's first rows with column mapping ``name`` (so DROP and RENAME
COLUMN are metadata changes) and the ``timestampNtz`` feature; its columns are the
source's, typed as the changelog lake types them (``lake.spark_type``: every integer
is a bigint, a DECIMAL(p<=38,s) a decimal(38,s): widening a source type keeps the lake
type).

A batch, per table: its changes are collapsed to the last one per key in commit
order (an update that changes the key is a delete of the old key and an upsert of the
new one), then applied by one ``MERGE INTO ... ON <pk>`` (delete when matched and
deleted; update when matched; insert when not matched and not deleted): one Delta
commit per table per batch (a DDL of the batch splits it: the rows before it are
merged first). A table without a primary key is **append-only**: every change is
appended with ``_op`` ('i' for an insert and an update's new image, 'd' for a delete
and an update's old image) and its identity ``(_commit_ts, _region, _seq, _sub)``;
its current state is the multiset of 'i' rows less the 'd' rows (``keyless_state_sql``).

Exactly-once: every commit the sender makes to a table carries Delta's idempotent-write
pair, ``txnAppId`` = ``binlog-capturer/<sender>/<lake table>`` (the name the table was created
under: a RENAME TABLE keeps it, ``_capturer.json``'s ``app_id``) and ``txnVersion`` = the
commit_ts of the table's last transaction in the commit (raised to the previous
version + 1 when two commits end at the same commit_ts), and, in the commit's
``userMetadata``, the exact stream key of that transaction. At open the sender reads
both back from each table's ``_delta_log`` (the newest commit holding its appId) and,
in every later batch, drops the transactions at or below a table's key for that table
only: a kill -9 after some tables of a batch were merged and before the checkpoint
replays the batch, and each table takes just what it lacks. Delta itself refuses a
commit whose txnVersion is not above the recorded one (a second writer replaying an
old batch is a no-op). The stream itself resumes at the checkpoint (``resume_key`` is
None): a crashed batch may have merged some of its tables and not yet created another.

A reader sees each table's commits atomically; across tables there is no common
commit: while a batch is being merged, a reader may see its changes in one table and
not yet in another (as with any per-table sink); each table is always at a transaction
boundary of the source.

Upkeep (``compaction_interval``, 0 = never): every interval, between two batches, in the
sender's own thread (capture goes on: it is decoupled from the sender by the sender's
cursor), each table written since the last round gets ``OPTIMIZE`` (small files of the
MERGEs compacted) then ``VACUUM ... RETAIN vacuum_retention_hours HOURS`` (files no
version within the retention needs are deleted). A round stops after ``upkeep_budget``
seconds; the tables left go first in the next one. A failure is logged naming the table,
shown in status (``housekeeping_error``) and retried next interval; it never stops the
sender. ``compact_all`` (the operator's command) runs one round now, for every table.
OPTIMIZE and VACUUM are Delta commits without this sender's txnAppId: the read-back of a
table's position (``read_position``) goes past them to the newest commit holding it.

``change_data_feed = true``: tables are created with ``delta.enableChangeDataFeed``, and
existing tables get it at open (``ALTER TABLE ... SET TBLPROPERTIES``); a reader then sees
each MERGE's inserts, updates (pre- and post-images) and deletes through
``table_changes`` / ``readChangeFeed``. Turning it off later leaves the property on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

from capturer.errors import SinkError
from capturer.model import RowChange, StreamKey, Txn, key_from_json, key_to_json, stream_key
from capturer.model.ddl import added_if_not_exists, clean, dropped_tables, renamed_tables, split_qname
from capturer.util import failpoints
from senders.spark import deltajars, lake
from senders.spark.sender import _AS_IS, SparkSender, _java_found, arrow_type, build_session
from senders.sqlbuild import name_clash

log = logging.getLogger(__name__)

META = ["_op", "_commit_ts", "_region", "_seq", "_sub"]  # the extra columns of an append-only (keyless) table
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
CDF = "delta.enableChangeDataFeed"
_TXN_CONF = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion",
             "spark.databricks.delta.commitInfo.userMetadata")
KEY_META = "capturer_key"  # the userMetadata field holding the stream key


@dataclass
class DeltaTableState:
    """What the sender knows of one Delta table: its columns (name -> lake type, in
    order), key, and the position it was last written at."""

    db: str
    table: str
    name: str
    pk: list[str]
    columns: dict[str, str]
    version: int = 0  # the last txnVersion of this sender's appId (0: none)
    key: StreamKey | None = None  # the stream key of the last transaction merged
    app: str = ""  # the txnAppId of its commits: named after the table it was created as (kept by a RENAME)


def read_position(tdir: Path, app_id: str) -> tuple[int, StreamKey | None, bool]:
    """``(txnVersion, stream key, exact)`` of the newest commit of ``app_id`` in the
    Delta table at ``tdir``: the newest JSON commit holding a ``txn`` action of the appId
    (its ``commitInfo.userMetadata`` has the key); when the JSON files of the log were
    cleaned up past it, the version from the newest checkpoint and no key (exact False).
    ``(0, None, True)`` when the appId never wrote."""
    logdir = tdir / "_delta_log"
    if not logdir.is_dir():
        return 0, None, True
    commits = sorted(logdir.glob("[0-9]*.json"), reverse=True)
    for f in commits:
        version, meta = None, None
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            txn = action.get("txn")
            if txn is not None and txn.get("appId") == app_id:
                version = int(txn["version"])
            ci = action.get("commitInfo")
            if ci is not None and ci.get("userMetadata"):
                meta = ci["userMetadata"]
        if version is not None:
            key = None
            try:
                key = key_from_json(json.loads(meta).get(KEY_META)) if meta else None
            except (ValueError, AttributeError):
                key = None
            return version, key, key is not None
    # not in the JSON files left: the newest checkpoint holds the txn action (without the key)
    import pyarrow.parquet as pq

    for cp in sorted(logdir.glob("*.checkpoint*.parquet"), reverse=True):
        t = pq.read_table(cp, columns=["txn"]).column("txn").to_pylist()
        versions = [int(r["version"]) for r in t if r and r.get("appId") == app_id]
        if versions:
            return max(versions), None, False
        return 0, None, True
    return 0, None, True


DDL_META = "capturer_ddl"  # the userMetadata field of an ALTER clause's commit: [commit_ts, region, sub, clause]


def ddl_done(tdir: Path, key: StreamKey, scan: int = 1000) -> set[int]:
    """The clauses of the DDL at ``key`` the Delta table at ``tdir`` has committed (their
    numbers, ``DDL_META``): its newest JSON commits read back to the first one of an older
    key (upkeep's commits, untagged, passed over; at most ``scan`` of them)."""
    logdir = tdir / "_delta_log"
    done: set[int] = set()
    if not logdir.is_dir():
        return done
    for f in sorted(logdir.glob("[0-9]*.json"), reverse=True)[:scan]:
        meta = None
        for line in f.read_text().splitlines():
            if line.strip():
                ci = json.loads(line).get("commitInfo")
                if ci is not None and ci.get("userMetadata"):
                    meta = ci["userMetadata"]
        if not meta:
            continue
        try:
            doc = json.loads(meta)
            tag = doc.get(DDL_META)
            k = key_from_json(tag[:3]) if tag is not None else key_from_json(doc.get(KEY_META))
        except (ValueError, AttributeError, TypeError):
            continue
        if k is None:
            continue
        if tag is not None and k == key:
            done.add(int(tag[3]))
        elif k < key:
            break
    return done


def keyless_state_sql(source: str, columns: list[str]) -> str:
    """The current rows of an append-only table as a query over ``source`` (each row as
    many times as its 'i' rows outnumber its 'd' rows)."""
    cols = ", ".join(lake.q(c) for c in columns)
    return (f"SELECT {cols} FROM (SELECT {cols}, SUM(CASE WHEN _op = 'i' THEN 1 ELSE -1 END) AS _n "
            f"FROM {source} GROUP BY {cols}) LATERAL VIEW explode(sequence(1, _n)) AS _i WHERE _n > 0")


class DeltaSender(SparkSender):
    """``[spark] table_format=delta`` (see the module's docstring). Needs its Spark
    session from open on (every batch is a Spark job); ``writer`` does not apply;
    ``compaction_interval`` is the interval of the upkeep rounds (OPTIMIZE, VACUUM)."""

    def __init__(self, name: str, options: dict[str, Any], queue_rows: int = 100_000):
        super().__init__(name, options, queue_rows)
        self.dtables: dict[tuple[str, str], DeltaTableState] = {}
        self.merges = 0
        self.merged_rows = 0
        self.merge_seconds = 0.0
        # upkeep: the lake tables written since the last round (or left by it), in order
        self._upkeep_due: dict[str, None] = {}
        # tables renamed (the name before) -> the stream key of the RENAME: a change to that name at or below
        # it is one the renamed table has (a replay after a crash); a RENAME at or below it is done
        self.renamed: dict[tuple[str, str], StreamKey] = {}
        self.optimizes = 0
        self.vacuums = 0
        self.last_upkeep_seconds = 0.0

    def status(self) -> dict[str, Any]:
        st = super().status()
        st.update({"table_format": "delta", "tables": len(self.dtables), "merges": self.merges,
                   "merged_rows": self.merged_rows, "merge_seconds": round(self.merge_seconds, 2),
                   "optimizes": self.optimizes, "vacuums": self.vacuums,
                   "last_upkeep_seconds": round(self.last_upkeep_seconds, 2)})
        return st

    def app_id(self, name: str) -> str:
        """The Delta ``txnAppId`` of this sender's writes to lake table ``name``."""
        return f"binlog-capturer/{self.name}/{name}"

    # --- lifecycle ----------------------------------------------------------
    def _session_at_open(self) -> bool:
        return True

    def open(self) -> None:
        if self._opened:
            return
        why = deltajars.incompatible()
        if why:
            raise SinkError(why, retriable=False)
        if not _java_found():
            raise SinkError("the spark sender needs Java (17) for its Spark session: none on PATH and no "
                            "JAVA_HOME; sh start.sh installs it (apt-get install openjdk-17-jre-headless)",
                            retriable=False)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        if not self._commits.lock():  # (the changelog format's lock: one writer per warehouse, either format)
            raise SinkError(f"the lake {self.warehouse} is being written by another process (pid "
                            f"{self._commits.holder()}: another capturer, or this sender's previous process "
                            "still exiting); waiting for it", poll=0.2)  # (as the file's lock: freed at once
            # when its writer stops; a takeover must not then sit in a growing back-off)
        try:
            self._closed = False
            try:
                self._session(wait=True)
            except SinkError as exc:
                if isinstance(exc.__cause__, SinkError):
                    raise exc.__cause__ from None
                raise
            self._load_tables()
            if self.options.get("change_data_feed"):
                self._enable_cdf()
        except BaseException:
            self._commits.unlock()
            raise
        self._opened = True

    def _start_session(self) -> None:
        try:
            from pyspark import SparkContext

            active = SparkContext._active_spark_context
            self._own_session = active is None
            if active is None:
                self.spark = build_delta_session(self.options, self.warehouse)
            else:  # a session of this process (a notebook, a test module): it must have loaded Delta
                from pyspark.sql import SparkSession

                spark = SparkSession.builder.getOrCreate()
                if deltajars.EXTENSION not in str(spark.conf.get("spark.sql.extensions", "")):
                    raise SinkError("table_format=delta: the Spark session already running in this process was "
                                    "started without Delta Lake (spark.sql.extensions lacks "
                                    f"{deltajars.EXTENSION}); start it with senders.spark.deltasink."
                                    "build_delta_session, or stop it first", retriable=False)
                self.spark = spark
        except BaseException as exc:
            self._session_error = exc
            import threading

            threading.current_thread().error = exc  # type: ignore[attr-defined]

    def _load_tables(self) -> None:
        """Every Delta table of the warehouse this sender wrote, with its columns and position."""
        self.dtables = {}
        for tdir in sorted(self.warehouse.iterdir()):
            meta = tdir / "_capturer.json"
            if not (tdir / "_delta_log").is_dir() or not meta.exists():
                continue
            m = json.loads(meta.read_text())
            tdir = self._finish_rename(tdir, m)
            st = DeltaTableState(m["db"], m["table"], tdir.name, list(m["pk"]), {},
                                 app=m.get("app_id") or self.app_id(tdir.name))
            for r in m.get("renamed_from") or []:
                self._note_renamed((r["db"], r["table"]), key_from_json(r["key"]))
            st.columns = self._delta_columns(tdir)
            st.version, st.key, exact = read_position(tdir, st.app)
            if not exact:
                log.warning("sender %s: %s: the Delta log's JSON commits holding its position were cleaned up; "
                            "resuming at the checkpoint (changes replayed since are merged again: converges for a "
                            "keyed table, may repeat rows of an append-only one)", self.name, tdir.name)
            self.dtables[(st.db, st.table)] = st

    def _finish_rename(self, tdir: Path, meta: dict[str, Any]) -> Path:
        """A table whose directory is not named after the table its ``_capturer.json``
        names: a RENAME TABLE (``_rename``) that a crash cut between writing the new name
        and moving the directory. The move is done now."""
        want = self.warehouse / lake.table_name(meta["db"], meta["table"])
        if tdir == want:
            return tdir
        if want.exists():
            raise SinkError(f"Delta table {tdir} was being renamed to {want} ({meta['db']}.{meta['table']}), which "
                            "exists: move one of them aside", retriable=False)
        os.replace(tdir, want)
        log.warning("sender %s: %s: its RENAME TABLE to %s.%s finished (a crash came between its two steps)",
                    self.name, tdir.name, meta["db"], meta["table"])
        return want

    def _note_renamed(self, old: tuple[str, str], key: StreamKey | None) -> None:
        """The table ``old`` was renamed at ``key``: its changes at or below it are in the renamed table."""
        if key is not None and (old not in self.renamed or key > self.renamed[old]):
            self.renamed[old] = key

    def _enable_cdf(self) -> None:
        """``change_data_feed = true``: set the property on the tables that lack it."""
        for st in self.dtables.values():
            tdir = self.warehouse / st.name
            props = {r[0]: r[1] for r in self.spark.sql(f"SHOW TBLPROPERTIES delta.`{tdir}`").collect()}
            if str(props.get(CDF, "")).lower() != "true":
                try:
                    self.spark.sql(f"ALTER TABLE delta.`{tdir}` SET TBLPROPERTIES ('{CDF}' = 'true')")
                except Exception as exc:
                    raise SinkError(f"Delta table {tdir}: turning on its change data feed failed: {exc}") from exc
                log.info("sender %s: %s: change data feed turned on", self.name, st.name)

    def _delta_columns(self, tdir: Path) -> dict[str, str]:
        df = self.spark.read.format("delta").load(str(tdir))
        return {f.name: f.dataType.simpleString() for f in df.schema.fields if f.name not in META}

    # --- positions ----------------------------------------------------------
    def resume_key(self) -> StreamKey | None:
        """None: the stream resumes at the checkpoint, which never passes a batch not merged
        into every one of its tables. No key read from the tables could say more: a batch
        cut short by a crash may have merged some tables and not yet created another, whose
        changes below the other tables' keys are still due. What each table has is dropped
        for that table only, in ``send`` (its key, read back from its Delta log at open)."""
        return None

    # --- upkeep -------------------------------------------------------------
    def housekeeping(self) -> None:
        """An upkeep round when ``compaction_interval`` has passed since the last one
        (between batches, in the sender's thread). Never raises: a failure is logged,
        shown (status ``housekeeping_error``) and the table tried again next interval."""
        interval = float(self.options["compaction_interval"])
        if not interval or not self._opened or self.spark is None:
            return
        if time.monotonic() - self._last_compaction < interval:
            return
        try:
            self._upkeep(list(self._upkeep_due))
        except Exception as exc:  # (_upkeep catches per table; this is the unexpected)
            self.housekeeping_error = str(exc)
            log.warning("sender %s: upkeep failed: %s; the batches go on, tried again in %.0f s",
                        self.name, exc, interval)

    def compact_all(self) -> None:
        """One upkeep round now, of every table (the operator's command); between batches only.
        Raises when a table's upkeep failed (the others were done)."""
        if not self._opened:
            self.open()
        names = list(self._upkeep_due) + [st.name for st in self.dtables.values() if st.name not in self._upkeep_due]
        if not self._upkeep(names):
            raise SinkError(f"upkeep: {self.housekeeping_error}")

    def _upkeep(self, names: list[str]) -> bool:
        """OPTIMIZE then VACUUM each table of ``names`` (lake table names) in order, until
        ``upkeep_budget`` seconds have passed: the tables not reached, and those that
        failed, stay due. True when none failed."""
        t0 = time.monotonic()
        budget = float(self.options.get("upkeep_budget") or 60.0)
        hours = float(self.options.get("vacuum_retention_hours", 168.0))
        if hours < 168:  # the user asked for less than Delta's safety margin (documented risk)
            self.spark.conf.set(RETENTION_CHECK, "false")
        errors = []
        live = {st.name for st in self.dtables.values()}
        for name in names:
            if time.monotonic() - t0 >= budget:
                log.info("sender %s: upkeep round out of its %.0f s budget; %d table(s) left for the next",
                         self.name, budget, len(self._upkeep_due))
                break
            if name not in live:  # dropped since
                self._upkeep_due.pop(name, None)
                continue
            tdir = self.warehouse / name
            try:
                failpoints.hit("spark.upkeep")
                self.spark.sql(f"OPTIMIZE delta.`{tdir}`").collect()
                self.optimizes += 1
                self.spark.sql(f"VACUUM delta.`{tdir}` RETAIN {hours:g} HOURS").collect()
                self.vacuums += 1
                self._upkeep_due.pop(name, None)
            except Exception as exc:
                errors.append(f"{name}: {exc}")
                self._upkeep_due[name] = None
                log.warning("sender %s: upkeep (OPTIMIZE/VACUUM) of Delta table %s failed: %s; the batches go on, "
                            "tried again next round", self.name, tdir, exc)
        self.housekeeping_error = "; ".join(f"upkeep of {e}"[:2000] for e in errors)
        self.compactions += 1
        self.last_upkeep_seconds = self.last_compaction_seconds = time.monotonic() - t0
        self._last_compaction = time.monotonic()
        return not errors

    # --- sending ------------------------------------------------------------
    def send(self, batch: list[Txn]) -> None:
        """Merge the batch into its tables: per table, the transactions above the
        table's key, collapsed to the last change per key, in one MERGE (one Delta
        commit) between two DDL of the batch. DDL is applied in stream order."""
        if not self._opened:
            self.open()
        if not batch:
            return
        pending: dict[tuple[str, str], list[tuple[Txn, int, RowChange]]] = {}
        for txn in batch:
            if txn.ddl is not None:
                self._merge_all(pending)
                pending = {}
                self._ddl(txn)
                continue
            for seq, ch in enumerate(txn.changes):
                s = ch.schema
                st = self.dtables.get((s.db, s.table))
                if st is not None and st.key is not None and stream_key(txn) <= st.key:
                    continue  # this table has it (a replay after a crash)
                gone = self.renamed.get((s.db, s.table)) if self.renamed else None
                if gone is not None and stream_key(txn) <= gone:
                    continue  # the table was renamed after this change, which it has (a replay)
                pending.setdefault((s.db, s.table), []).append((txn, seq, ch))
        self._merge_all(pending)

    def _merge_all(self, pending: dict[tuple[str, str], list[tuple[Txn, int, RowChange]]]) -> None:
        for rows in pending.values():
            if rows:
                self._merge(rows)

    def _columns_of(self, rows: list[tuple[Txn, int, RowChange]]) -> dict[str, str]:
        """The columns of the rows' images, in source order, typed as the newest schema types them."""
        newest = rows[-1][2].schema
        info = dict(zip(newest.columns, newest.column_info))
        seen: dict[str, str] = {}
        done: set[int] = set()
        for _t, _s, ch in rows:
            s = ch.schema
            if id(s) in done:
                continue
            cinfo = dict(zip(s.columns, s.column_info))
            for img in (ch.after, ch.before):
                for c in img or {}:
                    if c not in seen:
                        seen[c] = lake.spark_type(cinfo.get(c) or info.get(c))
            done.add(id(s))
        return seen

    def _table_for(self, rows: list[tuple[Txn, int, RowChange]], columns: dict[str, str]) -> DeltaTableState:
        """The table's state, creating the Delta table or adding the columns it lacks;
        a column whose lake type changed is an error that stops the sender."""
        s = rows[-1][2].schema
        st = self.dtables.get((s.db, s.table))
        name = lake.table_name(s.db, s.table)
        tdir = self.warehouse / name
        pair = name_clash([*(st.columns if st is not None else ()), *(c for c in columns if st is None
                                                                       or c not in st.columns)])
        if pair is not None:
            raise SinkError(lake.case_clash_error(s.db, s.table, pair), retriable=False)
        if st is None:
            clash = [c for c in columns if c in META] if not s.pk else []
            if clash:
                raise SinkError(f"{s.db}.{s.table}: column {clash[0]!r} has the name of a lake metadata column "
                                f"({', '.join(META)}) of an append-only table", retriable=False)
            cols = dict(columns) if s.pk else {"_op": "string", "_commit_ts": "bigint", "_region": "string",
                                                   "_seq": "int", "_sub": "int", **columns}
            spec = ", ".join(f"{lake.q(c)} {t}" for c, t in cols.items())
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS delta.`{tdir}` ({spec}) USING delta TBLPROPERTIES ("
                "'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '3', "
                "'delta.minWriterVersion' = '7', 'delta.feature.timestampNtz' = 'supported'"
                + (f", '{CDF}' = 'true'" if self.options.get("change_data_feed") else "") + ")")
            meta = tdir / "_capturer.json"
            tmp = tdir / "_capturer.json.tmp"
            tmp.write_text(json.dumps({"db": s.db, "table": s.table, "pk": list(s.pk), "app_id": self.app_id(name)}))
            os.replace(tmp, meta)
            st = DeltaTableState(s.db, s.table, name, list(s.pk), self._delta_columns(tdir), app=self.app_id(name))
            st.version, st.key, _ = read_position(tdir, st.app)
            self.dtables[(s.db, s.table)] = st
        missing = {c: t for c, t in columns.items() if c not in st.columns}
        for c, t in columns.items():
            have = st.columns.get(c)
            if have is not None and have != t:
                raise SinkError(
                    f"Delta table {tdir} ({s.db}.{s.table}): column {c!r} changed type from {have} to {t}, which "
                    "the lake table cannot take in place. Way out: stop the capturer, move the table's directory "
                    "aside, and re-copy the source table (or start this sender from a checkpoint before it existed)",
                    retriable=False)
        if missing:
            spec = ", ".join(f"{lake.q(c)} {t}" for c, t in missing.items())
            self.spark.sql(f"ALTER TABLE delta.`{tdir}` ADD COLUMNS ({spec})")
            st.columns.update(missing)
        if list(s.pk) != st.pk and s.pk and st.pk:
            st.pk = list(s.pk)
        return st

    def _merge(self, rows: list[tuple[Txn, int, RowChange]]) -> None:
        import pyarrow as pa

        t0 = time.monotonic()
        columns = self._columns_of(rows)
        st = self._table_for(rows, columns)
        tdir = self.warehouse / st.name
        last = rows[-1][0]
        if st.pk:
            pk = st.pk
            final: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
            for _txn, _seq, ch in rows:
                op = ch.op
                if op == "delete":
                    b = ch.before or {}
                    final[tuple(b.get(c) for c in pk)] = ("d", b)
                    continue
                a = ch.after or {}
                if op == "update":
                    b = ch.before or {}
                    kb = tuple(b.get(c) for c in pk)
                    ka = tuple(a.get(c) for c in pk)
                    if kb != ka:
                        final[kb] = ("d", b)
                    final[ka] = ("u", a)
                else:
                    final[tuple(a.get(c) for c in pk)] = ("u", a)
            ops = [v[0] for v in final.values()]
            imgs = [v[1] for v in final.values()]
            data: dict[str, list[Any]] = {"_op": ops}
            fields = [pa.field("_op", pa.string())]
        else:
            ops, imgs, cts, regs, seqs, subs = [], [], [], [], [], []
            for txn, seq, ch in rows:
                parts = ([("d", ch.before), ("i", ch.after)] if ch.op == "update"
                         else [("d", ch.before)] if ch.op == "delete" else [("i", ch.after)])
                for sub, (o, img) in enumerate(parts):
                    ops.append(o)
                    imgs.append(img or {})
                    cts.append(txn.commit_ts)
                    regs.append(txn.region)
                    seqs.append(seq)
                    subs.append(sub)
            data = {"_op": ops, "_commit_ts": cts, "_region": regs, "_seq": seqs, "_sub": subs}
            fields = [pa.field("_op", pa.string()), pa.field("_commit_ts", pa.int64()),
                      pa.field("_region", pa.string()), pa.field("_seq", pa.int32()), pa.field("_sub", pa.int32())]
        get = dict.get
        for c, t in columns.items():
            vals = list(map(get, imgs, repeat(c)))
            if not set(map(type, vals)) <= _AS_IS.get(t if not t.startswith("decimal") else "decimal", set()):
                vals = [lake.lake_value(v, t) for v in vals]
            data[c] = vals
            fields.append(pa.field(c, arrow_type(t)))
        table = pa.Table.from_pydict(data, schema=pa.schema(fields))
        version = max(st.version + 1, last.commit_ts)
        key = stream_key(last)
        try:
            df = self.spark.createDataFrame(table)
            view = f"_capturer_src_{uuid.uuid4().hex[:8]}"
            df.createOrReplaceTempView(view)
            failpoints.hit("spark.commit")
            conf = self.spark.conf
            conf.set(_TXN_CONF[0], st.app)
            conf.set(_TXN_CONF[1], str(version))
            conf.set(_TXN_CONF[2], json.dumps({KEY_META: key_to_json(key), "sender": self.name}))
            try:
                cols = list(columns)
                if st.pk:
                    on = " AND ".join(f"t.{lake.q(c)} = s.{lake.q(c)}" for c in st.pk)
                    sets = ", ".join(f"t.{lake.q(c)} = s.{lake.q(c)}" for c in cols)
                    ins = ", ".join(lake.q(c) for c in cols)
                    values = ", ".join(f"s.{lake.q(c)}" for c in cols)
                    self.spark.sql(
                        f"MERGE INTO delta.`{tdir}` t USING {view} s ON {on} "
                        "WHEN MATCHED AND s._op = 'd' THEN DELETE "
                        f"WHEN MATCHED THEN UPDATE SET {sets} "
                        f"WHEN NOT MATCHED AND s._op <> 'd' THEN INSERT ({ins}) VALUES ({values})")
                else:
                    allc = META + cols
                    self.spark.sql(f"INSERT INTO delta.`{tdir}` ({', '.join(lake.q(c) for c in allc)}) "
                                   f"SELECT {', '.join(lake.q(c) for c in allc)} FROM {view}")
            finally:
                for k in _TXN_CONF:
                    conf.unset(k)
                self.spark.catalog.dropTempView(view)
        except SinkError:
            raise
        except Exception as exc:
            # what reached the table is read back: the retry merges only what it lacks
            st.version, st.key, _ = read_position(tdir, st.app)
            raise SinkError(f"MERGE into Delta table {tdir} failed: {exc}") from exc
        st.version, st.key = version, key
        self._upkeep_due[st.name] = None
        failpoints.hit("spark.committed")
        self.merges += 1
        self.merged_rows += len(rows)
        self.appends += 1
        self.merge_seconds += time.monotonic() - t0

    # --- DDL ----------------------------------------------------------------
    def _ddl(self, txn: Txn) -> None:
        """ADD / DROP / RENAME COLUMN (column mapping makes the last two metadata changes),
        TRUNCATE (a DELETE of every row, with the txn pair), DROP TABLE (the directory
        removed), RENAME TABLE (``_rename``: the directory moved, the table's history kept).
        Each is idempotent: a replayed DDL finds its work done."""
        ddl = txn.ddl
        assert ddl is not None
        head = clean(ddl.sql).upper()
        key = stream_key(txn)
        try:
            if head.startswith("DROP"):
                # every table of the statement (DROP TABLE a, b), or of the database (DROP DATABASE)
                for db, table in dropped_tables(ddl.sql, ddl.session_db or ddl.db):
                    for t in [table] if table else sorted(t for d, t in self.dtables if d == db):
                        self._drop((db, t), key)
                return
        except Exception as exc:
            raise SinkError(f"Delta lake {self.warehouse}: applying the DDL {ddl.sql!r} failed: {exc}",
                            retriable=False) from exc
        if not ddl.table:
            return
        st = self.dtables.get((ddl.db, ddl.table))
        tdir = self.warehouse / lake.table_name(ddl.db, ddl.table)
        if st is not None and st.key is not None and key <= st.key:
            return  # replayed: this table has it
        try:
            if head.startswith("RENAME"):
                for old, new in renamed_tables(ddl.sql, ddl.session_db or ddl.db):
                    self._rename(old, new, key, ddl.sql)
                return
            if st is None:
                return  # no rows yet: the table is made from its first rows' schema
            if head.startswith("TRUNCATE"):
                self._txn_sql(st, txn, f"DELETE FROM delta.`{tdir}`")
                return
            if head.startswith("ALTER"):
                self._alter(st, txn, key)
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(f"Delta table {tdir}: applying {ddl.db}.{ddl.table}'s DDL failed: {ddl.sql!r}: {exc}",
                            retriable=False) from exc

    def _drop(self, name: tuple[str, str], key: StreamKey) -> None:
        """A DROP TABLE of ``name``: its directory removed (moved aside first: a crash leaves it whole or gone).
        Replayed (the table's key at or past ``key``: a table of that name made after the DROP): nothing."""
        st = self.dtables.get(name)
        if st is not None and st.key is not None and key <= st.key:
            return
        tdir = self.warehouse / lake.table_name(*name)
        if st is not None or tdir.exists():
            gone = tdir.with_name(f".{tdir.name}.dropped.{uuid.uuid4().hex[:6]}")
            os.replace(tdir, gone)
            shutil.rmtree(gone, ignore_errors=True)
            self.dtables.pop(name, None)

    def _alter(self, st: DeltaTableState, txn: Txn, key: StreamKey) -> None:
        """An ALTER TABLE of a table the lake has: ADD COLUMN (with a constant DEFAULT set on
        the older rows), DROP / RENAME / CHANGE COLUMN, then a RENAME TO. Each clause is a
        Delta commit of its own, tagged with the DDL's key and the clause's number
        (``DDL_META``): a replay after a crash skips the clauses the table has (``ddl_done``),
        so a statement whose clauses are not idempotent one by one (``DROP COLUMN a, CHANGE b
        a``: a second DROP would drop the renamed column) is applied once."""
        ddl = txn.ddl
        assert ddl is not None
        tdir = self.warehouse / st.name
        done = ddl_done(tdir, key)  # the clauses of this DDL the table has (a replay after a crash)
        fill: dict[str, str] = {}  # column added -> its default, set on the rows there in one commit at the end
        lake.warn_unknown_adds(log, self.name, ddl.db, ddl.table, ddl.sql)
        if_new = {c.lower() for c in added_if_not_exists(ddl.sql)}
        adds = iter(lake.parse_add_columns(ddl.sql))  # (its ADDs, in the same order)
        rename_to = ""

        def run(i: int, sql: str) -> None:  # one clause's Delta commit, tagged
            conf = self.spark.conf
            conf.set(_TXN_CONF[2], json.dumps({DDL_META: [key[0], key[1], key[2], i], "sender": self.name}))
            try:
                self.spark.sql(sql)
            finally:
                conf.unset(_TXN_CONF[2])
            failpoints.hit("spark.alter")  # (a clause committed, the next not yet)

        for i, (what, a, b) in enumerate(lake.alter_columns(ddl.sql)):  # in the clauses' order (DROP c, ADD c)
            if what == "rename_table":
                rename_to = b
                continue
            if what == "add":
                col, stype, default = next(adds)
                col = lake.column_named(col, st.columns) or col
                if i in done:  # (committed before the crash: what it set on the rows is still to do)
                    if col in st.columns and default is not None and default.upper() != "NULL":
                        fill[col] = default
                    continue
                if col in st.columns and col.lower() in if_new:
                    # ADD COLUMN IF NOT EXISTS of a column the table has: the source leaves it and its values
                    # as they are (the default is not set on its rows)
                    continue
                if col not in st.columns and stype is not None:
                    run(i, f"ALTER TABLE delta.`{tdir}` ADD COLUMNS ({lake.q(col)} {stype})")
                    st.columns[col] = stype
                if col in st.columns and default is not None and default.upper() != "NULL":
                    fill[col] = default
                continue
            if i in done:
                if what == "drop":
                    fill.pop(lake.column_named(a, fill) or a, None)
                elif what == "rename" and a in fill:
                    fill[b] = fill.pop(a)
                continue
            a = lake.column_named(a, st.columns) or a  # (DROP COLUMN ID drops id, as on the source)
            if what == "drop" and a in st.columns:
                if a in st.pk:
                    self._cannot(ddl.db, ddl.table, ddl.sql, "DROP of a primary key column")
                run(i, f"ALTER TABLE delta.`{tdir}` DROP COLUMN {lake.q(a)}")
                del st.columns[a]
                fill.pop(a, None)
            elif what == "rename" and a in st.columns and (b not in st.columns or b.lower() == a.lower()):
                run(i, f"ALTER TABLE delta.`{tdir}` RENAME COLUMN {lake.q(a)} TO {lake.q(b)}")
                st.columns = {(b if c == a else c): t for c, t in st.columns.items()}
                st.pk = [b if c == a else c for c in st.pk]
                if a in fill:
                    fill[b] = fill.pop(a)
        if fill:
            # the rows from before the ALTER read the column's default, as on the source: set in one
            # commit with the txn pair (the table's key is then this DDL's: a replay skips it whole)
            sets = ", ".join(f"{lake.q(c)} = CAST({d} AS {st.columns[c]})" for c, d in fill.items())
            self._txn_sql(st, txn, f"UPDATE delta.`{tdir}` SET {sets}")
        if rename_to:  # (after the column changes: MySQL applies the clauses so too)
            to_db, to_table = split_qname(rename_to)
            self._rename((ddl.db, ddl.table), (to_db or ddl.db, to_table), key, ddl.sql)

    def _rename(self, old: tuple[str, str], new: tuple[str, str], key: StreamKey, sql: str) -> None:
        """RENAME TABLE ``old`` TO ``new`` (one pair of the statement, in its order, so a swap
        through a third name works): the table's directory is moved to the new name, its Delta
        log, history and txnAppId kept. Two steps, each atomic: the new name, the table's
        ``app_id`` and ``renamed_from`` (``old`` at ``key``) are written to its ``_capturer.json``,
        then the directory is renamed; a crash between them is finished at the next open
        (``_finish_rename``). A replay after a crash finds the rename in ``renamed`` and
        skips it, and the changes to ``old`` at or below ``key``, which the table has (every
        change before a DDL is merged before it). A table with no Delta table yet (no rows)
        has nothing to move: its rows come under the new name. A new name that is a lake
        table already stops the sender (the source refuses that RENAME; the lake has the
        name from before, e.g. a table dropped while the filter left it out)."""
        if old in self.renamed and key <= self.renamed[old]:
            return  # done before a crash
        st = self.dtables.get(old)
        if st is None:
            return
        src = self.warehouse / st.name
        dst = self.warehouse / lake.table_name(*new)
        if new in self.dtables or dst.exists():
            self._cannot(old[0], old[1], sql, f"RENAME TABLE onto {new[0]}.{new[1]}, which the lake already has "
                                              f"({dst})")
        meta_path = src / "_capturer.json"
        meta = json.loads(meta_path.read_text())
        meta.update({"db": new[0], "table": new[1], "pk": st.pk, "app_id": st.app,
                     "renamed_from": [*(meta.get("renamed_from") or []),
                                      {"db": old[0], "table": old[1], "key": key_to_json(key)}]})
        tmp = src / "_capturer.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, meta_path)
        failpoints.hit("spark.rename")
        os.replace(src, dst)
        del self.dtables[old]
        st.db, st.table, st.name = new[0], new[1], dst.name
        self.dtables[new] = st
        self._note_renamed(old, key)
        if self._upkeep_due.pop(src.name, 0) is None:
            self._upkeep_due[dst.name] = None
        log.info("sender %s: Delta table %s renamed to %s (%s.%s -> %s.%s)", self.name, src.name, dst.name,
                 *old, *new)

    def _txn_sql(self, st: DeltaTableState, txn: Txn, sql: str) -> None:
        """Run one Delta DML statement as a commit of this sender: with the txn pair and
        the stream key of ``txn`` (a DDL's)."""
        version, key = max(st.version + 1, txn.commit_ts), stream_key(txn)
        conf = self.spark.conf
        conf.set(_TXN_CONF[0], st.app)
        conf.set(_TXN_CONF[1], str(version))
        conf.set(_TXN_CONF[2], json.dumps({KEY_META: key_to_json(key), "sender": self.name}))
        try:
            self.spark.sql(sql)
            self._upkeep_due[st.name] = None
        finally:
            for k in _TXN_CONF:
                conf.unset(k)
        st.version, st.key = version, key

    def _cannot(self, db: str, table: str, sql: str, what: str) -> None:
        raise SinkError(f"table_format=delta cannot apply a {what} yet: {db}.{table}: {sql!r}. The sender stops "
                        "(the others go on); way out: exclude the table (filter_rule.txt) or re-copy it under its "
                        "new name", retriable=False)


def build_delta_session(options: dict[str, Any], warehouse: Path) -> Any:
    """A SparkSession with Delta Lake loaded (jars resolved by ``deltajars``). In a
    process whose Spark JVM runs but has no context (one was stopped), the JVM is
    started anew: jars given to a running JVM would not reach its SQL extensions."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None and SparkContext._gateway is not None:
        try:
            jvm: Any = SparkContext._jvm
            loaded = "JavaClass" in type(jvm.io.delta.sql.DeltaSparkSessionExtension).__name__
        except Exception:
            loaded = False
        if not loaded:
            try:
                SparkContext._gateway.shutdown()
            except Exception:
                pass
            SparkContext._gateway = None
            SparkContext._jvm = None
    opts = dict(options)
    # small tables on one machine: few partitions for the log's state and the MERGE's joins; the
    # MERGE's source (rows built here, deterministic) is not materialised again (one Spark job less)
    conf = {**deltajars.session_conf(), "spark.databricks.delta.snapshotPartitions": "2",
            "spark.sql.shuffle.partitions": "2", "spark.databricks.delta.merge.materializeSource": "none",
            # VACUUM lists a table's files in a job of this many tasks (Spark's default, 10000, took 90 s on a
            # table of a few files)
            "spark.sql.sources.parallelPartitionDiscovery.parallelism": "16",
            **(options.get("conf.*") or {})}
    opts["conf.*"] = conf
    return build_session(opts, warehouse)
