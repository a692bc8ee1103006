"""The MySQL sender's phases (senders/mysql/sender.py ``_send``): the next phase is
placed while the workers apply one, but handed to them only after it committed.

The workers here are fakes that record what they were given and when (no target
needed: what is checked is the ordering between phases, which the integration
tests against real MariaDB servers cannot observe directly)."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from capturer.errors import SinkError
from capturer.model import Ddl, RowChange, TableSchema, Txn
from senders.mysql.sender import MySQLSender, Op

S = TableSchema("d", "t", ("id", "v"), ("id",))


Event = tuple[str, int, float]  # ("start" | "end", phase, time)


class FakeWorker:
    def __init__(self, s: Any, index: int, fail_on: int | None, delay: float):
        self.s, self.index, self.fail_on, self.delay = s, index, fail_on, delay
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.applied: list[int] = []  # ids, in the order applied
        self.busy = False

    def submit(self, units: list[list[Op]], atomic: bool, mark: Any = None) -> Future[int]:
        self.busy = True
        return self.pool.submit(self.apply, units, self.s.counters["phases"])

    def apply(self, units: list[list[Op]], phase: int) -> int:
        ids = [op.ch.after["id"] for unit in units for op in unit]
        self.s.log.append(("start", phase, time.perf_counter()))
        time.sleep(self.delay)
        try:
            if self.fail_on is not None and self.fail_on in ids:
                raise SinkError("boom", retriable=True)
            self.applied += ids
            return len(ids)
        finally:
            self.s.log.append(("end", phase, time.perf_counter()))
            self.busy = False

    def connect(self) -> None:
        return None

    def close(self) -> None:
        self.pool.shutdown()


def sender(n: int = 3, phase_rows: int = 10, fail_on: int | None = None, delay: float = 0.02) -> Any:
    opts = {k.name: k.default for k in MySQLSender.KEYS}
    opts.update(host="h", user="u", threadnum=n, meta_database="")
    s = MySQLSender("m", opts)
    s.log = []
    s.workers = [FakeWorker(s, i, fail_on, delay) for i in range(n)]
    s.phase_rows = phase_rows
    s._progress_loaded = True
    return s


def txns(ids: list[int], ts0: int = 100) -> list[Txn]:
    return [Txn("r", ts0 + i, None, (RowChange(S, "insert", None, {"id": k, "v": k}),)) for i, k in enumerate(ids)]


def phases(log: list[Event]) -> list[tuple[float, float]]:
    """(first start, last end) of each phase, in phase order."""
    nums = sorted({p for _, p, _ in log})
    return [(min(t for k, p, t in log if p == n and k == "start"), max(t for k, p, t in log if p == n and k == "end"))
            for n in nums]


def test_phases_never_overlap_and_every_row_is_applied_in_order_per_key() -> None:
    s = sender()
    ids = list(range(45)) + list(range(10))  # later updates of the first keys (a new phase each time)
    s.send(txns(ids))
    ps = phases(s.log)
    assert len(ps) >= 5  # 55 rows in phases of 10
    for (_, end), (start, _) in zip(ps, ps[1:]):
        assert start >= end  # the next phase starts only after every worker ended the one before
    applied = [k for w in s.workers for k in w.applied]
    assert sorted(applied) == sorted(ids)
    for w in s.workers:  # a key's second change after its first, on the worker holding the key
        for k in set(w.applied):
            assert w.applied.count(k) == ids.count(k)


def test_the_next_phase_is_placed_while_one_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    s = sender(delay=0.2)
    placed_during: list[bool] = []
    import senders.mysql.sender as ms

    # the placing of each change: its conflict keys (the Python path), or the C call that places a run of
    # changes (args[7]: how many the phase held before it, its result[2]: after)
    if ms._place_txns is None:
        real = ms.conflict_keys

        def spy(*args: Any) -> Any:
            placed_during.append(any(w.busy for w in s.workers))
            return real(*args)

        monkeypatch.setattr(ms, "conflict_keys", spy)
    else:
        real_run = ms._place_txns

        def spy_run(*args: Any) -> Any:
            busy = any(w.busy for w in s.workers)
            out = real_run(*args)
            placed_during.extend([busy] * (out[2] - args[7]))
            return out

        monkeypatch.setattr(ms, "_place_txns", spy_run)
    s.send(txns(list(range(30))))
    # the rows of phase 2 and 3 were placed while the workers held phase 1 or 2
    assert sum(placed_during[10:]) >= 15 and not any(placed_during[:10])


def test_a_failed_phase_stops_the_batch_before_the_next_one_starts() -> None:
    s = sender(fail_on=12)  # in the second phase
    with pytest.raises(SinkError, match="boom"):
        s.send(txns(list(range(40))))
    applied = {k for w in s.workers for k in w.applied}
    assert applied >= set(range(10))  # phase 1 committed
    assert not applied & set(range(20, 40))  # phase 3 and 4 never started


def test_a_ddl_waits_for_the_phase_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    s = sender(delay=0.1)
    seen: list[int] = []

    def ddl(d: Ddl, key: Any = None) -> None:
        seen.append(sum(len(w.applied) for w in s.workers))

    monkeypatch.setattr(s, "_apply_ddl", ddl)
    batch = txns(list(range(15))) + [Txn("r", 500, None, (), ddl=Ddl("d", "ALTER TABLE t ADD c INT"))] + \
        txns(list(range(15, 20)), 600)
    s.send(batch)
    assert seen == [15]  # every row before the DDL was applied when it ran
    assert sum(len(w.applied) for w in s.workers) == 20


# --- a worker's statements and commits (a recording connection instead of a server) ----------------

class RecConn:
    """Records the statements of each target transaction; ``fail_at``: the statement
    numbers that raise a deadlock (1213) once."""

    server_status = 0

    def __init__(self, fail_at: set[int] = frozenset()):  # type: ignore[assignment]
        self.fail_at, self.n = set(fail_at), 0
        self.pending: list[tuple[str, Any]] = []
        self.committed: list[list[tuple[str, Any]]] = []

    def escape(self, v: Any) -> str:
        import pymysql

        return pymysql.connect(defer_connect=True, charset="utf8mb4").escape(v)

    def cursor(self) -> RecConn:
        return self

    def __enter__(self) -> RecConn:
        return self

    def __exit__(self, *a: Any) -> None:
        return None

    @property
    def connection(self) -> RecConn:
        return self

    def execute(self, sql: str, params: Any = None) -> int:
        import pymysql

        if sql.startswith("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS"):
            return 0  # (the worker's look at a table's NOT NULL date columns: none here; not a statement recorded)
        self.n += 1
        if self.n in self.fail_at:
            self.fail_at.discard(self.n)
            raise pymysql.err.OperationalError(1213, "Deadlock found")
        self.pending.append((sql, params))
        return 1

    def fetchall(self) -> list[Any]:
        return []

    def commit(self) -> None:
        self.committed.append(self.pending)
        self.pending = []

    def rollback(self) -> None:
        self.pending = []


def real_worker(conn: RecConn, commit_rows: int = 5000) -> Any:
    from senders.mysql.sender import Worker

    s = sender(n=1)
    s.commit_rows = commit_rows
    w = Worker(s, 0)
    w.conn = conn
    return w


KEYLESS = TableSchema("d", "log", ("msg", "n"), (), (), (15, 3))


def test_a_deadlock_retry_does_not_apply_committed_chunks_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A keyless table's rows in 3 commits; the second one deadlocks once: its rows
    and the third's are applied once each, the first's are not applied again."""
    import senders.mysql.sender as ms

    monkeypatch.setattr(ms.time, "sleep", lambda s: None)
    conn = RecConn(fail_at={2})
    w = real_worker(conn, commit_rows=4)
    w.s.meta_db = ""
    units = [[Op((1, "r", i), RowChange(KEYLESS, "insert", None, {"msg": f"m{i}", "n": i}), "d", "log")]
             for i in range(12)]
    assert w.apply(units, atomic=False) == 12
    inserted = [sql for tx in conn.committed for sql, _ in tx]
    for i in range(12):
        assert sum(f"'m{i}'" in sql for sql in inserted) == 1, i
    assert w.s.counters["deadlock_retries"] == 1


def test_runs_group_by_table_kind_and_columns_and_pick_the_literal_path_only_without_conversions() -> None:
    from capturer.model.encode import T_BIT

    conn = RecConn()
    w = real_worker(conn)
    bits = TableSchema("d", "t", ("id", "v"), ("id",), (), (3, T_BIT))
    plain = TableSchema("d", "t", ("id", "v"), ("id",), (), (3, 3))
    ops = [
        Op((1, "r", 0), RowChange(plain, "insert", None, {"id": 1, "v": 1}), "d", "t"),
        Op((1, "r", 1), RowChange(plain, "insert", None, {"v": 2, "id": 2}), "d", "t"),  # other order: same run
        Op((1, "r", 2), RowChange(plain, "delete", {"id": 1, "v": 1}, None), "d", "t"),  # another kind
        Op((1, "r", 3), RowChange(plain, "insert", None, {"id": 3, "v": 3}), "d", "t2"),  # another table
        Op((1, "r", 4), RowChange(plain, "insert", None, {"id": 4, "v": 4}), "d", "t2"),
        Op((1, "r", 5), RowChange(bits, "insert", None, {"id": 5, "v": "101"}), "d", "t2"),  # BIT: converted
        Op((1, "r", 6), RowChange(S, "insert", None, {"id": 6}), "d", "t2"),  # other columns, no types
    ]
    w._apply_ops(conn, ops)
    stmts = conn.pending
    assert len(stmts) == 4
    (s1, p1), (s2, p2), (s3, p3), (s4, p4) = stmts
    assert "`d`.`t` " in s1 and "(1, 1), (2, 2)" in s1 and p1 is None  # literal: values in the text
    assert s2 == "DELETE FROM `d`.`t` WHERE `id` IN ((1))" and p2 is None  # the same text as with parameters
    # one value needs sql_param (BIT '101' -> 5): the whole run goes with parameters
    assert "`d`.`t2` " in s3 and p3 == [3, 3, 4, 4, 5, 5]
    assert "(`id`) VALUES (%s)" in s4 and p4 == [6]  # other columns; types unknown: parameters


def test_status_names_what_the_sender_waits_for_at_the_target() -> None:
    """A statement, commit or DDL a worker has had at the target for a second or more (a row lock held
    there by another session, a hung server) is what ``/status`` says the sender waits for."""
    s = sender(n=3)
    s.options.update(port=3307)
    st = s.status()
    assert st["waiting_for"] is None and st["waiting_seconds"] is None and st["workers_waiting"] == []
    now = time.monotonic()
    s.workers[0].doing = (now - 0.2, "COMMIT of 2 change(s)")  # (a short one is not a wait)
    s.workers[2].doing = (now - 7.5, "update into `d`.`t` (3 row(s))")
    s.workers[1].doing = (now - 2.0, "insert into `d`.`u` (1 row(s))")
    st = s.status()
    assert st["waiting_for"] == "the target h:3307: worker 2's update into `d`.`t` (3 row(s)); 1 more worker(s) waiting"
    assert st["waiting_seconds"] >= 7.5
    assert [w["worker"] for w in st["workers_waiting"]] == [2, 1]
    for w in s.workers:
        w.doing = None
    assert s.status()["waiting_for"] is None
    for w in s.workers:
        w.close()
