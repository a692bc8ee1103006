"""Benchmarks: a fixed workload on private MariaDB regions, the capturer's
end-to-end rate into each sender, next to baselines measured in the same run.

    sh bench/run.sh                 # full: 200k inserts (100-row txns), 50k updates, 20k deletes, 2 regions
    sh bench/run.sh --rows 5000     # smoke size

Every figure is reported with its ratio to a baseline from the same run; the
machine is small and noisy, so absolute numbers mean little on their own.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import decimal
import gc
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from capturer.app import (
    Capturer,
    load_config,
)
from devtools.local_mariadb import MariaDBInstance, free_port

TABLE = """CREATE TABLE bench.t (
  id INT PRIMARY KEY, name VARCHAR(64), city VARCHAR(32), price DECIMAL(12,2), qty DECIMAL(10,3),
  created DATETIME(6), updated DATETIME, n INT, big BIGINT, note TEXT)"""


def load(m: MariaDBInstance, region: int, inserts: int, updates: int, deletes: int, batch: int = 100) -> int:
    """The fixed workload on one region; returns the row changes written."""
    rng = random.Random(region)
    c = m.connect()
    c.autocommit(False)
    base = region * 10_000_000
    now = dt.datetime(2026, 1, 1, 12, 0, 0)
    with c.cursor() as cur:
        for start in range(0, inserts, batch):
            rows = [
                (base + i, f"name-{i}", rng.choice(["Paris", "Oslo", "Lima", "Pune"]),
                 decimal.Decimal(rng.randrange(100000)) / 100, decimal.Decimal(rng.randrange(100000)) / 1000,
                 now + dt.timedelta(microseconds=i), now, i, i * 1000, "x" * 60)
                for i in range(start, min(start + batch, inserts))
            ]
            cur.executemany("INSERT INTO bench.t VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", rows)
            c.commit()
        for start in range(0, updates, batch):
            cur.execute("UPDATE bench.t SET n = n + 1, updated = NOW() WHERE id >= %s AND id < %s",
                        (base + start, base + min(start + batch, updates)))
            c.commit()
        top = inserts - deletes
        for start in range(top, inserts, batch):
            cur.execute("DELETE FROM bench.t WHERE id >= %s AND id < %s", (base + start, base + min(start + batch, inserts)))
            c.commit()
    c.close()
    return inserts + updates + deletes


def baseline_decode(m: MariaDBInstance, fast: bool = False, use_c: bool = False) -> tuple[int, float]:
    """python-mysql-replication alone: decode every row event of the binlog to dicts
    (``fast``: the same framing, rows decoded by capturer.regions.mysql.rowdecode, in
    Python or, ``use_c``, by its C build)."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    from capturer.regions.mysql.rowdecode import fast_rows

    s = BinLogStreamReader(
        {"host": "127.0.0.1", "port": m.port, "user": "root", "passwd": ""}, server_id=4242,
        blocking=False, resume_stream=True, log_file="mariadb-bin.000001", log_pos=4,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent], enable_logging=False,
    )
    t0 = time.perf_counter()
    n = 0
    for ev in s:
        if fast:
            rows = fast_rows(ev, isinstance(ev, UpdateRowsEvent), use_c)
            assert rows is not None
            n += len(rows)
        else:
            for _ in ev.rows:
                n += 1
    dt_ = time.perf_counter() - t0
    s.close()
    return n, dt_


def baseline_upsert(target: MariaDBInstance, rows: int, batch: int = 1000) -> float:
    """Raw multi-row upsert rate of the target: pymysql executemany, 1000-row batches, 1 connection."""
    target.execute("CREATE DATABASE IF NOT EXISTS base", TABLE.replace("bench.t", "base.t"))
    c = target.connect()
    c.autocommit(False)
    now = dt.datetime(2026, 1, 1)
    data = [(i, f"name-{i}", "Oslo", decimal.Decimal("12.34"), decimal.Decimal("1.500"), now, now, i, i * 1000, "x" * 60)
            for i in range(rows)]
    t0 = time.perf_counter()
    with c.cursor() as cur:
        for start in range(0, rows, batch):
            cur.executemany(
                "INSERT INTO base.t VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON DUPLICATE KEY UPDATE "
                "name=VALUES(name), n=VALUES(n)", data[start:start + batch])
            c.commit()
    secs = time.perf_counter() - t0
    c.close()
    target.execute("DROP DATABASE base")
    return rows / secs


def write_capturer_config(tmp: Path, servers: list[MariaDBInstance], senders_cfg: str, region_extra: str = "",
                          extra_global: str = "") -> Path:
    regions = "".join(
        f"\n[region:r{i}]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id={700 + i}\n{region_extra}"
        for i, m in enumerate(servers)
    )
    (tmp / "senders.cfg").write_text(senders_cfg)
    (tmp / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={tmp / 'cp.json'}\nsenderConfig={tmp / 'senders.cfg'}\n"
        f"filterRuleDict=\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n{extra_global}" + regions
    )
    return tmp / "config.cfg"


def run_capturer(tmp: Path, servers: list[MariaDBInstance], senders_cfg: str, expect_rows: int,
                 region_extra: str = "", extra_global: str = "", ha: str = "") -> dict[str, Any]:
    """``ha``: etcd endpoints: run as the active capturer of an [ha] group."""
    cfg = write_capturer_config(tmp, servers, senders_cfg, region_extra, extra_global)
    if ha:
        cfg.write_text(cfg.read_text() + f"\n[ha]\nendpoints={ha}\nname=bench-{tmp.name}\nleaseSeconds=10\n")
    return run_until_delivered(cfg, expect_rows, ha=bool(ha))


def run_capturer_agents(tmp: Path, servers: list[MariaDBInstance], expect_rows: int) -> dict[str, Any]:
    """The same as ``run_capturer`` to a file, each region read by its own agent process."""
    import subprocess

    procs, remote = [], ""
    try:
        for i, m in enumerate(servers):
            (tmp / f"agent{i}.cfg").write_text(
                f"[agent]\nlisten=127.0.0.1:0\nstateDir={tmp / 'agent-state'}\nlogLevel=warning\n"
                f"[region:r{i}]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id={720 + i}\n")
            pf = tmp / f"agent{i}.port"
            procs.append(subprocess.Popen([sys.executable, "-m", "capturer.agent", "--config", str(tmp / f"agent{i}.cfg"),
                                           "--port-file", str(pf)], cwd=str(ROOT)))
            deadline = time.monotonic() + 60
            while not pf.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            remote += f"\n[region:r{i}]\ntype=remote\naddress=127.0.0.1:{pf.read_text().strip()}\n"
        (tmp / "senders.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp / 'changes.jsonl'}\n")
        (tmp / "config.cfg").write_text(
            f"[global]\nbinlogCheckPointPath={tmp / 'cp.json'}\nsenderConfig={tmp / 'senders.cfg'}\n"
            f"filterRuleDict=\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n" + remote)
        return run_until_delivered(tmp / "config.cfg", expect_rows)
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)


def many_regions(tmp: Path, n: int, total_inserts: int, agents: int = 2) -> dict[str, Any]:
    """``n`` regions (MariaDB servers) with the fixed workload split over them, read
    in-process and through ``agents`` agent processes (n/agents regions each), each
    into the file sender; the file's commit order is checked."""
    import subprocess

    small = {"innodb_buffer_pool_size": "32M", "innodb_log_file_size": "48M"}
    servers = [MariaDBInstance(tmp / f"m{i}", server_id=100 + i, extra=dict(small)).start() for i in range(n)]
    out: dict[str, Any] = {"regions": n}
    try:
        per = total_inserts // n
        for m in servers:
            m.execute("CREATE DATABASE bench", TABLE)
        threads = [threading.Thread(target=load, args=(m, 100 + i, per, per // 4, per // 10))
                   for i, m in enumerate(servers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = n * (per + per // 4 + per // 10)
        out["rows"] = total

        def ordered(path: Path) -> bool:
            last = -1
            with open(path, encoding="utf-8") as f:
                for line in f:
                    ts = json.loads(line)["commit_ts"]
                    if ts < last:
                        return False
                    last = ts
            return True

        d = tmp / "local"
        d.mkdir()
        r = run_capturer(d, servers, f"[global]\ntype=local\n[local]\nfilepath={d / 'changes.jsonl'}\n", total)
        r["ordered"] = ordered(d / "changes.jsonl")
        out["in_process"] = r
        d = tmp / "agents"
        d.mkdir()
        procs, remote = [], ""
        try:
            for a in range(agents):
                mine = [(i, m) for i, m in enumerate(servers) if i % agents == a]
                cfg = f"[agent]\nlisten=127.0.0.1:0\nstateDir={d / 'state'}\nlogLevel=warning\n" + "".join(
                    f"[region:r{i}]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id={900 + i}\n"
                    for i, m in mine)
                (d / f"agent{a}.cfg").write_text(cfg)
                pf = d / f"agent{a}.port"
                procs.append(subprocess.Popen([sys.executable, "-m", "capturer.agent", "--config",
                                               str(d / f"agent{a}.cfg"), "--port-file", str(pf)], cwd=str(ROOT)))
                deadline = time.monotonic() + 60
                while not pf.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                remote += "".join(f"\n[region:r{i}]\ntype=remote\naddress=127.0.0.1:{pf.read_text().strip()}\n"
                                  for i, _ in mine)
            (d / "senders.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={d / 'changes.jsonl'}\n")
            (d / "config.cfg").write_text(
                f"[global]\nbinlogCheckPointPath={d / 'cp.json'}\nsenderConfig={d / 'senders.cfg'}\n"
                f"filterRuleDict=\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n" + remote)
            r = run_until_delivered(d / "config.cfg", total)
            r["ordered"] = ordered(d / "changes.jsonl")
            out["agents"] = r
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
    finally:
        for m in servers:
            m.stop()
    return out


def _role(pid: int, cmd: list[str]) -> str:
    """What a process of this bench is, from its command line."""
    if pid == os.getpid():
        return "capturer"  # the bench process: the capturer runs in it
    exe = Path(cmd[0]).name if cmd else ""
    if exe == "mariadbd":
        cnf = next((a for a in cmd if a.startswith("--defaults-file=")), "")
        return "sources" if re.fullmatch(r"r\d+", Path(cnf.split("=", 1)[-1]).parent.name) else "target"
    if exe in ("postgres", "postmaster") or (cmd and cmd[0].startswith("postgres:")):  # (backends retitle)
        return "sources"
    if any("baikaldb_double" in a for a in cmd):
        return "sources"
    if exe == "java" and "kafka.Kafka" in cmd:  # devtools/local_kafka.py's broker (Apache Kafka)
        return "broker"
    if exe == "java":
        return "spark jvm"
    if any("senders.process" in a for a in cmd):
        return "sender processes"
    if any("capturer.agent" in a or "regionproc" in a for a in cmd):
        return "region workers"
    if "apply" in cmd and "capturer" in cmd:
        return "applier"
    return "other"


def cpu_by_role() -> dict[str, float]:
    """CPU seconds used so far by this process and each of its descendants (the
    servers it started, Spark's JVM, sender and region processes), by role; and
    ``machine``: every process's busy time, from /proc/stat. Linux only ({}
    elsewhere). A process that ended between two samples loses its share."""
    try:
        tck = os.sysconf("SC_CLK_TCK")
        procs: dict[int, tuple[int, float, list[str]]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                rest = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
            except (OSError, IndexError):
                continue
            procs[int(d)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / tck, cmd)
        family, grew = {os.getpid()}, True
        while grew:
            more = {pid for pid, (ppid, _, _) in procs.items() if ppid in family} - family
            family |= more
            grew = bool(more)
        out: dict[str, float] = {}
        for pid in family:
            if pid in procs:
                role = _role(pid, procs[pid][2])
                out[role] = out.get(role, 0.0) + procs[pid][1]
        cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        out["machine"] = (sum(int(x) for x in cpu) - int(cpu[3]) - int(cpu[4])) / tck  # all but idle, iowait
        return out
    except OSError:
        return {}


CAPTURER_ROLES = ("capturer", "region workers", "sender processes")  # (cpu_by_role): the capturer's own processes


def cpu_split(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores used on average by each role between two ``cpu_by_role`` samples."""
    return {k: round((v - before.get(k, 0.0)) / seconds, 2) for k, v in sorted(after.items())
            if seconds > 0 and v - before.get(k, 0.0) > 0}


_FAIL_NEXT_RUN: list[str] = []  # --fail-part (the bench's own test): the part's next capturer run fails


def run_until_delivered(config: Path, expect_rows: int, ha: bool = False) -> dict[str, Any]:
    """Run the capturer in-process until every sender has ``expect_rows`` rows (``ha``: as the
    active capturer of the config's [ha] group: lease kept, checkpoints and journals in etcd,
    every write checked against the lease)."""
    if _FAIL_NEXT_RUN:
        import subprocess

        name = _FAIL_NEXT_RUN.pop()
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # bench-injected-failure"])
        raise RuntimeError(f"--fail-part {name}: the part fails with a process of its own left running")
    node = None
    if ha:
        from capturer.ha.node import HaNode
        from capturer.ops.status import StatusServer

        node = HaNode(load_config(config), ["--config", str(config)], threading.Event(), Capturer, StatusServer)
        won = node.coord.campaign(node._record("active"))
        assert won is not None, "the bench's etcd group has an active capturer already"
        cfg, restored = node.begin(*won)
        cap = Capturer(cfg, rebuild_backlog=restored, ha=node)
        node.attach(cap)
    else:
        cap = Capturer(load_config(config))
    try:
        return _run_cap(cap, expect_rows)
    finally:
        if node is not None:
            from capturer.regions import journal
            from capturer.util.fencing import GUARD

            node._resign()
            GUARD.disarm()  # (the bench's later parts run capturers in this process, without [ha])
            journal.REPLICATE = None


class GcClock:
    """The cyclic collector's collections and their seconds (wall, with the GIL held: no other
    thread of the capturer runs meanwhile) while it is installed, by generation."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._t0: dict[int, float] = {}

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._t0[me] = time.perf_counter()
        elif me in self._t0:
            g = info["generation"]
            self.count[g] += 1
            self.seconds[g] += time.perf_counter() - self._t0.pop(me)

    def result(self) -> dict[str, Any]:
        return {"collections": self.count, "seconds": [round(x, 3) for x in self.seconds],
                "total_seconds": round(sum(self.seconds), 3)}


def _run_cap(cap: Capturer, expect_rows: int) -> dict[str, Any]:
    with GcClock() as clock:
        out = _run_cap_timed(cap, expect_rows)
    out["gc"] = clock.result()  # (the whole run: every thread of the capturer, and the bench's own)
    manager, stream = getattr(cap, "manager", None), getattr(cap, "stream", None)
    if manager is not None:  # items each sender read back from the backlog, and how many a reader found decoded
        out["read_from_backlog"] = {n: c.read_from_backlog for n, c in manager.cursors.items()}
        backlog = getattr(stream, "backlog", None)
        if backlog is not None:
            out["backlog_decoded_hits"] = backlog.decoded_hits
    return out


def _run_cap_timed(cap: Capturer, expect_rows: int) -> dict[str, Any]:
    cpu0 = cpu_by_role()
    cpu1: dict[str, float] = {}
    t0 = time.perf_counter()
    cap.start()
    done_at: list[float] = []
    marks: dict[int, tuple[float, int]] = {}  # first sample at or past 10 % / 90 % of the rows
    first_by_sender: dict[str, float] = {}

    def until(c: Capturer) -> bool:
        now, rows = time.perf_counter(), min(s.rows for s in c.senders)
        for s in c.senders:  # (when each sender delivered its first row: what the start-up costs whom)
            if s.rows and s.name not in first_by_sender:
                first_by_sender[s.name] = round(now - t0, 2)
        for pct in (0, 10, 90):
            if pct not in marks and rows * 100 >= max(expect_rows * pct, 1):
                marks[pct] = (now, rows)
        if rows >= expect_rows:
            done_at.append(now)
            cpu1.update(cpu_by_role())  # before the capturer stops its workers and senders
            return True
        return now - t0 > 1800

    code = cap.run(until=until)
    elapsed = (done_at[0] if done_at else time.perf_counter()) - t0
    rows = min(s.rows for s in cap.senders)
    out = {"exit": code, "seconds": round(elapsed, 2), "rows": rows, "rows_per_s": round(rows / elapsed)}
    # cores used by each part until every row was delivered (the machine has 2)
    out["cpu_cores"] = cpu_split(cpu0, cpu1 or cpu_by_role(), elapsed)
    cores = sum(v for k, v in out["cpu_cores"].items() if k in CAPTURER_ROLES)
    if cores:  # what the capturer's work costs, comparable across machines
        out["capturer_cores"] = round(cores, 2)
        out["rows_per_capturer_cpu_s"] = round(out["rows_per_s"] / cores)
    if 10 in marks and 90 in marks and marks[90][0] > marks[10][0]:
        # steady state: the rate between 10 % and 90 % of the rows delivered (no connecting at
        # the start, no waiting for every region's last heartbeat at the end); sampled every 0.1 s
        (ta, ra), (tb, rb) = marks[10], marks[90]
        out["steady_rows_per_s"] = round((rb - ra) / (tb - ta))
        out["steady_seconds"] = round(tb - ta, 2)
        # where the rest of the time went: until the first row was delivered, and the last 10 %
        out["first_row_seconds"] = round(marks[0][0] - t0, 2)
        out["first_row_by_sender"] = first_by_sender
        out["last_10pct_seconds"] = round(elapsed - (tb - t0), 2)
    return out


def baikal_decode(rows: int) -> dict[str, float]:
    """BaikalDB payload decoding over the bench workload's prewrite payloads (made by
    the test double's writer): protobuf parse alone (the ceiling), the capturer's
    decoder in Python, and in C; rows per second of each."""
    from capturer.model import protogen
    from capturer.regions.baikaldb.rows import RowPlan, mutation_changes, parse_entry
    from capturer.regions.baikaldb.schema import TableDef
    from devtools.baikaldb_double.__main__ import bench_load
    from devtools.baikaldb_double.cluster import Cluster

    P = protogen.load("baikaldb")
    c = Cluster()
    c.stores = ["127.0.0.1:1"]
    n, _ = bench_load(c, rows)
    payloads = [(rec.ts, r.prewrites[rec.start_ts]) for r in c.regions.values() for rec in r.records if not rec.fake]
    info = next(t for t in c.tables.values()).schema_info()
    from capturer.regions.baikaldb import brpc_json

    tdef = TableDef.from_schema_info(brpc_json.from_json(info, P.SchemaInfo()))
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    k = 0
    for _, raw in payloads:
        req = P.StoreReq()
        req.ParseFromString(raw)
        for m in req.binlog.prewrite_value.mutations:
            k += len(m.insert_rows) + len(m.deleted_rows)
    out["protobuf_parse"] = k / (time.perf_counter() - t0)
    for name, use_c in (("python", False), ("c", True)):
        plan = RowPlan(tdef)
        if not use_c:
            plan._c = None
        elif plan._c is None:
            continue
        t0 = time.perf_counter()
        got = 0
        for ts, raw in payloads:
            e = parse_entry(P, raw, ts, 1)
            for m in e.mutations:
                changes, _ = mutation_changes(plan, m, False)
                got += len(changes)
        assert got == n, (got, n)
        out[name] = got / (time.perf_counter() - t0)
    return out


def run_capturer_baikal(tmp: Path, meta: str, expect_rows: int) -> dict[str, Any]:
    """The capturer reading the double (its own process) into the file sender."""
    (tmp / "senders.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp / 'changes.jsonl'}\n")
    (tmp / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={tmp / 'cp.json'}\nsenderConfig={tmp / 'senders.cfg'}\n"
        f"filterRuleDict=\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n"
        f"[region:bk]\ntype=baikaldb\nmetaServer={meta}\nbinlogTableID=20\ncreate_tables=false\n")
    return run_until_delivered(tmp / "config.cfg", expect_rows)


def baikal_double_process(tmp: Path, rows: int) -> tuple[Any, dict[str, Any]]:
    import subprocess

    ready = tmp / "double-ready.json"
    p = subprocess.Popen([sys.executable, "-m", "devtools.baikaldb_double", "--bench-rows", str(rows), "--ready", str(ready)],
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         stdout=subprocess.DEVNULL, stderr=open(tmp / "double.log", "wb"))
    # its preparation writes the workload in-process (~45 s per million rows here)
    limit = 120 + rows / 5000
    deadline = time.time() + limit
    while not ready.exists():
        if p.poll() is not None or time.time() > deadline:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
            raise RuntimeError(f"the BaikalDB double did not get ready in {limit:.0f} s: {(tmp / 'double.log').read_text()[-2000:]}")
        time.sleep(0.2)
    time.sleep(0.2)
    return p, json.loads(ready.read_text())


def load_sequence(m: MariaDBInstance, table: str, rows: int) -> None:
    """``rows`` rows of the bench shape, generated inside the server (the Sequence engine)."""
    m.execute("CREATE DATABASE IF NOT EXISTS snap", TABLE.replace("bench.t", table))
    c = m.connect()
    c.autocommit(True)
    with c.cursor() as cur:
        step = 1_000_000
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            cur.execute(
                f"INSERT INTO {table} SELECT seq, CONCAT('name-', seq), ELT(1 + seq % 4, 'Paris', 'Oslo', 'Lima', "
                "'Pune'), (seq % 100000) / 100, (seq % 100000) / 1000, '2026-01-01 12:00:00.123456', "
                f"'2026-01-01 12:00:00', seq, seq * 1000, REPEAT('x', 60) FROM snap.seq_{lo}_to_{hi - 1}")
    c.close()


def snapshot_run(tmp: Path, m: MariaDBInstance, senders_cfg: str, rows: int, workers: int = 2,
                 region_extra: str = "") -> dict[str, Any]:
    """The capturer copying snap.t (``rows`` rows) with snapshot=initial, in-process:
    seconds from start until every sender holds every row."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "senders.cfg").write_text(senders_cfg)
    (tmp / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={tmp / 'cp.json'}\nsenderConfig={tmp / 'senders.cfg'}\n"
        f"filterRuleDict=\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n"
        f"[region:r1]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id=733\n"
        f"snapshot=initial\nsnapshot_workers={workers}\n{region_extra}")
    (tmp / "filter.txt").write_text("include snap.*\n")
    cfgtext = (tmp / "config.cfg").read_text().replace("filterRuleDict=\n", f"filterRuleDict={tmp / 'filter.txt'}\n")
    (tmp / "config.cfg").write_text(cfgtext)
    return run_until_delivered(tmp / "config.cfg", rows)


def raw_chunked_read(m: MariaDBInstance, table: str, chunk_rows: int = 20_000) -> dict[str, Any]:
    """The ceiling of a snapshot's read: ``table`` read in primary-key chunks of
    ``chunk_rows`` (``WHERE id > last ORDER BY id LIMIT n``) with the driver the
    snapshot uses (MariaDB Connector/Python where installed), rows as the driver makes
    them and nothing else done with them; one chunk after the other, each on the
    other of two connections (as a worker with read-ahead has)."""
    try:
        import mariadb

        conns = [mariadb.connect(host="127.0.0.1", port=m.port, user="root", password="") for _ in range(2)]
        driver, ph = "mariadb", "?"
    except ImportError:
        import pymysql

        conns = [pymysql.connect(host="127.0.0.1", port=m.port, user="root", password="") for _ in range(2)]
        driver, ph = "pymysql", "%s"
    db, t = table.split(".")
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    last, rows, i = None, 0, 0
    while True:
        cur = conns[i % 2].cursor()
        if last is None:
            cur.execute(f"SELECT * FROM `{db}`.`{t}` ORDER BY id LIMIT {chunk_rows}")
        else:
            cur.execute(f"SELECT * FROM `{db}`.`{t}` WHERE id > {ph} ORDER BY id LIMIT {chunk_rows}", (last,))
        got = cur.fetchall()
        cur.close()
        rows += len(got)
        i += 1
        if len(got) < chunk_rows:
            break
        last = got[-1][0]
    secs = time.perf_counter() - t0
    for c in conns:
        c.close()
    return {"driver": driver, "rows": rows, "seconds": round(secs, 2), "rows_per_s": round(rows / secs),
            "client_cpu_s": round(time.process_time() - cpu0, 2)}


def snapshot_rss(tmp: Path, m: MariaDBInstance, rows: int) -> dict[str, Any]:
    """Peak RSS (VmHWM) of a capturer process copying a ``rows``-row table to a file."""
    import subprocess

    d = tmp / "snaprss"
    d.mkdir()
    (d / "senders.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={d / 'out.jsonl'}\nrotate_mb=100000\n")
    (d / "filter.txt").write_text("include snap.big\n")
    (d / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={d / 'cp.json'}\nsenderConfig={d / 'senders.cfg'}\n"
        f"filterRuleDict={d / 'filter.txt'}\nhttpPort={free_port()}\ncheckpointInterval=1\nlogLevel=info\n"
        f"[region:r1]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id=734\nsnapshot=initial\n")
    t0 = time.perf_counter()
    log = open(d / "log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "capturer", "--config", str(d / "config.cfg")], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL, stderr=log)
    peak, done = 0, False
    while time.perf_counter() - t0 < 3600 and p.poll() is None:
        try:
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:
            break
        if b"snapshot of snap.big done" in (d / "log").read_bytes():
            done = True
            break
        time.sleep(0.5)
    secs = time.perf_counter() - t0
    p.terminate()
    p.wait(120)
    return {"rows": rows, "done": done, "seconds": round(secs, 1), "rows_per_s": round(rows / secs),
            "peak_rss_mb": round(peak / 1024)}


def verify_config(d: Path, src: MariaDBInstance, senders_cfg: str, region_extra: str = "") -> Path:
    """A capturer config for ``verify``: one region (the source, as the capture user),
    only bench_v.* selected; ``senders_cfg`` as its senderConfig.cfg."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "senderConfig.cfg").write_text(senders_cfg)
    (d / "filter.txt").write_text("include bench_v.*\n")
    (d / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={d / 'cp.json'}\nsenderConfig={d / 'senderConfig.cfg'}\n"
        f"filterRuleDict={d / 'filter.txt'}\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n"
        f"[region:r1]\ntype=mysql\nhost=127.0.0.1\nport={src.port}\nuser=capturer\npassword=capturer\n"
        f"server_id=735\n{region_extra}")
    return d / "config.cfg"


def select_baseline(m: MariaDBInstance, table: str) -> tuple[int, float]:
    """A plain ``SELECT *`` of ``table`` through pymysql (default cursor, fetched in
    10k-row pieces): rows read and seconds."""
    c = m.connect()
    try:
        t0 = time.perf_counter()
        n = 0
        with c.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            while rows := cur.fetchmany(10_000):
                n += len(rows)
        return n, time.perf_counter() - t0
    finally:
        c.close()


def _cpu_seconds(pid: int) -> float:
    """utime + stime of one live process, from /proc (0 if it is gone)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def run_verify(cfg: Path, sender: str, table: str, servers: list[MariaDBInstance]) -> dict[str, Any]:
    """``python -m capturer verify --json`` for one sender and table, in its own process:
    its wall time, its report's table entry, the CPU seconds of the verify process
    (getrusage of reaped children), of its own children (sampled from /proc: Spark's
    JVM) and of the ``servers`` it read."""
    import resource
    import subprocess

    cmd = [sys.executable, "-m", "capturer", "verify", "--config", str(cfg), "--sender", sender,
           "--table", table, "--json"]
    servers_cpu0 = [_cpu_seconds(m.proc.pid) if m.proc else 0.0 for m in servers]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    err = open(cfg.parent / f"verify-{sender}.log", "wb")
    p = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                         stderr=err)
    kids: dict[int, float] = {}  # the verify process's children (Spark's JVM): last CPU seen

    def sampler() -> None:
        while p.poll() is None:
            for pid in _children(p.pid):
                kids[pid] = max(kids.get(pid, 0.0), _cpu_seconds(pid))
            time.sleep(0.2)

    out = b""
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    try:
        out, _ = p.communicate(timeout=1800)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        err.close()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    th.join(5)
    text = out.decode("utf-8", "replace")
    try:
        report = json.loads(text[text.index("{"):])
    except ValueError:
        report = {}
    entry = next((t for t in report.get("tables", []) if t.get("sender") == sender), {})
    res: dict[str, Any] = {
        "command": f"python -m capturer verify --config CFG --sender {sender} --table {table} --json",
        "exit": p.returncode, "status": entry.get("status"), "rows": entry.get("rows"),
        "sink_rows": entry.get("sink_rows"), "method": entry.get("method"),
        "report_seconds": entry.get("seconds"), "wall_seconds": round(wall, 2),
        "rows_per_s": round((entry.get("rows") or 0) / wall),
        "verify_cpu_s": round(ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, 2)}
    if kids:
        res["children_cpu_s"] = round(sum(kids.values()), 2)
    res["servers_cpu_s"] = [round(_cpu_seconds(m.proc.pid) - c0, 2) if m.proc else None
                            for m, c0 in zip(servers, servers_cpu0)]
    if not entry:
        res["error"] = (text[-1500:] or (cfg.parent / f"verify-{sender}.log").read_text()[-1500:])
    return res


def verify_runs(tmp: Path, rows: int, lake_rows: int | None = None) -> dict[str, Any]:
    """``python -m capturer verify`` over a ``rows``-row table, equal in source and sink:

    * ``select_rows_per_s``: the baseline, a plain ``SELECT *`` of the source table (pymysql);
    * ``mysql``: against a MariaDB target holding the same rows (generated in both
      servers by the same expressions): chunk checksums in both servers at once;
    * ``lake``: against a Spark lake filled by the capturer (snapshot=initial, the
      Spark sender with writer=arrow) with ``lake_rows`` rows (default: ``rows``):
      the merged view read through Spark.

    No capturer runs while verify does (the data are equal: nothing to re-check)."""
    out: dict[str, Any] = {"rows": rows}
    src = MariaDBInstance(tmp / "verify-src", server_id=51).start()
    target = MariaDBInstance(tmp / "verify-target", server_id=52, binlog=False).start()
    try:
        src.create_capture_user()
        t0 = time.perf_counter()
        for m in (src, target):
            m.execute("CREATE DATABASE bench_v")
            load_sequence(m, "bench_v.t", rows)
        out["load_seconds"] = round(time.perf_counter() - t0, 1)
        n, secs = select_baseline(src, "bench_v.t")
        out["select_rows_per_s"] = round(n / secs)
        out["select_seconds"] = round(secs, 2)
        cfg = verify_config(tmp / "verify-mysql", src, "[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\n"
                            f"port={target.port}\nuser=root\npassword=\ndatabase=\n")
        r = run_verify(cfg, "mysql", "bench_v.t", [src, target])
        r["ratio_to_select"] = round(r["rows_per_s"] / out["select_rows_per_s"], 2)
        out["mysql"] = r
        target.stop()
        lake_rows = min(lake_rows or rows, rows)
        if lake_rows != rows:  # the lake's table: the first lake_rows rows
            src.execute(f"DELETE FROM bench_v.t WHERE id >= {lake_rows}")
        cfg = verify_config(tmp / "verify-lake", src, "[global]\ntype=spark\n[spark]\n"
                            f"warehouse={tmp / 'verify-lake' / 'wh'}\nwriter=arrow\ncompaction_interval=0\n"
                            "batch_interval=1\n", region_extra="snapshot=initial\n")
        fill = run_until_delivered(cfg, lake_rows)
        r = run_verify(cfg, "spark", "bench_v.t", [src])
        r["lake_rows"] = lake_rows
        r["fill_seconds"] = fill["seconds"]
        r["fill_rows"] = fill["rows"]
        r["ratio_to_select"] = round(r["rows_per_s"] / out["select_rows_per_s"], 2)
        out["lake"] = r
    finally:
        target.stop()
        src.stop()
    return out


def _http_status(url: str) -> dict[str, Any]:
    """The capturer's /status at ``url``, or {} while it cannot be read."""
    import requests

    try:
        return requests.get(url + "/status", timeout=5).json()
    except (requests.RequestException, ValueError):
        return {}


def _steady_updates(src: MariaDBInstance, preload: int, rate: int, stop: threading.Event) -> threading.Thread:
    """A thread updating ``rate`` rows/s of bench_v.t (50 a transaction, round the table) until ``stop``."""

    def drive() -> None:
        c = src.connect()
        c.autocommit(True)
        per_txn, k = 50, 0
        nxt = time.time()
        with c.cursor() as cur:
            while not stop.is_set():
                lo = (k * per_txn) % (preload - per_txn)
                cur.execute("UPDATE bench_v.t SET n = n + 1 WHERE id >= %s AND id < %s", (lo, lo + per_txn))
                k += 1
                nxt += per_txn / rate
                time.sleep(max(0.0, nxt - time.time()))
        c.close()

    loader = threading.Thread(target=drive, daemon=True)
    loader.start()
    return loader


def _verify_by_cli(cfg: Path, done: threading.Event, codes: list[int]) -> None:
    """``python -m capturer verify`` (mysql and local) run again and again until ``done``; its exit codes."""
    import subprocess

    while not done.is_set():
        p = subprocess.run([sys.executable, "-m", "capturer", "verify", "--config", str(cfg),
                            "--sender", "mysql", "--sender", "local", "--json", "--wait", "20"],
                           cwd=ROOT, capture_output=True, text=True)
        codes.append(p.returncode)


def _verify_by_post(url: str, token: str, done: threading.Event, codes: list[int]) -> None:
    """``POST /verify`` (mysql and local) again and again until ``done``; each run's exit code from /status."""
    import requests

    h = {"Authorization": f"Bearer {token}"}
    while not done.is_set():
        r = requests.post(url + "/verify", json={"senders": ["mysql", "local"], "wait": 20}, headers=h, timeout=10)
        if r.status_code != 202:
            time.sleep(0.5)
            continue
        while not done.is_set() and _http_status(url).get("verify", {}).get("state") == "running":
            time.sleep(0.5)
        last = _http_status(url).get("verify", {}).get("last") or {}
        if "exit_code" in last:
            codes.append(int(last["exit_code"]))


def _verify_window(name: str, pid: int, url: str, cfg: Path, token: str, seconds: int) -> dict[str, Any]:
    """One window of ``verify_cost``: ``seconds`` of the load with verify run by ``name`` (baseline: none)."""
    import resource

    codes: list[int] = []
    done = threading.Event()
    t = None
    if name != "baseline":
        args = (cfg, done, codes) if name == "cli" else (url, token, done, codes)
        t = threading.Thread(target=_verify_by_cli if name == "cli" else _verify_by_post, args=args, daemon=True)
        t.start()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    c0, r0, t0 = _cpu_seconds(pid), _http_status(url)["senders"]["mysql"]["rows"], time.time()
    worst = 0.0
    while time.time() - t0 < seconds:
        time.sleep(1)
        lags = [x.get("lag_seconds") or 0.0 for x in _http_status(url).get("senders", {}).values()]
        worst = max([worst, *lags])
    c1, r1, t1 = _cpu_seconds(pid), _http_status(url)["senders"]["mysql"]["rows"], time.time()
    done.set()
    if t is not None:
        t.join(120)
        while name == "post" and _http_status(url).get("verify", {}).get("state") == "running":
            time.sleep(0.5)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = {"capturer_cores": round((c1 - c0) / (t1 - t0), 3), "mysql_rows_per_s": round((r1 - r0) / (t1 - t0)),
           "worst_lag_s": round(worst, 1), "verify_runs": len(codes), "exit_codes": codes}
    if name == "cli" and codes:  # the verify processes this bench reaped (POST's are the capturer's)
        cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
        res["verify_cpu_s_per_run"] = round(cpu / len(codes), 2)
    return res


def verify_cost(tmp: Path, preload: int = 200_000, rate: int = 2000, seconds: int = 20) -> dict[str, Any]:
    """What ``verify`` costs a running capture: the capturer (``python -m capturer``, its
    own process: its CPU read from /proc) replicates a ``preload``-row table (a
    snapshot) to a MariaDB target and the file, then a steady ``rate`` rows/s of
    updates runs through three windows of ``seconds`` each:

    * ``baseline``: the load alone;
    * ``cli``: ``python -m capturer verify --sender mysql --sender local`` run again and again
      in a process of its own (the capturer is not involved: its cost is the reads of the
      checkpoint, and the servers');
    * ``post``: ``POST /verify`` (mysql and local) again and again, in the capturer's process.

    Per window: the capturer's cores (CPU s / s), the rows the MySQL sender delivered per
    second, the worst sender lag on /status, and the verify runs' exit codes (0 equal
    or 3 not settled while the load runs; 1 would be a false alarm)."""
    import subprocess

    d = tmp / "verify-cost"
    src = MariaDBInstance(tmp / "vc-src", server_id=53).start()
    target = MariaDBInstance(tmp / "vc-target", server_id=54, binlog=False).start()
    proc = None
    out: dict[str, Any] = {"preload_rows": preload, "rate": rate, "window_seconds": seconds}
    try:
        src.create_capture_user()
        src.execute("CREATE DATABASE bench_v")
        load_sequence(src, "bench_v.t", preload)
        token = "bench-verify"
        cfg = verify_config(d, src, "[global]\ntype=mysql,local\n[mysql]\nhost=127.0.0.1\n"
                            f"port={target.port}\nuser=root\npassword=\nthreadnum=4\n"
                            f"[local]\nfilepath={d / 'changes.jsonl'}\n",
                            region_extra="snapshot=initial\n")
        text = cfg.read_text().replace("checkpointInterval=0.5\n", f"checkpointInterval=0.5\ncontrolToken={token}\n")
        cfg.write_text(text)
        port = int(re.search(r"httpPort=(\d+)", text).group(1))  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}"
        log = (d / "capturer.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "capturer", "--config", str(cfg)], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT)
        deadline = time.time() + 600
        while time.time() < deadline and (
                _http_status(url).get("senders", {}).get("mysql", {}).get("rows", 0) < preload
                or _http_status(url).get("senders", {}).get("local", {}).get("rows", 0) < preload):
            time.sleep(1)
        stop = threading.Event()
        loader = _steady_updates(src, preload, rate, stop)
        time.sleep(3)
        for name in ("baseline", "cli", "post"):
            out[name] = _verify_window(name, proc.pid, url, cfg, token, seconds)
        base = out["baseline"]["capturer_cores"] or 1e-9
        for name in ("cli", "post"):
            out[name]["cores_ratio_to_baseline"] = round(out[name]["capturer_cores"] / base, 2)
        stop.set()
        loader.join(30)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        target.stop()
        src.stop()
    return out


def warm_broker(broker: Any) -> Any:
    """``broker`` once it has answered an idempotent producer: a fresh broker's first InitProducerId is
    answered "coordinator load in progress" until its transaction state is loaded (librdkafka retries
    it, ~0.5-1.5 s here), a start-up cost of the broker that a capturer meets only on a broker started
    just before it. Without this, whichever timed run came first on a new broker paid it (the all-four
    run's first Kafka row took 1.8-3.5 s)."""
    import confluent_kafka

    p = confluent_kafka.Producer({"bootstrap.servers": broker.servers, "acks": "all", "enable.idempotence": True})
    p.produce("bench-warm-up", value=b"x")
    if p.flush(120):
        raise RuntimeError(f"the broker at {broker.servers} did not take a warm-up message in 120 s")
    return broker


def baseline_producer(servers: str, client: str, n: int) -> float:
    """Raw producer rate: n ~420-byte JSON messages, keyed, acks=all, idempotent, one topic."""
    value = json.dumps({"id": 1, "name": "x" * 380}).encode()
    topic = f"baseline-{client}"
    t0 = time.perf_counter()
    if client == "confluent":
        import confluent_kafka

        p = confluent_kafka.Producer({"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True,
                                      "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
        for i in range(n):
            while True:
                try:
                    p.produce(topic, value=value, key=str(i).encode())
                    break
                except BufferError:
                    p.poll(0.05)
            p.poll(0)
        p.flush(120)
    else:
        from kafka import KafkaProducer

        kp = KafkaProducer(bootstrap_servers=servers, acks="all", enable_idempotence=True, linger_ms=5,
                           batch_size=256 * 1024)
        for i in range(n):
            kp.send(topic, value=value, key=str(i).encode())
        kp.flush(120)
        kp.close()
    return n / (time.perf_counter() - t0)


def baseline_arrow_append(tmp: Path, rows: int, batch: int = 50_000) -> float:
    """Raw Spark rate: Arrow tables of the bench shape appended to Parquet, 50k rows a batch."""
    import pyarrow as pa

    from senders.spark.sender import build_session

    spark = build_session({"master": "local[*]"}, tmp / "baseline-spark")
    try:
        now = dt.datetime(2026, 1, 1)
        t0 = time.perf_counter()
        for start in range(0, rows, batch):
            n = min(batch, rows - start)
            ids = list(range(start, start + n))
            table = pa.table({
                "_op": ["i"] * n, "_commit_ts": ids, "_region": ["r1"] * n, "_seq": [0] * n, "_sub": [0] * n,
                "id": ids, "name": [f"name-{i}" for i in ids], "city": ["Oslo"] * n,
                "price": pa.array([decimal.Decimal("12.34")] * n, pa.decimal128(38, 2)),
                "qty": pa.array([decimal.Decimal("1.500")] * n, pa.decimal128(38, 3)),
                "created": pa.array([now] * n, pa.timestamp("us")), "updated": pa.array([now] * n, pa.timestamp("us")),
                "n": ids, "big": ids, "note": ["x" * 60] * n,
            })
            spark.createDataFrame(table).coalesce(1).write.mode("append").parquet(str(tmp / "baseline-spark" / "t"))
        return rows / (time.perf_counter() - t0)
    finally:
        spark.stop()


def compaction_seconds(tmp: Path, changes: int = 1_000_000, keys: int = 200_000) -> float:
    """Time to compact a changelog of ``changes`` rows over ``keys`` primary keys."""
    from senders.spark import lake
    from senders.spark.sender import build_session

    wh = tmp / "compaction"
    spark = build_session({"master": "local[*]"}, wh)
    try:
        spark.range(changes).selectExpr(
            f"CASE WHEN id % 20 = 19 THEN 'd' WHEN id < {keys} THEN 'i' ELSE 'u' END AS _op",
            "id AS _commit_ts", "'r1' AS _region", "CAST(0 AS INT) AS _seq", "CAST(0 AS INT) AS _sub",
            f"id % {keys} AS id", "concat('name-', id) AS name", "CAST(id AS DOUBLE) AS price",
        ).write.parquet(str(wh / "t__t" / "changelog"))
        st = lake.TableState("t", "t", "t__t", ["id"], [["id", "bigint"], ["name", "string"], ["price", "double"]])
        st.save(wh / "t__t")
        lake.register(spark, st, "cdc", wh)
        t0 = time.perf_counter()
        new = lake.compact(spark, st, "cdc", wh)
        secs = time.perf_counter() - t0
        assert new.generation == 1
        return secs
    finally:
        spark.stop()


def latency_run(tmp: Path, servers: list[MariaDBInstance], rate: int = 5000, seconds: int = 20,
                txn_rows: int = 50, region_extra: str = "", name: str = "latency",
                other_senders: str = "") -> dict[str, Any]:
    """Commit-to-acknowledgement latency (file sender) at a steady ``rate`` rows/s over 2 regions.
    ``other_senders``: "type1,type2\n<their sections>" to run next to the file sender (the
    acknowledgement is then every sender's)."""
    d = tmp / name
    out = d / "changes.jsonl"
    run = sum(1 for p in tmp.glob("latency*") if p.is_dir())
    d.mkdir()
    regions = "".join(
        f"\n[region:r{i}]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id={750 + i}\nstart=latest\n"
        f"{region_extra}" for i, m in enumerate(servers))
    types, _, sections = other_senders.partition("\n")
    (d / "senders.cfg").write_text(f"[global]\ntype=local{',' + types if types else ''}\n[local]\nfilepath={out}\n"
                                   + sections)
    (d / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={d / 'cp.json'}\nsenderConfig={d / 'senders.cfg'}\n"
        f"filterRuleDict=\nhttpPort={free_port()}\nlogLevel=warning\n" + regions)
    cap = Capturer(load_config(d / "config.cfg"))
    cap.start()
    acks: list[tuple[float, int]] = []
    commits: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:
        last = -1
        while not stop.is_set():
            a = cap.manager.acked_ts()
            if a != last:
                acks.append((time.time(), a))
                last = a
            time.sleep(0.002)

    def drive(i: int, m: MariaDBInstance) -> None:
        c = m.connect()
        c.autocommit(False)
        per_region = rate / len(servers)
        interval = txn_rows / per_region
        base = 50_000_000 + i * 10_000_000 + run * 1_000_000  # each run its own ids
        nxt = time.time()
        k = 0
        with c.cursor() as cur:
            while time.time() < t_end:
                rows = [(base + k + j, "lat", "Oslo", 1, 1, dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 1), 0, 0, "x")
                        for j in range(txn_rows)]
                cur.executemany("INSERT INTO bench.t VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", rows)
                c.commit()
                commits[base + k] = time.time()
                k += txn_rows
                nxt += interval
                time.sleep(max(0.0, nxt - time.time()))
        c.close()

    threading.Thread(target=poll, daemon=True).start()
    time.sleep(2)
    t_end = time.time() + seconds
    ts = [threading.Thread(target=drive, args=(i, m)) for i, m in enumerate(servers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    deadline = time.time() + 60
    while time.time() < deadline:
        lines = out.read_text().count("\n") if out.exists() else 0
        if lines >= len(commits) * txn_rows:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    stop.set()
    cap.shutdown()
    first_ts = {}
    for line in out.read_text().splitlines():
        d = json.loads(line)
        if d["op"] == "insert" and d["after"]["id"] in commits:
            first_ts[d["after"]["id"]] = d["commit_ts"]
    import bisect

    ack_times = [t for t, _ in acks]
    ack_vals = [a for _, a in acks]
    # acked_ts only grows, so the first poll with acked >= commit_ts is the ack time
    lat = []
    for rid, cts in first_ts.items():
        i = bisect.bisect_left(ack_vals, cts)
        if i < len(ack_times):
            lat.append(ack_times[i] - commits[rid])
    lat.sort()
    pct = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 1) if lat else None  # noqa: E731
    return {"rate_rows_per_s": rate, "txns": len(commits), "measured": len(lat),
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": pct(1.0)}


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (from /proc/*/stat: /proc/PID/task/PID/children
    is not in every kernel)."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d))
    return out


def _descendants() -> dict[int, list[str]]:
    """Every process below this one (children, theirs, ...) with its command line."""
    procs: dict[int, tuple[int, list[str]]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
            except (OSError, IndexError, ValueError):
                continue
            procs[int(d)] = (ppid, cmd)
    family, grew = {os.getpid()}, True
    while grew:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in family} - family
        family |= more
        grew = bool(more)
    return {pid: procs[pid][1] for pid in family - {os.getpid()} if pid in procs}


def stop_processes(keep: set[int] = frozenset(), grace: float = 10.0,  # type: ignore[assignment]
                   spare_jvm: bool = False) -> list[str]:
    """Stop every process below this one but those in ``keep`` (and theirs): SIGTERM,
    then SIGKILL after ``grace`` s. Returns what was stopped, for the log. (A part that
    failed half-way leaves what it started: a test double, an agent, an applier.)
    ``spare_jvm``: not Spark's JVM either (the in-process session's, which later parts use)."""
    import signal

    procs = _descendants()
    if spare_jvm:
        keep = set(keep) | {pid for pid, cmd in procs.items()
                            if cmd and (Path(cmd[0]).name == "java" or any("spark-submit" in a for a in cmd))}
    kept = set(keep)
    grew = True
    while grew:  # the kept ones' own children stay too
        more = {pid for pid in procs if pid not in kept and _parent(pid) in kept}
        kept |= more
        grew = bool(more)
    victims = {pid: cmd for pid, cmd in procs.items() if pid not in kept}
    for pid in victims:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in victims):
        time.sleep(0.1)
    for pid in victims:
        try:
            if not _zombie(pid):
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in victims:  # reap our own children
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass
    return [" ".join(cmd)[:120] for cmd in victims.values()]


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True  # gone


def reset_target(target: MariaDBInstance) -> None:
    """Empty the target for another run: its tables and the MySQL sender's applied marks
    (without dropping those, the next run would skip every row as applied before)."""
    target.execute("DROP DATABASE IF EXISTS bench", "DROP DATABASE IF EXISTS _capturer")


def with_procs(senders_cfg: str, kinds: str = "local|mysql|kafka|spark") -> str:
    """The same senders, those of ``kinds`` (a regex alternation) each in a process of its own (process=true)."""
    return re.sub(rf"^\[({kinds})\]\n", "[\\1]\nprocess=true\n", senders_cfg, flags=re.M)


def ha_takeovers(tmp: Path, servers: list[MariaDBInstance], n: int = 5, lease: int = 3) -> dict[str, Any]:
    """Two capturer processes in an [ha] group (a private etcd), a file sender, a light load (~100
    transactions/s): ``n`` times kill -9 of the active one, timing (1) until the standby says it is
    active and (2) until the file grows again; the killed one comes back as a standby."""
    import json as _json
    import re
    import signal
    import subprocess
    import urllib.request

    from devtools.local_etcd import EtcdCluster

    d = tmp / "ha-takeover"
    d.mkdir()
    etcd = EtcdCluster(d / "etcd", 1).start()
    out = d / "out" / "changes.jsonl"
    cfg = write_capturer_config(d, servers, f"[global]\ntype=local\n[local]\nfilepath={out}\nfsync=false\n",
                                region_extra="start=latest\n")  # (not the main load's rows again)
    text = re.sub(r"httpPort=\d+", "httpPort=0", cfg.read_text()).replace("logLevel=warning", "logLevel=info")
    cfg.write_text(text + f"\n[ha]\nendpoints={etcd.endpoints}\nname=bench\nleaseSeconds={lease}\n")
    logs = [d / "a.log", d / "b.log"]
    procs: list[Any] = [None, None]

    def start(i: int) -> None:
        with open(logs[i], "ab") as f:
            procs[i] = subprocess.Popen([sys.executable, "-m", "capturer", "--config", str(cfg)], stdout=f,
                                        stderr=subprocess.STDOUT, cwd=str(ROOT))

    def role(i: int) -> str:
        ports = re.findall(r"status on http://127\.0\.0\.1:(\d+)", logs[i].read_text(errors="replace"))
        if not ports:
            return ""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[-1]}/status", timeout=2) as r:
                return str((_json.loads(r.read()).get("ha") or {}).get("role", ""))
        except (OSError, ValueError):
            return ""

    def size() -> int:
        return out.stat().st_size if out.exists() else 0

    def until(pred: Any, timeout: float) -> float:
        t0 = time.monotonic()
        while not pred():
            if time.monotonic() - t0 > timeout:
                raise RuntimeError("ha takeover: timed out")
            time.sleep(0.05)
        return time.monotonic() - t0

    stop = threading.Event()

    def load_loop() -> None:
        c = servers[0].connect()
        k = 900_000_000  # (above every region's keys of the main load)
        while not stop.is_set():
            k += 1
            with c.cursor() as cur:
                cur.execute("INSERT INTO bench.t (id, name) VALUES (%s, 'ha')", (k,))
            c.commit()
            time.sleep(0.01)
        c.close()

    active_s: list[float] = []
    writing_s: list[float] = []
    loader = threading.Thread(target=load_loop, daemon=True)
    try:
        start(0)
        start(1)
        until(lambda: sorted(role(i) for i in (0, 1)) == ["active", "standby"], 120)
        loader.start()
        for _ in range(n):
            until(lambda: sorted(role(i) for i in (0, 1)) == ["active", "standby"], 120)
            a = 0 if role(0) == "active" else 1
            until(lambda: size() > 0, 60)
            time.sleep(2)
            procs[a].send_signal(signal.SIGKILL)
            procs[a].wait()
            t0 = time.monotonic()
            before = size()
            until(lambda a=a: role(1 - a) == "active", 120)
            active_s.append(round(time.monotonic() - t0, 2))
            until(lambda before=before: size() > before, 120)
            writing_s.append(round(time.monotonic() - t0, 2))
            start(a)
    finally:
        stop.set()
        for p in procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        etcd.stop()
    import statistics

    return {"lease_seconds": lease, "takeovers": n, "to_active_s": active_s, "to_writing_s": writing_s,
            "to_active_p50_s": statistics.median(active_s), "to_active_max_s": max(active_s),
            "to_writing_p50_s": statistics.median(writing_s), "to_writing_max_s": max(writing_s)}


def big_txn_rss(tmp: Path, rows: int = 1_000_000, region_extra: str = "", name: str = "bigtxn") -> dict[str, Any]:
    """One transaction of ``rows`` rows through the capturer (file sender) in its own
    process; its peak RSS (VmHWM) and time. With ``region_extra="process=true"`` the
    region runs in a worker process (the agent's code on a Unix socket): the peak of
    each process is reported."""
    import subprocess

    m = MariaDBInstance(tmp / f"{name}-src", server_id=31).start()
    try:
        m.execute("CREATE DATABASE bench", TABLE)
        c = m.connect()
        c.autocommit(False)
        now = dt.datetime(2026, 1, 1)
        with c.cursor() as cur:
            for start in range(0, rows, 5000):
                cur.executemany("INSERT INTO bench.t VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                                [(i, f"name-{i}", "Oslo", decimal.Decimal("12.34"), decimal.Decimal("1.500"), now,
                                  now, i, i, "x" * 60) for i in range(start, min(start + 5000, rows))])
        c.commit()  # one transaction
        c.close()
        d = tmp / name
        d.mkdir()
        (d / "senders.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={d / 'out.jsonl'}\nrotate_mb=100000\n")
        (d / "config.cfg").write_text(
            f"[global]\nbinlogCheckPointPath={d / 'cp.json'}\nsenderConfig={d / 'senders.cfg'}\nfilterRuleDict=\n"
            f"httpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n"
            f"[region:r1]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id=777\n{region_extra}")
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "capturer", "--config", str(d / "config.cfg")], cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
                             stderr=open(d / "log", "wb"))
        peaks: dict[int, int] = {}  # pid -> VmHWM (kB): the capturer and its worker processes
        done = False
        while time.perf_counter() - t0 < 1200 and p.poll() is None:
            for pid in {p.pid} | _children(p.pid):
                try:
                    for line in open(f"/proc/{pid}/status"):
                        if line.startswith("VmHWM:"):
                            peaks[pid] = max(peaks.get(pid, 0), int(line.split()[1]))
                except OSError:
                    pass
            if (d / "cp.json").exists() and json.loads((d / "cp.json").read_text())["commit_ts"] > 0:
                lines = sum(1 for _ in open(d / "out.jsonl")) if (d / "out.jsonl").exists() else 0
                if lines >= rows:
                    done = True
                    break
            time.sleep(0.5)
        secs = time.perf_counter() - t0
        p.terminate()
        p.wait(60)
        out = {"rows": rows, "delivered": done, "seconds": round(secs, 1),
               "peak_rss_mb": round(peaks.get(p.pid, 0) / 1024)}
        workers = [v for k, v in peaks.items() if k != p.pid]
        if region_extra:
            out["worker_peak_rss_mb"] = round(max(workers, default=0) / 1024)
        return out
    finally:
        m.stop()


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, float | None]] = []

    def add(self, label: str, rate: float, baseline: float | None, cpu: float | dict[str, Any] | None = None) -> None:
        """``cpu``: rows per CPU-second of the capturer (its process, region workers and sender
        processes; of the client process for a baseline), or a ``run_until_delivered`` result."""
        if isinstance(cpu, dict):
            cpu = cpu.get("rows_per_capturer_cpu_s")
        self.rows.append((label, rate, rate / baseline if baseline else 1.0, cpu))

    def markdown(self) -> str:
        out = ["| measure | rows/s | ratio to its baseline | rows per capturer CPU-second |", "|---|---:|---:|---:|"]
        out += [f"| {label} | {rate:,.0f} | {ratio:.2f} | {f'{cpu:,.0f}' if cpu else ''} |"
                for label, rate, ratio, cpu in self.rows]
        return "\n".join(out)


def independent_runs(tmp: Path, servers: list[MariaDBInstance], target: MariaDBInstance, broker_servers: str,
                     total: int, threads: int) -> dict[str, Any]:
    """Issue 30's figures, in one run of the same workload:

    * ``others_alone``: file, Kafka (confluent) and the lake, without a MySQL sender;
    * ``others_with_hung_mysql``: the same three plus a MySQL sender whose target is
      hung (SIGSTOP) the whole time: the rate at which the three deliver everything
      (their share: the ratio to ``others_alone``), then the MySQL sender's rate
      catching up from the backlog once the target wakes up;
    * ``file_catch_up``: the file sender paused until the whole workload has been read
      (all of it in the backlog), then resumed: its rate reading the backlog.
    """
    import signal as _signal

    out: dict[str, Any] = {}

    def three(name: str) -> str:
        return ("[global]\ntype=local,kafka,spark\n"
                f"[local]\nfilepath={tmp / name / 'changes.jsonl'}\n"
                f"[kafka]\nservers={broker_servers}\nclient=confluent\n"
                f"[spark]\nwarehouse={tmp / name / 'wh'}\ncompaction_interval=0\nbatch_interval=1\n")

    def timed(cap: Capturer, names: list[str], limit: float = 1800) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < limit:
            if all(s.rows >= total for s in cap.senders if s.name in names):
                return time.perf_counter() - t0
            if cap._find_failure():
                raise RuntimeError(cap._find_failure())
            time.sleep(0.05)
        raise RuntimeError(f"{names}: not delivered in {limit} s")

    (tmp / "ind-alone").mkdir()
    cfg = write_capturer_config(tmp / "ind-alone", servers, three("ind-alone"))
    cap = Capturer(load_config(cfg))
    cap.start()
    try:
        secs = timed(cap, ["local", "kafka", "spark"])
    finally:
        cap.shutdown()
    out["others_alone_rows_per_s"] = round(total / secs)

    reset_target(target)
    (tmp / "ind-hung").mkdir()
    cfg = write_capturer_config(tmp / "ind-hung", servers, three("ind-hung") +
                                f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={threads}\n"
                                "connect_timeout=5\n", extra_global="")
    (tmp / "ind-hung" / "senders.cfg").write_text((tmp / "ind-hung" / "senders.cfg").read_text()
                                                  .replace("type=local,kafka,spark", "type=local,kafka,spark,mysql"))
    cap = Capturer(load_config(cfg))
    assert target.proc is not None
    cap.start()
    time.sleep(1.0)  # the MySQL sender connected
    os.kill(target.proc.pid, _signal.SIGSTOP)
    try:
        secs = timed(cap, ["local", "kafka", "spark"])
        out["others_with_hung_mysql_rows_per_s"] = round(total / secs)
        out["backlog_bytes_at_the_end"] = cap.stream.status()["backlog_bytes"]
        out["stream_waits"] = cap.stream.status()["waits"]
        os.kill(target.proc.pid, _signal.SIGCONT)
        mysql = next(s for s in cap.senders if s.name == "mysql")
        before = mysql.rows
        t0 = time.perf_counter()
        timed(cap, ["mysql"])
        out["mysql_catch_up_rows_per_s"] = round((total - before) / (time.perf_counter() - t0))
        out["mysql_read_from_backlog_items"] = cap.manager.cursors["mysql"].read_from_backlog
    finally:
        os.kill(target.proc.pid, _signal.SIGCONT)
        cap.shutdown()
    out["share_delivered_by_the_others"] = round(out["others_with_hung_mysql_rows_per_s"] /
                                                 out["others_alone_rows_per_s"], 3)

    (tmp / "ind-catchup").mkdir()
    cfg = write_capturer_config(tmp / "ind-catchup", servers,
                                f"[global]\ntype=local\n[local]\nfilepath={tmp / 'ind-catchup' / 'changes.jsonl'}\n",
                                extra_global="queueRows=20000\n")
    (tmp / "ind-catchup" / "cp.json.paused").write_text("local\n")  # paused from the start, as an operator left it
    cap = Capturer(load_config(cfg))
    cap.start()
    try:
        t0 = time.perf_counter()
        while cap.manager.dispatched_rows < total and time.perf_counter() - t0 < 1800:
            time.sleep(0.05)
        out["read_into_backlog_seconds"] = round(time.perf_counter() - t0, 2)
        out["backlog_bytes"] = cap.stream.status()["backlog_bytes"]
        local = cap.senders[0]
        local.resume()
        secs = timed(cap, ["local"])
        out["file_catch_up_rows_per_s"] = round(total / secs)
        out["file_read_from_backlog_items"] = cap.manager.cursors["local"].read_from_backlog
    finally:
        cap.shutdown()
    return out


APPLY_TXN_TOPIC = "capturer.txn"


def start_applier(d: Path, name: str, servers: str, senders_cfg: str) -> tuple[Any, int]:
    """``python -m capturer apply`` as a child process (as on another machine)."""
    import subprocess

    d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (d / f"{name}-senders.cfg").write_text(senders_cfg)
    (d / f"{name}.cfg").write_text(
        f"[global]\nname={name}\nservers={servers}\ntxn_topic={APPLY_TXN_TOPIC}\nclient=confluent\n"
        f"senderConfig={d / f'{name}-senders.cfg'}\nhttpPort={port}\nlogLevel=warning\n")
    with open(d / f"{name}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "capturer", "apply", "--config", str(d / f"{name}.cfg")],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return proc, port


def applied_rows(port: int) -> int:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
            return int(json.loads(r.read())["applied"]["rows"])
    except (OSError, ValueError, KeyError):
        return -1


def wait_applied(proc: Any, port: int, rows: int, timeout: float = 1800) -> float:
    """Until the applier applied ``rows`` rows: the moment (perf_counter), or raises."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if applied_rows(port) >= rows:
            return time.perf_counter()
        if proc.poll() is not None:
            raise RuntimeError(f"the applier exited with {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"the applier did not apply {rows} rows in {timeout:.0f}s")


def apply_runs(tmp: Path, servers: list[MariaDBInstance], target: MariaDBInstance, total: int, threads: int,
               lag_rate: int = 10_000, lag_seconds: int = 20, txn_rows: int = 50) -> dict[str, Any]:
    """Capturer -> Kafka (confluent, txn_topic) -> applier -> MySQL: end to end (the applier
    running while the capturer captures), draining a full backlog (a second applier of its
    own group into an emptied target), and the source-commit -> target-visible lag at
    ``lag_rate`` rows/s (the first applier, caught up, a steady load)."""
    from devtools.local_kafka import Broker

    d = tmp / "apply"
    d.mkdir()
    broker = warm_broker(Broker().start())
    mysql = (f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\n"
             f"threadnum={threads}\n")
    kcfg = (f"[global]\ntype=kafka\n[kafka]\nservers={broker.servers}\nclient=confluent\n"
            f"txn_topic={APPLY_TXN_TOPIC}\n")
    out: dict[str, Any] = {}
    procs: list[Any] = []
    try:
        reset_target(target)
        ap, port = start_applier(d, "e2e", broker.servers, mysql)
        procs.append(ap)
        cpu0 = cpu_by_role()
        t0 = time.perf_counter()
        (d / "cap").mkdir()
        cap = run_capturer(d / "cap", servers, kcfg, total)
        t1 = wait_applied(ap, port, total)
        out["capturer_to_kafka_rows_per_s"] = cap["rows_per_s"]
        out["end_to_end_rows_per_s"] = round(total / (t1 - t0))
        out["end_to_end_cpu_cores"] = cpu_split(cpu0, cpu_by_role(), t1 - t0)
        # the lag at a steady load, with this applier caught up
        out["lag"] = apply_lag(d, servers, target, kcfg, lag_rate, lag_seconds, txn_rows)
        ap.terminate()
        ap.wait(60)
        # a full backlog drained by an applier of its own (own group, own positions) into an emptied target
        reset_target(target)
        ap2, port2 = start_applier(d, "drain", broker.servers, mysql)
        procs.append(ap2)
        cpu0 = cpu_by_role()
        t0 = time.perf_counter()
        want = total + out["lag"]["rows"]
        t1 = wait_applied(ap2, port2, want)
        out["drain_rows_per_s"] = round(want / (t1 - t0))
        out["drain_cpu_cores"] = cpu_split(cpu0, cpu_by_role(), t1 - t0)
        ap2.terminate()
        ap2.wait(60)
        # the same with the MySQL sender's work in a process of its own (process=true)
        reset_target(target)
        ap3, port3 = start_applier(d, "drainproc", broker.servers, mysql + "process=true\n")
        procs.append(ap3)
        cpu0 = cpu_by_role()
        t0 = time.perf_counter()
        t1 = wait_applied(ap3, port3, want)
        out["drain_proc_rows_per_s"] = round(want / (t1 - t0))
        out["drain_proc_cpu_cores"] = cpu_split(cpu0, cpu_by_role(), t1 - t0)
        ap3.terminate()
        ap3.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        broker.kill()
    return out


def apply_lag(d: Path, servers: list[MariaDBInstance], target: MariaDBInstance, kcfg: str, rate: int,
              seconds: int, txn_rows: int) -> dict[str, Any]:
    """Source commit -> row visible in the target (polled every 5 ms), per transaction."""
    cfg = write_capturer_config(d / "cap", servers, kcfg)
    cap = Capturer(load_config(cfg))
    cap.start()
    commits: dict[int, float] = {}
    seen: dict[int, float] = {}
    stop = threading.Event()
    bases = [70_000_000 + i * 10_000_000 for i in range(len(servers))]
    order: list[list[int]] = [[] for _ in servers]  # per region: each transaction's first id, in commit order

    def poll() -> None:
        c = target.connect()
        c.autocommit(True)
        nxt = [0] * len(servers)
        try:
            with c.cursor() as cur:
                while not stop.is_set():
                    now = time.time()
                    for i, base in enumerate(bases):
                        cur.execute("SELECT MAX(id) FROM bench.t WHERE id BETWEEN %s AND %s", (base, base + 9_999_999))
                        top = cur.fetchone()[0]
                        firsts = order[i]
                        while top is not None and nxt[i] < len(firsts) and firsts[nxt[i]] + txn_rows - 1 <= top:
                            seen[firsts[nxt[i]]] = now
                            nxt[i] += 1
                    time.sleep(0.005)
        finally:
            c.close()

    def drive(i: int, m: MariaDBInstance) -> None:
        c = m.connect()
        c.autocommit(False)
        interval = txn_rows / (rate / len(servers))
        nxt, k = time.time(), 0
        with c.cursor() as cur:
            while time.time() < t_end:
                first = bases[i] + k
                rows = [(first + j, "lag", "Oslo", 1, 1, dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 1), 0, 0, "x")
                        for j in range(txn_rows)]
                cur.executemany("INSERT INTO bench.t VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", rows)
                c.commit()
                commits[first] = time.time()
                order[i].append(first)
                k += txn_rows
                nxt += interval
                time.sleep(max(0.0, nxt - time.time()))
        c.close()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    time.sleep(2)
    t_end = time.time() + seconds
    ts = [threading.Thread(target=drive, args=(i, m)) for i, m in enumerate(servers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    deadline = time.time() + 120
    while time.time() < deadline and len(seen) < len(commits):
        time.sleep(0.2)
    stop.set()
    poller.join(10)
    cap.shutdown()
    lat = sorted(seen[k] - commits[k] for k in seen)
    pct = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 1) if lat else None  # noqa: E731
    return {"rate_rows_per_s": rate, "txns": len(commits), "rows": len(commits) * txn_rows, "measured": len(lat),
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": pct(1.0)}


class _PartWatchdog:
    """A part that hangs says where: after ``seconds`` every thread's stack and the processes the bench
    started go to stderr, then SIGTERM ends the run the usual way (results written, processes stopped)."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.done = name, threading.Event()
        threading.Thread(target=self._watch, args=(seconds,), daemon=True, name=f"watchdog-{name}").start()

    def _watch(self, seconds: float) -> None:
        if self.done.wait(seconds):
            return
        import faulthandler

        print(f"\nbench: part {self.name!r} still running after {seconds:.0f} s; its threads:", file=sys.stderr,
              flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for pid, cmd in sorted(_descendants().items()):
            print(f"bench: process {pid}: {' '.join(cmd)[:300]}", file=sys.stderr)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGTERM)

    def cancel(self) -> None:
        self.done.set()


class Bench:
    """What the parts share: the options, the temporary directory, the two source regions, the servers and
    brokers parts started (``extra``; the MySQL part's target as ``target``), the sources' workload and what was
    measured (``results``, the report's rows, the CPU lines, the failures). Results are written after every part
    (a part that fails is marked, the others' figures stay); a smoke run (CI) writes none."""

    def __init__(self, args: argparse.Namespace, only: set[str], full: bool, tmp: Path,
                 servers: list[MariaDBInstance], results: dict[str, Any]) -> None:
        self.args, self.only, self.tmp, self.servers, self.results = args, only, tmp, servers, results
        self.extra: list[Any] = []
        self.rep = Report()
        self.failures: list[str] = []
        self.cpu_lines: list[str] = []
        self.inserts = args.rows // 2
        self.updates, self.deletes = self.inserts // 4, self.inserts // 10
        self.total = 0  # (rows written to the sources, and the baseline decode rate: set by prepare)
        self.decode = 0.0
        self.target: Any = None  # (the MySQL target: started by the mysql part, used by later ones)
        suffix = "" if full else "-" + "-".join(sorted(only))
        self.dest = (Path(args.out) if args.out else None if args.smoke
                     else ROOT / "bench" / "results" / f"{dt.date.today().isoformat()}{suffix}.json")

    def save(self) -> None:
        self.results["table"] = self.rep.rows
        if self.dest is not None:
            part_file = self.dest.with_suffix(".json.part")
            part_file.write_text(json.dumps(self.results, indent=2) + "\n")
            os.replace(part_file, self.dest)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """One part of the bench: if it fails, its error is kept in the results (``failed_parts``),
        the processes it left are stopped, and the run goes on with the next part."""
        args, results, failures, extra, servers = self.args, self.results, self.failures, self.extra, self.servers
        t_part = time.perf_counter()
        extra_before = len(extra)
        watchdog = _PartWatchdog(name, args.part_timeout) if args.part_timeout > 0 else None
        try:
            _FAIL_NEXT_RUN[:] = [name] if name == args.fail_part else []
            yield
        except Exception as e:
            print(f"\nbench: part {name!r} failed; going on with the next ones\n{traceback.format_exc()}",
                  file=sys.stderr)
            results.setdefault("failed_parts", {})[name] = f"{type(e).__name__}: {e}"[:2000]
            failures.append(f"{name}: failed ({type(e).__name__}: {str(e)[:200]})")
            from devtools.local_kafka import Broker

            for o in extra[extra_before:]:  # its brokers (a target it started stays: later parts use it)
                if isinstance(o, Broker):
                    o.kill()
            keep = {o.proc.pid for o in servers + extra if getattr(o, "proc", None) is not None}
            stopped = stop_processes(keep, spare_jvm=True)
            if stopped:
                print(f"bench: stopped what part {name!r} left running: {stopped}", file=sys.stderr)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            _FAIL_NEXT_RUN.clear()
            results.setdefault("part_seconds", {})[name] = round(time.perf_counter() - t_part, 1)
            self.save()

    def e2e(self, name: str, senders_cfg: str, total: int, baseline: float | None, label: str,
            region_extra: str = "", ha: str = "") -> None:
        tmp, servers, results, rep = self.tmp, self.servers, self.results, self.rep
        (tmp / name).mkdir()
        r = run_capturer(tmp / name, servers, senders_cfg, total, region_extra, ha=ha)
        results[name] = r
        rep.add(label, r["rows_per_s"], baseline, r)
        if r.get("cpu_cores"):
            gcs = f" (the collector {r['gc']['total_seconds']:.2f} s of it)" if r.get("gc") else ""
            self.cpu_lines.append(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_cores"].items()) + gcs)
        if r["rows"] != total or r["exit"] != 0:
            self.failures.append(f"{name}: {r['rows']} of {total} rows, exit {r['exit']}")


def prepare(ctx: Bench) -> None:
    """Before the parts: the workload written to both sources, and the decode baselines."""
    servers, rep, results, inserts, updates = ctx.servers, ctx.rep, ctx.results, ctx.inserts, ctx.updates
    deletes = ctx.deletes
    for m in servers:
        m.execute("CREATE DATABASE bench", TABLE)
    t0 = time.perf_counter()
    written = [0, 0]

    def go(i: int, m: MariaDBInstance) -> None:
        written[i] = load(m, i + 1, inserts, updates, deletes)

    threads = [threading.Thread(target=go, args=(i, m)) for i, m in enumerate(servers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(written)
    results["load_seconds"] = round(time.perf_counter() - t0, 2)
    c0 = time.process_time()  # (the reading process's CPU: rows per CPU-second)
    n, secs = baseline_decode(servers[0])
    decode = n / secs
    results["baseline_decode_rows_per_s"] = round(decode)
    rep.add("baseline: python-mysql-replication decode, 1 region", decode, None, n / (time.process_time() - c0))
    c0 = time.process_time()
    n2, secs2 = baseline_decode(servers[0], fast=True)
    results["fast_decode_rows_per_s"] = round(n2 / secs2)
    rep.add("fast row decoder, Python (same framing), 1 region", n2 / secs2, decode,
            n2 / (time.process_time() - c0))
    from capturer.regions.mysql.rowdecode import c_decoder_built

    if c_decoder_built():
        c0 = time.process_time()
        n3, secs3 = baseline_decode(servers[0], fast=True, use_c=True)
        results["fast_decode_c_rows_per_s"] = round(n3 / secs3)
        rep.add("fast row decoder, C build (same framing), 1 region", n3 / secs3, decode,
                n3 / (time.process_time() - c0))
    ctx.total, ctx.decode = total, decode


def part_file(ctx: Bench) -> None:
    only, tmp, results, total, decode, e2e = ctx.only, ctx.tmp, ctx.results, ctx.total, ctx.decode, ctx.e2e
    e2e("file", f"[global]\ntype=local\n[local]\nfilepath={tmp / 'file' / 'changes.jsonl'}\n",
        total, decode, "capturer -> file (2 regions)")
    if "ab" in only:
        from capturer.util import mysqlconn

        real_buf, mysqlconn.READ_BUFFER = mysqlconn.READ_BUFFER, 8192
        try:
            e2e("file-8k-reads", f"[global]\ntype=local\n[local]\nfilepath={tmp / 'file-8k' / 'changes.jsonl'}\n",
                total, results["file"]["rows_per_s"],
                "capturer -> file, binlog read through pymysql's 8 KiB buffer; ratio to 256 KiB")
        finally:
            mysqlconn.READ_BUFFER = real_buf
        from capturer.regions.mysql import tablemap

        real_connect, tablemap.connect = tablemap.connect, mysqlconn.connect
        try:
            e2e("file-no-tablemap-cache",
                f"[global]\ntype=local\n[local]\nfilepath={tmp / 'file-ntm' / 'changes.jsonl'}\n",
                total, results["file"]["rows_per_s"],
                "capturer -> file, every table map parsed by the library; ratio to parsed once per definition")
        finally:
            tablemap.connect = real_connect
    if "senderprocs" in only:
        e2e("file-proc", f"[global]\ntype=local\n[local]\nfilepath={tmp / 'file-proc' / 'changes.jsonl'}\n"
            "process=true\n", total, results["file"]["rows_per_s"],
            "capturer -> file, sender in its own process; ratio to in-process")


def part_workers(ctx: Bench) -> None:
    tmp, results, total, e2e = ctx.tmp, ctx.results, ctx.total, ctx.e2e
    e2e("file-workers", f"[global]\ntype=local\n[local]\nfilepath={tmp / 'file-workers' / 'changes.jsonl'}\n",
        total, results.get("file", {}).get("rows_per_s"),
        "capturer -> file, regions in worker processes (process=true); ratio to in-process",
        region_extra="process=true\n")


def part_regions16(ctx: Bench) -> None:
    tmp, rep, results, failures, inserts = ctx.tmp, ctx.rep, ctx.results, ctx.failures, ctx.inserts
    base2 = results.get("file", {}).get("rows_per_s")
    r16 = many_regions(tmp / "regions16", 16, inserts * 2)
    results["regions16"] = r16
    for k, label in (("in_process", "16 regions in-process -> file; ratio to 2 regions"),
                     ("agents", "16 regions through 2 agents (8 each) -> file; ratio to 2 regions")):
        rep.add(label, r16[k]["rows_per_s"], base2)
        steady2 = results.get("file", {}).get("steady_rows_per_s")
        if r16[k].get("steady_rows_per_s"):
            rep.add(label.replace("; ratio", ", steady state (10-90 % of rows); ratio")
                    .replace("2 regions", "2 regions' steady state"), r16[k]["steady_rows_per_s"], steady2)
        if r16[k]["rows"] != r16["rows"] or r16[k]["exit"] != 0 or not r16[k]["ordered"]:
            failures.append(f"regions16 {k}: {r16[k]['rows']} of {r16['rows']} rows, exit {r16[k]['exit']}, "
                            f"ordered {r16[k]['ordered']}")


def part_agents(ctx: Bench) -> None:
    tmp, servers, rep, results, failures, total = ctx.tmp, ctx.servers, ctx.rep, ctx.results, ctx.failures, ctx.total
    from agent_transport import measure

    tr = measure(300_000)
    results["agent_transport"] = tr
    rep.add("agent -> capturer transport ceiling (synthetic region, gRPC loopback)", tr["rows_per_s"], None)
    (tmp / "agents").mkdir()
    r = run_capturer_agents(tmp / "agents", servers, total)
    results["agents"] = r
    rep.add("capturer -> file, 2 regions each served by an agent process; ratio to in-process",
            r["rows_per_s"], results.get("file", {}).get("rows_per_s"))
    if r["rows"] != total or r["exit"] != 0:
        failures.append(f"agents: {r['rows']} of {total} rows, exit {r['exit']}")


def part_baikaldb(ctx: Bench) -> None:
    tmp, rep, results, failures, cpu_lines = ctx.tmp, ctx.rep, ctx.results, ctx.failures, ctx.cpu_lines
    inserts, decode = ctx.inserts, ctx.decode
    dec = baikal_decode(inserts * 2)
    for k, v in dec.items():
        results[f"baikaldb_decode_{k}_rows_per_s"] = round(v)
    rep.add("BaikalDB payloads: protobuf parse only (ceiling), 1 binlog region", dec["protobuf_parse"], decode)
    rep.add("BaikalDB row decoder, Python", dec["python"], decode)
    if "c" in dec:
        rep.add("BaikalDB row decoder, C build", dec["c"], decode)
    proc, info = baikal_double_process(tmp, inserts * 2)
    try:
        (tmp / "baikaldb").mkdir()
        r = run_capturer_baikal(tmp / "baikaldb", info["meta"], info["rows"])
    finally:
        proc.terminate()
        proc.wait(30)
    results["baikaldb"] = r
    mysql_file = results.get("file", {}).get("rows_per_s")
    rep.add("BaikalDB (double, 1 partition x 2 regions) -> file; ratio to MySQL -> file",
            r["rows_per_s"], mysql_file, r)
    if r.get("cpu_cores"):
        cpu_lines.append("baikaldb: " + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_cores"].items()))
    if r["rows"] != info["rows"] or r["exit"] != 0:
        failures.append(f"baikaldb: {r['rows']} of {info['rows']} rows, exit {r['exit']}")


def part_pgsnapshot(ctx: Bench) -> None:
    args, tmp, rep, results, failures = ctx.args, ctx.tmp, ctx.rep, ctx.results, ctx.failures
    from pg_bench import snapshot_measure

    (tmp / "pgsnapshot").mkdir()
    prows = 1_000_000 if not args.smoke else args.rows
    r = snapshot_measure(tmp / "pgsnapshot", prows, run_until_delivered)
    results["pgsnapshot"] = r
    rep.add(f"baseline: PostgreSQL {prows:,}-row table read in 20,000-row key chunks, values as text "
            "(psycopg)", r["raw_chunked_rows_per_s"], None)
    rep.add("PostgreSQL: the same table with COPY TO STDOUT (text), for scale", r["copy_rows_per_s"],
            r["raw_chunked_rows_per_s"])
    rep.add("PostgreSQL snapshot -> file; ratio to the raw chunked read", r["capturer"]["rows_per_s"],
            r["raw_chunked_rows_per_s"])
    if r["capturer"]["rows"] < prows or r["capturer"]["exit"] != 0:
        failures.append(f"pgsnapshot: {r['capturer']['rows']} of {prows} rows, exit {r['capturer']['exit']}")


def part_postgresql(ctx: Bench) -> None:
    args, only, tmp, extra, rep, results = ctx.args, ctx.only, ctx.tmp, ctx.extra, ctx.rep, ctx.results
    failures, cpu_lines, inserts = ctx.failures, ctx.cpu_lines, ctx.inserts
    from pg_bench import measure as pg_measure

    (tmp / "postgresql").mkdir()
    pg_variants: dict[str, tuple[str, str]] = {}
    pg_broker = None
    if "kafka" in only and "confluent" in args.kafka_clients.split(","):
        from devtools.local_kafka import Broker

        pg_broker = warm_broker(Broker().start())
        extra.append(pg_broker)
        pg_variants["kafka"] = ("", f"[global]\ntype=kafka\n[kafka]\nservers={pg_broker.servers}\n"
                                    "client=confluent\n")
    r = pg_measure(tmp / "postgresql", inserts * 2, run_until_delivered, pg_variants)
    if pg_broker is not None:
        pg_broker.kill()
    results["postgresql"] = r
    raw = r["raw_stream_rows_per_s"]
    rep.add("PostgreSQL: raw pgoutput stream, framing only (baseline), 1 slot", raw, None,
            r["raw_stream_rows_per_cpu_s"])
    rep.add("PostgreSQL: + pgoutput.parse of every message", r["pgoutput_parse_rows_per_s"], raw,
            r["pgoutput_parse_rows_per_cpu_s"])
    rep.add("PostgreSQL region -> file, end to end; ratio to the raw stream", r["capturer"]["rows_per_s"], raw,
            r["capturer"])
    rep.add("PostgreSQL region -> file; ratio to MySQL (2 regions) -> file", r["capturer"]["rows_per_s"],
            results.get("file", {}).get("rows_per_s"), r["capturer"])
    if "capturer_kafka" in r:
        rep.add("PostgreSQL region -> kafka (confluent); ratio to the raw stream",
                r["capturer_kafka"]["rows_per_s"], raw, r["capturer_kafka"])
    for name in ("capturer", *(f"capturer_{v}" for v in pg_variants)):
        if r[name]["rows"] != r["rows"] or r[name]["exit"] != 0:
            failures.append(f"postgresql ({name}): {r[name]['rows']} of {r['rows']} rows, "
                            f"exit {r[name]['exit']}")
        if r[name].get("cpu_cores"):
            cpu_lines.append(f"postgresql {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                               r[name]["cpu_cores"].items()))


def part_mysql(ctx: Bench) -> None:
    args, only, tmp, extra, rep, results = ctx.args, ctx.only, ctx.tmp, ctx.extra, ctx.rep, ctx.results
    total, e2e = ctx.total, ctx.e2e
    target = MariaDBInstance(tmp / "target", server_id=99).start()
    extra.append(target)
    ctx.target = target
    ups = baseline_upsert(target, total)
    results["baseline_upsert_rows_per_s"] = round(ups)
    rep.add("baseline: raw multi-row upsert into the target (1 conn, 1000-row batches)", ups, None)
    mysql_cfg = (f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\n"
                 f"threadnum={args.threads}\n")
    e2e("mysql", mysql_cfg, total, ups, f"capturer -> mysql ({args.threads} workers)")
    if "ab" in only:
        from senders.mysql import sender as msender
        from senders.mysql import worker as mworker  # (the statement kinds and SQL literals live here now)

        def as_before(ch: Any) -> str:  # every update as UPDATE ... WHERE <old key>
            return {"insert": "upsert", "read": "upsert", "delete": "delete"}.get(ch.op, "update")

        reset_target(target)
        real_kind, mworker._kind = mworker._kind, as_before
        try:
            e2e("mysql-updates", mysql_cfg, total, results["mysql"]["rows_per_s"],
                "capturer -> mysql, updates as UPDATE statements; ratio to upserts")
        finally:
            mworker._kind = real_kind
        reset_target(target)
        real_tuples, real_phase = mworker._sql_tuples, msender.MySQLSender.phase_rows
        mworker._sql_tuples, msender.MySQLSender.phase_rows = None, 10**9  # one phase per batch
        try:
            e2e("mysql-params-one-phase", mysql_cfg, total, results["mysql"]["rows_per_s"],
                "capturer -> mysql, values as parameters and no placing during apply; ratio to this release")
        finally:
            mworker._sql_tuples, msender.MySQLSender.phase_rows = real_tuples, real_phase
        from senders.mysql import causality

        reset_target(target)
        real_placing = msender.conflict_keys, msender.Causality, msender.stable_hash, msender._place_txns
        # the placing in Python (senders/mysql/causality.py's specification) instead of its C twin
        msender.conflict_keys, msender.Causality, msender.stable_hash, msender._place_txns = (
            causality.conflict_keys_py, causality.CausalityPy, causality.stable_hash_py, None)
        try:
            e2e("mysql-py-placing", mysql_cfg, total, results["mysql"]["rows_per_s"],
                "capturer -> mysql, conflict keys and placing in Python; ratio to this release")
        finally:
            msender.conflict_keys, msender.Causality, msender.stable_hash, msender._place_txns = real_placing
    if "atomic" in only:  # whole source transactions, with the lanes' exact position and without it
        for name, extra_cfg in (("mysql-atomic", "txn_atomic=true\n"),
                                ("mysql-atomic-nopos", "txn_atomic=true\nmeta_database=\n"),
                                ("mysql-atomic-2", "txn_atomic=true\n")):
            reset_target(target)
            e2e(name, mysql_cfg + extra_cfg, total, results["mysql"]["rows_per_s"],
                f"capturer -> mysql, {extra_cfg.strip().replace(chr(10), ', ')}; ratio to rows")
        pos = (results["mysql-atomic"]["rows_per_s"] + results["mysql-atomic-2"]["rows_per_s"]) / 2
        rep.add("txn_atomic: the lanes' position (rows per commit) vs no position (A-B-A)", pos,
                results["mysql-atomic-nopos"]["rows_per_s"])
    if "senderprocs" in only:
        reset_target(target)
        e2e("mysql-proc", with_procs(mysql_cfg), total, results["mysql"]["rows_per_s"],
            "capturer -> mysql, sender in its own process; ratio to in-process")


def part_kafka(ctx: Bench) -> None:
    args, only, extra, rep, results, total = ctx.args, ctx.only, ctx.extra, ctx.rep, ctx.results, ctx.total
    e2e = ctx.e2e
    from devtools.local_kafka import Broker

    for client in args.kafka_clients.split(","):
        broker = warm_broker(Broker().start())  # a fresh broker each: memory storage grows
        extra.append(broker)
        c0 = time.process_time()
        raw = baseline_producer(broker.servers, client, total)
        results[f"baseline_producer_{client}_msgs_per_s"] = round(raw)
        rep.add(f"baseline: raw producer, {client}", raw, None, total / (time.process_time() - c0))
        kcfg = f"[global]\ntype=kafka\n[kafka]\nservers={broker.servers}\nclient={client}\n"
        e2e(f"kafka-{client}", kcfg, total, raw, f"capturer -> kafka ({client})")
        broker.kill()
        if "workers" in only:
            broker = warm_broker(Broker().start())
            extra.append(broker)
            kcfg = f"[global]\ntype=kafka\n[kafka]\nservers={broker.servers}\nclient={client}\n"
            e2e(f"kafka-{client}-workers", kcfg, total, results[f"kafka-{client}"]["rows_per_s"],
                f"capturer -> kafka ({client}), regions in worker processes; ratio to in-process",
                region_extra="process=true\n")
            broker.kill()
        if "ab" in only:
            from senders.kafka import sender as ksender

            broker = warm_broker(Broker().start())
            extra.append(broker)
            kcfg = f"[global]\ntype=kafka\n[kafka]\nservers={broker.servers}\nclient={client}\n"
            real_c, ksender._kafka_json = ksender._kafka_json, None
            try:
                e2e(f"kafka-{client}-pyenc", kcfg, total, results[f"kafka-{client}"]["rows_per_s"],
                    f"capturer -> kafka ({client}), messages encoded in Python; ratio to the C encoder")
            finally:
                ksender._kafka_json = real_c
            broker.kill()
        if "senderprocs" in only and client == "confluent":
            broker = warm_broker(Broker().start())
            extra.append(broker)
            kcfg = f"[global]\ntype=kafka\n[kafka]\nservers={broker.servers}\nclient={client}\n"
            e2e("kafka-confluent-proc", with_procs(kcfg), total, results["kafka-confluent"]["rows_per_s"],
                "capturer -> kafka (confluent), sender in its own process; ratio to in-process")
            broker.kill()
    if "kafka-kafka-python" in results and "kafka-confluent" in results:
        rep.add("capturer -> kafka (kafka-python); ratio to the confluent sender",
                results["kafka-kafka-python"]["rows_per_s"], results["kafka-confluent"]["rows_per_s"],
                results["kafka-kafka-python"])


def part_spark(ctx: Bench) -> None:
    args, only, tmp, rep, results, total, e2e = ctx.args, ctx.only, ctx.tmp, ctx.rep, ctx.results, ctx.total, ctx.e2e
    raw = baseline_arrow_append(tmp, total)
    results["baseline_arrow_append_rows_per_s"] = round(raw)
    rep.add("baseline: raw Spark Arrow append (50k-row batches)", raw, None)
    e2e("spark", f"[global]\ntype=spark\n[spark]\nwarehouse={tmp / 'spark' / 'wh'}\n"
        "compaction_interval=0\nbatch_interval=1\n", total, raw, "capturer -> spark")
    if "senderprocs" in only:
        e2e("spark-proc", f"[global]\ntype=spark\n[spark]\nwarehouse={tmp / 'spark-proc' / 'wh'}\n"
            "compaction_interval=0\nbatch_interval=1\nprocess=true\n", total, results["spark"]["rows_per_s"],
            "capturer -> spark, sender in its own process; ratio to in-process")
    if not args.smoke:
        results["compaction_1M_seconds"] = round(compaction_seconds(tmp), 1)


def part_all(ctx: Bench) -> None:
    args, only, tmp, servers, extra, rep = ctx.args, ctx.only, ctx.tmp, ctx.servers, ctx.extra, ctx.rep
    results, total, decode, target, e2e = ctx.results, ctx.total, ctx.decode, ctx.target, ctx.e2e
    from devtools.local_kafka import Broker

    broker = warm_broker(Broker().start())
    extra.append(broker)
    reset_target(target)
    e2e("all", "[global]\ntype=local,mysql,kafka,spark\n"
        f"[local]\nfilepath={tmp / 'all' / 'changes.jsonl'}\n"
        f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={args.threads}\n"
        f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
        f"[spark]\nwarehouse={tmp / 'all' / 'wh'}\ncompaction_interval=0\nbatch_interval=1\n",
        total, decode, "capturer -> all four at once (file, mysql, kafka/confluent, spark)")
    broker.kill()
    if "file" in results:
        rep.add("capturer -> all four at once; ratio to capturer -> file alone", results["all"]["rows_per_s"],
                results["file"]["rows_per_s"], results["all"])
    if "ab" in only:
        broker = warm_broker(Broker().start())
        extra.append(broker)
        reset_target(target)
        (tmp / "all-nobacklog").mkdir()
        r = run_capturer(tmp / "all-nobacklog", servers, "[global]\ntype=local,mysql,kafka,spark\n"
                         f"[local]\nfilepath={tmp / 'all-nobacklog' / 'changes.jsonl'}\n"
                         f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={args.threads}\n"
                         f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
                         f"[spark]\nwarehouse={tmp / 'all-nobacklog' / 'wh'}\ncompaction_interval=0\n"
                         "batch_interval=1\n", total, extra_global="backlogMaxMB=0\n")
        results["all-nobacklog"] = r
        rep.add("capturer -> all four without a backlog (backlogMaxMB=0: one queue's worth, then the "
                "stream waits); the all-four run's ratio to it is the backlog's cost",
                r["rows_per_s"], results["all"]["rows_per_s"])
        results["all_backlog_vs_without"] = round(results["all"]["rows_per_s"] / r["rows_per_s"], 3)
        broker.kill()
        import gc

        broker = warm_broker(Broker().start())
        extra.append(broker)
        reset_target(target)
        tuned = gc.get_threshold()
        gc.set_threshold(700, 10, 10)  # Python's defaults
        try:
            e2e("all-gc-default", "[global]\ntype=local,mysql,kafka,spark\n"
                f"[local]\nfilepath={tmp / 'all-gcd' / 'changes.jsonl'}\n"
                f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={args.threads}\n"
                f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
                f"[spark]\nwarehouse={tmp / 'all-gcd' / 'wh'}\ncompaction_interval=0\nbatch_interval=1\n",
                total, results["all"]["rows_per_s"],
                "capturer -> all four, Python's default GC thresholds; ratio to the capturer's")
        finally:
            gc.set_threshold(*tuned)
        broker.kill()
    if "senderprocs" in only:
        broker = warm_broker(Broker().start())
        extra.append(broker)
        reset_target(target)
        e2e("all-proc", with_procs("[global]\ntype=local,mysql,kafka,spark\n"
            f"[local]\nfilepath={tmp / 'all-proc' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={args.threads}\n"
            f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
            f"[spark]\nwarehouse={tmp / 'all-proc' / 'wh'}\ncompaction_interval=0\nbatch_interval=1\n"),
            total, results["all"]["rows_per_s"],
            "capturer -> all four, each sender in its own process; ratio to all four in-process")
        broker.kill()
        broker = warm_broker(Broker().start())
        extra.append(broker)
        reset_target(target)
        e2e("all-proc-ks", with_procs("[global]\ntype=local,mysql,kafka,spark\n"
            f"[local]\nfilepath={tmp / 'all-proc-ks' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={args.threads}\n"
            f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
            f"[spark]\nwarehouse={tmp / 'all-proc-ks' / 'wh'}\ncompaction_interval=0\nbatch_interval=1\n",
            "kafka|spark"), total, results["all"]["rows_per_s"],
            "capturer -> all four, kafka and spark each in its own process (file and mysql in the capturer); "
            "ratio to all four in-process")
        broker.kill()
    if "ha" in only:
        all_with_ha(ctx)
    if "workers" in only:
        broker = warm_broker(Broker().start())
        extra.append(broker)
        reset_target(target)
        e2e("all-workers", "[global]\ntype=local,mysql,kafka,spark\n"
            f"[local]\nfilepath={tmp / 'all-workers' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={args.threads}\n"
            f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
            f"[spark]\nwarehouse={tmp / 'all-workers' / 'wh'}\ncompaction_interval=0\nbatch_interval=1\n",
            total, results["all"]["rows_per_s"],
            "capturer -> all four, regions in worker processes; ratio to all four in-process",
            region_extra="process=true\n")
        broker.kill()


def all_with_ha(ctx: Bench) -> None:
    """Part all, with ha: all four as the active capturer of an [ha] group, and without [ha] again after it."""
    args, tmp, extra, results, total = ctx.args, ctx.tmp, ctx.extra, ctx.results, ctx.total
    target, e2e = ctx.target, ctx.e2e
    from devtools.local_etcd import EtcdCluster
    from devtools.local_kafka import Broker

    etcd = EtcdCluster(tmp / "etcd-all", 1).start()
    extra.append(etcd)
    broker = warm_broker(Broker().start())
    extra.append(broker)
    reset_target(target)
    e2e("all-ha", "[global]\ntype=local,mysql,kafka,spark\n"
        f"[local]\nfilepath={tmp / 'all-ha' / 'changes.jsonl'}\n"
        f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={args.threads}\n"
        f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
        f"[spark]\nwarehouse={tmp / 'all-ha' / 'wh'}\ncompaction_interval=0\nbatch_interval=1\n",
        total, results["all"]["rows_per_s"],
        "capturer -> all four as the active capturer of an [ha] group (etcd: lease, checkpoints, "
        "fenced writes); ratio to all four without [ha]", ha=etcd.endpoints)
    broker.kill()
    etcd.stop()
    # the same without [ha] again, after it (A B A: the second run of a kind in one process, a
    # Spark session already up, is what the first one is not); the ratio is to their mean
    broker = warm_broker(Broker().start())
    extra.append(broker)
    reset_target(target)
    e2e("all-again", "[global]\ntype=local,mysql,kafka,spark\n"
        f"[local]\nfilepath={tmp / 'all-again' / 'changes.jsonl'}\n"
        f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={args.threads}\n"
        f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
        f"[spark]\nwarehouse={tmp / 'all-again' / 'wh'}\ncompaction_interval=0\nbatch_interval=1\n",
        total, results["all"]["rows_per_s"], "capturer -> all four again, without [ha] (after it)")
    broker.kill()
    for key in ("rows_per_s", "steady_rows_per_s"):
        base = [results[k].get(key) for k in ("all", "all-again")]
        if all(base) and results["all-ha"].get(key):
            results[f"all_ha_vs_without_{key}"] = round(
                results["all-ha"][key] / (sum(base) / 2), 3)
    print(f"all four with [ha] / without (mean of the runs before and after it): "
          f"{results.get('all_ha_vs_without_rows_per_s')} end to end, "
          f"{results.get('all_ha_vs_without_steady_rows_per_s')} steady (10-90 % of the rows)")


def part_independent(ctx: Bench) -> None:
    args, tmp, servers, extra, rep, results = ctx.args, ctx.tmp, ctx.servers, ctx.extra, ctx.rep, ctx.results
    total, target = ctx.total, ctx.target
    from devtools.local_kafka import Broker

    broker = warm_broker(Broker().start())
    extra.append(broker)
    ind = independent_runs(tmp, servers, target, broker.servers, total, args.threads)
    broker.kill()
    results["independent"] = ind
    rep.add("file, kafka, spark with the MySQL target hung; ratio to the three alone (their share)",
            ind["others_with_hung_mysql_rows_per_s"], ind["others_alone_rows_per_s"])
    rep.add("mysql catching up from the backlog after the hang; ratio to its live rate",
            ind["mysql_catch_up_rows_per_s"], results.get("mysql", {}).get("rows_per_s"))
    rep.add("file catching up from the backlog (paused until all was read); ratio to its live rate",
            ind["file_catch_up_rows_per_s"], results.get("file", {}).get("rows_per_s"))


def part_snapshot(ctx: Bench) -> None:
    args, tmp, extra, rep, results, failures = ctx.args, ctx.tmp, ctx.extra, ctx.rep, ctx.results, ctx.failures
    srows = 1_000_000 if not args.smoke else args.rows
    src = MariaDBInstance(tmp / "snapsrc", server_id=41).start()
    extra.append(src)
    t0 = time.perf_counter()
    load_sequence(src, "snap.t", srows)
    results["snapshot_load_seconds"] = round(time.perf_counter() - t0, 1)
    raw = raw_chunked_read(src, "snap.t")
    results["snapshot_raw_read"] = raw
    rep.add(f"baseline: raw chunked read of the {srows:,}-row table ({raw['driver']}, 20,000-row chunks, "
            "2 connections)", raw["rows_per_s"], None)
    runs = {}
    for name, opts in (("one", ""), ("ahead", "snapshot_read_ahead=true\n"), ("process", "process=true\n")):
        d = tmp / f"snap-file-{name}"
        runs[name] = snapshot_run(d, src, f"[global]\ntype=local\n[local]\nfilepath={d / 'o.jsonl'}\n"
                                  "rotate_mb=100000\n", srows, region_extra=opts)
        x = runs[name]
        cores = x.get("cpu_cores", {}).get("capturer", 0)  # rows per CPU-second of the capturer's process
        x["rows_per_core_second"] = round(x["rows_per_s"] / cores) if cores else None
        if x["rows"] < srows or x["exit"] != 0:
            failures.append(f"snapshot->file ({name}): {x['rows']} of {srows} rows, exit {x['exit']}")
    r, one = runs["one"], runs["one"]
    results["snapshot_file"] = r
    results["snapshot_file_read_ahead"] = runs["ahead"]
    results["snapshot_file_region_process"] = runs["process"]
    rep.add(f"snapshot of {srows:,} rows -> file, one reader (the default); ratio to the raw chunked read",
            r["rows_per_s"], raw["rows_per_s"])
    rep.add("snapshot -> file, read-ahead (a second connection per table); ratio to one reader",
            runs["ahead"]["rows_per_s"], one["rows_per_s"])
    rep.add("snapshot -> file, the region in a worker process (process=true); ratio to one reader",
            runs["process"]["rows_per_s"], one["rows_per_s"])
    rep.add("snapshot -> file, the region in a worker process; ratio to the raw chunked read",
            runs["process"]["rows_per_s"], raw["rows_per_s"])
    starget = MariaDBInstance(tmp / "snaptarget", server_id=42, binlog=False).start()
    extra.append(starget)
    ups = baseline_upsert(starget, srows)
    results["snapshot_baseline_upsert_rows_per_s"] = round(ups)
    rep.add("baseline: raw multi-row upsert into the target (1 conn, 1000-row batches)", ups, None)
    r = snapshot_run(tmp / "snap-mysql", src, f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\n"
                     f"port={starget.port}\nuser=root\nthreadnum={args.threads}\n", srows)
    results["snapshot_mysql"] = r
    rep.add(f"snapshot of {srows:,} rows -> mysql ({args.threads} workers)", r["rows_per_s"], ups)
    if r["rows"] < srows or r["exit"] != 0:
        failures.append(f"snapshot->mysql: {r['rows']} of {srows} rows, exit {r['exit']}")
    if not args.smoke:
        big = 10_000_000
        load_sequence(src, "snap.big", big)
        results["snapshot_rss"] = snapshot_rss(tmp, src, big)


def part_verifycost(ctx: Bench) -> None:
    args, tmp, results, failures = ctx.args, ctx.tmp, ctx.results, ctx.failures
    vc = verify_cost(tmp, preload=min(200_000, max(20_000, args.rows)), seconds=8 if args.smoke else 20)
    results["verifycost"] = vc
    for name in ("cli", "post"):
        if 1 in vc[name]["exit_codes"] or not vc[name]["verify_runs"]:
            failures.append(f"verify under load ({name}): runs {vc[name]['verify_runs']}, "
                            f"exit codes {vc[name]['exit_codes']} (1: a false alarm)")


def part_verify(ctx: Bench) -> None:
    args, tmp, rep, results, failures = ctx.args, ctx.tmp, ctx.rep, ctx.results, ctx.failures
    vrows = args.rows if args.smoke else args.verify_rows
    v = verify_runs(tmp, vrows, args.verify_lake_rows or None)
    results["verify"] = v
    rep.add(f"baseline: plain SELECT * of a {vrows:,}-row table (pymysql, 10k-row fetches)",
            v["select_rows_per_s"], None)
    rep.add(f"verify -> mysql target, {vrows:,} equal rows (chunk checksums in both servers); "
            "ratio to the SELECT", v["mysql"]["rows_per_s"], v["select_rows_per_s"])
    lk = v["lake"]
    rep.add(f"verify -> lake, {lk['lake_rows']:,} equal rows (merged view through Spark); ratio to the SELECT",
            lk["rows_per_s"], v["select_rows_per_s"])
    for name, r, want in (("mysql", v["mysql"], vrows), ("lake", lk, lk["lake_rows"])):
        if r["status"] != "equal" or r["rows"] != want or r["exit"] != 0:
            failures.append(f"verify {name}: status {r['status']}, {r['rows']} of {want} rows, "
                            f"exit {r['exit']}{' ' + r['error'][-300:] if r.get('error') else ''}")


def part_apply(ctx: Bench) -> None:
    args, tmp, servers, rep, results, failures = ctx.args, ctx.tmp, ctx.servers, ctx.rep, ctx.results, ctx.failures
    cpu_lines, total, target = ctx.cpu_lines, ctx.total, ctx.target
    reset_target(target)
    ar = apply_runs(tmp, servers, target, total, args.threads,
                    lag_seconds=5 if args.smoke else 20, lag_rate=2000 if args.smoke else 10_000)
    results["apply"] = ar
    direct = results["mysql"]["rows_per_s"]
    rep.add("capturer -> kafka -> applier -> mysql, end to end; ratio to capturer -> mysql",
            ar["end_to_end_rows_per_s"], direct)
    rep.add("applier draining a full backlog -> mysql; ratio to capturer -> mysql", ar["drain_rows_per_s"],
            direct)
    cpu_lines.append("apply end to end: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                      ar["end_to_end_cpu_cores"].items()))
    rep.add("applier draining, MySQL sender in its own process (process=true); ratio to capturer -> mysql",
            ar["drain_proc_rows_per_s"], direct)
    cpu_lines.append("apply drain: " + ", ".join(f"{k} {v:.2f}" for k, v in ar["drain_cpu_cores"].items()))
    cpu_lines.append("apply drain, process=true: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                               ar["drain_proc_cpu_cores"].items()))
    if ar["lag"]["measured"] < ar["lag"]["txns"]:
        failures.append(f"apply lag: {ar['lag']['measured']} of {ar['lag']['txns']} transactions seen "
                        "at the target")


def part_hatakeover(ctx: Bench) -> None:
    args, tmp, servers, results = ctx.args, ctx.tmp, ctx.servers, ctx.results
    r = ha_takeovers(tmp, servers, n=2 if args.smoke else 5)
    results["ha_takeover"] = r
    print(f"ha takeovers (lease {r['lease_seconds']} s, kill -9 of the active): to the standby active "
          f"p50 {r['to_active_p50_s']} s max {r['to_active_max_s']} s; to the file written again p50 "
          f"{r['to_writing_p50_s']} s max {r['to_writing_max_s']} s")


def part_latency(ctx: Bench) -> None:
    args, only, tmp, servers, extra, results = ctx.args, ctx.only, ctx.tmp, ctx.servers, ctx.extra, ctx.results
    target = ctx.target
    if "all" in results and "mysql" in only:
        # every sender at half the rate all four reached: the latency they keep at that load
        from devtools.local_kafka import Broker

        half = max(1000, results["all"]["rows_per_s"] // 2 // 100 * 100)
        broker = warm_broker(Broker().start())
        extra.append(broker)
        results["latency_all_half"] = latency_run(
            tmp, servers, rate=half, name="latency-all",
            other_senders="mysql,kafka,spark\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\nthreadnum={args.threads}\n"
            f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
            f"[spark]\nwarehouse={tmp / 'latency-all-wh'}\ncompaction_interval=0\nbatch_interval=0.02\n")
        broker.kill()
    results["latency"] = latency_run(tmp, servers)
    results["latency_20k"] = latency_run(tmp, servers, rate=20_000, name="latency-20k")
    if "workers" in only:
        results["latency_20k_workers"] = latency_run(tmp, servers, rate=20_000, name="latency-20k-workers",
                                                     region_extra="process=true\n")


def part_peers(ctx: Bench) -> None:
    args, tmp, servers, results, failures = ctx.args, ctx.tmp, ctx.servers, ctx.results, ctx.failures
    inserts, updates, deletes = ctx.inserts, ctx.updates, ctx.deletes
    import peers

    results["peers"] = peers.run(tmp / "peers", servers, {"c": inserts * 2, "u": updates * 2,
                                 "d": deletes * 2}, args.peers_snapshot_rows, load_sequence)
    failures += results["peers"]["problems"]
    print(peers.summary(results["peers"]))


def part_delta(ctx: Bench) -> None:
    args, tmp, results, failures = ctx.args, ctx.tmp, ctx.results, ctx.failures
    import lake_delta

    small = args.smoke
    r = lake_delta.run(tmp / "delta", preload=5_000 if small else 200_000, batches=2 if small else 5,
                       changes=2_000 if small else 20_000, rounds=1 if small else 2)
    results["delta"] = r
    failures += [f"delta: {p}" for p in r.get("problems", [])]
    print(lake_delta.summary(r))


def part_spark_apply(ctx: Bench) -> None:
    args, tmp, results, failures = ctx.args, ctx.tmp, ctx.results, ctx.failures
    import spark_apply

    from devtools.local_kafka import Broker

    small = args.smoke
    broker = warm_broker(Broker().start())
    try:
        r = spark_apply.run(tmp / "spark_apply", broker.servers, changes=3_000 if small else 60_000,
                            max_offsets=1_000 if small else 20_000, rounds=1 if small else 2)
    finally:
        broker.stop()
        broker.cleanup()
    results["spark_apply"] = r
    failures += [f"spark_apply: {p}" for p in r.get("problems", [])]
    print(spark_apply.summary(r))


def part_bigtxn(ctx: Bench) -> None:
    only, tmp, results, failures = ctx.only, ctx.tmp, ctx.results, ctx.failures
    results["big_txn"] = big_txn_rss(tmp)
    if "workers" in only:
        results["big_txn_workers"] = big_txn_rss(tmp, region_extra="process=true\n", name="bigtxn-workers")
    failures += [f"{k}: the transaction was not delivered" for k in ("big_txn", "big_txn_workers")
                 if k in results and not results[k]["delivered"]]


class Part(NamedTuple):
    """A part of the bench: ``--only`` names it by its key in PARTS."""

    fn: Callable[[Bench], None]
    about: str  # one line, for --help
    needs: frozenset[str] = frozenset()  # other names --only must hold for it to run
    smoke: bool = True  # runs in a --smoke run too
    name: str = ""  # its name in the results (part_seconds, failed_parts) if not its key


# the parts in the order they run (later ones compare with earlier ones' figures, and apply adds rows to the sources)
PARTS: dict[str, Part] = {
    "file": Part(part_file, "capturer -> file (2 regions), next to the decode baselines"),
    "workers": Part(part_workers, "capturer -> file, regions in worker processes (process=true); with kafka, all, "
                    "latency, bigtxn: those in worker processes too"),
    "regions16": Part(part_regions16, "16 regions -> file, in-process and through 2 agents"),
    "agents": Part(part_agents, "the agent transport's ceiling, and 2 regions each served by an agent process -> file"),
    "baikaldb": Part(part_baikaldb, "BaikalDB row decoders, and a BaikalDB double (2 regions) -> file"),
    "pgsnapshot": Part(part_pgsnapshot, "PostgreSQL snapshot -> file, next to a chunked read and COPY"),
    "postgresql": Part(part_postgresql, "PostgreSQL: the raw pgoutput stream, its parse, the region -> file "
                       "(and -> kafka with kafka)"),
    "mysql": Part(part_mysql, "capturer -> mysql target, next to a raw multi-row upsert"),
    "kafka": Part(part_kafka, "capturer -> kafka with each of --kafka-clients, next to a raw producer"),
    "spark": Part(part_spark, "capturer -> spark (the lake), next to a raw Arrow append"),
    "all": Part(part_all, "all four senders at once (with mysql and kafka); with ha: as the active of an [ha] group",
                needs=frozenset({"mysql", "kafka"})),
    "independent": Part(part_independent, "the other senders' share with the MySQL target hung, and senders "
                        "catching up from the backlog (with mysql)", needs=frozenset({"mysql"})),
    "snapshot": Part(part_snapshot, "snapshot of a table -> file (one reader, read-ahead, a worker process) "
                     "and -> mysql"),
    "verifycost": Part(part_verifycost, "what verify (the CLI, and POST /verify in the capturer) costs a running "
                       "capture under a steady load"),
    "verify": Part(part_verify, "python -m capturer verify of an equal table against a MySQL target and the lake, "
                   "next to a plain SELECT"),
    "apply": Part(part_apply, "capturer -> kafka -> applier -> mysql, a backlog drained, commit -> visible lag "
                  "(with mysql)", needs=frozenset({"mysql"})),
    "ha": Part(part_hatakeover, "takeover times of an [ha] group, kill -9 of the active (results: hatakeover)",
               name="hatakeover"),
    "latency": Part(part_latency, "commit -> ack latency at steady rates (not with --smoke)", smoke=False),
    "peers": Part(part_peers, "beside Debezium in Kafka Connect (bench/peers.py; not in the default: a Connect JVM)"),
    "delta": Part(part_delta, "the Delta sender's MERGE next to a raw Delta append of the same rows and the "
                  "changelog sender (bench/lake_delta.py; sender-level, no sources; not in the default: PySpark 4.2)"),
    "spark_apply": Part(part_spark_apply, "python -m capturer spark-apply draining Kafka into Delta on local[1], then "
                        "on a standalone Spark cluster of 1 and of 2 one-core workers (bench/spark_apply.py; not in "
                        "the default: PySpark 4.2, three Spark applications)"),
    "bigtxn": Part(part_bigtxn, "one 1,000,000-row transaction -> file, peak RSS (not with --smoke)", smoke=False),
}
# names --only takes that are no part of their own: they add runs to the parts above
MODIFIERS = {
    "ab": "to file, mysql, kafka and all: runs without this release's speed-ups, for the ratio",
    "atomic": "to mysql: whole source transactions (txn_atomic), with the lanes' position and without it",
    "senderprocs": "to file, mysql, kafka, spark and all: each sender in a process of its own; and all with "
                   "only kafka and spark in processes",
}


def parts_listing() -> str:
    width = max(map(len, [*PARTS, *MODIFIERS]))
    return ("parts (--only, in the order they run):\n"
            + "\n".join(f"  {k:<{width}}  {p.about}" for k, p in PARTS.items())
            + "\nand, adding runs to other parts:\n"
            + "\n".join(f"  {k:<{width}}  {about}" for k, about in MODIFIERS.items()))


def argparser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(epilog=parts_listing(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000, help="inserts per run (split over regions)")
    ap.add_argument("--smoke", action="store_true", help="assert completeness only (CI)")
    ap.add_argument("--threads", type=int, default=8, help="MySQL sender workers")
    ap.add_argument("--only", default="file,workers,agents,baikaldb,postgresql,snapshot,pgsnapshot,mysql,apply,kafka,"
                    "spark,all,latency,bigtxn,senderprocs,independent,verify,verifycost,ha",
                    help="parts to run; 'ab' adds, to mysql and kafka, a run without this release's sender speed-ups "
                    "(Kafka: the Python message encoder instead of C; MySQL: updates as UPDATE statements instead of "
                    "upserts, and values as parameters with one phase per batch; file: the binlog read through an 8 KiB buffer instead of 256 KiB, and every table map "
                    "parsed by the library instead of once per definition; all four: Python's default GC thresholds, and no "
                    "backlog); 'independent' (with mysql): the other senders' share with the MySQL target hung, "
                    "and senders catching up from the backlog; 'verify': python -m capturer verify of an equal table "
                    "against a MySQL target and the lake, next to a plain SELECT of it; 'verifycost': what verify "
                    "(the CLI, and POST /verify in the capturer) costs a running capture under a steady load; 'ha': all four as "
                    "the active capturer of an [ha] group (ratio to all four), and takeover times (kill -9 of the active); "
                    "'peers' (not in the default): beside Debezium in Kafka Connect (bench/peers.py)")
    ap.add_argument("--verify-rows", type=int, default=1_000_000, help="rows of the table 'verify' compares "
                    "(--smoke: --rows)")
    ap.add_argument("--verify-lake-rows", type=int, default=0, help="rows of it in the lake (default: all)")
    ap.add_argument("--peers-snapshot-rows", type=int, default=1_000_000, help="peers: rows of the snapshot table "
                    "(0: no snapshot run)")
    ap.add_argument("--kafka-clients", default="kafka-python,confluent", help="Kafka clients to run")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (servers' data, outputs, "
                    "logs); removed at the end otherwise")
    ap.add_argument("--out", help="where the results go (default: bench/results/<date>[-<parts>].json; "
                    "--smoke: nowhere)")
    ap.add_argument("--fail-part", default="", help=argparse.SUPPRESS)  # the bench's own test: that part fails
    ap.add_argument("--part-timeout", type=float, default=0, help="a part running longer than this many seconds "
                    "prints every thread's stack and the processes it started, and the run ends as on SIGTERM "
                    "(what was measured is written, every process stopped); 0: no limit")
    return ap


def main() -> int:
    ap = argparser()
    args = ap.parse_args()
    only = set(args.only.split(","))
    unknown = sorted(only - set(PARTS) - set(MODIFIERS) - {""})
    if unknown:
        ap.error(f"--only: no part named {', '.join(unknown)}\n{parts_listing()}")

    # SIGTERM (a CI timeout, kill) ends the run as Ctrl-C does: what was measured is written, every process stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # the capturer runs in this process: malloc as ``python -m capturer`` sets it (CAPTURER_MALLOC=default: glibc's own)
    from capturer.util.memory import GC_THRESHOLDS, tune_gc, tune_malloc

    results_malloc = "fixed mmap threshold" if tune_malloc() else "glibc default"
    # and the collector as ``python -m capturer`` sets it (CAPTURER_GC=default: Python's own)
    results_gc = f"thresholds {GC_THRESHOLDS}" if tune_gc() else "Python default"
    inserts = args.rows // 2
    updates, deletes = inserts // 4, inserts // 10
    tmp = Path(tempfile.mkdtemp(prefix="capt-bench-"))
    servers = [MariaDBInstance(tmp / f"r{i}", server_id=i + 1).start() for i in range(2)]
    results: dict[str, Any] = {"date": dt.datetime.now().isoformat(timespec="seconds"),
                               "workload": {"inserts": inserts * 2, "updates": updates * 2, "deletes": deletes * 2,
                                            "regions": 2}, "cpu": os.cpu_count(), "malloc": results_malloc,
                               "gc": results_gc}
    full = only >= set(ap.get_default("only").split(","))
    ctx = Bench(args, only, full, tmp, servers, results)
    extra = ctx.extra
    results["complete"] = False
    try:
        prepare(ctx)
        for key, (fn, _, needs, smoke, name) in PARTS.items():
            if key in only and needs <= only and (smoke or not args.smoke):
                with ctx.part(name or key):
                    fn(ctx)
    finally:
        for m in servers + extra:
            try:
                m.stop()
            except Exception as e:  # (keep stopping the others)
                print(f"bench: stopping {m!r}: {e}", file=sys.stderr)
        stopped = stop_processes()
        if stopped:
            print(f"bench: stopped processes left running: {stopped}", file=sys.stderr)
        if args.keep:
            print(f"servers' data, outputs and logs kept in {tmp}", file=sys.stderr)
        else:  # (gigabytes: the servers' data dirs and every run's output)
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return report(ctx)


def report(ctx: Bench) -> int:
    """What was measured, printed; the results written one last time (exit 1 if incomplete)."""
    rep, results, failures, cpu_lines = ctx.rep, ctx.results, ctx.failures, ctx.cpu_lines
    results["table"] = rep.rows
    print(json.dumps(results, indent=2))
    print()
    print(rep.markdown())
    if cpu_lines:
        print(f"\ncores used during each run ({os.cpu_count()} here; 'machine' is every process on it):")
        print("\n".join(cpu_lines))
    for key in ("latency", "latency_20k", "latency_20k_workers", "latency_all_half"):
        if key in results:
            lat = results[key]
            print(f"\ncommit -> ack latency at {lat['rate_rows_per_s']} rows/s"
                  f"{' (regions in worker processes)' if 'workers' in key else ''}"
                  f"{' (all four senders, half their rate)' if key == 'latency_all_half' else ''}: p50 {lat['p50_ms']} ms, "
                  f"p99 {lat['p99_ms']} ms (over {lat['measured']} transactions)")
    if "apply" in results:
        lat = results["apply"]["lag"]
        print(f"\ncommit -> visible in the target through Kafka and an applier at {lat['rate_rows_per_s']} rows/s: "
              f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, max {lat['max_ms']} ms (over {lat['measured']} "
              "transactions)")
    if "big_txn" in results:
        b = results["big_txn"]
        print(f"one {b['rows']:,}-row transaction -> file: delivered={b['delivered']} in {b['seconds']} s, "
              f"capturer peak RSS {b['peak_rss_mb']} MB")
    if "big_txn_workers" in results:
        b = results["big_txn_workers"]
        print(f"the same, region in a worker process: delivered={b['delivered']} in {b['seconds']} s, "
              f"peak RSS: capturer {b['peak_rss_mb']} MB, region worker {b['worker_peak_rss_mb']} MB")
    if "snapshot_rss" in results:
        b = results["snapshot_rss"]
        print(f"snapshot of a {b['rows']:,}-row table -> file: done={b['done']} in {b['seconds']} s "
              f"({b['rows_per_s']:,} rows/s), capturer peak RSS {b['peak_rss_mb']} MB")
    if "verify" in results:
        v = results["verify"]
        for name in ("mysql", "lake"):
            r = v[name]
            print(f"verify -> {name}: {r['rows']:,} rows {r['status']} in {r['wall_seconds']} s wall "
                  f"({r['rows_per_s']:,} rows/s, {r['ratio_to_select']} x the plain SELECT's "
                  f"{v['select_rows_per_s']:,}); CPU s: verify {r['verify_cpu_s']}"
                  + (f", its JVM {r['children_cpu_s']}" if "children_cpu_s" in r else "")
                  + ", servers " + " + ".join(str(c) for c in r["servers_cpu_s"]))
    if "verifycost" in results:
        vc = results["verifycost"]
        for name in ("baseline", "cli", "post"):
            w = vc[name]
            print(f"verify cost, {name}: capturer {w['capturer_cores']} cores"
                  + (f" ({w['cores_ratio_to_baseline']} x the load alone)" if name != "baseline" else "")
                  + f", MySQL sender {w['mysql_rows_per_s']:,} rows/s, worst lag {w['worst_lag_s']} s, "
                  f"{w['verify_runs']} verify runs, exit codes {sorted(set(w['exit_codes']))}"
                  + (f", {w['verify_cpu_s_per_run']} CPU s per verify run" if "verify_cpu_s_per_run" in w else ""))
    if "compaction_1M_seconds" in results:
        print(f"compaction of 1M changes over 200k keys: {results['compaction_1M_seconds']} s")
    import resource

    results["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(f"peak RSS of the bench process (capturer in-process, no JVM): {results['peak_rss_mb']} MB")
    results["complete"] = not failures
    if failures:
        results["failures"] = failures
    ctx.save()
    if ctx.dest is not None:
        print(f"\nwritten {ctx.dest}" + (" (incomplete: see failed_parts / failures in it)" if failures else ""))
    if failures:
        print("\nINCOMPLETE: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

