"""MariaDB binlog compression (``log_bin_compress=ON``; issue 49, item 5).

python-mysql-replication does not read compressed events, and the region used to skip
them as events it did not need: every row written while compression was on was lost
without a word (measured before the fix: 50 inserts, 10 updates, 10 deletes -> one
line in the file, a DDL). Now a server with ``log_bin_compress=ON`` is refused at start
and by ``--check --connect``, naming the setting; and a compressed event met in the
stream (written while it was on, read after it was turned off) stops the region with
an error that says what to do, instead of losing its rows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, CapturerProcess, read_lines, write_config

from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


def test_compressed_binlogs_are_refused_never_skipped(tmp_path: Path) -> None:
    m = MariaDBInstance(tmp_path / "m", server_id=1,
                        extra={"log_bin_compress": "ON", "log_bin_compress_min_len": "10"}).start()
    try:
        m.create_capture_user()
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v TEXT)",
                  *[f"INSERT INTO d.t VALUES ({i}, '{'x' * 200}')" for i in range(20)])
        cfg = write_config(tmp_path, [m])
        r = subprocess.run([sys.executable, "-m", "capturer", "--config", str(cfg), "--check", "--connect"],
                           capture_output=True, text=True, cwd=str(ROOT), timeout=120)
        assert r.returncode == 3 and "log_bin_compress=ON" in r.stderr, r.stdout + r.stderr
        log = tmp_path / "capturer.log"
        p = CapturerProcess(cfg, log).start()
        assert p.proc is not None and p.proc.wait(120) == 1
        assert "log_bin_compress=ON" in log.read_text()

        # turned off, but the events written meanwhile are still compressed: the region stops at the first
        # one, naming what to do; nothing after it is delivered as if the rows had not been there
        m.execute("SET GLOBAL log_bin_compress = OFF", "INSERT INTO d.t VALUES (100, 'after')")
        p = CapturerProcess(cfg, log).start()
        assert p.proc is not None and p.proc.wait(120) == 1
        text = log.read_text()
        assert "a compressed binlog event (type 16" in text and "log_bin_compress" in text, text[-2000:]
        assert not [x for x in read_lines(tmp_path) if x["op"] != "ddl"]  # no row was passed on past a hole
    finally:
        m.stop()
