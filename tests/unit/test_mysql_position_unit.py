"""The MySQL sender's position in the target (senders/mysql/position.py, ``resume_key``),
without a server.

* ``whole_key``: a phase counts only when every worker with a share wrote its row
  for *that* phase of *that* run;
* the sender's phases carry the right marks (a phase ending inside a transaction
  covers the transaction before it; a DDL is a phase of one);
* the real ``Worker`` writes its row in the transaction of its share's last rows,
  once (also when that transaction deadlocks and is redone);
* a simulated target (workers that commit chunk by chunk, each chunk's rows with
  its position row at once) crashed at every commit of a load: what ``resume_key``
  then reads is always held whole, and the rerun from it completes the target
  without re-applying anything at or below it.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from capturer.errors import SinkError
from capturer.model import Ddl, RowChange, StreamKey, TableSchema, Txn, stream_key
from senders.mysql import position
from senders.mysql.position import Mark, Row, whole_key
from senders.mysql.sender import MySQLSender, Op

S = TableSchema("d", "t", ("id", "v"), ("id",))
KEYLESS = TableSchema("d", "log", ("msg", "n"), (), (), (15, 3))


def k(ts: int, region: str = "r", sub: int = 0) -> StreamKey:
    return (ts, region, sub)


# --- whole_key ------------------------------------------------------------------------------------

def test_whole_key_of_no_rows_is_none() -> None:
    assert whole_key([]) is None


def test_a_phase_is_whole_only_when_every_worker_with_a_share_wrote_its_row() -> None:
    # phase 7 of run 1 had 3 workers; two wrote their row, the third did not (yet)
    rows = [Row(0, 1, 7, 3, k(10), k(20)), Row(2, 1, 7, 3, k(10), k(20)), Row(1, 1, 6, 2, k(5), k(10))]
    assert whole_key(rows) == k(10)  # phase 6 is whole (every row's "before" says so), 7 is not
    rows[2] = Row(1, 1, 7, 3, k(10), k(20))
    assert whole_key(rows) == k(20)


def test_rows_of_another_run_never_complete_a_phase() -> None:
    """Run 1 died in its phase 4 (worker 0 committed its share, worker 1 did not); run 2,
    starting from k(10), cut the stream into other phases, its phase 4 too. Worker 1's
    row for run 2's phase 4 plus worker 0's stale row of run 1 are two rows "of phase 4",
    yet no phase of either run is whole: a row may have gone to another worker."""
    rows = [Row(0, 111, 4, 2, k(10), k(30)), Row(1, 222, 4, 2, k(10), k(30))]
    assert whole_key(rows) == k(10)


def test_a_worker_that_moved_on_vouches_for_the_phase_before() -> None:
    # worker 0 wrote phase 5 (so 4 committed everywhere); worker 1 had a share of 4 only
    rows = [Row(0, 9, 5, 2, k(40), k(50)), Row(1, 9, 4, 2, k(30), k(40)), Row(2, 9, 3, 3, k(20), k(30))]
    assert whole_key(rows) == k(40)


def test_row_from_db_reads_keys_and_nulls() -> None:
    r = Row.from_db((3, 99, 12, 4, None, None, None, 1 << 62, b"r2", -2))
    assert r == Row(3, 99, 12, 4, None, (1 << 62, "r2", -2))
    m = Mark(99, 12, 4, None, (5, "r1", 0))
    assert m.params("mysql", 3) == ("mysql", 3, 99, 12, 4, None, None, None, 5, "r1", 0)
    assert position.upsert_sql("a%b").count("%s") == 11 and "`a%%b`.`position`" in position.upsert_sql("a%b")


# --- a connection that records statements, transaction by transaction ------------------------------

class RecConn:
    """Records the statements of each target transaction; raises a deadlock at the
    statement numbers in ``fail_at`` (once each); answers the position SELECT from
    ``rows`` (a shared dict: worker -> the row as the table holds it)."""

    server_status = 0

    def __init__(self, rows: dict[int, tuple[Any, ...]] | None = None, fail_at: frozenset[int] = frozenset()):
        self.fail_at, self.n = set(fail_at), 0
        self.pending: list[tuple[str, Any]] = []
        self.committed: list[list[tuple[str, Any]]] = []
        self.rows = rows if rows is not None else {}
        self._result: list[tuple[Any, ...]] = []

    def escape(self, v: Any) -> str:
        import pymysql

        return str(pymysql.connect(defer_connect=True, charset="utf8mb4").escape(v))

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

        self.n += 1
        if self.n in self.fail_at:
            self.fail_at.discard(self.n)
            raise pymysql.err.OperationalError(1213, "Deadlock found")
        if sql.startswith("SELECT worker"):
            self._result = sorted(self.rows.values())
            return len(self._result)
        self.pending.append((sql, params))
        return 1

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._result

    def commit(self) -> None:
        for sql, params in self.pending:
            if "`position`" in sql and sql.startswith("INSERT"):
                self.rows[params[1]] = params[1:]  # worker, run, phase, parts, before..., whole...
        self.committed.append(self.pending)
        self.pending = []

    def rollback(self) -> None:
        self.pending = []


def new_sender(n: int = 1, **opts: Any) -> MySQLSender:
    o = {key.name: key.default for key in MySQLSender.KEYS}
    o.update(host="h", user="u", threadnum=n)
    o.update(opts)
    return MySQLSender("mysql", o)


def with_conn(s: MySQLSender, conn: RecConn) -> MySQLSender:
    for w in s.workers:
        w.conn = conn  # type: ignore[assignment]
    return s


def test_the_worker_writes_its_row_with_its_last_rows_once_even_after_a_deadlock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import senders.mysql.sender as ms

    monkeypatch.setattr(ms.time, "sleep", lambda s: None)
    # statements: chunk 1 = 1 insert + applied; chunk 2 = insert, applied, position;
    # chunk 3 = insert (the 7th statement deadlocks once), applied, position
    conn = RecConn(fail_at=frozenset({7}))
    s = with_conn(new_sender(), conn)
    s.commit_rows = 4
    s._progress_loaded = True
    w = s.workers[0]
    units = [[Op((1, "r", i), RowChange(KEYLESS, "insert", None, {"msg": f"m{i}", "n": i}), "d", "log")]
             for i in range(10)]
    mark = Mark(5, 3, 1, k(0), (1, "r", 0))
    assert w.apply(units, atomic=False, mark=mark) == 10
    assert len(conn.committed) == 3
    pos = [[p for sql, p in tx if "`position`" in sql] for tx in conn.committed]
    assert pos == [[], [], [mark.params("mysql", 0)]]
    assert any("'m9'" in sql for sql, _ in conn.committed[-1])  # in the transaction of the last rows
    assert s.counters["deadlock_retries"] == 1


def test_without_meta_database_no_row_is_written_and_resume_key_is_none() -> None:
    conn = RecConn()
    s = with_conn(new_sender(meta_database=""), conn)
    s.open()
    assert s.resume_key() is None
    s.send([Txn("r", 10, None, (RowChange(S, "insert", None, {"id": 1, "v": 1}),))])
    assert not any("`position`" in sql for tx in conn.committed for sql, _ in tx)
    assert not conn.rows


def test_a_ddl_writes_its_position_after_it_in_a_transaction_of_its_own() -> None:
    conn = RecConn()
    s = with_conn(new_sender(), conn)
    s.open()
    assert s.resume_key() is None
    ddl = Txn("r", 20, None, (), ddl=Ddl("d", "ALTER TABLE t ADD c INT", "t"))
    s.send([Txn("r", 10, None, (RowChange(S, "insert", None, {"id": 1, "v": 1}),)), ddl])
    ddl_tx = [tx for tx in conn.committed if any(sql.startswith("ALTER") for sql, _ in tx)]
    assert len(ddl_tx) == 1 and not any("`position`" in sql for sql, _ in ddl_tx[0])
    after = conn.committed[conn.committed.index(ddl_tx[0]) + 1]
    assert [p[4:] for sql, p in after if "`position`" in sql] == [(1, 10, "r", 0, 20, "r", 0)]
    assert s.resume_key() == (20, "r", 0)
    assert s.status()["position"] == [20, "r", 0]


# --- the sender's marks (fake workers that record them) -------------------------------------------

class MarkWorker:
    def __init__(self, index: int, log: list[tuple[int, Mark | None, list[Any]]]):
        self.index, self.log = index, log
        self.pool = ThreadPoolExecutor(max_workers=1)

    def submit(self, units: list[list[Op]], atomic: bool, mark: Mark | None = None) -> Future[int]:
        self.log.append((self.index, mark, [op.ident for u in units for op in u]))
        f: Future[int] = Future()
        f.set_result(len(units))
        return f

    def close(self) -> None:
        self.pool.shutdown()


def marking_sender(n: int, phase_rows: int, atomic: bool = False) -> tuple[MySQLSender, list[Any]]:
    s = new_sender(n, txn_atomic=atomic)
    got: list[tuple[int, Mark | None, list[Any]]] = []
    s.workers = [MarkWorker(i, got) for i in range(n)]  # type: ignore[misc]
    s.phase_rows = phase_rows
    s._progress_loaded = True
    s._run_id = 77
    return s, got


def ins(ts: int, ids: list[int]) -> Txn:
    return Txn("r", ts, None, tuple(RowChange(S, "insert", None, {"id": i, "v": i}) for i in ids))


@pytest.mark.parametrize("atomic", [False, True])
def test_every_worker_of_a_phase_gets_the_phase_mark(atomic: bool) -> None:
    s, got = marking_sender(4, phase_rows=6, atomic=atomic)
    s._whole = k(5)
    s.send([ins(10, [1, 2, 3]), ins(11, [4, 5, 6]), ins(12, [7, 8])])
    phases: dict[int, set[Any]] = {}
    for w, mark, _ in got:
        assert mark is not None
        phases.setdefault(mark.phase, set()).add((w, mark))
    assert sorted(phases) == [1, 2]
    for members in phases.values():
        marks = {m for _, m in members}
        assert len(marks) == 1  # one mark per phase, the same for every worker
        (m,) = marks
        assert m.run == 77 and m.parts == len(members) == len({w for w, _ in members})
    (m1,) = {m for _, m in phases[1]}
    (m2,) = {m for _, m in phases[2]}
    assert (m1.before, m1.whole) == (k(5), k(11)) and (m2.before, m2.whole) == (k(11), k(12))
    assert s._whole == k(12)


def test_a_phase_that_ends_inside_a_transaction_covers_the_one_before() -> None:
    s, got = marking_sender(2, phase_rows=4)
    s.send([ins(10, [1]), ins(11, list(range(2, 12))), ins(12, [20])])
    marks = sorted({m for _, m, _ in got if m is not None}, key=lambda m: m.phase)
    assert [(m.before, m.whole) for m in marks] == [(None, k(10)), (k(10), k(10)), (k(10), k(12))]


def test_a_barrier_ends_the_phase_before_the_transaction_that_links_two_groups() -> None:
    s, got = marking_sender(4, phase_rows=100)
    s2 = TableSchema("d", "u", ("id", "e"), ("id",), (("e",),))
    t1 = Txn("r", 10, None, (RowChange(s2, "insert", None, {"id": 1, "e": 1}),
                             RowChange(s2, "insert", None, {"id": 2, "e": 2})))
    t2 = Txn("r", 11, None, (RowChange(s2, "update", {"id": 1, "e": 1}, {"id": 1, "e": 2}),))  # links 1 and 2
    s.send([t1, t2])
    marks = sorted({m for _, m, _ in got if m is not None}, key=lambda m: m.phase)
    assert [(m.before, m.whole) for m in marks] == [(None, k(10)), (k(10), k(11))]


def test_send_drops_what_the_target_has() -> None:
    s, got = marking_sender(2, phase_rows=100)
    s._whole = k(11)
    s.send([ins(10, [1]), ins(11, [2]), ins(12, [3])])
    assert sorted(i for _, _, ids in got for i in ids) == [(12, "r", 0)]


# --- a simulated target, crashed at every commit ----------------------------------------------------

class Target:
    """Committed rows (the runs that applied each change) and the position table."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.applied: dict[tuple[int, str, int], list[int]] = {}
        self.rows: dict[int, tuple[Any, ...]] = {}
        self.commits = 0
        self.crash_at: int | None = None
        self.attempt = 0  # which attempt (a run, or a retry within one) is applying
        self.fail_workers: set[int] = set()  # workers whose commits fail

    def commit(self, idents: list[tuple[int, str, int]], worker: int, mark: Mark | None, name: str) -> None:
        with self.lock:
            if worker in self.fail_workers:
                raise SinkError(f"worker {worker} lost its connection", retriable=True)
            if self.crash_at is not None and self.commits >= self.crash_at:
                raise SinkError("the target connection is gone", retriable=True)  # nothing more commits
            self.commits += 1
            for i in idents:
                self.applied.setdefault(i, []).append(self.attempt)
            if mark is not None:
                self.rows[worker] = mark.params(name, worker)[1:]


class SimWorker:
    """Commits its share in chunks of ``chunk`` rows, the last with its position row."""

    def __init__(self, s: MySQLSender, index: int, target: Target, chunk: int):
        self.s, self.index, self.target, self.chunk = s, index, target, chunk
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.conn = RecConn(target.rows)

    def connect(self) -> RecConn:
        return self.conn

    def submit(self, units: list[list[Op]], atomic: bool, mark: Mark | None = None) -> Future[int]:
        return self.pool.submit(self.apply, units, atomic, mark)

    def apply(self, units: list[list[Op]], atomic: bool, mark: Mark | None) -> int:
        ops = [op for u in units for op in u]
        chunks = units if atomic else [ops[i:i + self.chunk] for i in range(0, len(ops), self.chunk)]
        for n, c in enumerate(chunks):
            self.target.commit([op.ident for op in c], self.index, mark if n == len(chunks) - 1 else None,
                               self.s.name)
        return len(ops)

    def drop(self) -> None:
        return None

    def close(self) -> None:
        self.pool.shutdown()


def sim_sender(target: Target, n: int, atomic: bool, rng: random.Random) -> MySQLSender:
    s = new_sender(n, txn_atomic=atomic)
    s.workers = [SimWorker(s, i, target, chunk=rng.randint(1, 4)) for i in range(n)]  # type: ignore[misc]
    s.phase_rows = rng.randint(3, 12)
    s._load_progress = lambda: setattr(s, "_progress_loaded", True)  # type: ignore[method-assign]
    return s


def load(rng: random.Random, n_txns: int) -> list[Txn]:
    out = []
    for t in range(n_txns):
        rows = []
        for _ in range(rng.randint(0, 6)):
            i = rng.randrange(40)
            if rng.random() < 0.15:  # a key change: two keys, may link two groups (a barrier)
                j = rng.randrange(40)
                rows.append(RowChange(S, "update", {"id": i, "v": 0}, {"id": j, "v": 1}))
            else:
                rows.append(RowChange(S, "insert", None, {"id": i, "v": t}))
        if rng.random() < 0.05:
            out.append(Txn("r1", 100 + t, None, (), ddl=Ddl("d", "ALTER TABLE t ADD c INT", "t")))
            continue
        out.append(Txn(rng.choice(["r1", "r2"]), 100 + t, None, tuple(rows)))
    return out


def idents(txns: list[Txn]) -> list[tuple[int, str, int]]:
    return [(t.commit_ts, t.region, i) for t in txns for i in range(len(t.changes))]


@pytest.mark.parametrize("seed", range(40))
def test_after_a_failure_at_any_commit_resume_key_is_held_whole_and_the_rest_completes(seed: int) -> None:
    """Each attempt fails at a random commit (every commit after it fails too, as when
    the capturer is killed or the target goes away); the next attempt is a retry of
    the batch by the same sender (every other time) or a new sender (a restart). Each
    starts from ``resume_key()``, as the base and the stream do."""
    rng = random.Random(seed)
    txns = load(rng, 60)
    atomic = seed % 3 == 0
    n = rng.choice([1, 2, 4])
    batches = [txns[i:i + 15] for i in range(0, len(txns), 15)]
    target = Target()
    target.crash_at = rng.randint(0, 40)
    starts: list[StreamKey | None] = []
    s = sim_sender(target, n, atomic, rng)
    s.open()
    for attempt in range(12):
        target.attempt = attempt
        key = s.resume_key()
        starts.append(key)
        held = set(target.applied)
        # what the target says it has, it has: every change of every transaction at or below it
        assert all(i in held for t in txns if key is not None and stream_key(t) <= key for i in idents([t])), key
        todo = [[t for t in b if key is None or stream_key(t) > key] for b in batches]
        try:
            for b in todo:
                if b:
                    s.send(b)
        except SinkError:
            # the next attempt fails a bit later (from the sixth on, none does)
            target.crash_at = target.commits + rng.randint(1, 25) if attempt < 5 else None
            if attempt % 2:
                s.close()
                s = sim_sender(target, n, atomic, rng)
                s.open()
            continue
        break
    else:
        pytest.fail("never finished")
    s.close()
    assert set(target.applied) == set(idents(txns))  # nothing lost
    last = sim_sender(target, n, atomic, rng)
    last.open()
    # the last transaction with rows or a DDL (empty ones after it need not be written down)
    last_real = [t for t in txns if t.changes or t.ddl is not None][-1]
    assert stream_key(last_real) <= last.resume_key() <= stream_key(txns[-1])  # type: ignore[operator]
    # an attempt never applied again what was at or below the position it started from
    for attempt, key in enumerate(starts):
        if key is None:
            continue
        again = [i for t in txns if stream_key(t) <= key for i in idents([t])
                 if any(a >= attempt for a in target.applied[i])]
        assert not again, (attempt, key, again[:3])
    assert len(starts) > 1  # it did fail at least once


def test_a_restart_names_its_phases_anew_so_a_stale_row_never_completes_one() -> None:
    """Run 1: phase 1 (T1 on both workers), worker 1 fails. Run 2 (from nothing: T1
    is not whole): phase 1 again (T1, T2), now worker 0 fails. Worker 0's row of run
    1 and worker 1's of run 2 are both "phase 1 of 2 workers", yet T2's rows on worker
    0 never committed: the target holds nothing whole."""
    rng = random.Random(1)
    target = Target()
    t1 = Txn("r", 10, None, tuple(RowChange(S, "insert", None, {"id": i, "v": 0}) for i in range(8)))
    t2 = Txn("r", 11, None, tuple(RowChange(S, "insert", None, {"id": i, "v": 1}) for i in range(8, 16)))
    for fail, batch in (({1}, [t1]), ({0}, [t1, t2])):
        s = sim_sender(target, 2, False, rng)
        s.phase_rows = 100
        s.open()
        assert s.resume_key() is None
        target.fail_workers = fail
        with pytest.raises(SinkError):
            s.send(batch)
        s.close()
    assert {r[0]: r[2] for r in target.rows.values()} == {0: 1, 1: 1}  # both rows say "phase 1"
    s = sim_sender(target, 2, False, rng)
    s.open()
    assert s.resume_key() is None
