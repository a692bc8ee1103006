"""Shared helpers for integration tests: private MariaDB servers and a capturer
run in-process or as a real subprocess (for kill -9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devtools.local_kafka import Broker
from devtools.local_mariadb import MariaDBInstance, free_port

ROOT = Path(__file__).resolve().parent.parent


class SharedBroker(Broker):
    """The one Apache Kafka broker (JVM) of a pytest run, lent to tests that do not break it.

    ``kill()`` and ``stop()`` give it back (they do nothing), so a test written for a broker of its own
    can take this one unchanged; ``shutdown()`` ends it (at the end of the run). A test that stops,
    kills, pauses or restarts its broker starts a ``Broker()`` of its own instead."""

    def kill(self) -> None:
        pass

    def stop(self, timeout: float = 60) -> None:
        pass

    def shutdown(self) -> None:
        Broker.kill(self)
        Broker.cleanup(self)

    def cleanup(self) -> None:
        self.shutdown()


_SHARED: list[SharedBroker] = []


def shared_broker() -> SharedBroker:
    """The run's shared broker, started at the first call and emptied at each: every topic but Kafka's
    own (``__*``) and every consumer group deleted, so a test sees only what it writes itself."""
    if _SHARED and _SHARED[0].proc is not None and _SHARED[0].proc.poll() is None:
        empty_broker(_SHARED[0].servers)
        return _SHARED[0]
    if _SHARED:
        _SHARED.pop().shutdown()
    _SHARED.append(SharedBroker().start())
    return _SHARED[0]


def empty_broker(servers: str, timeout: float = 60) -> None:
    """Delete every topic but the broker's own and every consumer group; return once metadata shows none."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": servers})
    groups = [g.group_id for g in admin.list_consumer_groups(request_timeout=30).result(timeout).valid]
    if groups:
        for f in admin.delete_consumer_groups(groups, request_timeout=30).values():
            try:
                f.result(timeout)
            except Exception:
                pass  # (a group of a consumer left running by a failed test; its topics go anyway)
    topics = [t for t in admin.list_topics(timeout=30).topics if not t.startswith("__")]
    if topics:
        for f in admin.delete_topics(topics, operation_timeout=30).values():
            try:
                f.result(timeout)
            except Exception:
                pass  # (already gone)
    deadline = time.monotonic() + timeout
    while any(not t.startswith("__") for t in admin.list_topics(timeout=30).topics):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the shared broker still has topics {topics} after deleting them")
        time.sleep(0.1)


def start_servers(tmp: Path, n: int, **kw: Any) -> list[MariaDBInstance]:
    servers = []
    for i in range(n):
        m = MariaDBInstance(tmp / f"mdb{i + 1}", server_id=i + 1, **kw).start()
        m.create_capture_user()
        servers.append(m)
    return servers


# snapshot_method given to every region write_config writes (set by the snapshot tests' fixture)
SNAPSHOT_METHOD = ""


def write_config(
    tmp: Path,
    servers: list[MariaDBInstance],
    senders: str = "",
    filter_text: str = "",
    extra_global: str = "",
    region_extra: str = "",
) -> Path:
    if SNAPSHOT_METHOD and "snapshot_method" not in region_extra:
        region_extra += f"snapshot_method={SNAPSHOT_METHOD}\n"
    regions = "".join(
        f"\n[region:r{i + 1}]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\n"
        f"password=capturer\nserver_id={800 + i}\nheartbeat_ms=200\n{region_extra}"
        for i, m in enumerate(servers)
    )
    (tmp / "filter_rule.txt").write_text(filter_text)
    (tmp / "senderConfig.cfg").write_text(
        senders or f"[global]\ntype=local\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n"
    )
    cfg = tmp / "config.cfg"
    cfg.write_text(
        "[global]\n"
        f"binlogCheckPointPath={tmp / 'checkpoint.json'}\n"
        f"senderConfig={tmp / 'senderConfig.cfg'}\n"
        f"filterRuleDict={tmp / 'filter_rule.txt'}\n"
        f"httpPort={free_port()}\ncheckpointInterval=0.5\n{extra_global}" + regions
    )
    return cfg


def read_lines(tmp: Path) -> list[dict[str, Any]]:
    from senders.local.replay import output_files

    out = []
    for p in output_files(tmp / "out" / "changes.jsonl"):
        # a line is whole once its newline is written: a running capturer may be in the middle of the last one
        lines = p.read_bytes().split(b"\n")[:-1]
        out.extend(json.loads(line) for line in lines if line)
    return out


def wait_for(pred: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def master_pos(m: MariaDBInstance) -> tuple[str, int]:
    return m.master_position()


def checkpoint_covers(tmp: Path, servers: list[MariaDBInstance]) -> bool:
    """Every sender has acknowledged every change the servers have now (each sender's
    own cut in the checkpoint; a version-1 checkpoint: its one position)."""
    p = tmp / "checkpoint.json"
    if not p.exists():
        return False
    try:
        cp = json.loads(p.read_text())
    except ValueError:
        return False
    cuts = [s["regions"] for s in cp.get("senders", {}).values() if not s.get("detached")] or [cp["regions"]]
    for i, m in enumerate(servers):
        want = master_pos(m)
        for regions in cuts:
            pos = regions.get(f"r{i + 1}")
            if pos is None or (pos["file"], pos["pos"]) < want:
                return False
    return True


LIVE_PROCESSES: list[subprocess.Popen[bytes]] = []  # capturers started by tests (killed after each test)


class CapturerProcess:
    """``python -m capturer`` as a child process, as start.sh runs it."""

    def __init__(self, cfg: Path, log: Path):
        self.cfg = cfg
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def _ready_count(self) -> int:
        try:
            return self.log.read_text(errors="replace").count("status on http")
        except FileNotFoundError:
            return 0

    def start(self) -> CapturerProcess:
        self._ready_before = self._ready_count()
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "capturer", "--config", str(self.cfg)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
            )
        LIVE_PROCESSES.append(self.proc)
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def wait_ready(self, timeout: float = 120) -> None:
        """Until this process serves its status (its pipeline is built and started)."""
        wait_for(lambda: self._ready_count() > self._ready_before or (self.proc is not None and self.proc.poll() is not None),
                 timeout, "the capturer to start")

    def stop(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.wait_ready()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def consume_all(servers: str, topics: list[str] | None = None, idle: float = 3.0, committed: bool = False) -> list[Any]:
    """Every message of the given topics (default: all), from the beginning; ``committed``: read_committed
    (what our consumers see), else read_uncommitted (also the messages of open and aborted transactions)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False, group_id=None,
                      isolation_level="read_committed" if committed else "read_uncommitted",
                      session_timeout_ms=6000, heartbeat_interval_ms=2000)
    try:
        names = topics if topics is not None else sorted(t for t in c.topics() if not t.startswith("__"))
        tps = [TopicPartition(t, p) for t in names for p in sorted(c.partitions_for_topic(t) or [])]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        # the idle wait counts only once every partition was read up to the end it had when the read began
        # (on a loaded machine the first fetch alone can take longer than ``idle``), or after 60 s without news
        end = c.end_offsets(tps) if tps else {}
        out: list[Any] = []
        last = time.monotonic()
        reached = not tps
        while True:
            batch = c.poll(timeout_ms=300)
            for recs in batch.values():
                out.extend(recs)
                last = time.monotonic()
            reached = reached or all(c.position(tp) >= end.get(tp, 0) for tp in tps)
            quiet = time.monotonic() - last
            if (reached and quiet >= idle) or quiet >= 60:
                return out
    finally:
        c.close()


def verify_equal(cfg: Path, senders: list[str], wait: float = 60) -> dict[str, Any]:
    """``python -m capturer verify`` of these senders must find every table equal (exit 0);
    its JSON report."""
    cmd = [sys.executable, "-m", "capturer", "verify", "--config", str(cfg), "--json", "--wait", str(wait)]
    for s in senders:
        cmd += ["--sender", s]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.returncode, p.stdout[-4000:], p.stderr[-2000:])
    report: dict[str, Any] = json.loads(p.stdout)
    assert {t["sender"] for t in report["tables"]} == set(senders), report["summary"]
    return report
