"""A hostile PostgreSQL workload and row comparisons for PostgreSQL regions.

Tables with hostile names (quotes, backticks, spaces, non-ASCII), every common
type, NULLs, primary-key changes, a keyless REPLICA IDENTITY FULL table with
duplicate rows, a table with a unique key, TOASTed values left unchanged by
updates, transactions and savepoints rolled back (their marker must never
reach a sink), a transaction past spillRows, and schema changes.
"""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import psycopg
import pymysql

from capturer.model.encode import json_row
from capturer.regions.postgresql.types import Unrepresentable, pg_type, resolve_domains
from devtools.local_mariadb import MariaDBInstance
from devtools.local_postgres import PostgresInstance

HOSTILE_SCHEMA = 'we"ird `sch'
HOSTILE_TABLE = "tab`le é \"x\""
ROLLBACK_MARKER = "ROLLED-BACK-MUST-NOT-APPEAR"


def qpg(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def qmy(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


HOSTILE = f"{qpg(HOSTILE_SCHEMA)}.{qpg(HOSTILE_TABLE)}"

SCHEMA_SQL = f"""
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE SCHEMA {qpg(HOSTILE_SCHEMA)};
CREATE TABLE {HOSTILE} (
  id bigint PRIMARY KEY,
  "sel""ect" text,
  "a b" varchar(40),
  "ключ" integer,
  small smallint,
  num numeric(20,6),
  anynum numeric,
  f4 real,
  f8 double precision,
  ok boolean,
  raw bytea,
  d date,
  t time,
  ts timestamp,
  tstz timestamptz,
  js json,
  jb jsonb,
  u uuid,
  arr integer[],
  tags text[],
  m mood,
  iv interval,
  ch char(5),
  bits bit(8),
  addr inet,
  money_ money
);
CREATE TABLE public.keyless (a int, b text);
ALTER TABLE public.keyless REPLICA IDENTITY FULL;
CREATE TABLE public.toasty (id int PRIMARY KEY, big text, n int);
CREATE TABLE public.multi (a int, b text, v int, PRIMARY KEY (a, b));
CREATE TABLE public.uk (id int PRIMARY KEY, code text UNIQUE NOT NULL, v int);
ALTER TABLE public.uk REPLICA IDENTITY FULL;
CREATE TABLE public.big (id int PRIMARY KEY, payload text);
"""

TABLES = [(HOSTILE_SCHEMA, HOSTILE_TABLE), ("public", "keyless"), ("public", "toasty"), ("public", "multi"),
          ("public", "uk"), ("public", "big")]


def hostile_row(rng: random.Random, i: int) -> tuple[str, list[Any]]:
    """An INSERT of row ``i`` (values as SQL parameters; some NULL, some extreme)."""
    def maybe(v: Any) -> Any:
        return None if rng.random() < 0.1 else v

    text = rng.choice(["plain", "quote ' \" ` \\ back", "emoji \U0001F600 ünïcödé", "tab\there\nnewline", "", "%s %% {}"])
    vals = [
        i, maybe(f"{text} {i}"), maybe(text[:40]), maybe(rng.randint(-2**31, 2**31 - 1)),
        maybe(rng.choice([-32768, 32767, 0, 7])),
        maybe(rng.choice(["12345678901234.123456", "-0.000001", "0", "99999999999999.999999"])),
        maybe(rng.choice(["1e-20", "123456789012345678901234567890.5", "-7", "NaN"])),
        maybe(rng.choice([1.25, -2.5, 0.0, 1024.0])),
        maybe(rng.choice([0.1, -1e300, 3.141592653589793, 5e-324, float("nan"), float("inf")])),
        maybe(rng.choice([True, False])),
        maybe(bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))),
        maybe(rng.choice(["2024-02-29", "1000-01-01", "9999-12-31", "infinity", "0044-03-15 BC"])),
        maybe(rng.choice(["00:00:00", "23:59:59.999999", "12:34:56.5", "24:00:00"])),
        maybe(rng.choice(["2024-01-02 03:04:05.123456", "1970-01-01 00:00:00", "9999-12-31 23:59:59"])),
        maybe(rng.choice(["2024-01-02 03:04:05.123456+05:30", "2000-06-01 12:00:00-07", "infinity"])),
        maybe(json.dumps({"k": text, "n": i, "nested": [1, None, True]})),
        maybe(json.dumps({"b": 2, "a": [text], "z": None})),
        maybe(f"{rng.getrandbits(128):032x}"),
        maybe([rng.randint(-5, 5) for _ in range(rng.randint(0, 3))]),
        maybe([text, "x,y", "{brace}"]),
        maybe(rng.choice(["sad", "ok", "happy"])),
        maybe(rng.choice(["1 year 2 mons 3 days 04:05:06", "-1 day", "00:00:00.000001"])),
        maybe(rng.choice(["ab", "abcde", ""])),
        maybe(format(rng.randrange(256), "08b")),
        maybe(rng.choice(["192.168.0.1", "::1", "10.0.0.0/8"])),
        maybe(rng.choice(["1234.56", "-0.01"])),
    ]
    sql = (f"INSERT INTO {HOSTILE} VALUES (%s, %s, %s, %s, %s, %s::numeric, %s::numeric, %s, %s, %s, %s, %s::date, "
           "%s::time, %s::timestamp, %s::timestamptz, %s::json, %s::jsonb, %s::uuid, %s, %s, %s::mood, %s::interval, "
           "%s, %s::bit(8), %s::inet, %s::money)")
    return sql, vals


def apply_schema(pg: PostgresInstance) -> None:
    with pg.connect() as c:
        c.execute(SCHEMA_SQL)


class Workload:
    """Random transactions over the tables (a thread; ``stop()`` ends it)."""

    def __init__(self, pg: PostgresInstance, seed: int = 7, big_txn_rows: int = 0, pace: float = 0.0):
        self.pg = pg
        self.pace = pace  # seconds between transactions (0: as fast as the server takes them)
        self.rng = random.Random(seed)
        self.next_id = 1
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.txns = 0
        self.rollbacks = 0
        self.big_txn_rows = big_txn_rows
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Workload:
        self._t.start()
        return self

    def stop(self) -> None:
        self.done.set()
        self._t.join(60)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            with self.pg.connect(autocommit=False) as c:
                while not self.done.is_set():
                    self.step(c)
                    if self.pace:
                        self.done.wait(self.pace)
        except BaseException as exc:
            self.error = exc

    def step(self, c: Any) -> None:
        rng = self.rng
        cur = c.cursor()
        rollback = rng.random() < 0.1
        for _ in range(rng.randint(1, 6)):
            cur.execute("SAVEPOINT op")
            try:
                self._op(cur)
            except psycopg.errors.IntegrityError:  # a generated key that exists already: undo just this one
                cur.execute("ROLLBACK TO SAVEPOINT op")
        if rng.random() < 0.15:  # a savepoint rolled back inside a committed transaction
            cur.execute("SAVEPOINT s")
            cur.execute("INSERT INTO public.keyless VALUES (-1, %s)", (ROLLBACK_MARKER,))
            cur.execute("ROLLBACK TO SAVEPOINT s")
        if rollback:
            cur.execute("INSERT INTO public.keyless VALUES (-2, %s)", (ROLLBACK_MARKER,))
            c.rollback()
            self.rollbacks += 1
        else:
            c.commit()
            self.txns += 1

    def _op(self, cur: Any) -> None:
        rng = self.rng
        if True:
            op = rng.random()
            if op < 0.35:
                sql, vals = hostile_row(rng, self.next_id)
                self.next_id += 1
                cur.execute(sql, vals)
            elif op < 0.45:
                cur.execute(f"UPDATE {HOSTILE} SET id = id + 1000000 WHERE id = (SELECT min(id) FROM {HOSTILE} "
                            "WHERE id < 1000000)")  # a primary-key change
            elif op < 0.55:
                cur.execute(f"UPDATE {HOSTILE} SET \"a b\" = %s, num = NULL WHERE id %% 3 = %s",
                            (rng.choice(["upd", None, "é"]), rng.randrange(3)))
            elif op < 0.6:
                cur.execute(f"DELETE FROM {HOSTILE} WHERE id = (SELECT max(id) FROM {HOSTILE})")
            elif op < 0.7:
                a = rng.randrange(5)
                cur.execute("INSERT INTO public.keyless VALUES (%s, %s)", (a, rng.choice(["dup", None, "x"])))
                if rng.random() < 0.3:
                    cur.execute("DELETE FROM public.keyless WHERE ctid = (SELECT ctid FROM public.keyless "
                                "WHERE a = %s LIMIT 1)", (a,))
            elif op < 0.8:
                k = rng.randrange(20)
                cur.execute("INSERT INTO public.toasty VALUES (%s, %s, 0) ON CONFLICT (id) DO UPDATE SET n = "
                            "toasty.n + 1", (k, "".join(rng.choice("abcdefghijklmnop0123456789") for _ in range(9000))
                                             + str(k)))
                cur.execute("UPDATE public.toasty SET n = n + 1 WHERE id = %s", (rng.randrange(20),))  # big unchanged
            elif op < 0.9:
                a, b = rng.randrange(10), rng.choice(["x", "y", "z`", "é"])
                cur.execute("INSERT INTO public.multi VALUES (%s, %s, 1) ON CONFLICT (a, b) DO UPDATE SET v = "
                            "multi.v + 1", (a, b))
                cur.execute("UPDATE public.multi SET b = b || '+' WHERE a = %s AND length(b) < 4", (rng.randrange(10),))
            else:
                k = rng.randrange(15)
                cur.execute("INSERT INTO public.uk VALUES (%s, %s, 0) ON CONFLICT (id) DO UPDATE SET code = "
                            "EXCLUDED.code || uk.v, v = uk.v + 1", (k, f"c{k}"))

    def big_txn(self, rows: int) -> None:
        with self.pg.connect(autocommit=False) as c:
            cur = c.cursor()
            cur.execute("INSERT INTO public.big SELECT g, repeat(md5(g::text), 3) FROM generate_series(1, %s) g",
                        (rows,))
            cur.execute("UPDATE public.big SET id = id + %s", (rows,))  # a key change of every row
            c.commit()


def pg_rows(pg: PostgresInstance, db: str, table: str) -> list[str]:
    """Canonical JSON of each source row, as the capturer maps its values."""
    with pg.connect() as c:
        c.execute("SET TimeZone = 'UTC'; SET DateStyle = ISO; SET IntervalStyle = iso_8601; "
                  "SET extra_float_digits = 3")
        cols = c.execute("SELECT a.attname, a.atttypid, a.atttypmod FROM pg_attribute a JOIN pg_class r ON "
                         "r.oid = a.attrelid JOIN pg_namespace n ON n.oid = r.relnamespace WHERE n.nspname = %s "
                         "AND r.relname = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' "
                         "ORDER BY a.attnum", (db, table)).fetchall()
        # (domains as their base types, as the region carries them)
        bases = resolve_domains(lambda q, a: c.execute(q, a).fetchall(), [(oid, mod) for _, oid, mod in cols])
        cols = [(n, oid, mod) for (n, _, _), (oid, mod) in zip(cols, bases)]
        # format('%s', c): the type's output function, as pgoutput writes values (c::text differs for char, inet)
        sel = ", ".join(f"CASE WHEN {qpg(n)} IS NULL THEN NULL ELSE format('%s', {qpg(n)}) END" for n, _, _ in cols)
        out = []
        for r in c.execute(f"SELECT {sel} FROM {qpg(db)}.{qpg(table)}").fetchall():
            row = {}
            for (name, oid, mod), v in zip(cols, r):
                t = pg_type(oid, mod)
                try:
                    row[name] = None if v is None else t.parse(v)
                except Unrepresentable:
                    row[name] = None
                if t.code == 16 and row[name] is not None:
                    row[name] = int(str(row[name]), 2)
            out.append(json.dumps(json_row(row, set()), sort_keys=True))
    return sorted(out)


def mysql_rows(m: MariaDBInstance, db: str, table: str) -> list[str]:
    c = m.connect()
    try:
        with c.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            try:
                cur.execute(f"SELECT * FROM {qmy(db)}.{qmy(table)}")
            except pymysql.err.ProgrammingError as exc:
                if exc.args[0] == 1146:  # a table no change ever reached: never created
                    return []
                raise
            names = [d[0] for d in cur.description]
            types = [d[1] for d in cur.description]
            out = []
            for r in cur.fetchall():
                row = {}
                for n, t, v in zip(names, types, r):
                    if t == 16 and isinstance(v, bytes):  # BIT
                        v = int.from_bytes(v, "big")
                    if t == 4 and v is not None:  # FLOAT: single precision, as PostgreSQL real
                        v = float(v)
                    row[n] = v
                out.append(json.dumps(json_row(row, set()), sort_keys=True))
    finally:
        c.close()
    return sorted(out)


def file_rows(state: dict[tuple[str, str], dict[Any, dict[str, Any]]], db: str, table: str,
              bit_columns: tuple[str, ...] = ("bits",)) -> list[str]:
    """Rows of a table rebuilt from the file sender's lines (values as JSON already)."""
    out = []
    for row in state.get((db, table), {}).values():
        row = dict(row)
        for b in bit_columns:
            if isinstance(row.get(b), str):
                row[b] = int(row[b], 2)
        out.append(json.dumps(row, sort_keys=True))
    return sorted(out)
