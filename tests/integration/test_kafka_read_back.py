"""The Kafka sender's start-up read-back on the run's Apache Kafka broker: a new sender (a restart
after ``kill -9``) whose first batch goes to 20 topics reads the marks of all of them together,
one consumer for all their partitions (a round or two), not one consumer a topic (~0.5 s each:
with tens of tables a capturer killed every few seconds never had a batch acknowledged), and
skips exactly what the partitions hold: every message once. Both clients (kafka-python also
without confluent-kafka, its own consumer reading back), with and without Kafka transactions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import Broker, consume_all, shared_broker

pytestmark = pytest.mark.integration

TABLES = 20


@pytest.fixture
def broker() -> Iterator[Broker]:
    yield shared_broker()  # the run's one Apache Kafka broker, emptied for this test


def batch(first_ts: int, rows: int = 20) -> list[Any]:
    """One transaction per table (a topic each), ``rows`` inserts each."""
    from capturer.model import Position, RowChange, TableSchema, Txn

    out = []
    for i in range(TABLES):
        schema = TableSchema("rb", f"t{i}", ("id", "v"), ("id",))
        out.append(Txn("r1", first_ts + i, Position("f", first_ts + i),
                       tuple(RowChange(schema, "insert", None, {"id": k, "v": first_ts}) for k in range(rows))))
    return out


@pytest.mark.parametrize("client,transactional", [
    ("confluent", False), ("kafka-python", False), ("kafka-python-alone", False),
    ("confluent", True),
    # (the read-back of kafka-python's client is confluent-kafka's where it is installed, as above)
    pytest.param("kafka-python", True, marks=pytest.mark.slow),
])
def test_a_restarted_sender_reads_its_topics_back_together(broker: Broker, monkeypatch: pytest.MonkeyPatch,
                                                           client: str, transactional: bool) -> None:
    import kafka

    import senders.kafka.client as kc
    from senders.kafka.sender import KafkaSender

    if client == "kafka-python-alone":  # as where confluent-kafka is not installed: kafka-python's consumer
        monkeypatch.setattr(kc, "confluent_available", lambda: False)
    options: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
    options.update(servers=broker.servers, client=client.removesuffix("-alone"), schema_topic="",
                   txn_topic="capturer.txns", transactional=transactional, process=False)
    first, second = batch(1000), batch(2000)

    def run(txns: list[Any]) -> KafkaSender:
        s = KafkaSender("k", options)
        s.open()
        s.send(txns)
        s.settle()
        s.close()
        return s

    run(first + second[:7])  # what reached Kafka before the crash
    readers: list[int] = []  # consumers made (confluent-kafka) / assignments (kafka-python's consumer)
    fresh, assign = kc.ConfluentReadBack._fresh, kafka.KafkaConsumer.assign
    monkeypatch.setattr(kc.ConfluentReadBack, "_fresh", lambda self: (readers.append(1), fresh(self))[1])
    monkeypatch.setattr(kafka.KafkaConsumer, "assign", lambda self, tps: (readers.append(1), assign(self, tps))[1])
    s = run(first[4:] + second)  # the restart replays from an older checkpoint
    reads = len(readers)
    topics = [f"capturer.rb.t{i}" for i in range(TABLES)]
    records = consume_all(broker.servers, [*topics, "capturer.txns"], committed=True)
    ids = Counter((r.topic, dict(r.headers)["commit_ts"], dict(r.headers)["seq"], dict(r.headers)["op"])
                  for r in records)
    assert max(ids.values()) == 1, [k for k, n in ids.items() if n > 1][:5]
    rows = {k for k in ids if k[0] != "capturer.txns"}
    assert len(rows) == 2 * TABLES * 20
    assert len(ids) - len(rows) == 2 * 2 * TABLES  # a BEGIN and an END a transaction
    assert s.marks.skipped > 0
    # 21 topics: read in one round (a second where the last record of a partition is a transaction's
    # commit marker: read again from a little further back), never one consumer a topic
    # (confluent-kafka: one consumer more, kept for the offsets)
    assert 1 <= reads <= 2 + (client != "kafka-python-alone"), reads
