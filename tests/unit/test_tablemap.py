"""capturer.regions.mysql.tablemap on table map events made byte by byte: the
same bytes give the same parsed table (one object), other bytes under the same
table id (ids come back after a server restart) a new parse, and a stream
without the cache parses every time. (The real thing: tests/integration/test_tablemap.py.)"""

from __future__ import annotations

import struct
from typing import Any

import pymysqlreplication.row_event as row_event
from pymysql.protocol import MysqlPacket
from pymysqlreplication import constants
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent

from capturer.regions.mysql import tablemap

COLUMN_NAME = 4  # optional metadata field: the column names


class Ctl:
    charset = "utf8"

    def __init__(self, cache: bool, dbms: str = "mysql"):
        self.dbms = dbms
        if cache:
            setattr(self, tablemap.CACHE_ATTR, tablemap.TableMapCache())

    def _get_dbms(self) -> str:
        return self.dbms


def body(table_id: int, names: list[str], with_names: bool = True) -> bytes:
    """A table map of INT columns, then binlog_row_metadata=FULL's names."""
    n = len(names)
    b = table_id.to_bytes(6, "little") + struct.pack("<H", 1)
    b += b"\x01d\x00" + b"\x01t\x00" + bytes([n]) + bytes([constants.FIELD_TYPE.LONG] * n) + b"\x00"
    b += bytes([0] * ((n + 7) // 8))  # null bitmap
    if with_names:
        names_tlv = b"".join(bytes([len(x)]) + x.encode() for x in names)
        b += bytes([COLUMN_NAME, len(names_tlv)]) + names_tlv
    return b


def parse(raw: bytes, ctl: Ctl, table_map: dict[int, Any], freeze: bool = False, verify: bool = False,
          meta: bool = True, post: bytes | None = None) -> tuple[Any, BinLogPacketWrapper]:
    tablemap.install()
    checksum = b"\0\0\0\0"
    header = struct.pack("<cIBIIIH", b"\0", 0, constants.TABLE_MAP_EVENT, 1, 19 + len(raw) + 4, 4, 0)
    w = BinLogPacketWrapper(MysqlPacket(header + raw + checksum, 0), table_map, ctl, (8, 0, 0), True,
                            frozenset([TableMapEvent]), None, None, None, None, freeze, False, verify,
                            meta, False, False, post)
    return w.event, w


def test_same_bytes_same_table_other_bytes_a_new_parse() -> None:
    ctl, tm = Ctl(cache=True), {}
    a, wa = parse(body(5, ["id", "name"]), ctl, tm)
    b, wb = parse(body(5, ["id", "name"]), ctl, tm)
    assert [c.name for c in a.get_table().columns] == ["id", "name"]
    assert b.get_table() is a.get_table()
    assert (b.table_id, b.schema, b.table, b.column_count) == (5, "d", "t", 2)
    assert wb.bytes_to_read() == wa.bytes_to_read() == 4  # the body read either way, up to the checksum
    # the same table id, a renamed column (a restarted server gives ids out again)
    c, _ = parse(body(5, ["id", "nom"]), ctl, tm)
    assert [col.name for col in c.get_table().columns] == ["id", "nom"] and c.get_table() is not a.get_table()
    d, _ = parse(body(6, ["id", "name"]), ctl, tm)  # another id: its own entry
    assert d.table_id == 6 and d.get_table() is not a.get_table()
    assert len(getattr(ctl, tablemap.CACHE_ATTR)) == 3


def test_no_cache_without_names_or_on_a_stream_without_one() -> None:
    ctl = Ctl(cache=True)
    # no names in the metadata: the library asks the server (here: nobody answers); never cached
    raw = body(7, ["a", "b"], with_names=False)
    real = row_event.fetch_column_names
    row_event.fetch_column_names = lambda *a, **k: ["x", "y"]  # type: ignore[assignment]
    try:
        e1, _ = parse(raw, ctl, {})
        e2, _ = parse(raw, ctl, {})
    finally:
        row_event.fetch_column_names = real  # type: ignore[assignment]
    assert [c.name for c in e1.get_table().columns] == ["x", "y"]
    assert e2.get_table() is not e1.get_table() and getattr(ctl, tablemap.CACHE_ATTR) == {}
    plain = Ctl(cache=False)
    p1, _ = parse(body(5, ["id"]), plain, {})
    p2, _ = parse(body(5, ["id"]), plain, {})
    assert p1.get_table() is not p2.get_table() and p1.get_table() == p2.get_table()


def test_bounded_the_oldest_definition_goes(monkeypatch: Any) -> None:
    monkeypatch.setattr(tablemap, "MAX_ENTRIES", 2)
    ctl, tm = Ctl(cache=True), {}
    first, _ = parse(body(1, ["a"]), ctl, tm)
    for i in (2, 3):
        parse(body(i, ["a"]), ctl, tm)
    cache = getattr(ctl, tablemap.CACHE_ATTR)
    assert len(cache) == 2 and [k[-1][:6] for k in cache] == [(2).to_bytes(6, "little"), (3).to_bytes(6, "little")]
    again, _ = parse(body(1, ["a"]), ctl, tm)  # parsed anew, correctly
    assert again.get_table() is not first.get_table() and [c.name for c in again.get_table().columns] == ["a"]


def test_only_with_the_regions_settings_and_keyed_by_what_the_parse_depends_on(monkeypatch: Any) -> None:
    raw = body(9, ["id", "v"])
    # a checksum check, no metadata switch, a frozen schema: the library's parse every time, nothing kept
    monkeypatch.setattr(row_event, "fetch_column_names", lambda *a, **k: ["id", "v"])
    for kw in ({"verify": True}, {"meta": False}, {"freeze": True}):
        ctl = Ctl(cache=True)
        e1, _ = parse(raw, ctl, {}, **kw)
        e2, _ = parse(raw, ctl, {}, **kw)
        assert e1.get_table() is not e2.get_table() and len(getattr(ctl, tablemap.CACHE_ATTR)) == 0, kw
    # the same bytes from a server of another kind, or after another format description: a parse of their own
    mysql, mariadb = Ctl(cache=True), Ctl(cache=True, dbms="mariadb")
    shared = getattr(mysql, tablemap.CACHE_ATTR)
    setattr(mariadb, tablemap.CACHE_ATTR, shared)
    post = bytearray(41)
    post[constants.TABLE_MAP_EVENT - 1] = 8
    tables = [parse(raw, c, {}, post=p)[0].get_table() for c in (mysql, mariadb) for p in (None, bytes(post))]
    assert len({id(t) for t in tables}) == 4 and len(shared) == 4
    # a mock connection (any attribute exists) is not a cache
    class Loose(Ctl):
        def __getattr__(self, name: str) -> Any:
            return {}
    e1, _ = parse(raw, Loose(cache=False), {})
    assert [c.name for c in e1.get_table().columns] == ["id", "v"]


def test_least_recently_used_goes_first_and_columns_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(tablemap, "MAX_COLUMNS", 5)
    ctl = Ctl(cache=True)
    a, _ = parse(body(1, ["a", "b"]), ctl, {})
    parse(body(2, ["a", "b"]), ctl, {})
    assert parse(body(1, ["a", "b"]), ctl, {})[0].get_table() is a.get_table()  # 1 is now the most recent
    parse(body(3, ["a", "b"]), ctl, {})  # 6 columns > 5: the least recently used (2) goes
    cache = getattr(ctl, tablemap.CACHE_ATTR)
    assert [k[-1][:6] for k in cache] == [(1).to_bytes(6, "little"), (3).to_bytes(6, "little")] and cache.columns == 4
    parse(body(4, ["a", "b", "c", "d", "e", "f"]), ctl, {})  # wider than the bound alone: kept, alone
    assert len(cache) == 1 and cache.columns == 6
