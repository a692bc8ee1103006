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
came (a slow broker is given time as long as it answers).

After DDL the last message of a key carries the columns of its time; the reader
brings it to the table's current schema as a consumer applying the stream would
(``SchemaLog``): the DDL the sender published (``schema_topic``, else the ``DDL``
records of ``txn_topic``) is read with the table's topics and applied, in the
region's order, to each key's last image written before it: an added column takes
its constant DEFAULT (capturer/model/ddl.py ``row_steps``, the parser the lake and the
file's replay use), a dropped one goes, a renamed one moves, a RENAME TABLE takes the
rows to the new name (the old name's topics are read too when the ``topic`` pattern
names the table), DROP TABLE and TRUNCATE remove them. A key seen in several topics
(a renamed table's) is the newest of its messages there, a delete included."""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from capturer.model import Ddl, protogen
from capturer.model.ddl import RowStep, apply_row_steps, clean, dropped_tables, row_steps, table_renames
from senders.kafka.client import ConfluentTopicReader, KafkaMessage, KafkaPythonTopicReader
from senders.kafka.format import Name, decode, is_truncate

_TOPIC_BAD = re.compile(r"[^a-zA-Z0-9._-]")


@dataclass
class _Ddl:
    """One DDL of the stream, read for what it does to rows written before it."""

    db: str
    table: str
    drops: list[tuple[str, str]]  # (db, "") a whole database
    steps: list[RowStep]  # an ALTER TABLE's column changes (capturer/model/ddl.py row_steps)
    renames: list[tuple[Name, Name]]  # after the column changes, in the statement's order


_CREATE_OR_REPLACE = re.compile(r"^\s*CREATE\s+OR\s+REPLACE\s+(?:TEMPORARY\s+)?TABLE\b", re.I)


class SchemaLog:
    """The DDL the sender published, per region in the stream's order; ``plan`` says what
    becomes of a row a region wrote at a commit_ts: the table it is in now (None: dropped
    or truncated since) and the column changes to apply to its image."""

    def __init__(self) -> None:
        self.at: dict[str, list[tuple[int, int]]] = {}  # region -> [(commit_ts, prelude seq or 0)], sorted
        self.ddls: dict[str, list[_Ddl]] = {}  # region -> its DDL, in the order of ``at``
        self.renames = False  # a table or a column was renamed (keys are then matched across topics)
        self._plans: dict[tuple[str, int, Name], tuple[Name | None, tuple[RowStep, ...]]] = {}

    def add(self, region: str, commit_ts: int, seq: int, db: str, table: str, sql: str, session_db: str) -> None:
        steps = row_steps(sql) if table else []
        drops = dropped_tables(sql, session_db or db)
        if (table and is_truncate(Ddl(db, sql, table, session_db, seq))) or (table and _CREATE_OR_REPLACE.match(clean(sql))):
            drops.append((db, table))
        d = _Ddl(db, table, drops, steps, table_renames(sql, db, table, session_db))
        if not (d.drops or d.steps or d.renames):
            return
        self.renames = self.renames or bool(d.renames) or any(s[0] == "rename" for s in steps)
        key = (commit_ts, seq if seq < 0 else 0)
        at = self.at.setdefault(region, [])
        i = bisect.bisect_right(at, key)
        at.insert(i, key)
        self.ddls.setdefault(region, []).insert(i, d)
        self._plans.clear()

    def plan(self, region: str, commit_ts: int, name: Name) -> tuple[Name | None, tuple[RowStep, ...]]:
        at = self.at.get(region)
        if not at:
            return name, ()
        i = bisect.bisect_right(at, (commit_ts, 0))  # the DDL after the row (a prelude at its commit_ts is before)
        if i == len(at):
            return name, ()
        hit = self._plans.get((region, i, name))
        if hit is None:
            cur: Name | None = name
            steps: list[RowStep] = []
            for d in self.ddls[region][i:]:
                assert cur is not None
                if cur in d.drops or (cur[0], "") in d.drops:
                    cur = None
                    break
                if d.steps and cur == (d.db, d.table):
                    steps += d.steps
                for old, new in d.renames:
                    if cur == old:
                        cur = new
            hit = self._plans[(region, i, name)] = (cur, tuple(steps))
        return hit

    def sources(self, name: Name) -> set[Name]:
        """``name`` and every table renamed (in any region, maybe in several steps) into it."""
        out = {name}
        pairs = [p for ds in self.ddls.values() for d in ds for p in d.renames]
        grew = True
        while grew:
            grew = False
            for old, new in pairs:
                if new in out and old not in out:
                    out.add(old)
                    grew = True
        return out


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default


def _ddl_of(m: KafkaMessage, fmt: str) -> tuple[str, str, str, str] | None:
    """``(db, table, sql, session_db)`` of a message of the schema topic (or a ``DDL``
    record of the transaction topic), None for anything else."""
    if m.value is None:
        return None
    if fmt == "protobuf" and not m.value.lstrip().startswith(b"{"):
        pb = protogen.load()
        r = pb.RowChange.FromString(m.value)
        return (r.db, r.table, r.sql, "") if r.op == pb.RowChange.DDL else None
    d = json.loads(m.value)
    if not isinstance(d, dict):
        return None
    if "ddl" in d and isinstance(d.get("source"), dict):  # json
        src = d["source"]
        return src.get("db") or "", src.get("table") or "", d["ddl"], src.get("session_db") or ""
    if d.get("isDdl") and "sql" in d:  # canal
        return d.get("database") or "", d.get("table") or "", d["sql"], ""
    if d.get("status") == "DDL":  # txn_topic
        return d.get("db") or "", d.get("table") or "", d.get("sql") or "", d.get("session_db") or ""
    return None


_NEWEST = 1 << 63  # a message without a commit_ts header: no DDL is after it


def _text(row: dict[str, Any]) -> str:
    """A row's text for the keyless rows' index (rows equal by == but written otherwise are found by a scan)."""
    return json.dumps(row, sort_keys=True, default=repr)


class KafkaState:
    """The tables as the messages applied so far leave them (see the module docstring).
    Messages of ``ddl_topic`` feed the ``SchemaLog``."""

    def __init__(self, fmt: str = "json", ddl_topic: str = "") -> None:
        self.fmt = fmt
        self.ddl_topic = ddl_topic
        self.log = SchemaLog()
        # (topic, partition) -> (table, message key) -> (region, commit_ts, row; None: deleted)
        self.keyed: dict[tuple[str, int], dict[tuple[Name, bytes], tuple[str, int, dict[str, Any] | None]]] = {}
        # (topic, partition) -> {n: (table, region, commit_ts, row)} in the order written; deletes that found
        # no equal row there
        self.keyless: dict[tuple[str, int], dict[int, tuple[Name, str, int, dict[str, Any]]]] = {}
        # (topic, partition, table, the row's JSON text) -> its entries' numbers in ``keyless``: a delete finds
        # one equal row without a scan of the partition's rows (a scan per delete made verify of a keyless
        # table of 100,000 rows with as many deletes take minutes); a row not found so is still scanned for
        self._bag_index: dict[tuple[str, int, Name, str], list[int]] = {}
        self._bag_n = 0
        self.unmatched: list[tuple[Name, str, int, dict[str, Any]]] = []
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
        region, ts = h.get("region", ""), _int(h.get("commit_ts"), _NEWEST)
        if m.topic == self.ddl_topic:
            ddl = _ddl_of(m, self.fmt)
            if ddl is not None and ts != _NEWEST:
                self.log.add(region, ts, _int(h.get("seq"), 0), *ddl)
            return
        change = decode(m.value, self.fmt)
        if change is None:
            return  # not a row change (e.g. a transaction record)
        name, op, before, after = change
        part = (m.topic, m.partition)
        rows = self.keyed.setdefault(part, {})
        bag = self.keyless.setdefault(part, {})
        if op == "t":
            for k in [k for k in rows if k[0] == name]:
                del rows[k]
            for i in [i for i, e in bag.items() if e[0] == name]:
                del bag[i]  # (their numbers left in the index are skipped: gone from the bag)
        elif m.key is None:
            if op in ("u", "d") and before is not None:
                i = self._bag_find(part, bag, name, before)
                if i >= 0:
                    del bag[i]
                else:  # written before a DDL, maybe in a renamed table's topic: matched in ``rows``
                    self.unmatched.append((name, region, ts, before))
            if op in ("c", "u", "r") and after is not None:
                self._bag_n += 1
                bag[self._bag_n] = (name, region, ts, after)
                self._bag_index.setdefault((*part, name, _text(after)), []).append(self._bag_n)
        elif op in ("c", "u", "r") and after is not None:
            rows[(name, m.key)] = (region, ts, after)
        elif op == "d":
            rows[(name, m.key)] = (region, ts, None)

    def _bag_find(self, part: tuple[str, int], bag: dict[int, tuple[Name, str, int, dict[str, Any]]], name: Name,
                  before: dict[str, Any]) -> int:
        """The number of one row of ``name`` equal to ``before`` in the partition's bag (-1: none)."""
        nums = self._bag_index.get((*part, name, _text(before)))
        while nums:
            i = nums.pop()
            e = bag.get(i)
            if e is not None and e[0] == name and e[3] == before:
                return i
        return next((i for i, e in bag.items() if e[0] == name and e[3] == before), -1)

    def _now(self, region: str, ts: int, name: Name, row: dict[str, Any] | None) -> tuple[Name | None, bool, Any]:
        """Where a row written at ``ts`` is now, whether the DDL since moved it (another table or
        renamed columns), and its image in the table's current columns."""
        to, steps = self.log.plan(region, ts, name)
        if to is None:
            return None, True, None
        if steps and row is not None:
            row = apply_row_steps(row, list(steps))
        return to, to != name or any(s[0] == "rename" for s in steps), row

    def _key(self, key: bytes, region: str, ts: int, name: Name) -> Any:
        """A message key in the table's current column names (matched across topics)."""
        try:
            d = json.loads(key, parse_float=str, parse_int=str)
        except ValueError:
            return key
        if not isinstance(d, dict):
            return key
        _, steps = self.log.plan(region, ts, name)
        for what, a, b in steps:
            if what == "rename" and a in d:
                d = {(b if c == a else c): v for c, v in d.items()}
        return tuple((c, json.dumps(v) if isinstance(v, (list, dict)) else v) for c, v in d.items())

    def tables(self) -> dict[Name, list[dict[str, Any]]]:
        names: set[Name | None] = set()
        for part_rows in self.keyed.values():
            names |= {self.log.plan(region, ts, n)[0] for (n, _), (region, ts, _) in part_rows.items()}
        for bag in self.keyless.values():
            names |= {self.log.plan(region, ts, n)[0] for n, region, ts, _ in bag.values()}
        out: dict[Name, list[dict[str, Any]]] = {}
        for n in names:
            got = self.rows(n) if n is not None else []
            if got and n is not None:
                out[n] = got
        return out

    def rows(self, name: Name) -> list[dict[str, Any]]:
        if not self.log.at:  # no DDL: each key's newest message, as it is
            out = [row for part_rows in self.keyed.values() for (n, _), (_, _, row) in part_rows.items()
                   if n == name and row is not None]
            return out + [row for bag in self.keyless.values() for n, _, _, row in bag.values() if n == name]
        return self._keyed_rows(name) + self._keyless_rows(name)

    def _keyed_rows(self, name: Name) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        newest: dict[Any, int] = {}
        moved: list[tuple[Any, int, dict[str, Any]]] = []
        for part_rows in self.keyed.values():
            for (n, key), (region, ts, row) in part_rows.items():
                to, was_moved, row = self._now(region, ts, n, row)
                if to != name:
                    continue
                if not self.log.renames:  # a key keeps its topic and its bytes
                    if row is not None:
                        out.append(row)
                    continue
                k = self._key(key, region, ts, n)
                newest[k] = max(newest.get(k, -1), ts)
                if was_moved:
                    if row is not None:
                        moved.append((k, ts, row))
                elif row is not None:
                    out.append(row)
        # a row a RENAME brought (from the old name's topic, or under old key columns) unless the key
        # has a newer message since (an update or a delete under the new names)
        return out + [row for k, ts, row in moved if ts >= newest[k]]

    def _keyless_rows(self, name: Name) -> list[dict[str, Any]]:
        got: list[tuple[int, dict[str, Any]]] = []
        for bag in self.keyless.values():
            for n, region, ts, row in bag.values():
                to, _, now = self._now(region, ts, n, row)
                if to == name:
                    got.append((ts, now))
        for n, region, ts, before in self.unmatched:
            to, _, now = self._now(region, ts, n, before)
            if to != name:
                continue
            i = next((i for i, (t, r) in enumerate(got) if t < ts and r == now), -1)
            if i >= 0:
                del got[i]
        return [r for _, r in got]


def rebuild_kafka(messages: Iterable[KafkaMessage], ddl_topic: str = "capturer.schema_changes",
                  fmt: str = "json") -> dict[Name, list[dict[str, Any]]]:
    """The tables the messages leave, applied per partition in offset order."""
    st = KafkaState(fmt, ddl_topic)
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
        # the DDL the sender published: its schema topic, else the DDL records of its transaction topic
        self.ddl_topic = options.get("schema_topic") or options.get("txn_topic") or ""
        self.state = KafkaState(fmt, self.ddl_topic)
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
        while True:  # the table's topics, the DDL's, and those of each table the DDL renamed into it
            want = {self._topic(db, t, r) for db, t in self.state.log.sources(dest) for r in self.regions}
            new = (want | ({self.ddl_topic} if self.ddl_topic else set())) - self.topics
            if not new:
                return self.state.rows(dest)
            self.topics |= new
            self._reader().read(sorted(new), self.state.apply, 120.0)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
