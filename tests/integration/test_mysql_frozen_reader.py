"""A reader of the binlog that is alive but frozen (SIGSTOP, a paused VM: with ``[ha]`` the deposed
active) must not hold back the next reader with the same ``server_id``.

MariaDB ends the older dump of a ``server_id`` when a new one starts, but only marks it killed: that
dump stays blocked writing into the frozen reader's full socket (until ``net_write_timeout``, for as long
as the freeze lasts while the peer's TCP stays up) and the new dump waits in ``starting`` meanwhile. In an
HA group under load the standby that took over from a frozen active then captured nothing for 60 s (the
whole wait of the test that found it). The region now ends such a dump (``KILL CONNECTION``) when its own
dump sends nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers import CapturerProcess, read_lines, start_servers, wait_for, write_config

pytestmark = pytest.mark.integration


def rows(tmp: Path) -> int:
    return sum(1 for d in read_lines(tmp) if d["table"] == "t" and d["op"] != "ddl")


def test_a_frozen_reader_with_the_same_server_id_holds_back_no_new_one(tmp_path: Path) -> None:
    m = start_servers(tmp_path, 1)[0]
    a = b = None
    try:
        # the server's own limit far beyond the test's wait: only the capturer can end the frozen dump
        m.execute("SET GLOBAL net_write_timeout = 900", "CREATE DATABASE app",
                  "CREATE TABLE app.t (id INT PRIMARY KEY, v LONGTEXT)")
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        a = CapturerProcess(write_config(tmp_path / "a", [m]), tmp_path / "a.log").start()
        a.wait_ready()
        m.execute("INSERT INTO app.t VALUES (0, 'first')")
        wait_for(lambda: rows(tmp_path / "a") == 1, 60, "the first capturer to stream")
        assert a.proc is not None
        os.kill(a.proc.pid, signal.SIGSTOP)  # frozen: its dump's socket fills up

        stop = threading.Event()
        written = [1]

        def load() -> None:
            c = m.connect()
            c.autocommit(True)
            with c.cursor() as cur:
                while not stop.is_set() and written[0] < 3000:
                    cur.execute("INSERT INTO app.t VALUES (%s, REPEAT('x', 20000))", (written[0],))
                    written[0] += 1
            c.close()

        t = threading.Thread(target=load, daemon=True)
        t.start()
        wait_for(lambda: written[0] > 400, 120, "rows beyond what the frozen reader's socket holds")
        b = CapturerProcess(write_config(tmp_path / "b", [m]), tmp_path / "b.log").start()  # the same server_id
        b.wait_ready()
        t0 = time.monotonic()
        try:
            wait_for(lambda: rows(tmp_path / "b") >= 400, 90,
                     "the new reader to get the rows while the old one is frozen")
        finally:
            stop.set()
            t.join(30)
        took = time.monotonic() - t0
        wait_for(lambda: rows(tmp_path / "b") == written[0], 120, "every row")
        assert "binlog dump of an earlier reader" in b.log.read_text()
        print(f"the new reader streamed {took:.1f} s after its start, the old one still frozen")
        assert b.stop() == 0
    finally:
        for p in (a, b):
            if p is not None and p.proc is not None and p.proc.poll() is None:
                os.kill(p.proc.pid, signal.SIGCONT)
                p.proc.kill()
                p.proc.wait()
        m.stop()
