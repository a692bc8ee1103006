"""capturer.regions.mysql.tablemap against a real MariaDB binlog: table maps
parsed once per table definition give what the library's own parse of every
table map gives, and a DDL (a new column, a renamed one) is a new definition."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

from capturer.regions.mysql import tablemap
from capturer.util import mysqlconn
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


def _read(m: MariaDBInstance, wrapper: Callable[..., Any]) -> tuple[list[tuple[Any, ...]], Any]:
    s = BinLogStreamReader({"host": "127.0.0.1", "port": m.port, "user": "root", "password": ""}, server_id=4343,
                           blocking=False, resume_stream=True, log_file="mariadb-bin.000001", log_pos=4,
                           only_events=[WriteRowsEvent, UpdateRowsEvent], enable_logging=False,
                           pymysql_wrapper=wrapper)
    out = []
    try:
        for ev in s:
            t = ev.table_map[ev.table_id]
            rows = [r.get("values", r.get("after_values")) for r in ev.rows]
            out.append((t, ev.schema, ev.table, t.primary_key, [c.data for c in t.columns], rows))
        return out, getattr(s._ctl_connection, tablemap.CACHE_ATTR, None)
    finally:
        s.close()


def test_table_maps_parsed_once_per_definition(tmp_path: Path) -> None:
    m = MariaDBInstance(tmp_path / "src", server_id=7).start()
    try:
        m.execute("CREATE DATABASE d",
                  "CREATE TABLE d.t (id INT PRIMARY KEY, s VARCHAR(20) CHARACTER SET latin1, e ENUM('a','b'), "
                  "st SET('x','y'), dc DECIMAL(10,2), b BLOB, dt DATETIME(3), u BIGINT UNSIGNED)",
                  "CREATE TABLE d.`we``ird` (k VARCHAR(10) PRIMARY KEY, v TEXT)")
        c = m.connect()
        c.autocommit(False)
        with c.cursor() as cur:
            def txns(n: int, start: int, extra: str = "", more: tuple[Any, ...] = ()) -> None:
                for i in range(start, start + n):
                    cur.execute(f"INSERT INTO d.t VALUES (%s, %s, 'b', 'x,y', 1.5, %s, NOW(3), 18446744073709551615{extra})",
                                (i, f"é{i}", b"\x00\xff", *more))
                    cur.execute("INSERT INTO d.`we``ird` VALUES (%s, 'v')", (f"k{i}",))
                    cur.execute("UPDATE d.`we``ird` SET v = 'w' WHERE k = %s", (f"k{i}",))
                    c.commit()
            txns(5, 0)
            cur.execute("ALTER TABLE d.t ADD COLUMN z INT")
            txns(3, 100, ", %s", (7,))
            cur.execute("ALTER TABLE d.t CHANGE s s2 VARCHAR(20) CHARACTER SET latin1")  # only a name changes
            txns(2, 200, ", %s", (8,))
        c.close()
        plain, no_cache = _read(m, mysqlconn.connect)
        cached, cache = _read(m, tablemap.connect)
        after, no_cache2 = _read(m, mysqlconn.connect)  # installed now, but a stream without the cache parses as before
    finally:
        m.stop()
    assert no_cache is None and no_cache2 is None and len(plain) == 30
    # the same tables, keys, columns (names, types, charsets, enum/set values, ...) and rows
    assert [x[1:] for x in cached] == [x[1:] for x in plain] == [x[1:] for x in after]
    assert {tuple(col["name"] for col in x[4]) for x in cached if x[2] == "t"} == {
        ("id", "s", "e", "st", "dc", "b", "dt", "u"), ("id", "s", "e", "st", "dc", "b", "dt", "u", "z"),
        ("id", "s2", "e", "st", "dc", "b", "dt", "u", "z")}
    # the library makes a Table per table map (the server writes one per table per statement);
    # with the cache, one per definition: d.t three times (a column added, one renamed), `we``ird` once
    assert len({id(x[0]) for x in plain}) == 30
    assert len({id(x[0]) for x in cached}) == 4 and len(cache) == 4
