"""Kafka sender throughput, transactional vs not (issue 45 item 3), in one run on one
real Apache Kafka broker (devtools/local_kafka.py, or ``--servers``).

    PYTHONPATH=. .venv/bin/python bench/kafka_txn.py --rows 200000 [--client confluent] [--servers h:p]

Each mode sends the same rows (transactions of ``--txn-rows`` rows, batches of
``--batch`` transactions, as the pipeline hands them over) to topics of its own;
the modes alternate (``--rounds``) so a busy host slows both alike. Prints rows/s
per mode and the ratio transactional / non-transactional (goal >= 0.8)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from capturer.model import Position, RowChange, TableSchema, Txn
from senders.kafka.sender import KafkaSender


def batches(rows: int, txn_rows: int, batch: int) -> list[list[Txn]]:
    schema = TableSchema("bench", "t", ("id", "v"), ("id",))
    txns = [Txn("r1", 1000 + t, Position("f", t),
                tuple(RowChange(schema, "insert", None, {"id": t * txn_rows + i, "v": "x" * 40})
                      for i in range(txn_rows)))
            for t in range(max(1, rows // txn_rows))]
    return [txns[i:i + batch] for i in range(0, len(txns), batch)]


def run(servers: str, client: str, transactional: bool, work: list[list[Txn]], tag: str) -> float:
    options: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
    options.update(servers=servers, client=client, schema_topic="", transactional=transactional,
                   topic=f"bench.{tag}.{{table}}", partitions=3, transactional_id=f"bench.{tag}")
    s = KafkaSender(f"k{tag}", options)
    s.open()
    s.send(work[0][:1])  # the topic made and read back, the producer (and its transactions) ready
    t0 = time.perf_counter()
    for b in work:
        s.send(b)
    dt = time.perf_counter() - t0
    s.close()
    return sum(len(t.changes) for b in work for t in b) / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--txn-rows", type=int, default=10)
    ap.add_argument("--batch", type=int, default=2000, help="transactions per batch (send call)")
    ap.add_argument("--client", choices=("confluent", "kafka-python", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--servers", default="", help="an existing broker; default: start one")
    a = ap.parse_args()
    broker = None
    servers = a.servers
    if not servers:
        from devtools.local_kafka import Broker

        broker = Broker(partitions=3).start()
        servers = broker.servers
    try:
        work = batches(a.rows, a.txn_rows, a.batch)
        clients = ("confluent", "kafka-python") if a.client == "both" else (a.client,)
        for client in clients:
            rates: dict[bool, list[float]] = {False: [], True: []}
            for r in range(a.rounds):
                for txn in (False, True):
                    rates[txn].append(run(servers, client, txn, work, f"{client}.{int(txn)}.{r}"))
            plain, trans = max(rates[False]), max(rates[True])
            print(f"{client}: {a.rows} rows, batches of {a.batch} transactions of {a.txn_rows} rows; "
                  f"non-transactional {plain:,.0f} rows/s, transactional {trans:,.0f} rows/s "
                  f"(best of {a.rounds}); ratio {trans / plain:.2f} (goal >= 0.8)", flush=True)
    finally:
        if broker is not None:
            broker.cleanup()


if __name__ == "__main__":
    main()
