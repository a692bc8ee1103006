"""A seeded random workload on the BaikalDB double, and the checks that compare
what the capturer delivered (file, MySQL target) with the double's tables.

Layout: binlog table 20 (``ops.binlog_shop``: 1 partition x 3 regions) carries
``shop.orders`` (every type, a unique key) and ``shop.order items`` (a composite
key, a hostile column name, linked through ``binlog_infos``); binlog table 30
(``ops.binlog_acct``: 3 partitions x 1 region) carries ``acct.balances`` (a GBK
table partitioned by id, so transfers are multi-partition transactions).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import struct
from pathlib import Path
from typing import Any

from capturer.model.encode import json_value, quote_ident
from devtools.baikaldb_double import BaikalDouble, Cluster

ORDERS, ITEMS, BAL = 10, 11, 12
NAMES = {ORDERS: ("shop", "orders"), ITEMS: ("shop", "order items"), BAL: ("acct", "balances")}
STRINGS = ["plain", "O'Brien", "back\\slash", 'quote"d', "tab\tnew\nline", "emoji 😀", "中文", "`tick`", "",
           "NUL\x00byte", "%s %d"]
GBK = ["张三", "李四", "O'Neil", "plain", "", "back\\slash"]


def build(d: BaikalDouble) -> Cluster:
    c = d.cluster
    c.create_binlog_table(20, "ops", "binlog_shop", partitions=1, regions_per_partition=3)
    c.create_binlog_table(30, "ops", "binlog_acct", partitions=3, regions_per_partition=1)
    c.create_table(ORDERS, "shop", "orders", [
        ("id", "INT64", False), ("code", "STRING", False), ("customer", "STRING"), ("amount", "DOUBLE"),
        ("qty", "INT32"), ("status", "INT8"), ("flag", "BOOL"), ("big", "UINT64"), ("small", "UINT8"),
        ("mid", "UINT16"), ("u32", "UINT32"), ("i16", "INT16"), ("f", "FLOAT"), ("created", "DATETIME"),
        ("day", "DATE"), ("t", "TIME"), ("ts", "TIMESTAMP"), ("sketch", "HLL"), ("doc", "JSON"), ("note", "STRING"),
    ], ["id"], 20, uniques=[["code"]])
    c.create_table(ITEMS, "shop", "order items", [
        ("order_id", "INT64", False), ("line", "INT32", False), ('q"ty`', "INT32"), ("label", "STRING")],
        ["order_id", "line"], 20, link_style="binlog_infos")
    c.create_table(BAL, "acct", "balances", [
        ("id", "UINT32", False), ("owner", "STRING"), ("balance", "DOUBLE"), ("updated", "DATETIME")],
        ["id"], 30, charset=1)
    return c


class Workload:
    def __init__(self, c: Cluster, seed: int = 7):
        self.c = c
        self.rng = random.Random(seed)
        self.next_order = 1
        self.next_code = 1
        self.next_acct = 1
        self.txns = 0
        self.rows = 0
        self.rollbacks = 0
        self.last_ts: dict[int, int] = {}
        self.schema_steps: dict[int, str] = {}

    # --- values ---------------------------------------------------------------------------
    def _maybe(self, v: Any, p: float = 0.15) -> Any:
        return None if self.rng.random() < p else v

    def order(self) -> dict[str, Any]:
        r = self.rng
        self.next_order += 1
        self.next_code += 1
        return {
            "id": self.next_order, "code": f"c-{self.next_code}", "customer": self._maybe(r.choice(STRINGS)),
            "amount": self._maybe(round(r.uniform(-1e6, 1e6), 2)), "qty": self._maybe(r.choice([0, 1, -5, 2**31 - 1])),
            "status": self._maybe(r.choice([0, -128, 127, 3])), "flag": self._maybe(r.choice([True, False])),
            "big": self._maybe(r.choice([0, 1 << 32, (1 << 64) - 1, r.getrandbits(64)])),
            "small": self._maybe(r.choice([0, 255])), "mid": self._maybe(r.randrange(65536)),
            "u32": self._maybe(r.choice([0, (1 << 32) - 1])), "i16": self._maybe(r.choice([-32768, 32767, 0])),
            "f": self._maybe(r.choice([0.0, 0.5, -3.75, 100.25])),
            "created": self._maybe(dt.datetime(2026, 1, 1) + dt.timedelta(microseconds=r.randrange(10**13))),
            "day": self._maybe(dt.date(1000, 1, 1) + dt.timedelta(days=r.randrange(3_000_000))),
            "t": self._maybe(dt.timedelta(seconds=r.randrange(-838 * 3600, 838 * 3600))),
            "ts": self._maybe(dt.datetime(2001, 1, 1) + dt.timedelta(seconds=r.randrange(10**9))),
            "sketch": self._maybe(r.randbytes(r.randrange(0, 20))),
            "doc": self._maybe(json.dumps({"k": [1, r.randrange(9), {"x": None}]})),
            "note": self._maybe(r.choice(STRINGS), 0.4),
        }

    # --- statements -------------------------------------------------------------------------
    def step(self) -> None:
        c = self.c
        orders = sorted(c.tables[ORDERS].rows)
        accts = sorted(c.tables[BAL].rows)
        tx = c.begin()
        try:
            self._statements(tx, orders, accts)
        except KeyError:  # a generated key change collided with an existing key: skip it
            return
        if tx.stmts and tx.stmts[0].sql == "rollback":
            return
        ts = tx.commit()
        self.txns += 1
        self.rows += sum(max(len(s.old), len(s.new)) for s in tx.stmts)  # row changes, as delivered
        for region, _, _, _ in tx.prewritten:
            self.last_ts[region.table_id] = max(self.last_ts.get(region.table_id, 0), ts)

    def _statements(self, tx: Any, orders: list[Any], accts: list[Any]) -> None:
        c, r = self.c, self.rng
        x = r.random()
        if x < 0.25 or len(orders) < 6:
            new = [self.order() for _ in range(r.randint(1, 4))]
            tx.insert(ORDERS, *new)
            for o in new[: r.randint(0, 2)]:
                tx.insert(ITEMS, *({"order_id": o["id"], "line": i, 'q"ty`': r.randrange(100),
                                    "label": r.choice(STRINGS)} for i in range(r.randint(1, 3))))
        elif x < 0.40:
            keys = r.sample(orders, min(3, len(orders)))
            upd = []
            for k in keys:
                o = self.order()
                cols = r.sample([c_ for c_ in o if c_ not in ("id", "code")], 3)
                upd.append((k, {c_: o[c_] for c_ in cols}))
            tx.update(ORDERS, upd)
        elif x < 0.47:
            k = r.choice(orders)
            self.next_order += 1
            tx.update(ORDERS, [(k, {"id": self.next_order})])  # primary key change
        elif x < 0.52 and len(orders) >= 2:
            a, b = r.sample(orders, 2)  # two rows swap their unique code in one statement
            rows = c.tables[ORDERS].rows
            tx.update(ORDERS, [(a, {"code": rows[b]["code"]}), (b, {"code": rows[a]["code"]})])
        elif x < 0.60:
            tx.delete(ORDERS, *r.sample(orders, min(2, len(orders))))
        elif x < 0.70:
            items = sorted(c.tables[ITEMS].rows)
            if items:
                k = r.choice(items)
                if r.random() < 0.5:
                    tx.update(ITEMS, [(k, {'q"ty`': self._maybe(r.randrange(1000)), "line": k[1] + 100})])
                else:
                    tx.delete(ITEMS, k)
            else:
                tx.insert(ITEMS, {"order_id": r.choice(orders)[0], "line": 1, 'q"ty`': 1, "label": "x"})
        elif x < 0.82 or len(accts) < 4:
            for _ in range(r.randint(1, 3)):
                self.next_acct += 1
                tx.insert(BAL, {"id": self.next_acct, "owner": self._maybe(r.choice(GBK)),
                                "balance": round(r.uniform(0, 1000), 2), "updated": dt.datetime(2026, 2, 3, 4, 5, 6)})
        elif x < 0.92:
            a, b = r.sample(accts, 2)  # a transfer: usually two partitions, one transaction
            rows = c.tables[BAL].rows
            amt = round(r.uniform(0, 10), 2)
            tx.update(BAL, [(a, {"balance": round((rows[a]["balance"] or 0) - amt, 2)}),
                            (b, {"balance": round((rows[b]["balance"] or 0) + amt, 2)})])
            if r.random() < 0.3:
                tx.update(ORDERS, [(r.choice(orders), {"note": "paid"})])  # and another binlog table
        elif x < 0.96:
            tx.delete(BAL, r.choice(accts))
        else:
            tx.insert(ORDERS, self.order())
            tx.prewrite()
            tx.rollback()  # never appears downstream
            self.rollbacks += 1
            tx.stmts[0].sql = "rollback"

    def schema_change(self, which: int) -> None:
        """1: ADD COLUMN with a default; 2: DROP COLUMN; 3: ADD COLUMN to the GBK table."""
        c = self.c
        if which == 1:
            c.add_column(ORDERS, "extra", "INT32", True, 5)
        elif which == 2:
            c.drop_column(ORDERS, "note")
        elif which == 3:
            c.add_column(BAL, "tier", "STRING", True, "std")

    def run(self, steps: int, schema_at: dict[int, int] | None = None, pause: float = 0.0) -> None:
        import time

        for i in range(steps):
            if schema_at and i in schema_at:
                self.schema_change(schema_at[i])
            self.step()
            if pause:
                time.sleep(pause)


# --- comparisons -------------------------------------------------------------------------

def _f32(v: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", v))[0])


def _norm(v: Any, typ: int) -> Any:
    if v is None:
        return None
    if typ == 11:
        return _f32(float(v))
    if typ in (1, 2):
        return int(v)
    return v


def expected(c: Cluster, table_id: int) -> list[tuple[Any, ...]]:
    t = c.tables[table_id]
    with c.lock:
        return sorted((tuple(_norm(r.get(f.name), f.type) for f in t.live) for r in t.state()), key=repr)


def assert_mysql_equals(c: Cluster, target: Any, tables: tuple[int, ...] = (ORDERS, ITEMS, BAL)) -> None:
    conn = target.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            for tid in tables:
                t = c.tables[tid]
                db, name = NAMES[tid]
                cols = ", ".join(quote_ident(f.name) for f in t.live)
                cur.execute(f"SELECT {cols} FROM {quote_ident(db)}.{quote_ident(name)}")
                got = sorted((tuple(_norm(v, f.type) for v, f in zip(row, t.live)) for row in cur.fetchall()),
                             key=repr)
                want = expected(c, tid)
                if got != want:
                    missing = [x for x in want if x not in got][:2]
                    extra = [x for x in got if x not in want][:2]
                    raise AssertionError(f"{db}.{name}: {len(want)} rows in the double, {len(got)} in the target; "
                                         f"missing e.g. {missing}; extra e.g. {extra}")
    finally:
        conn.close()


def assert_file_equals(c: Cluster, out: Path, tables: tuple[int, ...] = (ORDERS, ITEMS, BAL)) -> None:
    from senders.local.replay import read_changes, rebuild

    state = rebuild(read_changes(out))
    for tid in tables:
        t = c.tables[tid]
        db, name = NAMES[tid]
        got = sorted((tuple(row.get(f.name) for f in t.live) for row in state.get((db, name), {}).values()),
                     key=repr)
        want = sorted((tuple(json_value(v)[0] for v in r) for r in expected(c, tid)), key=repr)
        if got != want:
            missing = [x for x in want if x not in got][:2]
            extra = [x for x in got if x not in want][:2]
            raise AssertionError(f"{db}.{name}: {len(want)} rows in the double, {len(got)} in the file; "
                                 f"missing e.g. {missing}; extra e.g. {extra}")


def baikal_config(tmp: Path, d: BaikalDouble, senders: str, extra_regions: str = "", region_extra: str = "",
                  extra_global: str = "", http_port: int = 0) -> Path:
    from devtools.local_mariadb import free_port

    (tmp / "senderConfig.cfg").write_text(senders)
    (tmp / "filter_rule.txt").write_text("")
    cfg = tmp / "config.cfg"
    regions = "".join(f"\n[region:{name}]\ntype=baikaldb\nmetaServer={d.meta_servers}\nbinlogTableID={bt}\n"
                      f"poll_ms=50\nschema_refresh=2\n{region_extra}" for name, bt in (("shop", 20), ("acct", 30)))
    cfg.write_text("[global]\n"
                   f"binlogCheckPointPath={tmp / 'checkpoint.json'}\n"
                   f"senderConfig={tmp / 'senderConfig.cfg'}\nfilterRuleDict={tmp / 'filter_rule.txt'}\n"
                   f"httpPort={http_port or free_port()}\ncheckpointInterval=0.5\n{extra_global}"
                   + regions + extra_regions)
    return cfg


def covered(tmp: Path, w: Workload) -> bool:
    """The checkpoint has passed the last commit of every binlog table."""
    p = tmp / "checkpoint.json"
    try:
        cp = json.loads(p.read_text())
    except (OSError, ValueError):
        return False
    # the checkpoint's own ``regions`` is where the sources resume (ahead of a sender still draining the
    # backlog on disk): every attached sender's acknowledged position must pass the commit too
    positions = [cp["regions"]] + [s.get("regions", {}) for s in cp.get("senders", {}).values()
                                   if not s.get("detached")]
    for name, bt in (("shop", 20), ("acct", 30)):
        for regions in positions:
            pos = regions.get(name)
            if w.last_ts.get(bt) and (pos is None or pos["ts"] < w.last_ts[bt]):
                return False
    return True
