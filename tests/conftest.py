from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings as _hypothesis_settings

# no per-example time limit anywhere (Hypothesis' default is 200 ms): the tests run on busy
# machines, and a slow example is not a failure (a test's own @settings may set other things)
_hypothesis_settings.register_profile("capturer", deadline=None)
_hypothesis_settings.load_profile("capturer")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from devtools import local_mariadb

# the tests' MariaDB servers: a 32 MB redo log (not 96 MB): the few hundred servers a run starts
# each write 64 MB less at their first start; no test's workload comes near filling it
local_mariadb.REDO_LOG_SIZE = "32M"


class _DataDirTemplate:
    """The tests' MariaDB servers start from a copy of one data directory that ``mariadb-install-db`` made
    once per pytest run, instead of running it for each of the few hundred servers a run starts (measured
    2026-11-28: 0.47 s per start + stop instead of 1.05-1.29 s). Only servers with the default settings (no
    ``extra`` options, the same redo log size) get the copy; the others install as before. The copy is the
    same files mariadb-install-db writes (system tables, InnoDB system tablespace, redo log); the binary log
    directory is not copied, so a server starts with its own first binlog file. MARIADB_TEMPLATE=0 turns it off."""

    def __init__(self) -> None:
        self.dir: Path | None = None
        self.redo = ""
        self.failed = False

    def data(self) -> Path | None:
        import atexit
        import shutil
        import subprocess
        import tempfile

        if self.failed or os.environ.get("MARIADB_TEMPLATE") == "0":  # (0: every server installs its own)
            return None
        if self.dir is None or self.redo != local_mariadb.REDO_LOG_SIZE:
            base = Path(tempfile.mkdtemp(prefix="capturer-mariadb-template-"))
            pid = os.getpid()  # (a forked child that exits must not remove it)
            atexit.register(lambda: os.getpid() == pid and shutil.rmtree(base, True))
            tpl = local_mariadb.MariaDBInstance(base / "tpl", server_id=1)
            tpl._write_cnf()
            install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
            res = subprocess.run([install or "mariadb-install-db", f"--defaults-file={tpl.cnf}",
                                  "--auth-root-authentication-method=normal", "--skip-test-db"],
                                 capture_output=True, text=True) if install else None
            if res is None or res.returncode != 0 or not (tpl.basedir / "data" / "mysql").is_dir():
                self.failed = True  # each server installs its own, and says why if that fails too
                return None
            self.dir, self.redo = tpl.basedir / "data", local_mariadb.REDO_LOG_SIZE
        return self.dir


_TEMPLATE = _DataDirTemplate()
_start_once = local_mariadb.MariaDBInstance._start_once


def _start_once_from_template(self: local_mariadb.MariaDBInstance, timeout: float) -> local_mariadb.MariaDBInstance:
    import shutil

    datadir = self.basedir / "data"
    if not self.extra and not datadir.exists():
        tpl = _TEMPLATE.data()
        if tpl is not None:
            shutil.copytree(tpl, datadir, symlinks=True)
    return _start_once(self, timeout)


local_mariadb.MariaDBInstance._start_once = _start_once_from_template  # type: ignore[method-assign]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")
    parser.addoption("--durations-file", default=None, metavar="PATH",
                     help="write every test's setup, call and teardown time (slowest first) and each file's total "
                          "to PATH (tests/run.sh: tests/artifacts/durations.txt)")


class _DurationsFile:
    """Every phase of every test with its time, written at the end of the run: the console shows the slowest
    40 (--durations=40 in pytest.ini), this file shows where all the rest of the time goes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[tuple[float, str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.rows.append((report.duration, report.when, report.nodeid.replace("\n", "\\n")))

    def pytest_sessionfinish(self) -> None:
        per_file: dict[str, float] = {}
        for d, _, nodeid in self.rows:
            f = nodeid.split("::", 1)[0]
            per_file[f] = per_file.get(f, 0.0) + d
        total = sum(per_file.values())
        lines = [f"# {len({n for _, _, n in self.rows})} tests, {total:.1f} s in setup + call + teardown", "",
                 "# per file (setup + call + teardown)"]
        lines += [f"{d:9.2f}s  {f}" for f, d in sorted(per_file.items(), key=lambda x: -x[1])]
        lines += ["", "# per phase, slowest first"]
        lines += [f"{d:9.2f}s {w:<8} {n}" for d, w, n in sorted(self.rows, key=lambda r: -r[0])]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(lines) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--durations-file")
    if path and not hasattr(config, "workerinput"):  # (with pytest-xdist: the controller, which sees every report)
        config.pluginmanager.register(_DurationsFile(Path(path)), "durations-file")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow") or os.environ.get("RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_capturer_left_running():  # type: ignore[no-untyped-def]
    """A test that fails half way may leave a capturer process running: kill it, so
    it cannot hold ports, servers or CPU for the tests after it."""
    from helpers import LIVE_PROCESSES

    before = len(LIVE_PROCESSES)  # (a module fixture's shared capturer was started before this)
    yield
    while len(LIVE_PROCESSES) > before:
        p = LIVE_PROCESSES.pop()
        if p.poll() is None:
            p.kill()
            p.wait()
