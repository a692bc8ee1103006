"""Start and stop private PostgreSQL servers with logical decoding on.

Used by the integration tests, the benchmarks and ``sh start.sh --demo``. Each
instance gets its own data directory (``initdb``), a socket directory inside it
and a free TCP port on 127.0.0.1, with ``wal_level = logical``. Nothing here
touches a system-wide PostgreSQL. PostgreSQL refuses to run as root: as root,
the server runs as the ``postgres`` user (Debian's package creates it).
"""

from __future__ import annotations

import glob
import logging
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.model import parse_lsn, wal_record_end
from devtools.local_mariadb import free_port

log = logging.getLogger(__name__)


def committed_lsn(conn: Any) -> int:
    """The end of the last WAL record written, through ``conn`` (psycopg): every commit
    that has returned is below it. Not ``pg_current_wal_lsn()``: these servers run with
    ``synchronous_commit = off``, where that write position can lag a commit that has
    returned (it stopped at a page boundary inside the last transaction, and a wait for
    it passed with that transaction still to come: a flaky test_new_tables failure).
    The insert position at a page's start is after the page's header, which a
    replication stream (that reports record ends) never reaches: taken off."""
    return wal_record_end(parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]))


class PostgresUnavailable(RuntimeError):
    """initdb / postgres cannot be found or started."""


def find_bindir() -> Path:
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if os.path.exists(os.path.join(cand, "postgres")) and os.path.exists(os.path.join(cand, "initdb")):
            return Path(cand)
    which = shutil.which("initdb")
    if which:
        return Path(os.path.realpath(which)).parent
    raise PostgresUnavailable("PostgreSQL's initdb/postgres not found; install it with: apt-get install -y postgresql")


@dataclass
class PostgresInstance:
    """A private PostgreSQL server (superuser ``postgres``, trust auth on 127.0.0.1)."""

    basedir: Path | None = None
    port: int = 0
    wal_level: str = "logical"
    settings: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    user: str = "postgres"

    def __post_init__(self) -> None:
        if self.basedir is None:
            # not under pytest's tmp dir: the postgres user must be able to reach it
            self.basedir = Path(tempfile.mkdtemp(prefix="capturer-pg-"))
        self.basedir = Path(self.basedir)
        self.bindir = find_bindir()

    @property
    def datadir(self) -> Path:
        assert self.basedir is not None
        return self.basedir / "data"

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        return ["runuser", "-u", "postgres", "--", *argv]

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def start(self, timeout: float = 60.0) -> PostgresInstance:
        assert self.basedir is not None
        self.basedir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.basedir, 0o755)
        self._chown(self.basedir)
        if not (self.datadir / "PG_VERSION").exists():
            r = subprocess.run(self._as_owner([str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                                               "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"]),
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise PostgresUnavailable(f"initdb failed: {r.stderr[-2000:]}")
        last = ""
        for _ in range(5):
            port = self.port or free_port()
            opts = {"listen_addresses": "127.0.0.1", "port": str(port), "unix_socket_directories": str(self.basedir),
                    "wal_level": self.wal_level, "max_replication_slots": "20", "max_wal_senders": "20",
                    "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                    "shared_buffers": "64MB", "log_min_messages": "warning", **self.settings}
            argv = [str(self.bindir / "postgres"), "-D", str(self.datadir)]
            for k, v in opts.items():
                argv += ["-c", f"{k}={v}"]
            logf = open(self.basedir / "server.log", "ab")
            self.proc = subprocess.Popen(self._as_owner(argv), stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            logf.close()
            deadline = time.time() + timeout
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    break
                ready = subprocess.run([str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-q"])
                if ready.returncode == 0:
                    self.port = port
                    return self
                time.sleep(0.2)
            last = (self.basedir / "server.log").read_text(errors="replace")[-2000:]
            self.stop()
            if "already in use" not in last and "could not bind" not in last:
                break
            self.port = 0
        raise PostgresUnavailable(f"postgres did not start: {last}")

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster: SIGTERM's smart mode would wait for walsenders)."""
        if self.proc is not None and self.proc.poll() is None:
            pid = self._postmaster_pid()
            try:
                os.kill(pid or self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                if pid:
                    os.kill(pid, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _postmaster_pid(self) -> int:
        try:
            return int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def restart(self) -> None:
        port = self.port
        self.stop()
        self.port = port
        self.start()

    def destroy(self) -> None:
        self.stop()
        if self.basedir is not None:
            shutil.rmtree(self.basedir, ignore_errors=True)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def connect(self, dbname: str = "postgres", autocommit: bool = True) -> Any:
        import psycopg

        return psycopg.connect(self.dsn(dbname), autocommit=autocommit)

    def sql(self, sql: str, dbname: str = "postgres") -> None:
        with self.connect(dbname) as c:
            c.execute(sql)
