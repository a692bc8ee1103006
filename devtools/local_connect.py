"""Kafka Connect standalone with Debezium's MySQL connector: the peer the bench runs beside the capturer.

Apache Kafka Connect |CONNECT_VERSION| (``org.apache.kafka:connect-runtime``) and Debezium
|DEBEZIUM_VERSION| (``io.debezium:debezium-connector-mysql``; ``debezium-connector-mariadb`` is not
served by this machine's Maven mirror, so the MySQL connector reads MariaDB), resolved from Maven Central
by ``devtools/connect/pom.xml`` once into ``~/.cache/binlog-capturer/connect-<v>-debezium-<v>/lib``
(``$CAPTURER_KAFKA_CACHE`` overrides the parent), as ``devtools/local_kafka.py`` does for the broker.
Only jars and configuration files: no code of theirs is in ours.

    c = Connect(broker.servers).start([debezium_mysql("peer0", m, server_id=801, prefix="dbz0", ...)])
    c.pid                     # the Connect JVM (CPU, RSS)
    c.status("peer0")         # the REST API's /connectors/peer0/status
    c.stop()                  # SIGTERM (SIGKILL after a timeout); c.cleanup() deletes its directory too
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from devtools.local_kafka import java
from devtools.local_mariadb import MariaDBInstance, free_port

CONNECT_VERSION = "4.4.0"
DEBEZIUM_VERSION = "3.6.1.Final"
POM = Path(__file__).resolve().parent / "connect" / "pom.xml"
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
    return Path(base) / f"connect-{CONNECT_VERSION}-debezium-{DEBEZIUM_VERSION}"


def classpath() -> str:
    """Connect's and the connector's jars (``<cache>/lib/*``), resolved with Maven the first time (a file
    lock: one process resolves, the others wait). Raises RuntimeError with Maven's error."""
    cache = cache_dir()
    lib = cache / "lib"
    want = hashlib.sha256(POM.read_bytes() + CONNECT_VERSION.encode() + DEBEZIUM_VERSION.encode()).hexdigest()
    stamp = lib / ".complete"
    if stamp.exists() and stamp.read_text().strip() == want:
        return f"{lib}/*"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text().strip() == want:
            return f"{lib}/*"
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("Kafka Connect's jars are resolved with Maven, and mvn is not on PATH")
        tmp = Path(tempfile.mkdtemp(prefix="lib.", dir=cache))
        r = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
                            f"-Dconnect.version={CONNECT_VERSION}", f"-Ddebezium.version={DEBEZIUM_VERSION}",
                            f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0 or not any(tmp.glob(f"debezium-connector-mysql-{DEBEZIUM_VERSION}.jar")):
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"mvn could not resolve Kafka Connect / Debezium's jars:\n{(r.stdout + r.stderr)[-3000:]}")
        shutil.rmtree(lib, ignore_errors=True)
        tmp.rename(lib)
        stamp.write_text(want + "\n")
    return f"{lib}/*"


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
    m.execute(f"CREATE USER IF NOT EXISTS '{DBZ_USER}'@'%' IDENTIFIED BY '{DBZ_PASSWORD}'",
              f"GRANT SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT, BINLOG MONITOR "
              f"ON *.* TO '{DBZ_USER}'@'%'")


def debezium_mysql(name: str, m: MariaDBInstance, *, server_id: int, prefix: str, servers: str,
                   tables: str = "bench.t", snapshot_mode: str = "no_data", **extra: str) -> dict[str, str]:
    """A Debezium MySQL connector's configuration reading MariaDB ``m`` (as the user grant_debezium made).

    ``snapshot_mode``: ``no_data`` records the schema and streams from the binlog's current end (3.6 has no
    ``never``: it answers that value with a config error, which Connect 4.4 turns into a
    NullPointerException); ``initial`` snapshots the tables, then streams. Topics: ``<prefix>.<db>.<table>``; the schema history
    in ``<prefix>.schema-history`` (Kafka, as in production); schema changes not published."""
    db = tables.split(".", 1)[0]
    cfg = {
        "name": name,
        "connector.class": "io.debezium.connector.mysql.MySqlConnector",
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
    return {k: v for k, v in cfg.items() if v != ""}  # (an empty value: Connect 4.4 validation NPE)


class Connect:
    """One Kafka Connect standalone worker (its own JVM) on a free REST port of 127.0.0.1, JSON
    converters without schemas, offsets in a file of its directory."""

    def __init__(self, servers: str, *, heap: str = DEFAULT_HEAP, directory: Path | None = None,
                 settings: dict[str, str] | None = None):
        self.servers = servers
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
        out = open(self.log_file, "ab")
        self.proc = subprocess.Popen(
            [java(), f"-Xms{self.heap}", f"-Xmx{self.heap}", "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError",
             f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}", "-cp", classpath(),
             STANDALONE_MAIN, str(self.dir / "worker.properties"), *files],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
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
        try:
            return self.log_file.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def cleanup(self) -> None:
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
