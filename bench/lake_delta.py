"""Bench part ``delta`` (issue 47): the Spark sender's ``table_format=delta`` (one MERGE by primary key
per table per batch, with Delta's idempotent-write pair) next to, on the same batches of changes:

* a **raw Delta append** of the same rows (every change's image appended, one Spark write a batch: what a
  sink that keeps no current state costs on the same format, the issue's baseline for the MERGE);
* the **changelog** format (``table_format=changelog``, today's default: Parquet files a batch, merged on
  read).

The sender is driven directly (``send`` with ready-made transactions): the figure is the lake's cost,
not the capture's. The workload: one table (id BIGINT key, name, qty, price) with ``preload`` rows, then
``batches`` batches of ``changes`` changes in 10-change transactions: 4/7 inserts of new keys, 2/7
updates of recent keys, 1/7 deletes of recent keys (each key once per transaction). The three run in
turn, twice (``rounds``): the JVM warms up over the first round (the first MERGEs of a session take twice
as long), and only the last round's rates count, each without its first batch. Every output is checked:
the Delta table (read by Spark) holds exactly the expected rows (count and key sum), the changelog's
merged view the same, the raw append one row per change.

The MERGE's fixed part is measured beside it: after each batch, a MERGE of ``PROBE_ROWS`` inserts of new keys
(keys from ``PROBE_BASE`` up: no file of the table touched, nothing rewritten), timed apart from the batches
(``merge_fixed_seconds``, the median of the last round without its first); the content check leaves those keys
out and counts them.

Needs PySpark 4.2 (the Delta runtime pinned by ``senders/spark/deltajars.py``: ``sh bench/run.sh`` installs
the ``delta`` extra), Java, and the Delta jars (Maven); the part is skipped, saying why, otherwise."""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any

from capturer import config
from capturer.model import Position, RowChange, TableSchema, Txn
from senders import CATALOG

PROBE_BASE = 10**12  # the keys of the fixed-cost probes (above every key of the workload)
PROBE_ROWS = 10
SCHEMA = TableSchema("bench", "lake", ("id", "name", "qty", "price"), ("id",), (), (8, 15, 8, 5))


def workload(preload: int, batches: int, changes: int, seed: int = 7) -> tuple[list[list[Txn]], dict[int, tuple]]:
    """The batches (the first is the preload: inserts only) and the expected final rows by key."""
    rnd = random.Random(seed)
    state: dict[int, tuple[Any, ...]] = {}
    live: list[int] = []
    nxt = 0
    ts = 1_700_000_000_000 << 18
    pos = 4
    out: list[list[Txn]] = []

    def row(k: int, gen: int) -> dict[str, Any]:
        return {"id": k, "name": f"name-{k}-{gen}", "qty": k * 3 + gen, "price": float(k) / 7}

    def txns(chs: list[RowChange]) -> list[Txn]:
        nonlocal ts, pos
        res = []
        for i in range(0, len(chs), 10):
            ts += 1
            pos += 100
            res.append(Txn("r1", ts, Position("bin.000001", pos), tuple(chs[i:i + 10])))
        return res

    pre = []
    for _ in range(preload):
        r = row(nxt, 0)
        pre.append(RowChange(SCHEMA, "insert", None, r))
        state[nxt] = tuple(r.values())
        live.append(nxt)
        nxt += 1
    out.append(txns(pre))
    for b in range(1, batches + 1):
        chs: list[RowChange] = []
        while len(chs) < changes:
            used: set[int] = set()
            for _ in range(10):
                x = rnd.random()
                window = min(len(live), 50_000)
                if x < 4 / 7 or window == 0:
                    r = row(nxt, b)
                    chs.append(RowChange(SCHEMA, "insert", None, r))
                    state[nxt] = tuple(r.values())
                    live.append(nxt)
                    used.add(nxt)
                    nxt += 1
                    continue
                j = len(live) - 1 - rnd.randrange(window)
                k = live[j]
                if k in used:
                    continue
                used.add(k)
                before = dict(zip(SCHEMA.columns, state[k]))
                if x < 6 / 7:
                    r = row(k, b)
                    chs.append(RowChange(SCHEMA, "update", before, r))
                    state[k] = tuple(r.values())
                else:
                    chs.append(RowChange(SCHEMA, "delete", before, None))
                    del state[k]
                    live[j] = live[-1]
                    live.pop()
        out.append(txns(chs))
    return out, state


def _sender(tmp: Path, name: str, options: str) -> Any:
    p = tmp / f"{name}.cfg"
    p.write_text(f"[global]\ntype=spark\n[spark]\nmaster=local[2]\nbatch_interval=0\ncompaction_interval=0\n{options}")
    (sc,) = config.load_sender_config(p, CATALOG)
    from senders.spark.sender import SparkSender

    return SparkSender("spark", sc.options)


def _rate(times: list[float], sizes: list[int]) -> float:
    """Changes per second over the batches after the first (the JVM's warm-up)."""
    return sum(sizes[1:]) / max(sum(times[1:]), 1e-9)


def run(tmp: Path, preload: int = 200_000, batches: int = 5, changes: int = 20_000,
        rounds: int = 2) -> dict[str, Any]:
    from senders.spark import deltajars

    why = deltajars.incompatible()
    if why:
        return {"skipped": why}
    if shutil.which("java") is None:
        return {"skipped": "no java"}
    import pyarrow as pa

    from senders.spark.deltasink import build_delta_session

    tmp.mkdir(parents=True, exist_ok=True)
    data, want = workload(preload, batches, changes)
    sizes = [sum(len(t.changes) for t in b) for b in data[1:]]
    spark = build_delta_session({"master": "local[2]", "conf.*": {"spark.driver.memory": "1g"}}, tmp / "sparkhome")
    res: dict[str, Any] = {"preload": preload, "batches": batches, "changes_per_batch": changes,
                           "rounds": rounds, "problems": []}

    def through_sender(name: str, options: str, probe: bool = False) -> list[float]:
        s = _sender(tmp, name, options)
        s.send(data[0])
        times = []
        for b in data[1:]:
            t0 = time.perf_counter()
            s.send(b)
            times.append(time.perf_counter() - t0)
            if probe:
                # the fixed part of a MERGE: one of PROBE_ROWS inserts of new keys (no file of the table touched,
                # nothing rewritten), between two batches, outside the batches' times
                last = b[-1]
                ins = tuple(RowChange(SCHEMA, "insert", None, {"id": PROBE_BASE + len(res["merge_fixed"]) * PROBE_ROWS + i,
                                                               "name": "probe", "qty": 0, "price": 0.0})
                            for i in range(PROBE_ROWS))
                t0 = time.perf_counter()
                s.send([Txn("r2", last.commit_ts, last.position, ins)])  # (same commit_ts, later region: between batches)
                res["merge_fixed"].append(time.perf_counter() - t0)
        s.close()
        return times

    def raw_append(path: Path) -> list[float]:
        times = []
        for i, b in enumerate(data):
            chs = [c for t in b for c in t.changes]
            imgs = [c.after if c.after is not None else c.before for c in chs]
            table = pa.table({"_op": [c.op[0] for c in chs],
                              **{col: [img[col] for img in imgs] for col in SCHEMA.columns}})
            t0 = time.perf_counter()
            spark.createDataFrame(table).write.format("delta").mode("append").save(str(path))
            if i:
                times.append(time.perf_counter() - t0)
        return times

    try:
        # the three in turn, ``rounds`` times (the JVM warms up over the first: only the last round counts)
        for r in range(rounds):
            for what in ("merge", "append", "changelog"):
                where = tmp / f"{what}-{r}"
                if what == "merge":
                    res["merge_fixed"] = []
                    times = through_sender(f"merge{r}", f"table_format=delta\nwarehouse={where}\n", probe=True)
                    res[f"merge_fixed_seconds_round{r + 1}"] = [round(t, 3) for t in res.pop("merge_fixed")]
                elif what == "append":
                    times = raw_append(where)
                else:
                    times = through_sender(f"changelog{r}", f"table_format=changelog\nwarehouse={where}\n")
                res[f"{what}_batch_seconds_round{r + 1}"] = [round(t, 3) for t in times]
                res[f"{what}_changes_per_s"] = round(_rate(times, sizes))
            # each round's outputs checked: the Delta MERGE table and the changelog's merged view hold exactly the
            # expected rows, the raw append every change
            got = spark.read.format("delta").load(str(tmp / f"merge-{r}" / "bench__lake"))
            probes = got.where(f"id >= {PROBE_BASE}").count()
            if probes != batches * PROBE_ROWS:
                res["problems"].append(f"delta MERGE table: {probes} probe rows, want {batches * PROBE_ROWS}")
            got = got.where(f"id < {PROBE_BASE}")
            n, ksum = got.count(), got.agg({"id": "sum"}).collect()[0][0]
            if n != len(want) or int(ksum or 0) != sum(want):
                res["problems"].append(f"delta MERGE table: {n} rows (key sum {ksum}), want {len(want)} "
                                       f"(key sum {sum(want)})")
            n = spark.read.format("delta").load(str(tmp / f"append-{r}")).count()
            if n != preload + sum(sizes):
                res["problems"].append(f"raw append: {n} rows, want {preload + sum(sizes)}")
            from senders.spark import lake

            lake.register_tables(spark, tmp / f"changelog-{r}", f"benchcl{r}")
            row = spark.sql(f"SELECT count(*) AS n, sum(id) AS k FROM benchcl{r}.bench__lake").collect()[0]
            if row["n"] != len(want) or int(row["k"] or 0) != sum(want):
                res["problems"].append(f"changelog merged view: {row['n']} rows (key sum {row['k']}), want "
                                       f"{len(want)} (key sum {sum(want)})")
    finally:
        spark.stop()
    fixed = res[f"merge_fixed_seconds_round{rounds}"][1:]
    res["merge_fixed_seconds"] = round(sorted(fixed)[len(fixed) // 2], 3) if fixed else None
    app = res[f"append_batch_seconds_round{rounds}"][1:]
    res["append_batch_seconds"] = round(sorted(app)[len(app) // 2], 3) if app else None
    res["merge_vs_append"] = round(res["merge_changes_per_s"] / res["append_changes_per_s"], 3)
    res["changelog_vs_append"] = round(res["changelog_changes_per_s"] / res["append_changes_per_s"], 3)
    res["merge_vs_changelog"] = round(res["merge_changes_per_s"] / res["changelog_changes_per_s"], 3)
    return res


def summary(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"delta: skipped ({r['skipped']})"
    return (f"delta, {r['batches']} batches of {r['changes_per_batch']:,} changes on a {r['preload']:,}-row table "
            f"(the last of {r['rounds']} rounds, its first batch left out):\n"
            f"  raw Delta append of the same rows   {r['append_changes_per_s']:>9,} changes/s\n"
            f"  Delta sender (MERGE)                {r['merge_changes_per_s']:>9,} changes/s  "
            f"{r['merge_vs_append']:.2f} of the append [goal >= 0.5]\n"
            f"  a MERGE of {PROBE_ROWS} new keys (its fixed part)  {r['merge_fixed_seconds']} s, the append of a batch "
            f"{r['append_batch_seconds']} s (medians)\n"
            f"  changelog sender                    {r['changelog_changes_per_s']:>9,} changes/s  "
            f"{r['changelog_vs_append']:.2f} of the append\n"
            + (f"  PROBLEMS: {r['problems']}\n" if r["problems"] else ""))
