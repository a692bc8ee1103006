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

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from capturer.util.kafkasec import Watch, kafka_python_conf, librdkafka_conf

_TOPIC_BAD = re.compile(r"[^a-zA-Z0-9._-]")
Name = tuple[str, str]


@dataclass
class KafkaMessage:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]


Change = tuple[Name, str, "dict[str, Any] | None", "dict[str, Any] | None"]
_CANAL_OP = {"INSERT": "c", "UPDATE": "u", "DELETE": "d", "TRUNCATE": "t"}


_TRUNCATE = re.compile(r"^\s*(?:/\*.*?\*/\s*)*TRUNCATE\b", re.I | re.S)


def _pb_value(v: Any) -> Any:
    kind = v.WhichOneof("kind")
    return None if kind in (None, "is_null") else getattr(v, kind)


def decode_protobuf(value: bytes) -> Change | None:
    """The same of a ``format=protobuf`` message (``capturer.RowChange``, proto/capturer.proto)."""
    from capturer.model import protogen

    pb = protogen.load()
    m = pb.RowChange.FromString(value)
    name = (m.db, m.table)
    if m.op == pb.RowChange.DDL:
        return (name, "t", None, None) if m.table and _TRUNCATE.match(m.sql) else None
    op = {pb.RowChange.INSERT: "c", pb.RowChange.UPDATE: "u", pb.RowChange.DELETE: "d", pb.RowChange.READ: "r"}[m.op]
    before = {c.name: _pb_value(c.value) for c in m.before} if len(m.before) else None
    after = {c.name: _pb_value(c.value) for c in m.after} if len(m.after) else None
    return name, op, before, after


def decode(value: bytes, fmt: str = "json") -> Change | None:
    """``(table, op, before, after)`` of a ``format=json``, ``canal`` or ``protobuf`` message
    (op as Debezium's: c, u, d, r, t), or None for anything else."""
    if fmt == "protobuf":
        return decode_protobuf(value)
    d = json.loads(value)
    if not isinstance(d, dict):
        return None
    if "source" in d and "op" in d:  # json
        return (d["source"]["db"], d["source"]["table"]), d["op"], d.get("before"), d.get("after")
    if "database" in d and "type" in d:  # canal: data is the row (the old one for a delete), old the changed columns
        op = _CANAL_OP.get(str(d["type"]))
        if op is None or (d.get("isDdl") and op != "t"):
            return None
        row = (d.get("data") or [None])[0]
        name = (d["database"], d["table"])
        if op == "u":
            return name, op, {**row, **((d.get("old") or [{}])[0])}, row
        return name, op, row if op == "d" else None, row if op == "c" else None
    return None


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


def _headers(raw: Any) -> dict[str, str]:
    return {str(k): v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v or "") for k, v in raw or []}


class _Confluent:
    """Every partition of the topics it is given, read on from where it stopped."""

    def __init__(self, servers: str, opts: dict[str, Any] | None = None, who: str = "verify: sender kafka"):
        import confluent_kafka

        self.opts = opts or {}
        self.who = who
        self.watch = Watch()  # the client's errors (error_cb): a refused login, a failed TLS handshake
        self.c = confluent_kafka.Consumer({
            **librdkafka_conf(self.opts), "error_cb": self.watch, "bootstrap.servers": servers, "group.id": "capturer-verify", "enable.auto.commit": False,
            "isolation.level": "read_committed", "enable.partition.eof": True, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 2000})
        self.next: dict[tuple[str, int], int] = {}  # where each assigned partition's reading goes on

    def read(self, topics: Sequence[str], apply: Any, timeout: float) -> None:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        try:
            md = self.c.list_topics(timeout=10)  # every topic: asking for one could make a broker create it
        except KafkaException as exc:
            if not self.next:
                self.c.poll(0)  # serves error_cb (nothing assigned yet: no message is taken)
            why = self.watch.explain(self.who, self.opts, exc, "[kafka] of the senderConfig")
            if why is not None:
                raise RuntimeError(why) from None
            raise
        for topic in topics:
            t = md.topics.get(topic)
            for p in sorted(t.partitions) if t is not None and t.error is None else []:
                if (topic, p) not in self.next:
                    lo, _hi = self.c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    self.next[(topic, p)] = lo
        pending = set()
        for tp, at in self.next.items():
            _lo, hi = self.c.get_watermark_offsets(TopicPartition(*tp), timeout=10)
            if hi > at:  # (Tansu answers the start of the last batch + 1: still > where the last read ended)
                pending.add(tp)
        if not pending:
            return
        self.c.assign([TopicPartition(t, p, self.next[(t, p)]) for t, p in sorted(pending)])
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"kafka: nothing more read for {timeout:.0f}s before the end of {sorted(pending)}")
            got = self.c.consume(1000, 0.5)
            if got:
                deadline = time.monotonic() + timeout  # a slow broker is given time as long as it answers
            for msg in got:
                tp = (str(msg.topic()), int(msg.partition() or 0))
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(tp)
                        continue
                    raise KafkaException(err)
                off = int(msg.offset() or 0)
                if off < self.next.get(tp, 0):
                    continue
                self.next[tp] = off + 1
                apply(KafkaMessage(tp[0], tp[1], off, msg.key(), msg.value(), _headers(msg.headers())))
        self.c.unassign()

    def close(self) -> None:
        self.c.close()


class _KafkaPython:
    """The same with kafka-python (where confluent-kafka is not installed): read until a
    poll returns nothing and every partition's position is at its end offset."""

    def __init__(self, servers: str, opts: dict[str, Any] | None = None, who: str = "verify: sender kafka"):
        from kafka import KafkaConsumer

        opts = opts or {}
        extra: dict[str, Any] = {"bootstrap_timeout_ms": 15000} \
            if "bootstrap_timeout_ms" in KafkaConsumer.DEFAULT_CONFIG else {}
        watch = Watch()
        try:
            with watch.kafka_python():
                self.c = KafkaConsumer(bootstrap_servers=servers.split(","), group_id=None, enable_auto_commit=False,
                                       isolation_level="read_committed", auto_offset_reset="earliest",
                                       request_timeout_ms=15000, session_timeout_ms=6000, heartbeat_interval_ms=2000,
                                       **extra, **kafka_python_conf(opts))
        except Exception as exc:
            why = watch.explain(who, opts, exc, "[kafka] of the senderConfig")
            if why is not None:
                raise RuntimeError(why) from None
            raise
        self.next: dict[tuple[str, int], int] = {}

    def read(self, topics: Sequence[str], apply: Any, timeout: float) -> None:
        from kafka import TopicPartition

        for topic in topics:
            for p in sorted(self.c.partitions_for_topic(topic) or []):
                self.next.setdefault((topic, p), -1)
        if not self.next:
            return
        tps = [TopicPartition(t, p) for t, p in sorted(self.next)]
        self.c.assign(tps)
        begin = self.c.beginning_offsets(tps)
        for tp in tps:
            at = self.next[(tp.topic, tp.partition)]
            self.c.seek(tp, at if at >= 0 else begin[tp])
        deadline = time.monotonic() + timeout
        while True:
            got = self.c.poll(timeout_ms=500, max_records=5000)
            if got:
                deadline = time.monotonic() + timeout
            elif all(self.c.position(tp) >= end for tp, end in self.c.end_offsets(tps).items()):
                break  # every partition read to its end (a fetch hands out whole batches)
            elif time.monotonic() > deadline:
                raise TimeoutError(f"kafka: nothing more read for {timeout:.0f}s before the partitions' ends")
            for tp, msgs in got.items():
                for msg in msgs:
                    self.next[(tp.topic, tp.partition)] = msg.offset + 1
                    apply(KafkaMessage(tp.topic, tp.partition, msg.offset, msg.key, msg.value,
                                       _headers(msg.headers)))

    def close(self) -> None:
        self.c.close()


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
                self._client = _Confluent(self.o["servers"], self.o, f"verify: sender {self.name}")
            except ImportError:
                self._client = _KafkaPython(self.o["servers"], self.o, f"verify: sender {self.name}")
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
