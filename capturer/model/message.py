"""A message read back from a log topic (a Kafka partition), as the applier sees it,
and what it needs of the consumer that reads them (the Kafka sender kind provides one:
``senders/kafka/consumer.py``, reached through the sender registry)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

TP = tuple[str, int]
"""(topic, partition)"""


@dataclass(slots=True)
class Msg:
    """One consumed Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    ts_ms: int = 0  # the message's Kafka timestamp


class Consumer(Protocol):
    def topics(self) -> dict[str, int]:
        """Every topic the broker has, with its partition count."""
        ...

    def add(self, tps: Iterable[TP]) -> None:
        """Read these partitions too (from the group's committed offset, else the beginning)."""
        ...

    def poll(self, max_msgs: int, timeout: float) -> list[Msg]: ...
    def commit(self, offsets: dict[TP, int]) -> None: ...
    def lag(self) -> dict[TP, int]:
        """Messages between the position and the end, per assigned partition (from the last fetches)."""
        ...

    def pause(self, tps: Iterable[TP]) -> None: ...
    def resume(self, tps: Iterable[TP]) -> None: ...
    def dead_letter(self, topic: str, msg: Msg, why: str) -> None: ...
    def close(self) -> None: ...
