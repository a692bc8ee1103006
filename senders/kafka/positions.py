"""Where the Kafka sender stands in each partition, read from the partitions
themselves, so that nothing is written twice after a crash or a failed batch.

**Message keys.** Every message the sender writes has a key in one total order,
made from its identity headers (``region``, ``commit_ts``, ``seq``, ``op``) and
whether its value is null (a tombstone carries its delete's headers)::

    (commit_ts, region, sub, pos, rank)

``(commit_ts, region, sub)`` is the transaction's stream key; ``pos`` is the
row's ``seq`` (-1 for the ``BEGIN`` record of ``txn_topic``, ``END_POS`` for its
``END``, 0 for a DDL or TRUNCATE message, whose ``sub`` is ``min(seq, 0)``);
``rank`` orders one row's messages: a delete (0), its tombstone (1), then the
create, update or read (2) (a key change is a delete and a create); a DDL
message 0, a TRUNCATE 1. The sender writes every message in increasing key order
(transactions come in stream-key order, rows in seq order), so **each partition
receives its messages in increasing key order**.

**A partition's mark.** Within a partition Kafka keeps what one producer wrote in
the order it was written (confluent: idempotent; kafka-python: one request in
flight), and what a crash or a failed batch leaves there is a prefix of what was
sent to it (kafka-python: a request its own retry wrote twice appears twice, the
copies next to each other: still no message newer than the last one). So the key
of a partition's last message (its *mark*) tells exactly what it holds: every
message of the sender for that partition with a key at or below the mark is
there, nothing above it is. The sender reads the marks of a topic's partitions
(``read_marks``) before it first writes to the topic with a new producer (at
start, and after every failed batch), and drops every message whose key is at or
below the mark of *its* partition (``Marks``).

This assumes one writer per partition: the sender's topics are written by it
alone. A last message without identity headers gives no mark (nothing skipped in
that partition); another capturer's messages, with the same headers, would be
taken for this sender's (``read_back=false`` for shared topics).

A failure the producer reports for one message (e.g. a record the broker
refuses) can leave a gap: later messages of that partition may be there while
it is not. The sender remembers every failed message's key for the run (until a
batch succeeds) and never skips at or above it, whatever the mark says: the
messages from the failed one on are written again (perhaps twice, never lost).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from capturer.errors import SinkError
from capturer.model import StreamKey

log = logging.getLogger(__name__)

MsgKey = tuple[int, str, int, int, int]
"""``(commit_ts, region, sub, pos, rank)``: a message's place in what the sender writes."""

Partition = tuple[str, int]
"""``(topic, partition)``"""

END_POS = 1 << 62
"""``pos`` of a transaction's ``END`` record (after every row)."""

# rank of a row's message by its op header (a tombstone: 1)
_RANK = {b"d": 0, b"c": 2, b"u": 2, b"r": 2}


def row_key(commit_ts: int, region: str, seq: int, op: bytes, null: bool) -> MsgKey:
    """The key of a row's message (``op`` the header's value; ``null``: a tombstone)."""
    return (commit_ts, region, 0, seq, 1 if null else _RANK.get(op, 2))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def message_key(headers: Iterable[tuple[str, Any]] | None, null: bool) -> MsgKey | None:
    """A message's key from its headers (and whether its value is null); None for a
    message without the sender's identity headers (not written by this sender)."""
    h: dict[str, Any] = {}
    for k, v in headers or ():
        h[k] = v
    try:
        region, commit_ts, seq, op = _text(h["region"]), int(h["commit_ts"]), int(h["seq"]), h["op"]
    except (KeyError, TypeError, ValueError, UnicodeDecodeError):
        return None
    op = op.encode() if isinstance(op, str) else bytes(op)
    if op == b"begin":
        return (commit_ts, region, 0, -1, 0)
    if op == b"end":
        return (commit_ts, region, 0, END_POS, 0)
    if op == b"ddl":
        return (commit_ts, region, min(seq, 0), 0, 0)
    if op == b"t":
        return (commit_ts, region, min(seq, 0), 0, 1)
    return row_key(commit_ts, region, seq, op, null)


class Marks:
    """The partitions whose mark is not behind the transaction in hand: each with the
    limit up to which its messages are dropped. Cheap once the replayed part is past:
    ``limits`` is empty then, and the sender checks nothing per message.

    * ``learn(topic, marks, txn_key)`` after reading a topic's marks;
    * ``at(txn_key)`` before each transaction (drops every limit below it);
    * ``keep(partition, key)`` for a message to write (a kept one ends its partition's limit);
    * ``failed(partition, key)`` for a message the producer could not deliver;
      ``batch_done()`` once a whole batch is acknowledged (forgets the failures).
    """

    def __init__(self) -> None:
        # partition -> (limit, inclusive): drop a message whose key is <= limit (< limit if not inclusive)
        self.limits: dict[Partition, tuple[MsgKey, bool]] = {}
        self.top: StreamKey | None = None  # the greatest transaction key of a limit
        self._failed: dict[Partition, MsgKey] = {}
        # partitions of failures no read-back has applied since (kept until one has: a batch that did not
        # write to the topic says nothing of the gap)
        self._unread: set[Partition] = set()
        self.skipped = 0  # messages dropped since the sender started

    def learn(self, topic: str, marks: dict[int, MsgKey], txn_key: StreamKey) -> None:
        """A topic's partition marks, read back before the first message to it from
        the transaction ``txn_key`` on (they replace what an earlier read said of the
        topic). Marks below that transaction are no use."""
        for tp in [tp for tp in self.limits if tp[0] == topic]:
            del self.limits[tp]
        for tp in [tp for tp in self._unread if tp[0] == topic]:
            self._unread.discard(tp)
        for part, mark in marks.items():
            tp = (topic, part)
            limit, inclusive = mark, True
            bad = self._failed.get(tp)
            if bad is not None and bad <= mark:
                limit, inclusive = bad, False  # a possible gap: write again from the failed message on
            if limit[:3] < txn_key:
                continue
            self.limits[tp] = (limit, inclusive)
            if self.top is None or limit[:3] > self.top:
                self.top = limit[:3]

    def at(self, txn_key: StreamKey) -> None:
        """Before the messages of the transaction ``txn_key``."""
        if self.top is not None and txn_key > self.top:
            self.limits.clear()
            self.top = None

    def keep(self, tp: Partition, key: MsgKey) -> bool:
        """False: the partition ``tp`` holds the message ``key`` already (drop it)."""
        lim = self.limits.get(tp)
        if lim is None:
            return True
        limit, inclusive = lim
        if key < limit or (inclusive and key == limit):
            self.skipped += 1
            return False
        del self.limits[tp]  # the rest of this partition's messages come after it
        return True

    def failed(self, tp: Partition, key: MsgKey | None) -> None:
        """The producer could not deliver the message ``key`` to ``tp`` (None: a
        message of unknown identity: nothing of ``tp`` is skipped any more this run)."""
        low = (-1, "", 0, 0, 0) if key is None else key
        old = self._failed.get(tp)
        if old is None or low < old:
            self._failed[tp] = low
        self._unread.add(tp)

    def batch_done(self, upto: StreamKey | None = None) -> None:
        """A batch was acknowledged whole: everything sent so far is in Kafka. ``upto``: the key of the
        last transaction sent; a failure above it (one the checkpoint kept from an earlier run, see
        ``gaps``) is not written again yet, and stays."""
        if upto is None:
            self._failed.clear()
            self._unread.clear()
        else:
            for tp in [tp for tp, k in self._failed.items() if k[:3] <= upto and tp not in self._unread]:
                del self._failed[tp]

    def gaps(self) -> list[list[Any]]:
        """The failures remembered, as the checkpoint keeps them: ``[[topic, partition, key...]]``."""
        return [[t, p, *k] for (t, p), k in sorted(self._failed.items())]

    def add_gaps(self, gaps: Any) -> None:
        """The failures the checkpoint kept (``gaps``), remembered as the producer's own: what a
        stopped run could not deliver is written again, even where later messages got through."""
        for g in gaps if isinstance(gaps, list) else ():
            try:
                t, p, ts, region, sub, pos, rank = g
                self.failed((str(t), int(p)), (int(ts), str(region), int(sub), int(pos), int(rank)))
            except (TypeError, ValueError):
                log.warning("a Kafka gap the checkpoint kept is not understood: %r", g)


# --- reading a partition's last message -------------------------------------------------

Record = tuple[Any, bool]
"""``(headers, value is null)`` of a message read back."""


ReadOf = Callable[[dict[Partition, int], float, Collection[Partition]],
                  tuple[dict[Partition, Record], dict[str, Exception]]]
"""``read(starts, timeout, patient)`` of ``read_marks_of``: partitions of any topics read at once
(one consumer), each from its start offset to its end: the last message read of each, and what went
wrong per topic (a topic in the errors counts as not read: its partitions' records are not used)."""


def read_marks(
    topic: str,
    partitions: Sequence[int],
    offsets: Callable[[str, Sequence[int]], dict[int, tuple[int, int]]],
    read: Callable[[str, dict[int, int], float, Collection[int]], dict[int, Record]],
    timeout: float = 60.0,
) -> dict[int, MsgKey]:
    """The key of the last message of each non-empty partition of ``topic``.

    ``offsets(topic, parts)`` gives each partition's ``(low, high)`` offsets from
    the broker (ListOffsets); ``read(topic, {part: start}, timeout)`` reads each
    partition from ``start`` to its end, the end being the high watermark of the
    fetch responses, and gives the last message read of each.

    ``high`` is only the start of the read: the read itself goes to the true end.
    A real broker's ``high`` is the end, so the read starts at the last message;
    Tansu's is the base offset of the partition's last record batch + 1 after
    batched sends, so the read starts at that batch's first record (one batch per
    partition is read either way). A partition where nothing is found from there
    (e.g. control records at the end, or a broker that answers nothing from there)
    is read again from further back: 16, 256, 4096... records, down to ``low``. A partition whose last message has no identity headers
    (another producer's) gets no mark (a warning): nothing is skipped there.
    Raises a retriable SinkError when the reading takes longer than ``timeout``.

    No offsets are kept in the checkpoint (``position_state``) for this: the start
    above is at most one record batch before the end on either broker, while the
    offsets of the last acknowledged batch would be up to a checkpoint interval
    behind, and learning them would cost a delivery report per message (the
    confluent producer reports failures only, for speed).

    ``read_marks_of`` does the same for several topics at once (what the sender uses);
    this is its one-topic face."""
    marks, errors = read_marks_of({topic: len(partitions)}, per_topic_offsets(offsets), per_topic(read), timeout,
                                  {topic: partitions})
    if topic in errors:
        raise errors[topic]
    return marks.get(topic, {})


def per_topic(read: Callable[[str, dict[int, int], float, Collection[int]], dict[int, Record]]) -> ReadOf:
    """A ``ReadOf`` made of a one-topic ``read(topic, starts, timeout, patient)`` called topic by topic
    (a client without a read of several topics at once: a test double); what it raises is that topic's
    error."""

    def read_of(starts: dict[Partition, int], timeout: float,
                patient: Collection[Partition]) -> tuple[dict[Partition, Record], dict[str, Exception]]:
        deadline = time.monotonic() + timeout
        by_topic: dict[str, dict[int, int]] = {}
        for (t, p), off in starts.items():
            by_topic.setdefault(t, {})[p] = off
        got: dict[Partition, Record] = {}
        errors: dict[str, Exception] = {}
        for t, parts in by_topic.items():
            try:
                recs = read(t, parts, max(deadline - time.monotonic(), 0.0), [p for p in parts if (t, p) in patient])
            except Exception as exc:
                errors[t] = exc
                continue
            got.update(((t, p), rec) for p, rec in recs.items())
        return got, errors

    return read_of


OffsetsOf = Callable[[dict[str, Sequence[int]]], tuple[dict[Partition, tuple[int, int]], dict[str, Exception]]]
"""``offsets({topic: partitions})`` of ``read_marks_of``: each partition's ``(low, high)`` offsets, and
the error of each topic whose offsets could not be listed."""


def per_topic_offsets(offsets: Callable[[str, Sequence[int]], dict[int, tuple[int, int]]]) -> OffsetsOf:
    """An ``OffsetsOf`` made of a one-topic ``offsets(topic, partitions)`` called topic by topic."""

    def offsets_of(topics: dict[str, Sequence[int]]) -> tuple[dict[Partition, tuple[int, int]],
                                                              dict[str, Exception]]:
        out: dict[Partition, tuple[int, int]] = {}
        errors: dict[str, Exception] = {}
        for topic, parts in topics.items():
            try:
                listed = offsets(topic, parts)
            except Exception as exc:
                errors[topic] = exc
                continue
            out.update(((topic, p), b) for p, b in listed.items())
        return out, errors

    return offsets_of


def read_marks_of(
    topics: dict[str, int],
    offsets: OffsetsOf,
    read: ReadOf,
    timeout: float = 60.0,
    partitions: dict[str, Sequence[int]] | None = None,
) -> tuple[dict[str, dict[int, MsgKey]], dict[str, Exception]]:
    """``read_marks`` of several topics at once (``topics``: each topic's partition count; ``partitions``:
    which of them, where not all): the partitions of every topic read together, in rounds (one
    ``read`` of every partition still to read each), so that N topics cost about what one does
    (0.5 s a topic one by one, measured with confluent-kafka on Apache Kafka: a fresh consumer's
    first fetch each). Returns each topic's marks and, apart, each topic that could not be read
    (its offsets not listed, a partition not read to its end in ``timeout``, a read error): the
    exception that says why, as ``read_marks`` raises it for the topic alone. One topic's failure
    does not touch what the others learn."""
    deadline = time.monotonic() + timeout
    try:
        bounds, errors = offsets({t: (partitions or {}).get(t, range(n)) for t, n in topics.items()})
    except Exception as exc:  # (not told per topic: every topic)
        bounds, errors = {}, dict.fromkeys(topics, exc)
    errors = dict(errors)
    starts = {tp: max(lo, hi - 1) for tp, (lo, hi) in bounds.items() if hi > lo}
    out: dict[str, dict[int, MsgKey]] = {t: {} for t in topics if t not in errors}
    back = dict.fromkeys(starts, 1)  # how far each partition steps back next time: x16 each time
    while starts:
        left = deadline - time.monotonic()
        if left <= 0:
            for t in sorted({tp[0] for tp in starts}):
                errors[t] = SinkError(f"the last messages of topic {t!r} were not read in {timeout:.0f}s")
            break
        try:
            got, failed = read(starts, left, [tp for tp, start in starts.items() if start <= bounds[tp][0]])
        except Exception as exc:  # (not told per topic: every topic of the read)
            got, failed = {}, dict.fromkeys({tp[0] for tp in starts}, exc)
        errors.update(failed)
        again: dict[Partition, int] = {}
        for tp, start in starts.items():
            topic, p = tp
            if topic in errors:
                continue
            rec = got.get(tp)
            if rec is not None:
                key = message_key(rec[0], rec[1])
                if key is None:
                    log.warning("topic %s partition %d: its last message has no identity headers (written by "
                                "another producer?): nothing already there is skipped in it", topic, p)
                else:
                    out[topic][p] = key
                continue
            lo = bounds[tp][0]
            if start > lo:
                # nothing from there: further back, a few record batches at a time, not at once from the
                # partition's start (a long read on a big partition); the start is where every broker serves
                back[tp] *= 16
                again[tp] = max(lo, start - back[tp])
        starts = again
    return {t: m for t, m in out.items() if t not in errors}, errors
