"""The Kafka sender's start-up read-back with many topics: the time from a new sender's ``open()``
to its first acknowledged batch (a restart after ``kill -9``: the batch replays what the topics
hold already, then goes on), its topics' marks read together (one consumer for all of their
partitions: ``read_marks_of``) or topic by topic (what the sender did before 2026-11-29: the
client's per-topic faces, one consumer a topic), alternated in one run on one real Apache Kafka
broker (devtools/local_kafka.py, or ``--servers``).

    PYTHONPATH=. .venv/bin/python bench/kafka_readback.py --topics 20,50 [--client confluent] [--rounds 3]
        [--transactional] [--json bench/results/<date>-kafka-readback.json]

Each topic (one table) gets one transaction of ``--rows`` rows first; the measured sender then
sends a batch of each table's first transaction again (skipped: Kafka holds it) and a new one.
Prints seconds per mode (median of ``--rounds``) and the ratio together / one by one."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from capturer.model import Position, RowChange, TableSchema, Txn
from senders.kafka.sender import KafkaSender


def batch(topics: int, first_ts: int, rows: int) -> list[Txn]:
    out = []
    for i in range(topics):
        schema = TableSchema("bench", f"t{i}", ("id", "v"), ("id",))
        out.append(Txn("r1", first_ts + i, Position("f", first_ts + i),
                       tuple(RowChange(schema, "insert", None, {"id": k, "v": "x" * 40}) for k in range(rows))))
    return out


class OneByOne:
    """A client seen through its one-topic faces only (partitions, offsets, last_records): the sender
    then reads the topics back one after the other, a consumer each, as it did before."""

    def __init__(self, client: Any):
        self._c = client

    def __getattr__(self, name: str) -> Any:
        if name in ("partitions_of", "offsets_of", "last_records_of"):
            raise AttributeError(name)
        return getattr(self._c, name)


def options(servers: str, client: str, tag: str, transactional: bool) -> dict[str, Any]:
    opts: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
    opts.update(servers=servers, client=client, schema_topic="", topic=f"rb.{tag}.{{table}}",
                txn_topic=f"rb.{tag}.txns", partitions=3, transactional=transactional,
                transactional_id=f"rb.{tag}", process=False)
    return opts


def first_batch(opts: dict[str, Any], txns: list[Txn], together: bool) -> tuple[float, int]:
    """Seconds from open() to the batch acknowledged, and the messages skipped."""
    s = KafkaSender("k", opts)
    t0 = time.perf_counter()
    s.open()
    if not together:
        s.client = OneByOne(s.client)  # type: ignore[assignment]
    s.send(txns)
    s.settle()
    dt = time.perf_counter() - t0
    skipped = s.marks.skipped
    s.close()
    return dt, skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", default="20,50", help="topic counts, comma-separated")
    ap.add_argument("--rows", type=int, default=20, help="rows of each table's transaction")
    ap.add_argument("--client", choices=("confluent", "kafka-python", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--transactional", action="store_true")
    ap.add_argument("--servers", default="", help="an existing broker; default: start one")
    ap.add_argument("--json", default="", help="write the results there")
    a = ap.parse_args()
    broker = None
    servers = a.servers
    if not servers:
        from devtools.local_kafka import Broker

        broker = Broker(partitions=3).start()
        servers = broker.servers
    results: dict[str, Any] = {"bench": "kafka_readback", "date": time.strftime("%Y-%m-%d"), "rows": a.rows,
                               "rounds": a.rounds, "transactional": a.transactional, "runs": {}}
    try:
        clients = ("confluent", "kafka-python") if a.client == "both" else (a.client,)
        run_id = f"{int(time.time())}"
        for client in clients:
            for n in (int(x) for x in a.topics.split(",")):
                secs: dict[str, list[float]] = {"one_by_one": [], "together": []}
                for r in range(a.rounds):
                    for mode in (("one_by_one", "together") if r % 2 == 0 else ("together", "one_by_one")):
                        tag = f"{run_id}.{client}.{n}.{r}.{mode}"
                        opts = options(servers, client, tag, a.transactional)
                        first_batch(opts, batch(n, 1000, a.rows), True)  # what Kafka holds before the restart
                        dt, skipped = first_batch(opts, batch(n, 1000, a.rows) + batch(n, 5000, a.rows),
                                                  mode == "together")
                        assert skipped >= n * a.rows, (skipped, n * a.rows)
                        secs[mode].append(dt)
                one, tog = statistics.median(secs["one_by_one"]), statistics.median(secs["together"])
                print(f"{client}, {n} topics{' (transactional)' if a.transactional else ''}: open -> first batch "
                      f"acknowledged: one by one {one:.2f} s, together {tog:.2f} s (median of {a.rounds}); "
                      f"ratio {tog / one:.3f}", flush=True)
                results["runs"][f"{client}/{n}"] = {
                    "seconds": {k: [round(x, 3) for x in v] for k, v in secs.items()},
                    "median": {"one_by_one": round(one, 3), "together": round(tog, 3)},
                    "ratio_together_over_one_by_one": round(tog / one, 3)}
    finally:
        if broker is not None:
            broker.cleanup()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
