"""The Kafka sender's topics, read back for ``verify`` (capturer/ops/verify.py).

What a compacted consumer ends with: per topic and partition, in offset order, the
newest value per message key. A ``c``/``u``/``r`` message sets the row of its key, a
``d`` removes it (a key change is a delete of the old key then a create of the new
one), a truncate (``t``, sent to every partition) empties what the partition holds of
the table, tombstones (null values) are skipped (the delete before them did the
work). Rows of a keyless table (no message key) are a multiset: a delete removes one
equal row. A message sent twice (the same ``region, commit_ts, seq, op`` headers in a
partition: a retried batch) counts once.

``format=json``, ``format=canal`` (values as strings) and ``format=protobuf`` are read
back, every value compared by the source column's type; ``sql`` topics (statements)
are "cannot check". The topics read are the sender's
``topic`` pattern filled in for each table and region, read from their start; later
reads (``refresh``) go on from where the last one ended, with confluent-kafka where it
is installed, kafka-python's consumer otherwise. The end of a partition is where the
broker's fetch answers say it ends, not its end-offset answer (Tansu's is wrong after
batched sends). A read gives up after ``timeout`` seconds in which nothing more
came (a slow broker is given time as long as it answers)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from senders.kafka.client import ConfluentTopicReader, KafkaMessage, KafkaPythonTopicReader
from senders.kafka.format import Name, decode

_TOPIC_BAD = re.compile(r"[^a-zA-Z0-9._-]")


class KafkaState:
    """The tables as the messages applied so far leave them (see the module docstring)."""

    def __init__(self, fmt: str = "json") -> None:
        self.fmt = fmt
        self.keyed: dict[tuple[str, int], dict[bytes, tuple[Name, dict[str, Any]]]] = {}
        self.keyless: dict[tuple[str, int], list[tuple[Name, dict[str, Any]]]] = {}
        self.seen: set[tuple[str, int, str, str, str, str]] = set()
        self.messages = 0

    def apply(self, m: KafkaMessage) -> None:
        if m.value is None:
            return
        h = m.headers
        ident = (m.topic, m.partition, h.get("region", ""), h.get("commit_ts", ""), h.get("seq", ""), h.get("op", ""))
        if ident in self.seen:
            return
        self.seen.add(ident)
        self.messages += 1
        change = decode(m.value, self.fmt)
        if change is None:
            return  # not a row change (e.g. a transaction record)
        name, op, before, after = change
        part = (m.topic, m.partition)
        rows = self.keyed.setdefault(part, {})
        bag = self.keyless.setdefault(part, [])
        if op == "t":
            for k in [k for k, (n, _) in rows.items() if n == name]:
                del rows[k]
            bag[:] = [(n, r) for n, r in bag if n != name]
        elif m.key is None:
            if op in ("u", "d") and before is not None and (name, before) in bag:
                bag.remove((name, before))
            if op in ("c", "u", "r") and after is not None:
                bag.append((name, after))
        elif op in ("c", "u", "r") and after is not None:
            rows[m.key] = (name, after)
        elif op == "d":
            rows.pop(m.key, None)

    def tables(self) -> dict[Name, list[dict[str, Any]]]:
        out: dict[Name, list[dict[str, Any]]] = {}
        for part_rows in self.keyed.values():
            for name, row in part_rows.values():
                out.setdefault(name, []).append(row)
        for bag in self.keyless.values():
            for name, row in bag:
                out.setdefault(name, []).append(row)
        return out

    def rows(self, name: Name) -> list[dict[str, Any]]:
        out = [row for part_rows in self.keyed.values() for n, row in part_rows.values() if n == name]
        return out + [row for bag in self.keyless.values() for n, row in bag if n == name]


def rebuild_kafka(messages: Iterable[KafkaMessage]) -> dict[Name, list[dict[str, Any]]]:
    """The tables the messages leave, applied per partition in offset order."""
    st = KafkaState()
    for m in sorted(messages, key=lambda m: (m.topic, m.partition, m.offset)):
        st.apply(m)
    return st.tables()


class KafkaReader:
    kind = "kafka"

    def __init__(self, name: str, options: dict[str, Any], regions: list[tuple[str, str, str]]):
        self.name = name
        self.o = options
        self.regions = [r[0] for r in regions]
        fmt = options.get("format", "json")
        self.cannot = "" if fmt in ("json", "canal", "protobuf") else \
            f"format={fmt}: statements, not rows (json, canal and protobuf topics are read back)"
        self.state = KafkaState(fmt)
        self.topics: set[str] = set()
        self._client: Any = None

    def _topic(self, db: str, table: str, region: str) -> str:
        t = self.o["topic"].replace("{db}", db).replace("{table}", table).replace("{region}", region)
        return _TOPIC_BAD.sub("_", t)[:249]

    def _reader(self) -> Any:
        if self._client is None:
            try:
                self._client = ConfluentTopicReader(self.o["servers"], self.o, f"verify: sender {self.name}")
            except ImportError:
                self._client = KafkaPythonTopicReader(self.o["servers"], self.o, f"verify: sender {self.name}")
        return self._client

    def destination(self, db: str, table: str) -> tuple[str, str]:
        return (db, table)

    def where(self, dest: tuple[str, str]) -> str:
        if not dest[1]:
            return f"kafka {self.o['servers']}"
        return "kafka topic " + ", ".join(sorted({self._topic(dest[0], dest[1], r) for r in self.regions}))

    def refresh(self) -> None:
        if self.topics:
            self._reader().read(sorted(self.topics), self.state.apply, 120.0)

    def rows(self, dest: tuple[str, str], columns: Sequence[str]) -> list[dict[str, Any]]:
        new = {self._topic(dest[0], dest[1], r) for r in self.regions} - self.topics
        if new:
            self.topics |= new
            self._reader().read(sorted(new), self.state.apply, 120.0)
        return self.state.rows(dest)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
