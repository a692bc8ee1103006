"""Senders that never hold each other back (issue 30), with real servers: two MariaDB
sources under a steady load, a MariaDB target, an Apache Kafka broker, the file and the lake.

* a MySQL target hung (SIGSTOP) under load: the file, Kafka and the lake go on at the
  load's pace; the target catches up from the backlog afterwards;
* a broker hung (SIGSTOP): the others go on;
* a sender paused with a small queueRows: the others go on, it catches up when resumed;
* the backlog limit under ``block`` (the stream waits) and ``detach`` (the sender is
  detached, the others go on, it is attached again);
* kill -9 while a sender catches up and while a backlog segment is written;
* a sender added to, or removed from, senderConfig.cfg between two starts.

Every run ends with every sink equal to the sources and no identity twice in any sink.
The long versions (60 s hang, 2 min broker outage, minutes of pause) run with --runslow.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from chaos.harness import compare, consume_fast, duplicate_identities, source_json
from helpers import Broker, CapturerProcess, checkpoint_covers, shared_broker, start_servers, verify_equal, wait_for
from workload import SCHEMA, TABLES, Workload, assert_target_equals_sources, file_state_equals

from devtools.local_mariadb import MariaDBInstance, free_port
from integration.test_snapshot import rebuild_kafka

pytestmark = pytest.mark.integration
TOKEN = "t0ken-independent"


class Load:
    """A steady load on every source (a transaction per ``pace`` seconds each)."""

    def __init__(self, sources: list[MariaDBInstance], pace: float = 0.01, seed: int = 30, shard0: int = 1):
        # shard0: where its key ranges start (a second load on the same servers takes others)
        self.loads = [Workload(m, shard0 + i, seed + i) for i, m in enumerate(sources)]
        self.stop = threading.Event()
        self.pace = pace
        self.threads: list[threading.Thread] = []

    def _run(self, w: Workload) -> None:
        try:
            while not self.stop.is_set():
                w.step()
                time.sleep(self.pace)
        except BaseException as exc:
            w.errors.append(exc)

    def __enter__(self) -> Load:
        for w in self.loads:
            t = threading.Thread(target=self._run, args=(w,), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        errors = [e for w in self.loads for e in w.errors]
        assert not errors, errors

    @property
    def rows(self) -> int:
        return sum(w.rows for w in self.loads)


# the tests that hang (SIGSTOP) or stop their broker: a broker of their own; the others borrow the run's
OWN_BROKER = {"test_a_hung_broker_holds_back_nobody", "test_a_mysql_target_hung_for_a_minute_and_a_broker_down_for_two"}


@pytest.fixture()
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    sources = start_servers(tmp_path, 2)
    for m in sources:
        m.execute(*SCHEMA)
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    own = request.node.originalname in OWN_BROKER
    broker = Broker().start() if own else shared_broker()  # (shared: emptied for this test)
    try:
        yield {"sources": sources, "target": target, "broker": broker, "tmp": tmp_path}
    finally:
        if own:
            for p in (getattr(broker, "proc", None),):
                if p is not None and p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
            broker.cleanup()
        for srv in [*sources, target]:
            try:
                if srv.proc is not None and srv.proc.poll() is None:
                    os.kill(srv.proc.pid, signal.SIGCONT)
                srv.stop()
            except Exception:
                pass


def configure(rig: dict[str, Any], senders: list[str], queue_rows: int = 2000, extra_global: str = "") -> Path:
    tmp: Path = rig["tmp"]
    target: MariaDBInstance = rig["target"]
    broker: Broker = rig["broker"]
    sections = {
        "local": f"[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\nrotate_mb=4\n",
        "mysql": f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n",
        "kafka": f"[kafka]\nservers={broker.servers}\nclient=confluent\n",
        "spark": f"[spark]\nwarehouse={tmp / 'wh'}\nwriter=arrow\nbatch_interval=1\nbatch_rows=500\ncompaction_interval=0\n",
    }
    (tmp / "senderConfig.cfg").write_text(f"[global]\ntype={','.join(senders)}\n" +
                                          "".join(sections[s] for s in senders))
    (tmp / "filter_rule.txt").write_text("")
    port = rig.setdefault("port", free_port())
    regions = "".join(
        f"\n[region:r{i + 1}]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\npassword=capturer\n"
        f"server_id={800 + i}\nheartbeat_ms=200\n" for i, m in enumerate(rig["sources"]))
    cfg = tmp / "config.cfg"
    cfg.write_text(f"[global]\nbinlogCheckPointPath={tmp / 'checkpoint.json'}\nsenderConfig={tmp / 'senderConfig.cfg'}\n"
                   f"filterRuleDict={tmp / 'filter_rule.txt'}\nhttpPort={port}\ncheckpointInterval=0.5\n"
                   f"queueRows={queue_rows}\ncontrolToken={TOKEN}\n{extra_global}" + regions)
    rig["url"] = f"http://127.0.0.1:{port}"
    return cfg


def status(rig: dict[str, Any]) -> dict[str, Any]:
    return requests.get(rig["url"] + "/status", timeout=10).json()  # type: ignore[no-any-return]


def post(rig: dict[str, Any], path: str) -> requests.Response:
    return requests.post(rig["url"] + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)


@contextmanager
def stopped(proc: Any) -> Iterator[None]:
    """SIGSTOP a server's process (it hangs: connections stay open, nothing answers)."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def lags(rig: dict[str, Any]) -> dict[str, float]:
    return {n: (s["lag_seconds"] if s["lag_seconds"] is not None else 1e9) for n, s in status(rig)["senders"].items()}


def check_sinks(rig: dict[str, Any], senders: list[str]) -> dict[str, int]:
    """Every sink equals the sources; returns the duplicates found per sink (all must be 0)."""
    tmp, sources = rig["tmp"], rig["sources"]
    dups: dict[str, int] = {}
    if "local" in senders:
        from senders.local.replay import read_changes

        raw = list(read_changes(tmp / "out" / "changes.jsonl", dedupe=False))
        items = [((d["region"], d["commit_ts"], d["seq"]), json.dumps(d, sort_keys=True)) for d in raw]
        dups["local"] = duplicate_identities(items)[0]
        file_state_equals(tmp, sources)
    if "mysql" in senders:
        assert_target_equals_sources(sources, rig["target"])  # keyless rows as a multiset: a duplicate fails it
        dups["mysql"] = 0
    if "kafka" in senders:
        records = consume_fast(rig["broker"].servers, idle=5.0, first=60.0)
        items = []
        for r in records:
            if r.value is None or r.topic == "capturer.schema_changes":
                continue
            h = {k: v.decode() for k, v in r.headers}
            body = json.loads(r.value)
            body.pop("ts_ms", None)
            items.append(((h["region"], h["commit_ts"], h["seq"], h["op"]), json.dumps(body, sort_keys=True)))
        dups["kafka"] = duplicate_identities(items)[0]
        state = rebuild_kafka(records)
        for t in TABLES:
            lost, extra, why = compare(f"Kafka app.{t}", source_json(sources, t), state.get(("app", t), []))
            assert not why, why
    if "spark" in senders:
        dups["spark"] = lake_duplicates(tmp / "wh")
    verify_equal(tmp / "config.cfg", senders)  # the product's own check agrees
    return dups


def lake_duplicates(wh: Path) -> int:
    """Identities seen twice in the lake's changelogs (pyarrow: no JVM)."""
    import pyarrow.parquet as pq

    n = 0
    for log_dir in wh.glob("*/changelog"):
        seen: set[tuple[Any, ...]] = set()
        for f in sorted(log_dir.rglob("*.parquet")):
            t = pq.read_table(f, columns=["_region", "_commit_ts", "_seq", "_sub"]).to_pylist()
            for r in t:
                k = (r["_region"], r["_commit_ts"], r["_seq"], r["_sub"])
                n += k in seen
                seen.add(k)
    return n


def run_hang(rig: dict[str, Any], senders: list[str], hung: str, seconds: float) -> None:
    cfg = configure(rig, senders)
    cap = CapturerProcess(cfg, rig["tmp"] / "capturer.log").start()
    cap.wait_ready()
    proc = rig["target"].proc if hung == "mysql" else rig["broker"].proc
    others = [s for s in senders if s != hung]
    with Load(rig["sources"]) as load:
        wait_for(lambda: all(v < 5 for v in lags(rig).values()), 120, "every sender streaming")
        before = load.rows
        with stopped(proc):
            t0 = time.monotonic()
            worst: dict[str, float] = dict.fromkeys(others, 0.0)
            while time.monotonic() - t0 < seconds:
                time.sleep(1)
                lg = lags(rig)
                for s in others:
                    worst[s] = max(worst[s], lg[s])
            st = status(rig)
            written = load.rows - before
            # the others kept up with the load the whole time; the hung one fell behind, on disk
            assert written > 200, written
            assert all(w < 8 for w in worst.values()), (worst, st["senders"])
            assert st["senders"][hung]["lag_seconds"] > seconds * 0.6, st["senders"][hung]
            assert st["senders"][hung]["stream_state"] in ("catching up", "failing", "live"), st["senders"][hung]
            assert st["stream"]["backlog_bytes"] > 0 and st["stream"]["waits"] == 0, st["stream"]
            assert not st["merger"]["full_senders"]
        wait_for(lambda: lags(rig)[hung] < 5, 300, f"{hung} to catch up from the backlog")
    wait_for(lambda: checkpoint_covers(rig["tmp"], rig["sources"]), 300, "every sender to have everything")
    assert status(rig)["senders"][hung]["read_from_backlog"] > 0
    assert cap.stop() == 0
    dups = check_sinks(rig, senders)
    assert not any(dups.values()), dups


def test_a_hung_mysql_target_holds_back_nobody(rig: dict[str, Any]) -> None:
    run_hang(rig, ["local", "mysql", "kafka", "spark"], "mysql", 15)


def test_a_hung_broker_holds_back_nobody(rig: dict[str, Any]) -> None:
    run_hang(rig, ["local", "mysql", "kafka"], "kafka", 15)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_mysql_target_hung_for_a_minute_and_a_broker_down_for_two(rig: dict[str, Any]) -> None:
    run_hang(rig, ["local", "mysql", "kafka", "spark"], "mysql", 60)
    rig["tmp"].joinpath("checkpoint.json").unlink()  # (a second, independent run on the same servers)
    run_hang(rig, ["local", "mysql", "kafka", "spark"], "kafka", 120)


def test_a_paused_sender_holds_back_nobody_and_catches_up(rig: dict[str, Any]) -> None:
    senders = ["local", "mysql", "kafka"]
    cfg = configure(rig, senders, queue_rows=500)
    cap = CapturerProcess(cfg, rig["tmp"] / "capturer.log").start()
    cap.wait_ready()
    with Load(rig["sources"]):
        wait_for(lambda: all(v < 5 for v in lags(rig).values()), 120, "every sender streaming")
        assert post(rig, "/senders/local/pause").status_code == 200
        time.sleep(12)
        st = status(rig)
        assert st["senders"]["local"]["stream_state"] == "paused" and st["senders"]["local"]["backlog_bytes"] > 0
        assert st["senders"]["mysql"]["lag_seconds"] < 8 and st["senders"]["kafka"]["lag_seconds"] < 8
        assert not st["merger"]["full_senders"] and st["stream"]["waits"] == 0
        # the checkpoint moves for the others while it is paused
        cp = json.loads((rig["tmp"] / "checkpoint.json").read_text())
        assert cp["senders"]["mysql"]["offset"] > cp["senders"]["local"]["offset"]
        assert post(rig, "/senders/local/resume").status_code == 200
        wait_for(lambda: lags(rig)["local"] < 5, 120, "the file to catch up")
    wait_for(lambda: checkpoint_covers(rig["tmp"], rig["sources"]), 300, "every sender to have everything")
    assert cap.stop() == 0
    assert not any(check_sinks(rig, senders).values())


def test_backlog_limit_block_waits_and_detach_detaches(rig: dict[str, Any]) -> None:
    senders = ["local", "mysql"]
    # block: the stream waits for the paused sender once the backlog is full; nothing is lost
    cfg = configure(rig, senders, queue_rows=200, extra_global="backlogMaxMB=1\nbacklogFull=block\n")
    cap = CapturerProcess(cfg, rig["tmp"] / "capturer.log").start()
    cap.wait_ready()
    with Load(rig["sources"], pace=0.002):
        wait_for(lambda: all(v < 5 for v in lags(rig).values()), 120, "every sender streaming")
        assert post(rig, "/senders/local/pause").status_code == 200
        wait_for(lambda: status(rig)["merger"]["full_senders"] == ["local"], 120, "the stream to wait for the file")
        st = status(rig)
        assert st["stream"]["backlog_bytes"] >= 1 << 20 and not st["senders"]["local"]["detached"]
        assert post(rig, "/senders/local/resume").status_code == 200
        wait_for(lambda: not status(rig)["merger"]["full_senders"], 120, "the stream to go on")
    wait_for(lambda: checkpoint_covers(rig["tmp"], rig["sources"]), 300, "every sender to have everything")
    assert cap.stop() == 0
    assert not any(check_sinks(rig, senders).values())

    # detach: the paused sender is detached, the others go on; attached again it goes on from the head
    cfg = configure(rig, senders, queue_rows=200, extra_global="backlogMaxMB=1\nbacklogFull=detach\n")
    cap = CapturerProcess(cfg, rig["tmp"] / "capturer.log").start()
    cap.wait_ready()
    with Load(rig["sources"], pace=0.002, seed=60, shard0=3):
        wait_for(lambda: all(v < 5 for v in lags(rig).values()), 120, "every sender streaming")
        assert post(rig, "/senders/local/pause").status_code == 200
        wait_for(lambda: status(rig)["senders"]["local"]["detached"], 120, "the file to be detached")
        h = requests.get(rig["url"] + "/health", timeout=10)
        assert h.status_code != 200 and "detached" in h.text
        time.sleep(3)
        assert status(rig)["senders"]["mysql"]["lag_seconds"] < 8 and not status(rig)["merger"]["full_senders"]
        assert "capturer_sender_detached{sender=\"local\"} 1.0" in requests.get(rig["url"] + "/metrics",
                                                                                timeout=10).text
        assert json.loads((rig["tmp"] / "checkpoint.json").read_text())["senders"]["local"]["detached"]
        post(rig, "/senders/local/resume")
        r = post(rig, "/senders/local/attach")
        assert r.status_code == 200 and r.json()["changed"], r.text
        wait_for(lambda: lags(rig)["local"] < 5, 120, "the file, attached again, to follow")
    wait_for(lambda: checkpoint_covers(rig["tmp"], rig["sources"]), 300, "every sender to have everything")
    assert cap.stop() == 0
    assert_target_equals_sources(rig["sources"], rig["target"])
    from senders.local.replay import read_changes

    raw = list(read_changes(rig["tmp"] / "out" / "changes.jsonl", dedupe=False))
    assert duplicate_identities([((d["region"], d["commit_ts"], d["seq"]), "") for d in raw])[0] == 0


def test_kill9_while_catching_up_and_while_a_backlog_segment_is_written(rig: dict[str, Any]) -> None:
    senders = ["local", "mysql", "kafka"]
    cfg = configure(rig, senders, queue_rows=500)
    log = rig["tmp"] / "capturer.log"
    cap = CapturerProcess(cfg, log).start()
    cap.wait_ready()
    with Load(rig["sources"]):
        wait_for(lambda: all(v < 5 for v in lags(rig).values()), 120, "every sender streaming")
        with stopped(rig["target"].proc):
            time.sleep(6)
        # the target is back: the MySQL sender reads the backlog; kill -9 in the middle of that
        wait_for(lambda: status(rig)["senders"]["mysql"]["read_from_backlog"] > 0, 60, "catching up")
        cap.kill9()
        cap = CapturerProcess(cfg, log).start()
        cap.wait_ready()
        wait_for(lambda: all(v < 5 for v in lags(rig).values()), 180, "caught up after the restart")
        cap.kill9()
        # a crash in the middle of a backlog write: the target hangs so that the stream goes to disk
        env_before = os.environ.get("CAPTURER_FAILPOINTS")
        os.environ["CAPTURER_FAILPOINTS"] = "backlog.write=kill@50"
        try:
            with stopped(rig["target"].proc):
                cap = CapturerProcess(cfg, log).start()
                wait_for(lambda: cap.proc is not None and cap.proc.poll() is not None, 120,
                         "the capturer to die at the failpoint")
        finally:
            if env_before is None:
                os.environ.pop("CAPTURER_FAILPOINTS")
            else:
                os.environ["CAPTURER_FAILPOINTS"] = env_before
        cap = CapturerProcess(cfg, log).start()
        cap.wait_ready()
        wait_for(lambda: all(v < 5 for v in lags(rig).values()), 180, "caught up after the second restart")
    wait_for(lambda: checkpoint_covers(rig["tmp"], rig["sources"]), 300, "every sender to have everything")
    assert cap.stop() == 0
    dups = check_sinks(rig, senders)
    assert not any(dups.values()), dups


def test_a_sender_added_or_removed_between_two_starts(rig: dict[str, Any]) -> None:
    tmp = rig["tmp"]
    cfg = configure(rig, ["local"])
    w = [Workload(m, i + 1, 40 + i) for i, m in enumerate(rig["sources"])]
    for x in w:
        x.run(30)
    cap = CapturerProcess(cfg, tmp / "capturer.log").start()
    wait_for(lambda: checkpoint_covers(tmp, rig["sources"]), 120, "the file to have everything")
    assert cap.stop() == 0
    cfg = configure(rig, ["local", "kafka"])
    for x in w:
        x.run(30)
    cap = CapturerProcess(cfg, tmp / "capturer.log").start()
    wait_for(lambda: checkpoint_covers(tmp, rig["sources"]), 120, "both to have everything")
    assert cap.stop() == 0
    text = (tmp / "capturer.log").read_text()
    assert "sender kafka is new" in text
    records = consume_fast(rig["broker"].servers, idle=5.0, first=60.0)
    # the new sender got what was read after it was added, nothing twice, and not what came before
    stamps = [int({k: v.decode() for k, v in r.headers}["commit_ts"]) for r in records if r.value is not None]
    cp = json.loads((tmp / "checkpoint.json").read_text())
    assert stamps and len(records) < sum(x.rows for x in w)
    assert set(cp["senders"]) == {"local", "kafka"}
    cfg = configure(rig, ["local"])
    cap = CapturerProcess(cfg, tmp / "capturer.log").start()
    cap.wait_ready()
    assert cap.stop() == 0
    assert "sender kafka, which senderConfig no longer has: dropped" in (tmp / "capturer.log").read_text()
    assert set(json.loads((tmp / "checkpoint.json").read_text())["senders"]) == {"local"}
    file_state_equals(tmp, rig["sources"])
