"""capturer.util.mysqlconn against a real MariaDB: the same answers as pymysql,
read from the socket in far fewer pieces (each ``recv`` lets go of the GIL)."""

from __future__ import annotations

import socket
from typing import Any

import pymysql
import pytest

from capturer.util import mysqlconn
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


def test_big_reads_same_answers(target: MariaDBInstance, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = {"n": 0}
    real = socket.SocketIO.readinto

    def counting(self: Any, b: Any) -> Any:
        reads["n"] += 1
        return real(self, b)

    monkeypatch.setattr(socket.SocketIO, "readinto", counting)
    query = "SELECT seq, REPEAT(CHAR(65 + seq % 26), 200) FROM seq_1_to_20000"  # (the SEQUENCE engine)  # ~4 MB of rows
    got = {}
    for name, connect in (("pymysql", pymysql.connect), ("mysqlconn", mysqlconn.connect)):
        conn = connect(host="127.0.0.1", port=target.port, user="root", password="", database="mysql")
        try:
            with conn.cursor() as cur:
                reads["n"] = 0
                cur.execute(query)
                got[name] = (cur.fetchall(), reads["n"])
        finally:
            conn.close()
    assert got["mysqlconn"][0] == got["pymysql"][0] and len(got["pymysql"][0]) == 20000
    # 8 KiB pieces against 256 KiB ones (what arrives per recv varies: a wide margin)
    assert got["mysqlconn"][1] * 4 < got["pymysql"][1], (got["mysqlconn"][1], got["pymysql"][1])
