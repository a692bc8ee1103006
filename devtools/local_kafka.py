"""A private Apache Kafka broker for the demo, the tests and the bench.

Apache Kafka |version| in KRaft mode (no ZooKeeper): one JVM that is broker and controller, on free
ports of 127.0.0.1, its log in a directory of its own. Its jars come from Maven Central: Maven resolves
``devtools/kafka/pom.xml`` (``org.apache.kafka:kafka_2.13``, pinned) once into
``~/.cache/binlog-capturer/kafka-<version>/lib`` (``$CAPTURER_KAFKA_CACHE`` overrides the parent), so a
second start resolves nothing and needs no network. Needs ``java`` (17+) and ``mvn`` on PATH
(``scripts/bootstrap.sh`` installs both where missing with NEED_KAFKA=1).

    b = Broker().start()      # formats the storage, starts the JVM, waits until it answers a metadata request
    b.servers                 # "127.0.0.1:<port>"
    b.stop()                  # SIGTERM: a clean shutdown (its log kept: start() again restarts it)
    b.kill()                  # SIGKILL (its log kept too, recovered at the next start())
    b.cleanup()               # stop and delete its directory (also done at interpreter exit)

    t = make_tls(dir)         # a test CA (openssl) and a broker certificate for 127.0.0.1/localhost
    b = Broker(sasl_ssl=SaslSsl(t, {"alice": "pw"})).start()
    b.secure_servers          # "127.0.0.1:<port>": a SASL_SSL listener (PLAIN and SCRAM-SHA-512 users);
                              # b.servers stays the PLAINTEXT one

    c = Cluster(3).start()    # three nodes, each broker and controller: replication factor 3,
    c.servers                 # min.insync.replicas 2; c.brokers[i].kill()/.start() moves leaders

Until 2026-11-27 this module started Tansu, a Kafka-protocol lookalike (docs/tansu-idempotence.md says
what it taught us); the class keeps the API it had.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from devtools import jvm
from devtools.jvm import java
from devtools.local_mariadb import free_port

KAFKA_VERSION = "4.4.0"
POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
BROKER_MAIN = "kafka.Kafka"  # core (kafka_2.13): the server, given a server.properties
STORAGE_MAIN = "kafka.tools.StorageTool"  # core: `format` writes meta.properties and the bootstrap checkpoint
JVM_OPTS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
            "-XX:+ExitOnOutOfMemoryError"]

LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


def cache_dir() -> Path:
    """Where the jars of KAFKA_VERSION live (created on first use)."""
    base = os.environ.get("CAPTURER_KAFKA_CACHE") or str(Path.home() / ".cache" / "binlog-capturer")
    return Path(base) / f"kafka-{KAFKA_VERSION}"


def classpath() -> str:
    """The broker's classpath (``<cache>/lib/*``), resolving the jars with Maven the first time
    (devtools/jvm.py: a file lock, a checksum stamp). Raises RuntimeError naming what is missing (java,
    mvn) or Maven's own error."""
    return jvm.resolve_jars(cache_dir(), POM, {"kafka.version": KAFKA_VERSION}, f"kafka_2.13-{KAFKA_VERSION}.jar",
                            f"Apache Kafka {KAFKA_VERSION}'s jars",
                            " (apt-get install maven, or run scripts/bootstrap.sh with NEED_KAFKA=1)")


def unavailable() -> str:
    """Why a broker cannot start here ('' when it can): no Java runtime, or neither cached jars nor mvn."""
    try:
        java()
    except RuntimeError as exc:
        return str(exc)
    stamp = cache_dir() / "lib" / ".complete"
    if not stamp.exists() and shutil.which("mvn") is None:
        return ("Apache Kafka's jars are not cached and mvn is not on PATH to resolve them "
                "(apt-get install maven)")
    return ""


def new_cluster_id() -> str:
    """A random cluster id as kafka-storage wants it (a UUID, URL-safe base64, no padding), never one
    that starts with "-" (kafka-storage would take it for an option, as Kafka's own Uuid avoids)."""
    import base64

    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> int:
    """Send one Metadata request (v4, no topics) and return how many brokers the answer lists.

    Raises OSError when nothing answers or the answer is cut short. A broker answers only once it
    processes requests (KRaft: after it caught up with the controller's metadata), which is when it is
    ready for clients."""
    body = struct.pack(">hhi", 3, 4, 1) + _str("local_kafka") + struct.pack(">i?", 0, False)
    with socket.create_connection((host, port), timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(body)) + body)
        head = _recv(s, 4)
        data = _recv(s, struct.unpack(">i", head)[0])
    _corr, _throttle, n = struct.unpack(">iii", data[:12])
    return int(n)


def _recv(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed mid-answer")
        buf += chunk
    return buf


@dataclass(frozen=True)
class Tls:
    """Files of a test CA and of a broker certificate it signed (see make_tls)."""

    dir: Path
    ca: Path  # the CA's certificate (PEM): a client's ssl_ca
    ca_key: Path
    keystore: Path  # the broker's private key (PKCS#8) and certificate in one PEM file (ssl.keystore.type=PEM)


def make_tls(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), days: int = 2) -> Tls:
    """A self-signed CA and a broker certificate it signed for ``hosts`` (IP addresses and DNS names
    in its subjectAltName), made with the ``openssl`` CLI in ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is not on PATH (apt-get install openssl)")

    def run(*args: str) -> None:
        r = subprocess.run([openssl, *args], cwd=d, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {r.stderr[-1500:]}")

    san = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts)
    (d / "san.ext").write_text(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n")
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", str(days),
        "-subj", "/CN=capturer test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", f"/CN={hosts[0]}")
    run("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "broker.crt", "-days", str(days), "-extfile", "san.ext")
    run("pkcs8", "-topk8", "-nocrypt", "-in", "broker.key", "-out", "broker.p8")  # Kafka's PEM keystore: PKCS#8
    keystore = d / "broker-keystore.pem"
    keystore.write_text((d / "broker.p8").read_text() + (d / "broker.crt").read_text())
    return Tls(d, d / "ca.pem", d / "ca.key", keystore)


@dataclass(frozen=True)
class SaslSsl:
    """A SASL_SSL listener: TLS with ``tls``'s broker certificate; ``users`` (name -> password) may log
    in with PLAIN and with SCRAM-SHA-512 (the SCRAM credentials are written at format time)."""

    tls: Tls
    users: dict[str, str] = field(default_factory=dict)


class Broker:
    """One Apache Kafka broker (KRaft, broker and controller in one JVM) on 127.0.0.1.

    ``port`` is the client listener (0: a free one); the controller listener gets a free port too. Both
    stay the same across stop()/start(), so clients reconnect to a restarted broker. ``partitions`` is
    ``num.partitions`` (topics created by auto-creation or without a count); ``auto_create`` is
    ``auto.create.topics.enable``. ``settings`` adds or overrides server.properties lines. ``directory``
    (default: a new temporary one, deleted at cleanup() or at exit) holds the log, server.properties and
    ``broker.log`` (the JVM's output and the broker's warnings). ``sasl_ssl`` adds a SASL_SSL listener
    on ``secure_port`` (``secure_servers``); the PLAINTEXT one stays (readiness, and tests' own checks)."""

    def __init__(self, port: int = 0, *, partitions: int = 1, auto_create: bool = True,
                 settings: dict[str, str] | None = None, directory: Path | None = None,
                 node_id: int = 1, controller_port: int = 0, voters: str = "", cluster_id: str = "",
                 sasl_ssl: SaslSsl | None = None):
        self._fixed_port = bool(port)
        self.port = port or free_port()
        self.sasl_ssl = sasl_ssl
        self.secure_port = free_port() if sasl_ssl is not None else 0
        self.controller_port = controller_port or free_port()
        # a member of a Cluster: its node id, the quorum's voters ("1@host:port,...") and the shared id
        self.node_id = node_id
        self.voters = voters
        self.cluster_id = cluster_id or new_cluster_id()
        self.partitions = partitions
        self.auto_create = auto_create
        self.settings = dict(settings or {})
        self._own_dir = directory is None
        self.dir = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="kafka-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_seconds: list[float] = []  # how long each start() took, until the broker answered
        atexit.register(self.cleanup)

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secure_servers(self) -> str:
        """The SASL_SSL listener (a Broker made with ``sasl_ssl``)."""
        if self.sasl_ssl is None:
            raise RuntimeError("this broker has no SASL_SSL listener (Broker(sasl_ssl=...))")
        return f"127.0.0.1:{self.secure_port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "broker.log"

    def properties(self) -> dict[str, str]:
        """server.properties: one node, fast start-up, replication of internal topics 1."""
        p = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters or f"{self.node_id}@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            "num.partitions": str(self.partitions),
            "auto.create.topics.enable": str(self.auto_create).lower(),
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            # a restart after kill -9 waits for the old registration's session to lapse (9 s by default)
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "4000",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "2",
            "log.segment.bytes": str(256 * 1024 * 1024),
        }
        if self.sasl_ssl is not None:
            t, users = self.sasl_ssl.tls, self.sasl_ssl.users
            p["listeners"] += f",SASL_SSL://127.0.0.1:{self.secure_port}"
            p["advertised.listeners"] += f",SASL_SSL://127.0.0.1:{self.secure_port}"
            p["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL"
            plain = " ".join(f'user_{u}="{pw}"' for u, pw in users.items())
            p.update({
                "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
                "listener.name.sasl_ssl.plain.sasl.jaas.config":
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
                "listener.name.sasl_ssl.ssl.keystore.location": str(t.keystore),
                "listener.name.sasl_ssl.ssl.client.auth": "none",
            })
        p.update(self.settings)
        return p

    def _format(self) -> None:
        """Write server.properties and format the storage, once per directory (a restart keeps the log)."""
        (self.dir / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (self.dir / "log4j2.properties").write_text(LOG4J2.format(log=self.log_file))
        if (self.dir / "data" / "meta.properties").exists():
            return
        r = subprocess.run([java(), *JVM_OPTS, "-cp", classpath(),
                            f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                            STORAGE_MAIN, "format", "-t", self.cluster_id, "-c", str(self.dir / "server.properties"),
                            *self._scram_args()],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed: {(r.stdout + r.stderr)[-2000:]}")

    def _scram_args(self) -> list[str]:
        """``--add-scram`` for each SASL_SSL user (SCRAM-SHA-512 credentials in the bootstrap metadata)."""
        if self.sasl_ssl is None:
            return []
        return [a for u, pw in self.sasl_ssl.users.items()
                for a in ("--add-scram", f"SCRAM-SHA-512=[name={u},password={pw}]")]

    def start(self, timeout: float = 120) -> Broker:
        """Start the JVM (formatting the storage the first time) and return once the broker answers a
        metadata request listing itself. Raises RuntimeError with the end of broker.log when it exits or
        does not answer within ``timeout`` seconds."""
        t0 = time.monotonic()
        self.launch()
        return self.wait_ready(t0 + timeout, t0)

    def launch(self) -> None:
        """Format the storage the first time and start the JVM; do not wait (see wait_ready)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._format()
        self.proc = jvm.launch(
            [java(), *JVM_OPTS, "-cp", classpath(), f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
             BROKER_MAIN, str(self.dir / "server.properties")], self.log_file)

    def wait_ready(self, deadline: float, t0: float | None = None) -> Broker:
        """Return once the launched broker answers a metadata request (see start)."""
        t0 = time.monotonic() if t0 is None else t0
        while time.monotonic() < deadline:
            if self.proc is None:
                raise RuntimeError("Apache Kafka was not launched")
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.proc = None
                if not self.start_seconds and not self.voters and "Address already in use" in self._tail():
                    # a port picked for it was taken meanwhile: new ones (a first start only)
                    if not self._fixed_port:
                        self.port = free_port()
                    self.controller_port = free_port()
                    if self.sasl_ssl is not None:
                        self.secure_port = free_port()
                    self.launch()
                    continue
                raise RuntimeError(f"Apache Kafka exited with {rc} at start:\n{self._tail()}")
            try:
                if metadata_brokers("127.0.0.1", self.port) > 0:
                    self.start_seconds.append(time.monotonic() - t0)
                    return self
            except (OSError, struct.error):
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"Apache Kafka did not answer on {self.servers} in {time.monotonic() - t0:.0f} s:\n"
                           f"{self._tail()}")

    def _tail(self, n: int = 4000) -> str:
        return jvm.tail(self.log_file, n)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM and wait for a clean shutdown (SIGKILL after ``timeout`` seconds). The log stays."""
        jvm.stop(self.proc, timeout)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL (as kill -9). The log stays; the next start() recovers it."""
        jvm.kill(self.proc)
        self.proc = None

    def cleanup(self) -> None:
        """Kill the broker and delete its directory (when this object made it)."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """``n`` Apache Kafka nodes on 127.0.0.1, each a broker and a controller (a KRaft quorum of ``n``),
    for tests that need leader changes: replication factor min(3, n) for new and internal topics,
    ``min.insync.replicas`` min(2, n). ``brokers[i]`` is node i + 1, a Broker (stop, kill and start one
    to move its partitions' leadership to the others; ``node``: a Broker subclass to make them of).
    ``servers`` lists every node."""

    def __init__(self, n: int = 3, *, partitions: int = 3, auto_create: bool = True,
                 settings: dict[str, str] | None = None, node: type[Broker] = Broker):
        ports = [free_port() for _ in range(n)]
        cports = [free_port() for _ in range(n)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, c in enumerate(cports))
        rf, isr = str(min(3, n)), str(min(2, n))
        common = {"default.replication.factor": rf, "min.insync.replicas": isr,
                  "offsets.topic.replication.factor": rf, "transaction.state.log.replication.factor": rf,
                  "transaction.state.log.min.isr": isr, "share.coordinator.state.topic.replication.factor": rf,
                  "share.coordinator.state.topic.min.isr": isr, **(settings or {})}
        cid = new_cluster_id()
        self.brokers = [node(ports[i], partitions=partitions, auto_create=auto_create, settings=common,
                               node_id=i + 1, controller_port=cports[i], voters=voters, cluster_id=cid)
                        for i in range(n)]

    @property
    def servers(self) -> str:
        return ",".join(b.servers for b in self.brokers)

    def start(self, timeout: float = 180) -> Cluster:
        """Start every node at once (a quorum forms only when a majority runs) and return once each
        answers and the metadata lists all of them."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        for b in self.brokers:
            b.launch()
        for b in self.brokers:
            b.wait_ready(deadline, t0)
        while metadata_brokers("127.0.0.1", self.brokers[0].port) < len(self.brokers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not list {len(self.brokers)} brokers in {timeout:.0f} s")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        for b in self.brokers:
            b.stop()

    def kill(self) -> None:
        for b in self.brokers:
            b.kill()

    def cleanup(self) -> None:
        for b in self.brokers:
            b.cleanup()


def main() -> int:
    """``python -m devtools.local_kafka [--fetch]``: resolve the jars (--fetch), or run a broker until Ctrl-C."""
    import sys

    if "--fetch" in sys.argv[1:]:
        print(classpath())
        return 0
    b = Broker().start()
    print(f"Apache Kafka {KAFKA_VERSION} on {b.servers} (log: {b.log_file}); Ctrl-C stops it", flush=True)
    try:
        while b.proc is not None and b.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()
        b.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
