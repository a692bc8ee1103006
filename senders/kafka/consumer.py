"""The applier's Kafka consumer (``SenderKind.consumer`` of the Kafka kind; its contract,
``Consumer``, is capturer/model/message.py): kafka-python (the default, the design card's package)
or confluent-kafka (``client = confluent``, librdkafka: the fast one).

Partitions are **assigned**, never subscribed: no group membership, so no rebalance
moves a partition while its transactions are half regrouped, and a paused applier
is never thrown out of a group. The group id is only where offsets are committed
(``commit``, synchronous, called with what the regrouper says is safe: behind what
every destination holds). A newly assigned partition starts at the group's committed
offset, or at its beginning when the group has none.

Read ``read_committed``; a broker outage shows as polls that return nothing and a
commit that fails (retried at the next interval); the status says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model.encode import _fastrows
from capturer.model.message import TP, Consumer, Msg
from capturer.util.kafkasec import Watch, kafka_python_conf, librdkafka_conf

log = logging.getLogger(__name__)

# confluent-kafka's messages made Msg objects in one C call a poll (ConfluentConsumer.poll's loop; an older build lacks it)
_msgs: Callable[[list[Any], type], list[Msg] | None] | None = getattr(_fastrows, "kafka_msgs", None)


def _dl_headers(msg: Msg, why: str) -> list[tuple[str, bytes]]:
    return list(msg.headers or []) + [
        ("dead_letter_topic", msg.topic.encode()), ("dead_letter_partition", str(msg.partition).encode()),
        ("dead_letter_offset", str(msg.offset).encode()), ("dead_letter_error", why.encode()[:2000])]


class KafkaPythonConsumer:
    def __init__(self, servers: str, group: str, security: dict[str, Any] | None = None, who: str = "applier",
                 timeout: float = 15.0, where: str = ""):
        from kafka import KafkaConsumer

        self.servers = servers
        self.security = kafka_python_conf(security or {})
        extra: dict[str, Any] = {"bootstrap_timeout_ms": int(timeout * 1000)} \
            if "bootstrap_timeout_ms" in KafkaConsumer.DEFAULT_CONFIG else {}
        watch = Watch()
        try:
            with watch.kafka_python():
                self.c = KafkaConsumer(
                    bootstrap_servers=servers.split(","), group_id=group, enable_auto_commit=False,
                    auto_offset_reset="earliest", isolation_level="read_committed", request_timeout_ms=15000,
                    session_timeout_ms=6000, heartbeat_interval_ms=2000, max_poll_records=5000,
                    fetch_max_bytes=32 * 1024 * 1024, **extra, **self.security)
        except Exception as exc:
            why = watch.explain(who, security or {}, exc, where)
            if why is not None:  # a refused login, a certificate the CA did not sign: retrying cannot help
                raise FatalSourceError(why) from None
            raise SourceError(f"cannot reach Kafka at {servers}: {exc}") from exc
        self.assigned: list[Any] = []
        self._paused: set[TP] = set()
        self._producer: Any = None

    def topics(self) -> dict[str, int]:
        out = {}
        for t in self.c.topics():
            parts = self.c.partitions_for_topic(t)
            out[t] = len(parts) if parts else 0
        return out

    def add(self, tps: Iterable[TP]) -> None:
        from kafka import TopicPartition

        new = [TopicPartition(t, p) for t, p in tps]
        new = [tp for tp in new if tp not in self.assigned]
        if not new:
            return
        positions = {tp: self.c.position(tp) for tp in self.assigned}
        self.assigned += new
        self.c.assign(self.assigned)
        for tp, pos in positions.items():  # assign() forgets where the others were
            if pos is not None:
                self.c.seek(tp, pos)
        for tp in new:
            committed = self.c.committed(tp)
            if committed is not None and committed >= 0:
                self.c.seek(tp, committed)
            else:
                self.c.seek_to_beginning(tp)
        if self._paused:
            self.c.pause(*[tp for tp in self.assigned if (tp.topic, tp.partition) in self._paused])

    def poll(self, max_msgs: int, timeout: float) -> list[Msg]:
        if not self.assigned:
            time.sleep(timeout)
            return []
        out: list[Msg] = []
        for tp, recs in self.c.poll(timeout_ms=int(timeout * 1000), max_records=max_msgs).items():
            for r in recs:
                out.append(Msg(tp.topic, tp.partition, r.offset, r.key, r.value, list(r.headers or []),
                               r.timestamp))
        return out

    def commit(self, offsets: dict[TP, int]) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        if offsets:
            self.c.commit({TopicPartition(t, p): OffsetAndMetadata(off, "", -1) for (t, p), off in offsets.items()},
                          timeout_ms=15000)

    def lag(self) -> dict[TP, int]:
        out = {}
        for tp in self.assigned:
            hw = self.c.highwater(tp)
            try:
                pos = self.c.position(tp, timeout_ms=100)
            except Exception:
                pos = None
            if hw is not None and pos is not None:
                out[(tp.topic, tp.partition)] = max(0, hw - pos)
        return out

    def pause(self, tps: Iterable[TP]) -> None:
        from kafka import TopicPartition

        tps = [tp for tp in tps if tp not in self._paused]
        self._paused.update(tps)
        if tps:
            self.c.pause(*[TopicPartition(t, p) for t, p in tps])

    def resume(self, tps: Iterable[TP]) -> None:
        from kafka import TopicPartition

        tps = [tp for tp in tps if tp in self._paused]
        self._paused.difference_update(tps)
        if tps:
            self.c.resume(*[TopicPartition(t, p) for t, p in tps])

    def dead_letter(self, topic: str, msg: Msg, why: str) -> None:
        from kafka import KafkaProducer

        if self._producer is None:
            self._producer = KafkaProducer(bootstrap_servers=self.servers.split(","), acks="all",
                                           enable_idempotence=True, max_in_flight_requests_per_connection=1,
                                           **self.security)
        self._producer.send(topic, value=msg.value, key=msg.key, headers=_dl_headers(msg, why)).get(timeout=30)

    def close(self) -> None:
        try:
            self.c.close(autocommit=False)
        finally:
            if self._producer is not None:
                self._producer.close(5)


class ConfluentConsumer:
    def __init__(self, servers: str, group: str, security: dict[str, Any] | None = None, who: str = "applier",
                 timeout: float = 15.0, where: str = ""):
        import confluent_kafka

        self.servers = servers
        self.opts = security or {}
        self.security = librdkafka_conf(self.opts)
        self.who, self.where = who, where
        self.timeout = timeout
        self.watch = Watch()  # the client's errors (error_cb, served by poll): a refused login, a failed handshake
        self.c = confluent_kafka.Consumer({
            **self.security, "error_cb": self.watch, "bootstrap.servers": servers, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 2000, "enable.partition.eof": False})
        self.assigned: set[TP] = set()
        self._producer: Any = None

    def topics(self) -> dict[str, int]:
        from confluent_kafka import KafkaException

        try:
            md = self.c.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            if not self.assigned:
                self.c.poll(0)  # serves error_cb (nothing assigned: no message is taken)
            self._fatal(exc)
            raise SourceError(f"Kafka at {self.servers}: cannot list topics: {exc}") from exc
        return {t: len(m.partitions) for t, m in md.topics.items() if m.error is None}

    def _fatal(self, exc: BaseException | None = None) -> None:
        """FatalSourceError where the client said its login was refused or the broker's certificate
        did not verify: retrying cannot help."""
        why = self.watch.explain(self.who, self.opts, exc, self.where)
        if why is not None:
            raise FatalSourceError(why)
        self.watch.texts.clear()

    def add(self, tps: Iterable[TP]) -> None:
        """Read these partitions too, each from the group's committed offset, else its beginning.

        The committed offsets are fetched here, with retries, and the partitions assigned at them:
        assigned at OFFSET_STORED, librdkafka fetches them itself, and a fetch answered with a
        request-level NOT_COORDINATOR (a broker whose group coordinator is still loading: any fresh
        or restarted broker) leaves the partition waiting forever, no error, no message
        (librdkafka issue 5586; it hung an applier here)."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

        new = [tp for tp in tps if tp not in self.assigned]
        if not new:
            return
        deadline = time.monotonic() + 4 * self.timeout
        while True:
            try:
                got = self.c.committed([TopicPartition(t, p) for t, p in new], timeout=self.timeout)
                bad = [tp for tp in got if tp.error is not None]
                if not bad:
                    break
                why: Any = bad[0].error
            except KafkaException as exc:
                why = exc
            if time.monotonic() > deadline:
                raise SourceError(f"Kafka at {self.servers}: cannot read the committed offsets of "
                                  f"{', '.join(f'{t}[{p}]' for t, p in new)}: {why}")
            log.warning("Kafka consumer: committed offsets not read yet (%s); retrying", why)
            time.sleep(0.5)
        self.c.incremental_assign([TopicPartition(tp.topic, tp.partition,
                                                  tp.offset if tp.offset >= 0 else OFFSET_BEGINNING) for tp in got])
        self.assigned.update(new)

    def poll(self, max_msgs: int, timeout: float) -> list[Msg]:
        from confluent_kafka import KafkaError

        if not self.assigned:
            time.sleep(timeout)
            return []
        out: list[Msg] = []
        # the first message waits up to ``timeout``, the rest is what is there already: consume(n, t)
        # alone would wait its whole timeout for fewer than n messages (latency at a light load)
        first = self.c.poll(timeout)
        if self.watch.texts:
            self._fatal()
        if first is None:
            return out
        got = [first] + self.c.consume(max_msgs - 1, 0)
        if _msgs is not None:
            fast = _msgs(got, Msg)  # the loop below in one C call (None: a message carries an error)
            if fast is not None:
                return fast
        append = out.append
        last: dict[TP, Any] = {}
        m: Any
        for m in got:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal():
                    raise SourceError(f"Kafka consumer: {err}")
                log.warning("Kafka consumer: %s", err)
                continue
            msg = Msg(m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers() or [])
            append(msg)
            last[(msg.topic, msg.partition)] = (msg, m)
        for msg, m in last.values():  # the Kafka timestamp of each partition's last message (its lag in seconds)
            ts = m.timestamp()
            msg.ts_ms = ts[1] if ts and ts[0] else 0
        return out

    def commit(self, offsets: dict[TP, int]) -> None:
        from confluent_kafka import TopicPartition

        if offsets:
            self.c.commit(offsets=[TopicPartition(t, p, off) for (t, p), off in offsets.items()], asynchronous=False)

    def lag(self) -> dict[TP, int]:
        from confluent_kafka import TopicPartition

        out: dict[TP, int] = {}
        tps = [TopicPartition(t, p) for t, p in self.assigned]
        try:
            positions = self.c.position(tps)
        except Exception:
            return out
        for tp in positions:
            try:
                _low, high = self.c.get_watermark_offsets(tp, cached=True)
            except Exception:
                continue
            if high is not None and high >= 0 and tp.offset >= 0:
                out[(tp.topic, tp.partition)] = max(0, high - tp.offset)
        return out

    def pause(self, tps: Iterable[TP]) -> None:
        from confluent_kafka import TopicPartition

        tps = list(tps)
        if tps:
            self.c.pause([TopicPartition(t, p) for t, p in tps])

    def resume(self, tps: Iterable[TP]) -> None:
        from confluent_kafka import TopicPartition

        tps = list(tps)
        if tps:
            self.c.resume([TopicPartition(t, p) for t, p in tps])

    def dead_letter(self, topic: str, msg: Msg, why: str) -> None:
        import confluent_kafka

        if self._producer is None:
            self._producer = confluent_kafka.Producer({**self.security, "bootstrap.servers": self.servers, "acks": "all",
                                                       "enable.idempotence": True})
        errors: list[str] = []
        self._producer.produce(topic, msg.value, msg.key, headers=_dl_headers(msg, why),
                               on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
        if self._producer.flush(30) or errors:
            raise SourceError(f"dead-letter topic {topic!r}: not written ({errors or 'timed out'})")

    def close(self) -> None:
        try:
            self.c.close()
        finally:
            if self._producer is not None:
                self._producer.flush(5)


def make_consumer(client: str, servers: str, group: str, security: dict[str, Any] | None = None,
                  who: str = "applier", timeout: float = 15.0, where: str = "") -> Consumer:
    """``security``: the SASL and TLS keys (capturer/util/kafkasec.py); ``who``: names the applier, and
    ``where`` where its settings are, in errors; ``timeout``: seconds to wait for a first answer from Kafka."""
    if client == "confluent":
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise SourceError("client=confluent needs confluent-kafka: .venv/bin/pip install confluent-kafka") from None
        return ConfluentConsumer(servers, group, security, who, timeout, where)
    try:
        import kafka  # noqa: F401
    except ImportError:
        raise SourceError("client=kafka-python needs the project's 'kafka' extra: .venv/bin/pip install -e '.[kafka]' "
                          "(start.sh installs it)") from None
    return KafkaPythonConsumer(servers, group, security, who, timeout, where)
