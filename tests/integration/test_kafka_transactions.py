"""Kafka transactions (``[kafka] transactional = true``, issue 45 item 3) on the run's
Apache Kafka broker: an aborted batch is invisible to a ``read_committed`` reader and the
retry writes it once; ``kill -9`` mid-load (mid-transaction) loses and repeats nothing for
a ``read_committed`` reader; a second producer of the same transactional id fences the
first at the broker (its batch raises ``Fenced``, nothing of it is visible), for both clients."""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Broker, checkpoint_covers, consume_all, shared_broker, wait_for, write_config

sys.path.insert(0, str(Path(__file__).parent))  # the crash test's load and checks are shared with issue 30's
from test_kafka_exactly_once import check_kafka, crash_mid_load, kafka_senders, start_load, stop_load

from capturer.errors import FENCED_MARK, Fenced, SinkError
from capturer.util import failpoints
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


@pytest.fixture
def broker() -> Iterator[Broker]:
    yield shared_broker()  # the run's one Apache Kafka broker, emptied for this test


def read_all(servers: str, committed: bool, topics: list[str] | None = None) -> list[Any]:
    """Every message of the topics (default: all), ``read_committed`` or not."""
    return consume_all(servers, topics, committed=committed)


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


def txns(first: int, n: int, rows: int = 50) -> list[Any]:
    """``n`` transactions of ``rows`` inserts into d.t, commit_ts ``first``, ``first + 1``, ...; ids by commit_ts."""
    from capturer.model import Position, RowChange, TableSchema, Txn

    schema = TableSchema("d", "t", ("id",), ("id",))
    return [Txn("r1", ts, Position("f", ts), tuple(RowChange(schema, "insert", None, {"id": ts * 1000 + i})
                                                  for i in range(rows)))
            for ts in range(first, first + n)]


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_a_second_producer_of_the_transactional_id_fences_the_first(broker: Broker, client: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Two senders of one transactional id (two capturers of one HA group): the second's
    init_transactions fences the first at the broker. The first's next batch raises Fenced (by the
    client's error code or class) naming the id; so does a batch whose transaction is open, all its
    messages acknowledged, when a third starts: that batch is in the log (read_uncommitted) but never
    visible read_committed. The fenced senders do not take the id back: the last one goes on."""
    from senders.kafka.sender import KafkaSender

    options: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
    options.update(servers=broker.servers, client=client, partitions=3, schema_topic="", transactional=True,
                   ha_group="g")
    senders = [KafkaSender("k", {**options, "ha_epoch": e}) for e in (1, 2, 3)]
    assert {s.transactional_id for s in senders} == {"capturer.g.k"}
    first, second, third = senders
    a, b, c, d, e = (txns(10 * i, 3) for i in range(1, 6))
    first.open()
    first.send(a)
    second.open()  # its init_transactions fences the first
    with pytest.raises(Fenced) as fenced:
        first.send(b)
    assert "'capturer.g.k'" in str(fenced.value) and FENCED_MARK in str(fenced.value), fenced.value
    assert first.client is None  # dropped: a new producer's init_transactions would fence the second in turn
    second.send(c)

    # the second mid-transaction (every message of its batch acknowledged, the commit not sent) when the third starts
    assert second.client is not None
    commit = second.client.commit

    def third_starts_then_commit() -> None:
        third.open()
        commit()

    monkeypatch.setattr(second.client, "commit", third_starts_then_commit)
    with pytest.raises(Fenced):
        second.send(d)
    third.send(e)
    third.close()
    committed = {ts for ts, _ in ids(read_all(broker.servers, True, ["capturer.d.t"]))}
    written = {ts for ts, _ in ids(read_all(broker.servers, False, ["capturer.d.t"]))}
    want = {str(t.commit_ts) for t in a + c + e}
    assert {str(t.commit_ts) for t in d} <= written, "the fenced open transaction was not in the log: the test " \
        "proves nothing"
    assert committed == want, (sorted(committed - want), sorted(want - committed))
    assert len(read_all(broker.servers, True, ["capturer.d.t"])) == 9 * 50  # each once


def test_the_applier_and_verify_skip_an_aborted_transaction(broker: Broker, tmp_path: Path) -> None:
    """A transaction the sender aborted (failpoint ``kafka.commit=eio``: every message of its batch
    acknowledged, then the commit fails), between two committed batches, in the format the sender
    writes (json, with ``txn_topic``): it inserts rows that never were and deletes rows that are.
    ``verify``'s readers (both clients) and an applier (``python -m capturer apply`` into the file)
    see the committed batches only."""
    from capturer.model import Position, RowChange, TableSchema, Txn
    from integration.test_apply import TXN_TOPIC, ApplierProcess, write_applier
    from senders.kafka.client import ConfluentTopicReader, KafkaPythonTopicReader
    from senders.kafka.sender import KafkaSender
    from senders.kafka.verify import KafkaState
    from senders.local.replay import read_changes

    options: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
    options.update(servers=broker.servers, client="confluent", partitions=3, schema_topic="", transactional=True,
                   txn_topic=TXN_TOPIC)
    s = KafkaSender("k", options)
    s.open()
    s.send(txns(10, 3))
    schema = TableSchema("d", "t", ("id",), ("id",))
    ghost = Txn("r1", 20, Position("f", 20), tuple(RowChange(schema, "insert", None, {"id": 20_000 + i})
                                                   for i in range(50)) +
                tuple(RowChange(schema, "delete", {"id": 10_000 + i}, None) for i in range(10)))
    failpoints.set_rules("kafka.commit=eio@1")
    try:
        with pytest.raises(SinkError):
            s.send([ghost])
    finally:
        failpoints.set_rules("")
    s.send(txns(30, 2))
    s.close()
    want = {t * 1000 + i for t in (10, 11, 12, 30, 31) for i in range(50)}
    written = read_all(broker.servers, False, ["capturer.d.t"])
    assert {ts for ts, _ in ids(written)} >= {"20"}, "the aborted transaction is not in the log: the test proves nothing"

    # verify's reading, with each client
    for reader in (ConfluentTopicReader(broker.servers), KafkaPythonTopicReader(broker.servers)):
        st = KafkaState()
        try:
            reader.read(["capturer.d.t"], st.apply, 60)
        finally:
            reader.close()
        got = sorted(r["id"] for r in st.rows(("d", "t")))
        assert sorted(want) == got, (type(reader).__name__, len(got), sorted(set(got) ^ want)[:10])

    # an applier into the file
    out = tmp_path / "out" / "changes.jsonl"
    cfg, port = write_applier(tmp_path, "ab", broker.servers, f"[global]\ntype=local\n[local]\nfilepath={out}\n")
    ap = ApplierProcess(cfg, tmp_path / "ab.log", port).start()
    try:
        def applied() -> int:
            try:
                return int(ap.status()["applied"]["txns"])
            except Exception:
                return -1

        wait_for(lambda: applied() == 5, 60, "the applier to apply the 5 committed transactions")
        time.sleep(1.5)
        assert applied() == 5
    finally:
        assert ap.stop() == 0
    changes = list(read_changes(out, dedupe=False))
    assert {d["commit_ts"] for d in changes} == {10, 11, 12, 30, 31}, {d["commit_ts"] for d in changes}
    assert len(changes) == len(want) and all(d["op"] == "insert" for d in changes), len(changes)


@pytest.mark.timeout(900)
# the default client in the default run; kafka-python's (~1 min) with --runslow (its transactions: the
# fencing and aborted-batch tests above run both clients)
@pytest.mark.parametrize("client", ["confluent", pytest.param("kafka-python", marks=pytest.mark.slow)])
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
    proc = crash_mid_load(tmp_path, cfg, log, monkeypatch, rng, 2, 1)
    stop_load(loads, threads, scratch)
    wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 300, "Kafka to catch up")
    assert proc.stop() == 0
    records = read_all(broker.servers, True)
    print(f"{client} transactional: {check_kafka(records, loads, scratch, two_servers)}")
    dirty = read_all(broker.servers, False)
    print(f"read_uncommitted: {len(dirty)} messages, {len(dirty) - len(records)} of aborted transactions")
    assert len(dirty) >= len(records)
