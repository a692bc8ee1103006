"""Region agents (``python -m capturer.agent``) feeding capturers over gRPC
(regions of ``type = remote``): every sender, kill -9 of an agent, of the
capturer and of both, an agent restarted at another address, refusals, TLS.

Agents and capturers run as real child processes on their own loopback ports;
one test puts an agent and its source in a network namespace of their own,
reached over a veth pair, as on another host (it needs root and iproute2, and
says so when it skips)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaos.harness import compare, source_json
from helpers import LIVE_PROCESSES, ROOT, CapturerProcess, start_servers, wait_for, write_config
from workload import SCHEMA, Workload, assert_target_equals_sources, file_state_equals

from devtools.local_mariadb import MariaDBInstance, free_port
from senders.local.replay import read_changes

pytestmark = pytest.mark.integration


class AgentProcess:
    """``python -m capturer.agent`` as a child process."""

    def __init__(self, cfg: Path, log: Path, prefix: tuple[str, ...] = ()):
        self.cfg = cfg
        self.log = log
        self.prefix = prefix  # e.g. ("ip", "netns", "exec", NAME): it execs, so the pid is the agent's
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, listen: str | None = None) -> AgentProcess:
        pf = self.cfg.with_suffix(".port")
        pf.unlink(missing_ok=True)
        argv = [*self.prefix, sys.executable, "-m", "capturer.agent", "--config", str(self.cfg), "--port-file", str(pf)]
        if listen:
            argv += ["--listen", listen]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT),
                                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
        LIVE_PROCESSES.append(self.proc)
        wait_for(lambda: pf.exists() or self.proc.poll() is not None, 60, "the agent to serve")  # type: ignore[union-attr]
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        self.port = int(pf.read_text())
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def agent_config(tmp: Path, name: str, regions: dict[str, MariaDBInstance], port: int = 0, extra: str = "",
                 region_extra: str = "", source_host: str = "127.0.0.1") -> Path:
    cfg = tmp / f"{name}.cfg"
    text = f"[agent]\nlisten=127.0.0.1:{port}\nstateDir={tmp / (name + '-state')}\nstatusInterval=0.5\n{extra}"
    for i, (rname, m) in enumerate(regions.items()):
        text += (f"\n[region:{rname}]\ntype=mariadb\nhost={source_host}\nport={m.port}\nuser=capturer\n"
                 f"password=capturer\nserver_id={900 + i}\nheartbeat_ms=200\n{region_extra}")
    cfg.write_text(text)
    return cfg


def capturer_config(tmp: Path, remote: dict[str, str], local: list[MariaDBInstance] = (), senders: str = "",
                    extra_global: str = "") -> Path:
    """r1.. for ``local`` servers, then the remote regions ({name: region section body})."""
    cfg = write_config(tmp, list(local), senders=senders, extra_global=extra_global)
    cfg.write_text(cfg.read_text() + "".join(f"\n[region:{n}]\ntype=remote\n{body}" for n, body in remote.items()))
    return cfg


@pytest.fixture
def sources(tmp_path: Path) -> Iterator[list[MariaDBInstance]]:
    servers = start_servers(tmp_path, 2)
    for m in servers:
        m.execute(*SCHEMA)
    yield servers
    for m in servers:
        m.stop()


def regions_covered(tmp: Path, servers: dict[str, MariaDBInstance]) -> bool:
    p = tmp / "checkpoint.json"
    try:
        cp = json.loads(p.read_text())
    except (OSError, ValueError):
        return False
    for name, m in servers.items():
        pos = cp["regions"].get(name)
        if pos is None or (pos["file"], pos["pos"]) < m.master_position():
            return False
    return True


def snapshot_finished(cap: Any, tmp: Path, region: str) -> bool:
    """The agent's region copied every table, and the checkpoint (what every sender
    acknowledged) has no copy left in progress."""
    st = cap.snapshot()["regions"][region]["agent"]["region_status"].get("snapshot")
    if not st or not st["tables"] or not all(t["state"] in ("done", "dropped") for t in st["tables"].values()):
        return False
    try:
        pos = json.loads((tmp / "checkpoint.json").read_text())["regions"][region]
    except (OSError, ValueError, KeyError):
        return False
    return all(t["state"] in ("done", "dropped") for t in pos.get("snapshot", []))


def alive(cap: Any) -> bool:
    assert not cap._find_failure(), cap._find_failure()
    return True


def http_status(cfg: Path) -> dict[str, Any]:
    port = next(int(line.split("=", 1)[1]) for line in cfg.read_text().splitlines() if line.startswith("httpPort="))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
        return json.loads(r.read())


def test_agent_feeds_every_sender_with_an_initial_snapshot(tmp_path: Path, sources: list[MariaDBInstance],
                                                           target: MariaDBInstance, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """One region through an agent (token, initial snapshot of rows that were there
    before), one local region: file, MySQL, Kafka and Spark equal the sources, and the
    merged stream is in one commit order across the two kinds."""
    pytest.importorskip("pyspark")
    from chaos.harness import consume_fast
    from helpers import shared_broker

    from integration.test_snapshot import rebuild_kafka
    from senders.spark.lakecli import verify
    from senders.spark.sender import build_session

    local, remote = sources
    Workload(remote, 2, seed=70).run(60)  # there before anything reads: only a snapshot can copy these
    agent = AgentProcess(agent_config(tmp_path, "agent", {"shard2": remote}, extra="token=t0k3n\n",
                                      region_extra="snapshot=initial\nsnapshot_chunk_rows=50\n"),
                         tmp_path / "agent.log").start()
    broker = shared_broker()
    wh = tmp_path / "wh"
    senders = (f"[global]\ntype=local,mysql,kafka,spark\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n"
               f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
               f"[spark]\nmaster=local[2]\nwarehouse={wh}\nbatch_interval=0.3\ncompaction_interval=0\n")
    cfg = capturer_config(tmp_path, {"shard2": f"address=127.0.0.1:{agent.port}\ntoken=t0k3n\n"}, [local],
                          senders=senders)
    # app.log has no key: its copy would start with a TRUNCATE that empties r1's rows too (refused: see
    # test_refusals_name_region_and_agent); the keyed tables are copied
    (tmp_path / "filter_rule.txt").write_text("exclude app.log\n")
    tables = ["users", "pairs"]
    try:
        with capturer_running(cfg) as cap:
            loads = [Workload(local, 1, seed=71), Workload(remote, 3, seed=72)]
            threads = [w.thread(250) for w in loads]
            for t in threads:
                t.join()
            assert not any(w.errors for w in loads)
            # covered binlog is not enough: the snapshot's chunks may still be on their way
            wait_for(lambda: alive(cap) and regions_covered(tmp_path, {"r1": local, "shard2": remote})
                     and snapshot_finished(cap, tmp_path, "shard2"), 240, "every sender")
            st = http_status(cfg)
            r = st["regions"]["shard2"]
            assert r["agent"]["address"] == f"127.0.0.1:{agent.port}" and r["rows"] > 0 and r["state"] == "streaming"
            assert r["agent"]["region_status"]["snapshot"]["rows"] >= 60, r["agent"]["region_status"]
            assert all(s["errors"] == 0 for s in st["senders"].values()), st["senders"]
        assert_target_equals_sources(sources, target, tables)
        file_state_equals(tmp_path, sources, tables)
        lines = list(read_changes(tmp_path / "out" / "changes.jsonl", dedupe=False))
        tss = [d["commit_ts"] for d in lines]
        assert tss == sorted(tss), "one commit order across a local and a remote region"
        regions = [d["region"] for d in lines if d["op"] != "ddl"]
        assert {"r1", "shard2"} <= set(regions)
        assert any(d["op"] == "read" for d in lines if d["region"] == "shard2"), "snapshot rows"
        state_k = rebuild_kafka(consume_fast(broker.servers))
        for t in tables:
            lost, div, why = compare(f"Kafka app.{t}", source_json(sources, t), state_k.get(("app", t), []))
            assert not lost and not div, why
        spark = build_session({"master": "local[1]"}, tmp_path / "sparkhome")
        try:
            srcs = [{"host": "127.0.0.1", "port": m.port, "user": "root", "password": ""} for m in sources]
            for t in tables:
                res = verify(spark, wh, "cdc", "app", t, srcs)
                assert res["equal"], res
        finally:
            spark.stop()
    finally:
        broker.kill()
        agent.stop()


def _load(servers: list[MariaDBInstance], seed: int) -> tuple[list[Workload], threading.Event, list[threading.Thread]]:
    loads = [Workload(m, i + 1, seed + i) for i, m in enumerate(servers)]
    stop = threading.Event()

    def go(w: Workload) -> None:
        while not stop.is_set():
            w.step()
            time.sleep(0.003)

    threads = [threading.Thread(target=go, args=(w,), daemon=True) for w in loads]
    for t in threads:
        t.start()
    return loads, stop, threads


def test_kill9_agent_restarted_at_another_address_then_capturer_then_both(
        tmp_path: Path, sources: list[MariaDBInstance], target: MariaDBInstance) -> None:
    """Under load: kill -9 of the agent (a new one starts at another port, which the
    capturer's address list names second), then of the capturer, then of both.
    The target and the file equal the sources; nothing is repeated under another
    identity; the checkpoint keeps moving."""
    ports = [free_port(), free_port()]
    acfg = agent_config(tmp_path, "agent", {"s1": sources[0], "s2": sources[1]})
    agent = AgentProcess(acfg, tmp_path / "agent.log").start(f"127.0.0.1:{ports[0]}")
    senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")
    addr = f"address=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}\nconnect_timeout=1\nidle_timeout=3\n"
    cfg = capturer_config(tmp_path, {"s1": addr, "s2": addr}, senders=senders)
    cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    names = {"s1": sources[0], "s2": sources[1]}
    loads, stop, threads = _load(sources, 80)
    try:
        cap.wait_ready()
        wait_for(lambda: regions_covered(tmp_path, dict(names.items())) or
                 sum(w.txns for w in loads) > 150, 60, "load to start")
        time.sleep(2)
        agent.kill9()  # 1. the agent; a new one at the second address
        time.sleep(1)
        agent = AgentProcess(acfg, tmp_path / "agent2.log").start(f"127.0.0.1:{ports[1]}")
        before = sum(w.txns for w in loads)
        wait_for(lambda: sum(w.txns for w in loads) > before + 100, 60, "load to go on")
        time.sleep(2)
        cap.kill9()  # 2. the capturer
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        cap.wait_ready()
        time.sleep(3)
        agent.kill9()  # 3. both
        cap.kill9()
        agent = AgentProcess(acfg, tmp_path / "agent3.log").start(f"127.0.0.1:{ports[0]}")
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        cap.wait_ready()
        time.sleep(3)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(w.errors for w in loads), [w.errors for w in loads]
    assert sum(w.rows for w in loads) > 500
    try:
        wait_for(lambda: regions_covered(tmp_path, names), 180, "the capturer to catch up")
        st = http_status(cfg)
        assert st["regions"]["s1"]["reconnects"] >= 0 and st["regions"]["s1"]["state"] == "streaming"
        assert cap.stop() == 0
    finally:
        agent.stop()
    log = (tmp_path / "capturer.log").read_text()
    assert "not reachable" in log or "UNAVAILABLE" in log, "the capturer saw the agent go"
    assert_target_equals_sources(sources, target)
    file_state_equals(tmp_path, sources)


@contextlib.contextmanager
def network_namespace() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to this one by a veth pair: (name, this side's
    address, the namespace's address). Skips, saying why, where it cannot be made."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("a network namespace needs root and iproute2 (ip)")
    n = os.getpid() % 200 + 20
    ns, here, there = f"capt{os.getpid()}", f"cvh{os.getpid()}", f"cva{os.getpid()}"
    host_ip, ns_ip = f"10.231.{n}.1", f"10.231.{n}.2"
    steps = [["ip", "netns", "add", ns], ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
             ["ip", "link", "set", there, "netns", ns], ["ip", "addr", "add", f"{host_ip}/30", "dev", here],
             ["ip", "link", "set", here, "up"],
             ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", there],
             ["ip", "netns", "exec", ns, "ip", "link", "set", there, "up"],
             ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    try:
        for step in steps:
            r = subprocess.run(step, capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot make a network namespace here: {' '.join(step)}: {r.stderr.strip()}")
        yield ns, host_ip, ns_ip
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_agent_in_another_network_namespace(tmp_path: Path) -> None:
    """An agent in a network namespace of its own (as on another host: its own
    loopback, reached only over a veth pair) reads its source over that link and
    serves the capturer across it. Under load, kill -9 of the agent and a new one in
    the namespace: the file equals the source."""
    with network_namespace() as (ns, host_ip, ns_ip):
        m = MariaDBInstance(tmp_path / "src", server_id=41, extra={"bind-address": f"127.0.0.1,{host_ip}"}).start()
        try:
            m.execute(*SCHEMA, f"CREATE USER 'capturer'@'{ns_ip}' IDENTIFIED BY 'capturer'",
                      f"GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT, RELOAD ON *.* TO 'capturer'@'{ns_ip}'")
            inside = ("ip", "netns", "exec", ns)
            acfg = agent_config(tmp_path, "agent", {"far": m}, source_host=host_ip)
            agent = AgentProcess(acfg, tmp_path / "agent.log", prefix=inside).start(f"{ns_ip}:0")
            with socket.socket() as probe:  # not on this side's loopback: only across the link
                assert probe.connect_ex(("127.0.0.1", agent.port)) != 0
            cfg = capturer_config(tmp_path, {"far": f"address={ns_ip}:{agent.port}\nconnect_timeout=1\n"},
                                  senders=f"[global]\ntype=local\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n")
            cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
            loads, stop, threads = _load([m], 90)
            try:
                cap.wait_ready()
                wait_for(lambda: http_status(cfg)["regions"]["far"]["rows"] > 300, 60, "rows through the first agent")
                agent.kill9()
                agent = AgentProcess(acfg, tmp_path / "agent2.log", prefix=inside).start(f"{ns_ip}:{agent.port}")
                before = sum(w.txns for w in loads)
                wait_for(lambda: sum(w.txns for w in loads) > before + 100, 60, "load to go on")
            finally:
                stop.set()
                for t in threads:
                    t.join(30)
            assert not any(w.errors for w in loads), [w.errors for w in loads]
            try:
                wait_for(lambda: regions_covered(tmp_path, {"far": m}), 120, "the capturer to catch up")
                st = http_status(cfg)
                assert st["regions"]["far"]["agent"]["address"] == f"{ns_ip}:{agent.port}", st["regions"]["far"]
                assert cap.stop() == 0
            finally:
                agent.stop()
            log = (tmp_path / "capturer.log").read_text()
            assert "UNAVAILABLE" in log or "not reachable" in log, "the capturer saw the agent go"
            assert sum(w.rows for w in loads) > 500
            file_state_equals(tmp_path, [m])
        finally:
            m.stop()


def test_refusals_name_region_and_agent(tmp_path: Path, sources: list[MariaDBInstance]) -> None:
    """A wrong token and an unknown region stop the capturer (exit 1) with the
    agent's reason; a bad agent config is refused (exit 2) naming file and key."""
    m = sources[0]
    agent = AgentProcess(agent_config(tmp_path, "agent", {"s1": m}, extra="token=Zq9-right\n"),
                         tmp_path / "agent.log").start()
    try:
        for name, body, want in [
            ("wrongtoken", f"address=127.0.0.1:{agent.port}\ntoken=Zq9-wrong\nagent_region=s1\n", "UNAUTHENTICATED"),
            ("nosuch", f"address=127.0.0.1:{agent.port}\ntoken=Zq9-right\n", "serves no region 'nosuch'"),
        ]:
            d = tmp_path / name
            d.mkdir()
            cfg = capturer_config(d, {name: body})
            cap = CapturerProcess(cfg, d / "capturer.log").start()
            assert cap.proc is not None and cap.proc.wait(60) == 1
            log = (d / "capturer.log").read_text()
            assert want in log and f"region {name}" in log, log[-2000:]
            assert "Zq9" not in log, "a token is never printed"
        # a second capturer on a region another capturer reads is refused (they would push each other off)
        first, second = tmp_path / "first", tmp_path / "second"
        first.mkdir()
        second.mkdir()
        body = f"address=127.0.0.1:{agent.port}\ntoken=Zq9-right\nagent_region=s1\n"
        a = CapturerProcess(capturer_config(first, {"one": body}), first / "capturer.log").start()
        a.wait_ready()
        wait_for(lambda: http_status(first / "config.cfg")["regions"]["one"]["state"] == "streaming", 60, "streaming")
        b = CapturerProcess(capturer_config(second, {"two": body}), second / "capturer.log").start()
        assert b.proc is not None and b.proc.wait(60) == 1
        assert "is being read by another capturer" in (second / "capturer.log").read_text()
        assert http_status(first / "config.cfg")["regions"]["one"]["state"] == "streaming"
        assert a.stop() == 0
    finally:
        agent.stop()
    # a copy through an agent that would empty a table a local region also delivers: refused by the agent's
    # region after asking the capturer which other regions deliver the table
    agent = AgentProcess(agent_config(tmp_path, "agent2", {"s2": sources[1]}, region_extra="snapshot=initial\n"),
                         tmp_path / "agent2.log").start()
    try:
        d = tmp_path / "conflict"
        d.mkdir()
        cfg = capturer_config(d, {"s2": f"address=127.0.0.1:{agent.port}\n"}, [m])
        cap = CapturerProcess(cfg, d / "capturer.log").start()
        assert cap.proc is not None and cap.proc.wait(60) == 1
        log = (d / "capturer.log").read_text()
        assert "snapshot=initial refused: table app.log is captured from regions r1, s2" in log, log[-2000:]
    finally:
        agent.stop()
    bad = tmp_path / "bad.cfg"
    bad.write_text("[agent]\nlisten=127.0.0.1:0\ntls_cert=/nonexistent.pem\n[region:a]\ntype=mysql\nhost=h\n"
                   "user=u\nserver_id=1\n")
    r = subprocess.run([sys.executable, "-m", "capturer.agent", "--config", str(bad), "--check"], cwd=str(ROOT),
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2 and str(bad) in r.stderr and "tls_cert" in r.stderr, r.stderr


def test_tls_token_and_a_big_transaction(tmp_path: Path, sources: list[MariaDBInstance], capturer_running) -> None:  # type: ignore[no-untyped-def]
    """TLS with a private CA and a token; a 6,000-row transaction (primary keys
    changed) is spilled on both sides and arrives whole."""
    m = sources[0]
    key, crt = tmp_path / "agent.key", tmp_path / "agent.crt"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        "/CN=capturer-agent", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(crt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"openssl cannot make a test certificate: {r.stderr[-300:]}")
    agent = AgentProcess(agent_config(tmp_path, "agent", {"s1": m},
                                      extra=f"token=tls-t0ken\ntls_cert={crt}\ntls_key={key}\nspillRows=1000\n"),
                         tmp_path / "agent.log").start()
    cfg = capturer_config(tmp_path, {"s1": f"address=localhost:{agent.port}\ntoken=tls-t0ken\ntls_ca={crt}\n"},
                          extra_global="spillRows=1500\n")
    try:
        with capturer_running(cfg) as cap:
            w = Workload(m, 1, seed=90)
            w.run(50)
            c = m.connect("app")
            with c.cursor() as cur:
                cur.execute("INSERT INTO app.pairs (a, b, val) SELECT seq, 'big', REPEAT('x', 50) "
                            "FROM seq_1_to_6000")
                c.commit()
                cur.execute("UPDATE app.pairs SET a = a + 100000 WHERE b = 'big'")
                c.commit()
            c.close()
            w.run(30)
            wait_for(lambda: alive(cap) and regions_covered(tmp_path, {"s1": m}), 120, "the capturer to catch up")
            wait_for(lambda: cap.snapshot()["regions"]["s1"]["agent"]["region_status"].get("spilled_txns", 0) >= 2,
                     10, "the agent's status to show its spilled transactions")
            assert cap.snapshot()["regions"]["s1"]["spilled_txns"] >= 2
        file_state_equals(tmp_path, [m])
        lines = list(read_changes(tmp_path / "out" / "changes.jsonl", dedupe=False))
        big = [d for d in lines if d.get("table") == "pairs" and d["op"] == "update" and
               (d.get("after") or {}).get("b") == "big"]
        assert len(big) == 6000 and len({d["commit_ts"] for d in big}) == 1
    finally:
        agent.stop()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is gone too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _kill9_and_restart(cap: CapturerProcess, cfg: Path, tmp: Path, children: list[int],
                       what: str) -> CapturerProcess:
    """kill -9 of the capturer: ``children`` (its worker or sender processes) must exit
    by themselves; then a new capturer, ready."""
    cap.kill9()
    wait_for(lambda: not any(_pid_alive(p) for p in children), 30, f"{what} to exit with the capturer")
    cap = CapturerProcess(cfg, tmp / "capturer.log").start()
    cap.wait_ready()
    time.sleep(2)
    return cap


def _stop_load(stop: threading.Event, threads: list[threading.Thread]) -> None:
    stop.set()
    for t in threads:
        t.join(30)


def test_regions_in_worker_processes(tmp_path: Path, sources: list[MariaDBInstance], target: MariaDBInstance) -> None:
    """process=true: each region decodes in a worker process. Under load: kill -9
    of a worker (started again, the region resumes), then kill -9 of the capturer
    (its workers exit by themselves), a restart: target and file equal the sources."""
    senders = (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")
    cfg = write_config(tmp_path, sources, senders=senders, region_extra="process=true\n")
    cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    loads, stop, threads = _load(sources, 60)
    names = {"r1": sources[0], "r2": sources[1]}
    try:
        cap.wait_ready()
        wait_for(lambda: all(r.get("worker", {}).get("pid") and r["state"] == "streaming"
                             for r in http_status(cfg)["regions"].values()), 60, "workers to stream")
        st = http_status(cfg)["regions"]
        first = st["r1"]["worker"]["pid"]
        time.sleep(2)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: http_status(cfg)["regions"]["r1"]["worker"]["starts"] == 2, 60, "the worker to start again")
        time.sleep(2)
        workers = [r["worker"]["pid"] for r in http_status(cfg)["regions"].values()]
        cap = _kill9_and_restart(cap, cfg, tmp_path, workers, "the workers")
    finally:
        _stop_load(stop, threads)
    assert not any(w.errors for w in loads)
    wait_for(lambda: regions_covered(tmp_path, names), 180, "the capturer to catch up")
    workers = [r["worker"]["pid"] for r in http_status(cfg)["regions"].values()]
    assert cap.stop() == 0
    assert not any(_pid_alive(p) for p in workers), "a clean stop ends the workers"
    assert "the worker exited with code -9; starting it again" in (tmp_path / "capturer.log").read_text()
    assert_target_equals_sources(sources, target)
    file_state_equals(tmp_path, sources)


def test_senders_in_their_own_processes(tmp_path: Path, sources: list[MariaDBInstance],
                                        target: MariaDBInstance) -> None:
    """process=true on the senders: the file, MySQL and Kafka (confluent) senders each
    run in a child process. Under load: kill -9 of the MySQL sender's process and of
    the Kafka sender's (new ones start, the batch is sent again), then kill -9 of the
    capturer (the sender processes exit by themselves) and a restart. The target, the
    file and the tables rebuilt from Kafka equal the sources."""
    from helpers import consume_all, shared_broker

    from integration.test_kafka_sender import rebuild_from_kafka, source_json_rows

    broker = shared_broker()
    senders = (f"[global]\ntype=local,mysql,kafka\n"
               f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\nprocess=true\n"
               f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\nprocess=true\n"
               f"[kafka]\nservers={broker.servers}\nclient=confluent\nprocess=true\n")
    cfg = write_config(tmp_path, sources, senders=senders)
    cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    loads, stop, threads = _load(sources, 90)
    names = {"r1": sources[0], "r2": sources[1]}

    def pids() -> dict[str, int]:
        return {n: s["process"]["pid"] for n, s in http_status(cfg)["senders"].items()}

    try:
        cap.wait_ready()
        wait_for(lambda: all(pids().values()) and all(s["rows"] > 0 for s in http_status(cfg)["senders"].values()),
                 90, "every sender's process to send")
        first = pids()
        assert len(set(first.values()) | {cap.proc.pid}) == 4  # type: ignore[union-attr]
        os.kill(first["mysql"], signal.SIGKILL)
        os.kill(first["kafka"], signal.SIGKILL)
        wait_for(lambda: all(http_status(cfg)["senders"][n]["process"]["restarts"] >= 1 for n in ("mysql", "kafka"))
                 and all(pids().values()), 90, "new sender processes")
        assert pids()["local"] == first["local"]
        port = next(int(x.split("=", 1)[1]) for x in cfg.read_text().splitlines() if x.startswith("httpPort="))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'capturer_sender_process_restarts_total{sender="kafka"} 1.0' in metrics, metrics[-2000:]
        time.sleep(2)
        cap = _kill9_and_restart(cap, cfg, tmp_path, list(pids().values()), "the sender processes")
    finally:
        _stop_load(stop, threads)
    try:
        assert not any(w.errors for w in loads)
        assert sum(w.rows for w in loads) > 300
        wait_for(lambda: regions_covered(tmp_path, names), 180, "the capturer to catch up")
        children = list(pids().values())
        assert cap.stop() == 0
        assert not any(_pid_alive(p) for p in children), "a clean stop ends the sender processes"
        records = consume_all(broker.servers)
    finally:
        broker.kill()
    assert "the sender's process exited (code -9)" in (tmp_path / "capturer.log").read_text()
    assert_target_equals_sources(sources, target)
    file_state_equals(tmp_path, sources)
    state = rebuild_from_kafka([r for r in records if r.topic.startswith("capturer.app.")])
    for table in ("users", "pairs", "log"):
        got = sorted(json.dumps(v, sort_keys=True) for v in state[f"capturer.app.{table}"].values())
        assert got == source_json_rows(sources, table), f"{table} rebuilt from Kafka differs"
