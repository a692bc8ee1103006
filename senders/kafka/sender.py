"""The Kafka sender: one message per row change, keyed by the primary key and
partitioned by a hash of it, so every change to one key stays in one partition,
in order.

* topic: ``topic`` may contain ``{db}``, ``{table}`` and ``{region}``; the
  default ``capturer.{db}.{table}`` gives one topic per table, as Debezium's
  ``<prefix>.<db>.<table>``. Characters Kafka does not allow in a topic name
  become ``_``.
* partition: Kafka's murmur2 of the key bytes (what the Java client does), so
  consumers in any language can find a key. Keyless tables are partitioned by
  table name: their rows keep their order. The partition count is the one the
  sender first wrote the topic with, kept in the checkpoint (``_pin``): partitions
  added to a topic later stay empty, so no key moves and a replay goes where it went.
* a primary-key change is a delete under the old key, then a create under the
  new key (as Debezium does); ``tombstones=true`` adds a null-value message
  after each delete for log compaction.
* a ``TRUNCATE`` (a snapshot's, or the source's) also goes to the table's own
  topic, in every partition, without a key: Debezium's ``op: "t"`` in json,
  Canal's ``TRUNCATE`` in canal, the statement in sql, a DDL change in protobuf.
* delivery: ``acks=all``; both clients' producers are idempotent (kafka-python's
  since 2026-11-27, see senders/kafka/client.py) and kafka-python's keeps one request in flight. A batch is acknowledged
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

import contextlib
import logging
import re
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, ClassVar

from capturer.errors import FENCED_MARK, Fenced, SinkError
from capturer.model import Ddl, RowChange, StreamKey, TableSchema, Txn, schema_json, stream_key, ts_physical_ms
from capturer.model.encode import _fallback, _fastrows, dumps_compact, quote_ident
from capturer.model.spill import SpilledChanges
from capturer.util import failpoints, fencing
from capturer.util.ini import Key, p_bool, p_choice, p_int, p_nonempty, p_str
from capturer.util.kafkasec import SECURITY_KEYS, Watch, check_security
from senders.base import Sender
from senders.kafka.client import (
    FENCED,
    UNAUTHORIZED,
    Client,
    ConfluentClient,
    KafkaPythonClient,
    Message,
    topic_settings,
    txn_failure,
)
from senders.kafka.format import (
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
from senders.kafka.positions import (
    END_POS,
    Marks,
    MsgKey,
    message_key,
    per_topic,
    per_topic_offsets,
    read_marks_of,
    row_key,
)

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

_kafka_json = getattr(_fastrows, "kafka_json", None)
SLICE_ROWS = 2_000  # rows the C encoder renders in one call
FLUSH_ROWS = 50_000  # a big transaction: flush at least this often, to bound what the client buffers


def _slices(changes: Sequence[RowChange], rows: int) -> Iterator[Sequence[RowChange]]:
    """A transaction's changes in slices of at most ``rows`` (a spilled one loaded a chunk at a time)."""
    chunks = changes.chunks() if isinstance(changes, SpilledChanges) else iter((changes,))
    for chunk in chunks:
        for i in range(0, len(chunk), rows):
            yield chunk[i:i + rows]


def _too_large(low: str) -> bool:
    """A client's error text (lowered) says a message or record batch was too large for Kafka."""
    return ("message size too large" in low or "messagesizetoolarge" in low or "msg_size_too_large" in low
            or "message_too_large" in low or "too large" in low and "message" in low)


def _invalid_topic(exc: BaseException) -> bool:
    """Kafka's INVALID_TOPIC_EXCEPTION (17) from either client: a topic name the broker refuses (e.g. one
    that collides with an existing topic's), by the clients' error codes, not the text."""
    err = exc.args[0] if type(exc).__name__ == "KafkaException" and exc.args else exc
    code = getattr(err, "code", None)
    if callable(code):  # confluent-kafka's KafkaError
        try:
            return bool(code() == 17)
        except Exception:
            return False
    return getattr(type(exc), "errno", None) == 17  # kafka-python's InvalidTopicError


def partition_for(key: bytes, partitions: int) -> int:
    return (_murmur2(key) & 0x7FFFFFFF) % partitions


# the largest record batch each client makes by default (confluent: librdkafka's batch.size; kafka-python: the
# batch_size the sender sets), and what a record batch adds to its records' bytes (header, per-record framing)
_BATCH_BYTES = {"confluent": 1_000_000, "kafka-python": 256 * 1024}
_BATCH_FRAMING = 512

READ_BACK_TIMEOUT = 60.0  # seconds to read the last messages of one topic's partitions (+1 s a topic more)
READ_BACK_TOPICS = 100  # topics read back at once at most (one consumer assigned to all their partitions)
# attempts in a row after which a topic that cannot be read back is written without skipping (at least once
# there, loudly) rather than never again: a broker that cannot serve a read must not stop this sender for good
READ_BACK_GIVE_UP = 3


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
    # the first batch after a start: its read-back (~0.5 s) then at most 2,000 rows before it is acknowledged
    # (a first batch of 20,000 rows and the next one's, deferred settle, took 2.5 s at load 18 from ready to
    # the first acknowledgement with confluent-kafka, 4.4 s with kafka-python)
    start_rows = 2_000

    def __init__(self, name: str, options: dict[str, Any], queue_rows: int = 100_000):
        super().__init__(name, options, queue_rows)
        self.fmt = options["format"]
        self.encode = FORMATS[self.fmt]
        self.client: Client | None = None
        self._parts: dict[str, int] = {}
        # the batch in hand and the index of its transaction in hand (the topics it goes on to: _batch_topics),
        # and the topics prepared for it (each looked for once a batch)
        self._batch: Sequence[Txn] = ()
        self._batch_at = 0
        self._batch_seen: set[str] = set()
        self._topics: dict[tuple[str, str, str], str] = {}
        # topic -> what the pattern names of the first table sent there, and its (db, table, region)
        self._topic_owner: dict[str, tuple[tuple[str | None, ...], tuple[str, str, str]]] = {}
        # a topic name with its '.' made '_' -> the first topic of that form and its (db, table, region)
        self._topic_alike: dict[str, tuple[str, tuple[str, str, str]]] = {}
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
        # not transactional: a batch's delivery (the flush) is waited for in settle(), after the next batch was
        # read, encoded and produced (senders/base.py defer_settle); a transactional batch commits in send()
        self.defer_settle = not self.transactional
        self._unsettled: list[Txn] = []  # what send() handed over since the last settle()
        # topic -> the partition count this sender hashes its keys over (kept in the checkpoint: position_state),
        # read from the checkpoint's copy when first needed; and topic -> the count the broker says, where more
        self._pins: dict[str, int] | None = None
        self.partitions_raised: dict[str, int] = {}
        # the messages the producer could not deliver (Marks.gaps), for the checkpoint (ack_state): set by the
        # sender's thread, read by the checkpoint's; the checkpoint's own are taken at the first open()
        self._gaps: list[list[Any]] = []
        self._gaps_loaded = False
        # what the broker says of the topics (DescribeConfigs, when first written with a producer): each one's
        # max.message.bytes, the compacted ones; the largest record batch the producer makes (None: the client's)
        self._topic_limit: dict[str, int] = {}
        self._compact: set[str] = set()
        self._truncate_skipped: set[str] = set()
        self._batch_cap: int | None = None
        self._described: set[str] = set()  # topics whose settings were asked this run
        self._waiting: tuple[float, str] | None = None  # (since, what) while the sender waits at the broker
        self._said_before: object = None  # what the client had said last when the wait began

    @staticmethod
    def check_options(opts: dict[str, Any], where: Callable[[str], str]) -> None:
        """At config time: the SASL and TLS keys (capturer/util/kafkasec.py)."""
        check_security(opts, where)

    def status(self) -> dict[str, Any]:
        st = super().status()
        st.update({"messages": self.messages, "client": self.options["client"], "format": self.fmt,
                   "skipped": self.marks.skipped, "read_back_given_up": sorted(self.read_back_given_up)})
        st.update(self._waiting_status())
        if self.partitions_raised:  # topics written over fewer partitions than they have (see _pin)
            pins = self._pins or {}
            st["partitions_kept"] = {t: [pins.get(t, n), n] for t, n in sorted(self.partitions_raised.items())}
        return st

    def pending_state(self) -> dict[str, Any] | None:
        """The messages a producer of this run could not deliver while later ones of their partitions may
        have got through (``gaps``, Marks.gaps), kept by the checkpoint whether or not a batch was acknowledged
        since: a run stopped by a message the broker refuses (too large for the topic) leaves the messages
        after it in Kafka, and the next run must write it again rather than skip it on the strength of those
        (it would be lost). None until the checkpoint's own gaps were taken (the first open())."""
        return {"gaps": self._gaps} if self._gaps_loaded else None

    def open(self) -> None:
        if not self._gaps_loaded:
            self._gaps_loaded = True
            self.marks.add_gaps((self.resume_state or {}).get("gaps"))
            self._gaps = self.marks.gaps()
        self.client = self._new_client(self.options["servers"])
        # a new producer: every topic's partitions are read back before its first message
        self._parts = {}

    def _new_client(self, servers: str) -> Client:
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

    def _new_client_watched(self, servers: str, watch: Watch) -> Client:
        try:
            if self.options["client"] == "confluent":
                try:
                    import confluent_kafka  # noqa: F401
                except ImportError:
                    raise SinkError("client=confluent needs confluent-kafka: "
                                    ".venv/bin/pip install confluent-kafka", retriable=False) from None
                return ConfluentClient(servers, self.options, watch)
            try:
                import kafka  # noqa: F401
            except ImportError:
                raise SinkError("client=kafka-python needs the project's 'kafka' extra: "
                                ".venv/bin/pip install -e '.[kafka]' (start.sh installs it)",
                                retriable=False) from None
            return KafkaPythonClient(servers, self.options)
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
        self._unsettled = []  # (a retry hands every batch not acknowledged to send() again)
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
            self._gaps = self.marks.gaps()

    def topic_for(self, db: str, table: str, region: str) -> str:
        hit = self._topics.get((db, table, region))
        if hit is None:
            pattern = self.options["topic"]
            t = pattern.replace("{db}", db).replace("{table}", table).replace("{region}", region)
            hit = _TOPIC_BAD.sub("_", t)[:249]
            # what the pattern names: two of those on one topic only by the characters a topic cannot have
            # (made "_") or the cut at 249, or by a dot in a name ("a.b" + "c", "a" + "b.c"), would put two
            # tables' rows under the same keys in one topic (a compacted topic keeps one of them)
            owner = tuple(v if f"{{{k}}}" in pattern else None for k, v in (("db", db), ("table", table),
                                                                             ("region", region)))
            other, first = self._topic_owner.setdefault(hit, (owner, (db, table, region)))
            if other != owner:
                names = [f"{quote_ident(d)}.{quote_ident(t)} (region {r})" for d, t, r in (first, (db, table, region))]
                raise SinkError(f"sender {self.name}: {names[0]} and {names[1]} would both go to Kafka topic {hit!r} "
                                f"(topic = {pattern}: a topic name keeps only a-z A-Z 0-9 . _ -, at most 249 of them), "
                                "where their rows would share keys; rename or exclude one of the tables, or use a "
                                "topic pattern that keeps them apart", retriable=False)
            # Kafka refuses a topic whose name differs from an existing one's only by '.' against '_' (its
            # metrics names do not tell them apart): said here, naming both tables, rather than retried for good
            alike, seen = self._topic_alike.setdefault(hit.replace(".", "_"), (hit, (db, table, region)))
            if alike != hit:
                names = [f"{quote_ident(d)}.{quote_ident(t)} (region {r})" for d, t, r in (seen, (db, table, region))]
                raise SinkError(f"sender {self.name}: {names[0]} and {names[1]} go to Kafka topics {alike!r} and "
                                f"{hit!r} (topic = {pattern}), which Kafka cannot have both of: it takes '.' and '_' "
                                "in topic names for the same (its metrics names), and refuses the second ('collides "
                                "with existing topic'); rename or exclude one of the tables, or use a topic pattern "
                                "that keeps them apart", retriable=False)
            if len(self._topics) > 100_000:
                self._topics.clear()
            self._topics[(db, table, region)] = hit
        return hit

    def _partitions(self, topic: str) -> int:
        """The partition count of ``topic`` (created if missing); the first time with this
        producer, after reading its partitions' marks back: together with every other topic
        the rest of the batch in hand goes to that this producer has not written yet (one
        read of them all, ``_prepare``)."""
        n = self._parts.get(topic)
        if n is None:
            self._prepare(topic)
            n = self._parts[topic]
        return n

    def _prepare(self, topic: str) -> None:
        """Make ``topic`` ready for this producer (its partitions known, created if missing, its
        marks read back), and with it the other topics the rest of the batch in hand writes to for
        the first time: their marks read back in one go (``read_marks_of``: one consumer for all of
        their partitions), not one topic after another, each costing a consumer's first fetch
        (~0.5 s a topic: with tens of tables a snapshot restarted by kill -9 every few seconds was
        killed again before its first batch was acknowledged, and copied its tables again and
        again). The other topics are found only here, when a topic is new to the producer (at
        start, after a failed batch, a new table): nothing is looked at per row otherwise."""
        assert self.client is not None
        client = self.client
        topics = [topic]
        if topic not in self._batch_seen and self.options["read_back"]:
            topics += [t for t in self._batch_topics() if t != topic and t not in self._parts
                       and t not in self._batch_seen]
        self._batch_seen.update(topics)
        partitions_of = getattr(client, "partitions_of", None)
        counts = partitions_of(topics) if partitions_of is not None else {t: client.partitions(t) for t in topics}
        missing = [t for t, n in counts.items() if n == 0]
        created: set[str] = set()  # topics this sender made now: empty, no count kept for them holds
        if missing and not self.options["create_topics"]:
            if counts[topic] == 0:
                raise SinkError(f"topic {topic!r} does not exist and create_topics = false "
                                f"in [{self.name}]: create the topic on the broker (kafka-topics.sh --create "
                                f"--topic {topic}), or set create_topics = true", retriable=False)
            for t in missing:  # (said when it is written to: a TRUNCATE of a table with no topic is not sent)
                del counts[t]
        elif missing:
            created = set(missing)
            for t in missing:
                try:
                    self.client.create_topic(t, self.options["partitions"], self.options["replication_factor"])
                except Exception as exc:
                    if _invalid_topic(exc):  # refused for its name: every attempt would be
                        raise SinkError(f"sender {self.name}: Kafka refuses to create topic {t!r} ({exc}): a name "
                                        "that differs from an existing topic's only by '.' against '_' collides "
                                        "with it; rename or exclude the table, delete the other topic, or change "
                                        f"topic = {self.options['topic']}", retriable=False) from None
                    raise
            deadline = time.monotonic() + 15
            while missing and time.monotonic() < deadline:
                time.sleep(0.1)
                for t in missing:
                    counts[t] = client.partitions(t)
                missing = [t for t in missing if counts[t] == 0]
            if counts[topic] == 0:
                raise SinkError(f"topic {topic!r} was created but has no partitions yet")
            for t in missing:  # (tried again when written to)
                del counts[t]
        self._pin(counts, created)
        for t in counts:
            client.learn(t)
        self._read_back_all(counts)

    def _settings_after_refusal(self, batch: list[Txn], exc: BaseException) -> None:
        """A batch the broker refused (too large: MSG_SIZE_TOO_LARGE; INVALID_RECORD, e.g. a message without
        a key to a compacted topic): the settings of the topics it writes that were not read yet this run
        (DescribeConfigs, only now: nothing is asked while batches go through), and a retriable error when
        they explain it (``_learn_settings``): the retry makes smaller batches, leaves a TRUNCATE out of a
        compacted topic, or stops naming a keyless table there."""
        low = str(exc).lower()
        if not (_too_large(low) or "invalid_record" in low or "invalidrecord" in low
                or "failed to validate record" in low):
            return
        topics: dict[str, None] = {}
        for txn in batch:
            d = txn.ddl
            if d is not None:
                if is_truncate(d):
                    self._add_topic(topics, d.db, d.table, txn.region)
                continue
            for part in _slices(txn.changes, SLICE_ROWS):
                for schema in {id(ch.schema): ch.schema for ch in part}.values():
                    self._add_topic(topics, schema.db, schema.table, txn.region)
        ask = [t for t in topics if t not in self._described]
        if not ask:
            return
        self._described.update(ask)  # (asked once a run)
        settings = topic_settings(self.options["servers"], self.options, ask, ("max.message.bytes", "cleanup.policy"))
        compact = set(self._compact)
        self._learn_settings(settings)  # (raises when the batches must be smaller)
        if self._compact - compact:
            raise SinkError(f"sender {self.name}: topic(s) {sorted(self._compact - compact)} are compacted "
                            f"(cleanup.policy=compact), which refuses messages without a key ({exc})")

    def _learn_settings(self, settings: dict[str, dict[str, str]]) -> None:
        """The topics' max.message.bytes and cleanup.policy, as the broker says them (left as they were
        where it does not: no DescribeConfigs right, no confluent-kafka). A topic that takes record batches
        smaller than the producer makes (e.g. created with max.message.bytes = 64 KB): every batch of
        small rows would be refused as too large (MSG_SIZE_TOO_LARGE: the sender stopped, naming a row that
        fits); the producer is made again (a retriable error) with batches no bigger than the topic takes."""
        need: tuple[int, str, int] | None = None  # (cap, topic, its limit)
        largest = self._batch_cap or _BATCH_BYTES.get(self.options["client"], 1_000_000)
        for t, conf in settings.items():
            if "compact" in conf.get("cleanup.policy", ""):
                self._compact.add(t)
            else:
                self._compact.discard(t)
            try:
                limit = int(conf["max.message.bytes"])
            except (KeyError, ValueError):
                continue
            self._topic_limit[t] = limit
            cap = max(limit - _BATCH_FRAMING, 1024)
            if cap < largest and (need is None or cap < need[0]):
                need = (cap, t, limit)
        if need is not None:
            cap, t, limit = need
            self._batch_cap = cap
            self.options = {**self.options, "_batch_cap": cap}
            log.warning("sender %s: topic %s takes record batches of at most %d bytes (max.message.bytes): the "
                        "producer is made again with batches of at most %d bytes", self.name, t, limit, cap)
            raise SinkError(f"sender {self.name}: topic {t!r} takes record batches of at most {limit} bytes "
                            f"(max.message.bytes), less than the producer's batches: made again with batches of at "
                            f"most {cap} bytes")

    def _pin(self, counts: dict[str, int], created: Collection[str] = ()) -> None:
        """The partition count each topic of ``counts`` is written with, in place of the broker's: the one
        this sender hashed the topic's keys over before, as long as the broker's is not lower. A topic's
        partitions raised (``kafka-topics --alter --partitions``) would move half of the keys to other
        partitions: a consumer could read a key's newer change before its older one (in the partition it
        left), and a restart after kill -9 would write what it replays from the checkpoint into other
        partitions than those that hold it, where the read-back finds no mark of it: twice. So the count
        first seen is kept (in the checkpoint, ``position_state``): every key stays in its partition, in
        order, once; the new partitions stay empty (shown in the status, ``partitions_kept``). A count
        lower than the one kept (the topic deleted and made again) is taken as it is, and so is the count
        of a topic this sender has just made (``created``: deleted, made again with ``partitions``: empty)."""
        pins = self._pins
        if pins is None:
            kept = (self.resume_state or {}).get("partitions")
            pins = self._pins = {str(t): int(n) for t, n in kept.items()} if isinstance(kept, dict) else {}
            self.position_state = {**(self.position_state or {}), "partitions": dict(pins)}
        changed = False
        for t, n in counts.items():
            was = pins.get(t)
            if t in created and was is not None and was != n:
                log.warning("sender %s: topic %s made again with %d partitions (its keys were hashed over %d): "
                            "hashed over %d from now on", self.name, t, n, was, n)
                was = None
            if was is None or n < was:
                if was is not None:
                    log.warning("sender %s: topic %s has %d partitions, fewer than the %d its keys were hashed "
                                "over (deleted and made again?): hashed over %d from now on, and nothing of it "
                                "skipped until a batch is acknowledged", self.name, t, n, was, n)
                    # the keys moved: a partition's mark says nothing of the messages hashed to it now (a
                    # message that failed in another partition is below the mark of the one it goes to now)
                    for p in range(n):
                        self.marks.failed((t, p), None)
                pins[t] = n
                changed = True
                self.partitions_raised.pop(t, None)
            elif n > was:
                counts[t] = was
                if self.partitions_raised.get(t) != n:
                    log.warning("sender %s: topic %s has %d partitions now; its keys stay hashed over the %d "
                                "they were written to (each key in its partition, in order; nothing written "
                                "twice after a crash), the new partitions get nothing (docs/senders.md: "
                                "partitions raised)", self.name, t, n, was)
                self.partitions_raised[t] = n
        if changed:
            self.position_state = {**(self.position_state or {}), "partitions": dict(pins)}

    def _batch_topics(self) -> list[str]:
        """The topics the rest of the batch in hand (from the transaction in hand on) writes to,
        in the order it first does (a spilled transaction's tables are not looked for: that
        would read it from disk; its topics are prepared as they come)."""
        out: dict[str, None] = {}
        txn_topic, schema_topic = self.options["txn_topic"], self.options["schema_topic"]
        for txn in self._batch[self._batch_at:]:
            d = txn.ddl
            if d is not None:
                if txn_topic:
                    out[txn_topic] = None
                if schema_topic:
                    out[schema_topic] = None
                if is_truncate(d):
                    self._add_topic(out, d.db, d.table, txn.region)
                continue
            changes = txn.changes
            if not changes:
                continue
            if txn_topic:
                out[txn_topic] = None
            if isinstance(changes, SpilledChanges):
                continue
            for schema in {id(ch.schema): ch.schema for ch in changes}.values():
                self._add_topic(out, schema.db, schema.table, txn.region)
        return list(out)

    def _add_topic(self, out: dict[str, None], db: str, table: str, region: str) -> None:
        try:
            out[self.topic_for(db, table, region)] = None
        except SinkError:
            pass  # (two tables on one topic: said when the second one is written)

    def _read_back(self, topic: str, partitions: int) -> None:
        """``_read_back_all`` of one topic."""
        self._read_back_all({topic: partitions})

    def _read_back_all(self, topics: dict[str, int]) -> None:
        """Learn what the partitions of ``topics`` (each with its partition count) hold of this
        sender's messages (their last message's key), before this producer writes to them (even a
        topic just created: another writer may have been quicker, and an empty topic costs one
        ListOffsets); every topic read, or given up on (READ_BACK_GIVE_UP), is ready for the producer.
        A topic that cannot be read back raises (the first such topic's error), as it did alone."""
        client = self.client
        if not self.options["read_back"] or client is None or getattr(client, "last_records", None) is None:
            self._parts.update(topics)
            return
        t0 = time.monotonic()
        read_of = getattr(client, "last_records_of", None) or per_topic(client.last_records)
        offsets_of = getattr(client, "offsets_of", None) or per_topic_offsets(client.offsets)
        marks: dict[str, dict[int, MsgKey]] = {}
        errors: dict[str, Exception] = {}  # topic -> the error it raises (failed_with: what the read said)
        names = list(topics)
        with self._waiting_for(f"the read-back of the last messages of {len(names)} topic(s)"):
            for i in range(0, len(names), READ_BACK_TOPICS):
                part = {t: topics[t] for t in names[i:i + READ_BACK_TOPICS]}
                got, failed = read_marks_of(part, offsets_of, read_of, READ_BACK_TIMEOUT + len(part) - 1)
                marks.update(got)
                errors.update(failed)
        took = time.monotonic() - t0
        failed_with = dict(errors)
        for topic, parts in topics.items():
            exc = errors.get(topic)
            if exc is not None:
                err = exc if isinstance(exc, SinkError) else \
                    SinkError(f"topic {topic!r}: cannot read its last messages back: {exc}")
                n = self.read_back_failures[topic] = self.read_back_failures.get(topic, 0) + 1
                if n < READ_BACK_GIVE_UP or not err.retriable:
                    errors[topic] = err
                    continue
                log.error("sender %s: topic %s could not be read back %d times in a row (%s): writing to it "
                          "without skipping what it may hold already; what reached it after the last checkpoint "
                          "may be there twice (identified by the region, commit_ts and seq headers)",
                          self.name, topic, n, err)
                self.read_back_given_up.add(topic)
                del errors[topic]
                self._parts[topic] = parts
                continue
            self.read_back_failures.pop(topic, None)
            before = len(self.marks.limits)
            self.marks.learn(topic, marks.get(topic, {}), self._txn_key)
            if len(self.marks.limits) != before or log.isEnabledFor(logging.DEBUG):
                log.info("sender %s: topic %s read back in %.2fs%s: %d of %d partitions hold messages of the stream "
                         "from %s on (those are not sent again)", self.name, topic, took,
                         f" (with {len(topics) - 1} other topics)" if len(topics) > 1 else "",
                         sum(1 for tp in self.marks.limits if tp[0] == topic), parts, list(self._txn_key))
            self._parts[topic] = parts
        for topic, why in errors.items():
            exc = failed_with[topic]
            if why is exc:
                raise why
            raise why from exc

    def send(self, batch: list[Txn]) -> None:
        if self.client is None:
            self.open()
        assert self.client is not None
        sent = 0
        try:
            if self.transactional:
                self.client.begin()
            guard = f"sender {self.name}"
            self._batch, self._batch_seen = batch, set()
            try:
                for self._batch_at, txn in enumerate(batch):
                    # high availability: the lease before each transaction (and each slice of rows), not only
                    # before the batch: a capturer paused in the middle of a batch produces nothing more once it
                    # runs again past its lease (what the client library held before the pause may still go out)
                    fencing.check(guard)
                    sent += self._send_txn(txn)
            finally:
                self._batch = ()
            if self.settle_later:  # delivered by settle() (what it waits for is the next batch's overlap)
                self.messages += sent
                self._unsettled.extend(batch)
                return
            self._flush_or_raise(self.client)
            if self.transactional:
                if sent:
                    failpoints.hit("kafka.commit")
                # high availability: a capturer deposed while its transaction was open (paused past its lease)
                # must not commit it before the new active's init_transactions has fenced it at the broker
                fencing.check(f"sender {self.name}")
                with self._waiting_for("the broker's commit of the batch's Kafka transaction"):
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
        self._batch_done()

    def settle(self) -> None:
        """Wait until every message produced so far is acknowledged by the broker (the batches
        ``send`` handed over with ``settle_later``); SinkError if not, with a fresh producer for
        the retry, as a failed ``send``."""
        batch, self._unsettled = self._unsettled, []
        if self.client is None:
            return
        try:
            self._flush_or_raise(self.client)
        except Exception as exc:
            self.close()  # a fresh producer for the retry (what was not delivered is marked failed)
            self._raise_if_too_large(batch, exc)
            raise exc if isinstance(exc, SinkError) else SinkError(f"produce failed: {exc}") from exc
        self._batch_done()

    def _batch_done(self) -> None:
        self.marks.batch_done(self._txn_key)
        if self._gaps:
            self._gaps = self.marks.gaps()
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
        self._settings_after_refusal(batch, exc)
        if not _too_large(str(exc).lower()):
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
        known = self._topic_limit.get(topic)
        if known is not None and size < known - _BATCH_FRAMING and limit >= known:
            raise SinkError(f"a record batch bigger than topic {topic!r} takes (max.message.bytes = {known}) though "
                            f"its largest message is about {size} bytes: {exc}") from None
        raise SinkError(
            f"a row of table {table} (key {shown or '(none)'}) is a message of about {size} bytes, "
            f"more than Kafka takes: the producer's limit is max_message_bytes = {limit} (in [{self.name}]), and "
            f"topic {topic!r} may have a lower max.message.bytes on the broker (its default is the broker's "
            f"message.max.bytes, 1048588): raise both, or keep such rows out with the filter; the sender stops "
            f"rather than drop it ({exc})", retriable=False) from None

    def _flush_or_raise(self, client: Client) -> None:
        with self._waiting_for("the broker's acknowledgement of the messages produced"):
            errors = client.flush(60)
        if errors:
            raise SinkError(f"{len(errors)} messages not acknowledged, e.g. {errors[0]}")

    @contextlib.contextmanager
    def _waiting_for(self, what: str) -> Iterator[None]:
        """While inside, the status says the sender waits for ``what`` (after WAIT_SHOWN s)."""
        texts = getattr(getattr(self.client, "watch", None), "texts", None)
        self._said_before = texts[-1] if texts else None
        self._waiting = (time.monotonic(), what)
        try:
            yield
        finally:
            self._waiting = None

    #: a wait at the broker longer than this is shown as what the sender waits for
    WAIT_SHOWN = 1.0

    def _waiting_status(self) -> dict[str, Any]:
        """``waiting_for``/``waiting_seconds`` (as every sender that can hang shows them): what the sender has
        waited for at the broker for WAIT_SHOWN s or more (a broker down or unreachable: the acknowledgement
        of the messages produced, a read-back, a commit), with what the client last said about it (e.g.
        'Connect to ... failed: Connection refused')."""
        waiting = self._waiting  # (one read: the sender's thread replaces it)
        if waiting is None or time.monotonic() - waiting[0] < self.WAIT_SHOWN:
            return {"waiting_for": None, "waiting_seconds": None}
        what = f"{waiting[1]} (servers {self.options['servers']})"
        watch = getattr(self.client, "watch", None)
        texts = getattr(watch, "texts", None)
        if texts:
            try:
                said = texts[-1]
            except IndexError:
                said = None
            if said is not None and said is not self._said_before:  # (said during this wait)
                what += f"; the client says: {said}"
        return {"waiting_for": what, "waiting_seconds": round(time.monotonic() - waiting[0], 1)}

    def _headers(self, txn: Txn, seq: int, op: str) -> list[tuple[str, bytes]]:
        return [("region", txn.region.encode()), ("commit_ts", str(txn.commit_ts).encode()),
                ("seq", str(seq).encode()), ("op", _OP_BYTES.get(op) or op.encode())]

    def _put(self, client: Client, topic: str, part: int, key: bytes | None, value: bytes | None,
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
                if table_topic in self._compact:
                    # its event has no key, which a compacted topic refuses (as Debezium's users skip it there)
                    if table_topic not in self._truncate_skipped:
                        self._truncate_skipped.add(table_topic)
                        log.warning("sender %s: TRUNCATE of %s.%s not sent to %r: the topic is compacted "
                                    "(cleanup.policy=compact), which refuses a message without a key (the schema "
                                    "topic and txn_topic have it); said once a topic", self.name, d.db, d.table,
                                    table_topic)
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

    def _send_rows(self, txn: Txn, client: Client,
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
            if seq0:
                fencing.check(f"sender {self.name}")  # (a big transaction: at every slice; see send)
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
            if self._compact:
                self._keyless_to_compacted(msgs, part, seq0)
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

    def _keyless_to_compacted(self, msgs: list[Message], part: Sequence[RowChange], seq0: int) -> None:
        """A message without a key (a row of a table without a primary key) to a compacted topic, which Kafka
        refuses (INVALID_RECORD, retried for good before): a fatal error naming the table and the topic."""
        compact = self._compact
        for m in msgs:
            if m[2] is None and m[0] in compact and m[3] is not None:
                ch = part[int(m[4][2][1]) - seq0]
                raise SinkError(f"sender {self.name}: table {quote_ident(ch.db)}.{quote_ident(ch.table)} has no "
                                f"primary key, so its rows are messages without a key, and topic {m[0]!r} is "
                                "compacted (cleanup.policy=compact), which refuses those: give the table a primary "
                                "key, exclude it with the filter, or send it to a topic that is not compacted",
                                retriable=False)

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
