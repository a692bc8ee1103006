"""The applier's confluent-kafka consumer assigns partitions at offsets it fetched itself.

A stand-in replaces the librdkafka consumer here (the failure it guards against, a request-level
NOT_COORDINATOR answer to the offset fetch of a partition assigned at OFFSET_STORED, cannot be
caused on demand with a real broker: it needs a coordinator that is still loading at that moment).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from capturer.errors import SourceError
from senders.kafka.consumer import ConfluentConsumer


class StandIn:
    def __init__(self, failures: int, committed: dict[tuple[str, int], int]) -> None:
        self.failures, self.offsets = failures, committed
        self.calls = 0
        self.assigned: list[TopicPartition] = []

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))
        return [TopicPartition(tp.topic, tp.partition, self.offsets.get((tp.topic, tp.partition), -1001))
                for tp in tps]

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.assigned += tps


def consumer(c: Any, timeout: float = 0.2) -> ConfluentConsumer:
    cc = ConfluentConsumer.__new__(ConfluentConsumer)
    cc.c, cc.servers, cc.timeout, cc.assigned = c, "127.0.0.1:1", timeout, set()
    return cc


def test_assigned_at_the_committed_offset_or_the_beginning_after_retries() -> None:
    c = StandIn(failures=2, committed={("t", 0): 42})
    consumer(c, timeout=5).add([("t", 0), ("t", 1)])
    assert c.calls == 3  # two NOT_COORDINATOR answers retried
    assert {(tp.topic, tp.partition, tp.offset) for tp in c.assigned} == {("t", 0, 42), ("t", 1, OFFSET_BEGINNING)}


def test_a_coordinator_that_never_answers_is_an_error_not_a_silent_wait() -> None:
    c = StandIn(failures=10**9, committed={})
    cc = consumer(c, timeout=0.2)
    with pytest.raises(SourceError, match=r"cannot read the committed offsets of t\[0\]"):
        cc.add([("t", 0)])
    assert not c.assigned and not cc.assigned
