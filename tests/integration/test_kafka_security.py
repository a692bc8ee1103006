"""SASL and TLS to Kafka (issue 45 item 4) against one Apache Kafka broker with a SASL_SSL listener
(devtools/local_kafka.py: a CA and a broker certificate made here with openssl; PLAIN and
SCRAM-SHA-512 users), and what users meet when Kafka says no.

* the capturer writes through SASL_SSL with each client (kafka-python with SCRAM-SHA-512,
  confluent with PLAIN), an applier (same client and mechanism) applies the topics into a MariaDB
  target, ``verify`` reads them back equal; the password appears in no log and no status;
* a wrong password and a CA that did not sign the broker's certificate: ``--check --connect``
  (capturer and applier) exits 3 naming ``sasl_password`` / ``ssl_ca``; a running capturer and a
  running applier stop (not retried forever) naming them;
* ``create_topics = false`` with a missing topic (the broker's auto-creation off): the error names
  the topic and the setting; a row bigger than the broker's ``message.max.bytes``: the capturer
  stops naming the table, the key and the sizes (never a silent drop).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import ROOT, CapturerProcess, checkpoint_covers, start_servers, verify_equal, wait_for, write_config
from workload import SCHEMA, Workload

from devtools.local_kafka import Broker, SaslSsl, make_tls, unavailable
from devtools.local_mariadb import MariaDBInstance, free_port
from integration.test_apply import ApplierProcess, wait_equal

pytestmark = pytest.mark.integration

USER = "capturer"
PASSWORD = "kafkaSecret7731"  # never in a log or a status
WRONG = "wrongSecret4409"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One broker for the module: PLAINTEXT (b.servers) and SASL_SSL (b.secure_servers), no auto-creation."""
    why = unavailable()
    if why:
        pytest.skip(why)
    d = tmp_path_factory.mktemp("kafka-sec")
    tls, bad = make_tls(d / "ca"), make_tls(d / "other-ca")
    b = Broker(partitions=3, auto_create=False, sasl_ssl=SaslSsl(tls, {USER: PASSWORD})).start()
    try:
        yield {"broker": b, "ca": tls.ca, "bad_ca": bad.ca}
    finally:
        b.cleanup()


def security(ca: Path, mechanism: str, password: str = PASSWORD) -> str:
    return (f"security_protocol=SASL_SSL\nsasl_mechanism={mechanism}\nsasl_username={USER}\n"
            f"sasl_password={password}\nssl_ca={ca}\n")


def kafka_section(servers: str, client: str, prefix: str, sec: str, extra: str = "") -> str:
    return (f"[global]\ntype=kafka\n[kafka]\nservers={servers}\nclient={client}\ntopic={prefix}.{{db}}.{{table}}\n"
            f"txn_topic={prefix}.txn\nschema_topic={prefix}.schema\ntombstones=true\n{sec}{extra}")


def applier_config(tmp: Path, name: str, servers: str, client: str, txn_topic: str, sec: str,
                   target: MariaDBInstance | None) -> tuple[Path, int]:
    port = free_port()
    sc = tmp / f"apply-{name}-senders.cfg"
    sc.write_text(f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port if target else 1}\nuser=root\n"
                  "password=\nthreadnum=2\n")
    cfg = tmp / f"apply-{name}.cfg"
    cfg.write_text(f"[global]\nname={name}\nservers={servers}\ntxn_topic={txn_topic}\nclient={client}\n"
                   f"senderConfig={sc}\nhttpPort={port}\ncommitInterval=0.5\n{sec}")
    return cfg, port


def http_port(cfg: Path) -> int:
    m = re.search(r"httpPort=(\d+)", cfg.read_text())
    assert m is not None
    return int(m.group(1))


@pytest.mark.parametrize(("client", "mechanism"), [("kafka-python", "SCRAM-SHA-512"), ("confluent", "PLAIN")])
def test_sasl_ssl_capture_apply_verify(secure: dict[str, Any], tmp_path: Path, client: str, mechanism: str) -> None:
    b: Broker = secure["broker"]
    sec = security(secure["ca"], mechanism)
    prefix = "sec_" + client.replace("-", "_")
    sources = start_servers(tmp_path, 1)
    sources[0].execute(*SCHEMA)
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    procs: list[Any] = []
    try:
        cfg = write_config(tmp_path, sources, senders=kafka_section(b.secure_servers, client, prefix, sec))
        cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        procs.append(cap)
        cap.wait_ready()
        acfg, aport = applier_config(tmp_path, "s", b.secure_servers, client, f"{prefix}.txn", sec, target)
        a = ApplierProcess(acfg, tmp_path / "applier.log", aport).start()
        procs.append(a)
        w = Workload(sources[0], 1, 11)
        w.thread(150).join()
        wait_for(lambda: checkpoint_covers(tmp_path, sources), 120, "the capturer to write Kafka (SASL_SSL)")
        wait_equal(sources, target, 120, "the applier (SASL_SSL) to bring the target level", [a])
        statuses = [requests.get(f"http://127.0.0.1:{http_port(cfg)}/status", timeout=10).text, json.dumps(a.status())]
        assert cap.stop() == 0
        assert a.stop() == 0
        report = verify_equal(cfg, ["kafka"], 5)  # verify reads the topics through SASL_SSL too
        assert report["tables"]
        for text in [*statuses, (tmp_path / "capturer.log").read_text(errors="replace"),
                     (tmp_path / "applier.log").read_text(errors="replace"), json.dumps(report)]:
            assert PASSWORD not in text
    finally:
        for p in procs:
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
        for srv in [*sources, target]:
            srv.stop()


def run(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "capturer", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_wrong_password_and_wrong_ca_named(secure: dict[str, Any], tmp_path: Path) -> None:
    """Each client, a wrong password and a CA that did not sign the broker's certificate: named by the
    check (exit 3) and by a running capturer and applier, which stop (not retried forever)."""
    b: Broker = secure["broker"]
    sources = start_servers(tmp_path, 1)
    cases = {  # name: (client, sasl_password, ssl_ca, the setting the error must name)
        "kp-pw": ("kafka-python", WRONG, secure["ca"], "sasl_password"),
        "ck-pw": ("confluent", WRONG, secure["ca"], "sasl_password"),
        "kp-ca": ("kafka-python", PASSWORD, secure["bad_ca"], "ssl_ca"),
        "ck-ca": ("confluent", PASSWORD, secure["bad_ca"], "ssl_ca"),
    }
    try:
        cfgs: dict[str, tuple[Path, Path]] = {}
        for i, (name, (client, pw, ca, _key)) in enumerate(cases.items()):
            d = tmp_path / name
            d.mkdir()
            sec = security(ca, "SCRAM-SHA-512", pw)
            cfg = write_config(d, sources, senders=kafka_section(b.secure_servers, client, "bad", sec))
            cfg.write_text(cfg.read_text().replace("server_id=800", f"server_id={810 + i}"))
            acfg, _ = applier_config(d, name, b.secure_servers, client, "bad.txn", sec, None)
            cfgs[name] = (cfg, acfg)
        # --check --connect: the capturer's (every case) and the applier's (every case), all at once
        checks = {(name, kind): run(*(["apply"] if kind == "apply" else []), "--config", str(cfgs[name][kind == "apply"]),
                                    "--check", "--connect")
                  for name in cases for kind in ("capturer", "apply")}
        for (name, kind), p in checks.items():
            out, _ = p.communicate(timeout=120)
            key = cases[name][3]
            assert p.returncode == 3, (name, kind, out)
            assert key in out and (key != "ssl_ca" or str(secure["bad_ca"]) in out), (name, kind, out)
            assert WRONG not in out and PASSWORD not in out, (name, kind, out)
        # running: the capturer's sender and the applier's consumer stop, naming the setting
        t0 = time.monotonic()
        procs = {(name, kind): run(*(["apply"] if kind == "apply" else []), "--config", str(cfgs[name][kind == "apply"]))
                 for name in cases for kind in ("capturer", "apply")}
        for (name, kind), p in procs.items():
            try:
                out, _ = p.communicate(timeout=max(5.0, 120 - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                raise AssertionError(f"{name} {kind}: still running (retrying?):\n{out[-3000:]}") from None
            key = cases[name][3]
            assert p.returncode != 0, (name, kind, out[-3000:])
            assert key in out, (name, kind, out[-3000:])
            assert WRONG not in out and PASSWORD not in out, (name, kind)
    finally:
        for srv in sources:
            srv.stop()


def test_missing_topic_and_too_large_row(secure: dict[str, Any], tmp_path: Path) -> None:
    """Topic auto-creation off on the broker and ``create_topics = false``: the error names the topic
    and the setting. A row bigger than the broker's message.max.bytes (1048588 by default; the
    producer's max_message_bytes raised above it): the capturer stops naming the table, the key and the
    sizes; nothing after it is written."""
    b: Broker = secure["broker"]
    sources = start_servers(tmp_path, 1)
    m = sources[0]
    m.execute("CREATE DATABASE big", "CREATE TABLE big.docs (id INT PRIMARY KEY, body LONGTEXT)")
    procs: dict[str, CapturerProcess] = {}
    try:
        # missing: create_topics = false; large: the broker refuses it (the producer's limit raised);
        # limit: the producer's own limit (kafka-python's, max_message_bytes at its default) refuses it
        for i, (name, client, extra) in enumerate([("missing", "confluent", "create_topics=false\n"),
                                                   ("large", "confluent", "max_message_bytes=4000000\n"),
                                                   ("limit", "kafka-python", "")]):
            d = tmp_path / name
            d.mkdir()
            cfg = write_config(d, sources, senders=kafka_section(b.servers, client, name, "", extra))
            cfg.write_text(cfg.read_text().replace("server_id=800", f"server_id={820 + i}"))
            procs[name] = CapturerProcess(cfg, d / "capturer.log").start()
        for p in procs.values():
            p.wait_ready()
        m.execute("INSERT INTO big.docs VALUES (1, 'small')", f"INSERT INTO big.docs VALUES (7, REPEAT('x', {1_500_000}))",
                  "INSERT INTO big.docs VALUES (8, 'after')")
        for name, p in procs.items():
            assert p.proc is not None
            try:
                p.proc.wait(90)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name}: the capturer still runs: {p.log.read_text()[-3000:]}") from None
            assert p.proc.returncode != 0
        log = procs["missing"].log.read_text(errors="replace")
        assert "create_topics = false" in log and re.search(r"topic 'missing\.[a-z_.]+' does not exist", log), log[-3000:]
        log = procs["large"].log.read_text(errors="replace")
        assert "big.docs" in log and "key" in log and "max_message_bytes = 4000000" in log, log[-3000:]
        assert re.search(r"a message of about 15\d{5} bytes", log), log[-3000:]
        log = procs["limit"].log.read_text(errors="replace")
        assert "big.docs" in log and "max_message_bytes = 1048576" in log, log[-3000:]
        assert re.search(r"a message of about 15\d{5} bytes", log), log[-3000:]
        # the rows before it were written, the big row is not there (the capturer stopped on it: its
        # checkpoint stays before it, so a restart with the limits raised sends it)
        from helpers import consume_all

        values = [r.value for r in consume_all(b.servers, ["large.big.docs"], idle=2.0) if r.value]
        assert any(b'"small"' in v for v in values)
        assert not any(len(v) > 1_000_000 for v in values)
    finally:
        for p in procs.values():
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
        for srv in sources:
            srv.stop()
