"""Micro-bench of two senders' per-row work (issue 50): no server, one process.

    .venv/bin/python bench/sender_encode.py [--repeat 3] [--json OUT]

Over the bench table's rows (bench.py's TABLE and load(): 300,000 inserts, 75,000 updates with both
images, 30,000 deletes, in 100-row transactions) it times, per row:

* ``file_json``: the file sender's rendering of every transaction (``txn_blocks_json``: the C
  ``json_lines`` where it is built);
* ``spark_send``: ``SparkSender.send`` (``writer = arrow``, a temporary warehouse) of the transactions
  in 500-transaction batches (50,000 rows, the sender's ``batch_rows``), its Parquet writes included.

* ``procs4_send``: four ``ProcessSender`` s (``process = true``; the file sender in each child) sent
  the same 500-transaction batches in turn: the capturer's side only (the children's CPU is not
  counted), which is what a sender in a process of its own costs the capturer's core.

CPU time (``time.process_time``), the best of ``--repeat`` runs; the process takes the capturer's
malloc and garbage-collector settings. Run it from each tree in turn to compare two versions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from microbench import SCHEMA, bench_row, cpu_figures, report  # (this directory)

from capturer.model import Position, RowChange, Txn
from capturer.util.memory import tune


def workload() -> list[Txn]:
    rng = random.Random(1)
    now = dt.datetime(2026, 1, 1, 12)

    def row(i: int) -> dict[str, Any]:
        return bench_row(rng, now, i)

    def update(i: int) -> RowChange:
        before = row(i)
        return RowChange(SCHEMA, "update", before, {**before, "n": i + 1})

    ts, txns = 1 << 40, []
    for k in range(3000):
        txns.append(Txn("r0", ts + k, Position("b.000001", 4 + k),
                        tuple(RowChange(SCHEMA, "insert", None, row(k * 100 + j)) for j in range(100))))
    for k in range(750):
        txns.append(Txn("r0", ts + 3000 + k, Position("b.000001", 5000 + k),
                        tuple(update(k * 100 + j) for j in range(100))))
    for k in range(300):
        txns.append(Txn("r0", ts + 4000 + k, Position("b.000001", 9000 + k),
                        tuple(RowChange(SCHEMA, "delete", row(k * 100 + j), None) for j in range(100))))
    return txns


def file_json(txns: list[Txn]) -> float:
    from senders.local.sender import txn_blocks_json

    t0 = time.process_time()
    for t in txns:
        for _ in txn_blocks_json(t):
            pass
    return time.process_time() - t0


def spark_send(txns: list[Txn]) -> float:
    from senders.spark.sender import SparkSender

    opts = {k.name: k.default for k in SparkSender.KEYS}
    opts.update({"warehouse": tempfile.mkdtemp(prefix="sender-encode-"), "compaction_interval": 0,
                 "batch_interval": 1, "conf.*": {}})
    s = SparkSender("spark", opts)
    s.open()
    s.send(txns[:1])  # its imports and the table's set-up, outside the timing
    t0 = time.process_time()
    for a in range(1, len(txns), 500):
        s.send(txns[a:a + 500])
    cpu = time.process_time() - t0
    s.close()
    import shutil

    shutil.rmtree(opts["warehouse"], ignore_errors=True)
    return cpu


def procs4_send(txns: list[Txn]) -> float:
    from senders.local.sender import LocalSender
    from senders.process import ProcessSender

    tmp = Path(tempfile.mkdtemp(prefix="sender-encode-"))
    opts = {k.name: k.default for k in LocalSender.KEYS}
    senders = [ProcessSender("local", {**opts, "filepath": str(tmp / f"p{i}" / "out.jsonl"), "fsync": False})
               for i in range(4)]
    for s in senders:
        s.open()
    txns = [Txn(t.region, t.commit_ts, t.position, t.changes) for t in txns]  # (none encoded before)
    t0 = time.process_time()
    for a in range(0, len(txns), 500):
        for s in senders:
            s.send(txns[a:a + 500])
    cpu = time.process_time() - t0
    for s in senders:
        s.close()
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results there too")
    args = ap.parse_args()
    tune()
    txns = workload()
    rows = sum(len(t.changes) for t in txns)
    out: dict[str, Any] = {"tree": os.getcwd(), "rows": rows}
    for name, fn in (("file_json", file_json), ("spark_send", spark_send), ("procs4_send", procs4_send)):
        out[name] = cpu_figures([fn(txns) for _ in range(args.repeat)], rows)
    report(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
