"""Query and verify the Spark lake: ``python -m senders.spark.lakecli ...``

    tables   --warehouse W                      list lake tables and their state, and the commit log's
                                                last batch (the lake's position)
    sql      --warehouse W "SELECT ..."         run Spark SQL with every lake table registered
    show     --warehouse W db.table [--limit N] the current state of one source table
    compact  --warehouse W                      write new snapshots now
    verify   --warehouse W --table db.table --source USER:PASSWORD@HOST:PORT [--source ...]
             compare the current state with the source table(s): missing, extra, different rows

``--config conf/config.cfg`` instead of ``--warehouse`` (and ``--source``) takes
both from the capturer's own config ([spark] warehouse/database and the regions).
Exit code of verify: 0 equal, 1 different.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import sys
from pathlib import Path
from typing import Any

from capturer.config import load_config
from capturer.model.encode import format_timedelta, quote_ident
from senders import CATALOG
from senders.spark import lake
from senders.spark.commits import CommitLog
from senders.spark.sender import build_session


def canon(v: Any) -> str:
    """One spelling for equal values from Spark and from pymysql."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, (int, decimal.Decimal)):
        return format(decimal.Decimal(v).normalize(), "f")
    if isinstance(v, float):
        return repr(v + 0.0)  # (-0.0 is 0.0: a MySQL table stores no negative zero; the lake of a PostgreSQL source does)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "0x" + bytes(v).hex()
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return format_timedelta(v)
    if isinstance(v, (set, frozenset)):
        return ",".join(sorted(str(x) for x in v))
    return str(v)


def _parse_source(s: str) -> dict[str, Any]:
    cred, _, hostport = s.rpartition("@")
    user, _, password = cred.partition(":")
    host, _, port = hostport.rpartition(":")
    if not user or not host or not port.isdigit():
        raise SystemExit(f"--source {s!r}: expected USER:PASSWORD@HOST:PORT")
    return {"host": host, "port": int(port), "user": user, "password": password}


def source_rows(src: dict[str, Any], db: str, table: str) -> tuple[list[str], list[tuple[str, ...]]]:
    import pymysql

    conn = pymysql.connect(charset="utf8mb4", **src)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            cur.execute(f"SELECT * FROM {quote_ident(db)}.{quote_ident(table)}")
            cols = [d[0] for d in cur.description]
            bits = {i for i, d in enumerate(cur.description) if d[1] == 16}
            out = []
            for row in cur.fetchall():
                vals = [int.from_bytes(v, "big") if i in bits and v is not None else v for i, v in enumerate(row)]
                out.append(tuple(canon(v) for v in vals))
            return cols, out
    finally:
        conn.close()


def verify(spark: Any, warehouse: Path, database: str, db: str, table: str,
           sources: list[dict[str, Any]], show: int = 5) -> dict[str, Any]:
    tables = {(t.db, t.table): t for t in lake.register_tables(spark, warehouse, database)}
    st = tables.get((db, table))
    if st is None:
        raise SystemExit(f"no lake table for {db}.{table} under {warehouse}")
    want: list[tuple[str, ...]] = []
    cols: list[str] = []
    for src in sources:
        cols, rows = source_rows(src, db, table)
        want.extend(rows)
    lake_rows = spark.sql(f"SELECT {', '.join(lake.q(c) for c in cols)} FROM {lake.q(database)}.{lake.q(st.name)}").collect()
    got = [tuple(canon(v) for v in r) for r in lake_rows]
    pk_idx = [cols.index(c) for c in st.pk if c in cols]
    report: dict[str, Any] = {"table": f"{db}.{table}", "lake_table": f"{database}.{st.name}",
                              "source_rows": len(want), "lake_rows": len(got)}
    if pk_idx:
        w = {tuple(r[i] for i in pk_idx): r for r in want}
        g = {tuple(r[i] for i in pk_idx): r for r in got}
        missing = [k for k in w if k not in g]
        extra = [k for k in g if k not in w]
        diff = [k for k in w if k in g and w[k] != g[k]]
        report.update({"missing": len(missing), "extra": len(extra), "different": len(diff),
                       "examples": {"missing": missing[:show], "extra": extra[:show],
                                    "different": [{"source": w[k], "lake": g[k]} for k in diff[:show]]}})
    else:
        from collections import Counter

        cw, cg = Counter(want), Counter(got)
        missing_rows = list((cw - cg).elements())
        extra_rows = list((cg - cw).elements())
        report.update({"missing": len(missing_rows), "extra": len(extra_rows), "different": 0,
                       "examples": {"missing": missing_rows[:show], "extra": extra_rows[:show]}})
    report["equal"] = report["missing"] == report["extra"] == report["different"] == 0
    return report


def _from_config(path: str) -> tuple[Path, str, dict[str, Any], list[dict[str, Any]]]:
    cfg = load_config(Path(path), senders=CATALOG)
    spark_cfg = next((s for s in cfg.senders if s.name == "spark"), None)
    if spark_cfg is None:
        raise SystemExit(f"{cfg.sender_config_path}: no spark sender configured")
    o = spark_cfg.options
    # the MySQL/MariaDB regions (the rows are read back over the MySQL protocol)
    mysql: list[Any] = [r for r in cfg.regions if r.type in ("mysql", "mariadb")]
    sources = [{"host": r.host, "port": r.port, "user": r.user, "password": r.password} for r in mysql]
    return Path(o["warehouse"]).resolve(), o["database"], o, sources


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m senders.spark.lakecli", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["tables", "sql", "show", "compact", "verify"])
    ap.add_argument("arg", nargs="?", help="SQL for 'sql', db.table for 'show'")
    ap.add_argument("--warehouse")
    ap.add_argument("--config", help="take warehouse, database and sources from the capturer's config")
    ap.add_argument("--database", default=None)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--table", help="db.table for verify")
    ap.add_argument("--source", action="append", default=[], help="USER:PASSWORD@HOST:PORT (repeat per region)")
    ap.add_argument("--limit", type=int, default=50)
    args = ap.parse_args(argv)

    options: dict[str, Any] = {"master": args.master}
    sources = [_parse_source(s) for s in args.source]
    if args.config:
        warehouse, database, sopts, cfg_sources = _from_config(args.config)
        options.update({k: v for k, v in sopts.items() if k == "conf.*"})
        sources = sources or cfg_sources
    elif args.warehouse:
        warehouse, database = Path(args.warehouse).resolve(), "cdc"
    else:
        ap.error("give --warehouse or --config")
    database = args.database or database

    spark = build_session(options, warehouse)
    try:
        if args.command == "tables":
            for st in lake.register_tables(spark, warehouse, database):
                print(f"{database}.{st.name:40s} <- {st.db}.{st.table}  pk={st.pk} "
                      f"snapshot=gen{st.generation} watermark={st.watermark}")

            last = CommitLog(warehouse).last()
            print(f"commit log: {'no batch committed' if last is None else f'batch {last.batch}, key {list(last.key)}'}")
            return 0
        tables = lake.register_tables(spark, warehouse, database)
        if args.command == "sql":
            if not args.arg:
                ap.error("sql needs a query")
            spark.sql(args.arg).show(args.limit, truncate=False)
        elif args.command == "show":
            db, _, table = (args.arg or "").partition(".")
            shown = next((t for t in tables if (t.db, t.table) == (db, table)), None)
            if shown is None:
                print(f"no lake table for {args.arg}", file=sys.stderr)
                return 1
            spark.sql(f"SELECT * FROM {lake.q(database)}.{lake.q(shown.name)}").show(args.limit, truncate=False)
        elif args.command == "compact":
            for st in tables:
                new = lake.compact(spark, st, database, warehouse)
                print(f"{st.name}: generation {new.generation}, watermark {new.watermark}")
        else:
            if not args.table or not sources:
                ap.error("verify needs --table db.table and --source (or --config)")
            db, _, table = args.table.partition(".")
            import json

            report = verify(spark, warehouse, database, db, table, sources)
            print(json.dumps(report, indent=2, default=str))
            return 0 if report["equal"] else 1
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
