"""Micro-bench of the MySQL sender's DDL intent (senders/mysql/ddlstate.py): ``Fingerprint.state`` of
one table's scope (an ALTER TABLE, a CREATE TABLE of a snapshot) on a private MariaDB target holding
``--tables`` InnoDB tables, with InnoDB's table ids read only for the scope (``WHERE NAME LIKE``)
against the baseline that read every table's id of the server and kept the scope's in Python.
Interleaved rounds in one process; the two digests must be equal (an intent written by one is
compared by the other after an upgrade).

    .venv/bin/python bench/ddl_intent.py [--tables 3000] [--rounds 6] [--reps 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from capturer.model import Ddl
from devtools.local_mariadb import MariaDBInstance
from senders.mysql import ddlstate


class WholeList(ddlstate.Fingerprint):
    """The baseline: every table id of the server read, the scope's kept in Python."""

    def _ids(self, cur: Any, where: ddlstate.Scope) -> bytes | None:
        prefixes = tuple(f"{d}/" for d in where.dbs)
        names = {f"{d}/{t}" for d, t in where.tables}
        assert self.ids_query is not None
        cur.execute(self.ids_query)
        out = []
        for nm, tid in sorted((ddlstate._norm(r[0]), int(r[1])) for r in cur.fetchall()):
            base = re.split(r"#[Pp]#", nm, maxsplit=1)[0]
            if nm.startswith(prefixes) or base in names:
                out.append(f"{nm}={tid};")
        return "".join(out).encode("utf-8", "surrogatepass")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-ddl-intent-"))
    (base / "tmp").mkdir()
    m = MariaDBInstance(base, server_id=9, binlog=False, extra={"tmpdir": str(base / "tmp")}).start()
    try:
        conn = m.connect()
        conn.autocommit(True)
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE big")
            for i in range(a.tables):
                cur.execute(f"CREATE TABLE big.t{i} (id INT PRIMARY KEY, a INT, KEY ka (a))")
            cur.execute("CREATE TABLE big.p (id INT PRIMARY KEY) PARTITION BY HASH (id) PARTITIONS 4")
            sql = "ALTER TABLE t7 ADD COLUMN z INT"
            where = ddlstate.scope(Ddl("big", sql, "t7", "big", 0), sql, "big", mapped=False)
            wherep = ddlstate.scope(Ddl("big", "ALTER TABLE p ADD COLUMN z INT", "p", "big", 0),
                                    "ALTER TABLE p ADD COLUMN z INT", "big", mapped=False)
            new, old = ddlstate.Fingerprint(), WholeList()
            for w in (where, wherep):  # the same digest either way (partitions too)
                assert new.state(cur, w) == old.state(cur, w), w
                assert (new.state(cur, w) or "").startswith("v1:ids:"), new.state(cur, w)
            times: dict[str, list[float]] = {"scope_only": [], "whole_list": []}
            for _ in range(a.rounds):
                for name, fp in (("whole_list", old), ("scope_only", new)):
                    t0 = time.perf_counter()
                    for _ in range(a.reps):
                        fp.state(cur, where)
                    times[name].append((time.perf_counter() - t0) / a.reps * 1000)
        conn.close()
    finally:
        m.stop()
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"bench": "ddl_intent", "date": dt.date.today().isoformat(), "tables": a.tables, "rounds": a.rounds,
           "reps": a.reps, "ms_per_state": {k: [round(x, 2) for x in v] for k, v in times.items()},
           "median_ms": {k: round(v, 2) for k, v in med.items()},
           "ratio_whole_over_scope": round(med["whole_list"] / med["scope_only"], 2),
           "command": "python bench/ddl_intent.py " + " ".join(sys.argv[1:])}
    print(json.dumps(res, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
