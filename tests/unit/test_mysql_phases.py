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

    def submit(self, units: list[list[Op]], atomic: bool) -> "Future[int]":
        self.busy = True
        return self.pool.submit(self.apply, units, self.s.phase_no)

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
    s.log, s.phase_no = [], 0
    s.workers = [FakeWorker(s, i, fail_on, delay) for i in range(n)]
    s.phase_rows = phase_rows
    s._progress_loaded = True
    real = s._start_phase

    def start(lanes: Any) -> Any:
        s.phase_no += 1
        return real(lanes)

    s._start_phase = start
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

    real = ms.conflict_keys

    def spy(ch: RowChange, db: str, table: str) -> list[str]:
        placed_during.append(any(w.busy for w in s.workers))
        return real(ch, db, table)

    monkeypatch.setattr(ms, "conflict_keys", spy)
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

    def ddl(d: Ddl) -> None:
        seen.append(sum(len(w.applied) for w in s.workers))

    monkeypatch.setattr(s, "_apply_ddl", ddl)
    batch = txns(list(range(15))) + [Txn("r", 500, None, (), ddl=Ddl("d", "ALTER TABLE t ADD c INT"))] + \
        txns(list(range(15, 20)), 600)
    s.send(batch)
    assert seen == [15]  # every row before the DDL was applied when it ran
    assert sum(len(w.applied) for w in s.workers) == 20
