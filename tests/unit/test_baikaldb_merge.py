"""The BaikalDB region's merge and schema switches without servers: random
interleavings of three binlog regions over two partitions, multi-partition
transactions, fakes, transactions on consecutive TSOs, and schema switches of
one to many statements (a changed table, tables linked anew) seen at a random
point. Then a crash after a random item and a restart from the position of an
earlier item (the checkpoint), with the schema journal as it was at the crash.

Invariants, for the first run and for the restart:

* the items are in an order the capturer's merger accepts (DDL preludes share
  the commit_ts of the transaction they precede, nothing else does);
* every part of a transaction leaves in one transaction, none missing (in the
  first run: none twice);
* a position never promises more than was delivered: every entry at or below an
  item's position ts has left by then (a restart from it loses nothing);
* a schema switch names the new epoch only on its last statement;
* a restart sends again what it sends at an identity the first run had already
  delivered exactly as the first run did (same DDL, same rows, same position):
  copies are identifiable by ``(region, commit_ts, seq)``;
* no transaction is decoded without a column its table had when it committed.
"""

from __future__ import annotations

import collections
import random
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from capturer.model import TsPosition, Txn, protogen
from capturer.pipeline.merger import Merger
from capturer.regions.baikaldb.region import BaikalRegion, Epoch
from capturer.regions.baikaldb.rows import Entry, RowPlan
from capturer.regions.baikaldb.schema import FieldDef, TableDef
from capturer.regions.baikaldb.tso import from_commit_ts
from capturer.regions.base import RegionContext
from capturer.util.bqueue import WeightedQueue

P = protogen.load("baikaldb")
V1 = TableDef(10, "n", "d", "t", 1, (FieldDef(1, "id", 6), FieldDef(2, "v", 13)), ("id",))
V2 = TableDef(10, "n", "d", "t", 2, V1.fields + (FieldDef(3, "w", 6),), ("id",))
# tables linked anew at the switch: CREATE TABLE each (and CREATE DATABASE for some)
NEW = [TableDef(100 + i, "n", f"db{i % 9}", f"u{i}", 1, (FieldDef(1, "k", 5),), ("k",)) for i in range(20)]
REGIONS = (1, 2, 3)  # regions 1, 2: partition 0; region 3: partition 1


def region(tmp: Path, create_tables: bool, start: TsPosition | None = None
           ) -> tuple[BaikalRegion, WeightedQueue[Any]]:
    cfg = SimpleNamespace(name="bk", binlogTableID=20, metaServer=("127.0.0.1:1",), connect_timeout=0.05,
                          request_timeout=0.05, unpaired_update="error", create_tables=create_tables,
                          region_buffer=1000, binlogRegionID=(), schema_refresh=10 ** 9)
    out: WeightedQueue[Any] = WeightedQueue(10 ** 7)
    ctx = RegionContext(out, start, 0, None, threading.Event(), 0, "", tmp / "cp")  # type: ignore[arg-type]
    return BaikalRegion(cfg, ctx), out


def first_run_region(tmp: Path, create_tables: bool) -> tuple[BaikalRegion, WeightedQueue[Any]]:
    r, out = region(tmp, create_tables)
    r.journal.write(1, Epoch({10: V1}))
    r.tables, r.plans, r.epoch, r._initialised = {10: V1}, {10: RowPlan(V1)}, 1, True
    r.partitions = 2
    r._starts = dict.fromkeys(REGIONS, 1000)
    r.last_emitted = 1000
    return r, out


def restarted_region(tmp: Path, create_tables: bool, pos: TsPosition, defs: dict[int, TableDef]
                     ) -> tuple[BaikalRegion, WeightedQueue[Any]]:
    """As ``_discover`` starts a region from a checkpointed position (the meta
    answering with today's schemas; the TSO service unreachable, so anything
    seen now is due only later)."""
    r, out = region(tmp, create_tables, pos)
    # the meta (not reachable in a unit test): today's schemas; its TSO service: later than everything here
    r._linked = lambda meta=None: (None, defs, 2)  # type: ignore[method-assign]
    r._now_tso = lambda meta=None: 10 ** 15  # type: ignore[method-assign]
    r._init_schemas(defs)
    r._initialised = True
    r.partitions = 2
    r._starts = {rid: pos.resume_ts(rid) for rid in REGIONS}
    return r, out


def entry(ts: int, rid: int, txn: int, table: int = 10, w: bool = False) -> Entry:
    m = P.TableMutation(table_id=table)
    m.sequence.append(0)
    row = bytes([0x08, (txn * 2) & 0x7F])
    if w:  # written after the change: carries the new column (field 3)
        row += bytes([0x18, 0x02])
    m.insert_rows.append(row)
    return Entry(ts, rid, False, txn, ts - 5, [m])


def drain(q: WeightedQueue[Any]) -> list[Any]:
    out = []
    while (x := q.get(timeout=0)) is not None:
        out.append(x)
    return out


def feed(r: BaikalRegion, out: WeightedQueue[Any], per: dict[int, list[Entry]], rnd: random.Random,
         after: dict[int, int], on_item: Any = None) -> list[Any]:
    """Entries of each region after ``after[rid]``, arriving in a random interleaving."""
    todo = {rid: [e for e in es if e.ts > after[rid]] for rid, es in per.items()}
    buffers: dict[int, collections.deque[Entry]] = {rid: collections.deque() for rid in per}
    latest = dict(after)
    idx = dict.fromkeys(per, 0)
    items: list[Any] = []
    while any(idx[rid] < len(todo[rid]) for rid in idx):
        rid = rnd.choice([k for k in idx if idx[k] < len(todo[k])])
        for _ in range(rnd.randint(1, 3)):
            if idx[rid] < len(todo[rid]):
                e = todo[rid][idx[rid]]
                idx[rid] += 1
                buffers[rid].append(e)
                latest[rid] = e.ts
        r._advance(buffers, min(latest.values()))
        for it in drain(out):
            items.append(it)
            if on_item is not None:
                on_item(it)
    return items


def ident(it: Txn) -> tuple[int, int | None]:
    return (it.commit_ts, it.ddl.seq if it.ddl is not None else None)


def body(it: Txn) -> Any:
    rows = tuple(tuple(sorted((ch.after or {}).items())) for ch in it.changes)
    return (it.ddl.sql if it.ddl else None, it.gtid, rows, it.position.to_json())


def check(items: list[Any], data: dict[int, Entry], parts: dict[int, set[int]], before: set[int],
          once: bool, label: str) -> tuple[list[str], set[int]]:
    problems: list[str] = []
    m = Merger(["bk"])
    delivered = set(before)
    seen_txn: collections.Counter[int] = collections.Counter()
    epochs_of_switch: dict[int, list[int]] = collections.defaultdict(list)
    for it in items:
        try:
            m.offer(it)
            m.pop()
        except Exception as exc:
            problems.append(f"{label}: the merger refuses {type(it).__name__} at {from_commit_ts(it.commit_ts)}: {exc}")
            break
        t = from_commit_ts(it.commit_ts)
        if isinstance(it, Txn):
            if it.ddl is not None:
                epochs_of_switch[it.commit_ts].append(it.position.epoch)
            else:
                tid = int(it.gtid.split("-")[1])
                seen_txn[tid] += 1
                delivered |= parts[tid]
                if not parts[tid] <= {e for e in data if e <= t}:
                    problems.append(f"{label}: txn {tid} left at {t} before its part(s)")
                # a row written after the change carries field 3: decoded, never dropped
                for e in (data[x] for x in parts[tid]):
                    wrote_w = any(len(rw) > 2 for mm in e.mutations for rw in mm.insert_rows)
                    if wrote_w and not any("w" in (ch.after or {}) for ch in it.changes):
                        problems.append(f"{label}: txn {tid} at {t} lost the column w its row carries")
        lost = [e for e in data if e <= it.position.ts and e not in delivered]
        if lost:
            problems.append(f"{label}: {type(it).__name__} at {t}: position {it.position.ts} passes undelivered "
                            f"{sorted(lost)[:5]}")
    for tid, ps in parts.items():
        if once and seen_txn[tid] > 1:
            problems.append(f"{label}: txn {tid} (parts {sorted(ps)}) delivered {seen_txn[tid]} times")
    for ts, eps in epochs_of_switch.items():
        if len(eps) > 1 and (len(set(eps[:-1])) != 1 or eps[-1] == eps[0]):
            problems.append(f"{label}: DDL epochs {eps} at {from_commit_ts(ts)}: only the last names the new one")
    return problems, delivered


def run(seed: int, create_tables: bool, tmp: Path) -> list[str]:
    rnd = random.Random(seed)
    per: dict[int, list[Entry]] = {rid: [] for rid in REGIONS}
    parts: dict[int, set[int]] = {}
    ts, txn = 1001, 0
    n_txns = 60
    switch_at = rnd.randint(0, n_txns)  # the change is made in the source before this transaction
    obs = None
    for i in range(n_txns):
        ts += rnd.choice([1, 1, 1, 2, 5, 20])  # consecutive TSOs, mostly
        if i == switch_at:
            obs = ts + rnd.choice([0, 3, 40])  # the meta shows it a little later
        x = rnd.random()
        if x < 0.15:
            for rid in REGIONS:
                ts += rnd.choice([1, 3])
                per[rid].append(Entry(ts, rid, True))
        else:
            txn += 1
            n = 2 if x < 0.5 else 1
            rids = [rnd.choice([1, 2]), 3][:n] if n == 2 else [rnd.choice(REGIONS)]
            rnd.shuffle(rids)
            parts[txn] = set()
            for rid in rids:
                per[rid].append(entry(ts, rid, txn, w=obs is not None and ts > obs and rnd.random() < 0.5))
                parts[txn].add(ts)
                ts += rnd.choice([1, 1, 2])  # parts of one TSO batch, maybe with other tables' parts between
    if obs is None:
        obs = ts
    for rid in REGIONS:  # the regions go on (fakes), well past the last transaction
        ts += 500
        per[rid].append(Entry(ts, rid, True))
    n_new = rnd.choice([0, 1, 2, 20]) if create_tables else 0
    meta_now = {10: V2, **{d.table_id: d for d in NEW[:n_new]}}
    data = {e.ts: e for es in per.values() for e in es if not e.fake}

    # the first run, recording the schema journal as it is when each item leaves
    r, out = first_run_region(tmp, create_tables)
    r.pending = {tid: (d, obs) for tid, d in meta_now.items()}
    jpath = tmp / "cp.baikaldb.bk"
    journal_at: list[bytes] = []
    items = feed(r, out, per, rnd, dict.fromkeys(REGIONS, 1000),
                 lambda it: journal_at.append(jpath.read_bytes() if jpath.exists() else b""))
    problems, _ = check(items, data, parts, set(), True, "first run")
    if problems:
        return problems
    if not any(isinstance(it, Txn) and it.ddl is not None for it in items) and r.pending:
        return [f"the switch never happened (pending {sorted(r.pending)})"]

    # kill -9 after item `crash`; the checkpoint holds the position of item `cp` <= crash
    crash = rnd.randrange(len(items))
    cp = rnd.randint(0, crash)
    pos = items[cp].position
    jpath.write_bytes(journal_at[crash])
    delivered_before = {e for e in data if e <= pos.ts}
    r2, out2 = restarted_region(tmp, create_tables, pos, meta_now)
    items2 = feed(r2, out2, per, rnd, {rid: pos.resume_ts(rid) for rid in REGIONS})
    problems, delivered = check(items2, data, parts, delivered_before, False, f"restart from item {cp}")
    missing = set(data) - delivered
    if missing:
        problems.append(f"restart from item {cp}: entries never delivered: {sorted(missing)[:5]}")
    first = {ident(it): body(it) for it in items[: crash + 1] if isinstance(it, Txn)}
    for it in items2:
        if isinstance(it, Txn) and ident(it) in first and first[ident(it)] != body(it):
            problems.append(f"restart from item {cp} (crash after {crash}): {ident(it)} sent again differently: "
                            f"{first[ident(it)]} != {body(it)}")
    return problems


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10 ** 9), create_tables=st.booleans())
def test_merge_switches_and_restarts(seed: int, create_tables: bool, tmp_path_factory: Any) -> None:
    tmp = tmp_path_factory.mktemp("bk")
    assert run(seed, create_tables, tmp) == []


def test_a_switch_of_many_statements_between_consecutive_tsos(tmp_path: Path) -> None:
    """30 DDL statements (20 tables linked anew in 9 new databases, one ALTER) in
    front of a transaction whose TSO follows the previous one's by 1: no free
    commit_ts is needed, the rows keep their new column."""
    r, out = first_run_region(tmp_path, True)
    r.pending = {10: (V2, 1001), **{d.table_id: (d, 1001) for d in NEW}}
    per = {1: [entry(1002, 1, 1), entry(1003, 1, 2, w=True), Entry(1100, 1, True)],
           2: [Entry(1100, 2, True)], 3: [Entry(1100, 3, True)]}
    items = feed(r, out, per, random.Random(1), dict.fromkeys(REGIONS, 1000))
    txns = [it for it in items if isinstance(it, Txn)]
    ddl = [it for it in txns if it.ddl is not None]
    assert len(ddl) == 9 + 20 + 1  # CREATE DATABASE x9, CREATE TABLE x20, ALTER TABLE
    assert [it.ddl.seq for it in ddl] == list(range(-30, 0))
    assert {from_commit_ts(it.commit_ts) for it in ddl} == {1002}
    data = [it for it in txns if it.ddl is None]
    assert [from_commit_ts(it.commit_ts) for it in data] == [1002, 1003]
    assert data[1].changes[0].after == {"id": 2, "v": None, "w": 1}
    assert r.counters["schema_switches"] == 21
