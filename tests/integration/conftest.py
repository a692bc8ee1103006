from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import start_servers

from capturer.app import Capturer, load_config
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[list[MariaDBInstance]]:
    servers = start_servers(tmp_path, 2)
    yield servers
    for m in servers:
        m.stop()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[MariaDBInstance]:
    """A MariaDB target (no binlog) for the MySQL sender."""
    m = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    yield m
    m.stop()


@contextlib.contextmanager
def running(cfg_path: Path) -> Iterator[Capturer]:
    """The capturer in-process, in a thread, stopped cleanly on exit."""
    cap = Capturer(load_config(cfg_path))
    stop = threading.Event()
    result: dict[str, int] = {}
    cap.start()
    t = threading.Thread(target=lambda: result.setdefault("code", cap.run(should_stop=stop)))
    t.start()
    try:
        yield cap
    finally:
        stop.set()
        t.join(60)
    assert result.get("code") == 0, f"capturer exited with {result.get('code')}: {cap.failure}"


@pytest.fixture
def capturer_running():  # type: ignore[no-untyped-def]
    return running
