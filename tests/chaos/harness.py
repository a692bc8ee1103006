"""The reliability suite's machinery: real servers, a continuous workload, a
seeded schedule of faults, and a row-for-row check of every sink.

Everything is real: two MariaDB source regions, a MariaDB target, an Apache
Kafka broker (devtools/local_kafka.py; a restart keeps its topics), local Spark
and the capturer as a child process (``python -m capturer``, as ``start.sh``
runs it). Until 2026-11-27 the broker was Tansu, a Kafka-protocol lookalike
keeping its log in moto's S3 server (docs/tansu-idempotence.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
from bank import Bank, Sampler
from bank import setup as bank_setup
from helpers import ROOT, Broker, start_servers
from workload import SCHEMA, Workload

from devtools.local_mariadb import MariaDBInstance, free_port
from senders.local.replay import read_changes, rebuild

TABLES = ["users", "pairs", "log", "bulk"]
CHAOS_SCHEMA = SCHEMA + [
    "CREATE TABLE IF NOT EXISTS app.bulk (id BIGINT PRIMARY KEY, shard INT NOT NULL, n INT NOT NULL, "
    "payload VARCHAR(200) NOT NULL)",
]


# ----------------------------------------------------------------------------- servers


class PersistentBroker(Broker):
    """The suite's Apache Kafka broker (a JVM of its own; a restart keeps every topic), with the
    figures of its restarts: how long each SIGTERM stop took, and how many did not finish in time."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.killed_after_term = 0  # stops that SIGTERM did not finish in time
        self.stop_seconds: list[float] = []

    def stop_gracefully(self, timeout: float = 120) -> None:
        """SIGTERM and wait for a clean shutdown, as an operator restarts a broker (SIGKILL after
        ``timeout`` seconds, counted in killed_after_term)."""
        if self.proc is not None:
            t0 = time.monotonic()
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.killed_after_term += 1
            self.stop_seconds.append(time.monotonic() - t0)
            self.proc = None


class ChaosKafka:
    """The suite's Kafka: one broker, or a cluster of three (replication factor 3, ``min.insync.replicas``
    2) whose faults move partition leaders: a broker killed or stopped hands its leaderships to the
    others, and the controller hands them back (preferred leader election every few seconds) once it
    is back. Every node keeps its log across restarts."""

    def __init__(self, n: int) -> None:
        from devtools.local_kafka import Cluster

        self.cluster = None if n == 1 else Cluster(
            n, node=PersistentBroker, settings={"leader.imbalance.check.interval.seconds": "5",
                                                "leader.imbalance.per.broker.percentage": "0"})
        self.brokers: list[PersistentBroker] = ([PersistentBroker()] if self.cluster is None
                                                else self.cluster.brokers)  # type: ignore[assignment]

    @property
    def servers(self) -> str:
        return ",".join(b.servers for b in self.brokers)

    def start(self) -> ChaosKafka:
        if self.cluster is not None:
            self.cluster.start()
        else:
            self.brokers[0].start()
        return self

    @property
    def killed_after_term(self) -> int:
        return sum(b.killed_after_term for b in self.brokers)

    @property
    def stop_seconds(self) -> list[float]:
        return [x for b in self.brokers for x in b.stop_seconds]

    def leaders_on(self, broker: PersistentBroker) -> set[tuple[str, int]]:
        """The partitions ``broker`` leads, as another running broker's metadata says (empty with one)."""
        from confluent_kafka.admin import AdminClient

        others = [o.servers for o in self.brokers if o is not broker and o.proc is not None]
        if not others:
            return set()
        md = AdminClient({"bootstrap.servers": ",".join(others)}).list_topics(timeout=30)
        return {(t, p) for t, tm in md.topics.items() for p, pm in tm.partitions.items()
                if pm.leader == broker.node_id}

    def cleanup(self) -> None:
        for b in self.brokers:
            b.cleanup()


# ----------------------------------------------------------------------------- workload


class ChaosWorkload(Workload):
    """The OLTP mix of ``tests/workload.py`` (PK changes, unique-key swaps, a keyless
    table, rollbacks) plus big transactions that spill and DDL, and it rides out a
    restart of its server (a failed transaction is retried as a new one; the
    sources are the truth the sinks are compared with, not this model)."""

    def __init__(self, m: MariaDBInstance, shard: int, seed: int, big_rows: int):
        super().__init__(m, shard, seed)
        self.big_rows = big_rows
        self.bulk_next = shard * 1_000_000_000  # key ranges of the shards never meet
        self.big_txns = 0
        self.ddls = 0
        self.failed = 0
        self.paused = threading.Event()
        self.idle = threading.Event()
        self.want_big = threading.Event()
        self.want_ddl = threading.Event()

    def _big(self) -> None:
        assert self.conn is not None
        with self.conn.cursor() as cur:
            if self.rng.random() < 0.6 or self.bulk_next == self.shard * 1_000_000_000:
                rows = [(self.bulk_next + i, self.shard, i, f"p{self.rng.randrange(10**6)}" * 3)
                        for i in range(self.big_rows)]
                n = cur.executemany("INSERT INTO app.bulk VALUES (%s,%s,%s,%s)", rows)
                self.bulk_next += self.big_rows
            else:  # a big update, half of it moving primary keys
                n = cur.execute("UPDATE app.bulk SET n = n + 1, id = IF(n %% 2 = 0, id + 1000000, id) "
                                "WHERE shard = %s ORDER BY id DESC LIMIT %s", (self.shard, self.big_rows))
        self.conn.commit()
        self.rows += n
        self.big_txns += 1

    def _ddl(self) -> None:
        assert self.conn is not None
        self.ddls += 1
        col = f"c{self.shard}_{self.ddls}"
        with self.conn.cursor() as cur:
            cur.execute(f"ALTER TABLE app.bulk ADD COLUMN IF NOT EXISTS `{col}` INT NULL")
            cur.execute(f"ALTER TABLE app.bulk DROP COLUMN IF EXISTS `{col}`")

    def step(self) -> None:
        if self.paused.is_set():
            self.idle.set()
            time.sleep(0.05)
            return
        self.idle.clear()
        try:
            if self.conn is None:
                self.conn = self.m.connect(connect_timeout=3, read_timeout=30, write_timeout=30)
                self.conn.autocommit(False)
            if self.want_ddl.is_set():
                self.want_ddl.clear()
                self._ddl()
            elif self.want_big.is_set() or self.rng.random() < 0.004:
                self.want_big.clear()
                self._big()
            else:
                super().step()
        except pymysql.err.MySQLError:
            self.failed += 1
            with contextlib.suppress(Exception):
                if self.conn is not None:
                    self.conn.close()
            self.conn = None
            time.sleep(0.2)

    def run_until(self, stop: threading.Event, pace: float) -> None:
        try:
            while not stop.is_set():
                self.step()
                if pace:
                    time.sleep(pace)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.idle.set()


# ----------------------------------------------------------------------------- status hammer


class StatusHammer(threading.Thread):
    """Hits the status port from several connections: GETs of every page and
    junk (garbage bytes, a huge header, a half request). Counts what answered."""

    def __init__(self, port: int, seed: int):
        super().__init__(daemon=True)
        self.port = port
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.ok = 0
        self.refused = 0
        self.junk = 0

    def _one(self) -> None:
        kind = self.rng.random()
        with socket.create_connection(("127.0.0.1", self.port), 2) as s:
            s.settimeout(5)
            if kind < 0.7:
                path = self.rng.choice(["/status", "/metrics", "/health", "/", "/nope", "/status?x=1"])
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            elif kind < 0.8:
                s.sendall(bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 4096))))
                self.junk += 1
            elif kind < 0.9:
                s.sendall(b"GET /status HTTP/1.1\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n")
                self.junk += 1
            else:
                s.sendall(b"GET /../../etc/passwd HTTP/1.1\r\n")  # and never finishes it
                self.junk += 1
                return
            with contextlib.suppress(OSError):
                head = s.recv(64)
                if head.startswith(b"HTTP/1.") and b" 200 " in head[:16]:
                    self.ok += 1

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._one()
            except OSError:
                self.refused += 1  # a capturer that is down (killed on purpose) refuses
                time.sleep(0.1)


# ----------------------------------------------------------------------------- the capturer


class Capturer:
    """``python -m capturer`` as a child; can be armed with a failpoint."""

    def __init__(self, cfg: Path, log: Path):
        self.cfg, self.log = cfg, log
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "capturer", "--config", str(self.cfg)]

    def env(self, failpoints: str = "") -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("CAPTURER_FAILPOINTS", None)
        if failpoints:
            env["CAPTURER_FAILPOINTS"] = failpoints
        return env

    @staticmethod
    def cwd() -> str:
        return str(ROOT)

    def start(self, failpoints: str = "") -> Capturer:
        with open(self.log, "ab") as out:
            out.write(f"\n===== start {time.strftime('%H:%M:%S')} failpoints={failpoints or '-'}\n".encode())
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env(failpoints), cwd=self.cwd())
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def wait_dead(self, timeout: float) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, timeout: float = 120) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


# ----------------------------------------------------------------------------- the run


@dataclass
class Plan:
    seed: int
    kills: int  # kill -9 in total (random moments + at failpoints)
    target_outage: float  # seconds the MySQL target is down
    broker_restarts: int = 1  # a broker stopped with SIGTERM (of a cluster: one at random) and started again
    broker_kills: int = 0  # a broker killed with SIGKILL (kill -9) and started again
    kafka_brokers: int = 1  # 3: a cluster (replication factor 3, min.insync.replicas 2); its faults move leaders
    source_restarts: int = 1
    gap: tuple[float, float] = (3.0, 7.0)  # seconds of load between faults
    big_rows: int = 600
    spill_rows: int = 300
    pace: float = 0.01  # seconds between a shard's transactions: a load the sinks can follow on 2 cores
    spark: bool = True
    kafka_client: str = "kafka-python"  # the Kafka sender's client (kafka-python is the default)
    # high availability: two capturers in an [ha] group with a private etcd; this many kill -9 of the active
    # one (the standby takes over; the killed one comes back as a standby). With it, kills must be 0 (a
    # failpoint armed in a capturer that comes back as a standby would never be reached)
    ha_takeovers: int = 0
    # the MySQL sender's txn_atomic: with it, the reader of the target (the bank workload's Sampler) must never
    # see a state the sources never had; without it, never a row going back to an older image (issue 43)
    txn_atomic: bool = False


@dataclass
class Figures:
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    recoveries: list[tuple[str, float]] = field(default_factory=list)
    rows_written: int = 0
    txns: int = 0
    big_txns: int = 0
    ddls: int = 0
    broker_stops: list[float] = field(default_factory=list)  # seconds each graceful broker stop took
    failed_source_txns: int = 0
    lost: int = 0
    diverged: int = 0
    duplicates: dict[str, int] = field(default_factory=dict)
    status_ok: int = 0
    status_junk: int = 0
    elapsed: float = 0.0
    takeovers: list[float] = field(default_factory=list)  # seconds from kill -9 of the active to the standby running
    leader_moves: int = 0  # partitions whose leader moved away from a broker that was stopped or killed
    check_seconds: dict[str, float] = field(default_factory=dict)  # how long each sink's comparison took
    # a reader of the MySQL target (tests/bank.py's Sampler, one consistent read every ~40 ms through every
    # fault): samples taken, samples lost to the target's outage, rows seen going back to an older image
    # (regressions) and samples showing a state the sources never had (broken: counted against txn_atomic)
    reader_samples: int = 0
    reader_outages: int = 0
    reader_regressions: list[str] = field(default_factory=list)
    reader_broken: list[str] = field(default_factory=list)

    def max_recovery(self) -> float:
        return max((r for _, r in self.recoveries), default=0.0)

    def text(self) -> str:
        worst = max(self.recoveries, key=lambda x: x[1], default=("-", 0.0))
        return (
            f"chaos: faults injected {sum(self.faults.values())} ({dict(self.faults)}); "
            f"rows written {self.rows_written} in {self.txns} txns ({self.big_txns} spilled big, {self.ddls} DDL "
            f"pairs, {self.failed_source_txns} source txns failed by restarts); rows lost {self.lost}; "
            f"rows diverged {self.diverged}; duplicates (identified by region, commit_ts, seq) {self.duplicates}; "
            f"max recovery {worst[1]:.1f}s ({worst[0]}); status answers {self.status_ok} "
            f"(+{self.status_junk} junk requests); broker stops on SIGTERM took "
            f"{[round(x, 1) for x in self.broker_stops]} s; partition leaders moved {self.leader_moves}; "
            f"{self.elapsed:.0f}s; checks (s) {self.check_seconds}; MySQL sink: reader samples "
            f"{self.reader_samples} (+{self.reader_outages} during outages), regressions seen by readers "
            f"{len(self.reader_regressions)}, states the sources never had {len(self.reader_broken)}"
            + (f"; takeovers {len(self.takeovers)}: p50 {statistics.median(self.takeovers):.1f} s, max "
               f"{max(self.takeovers):.1f} s" if self.takeovers else "")
        )


def checkpoint_ts(cp: Path) -> int:
    try:
        return int(json.loads(cp.read_text())["commit_ts"])
    except (OSError, ValueError, KeyError):
        return 0


def covers(cp: Path, sources: list[MariaDBInstance]) -> bool:
    """Every sender acknowledged every change the sources have now (its own cut)."""
    try:
        d = json.loads(cp.read_text())
    except (OSError, ValueError):
        return False
    cuts = [s["regions"] for s in d.get("senders", {}).values() if not s.get("detached")] or [d.get("regions", {})]
    for i, m in enumerate(sources):
        try:
            want = m.master_position()
        except pymysql.err.MySQLError:
            return False
        for regions in cuts:
            pos = regions.get(f"r{i + 1}")
            if pos is None or (pos["file"], pos["pos"]) < want:
                return False
    return True


def wait(pred: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class ChaosRun:
    def __init__(self, tmp: Path, plan: Plan):
        self.tmp, self.plan = tmp, plan
        self.rng = random.Random(plan.seed)
        self.fig = Figures()
        self.sources: list[MariaDBInstance] = []
        self.target: MariaDBInstance | None = None
        self.broker: ChaosKafka | None = None
        self.cp = tmp / "checkpoint.json"
        self.out = tmp / "out" / "changes.jsonl"
        self.wh = tmp / "wh"
        self.http_port = free_port()
        self.loads: list[ChaosWorkload] = []
        self.stop_load = threading.Event()
        self.threads: list[threading.Thread] = []
        self.cap: Capturer | None = None
        self.ha = plan.ha_takeovers > 0
        self.etcd: Any = None
        self.standby: Capturer | None = None  # with ha: the other capturer of the group
        self.http_port_b = free_port()
        if self.ha:
            self.cp = tmp / "etcd-checkpoint.json"  # the state in etcd, pulled for the checks

    # -- set-up / tear-down
    def __enter__(self) -> ChaosRun:
        try:
            self.sources = start_servers(self.tmp, 2)
            for i, m in enumerate(self.sources):
                m.execute(*CHAOS_SCHEMA)
                bank_setup(m, i + 1)
            self.target = MariaDBInstance(self.tmp / "target", server_id=99, binlog=False).start()
            self.broker = ChaosKafka(self.plan.kafka_brokers).start()
            if self.ha:
                from devtools.local_etcd import EtcdCluster

                self.etcd = EtcdCluster(self.tmp / "etcd", 1).start()
        except BaseException:
            self.__exit__()
            raise
        self._write_config()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_load.set()
        for t in self.threads:
            t.join(30)
        for c in (self.cap, self.standby):
            if c is not None:
                c.kill9()
        if self.etcd is not None:
            self.etcd.stop()
        for srv in [*self.sources, self.target]:
            if srv is not None:
                with contextlib.suppress(Exception):
                    srv.stop()
        if self.broker is not None:
            self.broker.cleanup()

    def _write_config(self) -> None:
        p, t = self.plan, self.tmp
        assert self.target is not None and self.broker is not None
        senders = ["local", "mysql", "kafka"] + (["spark"] if p.spark else [])
        (t / "senderConfig.cfg").write_text(
            f"[global]\ntype={','.join(senders)}\n"
            f"[local]\nfilepath={self.out}\nrotate_mb=4\n"
            f"[mysql]\nhost=127.0.0.1\nport={self.target.port}\nuser=root\npassword=\nthreadnum=4\n"
            f"txn_atomic={str(p.txn_atomic).lower()}\n"
            f"[kafka]\nservers={self.broker.servers}\nclient={p.kafka_client}\nreplication_factor={p.kafka_brokers}\n"
            f"[spark]\nmaster=local[1]\nwarehouse={self.wh}\nbatch_interval=1\ncompaction_interval=0\n"
        )
        (t / "filter_rule.txt").write_text("")
        regions = "".join(
            f"\n[region:r{i + 1}]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\npassword=capturer\n"
            f"server_id={800 + i}\nheartbeat_ms=200\n" for i, m in enumerate(self.sources))
        ha = f"\n[ha]\nendpoints={self.etcd.endpoints}\nname=chaos\nleaseSeconds=4\n" if self.ha else ""
        for name, port in (("config.cfg", self.http_port), ("config-b.cfg", self.http_port_b)):
            (t / name).write_text(
                f"[global]\nbinlogCheckPointPath={t / 'checkpoint.json'}\nsenderConfig={t / 'senderConfig.cfg'}\n"
                f"filterRuleDict={t / 'filter_rule.txt'}\nhttpPort={port}\ncheckpointInterval=0.5\n"
                f"controlToken=chaos\nspillRows={p.spill_rows}\nspillDir={t / 'spill'}\nlogLevel=info\n"
                + regions + ha)

    # -- the checkpoint (with ha: the one the active capturer last wrote to etcd)
    def cp_ts(self) -> int:
        self._pull_state()
        return checkpoint_ts(self.cp)

    def _pull_state(self) -> None:
        if not self.ha:
            return
        from capturer.ha.coord import CoordinationError, Coordinator, unpack_state

        try:
            got = Coordinator((self.etcd.endpoints,), "chaos", 4).get("state")
        except CoordinationError:
            return
        if got is not None:
            tmp = self.cp.with_name(self.cp.name + ".tmp")
            tmp.write_text(json.dumps(unpack_state(got[0])["checkpoint"]))
            tmp.replace(self.cp)

    def _role(self, port: int) -> str:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
                return str((json.loads(r.read()).get("ha") or {}).get("role", ""))
        except (OSError, ValueError):
            return ""

    def takeover(self) -> None:
        """kill -9 of the active capturer: the standby takes over; the killed one comes back as a standby."""
        assert self.cap is not None and self.standby is not None
        nodes = [(self.cap, self.http_port), (self.standby, self.http_port_b)]
        wait(lambda: sorted(self._role(port) for _, port in nodes) == ["active", "standby"], 120,
             "one active and one standby capturer")
        (active, _), (other, other_port) = sorted(nodes, key=lambda n: self._role(n[1]) != "active")
        before = self.cp_ts()
        active.kill9()
        self.fig.faults["takeover (kill -9 of the active capturer)"] += 1
        self.fig.takeovers.append(wait(lambda: self._role(other_port) == "active", 120, "the standby to take over"))
        self.fig.recoveries.append(("takeover", wait(lambda: self.cp_ts() > before, 300, "progress after a takeover")))
        active.start()

    # -- faults
    def _restart(self, label: str, failpoints: str = "") -> None:
        """Start the capturer again and time until its checkpoint moves past where it was."""
        before = self.cp_ts()
        assert self.cap is not None
        self.cap.start(failpoints)
        self.fig.recoveries.append((label, wait(lambda: self.cp_ts() > before, 300, f"progress after {label}")))

    def kill_random(self) -> None:
        assert self.cap is not None
        self.cap.kill9()
        self.fig.faults["kill -9 (random moment)"] += 1
        self._restart("kill -9")

    def kill_at(self, point: str, trigger: Callable[[], None]) -> None:
        """Restart armed with a failpoint that kills at ``point``; make it happen."""
        assert self.cap is not None
        self.cap.kill9()
        hit = self.rng.randint(1, 3) if point == "checkpoint.write" else 1
        self.cap.start(f"{point}=kill@{hit}")
        trigger()
        died = self.cap.wait_dead(90)
        if not died:  # the moment did not come: a random kill instead, counted as such
            self.cap.kill9()
        self.fig.faults[f"kill -9 at {point}" if died else "kill -9 (random moment)"] += 1
        self._restart(f"kill -9 at {point}")

    def target_outage(self) -> None:
        assert self.target is not None
        self.target.stop()
        time.sleep(self.plan.target_outage)
        before = self.cp_ts()
        self.target.start()
        self.fig.faults[f"MySQL target down {self.plan.target_outage:.0f}s"] += 1
        self.fig.recoveries.append(("MySQL target back", wait(lambda: self.cp_ts() > before, 300,
                                                             "progress after the target came back")))

    def broker_restart(self, kill: bool = False) -> None:
        """A broker (of a cluster: one at random) stopped with SIGTERM, or killed with SIGKILL, and
        started again after 1-4 s. With one broker the capturer's Kafka sender waits for it; in a
        cluster its leaderships move to the others and back once it returns."""
        assert self.broker is not None
        b = self.rng.choice(self.broker.brokers)
        led = self.broker.leaders_on(b)
        if kill:
            b.kill()
        else:
            b.stop_gracefully()
            self.fig.broker_stops = list(self.broker.stop_seconds)
            if self.broker.killed_after_term:
                self.fig.faults["Kafka broker did not stop on SIGTERM in 120 s (killed)"] += 1
        if len(self.broker.brokers) > 1:  # the partitions it led are led by others (after its session lapses)
            deadline = time.monotonic() + 30
            while self.broker.leaders_on(b) and time.monotonic() < deadline:
                time.sleep(0.5)
            self.fig.leader_moves += len(led) - len(self.broker.leaders_on(b))
        time.sleep(self.rng.uniform(1, 4))
        before = self.cp_ts()
        b.start()
        of = f" (1 of {len(self.broker.brokers)})" if len(self.broker.brokers) > 1 else ""
        self.fig.faults[f"Kafka broker {'killed (kill -9)' if kill else 'restarted'}{of}"] += 1
        self.fig.recoveries.append(("broker back", wait(lambda: self.cp_ts() > before, 300,
                                                       "progress after the broker restart")))

    def broker_kill(self) -> None:
        self.broker_restart(kill=True)

    def source_restart(self) -> None:
        i = self.rng.randrange(len(self.sources))
        w, m = self.loads[i], self.sources[i]
        w.paused.set()
        w.idle.wait(30)
        m.stop()
        time.sleep(self.rng.uniform(1, 3))
        m.start()
        w.paused.clear()
        before = self.cp_ts()
        self.fig.faults["source server restarted"] += 1
        self.fig.recoveries.append((f"source r{i + 1} back", wait(lambda: self.cp_ts() > before, 300,
                                                                 "progress after the source restart")))

    def _trigger_ddl(self) -> None:
        self.rng.choice(self.loads).want_ddl.set()

    def _trigger_big(self) -> None:
        self.rng.choice(self.loads).want_big.set()

    def schedule(self) -> list[Callable[[], None]]:
        p = self.plan
        special = [lambda: self.kill_at("checkpoint.write", lambda: None),
                   lambda: self.kill_at("region.ddl", self._trigger_ddl),
                   lambda: self.kill_at("spill.chunk", self._trigger_big),
                   # before a MySQL worker commits a chunk while the others commit theirs: a phase partly at the
                   # target, which the reader must never see re-applied (issue 43)
                   lambda: self.kill_at("mysql.commit", lambda: None)]
        kills: list[Callable[[], None]] = [self.takeover] * p.ha_takeovers
        for k in range(p.kills):
            kills.append(special[k] if k < len(special) else
                         (self.kill_random if self.rng.random() < 0.6 else self.rng.choice(special)))
        others: list[Callable[[], None]] = [self.target_outage]
        others += [self.broker_restart] * p.broker_restarts + [self.broker_kill] * p.broker_kills
        others += [self.source_restart] * p.source_restarts
        faults = kills + others
        self.rng.shuffle(faults)
        return faults

    # -- main
    def run(self) -> Figures:
        t_start = time.monotonic()
        p = self.plan
        self.loads = [ChaosWorkload(m, i + 1, p.seed * 10 + i, p.big_rows) for i, m in enumerate(self.sources)]
        self.threads = [threading.Thread(target=w.run_until, args=(self.stop_load, p.pace), daemon=True)
                        for w in self.loads]
        # the bank workload beside the OLTP mix, and a reader of the target checking each consistent read
        banks = [Bank(m, i + 1, p.seed * 10 + 5 + i, pause=0.05, resilient=True) for i, m in enumerate(self.sources)]
        assert self.target is not None
        sampler = Sampler(self.target, [1, 2], outages_ok=True)
        for t in self.threads:
            t.start()
        for b in banks:
            b.start()
        sampler.start()
        self.cap = Capturer(self.tmp / "config.cfg", self.tmp / "capturer.log").start()
        if self.ha:  # both at once
            self.standby = Capturer(self.tmp / "config-b.cfg", self.tmp / "capturer-b.log").start()
        wait(lambda: self.cp_ts() > 0, 180, "the first checkpoint")
        hammer = StatusHammer(self.http_port, p.seed)
        hammer.start()
        try:
            for fault in self.schedule():
                time.sleep(self.rng.uniform(*p.gap))
                for c in (self.cap, self.standby):
                    assert c is None or c.alive(), f"a capturer died on its own; see {c.log if c else ''}"
                fault()
            time.sleep(self.rng.uniform(*p.gap))
        finally:
            self.stop_load.set()
            for b in banks:
                b.stop.set()
            for t in [*self.threads, *banks]:
                t.join(60)
            hammer.stop.set()
            hammer.join(10)
        assert not [e for w in self.loads for e in w.errors], [e for w in self.loads for e in w.errors]
        assert not [e for b in banks for e in b.errors], [e for b in banks for e in b.errors]
        assert self.cap.alive(), f"the capturer died on its own; see {self.cap.log}"
        try:
            wait(lambda: (self._pull_state(), covers(self.cp, self.sources))[1], 600,
                 "every sender to acknowledge all source changes")
        finally:
            sampler.stop.set()
            sampler.join(30)
        assert not sampler.errors, sampler.errors[:3]
        if self.standby is not None:
            assert self.standby.alive(), f"a capturer died on its own; see {self.standby.log}"
            assert self.standby.stop() == 0, f"unclean final stop; see {self.standby.log}"
        assert self.cap.stop() == 0, f"unclean final stop; see {self.cap.log}"
        f = self.fig
        f.rows_written = sum(w.rows for w in self.loads)
        f.txns = sum(w.txns for w in self.loads)
        f.big_txns = sum(w.big_txns for w in self.loads)
        f.ddls = sum(w.ddls for w in self.loads)
        f.txns += sum(b.txns for b in banks)
        f.failed_source_txns = sum(w.failed for w in self.loads) + sum(b.failed for b in banks)
        f.reader_samples, f.reader_outages = sampler.samples, sampler.outages
        f.reader_regressions, f.reader_broken = sampler.regressions, sampler.broken
        f.status_ok, f.status_junk = hammer.ok, hammer.junk
        f.elapsed = time.monotonic() - t_start
        return f


# ----------------------------------------------------------------------------- checks


def source_json(sources: list[MariaDBInstance], table: str) -> list[str]:
    from capturer.model.encode import json_row

    out: list[str] = []
    for m in sources:
        c = m.connect()
        try:
            with c.cursor() as cur:
                cur.execute("SET time_zone='+00:00'")
                cur.execute(f"SELECT * FROM app.`{table}`")
                cols = [d[0] for d in cur.description]
                out += [json.dumps(json_row(dict(zip(cols, r)), set()), sort_keys=True) for r in cur.fetchall()]
        finally:
            c.close()
    return sorted(out)


def compare(name: str, want: list[Any], got: list[Any]) -> tuple[int, int, str]:
    """(lost, diverged) rows as multisets, and a short description."""
    from collections import Counter

    cw, cg = Counter(want), Counter(got)
    lost = sum((cw - cg).values())
    extra = sum((cg - cw).values())
    if not lost and not extra:
        return 0, 0, ""
    return lost, extra, (f"{name}: {len(want)} source rows, {len(got)} in the sink; missing e.g. "
                         f"{list((cw - cg).elements())[:2]}; extra e.g. {list((cg - cw).elements())[:2]}")


def duplicate_identities(items: list[tuple[tuple[Any, ...], str]]) -> tuple[int, list[str]]:
    """Copies of the same (region, commit_ts, seq) must be the same change."""
    seen: dict[tuple[Any, ...], str] = {}
    dups, bad = 0, []
    for ident, body in items:
        prev = seen.get(ident)
        if prev is None:
            seen[ident] = body
        else:
            dups += 1
            if prev != body:
                bad.append(f"{ident}: {prev[:200]} != {body[:200]}")
    return dups, bad


class Rec(tuple):  # (topic, partition, offset, key, value, headers, timestamp ms), as a consumer record names them
    topic = property(lambda self: self[0])
    partition = property(lambda self: self[1])
    offset = property(lambda self: self[2])
    key = property(lambda self: self[3])
    value = property(lambda self: self[4])
    headers = property(lambda self: self[5])
    timestamp = property(lambda self: self[6])


def consume_fast(servers: str, idle: float = 60.0, first: float = 300.0) -> list[Rec]:
    """Every committed message of every topic, from the beginning to the end offsets the broker gives
    when the read starts (the capturer is stopped by then), read as our consumers read (read_committed);
    confluent-kafka fetches all partitions at once. It ends when each partition reached its end, or,
    if a partition never does (a fault the check must show), ``idle`` seconds after the last message."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": servers, "group.id": f"chaos-check-{time.time_ns()}",
                  "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 2000,
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        md = c.list_topics(timeout=30)
        tps = [TopicPartition(t, p, OFFSET_BEGINNING) for t, tm in md.topics.items() if not t.startswith("__")
               for p in tm.partitions]
        # the end of each partition now; for a read_committed reader the last stable offset, which
        # equals it once no transaction is open (librdkafka answers from the leader, after retries)
        ends = {}
        for tp in tps:
            low, high = c.get_watermark_offsets(tp, timeout=60, cached=False)
            if high > low:
                ends[(tp.topic, tp.partition)] = high
        c.assign(tps)
        out: list[Rec] = []
        last = time.monotonic()
        pending = set(ends)
        # wait long for the first message (a broker just restarted can take a while to lead again)
        while pending and time.monotonic() - last < (idle if out else first):
            for msg in c.consume(10_000, timeout=0.5):
                err = msg.error()
                key = (msg.topic(), msg.partition())
                if err is not None:  # the end of a partition (past any transaction markers), or a retried error
                    if err.code() == KafkaError._PARTITION_EOF and msg.offset() >= ends.get(key, 0):
                        pending.discard(key)
                    continue
                out.append(Rec((msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                                msg.headers() or [], msg.timestamp()[1])))
                if msg.offset() + 1 >= ends.get(key, 0):
                    pending.discard(key)
                last = time.monotonic()
        return out
    finally:
        c.close()


def check_sinks(run: ChaosRun) -> list[str]:
    """Every sink against the sources; fills the figures; returns the problems."""
    problems: list[str] = []
    f = run.fig
    t0 = time.monotonic()
    want = {t: source_json(run.sources, t) for t in TABLES}

    # the file: replayed in order, copies collapsed by identity
    raw = list(read_changes(run.out, dedupe=False))
    items = [((d["region"], d["commit_ts"], d["seq"], d.get("sub", 0)), json.dumps(d, sort_keys=True))
             for d in raw if d.get("op") != "ddl"]
    dups, bad = duplicate_identities(items)
    f.duplicates["file"] = dups
    problems += [f"file: two different changes share an identity: {b}" for b in bad[:3]]
    problems += [f"file: a rolled-back row arrived: {d}" for d in raw
                 if "rolled back" in json.dumps(d.get("after"))][:3]
    state = rebuild(read_changes(run.out))
    for t in TABLES:
        got = sorted(json.dumps(r, sort_keys=True) for r in state.get(("app", t), {}).values())
        lost, div, why = compare(f"file app.{t}", want[t], got)
        f.lost += lost
        f.diverged += div
        problems += [why] if why else []
    f.check_seconds["file"] = round(time.monotonic() - t0, 1)

    # the MySQL target, row for row
    t0 = time.monotonic()
    from workload import rows_of

    assert run.target is not None
    from collections import Counter

    for t in TABLES:
        w = sorted((r for m in run.sources for r in rows_of(m, "app", t)), key=repr)
        g = rows_of(run.target, "app", t)
        if t == "log":  # the keyless table: a row applied twice is a second identical row
            f.duplicates["mysql"] = sum((Counter(map(repr, g)) - Counter(map(repr, w))).values())
        lost, div, why = compare(f"MySQL app.{t}", [repr(r) for r in w], [repr(r) for r in g])
        f.lost += lost
        f.diverged += div
        problems += [why] if why else []

    f.check_seconds["mysql"] = round(time.monotonic() - t0, 1)

    # Kafka, replayed by key
    t0 = time.monotonic()
    from integration.test_snapshot import rebuild_kafka

    assert run.broker is not None
    records = consume_fast(run.broker.servers)
    items = []
    for r in records:
        if r.value is None or r.topic == "capturer.schema_changes":
            continue
        h = {k: v.decode() for k, v in r.headers}
        body = json.loads(r.value)
        body.pop("ts_ms", None)  # when the capturer sent it (Debezium's meaning): a re-send differs there only
        items.append(((h["region"], h["commit_ts"], h["seq"], h["op"]), json.dumps(body, sort_keys=True)))
    dups, bad = duplicate_identities(items)
    f.duplicates["kafka"] = dups
    problems += [f"kafka: two different changes share an identity: {b}" for b in bad[:3]]
    state_k = rebuild_kafka(records)
    for t in TABLES:
        lost, div, why = compare(f"Kafka app.{t}", want[t], state_k.get(("app", t), []))
        f.lost += lost
        f.diverged += div
        problems += [why] if why else []
        if why:
            problems += kafka_trail(records, raw, t, want[t], state_k.get(("app", t), []))

    f.check_seconds["kafka"] = round(time.monotonic() - t0, 1)

    # the lake, through its merge-on-read views (in a child: its own JVM), and its changelogs' identities
    if run.plan.spark:
        t0 = time.monotonic()
        problems += check_lake(run)
        f.duplicates["spark"] = lake_changelog_duplicates(run.wh)
        f.check_seconds["lake"] = round(time.monotonic() - t0, 1)
    return problems


def lake_changelog_duplicates(wh: Path) -> int:
    """Identities (_region, _commit_ts, _seq, _sub) that appear more than once in a
    table's changelog (what an outside checker counts; the merged views count one)."""
    import pyarrow.parquet as pq

    n = 0
    for log_dir in wh.glob("*/changelog"):
        seen: set[tuple[Any, ...]] = set()
        for part in sorted(log_dir.rglob("*.parquet")):
            for r in pq.read_table(part, columns=["_region", "_commit_ts", "_seq", "_sub"]).to_pylist():
                k = (r["_region"], r["_commit_ts"], r["_seq"], r["_sub"])
                n += k in seen
                seen.add(k)
    return n


def kafka_trail(records: list[Rec], raw: list[dict[str, Any]], table: str, want: list[str],
                got: list[str]) -> list[str]:
    """For a few rows Kafka has wrong: every message of that row's key (or, in a
    keyless table, with that row image) next to the file's changes of it, so a
    failure says whether a message is absent or out of order."""
    from collections import Counter

    bad = list((Counter(got) - Counter(want)).elements())[:2] + list((Counter(want) - Counter(got)).elements())[:2]
    out = []
    for row_json in bad:
        row = json.loads(row_json)
        kid = row.get("id", row.get("a"))
        def hit(img: Any) -> bool:
            if not isinstance(img, dict):
                return False
            return img == row if kid is None else img.get("id", img.get("a")) == kid
        ks = [(r.partition, r.offset, {k: v.decode() for k, v in r.headers}.get("commit_ts"),
               {k: v.decode() for k, v in r.headers}.get("seq"), json.loads(r.value).get("op"))
              for r in records if r.value is not None and r.topic == f"capturer.app.{table}"
              and (hit(json.loads(r.value).get("before")) or hit(json.loads(r.value).get("after")))]
        fs = [(d["region"], d["commit_ts"], d["seq"], d["op"]) for d in raw
              if d.get("table") == table and (hit(d.get("before")) or hit(d.get("after")))]
        out.append(f"  trail of {row_json[:120]}: kafka (partition, offset, commit_ts, seq, op) {ks[:12]}; "
                   f"file (region, commit_ts, seq, op) {fs[:12]}")
    return out


def check_lake(run: ChaosRun) -> list[str]:
    from senders.spark.lakecli import verify
    from senders.spark.sender import build_session

    spark = build_session({"master": "local[1]"}, run.tmp / "sparkhome")
    problems = []
    try:
        srcs = [{"host": "127.0.0.1", "port": m.port, "user": "root", "password": ""} for m in run.sources]
        for t in TABLES:
            report = verify(spark, run.wh, "cdc", "app", t, srcs)
            lost = int(report.get("missing", 0))
            div = int(report.get("extra", 0)) + int(report.get("different", 0))
            run.fig.lost += lost
            run.fig.diverged += div
            if not report.get("equal") or lost or div:
                problems.append(f"lake app.{t}: {json.dumps(report, default=str)[:1500]}")
    finally:
        spark.stop()
    return problems
