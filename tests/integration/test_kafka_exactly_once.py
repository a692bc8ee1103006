"""No duplicates and nothing lost in Kafka (issue 30), against a real Apache Kafka
broker and a real capturer: ``kill -9`` of the capturer mid-load, a batch that
fails half way and is retried within a run, and a sender in its own process.

A message's identity is its headers ``(region, commit_ts, seq, op)`` and whether its
value is null (a tombstone carries its delete's headers); a TRUNCATE is one message per
partition, so its identity includes the partition. "Duplicate" = one identity twice in
a topic; "missing" = a change the sources committed that no message carries.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Broker, CapturerProcess, checkpoint_covers, consume_all, shared_broker, wait_for, write_config
from workload import SCHEMA, Workload

from capturer.util import failpoints
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration

TXNS = "capturer.txns"


@pytest.fixture
def broker() -> Iterator[Broker]:
    yield shared_broker()  # the run's one Apache Kafka broker, emptied for this test


def kafka_senders(servers: str, **extra: object) -> str:
    opts: dict[str, object] = {"servers": servers, "txn_topic": TXNS, "tombstones": "true"}
    opts.update(extra)
    return "[global]\ntype=kafka\n[kafka]\n" + "".join(f"{k}={v}\n" for k, v in opts.items())


def hdr(rec: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in rec.headers}


def identity(rec: Any) -> tuple[Any, ...]:
    h = hdr(rec)
    part = rec.partition if h["op"] == "t" else None
    return (rec.topic, part, h["region"], int(h["commit_ts"]), int(h["seq"]), h["op"], rec.value is None)


def duplicates(records: list[Any]) -> list[tuple[tuple[Any, ...], int]]:
    return [(k, n) for k, n in Counter(identity(r) for r in records).items() if n > 1]


def source_rows(servers: list[MariaDBInstance], table: str) -> list[str]:
    from capturer.model.encode import json_row

    out = []
    for m in servers:
        c = m.connect()
        with c.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            cur.execute(f"SELECT * FROM app.{table}")
            cols = [d[0] for d in cur.description]
            out += [json.dumps(json_row(dict(zip(cols, r)), set()), sort_keys=True) for r in cur.fetchall()]
        c.close()
    return sorted(out)


def rebuild(records: list[Any], topic: str) -> list[str]:
    """A table from its topic: per partition in offset order (no deduplication: there is
    nothing to drop), keyless rows as a multiset, a TRUNCATE empties the partition."""
    keyed: dict[int, dict[bytes, Any]] = defaultdict(dict)
    keyless: dict[int, list[Any]] = defaultdict(list)
    for r in sorted((r for r in records if r.topic == topic), key=lambda r: (r.partition, r.offset)):
        if r.value is None:
            continue
        d = json.loads(r.value)
        if d["op"] == "t":
            keyed[r.partition].clear()
            keyless[r.partition].clear()
        elif r.key is None:
            if d["op"] in ("u", "d"):
                keyless[r.partition].remove(d["before"])
            if d["op"] in ("c", "u", "r"):
                keyless[r.partition].append(d["after"])
        elif d["op"] in ("c", "u", "r"):
            keyed[r.partition][r.key] = d["after"]
        else:
            keyed[r.partition].pop(r.key, None)
    rows = [row for p in keyed.values() for row in p.values()] + [row for p in keyless.values() for row in p]
    return sorted(json.dumps(row, sort_keys=True) for row in rows)


class Scratch:
    """Inserts into a small table of region 1 and now and then a TRUNCATE of it (a message in
    every partition of its topic, and a DDL in the schema topic)."""

    def __init__(self, m: MariaDBInstance):
        self.m = m
        self.rows = 0
        self.truncates = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        c = self.m.connect()
        c.autocommit(True)
        i = 0
        with c.cursor() as cur:
            while not self.stop.wait(0.05):
                i += 1
                if i % 40 == 0:
                    cur.execute("TRUNCATE TABLE app.scratch")
                    self.truncates += 1
                else:
                    self.rows += cur.execute("INSERT INTO app.scratch VALUES (%s, 'x')", (i,))
        c.close()


def check_kafka(records: list[Any], loads: list[Workload], scratch: Scratch, servers: list[MariaDBInstance]) -> str:
    """Asserts no duplicates and nothing missing; returns a summary."""
    dups = duplicates(records)
    assert not dups, f"{len(dups)} identities written more than once, e.g. {dups[:3]}"
    rows = [r for r in records if r.topic.startswith("capturer.app.")]
    changes = {(h["region"], h["commit_ts"], h["seq"]) for r in rows if (h := hdr(r))["op"] != "t"}
    assert len(changes) == sum(w.rows for w in loads) + scratch.rows, "row changes missing (or extra)"
    ends = [json.loads(r.value) for r in records if r.topic == TXNS and hdr(r)["op"] == "end"]
    begins = [r for r in records if r.topic == TXNS and hdr(r)["op"] == "begin"]
    assert len(begins) == len(ends) == len({(h["region"], h["commit_ts"]) for r in rows if (h := hdr(r))["op"] != "t"})
    assert sum(e["event_count"] for e in ends) == len(changes)
    truncs = Counter(r.partition for r in rows if r.topic == "capturer.app.scratch" and hdr(r)["op"] == "t")
    assert scratch.truncates > 0 and truncs == dict.fromkeys(range(3), scratch.truncates), truncs
    for table in ("users", "pairs", "log", "scratch"):
        sources = servers[:1] if table == "scratch" else servers
        assert rebuild(records, f"capturer.app.{table}") == source_rows(sources, table), f"{table} differs"
    return f"{len(records)} messages, {len(changes)} changes, {len(ends)} transactions, {scratch.truncates} truncates"


def acked_ts(tmp: Path) -> int:
    """The checkpoint's commit_ts (0 before the first one)."""
    try:
        return int(json.loads((tmp / "checkpoint.json").read_text())["commit_ts"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def start_load(servers: list[MariaDBInstance]) -> tuple[list[Workload], list[threading.Thread], Scratch]:
    for m in servers:
        m.execute(*SCHEMA)
    servers[0].execute("CREATE TABLE app.scratch (id INT PRIMARY KEY, v VARCHAR(10))")
    loads = [Workload(m, i + 1, 70 + i) for i, m in enumerate(servers)]
    threads = [w.thread(10**9) for w in loads]
    scratch = Scratch(servers[0])
    scratch.thread.start()
    return loads, threads, scratch


def stop_load(loads: list[Workload], threads: list[threading.Thread], scratch: Scratch) -> None:
    scratch.stop.set()
    for w in loads:
        w.stop.set()
    for t in threads:
        t.join(60)
    scratch.thread.join(60)
    for w in loads:
        assert not w.errors, w.errors


def crash_mid_load(tmp_path: Path, cfg: Path, log: Path, monkeypatch: pytest.MonkeyPatch, rng: random.Random,
                   crashes: int, failpoint_crash: int | None) -> CapturerProcess:
    """The capturer started, then ``crashes`` times, once the run has acknowledged a batch (mid-load,
    mid-delivery): ``kill -9`` from outside after a random 0.3-2 s, or, at crash number
    ``failpoint_crash``, a run that kills itself between two produce calls of a batch (messages in
    flight; failpoint ``kafka.produce=kill@N``); started again each time. The last run, ready and 2 s in."""
    proc = CapturerProcess(cfg, log).start()
    for crash in range(crashes):
        before = acked_ts(tmp_path)
        proc.wait_ready()
        wait_for(lambda: acked_ts(tmp_path) > before, 120, "the sender to acknowledge a batch")
        if crash == failpoint_crash:
            proc.kill9()
            monkeypatch.setenv(failpoints.ENV, f"kafka.produce=kill@{rng.randrange(30, 120)}")
            proc = CapturerProcess(cfg, log).start()
            monkeypatch.delenv(failpoints.ENV)
            assert proc.proc is not None
            proc.proc.wait(120)
        else:
            time.sleep(rng.uniform(0.3, 2.0))
            proc.kill9()
        proc = CapturerProcess(cfg, log).start()
    proc.wait_ready()
    time.sleep(2)
    return proc


@pytest.mark.timeout(900)
@pytest.mark.parametrize("client,process", [
    ("confluent", False),
    # kafka-python's read-back after kill -9 (~35 s) with --runslow; the default run reads it back in
    # test_kafka_sender and the chaos quick case
    pytest.param("kafka-python", False, marks=pytest.mark.slow),
    # a sender process: the same positions through the process boundary (slow: with --runslow)
    pytest.param("confluent", True, marks=pytest.mark.slow),
])
def test_kill9_mid_load_no_duplicates_nothing_lost(tmp_path: Path, two_servers: list[MariaDBInstance],
                                                   broker: Broker, monkeypatch: pytest.MonkeyPatch,
                                                   client: str, process: bool) -> None:
    """Three crashes under a steady load of two regions: two ``kill -9`` from outside at a
    random moment, and (in-process sender) one at a failpoint between two produce calls of
    a batch. Afterwards every topic holds every change once."""
    rng = random.Random(f"{client}{process}")
    extra = {"client": client} | ({"process": "true"} if process else {})
    cfg = write_config(tmp_path, two_servers, senders=kafka_senders(broker.servers, **extra))
    log = tmp_path / "capturer.log"
    loads, threads, scratch = start_load(two_servers)
    t0 = time.monotonic()
    proc = crash_mid_load(tmp_path, cfg, log, monkeypatch, rng, 3, None if process else 1)
    stop_load(loads, threads, scratch)
    wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 300, "Kafka to catch up")
    assert proc.stop() == 0
    records = consume_all(broker.servers)
    summary = check_kafka(records, loads, scratch, two_servers)
    text = log.read_text(errors="replace")
    skipped = text.count("held already were not sent again")
    for line in text.splitlines():
        if "were not sent again" in line or "read back in" in line or "killed" in line.lower():
            print(line[:300])
    print(f"{client} process={process}: {summary}; {skipped} batches skipped what Kafka held; "
          f"{time.monotonic() - t0:.0f}s")
    assert skipped > 0, "no restart found anything to skip: the test did not exercise the read-back"


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_retried_batch_writes_nothing_twice(tmp_path: Path, two_servers: list[MariaDBInstance], broker: Broker,
                                            capturer_running: Any, client: str) -> None:
    """A batch fails after part of it reached Kafka (an error injected between two produce
    calls, in the middle of a transaction of 20,000 rows over three partitions and a keyless
    table); the retry (a new producer) writes only what Kafka does not hold yet."""
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)", "CREATE TABLE d.k (v INT)")
    c = m1.connect()
    with c.cursor() as cur:
        cur.execute("INSERT INTO d.t SELECT seq, seq FROM d.seq_0_to_19999")
        cur.execute("INSERT INTO d.k SELECT seq FROM d.seq_1_to_100")
        cur.execute("UPDATE d.t SET id = id + 100000 WHERE id < 10")  # key changes: a delete and a create each
        c.commit()
        for i in range(50):
            cur.execute("INSERT INTO d.t VALUES (%s, 0)", (50_000 + i,))
            c.commit()
    c.close()
    cfg = write_config(tmp_path, two_servers[:1], senders=kafka_senders(broker.servers, client=client))
    # produce calls: a few DDLs, the big transaction's BEGIN, then one per slice of 2,000 rows:
    # the 12th is in the middle of the big transaction
    failpoints.set_rules("kafka.produce=eio@12")
    try:
        with capturer_running(cfg) as cap:
            wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 180, "Kafka to catch up")
            st = cap.senders[0].status()
    finally:
        failpoints.set_rules("")
    assert st["retries"] >= 1 and "injected at failpoint kafka.produce" in st["last_error"], st
    assert st["skipped"] >= 2000, st  # what the failed attempt had delivered was not sent again
    records = consume_all(broker.servers)
    dups = duplicates(records)
    assert not dups, f"{len(dups)} identities written twice after the retry, e.g. {dups[:3]}"
    t = [hdr(r) for r in records if r.topic == "capturer.d.t"]
    assert len({(h["commit_ts"], h["seq"]) for h in t}) == 20_000 + 10 + 50
    assert len(t) == 20_000 + 2 * 10 + 50 + 10  # + a tombstone after each key change's delete
    assert len([r for r in records if r.topic == "capturer.d.k"]) == 100
    for op in ("begin", "end"):
        marked = {h["commit_ts"] for r in records if r.topic == TXNS and (h := hdr(r))["op"] == op}
        assert {h["commit_ts"] for h in t} <= marked, f"a transaction has no {op.upper()} record"


class AnswerCutter:
    """A TCP proxy in front of the broker that passes the answer to the ``cut``-th, ... produce
    requests on to nobody: the broker wrote the request, the client's connection is closed (a
    connection lost mid-request, as in a broker restart or a network cut)."""

    def __init__(self, target: int, cut: set[int]):
        self.target, self.cut = target, cut
        self.produces = self.answers_cut = 0
        self.lock = threading.Lock()
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @staticmethod
    def _frame(s: Any) -> bytes:
        def exact(n: int) -> bytes:
            b = b""
            while len(b) < n:
                x = s.recv(n - len(b))
                if not x:
                    raise EOFError
                b += x
            return b

        size = exact(4)
        return size + exact(int.from_bytes(size, "big"))

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.target))
            drop: set[int] = set()
            threading.Thread(target=self._pipe, args=(c, u, drop, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c, drop, False), daemon=True).start()

    def _pipe(self, src: Any, dst: Any, drop: set[int], requests: bool) -> None:
        try:
            while True:
                f = self._frame(src)
                if requests and int.from_bytes(f[4:6], "big") == 0:  # api key 0: Produce
                    with self.lock:
                        self.produces += 1
                        if self.produces in self.cut:
                            drop.add(int.from_bytes(f[8:12], "big", signed=True))  # its correlation id
                if not requests and int.from_bytes(f[4:8], "big", signed=True) in drop:
                    with self.lock:
                        self.answers_cut += 1
                    raise EOFError
                dst.sendall(f)
        except (EOFError, OSError):
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.srv.close()


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_lost_produce_answers(tmp_path: Path, client: str) -> None:
    """The client's own retries, measured: three produce requests the broker wrote but whose
    answers were lost. Both clients' producers are idempotent, so the broker drops each retry
    (kafka-python's was not until 2026-11-27 and wrote each of those requests twice)."""
    from capturer.model import Position, RowChange, TableSchema, Txn
    from devtools.local_mariadb import free_port
    from senders.kafka.sender import KafkaSender

    port = free_port()
    proxy = AnswerCutter(port, {6, 12, 18})
    # a broker of its own: it advertises the proxy, so every client connection goes through it
    broker = Broker(port, settings={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"}).start()
    try:
        servers = f"127.0.0.1:{proxy.port}"
        options: dict[str, Any] = {k.name: k.default for k in KafkaSender.KEYS}
        options.update(servers=servers, client=client, partitions=1, schema_topic="", linger_ms=0)
        s = KafkaSender("k", options)
        s.open()
        schema = TableSchema("d", "t", ("id",), ("id",))
        for b in range(30):  # one transaction of 100 rows per batch: about one produce request each
            s.send([Txn("r1", 1000 + b, Position("f", b),
                        tuple(RowChange(schema, "insert", None, {"id": b * 100 + i}) for i in range(100)))])
        s.close()
        recs = sorted(consume_all(f"127.0.0.1:{proxy.port}", ["capturer.d.t"]), key=lambda r: r.offset)
    finally:
        broker.cleanup()
        proxy.close()
    ids = [(hdr(r)["commit_ts"], int(hdr(r)["seq"])) for r in recs]
    dups = len(ids) - len(set(ids))
    print(f"{client}: {proxy.produces} produce requests, {proxy.answers_cut} answers cut, {len(ids)} messages, "
          f"{len(set(ids))} distinct of 3000, {dups} duplicates")
    assert proxy.answers_cut == 3 and len(set(ids)) == 3000
    assert dups == 0
    assert ids == sorted(ids)  # in order
