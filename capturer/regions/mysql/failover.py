"""A MySQL/MariaDB region's servers and GTIDs (docs/regions-mysql.md#failover): the
server to read among the configured ones (the primary, ``read_only=OFF``), the
server's flavour and identity, the GTID state of its binlog at a position, why a
server cannot go on right after the region's GTID state (it was behind when it was
promoted, or purged the binlogs after it), the failovers noted for /status, and a
snapshot in progress across a change of server (its chunks read where the stream
reads; the region's position rebased into the new server's binlog).

The region is a MySQLRegion, typed Any: region.py imports this module (its methods
``_use_server``, ``_connect_primary``, ``_identify``, ``_gtid_at``, ``_start_gtid``,
``_gtid_problem``, ``_note_server``, ``_settle_snapshot_server``, ``_rebase`` and
``snapshot_server`` are these functions)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import pymysql

from capturer.errors import FatalSourceError, SourceError
from capturer.model import Position
from capturer.regions.base import close_quietly
from capturer.regions.mysql.gtid import maria_behind, maria_purged, mysql_behind, mysql_purged

log = logging.getLogger("capturer.regions.mysql.region")  # (the region's logger: its messages as before)


def use_server(region: Any, i: int) -> None:
    host, port = region.servers[i]
    region.cfg = dataclasses.replace(region.config, host=host, port=port)
    region.where = f"region {region.name} ({host}:{port})"


def connect_primary(region: Any) -> pymysql.connections.Connection:
    """A connection to the server to read: the one read last if it is still
    reachable and (with replicas configured) the primary, else the first of the
    others that is. The primary is the server with ``read_only=OFF`` (a promoted
    replica has it turned off; a replica keeps it on). Without replicas the one
    host is used as it is (a VIP: whatever server it leads to)."""
    if len(region.servers) == 1:
        return region._connect()
    cur_host = (region.cfg.host, region.cfg.port)
    first = region.servers.index(cur_host) if cur_host in region.servers else 0
    tried: list[str] = []
    for k in range(len(region.servers)):
        i = (first + k) % len(region.servers)
        region._use_server(i)
        try:
            conn = region._connect()
        except FatalSourceError:
            raise
        except SourceError as exc:
            tried.append(f"{region.servers[i][0]}:{region.servers[i][1]}: unreachable ({exc.__cause__ or exc})")
            continue
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@GLOBAL.read_only")
                ro = str(cur.fetchone()[0]).upper() in ("1", "ON")
        except pymysql.err.MySQLError as exc:
            close_quietly(conn)
            tried.append(f"{region.servers[i][0]}:{region.servers[i][1]}: {exc}")
            continue
        if not ro:
            return conn
        close_quietly(conn)
        tried.append(f"{region.servers[i][0]}:{region.servers[i][1]}: read_only=ON (a replica)")
    region._use_server(first)
    raise SourceError(f"region {region.name}: no primary among its servers ({'; '.join(tried)}); "
                      "waiting for one (a replica promoted: read_only=OFF)")


def identify(region: Any, cur: Any) -> str:
    """The server's flavour (``region.mariadb``) and identity (server_id, and MySQL's server_uuid)."""
    cur.execute("SELECT VERSION(), @@GLOBAL.server_id")
    version, sid = cur.fetchone()
    region.mariadb = "mariadb" in str(version).lower()
    region.gtid.mariadb = region.mariadb
    ident = f"server_id {sid}"
    if not region.mariadb:
        try:
            cur.execute("SELECT @@GLOBAL.server_uuid")
            ident += f", server_uuid {cur.fetchone()[0]}"
        except pymysql.err.MySQLError:
            pass
    return ident


def gtid_at(region: Any, cur: Any, pos: Position) -> str | None:
    """MariaDB: the GTID state of this server's binlog at ``pos`` (BINLOG_GTID_POS);
    None where it has none there (not a position of this server's binlog), or on MySQL."""
    if not region.mariadb:
        return None
    try:
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (pos.file, pos.pos))
        row = cur.fetchone()
    except pymysql.err.MySQLError:
        return None
    return None if row is None or row[0] is None else str(row[0])


def start_gtid(region: Any, cur: Any, pos: Position, at_end: bool = False) -> str:
    """The GTID state at a first start's position: MariaDB's BINLOG_GTID_POS; MySQL's
    gtid_executed where the position is the binlog's end, else unknown ('')."""
    if region.mariadb:
        return region._gtid_at(cur, pos) or ""
    if not at_end:
        return ""
    try:
        cur.execute("SELECT @@GLOBAL.gtid_executed")
        row = cur.fetchone()
    except pymysql.err.MySQLError:
        return ""
    return "" if row is None or row[0] is None else str(row[0]).replace("\n", "")


def gtid_problem(region: Any, cur: Any, logs: list[tuple[str, int]], ours: str) -> str:
    """Why this server cannot go on right after the GTID state ``ours`` ('' when it
    can): it has not reached it (it was behind when it was promoted), or it purged
    the binlogs after it. (``_identify`` first: the flavour.)"""
    server = f"{region.cfg.host}:{region.cfg.port}"
    if region.mariadb:
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos, @@GLOBAL.gtid_binlog_state")
        theirs, state = (str(x or "") for x in cur.fetchone())
        behind = maria_behind(ours, theirs, state)
        if behind:
            return (f"region {region.name}: server {server} does not hold the region's GTID position {ours} "
                    f"(its binlog lacks {', '.join(behind)}: its gtid_binlog_pos is {theirs or 'empty'}, "
                    f"gtid_binlog_state {state or 'empty'}; it was behind when it was promoted, and may have "
                    "written transactions of its own in their place). Transactions the region already passed "
                    "on are not in its history")
        oldest = region._gtid_at(cur, Position(logs[0][0], 4)) or ""
        gone = maria_purged(ours, oldest)
        if gone:
            return (f"region {region.name}: server {server} no longer has the binlogs after the region's GTID "
                    f"position {ours} (its oldest binlog {logs[0][0]} starts at {oldest}: purged). Rows "
                    "between would be lost")
        return ""
    cur.execute("SELECT @@GLOBAL.gtid_executed, @@GLOBAL.gtid_purged")
    executed, purged = (str(x or "").replace("\n", "") for x in cur.fetchone())
    missing = mysql_behind(ours, executed)
    if missing:
        return (f"region {region.name}: server {server} does not hold the region's GTID position {ours} "
                f"(it lacks {missing}: its gtid_executed is {executed or 'empty'}; it was behind when it was "
                "promoted). Transactions the region already passed on are not in its history")
    unread = mysql_purged(ours, purged)
    if unread:
        return (f"region {region.name}: server {server} purged GTIDs the region has not read ({unread}; its "
                f"gtid_purged is {purged}). Rows between would be lost")
    return ""


def note_server(region: Any, ident: str, by_gtid: bool) -> None:
    """The region reads this server now: a failover when it is not the one read before."""
    now = (region.cfg.host, region.cfg.port, ident)
    before, region._server_seen = region._server_seen, now
    if before is None and not by_gtid:
        return
    if before == now:
        return
    came = f"{before[0]}:{before[1]} ({before[2]})" if before else "the checkpoint's server"
    entry = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "from": came,
             "to": f"{now[0]}:{now[1]} ({ident})",
             "gtid": region.position.gtid if region.position is not None else ""}
    region.failovers.append(entry)
    del region.failovers[:-20]
    region.failover_count += 1
    log.warning("%s: failover: reading %s now (was %s), resuming after GTID %s", region.where, entry["to"],
                came, entry["gtid"] or "-")


# --- a snapshot across a change of server ---------------------------------------------

def settle_snapshot_server(region: Any, ident: str) -> bool:
    """The stream reads this server (``region.cfg``) now: snapshot chunks are read on it
    too. When it is another server than the one they were read on so far, every
    chunk read there is void (read again here): True."""
    now = (region.cfg.host, region.cfg.port, ident)
    with region._lock:
        region._apply_requests()
        changed = region._snap_seen is not None and region._snap_seen != now
        if changed:
            region._void_chunks(new_log=False)
        region._snap_seen = now
        region._snap_cfg = region.cfg
        region._lock.notify_all()
    if changed:
        snapshot_moves(region)
    return changed


def snapshot_moves(region: Any) -> None:
    """Say that a snapshot in progress goes on on the server read now."""
    running = [f"{p.db}.{p.table}" for p in region.snap_progress if p.state in ("pending", "running")]
    if running:
        log.warning("%s: failover during a snapshot: the copy of %d table(s) (%s) goes on on this server, "
                    "each from its last delivered chunk", region.where, len(running),
                    ", ".join(running[:5]) + (" ..." if len(running) > 5 else ""))


def rebase(region: Any, low: Position, say: bool = True) -> None:
    """A change of server resumed by GTID: the stream's positions are this server's
    binlog's from now on, which those of the server before do not compare with.
    The region's position becomes ``low`` (a position of this binlog at or before
    the first transaction the stream gives: the start of its oldest file, with our
    GTID state) until the stream's own positions take over: a snapshot chunk read
    here at P is delivered once the stream has passed P in this binlog, and heartbeats
    compare with it. Chunks read before are void: each table's copy goes on from its
    last delivered key, read on this server."""
    with region._lock:
        region._apply_requests()
        region.position = Position(low.file, low.pos, low.gtid, region.snap_progress, region.xa.marks())
        region._void_chunks(new_log=True)
        region._lock.notify_all()
    if say:
        snapshot_moves(region)


def snapshot_server(region: Any) -> tuple[int, Any, str]:
    """(the snapshot generation, the configuration of the server to read chunks on,
    its description) as one consistent choice: a reader connects there."""
    with region._lock:
        cfg = region._snap_cfg or region.cfg
        return region._snap_gen, cfg, f"region {region.name} ({cfg.host}:{cfg.port})"
