"""Start and stop private MariaDB servers with the binlog on.

Used by ``sh start.sh --demo``, the integration tests and the benchmarks. Each
instance gets its own data dir, socket and a free TCP port on 127.0.0.1, and is
configured the way the capturer needs a source to be (ROW format, FULL row
image, FULL row metadata). Nothing here touches a system-wide MariaDB.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pymysql

log = logging.getLogger(__name__)

_SBIN_CANDIDATES = ("/usr/sbin/mariadbd", "/usr/bin/mariadbd", "/usr/sbin/mysqld")


class MariaDBUnavailable(RuntimeError):
    """mariadbd / mariadb-install-db cannot be found or started."""


class _PortTaken(Exception):
    """mariadbd could not bind its port: somebody took it after we chose it."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free TCP port on 127.0.0.1 *below* the kernel's ephemeral range.

    A port from bind(0) comes out of the ephemeral range, where any outgoing
    connection or listener (Spark and py4j open many) can take it in the seconds
    before the server we picked it for binds it. Below that range only another
    explicit choice can collide, and ``MariaDBInstance.start`` retries that case.
    """
    hi = min(_ephemeral_low(), 65535)
    lo = max(1024, hi - 12000)
    for _ in range(200):
        port = random.randrange(lo, hi)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_mariadbd() -> str:
    for cand in (shutil.which("mariadbd"), *_SBIN_CANDIDATES):
        if cand and os.path.exists(cand):
            return cand
    raise MariaDBUnavailable(
        "mariadbd not found; install it with: apt-get install -y mariadb-server"
    )


# InnoDB's redo log size: 96M for the demo and the benchmarks; the tests set a smaller one
# (tests/conftest.py: each of the few hundred servers of a run then writes 64 MB less at its first start)
REDO_LOG_SIZE = "96M"


@dataclass
class MariaDBInstance:
    """A private MariaDB server. ``start()`` initialises the data dir on first use."""

    basedir: Path
    server_id: int = 1
    port: int = 0
    binlog: bool = True
    extra: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def cnf(self) -> Path:
        return self.basedir / "my.cnf"

    @property
    def socket_path(self) -> Path:
        # unix socket paths are limited to ~107 bytes; keep it short and unique
        return Path("/tmp") / f"capt-{os.getpid()}-{self.port}.sock"

    def _write_cnf(self) -> None:
        self.basedir.mkdir(parents=True, exist_ok=True)
        # a temporary directory of its own: in the shared /tmp another process removed an information_schema
        # query's temporary table under it (error 6, "Error on delete of '/tmp/#sql-temptable-...'")
        (self.basedir / "tmp").mkdir(exist_ok=True)
        opts: dict[str, str] = {
            "datadir": str(self.basedir / "data"),
            "tmpdir": str(self.basedir / "tmp"),
            "socket": str(self.socket_path),
            "pid-file": str(self.basedir / "mariadbd.pid"),
            "bind-address": "127.0.0.1",
            "port": str(self.port),
            "server_id": str(self.server_id),
            "character-set-server": "utf8mb4",
            "collation-server": "utf8mb4_general_ci",
            "log_error": str(self.basedir / "error.log"),
            "innodb_buffer_pool_size": "128M",
            "innodb_log_file_size": REDO_LOG_SIZE,
            "innodb_flush_log_at_trx_commit": "2",
            "sync_binlog": "0",
            "skip-name-resolve": "1",
            "max_connections": "200",
            "max_allowed_packet": "256M",
            "performance_schema": "0",
        }
        if self.binlog:
            opts.update(
                {
                    "log_bin": str(self.basedir / "binlog" / "mariadb-bin"),
                    "binlog_format": "ROW",
                    "binlog_row_image": "FULL",
                    "binlog_row_metadata": "FULL",
                    "max_binlog_size": "64M",
                }
            )
        opts.update(self.extra)
        if os.geteuid() == 0:
            opts["user"] = "root"
        lines = ["[mariadbd]"] + [f"{k}={v}" for k, v in opts.items()]
        lines += ["[client]", f"socket={self.socket_path}", f"port={self.port}", "host=127.0.0.1"]
        self.cnf.write_text("\n".join(lines) + "\n")
        (self.basedir / "binlog").mkdir(exist_ok=True)

    def start(self, timeout: float = 60.0) -> MariaDBInstance:
        """Start the server; with no fixed port, retry on a new one if the chosen port was taken."""
        fixed = bool(self.port)
        for attempt in range(5):
            if not fixed:
                self.port = free_port()
            try:
                return self._start_once(timeout)
            except _PortTaken:
                if fixed or attempt == 4:
                    raise MariaDBUnavailable(f"port {self.port} is in use; see {self.basedir / 'error.log'}") from None
                log.info("port %d was taken before mariadbd bound it; retrying on another", self.port)
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> MariaDBInstance:
        mariadbd = find_mariadbd()
        self._write_cnf()
        datadir = self.basedir / "data"
        if not (datadir / "mysql").exists():
            install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
            if not install:
                raise MariaDBUnavailable(
                    "mariadb-install-db not found; apt-get install -y mariadb-server"
                )
            for attempt in range(2):
                res = subprocess.run(
                    [
                        install,
                        f"--defaults-file={self.cnf}",
                        "--auth-root-authentication-method=normal",
                        "--skip-test-db",
                    ],
                    capture_output=True,
                    text=True,
                )
                if res.returncode == 0:
                    break
                errlog = self.basedir / "error.log"
                tail = errlog.read_text(errors="replace")[-3000:] if errlog.exists() else ""
                if attempt == 1:
                    raise MariaDBUnavailable(f"mariadb-install-db failed:\n{res.stdout}\n{res.stderr}\n"
                                             f"error.log:\n{tail}")
                # (seen once in a full run on a loaded machine, its log lost with the run: tried once more from
                # an empty data directory, the first failure's log kept in the error)
                log.warning("mariadb-install-db failed in %s; trying again:\n%s", datadir, tail)
                shutil.rmtree(datadir, ignore_errors=True)
        errlog = self.basedir / "error.log"
        err_from = errlog.stat().st_size if errlog.exists() else 0
        out = open(self.basedir / "stdout.log", "ab")
        self.proc = subprocess.Popen(
            [mariadbd, f"--defaults-file={self.cnf}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        deadline = time.monotonic() + timeout
        last_err: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code, self.proc = self.proc.returncode, None
                try:
                    with open(errlog, "rb") as f:
                        f.seek(err_from)
                        tail = f.read().decode("utf-8", "replace")
                except OSError:
                    tail = ""
                if "Address already in use" in tail or "Do you already have another" in tail:
                    raise _PortTaken()
                raise MariaDBUnavailable(f"mariadbd exited with {code}; see {errlog}")
            try:
                # short timeouts: whatever answers on the port must greet like *our* server
                conn = self.connect(connect_timeout=2, read_timeout=5, write_timeout=5)
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT @@datadir")
                        got = str(cur.fetchone()[0]).rstrip("/")
                finally:
                    conn.close()
                if Path(got).resolve() == datadir.resolve():
                    return self
                last_err = MariaDBUnavailable(f"port {self.port} answers with another server (datadir {got})")
                time.sleep(0.2)
            except (pymysql.err.MySQLError, OSError) as exc:
                last_err = exc
                time.sleep(0.2)
        self.stop()
        raise MariaDBUnavailable(f"mariadbd did not accept connections in {timeout}s: {last_err}")

    def connect(self, db: str | None = None, **kw: object) -> pymysql.connections.Connection:
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            password="",
            database=db,
            charset="utf8mb4",
            autocommit=True,
            **kw,
        )

    def execute(self, *sql: str) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for stmt in sql:
                    cur.execute(stmt)
        finally:
            conn.close()

    def master_position(self) -> tuple[str, int]:
        """(binlog file, position) the server will write next: SHOW MASTER STATUS."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                row = cur.fetchone()
                return str(row[0]), int(row[1])
        finally:
            conn.close()

    def create_capture_user(self, user: str = "capturer", password: str = "capturer", host: str = "127.0.0.1",
                            more_grants: str = "") -> None:
        """A login that reads the binlog and the tables (``more_grants``: more privileges, comma-separated)."""
        self.execute(
            f"CREATE USER IF NOT EXISTS '{user}'@'{host}' IDENTIFIED BY '{password}'",
            f"GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT, RELOAD{', ' + more_grants if more_grants else ''} "
            f"ON *.* TO '{user}'@'{host}'",
        )

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
