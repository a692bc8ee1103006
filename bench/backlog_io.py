"""Micro-bench of the stream log's backlog (issue 50): the cost of an item that leaves the memory
window for the segment files and of reading it back, as a sender that lags does. No server, one process.

    .venv/bin/python bench/backlog_io.py [--tree DIR] [--txns 4000] [--txn-rows 100] [--readers 3]
                                         [--repeat 3] [--json OUT]

``--tree``: the checkout whose ``capturer`` is measured (default: this one; its C extension built in
place), so that two versions run the same bench: run it with ``--tree`` of each in turn, interleaved.

The items are transactions of the bench table's shape (bench.py's TABLE and load(): inserts, then
updates with both images, then deletes, ``--txn-rows`` rows each, a MariaDB position with its GTID
each) and a heartbeat after every tenth transaction. They go through a real ``StreamLog`` with a small
memory window and a backlog in a temporary directory: one sender (the fast file sender) acknowledges
everything at once, ``--readers`` others (mysql, kafka, spark) read nothing while the stream is
appended, so every item goes to the segments. It times, in CPU seconds (``time.process_time``):

* ``write``: ``StreamLog.append`` of every item (the evictions' ``Backlog.append``: encode, CRC, write);
* ``read_1``: one lagging sender reading all of it back with its ``Cursor`` (``get_many`` of 20,000
  rows, as the mysql/kafka/file senders ask; acknowledging each batch): read, check, decode;
* ``read_n``: the ``--readers`` senders reading it back in turn, batch by batch (the ones after the
  first find the items decoded by the first: ``Backlog.decoded``), again from a fresh backlog.

It reports microseconds per row and per item of each (``read_n`` per row read by any sender), the best
of ``--repeat`` runs; the process takes the capturer's malloc and garbage-collector settings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _tree(argv: list[str]) -> Path:
    """``--tree`` before argparse: the import path must be set before capturer is imported."""
    for i, a in enumerate(argv):
        if a == "--tree" and i + 1 < len(argv):
            return Path(argv[i + 1]).resolve()
        if a.startswith("--tree="):
            return Path(a.split("=", 1)[1]).resolve()
    return Path(__file__).resolve().parent.parent


TREE = _tree(sys.argv)
sys.path.insert(0, str(TREE))

from microbench import SCHEMA, bench_row, report  # (this directory; after the tree is on the path)

from capturer.model import Heartbeat, Item, Position, RowChange, Txn, stream_key
from capturer.pipeline.backlog import Cut, StreamLog
from capturer.pipeline.segments import Backlog
from capturer.util.memory import tune

READ_ROWS = 20_000  # what the mysql, kafka and file senders ask for at once (batch_rows)


def workload(txns: int, txn_rows: int) -> list[Item]:
    """``txns`` transactions of ``txn_rows`` rows (75 % inserts, then 20 % updates, 5 % deletes, as
    bench.py's load() writes them) and a heartbeat after every tenth."""
    rng = random.Random(1)
    now = dt.datetime(2026, 1, 1, 12)

    def row(i: int) -> dict[str, Any]:
        return bench_row(rng, now, i)

    def change(k: int, j: int) -> RowChange:
        i = k * txn_rows + j
        if k < txns * 75 // 100:
            return RowChange(SCHEMA, "insert", None, row(i))
        if k < txns * 95 // 100:
            before = row(i)
            return RowChange(SCHEMA, "update", before, {**before, "n": i + 1})
        return RowChange(SCHEMA, "delete", row(i), None)

    ts = 1 << 40
    out: list[Item] = []
    for k in range(txns):
        pos = Position("mariadb-bin.000001", 4 + 9000 * k, f"0-1-{k + 1}")
        out.append(Txn("1", ts + (k << 18), pos, tuple(change(k, j) for j in range(txn_rows)),
                       source_ts=1_767_268_800 + k // 100, gtid=f"0-1-{k + 1}"))
        if k % 10 == 9:
            out.append(Heartbeat("1", ts + (k << 18) + 1, pos))
    return out


def _stream(items: list[Item], readers: int) -> tuple[StreamLog, list[Any], list[int], float, Path]:
    """A stream whose every item went to the backlog; (stream, the lagging cursors, their acknowledged
    offsets, CPU seconds of the appends, the directory)."""
    d = Path(tempfile.mkdtemp(prefix="backlog-io-"))
    backlog = Backlog(d / "backlog", 1 << 40)
    backlog.open(None, None)
    stream = StreamLog(1000, backlog, 1, Cut())
    stream.cursor("file", 1, None, Cut(), lambda: 1 << 62)  # the fast sender: has it all at once
    acked = [0] * readers
    cursors = [stream.cursor(f"lag{i}", 1, None, Cut(), lambda i=i: acked[i]) for i in range(readers)]
    keys = [stream_key(it) for it in items]
    t0 = time.process_time()
    for key, item in zip(keys, items):
        stream.append(key, item)
    cpu = time.process_time() - t0
    return stream, cursors, acked, cpu, d


def _read(stream: StreamLog, cursors: list[Any], acked: list[int], items: list[Item]) -> tuple[float, int]:
    """Every lagging cursor reads everything (in turn, a batch each); CPU seconds, items read."""
    end = len(items)
    n = 0
    t0 = time.process_time()
    live = list(range(len(cursors)))
    while live:
        for i in list(live):
            got = cursors[i].get_many(READ_ROWS, timeout=0)
            n += len(got)
            if got:
                acked[i] = got[-1][0]
            if acked[i] >= end:
                live.remove(i)
    cpu = time.process_time() - t0
    return cpu, n


def _check(items: list[Item]) -> None:
    """The backlog gives back what went in (once, outside the timing)."""
    _stream2, cursors, acked, _cpu, d = _stream(items, 1)
    got: list[Item] = []
    while len(got) < len(items):
        batch = cursors[0].get_many(READ_ROWS, timeout=0)
        got.extend(it for _off, it in batch)
        acked[0] = batch[-1][0]
    assert got == items, "the backlog gave back other items"
    shutil.rmtree(d, ignore_errors=True)


def run(items: list[Item], readers: int) -> dict[str, float]:
    stream, cursors, acked, write_cpu, d = _stream(items, 1)
    assert stream.evicted_to_disk >= len(items) - 200, stream.evicted_to_disk
    read1_cpu, n1 = _read(stream, cursors, acked, items)
    assert n1 == len(items), (n1, len(items))
    shutil.rmtree(d, ignore_errors=True)
    stream, cursors, acked, _w, d = _stream(items, readers)
    readn_cpu, nn = _read(stream, cursors, acked, items)
    assert nn == len(items) * readers, (nn, len(items) * readers)
    shutil.rmtree(d, ignore_errors=True)
    return {"write": write_cpu, "read_1": read1_cpu, "read_n": readn_cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=str(TREE), help="the checkout to measure (set before the imports)")
    ap.add_argument("--txns", type=int, default=4000)
    ap.add_argument("--txn-rows", type=int, default=100)
    ap.add_argument("--readers", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results there too")
    args = ap.parse_args()
    tune()
    items = workload(args.txns, args.txn_rows)
    rows = sum(len(t.changes) for t in items if isinstance(t, Txn))
    _check(items[:2000])
    runs = [run(items, args.readers) for _ in range(args.repeat)]
    out: dict[str, Any] = {"tree": str(TREE), "rows": rows, "items": len(items), "txn_rows": args.txn_rows,
                           "readers": args.readers}
    for name in ("write", "read_1", "read_n"):
        cpu = [r[name] for r in runs]
        k = args.readers if name == "read_n" else 1
        out[name] = {"cpu_s": [round(c, 3) for c in cpu], "us_per_row": round(min(cpu) / (rows * k) * 1e6, 3),
                     "us_per_item": round(min(cpu) / (len(items) * k) * 1e6, 2)}
    report(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
