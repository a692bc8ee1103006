"""``sh start.sh --demo``: two private MariaDB regions, a mixed workload, the
capturer writing to a local file, and progress on the terminal.

With ``--once`` it exits 0 as soon as every demo row has reached the file and
the checkpoint has passed the last transaction, after checking that replaying
the file gives exactly the source tables; otherwise non-zero.

``run_demo`` takes the senders it runs as ``Sinks`` (the file by default):
devtools/demo_full.py runs the same shards and workload into all four senders.
The checks are devtools/verify_sinks.py's (row by row, by value).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import random
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from capturer.app import Capturer, load_config
from capturer.model import LsnPosition, Position
from devtools.local_mariadb import MariaDBInstance
from devtools.local_postgres import committed_lsn
from devtools.verify_sinks import (
    SinkCheck,
    SourceTable,
    TableName,
    compare,
    merge_sources,
    read_mysql,
    replay_file,
)
from senders.local.replay import read_changes, rebuild

log = logging.getLogger(__name__)

SCHEMA = [
    "CREATE DATABASE IF NOT EXISTS shop",
    """CREATE TABLE IF NOT EXISTS shop.customers (
         id INT PRIMARY KEY, email VARCHAR(100) NOT NULL UNIQUE, name VARCHAR(100),
         balance DECIMAL(12,2) NOT NULL DEFAULT 0, updated DATETIME(6) NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS shop.orders (
         id BIGINT PRIMARY KEY, customer_id INT NOT NULL, amount DECIMAL(10,2),
         status ENUM('new','paid','shipped') NOT NULL DEFAULT 'new', note TEXT,
         created TIMESTAMP(3) NULL, meta JSON, receipt VARBINARY(16) NULL)""",
    """CREATE TABLE IF NOT EXISTS shop.audit (kind VARCHAR(20), detail VARCHAR(200))""",
]
TABLES = [("shop", "customers"), ("shop", "orders"), ("shop", "audit")]


class Workload:
    """A deterministic mixed workload for one region (a shard: its own id range)."""

    def __init__(self, m: MariaDBInstance, shard: int, seed: int):
        self.m = m
        self.shard = shard
        self.rng = random.Random(seed)
        self.conn = m.connect()
        self.conn.autocommit(False)
        self.next_cust = shard * 1_000_000
        self.next_order = shard * 1_000_000_000
        self.customers: list[int] = []
        self.orders: list[int] = []
        self.rows = 0  # committed row changes
        self.txns = 0

    def _txn(self, stmts: list[tuple[str, tuple[Any, ...]]], commit: bool = True) -> None:
        n = 0
        with self.conn.cursor() as cur:
            for sql, params in stmts:
                n += cur.execute(sql, params)
        if commit:
            self.conn.commit()
            self.rows += n
            self.txns += 1
        else:
            self.conn.rollback()

    def step(self) -> None:
        r = self.rng.random()
        now = dt.datetime.now().replace(microsecond=self.rng.randrange(1_000_000))
        if r < 0.35 or len(self.customers) < 5:
            stmts: list[tuple[str, tuple[Any, ...]]] = []
            for _ in range(self.rng.randint(1, 4)):
                cid = self.next_cust = self.next_cust + 1
                self.customers.append(cid)
                stmts.append((
                    "INSERT INTO shop.customers VALUES (%s,%s,%s,%s,%s)",
                    (cid, f"c{cid}@example.com", self.rng.choice(["Ann", "Bo", "Zoë 😀", "O'Neil"]),
                     decimal.Decimal(self.rng.randrange(0, 10**6)) / 100, now),
                ))
                oid = self.next_order = self.next_order + 1
                self.orders.append(oid)
                stmts.append((
                    "INSERT INTO shop.orders VALUES (%s,%s,%s,'new',%s,%s,%s,%s)",
                    (oid, cid, decimal.Decimal(self.rng.randrange(100, 100_000)) / 100, "first order\nwith a newline",
                     now.replace(microsecond=123000), json.dumps({"src": self.shard, "n": oid}),
                     # binary, not UTF-8: base64 in the file and Kafka, bytes in MySQL and the lake
                     bytes(self.rng.randrange(256) for _ in range(8)) if self.rng.random() < 0.8 else None),
                ))
            stmts.append(("INSERT INTO shop.audit VALUES ('signup', %s)", (f"{len(stmts)} rows",)))
            self._txn(stmts)
        elif r < 0.65:
            cid = self.rng.choice(self.customers)
            self._txn([
                ("UPDATE shop.customers SET balance = balance + 1.50, updated=%s WHERE id=%s", (now, cid)),
                ("UPDATE shop.orders SET status='paid' WHERE customer_id=%s", (cid,)),
            ])
        elif r < 0.75:
            # a primary-key change
            old = self.rng.choice(self.customers)
            new = self.next_cust = self.next_cust + 1
            self._txn([("UPDATE shop.customers SET id=%s WHERE id=%s", (new, old))])
            self.customers[self.customers.index(old)] = new
        elif r < 0.85 and len(self.orders) > 3:
            oid = self.orders.pop(self.rng.randrange(len(self.orders)))
            self._txn([("DELETE FROM shop.orders WHERE id=%s", (oid,))])
        elif r < 0.92:
            # rolled back: must never arrive
            self._txn([("INSERT INTO shop.audit VALUES ('rolled-back', 'never seen')", ())], commit=False)
        else:
            self._txn([("DELETE FROM shop.audit WHERE kind='signup' LIMIT 1", ())])


class Sink(Protocol):
    """One sender of a shop demo: its senderConfig section, where it writes, and how
    its contents are checked against the sources (``--once``)."""

    name: str  # the sender's name (senderConfig type= and its section)

    def section(self) -> str: ...
    def where(self) -> str: ...
    def check(self, sources: dict[TableName, SourceTable], committed_rows: int) -> SinkCheck: ...


class FileSink:
    """The local sender's JSON lines; checked by replaying the file."""

    name = "local"

    def __init__(self, out: Path):
        self.out = out

    def section(self) -> str:
        return f"[local]\nfilepath={self.out}\nformat=json\n"

    def where(self) -> str:
        return f"changes go to {self.out}"

    def check(self, sources: dict[TableName, SourceTable], committed_rows: int) -> SinkCheck:
        rows, changes = replay_file(self.out)
        c = compare(self.name, sources, rows, note=f"replayed {changes} row changes from {self.out}")
        if changes != committed_rows:
            c.problems.append(f"{changes} row changes in the file, {committed_rows} committed")
        return c


class Sinks:
    """The senders a shop demo runs: the plain demo's is the file alone. ``start``
    starts what they need (after the demo directory is made); ``midway`` runs
    between the two halves of ``--once``'s workload; ``stop`` stops what ``start``
    started. ``skipped`` says, one line each, what could not run and why."""

    def __init__(self) -> None:
        self.sinks: list[Sink] = []
        self.skipped: list[str] = []

    def start(self, basedir: Path, once: bool) -> None:
        self.sinks.append(FileSink(basedir / "out" / "changes.jsonl"))

    def midway(self, cap: Capturer, stop: threading.Event) -> None:
        return None

    def progress(self, snap: dict[str, Any]) -> str:
        """More for the progress line, from the capturer's status."""
        return ""

    def stop(self) -> None:
        return None

    def epilogue(self) -> list[str]:
        """Lines printed after the summary (how to look at what the senders wrote)."""
        return []

    def sender_config(self) -> str:
        return f"[global]\ntype={','.join(s.name for s in self.sinks)}\n" + "".join(s.section() for s in self.sinks)


def _write_conf(d: Path, regions: list[MariaDBInstance], sender_config: str | None = None) -> Path:
    """The demo's config (regions: the shards); senders: ``sender_config``, or the file."""
    conf = d / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    region_txt = "".join(
        f"\n[region:shard{i + 1}]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\n"
        f"password=capturer\nserver_id={9000 + i}\nstart=earliest\n"
        for i, m in enumerate(regions)
    )
    (conf / "config.cfg").write_text(
        "# written by the demo\n[global]\n"
        f"binlogCheckPointPath={d / 'checkpoint.json'}\n"
        f"senderConfig={conf / 'senderConfig.cfg'}\n"
        f"filterRuleDict={conf / 'filter_rule.txt'}\n"
        f"httpPort=0\ncontrolToken={_demo_token()}\ncheckpointInterval=3\n" + region_txt
    )
    if sender_config is None:
        sender_config = f"[global]\ntype=local\n{FileSink(d / 'out' / 'changes.jsonl').section()}"
    (conf / "senderConfig.cfg").write_text(sender_config)
    (conf / "filter_rule.txt").write_text("# capture the demo shop only\ninclude shop.*\n")
    return conf / "config.cfg"


def _demo_token() -> str:
    """A one-off control token for the demo's page (kept in its config, never printed)."""
    import secrets

    return secrets.token_urlsafe(18)


def _status_line(cap: Capturer, cfg_path: Path) -> str:
    assert cap.status_server is not None
    return (f"demo: capturer running; status page http://127.0.0.1:{cap.status_server.port}/ "
            f"(JSON at /status; the page's control token is controlToken in {cfg_path})")


def shop_sources(servers: list[MariaDBInstance]) -> dict[TableName, SourceTable]:
    """The shop tables of every shard, as one (the shards hold disjoint id ranges)."""
    return merge_sources(read_mysql(m.connect, TABLES) for m in servers)


def _check(sink: Sink, sources: dict[TableName, SourceTable], committed_rows: int) -> SinkCheck:
    try:
        return sink.check(sources, committed_rows)
    except Exception as exc:  # a sink that cannot be read back is a failed check, reported with the others
        log.debug("checking %s", sink.name, exc_info=True)
        return SinkCheck(sink.name, problems=[f"could not be read back: {type(exc).__name__}: {exc}"])


def acked_positions(cp: Any, region: str) -> list[Any]:
    """Where each sender (not detached) stands in ``region``: what has reached the
    destinations. The checkpoint's own region position is where the sources resume, which
    with a backlog can be ahead of a sender still reading it."""
    ps = [sp.regions.get(region) for sp in cp.senders.values() if not sp.detached]
    return ps or [cp.regions.get(region)]


SHARDS = ("shard1", "shard2")


def _fresh_dir(basedir: Path) -> Path:
    """``basedir`` made empty (what a previous run left is removed), absolute."""
    basedir = basedir.resolve()
    if basedir.exists():
        shutil.rmtree(basedir)
    basedir.mkdir(parents=True)
    return basedir


def _start_capturer(cfg_path: Path) -> Capturer:
    cap = Capturer(load_config(cfg_path))
    cap.start()
    assert cap.status_server is not None
    return cap


def _run_workload(step: Callable[[int, Any], None], stop: threading.Event, once: bool, steps: int,
                  pause: float, session: Callable[[], AbstractContextManager[Any]] = nullcontext) -> threading.Event:
    """``step(i, s)`` for i = 0, 1, ... on a thread of its own (``steps`` of them with
    ``once``, else until ``stop``), ``pause`` s apart, ``s`` what ``session()`` opens
    around them all; the event returned is set when they are done."""
    done = threading.Event()

    def drive() -> None:
        i = 0
        with session() as s:
            while not stop.is_set() and (not once or i < steps):
                step(i, s)
                i += 1
                if pause:
                    time.sleep(pause)
        done.set()

    threading.Thread(target=drive, name="demo-workload", daemon=True).start()
    return done


class _Watch:
    """``Capturer.run``'s ``until``: a progress line every 2 s; True when ``stop`` is
    set, or, with ``once``, when the workload is done and every sender has passed the
    sources' last transaction (``caught_up``), or after ``limit`` s (reported then)."""

    limit = 300.0

    def __init__(self, stop: threading.Event, once: bool, done: threading.Event, t0: float):
        self.stop, self.once, self.done, self.t0 = stop, once, done, t0
        self.last_print = 0.0

    def line(self, snap: dict[str, Any]) -> str:
        """The progress line after the elapsed time."""
        raise NotImplementedError

    def mark(self) -> None:
        """Once the workload is done: note where the sources ended (what ``caught_up`` waits for)."""

    def caught_up(self, cp: Any) -> bool:
        raise NotImplementedError

    def __call__(self, c: Capturer) -> bool:
        now = time.time()
        if now - self.last_print >= 2:
            self.last_print = now
            print(f"demo: {now - self.t0:5.1f}s  {self.line(c.snapshot())}", flush=True)
        if self.stop.is_set():
            return True
        if not self.once or not self.done.is_set():
            return False
        self.mark()
        return self.caught_up(c.checkpoint) or now - self.t0 > self.limit


def _ended(code: int, once: bool, stop: threading.Event) -> int | None:
    """The demo's exit code when its capturer ran (``code``) but nothing is to be checked, else None."""
    if code != 0:
        print("demo: the capturer stopped on a failure (see the log above)", flush=True)
        return code
    if not once or stop.is_set():
        print("demo: stopped", flush=True)
        return 0 if not once else 1
    return None


class _ShopWatch(_Watch):
    """The shop demo's: every sender past both shards' last transaction (their binlog positions)."""

    def __init__(self, loads: list[Workload], sinks: Sinks, stop: threading.Event, once: bool,
                 done: threading.Event, t0: float):
        super().__init__(stop, once, done, t0)
        self.loads, self.sinks = loads, sinks
        self.targets: list[tuple[str, int]] = []

    def line(self, snap: dict[str, Any]) -> str:
        rows = sum(w.rows for w in self.loads)
        sent = [(s.name, snap["senders"][s.name]["rows"]) for s in self.sinks.sinks]
        sent_txt = (f"in file={sent[0][1]}" if len(sent) == 1 and sent[0][0] == "local"
                    else "sent: " + " ".join(f"{n}={r}" for n, r in sent))
        more = self.sinks.progress(snap)
        return (f"source rows={rows}  {sent_txt}  checkpoint={snap['checkpoint']['commit_time']}"
                + (f"  {more}" if more else ""))

    def mark(self) -> None:
        if not self.targets:
            self.targets = [w.m.master_position() for w in self.loads]

    def caught_up(self, cp: Any) -> bool:
        return bool(self.targets) and all(
            isinstance(pos, Position) and (pos.file, pos.pos) >= target  # (None: none yet)
            for target, name in zip(self.targets, SHARDS) for pos in acked_positions(cp, name))


def run_demo(basedir: Path, once: bool = False, steps: int = 400,
             stop: threading.Event | None = None, sinks: Sinks | None = None) -> int:
    """The shop demo: two private MariaDB shards, their workload, the capturer, and
    ``sinks`` (default: the file). ``stop`` is set by the caller's signal handlers
    (Ctrl-C, SIGTERM). With ``once``: a fixed workload, then, once the checkpoint
    (what every sender acknowledged) has passed both shards' last transaction,
    every sink is read back and compared with the sources; 0 only if all are equal."""
    basedir = _fresh_dir(basedir)
    sinks = sinks if sinks is not None else Sinks()
    print(f"demo: starting two MariaDB regions under {basedir} ...", flush=True)
    servers = [MariaDBInstance(basedir / f"region{i + 1}", server_id=i + 1) for i in range(2)]
    stop = stop if stop is not None else threading.Event()
    cap: Capturer | None = None
    try:
        for m in servers:
            m.start()
            m.create_capture_user()
            m.execute(*SCHEMA)
        sinks.start(basedir, once)
        for line in sinks.skipped:
            print(f"demo: skipped {line}", flush=True)
        cfg_path = _write_conf(basedir, servers, sinks.sender_config())
        cap = _start_capturer(cfg_path)
        print(_status_line(cap, cfg_path), flush=True)
        for s in sinks.sinks:
            print(f"demo: {s.where()}", flush=True)
        loads = [Workload(m, i + 1, seed=42 + i) for i, m in enumerate(servers)]
        t0 = time.time()
        running = cap

        def step(i: int, _: Any) -> None:
            if once and i == steps // 2:
                sinks.midway(running, stop)
            loads[i % 2].step()

        done = _run_workload(step, stop, once, steps, 0.0 if once else 0.02)
        watch = _ShopWatch(loads, sinks, stop, once, done, t0)
        code = cap.run(until=watch)
        elapsed = time.time() - t0
        reached = watch.caught_up(cap.checkpoint)
        cap = None
        ended = _ended(code, once, stop)
        if ended is not None:
            return ended
        return _shop_summary(servers, loads, sinks, elapsed, reached)
    finally:
        if cap is not None:
            cap.shutdown()
        for m in servers:
            m.stop()
        sinks.stop()


def _shop_summary(servers: list[MariaDBInstance], loads: list[Workload], sinks: Sinks, elapsed: float,
                  reached: bool) -> int:
    """``--once``'s end of the shop demo: every sink read back and compared with the sources, the
    summary printed; 0 only if every sender caught up and all are equal."""
    committed = sum(w.rows for w in loads)
    sources = shop_sources(servers)
    checks = [_check(s, sources, committed) for s in sinks.sinks]
    print("\n== demo summary ==")
    print(f"transactions committed: {sum(w.txns for w in loads)} over 2 regions "
          f"(plus rolled-back ones that must not appear)")
    print(f"row changes committed:  {committed}")
    print(f"source rows now:        {sum(len(t.rows) for t in sources.values())} in {len(sources)} tables")
    print(f"elapsed:                {elapsed:.1f}s (workload start to every sender caught up)"
          if reached else f"elapsed:                {elapsed:.1f}s: NOT every sender caught up")
    for c in checks:
        print(f"{'sender ' + c.sink + ':':24s}{'EQUAL' if c.equal else 'DIFFERENT'}: {c.tables} tables, "
              f"{c.rows} rows" + (f"; {c.note}" if c.note else ""))
    for line in sinks.skipped:
        print(f"skipped:                {line}")
    for c in checks:
        for p in c.problems:
            print(f"MISMATCH {c.sink}: {p}")
    ok = reached and all(c.equal for c in checks)
    names = [c.sink for c in checks]
    if names == ["local"]:
        verdict = "OK: file replay equals the sources"
    else:
        verdict = f"OK: every sender{' that ran' if sinks.skipped else ''} equals the sources ({', '.join(names)})"
    print("result:                 " + (verdict if ok else "FAILED"))
    for line in sinks.epilogue():
        print(f"query the lake:         {line}")
    return 0 if ok else 1


BAIKAL_TABLES = (("shop", 20), ("acct", 30))  # the BaikalDB demo's regions: (name, binlog table id)


class _BaikalWatch(_Watch):
    """The BaikalDB demo's: every sender past the last commit ts of both binlog tables."""

    limit = 180.0

    def __init__(self, w: Any, stop: threading.Event, once: bool, done: threading.Event, t0: float):
        super().__init__(stop, once, done, t0)
        self.w = w

    def line(self, snap: dict[str, Any]) -> str:
        return (f"source rows={self.w.rows}  in file={snap['senders']['local']['rows']}  "
                f"checkpoint={snap['checkpoint']['commit_time']}")

    def caught_up(self, cp: Any) -> bool:
        last = self.w.last_ts
        for name, bt in BAIKAL_TABLES:
            for p in acked_positions(cp, name):
                if last.get(bt) and (p is None or getattr(p, "ts", 0) < last[bt]):
                    return False
        return True


def _baikal_conf(basedir: Path, meta_servers: str) -> Path:
    """The BaikalDB demo's config: the double's two binlog tables into a file."""
    conf = basedir / "conf"
    conf.mkdir()
    regions = "".join(f"\n[region:{name}]\ntype=baikaldb\nmetaServer={meta_servers}\nbinlogTableID={bt}\n"
                      "start=earliest\n" for name, bt in BAIKAL_TABLES)
    (conf / "config.cfg").write_text(
        "# written by the demo: two BaikalDB binlog tables from the test double\n[global]\n"
        f"binlogCheckPointPath={basedir / 'checkpoint.json'}\nsenderConfig={conf / 'senderConfig.cfg'}\n"
        f"filterRuleDict=\nhttpPort=0\ncontrolToken={_demo_token()}\ncheckpointInterval=1\n" + regions)
    (conf / "senderConfig.cfg").write_text(
        f"[global]\ntype=local\n[local]\nfilepath={basedir / 'out' / 'changes.jsonl'}\nformat=json\n")
    return conf / "config.cfg"


def run_baikaldb_demo(basedir: Path, once: bool = False, steps: int = 300,
                      stop: threading.Event | None = None) -> int:
    """``sh start.sh --demo baikaldb``: the capturer reading two BaikalDB binlog
    tables (1 partition x 3 regions, 3 partitions x 1 region) from the BaikalDB
    test double (meta and stores as real HTTP servers on 127.0.0.1, from the
    devtools/baikaldb_double), with a live workload and a schema change, into a file."""
    from devtools.baikaldb_double import BaikalDouble
    from devtools.baikaldb_workload import Workload as BaikalWorkload
    from devtools.baikaldb_workload import build

    basedir = _fresh_dir(basedir)
    stop = stop if stop is not None else threading.Event()
    double = BaikalDouble(n_stores=3, n_meta=2, fake_ms=500).start()
    cap: Capturer | None = None
    try:
        build(double)
        w = BaikalWorkload(double.cluster, seed=42)
        w.run(30)  # some history: the capturer starts from each region's oldest binlog
        cfg_path = _baikal_conf(basedir, double.meta_servers)
        print(f"demo: BaikalDB double: meta {double.meta_servers}, stores "
              f"{', '.join(s.addr for s in double.stores)}", flush=True)
        cap = _start_capturer(cfg_path)
        print(_status_line(cap, cfg_path), flush=True)
        print(f"demo: changes go to {basedir / 'out' / 'changes.jsonl'}", flush=True)
        t0 = time.time()

        def step(i: int, _: Any) -> None:
            if i == steps // 2:
                w.schema_change(1)  # ALTER TABLE ... ADD COLUMN, seen through the meta
            w.step()

        done = _run_workload(step, stop, once, steps, 0.005 if once else 0.05)
        watch = _BaikalWatch(w, stop, once, done, t0)
        code = cap.run(until=watch)
        ok_caught_up = watch.caught_up(cap.checkpoint)
        cap = None
        ended = _ended(code, once, stop)
        if ended is not None:
            return ended
        return _baikal_summary(double, w, basedir / "out" / "changes.jsonl", ok_caught_up)
    finally:
        if cap is not None:
            cap.shutdown()
        double.stop()


def _baikal_summary(double: Any, w: Any, out: Path, caught_up: bool) -> int:
    """``--once``'s end of the BaikalDB demo: the file replayed against the double's tables."""
    from devtools.baikaldb_workload import assert_file_equals

    lines = sum(1 for d in read_changes(out) if d["op"] != "ddl")
    problem = ""
    try:
        assert_file_equals(double.cluster, out)
    except AssertionError as exc:
        problem = str(exc)
    print("\n== demo summary (BaikalDB) ==")
    print(f"transactions committed: {w.txns} over 2 binlog tables, 6 binlog regions "
          f"(plus {w.rollbacks} rolled back, which must not appear)")
    print(f"row changes committed:  {w.rows}")
    print(f"row changes in file:    {lines}  ({out})")
    ok = caught_up and not problem and lines == w.rows
    if problem:
        print(f"MISMATCH: {problem}")
    print("result:                 " + ("OK: file replay equals the double's tables" if ok else "FAILED"))
    return 0 if ok else 1


class _PgWatch(_Watch):
    """The PostgreSQL demo's: every sender past the shard's last binlog position and PostgreSQL's WAL end."""

    limit = 180.0

    def __init__(self, m: MariaDBInstance, pg: Any, stop: threading.Event, once: bool, done: threading.Event,
                 t0: float):
        super().__init__(stop, once, done, t0)
        self.m, self.pg = m, pg
        self.targets: dict[str, Any] = {}

    def line(self, snap: dict[str, Any]) -> str:
        return f"rows in file={snap['senders']['local']['rows']}  checkpoint={snap['checkpoint']['commit_time']}"

    def mark(self) -> None:
        if not self.targets:
            self.targets["shard1"] = self.m.master_position()
            with self.pg.connect() as conn:
                self.targets["pg"] = committed_lsn(conn)

    def caught_up(self, cp: Any) -> bool:
        return all(
            isinstance(p1, Position) and (p1.file, p1.pos) >= self.targets["shard1"]
            and isinstance(p2, LsnPosition) and p2.lsn >= self.targets["pg"]
            for p1, p2 in zip(acked_positions(cp, "shard1"), acked_positions(cp, "pg")))


def _pg_conf(basedir: Path, m: MariaDBInstance, pg_port: int) -> Path:
    """The PostgreSQL demo's config: the shard and PostgreSQL (every table) into a file."""
    cfg_path = _write_conf(basedir, [m])
    cfg_path.write_text(cfg_path.read_text() + (
        f"\n[region:pg]\ntype=postgresql\nhost=127.0.0.1\nport={pg_port}\nuser=postgres\ndbname=postgres\n"
        "create_publication=all\nheartbeat_ms=200\n"))
    (basedir / "conf" / "filter_rule.txt").write_text("# the demo shop (MariaDB) and every PostgreSQL table\n")
    return cfg_path


def run_postgresql_demo(basedir: Path, once: bool = False, steps: int = 300,
                        stop: threading.Event | None = None) -> int:
    """``sh start.sh --demo postgresql``: a MariaDB shard (the shop workload) and a
    private PostgreSQL (the hostile workload of devtools/pg_workload.py: every common
    type, key changes, TOAST, rollbacks) merged into one file. ``--once`` compares
    the file with both sources."""
    from devtools.local_postgres import PostgresInstance
    from devtools.pg_workload import Workload as PgWorkload
    from devtools.pg_workload import apply_schema

    basedir = _fresh_dir(basedir)
    stop = stop if stop is not None else threading.Event()
    print(f"demo: starting a MariaDB region under {basedir} and a PostgreSQL region ...", flush=True)
    m = MariaDBInstance(basedir / "region1", server_id=1)
    pg = PostgresInstance()  # (a temporary directory the postgres user can reach)
    cap: Capturer | None = None
    try:
        m.start()
        m.create_capture_user()
        m.execute(*SCHEMA)
        pg.start()
        apply_schema(pg)
        cfg_path = _pg_conf(basedir, m, pg.port)
        cap = _start_capturer(cfg_path)
        print(f"demo: PostgreSQL {pg.bindir.parent.name} on 127.0.0.1:{pg.port} (data in {pg.basedir})", flush=True)
        print(_status_line(cap, cfg_path), flush=True)
        print(f"demo: changes go to {basedir / 'out' / 'changes.jsonl'}", flush=True)
        deadline = time.time() + 60
        while not all(r.state == "streaming" for r in cap.regions) and time.time() < deadline:
            time.sleep(0.1)
        shop = Workload(m, 1, seed=42)
        pgw = PgWorkload(pg, seed=42)
        t0 = time.time()

        def step(i: int, conn: Any) -> None:
            if i % 2:
                shop.step()
            else:
                pgw.step(conn)

        done = _run_workload(step, stop, once, steps, 0.0 if once else 0.02,
                             session=lambda: pg.connect(autocommit=False))
        watch = _PgWatch(m, pg, stop, once, done, t0)
        code = cap.run(until=watch)
        cap = None
        ended = _ended(code, once, stop)
        if ended is not None:
            return ended
        equal = _pg_summary(m, pg, shop, pgw, basedir / "out" / "changes.jsonl", t0)
        ok = bool(watch.targets) and equal
        print("result:                 " + ("OK: file replay equals both sources" if ok else "FAILED"))
        return 0 if ok else 1
    finally:
        if cap is not None:
            cap.shutdown()
        m.stop()
        pg.destroy()


def _pg_summary(m: MariaDBInstance, pg: Any, shop: Workload, pgw: Any, out: Path, t0: float) -> bool:
    """``--once``'s end of the PostgreSQL demo: the file replayed against both sources; True if equal."""
    from devtools.pg_workload import TABLES as PG_TABLES
    from devtools.pg_workload import file_rows, pg_rows

    shop_rows, _ = replay_file(out)
    problems = compare("local", shop_sources([m]), {t: shop_rows.get(t, []) for t in TABLES}).problems
    state = rebuild(read_changes(out))
    for db, table in PG_TABLES:
        want, got = pg_rows(pg, db, table), file_rows(state, db, table)
        if want != got:
            problems.append(f"{db}.{table}: {len(want)} source rows, {len(got)} rebuilt from the file")
    print("\n== demo summary ==")
    print(f"transactions committed: MariaDB {shop.txns}, PostgreSQL {pgw.txns} "
          f"(plus {pgw.rollbacks} rolled back in PostgreSQL, which must not appear)")
    print(f"elapsed:                {time.time() - t0:.1f}s")
    for p in problems:
        print(f"MISMATCH: {p}")
    return not problems
