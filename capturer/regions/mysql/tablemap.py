"""Table maps parsed once per definition, not once per transaction.

The binlog carries a table map event before the rows of every table in every
transaction. python-mysql-replication parses each one in Python (the column
types and their metadata, then binlog_row_metadata=FULL's names, charsets,
key and enum values) into new ``Column`` and ``Table`` objects: about a
quarter of a region's decoding CPU with 100-row transactions (py-spy, 2026-11-25),
under the GIL the senders need. Every table map of a table whose definition has
not changed carries the same bytes, so a stream whose connections come from
``connect`` below keeps what it parsed by those bytes and, for the same bytes
again, reuses the parsed fields and the same ``Table`` object (which also lets
the row decoder's plan cache skip its signature check).

It is safe because the bytes are the whole definition: the capturer requires
``binlog_row_metadata=FULL`` (``check_server``), so column names, key, charsets
and enum/set values are in them; the library only asks the server (through the
control connection) for names when that metadata is missing, and then the
cache is not used. The key also holds what the parse depends on besides the
bytes (the server's kind and version, the format description's post-header
lengths, the metadata switch). Table ids come back after a server restart, with
the same bytes meaning the same definition.

The library builds its event objects itself, so this wraps
``TableMapEvent.__init__`` (pinned version); streams whose control connection
does not carry a cache (any other ``BinLogStreamReader`` in the process) parse
as before.
"""

from __future__ import annotations

from typing import Any

from pymysqlreplication.row_event import TableMapEvent

from capturer.util import mysqlconn

CACHE_ATTR = "_capturer_table_maps"
# kept per stream, the least recently used going first: definitions, and their columns
# in all (a parsed column is about 1 kB)
MAX_ENTRIES = 4096
MAX_COLUMNS = 20_000
# set per event (or per stream) by BinLogEvent.__init__; the rest comes from the first parse
_PER_EVENT = ("packet", "table_map", "event_type", "timestamp", "event_size", "_ctl_connection")

_parse = TableMapEvent.__init__


def _cached_init(self: Any, from_packet: Any, event_size: int, table_map: dict[int, Any], ctl_connection: Any,
                 **kwargs: Any) -> None:
    cache = getattr(ctl_connection, CACHE_ATTR, None)
    # only the settings the region streams with: names in the bytes (binlog_row_metadata=FULL),
    # no checksum check (a hit would copy the first one's verdict), no frozen schema
    if (not isinstance(cache, TableMapCache) or not kwargs.get("optional_meta_data")
            or kwargs.get("verify_checksum") or kwargs.get("freeze_schema")):
        _parse(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
        return
    raw = _peek(from_packet, event_size)
    if raw is None:
        _parse(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
        return
    post = kwargs.get("post_header_lengths")
    key = (ctl_connection._get_dbms(), kwargs.get("mysql_version"), bytes(post) if post else None, raw)
    hit = cache.get(key)
    if hit is not None:
        cache.touch(key)
        self.__dict__.update(hit)
        self.packet = from_packet
        self.table_map = table_map
        self.event_type = from_packet.event_type
        self.timestamp = from_packet.timestamp
        self.event_size = event_size
        self._ctl_connection = ctl_connection
        from_packet.advance(event_size)
        table_map[self.table_id] = self.table_obj
        return
    _parse(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
    meta = getattr(self, "optional_metadata", None)
    # not when the names came from the server instead of the bytes (no names in the metadata)
    if self._processed and getattr(self, "table_obj", None) is not None and getattr(meta, "column_name_list", None):
        cache.put(key, {k: v for k, v in self.__dict__.items() if k not in _PER_EVENT}, len(self.columns))


class TableMapCache(dict[Any, dict[str, Any]]):
    """Parsed table maps by key, least recently used first, bounded in entries
    and in columns."""

    def __init__(self) -> None:
        super().__init__()
        self.columns = 0
        self._sizes: dict[Any, int] = {}

    def touch(self, key: Any) -> None:
        self[key] = self.pop(key)  # to the end: most recently used

    def put(self, key: Any, value: dict[str, Any], columns: int) -> None:
        if key in self:
            self.columns -= self._sizes.pop(key)
            del self[key]
        while self and (len(self) >= MAX_ENTRIES or self.columns + columns > MAX_COLUMNS):
            old = next(iter(self))
            del self[old]
            self.columns -= self._sizes.pop(old)
        self[key] = value
        self._sizes[key] = columns
        self.columns += columns


def _peek(from_packet: Any, size: int) -> bytes | None:
    """The event's body without consuming it (the wrapper has just read the
    header: nothing is buffered on top of pymysql's packet)."""
    pkt = getattr(from_packet, "packet", None)
    data, pos = getattr(pkt, "_data", None), getattr(pkt, "_position", None)
    if not isinstance(data, (bytes, bytearray)) or not isinstance(pos, int) or pos + size > len(data):
        return None
    return bytes(data[pos:pos + size])


def install() -> None:
    """Wrap the library's parse (once)."""
    if TableMapEvent.__init__ is not _cached_init:
        TableMapEvent.__init__ = _cached_init


def connect(*args: Any, **kwargs: Any) -> Any:
    """``mysqlconn.connect`` for a binlog stream's connections, with a table-map
    cache on each (the stream's control connection is the one the parse sees)."""
    install()
    conn = mysqlconn.connect(*args, **kwargs)
    setattr(conn, CACHE_ATTR, TableMapCache())
    return conn
