from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from devtools import local_mariadb

# the tests' MariaDB servers: a 32 MB redo log (not 96 MB): the few hundred servers a run starts
# each write 64 MB less at their first start; no test's workload comes near filling it
local_mariadb.REDO_LOG_SIZE = "32M"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


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
