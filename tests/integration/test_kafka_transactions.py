"""Kafka transactions (``[kafka] transactional = true``, issue 45 item 3) on the run's
Apache Kafka broker: an aborted batch is invisible to a ``read_committed`` reader and the
retry writes it once; ``kill -9`` mid-load (mid-transaction) loses and repeats nothing for
a ``read_committed`` reader, for both clients."""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Broker, CapturerProcess, checkpoint_covers, shared_broker, wait_for, write_config

sys.path.insert(0, str(Path(__file__).parent))  # the crash test's load and checks are shared with issue 30's
from test_kafka_exactly_once import acked_ts, check_kafka, kafka_senders, start_load, stop_load

from capturer.errors import SinkError
from capturer.util import failpoints
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


@pytest.fixture
def broker() -> Iterator[Broker]:
    yield shared_broker()  # the run's one Apache Kafka broker, emptied for this test


def read_all(servers: str, committed: bool, topics: list[str] | None = None, idle: float = 3.0) -> list[Any]:
    """Every message of the topics (default: all), from the beginning, ``read_committed`` or not."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False, group_id=None,
                      isolation_level="read_committed" if committed else "read_uncommitted",
                      session_timeout_ms=6000, heartbeat_interval_ms=2000)
    try:
        names = topics if topics is not None else sorted(t for t in c.topics() if not t.startswith("__"))
        tps = [TopicPartition(t, p) for t in names for p in sorted(c.partitions_for_topic(t) or [])]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out: list[Any] = []
        last = time.monotonic()
        while time.monotonic() - last < idle:
            for recs in c.poll(timeout_ms=300).values():
                out.extend(recs)
                last = time.monotonic()
        return out
    finally:
        c.close()


def ids(records: list[Any]) -> list[tuple[str, int]]:
    return [(dict(r.headers)["commit_ts"].decode(), int(dict(r.headers)["seq"])) for r in records]


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_aborted_batch_is_invisible_and_retried_once(broker: Broker, client: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose commit fails is aborted: a read_uncommitted reader sees its messages, a
    read_committed one none; the batch sent again (the sender's retry) is then read once."""
    from capturer.model import Position, RowChange, TableSchema, Txn
    from senders.kafka.sender import KafkaSender

    options: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
    options.update(servers=broker.servers, client=client, partitions=3, schema_topic="", transactional=True)
    s = KafkaSender("k", options)
    assert s.transactional_id == "capturer.k.k"
    schema = TableSchema("d", "t", ("id",), ("id",))
    batch = [Txn("r1", 1000 + b, Position("f", b),
                 tuple(RowChange(schema, "insert", None, {"id": b * 100 + i}) for i in range(100)))
             for b in range(5)]
    s.open()
    s.send(batch[:2])  # committed
    assert s.client is not None
    cls = type(s.client)

    def failing_commit(self: Any) -> None:
        raise RuntimeError("commit refused (injected)")

    with monkeypatch.context() as m:
        m.setattr(cls, "commit", failing_commit)
        with pytest.raises(SinkError):
            s.send(batch[2:])
    dirty = read_all(broker.servers, False, ["capturer.d.t"])
    clean = read_all(broker.servers, True, ["capturer.d.t"])
    assert len(set(ids(dirty))) == 500, "the aborted batch did not reach the broker: the test proves nothing"
    assert sorted(set(ids(clean))) == sorted(ids(clean)) and len(clean) == 200, len(clean)
    s.send(batch[2:])  # the retry: a new producer (its init_transactions), the read-back, a new transaction
    s.close()
    clean = read_all(broker.servers, True, ["capturer.d.t"])
    assert len(clean) == 500 and len(set(ids(clean))) == 500, len(clean)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_kill9_mid_transaction_nothing_lost_nothing_twice(tmp_path: Path, two_servers: list[MariaDBInstance],
                                                          broker: Broker, monkeypatch: pytest.MonkeyPatch,
                                                          client: str) -> None:
    """``kill -9`` from outside at a random moment, then one between two produce calls of a
    batch (an open transaction with messages in flight): a read_committed reader finds every
    change once; a read_uncommitted one sees the aborted transactions' messages too."""
    rng = random.Random(client)
    cfg = write_config(tmp_path, two_servers,
                       senders=kafka_senders(broker.servers, client=client, transactional="true"))
    log = tmp_path / "capturer.log"
    loads, threads, scratch = start_load(two_servers)
    proc = CapturerProcess(cfg, log).start()
    for crash in range(2):
        before = acked_ts(tmp_path)
        proc.wait_ready()
        wait_for(lambda: acked_ts(tmp_path) > before, 120, "the sender to acknowledge a batch")
        if crash == 1:
            proc.kill9()
            monkeypatch.setenv(failpoints.ENV, f"kafka.produce=kill@{rng.randrange(30, 120)}")
            proc = CapturerProcess(cfg, log).start()
            monkeypatch.delenv(failpoints.ENV)
            assert proc.proc is not None
            proc.proc.wait(120)
        else:
            time.sleep(rng.uniform(0.3, 2.0))
            proc.kill9()
        proc = CapturerProcess(cfg, log).start()
    proc.wait_ready()
    time.sleep(2)
    stop_load(loads, threads, scratch)
    wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 300, "Kafka to catch up")
    assert proc.stop() == 0
    records = read_all(broker.servers, True)
    print(f"{client} transactional: {check_kafka(records, loads, scratch, two_servers)}")
    dirty = read_all(broker.servers, False)
    print(f"read_uncommitted: {len(dirty)} messages, {len(dirty) - len(records)} of aborted transactions")
    assert len(dirty) >= len(records)
