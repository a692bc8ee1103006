"""Partial row images (an update whose new image leaves columns out: an unchanged
TOASTed value of a PostgreSQL row gone since, MySQL binlog_row_image=MINIMAL):
no sender makes the absent columns up (issue 44)."""

from __future__ import annotations

import json
import logging
import threading
from types import SimpleNamespace
from typing import Any, cast

import pymysql
import pytest

from capturer.model import LsnPosition, RowChange, TableSchema, Txn
from capturer.regions.postgresql.region import PostgresRegion
from capturer.regions.postgresql.snapshot import PgSnapshot
from senders.kafka.format import change_events, sql_message
from senders.local.replay import rebuild
from senders.mysql.sender import Op, Worker
from senders.sqlbuild import build

T = TableSchema("d", "t", ("id", "n", "big"), ("id",))


def upd(before: dict[str, Any], after: dict[str, Any]) -> RowChange:
    return RowChange(T, "update", before, after)


PARTIAL_MOVE = upd({"id": 1}, {"id": 2, "n": 5})  # a key change whose image leaves out "big"
WHOLE_MOVE = upd({"id": 3}, {"id": 4, "n": 6, "big": "x" * 10})


class Cursor:
    """Records statements: an UPDATE matches ``found`` rows; an UPDATE or INSERT of a
    row whose key is in ``taken`` collides (ER_DUP_ENTRY)."""

    def __init__(self, found: int, taken: tuple[int, ...] = ()):
        self.found, self.taken = found, taken
        self.log: list[tuple[str, list[Any]]] = []
        self.pending: list[int] = []
        self.rowcount = 0

    def execute(self, sql: str, params: list[Any] | None = None) -> int:
        params = list(params or [])
        self.log.append((sql, params))
        if sql.startswith(("UPDATE", "INSERT")) and any(p in self.taken for p in params[:1]):
            raise pymysql.err.IntegrityError(1062, "Duplicate entry")
        n = sql.count(";\n") + 1
        self.pending = [self.found] * (n - 1)
        return self.found

    def nextset(self) -> bool:
        if not self.pending:
            return False
        self.rowcount = self.pending.pop(0)
        return True


class Counts:
    def __init__(self) -> None:
        self.counters: dict[str, int] = {}

    def count(self, what: str, n: int = 1) -> None:
        self.counters[what] = self.counters.get(what, 0) + n


def worker() -> Worker:
    w = Worker(cast(Any, Counts()), 0)
    w.pool.shutdown()
    return w


def verbs(cur: Cursor) -> list[str]:
    return [sql.split(" ", 1)[0] for sql, _ in cur.log]


def test_absent_names_the_columns_an_update_leaves_out() -> None:
    assert PARTIAL_MOVE.absent == ("big",)
    assert WHOLE_MOVE.absent == ()
    assert RowChange(T, "insert", None, {"id": 1}).absent == ()  # (an insert's missing column is its default)
    assert RowChange(T, "delete", {"id": 1}, None).absent == ()


def test_mysql_update_of_a_partial_image_that_finds_no_row_is_not_upserted(caplog: pytest.LogCaptureFixture) -> None:
    """The whole image that finds no row at its old key is upserted; the partial one
    is skipped, counted and logged with its table and key: never an INSERT with the
    absent column made up."""
    w = worker()
    cur = Cursor(found=0)
    run = [Op((1, "r", 0), PARTIAL_MOVE, "d", "t"), Op((1, "r", 1), WHOLE_MOVE, "d", "t")]
    with caplog.at_level(logging.WARNING):
        w._update(cur, run)
    assert verbs(cur) == ["UPDATE", "INSERT"]
    inserted = cur.log[1]
    assert "`big`" in inserted[0] and inserted[1][:3] == [4, 6, "x" * 10]  # only the whole image
    assert 2 not in inserted[1]
    assert cast(Any, w.s).counters == {"partial_skipped": 1, "upsert_fallbacks": 1}
    assert "d.t" in caplog.text and "'id': 2" in caplog.text and "big" in caplog.text


def test_mysql_partial_image_one_by_one_never_inserts_or_replaces() -> None:
    """The slow path (two updates of one row in a run, or a collision): a partial image
    that finds no row is skipped, and one whose new key is taken is neither replaced
    nor makes the old row go (no DELETE): the target keeps what it has."""
    w = worker()
    again = upd({"id": 2}, {"id": 2, "n": 7})  # the same row again: the run goes one by one
    cur = Cursor(found=0)
    w._update(cur, [Op((1, "r", 0), PARTIAL_MOVE, "d", "t"), Op((1, "r", 1), again, "d", "t")])
    assert verbs(cur) == ["UPDATE", "UPDATE"]
    assert cast(Any, w.s).counters == {"partial_skipped": 2}
    w = worker()
    cur = Cursor(found=1, taken=(2,))
    w._update_one_by_one(cur, [Op((1, "r", 0), PARTIAL_MOVE, "d", "t")])
    assert verbs(cur) == ["UPDATE"]
    assert cast(Any, w.s).counters == {"partial_skipped": 1}
    # a whole image still takes the REPLACE path
    w = worker()
    cur = Cursor(found=1, taken=(4,))
    w._update_one_by_one(cur, [Op((1, "r", 0), WHOLE_MOVE, "d", "t")])
    assert verbs(cur) == ["UPDATE", "DELETE", "REPLACE"]


def test_sql_text_of_a_partial_image_is_an_update_never_delete_and_insert() -> None:
    """``format=sql`` files and Kafka ``sql`` messages: a whole key change is DELETE +
    upsert; a partial one is UPDATE ... WHERE <old key> (both Kafka halves alike)."""
    whole, _ = build(WHOLE_MOVE, literal=True)
    assert whole.startswith("DELETE") and "INSERT" in whole
    partial, _ = build(PARTIAL_MOVE, literal=True)
    assert partial == "UPDATE `d`.`t` SET `id`=2, `n`=5 WHERE `id` <=> 1"
    txn = Txn("pg", 1 << 18, LsnPosition(1), [PARTIAL_MOVE])
    halves = [sql_message(txn, 0, PARTIAL_MOVE, op).decode() for op, _ in change_events(PARTIAL_MOVE)]
    assert halves == [partial, partial]
    assert not any("INSERT" in h or "DELETE" in h for h in halves)


def test_file_replay_keeps_the_absent_columns_of_a_row_it_holds() -> None:
    """The file's line leaves the column out (not null); reading it back keeps the value
    the row had, and a whole image replaces the row."""
    def line(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
        return {"db": "d", "table": "t", "op": op, "pk": ["id"], "before": before, "after": after}

    changes = [line("insert", None, {"id": 1, "n": 0, "big": "B"}),
               line("update", {"id": 1}, {"id": 2, "n": 5}),
               line("insert", None, {"id": 3, "n": 0, "big": "C"}),
               line("update", {"id": 3}, {"id": 3, "n": 1, "big": None})]
    state = rebuild(iter(json.loads(json.dumps(c)) for c in changes))
    assert state[("d", "t")] == {(2,): {"id": 2, "n": 5, "big": "B"}, (3,): {"id": 3, "n": 1, "big": None}}


class FakeRegion:
    """What ``PostgresRegion._await_visible`` uses: snapshots answered from a list."""

    def __init__(self, snapshots: list[str], wait_ms: int = 200):
        self.snapshots, self.queries = snapshots, 0
        self.cfg = SimpleNamespace(toast_wait_ms=wait_ms)
        self.ctx = SimpleNamespace(stop=threading.Event())
        self.where = "region pg"
        self._snapshot_fn = "pg_current_snapshot()"
        self._last_snap: PgSnapshot | None = None
        self._xid_checked: int | None = None
        self.toast_waits, self.toast_wait_ms, self.toast_wait_timeouts = 0, 0.0, 0

    def _query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        assert sql == "SELECT pg_current_snapshot()::text"
        self.queries += 1
        return [(self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0],)]

    def visible(self, xid: int) -> bool:
        return PostgresRegion._await_visible(cast(Any, self), xid)


def test_the_toast_fill_waits_once_per_transaction_until_it_is_visible() -> None:
    """A transaction in progress in the snapshot (its commit record sent, not visible
    yet) is looked at again until it is not; the answer holds for its other rows, and
    a later transaction the last snapshot already sees costs no query at all."""
    r = FakeRegion(["100:102:100", "100:102:100", "101:101:"])  # xid 100 in progress twice, then done
    assert r.visible(100) and r.queries == 3
    assert r.toast_waits == 1 and r.toast_wait_ms > 0 and r.toast_wait_timeouts == 0
    assert r.visible(100) and r.queries == 3  # its next rows: no query
    r.snapshots = ["105:105:"]
    assert r.visible(99) and r.queries == 3  # below the last snapshot's xmin: seen already
    assert r.visible(103) and r.queries == 4 and r.toast_waits == 1  # newer: one look, visible at once
    r = FakeRegion(["100:100:"])  # at xmax: not completed yet in that snapshot
    assert r.visible(100) is False and r.toast_wait_timeouts == 1 and r.toast_waits == 1
    assert 150 <= r.toast_wait_ms < 2000
    assert r.visible(100) and r.queries > 1  # (given up once for the transaction: its other rows do not wait)
