"""MariaDB primary failover without a re-snapshot (issue 49, item 1).

A primary (server_id 1) and a GTID replica (server_id 2, ``log_slave_updates=ON``,
``gtid_strict_mode=ON``, ``read_only=ON``, replicating with ``MASTER_USE_GTID=slave_pos``);
the region names the replica (``replicas = ...``). Writes go to two replication domains
(0 and 1), so the region's GTID position has two entries. The primary is killed with
``kill -9`` while the capturer reads, the replica promoted (``STOP SLAVE; RESET SLAVE ALL;
SET GLOBAL read_only=OFF``) and written to; the region finds it and goes on after its GTID
position: the file sender's lines replayed equal the new primary's tables, no change twice,
each key's changes in order, and the MySQL sender's target equals them; a restart with the old
primary still gone reads the new one from the checkpoint's own file:pos. A replica that was behind (its SQL thread stopped before the
last writes) stops the region with an error naming the region, the server and the GTIDs; with
``snapshot = when_needed`` (and writes to it after its promotion, which take the sequence
numbers the region read from the old primary) the region copies the tables again from it.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, CapturerProcess, read_lines, wait_for, write_config

from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration

_GTID = {"gtid_strict_mode": "ON", "log_slave_updates": "ON", "gtid_domain_id": "0"}


def _pair(tmp: Path) -> tuple[MariaDBInstance, MariaDBInstance]:
    primary = MariaDBInstance(tmp / "primary", server_id=1, extra=dict(_GTID)).start()
    replica = MariaDBInstance(tmp / "replica", server_id=2, extra={**_GTID, "read_only": "ON"}).start()
    replica.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, MASTER_USER='root', "
                    "MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1", "START SLAVE")
    primary.create_capture_user()
    primary.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, n INT NOT NULL, pad TEXT)",
                    "CREATE TABLE d.u (id INT PRIMARY KEY, n INT NOT NULL, pad TEXT)")
    return primary, replica


def _one(m: MariaDBInstance, sql: str) -> Any:
    conn = m.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            row = cur.fetchone()
            return row[0] if row else None
    finally:
        conn.close()


def _catch_up(replica: MariaDBInstance, primary: MariaDBInstance) -> None:
    pos = _one(primary, "SELECT @@GLOBAL.gtid_binlog_pos")
    assert _one(replica, f"SELECT MASTER_GTID_WAIT('{pos}', 30)") == 0, "the replica did not catch up"


def _write(m: MariaDBInstance, start: int, count: int, ids: int = 20, pad: int = 0, base: int = 0) -> None:
    """``count`` transactions from number ``start`` on: each bumps one key's n (inserting it the first
    time) and sets its pad to ``pad`` bytes, alternately in domain 0 (table t) and domain 1 (table u); keys
    from ``base`` on."""
    conn = m.connect()
    try:
        with conn.cursor() as cur:
            for k in range(start, start + count):
                table, domain = ("t", 0) if k % 2 == 0 else ("u", 1)
                cur.execute(f"SET SESSION gtid_domain_id = {domain}")
                cur.execute(f"INSERT INTO d.{table} VALUES ({base + k % ids}, 1, REPEAT('{k % 10}', {pad})) "
                            f"ON DUPLICATE KEY UPDATE n = n + 1, pad = REPEAT('{k % 10}', {pad})")
    finally:
        conn.close()


def _replay(lines: list[dict[str, Any]]) -> tuple[dict[tuple[str, int], int], list[str]]:
    """The tables as the lines leave them, and what is wrong with the lines: a change twice, or a key's n
    not going up by one from line to line (order per key)."""
    rows: dict[tuple[str, int], int] = {}
    problems: list[str] = []
    seen = Counter(json.dumps([x["table"], x["op"], x["before"], x["after"]]) for x in lines if x["op"] != "ddl")
    problems += [f"twice: {k}" for k, c in seen.items() if c > 1]
    for x in lines:
        if x["op"] == "ddl" or x["db"] != "d":
            continue
        img = x["after"] or x["before"]
        key = (x["table"], int(img["id"]))
        if x["op"] == "delete":
            rows.pop(key, None)
            continue
        want = rows.get(key, 0) + 1
        if int(x["after"]["n"]) != want:
            problems.append(f"{key}: n={x['after']['n']} after {rows.get(key)}")
        rows[key] = int(x["after"]["n"])
    return rows, problems


def _source(m: MariaDBInstance) -> dict[tuple[str, int], int]:
    conn = m.connect()
    try:
        with conn.cursor() as cur:
            out = {}
            for t in ("t", "u"):
                cur.execute(f"SELECT id, n FROM d.{t}")
                out.update({(t, int(i)): int(n) for i, n in cur.fetchall()})
            return out
    finally:
        conn.close()


def _status(log: Path) -> dict[str, Any]:
    m = re.search(r"status on http://([^:/]+):(\d+)/status", log.read_text())
    assert m is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{m.group(2)}/status", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _promote(m: MariaDBInstance) -> None:
    m.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF")


def test_the_region_follows_a_promoted_replica(tmp_path: Path) -> None:
    primary, replica = _pair(tmp_path)
    target = MariaDBInstance(tmp_path / "target", server_id=9).start()
    try:
        senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")
        cfg = write_config(tmp_path, [primary], senders=senders, region_extra=f"replicas = 127.0.0.1:{replica.port}\n")
        log = tmp_path / "capturer.log"
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        _write(primary, 0, 500)
        wait_for(lambda: _replay(read_lines(tmp_path))[0] == _source(primary), 60, "the capturer to catch up")
        # the capturer frozen while 1000 transactions of 2 x 8 KB images (16 MB of binlog) are written: more
        # than its socket takes in while it does not read, so the primary dies in the middle of sending them
        assert p.proc is not None
        p.proc.send_signal(signal.SIGSTOP)
        try:
            _write(primary, 500, 1000, pad=8000)
            _catch_up(replica, primary)
            last = _one(primary, "SELECT @@GLOBAL.gtid_binlog_pos")
            primary.kill()  # kill -9
            t0 = time.monotonic()
            _promote(replica)
        finally:
            p.proc.send_signal(signal.SIGCONT)
        _write(replica, 1500, 500)
        replica.execute("SET SESSION gtid_domain_id = 1", "DELETE FROM d.u WHERE id IN (1, 3)")
        want = _source(replica)
        wait_for(lambda: _replay(read_lines(tmp_path))[0] == want, 60, "the output to equal the new primary")
        followed = time.monotonic() - t0
        rows, problems = _replay(read_lines(tmp_path))
        assert not problems, problems[:10]
        st = _status(log)["regions"]["r1"]
        assert st["server"] == f"127.0.0.1:{replica.port}" and st["failovers"] == 1, st
        assert st["failover_history"][0]["to"].startswith(f"127.0.0.1:{replica.port}"), st
        assert re.fullmatch(r"0-2-\d+,1-2-\d+", st["gtid"]), st  # both domains, written by the new primary last
        at = st["failover_history"][0]["gtid"]
        assert at != last, (at, last)  # the failover was in the middle of the stream
        text = log.read_text()
        assert "failover: reading 127.0.0.1" in text
        wait_for(lambda: _source(target) == want, 60, "the MySQL target to equal the new primary")
        print(f"failover at GTID {at} (the old primary had written up to {last}); {len(rows)} keys, "
              f"{len(read_lines(tmp_path))} lines; kill -> output equal {followed:.1f}s; region gtid {st['gtid']}")
        assert p.stop() == 0

        # a restart while the old primary is gone: the checkpoint's file:pos is the new primary's own
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        _write(replica, 2000, 100, base=100)  # (other keys: 1 and 3 were deleted, their lines would repeat)
        want = _source(replica)
        wait_for(lambda: _replay(read_lines(tmp_path))[0] == want and _source(target) == want, 60,
                 "the output to equal the new primary after a restart")
        assert not _replay(read_lines(tmp_path))[1]
        st = _status(log)["regions"]["r1"]
        assert st["server"] == f"127.0.0.1:{replica.port}" and st["failovers"] == 0, st
        # (from the new primary's own file:pos: its binlog holds the checkpoint's GTIDs right there)
        assert re.findall(r"reading from (\S+)", log.read_text())[-1].startswith("mariadb-bin."), log.read_text()[-3000:]
        assert p.stop() == 0
    finally:
        primary.kill()
        replica.stop()
        target.stop()


def test_a_replica_that_was_behind_stops_the_region_with_what_to_do(tmp_path: Path) -> None:
    primary, replica = _pair(tmp_path)
    try:
        cfg = write_config(tmp_path, [primary], region_extra=f"replicas = 127.0.0.1:{replica.port}\n")
        log = tmp_path / "capturer.log"
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        _write(primary, 0, 100)
        _catch_up(replica, primary)
        replica.execute("STOP SLAVE SQL_THREAD")
        _write(primary, 100, 20)
        want = _source(primary)
        wait_for(lambda: _replay(read_lines(tmp_path))[0] == want, 60, "the capturer to read the last writes")
        ours = _one(primary, "SELECT @@GLOBAL.gtid_binlog_pos")
        primary.kill()
        _promote(replica)
        theirs = _one(replica, "SELECT @@GLOBAL.gtid_binlog_pos")
        assert p.proc is not None and p.proc.wait(60) == 1
        text = log.read_text()
        err = next(line for line in text.splitlines() if "does not hold the region's GTID position" in line)
        assert "region r1" in err and f"127.0.0.1:{replica.port}" in err, err
        assert ours in err and theirs in err and "snapshot = when_needed" in err, err
        assert len([x for x in read_lines(tmp_path) if x["op"] != "ddl"]) == sum(want.values())  # nothing more
        # --check --connect finds the primary among the servers and says the same
        r = subprocess.run([sys.executable, "-m", "capturer", "--config", str(cfg), "--check", "--connect"],
                           capture_output=True, text=True, cwd=str(ROOT), timeout=120)
        assert r.returncode == 3 and "does not hold the region's GTID position" in r.stderr, r.stdout + r.stderr
        assert f"127.0.0.1:{replica.port}" in r.stderr and ours in r.stderr, r.stderr
    finally:
        primary.kill()
        replica.stop()


def _final(lines: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """The tables as the lines leave them, a TRUNCATE included (a copy made again)."""
    rows: dict[tuple[str, int], int] = {}
    for x in lines:
        if x["op"] == "ddl":
            if x["sql"].upper().startswith("TRUNCATE") and x["db"] == "d":
                rows = {k: v for k, v in rows.items() if k[0] != x["table"]}
            continue
        if x["db"] != "d":
            continue
        img = x["after"] or x["before"]
        key = (x["table"], int(img["id"]))
        if x["op"] == "delete":
            rows.pop(key, None)
        else:
            rows[key] = int(x["after"]["n"])
    return rows


def test_snapshot_when_needed_takes_over_from_a_replica_that_was_behind(tmp_path: Path) -> None:
    primary, replica = _pair(tmp_path)
    try:
        cfg = write_config(tmp_path, [primary], filter_text="include d.*\n",
                           region_extra=f"replicas = 127.0.0.1:{replica.port}\nsnapshot = when_needed\n")
        log = tmp_path / "capturer.log"
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        _write(primary, 0, 100)
        _catch_up(replica, primary)
        replica.execute("STOP SLAVE SQL_THREAD")
        _write(primary, 100, 20)
        wait_for(lambda: _final(read_lines(tmp_path)) == _source(primary), 60, "the capturer to read the last writes")
        primary.kill()
        _promote(replica)
        assert _source(replica) != _final(read_lines(tmp_path))  # it misses what the region passed on last
        _write(replica, 120, 50)
        want = _source(replica)
        wait_for(lambda: _final(read_lines(tmp_path)) == want, 60, "the output to equal the new primary")
        text = log.read_text()
        assert "does not hold the region's GTID position" in text and "snapshot=when_needed: copying" in text
        assert p.stop() == 0
    finally:
        primary.kill()
        replica.stop()
