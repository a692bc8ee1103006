"""Compare what a sink holds with the source tables, row by row, by value.

Used by ``--demo ... --once``. Every sink is read back into rows (``{column: value}``
per row, per ``(db, table)``) in whatever types it gives: pymysql's from a MySQL
target, JSON values from the file and from Kafka (DECIMAL as a string, binary as
base64, datetimes as text), Spark's from the lake. Each value is then brought to
one canonical form by the *source* column's type (``canon``), so a DECIMAL
``"19.990"`` equals ``Decimal("19.99")``, a base64 string equals the bytes it
encodes, ``"2026-11-22 05:35:04.5"`` equals the datetime; text is compared as is.

Tables with a primary key are compared by key (missing, extra, different rows);
tables without one as multisets. The readers:

* ``read_mysql``: the source servers and a MySQL target (SELECT every row, UTC);
* ``replay_file``: the local sender's JSON lines, replayed (``senders.local.replay``);
* ``kafka_rows``: the Kafka sender's JSON messages, rebuilt per key
  (``rebuild_kafka``: newest row per key, deletes and key changes honoured);
* ``lake_rows``: the Spark lake's current-state views (``senders.spark.lake``);
* ``delta_rows``: the Delta Lake tables of ``table_format=delta``, read by ``deltalake``
  (delta-rs: no JVM, none of the sender's code).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.model.compare import ABSENT, KINDS, canon
from senders.kafka.client import KafkaMessage
from senders.kafka.verify import rebuild_kafka  # noqa: F401  (re-exported for the demos)

TableName = tuple[str, str]
Rows = dict[TableName, list[dict[str, Any]]]

_KINDS = KINDS


@dataclass
class SourceTable:
    """A source table's columns (in order), their kinds, its primary key and its rows."""

    db: str
    table: str
    columns: list[str]
    kinds: dict[str, str]
    pk: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def canon_row(self, row: dict[str, Any]) -> tuple[Any, ...]:
        """The row's values in column order, canonical; columns the source does not
        have (with a value) make it differ from every source row."""
        extra = tuple(sorted(c for c in row if c not in self.kinds and row[c] is not None))
        vals = tuple(canon(row.get(c, ABSENT), self.kinds[c]) for c in self.columns)
        return vals + ((("extra columns",) + extra,) if extra else ())


def read_mysql(connect: Callable[[], Any], tables: Iterable[TableName]) -> dict[TableName, SourceTable]:
    """Every row of ``tables`` (a missing table: no rows, no columns) with their columns'
    kinds and primary key, read in UTC (TIMESTAMPs as the binlog carries them)."""
    import pymysql

    out: dict[TableName, SourceTable] = {}
    conn = connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            for db, table in tables:
                cur.execute("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_KEY FROM information_schema.COLUMNS "
                            "WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s ORDER BY ORDINAL_POSITION", (db, table))
                meta = cur.fetchall()
                st = SourceTable(db, table, [m[0] for m in meta],
                                 {m[0]: _KINDS.get(str(m[1]).lower(), "text") for m in meta},
                                 [m[0] for m in meta if m[2] == "PRI"])
                out[(db, table)] = st
                if not meta:
                    continue
                try:
                    cur.execute(f"SELECT * FROM `{db.replace('`', '``')}`.`{table.replace('`', '``')}`")
                except pymysql.err.ProgrammingError:
                    continue
                cols = [d[0] for d in cur.description]
                st.rows = [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        conn.close()
    return out


def merge_sources(shards: Iterable[dict[TableName, SourceTable]]) -> dict[TableName, SourceTable]:
    """The tables of several shards (same schema) as one: their rows together."""
    out: dict[TableName, SourceTable] = {}
    for shard in shards:
        for name, st in shard.items():
            if name not in out:
                out[name] = SourceTable(st.db, st.table, st.columns, st.kinds, st.pk, list(st.rows))
            else:
                out[name].rows.extend(st.rows)
    return out


@dataclass
class SinkCheck:
    """The outcome of comparing one sink with the sources."""

    sink: str
    tables: int = 0
    rows: int = 0  # source rows compared
    problems: list[str] = field(default_factory=list)
    note: str = ""  # what was read (shown in the summary)

    @property
    def equal(self) -> bool:
        return not self.problems


def _show(st: SourceTable, row: tuple[Any, ...]) -> str:
    def one(v: Any) -> str:
        if isinstance(v, decimal.Decimal):
            return format(v, "f")
        if isinstance(v, bytes):
            return "0x" + v.hex()
        if isinstance(v, (dt.date, dt.datetime)):
            return v.isoformat(sep=" ") if isinstance(v, dt.datetime) else v.isoformat()
        return repr(v)

    text = ", ".join(f"{c}={one(v)}" for c, v in zip(st.columns + ["?"] * (len(row) - len(st.columns)), row))
    return "{" + (text if len(text) <= 200 else text[:197] + "...") + "}"


def compare_table(st: SourceTable, got_rows: list[dict[str, Any]]) -> str:
    """'' when the sink's rows equal the source's, else what differs (counts and an example)."""
    want = Counter(st.canon_row(r) for r in st.rows)
    got = Counter(st.canon_row(r) for r in got_rows)
    if want == got:
        return ""
    name = f"{st.db}.{st.table}"
    if st.pk:
        idx = [st.columns.index(c) for c in st.pk]
        w = {tuple(r[i] for i in idx): r for r in want}
        g = {tuple(r[i] for i in idx): r for r in got}
        missing = [k for k in w if k not in g]
        extra = [k for k in g if k not in w]
        diff = [k for k in w if k in g and w[k] != g[k]]
        keys = Counter(tuple(r[i] for i in idx) for r in got.elements())
        dups = sum(n - 1 for n in keys.values() if n > 1)
        parts = [f"{name}: {len(st.rows)} source rows, {len(got_rows)} in the sink: {len(missing)} missing, "
                 f"{len(extra)} extra, {len(diff)} different" + (f", {dups} duplicated" if dups > 0 else "")]
        if diff:
            k = diff[0]
            parts.append(f"e.g. source {_show(st, w[k])} vs sink {_show(st, g[k])}")
        elif missing:
            parts.append(f"e.g. missing {_show(st, w[missing[0]])}")
        elif extra:
            parts.append(f"e.g. extra {_show(st, g[extra[0]])}")
        return "; ".join(parts)
    lost, more = want - got, got - want
    example = next(iter(lost or more))
    return (f"{name}: {len(st.rows)} source rows, {len(got_rows)} in the sink: {sum(lost.values())} missing, "
            f"{sum(more.values())} extra (no key: compared as a multiset); e.g. "
            f"{'missing' if lost else 'extra'} {_show(st, example)}")


def compare(sink: str, sources: dict[TableName, SourceTable], got: Rows, note: str = "") -> SinkCheck:
    """Every source table against the sink's rows of it; tables the sink has that the
    sources do not are problems too."""
    check = SinkCheck(sink, note=note)
    for name, st in sources.items():
        check.tables += 1
        check.rows += len(st.rows)
        problem = compare_table(st, got.get(name, []))
        if problem:
            check.problems.append(problem)
    for name in sorted(set(got) - set(sources)):
        if got[name]:
            check.problems.append(f"{name[0]}.{name[1]}: {len(got[name])} rows in the sink, no such source table")
    return check


# --- the sinks ------------------------------------------------------------------

def replay_file(path: Path) -> tuple[Rows, int]:
    """The tables rebuilt from the local sender's JSON lines, and how many row changes
    (DDL aside) the file holds after dropping duplicates."""
    from senders.local.replay import read_changes, rebuild

    changes = sum(1 for d in read_changes(path) if d["op"] != "ddl")
    state = rebuild(read_changes(path))
    return {name: list(rows.values()) for name, rows in state.items()}, changes


def kafka_messages(servers: str, topics: Callable[[str], bool], timeout: float = 60.0) -> list[KafkaMessage]:
    """Every message of the topics ``topics(name)`` selects, from the start to the end of
    each partition, with confluent-kafka (senders/kafka/verify.py's reader: the end is
    where the broker's fetch answers say a partition ends)."""
    from senders.kafka.client import ConfluentTopicReader

    r = ConfluentTopicReader(servers)
    try:
        names = sorted(t for t in r.c.list_topics(timeout=10).topics if topics(t))
        out: list[KafkaMessage] = []
        r.read(names, out.append, timeout)
        return out
    finally:
        r.close()


def lake_rows(warehouse: Path, database: str = "cdc", master: str = "local[2]") -> tuple[Rows, str]:
    """Every lake table's current state, read through its view (the newest row per
    key over the compacted snapshot and the newer changelog; deletes dropped), and a
    note of the snapshot generations."""
    from senders.spark import lake
    from senders.spark.sender import build_session

    spark = build_session({"master": master, "app_name": "capturer-demo-check",
                           "conf.*": {"spark.ui.showConsoleProgress": "false"}}, warehouse)
    try:
        out: Rows = {}
        gens = []
        for st in lake.register_tables(spark, warehouse, database):
            rows = spark.sql(f"SELECT * FROM {lake.q(database)}.{lake.q(st.name)}").collect()
            out[(st.db, st.table)] = [r.asDict() for r in rows]
            gens.append(f"{st.db}.{st.table}: gen {st.generation}")
        return out, "snapshot " + ", ".join(gens)
    finally:
        spark.stop()


def delta_rows(warehouse: Path) -> tuple[Rows, str]:
    """Every Delta table's current state under ``warehouse`` (``table_format=delta``: one
    table per source table, ``<db>__<table>``), read by ``deltalake`` (delta-rs, through
    DataFusion's ``QueryBuilder``, which honours column mapping), and a note of each table's
    Delta version. A keyless table is append-only: its rows are the multiset of its 'i' rows
    less its 'd' rows, without the identity columns (``deltasink.META``)."""
    import json

    import deltalake
    import pyarrow as pa

    meta = ("_op", "_commit_ts", "_region", "_seq", "_sub")  # (deltasink.META, without importing the sender)
    out: Rows = {}
    versions = []
    for tdir in sorted(p for p in warehouse.iterdir() if (p / "_delta_log").is_dir()):
        info = json.loads((tdir / "_capturer.json").read_text())
        t = deltalake.DeltaTable(str(tdir))
        rows = pa.table(deltalake.QueryBuilder().register("t", t).execute("SELECT * FROM t").read_all()).to_pylist()
        if not info.get("pk"):
            n: Counter[tuple[tuple[str, Any], ...]] = Counter()
            for r in rows:
                n[tuple((k, v) for k, v in r.items() if k not in meta)] += 1 if r["_op"] == "i" else -1
            rows = [dict(k) for k, c in n.items() for _ in range(c)]
        out[(info["db"], info["table"])] = rows
        versions.append(f"{info['db']}.{info['table']}: v{t.version()}")
    return out, ", ".join(versions)
