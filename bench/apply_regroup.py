"""The applier's own per-row work, without a broker or a target: what the Kafka sender writes
(json, the real ``KafkaSender`` into an in-memory client) for the bench table's shape
(``bench.t``: 100-row insert transactions, then updates and deletes), read back as the
consumer hands it over (``Msg`` objects, the partitions interleaved in polls of up to
5,000 messages) and regrouped into transactions (``Regrouper.add`` + ``ready``): CPU
microseconds per row change, best of ``--repeat``.

    .venv/bin/python bench/apply_regroup.py [--rows 100000] [--repeat 5] [--out F.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capturer.apply.regroup import Regrouper
from capturer.model import ColumnInfo, Position, RowChange, TableSchema, Txn
from capturer.model.message import Msg
from capturer.util.memory import tune
from senders.kafka.sender import KafkaSender

TYPES = (3, 15, 15, 246, 246, 18, 18, 3, 8, 252)
SCHEMA = TableSchema("bench", "t", ("id", "name", "city", "price", "qty", "created", "updated", "n", "big", "note"),
                     ("id",), (), TYPES, tuple(ColumnInfo(t) for t in TYPES))


class Log:
    """An in-memory Kafka: each partition's messages in order."""

    def __init__(self, parts: int = 3):
        self.parts = parts
        self.logs: dict[tuple[str, int], list[Any]] = {}

    def partitions(self, topic: str) -> int:
        return self.parts

    def learn(self, topic: str) -> None:
        pass

    def produce(self, topic: str, partition: int, key: Any, value: Any, headers: Any) -> None:
        self.produce_all([(topic, partition, key, value, headers)])

    def produce_all(self, messages: list[Any]) -> None:
        for topic, part, key, value, headers in messages:
            self.logs.setdefault((topic, part), []).append((key, value, headers))

    def flush(self, timeout: float) -> list[str]:
        return []

    def close(self) -> None:
        pass

    def failures(self) -> list[Any]:
        return []

    def offsets(self, topic: str, partitions: Any) -> dict[int, tuple[int, int]]:
        return dict.fromkeys(partitions, (0, 0))

    def last_records(self, topic: str, starts: dict[int, int], timeout: float, patient: Any = ()) -> dict[int, Any]:
        return {}


def row(i: int, rng: random.Random) -> dict[str, Any]:
    now = dt.datetime(2026, 1, 1, 12, 0, 0)
    return {"id": i, "name": f"name-{i}", "city": rng.choice(["Paris", "Oslo", "Lima", "Pune"]),
            "price": decimal.Decimal(rng.randrange(100000)) / 100, "qty": decimal.Decimal(rng.randrange(100000)) / 1000,
            "created": now + dt.timedelta(microseconds=i), "updated": now, "n": i, "big": i * 1000, "note": "x" * 60}


def workload(rows: int) -> list[Txn]:
    """inserts : updates : deletes as the bench's 200k : 50k : 20k, in 100-row transactions."""
    rng = random.Random(7)
    ins, upd, dele = rows * 20 // 27, rows * 5 // 27, rows * 2 // 27
    changes: list[RowChange] = [RowChange(SCHEMA, "insert", None, row(i, rng)) for i in range(ins)]
    for i in range(upd):
        old = row(i, rng)
        changes.append(RowChange(SCHEMA, "update", old, {**old, "n": -i, "note": "y" * 60}))
    changes += [RowChange(SCHEMA, "delete", row(ins - 1 - i, rng), None) for i in range(dele)]
    ts = 1_000 << 18
    return [Txn("r1", ts + k, Position("b.000001", 4 + k), tuple(changes[k:k + 100]))
            for k in range(0, len(changes), 100)]


def produce(txns: list[Txn]) -> Log:
    log = Log()
    options: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
    options.update(servers="127.0.0.1:9", tombstones=True, txn_topic="txns", format="json")
    s = KafkaSender("k", options)
    s._new_client = lambda servers: log  # type: ignore[method-assign]
    s.open()
    for i in range(0, len(txns), 20):
        s.send(txns[i:i + 20])
    return log


def polls(log: Log, batch: int = 5000) -> list[list[tuple[Any, ...]]]:
    """The messages as polls of up to ``batch``: a few hundred of each partition in turn."""
    cursors = dict.fromkeys(sorted(log.logs), 0)
    flat: list[tuple[Any, ...]] = []
    while cursors:
        for tp in list(cursors):
            i = cursors[tp]
            for off in range(i, min(i + 300, len(log.logs[tp]))):
                k, v, h = log.logs[tp][off]
                flat.append((tp[0], tp[1], off, k, v, list(h)))
            cursors[tp] = i + 300
            if cursors[tp] >= len(log.logs[tp]):
                del cursors[tp]
    return [flat[i:i + batch] for i in range(0, len(flat), batch)]


def once(batches: list[list[tuple[Any, ...]]]) -> tuple[float, int]:
    r = Regrouper("txns", "json")
    rows = 0
    t0 = time.process_time()
    for b in batches:
        for m in [Msg(*x) for x in b]:
            r.add(m)
        for _key, txn in r.ready():
            if txn is not None:
                rows += len(txn.changes)
    return time.process_time() - t0, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tune()  # (as every process of the capturer, the applier's too, starts)
    txns = workload(args.rows)
    batches = polls(produce(txns))
    msgs = sum(len(b) for b in batches)
    times = []
    for _ in range(args.repeat):
        t, rows = once(batches)
        times.append(t)
    best = min(times)
    res = {"rows": rows, "messages": msgs, "cpu_s": [round(t, 4) for t in times],
           "us_per_row": round(best / rows * 1e6, 3), "rows_per_cpu_s": round(rows / best)}
    print(json.dumps(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
