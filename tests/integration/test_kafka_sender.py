"""MySQL -> Kafka against a real Apache Kafka broker (devtools/local_kafka.py)."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Broker, CapturerProcess, checkpoint_covers, consume_all, shared_broker, wait_for, write_config
from workload import SCHEMA, Workload

from senders.kafka.sender import partition_for

pytestmark = pytest.mark.integration


@pytest.fixture
def broker() -> Iterator[Broker]:
    yield shared_broker()  # the run's one Apache Kafka broker, emptied for this test


def kafka_senders(servers: str, **extra: object) -> str:
    opts: dict[str, object] = {"servers": servers}
    opts.update(extra)
    return "[global]\ntype=kafka\n[kafka]\n" + "".join(f"{k}={v}\n" for k, v in opts.items())


def hdr(rec: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in rec.headers}


def rebuild_from_kafka(records: list[Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Apply the Debezium-like events per topic in partition order; dedupe by headers."""
    seen = set()
    state: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    keyless: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
        if r.value is None:
            continue
        h = hdr(r)
        ident = (h["region"], h["commit_ts"], h["seq"], h["op"])
        if ident in seen:
            continue
        seen.add(ident)
        d = json.loads(r.value)
        if r.key is None:
            if d["op"] == "c":
                keyless[r.topic].append(d["after"])
            elif d["op"] == "d":
                keyless[r.topic].remove(d["before"])
            continue
        if d["op"] in ("c", "u"):
            state[r.topic][r.key.decode()] = d["after"]
        else:
            state[r.topic].pop(r.key.decode(), None)
    for t, rows in keyless.items():
        state[t] = {str(i): row for i, row in enumerate(rows)}
    return state


def source_json_rows(servers: list[Any], table: str) -> list[str]:
    from capturer.model.encode import json_row

    c_rows = []
    for m in servers:
        c = m.connect()
        with c.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            cur.execute(f"SELECT * FROM app.{table}")
            cols = [d[0] for d in cur.description]
            c_rows += [json.dumps(json_row(dict(zip(cols, r)), set()), sort_keys=True) for r in cur.fetchall()]
        c.close()
    return sorted(c_rows)


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_complete_and_ordered_per_key(tmp_path: Path, two_servers, broker, capturer_running, client: str) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute(*SCHEMA)
    cfg = write_config(tmp_path, two_servers, senders=kafka_senders(broker.servers, client=client, txn_topic="capturer.txns"))
    with capturer_running(cfg) as cap:
        loads = [Workload(m, i + 1, 30 + i) for i, m in enumerate(two_servers)]
        threads = [w.thread(400) for w in loads]
        for t in threads:
            t.join()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 120, "Kafka to catch up")
        assert cap.senders[0].status()["errors"] == 0
    records = consume_all(broker.servers)
    topics = {r.topic for r in records}
    assert {"capturer.app.users", "capturer.app.pairs", "capturer.app.log", "capturer.schema_changes",
            "capturer.txns"} <= topics
    # per key: one partition, changes in commit order
    per_key: dict[tuple[str, bytes], list[int]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
        if r.key is not None and r.topic.startswith("capturer.app."):
            assert r.partition == partition_for(r.key, 3)
            per_key[(r.topic, r.key)].append(int(hdr(r)["commit_ts"]))
    for k, ts in per_key.items():
        assert ts == sorted(ts), f"changes of {k} out of order"
    # complete: rebuilding every table from the topics gives the sources' rows
    state = rebuild_from_kafka([r for r in records if r.topic.startswith("capturer.app.")])
    for table in ("users", "pairs", "log"):
        got = sorted(json.dumps(v, sort_keys=True) for v in state[f"capturer.app.{table}"].values())
        assert got == source_json_rows(two_servers, table), f"{table} differs"
    # transaction boundaries
    txn_recs = [json.loads(r.value) for r in records if r.topic == "capturer.txns"]
    ends = [t for t in txn_recs if t["status"] == "END"]
    assert sum(t["event_count"] for t in ends) == sum(w.rows for w in loads)


def test_pk_change_delete_then_create_in_right_partitions(tmp_path: Path, two_servers, broker, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(10))")
    cfg = write_config(tmp_path, two_servers[:1], senders=kafka_senders(
        broker.servers, tombstones="true", topic="cdc.{region}.{db}.{table}", partitions=5))
    with capturer_running(cfg):
        m1.execute("INSERT INTO d.t VALUES (1, 'a')", "UPDATE d.t SET id = 2 WHERE id = 1")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 60)
    recs = consume_all(broker.servers, ["cdc.r1.d.t"])
    events = [(r.key, r.partition, json.loads(r.value)["op"] if r.value else None) for r in recs]
    events.sort(key=lambda e: [r.offset for r in recs if (r.key, r.partition) == e[:2]][0])
    by_key = defaultdict(list)
    for r in recs:
        by_key[r.key].append((r.offset, json.loads(r.value)["op"] if r.value else "tombstone", r.partition))
    assert [e[1] for e in sorted(by_key[b'{"id":1}'])] == ["c", "d", "tombstone"]
    assert [e[1] for e in sorted(by_key[b'{"id":2}'])] == ["c"]
    assert {e[2] for e in by_key[b'{"id":1}']} == {partition_for(b'{"id":1}', 5)}
    assert {e[2] for e in by_key[b'{"id":2}']} == {partition_for(b'{"id":2}', 5)}
    create = [r for r in recs if r.key == b'{"id":2}'][0]
    delete = [r for r in recs if r.key == b'{"id":1}' and r.value and json.loads(r.value)["op"] == "d"][0]
    assert hdr(create)["commit_ts"] == hdr(delete)["commit_ts"]  # one source change, two events
    assert json.loads(delete.value)["before"] == {"id": 1, "v": "a"}


@pytest.mark.slow  # CI time (test_a_hung_broker_holds_back_nobody covers a broker that is away)
def test_broker_down_at_start_then_up_costs_nothing(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY)")
    broker = Broker()  # not started yet
    cfg = write_config(tmp_path, two_servers[:1], senders=kafka_senders(broker.servers))
    with capturer_running(cfg) as cap:
        m1.execute(*[f"INSERT INTO d.t VALUES ({i})" for i in range(50)])
        wait_for(lambda: cap.senders[0].retries > 0, 60, "the sender to retry")
        assert cap.checkpoint.commit_ts == 0 and cap.health()[0] is False
        broker.start()
        try:
            wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 120, "delivery once the broker is up")
            ids = sorted(json.loads(r.value)["after"]["id"] for r in consume_all(broker.servers, ["capturer.d.t"]))
        finally:
            broker.kill()
    assert ids == list(range(50))


@pytest.mark.slow  # CI time (the chaos suite's quick run restarts the broker under load, every sender)
def test_broker_restarted_mid_load(tmp_path: Path, two_servers) -> None:  # type: ignore[no-untyped-def]
    """The broker goes away under load and comes back (a broker of its own, stopped with
    SIGTERM as an operator restarts a broker; its log kept). While it is away the
    checkpoint must not pass what Kafka has not acknowledged; afterwards every row is
    in Kafka. A local sender runs alongside (fan-out) and tells each row's commit_ts."""
    for m in two_servers:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)")
    broker = Broker().start()
    senders = kafka_senders(broker.servers).replace("type=kafka", "type=kafka,local")
    senders += f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
    cfg = write_config(tmp_path, two_servers, senders=senders)
    proc = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    try:
        for i in range(300):
            two_servers[i % 2].execute(f"INSERT INTO d.t VALUES ({i}, {i})")
        time.sleep(2)
        broker.stop()
        for i in range(300, 600):
            two_servers[i % 2].execute(f"INSERT INTO d.t VALUES ({i}, {i})")
        time.sleep(3)
        stalled = json.loads((tmp_path / "checkpoint.json").read_text())["commit_ts"]
        broker.start()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 120, "recovery after the broker restart")
        recs = consume_all(broker.servers, ["capturer.d.t"])
    finally:
        assert proc.stop() == 0
        broker.cleanup()
    from helpers import read_lines

    commit_ts = {x["after"]["id"]: x["commit_ts"] for x in read_lines(tmp_path) if x["op"] == "insert"}
    assert sorted(commit_ts) == list(range(600))
    in_kafka = {json.loads(r.value)["after"]["id"] for r in recs}
    assert in_kafka == set(range(600)), f"missing in Kafka: {sorted(set(range(600)) - in_kafka)[:10]}"
    # while the broker was away the checkpoint did not pass rows the broker did not have yet
    late = [i for i in range(300, 600) if commit_ts[i] <= stalled]
    assert not late, f"the checkpoint passed rows written while the broker was down: {late[:10]}"


@pytest.mark.parametrize("fmt", ["canal", "sql", "protobuf"])
def test_other_formats(tmp_path: Path, two_servers, broker, capturer_running, fmt: str) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(10))")
    cfg = write_config(tmp_path, two_servers[:1], senders=kafka_senders(broker.servers, format=fmt))
    with capturer_running(cfg):
        m1.execute("INSERT INTO d.t VALUES (1, 'a')", "UPDATE d.t SET v = 'b' WHERE id = 1", "DELETE FROM d.t")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 60)
    recs = sorted(consume_all(broker.servers, ["capturer.d.t"]), key=lambda r: r.offset)
    assert len(recs) == 3
    if fmt == "canal":
        assert [json.loads(r.value)["type"] for r in recs] == ["INSERT", "UPDATE", "DELETE"]
        assert json.loads(recs[1].value)["old"] == [{"v": "a"}]
    elif fmt == "sql":
        sqls = [r.value.decode() for r in recs]
        assert sqls[0].startswith("INSERT INTO `d`.`t`") and sqls[2].startswith("DELETE FROM `d`.`t`")
    else:
        from capturer.model import protogen

        pb = protogen.load()
        ops = []
        for r in recs:
            m = pb.RowChange()
            m.ParseFromString(r.value)
            ops.append(m.op)
        assert ops == [pb.RowChange.INSERT, pb.RowChange.UPDATE, pb.RowChange.DELETE]
    ddl = consume_all(broker.servers, ["capturer.schema_changes"])
    assert len(ddl) == 2  # CREATE DATABASE, CREATE TABLE


def test_a_sender_process_settles_kafka_batches_later_and_loses_nothing_to_a_kill(tmp_path: Path,
                                                                                   broker: Broker) -> None:
    """``process = true``: the Kafka sender's child produces a batch handed over with ``["end", 1]`` and
    delivers it at the ``settle`` that follows (its flush overlaps the next batch, as in-process). A child
    killed (-9) between a batch's send and its settle is a retriable error at the settle, not an
    acknowledgement; the batches sent again then reach Kafka once each. A transactional sender commits in
    ``send`` and is not deferred."""
    import os
    import signal

    from capturer import config
    from capturer.errors import SinkError
    from capturer.model import ColumnInfo, Position, RowChange, TableSchema, Txn
    from senders import CATALOG
    from senders.process import ProcessSender

    s = TableSchema("d", "t", ("id", "v"), ("id",), (), (3, 15), (ColumnInfo(3), ColumnInfo(15)))

    def batch(first: int) -> list[Txn]:
        return [Txn("r1", (first + i) << 18, Position("bin.000001", 4 + first + i),
                    tuple(RowChange(s, "insert", None, {"id": (first + i) * 10 + k, "v": f"'{k}\\"})
                          for k in range(10)))
                for i in range(20)]

    def opts(extra: str = "") -> dict[str, Any]:
        p = tmp_path / f"s{len(extra)}.cfg"
        p.write_text(kafka_senders(broker.servers, client="confluent", topic="settle_later") + extra +
                     "process=true\n")
        (sc,) = config.load_sender_config(p, CATALOG)
        return sc.options

    assert not ProcessSender("kafka", opts("transactional=true\n")).defer_settle
    ps = ProcessSender("kafka", opts())
    assert ps.defer_settle
    ps.settle_later = True  # (as the sender's loop sets it)
    try:
        ps.open()
        ps.resume_key()
        ps.send(batch(1))
        ps.send(batch(100))
        ps.settle()
        ps.send(batch(200))
        assert ps.proc is not None
        os.kill(ps.proc.pid, signal.SIGKILL)  # produced, not settled
        ps.proc.wait()
        with pytest.raises(SinkError) as e:
            ps.settle()
        assert e.value.retriable
        ps.resume_key()  # (a new child: it reads back what the topic holds)
        ps.send(batch(200))  # the loop sends every unsettled batch again
        ps.settle()
    finally:
        ps.close()
    recs = consume_all(broker.servers, ["settle_later"])
    ids = sorted(json.loads(r.value)["after"]["id"] for r in recs)
    want = sorted(i * 10 + k for f in (1, 100, 200) for i in range(f, f + 20) for k in range(10))
    assert ids == want  # each once: nothing lost, nothing twice
