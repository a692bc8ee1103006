"""The BaikalDB region's merge without servers: random interleavings of three
binlog regions over two partitions, multi-partition transactions, fakes, and a
schema change seen at a random point. Invariants:

* transactions leave with strictly increasing commit_ts, heartbeats never go back;
* every part of a transaction leaves in one transaction, none twice, none missing;
* a position never promises more than was delivered: every entry at or below an
  item's position ts has left by then (a restart from it loses nothing);
* the DDL of a schema switch names the new epoch only on its last statement.
"""

from __future__ import annotations

import collections
import random
import threading
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from capturer import protogen
from capturer.bqueue import WeightedQueue
from capturer.model import Heartbeat, Txn
from capturer.regions.baikaldb.region import BaikalRegion
from capturer.regions.baikaldb.rows import Entry, RowPlan
from capturer.regions.baikaldb.schema import FieldDef, TableDef
from capturer.regions.baikaldb.tso import from_commit_ts
from capturer.regions.base import RegionContext

P = protogen.load("baikaldb")
V1 = TableDef(10, "n", "d", "t", 1, (FieldDef(1, "id", 6), FieldDef(2, "v", 13)), ("id",))
V2 = TableDef(10, "n", "d", "t", 2, V1.fields + (FieldDef(3, "w", 6),), ("id",))
V2_NEW = TableDef(11, "n", "d2", "u", 1, (FieldDef(1, "k", 5),), ("k",))


def region(create_tables: bool) -> tuple[BaikalRegion, WeightedQueue[Any]]:
    cfg = SimpleNamespace(name="bk", binlogTableID=20, metaServer=("127.0.0.1:1",), connect_timeout=0.1,
                          request_timeout=0.1, unpaired_update="error", create_tables=create_tables,
                          region_buffer=1000, binlogRegionID=())
    out: WeightedQueue[Any] = WeightedQueue(10 ** 7)
    r = BaikalRegion(cfg, RegionContext(out, None, 0, None, threading.Event(), 0, "", None))  # type: ignore[arg-type]
    r.tables, r.plans = {10: V1}, {10: RowPlan(V1)}
    r.partitions, r.epoch = 2, 1
    r.journal.epochs = {1: dict(r.tables)}
    r._starts = {1: 1000, 2: 1000, 3: 1000}
    r.last_emitted = 1000
    return r, out


def entry(ts: int, rid: int, txn: int, table: int = 10) -> Entry:
    m = P.TableMutation(table_id=table)
    m.sequence.append(0)
    m.insert_rows.append(bytes([0x08, (txn * 2) & 0x7F]))
    return Entry(ts, rid, False, txn, ts - 5, [m])


def drain(q: WeightedQueue[Any]) -> list[Any]:
    out = []
    while (x := q.get(timeout=0)) is not None:
        out.append(x)
    return out


def run(seed: int, create_tables: bool) -> list[str]:
    rnd = random.Random(seed)
    r, out = region(create_tables)
    per: dict[int, list[Entry]] = {1: [], 2: [], 3: []}  # regions 1, 2: partition 0; region 3: partition 1
    parts: dict[int, set[int]] = {}
    ts, txn = 1020, 0  # (a DDL needs a free commit_ts above the resume point, 1000)
    for _ in range(60):
        ts += rnd.choice([1, 1, 2, 5, 20])
        x = rnd.random()
        if x < 0.2:
            for rid in (1, 2, 3):
                ts += rnd.choice([1, 3])
                per[rid].append(Entry(ts, rid, True))
        else:
            txn += 1
            n = 2 if x < 0.5 else 1
            rids = [rnd.choice([1, 2]), 3][:n] if n == 2 else [rnd.choice([1, 2, 3])]
            rnd.shuffle(rids)
            parts[txn] = set()
            for rid in rids:
                per[rid].append(entry(ts, rid, txn))
                parts[txn].add(ts)
                ts += rnd.choice([1, 1, 2])  # parts of one TSO batch, maybe with other tables' parts between
    obs = rnd.randint(1000, ts)
    for rid in (1, 2, 3):  # the regions go on (fakes), well past the last transaction
        ts += 500
        per[rid].append(Entry(ts, rid, True))
    r.pending = {10: (V2, obs)}
    if create_tables:
        r.pending[11] = (V2_NEW, obs)
    buffers: dict[int, collections.deque[Entry]] = {rid: collections.deque() for rid in per}
    latest = {rid: 1000 for rid in per}
    idx = {rid: 0 for rid in per}
    items: list[Any] = []
    while any(idx[rid] < len(per[rid]) for rid in idx):
        rid = rnd.choice([k for k in idx if idx[k] < len(per[k])])
        for _ in range(rnd.randint(1, 3)):
            if idx[rid] < len(per[rid]):
                e = per[rid][idx[rid]]
                idx[rid] += 1
                buffers[rid].append(e)
                latest[rid] = e.ts
        r._advance(buffers, min(latest.values()))
        items += drain(out)
    problems = []
    if r.counters.get("ddl_late"):
        problems.append(f"{r.counters['ddl_late']} DDL placed late (a transaction without its new columns)")
    data = {e.ts: e for es in per.values() for e in es if not e.fake}
    delivered: set[int] = set()
    seen_txn: collections.Counter[int] = collections.Counter()
    last_txn = last_any = -1
    ddl_epochs: list[tuple[int, int]] = []
    for it in items:
        t = from_commit_ts(it.commit_ts)
        if isinstance(it, Txn):
            if t <= last_txn or t < last_any:
                problems.append(f"transaction at {t} after {max(last_txn, last_any)}")
            last_txn = t
            if it.ddl is not None:
                ddl_epochs.append((t, it.position.epoch))
            else:
                tid = int(it.gtid.split("-")[1])
                seen_txn[tid] += 1
                delivered |= parts[tid]
                if not parts[tid] <= {e for e in data if e <= t}:
                    problems.append(f"txn {tid} left at {t} before its part(s)")
        elif isinstance(it, Heartbeat) and t < last_any:
            problems.append(f"heartbeat {t} after {last_any}")
        last_any = max(last_any, t)
        lost = [e for e in data if e <= it.position.ts and e not in delivered]
        if lost:
            problems.append(f"{type(it).__name__} at {t}: position {it.position.ts} passes undelivered {lost}")
    for tid, ps in parts.items():
        if seen_txn[tid] != 1:
            problems.append(f"txn {tid} (parts {sorted(ps)}) delivered {seen_txn[tid]} times")
    if len(ddl_epochs) > 1:
        epochs = [e for _, e in ddl_epochs]
        if epochs[:-1] != [1] * (len(epochs) - 1) or epochs[-1] == 1:
            problems.append(f"DDL epochs {epochs}: only the last statement may name the new epoch")
    return problems


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10 ** 9), st.booleans())
def test_merge_invariants(seed: int, create_tables: bool) -> None:
    assert run(seed, create_tables) == []
