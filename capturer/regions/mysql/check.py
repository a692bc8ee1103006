"""``--check --connect`` of a MySQL/MariaDB region: the region's own connection logs in;
binlog settings, server_id, replication privileges, the checkpoint's binlog still on
the server, and what a snapshot needs. ``verify_source``: how ``verify`` reads the
source."""

from __future__ import annotations

import pymysql

from capturer.errors import FatalSourceError
from capturer.regions.mysql.gtid import maria_contains
from capturer.regions.mysql.prepare import check_server
from capturer.util.grants import Grants, account
from capturer.util.probe import Outcome, Probe, RegionCheck


def probe(c: RegionCheck) -> Probe:
    rc = c.config
    return Probe(f"region {rc.name} ({rc.type} {rc.host}:{rc.port})", lambda out: _source(c, out),
                 f"check host, port, user, password in {c.section}")


# MySQL privilege names as SHOW GRANTS writes them (and the aliases newer servers accept)
_REPL_SLAVE = {"REPLICATION SLAVE", "REPLICATION REPLICA"}
_BINLOG_MONITOR = {"BINLOG MONITOR", "REPLICATION CLIENT"}


def _source(c: RegionCheck, out: Outcome) -> None:
    region, rc = c.region, c.config
    # the region's own connection (FatalSourceError: access denied): with replicas, to the primary among them
    conn = region._connect_primary()
    where = region.where
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION(), @@server_id, CURRENT_USER()")
            version, server_id, user = cur.fetchone()
            acct = account(str(user))
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                        "('log_bin','binlog_format','binlog_row_image','binlog_row_metadata','log_bin_compress')")
            variables = {str(k).lower(): str(v) for k, v in cur.fetchall()}
            try:
                check_server(variables, where)
            except FatalSourceError as exc:
                out.problems.append(str(exc))
            if int(server_id or 0) == 0:
                out.problems.append(f"{where}: the server's server_id is 0: a source needs a non-zero server_id "
                                    "(server_id = 1 in its [mariadbd] / [mysqld] section, then restart it)")
            elif int(server_id) == rc.server_id:
                out.notes.append(f"{where}: [region:{rc.name}] server_id = {rc.server_id} is the source's own "
                                 "server_id: give the capturer one of its own (unique among the source's replicas)")
            grants = Grants.read(cur)
            if not grants.has_global(_REPL_SLAVE):
                grants.missing(out, where, f"the REPLICATION SLAVE privilege (reading the binlog): GRANT "
                                           f"REPLICATION SLAVE ON *.* TO {acct}")
            logs: list[str] | None = None
            if variables.get("log_bin", "").upper() == "ON":
                try:
                    cur.execute("SHOW BINARY LOGS")
                    logs = [str(r[0]) for r in cur.fetchall()]
                except pymysql.err.MySQLError as exc:
                    out.problems.append(f"{where}: SHOW BINARY LOGS failed ({exc.args[-1]}): grant BINLOG MONITOR "
                                        f"(MariaDB) or REPLICATION CLIENT (MySQL): GRANT BINLOG MONITOR ON *.* TO "
                                        f"{acct}")
            if rc.snapshot != "never":
                if not (grants.has_global({"SELECT"}) or grants.db_level({"SELECT"})):
                    grants.missing(out, where, f"the SELECT privilege: snapshot = {rc.snapshot} copies the selected "
                                               f"tables: GRANT SELECT ON *.* TO {acct} (or on their databases)")
                try:
                    region.check_snapshot_support()
                except ValueError as exc:
                    out.problems.append(f"{exc}; or set snapshot = never in [region:{rc.name}]")
                else:
                    if region.snap_method == "watermark":
                        out.notes.append(f"{where}: snapshots use the watermark method (no consistent-snapshot "
                                         "binlog position on this server): each chunk is a locking read (LOCK IN "
                                         "SHARE MODE NOWAIT); before MySQL 8.0.22 that needs the LOCK TABLES "
                                         "privilege as well as SELECT")
        if logs is not None:
            _binlog_position(c, logs, out, conn)
        if not out.problems:
            out.detail = (f"{version}, server_id {server_id}, binlog " +
                          "/".join(variables.get(k, "-") for k in ("binlog_format", "binlog_row_image",
                                                                   "binlog_row_metadata")) +
                          f", {len(logs or [])} binary log(s)" +
                          (f", resumes at {region.ctx.start}" if region.ctx.start is not None else ""))
    finally:
        conn.close()


def _binlog_position(c: RegionCheck, logs: list[str], out: Outcome, conn: pymysql.connections.Connection) -> None:
    region, rc = c.region, c.config
    where = region.where
    if not logs:
        out.problems.append(f"{where}: the server lists no binary logs")
        return
    pos = region.ctx.start  # the checkpoint's position for the region
    if pos is not None:
        if pos.file in logs and not pos.gtid:
            return
        if pos.file in logs:  # this server's own file:pos? (MariaDB: its binlog has the GTIDs right there)
            with conn.cursor() as cur:
                region._identify(cur)
                here = region._gtid_at(cur, pos)
            if not region.mariadb or (here is not None and maria_contains(here, pos.gtid)):
                return
        text = (f"{where}: the checkpoint's position {pos} ({c.checkpoint_path}) is no longer on the server "
                f"(purged?); the oldest binlog is {logs[0]}")
        if pos.gtid:  # another server's file:pos (a failover) or purged: its GTIDs decide
            with conn.cursor() as cur:
                region._identify(cur)
                lost = region._gtid_problem(cur, [(name, 0) for name in logs], pos.gtid)
            if not lost:
                out.notes.append(f"{where}: the checkpoint's position {pos} is not of this server's binlog, but "
                                 "the server holds its GTIDs: a start resumes after them (failover)")
                return
            text = f"{lost} ({c.checkpoint_path})"
        if rc.snapshot == "when_needed":
            out.notes.append(text + ": snapshot = when_needed: a start copies every selected table again")
        else:
            out.problems.append(text + ". Rows between would be lost: re-seed the destinations and delete the "
                                       "checkpoint to start over, or set snapshot = when_needed in "
                                       f"[region:{rc.name}] to copy every table again")
    elif rc.snapshot == "never" and rc.start not in ("earliest", "latest"):
        file = rc.start.rpartition(":")[0]
        if file not in logs:
            out.problems.append(f"{where}: [region:{rc.name}] start = {rc.start}: the server has no binlog {file} "
                                f"(it has {logs[0]} .. {logs[-1]})")
