"""The Kafka client libraries, kafka-python and confluent-kafka (librdkafka), behind the
few faces the Kafka sender's kind needs; nothing else of the kind touches a client library:

* producers (``Client``: ``KafkaPythonClient``, ``ConfluentClient``): the sender's
  messages, idempotent, transactional where asked; what a transactional producer's
  failure means (``txn_failure``);
* the read-back (``ConfluentReadBack``; kafka-python's consumer where confluent-kafka is
  not installed): each partition's last message, read_committed (senders/kafka/positions.py);
* topic readers (``ConfluentTopicReader``, ``KafkaPythonTopicReader``): every message of
  some topics, read on from where the last read stopped (``verify``, senders/kafka/verify.py);
* a metadata answer (``confluent_brokers``, ``kafka_python_brokers``: ``--check --connect``).

Every client takes the SASL/TLS settings of capturer/util/kafkasec.py.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from capturer.errors import SinkError
from capturer.model.encode import _fastrows
from capturer.util.kafkasec import Watch, kafka_python_conf, librdkafka_conf
from senders.kafka.positions import Partition, Record, per_topic, per_topic_offsets

log = logging.getLogger(__name__)

# one message to produce: (topic, partition, key, value, headers)
Message = tuple[str, int, "bytes | None", "bytes | None", list[tuple[str, bytes]]]

Failure = tuple[str, int, Any, bool]
"""A message the producer did not deliver: ``(topic, partition, headers, value is null)``."""

READ_BACK_STALL = 15.0  # seconds a partition may give nothing from where its read-back started
# (a broker on slow storage takes seconds to answer a fetch: too short a wait steps back for nothing)
READ_BACK_FAST_WAIT_MS = 20  # the first pass's fetch.wait.max.ms (see ConfluentReadBack.last_records_of)
READ_BACK_FAST_STALL = 2.0  # seconds the first pass waits for a partition's first message before the patient pass


FENCED, UNAUTHORIZED = "fenced", "unauthorized"


def _exceptions(exc: object) -> Iterator[object]:
    """``exc`` and the exceptions it was raised from or during (each once). confluent-kafka may raise its
    ``KafkaError`` object itself (not an exception: ``_call`` raises a ``KafkaException`` of it), which is
    then the next one's ``__context__`` and has no ``__cause__``: it is given as it is, and the walk ends."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        if not isinstance(exc, BaseException):
            break
        exc = exc.__cause__ or exc.__context__


def txn_failure(exc: BaseException | None, more: Sequence[object] = ()) -> tuple[str, object] | None:
    """What a transactional producer's failure means, by the clients' error codes and classes (never
    by text): FENCED (another producer of the transactional id initialised it: it holds the id now),
    UNAUTHORIZED (the principal may not use the transactional id), None (anything else: retried);
    with the error that says it. ``more``: errors the client reported otherwise (delivery reports,
    its transaction state)."""
    for e in [*_exceptions(exc), *more]:
        args = getattr(e, "args", None)
        err = args[0] if type(e).__name__ == "KafkaException" and args else e
        if type(err).__name__ == "KafkaError" and "confluent_kafka" in sys.modules:  # confluent-kafka's
            from confluent_kafka import KafkaError

            if not isinstance(err, KafkaError):
                continue
            c = err.code()
            # librdkafka reports a fencing as _FENCED (fatal); the broker's PRODUCER_FENCED, and
            # INVALID_PRODUCER_EPOCH when it is fatal (an abortable one is e.g. a transaction the
            # coordinator timed out, which a new transaction recovers from), say the same
            if c in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED) or \
                    (c == KafkaError.INVALID_PRODUCER_EPOCH and err.fatal()):
                return FENCED, err
            if c == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                return UNAUTHORIZED, err
            continue
        if type(e).__module__ == "kafka.errors":  # kafka-python's error classes
            import kafka.errors as ke

            if isinstance(e, ke.ProducerFencedError):
                return FENCED, e
            if isinstance(e, ke.TransactionalIdAuthorizationFailedError):
                return UNAUTHORIZED, e
    return None


class Client(Protocol):
    producer: Any
    """What the sender needs from a Kafka client library."""

    def partitions(self, topic: str) -> int: ...
    def partitions_of(self, topics: Sequence[str]) -> dict[str, int]:
        """``partitions`` of several topics (0: a topic that does not exist), the producer told of them all."""
        return {t: self.partitions(t) for t in topics}

    def create_topic(self, topic: str, partitions: int, replication: int) -> None: ...
    def learn(self, topic: str) -> None:
        """Before the first message to ``topic`` (which exists): fetch what the producer needs."""
        return None  # kafka-python: partitions() has asked its producer already

    def produce(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]]) -> None: ...
    def produce_all(self, messages: list[Message]) -> None:
        for topic, part, key, value, headers in messages:
            self.produce(topic, part, key, value, headers)

    def flush(self, timeout: float) -> list[str]: ...
    def close(self) -> None: ...

    def begin(self) -> None:
        """Begin a Kafka transaction (transactional producers only)."""
        self.producer.begin_transaction()

    def commit(self) -> None:
        """Commit the transaction begun: its messages become visible to read_committed readers."""
        self.producer.commit_transaction()

    def abort(self) -> None:
        """Abort the transaction begun: read_committed readers never see its messages."""
        self.producer.abort_transaction()

    # reading back (senders/kafka/positions.py); a client without these (a test double) reads nothing back
    def offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        """``(low, high)`` offsets of each partition, as the broker lists them."""
        raise NotImplementedError

    def last_records(self, topic: str, starts: dict[int, int], timeout: float,
                     patient: Collection[int] = ()) -> dict[int, Record]:
        """Each partition read from its start offset to its end (the high watermark the fetch
        responses report): the last message read of each (none for a partition with nothing there,
        or, but for those in ``patient``, one that gives nothing at all for READ_BACK_STALL s).
        A consumer of no group (assign and seek), ``read_committed``."""
        raise NotImplementedError

    def offsets_of(self, topics: dict[str, Sequence[int]]) -> tuple[dict[Partition, tuple[int, int]],
                                                                     dict[str, Exception]]:
        """``offsets`` of the partitions of several topics: each partition's ``(low, high)``, and the error
        of each topic whose offsets could not be listed (here one topic after the other)."""
        return per_topic_offsets(self.offsets)(topics)

    def last_records_of(self, starts: dict[Partition, int], timeout: float,
                        patient: Collection[Partition] = ()) -> tuple[dict[Partition, Record], dict[str, Exception]]:
        """``last_records`` of the partitions of several topics at once: the last message read of each
        partition, and the error of each topic that could not be read (here: one topic after the other;
        the clients read them all with one consumer)."""
        return per_topic(self.last_records)(starts, timeout, patient)

    def failures(self) -> list[Failure]:
        """The messages the producer reported as not delivered since the last call (after
        ``close()``: also those it gave up on at the close)."""
        return []

    def txn_errors(self) -> list[object]:
        """Errors of the transactional producer reported other than by a raised exception (delivery
        reports, its transaction state), for ``txn_failure``."""
        return []


def topic_settings(servers: str, opts: dict[str, Any], topics: Sequence[str],
                   keys: Collection[str]) -> dict[str, dict[str, str]]:
    """The settings ``keys`` of each topic the broker says (DescribeConfigs through confluent-kafka, an
    admin client of its own; nothing where confluent-kafka is not installed, or for a topic it could not
    read)."""
    if not confluent_available() or not topics:
        return {}
    rb = ConfluentReadBack(servers, opts)
    try:
        return rb.topic_configs_later(topics, keys)()
    except Exception as exc:
        log.info("topic settings of %s not read: %s", list(topics)[:3], exc)
        return {}
    finally:
        rb.close()


class KafkaPythonClient(Client):
    _reader: Any = None  # the consumer that reads partitions back, made when first needed

    def __init__(self, servers: str, opts: dict[str, Any]):
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient

        # the read-back goes through confluent-kafka where it is installed (see ConfluentReadBack)
        self._read = ConfluentReadBack(servers, opts) if confluent_available() else None
        self.servers = servers
        self.security = kafka_python_conf(opts)
        common = {"bootstrap_servers": servers.split(","), "request_timeout_ms": 15000, **self.security}
        if "bootstrap_timeout_ms" in KafkaAdminClient.DEFAULT_CONFIG:
            common["bootstrap_timeout_ms"] = 15000
        # the admin client first: a broker that refuses the login or the TLS handshake fails it in 15 s
        self.admin = KafkaAdminClient(**common)
        # Idempotent: a request the broker wrote but whose answer was lost is not
        # written again by the client's own retry (the broker answers
        # DUPLICATE_SEQUENCE_NUMBER). It was off until 2026-11-27 because the
        # test broker then, Tansu, lost acknowledged idempotent batches across
        # restarts (docs/tansu-idempotence.md); on Apache Kafka the reproducer
        # (tests/chaos/kafka_python_idempotence.py) lost none. One request in
        # flight keeps the order of a partition through retries (so a partition
        # holds a prefix of what was sent to it, which the read-back relies on).
        tid = opts.get("_transactional_id")
        if tid and not hasattr(KafkaProducer, "init_transactions"):  # kafka-python < 2.1
            raise SinkError("transactional = true needs a kafka-python with transactional producers (2.1 or "
                            "later): .venv/bin/pip install -U kafka-python, or client = confluent", retriable=False)
        self.producer = KafkaProducer(
            **common, acks="all", enable_idempotence=True, max_in_flight_requests_per_connection=1,
            **({"transactional_id": tid, "transaction_timeout_ms": 60000} if tid else {}),
            linger_ms=opts["linger_ms"], max_request_size=opts.get("max_message_bytes", 1_048_576),
            batch_size=min(256 * 1024, opts.get("_batch_cap") or 256 * 1024), max_block_ms=15000,
            delivery_timeout_ms=60000,
            compression_type=None if opts["compression"] == "none" else opts["compression"],
        )
        from kafka.record import util as record_util

        if getattr(record_util, "crc32c_c", None) is None:
            log.warning("client=kafka-python: the 'crc32c' package is not installed, so every record batch's "
                        "checksum is computed in Python (about a quarter of the rate with it): pip install crc32c, "
                        "or the project's 'kafka' extra")
        self.futures: list[tuple[Any, Message]] = []
        self._failed: list[Failure] = []
        if tid:  # fences an older producer of the same id, aborts its open transaction
            self.producer.init_transactions()

    def partitions(self, topic: str) -> int:
        # ask the admin client first: a producer metadata request for a missing
        # topic may make the broker auto-create it with its default partition count
        if topic not in self.admin.list_topics():
            return 0
        parts = self.producer.partitions_for(topic)
        return len(parts) if parts else 0

    def partitions_of(self, topics: Sequence[str]) -> dict[str, int]:
        # the producer told of every topic first: partitions_for() one topic after another waits for a
        # metadata update each (~0.1 s: its retry back-off), one update brings them all
        known = set(self.admin.list_topics())
        add = getattr(getattr(self.producer, "_sender", None), "add_topic", None)
        if add is not None:
            for t in topics:
                if t in known:
                    add(t)
        out = {}
        for t in topics:
            parts = self.producer.partitions_for(t) if t in known else None
            out[t] = len(parts) if parts else 0
        return out

    def create_topic(self, topic: str, partitions: int, replication: int) -> None:
        from kafka.admin import NewTopic
        from kafka.errors import TopicAlreadyExistsError

        try:
            self.admin.create_topics([NewTopic(topic, partitions, replication)])
        except TopicAlreadyExistsError:
            pass

    def produce(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]]) -> None:
        self.futures.append((self.producer.send(topic, value=value, key=key, headers=headers, partition=partition),
                             (topic, partition, key, value, headers)))

    def produce_all(self, messages: list[Message]) -> None:
        send, futures = self.producer.send, self.futures
        for m in messages:
            futures.append((send(m[0], value=m[3], key=m[2], headers=m[4], partition=m[1]), m))

    def flush(self, timeout: float) -> list[str]:
        self.producer.flush(timeout)
        errors = []
        for f, m in self.futures:
            if not f.is_done:
                errors.append("not acknowledged in time")
                self._failed.append((m[0], m[1], m[4], m[3] is None))
            elif f.failed():
                errors.append(repr(f.exception))
                self._failed.append((m[0], m[1], m[4], m[3] is None))
        self.futures = []
        return errors

    def failures(self) -> list[Failure]:
        out, self._failed = self._failed, []
        return out

    def txn_errors(self) -> list[object]:
        tm = getattr(self.producer, "_transaction_manager", None)
        if tm is None or not getattr(tm, "transactional_id", None):
            return []
        # a fenced producer's produce request may fail with INVALID_PRODUCER_EPOCH: the client then asks the
        # coordinator for its epoch again (KIP-360), whose answer says whether another producer fenced it
        # (state FATAL_ERROR, last error ProducerFencedError): waited for, briefly
        bumping = getattr(tm, "is_bumping_epoch", lambda: False)
        deadline = time.monotonic() + 10
        while bumping() and time.monotonic() < deadline:
            time.sleep(0.05)
        last = getattr(tm, "last_error", None)
        return [last() if isinstance(last, type) else last] if last is not None else []

    def _consumer(self) -> Any:
        if self._reader is None:
            from kafka import KafkaConsumer

            self._reader = KafkaConsumer(
                bootstrap_servers=self.servers.split(","), group_id=None, enable_auto_commit=False,
                isolation_level="read_committed", auto_offset_reset="earliest", request_timeout_ms=15000,
                session_timeout_ms=6000, heartbeat_interval_ms=2000, **self.security)
        return self._reader

    def offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        if self._read is not None:
            return self._read.offsets(topic, partitions)
        from kafka import TopicPartition

        c = self._consumer()
        tps = [TopicPartition(topic, p) for p in partitions]
        low, high = c.beginning_offsets(tps), c.end_offsets(tps)
        return {tp.partition: (low[tp], high[tp]) for tp in tps}

    def offsets_of(self, topics: dict[str, Sequence[int]]) -> tuple[dict[Partition, tuple[int, int]],
                                                                     dict[str, Exception]]:
        if self._read is not None:
            return self._read.offsets_of(topics)
        from kafka import TopicPartition

        # one ListOffsets round for all (topic by topic: a metadata update of the consumer each, ~0.1 s)
        c = self._consumer()
        tps = [TopicPartition(t, p) for t, parts in topics.items() for p in parts]
        try:
            low, high = c.beginning_offsets(tps), c.end_offsets(tps)
        except Exception:  # told topic by topic: which of them failed
            return per_topic_offsets(self.offsets)(topics)
        return {(tp.topic, tp.partition): (low[tp], high[tp]) for tp in tps}, {}

    def last_records(self, topic: str, starts: dict[int, int], timeout: float,
                     patient: Collection[int] = ()) -> dict[int, Record]:
        got, errors = self.last_records_of({(topic, p): off for p, off in starts.items()}, timeout,
                                           [(topic, p) for p in patient])
        if topic in errors:
            raise errors[topic]
        return {p: rec for (_t, p), rec in got.items()}

    def last_records_of(self, starts: dict[Partition, int], timeout: float,
                        patient: Collection[Partition] = ()) -> tuple[dict[Partition, Record], dict[str, Exception]]:
        if self._read is not None:
            return self._read.last_records_of(starts, timeout, patient)
        from kafka import TopicPartition

        c = self._consumer()
        tps = [TopicPartition(t, p) for t, p in starts]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, starts[(tp.topic, tp.partition)])
        out: dict[Partition, Record] = {}
        left = set(tps)
        deadline = time.monotonic() + timeout
        try:
            while left and time.monotonic() < deadline:
                for tp, recs in c.poll(timeout_ms=100).items():
                    if recs:
                        out[(tp.topic, tp.partition)] = (recs[-1].headers, recs[-1].value is None)
                for tp in list(left):
                    hw = c.highwater(tp)  # from the last fetch response: the true end, also on Tansu
                    if hw is not None and c.position(tp) >= hw:
                        left.discard(tp)
        finally:
            c.unsubscribe()
        errors: dict[str, Exception] = {}
        for t in sorted({tp.topic for tp in left}):
            parts = sorted(tp.partition for tp in left if tp.topic == t)
            errors[t] = SinkError(f"topic {t!r}: partitions {parts} not read to their end in {timeout:.0f}s")
        return {tp: rec for tp, rec in out.items() if tp[0] not in errors}, errors

    def close(self) -> None:
        try:
            self.producer.close(5)
            for f, m in self.futures:  # a batch that failed before its flush: what never made it
                if not f.is_done or f.failed():
                    self._failed.append((m[0], m[1], m[4], m[3] is None))
            self.futures = []
        finally:
            self.admin.close()
            if self._reader is not None:
                self._reader.close()
            if self._read is not None:
                self._read.close()


def row_identity(value: bytes) -> list[tuple[str, bytes]] | None:
    """The identity headers (region, commit_ts, seq, op) of a row's message in the json format, read from
    its value (a failed message whose report lacks its headers: its exact place, not the whole partition
    from the start); None for anything else (other formats, DDL and TRUNCATE messages): unknown."""
    if not value.startswith(b'{"before":'):
        return None
    try:
        d = json.loads(value)
        src, op = d["source"], d["op"]
        region, ts, seq = src["region"], src["commit_ts"], src["seq"]
    except (ValueError, KeyError, TypeError):
        return None
    if op not in ("c", "u", "d", "r") or "transaction" not in d or not isinstance(region, str) \
            or type(ts) is not int or type(seq) is not int:
        return None
    return [("region", region.encode()), ("commit_ts", str(ts).encode()), ("seq", str(seq).encode()),
            ("op", op.encode())]


class Reports:
    """The producer's delivery callback: collects failures. An object of its own, not
    a method of the client: a producer whose callback held its client would be in a
    reference cycle with it, and a cycle through the C producer is never collected, so
    every closed client (one per retry) would leave a producer retrying a broker forever.

    No lock: the callback runs only in the thread that calls the producer's poll() or
    flush(), the sender's, which also takes what it collected. (A lock held here hung a
    fenced producer's flush for good: confluent-kafka 2.16 calls the callback with an error
    already set, so the lock's acquisition raised SystemError after acquiring it, and the
    next message's callback waited for it forever.)"""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.failed: list[Failure] = []
        self.fatal: list[Any] = []  # the fatal KafkaErrors reported (e.g. _FENCED), the first of each code

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            headers, value = msg.headers(), msg.value()
            if headers is None and value is not None:  # (confluent-kafka's reports carry no headers)
                headers = row_identity(value)
            self.failed.append((msg.topic(), msg.partition(), headers, value is None))
            if err.fatal() and all(e.code() != err.code() for e in self.fatal):
                self.fatal.append(err)

    def take(self) -> list[str]:
        errors, self.errors = self.errors, []
        return errors

    def take_failed(self) -> list[Failure]:
        failed, self.failed = self.failed, []
        return failed


def librdkafka_call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` (a confluent-kafka producer's poll or flush), whatever it raises turned into
    an exception: on a fenced producer confluent-kafka 2.16 raises the KafkaError object itself
    (not an exception class: no ``except`` clause naming a class catches it), or SystemError."""
    try:
        return fn(*args)
    except Exception:
        raise
    except:  # noqa: E722 - the only clause that catches a raised non-exception object
        import confluent_kafka

        got = sys.exc_info()[1]
        if isinstance(got, confluent_kafka.KafkaError):
            raise confluent_kafka.KafkaException(got) from None
        raise SinkError(f"producer: {got!r}") from None


class ConfluentReadBack:
    """Reads partitions back with confluent-kafka (librdkafka): a consumer of no group
    (assign, never subscribe; nothing committed), ``read_committed``, fetches waiting
    the client's default (a short ``fetch.wait.max.ms`` made Tansu on S3 storage answer
    every fetch empty: nothing was ever read back). Used by both clients where
    confluent-kafka is installed (kafka-python's consumer is the fallback)."""

    _reader: Any = None  # the consumer, made when first needed
    _admin: Any = None  # the admin client of offsets_of, made when first needed

    def __init__(self, servers: str, opts: dict[str, Any] | None = None):
        self.servers = servers
        self.security = librdkafka_conf(opts or {})

    def _fresh(self, fetch_wait_ms: int | None = None) -> Any:
        import confluent_kafka

        # group.id only because the client wants one: no group is joined (assign, never subscribe)
        # and nothing is committed
        fast = {} if fetch_wait_ms is None else {"fetch.wait.max.ms": fetch_wait_ms}
        return confluent_kafka.Consumer({
            **self.security, "bootstrap.servers": self.servers, "group.id": "capturer-read-back", "enable.auto.commit": False,
            "isolation.level": "read_committed", "enable.partition.eof": True, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 2000, **fast})

    def _consumer(self) -> Any:
        if self._reader is None:
            self._reader = self._fresh()  # kept for the offsets (ListOffsets) of every topic
        return self._reader

    def topic_configs_later(self, topics: Sequence[str],
                            keys: Collection[str]) -> Callable[[], dict[str, dict[str, str]]]:
        """The settings ``keys`` of each topic (DescribeConfigs, one request), asked now and taken by the
        function returned (the round trip overlaps what the caller does meanwhile: the read-back): a topic
        whose settings cannot be read (no DescribeConfigs right, a broker that does not answer) is left out."""
        from confluent_kafka.admin import AdminClient, ConfigResource

        if not topics:
            return dict
        if self._admin is None:
            self._admin = AdminClient({**self.security, "bootstrap.servers": self.servers})
        try:
            futures = self._admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics],
                                                   request_timeout=10)
        except Exception as exc:
            log.info("topic settings of %s not read: %s", list(topics)[:3], exc)
            return dict

        def take() -> dict[str, dict[str, str]]:
            out: dict[str, dict[str, str]] = {}
            for res, fut in futures.items():
                try:
                    entries = fut.result(15)
                except Exception:
                    continue
                out[res.name] = {k: str(e.value) for k, e in entries.items() if k in keys and e.value is not None}
            return out

        return take

    def offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        leader_unknown = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                           KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION}
        c = self._consumer()
        # a topic just created has no leader for a moment (Apache Kafka answers NOT_LEADER_FOR_PARTITION
        # or LEADER_NOT_AVAILABLE until its leader is known): retriable errors are retried for up to 10 s
        deadline = time.monotonic() + 10
        while True:
            try:
                return {p: tuple(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)) for p in partitions}
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                code = err.code() if isinstance(err, KafkaError) else None
                if (code in leader_unknown or getattr(err, "retriable", lambda: False)()) \
                        and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                raise SinkError(f"topic {topic!r}: cannot list its offsets: {exc}") from exc

    def offsets_of(self, topics: dict[str, Sequence[int]]) -> tuple[dict[Partition, tuple[int, int]],
                                                                     dict[str, Exception]]:
        """``offsets`` of the partitions of several topics: two ListOffsets requests (earliest, latest) a
        broker for all of them (the admin client's list_offsets), not two a partition; read_committed, as
        the consumer's get_watermark_offsets in ``offsets`` answers (the end is the last stable offset: a
        transaction still open is not counted). A topic any of whose partitions gave an error is listed
        again alone (``offsets``: its retries of a leader not known yet)."""
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import AdminClient, OffsetSpec

        tps = [TopicPartition(t, p) for t, parts in topics.items() for p in parts]
        if not tps:
            return {}, {}
        if self._admin is None:
            self._admin = AdminClient({**self.security, "bootstrap.servers": self.servers})
        bounds: dict[Partition, list[int]] = {}
        again: set[str] = set()
        try:
            for spec, at in ((OffsetSpec.earliest(), 0), (OffsetSpec.latest(), 1)):
                futures = self._admin.list_offsets(dict.fromkeys(tps, spec), request_timeout=10,
                                                   isolation_level=IsolationLevel.READ_COMMITTED)
                for tp, fut in futures.items():
                    try:
                        off = fut.result(15).offset
                    except Exception:
                        again.add(tp.topic)
                        continue
                    bounds.setdefault((tp.topic, tp.partition), [0, 0])[at] = off
        except Exception:  # (the request itself refused: every topic alone)
            again = set(topics)
        out = {tp: (b[0], b[1]) for tp, b in bounds.items() if tp[0] not in again}
        listed, errors = per_topic_offsets(self.offsets)({t: topics[t] for t in sorted(again)})
        out.update(listed)
        return out, errors

    def last_records(self, topic: str, starts: dict[int, int], timeout: float,
                     patient: Collection[int] = ()) -> dict[int, Record]:
        got, errors = self.last_records_of({(topic, p): off for p, off in starts.items()}, timeout,
                                           [(topic, p) for p in patient])
        if topic in errors:
            raise errors[topic]
        return {p: rec for (_t, p), rec in got.items()}

    def last_records_of(self, starts: dict[Partition, int], timeout: float,
                        patient: Collection[Partition] = ()) -> tuple[dict[Partition, Record], dict[str, Exception]]:
        """``last_records`` of the partitions of any topics at once, one consumer assigned to all of them
        (one fetch per broker reads them all): the last message read of each partition, and each topic
        that failed (a partition not read to its end in ``timeout``, a read error) with its error.

        Two passes. A partition's end is known when a fetch comes back with nothing more after it, and a
        fetch with nothing to give waits the consumer's ``fetch.wait.max.ms`` (500 ms by default): every
        read-back (a sender's start, each new topic's first batch) paid that half second. The first pass
        waits ``READ_BACK_FAST_WAIT_MS``; a partition that gave it nothing at all in
        ``READ_BACK_FAST_STALL`` s (a broker on slow storage, which answers a short wait empty every time:
        Tansu on S3 did) is read again, from its start, by a second pass with the client's default wait
        and the usual stall and timeout rules, in what is left of ``timeout`` but at least half of it (the
        whole read: 1.5 ``timeout`` at most). What the first pass read to the end or found failed stays as
        it found it."""
        t0 = time.monotonic()
        out, errors, slow = self._read_pass(starts, timeout, patient, READ_BACK_FAST_WAIT_MS, READ_BACK_FAST_STALL)
        if slow:
            # what the first pass left of the read's time, but at least half of it: a first pass that spent
            # most of it on a long partition must not leave the slow ones a second to be read in
            left = max(timeout - (time.monotonic() - t0), timeout / 2)
            got, more, _slow = self._read_pass({tp: starts[tp] for tp in slow}, left, [tp for tp in patient if tp in slow],
                                        None, READ_BACK_STALL)
            out.update(got)
            errors.update({t: e for t, e in more.items() if t not in errors})
        return {tp: rec for tp, rec in out.items() if tp[0] not in errors}, errors

    def _read_pass(self, starts: dict[Partition, int], timeout: float, patient: Collection[Partition],
                   fetch_wait_ms: int | None, stall: float
                   ) -> tuple[dict[Partition, Record], dict[str, Exception], set[Partition]]:
        """One pass of ``last_records_of``: what it read, the topics that failed, and (a first pass: with
        ``fetch_wait_ms``) the partitions that gave nothing for ``stall`` s, left for the next pass. Without
        ``fetch_wait_ms``, a partition outside ``patient`` that gave nothing at all from its start for
        ``stall`` s is done: nothing read there."""
        from confluent_kafka import KafkaError, TopicPartition

        # a consumer of its own for each read: one left stalled by a broker fetches no more
        c = self._fresh(fetch_wait_ms)
        c.assign([TopicPartition(t, p, off) for (t, p), off in starts.items()])
        out: dict[Partition, Record] = {}
        errors: dict[str, Exception] = {}
        left = set(starts)
        slow: set[Partition] = set()
        deadline = time.monotonic() + timeout
        moved = dict.fromkeys(starts, time.monotonic())  # when each partition last gave something
        try:
            while left and time.monotonic() < deadline:
                first = c.poll(0.1)  # (consume() would wait its whole timeout for fewer messages)
                for m in ([first] + c.consume(1000, 0)) if first is not None else ():
                    err = m.error()
                    tp = (m.topic(), m.partition())
                    if tp not in moved:  # a consumer-wide error (no partition): every topic's
                        if err is not None and not err.retriable():
                            for t in {x[0] for x in left} - set(errors):
                                errors[t] = SinkError(f"topic {t!r}: reading its last messages failed: {err}")
                            left.clear()
                        continue
                    moved[tp] = time.monotonic()
                    if err is None:
                        out[tp] = (m.headers(), m.value() is None)
                    elif err.code() == KafkaError._PARTITION_EOF:  # at the fetch response's high watermark
                        left.discard(tp)
                    elif not err.retriable() and tp[0] not in errors:
                        errors[tp[0]] = SinkError(f"topic {tp[0]!r}: reading its last messages failed: {err}")
                        left -= {x for x in left if x[0] == tp[0]}
                # a partition that gives nothing at all from its start (Tansu on S3 storage serves nothing
                # from an offset inside a record batch): given up here, read again from further back
                # (``patient``: partitions read from their start, which may take the broker a while);
                # a first pass hands every partition that stopped moving to the patient pass, whole
                now = time.monotonic()
                for tp in [tp for tp in left if now - moved[tp] > stall
                           and (fetch_wait_ms is not None or (tp not in out and tp not in patient))]:
                    left.discard(tp)
                    if fetch_wait_ms is not None:
                        slow.add(tp)
                        out.pop(tp, None)
        finally:
            c.close()
        for t in sorted({tp[0] for tp in left} - set(errors)):
            parts = sorted(p for x, p in left if x == t)
            errors[t] = SinkError(f"topic {t!r}: partitions {parts} not read to their end in {timeout:.0f}s")
        return out, errors, {tp for tp in slow if tp[0] not in errors}

    def close(self) -> None:
        self._admin = None  # (an admin client has no close: dropped)
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def confluent_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("confluent_kafka") is not None


# ConfluentClient.produce_all's loop in C where it was built (capturer/_native/kafka.c)
_produce_each: Callable[[Any, list[Message], int], int] | None = getattr(_fastrows, "kafka_produce_each", None)


class ConfluentClient(Client):
    def __init__(self, servers: str, opts: dict[str, Any], watch: Watch | None = None):
        import confluent_kafka
        from confluent_kafka.admin import AdminClient

        self._read = ConfluentReadBack(servers, opts)

        self.servers = servers
        self.reports = Reports()
        self._since_poll = 0
        self.watch = watch or Watch()  # the producer's errors (error_cb): a refused login, a failed TLS handshake
        self.producer = confluent_kafka.Producer(self.conf(servers, opts))
        self.admin = AdminClient({**librdkafka_conf(opts), "bootstrap.servers": servers})
        # fail fast when no broker answers, like kafka-python's constructor does
        try:
            md = self.producer.list_topics(timeout=10)
        except Exception:
            self.producer.poll(0)  # serves error_cb: what the broker connections said
            raise
        if not md.brokers:
            raise SinkError(f"no broker reachable at {servers}")
        if opts.get("_transactional_id"):  # fences an older producer of the same id, aborts its open transaction
            self.producer.init_transactions(60)

    def conf(self, servers: str, opts: dict[str, Any], timeout_ms: int = 60_000) -> dict[str, Any]:
        # Delivery reports only for failures: a success costs no Python call. flush()
        # returns only when every message is delivered or failed (and its report served),
        # so "nothing left and no error reported" means every message was acknowledged.
        # Idempotent: the producer's own retries write nothing twice and keep each
        # partition's order, so a partition holds a prefix of what was sent to it.
        return {**librdkafka_conf(opts), "error_cb": self.watch,
                "bootstrap.servers": servers, "acks": "all", "enable.idempotence": True,
                "linger.ms": opts["linger_ms"], "message.timeout.ms": timeout_ms,
                "message.max.bytes": opts.get("max_message_bytes", 1_048_576),
                "compression.type": opts["compression"], "queue.buffering.max.messages": 1_000_000,
                "delivery.report.only.error": True, "on_delivery": self.reports,
                # a topic of a lower max.message.bytes than a batch can reach (the sender's _batch_cap)
                **({"batch.size": opts["_batch_cap"]} if opts.get("_batch_cap") else {}),
                **({"transactional.id": opts["_transactional_id"], "transaction.timeout.ms": 60000}
                   if opts.get("_transactional_id") else {})}

    def partitions(self, topic: str) -> int:
        md = self.admin.list_topics(timeout=10)  # all topics: never auto-creates one
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return 0
        return len(t.partitions)

    def partitions_of(self, topics: Sequence[str]) -> dict[str, int]:
        md = self.admin.list_topics(timeout=10)  # (one answer for all)
        out = {}
        for topic in topics:
            t = md.topics.get(topic)
            out[topic] = 0 if t is None or t.error is not None else len(t.partitions)
        return out

    def learn(self, topic: str) -> None:
        # the producer's own metadata for the topic now: without it, the first messages to a
        # topic the admin client just created wait in librdkafka for its next refresh (0.5-1.6 s
        # measured with Tansu, per new topic)
        self.producer.list_topics(topic, timeout=10)

    def create_topic(self, topic: str, partitions: int, replication: int) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        fut = self.admin.create_topics([NewTopic(topic, partitions, replication)])[topic]
        try:
            fut.result(15)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise

    def produce(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]]) -> None:
        while True:
            try:
                # (positional, as in produce_all; the headers: see there)
                self.producer.produce(topic, value, key, partition, None, None, 0, headers)  # type: ignore[arg-type]
                break
            except BufferError:
                librdkafka_call(self.producer.poll, 0.05)
        self._since_poll += 1
        if self._since_poll >= 256:  # serve delivery callbacks now and then, not per message
            self._since_poll = 0
            librdkafka_call(self.producer.poll, 0)

    def produce_all(self, messages: list[Message]) -> None:
        # every argument positional: confluent-kafka parses a keyword (headers=) through a dict made
        # per call, about 0.3 us of its ~1 us a message (bench/kafka_encode.py); callback and
        # on_delivery None and timestamp 0 are its defaults (the producer's on_delivery, the time now)
        produce = self.producer.produce
        each = _produce_each
        if each is not None and type(messages) is list:  # the same calls from C (capturer/_native/kafka.c)
            i, n = 0, len(messages)
            while i < n:
                i = each(produce, messages, i)
                if i < n:  # the queue is full: wait for room for this one, then on from the next
                    self.produce(*messages[i])
                    i += 1
        else:
            # (type: ignore: confluent-kafka only reads the headers, and takes str or None values too: list is
            # invariant; a cast() here would be a Python call per message)
            for topic, part, key, value, headers in messages:
                try:
                    produce(topic, value, key, part, None, None, 0, headers)  # type: ignore[arg-type]
                except BufferError:
                    self.produce(topic, part, key, value, headers)  # waits for room
        # failure reports are served now and then (and by flush): poll() lets go of the
        # GIL, and getting it back from the decoding threads costs up to a switch interval
        self._since_poll += len(messages)
        if self._since_poll >= 8192:
            self._since_poll = 0
            librdkafka_call(self.producer.poll, 0)

    def flush(self, timeout: float) -> list[str]:
        left = librdkafka_call(self.producer.flush, timeout)
        errors = self.reports.take()
        if left:
            errors.append(f"{left} messages not acknowledged in time")
        return errors

    def failures(self) -> list[Failure]:
        return self.reports.take_failed()

    def txn_errors(self) -> list[object]:
        return list(self.reports.fatal)

    def commit(self) -> None:
        self.producer.commit_transaction(60)

    def abort(self) -> None:
        self.producer.abort_transaction(30)

    def offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        return self._read.offsets(topic, partitions)

    def last_records(self, topic: str, starts: dict[int, int], timeout: float,
                     patient: Collection[int] = ()) -> dict[int, Record]:
        return self._read.last_records(topic, starts, timeout, patient)

    def offsets_of(self, topics: dict[str, Sequence[int]]) -> tuple[dict[Partition, tuple[int, int]],
                                                                     dict[str, Exception]]:
        return self._read.offsets_of(topics)

    def last_records_of(self, starts: dict[Partition, int], timeout: float,
                        patient: Collection[Partition] = ()) -> tuple[dict[Partition, Record], dict[str, Exception]]:
        return self._read.last_records_of(starts, timeout, patient)

    def close(self) -> None:
        try:
            if librdkafka_call(self.producer.flush, 5):
                # given up on: purged, reported as failures (a request in flight may still land: then
                # the retry writes it again, a duplicate, never a gap)
                self.producer.purge()
                librdkafka_call(self.producer.flush, 1)
        finally:
            self._read.close()


# --- topics read whole (verify) ---------------------------------------------------

@dataclass
class KafkaMessage:
    """One message read back (its headers as text)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]


def _headers(raw: Any) -> dict[str, str]:
    return {str(k): v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v or "") for k, v in raw or []}


class ConfluentTopicReader:
    """Every partition of the topics it is given, read on from where it stopped (``verify``: each
    message handed to ``apply`` as a ``KafkaMessage``)."""

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


class KafkaPythonTopicReader:
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


# --- a metadata answer (--check --connect) ------------------------------------------

def confluent_brokers(servers: str, wait: float, opts: dict[str, Any] | None = None, watch: Any = None) -> int:
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {**librdkafka_conf(opts or {}), "bootstrap.servers": servers, "logger": log}
    if watch is not None:
        conf["error_cb"] = watch
    admin = AdminClient(conf)
    try:
        return len(admin.list_topics(timeout=wait).brokers)
    except Exception:
        admin.poll(0)  # serves error_cb: what the broker connections said
        raise


def kafka_python_brokers(servers: str, wait: float, opts: dict[str, Any] | None = None, watch: Any = None) -> int:
    from kafka.admin import KafkaAdminClient

    kw: dict[str, Any] = {"bootstrap_servers": servers.split(","), "request_timeout_ms": int(wait * 1000),
                          **kafka_python_conf(opts or {})}
    if "bootstrap_timeout_ms" in KafkaAdminClient.DEFAULT_CONFIG:
        kw["bootstrap_timeout_ms"] = int(wait * 1000)
    # it logs every failed attempt; the outcome says it once (what it said goes to the watch)
    with (watch or Watch()).kafka_python(quiet=True):
        client = KafkaAdminClient(**kw)
        try:
            return len(client.describe_cluster().get("brokers", []))
        finally:
            client.close()
