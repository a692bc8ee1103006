"""Whole transactions again, from the messages of one capturer's Kafka sender.

What the Kafka sender writes (senders/kafka/sender.py) and this module relies on:

* ``txn_topic`` (partition 0), **the spine**: for every transaction a ``BEGIN`` and an
  ``END`` record, for every DDL a ``DDL`` record, in the stream's order (one partition,
  one producer: Kafka keeps that order). ``END`` lists, for each table the transaction
  touched, its schema and how many messages went to each ``(topic, partition)``.
* one message per row change in the table topics, carrying the identity headers
  ``region``, ``commit_ts``, ``seq``, ``op`` (a primary-key change is a delete and a
  create with the same seq, in different partitions; a tombstone repeats its delete's
  headers with a null value). Each partition holds its messages in stream order.

So a transaction is **complete** when its ``END`` has been read and every partition
it names has given as many distinct messages (by identity) as ``END`` counts. The
spine says which transaction comes next, so an idle partition never holds anything
up, and nothing waits for a partition that has nothing of the transaction. An
applier that owns only some tables (``owns``) counts only their partitions: the
rest of a transaction is another applier's.

Duplicates (a replay after a crash of the capturer or of the applier, a request
the producer wrote twice) are dropped by identity; transactions at or below
``done`` (what the destinations hold) are dropped whole.

**Offsets.** For each partition the regrouper knows the offset of the first message
of every transaction not yet done (``commit_offsets``): committing those, never more,
means a restart reads again everything a destination may lack, and nothing is lost;
what a destination holds already is dropped by its own position.

Pure: no Kafka, no threads (the applier feeds it); unit-tested with lists.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from capturer.model import (
    AnyPosition,
    Ddl,
    RowChange,
    SnapshotMark,
    StreamKey,
    TableSchema,
    Txn,
    position_from_json,
    protogen,
    schema_from_json,
)
from capturer.model.changes import make_change
from capturer.model.encode import _fastrows
from capturer.model.message import TP, Msg
from capturer.pipeline.filter import split_pattern

log = logging.getLogger(__name__)

try:  # 3-5x faster than json for the envelopes (the kafka and confluent extras install it)
    import orjson

    _fast_loads: Callable[[bytes], Any] | None = orjson.loads
except ImportError:  # pragma: no cover - depends on the install
    _fast_loads = None


_unjson: Callable[[bytes], Any] | None = getattr(_fastrows, "kafka_unjson", None)  # (an older build lacks it)


def loads(data: bytes) -> Any:
    """JSON text -> values: orjson where installed; the standard library for what it refuses
    (a lone surrogate escape), and where it is missing. (orjson makes a float of an integer
    beyond 64 bits; a row message's values are read by ``_fastrows.kafka_unjson`` first,
    which keeps it an int, as the standard library does.)"""
    if _fast_loads is not None:
        try:
            return _fast_loads(data)
        except ValueError:
            pass
    try:
        return json.loads(data)
    except RecursionError:  # (a value nested past the interpreter's recursion limit: a bad message, not a crash)
        raise ValueError("JSON nested too deep") from None


class BadMessage(ValueError):
    """A message that does not decode: names where it is and why."""

    def __init__(self, msg: Msg, why: str):
        super().__init__(f"topic {msg.topic!r} partition {msg.partition} offset {msg.offset}: {why}")
        self.msg = msg
        self.why = why


def headers_of(msg: Msg) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in msg.headers or ():
        if isinstance(v, bytes):
            try:
                out[k] = v.decode()
            except UnicodeDecodeError:
                out[k] = ""
        else:
            out[k] = "" if v is None else str(v)
    return out


# --- values --------------------------------------------------------------------------

_DECIMAL = {0, 246}
_DATETIME = {7, 12, 17, 18}
_DATE = {10, 14}
_TIME = {11, 19}
_SET = 248


def _timedelta(text: str) -> dt.timedelta:
    neg = text.startswith("-")
    hms, _, frac = text.lstrip("-").partition(".")
    h, m, s = (int(x) for x in hms.split(":"))
    us = int((frac + "000000")[:6]) if frac else 0
    td = dt.timedelta(hours=h, minutes=m, seconds=s, microseconds=us)
    return -td if neg else td


def json_to_value(v: Any, type_code: int | None, b64: bool) -> Any:
    """A value as the json format carries it (capturer/model/encode.py) back to what the
    region gave: bytes from base64, Decimal, datetime, date, timedelta, a set. A text the
    type's parser refuses (e.g. MySQL's zero date) stays text: the target takes it as the
    source wrote it."""
    if v is None:
        return None
    if b64 and isinstance(v, str):
        return base64.b64decode(v, validate=True)
    if not isinstance(v, str) or type_code is None:
        return v
    try:
        if type_code in _DECIMAL:
            return decimal.Decimal(v)
        if type_code in _DATETIME:
            return dt.datetime.fromisoformat(v)
        if type_code in _DATE:
            return dt.date.fromisoformat(v)
        if type_code in _TIME:
            return _timedelta(v)
        if type_code == _SET:
            return set(v.split(",")) if v else set()
    except (ValueError, ArithmeticError):
        return v
    return v


def _conv_set(v: str) -> set[str]:
    return set(v.split(",")) if v else set()


Conv = tuple[str, Callable[[str], Any], type[Exception]]
"""A typed column: its name, the parser of its text and what that parser raises for a text it
refuses (the text then stays as it is: json_to_value)."""


def _converter(type_code: int | None) -> tuple[Callable[[str], Any], type[Exception]] | None:
    if type_code in _DECIMAL:
        return decimal.Decimal, ArithmeticError
    if type_code in _DATETIME:
        return dt.datetime.fromisoformat, ValueError
    if type_code in _DATE:
        return dt.date.fromisoformat, ValueError
    if type_code in _TIME:
        return _timedelta, ValueError
    if type_code == _SET:
        return _conv_set, ValueError
    return None


def _converters(schema: TableSchema) -> tuple[Conv, ...]:
    """The schema's typed columns and their converters (kept on the schema, as its ``type_of`` map)."""
    hit = schema.__dict__.get("_apply_convs")
    if hit is None:
        hit = tuple((c, *f) for c, t in zip(schema.columns, schema.column_types) if (f := _converter(t)) is not None)
        schema.__dict__["_apply_convs"] = hit
    return hit


_unrow: Callable[[Any, Any], Any] | None = getattr(_fastrows, "kafka_unrow", None)
_untype: Callable[[dict[str, Any], tuple[Conv, ...], frozenset[str]], None] | None = getattr(
    _fastrows, "kafka_untype", None)


def _untype_py(img: dict[str, Any], convs: tuple[Conv, ...], b64: frozenset[str]) -> None:
    """The typed columns' text made values, in place (``kafka_untype`` in C)."""
    for c, f, catch in convs:
        v = img.get(c)
        if isinstance(v, str) and c not in b64:
            try:
                img[c] = f(v)
            except catch:
                pass


def _image(schema: TableSchema, img: Any, b64: frozenset[str], key: StreamKey, seq: int) -> dict[str, Any] | None:
    """A row image as the region gave it (``json_to_value`` for each column, by the
    schema's types: only the typed columns are touched)."""
    if img is None:
        return None
    if not isinstance(img, dict):
        raise ValueError(f"row {seq} of {key[1]}:{key[0]} is not an object")
    (_untype or _untype_py)(img, _converters(schema), b64)
    for c in b64:
        v = img.get(c)
        if isinstance(v, str):
            img[c] = base64.b64decode(v, validate=True)
    return img


def decode_json_py(value: bytes) -> tuple[str, str, Any, Any, frozenset[str]]:
    """``(db, table, before, after, base64 columns)`` of a json-format row message: the
    specification of ``_fastrows.kafka_unjson``, which reads the common shape in C (and
    answers None for the rest, which this reads); raises ValueError (or TypeError, KeyError,
    UnicodeDecodeError) for what is not such a message."""
    d = loads(value)
    if not isinstance(d, dict) or "op" not in d or not isinstance(d.get("source"), dict):
        raise ValueError("not a json envelope (no op or source)")
    src = d["source"]
    before, after = d.get("before"), d.get("after")
    for img in (before, after):
        if img is not None and not isinstance(img, dict):
            raise ValueError("a row image is not an object")
    return str(src["db"]), str(src["table"]), before, after, frozenset(d.get("b64") or ())


# --- the regrouper -------------------------------------------------------------------

Event = tuple[str, str, str, "dict[str, Any] | None", "dict[str, Any] | None", frozenset[str]]
"""(op c/u/d/r, db, table, before, after, base64 columns) of one row message, values as
they came (turned into the region's types at completion, when the schema is known)."""


@dataclass
class Entry:
    """One transaction or DDL of the spine."""

    key: StreamKey
    kind: str  # "txn" | "ddl"
    record: dict[str, Any] | None = None  # END (txn) or DDL record
    expected: dict[TP, int] | None = None  # owned partitions -> messages (from END)
    got: dict[TP, int] = field(default_factory=dict)
    seen: set[tuple[int, str, bool]] = field(default_factory=set)  # (seq, op, null) identities
    events: dict[int, list[Event]] = field(default_factory=dict)  # seq -> its events
    bad: int = 0  # messages sent to the dead-letter topic instead (counted, not applied)
    first_seen: float = 0.0
    queued: bool = False  # in the spine's order (its record was read)
    abandoned: str = ""  # why it will never be complete (then handed out as nothing)

    @property
    def complete(self) -> bool:
        if self.kind == "ddl" or self.abandoned:
            return True
        if self.expected is None:
            return False
        return all(self.got.get(tp, 0) >= n for tp, n in self.expected.items())

    def missing(self) -> dict[str, int]:
        if self.expected is None:
            return {"END record": 1}
        return {f"{tp[0]}[{tp[1]}]": n - self.got.get(tp, 0) for tp, n in self.expected.items()
                if self.got.get(tp, 0) < n}


Ready = tuple[StreamKey, "Txn | None"]
"""A complete spine entry in order: its key, and the transaction to apply (None: nothing
of it is this applier's)."""


class Regrouper:
    """Feed it every consumed message (``add``); take complete transactions in the
    spine's order (``ready``); tell it what the destinations hold (``done_through``)."""

    def __init__(self, spine: str, fmt: str = "json", owns: Callable[[str, str], bool] | None = None,
                 clock: Callable[[], float] | None = None, untabled_ddl: bool = True):
        import time

        self.spine = spine
        self.fmt = fmt
        self.owns = owns or (lambda db, table: True)
        self.untabled_ddl = untabled_ddl  # apply DDL that names no table (one applier of several should)
        self.clock = clock or time.monotonic
        self.order: collections.deque[Entry] = collections.deque()  # spine entries not yet handed out
        self.by_key: dict[StreamKey, Entry] = {}  # every entry not handed out, and early rows' entries
        self.last_spine: StreamKey | None = None  # key of the newest spine record read
        self.done: StreamKey | None = None  # every transaction at or below is at every destination
        self.handed: StreamKey | None = None  # the newest entry ready() gave out
        # per partition: (txn key, offset of its first message there) of what is not done, in order
        self.pending: dict[TP, collections.deque[tuple[StreamKey, int]]] = {}
        self.next_offset: dict[TP, int] = {}  # per partition: the offset after the last message read
        self.topics: set[str] = set()  # table topics the END records name for owned tables
        self.partitions: set[TP] = set()  # their partitions (what the applier must read)
        self.last_key: dict[TP, StreamKey] = {}  # per table partition: the greatest transaction key read
        self.abandoned = 0  # transactions the capturer will never finish (a snapshot chunk sent again)
        self._orphan_scan = 0.0
        self._schemas: dict[str, TableSchema] = {}  # schema JSON text -> one object
        self.duplicates = 0
        self.dropped = 0  # messages of transactions the destinations held already
        self.foreign = 0  # messages without the sender's identity headers (ignored)
        self.orphans = 0  # transactions whose rows came but the spine never named (dropped)
        self.rows_buffered = 0
        self._unrow = _unrow if fmt == "json" else None
        # (partition, key, entry) of the last row added: the next row of the same transaction in the same
        # partition (most rows) skips the look-ups it made (``_entry_for`` answers the same, ``last_key`` holds
        # the key already); forgotten whenever entries or what is done change (``ready``, ``done_through``, ...)
        self._last_row: tuple[TP, StreamKey, Entry] | None = None

    # --- input ---------------------------------------------------------------------
    def add(self, msg: Msg) -> None:
        """One consumed message. Raises BadMessage for one that does not decode (the
        caller stops, or calls ``add_bad`` after dead-lettering it)."""
        tp = (msg.topic, msg.partition)
        if msg.offset >= self.next_offset.get(tp, 0):
            self.next_offset[tp] = msg.offset + 1
        if msg.topic == self.spine:
            self._spine(msg, tp)
        else:
            self._row(msg, tp)

    def add_bad(self, msg: Msg) -> bool:
        """A message that did not decode was put aside (dead-letter topic): counted for its
        transaction when its identity headers say which (True), so the rest applies."""
        self._last_row = None  # (its _entry_for may note another transaction in the partition)
        h = headers_of(msg)
        try:
            key: StreamKey = (int(h["commit_ts"]), h["region"], 0)
            seq, op = int(h["seq"]), h["op"]
        except (KeyError, ValueError):
            return False
        if msg.topic == self.spine:
            return False
        e = self._entry_for(key, (msg.topic, msg.partition), msg.offset)
        if e is None:
            return True
        ident = (seq, op, msg.value is None)
        if ident not in e.seen:
            e.seen.add(ident)
            e.got[(msg.topic, msg.partition)] = e.got.get((msg.topic, msg.partition), 0) + 1
            e.bad += 1
        return True

    def _track(self, tp: TP, key: StreamKey, offset: int) -> None:
        q = self.pending.get(tp)
        if q is None:
            q = self.pending[tp] = collections.deque()
        if not q or q[-1][0] != key:
            q.append((key, offset))

    def _is_done(self, key: StreamKey) -> bool:
        return (self.done is not None and key <= self.done) or (self.handed is not None and key <= self.handed)

    def _spine(self, msg: Msg, tp: TP) -> None:
        if msg.value is None:
            return
        try:
            d = loads(msg.value)
            status = d["status"]
            commit_ts, region = int(d["commit_ts"]), str(d["region"])
            seq = int(d.get("seq", 0)) if status == "DDL" else 0
        except (ValueError, TypeError, KeyError) as exc:
            raise BadMessage(msg, f"not a transaction record of the capturer's Kafka sender ({exc!r})") from None
        key: StreamKey = (commit_ts, region, min(seq, 0))
        if status not in ("BEGIN", "END", "DDL"):
            raise BadMessage(msg, f"unknown transaction record status {status!r}")
        if self._is_done(key):
            self.dropped += 1
            return
        if self.last_spine is not None and key < self.last_spine:
            self.duplicates += 1  # (a replayed record: the spine is in key order)
            return
        self.last_spine = key
        if self.order:
            last = self.order[-1]
            if last.key != key and last.kind == "txn" and last.record is None and not last.abandoned:
                # its BEGIN, then another record: the capturer's Kafka sender writes a transaction's
                # BEGIN and END with nothing between them in this partition, and a replay after a
                # crash writes the missing END next (same key). So this one was given up: a snapshot
                # chunk read again after a crash goes out under a new commit_ts.
                self._abandon(last, "its BEGIN was followed by another transaction (a snapshot chunk the capturer "
                                    "sent again under a new key after a restart)")
        e = self.by_key.get(key)
        if e is None:
            e = self.by_key[key] = Entry(key, "ddl" if status == "DDL" else "txn", first_seen=self.clock())
        if not e.queued:
            e.queued = True
            self.order.append(e)  # (the spine is in key order: so is ``order``)
        self._track(tp, key, msg.offset)
        if status == "DDL":
            e.kind = "ddl"
            e.record = d
        elif status == "END" and e.record is None:
            self._end(msg, e, d)

    def _end(self, msg: Msg, e: Entry, d: dict[str, Any]) -> None:
        try:
            parts = d["parts"]
            schemas = d["schemas"]
            expected: dict[TP, int] = {}
            for db, table, topic, part, count in parts:
                if self.owns(str(db), str(table)):
                    tp = (str(topic), int(part))
                    expected[tp] = expected.get(tp, 0) + int(count)
                    if tp not in self.partitions:
                        self.partitions.add(tp)
                        self.topics.add(tp[0])
            tables: dict[tuple[str, str], list[TableSchema]] = {}
            for sj in schemas:
                text = json.dumps(sj, sort_keys=True)
                s = self._schemas.get(text)
                if s is None:
                    s = self._schemas[text] = schema_from_json(sj)
                tables.setdefault((s.db, s.table), []).append(s)
            position_from_json(d["position"])
        except KeyError as exc:
            raise BadMessage(msg, f"END record without {exc} (written by a capturer older than the applier: its "
                                  "transactions cannot be regrouped)") from None
        except (ValueError, TypeError) as exc:
            raise BadMessage(msg, f"bad END record: {exc}") from None
        # what the transaction needs later (not the counts and schemas' JSON: an entry may wait a while)
        e.record = {"position": d["position"], "source_ts": d.get("source_ts", 0), "gtid": d.get("gtid", ""),
                    "snapshot": d.get("snapshot"), "_tables": tables}
        e.expected = expected

    def _abandon(self, e: Entry, why: str) -> None:
        self._last_row = None
        e.abandoned = why
        self.abandoned += 1
        self.rows_buffered -= sum(len(v) for v in e.events.values())
        e.events = {}
        log.warning("transaction %s:%s will never be complete and is skipped: %s", e.key[1], e.key[0], why)

    def _entry_for(self, key: StreamKey, tp: TP, offset: int) -> Entry | None:
        """The entry a row of transaction ``key`` belongs to (made for rows that come
        before the spine's record); None when the transaction is done already."""
        if self._is_done(key):
            self.dropped += 1
            return None
        e = self.by_key.get(key)
        if e is None:
            e = self.by_key[key] = Entry(key, "txn", first_seen=self.clock())
        q = self.pending.get(tp)  # (``_track``, inline: once per message)
        if q is None:
            q = self.pending[tp] = collections.deque()
        if not q or q[-1][0] != key:
            q.append((key, offset))
        return e

    def _row(self, msg: Msg, tp: TP) -> None:
        unrow = self._unrow
        fast = unrow(msg.headers, msg.value) if unrow is not None else None  # headers and value in one call, in C
        if fast is not None:
            key, seq, op, ev = fast
        else:
            ev = None
            try:
                key, seq, op = self._identity(msg)
            except (KeyError, ValueError, TypeError, AttributeError):
                self.foreign += 1
                return
        if op in ("t", "ddl", "begin", "end"):
            return  # a TRUNCATE marker of a table topic: the spine's DDL record applies it
        last = self._last_row
        e: Entry | None
        if last is not None and last[1] == key and last[0] == tp:
            e = last[2]  # the previous row's transaction in the same partition: what follows was done for it
        else:
            lk = self.last_key.get(tp)
            if lk is None or key > lk:
                self.last_key[tp] = key
            e = self._entry_for(key, tp, msg.offset)
            if e is None:
                return
            self._last_row = (tp, key, e)
        assert e is not None
        value = msg.value
        ident = (seq, op, value is None)
        seen = e.seen
        if ident in seen:
            self.duplicates += 1
            return
        if value is None:
            # a tombstone: counted when its delete (before it, in the same partition) was this applier's
            if (seq, "d", False) not in seen:
                return
        else:
            if ev is None:
                ev = self._decode(msg, op)
            if not self.owns(ev[1], ev[2]):
                return  # another table in the same topic: another applier's
            evs = e.events.get(seq)
            if evs is None:
                e.events[seq] = [ev]
            else:
                evs.append(ev)
            self.rows_buffered += 1
        seen.add(ident)
        got = e.got
        got[tp] = got.get(tp, 0) + 1

    @staticmethod
    def _identity(msg: Msg) -> tuple[StreamKey, int, str]:
        """(transaction key, seq, op) of a row message, from its headers (``kafka_unrow`` in C)."""
        hs = msg.headers
        # the sender's own order first (region, commit_ts, seq, op: one look each), any order else
        if len(hs) == 4 and hs[0][0] == "region" and hs[1][0] == "commit_ts" and hs[2][0] == "seq" \
                and hs[3][0] == "op":
            return (int(hs[1][1]), hs[0][1].decode(), 0), int(hs[2][1]), hs[3][1].decode()
        h = headers_of(msg)
        return (int(h["commit_ts"]), h["region"], 0), int(h["seq"]), h["op"]

    def _decode(self, msg: Msg, op: str) -> Event:
        assert msg.value is not None
        if self.fmt == "protobuf":

            pb = protogen.load()
            try:
                m = pb.RowChange.FromString(msg.value)
            except Exception as exc:  # google.protobuf.message.DecodeError
                raise BadMessage(msg, f"not a capturer.RowChange ({exc})") from None
            if m.op == pb.RowChange.DDL:
                raise BadMessage(msg, "a DDL change where a row was expected")
            before = {c.name: protogen.value_of(c.value) for c in m.before} if len(m.before) else None
            after = {c.name: protogen.value_of(c.value) for c in m.after} if len(m.after) else None
            return (op, m.db, m.table, before, after, frozenset())
        if _unjson is not None:
            r = _unjson(msg.value)  # (None: not the common shape; the Python path reads it)
            if r is not None:
                return (op, r[0], r[1], r[2], r[3], r[4])
        try:
            return (op, *decode_json_py(msg.value))
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
            raise BadMessage(msg, f"does not decode as the json format ({exc!r})") from None

    # --- output --------------------------------------------------------------------
    def ready(self) -> list[Ready]:
        """The complete entries at the front of the spine, in order (each once)."""
        out: list[Ready] = []
        self._last_row = None
        if self.order and not self.order[0].complete:
            self._hole(self.order[0])
        while self.order and self.order[0].complete:
            e = self.order.popleft()
            self.by_key.pop(e.key, None)
            self.handed = e.key
            out.append((e.key, self._build(e)))
        return out

    def _hole(self, e: Entry) -> None:
        """A snapshot chunk that misses messages in a partition which has moved past it
        will never get them (a partition holds its messages in the stream's order): the
        capturer crashed before the chunk was acknowledged and sends it again under a new
        key. Any other transaction waits (never applied in part; the status shows it)."""
        if e.record is None or not e.record.get("snapshot") or e.expected is None:
            return
        for tp, n in e.expected.items():
            lk = self.last_key.get(tp)
            if e.got.get(tp, 0) < n and lk is not None and lk > e.key:
                self._abandon(e, f"a snapshot chunk missing messages in {tp[0]}[{tp[1]}], which has moved past it "
                                 "(sent again under a new key after a restart of the capturer)")
                return

    def _build(self, e: Entry) -> Txn | None:
        if e.abandoned:
            return None
        d = e.record
        assert d is not None
        commit_ts, region = e.key[0], e.key[1]
        position: AnyPosition = position_from_json(d["position"])
        if e.kind == "ddl":
            db, table = str(d.get("db", "")), str(d.get("table", ""))
            if table and not self.owns(db, table) or not table and not self.untabled_ddl:
                return None
            ddl = Ddl(db, str(d["sql"]), table, str(d.get("session_db", "")), int(d.get("seq", 0)))
            return Txn(region, commit_ts, position, (), ddl, int(d.get("source_ts", 0)), str(d.get("gtid", "")))
        if not e.expected:
            self.rows_buffered -= sum(len(v) for v in e.events.values())
            e.events = {}
            return None
        tables: dict[tuple[str, str], list[TableSchema]] = d["_tables"]
        changes: list[RowChange] = []
        for seq in sorted(e.events):
            evs = e.events[seq]
            ch = self._change(tables, evs, e.key, seq)
            if ch is not None:
                changes.append(ch)
        self.rows_buffered -= sum(len(v) for v in e.events.values())
        e.events = {}
        snap = d.get("snapshot")
        mark = SnapshotMark(str(snap["run"]), int(snap["chunk"]), bool(snap.get("last", False))) if snap else None
        return Txn(region, commit_ts, position, tuple(changes), None, int(d.get("source_ts", 0)),
                   str(d.get("gtid", "")), mark)

    def _change(self, tables: dict[tuple[str, str], list[TableSchema]], evs: list[Event], key: StreamKey,
                seq: int) -> RowChange | None:
        db, table = evs[0][1], evs[0][2]
        schemas = tables.get((db, table))
        if not schemas:
            raise ValueError(f"transaction {key[1]}:{key[0]} row {seq}: its END record has no schema of "
                             f"{db}.{table}")
        schema = schemas[0]
        if len(schemas) > 1:  # the table changed inside the transaction (PostgreSQL): the schema of its columns
            img = evs[-1][4] if evs[-1][4] is not None else evs[-1][3]
            cols = set(img or ())
            schema = next((s for s in schemas if set(s.columns) == cols), schemas[-1])
        if len(evs) > 1:
            by_op = {ev[0]: ev for ev in evs}
            if "d" in by_op and "c" in by_op:  # a primary-key change: the delete and the create of one update
                d, c = by_op["d"], by_op["c"]
                return make_change(schema, "update", _image(schema, d[3], d[5], key, seq),
                                 _image(schema, c[4], c[5], key, seq))
        op, _, _, before, after, b64 = evs[0]
        if op == "c":
            return make_change(schema, "insert", None, _image(schema, after, b64, key, seq))
        if op == "u":
            return make_change(schema, "update", _image(schema, before, b64, key, seq), _image(schema, after, b64, key, seq))
        if op == "d":
            return make_change(schema, "delete", _image(schema, before, b64, key, seq), None)
        if op == "r":
            return make_change(schema, "read", None, _image(schema, after, b64, key, seq))
        return make_change(schema, "insert", None, _image(schema, after, b64, key, seq))

    # --- positions -----------------------------------------------------------------
    def done_through(self, key: StreamKey) -> None:
        """Every transaction at or below ``key`` is at every destination: what it held is released."""
        self._last_row = None
        if self.done is None or key > self.done:
            self.done = key
        for q in self.pending.values():
            while q and q[0][0] <= key:
                q.popleft()
        now = self.clock()
        if len(self.by_key) > len(self.order) and now - self._orphan_scan >= 1.0:
            # rows of a transaction the spine never named (it has passed it): not the capturer's
            # (or a dead-lettered stray): dropped, their offsets released above
            self._orphan_scan = now
            for k in [k for k, e in self.by_key.items() if not e.queued and k <= key]:
                e = self.by_key.pop(k)
                self.rows_buffered -= sum(len(v) for v in e.events.values())
                self.orphans += 1

    def skip_through(self, key: StreamKey | None) -> None:
        """At start: the destinations hold everything at or below ``key``."""
        if key is not None:
            self.done_through(key)

    def commit_offsets(self) -> dict[TP, int]:
        """Per partition read: the offset a restart must read again from (the first message
        of a transaction not yet done, else the end of what was read)."""
        out: dict[TP, int] = {}
        for tp, nxt in self.next_offset.items():
            q = self.pending.get(tp)
            out[tp] = min(o for _, o in q) if q else nxt  # (min: a partition read again is not in order)
        return out

    def waiting(self, limit: int = 5) -> list[dict[str, Any]]:
        """The oldest spine entries still incomplete, with what they wait for."""
        now = self.clock()
        out = []
        for e in list(self.order)[:limit]:
            if e.complete:
                continue
            out.append({"txn": f"{e.key[1]}:{e.key[0]}", "waiting_s": round(now - e.first_seen, 1),
                        "missing": e.missing()})
        return out

    def stats(self) -> dict[str, Any]:
        return {"spine_entries": len(self.order), "rows_buffered": self.rows_buffered,
                "early_txns": sum(1 for e in list(self.by_key.values()) if not e.queued),
                "duplicates": self.duplicates, "dropped_done": self.dropped, "foreign": self.foreign,
                "orphans": self.orphans, "abandoned": self.abandoned}


def owned_by(patterns: Iterable[str]) -> Callable[[str, str], bool]:
    """``db.table`` glob patterns (``*``, ``?``; backticks quote a part with dots, ```` `` ```` is a backtick
    in it, as in filter rules; ``db`` alone is ``db.*``) -> a test. ValueError for a pattern that does not
    read (an unterminated backtick, text after the table)."""
    import fnmatch

    pats: list[tuple[str, str]] = []
    for p in patterns:
        p = p.strip()
        if not p:
            continue
        pats.append(split_pattern(p))
    if not pats or ("*", "*") in pats:
        return lambda db, table: True
    cache: dict[tuple[str, str], bool] = {}

    def owns(db: str, table: str) -> bool:
        hit = cache.get((db, table))
        if hit is None:
            hit = cache[(db, table)] = any(fnmatch.fnmatchcase(db, a) and fnmatch.fnmatchcase(table, b)
                                           for a, b in pats)
        return hit

    return owns


