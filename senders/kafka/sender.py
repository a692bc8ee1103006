"""The Kafka sender: one message per row change, keyed by the primary key and
partitioned by a hash of it, so every change to one key stays in one partition,
in order.

* topic: ``topic`` may contain ``{db}``, ``{table}`` and ``{region}``; the
  default ``capturer.{db}.{table}`` gives one topic per table, as Debezium's
  ``<prefix>.<db>.<table>``. Characters Kafka does not allow in a topic name
  become ``_``.
* partition: Kafka's murmur2 of the key bytes (what the Java client does), so
  consumers in any language can find a key. Keyless tables are partitioned by
  table name: their rows keep their order.
* a primary-key change is a delete under the old key, then a create under the
  new key (as Debezium does); ``tombstones=true`` adds a null-value message
  after each delete for log compaction.
* a ``TRUNCATE`` (a snapshot's, or the source's) also goes to the table's own
  topic, in every partition, without a key: Debezium's ``op: "t"`` in json,
  Canal's ``TRUNCATE`` in canal, the statement in sql, a DDL change in protobuf.
* delivery: ``acks=all``; both clients' producers are idempotent (kafka-python's
  since 2026-11-27, see _KafkaPython) and kafka-python's keeps one request in flight. A batch is acknowledged
  only when the broker has acknowledged every message in it. On failure the
  producer is dropped and the batch sent again by a new one.
* no duplicates (``read_back=true``, the default; senders/kafka/positions.py): before
  a producer first writes to a topic (at start, and after every failed batch) the
  sender reads the last message of each of the topic's partitions back from Kafka;
  its identity headers (``region``, ``commit_ts``, ``seq``, ``op``) say exactly
  what that partition already holds, since each partition gets the sender's
  messages in one increasing order and keeps a prefix of them. Every message at
  or below its partition's mark is dropped, so neither a restart after ``kill -9``
  nor a retried batch writes a message twice. ``resume_key()`` is None: one
  transaction's rows may be in some partitions and not yet in others, so the
  skipping is per partition, not per transaction. Once the replayed part is past
  (the transaction in hand is above every mark) nothing is checked per message.
  A client's own retry of a request whose answer was lost is deduplicated by the
  broker (idempotent producers; measured:
  tests/integration/test_kafka_exactly_once.py::test_lost_produce_answers). The
  topics must have this sender as their only writer; see the manual (Senders: Kafka).

  ``transactional=true`` (both clients): each batch is one Kafka transaction
  (aborted on failure, so read_committed readers see it whole or not at all); the
  read-back reads read_committed, so it learns the last committed position. The
  transactional id is ``<prefix>.<sender>``, the prefix being the HA group's where
  there is one: a new active's init_transactions fences the deposed one. A fenced
  producer (told by the clients' error codes and classes, ``txn_failure``) raises
  ``Fenced``: never retried (a new producer would fence the new active in turn); an HA
  node steps down, a capturer without ``[ha]`` stops naming the transactional id.
* ``client=confluent`` uses confluent-kafka (librdkafka) when it is installed.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, ClassVar, Protocol, cast

from capturer.errors import FENCED_MARK, Fenced, SinkError
from capturer.model import Ddl, RowChange, StreamKey, TableSchema, Txn, schema_json, stream_key, ts_physical_ms
from capturer.model.encode import _fallback, _fastrows, dumps_compact
from capturer.model.spill import SpilledChanges
from capturer.util import failpoints, fencing
from capturer.util.ini import Key, p_bool, p_choice, p_int, p_nonempty, p_str
from capturer.util.kafkasec import SECURITY_KEYS, Watch, check_security, kafka_python_conf, librdkafka_conf
from senders.base import Sender
from senders.kafka.messages import (
    FORMATS,
    change_events,
    ddl_message,
    is_truncate,
    json_envelope,
    json_table_piece,
    json_txn_pieces,
    key_bytes,
    truncate_message,
)
from senders.kafka.positions import END_POS, Marks, MsgKey, Record, message_key, read_marks, row_key

log = logging.getLogger(__name__)

_TOPIC_BAD = re.compile(r"[^a-zA-Z0-9._-]")


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as in the Java client's default partitioner)."""
    length = len(data)
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length & 3
    tail = n4 * 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


# the C build (capturer/_fastrows.c, reached through the model's encode module) where
# it was built; the Python function above is its specification
_murmur2 = getattr(_fastrows, "murmur2", murmur2)


_OP_BYTES = {"c": b"c", "u": b"u", "d": b"d"}

# one message to produce: (topic, partition, key, value, headers)
Message = tuple[str, int, "bytes | None", "bytes | None", list[tuple[str, bytes]]]
_kafka_json = getattr(_fastrows, "kafka_json", None)
SLICE_ROWS = 2_000  # rows the C encoder renders in one call
FLUSH_ROWS = 50_000  # a big transaction: flush at least this often, to bound what the client buffers


def _slices(changes: Sequence[RowChange], rows: int) -> Iterator[Sequence[RowChange]]:
    """A transaction's changes in slices of at most ``rows`` (a spilled one loaded a chunk at a time)."""
    chunks = changes.chunks() if isinstance(changes, SpilledChanges) else iter((changes,))
    for chunk in chunks:
        for i in range(0, len(chunk), rows):
            yield chunk[i:i + rows]


def partition_for(key: bytes, partitions: int) -> int:
    return (_murmur2(key) & 0x7FFFFFFF) % partitions


Failure = tuple[str, int, Any, bool]
"""A message the producer did not deliver: ``(topic, partition, headers, value is null)``."""

READ_BACK_TIMEOUT = 60.0  # seconds to read the last messages of one topic's partitions
# attempts in a row after which a topic that cannot be read back is written without skipping (at least once
# there, loudly) rather than never again: a broker that cannot serve a read must not stop this sender for good
READ_BACK_GIVE_UP = 3
READ_BACK_STALL = 15.0  # seconds a partition may give nothing from where its read-back started
# (a broker on slow storage takes seconds to answer a fetch: too short a wait steps back for nothing)


FENCED, UNAUTHORIZED = "fenced", "unauthorized"


def _exceptions(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during (each once)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
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


class _Client(Protocol):
    producer: Any
    """What the sender needs from a Kafka client library."""

    def partitions(self, topic: str) -> int: ...
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

    def failures(self) -> list[Failure]:
        """The messages the producer reported as not delivered since the last call (after
        ``close()``: also those it gave up on at the close)."""
        return []

    def txn_errors(self) -> list[object]:
        """Errors of the transactional producer reported other than by a raised exception (delivery
        reports, its transaction state), for ``txn_failure``."""
        return []


class _KafkaPython(_Client):
    _reader: Any = None  # the consumer that reads partitions back, made when first needed

    def __init__(self, servers: str, opts: dict[str, Any]):
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient

        # the read-back goes through confluent-kafka where it is installed (see _ConfluentReader)
        self._read = _ConfluentReader(servers, opts) if _confluent_available() else None
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
            batch_size=256 * 1024, max_block_ms=15000, delivery_timeout_ms=60000,
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

    def last_records(self, topic: str, starts: dict[int, int], timeout: float,
                     patient: Collection[int] = ()) -> dict[int, Record]:
        if self._read is not None:
            return self._read.last_records(topic, starts, timeout, patient)
        from kafka import TopicPartition

        c = self._consumer()
        tps = [TopicPartition(topic, p) for p in starts]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, starts[tp.partition])
        out: dict[int, Record] = {}
        left = set(tps)
        deadline = time.monotonic() + timeout
        try:
            while left and time.monotonic() < deadline:
                for tp, recs in c.poll(timeout_ms=100).items():
                    if recs:
                        out[tp.partition] = (recs[-1].headers, recs[-1].value is None)
                for tp in list(left):
                    hw = c.highwater(tp)  # from the last fetch response: the true end, also on Tansu
                    if hw is not None and c.position(tp) >= hw:
                        left.discard(tp)
        finally:
            c.unsubscribe()
        if left:
            raise SinkError(f"topic {topic!r}: partitions {sorted(tp.partition for tp in left)} not read to "
                            f"their end in {timeout:.0f}s")
        return out

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


class _Reports:
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
            self.failed.append((msg.topic(), msg.partition(), msg.headers(), msg.value() is None))
            if err.fatal() and all(e.code() != err.code() for e in self.fatal):
                self.fatal.append(err)

    def take(self) -> list[str]:
        errors, self.errors = self.errors, []
        return errors

    def take_failed(self) -> list[Failure]:
        failed, self.failed = self.failed, []
        return failed


def _librdkafka_call(fn: Callable[..., Any], *args: Any) -> Any:
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


class _ConfluentReader:
    """Reads partitions back with confluent-kafka (librdkafka): a consumer of no group
    (assign, never subscribe; nothing committed), ``read_committed``, fetches waiting
    the client's default (a short ``fetch.wait.max.ms`` made Tansu on S3 storage answer
    every fetch empty: nothing was ever read back). Used by both clients where
    confluent-kafka is installed (kafka-python's consumer is the fallback)."""

    _reader: Any = None  # the consumer, made when first needed

    def __init__(self, servers: str, opts: dict[str, Any] | None = None):
        self.servers = servers
        self.security = librdkafka_conf(opts or {})

    def _fresh(self) -> Any:
        import confluent_kafka

        # group.id only because the client wants one: no group is joined (assign, never subscribe)
        # and nothing is committed
        return confluent_kafka.Consumer({
            **self.security, "bootstrap.servers": self.servers, "group.id": "capturer-read-back", "enable.auto.commit": False,
            "isolation.level": "read_committed", "enable.partition.eof": True, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 2000})

    def _consumer(self) -> Any:
        if self._reader is None:
            self._reader = self._fresh()  # kept for the offsets (ListOffsets) of every topic
        return self._reader

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

    def last_records(self, topic: str, starts: dict[int, int], timeout: float,
                     patient: Collection[int] = ()) -> dict[int, Record]:
        from confluent_kafka import KafkaError, TopicPartition

        c = self._fresh()  # a consumer of its own for each read: one left stalled by a broker fetches no more
        c.assign([TopicPartition(topic, p, off) for p, off in starts.items()])
        out: dict[int, Record] = {}
        left = set(starts)
        deadline = time.monotonic() + timeout
        moved = dict.fromkeys(starts, time.monotonic())  # when each partition last gave something
        try:
            while left and time.monotonic() < deadline:
                first = c.poll(0.1)  # (consume() would wait its whole timeout for fewer messages)
                for m in ([first] + c.consume(1000, 0)) if first is not None else ():
                    err = m.error()
                    p = m.partition()
                    moved[p] = time.monotonic()
                    if err is None:
                        out[p] = (m.headers(), m.value() is None)
                    elif err.code() == KafkaError._PARTITION_EOF:  # at the fetch response's high watermark
                        left.discard(p)
                    elif not err.retriable():
                        raise SinkError(f"topic {topic!r}: reading its last messages failed: {err}")
                # a partition that gives nothing at all from its start (Tansu on S3 storage serves nothing
                # from an offset inside a record batch): given up here, read again from further back
                # (``patient``: partitions read from their start, which may take the broker a while)
                for p in [p for p in left if p not in out and p not in patient
                          and time.monotonic() - moved[p] > READ_BACK_STALL]:
                    left.discard(p)
        finally:
            c.close()
        if left:
            raise SinkError(f"topic {topic!r}: partitions {sorted(left)} not read to their end in {timeout:.0f}s")
        return out

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _confluent_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("confluent_kafka") is not None


class _Confluent(_Client):
    def __init__(self, servers: str, opts: dict[str, Any], watch: Watch | None = None):
        import confluent_kafka
        from confluent_kafka.admin import AdminClient

        self._read = _ConfluentReader(servers, opts)

        self.servers = servers
        self.reports = _Reports()
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
                **({"transactional.id": opts["_transactional_id"], "transaction.timeout.ms": 60000}
                   if opts.get("_transactional_id") else {})}

    def partitions(self, topic: str) -> int:
        md = self.admin.list_topics(timeout=10)  # all topics: never auto-creates one
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return 0
        return len(t.partitions)

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
                # only read (its header values may be str or None too: list is invariant)
                self.producer.produce(topic, value, key, partition,
                                      headers=cast("list[tuple[str, str | bytes | None]]", headers))
                break
            except BufferError:
                _librdkafka_call(self.producer.poll, 0.05)
        self._since_poll += 1
        if self._since_poll >= 256:  # serve delivery callbacks now and then, not per message
            self._since_poll = 0
            _librdkafka_call(self.producer.poll, 0)

    def produce_all(self, messages: list[Message]) -> None:
        produce = self.producer.produce
        for topic, part, key, value, headers in messages:
            try:
                produce(topic, value, key, part, headers=cast("list[tuple[str, str | bytes | None]]", headers))
            except BufferError:
                self.produce(topic, part, key, value, headers)  # waits for room
        # failure reports are served now and then (and by flush): poll() lets go of the
        # GIL, and getting it back from the decoding threads costs up to a switch interval
        self._since_poll += len(messages)
        if self._since_poll >= 8192:
            self._since_poll = 0
            _librdkafka_call(self.producer.poll, 0)

    def flush(self, timeout: float) -> list[str]:
        left = _librdkafka_call(self.producer.flush, timeout)
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

    def close(self) -> None:
        try:
            if _librdkafka_call(self.producer.flush, 5):
                # given up on: purged, reported as failures (a request in flight may still land: then
                # the retry writes it again, a duplicate, never a gap)
                self.producer.purge()
                _librdkafka_call(self.producer.flush, 1)
        finally:
            self._read.close()


class KafkaSender(Sender):
    KEYS: ClassVar[list[Key]] = [
        Key("servers", p_nonempty, required=True, doc="bootstrap servers host:port[,host:port]"),
        Key("topic", p_nonempty, "capturer.{db}.{table}", doc="topic; may use {db} {table} {region}"),
        Key("format", p_choice("json", "canal", "sql", "protobuf"), "json"),
        Key("client", p_choice("kafka-python", "confluent"), "kafka-python"),
        Key("tombstones", p_bool, False, doc="a null-value message after each delete"),
        Key("txn_topic", p_str, "", doc="topic for BEGIN/END transaction records; empty = off"),
        Key("schema_topic", p_str, "capturer.schema_changes", doc="topic for DDL; empty = off"),
        Key("partitions", p_int(1, 10_000), 3, doc="partitions of topics the sender creates"),
        Key("replication_factor", p_int(1, 100), 1, doc="replication of topics the sender creates"),
        Key("create_topics", p_bool, True, doc="create missing topics"),
        Key("compression", p_choice("none", "gzip", "lz4", "zstd", "snappy"), "none"),
        Key("linger_ms", p_int(0, 10_000), 5),
        Key("transactional", p_bool, False, doc="each batch is one Kafka transaction (read_committed consumers "
            "see all of it or none); with [ha] the new active fences the deposed one at the broker"),
        Key("transactional_id", p_str, "", doc="transactional id prefix; empty = capturer.<ha group or "
            "sender name>; the producer's id is <prefix>.<sender name>"),
        Key("read_back", p_bool, True, doc="read the last message of each partition back before writing to it "
            "with a new producer, and skip what Kafka holds already (no duplicates after a crash or a retry; "
            "needs read access to the topics); false = at least once"),
        Key("max_message_bytes", p_int(1024, 1_000_000_000), 1_048_576,
            doc="the largest message the producer sends (a row bigger stops the sender with an error naming it, "
                "never dropped); the topics' max.message.bytes (the broker's message.max.bytes) must allow it too"),
        *SECURITY_KEYS,
    ]
    batch_rows = 20_000

    def __init__(self, name: str, options: dict[str, Any], queue_rows: int = 100_000):
        super().__init__(name, options, queue_rows)
        self.fmt = options["format"]
        self.encode = FORMATS[self.fmt]
        self.client: _Client | None = None
        self._parts: dict[str, int] = {}
        self._topics: dict[tuple[str, str, str], str] = {}
        self.messages = 0
        # what each partition holds already (read back), for the run: survives new producers
        self.marks = Marks()
        self._txn_key: StreamKey = (0, "", 0)  # the transaction in hand
        self._skipped_logged = 0
        self.read_back_failures: dict[str, int] = {}  # topic -> read-backs failed in a row
        self.read_back_given_up: set[str] = set()  # topics written without skipping (READ_BACK_GIVE_UP)
        # high availability: every message carries the writing capturer's epoch (a consumer drops a message of
        # an older epoch than one it saw on the partition: a deposed capturer's client may still deliver
        # what it held when it was paused)
        epoch = int(options.get("ha_epoch") or 0)
        self.transactional = bool(options.get("transactional"))
        self.transactional_id = ""
        if self.transactional:
            # with [ha] the group's: the id is the same on every node of the group, so a new active's
            # init_transactions fences the deposed one at the broker (and aborts its open transaction)
            prefix = options.get("transactional_id") or f"capturer.{options.get('ha_group') or name}"
            self.transactional_id = f"{prefix}.{name}"
            self.options = {**self.options, "_transactional_id": self.transactional_id}
        self.epoch_header: list[tuple[str, bytes]] = [("capturer_epoch", str(epoch).encode())] if epoch else []

    @staticmethod
    def check_options(opts: dict[str, Any], where: Callable[[str], str]) -> None:
        """At config time: the SASL and TLS keys (capturer/util/kafkasec.py)."""
        check_security(opts, where)

    def status(self) -> dict[str, Any]:
        st = super().status()
        st.update({"messages": self.messages, "client": self.options["client"], "format": self.fmt,
                   "skipped": self.marks.skipped, "read_back_given_up": sorted(self.read_back_given_up)})
        return st

    def open(self) -> None:
        self.client = self._new_client(self.options["servers"])
        # a new producer: every topic's partitions are read back before its first message
        self._parts = {}

    def _new_client(self, servers: str) -> _Client:
        watch = Watch()
        try:
            with watch.kafka_python():
                return self._new_client_watched(servers, watch)
        except Exception as exc:
            # a refused login or a certificate the CA did not sign: retrying cannot help
            why = watch.explain("", self.options, exc, f"[{self.name}]")
            if why is not None:
                raise SinkError(why, retriable=False) from None
            found = txn_failure(exc) if self.transactional else None
            if found is not None and found[0] == UNAUTHORIZED:  # init_transactions refused
                raise self._txn_error(*found) from None
            raise

    def _new_client_watched(self, servers: str, watch: Watch) -> _Client:
        try:
            if self.options["client"] == "confluent":
                try:
                    import confluent_kafka  # noqa: F401
                except ImportError:
                    raise SinkError("client=confluent needs confluent-kafka: "
                                    ".venv/bin/pip install confluent-kafka", retriable=False) from None
                return _Confluent(servers, self.options, watch)
            try:
                import kafka  # noqa: F401
            except ImportError:
                raise SinkError("client=kafka-python needs the project's 'kafka' extra: "
                                ".venv/bin/pip install -e '.[kafka]' (start.sh installs it)",
                                retriable=False) from None
            return _KafkaPython(servers, self.options)
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(f"cannot reach Kafka at {servers}: {exc}") from exc

    def resume_key(self) -> StreamKey | None:
        """None: the sender skips per partition what Kafka holds already (the marks are read
        before the first message to each topic after ``open()``), not per transaction: rows
        of one transaction go to several partitions, and a crash or a failed batch can leave
        some of them written and others not."""
        return None

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass
            # what the producer did not deliver: never skipped on the strength of a later mark
            # (a gap before it), for the rest of the run
            for topic, part, headers, null in getattr(client, "failures", list)():
                self.marks.failed((topic, part), message_key(headers, null))

    def topic_for(self, db: str, table: str, region: str) -> str:
        hit = self._topics.get((db, table, region))
        if hit is None:
            t = self.options["topic"].replace("{db}", db).replace("{table}", table).replace("{region}", region)
            hit = _TOPIC_BAD.sub("_", t)[:249]
            if len(self._topics) > 100_000:
                self._topics.clear()
            self._topics[(db, table, region)] = hit
        return hit

    def _partitions(self, topic: str) -> int:
        """The partition count of ``topic`` (created if missing); the first time with this
        producer, after reading its partitions' marks back."""
        n = self._parts.get(topic)
        if n is None:
            assert self.client is not None
            n = self.client.partitions(topic)
            if n == 0:
                if not self.options["create_topics"]:
                    raise SinkError(f"topic {topic!r} does not exist and create_topics = false "
                                    f"in [{self.name}]: create the topic on the broker (kafka-topics.sh --create "
                                    f"--topic {topic}), or set create_topics = true", retriable=False)
                self.client.create_topic(topic, self.options["partitions"], self.options["replication_factor"])
                deadline = time.monotonic() + 15
                while n == 0 and time.monotonic() < deadline:
                    time.sleep(0.1)
                    n = self.client.partitions(topic)
                if n == 0:
                    raise SinkError(f"topic {topic!r} was created but has no partitions yet")
            self.client.learn(topic)
            self._read_back(topic, n)
            self._parts[topic] = n
        return n

    def _read_back(self, topic: str, partitions: int) -> None:
        """Learn what ``topic``'s partitions hold of this sender's messages (their last
        message's key), before this producer writes to it (even a topic just created:
        another writer may have been quicker, and an empty topic costs one ListOffsets)."""
        client = self.client
        if not self.options["read_back"] or client is None or getattr(client, "last_records", None) is None:
            return
        t0 = time.monotonic()
        try:
            marks = read_marks(topic, range(partitions), client.offsets, client.last_records, READ_BACK_TIMEOUT)
        except Exception as exc:
            err = exc if isinstance(exc, SinkError) else \
                SinkError(f"topic {topic!r}: cannot read its last messages back: {exc}")
            n = self.read_back_failures[topic] = self.read_back_failures.get(topic, 0) + 1
            if n < READ_BACK_GIVE_UP or not err.retriable:
                raise err from exc
            log.error("sender %s: topic %s could not be read back %d times in a row (%s): writing to it without "
                      "skipping what it may hold already; what reached it after the last checkpoint may be there "
                      "twice (identified by the region, commit_ts and seq headers)", self.name, topic, n, err)
            self.read_back_given_up.add(topic)
            return
        self.read_back_failures.pop(topic, None)
        before = len(self.marks.limits)
        self.marks.learn(topic, marks, self._txn_key)
        if len(self.marks.limits) != before or log.isEnabledFor(logging.DEBUG):
            log.info("sender %s: topic %s read back in %.2fs: %d of %d partitions hold messages of the stream from "
                     "%s on (those are not sent again)", self.name, topic, time.monotonic() - t0,
                     sum(1 for tp in self.marks.limits if tp[0] == topic), partitions, list(self._txn_key))

    def send(self, batch: list[Txn]) -> None:
        if self.client is None:
            self.open()
        assert self.client is not None
        sent = 0
        try:
            if self.transactional:
                self.client.begin()
            for txn in batch:
                sent += self._send_txn(txn)
            self._flush_or_raise(self.client)
            if self.transactional:
                if sent:
                    failpoints.hit("kafka.commit")
                # high availability: a capturer deposed while its transaction was open (paused past its lease)
                # must not commit it before the new active's init_transactions has fenced it at the broker
                fencing.check(f"sender {self.name}")
                self.client.commit()
        except SinkError as exc:
            self._abort_or_fenced(exc)
            self.close()  # a fresh producer for the retry
            self._raise_if_too_large(batch, exc)
            raise
        except Exception as exc:
            self._abort_or_fenced(exc)
            self.close()
            self._raise_if_too_large(batch, exc)
            raise SinkError(f"produce failed: {exc}") from exc
        self.messages += sent
        self.marks.batch_done()
        if self.marks.skipped != self._skipped_logged:
            log.info("sender %s: %d messages Kafka held already were not sent again (%d so far)", self.name,
                     self.marks.skipped - self._skipped_logged, self.marks.skipped)
            self._skipped_logged = self.marks.skipped

    def _abort_or_fenced(self, exc: BaseException) -> None:
        """A failed transactional batch: abort its transaction (read_committed readers never see
        it; the retry writes the batch again in a new one). Fenced (another producer of the same
        transactional id, a new active capturer, called init_transactions; told by the clients' error
        codes and classes, see ``txn_failure``): ``Fenced``, never retried (a retry's new producer
        would fence the new active in turn). A transactional id the principal may not use: fatal."""
        if not self.transactional:
            return
        client = self.client
        found = txn_failure(exc, client.txn_errors() if client is not None else ())
        if found is None and client is not None:
            try:
                client.abort()
            except Exception as abort_exc:  # a new producer's init_transactions aborts it anyway
                found = txn_failure(abort_exc, client.txn_errors())
                if found is None:
                    log.warning("sender %s: abort of the failed batch's transaction failed: %s", self.name, abort_exc)
        if found is not None:
            self.close()
            raise self._txn_error(*found) from None

    def _txn_error(self, kind: str, err: object) -> SinkError:
        """Fenced, or the fatal error of a transactional id the broker refuses (``err``: the client's error)."""
        tid = self.transactional_id
        if kind == FENCED:
            log.error("sender %s: fenced at the broker: a newer producer of transactional id %r started; this "
                      "capturer's open transaction is aborted and it writes nothing more", self.name, tid)
            return Fenced(f"[{self.name}] fenced at the broker: a newer producer of transactional id {tid!r} started "
                          f"({FENCED_MARK}, or another process uses the same transactional id); this capturer's "
                          f"open transaction is aborted and it writes nothing more ({err})")
        return SinkError(f"[{self.name}] the broker refuses transactional id {tid!r} "
                         f"(TRANSACTIONAL_ID_AUTHORIZATION_FAILED): grant this principal WRITE and DESCRIBE on "
                         f"TransactionalId {tid!r} (or its prefix), or set transactional_id in [{self.name}] to "
                         f"an allowed prefix ({err})", retriable=False)

    def _raise_if_too_large(self, batch: list[Txn], exc: BaseException) -> None:
        """A message bigger than Kafka takes (the producer's max_message_bytes, or the topic's
        max.message.bytes on the broker): a fatal SinkError naming the table, the key and the sizes,
        since sending it again cannot succeed, and dropping it would lose a row without a word."""
        low = str(exc).lower()
        if not ("message size too large" in low or "messagesizetoolarge" in low or "msg_size_too_large" in low
                or "message_too_large" in low or "too large" in low and "message" in low):
            return
        biggest: tuple[int, str, str, str] | None = None  # (size, table, key, topic)
        now_ms = int(time.time() * 1000)
        for txn in batch:
            if txn.ddl is not None or not txn.changes:
                continue
            seq0 = 0
            for part in _slices(txn.changes, SLICE_ROWS):
                for topic, _p, key, value, headers in self.row_messages(txn, part, seq0, self.encoder(now_ms)):
                    size = len(key or b"") + len(value or b"") + sum(len(k) + len(v) for k, v in headers)
                    if biggest is None or size > biggest[0]:
                        ch = part[int(headers[2][1]) - seq0]
                        biggest = (size, f"{ch.db}.{ch.table}", (key or b"").decode("utf-8", "replace")[:200], topic)
                seq0 += len(part)
        limit = self.options.get("max_message_bytes", 1_048_576)
        if biggest is None:
            raise SinkError(f"a message bigger than Kafka takes (max_message_bytes = {limit} "
                            f"in [{self.name}], and the topics' max.message.bytes on the broker): {exc}",
                            retriable=False) from None
        size, table, shown, topic = biggest
        raise SinkError(
            f"a row of table {table} (key {shown or '(none)'}) is a message of about {size} bytes, "
            f"more than Kafka takes: the producer's limit is max_message_bytes = {limit} (in [{self.name}]), and "
            f"topic {topic!r} may have a lower max.message.bytes on the broker (its default is the broker's "
            f"message.max.bytes, 1048588): raise both, or keep such rows out with the filter; the sender stops "
            f"rather than drop it ({exc})", retriable=False) from None

    @staticmethod
    def _flush_or_raise(client: _Client) -> None:
        errors = client.flush(60)
        if errors:
            raise SinkError(f"{len(errors)} messages not acknowledged, e.g. {errors[0]}")

    def _headers(self, txn: Txn, seq: int, op: str) -> list[tuple[str, bytes]]:
        return [("region", txn.region.encode()), ("commit_ts", str(txn.commit_ts).encode()),
                ("seq", str(seq).encode()), ("op", _OP_BYTES.get(op) or op.encode())]

    def _put(self, client: _Client, topic: str, part: int, key: bytes | None, value: bytes | None,
             headers: list[tuple[str, bytes]], mkey: MsgKey) -> int:
        """Produce one message (of key ``mkey``) unless its partition holds it already: 1 or 0."""
        if self.marks.limits and not self.marks.keep((topic, part), mkey):
            return 0
        client.produce(topic, part, key, value, headers + self.epoch_header)
        return 1

    def _send_txn(self, txn: Txn) -> int:
        assert self.client is not None
        client = self.client
        tk = self._txn_key = stream_key(txn)
        if self.marks.limits:
            self.marks.at(tk)
        n = 0
        if txn.ddl is not None:
            topic = self.options["schema_topic"]
            d = txn.ddl
            sub = tk[2]
            txn_topic = self.options["txn_topic"]
            if txn_topic:
                # the transaction topic lists every DDL too, in its place: one partition that tells
                # a consumer (capturer/apply) the whole order of the stream
                self._partitions(txn_topic)
                n += self._put(client, txn_topic, 0, f"{txn.region}:{txn.commit_ts}".encode(),
                               self._ddl_record(txn, d), self._headers(txn, d.seq, "ddl"),
                               (txn.commit_ts, txn.region, sub, 0, 0))
                failpoints.hit("kafka.produce")
            if topic:
                self._partitions(topic)  # create it if needed; DDL keeps one order: partition 0
                n += self._put(client, topic, 0, d.db.encode(), ddl_message(txn, d, self.fmt),
                               self._headers(txn, d.seq, "ddl"), (txn.commit_ts, txn.region, sub, 0, 0))
                failpoints.hit("kafka.produce")
            if is_truncate(d):
                # the table's own consumers see it emptied: an event (op "t", no key) in every
                # partition of its topic, in order with the keys that partition holds
                table_topic = self.topic_for(d.db, d.table, txn.region)
                body = truncate_message(txn, d, self.fmt)
                try:
                    parts = self._partitions(table_topic)
                except SinkError as exc:
                    if exc.retriable:
                        raise
                    # no topic and create_topics=false: nobody consumes an empty table's topic
                    log.warning("sender %s: TRUNCATE of %s.%s not sent to %r: %s", self.name, d.db, d.table,
                                table_topic, exc)
                    return n
                for part in range(parts):
                    n += self._put(client, table_topic, part, None, body, self._headers(txn, d.seq, "t"),
                                   (txn.commit_ts, txn.region, sub, 0, 1))
                failpoints.hit("kafka.produce")
            return n
        if not txn.changes:
            return 0
        txn_topic = self.options["txn_topic"]
        txn_id = f"{txn.region}:{txn.commit_ts}".encode()
        if txn_topic:
            self._partitions(txn_topic)
            n += self._put(client, txn_topic, 0, txn_id, self._txn_record(txn, "BEGIN"),
                           self._headers(txn, 0, "begin"), (txn.commit_ts, txn.region, 0, -1, 0))
            failpoints.hit("kafka.produce")
        counts: dict[tuple[str, str, str, int], int] | None = {} if txn_topic else None
        n += self._send_rows(txn, client, counts)
        if txn_topic:
            n += self._put(client, txn_topic, 0, txn_id, self._txn_record(txn, "END", counts),
                           self._headers(txn, 0, "end"), (txn.commit_ts, txn.region, 0, END_POS, 0))
            failpoints.hit("kafka.produce")
        return n

    def _unsent(self, txn: Txn, msgs: list[Message]) -> list[Message]:
        """The messages of ``msgs`` (rows of ``txn``) their partitions do not hold yet."""
        limits, keep = self.marks.limits, self.marks.keep
        ts, region = txn.commit_ts, txn.region
        # headers: region, commit_ts, seq, op (both encoders)
        return [m for m in msgs if (m[0], m[1]) not in limits
                or keep((m[0], m[1]), row_key(ts, region, int(m[4][2][1]), m[4][3][1], m[3] is None))]

    def _send_rows(self, txn: Txn, client: _Client,
                   parts: dict[tuple[str, str, str, int], int] | None = None) -> int:
        """The rows of a transaction, a slice at a time: in the json format rendered by
        the C encoder where it was built (``row_messages`` is what it renders, and the path
        taken for a slice it refuses, e.g. a lone surrogate in a value). ``parts``: counts
        the messages of each ``(db, table, topic, partition)`` (all of them, also those a
        partition held already), for the transaction's END record."""
        total = len(txn.changes)
        now_ms = int(time.time() * 1000)  # json's ts_ms (when the capturer sent it): one per transaction
        encode = self.encoder(now_ms)
        fast = _kafka_json if self.fmt == "json" else None
        if fast is not None:
            pieces = json_txn_pieces(txn, now_ms)
            hbase = (("region", txn.region.encode()), ("commit_ts", str(txn.commit_ts).encode()))
            tombstones = bool(self.options["tombstones"])

            def table(schema: TableSchema) -> tuple[str, int, bytes, tuple[str, ...], bytes]:
                return self.json_table(txn.region, schema)

        n = seq0 = unflushed = 0
        for part in _slices(txn.changes, SLICE_ROWS):
            msgs = None
            if fast is not None:
                try:
                    msgs = fast(part, seq0, total, pieces, table, _fallback, hbase, tombstones)
                except (TypeError, ValueError, UnicodeError):
                    pass
            if msgs is None:
                msgs = self.row_messages(txn, part, seq0, encode)
            if parts is not None:
                # per table and partition (a topic may hold several tables: a pattern without {table},
                # or two names that become one topic name): the row of a message by its seq header
                for m in msgs:
                    s = part[int(m[4][2][1]) - seq0].schema
                    k = (s.db, s.table, m[0], m[1])
                    parts[k] = parts.get(k, 0) + 1
            if self.marks.limits:  # (only while the replayed part is in hand)
                msgs = self._unsent(txn, msgs)
            if self.epoch_header:  # high availability: which capturer's epoch wrote it (after the others)
                eh = self.epoch_header
                msgs = [(t, p, k, v, h + eh) for t, p, k, v, h in msgs]
            client.produce_all(msgs)
            failpoints.hit("kafka.produce")
            n += len(msgs)
            seq0 += len(part)
            unflushed += len(part)
            if unflushed >= FLUSH_ROWS:  # a big transaction: bound what the client buffers
                self._flush_or_raise(client)
                unflushed = 0
        return n

    def encoder(self, now_ms: int) -> Callable[[Txn, int, RowChange, str], bytes]:
        """The message body of one event in the sender's format (json with ``now_ms`` as its ts_ms)."""
        if self.fmt == "json":
            return lambda txn, seq, ch, op: json_envelope(txn, seq, ch, op, now_ms)
        return self.encode

    def json_table(self, region: str, schema: TableSchema) -> tuple[str, int, bytes, tuple[str, ...], bytes]:
        """What the C encoder needs of a table: its topic, the topic's partitions, its
        part of the envelope, its key columns and the key bytes of a keyless row."""
        topic = self.topic_for(schema.db, schema.table, region)
        return (topic, self._partitions(topic), json_table_piece(schema.db, schema.table), tuple(schema.pk),
                f"{schema.db}.{schema.table}".encode())

    def row_messages(self, txn: Txn, part: Sequence[RowChange], seq0: int,
                 encode: Callable[[Txn, int, RowChange, str], bytes]) -> list[Message]:
        """The messages of a slice of a transaction's rows (``part``, its first row
        being the transaction's ``seq0``), in Python."""
        out: list[Message] = []
        base = [("region", txn.region.encode()), ("commit_ts", str(txn.commit_ts).encode())]  # every message's
        for seq, ch in enumerate(part, seq0):
            topic = self.topic_for(ch.db, ch.table, txn.region)
            parts = self._partitions(topic)
            seq_b = str(seq).encode()
            for op, image in change_events(ch):
                key = key_bytes(ch, image)
                p = partition_for(key if key is not None else f"{ch.db}.{ch.table}".encode(), parts)
                headers = base + [("seq", seq_b), ("op", _OP_BYTES.get(op) or op.encode())]
                out.append((topic, p, key, encode(txn, seq, ch, op), headers))
                if op == "d" and self.options["tombstones"] and key is not None:
                    out.append((topic, p, key, None, headers))
        return out

    def _txn_record(self, txn: Txn, status: str,
                    parts: dict[tuple[str, str, str, int], int] | None = None) -> bytes:
        """A BEGIN or END record of ``txn_topic`` (Debezium's transaction metadata). END also
        says, for a consumer that regroups the transaction (capturer/apply): ``parts``, the
        messages of each ``[db, table, topic, partition, count]`` (tombstones included), and
        ``schemas``, each table's columns, key, unique keys and column types."""
        d: dict[str, Any] = {"status": status, "id": f"{txn.region}:{txn.commit_ts}",
                             "ts_ms": ts_physical_ms(txn.commit_ts), "region": txn.region,
                             "commit_ts": txn.commit_ts, "position": txn.position.to_json()}
        if status == "END":
            counts: dict[tuple[str, str], int] = {}
            schemas: dict[int, TableSchema] = {}
            for part in _slices(txn.changes, SLICE_ROWS):
                for ch in part:
                    s = ch.schema
                    k = (s.db, s.table)
                    counts[k] = counts.get(k, 0) + 1
                    schemas[id(s)] = s
            d["event_count"] = len(txn.changes)
            d["data_collections"] = [{"data_collection": f"{k[0]}.{k[1]}", "event_count": v}
                                     for k, v in counts.items()]
            d["parts"] = [[db, table, t, p, c] for (db, table, t, p), c in sorted((parts or {}).items())]
            d["schemas"] = [schema_json(s) for s in schemas.values()]
            d["source_ts"], d["gtid"] = txn.source_ts, txn.gtid
            if txn.snapshot is not None:
                d["snapshot"] = txn.snapshot.to_json()
        return dumps_compact(d).encode()

    def _ddl_record(self, txn: Txn, d: Ddl) -> bytes:
        """A DDL's record of ``txn_topic`` (status ``DDL``), in the stream's order with the transactions'."""
        return dumps_compact({
            "status": "DDL", "id": f"{txn.region}:{txn.commit_ts}", "ts_ms": ts_physical_ms(txn.commit_ts),
            "region": txn.region, "commit_ts": txn.commit_ts, "position": txn.position.to_json(),
            "seq": d.seq, "db": d.db, "table": d.table, "sql": d.sql, "session_db": d.session_db,
            "source_ts": txn.source_ts, "gtid": txn.gtid}).encode()
