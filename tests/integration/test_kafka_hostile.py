"""The Kafka sender as operators run it, under hostile conditions, on the run's Apache Kafka broker:
a topic's partitions raised while the sender writes it (then a crash and a replay from an older
checkpoint), hostile table names made topic names, and a row bigger than the broker takes.
The sender is driven directly (its batches made here), as the capturer's loop drives it: what the
checkpoint would hold is the sender's ``position_state`` after an acknowledged batch."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import Broker, consume_all, shared_broker

pytestmark = pytest.mark.integration

KEYS = 40


@pytest.fixture
def broker() -> Iterator[Broker]:
    yield shared_broker()  # the run's one Apache Kafka broker, emptied for this test


def options(broker: Broker, **kw: Any) -> dict[str, Any]:
    from senders.kafka.sender import KafkaSender

    o: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
    o.update(servers=broker.servers, client="confluent", schema_topic="", process=False)
    o.update(kw)
    return o


def updates(first_ts: int, txns: int, db: str = "ph", table: str = "t") -> list[Any]:
    """``txns`` transactions, each an update of every one of KEYS keys (v = its commit_ts)."""
    from capturer.model import Position, RowChange, TableSchema, Txn

    schema = TableSchema(db, table, ("id", "v"), ("id",))
    return [Txn("r1", ts, Position("f", ts),
                tuple(RowChange(schema, "update", {"id": k, "v": ts - 1}, {"id": k, "v": ts}) for k in range(KEYS)))
            for ts in range(first_ts, first_ts + txns)]


def raise_partitions(servers: str, topic: str, total: int) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": servers})
    for f in admin.create_partitions([NewPartitions(topic, total)]).values():
        f.result(60)


@pytest.mark.parametrize("client,failed_batch", [
    ("confluent", False), ("confluent", True), pytest.param("kafka-python", True, marks=pytest.mark.slow)])
def test_partitions_raised_mid_run_then_a_crash_keep_each_key_in_its_partition_once(
        broker: Broker, client: str, failed_batch: bool) -> None:
    """The topic's partitions raised from 3 to 6 while the sender writes it (kafka-topics --alter
    --partitions), then (``failed_batch``) a failed batch (a new producer, which reads the partition
    count again), then kill -9: the restarted sender replays from the checkpoint taken before the
    change. Every row change
    is in Kafka exactly once, and every key's messages are in one partition, in order. Before the
    sender kept each topic's partition count (in the checkpoint), the new producer hashed keys over 6
    partitions (half of them moved: a consumer could read a key's newer change before its older one),
    and the replay after the crash put the changes written before it into other partitions than they
    were in, where the read-back found no mark of them: written twice."""
    from senders.kafka.sender import KafkaSender

    topic = "capturer.ph.t"
    b1, b2, b3, b4, b5 = (updates(1000 * i, 5) for i in range(1, 6))
    a = KafkaSender("k", options(broker, client=client))
    a.open()
    a.send(b1)
    a.settle()
    state = a.position_state  # what the checkpoint holds: b1 acknowledged
    a.send(b2)
    a.settle()
    raise_partitions(broker.servers, topic, 6)
    a.send(b3)
    a.settle()
    if failed_batch:
        a.close()  # a failed batch: the next one goes with a new producer
        a.send(b4)
        a.settle()
    a.close()  # kill -9: nothing more acknowledged than b1
    b = KafkaSender("k", options(broker, client=client))
    b.resume_state = state
    b.open()
    b.send(b2 + b3 + b4 + b5)
    b.settle()
    b.close()
    assert b.status()["partitions_kept"] == {topic: [3, 6]}  # what the status port says
    assert b.position_state == {"partitions": {topic: 3}}  # what the next checkpoint keeps
    records = consume_all(broker.servers, [topic])
    ids = Counter((int(dict(r.headers)["commit_ts"]), int(dict(r.headers)["seq"])) for r in records)
    twice = sorted(k for k, n in ids.items() if n > 1)
    assert not twice, f"{len(twice)} row changes written twice, e.g. {twice[:5]}"
    want = {(t.commit_ts, s) for batch in (b1, b2, b3, b4, b5) for t in batch for s in range(KEYS)}
    assert set(ids) == want, f"lost: {sorted(want - set(ids))[:5]}"
    where: dict[bytes, set[int]] = defaultdict(set)
    order: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for r in records:
        where[r.key].add(r.partition)
        order[r.key].append((r.offset, int(dict(r.headers)["commit_ts"])))
    moved = {k: sorted(p) for k, p in where.items() if len(p) > 1}
    assert not moved, f"{len(moved)} keys in two partitions, e.g. {list(moved.items())[:3]}"
    for k, seen in order.items():
        ts = [t for _, t in sorted(seen)]
        assert ts == sorted(ts), f"key {k!r} out of order: {ts}"

