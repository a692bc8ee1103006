"""The sender loop's deferred settling (senders/base.py ``defer_settle``, used by the Kafka
sender when not transactional): ``send`` hands a batch over, ``settle`` waits for its delivery,
and the loop acknowledges a batch only once a ``settle`` after its ``send`` succeeded (the next
batch's read and encoding overlap its delivery). A fake sender stands for the destination: what
``send`` hands over is delivered only by ``settle`` (or at once when ``settle_later`` is off)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from capturer.errors import SinkError
from capturer.model import Position, RowChange, TableSchema, Txn
from senders.base import Sender

S = TableSchema("d", "t", ("id",), ("id",))


def txn(ts: int) -> Txn:
    return Txn("r", ts, Position("bin.000001", ts), (RowChange(S, "insert", None, {"id": ts}),))


class Deferred(Sender):
    defer_settle = True
    batch_rows = 0  # a transaction a batch (get_many takes one, then more while under this)
    max_backoff = 0.02

    def __init__(self, send_fails: int = 0, settle_fails: int = 0, gate: threading.Event | None = None) -> None:
        super().__init__("deferred", {})
        self.handed: list[int] = []  # sent, not delivered
        self.delivered: list[int] = []
        self.sends: list[list[int]] = []
        self.settles = 0
        self.send_fails, self.settle_fails = send_fails, settle_fails
        self.gate = gate
        self.bad: list[str] = []  # acknowledged before delivered
        self.entered = threading.Event()  # a send() began

    def _check(self) -> None:
        if self.acked_ts and self.acked_ts not in self.delivered:
            self.bad.append(f"acked {self.acked_ts}, delivered {self.delivered}")

    def send(self, batch: list[Txn]) -> None:
        self._check()
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(5)
        self.sends.append([t.commit_ts for t in batch])
        if self.send_fails and len(self.sends) == 2:
            self.send_fails -= 1
            self.handed.clear()  # a failed send: what was handed over is lost (a fresh producer)
            raise SinkError("broker gone")
        self.handed.extend(t.commit_ts for t in batch)
        if not self.settle_later:
            self.settle()

    def settle(self) -> None:
        self._check()
        self.settles += 1
        if self.settle_fails:
            self.settle_fails -= 1
            self.handed.clear()
            raise SinkError("not acknowledged")
        self.delivered.extend(t for t in self.handed if t not in self.delivered)
        self.handed.clear()


def run(s: Deferred, n: int, before_start: bool = True, until: Callable[[], bool] | None = None) -> None:
    if before_start:
        for i in range(1, n + 1):
            s.queue.put((i, txn(i)))
    s.start(0)
    if not before_start:
        for i in range(1, n + 1):
            s.queue.put((i, txn(i)))
    deadline = time.monotonic() + 10
    while not (until or (lambda: s.acked_ts == n))() and time.monotonic() < deadline:
        time.sleep(0.01)
    s.stop()
    s.join(5)


def test_two_batches_are_settled_by_one_wait_and_acknowledged_after_it() -> None:
    s = Deferred()
    run(s, 4)
    assert s.delivered == [1, 2, 3, 4] and s.acked_ts == 4 and s.rows == 4 and s.txns == 4
    assert s.sends == [[1], [2], [3], [4]] and s.settles == 2  # one settle for each two batches
    assert not s.bad and s.settle_later is True


def test_a_lone_batch_is_settled_at_once() -> None:
    """Nothing waiting after it: settled at once, not after the next batch (a quiet stream's latency)."""
    s = Deferred()
    s.start(0)
    s.queue.put((1, txn(1)))
    deadline = time.monotonic() + 5
    while s.acked_ts < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert s.delivered == [1] and s.settles == 1 and s.acked_ts == 1
    s.stop()
    s.join(5)
    assert not s.bad


def test_a_failed_settle_sends_every_unsettled_batch_again() -> None:
    s = Deferred(settle_fails=1)
    run(s, 2)
    assert s.sends[:3] == [[1], [2], [1, 2]]  # both again, as one
    assert s.delivered == [1, 2] and s.acked_ts == 2 and s.retries == 1 and "not acknowledged" in s.last_error
    assert not s.bad


def test_a_failed_send_of_the_next_batch_sends_the_unsettled_one_again() -> None:
    s = Deferred(send_fails=1)
    run(s, 2)
    assert s.sends[:3] == [[1], [2], [1, 2]]  # batch 1 handed over, lost with batch 2's failed send
    assert s.delivered == [1, 2] and s.acked_ts == 2 and s.retries == 1
    assert not s.bad


def test_pausing_settles_what_was_sent_first() -> None:
    gate = threading.Event()
    s = Deferred(gate=gate)
    s.start(0)
    s.queue.put((1, txn(1)))
    s.queue.put((2, txn(2)))
    s.queue.put((3, txn(3)))
    assert s.entered.wait(5)  # the loop is in send of batch 1
    s.pause()
    gate.set()
    deadline = time.monotonic() + 5
    while s.state != "paused" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.state == "paused"
    assert s.acked_ts == s.delivered[-1] and not s.handed  # nothing sent is left unacknowledged while paused
    s.resume()
    while s.acked_ts < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.delivered == [1, 2, 3] and s.acked_ts == 3
    s.stop()
    s.join(5)
    assert not s.bad


def test_a_direct_send_is_delivered_before_it_returns() -> None:
    """Outside the loop (a sender process's child, an applier) settle_later is off: send delivers."""
    s = Deferred()
    s.send([txn(7)])
    assert s.delivered == [7] and s.settles == 1


def test_the_first_batches_after_the_start_are_small_then_grow() -> None:
    """``start_rows``: the first batch after the start takes at most that much (a queue full already:
    a restart), each next one 4x more, up to ``batch_rows``: the first acknowledgement comes early (a
    capturer killed a few seconds after its start has made progress), the rest at full size."""

    class Ramp(Deferred):
        batch_rows = 400
        start_rows = 10

    s = Ramp()
    run(s, 300)
    assert not s.bad
    sizes = [len(b) for b in s.sends]
    assert sum(sizes) == 300
    # (get_many takes a transaction more than the weight asked: 10 -> 11)
    assert sizes[0] <= 11 and sizes[1] <= 41 and sizes[2] <= 161 and sizes[0] < sizes[1] < sizes[2], sizes
