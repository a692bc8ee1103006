"""What a MySQL/MariaDB region reads of the binlog: the events it asks the library
for (``EVENTS``), MariaDB's compressed events (refused, never skipped:
``compressed_event_error``), the transaction being assembled (``TxnAssembler``),
and rows events made row changes: the fast decoder's images (``fast_changes``) or
the library's rows normalised (``library_changes``), a table map's columns as
``ColumnInfo`` (``column_info``), BINARY(n) values padded back to n bytes
(``pad_binary``)."""

from __future__ import annotations

import re
from typing import Any

from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from capturer.errors import FatalSourceError
from capturer.model import ColumnInfo, RowChange, TableSchema
from capturer.model.changes import make_changes
from capturer.regions.base import ChangeBuffer
from capturer.regions.mysql.rowdecode import normalise_library_row

EVENTS = [
    GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent, XAPrepareEvent, RotateEvent, HeartbeatLogEvent,
    WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
    NotImplementedEvent,  # (looked at for one thing: a compressed event, never skipped silently)
]

#: MariaDB's compressed events (log_bin_compress=ON): QUERY_COMPRESSED, and WRITE/UPDATE/DELETE_ROWS_COMPRESSED
#: v1 and v2. python-mysql-replication does not read them; skipped, they would lose their rows without a word.
COMPRESSED_EVENTS = frozenset(range(165, 172))


#: ``XA COMMIT`` / ``XA ROLLBACK`` as the server writes them in the binlog (the xid's parts in hex:
#: ``XA COMMIT X'7831',X'',1``): the decision on a transaction prepared earlier (its own group)
_XA_DECISION = re.compile(r"^\s*XA\s+(COMMIT|ROLLBACK)\s+X'([0-9A-Fa-f]*)'\s*,\s*X'([0-9A-Fa-f]*)'\s*,\s*(\d+)\s*"
                          r"(ONE\s+PHASE)?", re.I)


def xid_key(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    """An XA transaction's identity as ``PreparedXa.xid`` names it: ``format_id:gtrid:bqual``
    (the two in lower-case hex)."""
    return f"{int(format_id)}:{bytes(gtrid).hex()}:{bytes(bqual).hex()}"


def xa_decision(sql: str) -> tuple[str, str, bool] | None:
    """``(COMMIT or ROLLBACK, the xid_key, one phase)`` of an ``XA COMMIT``/``XA ROLLBACK`` Query
    event; None for any other statement."""
    m = _XA_DECISION.match(sql)
    if m is None:
        return None
    return (m.group(1).upper(), xid_key(int(m.group(4)), bytes.fromhex(m.group(2)), bytes.fromhex(m.group(3))),
            bool(m.group(5)))


#: ``SAVEPOINT name`` and ``ROLLBACK TO [SAVEPOINT] name`` as the server writes them inside a transaction's
#: group (the name backquoted, a backquote in it doubled). The server logs a rollback to a savepoint (instead
#: of cutting its cache) when the transaction also changed a non-transactional table: the rows between are
#: in the group but not in the source.
_SAVEPOINT = re.compile(r"^\s*(SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO(?:\s+SAVEPOINT)?|RELEASE\s+SAVEPOINT)(?:\s+|(?=`))"
                        r"(`(?:[^`]|``)*`|[^\s;`]+)", re.I)


def savepoint_statement(sql: str) -> tuple[str, str] | None:
    """``(SAVEPOINT | ROLLBACK TO | RELEASE, the name as the server compares it: lower case)``, or None."""
    m = _SAVEPOINT.match(sql)
    if m is None:
        return None
    verb = m.group(1).split()[0].upper()
    name = m.group(2)
    if name.startswith("`"):
        name = name[1:-1].replace("``", "`")
    return ("ROLLBACK TO" if verb == "ROLLBACK" else verb, name.lower())


def group_start(ev: Any) -> int:
    """Where an event starts in its binlog file: its header's next position minus its size (the
    header's: header, body and checksum; ``ev.event_size`` is the body's)."""
    return int(ev.packet.log_pos) - int(ev.packet.event_size)


_T_STRING = 254  # MYSQL_TYPE_STRING: CHAR(n) and BINARY(n) in a table map
_T_TIMESTAMP2 = 17  # MYSQL_TYPE_TIMESTAMP2


def binary_length(type_code: int, charset: str, max_length: Any) -> int:
    """A column's ``ColumnInfo.length``: n for a BINARY(n) (a fixed-length string without a
    character set), else 0."""
    if type_code != _T_STRING or charset.lower() != "binary":
        return 0
    try:
        return max(0, int(max_length or 0))
    except (TypeError, ValueError):
        return 0


def pad_binary(changes: list[RowChange], schema: TableSchema) -> None:
    """BINARY(n) values padded with zero bytes to n, in place. The binlog leaves a
    fixed-length binary value's trailing zero bytes out; the server stores, returns and
    compares it with them (a BINARY(16) key ending in 0x00 written without them matches
    no row of a target, and a consumer would get 15 bytes)."""
    cols = [(c, ci.length) for c, ci in zip(schema.columns, schema.column_info) if ci.length]
    for ch in changes:
        for img in (ch.before, ch.after):
            if img is None:
                continue
            for c, n in cols:
                v = img.get(c)
                if isinstance(v, (bytes, bytearray)) and len(v) < n:
                    img[c] = bytes(v).ljust(n, b"\x00")


def compressed_event_error(where: str, event_type: int, at: str) -> FatalSourceError:
    return FatalSourceError(
        f"{where}: a compressed binlog event (type {event_type}) at {at}: the server writes its binlog with "
        "log_bin_compress=ON, which this capturer cannot read (its rows would be lost). Set log_bin_compress=OFF "
        "on the server (SET GLOBAL log_bin_compress=OFF, and in its config file); events written while it was ON "
        "stay compressed: start after them (a new checkpoint from start=latest) and copy the tables again "
        "(snapshot=initial on a fresh checkpoint, or POST /snapshot)")



def column_info(columns: Any) -> tuple[ColumnInfo, ...]:
    """A table map's columns (the library's) as the pipeline describes them."""
    return tuple(
        ColumnInfo(c.type, bool(c.unsigned), int(getattr(c, "precision", 0) or 0),
                   int(getattr(c, "decimals", 0) or 0),
                   str(c.character_set_name or "").lower() == "binary",
                   binary_length(c.type, str(c.character_set_name or ""), getattr(c, "max_length", 0)))
        for c in columns
    )


def fast_changes(ev: Any, schema: TableSchema, fast: list[tuple[Any, Any]]) -> list[RowChange]:
    """The row changes of a rows event from the fast decoder's images (``fast_rows``)."""
    return make_changes(schema, 0 if isinstance(ev, UpdateRowsEvent) else 1 if isinstance(ev, WriteRowsEvent) else 2,
                        fast)


def library_changes(ev: Any, schema: TableSchema) -> list[RowChange]:
    """The row changes of a rows event from the library's decoded rows, normalised."""
    binary = frozenset(c for c, ci in zip(schema.columns, schema.column_info) if ci.binary)
    stamps = frozenset(c for c, ci in zip(schema.columns, schema.column_info) if ci.type == _T_TIMESTAMP2)
    if isinstance(ev, UpdateRowsEvent):
        return [RowChange(schema, "update",
                          normalise_library_row(r["before_values"], r["before_none_sources"], binary, stamps),
                          normalise_library_row(r["after_values"], r["after_none_sources"], binary, stamps))
                for r in ev.rows]
    if isinstance(ev, WriteRowsEvent):
        return [RowChange(schema, "insert", None,
                          normalise_library_row(r["values"], r["none_sources"], binary, stamps)) for r in ev.rows]
    return [RowChange(schema, "delete", normalise_library_row(r["values"], r["none_sources"], binary, stamps), None)
            for r in ev.rows]


class TxnAssembler:
    """The transaction being read: its GTID and row changes (a ``ChangeBuffer``:
    moved to disk in chunks once it grows past ``spill_rows``, 0 = never). ``open``
    is true between its first event and its end (a heartbeat then is not at a
    transaction boundary)."""

    def __init__(self, spill_rows: int, spill_dir: str, where: str):
        self.spill_rows = spill_rows
        self.spill_dir = spill_dir
        self.where = where
        self._reset()

    def _reset(self) -> None:
        self.gtid = ""
        self.savepoints: dict[str, int] = {}  # name -> how many changes the transaction had at it
        self.start: tuple[str, int] | None = None  # (file, pos) of its GTID event, where its group starts
        self.buf = ChangeBuffer(self.spill_rows, self.spill_dir, self.where)
        self.open = False

    @property
    def rows(self) -> int:
        return self.buf.rows

    def begin(self, gtid: str, start: tuple[str, int] | None = None) -> None:
        """A GTID event (starting at ``start``): a new transaction (anything unfinished before it is dropped)."""
        self._reset()
        self.gtid = gtid
        self.start = start
        self.open = True

    def add(self, changes: list[RowChange], at: str) -> None:
        """Changes read at ``at`` (named in the log line if the transaction spills)."""
        self.open = True
        self.buf.extend(changes, at)

    def savepoint(self, verb: str, name: str) -> None:
        """``SAVEPOINT name`` marks the changes so far; ``ROLLBACK TO name`` drops those
        added since (and the savepoints set after it); ``RELEASE SAVEPOINT name`` forgets it."""
        if verb == "SAVEPOINT":
            self.savepoints.pop(name, None)
            self.savepoints[name] = self.buf.rows
        elif verb == "RELEASE":
            self.savepoints.pop(name, None)
        elif name in self.savepoints:
            at = self.savepoints[name]
            self.buf.truncate(at)
            names = list(self.savepoints)
            for later in names[names.index(name) + 1:]:
                del self.savepoints[later]

    def finish(self) -> tuple[str, Any, None, bool]:
        """(gtid, its changes: in memory or spilled, no DDL, whether they were spilled)
        of the transaction that ends; then empty."""
        rows, spilled = self.buf.take()
        out = (self.gtid, rows, None, spilled)
        self._reset()
        return out

    def finish_empty(self) -> str:
        """A statement that is a transaction of its own (DDL, GRANT ...): its gtid; the state is emptied."""
        gtid = self.gtid
        self._reset()
        return gtid

