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


class Polled:
    """A stand-in whose poll and consume hand out these confluent-kafka messages."""

    def __init__(self, msgs: list[Any]) -> None:
        self.msgs = msgs

    def poll(self, timeout: float) -> Any:
        return self.msgs.pop(0) if self.msgs else None

    def consume(self, n: int, timeout: float) -> list[Any]:
        out, self.msgs = self.msgs[:n], self.msgs[n:]
        return out


def polled(msgs: list[Any], fast: bool, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    import senders.kafka.consumer as mod
    from capturer.util.kafkasec import Watch

    if not fast:
        monkeypatch.setattr(mod, "_msgs", None)
    cc = consumer(Polled(list(msgs)))
    cc.assigned, cc.watch = {("a", 0)}, Watch()
    out = cc.poll(5000, 0.1)
    monkeypatch.undo()
    return [(m.topic, m.partition, m.offset, m.key, m.value, m.headers, m.ts_ms) for m in out]


def test_the_c_read_of_a_poll_is_the_python_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kafka_msgs`` (one C call a poll) makes the Msg objects the Python loop makes: headers or [],
    each partition's last message with its Kafka timestamp (none where the message has none), the
    others 0; a poll with an error in it goes the Python way (skipped, logged)."""
    from confluent_kafka import Message

    import senders.kafka.consumer as mod

    assert mod._msgs is not None, "the C extension lacks kafka_msgs: rebuild it (setup.py build_ext --inplace)"
    hs = [("region", b"r1"), ("commit_ts", b"12"), ("seq", b"3"), ("op", b"c")]
    msgs = [Message(topic="a", partition=p, offset=o, key=k, value=v, headers=h, timestamp=ts)
            for p, o, k, v, h, ts in [(0, 5, b"k", b"{}", hs, (1, 100)), (1, 7, None, None, None, (1, 200)),
                                      (0, 6, b"k2", b"x", [], (1, 300)), (2, 1, b"", b"y", hs, (0, 400)),
                                      (1, 8, b"z", b"w", [("h", None)], (2, 500))]]
    want = [("a", 0, 5, b"k", b"{}", hs, 0), ("a", 1, 7, None, None, [], 0), ("a", 0, 6, b"k2", b"x", [], 300),
            ("a", 2, 1, b"", b"y", hs, 0), ("a", 1, 8, b"z", b"w", [("h", None)], 500)]
    assert polled(msgs, False, monkeypatch) == want
    assert polled(msgs, True, monkeypatch) == want
    assert mod._msgs(msgs, mod.Msg) is not None  # (the C path, not a fallback, gave it)
    with_error = msgs[:2] + [Message(error=KafkaError(KafkaError._PARTITION_EOF))] + msgs[2:]
    assert mod._msgs(with_error, mod.Msg) is None
    assert polled(with_error, True, monkeypatch) == polled(with_error, False, monkeypatch) == want
