"""``python -m capturer --config X --check --connect`` against real servers: each
source and destination that cannot serve the capturer is named, with what to
change; exit code 3 (2 stays for what a start refuses before connecting)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT, shared_broker

from devtools.local_mariadb import MariaDBInstance
from devtools.local_postgres import PostgresInstance

pytestmark = pytest.mark.integration

PASSWORD = "capt-s3cr-pw"


def capture_user(m: MariaDBInstance, user: str = "capturer", privileges: str =
                 "REPLICATION SLAVE, BINLOG MONITOR, SELECT") -> None:
    m.execute(f"CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'",
              f"GRANT {privileges} ON *.* TO '{user}'@'127.0.0.1'")


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBInstance]:
    """A source set up as the capturer needs it (also a MySQL sender's target)."""
    m = MariaDBInstance(tmp_path_factory.mktemp("good"), server_id=1).start()
    capture_user(m)
    capture_user(m, "norepl", "BINLOG MONITOR")
    m.execute("CREATE DATABASE tgt", f"CREATE USER 'weak'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'",
              "GRANT SELECT ON tgt.* TO 'weak'@'127.0.0.1'",
              f"CREATE USER 'writer'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'",
              "GRANT ALL PRIVILEGES ON tgt.* TO 'writer'@'127.0.0.1'")
    yield m
    m.stop()


@pytest.fixture(scope="module")
def statement(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBInstance]:
    """A source whose binlog holds statements, not rows."""
    m = MariaDBInstance(tmp_path_factory.mktemp("stmt"), server_id=1,
                        extra={"binlog_format": "STATEMENT", "binlog_row_metadata": "MINIMAL"}).start()
    capture_user(m)
    yield m
    m.stop()


def region(name: str, port: int, user: str = "capturer", extra: str = "") -> str:
    return (f"[region:{name}]\nhost=127.0.0.1\nport={port}\nuser={user}\npassword={PASSWORD}\nserver_id=801\n"
            f"{extra}")


def write(tmp: Path, regions: str, senders: str = "") -> Path:
    (tmp / "filter_rule.txt").write_text("")
    (tmp / "senderConfig.cfg").write_text(
        senders or f"[global]\ntype=local\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n")
    cfg = tmp / "config.cfg"
    cfg.write_text(f"[global]\nbinlogCheckPointPath={tmp / 'cp.json'}\nsenderConfig={tmp / 'senderConfig.cfg'}\n"
                   f"filterRuleDict={tmp / 'filter_rule.txt'}\nhttpPort=0\n{regions}")
    return cfg


def run(cfg: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "capturer", "--config", str(cfg), "--check", "--connect"],
                       capture_output=True, text=True, cwd=str(cfg.parent), timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    both = r.stdout + r.stderr
    assert "Traceback" not in both, both
    assert "s3cr" not in both, both  # (every password and token here holds it)
    return r, time.monotonic() - t0


def errors(r: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("error: ")]


def failed(cfg: Path, *needles: str) -> list[str]:
    """Exit code 3, and an error line holding all of ``needles``."""
    r, _ = run(cfg)
    assert r.returncode == 3, r.stdout + r.stderr
    lines = errors(r)
    assert any(all(n in line for n in needles) for line in lines), f"{needles} not in one line of:\n{r.stderr}"
    return lines


def test_a_good_mariadb_and_a_file_sender_pass(tmp_path: Path, good: MariaDBInstance) -> None:
    r, _ = run(write(tmp_path, region("r1", good.port)))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "config OK" and out[-1] == "connections OK", r.stdout
    assert any(line.startswith(f"ok: region r1 (mysql 127.0.0.1:{good.port}): ") and "ROW/FULL/FULL" in line
               for line in out), r.stdout
    assert any(line.startswith("ok: sender local") for line in out), r.stdout
    assert not errors(r)


def test_statement_binlog_is_named_with_what_to_set(tmp_path: Path, statement: MariaDBInstance) -> None:
    lines = failed(write(tmp_path, region("r1", statement.port)),
                   f"region r1 (127.0.0.1:{statement.port})", "binlog_format=STATEMENT (need binlog_format=ROW)",
                   "binlog_row_metadata=MINIMAL (need binlog_row_metadata=FULL)", "SET GLOBAL")
    assert len(lines) == 1


def test_missing_replication_privilege_is_named(tmp_path: Path, good: MariaDBInstance) -> None:
    failed(write(tmp_path, region("r1", good.port, user="norepl")),
           "region r1", "lacks the REPLICATION SLAVE privilege", "GRANT REPLICATION SLAVE ON *.* TO 'norepl'@")


def test_a_wrong_password_names_the_region_and_where_to_change_it(tmp_path: Path, good: MariaDBInstance) -> None:
    cfg = write(tmp_path, region("r1", good.port).replace(f"password={PASSWORD}", "password=wrong-one"))
    failed(cfg, f"region r1 (127.0.0.1:{good.port})", "Access denied", "[region:r1]", str(cfg))


def test_a_purged_checkpoint_binlog_is_named(tmp_path: Path, good: MariaDBInstance) -> None:
    cfg = write(tmp_path, region("r1", good.port))
    (tmp_path / "cp.json").write_text('{"version": 1, "commit_ts": 5, "regions": '
                                      '{"r1": {"file": "mariadb-bin.000099", "pos": 4}}}')
    failed(cfg, "region r1", "mariadb-bin.000099:4", "no longer on the server", "snapshot = when_needed")


def test_unreachable_sources_fail_quickly_and_at_once(tmp_path: Path, good: MariaDBInstance) -> None:
    """A closed port answers at once; a host that never answers is given up after the
    probe's timeout (5 s), while the other checks go on."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    silent = socket.socket()  # accepts (the kernel does), never greets
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    mute_port = silent.getsockname()[1]
    try:
        cfg = write(tmp_path, region("dead", closed_port) + region("mute", mute_port) +
                    region("fine", good.port).replace("server_id=801", "server_id=802"))
        r, took = run(cfg)
    finally:
        silent.close()
    assert r.returncode == 3, r.stdout + r.stderr
    lines = errors(r)
    assert any(f"region dead (127.0.0.1:{closed_port})" in line and "Connection refused" in line
               for line in lines), r.stderr
    assert any(f"region mute (mysql 127.0.0.1:{mute_port})" in line and "no answer within 5 s" in line
               for line in lines), r.stderr
    assert len(lines) == 2 and "ok: region fine" in r.stdout, r.stdout + r.stderr
    assert took < 20, f"took {took:.1f}s: the checks did not run at once with a timeout"


def test_postgresql_with_wal_level_replica_is_named(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    pg = PostgresInstance(wal_level="replica").start()
    try:
        cfg = write(tmp_path, f"[region:pg]\ntype=postgresql\nhost=127.0.0.1\nport={pg.port}\nuser=postgres\n"
                              "dbname=postgres\ncreate_publication=all\n")
        lines = failed(cfg, f"region pg (postgresql 127.0.0.1:{pg.port}/postgres", "wal_level is 'replica'",
                       "wal_level = logical")
        assert len(lines) == 1
    finally:
        pg.destroy()


def test_postgresql_ready_for_logical_decoding_passes(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    pg = PostgresInstance().start()
    try:
        region_pg = (f"[region:pg]\ntype=postgresql\nhost=127.0.0.1\nport={pg.port}\nuser=postgres\n"
                     "dbname=postgres\n")
        r, _ = run(write(tmp_path, region_pg + "create_publication=all\n"))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "ok: region pg (postgresql" in r.stdout
        assert "publication 'capturer_pg' does not exist: a start creates it" in r.stderr
        assert "replication slot 'capturer_pg' does not exist: a start creates it" in r.stderr
        # without create_publication, the missing publication is a problem
        failed(write(tmp_path, region_pg), "region pg", "publication 'capturer_pg' does not exist",
               "create_publication = all")
    finally:
        pg.destroy()


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_kafka_sender_at_a_dead_port_is_named(tmp_path: Path, good: MariaDBInstance, client: str) -> None:
    pytest.importorskip("kafka" if client == "kafka-python" else "confluent_kafka")
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    cfg = write(tmp_path, region("r1", good.port),
                f"[global]\ntype=kafka\n[kafka]\nservers=127.0.0.1:{port}\nclient={client}\n")
    r, took = run(cfg)
    assert r.returncode == 3, r.stdout + r.stderr
    # (the client's own limit answers first, or the probe's 5 s)
    assert any(line.startswith(f"error: sender kafka (127.0.0.1:{port}): no ") and "answer within" in line and
               f"[kafka] of {tmp_path / 'senderConfig.cfg'}" in line for line in errors(r)), r.stderr
    assert "ok: region r1" in r.stdout
    assert took < 20


def test_a_kafka_sender_with_a_broker_passes(tmp_path: Path, good: MariaDBInstance) -> None:
    pytest.importorskip("kafka")
    broker = shared_broker()
    try:
        r, _ = run(write(tmp_path, region("r1", good.port),
                         f"[global]\ntype=kafka\n[kafka]\nservers={broker.servers}\n"))
    finally:
        broker.kill()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ok: sender kafka ({broker.servers}): 1 broker(s) answered" in r.stdout


def mysql_sender(good: MariaDBInstance, user: str, extra: str = "") -> str:
    return (f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={good.port}\nuser={user}\npassword={PASSWORD}\n"
            f"database=tgt\n{extra}")


def test_a_mysql_target_user_without_privileges_is_named(tmp_path: Path, good: MariaDBInstance) -> None:
    cfg = write(tmp_path, region("r1", good.port), mysql_sender(good, "weak"))
    failed(cfg, f"sender mysql (127.0.0.1:{good.port})", "lacks INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX "
           "on database 'tgt'", "GRANT INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX ON `tgt`.* TO 'weak'@")
    # with ddl = skip, no DDL privilege is needed
    failed(write(tmp_path, region("r1", good.port), mysql_sender(good, "weak", "ddl=skip\n")),
           "lacks INSERT, UPDATE, DELETE on database 'tgt'")


def test_a_mysql_target_with_privileges_passes(tmp_path: Path, good: MariaDBInstance) -> None:
    r, _ = run(write(tmp_path, region("r1", good.port), mysql_sender(good, "writer", "meta_database=\n")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ok: sender mysql (127.0.0.1:{good.port})" in r.stdout and "database tgt" in r.stdout
    # a target database that does not exist is named
    failed(write(tmp_path, region("r1", good.port),
                 mysql_sender(good, "writer", "meta_database=\n").replace("database=tgt", "database=nope")),
           "database 'nope'", "does not exist on the target", "CREATE DATABASE `nope`")


def test_offline_problems_keep_exit_code_2(tmp_path: Path, good: MariaDBInstance) -> None:
    """A problem a start refuses before connecting wins over a connection problem."""
    cfg = write(tmp_path, region("r1", good.port))
    (tmp_path / "filter_rule.txt").write_text("frobnicate\n")
    r, _ = run(cfg)
    assert r.returncode == 2, r.stdout + r.stderr
    assert any(f"{tmp_path / 'filter_rule.txt'}:1:" in line for line in errors(r)), r.stderr


def test_a_region_in_a_worker_process_is_tried_as_its_worker_would(tmp_path: Path, good: MariaDBInstance) -> None:
    r, _ = run(write(tmp_path, region("r1", good.port, extra="process=true\n")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ok: region r1 (mysql 127.0.0.1:{good.port}): " in r.stdout
    failed(write(tmp_path, region("r1", good.port, user="norepl", extra="process=true\n")),
           "region r1", "lacks the REPLICATION SLAVE privilege")


def test_an_agent_that_does_not_answer_is_named(tmp_path: Path, good: MariaDBInstance) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    cfg = write(tmp_path, region("r1", good.port) + f"[region:far]\ntype=remote\naddress=127.0.0.1:{port}\n"
                                                    "token=agent-s3cr-tok\n")
    failed(cfg, f"region far (agent 127.0.0.1:{port}): no agent answered", "UNAVAILABLE", "[region:far]")


def test_baikaldb_meta_servers_answer_and_the_binlog_table_is_named(tmp_path: Path) -> None:
    from devtools.baikaldb_double import BaikalDouble
    from devtools.baikaldb_workload import baikal_config, build

    d = BaikalDouble(n_stores=1, n_meta=2).start()
    try:
        build(d)
        cfg = baikal_config(tmp_path, d, f"[global]\ntype=local\n[local]\nfilepath={tmp_path / 'o.jsonl'}\n")
        r, _ = run(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "ok: region shop (baikaldb meta " in r.stdout and "binlog region(s)" in r.stdout
        cfg.write_text(cfg.read_text().replace("binlogTableID=20", "binlogTableID=920"))
        failed(cfg, "region shop (BaikalDB binlog table 920): the meta server knows no region of table 920",
               "binlogTableID in [region:shop]")
    finally:
        d.stop()
    failed(cfg, "region shop", "no meta server answered", "check metaServer in [region:shop]")
