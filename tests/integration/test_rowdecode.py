"""The fast row decoder gives exactly the library's output, on every column type."""

from __future__ import annotations

import datetime as dt
import decimal
import random
from pathlib import Path
from typing import Any

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from capturer.regions.mysql.rowdecode import binary_columns, c_decoder_built, fast_rows, normalise_library_row
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration

GOLDEN = """CREATE TABLE g.t (
  id INT PRIMARY KEY, ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  f FLOAT, d DOUBLE, d1 DECIMAL(5,0), d2 DECIMAL(10,9), d3 DECIMAL(20,6), d4 DECIMAL(65,30), d5 DECIMAL(4,2),
  dt0 DATETIME, dt3 DATETIME(3), dt6 DATETIME(6), ts0 TIMESTAMP NULL, ts2 TIMESTAMP(2) NULL, ts6 TIMESTAMP(6) NULL,
  t0 TIME, t1 TIME(1), t4 TIME(4), t6 TIME(6), da DATE, y YEAR,
  c CHAR(10), vc VARCHAR(20), vl VARCHAR(400), lat VARCHAR(20) CHARACTER SET latin1, tx TEXT, mt MEDIUMTEXT,
  bl BLOB, lb LONGBLOB, bn BINARY(4), vb VARBINARY(300), j JSON,
  e ENUM('a','b','c'), s SET('x','y','z'), b1 BIT(1), b9 BIT(9), b64 BIT(64), g POINT NULL
) DEFAULT CHARSET=utf8mb4"""

COLS = ["ti", "tiu", "si", "siu", "mi", "miu", "i", "iu", "bi", "biu", "f", "d", "d1", "d2", "d3", "d4", "d5",
        "dt0", "dt3", "dt6", "ts0", "ts2", "ts6", "t0", "t1", "t4", "t6", "da", "y", "c", "vc", "vl", "lat", "tx",
        "mt", "bl", "lb", "bn", "vb", "j", "e", "s", "b1", "b9", "b64"]


def rand_row(rng: random.Random, i: int) -> list[Any]:
    def n(v: Any) -> Any:
        return None if rng.random() < 0.1 else v

    def dec(p: int, s: int) -> decimal.Decimal:
        digits = rng.randrange(10 ** p)
        v = decimal.Decimal(digits).scaleb(-s)
        return -v if rng.random() < 0.5 else v

    def tm(fsp: int) -> str:
        sign = "-" if rng.random() < 0.3 else ""
        frac = f".{rng.randrange(10 ** fsp):0{fsp}d}" if fsp else ""
        return f"{sign}{rng.randrange(839):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}{frac}"

    base = dt.datetime(1000, 1, 1) + dt.timedelta(seconds=rng.randrange(int(9e9) * 28))
    tsb = dt.datetime(1970, 1, 2) + dt.timedelta(seconds=rng.randrange(int(2.1e9)))
    return [
        n(rng.randrange(-128, 128)), n(rng.randrange(256)), n(rng.randrange(-2**15, 2**15)), n(rng.randrange(2**16)),
        n(rng.randrange(-2**23, 2**23)), n(rng.randrange(2**24)), n(rng.randrange(-2**31, 2**31)), n(rng.randrange(2**32)),
        n(rng.randrange(-2**63, 2**63)), n(rng.randrange(2**64)), n(rng.uniform(-1e30, 1e30)), n(rng.uniform(-1e300, 1e300)),
        n(dec(5, 0)), n(dec(10, 9)), n(dec(20, 6)), n(dec(65, 30)), n(dec(4, 2)),
        n(base.replace(microsecond=0)), n(base.replace(microsecond=rng.randrange(1000) * 1000)),
        n(base.replace(microsecond=rng.randrange(10**6))),
        n(tsb.replace(microsecond=0)), n(tsb.replace(microsecond=rng.randrange(100) * 10000)),
        n(tsb.replace(microsecond=rng.randrange(10**6))),
        n(tm(0)), n(tm(1)), n(tm(4)), n(tm(6)), n(base.date()), n(rng.randrange(1901, 2156)),
        n(rng.choice(["", "a", "abc  ", "é😀"])), n("v" * rng.randrange(20)), n("ü" * rng.randrange(400)),
        n(rng.choice(["café", "naïve", ""])), n("text " * rng.randrange(100)), n("😀" * rng.randrange(3000)),
        n(bytes(rng.randrange(256) for _ in range(rng.randrange(50)))), n(b"\x00\xff" * rng.randrange(5000)),
        n(bytes(rng.randrange(256) for _ in range(4))), n(bytes(rng.randrange(256) for _ in range(rng.randrange(300)))),
        n(f'{{"k": [{i}, "x"]}}'), n(rng.choice(["a", "b", "c"])), n(rng.choice(["", "x", "x,z", "x,y,z"])),
        n(rng.randrange(2)), n(rng.randrange(2**9)), n(rng.randrange(2**64)),
    ]


def canon(rows: list[Any]) -> list[Any]:
    return [[(k, type(v).__name__, repr(v)) for k, v in sorted(r.items())] if r is not None else None for r in rows]


def read(m: MariaDBInstance, fast: bool, use_c: bool = False) -> list[Any]:
    s = BinLogStreamReader({"host": "127.0.0.1", "port": m.port, "user": "root", "passwd": ""}, server_id=4321,
                           blocking=False, resume_stream=True, log_file="mariadb-bin.000001", log_pos=4,
                           only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent], enable_logging=False)
    out: list[Any] = []
    try:
        for ev in s:
            if ev.table != "t":
                continue
            upd = isinstance(ev, UpdateRowsEvent)
            if fast:
                rows = fast_rows(ev, upd, use_c)
                assert rows is not None, "the fast decoder refused a supported table"
                for a, b in rows:
                    out += [a, b]
            else:
                binary = binary_columns(ev.columns)
                for r in ev.rows:
                    if upd:
                        out += [normalise_library_row(r["before_values"], r["before_none_sources"], binary),
                                normalise_library_row(r["after_values"], r["after_none_sources"], binary)]
                    else:
                        out += [normalise_library_row(r["values"], r["none_sources"], binary), None]
    finally:
        s.close()
    return out


def mask_negative_fractional_time(rows: list[Any]) -> list[Any]:
    out = []
    for r in rows:
        if r is not None:
            r = {k: ("<neg frac>" if isinstance(v, dt.timedelta) and v < dt.timedelta(0)
                     and (v.microseconds or (-v).microseconds) else v) for k, v in r.items()}
        out.append(r)
    return out


def test_fast_decoder_equals_library_on_every_type(tmp_path: Path) -> None:
    m = MariaDBInstance(tmp_path / "m", server_id=3).start()
    try:
        m.execute("CREATE DATABASE g", GOLDEN)
        rng = random.Random(7)
        c = m.connect()
        with c.cursor() as cur:
            cur.execute("SET time_zone='+00:00'")
            ph = ", ".join(["%s"] * (len(COLS) + 1))
            for i in range(400):
                cur.execute(f"INSERT INTO g.t (id, {', '.join(COLS)}) VALUES ({ph})", [i, *rand_row(rng, i)])
            cur.execute("UPDATE g.t SET g = POINT(1.5, -2) WHERE id < 5")
            cur.execute("UPDATE g.t SET d4 = -d4, s = '', t6 = '-00:00:00.000001' WHERE id % 3 = 0")
            cur.execute("INSERT INTO g.t (id) VALUES (1000)")  # all NULL
            cur.execute("DELETE FROM g.t WHERE id % 7 = 0")
        c.close()
        lib = read(m, fast=False)
        fast = read(m, fast=True, use_c=False)
        assert len(lib) == len(fast) > 800
        # python-mysql-replication misreads negative TIME values with a fraction
        # ('-01:00:00.25' as -00:59:59.75): those are checked against the server below
        assert canon(mask_negative_fractional_time(fast)) == canon(mask_negative_fractional_time(lib))
        # the C build of the decoder (setup.py builds it; CI has a compiler) gives the same
        assert c_decoder_built(), "capturer._fastrows was not built"
        fast_c = read(m, fast=True, use_c=True)
        assert canon(fast_c) == canon(fast)
        # TIME values: what the server itself reads back (the final image of each row)
        final: dict[int, dict[str, Any]] = {}
        for r in fast:
            if r is not None:
                final[r["id"]] = r
        c = m.connect()
        with c.cursor() as cur:
            cur.execute("SELECT id, t0, t1, t4, t6 FROM g.t")
            server = {row[0]: row[1:] for row in cur.fetchall()}
        c.close()
        assert server and all(tuple(final[i][k] for k in ("t0", "t1", "t4", "t6")) == v for i, v in server.items())
        assert any(v[2] is not None and v[2] < dt.timedelta(0) and v[2].microseconds for v in server.values())
        # the golden rows really exercise the edge cases
        flat = [r for r in lib if r is not None]
        assert any(r["s"] == set() for r in flat)
        assert any(isinstance(r["t6"], dt.timedelta) and r["t6"] < dt.timedelta(0) for r in flat)
        assert any(r["g"] is not None for r in flat)
        assert any(r["bl"] == b"" for r in flat)
    finally:
        m.stop()


def test_latin1_bytes_cp1252_leaves_undefined(tmp_path: Path) -> None:
    """MySQL's latin1 stores any byte; Python's cp1252 (what pymysql maps latin1 to)
    refuses 0x81 0x8D 0x8F 0x90 0x9D, so the library raises on such a row. The
    fast decoder maps them as MySQL does (to U+0081 ...), on both builds."""
    m = MariaDBInstance(tmp_path / "m", server_id=3).start()
    try:
        m.execute("CREATE DATABASE g",
                  "CREATE TABLE g.t (id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET latin1, t TEXT CHARACTER SET latin1)",
                  "INSERT INTO g.t VALUES (1, X'41818D8F909D80E9', X'9D')")
        want = [{"id": 1, "v": "A\x81\x8d\x8f\x90\x9d€é", "t": "\x9d"}, None]
        assert read(m, fast=True, use_c=False) == want
        assert read(m, fast=True, use_c=True) == want
        c = m.connect()
        with c.cursor() as cur:  # and that is what MySQL itself reads back
            cur.execute("SELECT v, t FROM g.t")
            assert cur.fetchone() == ("A\x81\x8d\x8f\x90\x9d€é", "\x9d")
        c.close()
    finally:
        m.stop()
