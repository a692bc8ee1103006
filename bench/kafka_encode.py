"""Micro-bench of the Kafka sender's per-row work (issue 50), format json, client confluent: no broker.

    .venv/bin/python bench/kafka_encode.py [--repeat 3] [--only send,encode,produce[,flush]] [--json OUT]

Over bench/sender_encode.py's workload (the bench table's rows: 300,000 inserts, 75,000 updates with both
images, 30,000 deletes, in 100-row transactions; ``--txn-rows N``: the same rows in N-row ones) it times,
per row:

* ``send``: ``KafkaSender.send`` (format json, the C ``kafka_json`` where it is built) in 200-transaction
  batches (20,000 rows, the sender's ``batch_rows``) with a client whose ``produce_all`` only counts: the
  sender's own work, its messages rendered and handed over;
* ``encode``: the C ``kafka_json`` calls alone (one per transaction), for the share of ``send`` they are;
* ``produce``: ``ConfluentClient.produce_all`` of those messages into a real confluent-kafka producer whose
  broker is not reachable (127.0.0.1:9): librdkafka queues them (copies, headers, the delivery state) and
  sends nothing; purged after each 100,000 messages (not timed);
* ``flush`` (not in the default ``--only``; starts an Apache Kafka broker, devtools/local_kafka.py): the first
  100,000 messages produced (as produce_all does) to a 3-partition topic, then ``flush``: the calling
  thread's CPU (``time.thread_time``) and wall time of each, with the producer's ``on_delivery`` (the
  sender's) and without, with a thread spinning in Python (the GIL contended) and without; one line each.

CPU time (``time.process_time``), the best of ``--repeat`` runs; the capturer's malloc and collector
settings. Run it from each tree in turn (interleaved) to compare two versions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from microbench import cpu_figures, report  # (this directory)
from sender_encode import workload

from capturer.model import Position, Txn
from capturer.util.memory import tune


class CountingClient:
    """A producer that counts what it is given (the sender's work without a client library's)."""

    producer: Any = None

    def __init__(self) -> None:
        self.messages = 0

    def partitions(self, topic: str) -> int:
        return 3

    def learn(self, topic: str) -> None:
        return None

    def create_topic(self, topic: str, partitions: int, replication: int) -> None:
        raise AssertionError("the bench's topics exist")

    def produce(self, topic: str, partition: int, key: Any, value: Any, headers: Any) -> None:
        self.messages += 1

    def produce_all(self, messages: list[Any]) -> None:
        self.messages += len(messages)

    def flush(self, timeout: float) -> list[str]:
        return []

    def close(self) -> None:
        return None


def sender() -> Any:
    from senders.kafka.sender import KafkaSender

    opts = {k.name: k.default for k in KafkaSender.KEYS}
    opts.update(servers="127.0.0.1:9", client="confluent", format="json")
    s = KafkaSender("kafka", opts)
    s.client = CountingClient()
    return s


def send(txns: list[Txn]) -> float:
    s = sender()
    s.send(txns[:1])
    t0 = time.process_time()
    for a in range(1, len(txns), 200):
        s.send(txns[a:a + 200])
    return time.process_time() - t0


def messages(txns: list[Txn]) -> list[list[Any]]:
    """Each transaction's messages, as the sender hands them to produce_all."""
    from capturer.model.encode import _fallback
    from senders.kafka.format import json_txn_pieces
    from senders.kafka.sender import _kafka_json

    s = sender()
    now_ms = int(time.time() * 1000)
    out = []
    for txn in txns:
        hbase = (("region", txn.region.encode()), ("commit_ts", str(txn.commit_ts).encode()))
        out.append(_kafka_json(txn.changes, 0, len(txn.changes), json_txn_pieces(txn, now_ms),
                               lambda schema, r=txn.region: s.json_table(r, schema), _fallback, hbase, False))
    return out


def encode(txns: list[Txn]) -> float:
    from capturer.model.encode import _fallback
    from senders.kafka.format import json_txn_pieces
    from senders.kafka.sender import _kafka_json

    s = sender()
    now_ms = int(time.time() * 1000)
    cache: dict[int, Any] = {}
    pieces = [(json_txn_pieces(t, now_ms), (("region", t.region.encode()), ("commit_ts", str(t.commit_ts).encode())))
              for t in txns]

    def table(schema: Any) -> Any:
        hit = cache.get(id(schema))
        if hit is None:
            hit = cache[id(schema)] = s.json_table("r0", schema)
        return hit

    t0 = time.process_time()
    for txn, (p, hbase) in zip(txns, pieces):
        _kafka_json(txn.changes, 0, len(txn.changes), p, table, _fallback, hbase, False)
    return time.process_time() - t0


def produce(txns: list[Txn]) -> float:
    import confluent_kafka

    from senders.kafka.client import ConfluentClient, Reports

    msgs = messages(txns)
    c = ConfluentClient.__new__(ConfluentClient)
    c.reports = Reports()
    c._since_poll = 0
    c.watch = lambda *a: None  # type: ignore[assignment]
    opts = {"linger_ms": 5, "compression": "none", "max_message_bytes": 1_048_576}
    conf = c.conf("127.0.0.1:9", opts)
    conf["error_cb"] = lambda *a: None
    conf["log_level"] = 0  # (the refused connections, not logged)
    c.producer = confluent_kafka.Producer(conf)
    cpu = 0.0
    queued = 0
    for m in msgs:
        t0 = time.process_time()
        c.produce_all(m)
        cpu += time.process_time() - t0
        queued += len(m)
        if queued >= 100_000:
            c.producer.purge()
            c.producer.flush(0)
            c.reports.take()
            c.reports.take_failed()
            queued = 0
    c.producer.purge()
    c.producer.flush(0)
    return cpu


def flush(txns: list[Txn], repeat: int) -> list[dict[str, Any]]:
    import threading

    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic

    from devtools.local_kafka import Broker
    from senders.kafka.client import Reports

    msgs = [m for ms in messages(txns[:1000]) for m in ms]
    topics = {m[0] for m in msgs}
    b = Broker().start()
    out = []
    try:
        admin = AdminClient({"bootstrap.servers": b.servers})
        for fut in admin.create_topics([NewTopic(t, 3, 1) for t in topics]).values():
            fut.result(30)
        stop = threading.Event()

        def spin() -> None:
            x = 0
            while not stop.is_set():
                x += 1

        for rnd in range(repeat):
            for busy in (False, True):
                for dr in (True, False):
                    conf: dict[str, Any] = {"bootstrap.servers": b.servers, "acks": "all", "enable.idempotence": True,
                                            "linger.ms": 5, "queue.buffering.max.messages": 1_000_000,
                                            "delivery.report.only.error": True}
                    if dr:
                        conf["on_delivery"] = Reports()
                    p = confluent_kafka.Producer(conf)
                    for t in topics:
                        p.list_topics(t, timeout=10)
                    stop.clear()
                    th = threading.Thread(target=spin) if busy else None
                    if th is not None:
                        th.start()
                    c0, w0 = time.thread_time(), time.monotonic()
                    for topic, part, key, value, headers in msgs:
                        p.produce(topic, value, key, part, None, None, 0, headers)
                    c1, w1 = time.thread_time(), time.monotonic()
                    left = p.flush(120)
                    c2, w2 = time.thread_time(), time.monotonic()
                    stop.set()
                    if th is not None:
                        th.join()
                    out.append({"round": rnd, "busy_thread": busy, "on_delivery": dr, "messages": len(msgs),
                                "left": left, "produce_cpu_us_per_msg": round((c1 - c0) / len(msgs) * 1e6, 3),
                                "flush_cpu_us_per_msg": round((c2 - c1) / len(msgs) * 1e6, 3),
                                "produce_wall_s": round(w1 - w0, 3), "flush_wall_s": round(w2 - w1, 3)})
                    print(json.dumps(out[-1]), flush=True)
                    del p
    finally:
        b.cleanup()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="send,encode,produce")
    ap.add_argument("--txn-rows", type=int, default=100,
                    help="the workload's rows regrouped into transactions of this many (its own: 100)")
    ap.add_argument("--json", help="write the results there too")
    args = ap.parse_args()
    tune()
    txns = workload()
    if args.txn_rows != 100:  # (the same changes in the same order, in smaller or bigger transactions)
        changes = [ch for t in txns for ch in t.changes]
        k = args.txn_rows
        txns = [Txn("r0", (1 << 40) + i, Position("b.000001", 4 + i), tuple(changes[a:a + k]))
                for i, a in enumerate(range(0, len(changes), k))]
    rows = sum(len(t.changes) for t in txns)
    import capturer

    out: dict[str, Any] = {"tree": str(Path(capturer.__file__).resolve().parent.parent), "rows": rows,
                           "txn_rows": args.txn_rows}
    if "flush" in args.only.split(","):
        out["flush"] = flush(txns, args.repeat)
    for name, fn in (("send", send), ("encode", encode), ("produce", produce)):
        if name not in args.only.split(","):
            continue
        out[name] = cpu_figures([fn(txns) for _ in range(args.repeat)], rows)
    report(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
