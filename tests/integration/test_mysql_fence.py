"""High availability at a MySQL target: a new active capturer does not wait for a
frozen deposed one (issue 45, item 5).

A capturer frozen (SIGSTOP, a paused VM) inside a chunk's transaction holds the
target's fence row in share mode; the new active capturer's claim of the row used to
wait for that transaction until the frozen connection timed out (15 s and more: the
target received nothing meanwhile). Now the new active ends the deposed capturer's
connections (``<meta_database>.sessions``) before it claims: it writes within a
second, and the frozen one, when it wakes, finds its connection gone and then the
fence row's newer epoch: nothing of its chunk is committed.
"""

from __future__ import annotations

import time
from typing import Any

import pymysql
import pytest

from capturer.errors import SinkError
from capturer.model import RowChange, TableSchema, Txn
from devtools.local_mariadb import MariaDBInstance
from senders.mysql.sender import MySQLSender

pytestmark = pytest.mark.integration

S = TableSchema("fdb", "t", ("id", "v"), ("id",))


def sender(target: MariaDBInstance, epoch: int) -> MySQLSender:
    o: dict[str, Any] = {k.name: k.default for k in MySQLSender.KEYS}
    o.update(host="127.0.0.1", port=target.port, user="root", threadnum=2, ha_epoch=epoch, ha_lease=4)
    return MySQLSender("mysql", o)


def txn(ts: int, i: int, v: str) -> Txn:
    return Txn("r", ts, None, (RowChange(S, "insert", None, {"id": i, "v": v}),))


def test_a_new_active_ends_a_frozen_deposed_capturers_transactions_instead_of_waiting(
        target: MariaDBInstance) -> None:
    target.execute("CREATE DATABASE fdb", "CREATE TABLE fdb.t (id INT PRIMARY KEY, v VARCHAR(20))")
    old = sender(target, 1)
    old.open()
    old.resume_key()
    old.send([txn(10, 1, "old")])
    # the old capturer "freezes" inside a chunk: the fence row read in share mode, a row written, no commit
    w = old.workers[0]
    conn = w.connect()
    old.fence_check(conn)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO fdb.t VALUES (2, 'frozen')")

    new = sender(target, 2)
    t0 = time.monotonic()
    new.open()  # ends the old one's connections, then claims the fence row
    claimed = time.monotonic() - t0
    new.resume_key()
    new.send([txn(11, 3, "new")])
    took = time.monotonic() - t0
    assert claimed < 3 and took < 5, (claimed, took)  # not the old connection's time-out (15 s and more)
    assert new.counters["deposed_sessions_ended"] >= 1

    # the frozen one wakes: its transaction is gone (rolled back), and it may write nothing more
    with pytest.raises(pymysql.err.MySQLError):
        conn.commit()
    with pytest.raises(SinkError):
        old.send([txn(12, 4, "late")])
    c = target.connect()
    with c.cursor() as cur:
        cur.execute("SELECT id, v FROM fdb.t ORDER BY id")
        rows = cur.fetchall()
        cur.execute("SELECT epoch FROM _capturer.fence WHERE sender = 'mysql'")
        (epoch,) = cur.fetchone()
        cur.execute("SELECT COUNT(*) FROM _capturer.sessions WHERE sender = 'mysql' AND epoch < 2")
        (stale,) = cur.fetchone()
    c.close()
    assert rows == ((1, "old"), (3, "new")), rows  # nothing of the frozen chunk, nothing after it
    assert int(epoch) == 2
    assert stale <= 2  # (the old one noted its new connections when it woke; the next takeover ends them)
    old.close()
    new.close()
