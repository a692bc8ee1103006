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
import threading
from typing import Any

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
from capturer.model import PreparedXa
from capturer.regions.mysql import tablemap
from capturer.regions.mysql.binlog import (
    COMPRESSED_EVENTS,
    EVENTS,
    TxnAssembler,
    compressed_event_error,
    savepoint_statement,
    xid_key,
)
from capturer.util import mysqlconn

log = logging.getLogger(__name__)


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
        rows, spilled = read_prepared(region, mark)
        region.xa.hold(mark, rows, spilled)
        log.info("%s: XA transaction %s prepared at %s:%d (before the resume point, not decided there): "
                 "%d row(s) read again, held until its XA COMMIT or XA ROLLBACK", region.where, mark.xid,
                 mark.file, mark.pos, len(rows))


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
