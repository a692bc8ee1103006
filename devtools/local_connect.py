"""Kafka Connect standalone with Debezium's MariaDB connector: the peer the bench runs beside the capturer.

Apache Kafka Connect |CONNECT_VERSION| (``org.apache.kafka:connect-runtime``) and Debezium
|DEBEZIUM_VERSION| (``io.debezium:debezium-connector-mariadb``: 3.6.x of it is not on Maven Central, 3.5.0
is; the MySQL connector 3.6.1 sends MySQL 8.4's ``SHOW BINARY LOG STATUS``, which MariaDB 10.11 refuses),
and Debezium 3.5 needs Connect 4.1 (4.4 moved a class it uses), resolved from Maven Central by
``devtools/connect/pom.xml`` once into ``~/.cache/binlog-capturer/connect-<v>-<connector>-<v>/lib``
(``$CAPTURER_KAFKA_CACHE`` overrides the parent), as ``devtools/local_kafka.py`` does for the broker.
Only jars and configuration files: no code of theirs is in ours.

    c = Connect(broker.servers).start([debezium_mariadb("peer0", m, server_id=801, prefix="dbz0", ...)])
    c.pid                     # the Connect JVM (CPU, RSS)
    c.status("peer0")         # the REST API's /connectors/peer0/status
    c.stop()                  # SIGTERM (SIGKILL after a timeout); c.cleanup() deletes its directory too

Debezium's JDBC sink (``io.debezium:debezium-connector-jdbc``, the same version, with MariaDB's JDBC driver
|MARIADB_JDBC_VERSION|) runs in a worker of its own classpath (``devtools/connect/jdbc-sink.pom.xml``):

    Connect(broker.servers, jars=jdbc_classpath(), settings={...schemas.enable...}).start(
        [debezium_jdbc_sink("sink", target, user=..., password=..., database="bench", table="t", topics=[...], tasks=2)])
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from devtools import jvm
from devtools.jvm import java
from devtools.local_mariadb import MariaDBInstance, free_port

CONNECT_VERSION = "4.1.1"  # Debezium 3.5 is built on Kafka 4.1 (4.4 moved classes it uses)
DEBEZIUM_VERSION = "3.5.0.Final"
CONNECTOR = "debezium-connector-mariadb"
POM = Path(__file__).resolve().parent / "connect" / "pom.xml"
# the JDBC sink's worker: a classpath of its own (jdbc-sink.pom.xml), Debezium's JDBC sink connector and
# MariaDB's JDBC driver (3.5.x: the driver's stable line; 4.0.0 is new)
JDBC_POM = Path(__file__).resolve().parent / "connect" / "jdbc-sink.pom.xml"
MARIADB_JDBC_VERSION = "3.5.6"
STANDALONE_MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"
DEFAULT_HEAP = "1g"

LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
logger.dbz.name = io.debezium
logger.dbz.level = INFO
"""


def cache_dir() -> Path:
    base = os.environ.get("CAPTURER_KAFKA_CACHE") or str(Path.home() / ".cache" / "binlog-capturer")
    return Path(base) / f"connect-{CONNECT_VERSION}-{CONNECTOR}-{DEBEZIUM_VERSION}"


def classpath() -> str:
    """Connect's and the connector's jars (``<cache>/lib/*``), resolved with Maven the first time
    (devtools/jvm.py: a file lock, a checksum stamp). Raises RuntimeError with Maven's error."""
    return jvm.resolve_jars(cache_dir(), POM, {"connect.version": CONNECT_VERSION, "debezium.version": DEBEZIUM_VERSION,
                                                "debezium.connector": CONNECTOR},
                            f"{CONNECTOR}-{DEBEZIUM_VERSION}.jar", "Kafka Connect / Debezium's jars")


def jdbc_cache_dir() -> Path:
    return cache_dir().parent / f"connect-{CONNECT_VERSION}-debezium-connector-jdbc-{DEBEZIUM_VERSION}"


def jdbc_classpath() -> str:
    """Connect's, Debezium's JDBC sink's and MariaDB's driver's jars (as classpath() does)."""
    return jvm.resolve_jars(jdbc_cache_dir(), JDBC_POM, {"connect.version": CONNECT_VERSION,
                                                          "debezium.version": DEBEZIUM_VERSION,
                                                          "mariadb.jdbc.version": MARIADB_JDBC_VERSION},
                            f"debezium-connector-jdbc-{DEBEZIUM_VERSION}.jar", "Debezium's JDBC sink's jars")


def debezium_jdbc_sink(name: str, m: MariaDBInstance, *, user: str, password: str, database: str, table: str,
                       topics: list[str], tasks: int, **extra: str) -> dict[str, str]:
    """Debezium's JDBC sink connector writing ``topics`` (Debezium change events with their schemas: the
    sink reads Debezium's envelope itself, no ExtractNewRecordState) into ``database.table`` of MariaDB
    ``m``: upserts by the record's key, deletes applied, the table made or widened by the sink if needed."""
    cfg = {
        "name": name,
        "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "tasks.max": str(tasks),
        "topics": ",".join(topics),
        "connection.url": f"jdbc:mariadb://127.0.0.1:{m.port}/{database}",
        "connection.username": user,
        "connection.password": password,
        "insert.mode": "upsert",
        "primary.key.mode": "record_key",
        "delete.enabled": "true",
        "schema.evolution": "basic",
        "collection.name.format": table,
    }
    cfg.update(extra)
    return {k: v for k, v in cfg.items() if v != ""}


def unavailable() -> str:
    """Why Connect cannot start here ('' when it can)."""
    try:
        java()
    except RuntimeError as exc:
        return str(exc)
    if not (cache_dir() / "lib" / ".complete").exists() and shutil.which("mvn") is None:
        return "Kafka Connect's jars are not cached and mvn is not on PATH to resolve them"
    return ""


DBZ_USER, DBZ_PASSWORD = "debezium", "dbz-pw"


def grant_debezium(m: MariaDBInstance) -> None:
    """The connector's login on ``m``: a user with a password and the grants Debezium's docs list."""
    m.create_capture_user(DBZ_USER, DBZ_PASSWORD, host="%", more_grants="SHOW DATABASES, REPLICATION CLIENT")


def debezium_mariadb(name: str, m: MariaDBInstance, *, server_id: int, prefix: str, servers: str,
                   tables: str = "bench.t", snapshot_mode: str = "no_data", **extra: str) -> dict[str, str]:
    """A Debezium MariaDB connector's configuration reading MariaDB ``m`` (as the user grant_debezium made).

    ``snapshot_mode``: ``no_data`` records the schema and streams from the binlog's current end; ``never``
    reads the binlog from its first file (the schema from its DDL); ``initial`` snapshots the tables, then
    streams. Topics: ``<prefix>.<db>.<table>``; the schema history
    in ``<prefix>.schema-history`` (Kafka, as in production); schema changes not published."""
    db = tables.split(".", 1)[0]
    cfg = {
        "name": name,
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": str(m.port),
        "database.user": DBZ_USER,
        "database.password": DBZ_PASSWORD,
        "database.server.id": str(server_id),
        "topic.prefix": prefix,
        "database.include.list": db,
        "table.include.list": tables,
        "snapshot.mode": snapshot_mode,
        "include.schema.changes": "false",
        "schema.history.internal.kafka.bootstrap.servers": servers,
        "schema.history.internal.kafka.topic": f"{prefix}.schema-history",
        "decimal.handling.mode": "string",
        "tombstones.on.delete": "false",
    }
    cfg.update(extra)
    return {k: v for k, v in cfg.items() if v != ""}  # (an empty value: a validation NPE in Connect)


class Connect:
    """One Kafka Connect standalone worker (its own JVM) on a free REST port of 127.0.0.1, JSON
    converters without schemas, offsets in a file of its directory."""

    def __init__(self, servers: str, *, heap: str = DEFAULT_HEAP, directory: Path | None = None,
                 settings: dict[str, str] | None = None, jars: str | None = None):
        """``jars``: the classpath (default: classpath(), the MariaDB source connector's)."""
        self.servers = servers
        self.jars = jars
        self.heap = heap
        self.settings = dict(settings or {})
        self._own_dir = directory is None
        self.dir = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="connect-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.cleanup)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    @property
    def log_file(self) -> Path:
        return self.dir / "connect.log"

    def worker_properties(self) -> dict[str, str]:
        p = {
            "bootstrap.servers": self.servers,
            "listeners": f"http://127.0.0.1:{self.port}",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
            "offset.storage.file.filename": str(self.dir / "offsets.dat"),
            "offset.flush.interval.ms": "1000",
            "plugin.discovery": "only_scan",
        }
        p.update(self.settings)
        return p

    def start(self, connectors: list[dict[str, str]], timeout: float = 180) -> Connect:
        """Start the JVM with these connectors and return once each connector and its task are RUNNING.
        Raises RuntimeError with the end of connect.log otherwise (the JVM is killed)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in self.worker_properties().items()))
        (self.dir / "log4j2.properties").write_text(LOG4J2.format(log=self.log_file))
        files = []
        for c in connectors:
            f = self.dir / f"{c['name']}.properties"
            f.write_text("".join(f"{k}={v}\n" for k, v in c.items()))
            files.append(str(f))
        self.proc = jvm.launch(
            [java(), f"-Xms{self.heap}", f"-Xmx{self.heap}", "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError",
             f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}", "-cp", self.jars or classpath(),
             STANDALONE_MAIN, str(self.dir / "worker.properties"), *files], self.log_file)
        deadline = time.monotonic() + timeout
        try:
            for c in connectors:
                self.wait_running(c["name"], deadline)
        except BaseException:
            self.kill()
            raise
        return self

    def status(self, name: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/connectors/{name}/status", timeout=5) as r:
            return dict(json.loads(r.read()))

    def wait_running(self, name: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"Kafka Connect exited at start:\n{self.tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                st = self.status(name)
                states = [st["connector"]["state"]] + [t["state"] for t in st.get("tasks", [])]
                if "FAILED" in states:
                    traces = [t.get("trace", "") for t in st.get("tasks", [])] + [st["connector"].get("trace", "")]
                    raise RuntimeError(f"connector {name} FAILED: {''.join(traces)[:3000]}")
                if st.get("tasks") and all(s == "RUNNING" for s in states):
                    return
            time.sleep(0.25)
        raise RuntimeError(f"connector {name} was not RUNNING in time:\n{self.tail()}")

    def failed(self) -> str:
        """The trace of a connector or task that FAILED since the start ('' when none)."""
        out = []
        for f in self.dir.glob("*.properties"):
            if f.name in ("worker.properties", "log4j2.properties"):
                continue
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                st = self.status(f.stem)
                for t in [st["connector"], *st.get("tasks", [])]:
                    if t.get("state") == "FAILED":
                        out.append(f"{f.stem}: {t.get('trace', '')[:2000]}")
        return "\n".join(out)

    def tail(self, n: int = 4000) -> str:
        return jvm.tail(self.log_file, n)

    def stop(self, timeout: float = 30) -> None:
        jvm.stop(self.proc, timeout)
        self.proc = None

    def kill(self) -> None:
        jvm.kill(self.proc)
        self.proc = None

    def cleanup(self) -> None:
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
