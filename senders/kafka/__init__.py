"""The Kafka sender and its message formats."""

from collections.abc import Mapping
from typing import Any

from senders.kind import SenderKind


def _extra(options: Mapping[str, Any]) -> str:
    return "confluent" if options.get("client") == "confluent" else "kafka"


KIND = SenderKind("kafka", "senders.kafka.sender:KafkaSender", verify="senders.kafka.verify:KafkaReader",
                  check="senders.kafka.check", extra=_extra, doc="Apache Kafka topics",
                  consumer="senders.kafka.consumer:make_consumer")
