"""The Kafka sender's read-back and per-partition skipping (senders/kafka/positions.py),
without a broker: a fake client keeps each partition's log in memory (and lists its
offsets the way Tansu does after batched sends: the base offset of the last batch + 1)."""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from typing import Any

import pytest

from capturer.errors import SinkError
from capturer.model import Ddl, Position, RowChange, TableSchema, Txn, stream_key
from senders.kafka import sender as ks
from senders.kafka.positions import END_POS, Marks, message_key, read_marks, row_key
from senders.kafka.sender import KafkaSender

USERS = TableSchema("app", "users", ("id", "v"), ("id",))
PAIRS = TableSchema("app", "pairs", ("a", "b", "v"), ("a", "b"))
LOG = TableSchema("app", "log", ("msg",), ())  # keyless: one partition per table


class Crash(Exception):
    """The fake's way to stop a batch part way (a process killed, a failed produce)."""


class FakeKafka:
    """Partitions as lists of (key, value, headers). ``cut``: after that many messages
    produce raises (what was produced before stays: a prefix of the batch). ``lose``:
    messages of these partitions whose number is in the set are refused (reported as
    failures) while later ones are kept: a gap."""

    def __init__(self, logs: dict[tuple[str, int], list[Any]] | None = None, parts: int = 3):
        self.logs: dict[tuple[str, int], list[Any]] = logs if logs is not None else {}
        self.batches: dict[tuple[str, int], list[int]] = {}  # base offsets of the "record batches"
        self.parts = parts
        self.cut: int | None = None
        self.lose: set[int] = set()
        self.produced = 0
        self.failed: list[Any] = []
        self.reads = 0

    # producer
    def partitions(self, topic: str) -> int:
        return self.parts

    def create_topic(self, topic: str, partitions: int, replication: int) -> None:
        raise AssertionError("every topic exists")

    def learn(self, topic: str) -> None:
        pass

    def produce(self, topic: str, partition: int, key: Any, value: Any, headers: Any) -> None:
        self.produce_all([(topic, partition, key, value, headers)])

    def produce_all(self, messages: list[Any]) -> None:
        started: set[tuple[str, int]] = set()
        for topic, part, key, value, headers in messages:
            if self.cut is not None and self.produced >= self.cut:
                raise Crash(f"cut after {self.cut} messages")
            self.produced += 1
            if self.produced in self.lose:
                self.failed.append((topic, part, headers, value is None))
                continue
            log = self.logs.setdefault((topic, part), [])
            if (topic, part) not in started:
                self.batches.setdefault((topic, part), []).append(len(log))
                started.add((topic, part))
            log.append((key, value, headers))

    def flush(self, timeout: float) -> list[str]:
        return ["refused"] * len(self.failed) if self.failed else []

    def close(self) -> None:
        pass

    def failures(self) -> list[Any]:
        out, self.failed = self.failed, []
        return out

    # reading back
    def offsets(self, topic: str, partitions: Any) -> dict[int, tuple[int, int]]:
        out = {}
        for p in partitions:
            log = self.logs.get((topic, p), [])
            base = self.batches.get((topic, p), [0])[-1] if log else 0
            out[p] = (0, base + 1 if log else 0)  # Tansu's answer: the last batch's base + 1
        return out

    def last_records(self, topic: str, starts: dict[int, int], timeout: float,
                     patient: Any = ()) -> dict[int, Any]:
        self.reads += 1
        out = {}
        for p, start in starts.items():
            log = self.logs.get((topic, p), [])
            if len(log) > start:
                _k, value, headers = log[-1]
                out[p] = (headers, value is None)
        return out


def sender(client: FakeKafka, marks: Marks | None = None, **opts: Any) -> KafkaSender:
    options: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
    options.update({"servers": "127.0.0.1:9", "process": False, "tombstones": True, "txn_topic": "txns", **opts})
    s = KafkaSender("k", options)
    s._new_client = lambda servers: client  # type: ignore[method-assign]
    s.open()
    if marks is not None:
        s.marks = marks
    return s


def txn(region: str, ts: int, *changes: RowChange) -> Txn:
    return Txn(region, ts, Position("bin.000001", ts), tuple(changes))


def workload(seed: int, n: int = 40) -> list[Txn]:
    """Transactions of two regions in stream order: inserts, updates, key changes,
    deletes (tombstones), keyless rows, DDL, a TRUNCATE and a DDL prelude."""
    rng = random.Random(seed)
    out: list[Txn] = []
    ts = 1000
    for i in range(n):
        ts += rng.randrange(1, 3)
        region = rng.choice(["r1", "r2"])
        kind = rng.random()
        if kind < 0.05:
            out.append(Txn(region, ts, Position("b", ts), ddl=Ddl("app", f"ALTER TABLE users COMMENT '{i}'", "users")))
            continue
        if kind < 0.08:
            out.append(Txn(region, ts, Position("b", ts), ddl=Ddl("app", "TRUNCATE TABLE log", "log")))
            continue
        if kind < 0.11:  # a prelude: DDL at the transaction's commit_ts, seq -1, then the transaction
            out.append(Txn(region, ts, Position("b", ts), ddl=Ddl("app", "ALTER TABLE pairs ADD c INT", "pairs",
                                                                  seq=-1)))
        changes = []
        for _ in range(rng.randrange(1, 12)):
            r = rng.random()
            k = rng.randrange(20)
            if r < 0.3:
                changes.append(RowChange(USERS, "insert", None, {"id": k, "v": i}))
            elif r < 0.5:
                changes.append(RowChange(USERS, "update", {"id": k, "v": 0}, {"id": k, "v": i}))
            elif r < 0.6:
                changes.append(RowChange(USERS, "update", {"id": k, "v": 0}, {"id": k + 100, "v": i}))
            elif r < 0.7:
                changes.append(RowChange(USERS, "delete", {"id": k, "v": 0}, None))
            elif r < 0.85:
                changes.append(RowChange(PAIRS, "insert", None, {"a": k, "b": "x", "v": i}))
            else:
                changes.append(RowChange(LOG, rng.choice(["insert", "delete"]), {"msg": "m"}, {"msg": "m"}))
        out.append(txn(region, ts, *changes))
    assert [stream_key(t) for t in out] == sorted(stream_key(t) for t in out)
    return out


def batches(txns: list[Txn], size: int) -> list[list[Txn]]:
    return [txns[i:i + size] for i in range(0, len(txns), size)]


def identities(logs: dict[tuple[str, int], list[Any]]) -> Counter[Any]:
    return Counter((tp, message_key(h, v is None)) for tp, log in logs.items() for _k, v, h in log)


def reference(txns: list[Txn], size: int = 7) -> dict[tuple[str, int], list[Any]]:
    """What the partitions hold when everything goes well."""
    fk = FakeKafka()
    s = sender(fk)
    for b in batches(txns, size):
        s.send(b)
    return fk.logs


def strip(logs: dict[tuple[str, int], list[Any]]) -> dict[tuple[str, int], list[Any]]:
    """Logs without the json envelopes' ts_ms (when the message was sent)."""
    return {tp: [(k, h, v is None) for k, v, h in log] for tp, log in logs.items() if log}


# --- keys ---------------------------------------------------------------------------------

def test_message_keys_from_headers() -> None:
    def h(seq: int, op: str) -> list[tuple[str, bytes]]:
        return [("region", b"r1"), ("commit_ts", b"77"), ("seq", str(seq).encode()), ("op", op.encode())]

    assert message_key(h(3, "c"), False) == (77, "r1", 0, 3, 2)
    assert message_key(h(3, "d"), False) == (77, "r1", 0, 3, 0)
    assert message_key(h(3, "d"), True) == (77, "r1", 0, 3, 1)  # the tombstone after the delete
    assert message_key(h(0, "begin"), False) == (77, "r1", 0, -1, 0)
    assert message_key(h(0, "end"), False) == (77, "r1", 0, END_POS, 0)
    assert message_key(h(0, "ddl"), False) == (77, "r1", 0, 0, 0)
    assert message_key(h(-2, "ddl"), False) == (77, "r1", -2, 0, 0)  # a prelude: before the transaction
    assert message_key(h(-2, "t"), False) == (77, "r1", -2, 0, 1)
    assert message_key([("region", "r1"), ("commit_ts", "77"), ("seq", "3"), ("op", "u")], False) == row_key(
        77, "r1", 3, b"u", False)
    assert message_key(None, False) is None
    assert message_key([("region", b"r1"), ("commit_ts", b"x"), ("seq", b"0"), ("op", b"c")], False) is None
    assert message_key([("other", b"1")], False) is None


@pytest.mark.parametrize("c_encoder", [True, False])
def test_each_partition_gets_increasing_keys(monkeypatch: pytest.MonkeyPatch, c_encoder: bool) -> None:
    """What the read-back rests on: the messages of every partition are written in strictly
    increasing key order (the txn topic, the schema topic, TRUNCATEs, key changes, tombstones)."""
    if not c_encoder:
        monkeypatch.setattr(ks, "_kafka_json", None)
    logs = reference(workload(1, 120))
    assert {tp[0] for tp in logs} >= {"txns", "capturer.schema_changes", "capturer.app.users", "capturer.app.log"}
    for tp, log in logs.items():
        keys = [message_key(h, v is None) for _k, v, h in log]
        assert None not in keys
        assert all(a < b for a, b in zip(keys, keys[1:])), f"{tp}: keys not increasing"  # type: ignore[operator]


# --- Marks ----------------------------------------------------------------------------------

def test_marks_skip_up_to_the_mark_then_switch_off() -> None:
    m = Marks()
    mark = row_key(10, "r1", 4, b"c", False)
    m.learn("t", {0: mark, 1: row_key(8, "r1", 0, b"c", False)}, (9, "r1", 0))
    assert list(m.limits) == [("t", 0)]  # partition 1's mark is behind the transaction in hand: no use
    m.at((10, "r1", 0))
    assert not m.keep(("t", 0), row_key(10, "r1", 2, b"c", False))
    assert not m.keep(("t", 0), mark)
    assert m.keep(("t", 1), row_key(10, "r1", 3, b"c", False))  # another partition: not skipped
    assert m.keep(("t", 0), row_key(10, "r1", 5, b"c", False))
    assert m.limits == {}  # passed: nothing is checked any more
    assert m.skipped == 2


def test_marks_clear_once_the_stream_is_past_them() -> None:
    m = Marks()
    m.learn("t", {0: row_key(10, "r2", 4, b"c", False)}, (10, "r1", 0))
    m.at((10, "r2", 0))
    assert m.limits
    m.at((10, "r3", 0))
    assert m.limits == {}


def test_marks_never_skip_at_or_after_a_failed_message() -> None:
    """A message the producer could not deliver while later ones of its partition got through
    (a gap): the mark is above it, but it and what follows are written again."""
    m = Marks()
    failed = row_key(10, "r1", 3, b"c", False)
    m.failed(("t", 0), failed)
    m.learn("t", {0: row_key(10, "r1", 6, b"c", False)}, (10, "r1", 0))
    assert not m.keep(("t", 0), row_key(10, "r1", 2, b"c", False))
    assert m.keep(("t", 0), failed)
    m.batch_done()
    m.learn("t", {0: row_key(10, "r1", 6, b"c", False)}, (10, "r1", 0))
    assert not m.keep(("t", 0), failed)  # the failure was written again since
    m.failed(("t", 1), None)  # not even its identity known: nothing of the partition is skipped
    m.learn("t", {1: row_key(10, "r1", 6, b"c", False)}, (10, "r1", 0))
    assert m.keep(("t", 1), row_key(10, "r1", 0, b"c", False))


def test_gaps_kept_by_the_checkpoint_are_written_again_by_the_next_run() -> None:
    """The failures of a stopped run, as the checkpoint keeps them (``gaps``), make the next run write the
    failed message and what follows in its partition; they are forgotten only once a batch acknowledged
    went past them (an earlier batch of the replay does not)."""
    m = Marks()
    failed = row_key(10, "r1", 3, b"c", False)
    m.failed(("t", 0), failed)
    m.failed(("t", 1), None)
    kept = m.gaps()
    assert kept == [["t", 0, 10, "r1", 0, 3, 2], ["t", 1, -1, "", 0, 0, 0]]
    n = Marks()  # the next run
    n.add_gaps([*kept, ["bad"]])  # (an entry not understood: a warning)
    assert n.gaps() == kept
    n.learn("t", {0: row_key(10, "r1", 6, b"c", False)}, (9, "r1", 0))
    assert not n.keep(("t", 0), row_key(10, "r1", 2, b"c", False))
    assert n.keep(("t", 0), failed)
    n.batch_done((9, "r1", 0))  # a batch before the gap: it stays
    assert n.gaps() == [["t", 0, 10, "r1", 0, 3, 2]]
    n.batch_done((10, "r1", 0))
    assert n.gaps() == []
    o = Marks()  # a gap of a topic the batches acknowledged did not write to (not read back): kept
    o.add_gaps(kept)
    o.batch_done((20, "r1", 0))
    assert o.gaps() == kept
    o.learn("t", {}, (20, "r1", 0))
    o.batch_done((20, "r1", 0))
    assert o.gaps() == []


def test_a_new_read_replaces_what_an_earlier_one_said() -> None:
    m = Marks()
    m.learn("t", {0: row_key(10, "r1", 6, b"c", False)}, (10, "r1", 0))
    m.learn("t", {}, (10, "r1", 0))  # the partition is empty now (the topic was recreated)
    assert m.keep(("t", 0), row_key(10, "r1", 2, b"c", False))


# --- read_marks -----------------------------------------------------------------------------

def hdr(ts: int, seq: int) -> list[tuple[str, bytes]]:
    return [("region", b"r1"), ("commit_ts", str(ts).encode()), ("seq", str(seq).encode()), ("op", b"c")]


def test_read_marks_starts_at_the_listed_end_and_steps_back() -> None:
    logs: dict[int, list[Any]] = {0: [hdr(1, i) for i in range(50)], 1: [], 2: [hdr(2, i) for i in range(5)],
                                  3: [hdr(3, i) for i in range(80)]}
    asked: list[dict[int, int]] = []

    def offsets(topic: str, parts: Any) -> dict[int, tuple[int, int]]:
        return {0: (0, 11), 1: (0, 0), 2: (0, 5), 3: (0, 1000)}

    patience: list[list[int]] = []

    def read(topic: str, starts: dict[int, int], timeout: float, patient: Any = ()) -> dict[int, Any]:
        asked.append(dict(starts))
        patience.append(sorted(patient))
        # partition 2: only control records after offset 2 (nothing a consumer sees); partition 3:
        # nothing from offset 990 on
        return {p: (logs[p][-1], False) for p, s in starts.items()
                if p == 0 or (p == 2 and s < 2) or (p == 3 and s < 990)}

    marks = read_marks("t", [0, 1, 2, 3], offsets, read)
    assert marks == {0: (1, "r1", 0, 49, 2), 2: (2, "r1", 0, 4, 2), 3: (3, "r1", 0, 79, 2)}
    assert asked[0] == {0: 10, 2: 4, 3: 999}  # an empty partition is not read
    # further back, x16 each time, down to the partition's start (never from there at once)
    assert asked[1:] == [{2: 0, 3: 983}]
    assert patience == [[], [2]]  # read from its start: waited for however long the broker takes


def test_read_marks_foreign_last_message_gives_no_mark() -> None:
    marks = read_marks("t", [0], lambda t, p: {0: (0, 3)}, lambda t, s, to, pa=(): {0: ([("x", b"1")], False)})
    assert marks == {}


def test_read_marks_gives_up_after_its_time() -> None:
    with pytest.raises(SinkError, match="not read"):
        read_marks("t", [0], lambda t, p: {0: (5, 9)}, lambda t, s, to, pa=(): {}, timeout=0.0)


# --- the sender over the fake broker ---------------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_restart_after_a_crash_mid_batch_writes_nothing_twice(seed: int) -> None:
    """kill -9 mid-batch: the partitions hold a prefix each (of their own messages); a new
    sender (nothing in memory) replays from an older checkpoint and the partitions end up
    exactly as if nothing had happened."""
    rng = random.Random(seed)
    txns = workload(seed)
    want = strip(reference(txns))
    fk = FakeKafka()
    s = sender(fk)
    bs = batches(txns, 7)
    crash_at = rng.randrange(len(bs))
    for b in bs[:crash_at]:
        s.send(b)
    acked = {tp: len(log) for tp, log in fk.logs.items()}
    fk.cut = fk.produced + rng.randrange(1, 60)
    with contextlib.suppress(SinkError):  # (a cut after the batch's last message: it went whole)
        s.send(bs[crash_at])
    # what was produced reached some partitions and not others: keep a random prefix of each
    # partition's share of the failed batch (Kafka keeps a prefix per partition)
    for tp, log in fk.logs.items():
        if rng.random() < 0.5:
            del log[rng.randint(acked.get(tp, 0), len(log)):]
    fk.cut = None
    replay_from = rng.randrange(max(crash_at - 2, 0), crash_at + 1)  # the checkpoint may be behind
    s2 = sender(fk)
    for b in bs[replay_from:]:
        s2.send(b)
    assert strip(fk.logs) == want
    assert s2.marks.limits == {}


@pytest.mark.parametrize("c_encoder", [True, False])
def test_retried_batch_within_a_run_writes_nothing_twice(monkeypatch: pytest.MonkeyPatch, c_encoder: bool) -> None:
    if not c_encoder:
        monkeypatch.setattr(ks, "_kafka_json", None)
    txns = workload(5, 60)
    want = strip(reference(txns))
    fk = FakeKafka()
    s = sender(fk)
    fk.cut = 150
    with pytest.raises(SinkError):
        s.send(txns)
    fk.cut = None
    reads = fk.reads
    s.send(txns)  # the base loop's retry: the same batch (resume_key() is None: nothing dropped before)
    assert s.resume_key() is None
    assert fk.reads > reads  # read back again with the new producer
    assert strip(fk.logs) == want
    assert s.marks.skipped == 150


def test_a_gap_is_filled_not_skipped() -> None:
    """The producer refused message 40 while later messages of its partition were kept: the
    retry writes it (and, in its partition, what followed it: duplicates, never a loss)."""
    txns = workload(7, 30)
    want = identities(reference(txns))
    fk = FakeKafka()
    s = sender(fk)
    fk.lose = {40}
    with pytest.raises(SinkError, match="not acknowledged"):
        s.send(txns)
    fk.lose = set()
    s.send(txns)
    got = identities(fk.logs)
    assert set(got) == set(want), "a message is missing"
    assert s.marks.skipped > 0


def test_no_read_back_when_turned_off() -> None:
    txns = workload(3, 10)
    fk = FakeKafka()
    s = sender(fk, read_back=False)
    s.send(txns)
    s2 = sender(fk, read_back=False)
    s2.send(txns)
    assert fk.reads == 0
    assert max(identities(fk.logs).values()) == 2  # at least once


def test_steady_state_checks_nothing_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once past the marks the per-message check is off (the bench's path)."""
    txns = workload(9, 40)
    fk = FakeKafka()
    s = sender(fk)
    for b in batches(txns[:20], 5):
        s.send(b)
    s2 = sender(fk)
    s2.send(txns[15:25])
    assert s2.marks.limits == {}
    calls = []
    monkeypatch.setattr(s2, "_unsent", lambda *a: calls.append(1))
    s2.send(txns[25:])
    assert calls == []


def test_a_topic_that_cannot_be_read_back_is_written_after_a_few_attempts_not_never(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that cannot serve the read-back (seen with Tansu on S3 storage after a
    restart) must not stop the sender for good: after READ_BACK_GIVE_UP failed attempts
    in a row the topic is written without skipping, loudly, and the status says so."""
    from capturer.errors import SinkError
    from senders.kafka import sender as mod

    class Stuck(FakeKafka):
        def offsets(self, topic: str, parts: object) -> dict[int, tuple[int, int]]:
            return {0: (0, 10)}

        def last_records(self, topic: str, starts: object, timeout: float, patient: object = ()) -> dict[int, object]:
            raise SinkError(f"topic {topic!r}: partitions [0] not read to their end in 60s")

    s = sender(Stuck())
    for _ in range(mod.READ_BACK_GIVE_UP - 1):
        with pytest.raises(SinkError):
            s._read_back("t", 1)
    s._read_back("t", 1)  # the last attempt gives up on skipping, and goes on
    assert s.status()["read_back_given_up"] == ["t"] and not s.marks.limits


# --- the read-back of many topics at once ------------------------------------------------------

class JointKafka(FakeKafka):
    """A client that reads the partitions of several topics at once (as both real clients do:
    one consumer assigned to all of them): counts those reads and the topics each one read."""

    def __init__(self, missing: set[str] | None = None, stuck: set[str] | None = None) -> None:
        super().__init__()
        self.joint: list[list[str]] = []  # the topics of each read
        self.missing = missing or set()
        self.stuck = stuck or set()  # topics whose partitions are never read to their end

    def partitions(self, topic: str) -> int:
        return 0 if topic in self.missing else self.parts

    def last_records(self, topic: str, starts: dict[int, int], timeout: float, patient: Any = ()) -> dict[int, Any]:
        raise AssertionError("read topic by topic")

    def last_records_of(self, starts: dict[tuple[str, int], int], timeout: float,
                        patient: Any = ()) -> tuple[dict[tuple[str, int], Any], dict[str, Exception]]:
        self.joint.append(sorted({t for t, _p in starts}))
        out, errors = {}, {}
        for (topic, p), start in starts.items():
            if topic in self.stuck:
                errors[topic] = SinkError(f"topic {topic!r}: partitions [{p}] not read to their end in 60s")
                continue
            log = self.logs.get((topic, p), [])
            if len(log) > start:
                _k, value, headers = log[-1]
                out[(topic, p)] = (headers, value is None)
        return out, errors


def many_tables(n: int, first_ts: int, rows: int = 4) -> list[Txn]:
    """One transaction per table (``n`` tables, a topic each), ``rows`` inserts each."""
    out = []
    for i in range(n):
        schema = TableSchema("app", f"t{i}", ("id", "v"), ("id",))
        out.append(txn("r1", first_ts + i, *(RowChange(schema, "insert", None, {"id": k, "v": i})
                                              for k in range(rows))))
    return out


def test_the_topics_of_a_batch_are_read_back_together_not_one_by_one() -> None:
    """kill -9 restarts with 30 tables: the new sender reads the marks of every topic of its first
    batch in one read (one consumer for all partitions), not 30 one after the other (~0.5 s each on
    a real broker: a snapshot killed every few seconds never had a batch acknowledged), and skips
    exactly what the partitions hold."""
    first, second = many_tables(30, 1000), many_tables(30, 2000)
    want = strip(reference(first + second, size=len(first + second)))
    fk = JointKafka()
    s = sender(fk)
    s.send(first)
    s.send(second[:11])  # the crash: the checkpoint says only `first`... or less
    s2 = sender(fk)
    s2.send(first[5:] + second)  # the replay from an older checkpoint
    assert strip(fk.logs) == want
    assert s2.marks.skipped > 0 and s2.marks.limits == {}
    # the first sender read nothing (empty topics: their offsets say so); the second one read the
    # transaction topic and the 30 tables' topics in one go
    assert [len(r) for r in fk.joint] == [31], fk.joint


def test_one_topic_that_cannot_be_read_back_does_not_hold_the_others() -> None:
    """A topic whose partitions cannot be read to their end fails the batch (retried) as it did
    alone, counted for itself only; the others read in the same go learn their marks, and after
    READ_BACK_GIVE_UP failures the stuck topic alone is written without skipping."""
    first = many_tables(5, 1000)
    fk = JointKafka()
    sender(fk).send(first)
    fk.stuck = {"capturer.app.t2"}
    s = sender(fk)
    for _ in range(ks.READ_BACK_GIVE_UP - 1):
        with pytest.raises(SinkError, match="t2"):
            s.send(first)
        s.open()
    assert s.read_back_failures == {"capturer.app.t2": ks.READ_BACK_GIVE_UP - 1}
    before = {tp: len(log) for tp, log in fk.logs.items()}
    s.send(first)
    assert s.status()["read_back_given_up"] == ["capturer.app.t2"]
    grew = {tp[0] for tp, log in fk.logs.items() if len(log) != before.get(tp, 0)}
    assert grew == {"capturer.app.t2"}, grew  # the others skipped all they held: nothing written twice


def test_a_missing_topic_of_the_batch_is_no_error_until_written() -> None:
    """create_topics = false: a table later in the batch whose topic does not exist does not stop the
    topics before it (its own error comes when it is written); a TRUNCATE of a table without a topic
    is not sent, as before."""
    fk = JointKafka(missing={"capturer.app.t3"})
    s = sender(fk, create_topics=False, txn_topic="", schema_topic="")
    trunc = Txn("r1", 999, Position("b", 999), ddl=Ddl("app", "TRUNCATE TABLE t3", "t3"))
    batch = [trunc, *many_tables(5, 1000)]
    with pytest.raises(SinkError, match="t3") as e:
        s.send(batch)
    assert not e.value.retriable
    assert {tp[0] for tp in fk.logs} == {f"capturer.app.t{i}" for i in range(3)}


def test_the_status_says_what_the_sender_waits_for_at_the_broker() -> None:
    """A broker down (or unreachable) while a batch waits for its acknowledgement: the status shows
    ``waiting_for`` (what: the acknowledgement, the servers, what the client said during the wait, not
    before it) and ``waiting_seconds`` once it has waited a second; nothing once the wait is over.
    Before, the status said nothing (state running, no error) for the whole minute of the flush."""
    import threading
    import time

    from capturer.util.kafkasec import Watch

    class Down(FakeKafka):
        def __init__(self) -> None:
            super().__init__()
            self.watch = Watch()
            self.watch("an old outage")  # said before the wait: not shown as its cause
            self.release = threading.Event()

        def flush(self, timeout: float) -> list[str]:
            self.watch("127.0.0.1:9/1: Connect to ipv4#127.0.0.1:9 failed: Connection refused")
            self.release.wait(30)
            return []

    fk = Down()
    s = sender(fk, txn_topic="")
    s.WAIT_SHOWN = 0.05  # type: ignore[misc]
    assert s.status()["waiting_for"] is None
    schema = TableSchema("d", "t", ("id",), ("id",))
    t = threading.Thread(target=s.send, args=([txn("r1", 10, RowChange(schema, "insert", None, {"id": 1}))],))
    t.start()
    try:
        deadline = time.monotonic() + 30
        while s.status()["waiting_for"] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        st = s.status()
        assert st["waiting_for"].startswith("the broker's acknowledgement of the messages produced (servers "
                                            "127.0.0.1:9); the client says: 127.0.0.1:9/1: Connect to"), st
        assert st["waiting_seconds"] >= 0.05
    finally:
        fk.release.set()
        t.join(30)
    assert s.status()["waiting_for"] is None and s.status()["waiting_seconds"] is None


def test_a_failed_json_message_is_identified_by_its_value() -> None:
    """confluent-kafka's delivery reports carry no headers: a failed message of the json format is
    identified by its value (the same key as its headers give), anything else is unknown (None).
    Before, every such failure was of unknown identity: its whole partition written again."""
    from senders.kafka.client import row_identity
    from senders.kafka.format import json_envelope

    schema = TableSchema("d", "t", ("id", "v"), ("id",))
    t = txn("r1", 12345, RowChange(schema, "update", {"id": 1, "v": "a"}, {"id": 1, "v": '{"before":'}))
    for op in ("u", "d"):
        headers = [("region", b"r1"), ("commit_ts", b"12345"), ("seq", b"0"), ("op", op.encode())]
        got = row_identity(json_envelope(t, 0, t.changes[0], op))
        assert got == headers and message_key(got, False) == message_key(headers, False)
    assert row_identity(b'{"op":"t"}') is None
    assert row_identity(b'{"before":null,"after":{},"op":"ddl","source":{}}') is None
    assert row_identity(b"UPDATE `d`.`t` SET") is None
    assert row_identity(b'{"before":') is None  # (not json)
