"""``sh start.sh --demo full``: the shop demo (two private MariaDB shards and their
workload, devtools/demo.py) with all four senders at once:

* ``local``: the JSON-lines file, as in the plain demo;
* ``mysql``: a third private MariaDB as the target (``threadnum=4``);
* ``kafka``: a private Apache Kafka broker (``devtools/local_kafka.py``: KRaft, its jars
  resolved from Maven Central once), JSON messages through confluent-kafka, one topic per table;
* ``spark``: **Delta Lake tables** (``table_format=delta``: one table per source table,
  ``<lake>/shop__<table>``, kept by one MERGE per table per batch) where the Delta runtime
  is usable (PySpark 4.2, the ``deltalake`` package, and the Delta jars: resolved by Maven
  once, cached); otherwise the Parquet changelog (``writer=arrow``: changelog files are
  written without Spark; a Spark session starts only when the first compaction comes due),
  with one line saying why (``delta_missing``): Maven unreachable never stops the demo.

A part that cannot run on this machine (no Java or Maven for Kafka, or no confluent-kafka; no
pyspark/pyarrow, or no Java) is skipped with one line saying why, and the others
run. ``sh start.sh --demo full`` installs what they need (the ``delta``, ``demo`` and
``spark`` extras, a Java runtime and Maven).

``--once``: half the workload, then a wait for the lake's first compaction (Delta: the
first upkeep round, OPTIMIZE and VACUUM of every table; changelog: so that the lake's views
merge a compacted snapshot with newer changelog rows), the other half, and once every
sender has acknowledged everything, each one is read back and compared with the sources
row by row (devtools/verify_sinks.py): the file replayed, every target table selected, the
Kafka topics consumed and rebuilt per key, the Delta tables read by ``deltalake`` (delta-rs,
no JVM) or the changelog's current-state views read through Spark.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from pathlib import Path
from typing import Any

from capturer.app import Capturer
from devtools.demo import FileSink, Sinks, run_demo
from devtools.local_kafka import Broker
from devtools.local_mariadb import MariaDBInstance
from devtools.verify_sinks import (
    SinkCheck,
    SourceTable,
    TableName,
    compare,
    delta_rows,
    kafka_messages,
    lake_rows,
    read_mysql,
    rebuild_kafka,
)

INSTALL = "sh start.sh --demo full installs it"
KAFKA_TOPICS = "capturer."  # the sender's default topic template: capturer.{db}.{table}
SCHEMA_TOPIC = "capturer.schema_changes"


class MySQLSink:
    name = "mysql"

    def __init__(self, target: MariaDBInstance, threadnum: int = 4):
        self.target = target
        self.threadnum = threadnum

    def section(self) -> str:
        return (f"[mysql]\nhost=127.0.0.1\nport={self.target.port}\nuser=root\npassword=\n"
                f"threadnum={self.threadnum}\n")

    def where(self) -> str:
        return (f"mysql: a private MariaDB target on 127.0.0.1:{self.target.port}, {self.threadnum} workers "
                f"(mariadb -h127.0.0.1 -P{self.target.port} -uroot shop)")

    def check(self, sources: dict[TableName, SourceTable], committed_rows: int) -> SinkCheck:
        got = read_mysql(self.target.connect, sources)
        return compare(self.name, sources, {name: st.rows for name, st in got.items()},
                       note=f"SELECTed from the target 127.0.0.1:{self.target.port}")


class KafkaSink:
    name = "kafka"

    def __init__(self, broker: Broker):
        self.broker = broker

    def section(self) -> str:
        return f"[kafka]\nservers={self.broker.servers}\nclient=confluent\nformat=json\n"

    def where(self) -> str:
        return (f"kafka: a private Apache Kafka broker on {self.broker.servers}, topics {KAFKA_TOPICS}shop.<table> "
                f"(JSON, client confluent; DDL in {SCHEMA_TOPIC})")

    def check(self, sources: dict[TableName, SourceTable], committed_rows: int) -> SinkCheck:
        msgs = kafka_messages(self.broker.servers, lambda t: t.startswith(KAFKA_TOPICS) and t != SCHEMA_TOPIC)
        topics = len({m.topic for m in msgs})
        return compare(self.name, sources, rebuild_kafka(msgs),
                       note=f"rebuilt per key from {len(msgs)} messages in {topics} topics")


class SparkSink:
    name = "spark"

    def __init__(self, warehouse: Path, compaction_interval: float, delta: bool = False):
        self.warehouse = warehouse
        self.compaction_interval = compaction_interval
        self.delta = delta  # table_format=delta (else the changelog)
        self.config = Path()  # the demo's config.cfg (for the lakecli hint), set once known

    def section(self) -> str:
        fmt = "table_format=delta\n" if self.delta else "writer=arrow\n"
        return (f"[spark]\nmaster=local[2]\nwarehouse={self.warehouse}\n{fmt}batch_interval=1\n"
                f"compaction_interval={self.compaction_interval:g}\n"
                "conf.spark.ui.showConsoleProgress=false\n")  # (no progress bars across the demo's lines)

    def where(self) -> str:
        if self.delta:
            return (f"spark: Delta Lake tables {self.warehouse}/shop__<table> (table_format=delta: one MERGE per "
                    f"table per batch; OPTIMIZE and VACUUM every {self.compaction_interval:g}s)")
        return (f"spark: the Parquet lake {self.warehouse} (writer=arrow; a compaction every "
                f"{self.compaction_interval:g}s, the Spark session starts at the first); query it: "
                f".venv/bin/python -m senders.spark.lakecli show shop.orders --config {self.config}")

    def query_hints(self) -> list[str]:
        """How to query the Delta tables (printed at the end of the demo)."""
        if not self.delta:
            return []
        t = self.warehouse / "shop__orders"
        return [
            "Spark SQL: PATH=.venv/bin:$PATH spark-sql --jars \"$(.venv/bin/python -m senders.spark.deltajars | paste -sd,)\" "
            "--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension --conf "
            "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog "
            f"-e 'SELECT status, count(*) FROM delta.`{t}` GROUP BY status'",
            "deltalake (no JVM): .venv/bin/python -c \"import deltalake as d; "
            f"print(d.QueryBuilder().register('o', d.DeltaTable('{t}'))"
            ".execute('SELECT status, count(*) FROM o GROUP BY status').read_all())\"",
        ]

    def check(self, sources: dict[TableName, SourceTable], committed_rows: int) -> SinkCheck:
        if self.delta:
            rows, note = delta_rows(self.warehouse)
            return compare(self.name, sources, rows, note=f"Delta tables read by deltalake (delta-rs; {note})")
        rows, note = lake_rows(self.warehouse)
        return compare(self.name, sources, rows, note=f"read through the lake's views ({note})")


def kafka_missing() -> str:
    """Why the Kafka part cannot run here ('' when it can)."""
    from devtools.local_kafka import unavailable

    why = unavailable()
    if why:
        return f"no Apache Kafka broker ({why}; {INSTALL})"
    if importlib.util.find_spec("confluent_kafka") is None:
        return f"no Kafka client (confluent-kafka is not installed; {INSTALL})"
    return ""


def delta_missing(maven_timeout: float = 300) -> str:
    """Why the Spark part cannot write Delta tables here ('' when it can): PySpark 4.2 (the
    Delta runtime's Spark), the ``deltalake`` package (the check's reader) and the Delta jars
    (resolved by Maven the first time, at most ``maven_timeout`` seconds; cached after)."""
    from senders.spark import deltajars

    if deltajars.incompatible():
        import pyspark

        return (f"PySpark {pyspark.__version__} is installed and Delta Lake {deltajars.DELTA_VERSION} runs on "
                f"Spark {deltajars.SPARK_MINOR} (pip install -e '.[delta]')")
    if importlib.util.find_spec("deltalake") is None:
        return f"the deltalake package is not installed ({INSTALL})"
    try:
        deltajars.jars(timeout=maven_timeout)
    except (RuntimeError, OSError) as exc:
        return f"the Delta Lake jars could not be resolved: {str(exc).splitlines()[0]}"
    return ""


def spark_missing() -> str:
    """Why the Spark part cannot run here ('' when it can)."""
    missing = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (the spark extra, ~450 MB; {INSTALL})"
    from senders.spark.sender import _java_found  # the sender's own test, so both agree

    if not _java_found():
        home = os.environ.get("JAVA_HOME")
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH, no JAVA_HOME"
        return f"no Java runtime for its Spark session ({where}; {INSTALL})"
    return ""


class FullSinks(Sinks):
    """The four senders, each where it can run."""

    def __init__(self) -> None:
        super().__init__()
        self.target: MariaDBInstance | None = None
        self.broker: Broker | None = None
        self.spark: SparkSink | None = None

    def start(self, basedir: Path, once: bool) -> None:
        self.sinks.append(FileSink(basedir / "out" / "changes.jsonl"))
        print("demo: starting a MariaDB target for the mysql sender ...", flush=True)
        self.target = MariaDBInstance(basedir / "target", server_id=99, binlog=False)
        self.target.start()
        self.sinks.append(MySQLSink(self.target))
        why = kafka_missing()
        if not why:
            try:
                self.broker = Broker().start()
            except (RuntimeError, OSError) as exc:
                self.broker = None
                why = f"the Apache Kafka broker did not start: {exc}"
        if why:
            self.skipped.append(f"kafka: {why}")
        else:
            assert self.broker is not None
            self.sinks.append(KafkaSink(self.broker))
        why = spark_missing()
        if why:
            self.skipped.append(f"spark: {why}")
        else:
            print("demo: checking the Delta Lake runtime for the spark sender (its jars: resolved by Maven "
                  "the first time, cached after) ...", flush=True)
            no_delta = delta_missing()
            if no_delta:
                print(f"demo: spark writes the Parquet changelog, not Delta tables: {no_delta}", flush=True)
            # --once: the first compaction soon (midway waits for it; Delta: an upkeep round takes some seconds
            # between two batches, so not every 5 s); live: one a minute
            self.spark = SparkSink(basedir / "lake", (15 if not no_delta else 5) if once else 60, delta=not no_delta)
            self.spark.config = basedir / "conf" / "config.cfg"
            self.sinks.append(self.spark)

    def midway(self, cap: Capturer, stop: threading.Event) -> None:
        """Wait for the lake's first compaction, so that the check reads a compacted
        snapshot merged with the changelog rows of the workload's second half (Delta:
        tables OPTIMIZEd, then MERGEd into again)."""
        if self.spark is None:
            return
        print("demo: half the workload done; waiting for the lake's first compaction "
              + ("(OPTIMIZE and VACUUM of the Delta tables) ..." if self.spark.delta else
                 "(its Spark session starts now: a JVM, some seconds) ..."), flush=True)
        # Delta: an upkeep round that OPTIMIZEd tables (the first may come before any table exists)
        done = "optimizes" if self.spark.delta else "compactions"
        t0 = time.monotonic()
        while not stop.is_set() and not cap.failure and time.monotonic() - t0 < 180:
            st = cap.snapshot()["senders"].get("spark", {})
            if st.get(done, 0) >= 1:
                print(f"demo: the lake compacted ({st.get('last_compaction_seconds', 0):.1f}s, after "
                      f"{time.monotonic() - t0:.0f}s); the workload's second half runs", flush=True)
                return
            time.sleep(0.2)
        st = cap.snapshot()["senders"].get("spark", {})
        print(f"demo: no compaction of the lake after {time.monotonic() - t0:.0f}s (session: {st.get('session')}; "
              f"{st.get('housekeeping_error') or 'no error reported'}); the workload goes on", flush=True)

    def progress(self, snap: dict[str, Any]) -> str:
        st = snap["senders"].get("spark")
        if not st:
            return ""
        if st.get("table_format") == "delta":
            return f"lake: Delta, {st['merges']} MERGEs, {st['compactions']} upkeep rounds"
        return f"lake: session {st['session']}, {st['compactions']} compactions"

    def epilogue(self) -> list[str]:
        return self.spark.query_hints() if self.spark is not None else []

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
            self.broker.cleanup()  # (its temporary directory)
            self.broker = None
        if self.target is not None:
            self.target.stop()
            self.target = None


def run_full_demo(basedir: Path, once: bool = False, steps: int = 400, stop: threading.Event | None = None) -> int:
    return run_demo(basedir, once=once, steps=steps, stop=stop, sinks=FullSinks())
