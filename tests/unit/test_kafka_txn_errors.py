"""What a transactional Kafka producer's failure means (senders/kafka/client.py ``txn_failure``):
decided by the clients' error codes and classes, never by the text. The error objects are the
clients' own (confluent-kafka's KafkaError/KafkaException, kafka-python's error classes); the
fencing itself is shown against a real broker in tests/integration/test_kafka_transactions.py.
A broker refusing a transactional id needs an authorizer with ACLs, which the tests' brokers do
not run: its classification is shown here only."""

from __future__ import annotations

import pytest

from capturer.errors import SinkError
from senders.kafka.client import FENCED, UNAUTHORIZED, txn_failure

ck = pytest.importorskip("confluent_kafka")
ke = pytest.importorskip("kafka.errors")
E = ck.KafkaError


@pytest.mark.parametrize(("code", "fatal", "want"), [
    (E._FENCED, True, FENCED),
    (E.PRODUCER_FENCED, True, FENCED),
    (E.INVALID_PRODUCER_EPOCH, True, FENCED),
    (E.INVALID_PRODUCER_EPOCH, False, None),  # abortable (e.g. a transaction the coordinator timed out)
    (E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True, UNAUTHORIZED),
    (E._MSG_TIMED_OUT, False, None),
    (E.NOT_LEADER_FOR_PARTITION, False, None),
])
def test_confluent_codes(code: int, fatal: bool, want: str | None) -> None:
    err = E(code, "anything", fatal=fatal)
    got = txn_failure(ck.KafkaException(err))
    assert (got[0] if got else None) == want
    # the same error reported by a delivery report, or found as the cause of the sender's SinkError
    got = txn_failure(RuntimeError("x"), [err])
    assert (got[0] if got else None) == want
    try:
        try:
            raise ck.KafkaException(err)
        except ck.KafkaException as exc:
            raise SinkError("produce failed") from exc
    except SinkError as wrapped:
        got = txn_failure(wrapped)
    assert (got[0] if got else None) == want


def test_kafka_python_classes() -> None:
    got = txn_failure(ke.ProducerFencedError())
    assert got is not None and got[0] == FENCED
    got = txn_failure(RuntimeError("commit"), [ke.ProducerFencedError()])
    assert got is not None and got[0] == FENCED
    got = txn_failure(ke.TransactionalIdAuthorizationFailedError())
    assert got is not None and got[0] == UNAUTHORIZED
    # INVALID_PRODUCER_EPOCH on a produce request is not fencing by itself: the client asks again
    # (KIP-360) and its answer decides (the client's state, passed in ``more``)
    assert txn_failure(ke.InvalidProducerEpochError()) is None
    assert txn_failure(ke.KafkaError("Cannot execute transactional method")) is None


def test_not_by_text() -> None:
    assert txn_failure(RuntimeError("This instance has been fenced by a newer instance")) is None
    assert txn_failure(SinkError("INVALID_PRODUCER_EPOCH ProducerFencedError")) is None
    assert txn_failure(ck.KafkaException(E(E._TRANSPORT, "fenced by a newer instance"))) is None
