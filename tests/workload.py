"""A seeded random OLTP workload for one region (a shard with its own key range),
and a row-for-row comparison of sources against a target."""

from __future__ import annotations

import datetime as dt
import decimal
import random
import threading
from pathlib import Path
from typing import Any

import pymysql

from capturer.model.encode import quote_ident
from devtools.local_mariadb import MariaDBInstance

SCHEMA = [
    "CREATE DATABASE IF NOT EXISTS app",
    """CREATE TABLE IF NOT EXISTS app.users (
        id INT PRIMARY KEY, email VARCHAR(64) NOT NULL, name VARCHAR(64), score DECIMAL(10,2),
        updated DATETIME(6), UNIQUE KEY uk_email (email))""",
    """CREATE TABLE IF NOT EXISTS app.pairs (
        a INT NOT NULL, b VARCHAR(20) NOT NULL, val TEXT, PRIMARY KEY (a, b))""",
    "CREATE TABLE IF NOT EXISTS app.log (msg VARCHAR(100), n INT)",
]
TABLES = ["users", "pairs", "log"]


class Workload:
    def __init__(self, m: MariaDBInstance, shard: int, seed: int):
        self.m = m
        self.shard = shard
        self.rng = random.Random(seed)
        self.base = shard * 1_000_000
        self.next_id = self.base
        self.users: dict[int, str] = {}  # id -> email
        self.deleted: list[tuple[int, str]] = []
        self.pairs: set[tuple[int, str]] = set()
        self.rows = 0
        self.txns = 0
        self.conn: pymysql.connections.Connection | None = None
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def _email(self) -> str:
        return f"s{self.shard}-{self.rng.randrange(10**9)}@x.org"

    def _stmts(self) -> list[tuple[str, tuple[Any, ...]]]:
        r = self.rng.random()
        now = dt.datetime(2026, 1, 1) + dt.timedelta(microseconds=self.rng.randrange(10**12))
        out: list[tuple[str, tuple[Any, ...]]] = []
        if r < 0.30 or len(self.users) < 4:
            for _ in range(self.rng.randint(1, 8)):
                self.next_id += 1
                email = self._email()
                self.users[self.next_id] = email
                out.append(("INSERT INTO app.users VALUES (%s,%s,%s,%s,%s)",
                            (self.next_id, email, self.rng.choice(["a", "Bé", "c'd", "😀", None]),
                             decimal.Decimal(self.rng.randrange(10**6)) / 100, now)))
        elif r < 0.50:
            for uid in self.rng.sample(sorted(self.users), min(3, len(self.users))):
                out.append(("UPDATE app.users SET score = score + 1, name = %s, updated = %s WHERE id = %s",
                            (self.rng.choice(["x", "y", None]), now, uid)))
        elif r < 0.58:
            old = self.rng.choice(sorted(self.users))
            self.next_id += 1
            self.users[self.next_id] = self.users.pop(old)
            out.append(("UPDATE app.users SET id = %s WHERE id = %s", (self.next_id, old)))
        elif r < 0.64 and len(self.users) >= 2:
            # two rows swap a unique key inside one transaction
            u1, u2 = self.rng.sample(sorted(self.users), 2)
            e1, e2 = self.users[u1], self.users[u2]
            tmp = self._email()
            out += [("UPDATE app.users SET email = %s WHERE id = %s", (tmp, u1)),
                    ("UPDATE app.users SET email = %s WHERE id = %s", (e1, u2)),
                    ("UPDATE app.users SET email = %s WHERE id = %s", (e2, u1))]
            self.users[u1], self.users[u2] = e2, e1
        elif r < 0.72:
            uid = self.rng.choice(sorted(self.users))
            self.deleted.append((uid, self.users.pop(uid)))
            out.append(("DELETE FROM app.users WHERE id = %s", (uid,)))
        elif r < 0.77 and self.deleted:
            # re-insert a deleted key (same id, same email)
            uid, email = self.deleted.pop(self.rng.randrange(len(self.deleted)))
            self.users[uid] = email
            out.append(("INSERT INTO app.users VALUES (%s,%s,'again',0,%s)", (uid, email, now)))
        elif r < 0.87:
            a = self.base + self.rng.randrange(50)
            b = self.rng.choice(["x", "y", "z"])
            if (a, b) in self.pairs and self.rng.random() < 0.4:
                self.pairs.discard((a, b))
                out.append(("DELETE FROM app.pairs WHERE a=%s AND b=%s", (a, b)))
            elif (a, b) in self.pairs:
                out.append(("UPDATE app.pairs SET val = CONCAT(val, '+') WHERE a=%s AND b=%s", (a, b)))
            else:
                self.pairs.add((a, b))
                out.append(("INSERT INTO app.pairs VALUES (%s,%s,'v')", (a, b)))
        elif r < 0.95:
            out.append(("INSERT INTO app.log VALUES (%s, %s)", (self.rng.choice(["hi", "yo"]), self.rng.randrange(3))))
            if self.rng.random() < 0.3:
                out.append(("DELETE FROM app.log WHERE n = %s LIMIT 1", (self.rng.randrange(3),)))
        else:
            out.append(("__ROLLBACK__", ()))
        return out

    def step(self) -> None:
        if self.conn is None:
            self.conn = self.m.connect()
            self.conn.autocommit(False)
        stmts = self._stmts()
        if stmts and stmts[0][0] == "__ROLLBACK__":
            with self.conn.cursor() as cur:
                cur.execute("INSERT INTO app.log VALUES ('rolled back', 99)")
                cur.execute("UPDATE app.users SET name='rolled back'")
            self.conn.rollback()
            return
        n = 0
        with self.conn.cursor() as cur:
            for sql, params in stmts:
                n += cur.execute(sql, params)
        self.conn.commit()
        self.rows += n
        self.txns += 1

    def run(self, steps: int) -> None:
        for _ in range(steps):
            if self.stop.is_set():
                break
            self.step()

    def thread(self, steps: int) -> threading.Thread:
        def go() -> None:
            try:
                self.run(steps)
            except BaseException as exc:
                self.errors.append(exc)

        t = threading.Thread(target=go, daemon=True)
        t.start()
        return t


def rows_of(m: MariaDBInstance, db: str, table: str) -> list[tuple[Any, ...]]:
    c = m.connect()
    try:
        with c.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            cur.execute(f"SELECT * FROM {quote_ident(db)}.{quote_ident(table)}")
            return sorted(cur.fetchall(), key=repr)
    finally:
        c.close()


def assert_target_equals_sources(sources: list[MariaDBInstance], target: MariaDBInstance,
                                 tables: list[str] = TABLES, db: str = "app", target_db: str | None = None) -> None:
    for t in tables:
        want = sorted((r for m in sources for r in rows_of(m, db, t)), key=repr)
        got = rows_of(target, target_db or db, t)
        if want != got:
            missing = [r for r in want if r not in got][:3]
            extra = [r for r in got if r not in want][:3]
            raise AssertionError(f"{db}.{t}: {len(want)} source rows vs {len(got)} target rows; "
                                 f"missing e.g. {missing}; extra e.g. {extra}")


def file_state_equals(tmp: Path, servers: list[MariaDBInstance], tables: list[str] = TABLES) -> None:
    """The file, replayed with copies collapsed by identity, equals the sources; a
    repeated identity is always the same change."""
    import json

    from chaos.harness import compare, duplicate_identities, source_json

    from senders.local.replay import read_changes, rebuild

    out = tmp / "out" / "changes.jsonl"
    raw = list(read_changes(out, dedupe=False))
    items = [((d["region"], d["commit_ts"], d["seq"], d.get("sub", 0)), json.dumps(d, sort_keys=True))
             for d in raw if d.get("op") != "ddl"]
    _dups, bad = duplicate_identities(items)
    assert not bad, bad[:3]
    state = rebuild(read_changes(out))
    for t in tables:
        got = sorted(json.dumps(r, sort_keys=True) for r in state.get(("app", t), {}).values())
        lost, div, why = compare(f"file app.{t}", source_json(servers, t), got)
        assert not lost and not div, why
