"""A bank workload per shard and a reader of the target that checks what a reader may
see at every moment (issue 43: the MySQL target never shows a state the source never
had).

Per shard ``s`` (its own key ranges, the same tables in every shard):

* ``bank.accounts``: ``ACCOUNTS`` accounts holding ``START`` each; a transfer moves an
  amount between two accounts of the shard and adds a ``bank.ledger`` row in the same
  transaction (some transactions make several transfers), so the shard's
  ``SUM(balance)`` never changes and every balance equals ``START`` plus its ledger
  rows; every update bumps the row's ``ver``;
* ``bank.cards``: ``CARDS`` cards whose primary key moves now and then (the new key
  always greater: an old key never comes back at the source).

``Sampler`` reads the target in one consistent snapshot every few tens of ms and
counts, per shard once the initial rows are there: **broken** samples (the sum, the
card count or a balance disagreeing with the ledger: what whole source transactions
can never show) and **regressions** (a row older than one seen before: a ``ver``
lower than already seen, or a card key back after it had moved away), which no
reader may ever see, whether whole transactions are applied or not.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from typing import Any

import pymysql

from devtools.local_mariadb import MariaDBInstance

ACCOUNTS = 100
START = 2_000
CARDS = 50

SCHEMA = [
    "CREATE DATABASE IF NOT EXISTS bank",
    "CREATE TABLE IF NOT EXISTS bank.accounts (id INT PRIMARY KEY, shard INT NOT NULL, balance BIGINT NOT NULL, "
    "ver BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bank.ledger (id BIGINT PRIMARY KEY, shard INT NOT NULL, src INT NOT NULL, "
    "dst INT NOT NULL, amount BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bank.cards (id BIGINT PRIMARY KEY, shard INT NOT NULL, owner INT NOT NULL, "
    "ver BIGINT NOT NULL)",
]
TABLES = ["accounts", "ledger", "cards"]


def setup(m: MariaDBInstance, shard: int) -> None:
    """The schema and the shard's initial rows (one transaction)."""
    m.execute(*SCHEMA)
    c = m.connect()
    c.autocommit(False)
    with c.cursor() as cur:
        cur.executemany("INSERT INTO bank.accounts VALUES (%s, %s, %s, 0)",
                        [(shard * 10_000 + i, shard, START) for i in range(ACCOUNTS)])
        cur.executemany("INSERT INTO bank.cards VALUES (%s, %s, %s, 0)",
                        [(shard * 10**9 + i * 1000, shard, shard * 10_000 + i) for i in range(CARDS)])
    c.commit()
    c.close()


class Bank(threading.Thread):
    """Transfers (1-4 per transaction) and card moves on one shard until ``stop``."""

    def __init__(self, m: MariaDBInstance, shard: int, seed: int, pause: float = 0.0, resilient: bool = False):
        super().__init__(daemon=True, name=f"bank-{shard}")
        self.m, self.shard, self.rng, self.pause = m, shard, random.Random(seed), pause
        # resilient (the chaos suite, whose faults restart the source): a failed transaction is counted and
        # the next one made on a new connection (a commit whose answer was lost may have moved a card: the
        # next move of that card then finds no row, and the model follows the source again after it)
        self.resilient = resilient
        self.failed = 0
        self.stop = threading.Event()
        self.txns = 0
        self.errors: list[BaseException] = []
        self.cards = [shard * 10**9 + i * 1000 for i in range(CARDS)]
        self.next_ledger = shard * 10**12

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._run()
                return
            except pymysql.err.MySQLError as exc:
                if not self.resilient:
                    self.errors.append(exc)
                    return
                self.failed += 1
                time.sleep(0.2)
            except BaseException as exc:
                self.errors.append(exc)
                return

    def _run(self) -> None:
        c = self.m.connect(connect_timeout=3, read_timeout=30, write_timeout=30)
        try:
            c.autocommit(False)
            with c.cursor() as cur:
                while not self.stop.is_set():
                    for _ in range(self.rng.randint(1, 4)):
                        a, b = self.rng.sample(range(ACCOUNTS), 2)
                        src, dst = self.shard * 10_000 + a, self.shard * 10_000 + b
                        amount = self.rng.randint(1, 50)
                        cur.execute("UPDATE bank.accounts SET balance = balance - %s, ver = ver + 1 WHERE id = %s",
                                    (amount, src))
                        cur.execute("UPDATE bank.accounts SET balance = balance + %s, ver = ver + 1 WHERE id = %s",
                                    (amount, dst))
                        self.next_ledger += 1
                        cur.execute("INSERT INTO bank.ledger VALUES (%s, %s, %s, %s, %s)",
                                    (self.next_ledger, self.shard, src, dst, amount))
                    if self.rng.random() < 0.3:  # a card's primary key moves (always to a greater one)
                        i = self.rng.randrange(CARDS)
                        old, new = self.cards[i], self.cards[i] + 1
                        cur.execute("UPDATE bank.cards SET id = %s, ver = ver + 1 WHERE id = %s", (new, old))
                        self.cards[i] = new
                    c.commit()
                    self.txns += 1
                    if self.pause:
                        time.sleep(self.pause)
        finally:
            with contextlib.suppress(Exception):  # a connection the fault already broke
                c.close()


class Sampler(threading.Thread):
    """Reads the target in one consistent snapshot every ``every`` s (jittered)."""

    # a target that is down or restarting (the chaos suite's outages): the sample is taken again later
    OUTAGE = (2003, 2006, 2013, 2026, 1053, 1927, 4031)

    def __init__(self, target: MariaDBInstance, shards: list[int], every: float = 0.04, outages_ok: bool = False):
        super().__init__(daemon=True, name="sampler")
        self.target, self.shards, self.every = target, shards, every
        self.outages_ok = outages_ok
        self.outages = 0  # samples lost to an outage (with outages_ok)
        self.stop = threading.Event()
        self.samples = 0
        self.broken: list[str] = []
        self.regressions: list[str] = []
        self.errors: list[BaseException] = []
        self._ver: dict[tuple[str, int], int] = {}
        self._gone: set[int] = set()  # card keys seen and then gone
        self._cards: set[int] = set()

    def run(self) -> None:
        rng = random.Random(1)
        conn: Any = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = self.target.connect()
                self.sample(conn)
            except pymysql.err.MySQLError as exc:
                if exc.args and exc.args[0] in (1049, 1146, 1412):  # no bank tables yet (or just made)
                    pass
                elif self.outages_ok and (isinstance(exc, pymysql.err.InterfaceError)
                                          or (exc.args and exc.args[0] in self.OUTAGE)):
                    self.outages += 1
                    conn = None
                else:
                    self.errors.append(exc)
                    conn = None
            time.sleep(self.every * rng.uniform(0.5, 1.5))

    def sample(self, conn: Any) -> None:
        with conn.cursor() as cur:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cur.execute("SELECT id, shard, balance, ver FROM bank.accounts")
            accounts = cur.fetchall()
            cur.execute("SELECT src, dst, amount FROM bank.ledger")
            ledger = cur.fetchall()
            cur.execute("SELECT id, shard, ver FROM bank.cards")
            cards = cur.fetchall()
            cur.execute("COMMIT")
        self.samples += 1
        flow: dict[int, int] = {}
        for src, dst, amount in ledger:
            flow[src] = flow.get(src, 0) - amount
            flow[dst] = flow.get(dst, 0) + amount
        for shard in self.shards:
            mine = [a for a in accounts if a[1] == shard]
            if len(mine) < ACCOUNTS:
                continue  # the initial rows are not all there yet
            total = sum(a[2] for a in mine)
            n_cards = sum(1 for c in cards if c[1] == shard)
            off = [a[0] for a in mine if a[2] != START + flow.get(a[0], 0)]
            if total != ACCOUNTS * START or n_cards != CARDS or off:
                self.broken.append(f"sample {self.samples}, shard {shard}: SUM(balance) {total}, {n_cards} cards, "
                                   f"{len(off)} balance(s) disagreeing with the ledger")
        for table, rows in (("accounts", [(a[0], a[3]) for a in accounts]), ("cards", [(c[0], c[2]) for c in cards])):
            for key, ver in rows:
                seen = self._ver.get((table, key), -1)
                if ver < seen:
                    self.regressions.append(f"sample {self.samples}: {table} {key} ver {ver} after {seen}")
                self._ver[(table, key)] = max(seen, ver)
        now = {c[0] for c in cards}
        back = now & self._gone
        if back:
            self.regressions.append(f"sample {self.samples}: card key(s) back after they moved: {sorted(back)[:5]}")
        self._gone |= self._cards - now
        self._cards = now
