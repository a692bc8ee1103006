"""XA transactions of a MySQL/MariaDB region (MariaDB 10.5+, MySQL 5.7+).

The server writes an XA transaction's rows to the binlog at ``XA PREPARE``, in a
group of their own (GTID, rows, ``XA END``, an XA_PREPARE event: no XID), and the
decision later, as another group (GTID, the Query ``XA COMMIT X'..',X'..',n`` or
``XA ROLLBACK ...``), possibly after many other transactions. The region holds a
prepared group's rows (``Prepared``) until its decision: a commit sends them as a
transaction at the decision's place in the stream (the order of commits, not of
prepares), a rollback drops them. ``XA COMMIT ... ONE PHASE`` is an ordinary
transaction (MariaDB: GTID ... XID; MySQL: an XA_PREPARE event marked one-phase).

The transactions held are named in every position the region gives (``Position.xa``:
each one's xid and where its group starts), so a region that resumes past a
prepare (after a crash, from the checkpoint) reads those groups again
(``read_prepared``) before it goes on: a commit after the resume point finds its
rows, and a decision before it was already in the stream.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from capturer.errors import FatalSourceError
from capturer.model import Position, PreparedXa
from capturer.regions.base import close_quietly
from capturer.regions.mysql import tablemap
from capturer.regions.mysql.binlog import (
    COMPRESSED_EVENTS,
    EVENTS,
    TxnAssembler,
    compressed_event_error,
    group_start,
    savepoint_statement,
    xa_decision,
    xid_key,
)
from capturer.util import mysqlconn

log = logging.getLogger(__name__)

#: a MariaDB GTID event's flag: the group is an XA transaction's prepare (FL_PREPARED_XA)
_FL_PREPARED_XA = 0x40
#: the parts of an xid as ``XA RECOVER FORMAT='SQL'`` shows it: ``X'01ff',X'62',3``, or text where it is
#: printable (``'pre2'``; the branch qualifier and format id left out where empty and 1)
_SQL_PART = re.compile(r"X'([0-9A-Fa-f]*)'|'((?:[^']|'')*)'", re.I)


class Prepared:
    """The XA transactions prepared and not decided yet, in the order of their prepares:
    each one's mark (``PreparedXa``) and rows (in memory, or spilled)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[PreparedXa, Any, bool]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def marks(self) -> tuple[PreparedXa, ...]:
        return tuple(m for m, _, _ in self._held.values())

    def hold(self, mark: PreparedXa, rows: Any, spilled: bool) -> None:
        """A prepared group's rows (a group read again replaces the one held)."""
        self._held.pop(mark.xid, None)
        self._held[mark.xid] = (mark, rows, spilled)

    def take(self, xid: str) -> tuple[PreparedXa, Any, bool] | None:
        """The held transaction ``xid`` (no longer held); None when none is."""
        return self._held.pop(xid, None)

    def keep_only(self, marks: tuple[PreparedXa, ...]) -> list[PreparedXa]:
        """Hold exactly the transactions ``marks`` names (a resume point's): the others go
        (a stream read again from there gives them again); the marks not held are returned."""
        want = {m.xid for m in marks}
        for xid in [x for x in self._held if x not in want]:
            del self._held[xid]
        return [m for m in marks if m.xid not in self._held]


def restore(region: Any, start: Any) -> None:
    """Before the stream starts at ``start``: the region holds the XA transactions
    ``start.xa`` names, each read again from its group where it is not held yet."""
    missing = region.xa.keep_only(tuple(getattr(start, "xa", ())))
    for mark in missing:
        if region._gtid_start:
            # another server than the one the marks' positions are of (a failover resumed by GTID)
            region.xa_unknown += 1
            log.error("%s: XA transaction %s was prepared before the resume point on the server read before "
                      "(%s:%d there); its group cannot be read on this server: if it commits, its rows are "
                      "missing downstream (copy its tables again: POST /snapshot)", region.where, mark.xid,
                      mark.file, mark.pos)
            continue
        try:
            rows, spilled = read_prepared(region, mark)
        except FatalSourceError as exc:
            # not at the mark's place: a mark of the server read before a failover (its file:pos there; the
            # region went on on this one, whose binlog has the group elsewhere), a binlog file renamed ...:
            # looked for by its xid in this server's binlog, up to the resume point
            found = _relocate(region, mark, start)
            if found is None:
                raise exc from None
            log.warning("%s: XA transaction %s was not at %s:%d, where the resume point said it was prepared "
                        "(marks of the server read before a failover?): found at %s:%d", region.where, mark.xid,
                        mark.file, mark.pos, found[0].file, found[0].pos)
            mark, rows, spilled = found
        region.xa.hold(mark, rows, spilled)
        log.info("%s: XA transaction %s prepared at %s:%d (before the resume point, not decided there): "
                 "%d row(s) read again, held until its XA COMMIT or XA ROLLBACK", region.where, mark.xid,
                 mark.file, mark.pos, len(rows))


def _relocate(region: Any, mark: PreparedXa, start: Any) -> tuple[PreparedXa, Any, bool] | None:
    """The prepared group of ``mark``'s transaction found by its xid in this server's binlog, from its
    oldest file up to ``start`` (not decided before it): (its mark here, rows, spilled); None if none is."""
    if not isinstance(start, Position):
        return None
    conn = region._connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            logs = [str(r[0]) for r in cur.fetchall()]
    finally:
        close_quietly(conn)
    if not logs or (logs[0], 4) >= (start.file, start.pos):
        return None
    return _scan(region, logs[0], start, {mark.xid}).get(mark.xid)


def read_prepared(region: Any, mark: PreparedXa) -> tuple[Any, bool]:
    """(the rows, whether spilled) of the prepared XA transaction ``mark`` names, read from
    its group in the binlog (a short dump from its start, not blocking). FatalSourceError
    when the binlog no longer has it there (purged): its rows would be lost."""
    stream = BinLogStreamReader(
        connection_settings=region._conn_settings(),
        server_id=region.cfg.server_id,
        resume_stream=True,
        blocking=False,
        log_file=mark.file,
        log_pos=mark.pos,
        only_events=EVENTS,
        filter_non_implemented_events=False,
        enable_logging=False,
        pymysql_wrapper=tablemap.connect if region.cfg.decoder == "fast" else mysqlconn.connect,
    )
    txn = TxnAssembler(region.ctx.spill_rows, region.ctx.spill_dir, region.where)
    started = threading.Event()
    threading.Thread(target=region._free_dump, args=(stream, started), name=f"free-xa-dump-{region.name}",
                     daemon=True).start()
    groups = 0
    try:
        for ev in stream:
            started.set()
            if isinstance(ev, HeartbeatLogEvent):
                continue
            if type(ev) is NotImplementedEvent:
                if ev.event_type in COMPRESSED_EVENTS:
                    raise compressed_event_error(region.where, ev.event_type, f"{stream.log_file}:{stream.log_pos}")
                continue
            if isinstance(ev, (MariadbGtidEvent, GtidEvent)):
                groups += 1
                if groups > 1 and mark.gtid:
                    break  # (the group at the mark's position was not this transaction's)
                txn.begin(str(getattr(ev, "gtid", "")))
            elif isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                txn.add(region._changes(ev, region._schema(ev)), f"at {stream.log_file}:{stream.log_pos}")
            elif isinstance(ev, XAPrepareEvent):
                if not ev.one_phase and xid_key(ev.xid_format_id, ev.xid_gtrid, ev.xid_bqual) == mark.xid and (
                        not mark.gtid or txn.gtid == mark.gtid):
                    _, rows, _, spilled = txn.finish()
                    return rows, spilled
                txn.finish()
            elif isinstance(ev, XidEvent):
                txn.finish()
            elif isinstance(ev, QueryEvent):
                sp = savepoint_statement(ev.query if isinstance(ev.query, str) else ev.query.decode("utf-8", "replace"))
                if sp is not None:
                    txn.savepoint(*sp)
    except FatalSourceError:
        raise
    except Exception as exc:  # (a purged file: the server's 1236, a connection refused ...)
        raise FatalSourceError(
            f"{region.where}: cannot read the XA transaction {mark.xid} prepared at {mark.file}:{mark.pos} (before "
            f"the resume point, not decided there): {exc}. Its rows would be lost if it commits; copy its tables "
            "again (a new checkpoint with snapshot=initial, or POST /snapshot)") from exc
    finally:
        started.set()
        stream.close()
    raise FatalSourceError(
        f"{region.where}: the binlog has no prepared XA transaction {mark.xid} at {mark.file}:{mark.pos} (GTID "
        f"{mark.gtid or '?'}), where the checkpoint says it was prepared. Its rows would be lost if it commits; "
        "copy its tables again (a new checkpoint with snapshot=initial, or POST /snapshot)")


def _prepared_now(region: Any, cur: Any) -> set[str] | None:
    """The xids of the XA transactions the server holds prepared (``XA RECOVER``); None when
    it may not be asked (a warning says what is then not covered)."""
    try:
        try:
            cur.execute("XA RECOVER FORMAT='SQL'")  # (MariaDB 10.3+: the xid as SQL, whatever its bytes)
            rows = list(cur.fetchall())
            sql = True
        except pymysql.err.ProgrammingError:
            cur.execute("XA RECOVER")  # (MySQL)
            rows = list(cur.fetchall())
            sql = False
    except pymysql.err.MySQLError as exc:
        log.warning("%s: cannot list the XA transactions prepared on the server (XA RECOVER: %s): one prepared "
                    "before this first start and committed after it would be missing downstream", region.where, exc)
        return None
    out: set[str] = set()
    for fmt, glen, blen, data in (r[:4] for r in rows):
        if sql:
            text = data.decode("utf-8", "surrogateescape") if isinstance(data, (bytes, bytearray)) else str(data)
            parts = [bytes.fromhex(m.group(1)) if m.group(1) is not None else
                     m.group(2).replace("''", "'").encode("utf-8", "surrogateescape") for m in _SQL_PART.finditer(text)]
            if parts:
                out.add(xid_key(int(fmt), parts[0], parts[1] if len(parts) > 1 else b""))
        else:
            raw = data if isinstance(data, (bytes, bytearray)) else str(data).encode("utf-8", "surrogateescape")
            out.add(xid_key(int(fmt), bytes(raw[:int(glen)]), bytes(raw[int(glen):int(glen) + int(blen)])))
    return out


def recover(region: Any, cur: Any, at: Position) -> tuple[PreparedXa, ...]:
    """A first start at ``at`` (``start=latest``, a position, a snapshot's start): the XA
    transactions the server holds prepared whose prepare is before ``at`` (their decision comes
    after it) are found in the binlog, read from its oldest file up to ``at``, and held; their
    marks, for the start position (pinned with it). Nothing is read when none is prepared."""
    wanted = _prepared_now(region, cur)
    if not wanted:
        return ()
    cur.execute("SHOW BINARY LOGS")
    logs = [str(r[0]) for r in cur.fetchall()]
    if not logs or (logs[0], 4) >= (at.file, at.pos):
        return ()
    log.info("%s: %d XA transaction(s) prepared on the server at this first start: looking for their prepares in "
             "the binlog from %s to %s", region.where, len(wanted), logs[0], at)
    found = _scan(region, logs[0], at, wanted)
    for mark, rows, spilled in found.values():
        region.xa.hold(mark, rows, spilled)
        log.info("%s: XA transaction %s prepared at %s:%d, before the start: %d row(s) held until its XA COMMIT "
                 "or XA ROLLBACK", region.where, mark.xid, mark.file, mark.pos, len(rows))
    return tuple(m for m, _, _ in found.values())


def _scan(region: Any, first_file: str, at: Position, wanted: set[str]) -> dict[str, tuple[PreparedXa, Any, bool]]:
    """The prepared groups of ``wanted`` between ``first_file``'s start and ``at`` not decided
    before ``at``: xid -> (mark, rows, spilled). Only XA groups' rows are decoded."""
    stream = BinLogStreamReader(
        connection_settings=region._conn_settings(), server_id=region.cfg.server_id, resume_stream=True,
        blocking=False, log_file=first_file, log_pos=4, only_events=EVENTS, filter_non_implemented_events=False,
        enable_logging=False,
        pymysql_wrapper=tablemap.connect if region.cfg.decoder == "fast" else mysqlconn.connect)
    txn = TxnAssembler(region.ctx.spill_rows, region.ctx.spill_dir, region.where)
    found: dict[str, tuple[PreparedXa, Any, bool]] = {}
    collecting = False
    started = threading.Event()
    threading.Thread(target=region._free_dump, args=(stream, started), name=f"xa-scan-{region.name}",
                     daemon=True).start()
    try:
        for ev in stream:
            started.set()
            if (str(stream.log_file), int(stream.log_pos)) > (at.file, at.pos):
                break
            if type(ev) is NotImplementedEvent:
                if ev.event_type in COMPRESSED_EVENTS:
                    raise compressed_event_error(region.where, ev.event_type, f"{stream.log_file}:{stream.log_pos}")
                continue
            if isinstance(ev, (MariadbGtidEvent, GtidEvent)):
                txn.begin(str(getattr(ev, "gtid", "")), (str(stream.log_file), group_start(ev)))
                collecting = bool(int(getattr(ev, "flags", 0) or 0) & _FL_PREPARED_XA)
            elif isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                if collecting:
                    txn.add(region._changes(ev, region._schema(ev)), f"at {stream.log_file}:{stream.log_pos}")
            elif isinstance(ev, XAPrepareEvent):
                key = xid_key(ev.xid_format_id, ev.xid_gtrid, ev.xid_bqual)
                start = txn.start
                gtid, rows, _, spilled = txn.finish()
                if key in wanted and not ev.one_phase and start is not None:
                    found[key] = (PreparedXa(key, start[0], start[1], gtid), rows, spilled)
                collecting = False
            elif isinstance(ev, XidEvent):
                txn.finish()
                collecting = False
            elif isinstance(ev, QueryEvent):
                q = ev.query if isinstance(ev.query, str) else ev.query.decode("utf-8", "replace")
                if q.lstrip()[:8].upper() == "XA START":
                    collecting = True  # (MySQL: no flag on the GTID event)
                elif (decided := xa_decision(q)) is not None:
                    found.pop(decided[1], None)
                elif (sp := savepoint_statement(q)) is not None:
                    txn.savepoint(*sp)
    except FatalSourceError:
        raise
    except Exception as exc:
        raise FatalSourceError(f"{region.where}: cannot read the binlog for the XA transactions prepared before the "
                               f"start ({first_file} to {at}): {exc}") from exc
    finally:
        started.set()
        stream.close()
    return found
