"""Appliers (issue 33) with real servers: two MariaDB sources under the hostile OLTP mix
(primary-key changes, unique-key swaps, a keyless table, rollbacks), the capturer writing
Kafka (Apache Kafka) with ``txn_topic``, and appliers (``python -m capturer apply``, child
processes as start.sh runs them) reading it back into a MariaDB target, the file and the
Spark lake.

* scale-out by table: applier ``a`` owns app.users (``txn_atomic``, kafka-python), ``b`` owns
  app.pairs and app.log (confluent, its MySQL sender in a process of its own), both into the
  same target; ``c`` owns everything and
  writes the file and the lake; kill -9 of ``a`` and of ``c`` mid-load and of the capturer;
  a transaction spread over every table topic and partition arrives whole; every
  destination equals the sources (our own comparison and ``python -m capturer verify``),
  no identity twice in the file or the lake;
* a broker restart (SIGTERM, as an operator restarts a broker) under an applier;
  a message that does not decode: dead-lettered (the rest applied) or, by default, the
  applier stops naming topic, partition and offset.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import LIVE_PROCESSES, ROOT, Broker, CapturerProcess, shared_broker, verify_equal, wait_for
from workload import SCHEMA, assert_target_equals_sources, file_state_equals

from devtools.local_mariadb import MariaDBInstance, free_port
from integration.test_independent_senders import Load, lake_duplicates

pytestmark = pytest.mark.integration
TXN_TOPIC = "capturer.txn"


class ApplierProcess:
    """``python -m capturer apply --config CFG`` as a child process."""

    def __init__(self, cfg: Path, log: Path, port: int):
        self.cfg, self.log, self.port = cfg, log, port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ApplierProcess:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "capturer", "apply", "--config", str(self.cfg)],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
        LIVE_PROCESSES.append(self.proc)
        return self

    def status(self) -> dict[str, Any]:
        return requests.get(f"http://127.0.0.1:{self.port}/status", timeout=10).json()  # type: ignore[no-any-return]

    def rows(self) -> int:
        """Rows applied (-1 while the status port is not up yet)."""
        try:
            return int(self.status()["applied"]["rows"])
        except requests.RequestException:
            return -1

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def write_applier(tmp: Path, name: str, servers: str, senders: str, tables: str = "*.*", client: str = "confluent",
                  extra: str = "") -> tuple[Path, int]:
    port = free_port()
    sc = tmp / f"apply-{name}-senders.cfg"
    sc.write_text(senders)
    cfg = tmp / f"apply-{name}.cfg"
    cfg.write_text(f"[global]\nname={name}\nservers={servers}\ntxn_topic={TXN_TOPIC}\nclient={client}\n"
                   f"tables={tables}\nsenderConfig={sc}\nhttpPort={port}\ncommitInterval=0.5\n{extra}")
    return cfg, port


def capturer_config(tmp: Path, sources: list[MariaDBInstance], servers: str, fmt: str = "json") -> Path:
    (tmp / "senderConfig.cfg").write_text(
        f"[global]\ntype=kafka\n[kafka]\nservers={servers}\nclient=confluent\ntxn_topic={TXN_TOPIC}\n"
        f"tombstones=true\npartitions=3\nformat={fmt}\n")
    (tmp / "filter_rule.txt").write_text("")
    regions = "".join(
        f"\n[region:r{i + 1}]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\npassword=capturer\n"
        f"server_id={800 + i}\nheartbeat_ms=200\n" for i, m in enumerate(sources))
    cfg = tmp / "config.cfg"
    cfg.write_text(f"[global]\nbinlogCheckPointPath={tmp / 'checkpoint.json'}\nsenderConfig={tmp / 'senderConfig.cfg'}\n"
                   f"filterRuleDict={tmp / 'filter_rule.txt'}\nhttpPort={free_port()}\ncheckpointInterval=0.5\n"
                   + regions)
    return cfg


def verify_config(tmp: Path, target: MariaDBInstance) -> Path:
    """The sources, and the appliers' destinations as a capturer's senders: for ``verify``."""
    (tmp / "verifySenders.cfg").write_text(
        f"[global]\ntype=local,mysql,spark\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n"
        f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\n"
        f"[spark]\nwarehouse={tmp / 'wh'}\nwriter=arrow\ncompaction_interval=0\n")
    text = (tmp / "config.cfg").read_text().replace(f"senderConfig={tmp / 'senderConfig.cfg'}",
                                                    f"senderConfig={tmp / 'verifySenders.cfg'}")
    text = text.replace(f"binlogCheckPointPath={tmp / 'checkpoint.json'}",
                        f"binlogCheckPointPath={tmp / 'verify-checkpoint.json'}")
    cfg = tmp / "verify.cfg"
    cfg.write_text(text)
    return cfg


@pytest.fixture()
def rig(tmp_path: Path) -> Iterator[dict[str, Any]]:
    from helpers import start_servers

    sources = start_servers(tmp_path, 2)
    for m in sources:
        m.execute(*SCHEMA)
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    try:
        yield {"sources": sources, "target": target, "tmp": tmp_path}
    finally:
        for srv in [*sources, target]:
            try:
                srv.stop()
            except Exception:
                pass


def keep_logs(tmp: Path) -> None:
    """KEEP_LOGS=DIR: the processes' logs copied there (for a failure's post-mortem)."""
    if os.environ.get("KEEP_LOGS"):
        import shutil

        for f in tmp.glob("*.log"):
            shutil.copy(f, os.environ["KEEP_LOGS"])


def wait_equal(sources: list[MariaDBInstance], target: MariaDBInstance, timeout: float, what: str,
               appliers: list[ApplierProcess]) -> None:
    """Until the target equals the sources; on a timeout, the appliers' status in the error."""
    try:
        wait_for(lambda: settled(lambda: assert_target_equals_sources(sources, target)), timeout, what)
    except AssertionError as exc:
        states = []
        for a in appliers:
            try:
                states.append(json.dumps(a.status(), default=str)[:6000])
            except Exception as e:
                states.append(repr(e))
        raise AssertionError(f"{exc}; appliers: {states}") from None


def tear_down(tmp: Path, procs: list[Any], broker: Broker) -> None:
    """After a test: the logs kept (KEEP_LOGS), every child process still running killed, the broker too."""
    keep_logs(tmp)
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            p.proc.kill()
    broker.kill()


def settled(check: Any) -> bool:
    """Whether ``check`` passes now: False while it fails an assertion, or while the
    target has not got the database or table yet (errors 1049 / 1146: the applier
    creates it with the first change it applies)."""
    import pymysql

    try:
        check()
        return True
    except AssertionError:
        return False
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] in (1049, 1146):
            return False
        raise


def big_txn(m: MariaDBInstance, shard: int) -> None:
    """One transaction over every table, many partitions of each table topic."""
    c = m.connect()
    try:
        c.autocommit(False)
        with c.cursor() as cur:
            base = shard * 1_000_000 + 900_000
            cur.executemany("INSERT INTO app.users VALUES (%s,%s,'big',1.5,NOW(6))",
                            [(base + i, f"big{shard}-{i}@x.org") for i in range(400)])
            cur.executemany("INSERT INTO app.pairs VALUES (%s,%s,'big')", [(base + i, "q") for i in range(60)])
            cur.executemany("INSERT INTO app.log VALUES ('big', %s)", [(i,) for i in range(30)])
        c.commit()
    finally:
        c.close()


def test_two_appliers_split_by_table_survive_kill9(rig: dict[str, Any]) -> None:
    tmp, sources, target = rig["tmp"], rig["sources"], rig["target"]
    broker = shared_broker()
    procs: list[Any] = []
    try:
        cap = CapturerProcess(capturer_config(tmp, sources, broker.servers), tmp / "capturer.log").start()
        procs.append(cap)
        cap.wait_ready()
        mysql = f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\n"
        cfg_a, port_a = write_applier(tmp, "a", broker.servers, mysql + "threadnum=4\ntxn_atomic=true\n",
                                      tables="app.users", client="kafka-python", extra="untabled_ddl=apply\n")
        cfg_b, port_b = write_applier(tmp, "b", broker.servers, mysql + "threadnum=2\nprocess=true\n",
                                      tables="app.pairs, app.log", extra="untabled_ddl=apply\n")
        cfg_c, port_c = write_applier(
            tmp, "c", broker.servers,
            f"[global]\ntype=local,spark\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n"
            f"[spark]\nwarehouse={tmp / 'wh'}\nwriter=arrow\nbatch_interval=1\nbatch_rows=500\ncompaction_interval=0\n")
        a = ApplierProcess(cfg_a, tmp / "a.log", port_a).start()
        b = ApplierProcess(cfg_b, tmp / "b.log", port_b).start()
        c = ApplierProcess(cfg_c, tmp / "c.log", port_c).start()
        procs += [a, b, c]
        with Load(sources, pace=0.01) as load:
            wait_for(lambda: load.rows > 300, 60, "load")
            wait_for(lambda: a.rows() > 50, 90, "applier a applies rows")
            a.kill9()  # mid-load: its transactions in flight, offsets behind
            time.sleep(2)
            a.start()
            time.sleep(3)
            cap.kill9()
            time.sleep(1)
            cap.start()
            cap.wait_ready()
            c.kill9()
            time.sleep(2)
            c.start()
            big_txn(sources[0], 1)
            time.sleep(4)
        big_txn(sources[1], 2)
        wait_equal(sources, target, 180, "the target equals the sources", [a, b])
        wait_for(lambda: settled(lambda: file_state_equals(tmp, sources)), 120, "the file equals the sources")
        # the big transactions: whole and one transaction in the file (one commit_ts, contiguous)
        from senders.local.replay import read_changes

        lines = list(read_changes(tmp / "out" / "changes.jsonl", dedupe=False))
        for email in ("big1-0@x.org", "big2-0@x.org"):
            first = next(i for i, d in enumerate(lines) if (d.get("after") or {}).get("email") == email)
            ident = (lines[first]["region"], lines[first]["commit_ts"])
            rows = [d for d in lines if (d["region"], d["commit_ts"]) == ident]
            assert len(rows) == 490, len(rows)
            assert lines[first:first + 490] == rows or lines[first - rows[0]["seq"]:][:490] == rows
        # no identity twice in the file or the lake (the file sender and lake skip what they hold)
        idents = [(d["region"], d["commit_ts"], d["seq"]) for d in lines if d.get("op") != "ddl"]
        assert len(idents) == len(set(idents)), "an identity twice in the file"
        wait_for(lambda: settled(lambda: verify_equal(verify_config(tmp, target), ["local", "mysql", "spark"], 5)),
                 120, "verify finds every destination equal")
        assert lake_duplicates(tmp / "wh") == 0
        st = a.status()
        assert st["kind"] == "applier" and st["tables"] == ["app.users"] and st["state"] == "running"
        assert st["applied"]["rows"] > 0 and st["errors"]["bad_messages"] == 0
        assert any(p["topic"] == TXN_TOPIC for p in st["partitions"].values())
        assert all(p["topic"] in (TXN_TOPIC, "capturer.app.users") for p in st["partitions"].values())
        metrics = requests.get(f"http://127.0.0.1:{port_a}/metrics", timeout=10).text
        assert "capturer_apply_rows_total" in metrics and "capturer_apply_partition_lag_messages" in metrics
        page = requests.get(f"http://127.0.0.1:{port_a}/", timeout=10)
        assert page.status_code == 200 and "apply.js" in page.text
        for p in (a, b, c):
            assert p.stop() == 0
        assert cap.stop() == 0
    finally:
        tear_down(tmp, procs, broker)


def test_broker_restart_and_messages_that_do_not_decode(rig: dict[str, Any]) -> None:
    tmp, sources, target = rig["tmp"], rig["sources"], rig["target"]
    broker = Broker().start()  # a broker of its own: this test restarts it
    procs: list[Any] = []
    try:
        cap = CapturerProcess(capturer_config(tmp, sources, broker.servers), tmp / "capturer.log").start()
        procs.append(cap)
        cap.wait_ready()
        mysql = f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\n"
        cfg, port = write_applier(tmp, "dl", broker.servers, mysql, client="kafka-python",
                                  extra="on_bad_message=dead_letter\n")
        # a backlog in Kafka first (the applier not running), then the capturer stopped, then the
        # broker restarted under the applier. (The capturer stayed stopped for the restart because
        # Tansu, the stand-in broker until 2026-11-27, lost acknowledged batches in restarts;
        # the capturer's own broker restarts are the chaos suite's.)
        with Load(sources, pace=0.01) as load:
            wait_for(lambda: load.rows > 600, 90, "load")
        assert cap.stop() == 0
        ap = ApplierProcess(cfg, tmp / "dl.log", port).start()
        procs.append(ap)
        wait_for(lambda: ap.rows() > 50, 90, "the applier applies rows")
        broker.stop()
        time.sleep(3)
        broker.start()
        cap.start()
        cap.wait_ready()
        with Load(sources, pace=0.02, seed=55, shard0=3):
            time.sleep(4)
        wait_equal(sources, target, 240, "the target equals the sources after the broker restart", [ap])
        # a message that does not decode, with the identity headers of a transaction the spine never names
        import confluent_kafka

        prod = confluent_kafka.Producer({"bootstrap.servers": broker.servers})
        bad_headers = [("region", b"r1"), ("commit_ts", str((int(time.time() * 1000) << 18) + 7).encode()),
                       ("seq", b"0"), ("op", b"c")]
        prod.produce("capturer.app.users", b"{this is not json", b'{"id":1}', 0, headers=bad_headers)
        assert prod.flush(30) == 0
        wait_for(lambda: ap.status()["errors"]["dead_letters"] == 1, 60, "the bad message dead-lettered")
        st = ap.status()
        assert "topic 'capturer.app.users' partition 0 offset" in st["errors"]["last_bad"]
        from helpers import consume_all

        dead = consume_all(broker.servers, ["capturer.apply.dead_letter"])
        assert len(dead) == 1 and dead[0].value == b"{this is not json"
        assert dict(dead[0].headers)["dead_letter_topic"] == b"capturer.app.users"
        # the rest goes on: more load after it arrives
        with Load(sources, pace=0.02, seed=77, shard0=5):
            time.sleep(3)
        wait_equal(sources, target, 120, "still equal", [ap])
        assert ap.stop() == 0
        # the default (stop): an applier of its own stops at that message, naming it, exit 1
        cfg2, port2 = write_applier(tmp, "strict", broker.servers,
                                    f"[global]\ntype=local\n[local]\nfilepath={tmp / 'strict.jsonl'}\n")
        strict = ApplierProcess(cfg2, tmp / "strict.log", port2).start()
        procs.append(strict)
        assert strict.proc is not None
        assert strict.proc.wait(120) == 1
        text = (tmp / "strict.log").read_text()
        assert "does not decode" in text and "capturer.app.users" in text and "on_bad_message=stop" in text
        assert cap.stop() == 0
    finally:
        tear_down(tmp, procs, broker)
        broker.cleanup()


def test_protobuf_format(rig: dict[str, Any]) -> None:
    """The capturer writing protobuf, an applier reading it into the file: equal to the sources."""
    tmp, sources = rig["tmp"], rig["sources"]
    broker = shared_broker()
    procs: list[Any] = []
    try:
        cap = CapturerProcess(capturer_config(tmp, sources, broker.servers, "protobuf"), tmp / "capturer.log").start()
        procs.append(cap)
        cap.wait_ready()
        cfg, port = write_applier(tmp, "pb", broker.servers,
                                  f"[global]\ntype=local\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n",
                                  extra="format=protobuf\n")
        ap = ApplierProcess(cfg, tmp / "pb.log", port).start()
        procs.append(ap)
        with Load(sources, pace=0.01) as load:
            wait_for(lambda: load.rows > 300, 60, "load")
        big_txn(sources[0], 1)
        wait_for(lambda: settled(lambda: file_state_equals(tmp, sources)), 120, "the file equals the sources")
        assert ap.status()["format"] == "protobuf"
        assert ap.stop() == 0
        assert cap.stop() == 0
    finally:
        tear_down(tmp, procs, broker)


def test_check(tmp_path: Path) -> None:
    """``--check``: a bad key named with file and line; ``--connect``: the missing txn topic said."""
    broker = shared_broker()
    try:
        cfg, _ = write_applier(tmp_path, "chk", broker.servers,
                               f"[global]\ntype=local\n[local]\nfilepath={tmp_path / 'x.jsonl'}\n")
        run = [sys.executable, "-m", "capturer", "apply", "--config", str(cfg), "--check"]
        p = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "config OK" in p.stdout, p.stderr
        p = subprocess.run(run + ["--connect"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 3 and f"txn_topic {TXN_TOPIC!r}" in p.stderr, (p.stdout, p.stderr)
        cfg.write_text(cfg.read_text() + "format=canal\n")
        p = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and f"{cfg}:" in p.stderr and "format" in p.stderr, p.stderr
        (tmp_path / "apply-chk-senders.cfg").write_text("[global]\ntype=kafka\n[kafka]\nservers=x:1\n")
        cfg.write_text(cfg.read_text().replace("format=canal\n", ""))
        p = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and "unknown sender 'kafka'" in p.stderr, p.stderr
    finally:
        broker.kill()
