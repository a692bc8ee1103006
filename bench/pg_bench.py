"""PostgreSQL region benchmark: the bench workload (inserts in 100-row
transactions, updates, deletes) on a private PostgreSQL, read three ways from
slots created before the load, all in the same run:

* raw: the replication stream itself (libpq COPY framing, no pgoutput parsing):
  the ceiling of any pgoutput reader in Python;
* parse: the same plus ``pgoutput.parse`` of every message (no values);
* capturer: a PostgreSQL region into the file sender, end to end.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
import time
from pathlib import Path
from typing import Any

from capturer.regions.postgresql import pgoutput as po
from devtools.local_mariadb import free_port
from devtools.local_postgres import PostgresInstance

TABLE = """CREATE TABLE public.t (
  id int PRIMARY KEY, name varchar(64), city varchar(32), price numeric(12,2), qty numeric(10,3),
  created timestamp(6), updated timestamp, n int, big bigint, note text)"""


def load(pg: PostgresInstance, inserts: int, updates: int, deletes: int, batch: int = 100) -> int:
    rng = random.Random(1)
    now = dt.datetime(2026, 1, 1, 12, 0, 0)
    with pg.connect(autocommit=False) as c:
        cur = c.cursor()
        for start in range(0, inserts, batch):
            rows = [(i, f"name-{i}", rng.choice(["Paris", "Oslo", "Lima", "Pune"]),
                     decimal.Decimal(rng.randrange(100000)) / 100, decimal.Decimal(rng.randrange(100000)) / 1000,
                     now + dt.timedelta(microseconds=i), now, i, i * 1000, "x" * 60)
                    for i in range(start, min(start + batch, inserts))]
            cur.executemany("INSERT INTO public.t VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", rows)
            c.commit()
        for start in range(0, updates, batch):
            cur.execute("UPDATE public.t SET n = n + 1, updated = now() WHERE id >= %s AND id < %s",
                        (start, min(start + batch, updates)))
            c.commit()
        top = inserts - deletes
        for start in range(top, inserts, batch):
            cur.execute("DELETE FROM public.t WHERE id >= %s AND id < %s", (start, min(start + batch, inserts)))
            c.commit()
    return inserts + updates + deletes


def read_raw(pg: PostgresInstance, slot: str, rows: int, parse: bool) -> float:
    """Rows per second of reading the slot's stream until ``rows`` row messages arrived."""
    from psycopg import pq

    conn = pq.PGconn.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres "
                             "replication=database".encode())
    assert conn.status == pq.ConnStatus.OK, conn.error_message
    res = conn.exec_(f"START_REPLICATION SLOT {slot} LOGICAL 0/0 (proto_version '1', publication_names 'b')".encode())
    assert res.status == pq.ExecStatus.COPY_BOTH, res.error_message
    got = 0
    t0 = time.perf_counter()
    while got < rows:
        n, data = conn.get_copy_data(0)
        if n <= 0:
            raise RuntimeError(f"stream ended after {got} rows")
        b = bytes(data)
        if b[:1] != b"w":
            continue
        payload = b[25:]
        if parse:
            m = po.parse(payload)
            got += isinstance(m, (po.Insert, po.Update, po.Delete))
        else:
            got += payload[:1] in (b"I", b"U", b"D")
    secs = time.perf_counter() - t0
    conn.finish()
    return rows / secs


def measure(tmp: Path, inserts: int, run_until_delivered: Any, variants: dict[str, tuple[str, str]] | None = None,
            raw: bool = True) -> dict[str, Any]:
    """The three reads; ``variants``: more capturer runs (name -> (lines added to the region's
    section, the senders' configuration: "" for the file sender)), each from a slot of its own."""
    variants = variants or {}
    pg = PostgresInstance().start()
    try:
        with pg.connect() as c:
            c.execute(TABLE)
            c.execute("CREATE PUBLICATION b FOR ALL TABLES")
            for s in ("raw", "parsed", "capturer_pg", *(f"capturer_{v}" for v in variants)):
                c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))
        t0 = time.perf_counter()
        total = load(pg, inserts, inserts // 4, inserts // 10)
        out: dict[str, Any] = {"rows": total, "load_seconds": round(time.perf_counter() - t0, 2)}
        if raw:
            cpu0 = time.process_time()
            out["raw_stream_rows_per_s"] = round(read_raw(pg, "raw", total, parse=False))
            out["raw_stream_rows_per_cpu_s"] = round(total / max(time.process_time() - cpu0, 1e-6))
            cpu0 = time.process_time()
            out["pgoutput_parse_rows_per_s"] = round(read_raw(pg, "parsed", total, parse=True))
            out["pgoutput_parse_rows_per_cpu_s"] = round(total / max(time.process_time() - cpu0, 1e-6))
        for name, slot, (extra, senders) in (("capturer", "capturer_pg", ("", "")),
                                             *((f"capturer_{v}", f"capturer_{v}", e) for v, e in variants.items())):
            d = tmp / name
            d.mkdir()
            (d / "senders.cfg").write_text(senders or f"[global]\ntype=local\n[local]\nfilepath={d / 'changes.jsonl'}\n")
            (d / "config.cfg").write_text(
                f"[global]\nbinlogCheckPointPath={d / 'cp.json'}\nsenderConfig={d / 'senders.cfg'}\n"
                f"filterRuleDict=\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n"
                f"[region:pg]\ntype=postgresql\nhost=127.0.0.1\nport={pg.port}\nuser=postgres\ndbname=postgres\n"
                f"publication=b\nslot={slot}\nddl=false\n{extra}")
            out[name] = run_until_delivered(d / "config.cfg", total)
        return out
    finally:
        pg.destroy()


def snapshot_measure(tmp: Path, rows: int, run_until_delivered: Any) -> dict[str, Any]:
    """A ``rows``-row table of the bench shape (written in the server) copied by a
    PostgreSQL region's snapshot into the file sender, next to the raw read of the
    same table in the same chunks with the same client (its ceiling), and COPY."""
    from psycopg.types.string import TextLoader

    pg = PostgresInstance().start()
    try:
        with pg.connect() as c:
            c.execute(TABLE)
            c.execute("INSERT INTO public.t SELECT g, 'name-' || g, (ARRAY['Paris','Oslo','Lima','Pune'])[1 + g %% 4], "
                      "(g %% 100000) / 100.0, (g %% 100000) / 1000.0, timestamp '2026-01-01 12:00:00.123456', "
                      "timestamp '2026-01-01 12:00:00', g, g::bigint * 1000, repeat('x', 60) "
                      "FROM generate_series(1, %s) g", (rows,))
            c.execute("VACUUM ANALYZE public.t")
            c.execute("CREATE PUBLICATION b FOR ALL TABLES")
        out: dict[str, Any] = {"rows": rows}
        with pg.connect() as c:
            oids = [r[0] for r in c.execute("SELECT DISTINCT atttypid FROM pg_attribute WHERE attrelid = "
                                            "'public.t'::regclass AND attnum > 0").fetchall()]
            t0 = time.perf_counter()
            last, n = None, 0
            while True:
                cur = c.cursor()
                for oid in oids:
                    cur.adapters.register_loader(oid, TextLoader)
                if last is None:
                    got = cur.execute("SELECT * FROM public.t ORDER BY id LIMIT 20000").fetchall()
                else:
                    got = cur.execute("SELECT * FROM public.t WHERE (id) > (%s::int) ORDER BY id LIMIT 20000",
                                      (last,)).fetchall()
                n += len(got)
                if len(got) < 20000:
                    break
                last = got[-1][0]
            out["raw_chunked_rows_per_s"] = round(n / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            n = 0
            with c.cursor().copy("COPY public.t TO STDOUT") as cp:
                for _ in cp.rows():
                    n += 1
            out["copy_rows_per_s"] = round(n / (time.perf_counter() - t0))
        (tmp / "senders.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp / 'changes.jsonl'}\n"
                                         "rotate_mb=100000\n")
        (tmp / "config.cfg").write_text(
            f"[global]\nbinlogCheckPointPath={tmp / 'cp.json'}\nsenderConfig={tmp / 'senders.cfg'}\n"
            f"filterRuleDict=\nhttpPort={free_port()}\ncheckpointInterval=0.5\nlogLevel=warning\n"
            f"[region:pg]\ntype=postgresql\nhost=127.0.0.1\nport={pg.port}\nuser=postgres\ndbname=postgres\n"
            "publication=b\nslot=capturer_snap\nsnapshot=initial\n")
        out["capturer"] = run_until_delivered(tmp / "config.cfg", rows)
        cores = out["capturer"].get("cpu_cores", {}).get("capturer", 0)  # the capturer's process only
        out["capturer"]["rows_per_core_second"] = round(out["capturer"]["rows_per_s"] / cores) if cores else None
        return out
    finally:
        pg.destroy()
