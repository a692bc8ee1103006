"""The applier (capturer -> Apache Kafka -> ``python -m capturer apply`` -> MariaDB) under the
hostile workloads users' checks run: database, table and column names with spaces, backquotes,
double quotes, dots, semicolons, upper case, non-ASCII and a reserved word; values with quotes,
backslashes, NUL bytes, non-UTF-8 bytes, emoji and long texts; primary-key changes (several rows in
one statement, swaps through a third value), rows deleted and inserted again in one transaction,
rollbacks and a statement failing half way, a table with only a UNIQUE key and one without keys;
a target holding a row lock under load. The target is compared with the source row for row (rows
of the keyless table as a multiset: a row applied twice shows)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
from helpers import CapturerProcess, shared_broker, wait_for

from capturer.model.encode import quote_ident as q
from devtools.local_mariadb import MariaDBInstance
from integration.test_apply import ApplierProcess, capturer_config, tear_down, write_applier

pytestmark = pytest.mark.integration

DB = 'Sch "q".d,c;`ü'
T = 'Tab le."x",;`Ä'
UQ = "Uniq Only`"
KL = 'key.less "T"'
KEY, SEL, ABC, TICK, UNI, ORDER, UPPER, RAW, BLOB = ("Key.Col", 'sel"ect', "a,b;c", "tick`q", "Ünï", "order",
                                                     "UPPER", "raw data", "blob")
TEXTS = ["q'uote \"dq\" `bt`", "back\\slash \\n not a newline", "new\nline\ttab\r\n", "emoji 😀 ünï 𝄞",
         "", "semi; -- comment /* c */", "%s %% {}", "nul\x00byte", "'); DROP TABLE x; --"]
RAWS = [b"\xff\xfe\x00\x80", b"", b"\xc3\x28 not utf-8", b"\\x00'\"", b"\x00" * 5]
NU = "null Uniq"  # no primary key, a nullable UNIQUE key: rows with NULL there have no key at all
TABLES = [T, UQ, KL, NU]

SCHEMA = [
    f"CREATE DATABASE {q(DB)}",
    f"CREATE TABLE {q(DB)}.{q(T)} ({q(KEY)} INT PRIMARY KEY, {q(SEL)} TEXT, {q(ABC)} VARCHAR(200), "
    f"{q(TICK)} LONGTEXT, {q(UNI)} VARCHAR(100), {q(ORDER)} INT, {q(UPPER)} BIGINT, {q(RAW)} VARBINARY(64), "
    f"{q(BLOB)} BLOB) DEFAULT CHARSET=utf8mb4",
    f"CREATE TABLE {q(DB)}.{q(UQ)} ({q('u k')} INT NOT NULL, {q('v')} TEXT, UNIQUE KEY {q('u`x')} ({q('u k')})) "
    "DEFAULT CHARSET=utf8mb4",
    f"CREATE TABLE {q(DB)}.{q(KL)} ({q('a')} INT, {q('b')} TEXT) DEFAULT CHARSET=utf8mb4",
    f"CREATE TABLE {q(DB)}.{q(NU)} ({q('u')} INT NULL, {q('v')} VARCHAR(40), UNIQUE KEY ({q('u')})) "
    "DEFAULT CHARSET=utf8mb4",
]


def full(t: str) -> str:
    return f"{q(DB)}.{q(t)}"


def rows(m: MariaDBInstance, t: str, db: str = DB) -> list[tuple[Any, ...]]:
    c = m.connect()
    try:
        with c.cursor() as cur:
            cur.execute(f"SELECT * FROM {q(db)}.{q(t)}")
            return sorted(cur.fetchall(), key=repr)
    finally:
        c.close()


def diff(source: MariaDBInstance, target: MariaDBInstance, tables: list[str] = TABLES) -> dict[str, Any]:
    """Per table: (missing, extra) as multisets (a keyless row twice shows as extra)."""
    out = {}
    for t in tables:
        want, got = Counter(rows(source, t)), Counter(rows(target, t))
        missing, extra = want - got, got - want
        if missing or extra:
            out[t] = {"source": sum(want.values()), "target": sum(got.values()),
                      "missing": sum(missing.values()), "extra": sum(extra.values()),
                      "eg_missing": [repr(r)[:200] for r in list(missing)[:2]],
                      "eg_extra": [repr(r)[:200] for r in list(extra)[:2]]}
    return out


class Hostile:
    """A seeded workload of hostile transactions on one source (keys from ``base``)."""

    def __init__(self, m: MariaDBInstance, seed: int = 1, base: int = 0):
        self.m, self.rnd, self.base = m, random.Random(seed), base
        self.next_id = base + 1
        self.live: list[int] = []
        self.uq_next = base + 1
        self.uq_live: list[int] = []
        self.txns = 0
        self.rows = 0
        self.errors: list[BaseException] = []
        self.conn: Any = None
        self.cols: dict[str, str] = {}  # a column's name now ('' once dropped; set by a test)
        self.big = 0.0  # the share of big transactions (thousands of rows over every table; set by a test)
        self.t = T  # the keyed table's name now (a test renames it)
        self.hot: int | None = None  # a key most transactions also update (set by a test)

    def _row(self, i: int) -> tuple[Any, ...]:
        r = self.rnd
        long = "x" * r.choice([0, 10, 70_000, 300_000]) + r.choice(TEXTS)
        return (i, r.choice(TEXTS), r.choice(TEXTS)[:200], long, r.choice(TEXTS)[:100],
                None if i % 4 == 0 else r.randint(-5, 5), r.randint(-(2 ** 62), 2 ** 62),
                r.choice(RAWS), bytes(r.randrange(256) for _ in range(r.choice([0, 3, 300]))))

    def _put(self, cur: Any, i: int) -> None:
        names = [KEY, SEL, ABC, TICK, UNI, ORDER, UPPER, RAW, BLOB]
        pairs = [(self.cols.get(n, n), v) for n, v in zip(names, self._row(i)) if self.cols.get(n, n)]
        cur.execute(f"INSERT INTO {full(self.t)} ({', '.join(q(n) for n, _ in pairs)}) VALUES "
                    f"({', '.join(['%s'] * len(pairs))})", [v for _, v in pairs])

    def _insert(self, cur: Any, n: int) -> None:
        for _ in range(n):
            i = self.next_id
            self.next_id += 1
            self._put(cur, i)
            self.live.append(i)

    def step(self) -> None:
        if self.conn is None:
            self.conn = self.m.connect()
            self.conn.autocommit(False)
        c, r = self.conn, self.rnd
        kind = r.choice(["ins", "ins", "upd", "shift", "swap", "delre", "rollback", "fail", "keyless", "keyless",
                         "uq", "uq", "del", "nu", "nu"])
        if r.random() < self.big:
            kind = "big"
        try:
            with c.cursor() as cur:
                self._do(cur, kind)
                if self.hot is not None and kind != "rollback":
                    cur.execute(f"UPDATE {full(self.t)} SET {q(UPPER)}={q(UPPER)}+1 WHERE {q(KEY)}=%s", (self.hot,))
            c.commit()
            self.txns += 1
        except pymysql.err.IntegrityError:
            c.rollback()
        except pymysql.err.MySQLError as exc:  # a column or table a DDL just changed: again with the new names
            if exc.args[0] not in (1054, 1146):
                raise
            c.rollback()

    def _do(self, cur: Any, kind: str) -> None:
        r = self.rnd
        if kind == "ins" or len(self.live) < 4:
            self._insert(cur, r.randint(1, 5))
        elif kind == "upd":
            i = r.choice(self.live)
            cur.execute(f"UPDATE {full(self.t)} SET {q(self.cols.get(SEL, SEL))}=%s, {q(RAW)}=%s, {q(UPPER)}={q(UPPER)}+1 WHERE {q(KEY)}=%s",
                        (r.choice(TEXTS), r.choice(RAWS), i))
        elif kind == "shift":  # a primary-key change of several rows in one statement
            lo = min(self.live)
            cur.execute(f"UPDATE {full(self.t)} SET {q(KEY)} = {q(KEY)} + 1000000 WHERE {q(KEY)} BETWEEN %s AND %s "
                        f"ORDER BY {q(KEY)} DESC", (lo, lo + 3))
            moved = [i for i in self.live if lo <= i <= lo + 3]
            self.live = [i for i in self.live if i not in moved] + [i + 1000000 for i in moved]
        elif kind == "swap":  # two keys swapped through a third value
            a, b = r.sample(self.live, 2)
            tmp = -self.next_id
            cur.execute(f"UPDATE {full(self.t)} SET {q(KEY)}=%s WHERE {q(KEY)}=%s", (tmp, a))
            cur.execute(f"UPDATE {full(self.t)} SET {q(KEY)}=%s WHERE {q(KEY)}=%s", (a, b))
            cur.execute(f"UPDATE {full(self.t)} SET {q(KEY)}=%s WHERE {q(KEY)}=%s", (b, tmp))
        elif kind == "delre":  # deleted and inserted again in one transaction
            i = r.choice(self.live)
            cur.execute(f"DELETE FROM {full(self.t)} WHERE {q(KEY)}=%s", (i,))
            self._put(cur, i)
            cur.execute(f"UPDATE {full(self.t)} SET {q(UPPER)}=42 WHERE {q(KEY)}=%s", (i,))
        elif kind == "rollback":
            live, nxt = list(self.live), self.next_id
            self._insert(cur, 3)
            cur.execute(f"DELETE FROM {full(self.t)} WHERE {q(KEY)}=%s", (r.choice(live),))
            self.conn.rollback()
            self.live, self.next_id = live, nxt
        elif kind == "fail":  # a statement fails half way; the transaction goes on and commits
            self._insert(cur, 1)
            i = self.next_id
            try:
                cur.execute(f"INSERT INTO {full(self.t)} ({q(KEY)}, {q(RAW)}) VALUES (%s,'a'),(%s,'dup')",
                            (i, self.live[0]))
            except pymysql.err.IntegrityError:
                pass
            cur.execute(f"UPDATE {full(self.t)} SET {q(UPPER)}=7 WHERE {q(KEY)}=%s", (self.live[-1],))
        elif kind == "keyless":
            v = r.choice(TEXTS)
            cur.execute(f"INSERT INTO {full(KL)} VALUES (%s,%s),(%s,%s)", (self.base, v, self.base, v))
            if r.random() < 0.5:
                cur.execute(f"DELETE FROM {full(KL)} WHERE a=%s LIMIT 1", (self.base,))
            if r.random() < 0.3:
                cur.execute(f"UPDATE {full(KL)} SET b=%s WHERE a=%s LIMIT 1", (r.choice(TEXTS), self.base))
        elif kind == "uq":
            if len(self.uq_live) < 3 or r.random() < 0.4:
                cur.execute(f"INSERT INTO {full(UQ)} VALUES (%s,%s)", (self.uq_next, r.choice(TEXTS)))
                self.uq_live.append(self.uq_next)
                self.uq_next += 1
            else:  # the unique key changed, swapped through a third value
                a, b = r.sample(self.uq_live, 2)
                cur.execute(f"UPDATE {full(UQ)} SET {q('u k')}=%s WHERE {q('u k')}=%s", (-a, a))
                cur.execute(f"UPDATE {full(UQ)} SET {q('u k')}=%s, v=%s WHERE {q('u k')}=%s", (a, r.choice(TEXTS), b))
                cur.execute(f"UPDATE {full(UQ)} SET {q('u k')}=%s WHERE {q('u k')}=%s", (b, -a))
        elif kind == "nu":  # rows with a NULL unique value: changed, given a value, NULL again, deleted
            v, w = r.choice(TEXTS)[:40], r.choice(TEXTS)[:40]
            cur.execute(f"INSERT INTO {full(NU)} VALUES (NULL,%s),(NULL,%s)", (v, v))
            cur.execute(f"UPDATE {full(NU)} SET v=%s WHERE u IS NULL AND v=%s LIMIT 1", (w, v))
            u = self.base * 1000 + self.txns + 1
            cur.execute(f"UPDATE {full(NU)} SET u=%s WHERE u IS NULL AND v=%s LIMIT 1", (u, w))
            if r.random() < 0.5:
                cur.execute(f"UPDATE {full(NU)} SET u=NULL, v=%s WHERE u=%s", (v, u))
            if r.random() < 0.3:
                cur.execute(f"DELETE FROM {full(NU)} WHERE u IS NULL AND v=%s LIMIT 1", (v,))
        elif kind == "big":  # thousands of rows in one transaction, most in the keyless table
            v = r.choice(TEXTS)
            cur.executemany(f"INSERT INTO {full(KL)} VALUES (%s,%s)", [(self.base + 7, v)] * 1500)
            self._insert(cur, 200)
            cur.execute(f"UPDATE {full(KL)} SET b=CONCAT(b, 'u') WHERE a=%s LIMIT 700", (self.base + 7,))
            cur.execute(f"DELETE FROM {full(KL)} WHERE a=%s LIMIT 300", (self.base + 7,))
            self.rows += 2700
        elif kind == "del":
            i = r.choice(self.live)
            cur.execute(f"DELETE FROM {full(self.t)} WHERE {q(KEY)}=%s", (i,))
            self.live.remove(i)


class Run:
    """``Hostile`` in a thread until stopped."""

    def __init__(self, w: Hostile, pace: float = 0.005):
        self.w, self.pace, self.stop = w, pace, threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.w.step()
                time.sleep(self.pace)
        except BaseException as exc:
            self.w.errors.append(exc)

    def __enter__(self) -> Run:
        self.t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.t.join(60)
        if self.w.conn is not None:
            self.w.conn.close()
        assert not self.w.errors, self.w.errors


@pytest.fixture()
def hrig(tmp_path: Path) -> Iterator[dict[str, Any]]:
    from helpers import start_servers

    source = start_servers(tmp_path, 1)[0]
    source.execute(*SCHEMA)
    target = MariaDBInstance(tmp_path / "target", server_id=99, binlog=False).start()
    try:
        yield {"source": source, "target": target, "tmp": tmp_path}
    finally:
        for srv in (source, target):
            try:
                srv.stop()
            except Exception:
                pass


def equal_now(source: MariaDBInstance, target: MariaDBInstance, tables: list[str] = TABLES) -> bool:
    try:
        return not diff(source, target, tables)
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] in (1049, 1146):
            return False
        raise


def wait_equal(source: MariaDBInstance, target: MariaDBInstance, ap: ApplierProcess, timeout: float = 180,
               tables: list[str] = TABLES) -> None:
    try:
        wait_for(lambda: equal_now(source, target, tables), timeout, "target equals source")
    except AssertionError:
        st = ap.status() if ap.proc is not None and ap.proc.poll() is None else "applier not running"
        raise AssertionError(f"{json.dumps(diff(source, target, tables), default=str)[:3000]}\n"
                             f"{json.dumps(st, default=str)[:4000]}") from None


def start(tmp: Path, source: MariaDBInstance, target: MariaDBInstance, sender_extra: str = "",
          extra: str = "", tables: str = "*.*") -> tuple[CapturerProcess, ApplierProcess, Any]:
    broker = shared_broker()
    cap = CapturerProcess(capturer_config(tmp, [source], broker.servers), tmp / "capturer.log").start()
    cap.wait_ready()
    mysql = (f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\n"
             f"threadnum=4\n{sender_extra}")
    cfg, port = write_applier(tmp, "h", broker.servers, mysql, tables=tables, extra=extra)
    ap = ApplierProcess(cfg, tmp / "h.log", port).start()
    return cap, ap, broker


def test_target_row_lock_held_under_load(hrig: dict[str, Any]) -> None:
    """Another session holds a row lock on the target for 20 s while most source transactions update that
    row: the applier's ``/status`` names what it waits for (the worker, the statement kind and the table,
    for how long); once the lock goes, everything arrives, in order (the target equals the source).
    Before, the status said ``running`` with nothing but a growing queue."""
    tmp, source, target = hrig["tmp"], hrig["source"], hrig["target"]
    cap, ap, broker = start(tmp, source, target)
    try:
        w = Hostile(source, seed=7)
        w.step()
        w.step()
        w.hot = w.live[0]
        with Run(w, pace=0.005):
            wait_for(lambda: w.txns > 100, 120, "load")
            wait_for(lambda: equal_now(source, target) or ap.rows() > 200, 120, "applied some")
            hold = target.connect()
            hold.autocommit(False)
            with hold.cursor() as cur:
                cur.execute(f"SELECT * FROM {full(T)} WHERE {q(KEY)}=%s FOR UPDATE", (w.hot,))
            t0 = time.monotonic()
            qt = f"{q(DB)}.{q(T)}"

            def shown() -> bool:
                st = ap.status()
                m = st["senders"]["h.mysql"]
                return (m.get("waiting_for") is not None and qt in m["waiting_for"] and "update" in m["waiting_for"]
                        and m["waiting_seconds"] >= 3 and any(qt in x for x in st["waiting_for"]))

            wait_for(shown, 60, "the applier's status names the statement it waits for")
            time.sleep(max(0.0, 20 - (time.monotonic() - t0)))  # the lock held for 20 s in all
            hold.rollback()
            hold.close()
            wait_for(lambda: ap.status()["senders"]["h.mysql"]["waiting_for"] is None, 120, "the wait is over")
        wait_equal(source, target, ap, 180)
        assert ap.stop() == 0
        assert cap.stop() == 0
    finally:
        tear_down(tmp, [cap, ap], broker)


def verify_target(tmp: Path, target: MariaDBInstance) -> dict[str, Any]:
    """``python -m capturer verify`` of the source against the target (the applier's destination as a
    capturer's MySQL sender)."""
    from helpers import verify_equal

    (tmp / "verifySenders.cfg").write_text(
        f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\n")
    text = (tmp / "config.cfg").read_text()
    text = text.replace(f"senderConfig={tmp / 'senderConfig.cfg'}", f"senderConfig={tmp / 'verifySenders.cfg'}")
    text = text.replace(f"binlogCheckPointPath={tmp / 'checkpoint.json'}",
                        f"binlogCheckPointPath={tmp / 'verify-checkpoint.json'}")
    (tmp / "verify.cfg").write_text(text)
    return verify_equal(tmp / "verify.cfg", ["mysql"], 30)


def test_hostile_load_kill9_and_ddl_mid_load(hrig: dict[str, Any]) -> None:
    """The most demanding mix at once, on the applier that owns the hostile database by name (``tables``
    quotes it: commas, dots, doubled backticks): every hostile transaction kind, big transactions (1,500-row
    keyless inserts, 700 keyless updates, 300 deletes, 200 keyed inserts), and while rows flow ADD COLUMN
    with a DEFAULT (a quote and a backslash in it), DROP COLUMN, RENAME COLUMN, CHANGE COLUMN, RENAME TABLE
    and an ADD on the renamed table, with the applier killed (kill -9) three times between them. The target
    then equals the source row for row (the keyless table as a multiset: a row applied twice would show),
    ``verify`` finds every table equal, and the old table name is gone from the target."""
    tmp, source, target = hrig["tmp"], hrig["source"], hrig["target"]
    owned = q(DB) + ".*"
    cap, ap, broker = start(tmp, source, target, tables=f"{owned}, nothing.else", extra="untabled_ddl=apply\n")
    t2 = 'Re named.`T`,2'
    try:
        w = Hostile(source, seed=21)
        w.big = 0.02
        ddls = [(f"ALTER TABLE {full(T)} ADD COLUMN {q('new `c`ol é')} VARCHAR(30) NOT NULL DEFAULT 'd''ef\\\\ault'",
                 {}),
                (f"ALTER TABLE {full(T)} ADD COLUMN {q('n2')} INT DEFAULT 7 AFTER {q(KEY)}", {}),
                (f"ALTER TABLE {full(T)} DROP COLUMN {q(ABC)}", {ABC: ""}),
                (f"ALTER TABLE {full(T)} RENAME COLUMN {q(SEL)} TO {q('re.named `x`')}", {SEL: "re.named `x`"}),
                (f"ALTER TABLE {full(T)} CHANGE COLUMN {q(ORDER)} {q('Order2')} BIGINT", {ORDER: "Order2"}),
                (f"RENAME TABLE {full(T)} TO {full(t2)}", {}),
                (f"ALTER TABLE {full(t2)} ADD COLUMN {q('last')} TEXT DEFAULT NULL", {})]
        kills = 0
        with Run(w, pace=0.002):
            for i, (ddl, cols) in enumerate(ddls):
                before = w.txns
                wait_for(lambda: w.txns > before + 40, 120, "the load goes on")
                source.execute(ddl)
                w.cols.update(cols)
                w.t = t2 if "RENAME TABLE" in ddl else w.t
                if i % 2 == 1:  # the applier killed mid-load, around a DDL
                    applied = max(ap.rows(), 0)
                    wait_for(lambda: ap.rows() > applied, 120, "the applier applies rows")
                    ap.kill9()
                    kills += 1
                    ap.start()
        assert kills == 3 and w.txns > 300
        tables = [t2, UQ, KL, NU]
        wait_equal(source, target, ap, 240, tables)
        counts = {t: len(rows(source, t)) for t in tables}
        assert counts[KL] > 1000 and counts[NU] > 10 and counts[t2] > 100, counts
        print(f"hostile load: {w.txns} source transactions, rows now {counts}, applier kills {kills}, "
              f"DDL {len(ddls)}; duplicates and differences: {diff(source, target, tables) or 0}")
        report = verify_target(tmp, target)
        assert {t["table"] for t in report["tables"]} >= {f"{DB}.{t}" for t in tables}, report["summary"]
        with target.connect() as c, c.cursor() as cur:  # the old name is gone from the target
            cur.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema=%s AND table_name=%s",
                        (DB, T))
            assert cur.fetchone()[0] == 0
        assert ap.stop() == 0
        assert cap.stop() == 0
    finally:
        tear_down(tmp, [cap, ap], broker)
