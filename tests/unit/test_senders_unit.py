from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from capturer.errors import SinkError
from capturer.model import Heartbeat, Position, RowChange, TableSchema, Txn
from capturer.pipeline.checkpoint import Checkpoint
from capturer.pipeline.fanout import SenderManager
from senders.base import Sender
from senders.local.sender import LocalSender

S = TableSchema("d", "t", ("id", "v"), ("id",))


def txn(ts: int, region: str = "r", n: int = 2, pos: int = 0) -> Txn:
    ch = tuple(RowChange(S, "insert", None, {"id": ts * 10 + i, "v": "x"}) for i in range(n))
    return Txn(region, ts, Position("bin.000001", pos or ts * 100), ch)


def local(tmp: Path, **kw: object) -> LocalSender:
    opts = {"filepath": str(tmp / "out.jsonl"), "format": "json", "rotate_mb": 1, "fsync": True}
    opts.update(kw)
    return LocalSender("local", opts)


def test_local_cuts_torn_tail_and_rotates(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"a": 1}\n{"torn": ')
    s = local(tmp_path)
    s.open()
    assert out.read_text() == '{"a": 1}\n'
    big = Txn("r", 5, Position("f", 9), tuple(
        RowChange(S, "insert", None, {"id": i, "v": "y" * 300}) for i in range(4000)))
    s.send([big])
    s.send([txn(6)])
    s.close()
    assert (tmp_path / "out.jsonl.000001").exists()
    lines = [json.loads(x) for p in (tmp_path / "out.jsonl.000001", out) for x in p.read_text().splitlines()]
    assert [x["seq"] for x in lines if x.get("commit_ts") == 5] == list(range(4000))
    assert lines[-1]["commit_ts"] == 6 and lines[-1]["last"] is True


def test_local_sql_format(tmp_path: Path) -> None:
    s = local(tmp_path, format="sql")
    s.open()
    s.send([txn(7, n=1)])
    s.close()
    text = (tmp_path / "out.jsonl").read_text()
    assert "SET time_zone='+00:00';" in text
    assert "INSERT INTO `d`.`t` (`id`, `v`) VALUES (70, 'x') ON DUPLICATE KEY UPDATE" in text
    assert "-- region=r commit_ts=7" in text


class SlowSender(Sender):
    def __init__(self, name: str, gate: threading.Event):
        super().__init__(name, {})
        self.gate = gate
        self.got: list[int] = []

    def send(self, batch: list[Txn]) -> None:
        self.gate.wait()
        self.got.extend(t.commit_ts for t in batch)


def test_checkpoint_is_min_of_senders_and_positions_follow() -> None:
    fast_gate, slow_gate = threading.Event(), threading.Event()
    fast_gate.set()
    fast, slow = SlowSender("fast", fast_gate), SlowSender("slow", slow_gate)
    stop = threading.Event()
    m = SenderManager([fast, slow], Checkpoint(), stop)
    m.start()
    for ts in (1, 2, 3):
        m.dispatch(txn(ts, pos=ts * 100))
    m.dispatch(Heartbeat("q", 4, Position("other", 4)))
    deadline = time.time() + 5
    while fast.acked_ts < 4 and time.time() < deadline:
        time.sleep(0.01)
    assert fast.acked_ts == 4
    assert m.advance().commit_ts == 0  # the slow sender has acknowledged nothing
    slow_gate.set()
    while slow.acked_ts < 4 and time.time() < deadline:
        time.sleep(0.01)
    cp = m.advance()
    assert cp.commit_ts == 4
    assert cp.regions == {"r": Position("bin.000001", 300), "q": Position("other", 4)}
    m.stop()
    m.join()


class FlakySender(Sender):
    max_backoff = 0.05

    def __init__(self) -> None:
        super().__init__("flaky", {})
        self.fail = 3
        self.got: list[int] = []

    def send(self, batch: list[Txn]) -> None:
        from capturer.errors import SinkError

        if self.fail:
            self.fail -= 1
            raise SinkError("target down")
        self.got.extend(t.commit_ts for t in batch)


def test_retry_does_not_ack_until_delivered() -> None:
    s = FlakySender()
    s.start(0)
    s.queue.put((1, txn(1)))
    deadline = time.time() + 5
    while s.acked_ts < 1 and time.time() < deadline:
        assert s.acked_ts == 0 or s.got
        time.sleep(0.01)
    assert s.got == [1] and s.acked_ts == 1 and s.retries == 3 and "target down" in s.last_error
    s.stop()
    s.join()


class LockedSender(Sender):
    """Waits for a lock another process holds (as the file sender does during a takeover)."""

    max_backoff = 10.0

    def __init__(self, fails: int) -> None:
        super().__init__("locked", {})
        self.fails = fails
        self.tries: list[float] = []

    def open(self) -> None:
        from capturer.errors import SinkError

        self.tries.append(time.monotonic())
        if len(self.tries) <= self.fails:
            raise SinkError("being written by another process", poll=0.05)


def test_waiting_for_a_lock_polls_instead_of_backing_off() -> None:
    """An error that says it polls (``SinkError.poll``) is tried again at that pace, not
    after a back-off growing to ``max_backoff``: the file sender writes as soon as a
    deposed capturer frees its lock (with back-off, the 6th try would come ~6 s late)."""
    s = LockedSender(fails=6)
    s.start(0)
    deadline = time.time() + 5
    while len(s.tries) < 7 and time.time() < deadline:
        time.sleep(0.01)
    assert len(s.tries) == 7 and s.retries == 6
    gaps = [b - a for a, b in zip(s.tries, s.tries[1:])]
    assert max(gaps) < 1.0 and s.tries[-1] - s.tries[0] < 2.0, gaps
    s.stop()
    s.join()


def test_spark_sender_refuses_a_column_named_like_lake_metadata(tmp_path: Path) -> None:
    import pytest

    from capturer.errors import SinkError
    from senders.spark.sender import SparkSender

    s = SparkSender("spark", {"master": "local[1]", "warehouse": str(tmp_path), "database": "cdc",
                              "batch_rows": 10, "batch_interval": 0, "compaction_interval": 0,
                              "app_name": "", "conf.*": {}})
    schema = TableSchema("d", "t", ("id", "_op"), ("id",))
    with pytest.raises(SinkError) as ei:
        s._state_for(schema, [["id", "bigint"], ["_op", "string"]])
    assert "'_op'" in str(ei.value) and "d.t" in str(ei.value) and not ei.value.retriable
    # a type change of a known column is refused with the way out
    s._state_for(TableSchema("d", "u", ("id", "v"), ("id",)), [["id", "bigint"], ["v", "bigint"]])
    with pytest.raises(SinkError) as ei:
        s._state_for(TableSchema("d", "u", ("id", "v"), ("id",)), [["id", "bigint"], ["v", "string"]])
    assert "changed type from bigint to string" in str(ei.value) and "Way out" in str(ei.value)


class OneAtATime(Sender):
    """Takes one transaction per batch and blocks on the batch numbered ``hold``."""

    batch_rows = 1

    def __init__(self, hold: int):
        super().__init__("one", {})
        self.hold = hold
        self.gate = threading.Event()
        self.got: list[tuple[str, int]] = []

    def send(self, batch: list[Txn]) -> None:
        if len(self.got) + 1 == self.hold:
            self.gate.wait()
        self.got.extend((t.region, t.commit_ts) for t in batch)


def test_checkpoint_never_passes_an_unacknowledged_txn_at_the_same_commit_ts() -> None:
    """Two regions commit at the same commit_ts (MariaDB: same second, same counter).
    A sender that acknowledged the first but not the second must not let the
    checkpoint fold the second region's position: after a crash that region would
    resume past a transaction this sender never got."""
    s = OneAtATime(hold=3)
    m = SenderManager([s], Checkpoint(), threading.Event())
    m.start()
    m.dispatch(txn(4, "a", pos=400))
    m.dispatch(txn(5, "a", pos=500))
    m.dispatch(txn(5, "b", pos=600))
    deadline = time.time() + 5
    while len(s.got) < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert s.got == [("a", 4), ("a", 5)]
    time.sleep(0.1)
    cp = m.advance()
    assert "b" not in cp.regions, cp.regions  # (5, b) is not acknowledged
    assert cp.regions["a"] == Position("bin.000001", 500)
    assert cp.commit_ts == 4  # "everything at or below commit_ts is durable" stays true
    s.gate.set()
    while len(s.got) < 3 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    cp = m.advance()
    assert cp.commit_ts == 5 and cp.regions["b"] == Position("bin.000001", 600)
    m.stop()
    m.join()


def test_each_region_resumes_its_clock_above_its_own_acknowledged_item(tmp_path: Path) -> None:
    """(T, r1) acknowledged, r0's heartbeat at T not yet: the checkpoint's commit_ts
    is T-1, but r1's clock must resume above T, or a transaction it reads again
    would take T, the identity of the one it already delivered."""
    from capturer.model import make_ts
    from capturer.pipeline.checkpoint import load_checkpoint, save_checkpoint
    from capturer.regions.clock import LiftJournal, RegionClock

    t = make_ts(1_700_000_000_000) + 46
    s = OneAtATime(hold=0)  # (its thread is not started: the test says what it acknowledged)
    m = SenderManager([s], Checkpoint(), threading.Event())
    m.dispatch(txn(t - 1, "r0", pos=100))
    m.dispatch(txn(t, "r1", pos=200))
    m.dispatch(Heartbeat("r0", t, Position("bin.000001", 150)))
    handed = s.queue.get_many(10, timeout=1)  # what the sender's thread would take
    assert [off for off, _ in handed] == [1, 2, 3]
    s.acked_seq, s.acked_ts = 2, t  # it acknowledged the first two
    cp = m.advance()
    assert cp.commit_ts == t - 1 and cp.region_ts == {"r0": t - 1, "r1": t}
    save_checkpoint(tmp_path / "cp.json", cp)
    back = load_checkpoint(tmp_path / "cp.json")
    assert back is not None and back.floor("r1") == t and back.floor("r0") == t - 1
    assert back.floor("new") == t - 1  # a region the checkpoint does not know yet
    clock = RegionClock("r1", back.floor("r1"), LiftJournal(None))
    # r1's next transaction, in the same second: it had t + 1 the first time
    assert clock.commit(1_700_000_000, Position("bin.000001", 300)) == t + 1


class Housekeeper(Sender):
    """Counts its housekeeping calls; the second one fails (retriable)."""

    def __init__(self) -> None:
        super().__init__("hk", {})
        self.calls: list[float] = []
        self.got: list[int] = []

    def housekeeping(self) -> None:
        self.calls.append(time.monotonic())
        if len(self.calls) == 2:
            raise SinkError("compaction failed once")

    def send(self, batch: list[Txn]) -> None:
        self.got.extend(t.commit_ts for t in batch)


def test_the_sender_loop_runs_housekeeping_between_batches_and_while_idle() -> None:
    s = Housekeeper()
    m = SenderManager([s], Checkpoint(), threading.Event())
    m.start()
    deadline = time.time() + 5
    while len(s.calls) < 4 and time.time() < deadline:  # idle: every 0.2 s (and the retry after the failure)
        time.sleep(0.01)
    assert len(s.calls) >= 4 and s.errors == 1 and s.retries == 1 and "compaction failed once" in s.last_error
    m.dispatch(txn(4, "a", pos=400))
    while not s.got and time.time() < deadline:
        time.sleep(0.01)
    assert s.got == [4] and s.state == "running"
    m.stop()
    m.join()


def test_the_lakes_lock_held_by_another_writer_is_polled_as_the_files(tmp_path: Path) -> None:
    """High availability: a new active's lake sender waits for the deposed capturer's lock (a frozen
    capturer on the same machine holds it until it runs again and steps down). The lock is freed at
    once then, so the wait is a poll every 0.2 s, as the file sender's; before, it was the growing
    back-off of other errors (a takeover's lake waited up to 10 s more after the lock was free)."""
    import pytest

    from capturer import config
    from senders import CATALOG
    from senders.spark.commits import CommitLog
    from senders.spark.sender import SparkSender

    p = tmp_path / "s.cfg"
    p.write_text(f"[global]\ntype=spark\n[spark]\nwarehouse={tmp_path / 'wh'}\nwriter=arrow\ncompaction_interval=0\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    other = CommitLog(tmp_path / "wh")
    assert other.lock()  # another writer (a descriptor of its own: flock excludes it as another process)
    try:
        s = SparkSender("spark", sc.options)
        with pytest.raises(SinkError) as ei:
            s.open()
        assert "being written by another process" in str(ei.value) and ei.value.retriable
        assert ei.value.poll == 0.2
    finally:
        other.unlock()
    s.open()  # free: it opens at once
    s.close()
