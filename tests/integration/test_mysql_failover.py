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


def _tables(m: MariaDBInstance) -> dict[tuple[str, int], int]:
    """Every row's n of d.big, d.t and d.u."""
    conn = m.connect()
    try:
        with conn.cursor() as cur:
            out = {}
            for t in ("big", "t", "u"):
                cur.execute(f"SELECT id, n FROM d.{t}")
                out.update({(t, int(i)): int(n) for i, n in cur.fetchall()})
            return out
    finally:
        conn.close()


def _snapshot_problems(lines: list[dict[str, Any]]) -> list[str]:
    """What is wrong with lines of a snapshot taken while writes went on: a streamed change twice, a
    streamed change of a key whose n does not go up by one from the state before it, or a snapshot row
    older than the state a line before it gave (each row's newest state wins)."""
    problems: list[str] = []
    seen = Counter(json.dumps([x["table"], x["op"], x["before"], x["after"]]) for x in lines
                   if x["op"] not in ("ddl", "read"))
    problems += [f"twice: {k}" for k, c in seen.items() if c > 1]
    rows: dict[tuple[str, int], int] = {}
    for x in lines:
        if x["op"] == "ddl" or x["db"] != "d":
            continue
        img = x["after"] or x["before"]
        key = (x["table"], int(img["id"]))
        if x["op"] == "delete":
            rows.pop(key, None)
            continue
        n, was = int(x["after"]["n"]), rows.get(key)
        if x["op"] == "read":
            if was is not None and n < was:
                problems.append(f"{key}: snapshot row n={n} after n={was}")
        elif x["op"] == "insert" and n != 1 or x["op"] == "update" and was is not None and n != was + 1:
            problems.append(f"{key}: {x['op']} n={n} after {was}")
        rows[key] = n
    return problems


def _proc_state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat[stat.rindex(")") + 2]


@pytest.mark.parametrize("binlog, method", [("own", "consistent"), ("same", "consistent"), ("own", "watermark")])
def test_a_failover_during_a_snapshot_goes_on_on_the_new_primary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   binlog: str, method: str) -> None:
    """snapshot=initial of a 6,000-row table in chunks of 100: the capturer freezes itself after reading
    its 12th chunk (failpoint ``snapshot.chunk_read=stop``, not delivered yet); the old primary is written
    to, killed with ``kill -9``, the replica promoted and written to, then the capturer goes on: the copy
    goes on on the new primary from the last chunk delivered (not from the start), the stream from the
    GTID position, and the file's lines replayed and the MySQL target equal the new primary's tables; no
    streamed change twice, each key's changes in order, no snapshot row older than a change before it.
    ``own``: the replica's binlog has files of its own (flushed once at the start), so the region's
    position is not one of its binlog: resumed by GTID, the positions of another binlog from then on;
    ``same``: its binlog is laid out as the primary's (the same events at the same offsets), so the
    region's file:pos holds the same GTIDs there and it resumes from it. ``method``: how chunks are made
    exact (MariaDB's consistent-snapshot position, or the watermark's locking read)."""
    from capturer.util import failpoints

    primary, replica = _pair(tmp_path)
    target = MariaDBInstance(tmp_path / "target", server_id=9).start()
    try:
        if binlog == "own":
            replica.execute("FLUSH BINARY LOGS")
        primary.execute("CREATE TABLE d.big (id INT PRIMARY KEY, n INT NOT NULL, pad VARCHAR(200))")
        conn = primary.connect()
        try:
            with conn.cursor() as cur:
                for lo in range(0, 6000, 1000):
                    cur.executemany("INSERT INTO d.big VALUES (%s, 1, %s)",
                                    [(i, f"{i:08d}" * 10) for i in range(lo, lo + 1000)])
        finally:
            conn.close()
        _write(primary, 0, 200)
        _catch_up(replica, primary)
        senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")
        cfg = write_config(tmp_path, [primary], senders=senders, filter_text="include d.*\n",
                           region_extra=f"replicas = 127.0.0.1:{replica.port}\nsnapshot = initial\n"
                                        f"snapshot_chunk_rows = 100\nsnapshot_workers = 2\nsnapshot_method = {method}\n")
        log = tmp_path / "capturer.log"
        monkeypatch.setenv(failpoints.ENV, "snapshot.chunk_read=stop@12")
        p = CapturerProcess(cfg, log).start()
        monkeypatch.delenv(failpoints.ENV)
        assert p.proc is not None
        pid = p.proc.pid
        wait_for(lambda: _proc_state(pid) == "T", 120, "the capturer to stop at its 12th chunk")
        try:
            # the old primary: changes before and after the chunk boundary, deletes, new rows, both domains
            primary.execute("UPDATE d.big SET n = n + 1 WHERE id % 7 = 0",
                            "DELETE FROM d.big WHERE id BETWEEN 3000 AND 3010",
                            "INSERT INTO d.big SELECT id + 10000, 1, pad FROM d.big WHERE id < 50")
            # and 16 MB of binlog (1000 transactions of 2 x 8 KB images): more than the frozen capturer's socket
            # takes in, so the region is in the middle of the old primary's binlog when it dies
            _write(primary, 200, 1000, pad=8000)
            _catch_up(replica, primary)
            at_kill = _one(primary, "SELECT @@GLOBAL.gtid_binlog_pos")
            primary.kill()  # kill -9
            _promote(replica)
            replica.execute("UPDATE d.big SET n = n + 1 WHERE id % 11 = 0")
        finally:
            p.proc.send_signal(signal.SIGCONT)
        # the new primary, while the copy goes on there
        replica.execute("UPDATE d.big SET n = n + 1 WHERE id % 13 = 0",
                        "DELETE FROM d.big WHERE id BETWEEN 5000 AND 5005",
                        "INSERT INTO d.big VALUES (20000, 1, 'new')")
        _write(replica, 1200, 200)
        replica.execute("UPDATE d.big SET n = n + 1 WHERE id % 17 = 0")
        want = _tables(replica)
        wait_for(lambda: _final(read_lines(tmp_path)) == want, 120, "the output to equal the new primary")
        lines = read_lines(tmp_path)
        problems = _snapshot_problems(lines)
        assert not problems, problems[:10]
        st = _status(log)["regions"]["r1"]
        assert st["server"] == f"127.0.0.1:{replica.port}" and st["failovers"] == 1, st
        tables = st["snapshot"]["tables"]
        assert all(t["state"] == "done" for t in tables.values()), tables
        text = log.read_text()
        assert "failover during a snapshot" in text, text[-3000:]
        assert "changed server" not in text and "not supported yet" not in text
        # d.big's copy went on with reads of the new primary
        assert f"(127.0.0.1:{replica.port}): snapshot of d.big starts" in text, text[-3000:]
        resumed = re.findall(r"reading from (\S+)", text)[-1]
        assert resumed == "after" if binlog == "own" else resumed.startswith("mariadb-bin."), resumed
        # the copy went on from its last delivered chunk: d.big's rows were not all read again
        big = [x for x in lines if x["op"] == "read" and x["table"] == "big"]
        chunks = {x["snapshot"]["chunk"] for x in big}
        assert max(chunks) >= 59 and len(big) < 6000 + 40 + 3 * 100, (len(big), sorted(chunks)[-5:])
        wait_for(lambda: _tables(target) == want, 60, "the MySQL target to equal the new primary")
        assert st["failover_history"][0]["gtid"] != at_kill  # the region was in the middle of the old binlog
        print(f"failover during a snapshot at GTID {st['failover_history'][0]['gtid']} (the old primary had "
              f"written up to {at_kill}); {len(big)} rows of d.big read in {len(chunks)} chunks, "
              f"{len(lines)} lines; snapshot {json.dumps(tables)}")
        assert p.stop() == 0
    finally:
        primary.kill()
        replica.stop()
        target.stop()


def test_a_restart_after_a_crash_mid_snapshot_goes_on_on_the_new_primary(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The capturer dies (``kill -9``, failpoint ``snapshot.chunk_read=kill``) in the middle of a snapshot;
    while it is down the old primary is written to and killed, the replica promoted and written to; the
    capturer restarted with the checkpoint's position (of the old primary's binlog, with the snapshot's
    progress) reads the new primary by GTID and its copy goes on there from the last acknowledged chunk:
    the output equals the new primary's tables, nothing streamed twice, each key in order."""
    from capturer.util import failpoints

    primary, replica = _pair(tmp_path)
    try:
        replica.execute("FLUSH BINARY LOGS")  # (its binlog's files of its own: resumed by GTID)
        primary.execute("CREATE TABLE d.big (id INT PRIMARY KEY, n INT NOT NULL, pad VARCHAR(200))")
        conn = primary.connect()
        try:
            with conn.cursor() as cur:
                for lo in range(0, 30000, 1000):
                    cur.executemany("INSERT INTO d.big VALUES (%s, 1, %s)",
                                    [(i, f"{i:08d}" * 10) for i in range(lo, lo + 1000)])
        finally:
            conn.close()
        _write(primary, 0, 200)
        cfg = write_config(tmp_path, [primary], filter_text="include d.*\n",
                           region_extra=f"replicas = 127.0.0.1:{replica.port}\nsnapshot = initial\n"
                                        "snapshot_chunk_rows = 100\nsnapshot_workers = 2\n")
        log = tmp_path / "capturer.log"
        monkeypatch.setenv(failpoints.ENV, "snapshot.chunk_read=kill@150")
        p = CapturerProcess(cfg, log).start()
        monkeypatch.delenv(failpoints.ENV)
        assert p.proc is not None
        assert p.proc.wait(120) == -signal.SIGKILL
        ck = json.loads((tmp_path / "checkpoint.json").read_text())
        held = next(x for x in ck["regions"]["r1"]["snapshot"] if x["table"] == "big")  # the copy in progress
        assert held["chunks"] >= 1, held
        primary.execute("UPDATE d.big SET n = n + 1 WHERE id % 7 = 0",
                        "DELETE FROM d.big WHERE id BETWEEN 3000 AND 3010")
        _write(primary, 200, 200)
        _catch_up(replica, primary)
        primary.kill()
        _promote(replica)
        replica.execute("UPDATE d.big SET n = n + 1 WHERE id % 11 = 0",
                        "INSERT INTO d.big VALUES (90000, 1, 'new')")
        p = CapturerProcess(cfg, log).start()
        p.wait_ready()
        replica.execute("UPDATE d.big SET n = n + 1 WHERE id % 13 = 0")
        _write(replica, 400, 200)
        want = _tables(replica)
        wait_for(lambda: _final(read_lines(tmp_path)) == want, 120, "the output to equal the new primary")
        lines = read_lines(tmp_path)
        problems = _snapshot_problems(lines)
        assert not problems, problems[:10]
        st = _status(log)["regions"]["r1"]
        assert st["server"] == f"127.0.0.1:{replica.port}", st
        assert all(t["state"] == "done" for t in st["snapshot"]["tables"].values()), st["snapshot"]
        text = log.read_text()
        assert "failover during a snapshot" in text and re.findall(r"reading from (\S+)", text)[-1] == "after"
        # the copy went on from the checkpoint's last chunk: the chunks before it were delivered once (before
        # the crash), not read again
        big = [x for x in lines if x["op"] == "read" and x["table"] == "big"]
        before = Counter(x["snapshot"]["chunk"] for x in big if x["snapshot"]["chunk"] < held["chunks"])
        assert sum(before.values()) == held["rows"], (held, sorted(before.items())[:5])
        print(f"restart after a crash mid-snapshot, the old primary gone: the checkpoint held {held['chunks']} "
              f"chunks ({held['rows']} rows) of d.big; {len(big)} rows of it read in all, {len(lines)} lines")
        assert p.stop() == 0
    finally:
        primary.kill()
        replica.stop()
