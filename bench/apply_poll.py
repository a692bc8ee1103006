"""The applier's confluent-kafka poll, per message, against a real broker (devtools/local_kafka.py):
``--messages`` row-shaped messages (the sender's four identity headers, a json value) produced to one
partition, then read back in polls of 5,000 (``consume``) by fresh consumers, and each poll made the
applier's ``Msg`` objects by ``ConfluentConsumer.poll``'s Python loop (``py``) or by ``kafka_msgs``, its one
C call a poll (``c``), the two alternated; CPU microseconds per message of the consume call and of the
making, best of ``--repeat`` each. The first round also times ``headers()`` alone (confluent-kafka's own
making of the header list, which both paths pay) and nothing.

    .venv/bin/python bench/apply_poll.py [--messages 150000] [--repeat 4] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capturer.model.encode import _fastrows
from capturer.model.message import Msg
from capturer.util.memory import tune

VALUE = (b'{"before":null,"after":{"id":1,"name":"name-1","city":"Paris","price":"94.94","qty":"70.239",'
         b'"created":"2026-01-01 12:00:00.000001","updated":"2026-01-01 12:00:00","n":1,"big":1000,"note":"'
         + b"x" * 60 + b'"},"op":"c","ts_ms":1795946125503,"source":{"region":"r1","db":"bench","table":"t",'
         b'"commit_ts":262144000,"ts_ms":1000,"position":{"file":"b.000001","pos":4,"gtid":""},"gtid":"",'
         b'"seq":1,"snapshot":"false"},"transaction":{"id":"r1:262144000","total_order":2,"rows":100}}')


def py(ms: list[Any]) -> list[Msg]:
    """ConfluentConsumer.poll's Python loop (the fallback path)."""
    out: list[Msg] = []
    append = out.append
    last: dict[tuple[str, int], Any] = {}
    for m in ms:
        if m.error() is not None:
            continue
        msg = Msg(m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers() or [])
        append(msg)
        last[(msg.topic, msg.partition)] = (msg, m)
    for msg, m in last.values():
        ts = m.timestamp()
        msg.ts_ms = ts[1] if ts and ts[0] else 0
    return out


def main() -> int:
    import confluent_kafka as ck

    from devtools.local_kafka import Broker

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=150_000)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tune()
    n = args.messages
    ways: dict[str, Callable[[list[Any]], Any]] = {
        "py": py, "c": lambda ms: _fastrows.kafka_msgs(ms, Msg), "headers-only": lambda ms: [m.headers() for m in ms],
        "nothing": lambda ms: None}
    best: dict[str, list[float]] = {}
    broker = Broker().start()
    try:
        p = ck.Producer({"bootstrap.servers": broker.servers, "linger.ms": 50})
        for i in range(n):
            while True:
                try:
                    p.produce("t", VALUE, b'{"id":1}', partition=0, headers=[
                        ("region", b"r1"), ("commit_ts", b"262144000"), ("seq", str(i).encode()), ("op", b"c")])
                    break
                except BufferError:
                    p.poll(0.1)
        p.flush(60)
        for rep in range(args.repeat):
            order = ["py", "c"] if rep % 2 == 0 else ["c", "py"]
            for name in order + (["headers-only", "nothing"] if rep == 0 else []):
                co = ck.Consumer({"bootstrap.servers": broker.servers, "group.id": f"g{rep}{name}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
                co.assign([ck.TopicPartition("t", 0, ck.OFFSET_BEGINNING)])
                got, tc, tf = 0, 0.0, 0.0
                while got < n:
                    t0 = time.process_time()
                    ms = co.consume(5000, 1.0)
                    t1 = time.process_time()
                    r = ways[name](ms)
                    tf += time.process_time() - t1
                    tc += t1 - t0
                    got += len(ms)
                    del r, ms
                co.close()
                us = [round(tc / n * 1e6, 3), round(tf / n * 1e6, 3)]
                print(name, f"consume {us[0]} us a message, making {us[1]}", flush=True)
                b = best.get(name)
                best[name] = us if b is None or us[1] < b[1] else b
    finally:
        broker.kill()
    res = {"messages": n, "best_us_consume_making": best}
    print(json.dumps(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
