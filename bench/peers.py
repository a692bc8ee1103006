"""The bench part ``peers``: the capturer beside Debezium, in the same run, on the same sources and broker.

The two MariaDB sources already hold the bench workload (bench/bench.py loads it before any part). One
Apache Kafka broker (devtools/local_kafka.py) takes both outputs, in topics of their own. Each side runs
as its own process tree, one after the other, and is measured the same way:

* ours: ``python -m capturer`` with the Kafka sender (confluent-kafka), both regions, from each binlog's
  start, into ``capturer.bench.t``;
* theirs: Kafka Connect standalone with two Debezium MariaDB connectors (devtools/local_connect.py),
  ``snapshot.mode=never`` (each binlog from its first file), into ``dbz0.bench.t`` / ``dbz1.bench.t``.

Figures (all from the topics' end offsets, sampled every 0.1 s, and /proc): seconds from the process's
start until every change is in the topics; the steady rate between 10 % and 90 % of them; CPU seconds of
the capturing process tree (utime + stime), the sources' and the broker's apart; the tree's peak RSS
(sampled). Then both outputs are read back whole and checked against the sources: message count, the
count of each operation, and the keys alive after the last message of each key against ``SELECT id``.

The initial snapshot: ``snap.t`` (``snapshot_rows`` rows, made in the server) on one source, our
``snapshot=initial`` vs Debezium's ``snapshot.mode=initial``, the same figures.

The MySQL target (``run_sink``): Debezium's JDBC sink reading the Debezium topics (written first, with
schemas) into a MariaDB target vs our MySQL sender reading the binlogs into it, each until the target's
bench.t equals the sources' (rows and CRC32 sums), then compared row for row.

``PEERS_PARTS`` (environment; default ``streaming,snapshot,sink``) runs some of the parts only.

Only configuration of theirs (local_connect.py); no code of theirs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from devtools import local_connect
from devtools.local_kafka import Broker
from devtools.local_mariadb import MariaDBInstance, free_port

ROOT = Path(__file__).resolve().parent.parent
TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024

# Debezium as its documentation recommends for throughput (bigger batches and queue than the defaults of
# 2048 / 8192), and Connect's producer batching more than its defaults; our side: its defaults
DBZ_TUNING = {"max.batch.size": "8192", "max.queue.size": "32768", "poll.interval.ms": "50"}
CONNECT_PRODUCER = {"producer.linger.ms": "10", "producer.batch.size": "524288", "producer.compression.type": "none"}
HEAP = "1g"


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(ppid, utime + stime in seconds, RSS in kB) of one process, None if gone."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TCK, int(rest[21]) * PAGE_KB


def tree(root: int) -> dict[int, tuple[float, int]]:
    """{pid: (cpu seconds, rss kB)} of ``root`` and its descendants."""
    procs: dict[int, tuple[int, float, int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = _stat(int(d))
            if s is not None:
                procs[int(d)] = s
    family, grew = {root}, True
    while grew:
        more = {p for p, (pp, _, _) in procs.items() if pp in family} - family
        family |= more
        grew = bool(more)
    return {p: (procs[p][1], procs[p][2]) for p in family if p in procs}


def cpu_of(pids: list[int]) -> float:
    return sum(c for pid in pids for c, _ in tree(pid).values())


class Offsets:
    """The summed end offsets of some topics (0 for a topic not there yet)."""

    def __init__(self, servers: str, topics: list[str]):
        from confluent_kafka import Consumer

        self.topics = topics
        self.c = Consumer({"bootstrap.servers": servers, "group.id": f"peers-{os.getpid()}"})

    def total(self) -> int:
        from confluent_kafka import KafkaException, TopicPartition

        n = 0
        for t in self.topics:
            try:
                md = self.c.list_topics(t, timeout=2).topics.get(t)
                if md is None or md.error is not None:
                    continue
                for p in md.partitions:
                    n += self.c.get_watermark_offsets(TopicPartition(t, p), timeout=2)[1]
            except KafkaException:
                continue
        return n

    def close(self) -> None:
        self.c.close()


def watch(pid: int, others: dict[str, list[int]], off: Offsets, want: int, t0: float, cpu0: float,
          others0: dict[str, float], timeout: float, alive: Any) -> dict[str, Any]:
    """Sample until ``want`` messages are in the topics: the figures of one side."""
    marks: dict[int, tuple[float, int]] = {}
    cpu_at: dict[int, float] = {}
    peak_kb, n = 0, 0
    deadline = t0 + timeout
    while time.perf_counter() < deadline:
        now = time.perf_counter()
        n = off.total()
        t = tree(pid)
        peak_kb = max(peak_kb, sum(r for _, r in t.values()))
        for pct in (0, 10, 90):
            if pct not in marks and n * 100 >= max(want * pct, 1):
                marks[pct] = (now, n)
                cpu_at[pct] = sum(c for c, _ in t.values())
        if n >= want:
            break
        why = alive()
        if why:
            raise RuntimeError(why)
        time.sleep(0.1)
    end = time.perf_counter()
    cpu = sum(c for c, _ in tree(pid).values()) - cpu0
    secs = end - t0
    out: dict[str, Any] = {"messages": n, "seconds": round(secs, 2), "rows_per_s": round(n / secs),
                           "cpu_s": round(cpu, 2), "rows_per_cpu_s": round(n / cpu) if cpu else None,
                           "peak_rss_mb": round(peak_kb / 1024),
                           "others_cpu_s": {k: round(cpu_of(v) - others0[k], 2) for k, v in others.items()}}
    if 10 in marks and 90 in marks and marks[90][0] > marks[10][0]:
        (ta, ra), (tb, rb) = marks[10], marks[90]
        out["steady_rows_per_s"] = round((rb - ra) / (tb - ta))
        if cpu_at[90] > cpu_at[10]:  # (without the start: JVM / interpreter start, connecting, JIT warm-up)
            out["steady_rows_per_cpu_s"] = round((rb - ra) / (cpu_at[90] - cpu_at[10]))
        out["first_message_seconds"] = round(marks[0][0] - t0, 2)
    if n < want:
        out["error"] = f"{n} of {want} messages in {timeout:.0f} s"
    return out


LAT_RATE, LAT_SECONDS = 200, 15  # latency: one-row transactions per second (all sources), for this long


def latency(sources: list[MariaDBInstance], servers: str, topics: list[str], base: int, rate: int = LAT_RATE,
            seconds: float = LAT_SECONDS) -> dict[str, Any]:
    """Source commit -> message readable: one-row transactions into ``bench.lat`` at ``rate`` per second
    split over the sources (ids from ``base``), each timed from its COMMIT's return to a consumer of
    ``topics`` (positioned at their end first) reading it."""
    import threading

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": servers, "group.id": f"peers-lat-{time.time_ns()}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": "5"})
    parts = []
    for t in topics:
        for pn in c.list_topics(t, timeout=10).topics[t].partitions:
            parts.append(TopicPartition(t, pn, c.get_watermark_offsets(TopicPartition(t, pn), timeout=5)[1]))
    if len(parts) < len(topics):
        raise RuntimeError(f"latency: a topic of {topics} is not there")
    c.assign(parts)
    committed: dict[int, float] = {}
    seen: dict[int, float] = {}
    each = int(rate * seconds) // len(sources)
    n = each * len(sources)

    def write(r: int, m: MariaDBInstance) -> None:
        conn = m.connect()
        conn.autocommit(False)
        t0 = time.perf_counter()
        per = rate / len(sources)
        with conn.cursor() as cur:
            for i in range(each):
                time.sleep(max(0.0, t0 + i / per - time.perf_counter()))
                cur.execute("INSERT INTO bench.lat VALUES (%s, NOW(6))", (base + r * 10_000_000 + i,))
                conn.commit()
                committed[base + r * 10_000_000 + i] = time.time()
        conn.close()

    ws = [threading.Thread(target=write, args=(r, m)) for r, m in enumerate(sources)]
    for w in ws:
        w.start()
    deadline = time.monotonic() + seconds + 60
    try:
        while len(seen) < n and time.monotonic() < deadline:
            # a short wait: consume() returns after its timeout unless 500 messages came, and each read's time
            # is taken when it returns (at 0.05 s every latency had 0-50 ms of this loop's own wait added)
            for msg in c.consume(500, 0.005):
                if msg.error() is None and msg.key():
                    now = time.time()
                    k = json.loads(msg.key())
                    k = k.get("payload", k) if isinstance(k, dict) else k
                    if isinstance(k, dict) and isinstance(k.get("id"), int) and k["id"] >= base:
                        seen.setdefault(k["id"], now)
    finally:
        for w in ws:
            w.join()
        c.close()
    lat = sorted((seen[k] - committed[k]) * 1000 for k in seen if k in committed)
    if not lat:
        return {"rate_rows_per_s": rate, "measured": 0, "error": "no message read"}
    return {"rate_rows_per_s": rate, "sent": n, "measured": len(lat), "p50_ms": round(lat[len(lat) // 2], 1),
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1), "max_ms": round(lat[-1], 1)}


def read_back(servers: str, topics: list[str], timeout: float = 300) -> dict[str, Any]:
    """Every message of ``topics``: count, operations, and the keys alive after each key's last message."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": servers, "group.id": f"peers-read-{time.time_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "enable.partition.eof": True})
    c.subscribe(topics)
    ops: Counter[str] = Counter()
    alive: dict[Any, bool] = {}
    n, eofs, parts = 0, set(), None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if parts is None:
                parts = sum(len(m.partitions) for t, m in c.list_topics(timeout=5).topics.items() if t in topics)
            msgs = c.consume(2000, 1.0)
            for msg in msgs:
                if msg.error() is not None:
                    if msg.error().code() == -191:  # _PARTITION_EOF
                        eofs.add((msg.topic(), msg.partition()))
                    continue
                v = msg.value()
                if v is None:
                    continue  # (tombstone)
                n += 1
                val = json.loads(v)
                val = val.get("payload", val) if isinstance(val, dict) else val
                op = val.get("op", "?") if isinstance(val, dict) else "?"
                ops[op] += 1
                k = json.loads(msg.key()) if msg.key() else None
                k = k.get("payload", k) if isinstance(k, dict) and "payload" in k else k
                key = k.get("id") if isinstance(k, dict) and "id" in k else json.dumps(k, sort_keys=True)
                alive[key] = op != "d"
            if not msgs and parts and len(eofs) >= parts:
                break
    finally:
        c.close()
    return {"messages": n, "ops": dict(ops), "alive": {k for k, a in alive.items() if a}}


def check(got: dict[str, Any], want_n: int, want_ops: dict[str, int], want_keys: set[Any]) -> list[str]:
    """What is wrong in one side's output ([] when nothing)."""
    bad = []
    if got["messages"] != want_n:
        bad.append(f"{got['messages']} messages, {want_n} changes at the sources")
    if want_ops and got["ops"] != want_ops:
        bad.append(f"operations {got['ops']}, the sources' {want_ops}")
    keys = got["alive"]
    if keys != want_keys:
        bad.append(f"keys: {len(want_keys - keys)} missing, {len(keys - want_keys)} not at the sources")
    return bad


def _ours(tmp: Path, servers: list[MariaDBInstance], broker: str, region_extra: str, filt: str) -> subprocess.Popen[bytes]:
    tmp.mkdir(parents=True, exist_ok=True)
    regions = "".join(f"\n[region:r{i}]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id={760 + i}\n"
                      f"{region_extra}" for i, m in enumerate(servers))
    (tmp / "senders.cfg").write_text(f"[global]\ntype=kafka\n[kafka]\nservers={broker}\nclient=confluent\n")
    (tmp / "filter.txt").write_text(f"include {filt}\n")
    (tmp / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={tmp / 'cp.json'}\nsenderConfig={tmp / 'senders.cfg'}\n"
        f"filterRuleDict={tmp / 'filter.txt'}\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n"
        + regions)
    log = open(tmp / "capturer.log", "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "capturer", "--config", str(tmp / "config.cfg")],
                                cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        log.close()


def _stop(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def side_ours(tmp: Path, servers: list[MariaDBInstance], broker: Broker, want: int, topic: str,
              region_extra: str = "", filt: str = "bench.*", timeout: float = 1200, lat_base: int = 0) -> dict[str, Any]:
    others = {"sources": [m.proc.pid for m in servers if m.proc], "broker": [broker.proc.pid] if broker.proc else []}
    others0 = {k: cpu_of(v) for k, v in others.items()}
    off = Offsets(broker.servers, [topic])
    t0 = time.perf_counter()
    p = _ours(tmp, servers, broker.servers, region_extra, filt)
    try:
        r = watch(p.pid, others, off, want, t0, 0.0, others0, timeout,
                  lambda: f"the capturer exited {p.returncode}: {(tmp / 'capturer.log').read_text()[-2000:]}"
                  if p.poll() is not None else "")
        if lat_base:
            r["latency"] = latency(servers, broker.servers, ["capturer.bench.lat"], lat_base)
        return r
    finally:
        off.close()
        _stop(p)


def side_debezium(tmp: Path, servers: list[MariaDBInstance], broker: Broker, want: int, prefix: str,
                  snapshot_mode: str, tables: str = "bench.t", timeout: float = 1200,
                  lat_base: int = 0) -> dict[str, Any]:
    others = {"sources": [m.proc.pid for m in servers if m.proc], "broker": [broker.proc.pid] if broker.proc else []}
    others0 = {k: cpu_of(v) for k, v in others.items()}
    topics = [f"{prefix}{i}.{tables}" for i in range(len(servers))]
    off = Offsets(broker.servers, topics)
    connect = local_connect.Connect(broker.servers, heap=HEAP, directory=tmp, settings=CONNECT_PRODUCER)
    cfgs = [local_connect.debezium_mariadb(f"{prefix}{i}", m, server_id=810 + i, prefix=f"{prefix}{i}",
                                           servers=broker.servers, snapshot_mode=snapshot_mode,
                                           tables=tables + (",bench.lat" if lat_base else ""),
                                           **DBZ_TUNING)
            for i, m in enumerate(servers)]
    t0 = time.perf_counter()
    try:
        connect.start(cfgs, timeout=300)
        r = watch(connect.pid, others, off, want, t0, 0.0, others0, timeout,
                  lambda: connect.failed() or ("" if connect.proc and connect.proc.poll() is None
                                               else f"Connect exited: {connect.tail()}"))
        if lat_base:
            r["latency"] = latency(servers, broker.servers, [f"{prefix}{i}.bench.lat" for i in range(len(servers))],
                                   lat_base)
        r["failed"] = connect.failed()
        return r
    finally:
        off.close()
        connect.stop()


def source_state(servers: list[MariaDBInstance], table: str) -> set[Any]:
    keys: set[Any] = set()
    for m in servers:
        c = m.connect()
        with c.cursor() as cur:
            cur.execute(f"SELECT id FROM {table}")
            keys |= {r[0] for r in cur.fetchall()}
        c.close()
    return keys


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def run(tmp: Path, servers: list[MariaDBInstance], changes: dict[str, int], snapshot_rows: int,
        load_sequence: Any) -> dict[str, Any]:
    """``changes``: the sources' row changes in bench.t by operation (c, u, d; both regions)."""
    if why := local_connect.unavailable():
        raise RuntimeError(why)
    local_connect.classpath()  # (resolved before any clock starts)
    tmp.mkdir(parents=True, exist_ok=True)
    parts = os.environ.get("PEERS_PARTS", "streaming,snapshot,sink").split(",")  # (to run one of them)
    out: dict[str, Any] = {"versions": {"debezium": f"{local_connect.CONNECTOR} {local_connect.DEBEZIUM_VERSION}",
                                        "kafka_connect": local_connect.CONNECT_VERSION},
                           "debezium_settings": DBZ_TUNING, "connect_producer": CONNECT_PRODUCER, "heap": HEAP}
    for m in servers:
        local_connect.grant_debezium(m)
    want = sum(changes.values())
    keys = source_state(servers, "bench.t")
    problems: list[str] = []
    if "sink" in parts:
        out["mysql_target"] = run_sink(tmp / "sink", servers, want)
        problems += out["mysql_target"]["problems"]
    if "streaming" in parts:
        for m in servers:  # (latency's table: its DDL in the binlog before either side starts)
            m.execute("CREATE TABLE IF NOT EXISTS bench.lat (id INT PRIMARY KEY, at DATETIME(6))")
        broker = Broker(partitions=1).start()
        try:
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": broker.servers})
            made = admin.create_topics(
                [NewTopic(t, 1, 1) for t in ("capturer.bench.lat", "dbz0.bench.lat", "dbz1.bench.lat")])
            for f in made.values():
                f.result(60)
            ours = side_ours(tmp / "ours", servers, broker, want, "capturer.bench.t", lat_base=100_000_000)
            theirs = side_debezium(tmp / "connect", servers, broker, want, "dbz", "never", lat_base=200_000_000)
            for name, r, topics in (("ours", ours, ["capturer.bench.t"]),
                                    ("debezium", theirs, [f"dbz{i}.bench.t" for i in range(len(servers))])):
                got = read_back(broker.servers, topics)
                r["check"] = check(got, want, changes, keys) or "ok"
                if r["check"] != "ok":
                    problems.append(f"streaming, {name}: {'; '.join(r['check'])}")
            out["streaming"] = {"changes": want, "ours": ours, "debezium": theirs, "ratios": {
                "rows_per_s": ratio(ours["rows_per_s"], theirs["rows_per_s"]),
                "steady_rows_per_s": ratio(ours.get("steady_rows_per_s"), theirs.get("steady_rows_per_s")),
                "rows_per_cpu_s": ratio(ours["rows_per_cpu_s"], theirs["rows_per_cpu_s"]),
                "steady_rows_per_cpu_s": ratio(ours.get("steady_rows_per_cpu_s"), theirs.get("steady_rows_per_cpu_s")),
                "peak_rss": ratio(ours["peak_rss_mb"], theirs["peak_rss_mb"]),
                "latency_p50": ratio(ours.get("latency", {}).get("p50_ms"), theirs.get("latency", {}).get("p50_ms")),
                "latency_p99": ratio(ours.get("latency", {}).get("p99_ms"), theirs.get("latency", {}).get("p99_ms"))}}
        finally:
            broker.kill()
            broker.cleanup()
    if snapshot_rows and "snapshot" in parts:
        src = servers[:1]
        load_sequence(src[0], "snap.t", snapshot_rows)
        skeys = set(range(snapshot_rows))
        broker = Broker(partitions=1).start()
        try:
            ours = side_ours(tmp / "snap-ours", src, broker, snapshot_rows, "capturer.snap.t",
                             region_extra="snapshot=initial\nsnapshot_workers=2\n", filt="snap.*")
            theirs = side_debezium(tmp / "snap-connect", src, broker, snapshot_rows, "dbzs", "initial", tables="snap.t")
            for name, r, topics in (("ours", ours, ["capturer.snap.t"]), ("debezium", theirs, ["dbzs0.snap.t"])):
                got = read_back(broker.servers, topics)
                r["check"] = check(got, snapshot_rows, {}, skeys) or "ok"
                r["ops"] = got["ops"]
                if r["check"] != "ok":
                    problems.append(f"snapshot, {name}: {'; '.join(r['check'])}")
            out["snapshot"] = {"rows": snapshot_rows, "ours": ours, "debezium": theirs, "ratios": {
                "rows_per_s": ratio(ours["rows_per_s"], theirs["rows_per_s"]),
                "rows_per_cpu_s": ratio(ours["rows_per_cpu_s"], theirs["rows_per_cpu_s"]),
                "peak_rss": ratio(ours["peak_rss_mb"], theirs["peak_rss_mb"])}}
        finally:
            broker.kill()
            broker.cleanup()
    out["problems"] = problems
    return out


def summary(r: dict[str, Any]) -> str:
    lines = []
    for part in ("streaming", "snapshot"):
        if part not in r:
            continue
        p = r[part]
        n = p.get("changes", p.get("rows"))
        for side in ("ours", "debezium"):
            s = p[side]
            lines.append(f"peers {part} ({n:,} rows), {side}: {s['rows_per_s']:,} rows/s from start"
                         + (f", steady {s['steady_rows_per_s']:,}" if "steady_rows_per_s" in s else "")
                         + f", {s['rows_per_cpu_s']} rows/CPU-s"
                         + (f" (steady {s['steady_rows_per_cpu_s']})" if "steady_rows_per_cpu_s" in s else "")
                         + f", peak RSS {s['peak_rss_mb']} MB, check {s['check']}"
                         + (f", latency p50 {s['latency'].get('p50_ms')} ms p99 {s['latency'].get('p99_ms')} ms"
                            if "latency" in s else ""))
        lines.append(f"peers {part} ratios (ours / Debezium): {p['ratios']}")
    if "mysql_target" in r and "ours" in r["mysql_target"]:
        p = r["mysql_target"]
        for side in ("ours", "debezium_jdbc"):
            s = p[side]
            lines.append(f"peers mysql target ({p['changes']:,} changes), {side}: {s['rows_per_s']:,} rows/s from "
                         f"start until the target equals the sources ({s['seconds']} s; from the first row "
                         f"{s.get('rows_per_s_from_first_row')}), {s['rows_per_cpu_s']} "
                         f"rows/CPU-s, peak RSS {s['peak_rss_mb']} MB, check {s['check']}")
        lines.append(f"peers mysql target ratios (ours / Debezium JDBC sink): {p['ratios']}")
    return "\n".join(lines)


# ---- MySQL target: Debezium's JDBC sink (reading the Debezium topics) vs our MySQL sender ----------------

# the JDBC sink as Debezium's documentation recommends for throughput: upserts by key, bigger batches than
# the default 500, and Connect's consumer polling as many records as a batch (its default max.poll.records
# is 500, which would cap every batch at 500); one task per topic (one partition each)
SINK_TUNING = {"batch.size": "8192", "use.reduction.buffer": "true"}
SINK_CONSUMER = {"consumer.max.poll.records": "8192", "consumer.fetch.min.bytes": "65536",
                 "consumer.fetch.max.wait.ms": "100"}
SCHEMAS = {"key.converter.schemas.enable": "true", "value.converter.schemas.enable": "true"}
SINK_THREADS = 8  # our MySQL sender's threadnum (bench.py's --threads default)
COLUMNS = "id, name, city, price, qty, created, updated, n, big, note"


def table_sum(servers: list[MariaDBInstance], table: str = "bench.t") -> tuple[int, int]:
    """(rows, sum of each row's CRC32 over every column) of ``table`` summed over ``servers``: equal
    for the union of the sources and a target holding the same rows, whatever their order."""
    n = crc = 0
    for m in servers:
        c = m.connect()
        try:
            with c.cursor() as cur:
                cur.execute(f"SELECT COUNT(*), COALESCE(SUM(CRC32(CONCAT_WS('|', {COLUMNS}))), 0) FROM {table}")
                a, b = cur.fetchone()
                n, crc = n + int(a), crc + int(b)
        except Exception:  # (the target's table not made yet)
            pass
        finally:
            c.close()
    return n, crc


def table_count(m: MariaDBInstance, table: str = "bench.t") -> int:
    c = m.connect()
    try:
        with c.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {table}")
            return int(cur.fetchone()[0])
    except Exception:  # (the target's table not made yet)
        return 0
    finally:
        c.close()


def rows_of(servers: list[MariaDBInstance], table: str = "bench.t") -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for m in servers:
        c = m.connect()
        with c.cursor() as cur:
            cur.execute(f"SELECT {COLUMNS} FROM {table}")
            out += [tuple(r) for r in cur.fetchall()]
        c.close()
    return sorted(out)


def compare_rows(sources: list[MariaDBInstance], target: MariaDBInstance) -> list[str]:
    """The target's ``bench.t`` against the union of the sources', row for row ([] when equal)."""
    want, got = rows_of(sources), rows_of([target])
    if want == got:
        return []
    w, g = {r[0]: r for r in want}, {r[0]: r for r in got}
    differ = [k for k in w.keys() & g.keys() if w[k] != g[k]]
    bad = [f"{len(want)} rows at the sources, {len(got)} at the target: {len(w.keys() - g.keys())} missing, "
           f"{len(g.keys() - w.keys())} not at the sources, {len(differ)} different"]
    if differ:
        k = min(differ)
        bad.append(f"e.g. id {k}: source {w[k]!r}, target {g[k]!r}")
    return bad


def watch_target(pid: int, sources: list[MariaDBInstance], target: MariaDBInstance, want: tuple[int, int],
                 t0: float, timeout: float, alive: Any) -> dict[str, Any]:
    """Sample until the target's bench.t sums as the sources' (rows, CRC32 sum): the figures of one side."""
    peak_kb = 0
    done = False
    deadline = t0 + timeout
    tpid = [target.proc.pid] if target.proc else []
    target_cpu0 = cpu_of(tpid)
    first = None
    while time.perf_counter() < deadline:
        t = tree(pid)
        peak_kb = max(peak_kb, sum(r for _, r in t.values()))
        n = table_count(target)
        if first is None and n:
            first = time.perf_counter() - t0
        if n == want[0] and table_sum([target]) == want:
            done = True
            break
        why = alive()
        if why:
            raise RuntimeError(why)
        time.sleep(0.25)
    end = time.perf_counter()
    t = tree(pid)
    cpu = sum(c for c, _ in t.values())
    peak_kb = max(peak_kb, sum(r for _, r in t.values()))
    out: dict[str, Any] = {"seconds": round(end - t0, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(peak_kb / 1024),
                           "first_row_seconds": round(first, 2) if first is not None else None, "equal_sums": done,
                           "target_cpu_s": round(cpu_of(tpid) - target_cpu0, 2)}
    if not done:
        out["error"] = f"the target's bench.t did not sum as the sources' in {timeout:.0f} s"
    return out


def _rates(r: dict[str, Any], changes: int) -> None:
    """rows/s from the process's start, and from its first row at the target (without JVM / interpreter
    start, connecting, the first poll), rows per CPU-second of the process tree."""
    r["changes"] = changes
    r["rows_per_s"] = round(changes / r["seconds"])
    if r["first_row_seconds"] is not None and r["seconds"] > r["first_row_seconds"]:
        r["rows_per_s_from_first_row"] = round(changes / (r["seconds"] - r["first_row_seconds"]))
    r["rows_per_cpu_s"] = round(changes / r["cpu_s"]) if r["cpu_s"] else None


def _reset(target: MariaDBInstance) -> None:
    target.execute("DROP DATABASE IF EXISTS bench", "DROP DATABASE IF EXISTS _capturer")


def sink_ours(tmp: Path, servers: list[MariaDBInstance], target: MariaDBInstance, changes: int,
              want: tuple[int, int], timeout: float = 1200) -> dict[str, Any]:
    """The capturer with its MySQL sender (its defaults, threadnum=8) from each binlog's start into the
    target, until the target's bench.t equals the sources'."""
    _reset(target)
    tmp.mkdir(parents=True, exist_ok=True)
    regions = "".join(f"\n[region:r{i}]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id={770 + i}\n"
                      for i, m in enumerate(servers))
    (tmp / "senders.cfg").write_text(f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\n"
                                     f"user=root\nthreadnum={SINK_THREADS}\n")
    (tmp / "filter.txt").write_text("include bench.t\n")
    (tmp / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={tmp / 'cp.json'}\nsenderConfig={tmp / 'senders.cfg'}\n"
        f"filterRuleDict={tmp / 'filter.txt'}\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n"
        + regions)
    t0 = time.perf_counter()
    with open(tmp / "capturer.log", "ab") as log:
        p = subprocess.Popen([sys.executable, "-m", "capturer", "--config", str(tmp / "config.cfg")],
                             cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        r = watch_target(p.pid, servers, target, want, t0, timeout,
                         lambda: f"the capturer exited {p.returncode}: {(tmp / 'capturer.log').read_text()[-2000:]}"
                         if p.poll() is not None else "")
    finally:
        _stop(p)
    _rates(r, changes)
    r["config"] = {"type": "mysql", "threadnum": SINK_THREADS, "source": "each binlog from its first file"}
    return r


def sink_debezium(tmp: Path, servers: list[MariaDBInstance], target: MariaDBInstance, broker: Broker, changes: int,
                  want: tuple[int, int], topics: list[str], timeout: float = 1200) -> dict[str, Any]:
    """Kafka Connect with Debezium's JDBC sink reading ``topics`` (already holding every change) into the
    target, until the target's bench.t equals the sources'. The table is made first with the sources' DDL
    (the sink's own CREATE from the events' schemas would type the string decimals as text)."""
    c = servers[0].connect()
    with c.cursor() as cur:
        cur.execute("SHOW CREATE TABLE bench.t")
        ddl = cur.fetchone()[1]
    c.close()
    _reset(target)
    target.execute("CREATE DATABASE bench", ddl.replace("CREATE TABLE `t`", "CREATE TABLE bench.t", 1))
    user, pw = "dbzsink", "dbzsink-pw"
    target.execute(f"CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY '{pw}'",
                   f"GRANT ALL ON *.* TO '{user}'@'%'")
    connect = local_connect.Connect(broker.servers, heap=HEAP, directory=tmp, jars=local_connect.jdbc_classpath(),
                                    settings={**SCHEMAS, **SINK_CONSUMER})
    cfg = local_connect.debezium_jdbc_sink("sink", target, user=user, password=pw, database="bench", table="t",
                                           topics=topics, tasks=len(topics), **SINK_TUNING)
    t0 = time.perf_counter()
    try:
        connect.start([cfg], timeout=300)
        r = watch_target(connect.pid, servers, target, want, t0, timeout,
                         lambda: connect.failed() or ("" if connect.proc and connect.proc.poll() is None
                                                      else f"Connect exited: {connect.tail()}"))
        r["failed"] = connect.failed()
    finally:
        connect.stop()
    _rates(r, changes)
    r["config"] = {k: v for k, v in cfg.items() if "password" not in k}
    r["worker"] = {**SCHEMAS, **SINK_CONSUMER, "heap": HEAP}
    return r


def run_sink(tmp: Path, servers: list[MariaDBInstance], changes: int, timeout: float = 1200) -> dict[str, Any]:
    """The MySQL target part: Debezium's MariaDB connectors write the topics first (JSON with schemas, as the
    JDBC sink needs; not timed), then the JDBC sink reads them into a MariaDB target, and our capturer's
    MySQL sender reads the binlogs into the same target (emptied between): both until the target equals the
    sources, both checked row for row."""
    tmp.mkdir(parents=True, exist_ok=True)
    local_connect.jdbc_classpath()  # (resolved before any clock starts)
    want = table_sum(servers)
    target = MariaDBInstance(tmp / "target", server_id=97, binlog=False).start()
    out: dict[str, Any] = {"versions": {"jdbc_sink": f"debezium-connector-jdbc {local_connect.DEBEZIUM_VERSION}",
                                        "mariadb_jdbc": local_connect.MARIADB_JDBC_VERSION,
                                        "kafka_connect": local_connect.CONNECT_VERSION},
                           "changes": changes, "target_rows": want[0]}
    problems: list[str] = []
    broker = Broker(partitions=1).start()
    try:
        topics = [f"dbzj{i}.bench.t" for i in range(len(servers))]
        off = Offsets(broker.servers, topics)
        src = local_connect.Connect(broker.servers, heap=HEAP, directory=tmp / "source",
                                    settings={**CONNECT_PRODUCER, **SCHEMAS})
        t0 = time.perf_counter()
        try:
            src.start([local_connect.debezium_mariadb(f"dbzj{i}", m, server_id=830 + i, prefix=f"dbzj{i}",
                                                      servers=broker.servers, snapshot_mode="never", **DBZ_TUNING)
                       for i, m in enumerate(servers)], timeout=300)
            while off.total() < changes and time.perf_counter() - t0 < timeout:
                if why := src.failed():
                    raise RuntimeError(why)
                time.sleep(0.2)
        finally:
            src.stop()
            off.close()
        out["topics_written_seconds"] = round(time.perf_counter() - t0, 1)
        theirs = sink_debezium(tmp / "sink-connect", servers, target, broker, changes, want, topics, timeout)
        theirs["check"] = compare_rows(servers, target) or "ok"
        ours = sink_ours(tmp / "sink-ours", servers, target, changes, want, timeout)
        ours["check"] = compare_rows(servers, target) or "ok"
        for name, r in (("ours", ours), ("debezium_jdbc", theirs)):
            if r["check"] != "ok":
                problems.append(f"mysql target, {name}: {'; '.join(r['check'])}")
        out.update({"ours": ours, "debezium_jdbc": theirs, "ratios": {
            "rows_per_s": ratio(ours["rows_per_s"], theirs["rows_per_s"]),
            "rows_per_s_from_first_row": ratio(ours.get("rows_per_s_from_first_row"),
                                               theirs.get("rows_per_s_from_first_row")),
            "rows_per_cpu_s": ratio(ours["rows_per_cpu_s"], theirs["rows_per_cpu_s"]),
            "peak_rss": ratio(ours["peak_rss_mb"], theirs["peak_rss_mb"])}})
    finally:
        broker.kill()
        broker.cleanup()
        target.stop()
    out["problems"] = problems
    return out
