"""Benchmarks: a fixed workload on private MariaDB regions, the capturer's
end-to-end rate into each sender, next to baselines measured in the same run.

    sh bench/run.sh                 # full: 200k inserts (100-row txns), 50k updates, 20k deletes, 2 regions
    sh bench/run.sh --rows 5000     # smoke size

Every figure is reported with its ratio to a baseline from the same run; the
machine is small and noisy, so absolute numbers mean little on their own.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from capturer.app import Capturer  # noqa: E402
from capturer.config import load_config  # noqa: E402
from capturer.local_mariadb import MariaDBInstance, free_port  # noqa: E402

TABLE = """CREATE TABLE bench.t (
  id INT PRIMARY KEY, name VARCHAR(64), city VARCHAR(32), price DECIMAL(12,2), qty DECIMAL(10,3),
  created DATETIME(6), updated DATETIME, n INT, big BIGINT, note TEXT)"""


def load(m: MariaDBInstance, region: int, inserts: int, updates: int, deletes: int, batch: int = 100) -> int:
    """The fixed workload on one region; returns the row changes written."""
    rng = random.Random(region)
    c = m.connect()
    c.autocommit(False)
    base = region * 10_000_000
    now = dt.datetime(2026, 1, 1, 12, 0, 0)
    with c.cursor() as cur:
        for start in range(0, inserts, batch):
            rows = [
                (base + i, f"name-{i}", rng.choice(["Paris", "Oslo", "Lima", "Pune"]),
                 decimal.Decimal(rng.randrange(100000)) / 100, decimal.Decimal(rng.randrange(100000)) / 1000,
                 now + dt.timedelta(microseconds=i), now, i, i * 1000, "x" * 60)
                for i in range(start, min(start + batch, inserts))
            ]
            cur.executemany("INSERT INTO bench.t VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", rows)
            c.commit()
        for start in range(0, updates, batch):
            cur.execute("UPDATE bench.t SET n = n + 1, updated = NOW() WHERE id >= %s AND id < %s",
                        (base + start, base + min(start + batch, updates)))
            c.commit()
        top = inserts - deletes
        for start in range(top, inserts, batch):
            cur.execute("DELETE FROM bench.t WHERE id >= %s AND id < %s", (base + start, base + min(start + batch, inserts)))
            c.commit()
    c.close()
    return inserts + updates + deletes


def baseline_decode(m: MariaDBInstance) -> tuple[int, float]:
    """python-mysql-replication alone: decode every row event of the binlog to dicts."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    s = BinLogStreamReader(
        {"host": "127.0.0.1", "port": m.port, "user": "root", "passwd": ""}, server_id=4242,
        blocking=False, resume_stream=True, log_file="mariadb-bin.000001", log_pos=4,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent], enable_logging=False,
    )
    t0 = time.perf_counter()
    n = 0
    for ev in s:
        for _ in ev.rows:
            n += 1
    dt_ = time.perf_counter() - t0
    s.close()
    return n, dt_


def baseline_upsert(target: MariaDBInstance, rows: int, batch: int = 1000) -> float:
    """Raw multi-row upsert rate of the target: pymysql executemany, 1000-row batches, 1 connection."""
    target.execute("CREATE DATABASE IF NOT EXISTS base", TABLE.replace("bench.t", "base.t"))
    c = target.connect()
    c.autocommit(False)
    now = dt.datetime(2026, 1, 1)
    data = [(i, f"name-{i}", "Oslo", decimal.Decimal("12.34"), decimal.Decimal("1.500"), now, now, i, i * 1000, "x" * 60)
            for i in range(rows)]
    t0 = time.perf_counter()
    with c.cursor() as cur:
        for start in range(0, rows, batch):
            cur.executemany(
                "INSERT INTO base.t VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON DUPLICATE KEY UPDATE "
                "name=VALUES(name), n=VALUES(n)", data[start:start + batch])
            c.commit()
    secs = time.perf_counter() - t0
    c.close()
    target.execute("DROP DATABASE base")
    return rows / secs


def run_capturer(tmp: Path, servers: list[MariaDBInstance], senders_cfg: str, expect_rows: int) -> dict[str, Any]:
    regions = "".join(
        f"\n[region:r{i}]\nhost=127.0.0.1\nport={m.port}\nuser=root\npassword=\nserver_id={700 + i}\n"
        for i, m in enumerate(servers)
    )
    (tmp / "senders.cfg").write_text(senders_cfg)
    (tmp / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={tmp / 'cp.json'}\nsenderConfig={tmp / 'senders.cfg'}\n"
        f"filterRuleDict=\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n" + regions
    )
    cap = Capturer(load_config(tmp / "config.cfg"))
    t0 = time.perf_counter()
    cap.start()
    done_at: list[float] = []

    def until(c: Capturer) -> bool:
        if all(s.rows >= expect_rows for s in c.senders):
            done_at.append(time.perf_counter())
            return True
        return time.perf_counter() - t0 > 1800

    code = cap.run(until=until)
    elapsed = (done_at[0] if done_at else time.perf_counter()) - t0
    return {"exit": code, "seconds": round(elapsed, 2), "rows": min(s.rows for s in cap.senders),
            "rows_per_s": round(min(s.rows for s in cap.senders) / elapsed)}


def baseline_producer(servers: str, client: str, n: int) -> float:
    """Raw producer rate: n ~420-byte JSON messages, keyed, acks=all, idempotent, one topic."""
    value = json.dumps({"id": 1, "name": "x" * 380}).encode()
    topic = f"baseline-{client}"
    t0 = time.perf_counter()
    if client == "confluent":
        import confluent_kafka

        p = confluent_kafka.Producer({"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True,
                                      "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
        for i in range(n):
            while True:
                try:
                    p.produce(topic, value=value, key=str(i).encode())
                    break
                except BufferError:
                    p.poll(0.05)
            p.poll(0)
        p.flush(120)
    else:
        from kafka import KafkaProducer

        kp = KafkaProducer(bootstrap_servers=servers, acks="all", enable_idempotence=True, linger_ms=5,
                           batch_size=256 * 1024)
        for i in range(n):
            kp.send(topic, value=value, key=str(i).encode())
        kp.flush(120)
        kp.close()
    return n / (time.perf_counter() - t0)


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []

    def add(self, label: str, rate: float, baseline: float | None) -> None:
        self.rows.append((label, rate, rate / baseline if baseline else 1.0))

    def markdown(self) -> str:
        out = ["| measure | rows/s | ratio to its baseline |", "|---|---:|---:|"]
        out += [f"| {label} | {rate:,.0f} | {ratio:.2f} |" for label, rate, ratio in self.rows]
        return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000, help="inserts per run (split over regions)")
    ap.add_argument("--smoke", action="store_true", help="assert completeness only (CI)")
    ap.add_argument("--threads", type=int, default=8, help="MySQL sender workers")
    ap.add_argument("--only", default="file,mysql,kafka", help="senders to measure")
    args = ap.parse_args()
    only = set(args.only.split(","))
    inserts = args.rows // 2
    updates, deletes = inserts // 4, inserts // 10
    tmp = Path(tempfile.mkdtemp(prefix="capt-bench-"))
    servers = [MariaDBInstance(tmp / f"r{i}", server_id=i + 1).start() for i in range(2)]
    extra: list[Any] = []
    rep = Report()
    results: dict[str, Any] = {"date": dt.datetime.now().isoformat(timespec="seconds"),
                               "workload": {"inserts": inserts * 2, "updates": updates * 2, "deletes": deletes * 2,
                                            "regions": 2}, "cpu": os.cpu_count()}
    failures = []

    def e2e(name: str, senders_cfg: str, total: int, baseline: float | None, label: str) -> None:
        (tmp / name).mkdir()
        r = run_capturer(tmp / name, servers, senders_cfg, total)
        results[name] = r
        rep.add(label, r["rows_per_s"], baseline)
        if r["rows"] != total or r["exit"] != 0:
            failures.append(f"{name}: {r['rows']} of {total} rows, exit {r['exit']}")

    try:
        for m in servers:
            m.execute("CREATE DATABASE bench", TABLE)
        t0 = time.perf_counter()
        written = [0, 0]

        def go(i: int, m: MariaDBInstance) -> None:
            written[i] = load(m, i + 1, inserts, updates, deletes)

        threads = [threading.Thread(target=go, args=(i, m)) for i, m in enumerate(servers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = sum(written)
        results["load_seconds"] = round(time.perf_counter() - t0, 2)
        n, secs = baseline_decode(servers[0])
        decode = n / secs
        results["baseline_decode_rows_per_s"] = round(decode)
        rep.add("baseline: python-mysql-replication decode, 1 region", decode, None)
        if "file" in only:
            e2e("file", f"[global]\ntype=local\n[local]\nfilepath={tmp / 'file' / 'changes.jsonl'}\n",
                total, decode, "capturer -> file (2 regions)")
        if "mysql" in only:
            target = MariaDBInstance(tmp / "target", server_id=99).start()
            extra.append(target)
            ups = baseline_upsert(target, total)
            results["baseline_upsert_rows_per_s"] = round(ups)
            rep.add("baseline: raw multi-row upsert into the target (1 conn, 1000-row batches)", ups, None)
            e2e("mysql", f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\n"
                f"threadnum={args.threads}\n", total, ups, f"capturer -> mysql ({args.threads} workers)")
        if "kafka" in only:
            sys.path.insert(0, str(ROOT / "tests"))
            from helpers import Broker

            for client in ("kafka-python", "confluent"):
                broker = Broker().start()  # a fresh broker each: memory storage grows
                extra.append(broker)
                raw = baseline_producer(broker.servers, client, total)
                results[f"baseline_producer_{client}_msgs_per_s"] = round(raw)
                rep.add(f"baseline: raw producer, {client}", raw, None)
                e2e(f"kafka-{client}", f"[global]\ntype=kafka\n[kafka]\nservers={broker.servers}\nclient={client}\n",
                    total, raw, f"capturer -> kafka ({client})")
                broker.kill()
    finally:
        for m in servers + extra:
            (m.kill if hasattr(m, "kill") and not hasattr(m, "stop") else m.stop)()
    results["table"] = rep.rows
    print(json.dumps(results, indent=2))
    print()
    print(rep.markdown())
    if failures:
        print("\nINCOMPLETE: " + "; ".join(failures))
        return 1
    if not args.smoke:
        dest = ROOT / "bench" / "results" / f"{dt.date.today().isoformat()}.json"
        dest.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwritten {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
