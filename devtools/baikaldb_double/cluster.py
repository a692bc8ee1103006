"""The state of a simulated BaikalDB cluster: TSO, source tables (schemas with
field ids and their rows), binlog tables and their regions (records, prewrites,
check point, oldest ts, leader, version), and a writer that commits SQL-like
transactions the way baikaldb's SQL node does (shared/reference/baikaldb-protocol.md
§1, §7): one prewrite payload per binlog partition, written to a random region
of that partition, with consecutive start_ts/commit_ts across partitions.

This is a test double (no BaikalDB server can be installed here). Its row
encoder is written from the protocol document, independently of the
capturer's decoder (capturer/regions/baikaldb/rows.py).
"""

from __future__ import annotations

import datetime as dt
import random
import struct
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from capturer.model import protogen

BASE_MS = 1577808000000
TYPES = {
    "NULL_TYPE": 1, "BOOL": 2, "INT8": 3, "INT16": 4, "INT32": 5, "INT64": 6, "UINT8": 7, "UINT16": 8,
    "UINT32": 9, "UINT64": 10, "FLOAT": 11, "DOUBLE": 12, "STRING": 13, "DATETIME": 14, "TIMESTAMP": 15,
    "DATE": 16, "HLL": 17, "TIME": 18, "BITMAP": 21, "TDIGEST": 22, "JSON": 23,
}


def pb() -> Any:
    return protogen.load("baikaldb")


# --- values on the wire (BaikalDB's primitive_to_other_type, TableRecord::encode) ---------

def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(n: int, bits: int) -> int:
    return (n << 1) ^ (n >> (bits - 1))


def pack_datetime(t: dt.datetime) -> int:
    ym = t.year * 13 + t.month
    return (ym << 46) | (t.day << 41) | (t.hour << 36) | (t.minute << 30) | (t.second << 24) | t.microsecond


def pack_date(d: dt.date) -> int:
    return ((d.year * 13 + d.month) << 5) | d.day


def pack_time(td: dt.timedelta) -> int:
    secs = int(td.total_seconds())
    neg = secs < 0
    secs = abs(secs)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    v = (h << 12) | (m << 6) | s
    return -v if neg else v


def encode_field(fid: int, typ: int, v: Any, charset: str) -> bytes:
    def tag(wt: int) -> bytes:
        return _varint((fid << 3) | wt)

    if typ in (3, 4, 5):  # INT8/16/32: sint32
        return tag(0) + _varint(_zigzag(int(v), 32) & 0xFFFFFFFF)
    if typ == 6:  # INT64: sint64
        return tag(0) + _varint(_zigzag(int(v), 64))
    if typ in (7, 8, 9, 10):
        return tag(0) + _varint(int(v))
    if typ in (1, 2):
        return tag(0) + _varint(1 if v else 0)
    if typ == 11:
        return tag(5) + struct.pack("<f", float(v))
    if typ == 12:
        return tag(1) + struct.pack("<d", float(v))
    if typ == 14:
        return tag(1) + struct.pack("<Q", pack_datetime(v))
    if typ == 16:
        return tag(5) + struct.pack("<I", pack_date(v))
    if typ == 18:
        return tag(5) + struct.pack("<i", pack_time(v))
    if typ == 15:
        secs = int((v - dt.datetime(1970, 1, 1)).total_seconds())
        return tag(5) + struct.pack("<I", secs)
    raw = v.encode(charset) if isinstance(v, str) else bytes(v)
    return tag(2) + _varint(len(raw)) + raw


# --- schemas ---------------------------------------------------------------------------

@dataclass
class Field:
    field_id: int
    name: str
    type: int
    can_null: bool = True
    deleted: bool = False
    default: Any = None  # a Python value; written into SchemaInfo as its text form


@dataclass
class Table:
    table_id: int
    db: str
    name: str
    fields: list[Field]
    pk: list[str]
    uniques: list[list[str]] = field(default_factory=list)
    binlog_table_id: int = 0
    link_field: str = ""
    version: int = 1
    namespace: str = "TEST"
    charset: int = 0  # 0 UTF8, 1 GBK
    link_style: str = "binlog_info"  # or "binlog_infos" (a later link)
    rows: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    keyless_rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def live(self) -> list[Field]:
        return [f for f in self.fields if not f.deleted]

    @property
    def codec(self) -> str:
        return "gbk" if self.charset == 1 else "utf-8"

    def key(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row.get(c) for c in self.pk)

    def encode(self, row: dict[str, Any]) -> bytes:
        """A row as the SQL node serializes it: live fields, NULL = absent."""
        out = bytearray()
        for f in self.live:
            v = row.get(f.name)
            if v is not None:
                out += encode_field(f.field_id, f.type, v, self.codec)
        return bytes(out)

    def state(self) -> list[dict[str, Any]]:
        rows = list(self.rows.values()) if self.pk else list(self.keyless_rows)
        names = [f.name for f in self.live]
        return [{n: r.get(n) for n in names} for r in rows]

    def schema_info(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "table_id": self.table_id, "table_name": self.name, "database": self.db,
            "namespace_name": self.namespace, "partition_num": 1, "version": self.version,
            "engine": "ROCKSDB", "charset": "GBK" if self.charset == 1 else "UTF8",
            "max_field_id": max(f.field_id for f in self.fields),
            "fields": [_field_json(f) for f in self.fields],
            "indexs": [],
        }
        by_name = {f.name: f.field_id for f in self.fields}
        if self.pk:
            d["indexs"].append({"index_name": "primary_key", "index_type": "I_PRIMARY", "field_names": self.pk,
                                "field_ids": [by_name[c] for c in self.pk], "index_id": self.table_id})
        for i, uk in enumerate(self.uniques):
            d["indexs"].append({"index_name": f"uk_{i}", "index_type": "I_UNIQ", "field_names": uk,
                                "field_ids": [by_name[c] for c in uk], "index_id": self.table_id * 100 + i})
        if self.binlog_table_id:
            link = {"field_name": self.link_field, "mysql_type": _type_name(self._field(self.link_field).type),
                    "field_id": by_name[self.link_field]} if self.link_field else None
            if self.link_style == "binlog_infos":
                info = {"binlog_table_id": self.binlog_table_id, **({"link_field": link} if link else {})}
                d["binlog_infos"] = [info]
            else:
                d["binlog_info"] = {"binlog_table_id": self.binlog_table_id}
                if link:
                    d["link_field"] = link
        return d

    def _field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name and not f.deleted)


def _type_name(t: int) -> str:
    return next(k for k, v in TYPES.items() if v == t)


def _field_json(f: Field) -> dict[str, Any]:
    import base64

    d: dict[str, Any] = {"field_name": f.name, "mysql_type": _type_name(f.type), "can_null": f.can_null,
                         "field_id": f.field_id, "deleted": f.deleted}
    if f.default is not None:
        text = f.default if isinstance(f.default, str) else (
            f.default.isoformat(sep=" ") if isinstance(f.default, dt.datetime) else str(f.default))
        d["default_value"] = base64.b64encode(text.encode()).decode()
    return d


# --- binlog regions ----------------------------------------------------------------------

@dataclass
class Record:
    ts: int
    fake: bool
    start_ts: int = 0
    row_cnt: int = 0


@dataclass
class Region:
    region_id: int
    table_id: int  # the binlog table
    partition_id: int
    peers: list[str]
    leader: str
    version: int = 1
    conf_version: int = 1
    records: list[Record] = field(default_factory=list)
    prewrites: dict[int, bytes] = field(default_factory=dict)  # start_ts -> payload
    pending: set[int] = field(default_factory=set)  # start_ts of prewrites not yet committed
    applied_ts: int = 0
    oldest_ts: int = 0
    # faults
    lag: dict[str, int] = field(default_factory=dict)  # peer (leader or follower) -> the last ts it has applied
    peer_version: dict[str, int] = field(default_factory=dict)  # a peer still at an older region version
    meta_leader: str | None = None  # what the meta reports as leader (stale on purpose)
    leader_unknown: bool = False  # mid-election: everybody answers NOT_LEADER 0.0.0.0:0
    follower_reads: bool = True  # followers serve OP_READ_BINLOG
    peer_oldest: dict[str, int] = field(default_factory=dict)  # a peer whose binlog starts later (a new peer)
    announce: list[int] = field(default_factory=list)  # regions a VERSION_OLD answer lists after this one

    def check_point(self) -> int:
        return min(self.pending) if self.pending else self.applied_ts

    def info(self, table_name: str, partitions: int) -> dict[str, Any]:
        return {"region_id": self.region_id, "table_name": table_name, "table_id": self.table_id,
                "partition_id": self.partition_id, "replica_num": len(self.peers), "version": self.version,
                "conf_version": self.conf_version, "peers": list(self.peers),
                "leader": self.meta_leader if self.meta_leader is not None else self.leader,
                "status": "IDLE", "used_size": 0, "log_index": len(self.records), "can_add_peer": True,
                "parent": 0, "timestamp": int(time.time()), "num_table_lines": 0, "main_table_id": self.table_id,
                "is_binlog_region": True, "partition_num": partitions}


@dataclass
class BinlogTable:
    table_id: int
    db: str
    name: str
    partitions: int
    regions: list[Region]
    namespace: str = "TEST"

    def schema_info(self, targets: list[int]) -> dict[str, Any]:
        return {"table_id": self.table_id, "table_name": self.name, "database": self.db,
                "namespace_name": self.namespace, "partition_num": self.partitions, "version": 1,
                "engine": "BINLOG", "is_binlog": True,
                "fields": [{"field_name": "ts", "mysql_type": "INT64", "field_id": 1, "can_null": False}],
                "indexs": [{"index_name": "primary_key", "index_type": "I_PRIMARY", "field_names": ["ts"],
                            "field_ids": [1], "index_id": self.table_id}],
                "binlog_info": {"target_table_ids": targets}}


class Tso:
    """Monotonic TSO: physical ms since BaikalDB's base << 18, plus a logical counter."""

    def __init__(self) -> None:
        self.last = 0

    def alloc(self, count: int = 1) -> int:
        phys = (int(time.time() * 1000) - BASE_MS) << 18
        first = max(phys, self.last + 1)
        self.last = first + count - 1
        return first


class Cluster:
    """Everything the meta and the stores serve. One lock guards it all."""

    def __init__(self, seed: int = 1):
        self.lock = threading.RLock()
        self.rng = random.Random(seed)
        self.tso = Tso()
        self.tables: dict[int, Table] = {}
        self.binlogs: dict[int, BinlogTable] = {}
        self.regions: dict[int, Region] = {}
        self.next_txn = 1_000_000
        self.stores: list[str] = []  # store peer addresses, set by the servers
        self.meta_peers: list[str] = []
        self.meta_leader = ""
        self.meta_init = True  # False: HAVE_NOT_INIT
        self.commits = 0
        self.rollbacks = 0

    # --- setup -------------------------------------------------------------------------
    def create_binlog_table(self, table_id: int, db: str, name: str, partitions: int, regions_per_partition: int,
                            replicas: int = 3, first_region_id: int = 0) -> BinlogTable:
        with self.lock:
            regions = []
            rid = first_region_id or table_id * 100 + 1
            for p in range(partitions):
                for _ in range(regions_per_partition):
                    peers = self.rng.sample(self.stores, min(replicas, len(self.stores)))
                    r = Region(rid, table_id, p, peers, peers[0])
                    r.applied_ts = r.oldest_ts = self.tso.alloc()
                    regions.append(r)
                    self.regions[rid] = r
                    rid += 1
            bt = BinlogTable(table_id, db, name, partitions, regions)
            self.binlogs[table_id] = bt
            return bt

    def add_region(self, binlog_table_id: int, partition: int) -> Region:
        """A new binlog region of a partition (BaikalDB does not split binlog regions:
        this is the generic VERSION_OLD case of §6, for readers that must handle it)."""
        with self.lock:
            bt = self.binlogs[binlog_table_id]
            rid = max(self.regions) + 1
            peers = self.rng.sample(self.stores, min(3, len(self.stores)))
            r = Region(rid, binlog_table_id, partition, peers, peers[0])
            r.applied_ts = r.oldest_ts = self.tso.alloc()
            bt.regions.append(r)
            self.regions[rid] = r
            return r

    def create_table(self, table_id: int, db: str, name: str, columns: list[tuple[Any, ...]], pk: list[str],
                     binlog_table_id: int, uniques: list[list[str]] | None = None, link_field: str = "",
                     charset: int = 0, link_style: str = "binlog_info") -> Table:
        """``columns``: (name, TYPE name, can_null=True, default=None)."""
        fields = []
        for i, c in enumerate(columns, 1):
            fields.append(Field(i, c[0], TYPES[c[1]], c[2] if len(c) > 2 else True, False,
                                c[3] if len(c) > 3 else None))
        t = Table(table_id, db, name, fields, list(pk), uniques or [], binlog_table_id,
                  link_field or (pk[0] if pk else ""), charset=charset, link_style=link_style)
        with self.lock:
            self.tables[table_id] = t
        return t

    # --- DDL (bumps the version; the binlog carries none) --------------------------------
    def add_column(self, table_id: int, name: str, typ: str, can_null: bool = True, default: Any = None) -> None:
        with self.lock:
            t = self.tables[table_id]
            fid = max(f.field_id for f in t.fields) + 1
            t.fields.append(Field(fid, name, TYPES[typ], can_null, False, default))
            t.version += 1
            for r in (t.rows.values() if t.pk else t.keyless_rows):
                r[name] = default

    def drop_column(self, table_id: int, name: str) -> None:
        with self.lock:
            t = self.tables[table_id]
            t._field(name).deleted = True
            t.version += 1
            for r in (t.rows.values() if t.pk else t.keyless_rows):
                r.pop(name, None)

    # --- writing -------------------------------------------------------------------------
    def begin(self) -> Txn:
        return Txn(self)

    def partition_of(self, t: Table, row: dict[str, Any]) -> int:
        bt = self.binlogs[t.binlog_table_id]
        v = row.get(t.link_field)
        return zlib.crc32(repr(v).encode()) % bt.partitions

    def fake(self, region_ids: Iterable[int] | None = None) -> None:
        """One FAKE record per region (leaders write one about every second)."""
        with self.lock:
            for rid in (region_ids if region_ids is not None else list(self.regions)):
                r = self.regions[rid]
                ts = self.tso.alloc()
                r.records.append(Record(ts, True))
                r.applied_ts = max(r.applied_ts, ts)

    def purge(self, region_id: int, before_ts: int) -> None:
        with self.lock:
            r = self.regions[region_id]
            r.oldest_ts = max(r.oldest_ts, before_ts)
            r.records = [x for x in r.records if x.ts >= before_ts]

    def state(self, table_id: int) -> list[dict[str, Any]]:
        with self.lock:
            return self.tables[table_id].state()

    def table_by_name(self, db: str, name: str) -> Table:
        return next(t for t in self.tables.values() if t.db == db and t.name == name)


@dataclass
class _Stmt:
    table: Table
    kind: int  # 0 insert, 1 update, 2 delete
    old: list[dict[str, Any]]
    new: list[dict[str, Any]]
    sql: str


_GONE: Any = object()


class _Overlay:
    """A transaction's view of a table's rows: its own changes over the committed
    rows, which it never changes (so a transaction costs what it touches, not the
    table's size)."""

    def __init__(self, base: dict[tuple[Any, ...], dict[str, Any]]):
        self.base = base
        self.own: dict[tuple[Any, ...], Any] = {}

    def __contains__(self, key: tuple[Any, ...]) -> bool:
        v = self.own.get(key)
        return key in self.base if v is None else v is not _GONE

    def __setitem__(self, key: tuple[Any, ...], row: dict[str, Any]) -> None:
        self.own[key] = row

    def pop(self, key: tuple[Any, ...]) -> dict[str, Any]:
        v = self.own.get(key)
        if v is None:
            v = self.base[key]
        elif v is _GONE:
            raise KeyError(key)
        self.own[key] = _GONE
        return v


class Txn:
    """A SQL transaction: statements change the tables' rows at commit; each
    binlog partition it touches gets one prewrite payload."""

    def __init__(self, cluster: Cluster):
        self.c = cluster
        self.stmts: list[_Stmt] = []
        self.prewritten: list[tuple[Region, int, bytes, int]] = []
        self.txn_id = 0
        self._view: dict[int, _Overlay] = {}  # uncommitted rows per table

    def _rows(self, t: Table) -> _Overlay:
        v = self._view.get(t.table_id)
        if v is None:
            v = self._view[t.table_id] = _Overlay(t.rows)
        return v

    def _full(self, t: Table, row: dict[str, Any]) -> dict[str, Any]:
        return {f.name: row.get(f.name, f.default) for f in t.live}

    def insert(self, table_id: int, *rows: dict[str, Any]) -> Txn:
        t = self.c.tables[table_id]
        new = [self._full(t, r) for r in rows]
        if t.pk:
            view = self._rows(t)
            for r in new:
                if t.key(r) in view:
                    raise KeyError(f"duplicate key {t.key(r)} in {t.name}")
                view[t.key(r)] = r
        self.stmts.append(_Stmt(t, 0, [], new, f"insert into {t.name}"))
        return self

    def update(self, table_id: int, changes: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> Txn:
        """``changes``: (old primary key, {column: new value}); the key may change."""
        t = self.c.tables[table_id]
        view = self._rows(t)
        old, new = [], []
        for key, upd in changes:
            o = view.pop(tuple(key))
            n = {**o, **upd}
            old.append(dict(o))
            new.append(n)
        for n in new:
            if t.key(n) in view:
                raise KeyError(f"duplicate key {t.key(n)} in {t.name}")
            view[t.key(n)] = n
        self.stmts.append(_Stmt(t, 1, old, new, f"update {t.name}"))
        return self

    def delete(self, table_id: int, *keys: tuple[Any, ...]) -> Txn:
        t = self.c.tables[table_id]
        if not t.pk:
            raise ValueError("use delete_keyless")
        view = self._rows(t)
        old = [dict(view.pop(tuple(k))) for k in keys]
        self.stmts.append(_Stmt(t, 2, old, [], f"delete from {t.name}"))
        return self

    def raw(self, table_id: int, kind: int, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> Txn:
        """A mutation exactly as given (e.g. an UPDATE with unequal counts); no row state change."""
        t = self.c.tables[table_id]
        self.stmts.append(_Stmt(t, kind, [self._full(t, r) for r in old], [self._full(t, r) for r in new], "raw"))
        return self

    # --- 2PC -----------------------------------------------------------------------------
    def prewrite(self) -> Txn:
        """Write one prewrite per binlog partition touched (random region of it).
        Until commit/rollback they hold each region's check point back."""
        c = self.c
        P = pb()
        with c.lock:
            parts: dict[tuple[int, int], list[_Stmt]] = {}
            for s in self.stmts:
                bt_id = s.table.binlog_table_id
                by_part: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
                for r in s.old:
                    by_part.setdefault(c.partition_of(s.table, r), ([], []))[0].append(r)
                for r in s.new:
                    by_part.setdefault(c.partition_of(s.table, r), ([], []))[1].append(r)
                if s.kind == 1:
                    # an update keeps its old/new pairs together (the partition of the new row)
                    by_part = {}
                    for o, n in zip(s.old, s.new):
                        p = c.partition_of(s.table, n)
                        by_part.setdefault(p, ([], []))
                        by_part[p][0].append(o)
                        by_part[p][1].append(n)
                    extra_old, extra_new = s.old[len(s.new):], s.new[len(s.old):]
                    if extra_old or extra_new:
                        p = next(iter(by_part), 0)
                        by_part.setdefault(p, ([], []))
                        by_part[p][0].extend(extra_old)
                        by_part[p][1].extend(extra_new)
                for p, (olds, news) in by_part.items():
                    parts.setdefault((bt_id, p), []).append(_Stmt(s.table, s.kind, olds, news, s.sql))
            if not parts:
                return self
            c.next_txn += 1
            self.txn_id = c.next_txn
            start = c.tso.alloc(len(parts))
            for i, ((bt_id, p), stmts) in enumerate(sorted(parts.items())):
                bt = c.binlogs[bt_id]
                region = c.rng.choice([r for r in bt.regions if r.partition_id == p])
                st = start + i
                rows = sum(len(s.old) + len(s.new) for s in stmts)
                req = P.StoreReq(op_type=P.OP_PREWRITE_BINLOG, region_id=region.region_id,
                                 region_version=region.version, log_id=c.rng.getrandbits(63),
                                 db_conn_id=c.rng.getrandbits(40))
                d = req.binlog_desc
                d.binlog_ts, d.txn_id, d.start_ts, d.primary_region_id, d.binlog_row_cnt = \
                    st, self.txn_id, st, 7001, rows
                b = req.binlog
                b.type, b.start_ts = P.PREWRITE, st
                b.partition_key = p
                for s in stmts:
                    m = b.prewrite_value.mutations.add()
                    m.table_id = s.table.table_id
                    m.sequence.append(s.kind)
                    m.sql = s.sql.encode()
                    m.sign = zlib.crc32(s.sql.encode())
                    if s.kind == 0:
                        m.insert_rows.extend(s.table.encode(r) for r in s.new)
                    elif s.kind == 2:
                        m.deleted_rows.extend(s.table.encode(r) for r in s.old)
                    else:
                        m.deleted_rows.extend(s.table.encode(r) for r in s.old)
                        m.insert_rows.extend(s.table.encode(r) for r in s.new)
                payload = req.SerializeToString()
                region.prewrites[st] = payload
                region.pending.add(st)
                self.prewritten.append((region, st, payload, rows))
        return self

    def commit(self) -> int:
        """Commit: the rows change and each prewrite gets its commit record; returns
        the last commit TSO (0 for a transaction that wrote nothing)."""
        if not self.prewritten:
            self.prewrite()
        c = self.c
        with c.lock:
            ts = 0
            if self.prewritten:
                first = c.tso.alloc(len(self.prewritten))
                for i, (region, st, _, rows) in enumerate(self.prewritten):
                    ts = first + i
                    region.pending.discard(st)
                    region.records.append(Record(ts, False, st, rows))
                    region.applied_ts = max(region.applied_ts, ts)
            for s in self.stmts:
                if s.sql == "raw":
                    continue
                t = s.table
                if t.pk:
                    # the statement's effect on the rows as they are now (other
                    # transactions may have committed since this one began)
                    for r in s.old:
                        t.rows.pop(t.key(r), None)
                    for r in s.new:
                        t.rows[t.key(r)] = dict(r)
                else:
                    for r in s.old:
                        t.keyless_rows.remove(r)
                    t.keyless_rows.extend(dict(r) for r in s.new)
            c.commits += 1
            return ts

    def rollback(self) -> None:
        c = self.c
        with c.lock:
            for region, st, _, _ in self.prewritten:
                region.pending.discard(st)
                region.prewrites.pop(st, None)
            c.rollbacks += 1


def insert_keyless(c: Cluster, table_id: int, rows: list[dict[str, Any]]) -> int:
    t = c.tables[table_id]
    tx = c.begin()
    tx.stmts.append(_Stmt(t, 0, [], [tx._full(t, r) for r in rows], "insert"))
    return tx.commit()
