"""A MySQL/MariaDB region's setup at each connect (``prepare``): the server checked
(``check_server``: a row-based binlog with full images and column names), its clock
measured, and where to read from: the checkpoint's file:pos on its own server, after
its GTID state on another (a failover), a snapshot's start (``start_snapshot``, with
the up-front CREATE TABLEs of ``upfront_creates``), or the configured start.

The region is a MySQLRegion, typed Any: region.py imports this module (its methods
``_prepare``, ``_binlog_end``, ``_start_snapshot`` and ``_upfront_creates`` are these
functions)."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any

import pymysql

from capturer.errors import FatalSourceError
from capturer.model import Ddl, Position, TableProgress, Txn, ts_physical_ms
from capturer.model.encode import qualified, quote_ident
from capturer.regions.mysql import xa
from capturer.regions.mysql.gtid import maria_contains
from capturer.regions.mysql.snapshot import base_tables, create_table_sql
from capturer.util import failpoints
from capturer.util.binlogpos import binlog_end

log = logging.getLogger("capturer.regions.mysql.region")  # (the region's logger: its messages as before)

REQUIRED = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}


def check_server(variables: dict[str, str], where: str) -> None:
    """Refuse a server whose binlog cannot give full row changes with column names."""
    problems = []
    for name, want in REQUIRED.items():
        if name not in variables:
            if name == "binlog_row_metadata":
                continue  # older servers: names then come from information_schema
            problems.append(f"{name} is not reported by the server")
            continue
        have = variables[name].upper()
        if have != want:
            problems.append(f"{name}={variables[name]} (need {name}={want})")
    if variables.get("log_bin_compress", "OFF").upper() == "ON":
        problems.append("log_bin_compress=ON (need log_bin_compress=OFF: compressed binlog events cannot be read; "
                        "SET GLOBAL log_bin_compress=OFF)")
    if problems:
        raise FatalSourceError(
            f"{where}: server settings do not allow row capture: {'; '.join(problems)}. "
            "Set them in the server's config file ([mariadbd] / [mysqld] section: "
            "log_bin=<basename>, binlog_format=ROW, binlog_row_image=FULL, "
            "binlog_row_metadata=FULL) and restart it; binlog_format/binlog_row_image/"
            "binlog_row_metadata can also be changed with SET GLOBAL."
        )


def prepare(region: Any) -> Position:
    """Check the server, measure its clock, and decide where to read from."""
    conn = region._connect_primary()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                "('log_bin','binlog_format','binlog_row_image','binlog_row_metadata','log_bin_compress')"
            )
            check_server({k.lower(): str(v) for k, v in cur.fetchall()}, region.where)
            t0 = time.time()
            cur.execute("SELECT UNIX_TIMESTAMP(NOW(6))")
            server = float(cur.fetchone()[0])
            t1 = time.time()
            region._clock_offset_ms = (server - (t0 + t1) / 2) * 1000
            try:
                cur.execute("SHOW BINARY LOGS")
            except pymysql.err.MySQLError as exc:
                raise FatalSourceError(
                    f"{region.where}: SHOW BINARY LOGS failed ({exc}); the user needs the "
                    "BINLOG MONITOR (MariaDB) or REPLICATION CLIENT (MySQL) privilege"
                ) from None
            logs = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
            if not logs:
                raise FatalSourceError(f"{region.where}: the server lists no binary logs")
            ident = region._identify(cur)
            moved = region._settle_snapshot_server(ident)
            region._gtid_start = ""
            if region.position is not None:
                names = dict(logs)
                here = region._gtid_at(cur, region.position) if region.position.file in names else None
                # (a binlog's start with a GTID state: a position rebased after a failover, below
                # the new server's own; resumed by GTID, also on MySQL where no GTID is checked here)
                rebased = region.position.pos == 4 and bool(region.position.gtid)
                if region.position.file in names and (
                    (not region.mariadb and not rebased) or not region.position.gtid
                    or (here is not None and maria_contains(here, region.position.gtid))):
                    # this server's own file:pos (MariaDB: its binlog has our GTIDs right there)
                    region.gtid.reset(here if here is not None else region.position.gtid)
                    region._note_server(ident, by_gtid=False)
                    region._start_snapshot(cur, fresh=False)
                    return region.position
                lost = region._gtid_problem(cur, logs, region.position.gtid) if region.position.gtid else ""
                if region.position.gtid and not lost:
                    # another server (a promoted replica, a VIP moved): it holds our GTIDs, go on after them
                    region._gtid_start = region.position.gtid
                    region.gtid.reset(region.position.gtid)
                    region._note_server(ident, by_gtid=True)
                    region._rebase(Position(logs[0][0], 4, region.position.gtid), say=not moved)
                    # a snapshot in progress goes on here, from each table's last delivered key
                    region._start_snapshot(cur, fresh=False)
                    return region.position
                if not lost:
                    lost = (f"{region.where}: resume position {region.position} is no longer on the "
                            f"server (purged?); the oldest binlog is {logs[0][0]}. Rows between "
                            "would be lost")
                if region.cfg.snapshot != "when_needed":
                    raise FatalSourceError(
                        f"{lost}; re-seed the destinations and delete the checkpoint "
                        "to start over (or set snapshot = when_needed in this region to copy "
                        "every table again and go on from the current position)."
                    )
                log.warning("%s; snapshot=when_needed: copying every selected table again (each emptied "
                            "downstream first: rows deleted in the gap go too) and reading the binlog "
                            "from its current end", lost)
                region._note_server(ident, by_gtid=True)
                with region._lock:
                    region.position = None
                    region.snap_progress = ()
                    region._snap_gen += 1  # chunks in flight were read against the old binlog
                purged = True
            else:
                purged = False
            if not purged:
                region._note_server(ident, by_gtid=False)
            if region.cfg.snapshot in ("initial", "when_needed"):
                region._start_snapshot(cur, fresh=True, at=region._binlog_end(cur), truncate=purged)
                assert region.position is not None  # the snapshot's start, set by _start_snapshot
                return region.position
            start = region.cfg.start
            if start == "earliest":
                pos = Position(logs[0][0], 4)
            elif start == "latest":
                pos = region._binlog_end(cur)
            else:
                file, _, off = start.rpartition(":")
                pos = Position(file, int(off))
            pos = Position(pos.file, pos.pos, region._start_gtid(cur, pos))
            # the XA transactions prepared before it and not decided there: held, named in the position
            pos = Position(pos.file, pos.pos, pos.gtid, (), xa.recover(region, cur, pos) if start != "earliest" else ())
            region.gtid.reset(pos.gtid)
            # durable before anything is emitted: a crash before the first checkpoint
            # resumes here, not from a new "latest" (changes between would be lost)
            region.ctx.pin_start(region.name, pos)
            return pos
    finally:
        conn.close()


def binlog_end_at(region: Any, cur: Any) -> Position:
    """The position the server writes next (SHOW MASTER STATUS, or MySQL 8.4's
    SHOW BINARY LOG STATUS)."""
    def query(sql: str) -> list[tuple[Any, ...]]:
        cur.execute(sql)
        return list(cur.fetchall())
    got = binlog_end(query)
    if got is None:
        raise FatalSourceError(f"{region.where}: the server reports no binlog position (is log_bin on?)")
    pos = Position(*got)
    return Position(pos.file, pos.pos, region._start_gtid(cur, pos, at_end=True))


def start_snapshot(region: Any, cur: Any, fresh: bool, at: Position | None = None, truncate: bool = False) -> None:
    """On a first start (``fresh``) with snapshot=initial/when_needed: every table
    the filter selects (``truncate``: each emptied downstream first), from ``at``;
    on a restart: the snapshot in progress in the checkpoint. Tables whose copy has
    not started get their CREATE TABLE IF NOT EXISTS first (again after a restart),
    so that binlog changes to them find them on a new target."""
    if fresh or region.snap_progress:
        try:
            region._resolve_snap_method(cur)
        except ValueError as exc:
            raise FatalSourceError(str(exc)) from None
    if fresh:
        assert at is not None
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = "
                    "'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
        # the filter decides, system schemas included (left out unless a rule names them)
        tables = [(str(db), str(t)) for db, t in cur.fetchall() if region.ctx.table_selected(str(db), str(t))]

        def execute(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
            cur.execute(sql, params)
            return list(cur.fetchall())
        keyless = base_tables(execute, "%s", tables)
        # a copy that truncates must be the only source of its table downstream
        cut = [t for t in tables if truncate or keyless.get(t)]
        region.refuse_outside_peers(cut, truncate)
        run = uuid.uuid4().hex[:12]
        progress = tuple(TableProgress(db, t, run, truncate=truncate) for db, t in tables)
        start = Position(at.file, at.pos, at.gtid, progress, xa.recover(region, cur, at))
        # durable before anything is emitted: a crash before the first checkpoint resumes
        # this run from this position (so changes made meanwhile are delivered)
        region.ctx.pin_start(region.name, start)
        with region._lock:
            region.snap_progress = progress
            region.position = start
            region._apply_requests()  # (after: a request made meanwhile is kept)
        log.info("%s: snapshot=%s: copying %d table(s)%s while reading the binlog from %s",
                 region.where, region.cfg.snapshot, len(tables),
                 " (each emptied downstream first)" if truncate else "", region.position)
    if region.cfg.snapshot_ddl:
        region._upfront_creates(cur)
    with region._snap_lock:
        if fresh or region.snapshotter is None:
            pending = tuple(p for p in region.snap_progress if p.state in ("pending", "running"))
            if pending:
                if region.snapshotter is None:
                    region.snapshotter = region._new_snapshotter()
                region.snapshotter.load(pending)


def upfront_creates(region: Any, cur: Any) -> None:
    """Every pending table's CREATE TABLE IF NOT EXISTS, as the binlog would have
    given it, before anything else of the region: binlog changes to a table whose
    copy has not started then find it on a new target. They take the commit_ts
    right after the region's floor and only the last one's position marks them
    sent (``created``): a restart before that was acknowledged sends them again
    with the same identities (the floor is the one pinned with the start), and a
    restart after it does not send them again (which would lift every replayed
    transaction above them, to new identities)."""
    with region._lock:
        region._apply_requests()
        todo = [(p.run, p.db, p.table) for p in region.snap_progress
                if p.state == "pending" and not p.created and (p.run, p.db, p.table) not in region._creates_done]
    if not todo:
        return
    stmts: list[tuple[str, str, str]] = []
    for db in sorted({db for _, db, _ in todo}):
        stmts.append((db, "", f"CREATE DATABASE IF NOT EXISTS {quote_ident(db)}"))
    for _, db, t in todo:
        failpoints.hit("snapshot.create")
        try:
            cur.execute(f"SHOW CREATE TABLE {qualified(db, t)}")
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] == 1146:  # dropped since: its copy will say so
                continue
            raise
        row = cur.fetchone()
        sql = create_table_sql(db, t, str(row[1])) if row else ""
        if sql:
            stmts.append((db, t, sql))
    with region._lock:
        region._apply_requests()
        done = set(todo)
        progress = tuple(dataclasses.replace(p, created=True) if (p.run, p.db, p.table) in done else p
                         for p in region.snap_progress)
        here = region.position
        assert here is not None
        after = Position(here.file, here.pos, here.gtid, progress, here.xa)
        for i, (db, t, sql) in enumerate(stmts):
            ts = region.clock.next()
            region._emit(Txn(region.name, ts, after if i == len(stmts) - 1 else here, (),
                             Ddl(db, sql, t, db), ts_physical_ms(ts) // 1000, ""))
            region.last_commit_ts = ts
        region.snap_progress = progress
        region.position = after
        region._creates_done.update(todo)
