"""Run the BaikalDB double as its own process (for benchmarks: the store serves
from another process, as a real cluster would).

    python -m devtools.baikaldb_double --bench-rows 200000 --ready /tmp/ready.json

loads the bench workload (200k inserts in 100-row transactions, 50k updates,
20k deletes on a 10-column table, binlog table 20 with 1 partition x 2 regions),
writes ``{"meta": "host:port,...", "rows": N, "last_ts": TSO}`` to the ready
file, and serves until killed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import signal
import threading
from pathlib import Path

from .cluster import Cluster
from .server import BaikalDouble

BENCH_COLUMNS = [("id", "INT32", False), ("name", "STRING"), ("city", "STRING"), ("price", "DOUBLE"),
                 ("qty", "DOUBLE"), ("created", "DATETIME"), ("updated", "DATETIME"), ("n", "INT32"),
                 ("big", "INT64"), ("note", "STRING")]


def bench_load(c: Cluster, rows: int, regions: int = 2, batch: int = 100) -> tuple[int, int]:
    """The bench workload; returns (row changes, last commit TSO)."""
    c.create_binlog_table(20, "ops", "binlog_bench", partitions=1, regions_per_partition=regions)
    c.create_table(10, "bench", "t", BENCH_COLUMNS, ["id"], 20)
    rng = random.Random(1)
    now = dt.datetime(2026, 1, 1, 12, 0, 0)
    updates, deletes = rows // 4, rows // 10
    last = 0
    for start in range(0, rows, batch):
        new = [{"id": i, "name": f"name-{i}", "city": rng.choice(["Paris", "Oslo", "Lima", "Pune"]),
                "price": rng.randrange(100000) / 100, "qty": rng.randrange(100000) / 1000,
                "created": now + dt.timedelta(microseconds=i), "updated": now, "n": i, "big": i * 1000,
                "note": "x" * 60} for i in range(start, min(start + batch, rows))]
        last = c.begin().insert(10, *new).commit()
    for start in range(0, updates, batch):
        keys = [(i,) for i in range(start, min(start + batch, updates))]
        rows_ = c.tables[10].rows
        last = c.begin().update(10, [(k, {"n": rows_[k]["n"] + 1, "updated": now}) for k in keys]).commit()
    for start in range(rows - deletes, rows, batch):
        last = c.begin().delete(10, *[(i,) for i in range(start, min(start + batch, rows))]).commit()
    return rows + updates + deletes, last


def main() -> int:
    ap = argparse.ArgumentParser(prog="devtools.baikaldb_double")
    ap.add_argument("--bench-rows", type=int, default=0)
    ap.add_argument("--regions", type=int, default=2)
    ap.add_argument("--ready", required=True)
    args = ap.parse_args()
    d = BaikalDouble(n_stores=3, n_meta=1, fake_ms=1000).start()
    n, last = bench_load(d.cluster, args.bench_rows, args.regions) if args.bench_rows else (0, 0)
    Path(args.ready).write_text(json.dumps({"meta": d.meta_servers, "rows": n, "last_ts": last}))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    d.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
