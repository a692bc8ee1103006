"""The stream log, its cursors and the backlog on disk (capturer/pipeline/backlog.py),
with the SenderManager and real Sender threads (no server: senders that record what
they get, and hold when told to). The backlog's segment files are real files."""

from __future__ import annotations

import dataclasses
import decimal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from capturer.model import Heartbeat, Position, RowChange, TableSchema, Txn, stream_key
from capturer.pipeline.backlog import Backlog, BacklogError, Cut, StreamLog
from capturer.pipeline.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from capturer.pipeline.fanout import SenderManager
from senders.base import Sender

S = TableSchema("d", "t", ("id", "v", "amount"), ("id",))


def txn(ts: int, region: str = "r", n: int = 2, pos: int = 0) -> Txn:
    ch = tuple(RowChange(S, "insert", None, {"id": ts * 10 + i, "v": f"x{ts}'\"\\", "amount": decimal.Decimal("1.50")})
               for i in range(n))
    return Txn(region, ts, Position("bin.000001", pos or ts * 100), ch)


class Recorder(Sender):
    """Records what it gets; holds every batch while ``gate`` is clear."""

    batch_rows = 50

    def __init__(self, name: str, gate: threading.Event | None = None, key: Any = None):
        super().__init__(name, {})
        self.gate = gate or threading.Event()
        if gate is None:
            self.gate.set()
        self.got: list[tuple[str, int]] = []
        self.rows_got: list[dict[str, Any]] = []
        self.key = key
        self.crashed = threading.Event()  # kill -9: a held batch never lands

    def send(self, batch: list[Txn]) -> None:
        while not self.gate.wait(0.05):
            if self._stop.is_set():
                raise SystemExit  # stopped while held: as if killed, nothing of the batch landed
        if self.crashed.is_set():
            raise SystemExit
        for t in batch:
            self.got.append((t.region, t.commit_ts))
            self.rows_got.extend(ch.after or {} for ch in t.changes)

    def resume_key(self) -> Any:
        return self.key


def wait(pred: Any, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        if time.time() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def make(tmp: Path, senders: list[Sender], window: int = 30, max_bytes: int = 1 << 30, policy: str = "block",
         cp: Checkpoint | None = None) -> tuple[SenderManager, StreamLog, Backlog]:
    cp = cp or Checkpoint()
    b = Backlog(tmp / "backlog", max_bytes, segment_bytes=4096)
    behind = [sp.offset + 1 for sp in cp.senders.values() if cp.backlog and sp.offset + 1 < cp.backlog.next]
    nxt = b.open(cp.backlog, min(behind) if behind else None)
    stream = StreamLog(window, b, nxt, Cut(dict(cp.regions), dict(cp.region_ts)), policy,
                       start_rows=cp.backlog.rows if cp.backlog else 0)
    return SenderManager(senders, cp, threading.Event(), stream), stream, b


def test_a_held_sender_does_not_hold_the_others_and_catches_up_from_disk(tmp_path: Path) -> None:
    gate = threading.Event()
    fast, slow = Recorder("fast"), Recorder("slow", gate)
    m, stream, b = make(tmp_path, [fast, slow])
    m.start()
    want = [("r", ts) for ts in range(1, 501)]
    for ts in range(1, 501):
        m.dispatch(txn(ts))
    wait(lambda: len(fast.got) == 500)
    assert fast.got == want
    assert stream.evicted_to_disk > 300 and b.bytes > 0 and len(b.segments) > 1  # the slow one's share went to disk
    assert m.stream_state(slow) == "catching up"
    gate.set()
    wait(lambda: len(slow.got) == 500)
    assert slow.got == want  # in order, each once
    assert slow.queue.read_from_backlog > 300
    assert all(r["amount"] == decimal.Decimal("1.50") and r["v"].endswith("'\"\\") for r in slow.rows_got)
    wait(lambda: m.advance() and b.bytes == 0)  # every segment goes once both have passed it
    m.stop()
    m.join()


def test_two_held_senders_read_the_backlog_decoded_once(tmp_path: Path) -> None:
    gate = threading.Event()
    fast, slow1, slow2 = Recorder("fast"), Recorder("slow1", gate), Recorder("slow2", gate)
    m, stream, b = make(tmp_path, [fast, slow1, slow2])
    m.start()
    for ts in range(1, 301):
        m.dispatch(txn(ts))
    wait(lambda: len(fast.got) == 300)
    assert stream.evicted_to_disk > 200
    gate.set()
    wait(lambda: len(slow1.got) == 300 and len(slow2.got) == 300)
    want = [("r", ts) for ts in range(1, 301)]
    assert slow1.got == want and slow2.got == want
    # what one decoded the other took as it was (or decoded itself once it had left the cache)
    assert b.decoded_hits > 100
    assert slow1.rows_got == slow2.rows_got and all(r["amount"] == decimal.Decimal("1.50") for r in slow2.rows_got)
    m.stop()
    m.join()


def test_a_behind_sender_reads_the_backlog_one_read_ahead(tmp_path: Path) -> None:
    """Reading the backlog back, the next read is decoded in a thread of its own while the
    sender sends: the same items in the same order, each once, and most reads served by it."""

    class Busy(Recorder):
        def send(self, batch: list[Txn]) -> None:
            time.sleep(0.005)  # (a flush's wait: the read ahead runs meanwhile)
            super().send(batch)

    gate = threading.Event()
    fast, slow = Recorder("fast"), Busy("slow", gate)
    m, stream, b = make(tmp_path, [fast, slow])
    m.start()
    for ts in range(1, 601):
        m.dispatch(txn(ts, n=1 + ts % 3))
    wait(lambda: len(fast.got) == 600)
    gate.set()
    wait(lambda: len(slow.got) == 600)
    assert slow.got == [("r", ts) for ts in range(1, 601)]
    assert [r["id"] for r in slow.rows_got] == [r["id"] for r in fast.rows_got]
    ahead = m.cursors["slow"]._ahead
    assert ahead is not None and slow.queue.read_from_backlog > 400
    reads = slow.queue.read_from_backlog / slow.batch_rows  # (at least this many reads)
    assert ahead.hits > reads / 2
    m.stop()
    m.join()


def test_read_ahead_raises_what_the_read_raises_and_starts_over_elsewhere(tmp_path: Path) -> None:
    """A read ahead that failed raises on the read that takes it; one the cursor does not take
    (it went on elsewhere) is dropped and the read starts from a fresh reader."""
    from capturer.pipeline.backlog import ReadAhead

    calls: list[tuple[int, int]] = []

    class Reader:
        def read(self, start: int, upto: int, max_weight: int) -> list[tuple[int, int, Any, bool]]:
            calls.append((start, upto))
            if start == 3:
                raise BacklogError("damaged at 3")
            return [(o, o, Heartbeat("r", o, None), False) for o in range(start, min(upto, start + 2))]

    made: list[Reader] = []

    def new() -> Any:
        made.append(Reader())
        return made[-1]

    ra = ReadAhead("t", new)
    assert [o for o, *_ in ra.read(1, 10, 2)] == [1, 2]  # and 3.. is read ahead, which fails
    with pytest.raises(BacklogError, match="damaged at 3"):
        ra.read(3, 10, 2)
    assert [o for o, *_ in ra.read(5, 10, 2)] == [5, 6] and ra.hits == 0  # (read here; 7.. read ahead)
    assert [o for o, *_ in ra.read(7, 10, 2)] == [7, 8] and ra.hits == 1  # (9.. read ahead)
    assert len(made) == 1
    assert [o for o, *_ in ra.read(1, 10, 2)] == [1, 2]  # elsewhere: a fresh reader
    assert len(made) == 2 and ra.hits == 1
    ra.close()
    assert ra.read(1, 10, 2)[0][0] == 1 and ra._pending is None  # closed: no more reads ahead


def test_read_ahead_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read ahead asks for at most READ_AHEAD_ROWS rows, whatever the sender's batch."""
    from capturer.pipeline import backlog as bl

    asked: list[int] = []

    class Reader:
        def read(self, start: int, upto: int, max_weight: int) -> list[tuple[int, int, Any, bool]]:
            asked.append(max_weight)
            return [(start, start, Heartbeat("r", start, None), False)]

    monkeypatch.setattr(bl, "READ_AHEAD_ROWS", 7)
    ra = bl.ReadAhead("t", Reader)
    ra.read(1, 10, 1000)
    ra.read(2, 10, 1000)  # (the read ahead of 2, then that of 3)
    assert ra._pending is not None
    ra._pending[1].result()
    assert asked == [1000, 7, 7]
    ra.close()


def test_slow_but_busy_senders_pace_the_stream_instead_of_filling_the_backlog(tmp_path: Path) -> None:
    """A sender busy with what memory holds, neither waiting for more nor stalled: the
    backlog would only add a write and a read per item; the stream waits for it instead."""

    class Slow(Recorder):
        def send(self, batch: list[Txn]) -> None:
            time.sleep(0.02)
            super().send(batch)

    a = Slow("a")
    m, stream, b = make(tmp_path, [a])
    m.start()
    for ts in range(1, 301):
        m.dispatch(txn(ts))
    wait(lambda: len(a.got) == 300)
    assert stream.evicted_to_disk == 0 and b.written_items == 0
    assert stream.paced_waits > 0 and stream.waits == 0 and not stream.holding()
    m.stop()
    m.join()


def test_without_a_backlog_a_held_sender_holds_the_stream(tmp_path: Path) -> None:
    gate = threading.Event()
    fast, slow = Recorder("fast"), Recorder("slow", gate)
    stream = StreamLog(30, None, 1, Cut())
    m = SenderManager([fast, slow], Checkpoint(), threading.Event(), stream)
    m.start()
    done = threading.Event()

    def feed() -> None:
        for ts in range(1, 201):
            m.dispatch(txn(ts))
        done.set()

    threading.Thread(target=feed, daemon=True).start()
    time.sleep(0.5)
    assert not done.is_set() and len(fast.got) < 200  # back-pressure, as with one queue per sender
    assert stream.holding() == ["slow"]
    gate.set()
    wait(done.is_set)
    wait(lambda: len(slow.got) == 200 and len(fast.got) == 200)
    m.stop()
    m.join()


def test_restart_resumes_each_sender_from_its_own_position_without_duplicates(tmp_path: Path) -> None:
    """Crash with one sender ahead and one behind (its share on disk): after the
    restart the one behind reads the backlog, the sources are read again from where
    the backlog ends, and the one ahead skips what it has: nobody gets anything twice."""
    gate = threading.Event()
    fast, slow = Recorder("fast"), Recorder("slow", gate)
    m, stream, b = make(tmp_path, [fast, slow])
    m.start()
    for ts in range(1, 301):
        m.dispatch(txn(ts))
    wait(lambda: len(fast.got) == 300)
    cp = m.advance()
    save_checkpoint(tmp_path / "cp.json", cp)
    # kill -9: the threads just stop; what was in memory is gone
    slow.crashed.set()
    m.stop()
    gate.set()
    m.join()
    got_fast, got_slow = list(fast.got), list(slow.got)
    cp = load_checkpoint(tmp_path / "cp.json")
    assert cp is not None and cp.backlog is not None and cp.backlog.segment
    assert cp.senders["fast"].key == (300, "r", 0) and cp.senders["slow"].offset < cp.backlog.next - 1
    resume = cp.regions["r"]
    assert isinstance(resume, Position)
    fast2, slow2 = Recorder("fast"), Recorder("slow")
    m2, stream2, _ = make(tmp_path, [fast2, slow2], cp=cp)
    m2.start()
    # the sources, read again from the resume point (their transactions keep their commit_ts)
    for ts in range(resume.pos // 100 + 1, 401):
        m2.dispatch(txn(ts))
    wait(lambda: len(fast2.got) == 100 and len(got_slow) + len(slow2.got) >= 400)
    time.sleep(0.2)
    assert got_fast + fast2.got == [("r", ts) for ts in range(1, 401)]
    assert got_slow + slow2.got == [("r", ts) for ts in range(1, 401)]
    assert slow2.queue.read_from_backlog > 0 and fast2.queue.skipped_txns > 0
    m2.stop()
    m2.join()


def test_a_sender_added_later_starts_where_the_sources_resume_and_a_removed_one_is_dropped(tmp_path: Path) -> None:
    a = Recorder("a")
    m, _, _ = make(tmp_path, [a])
    m.start()
    for ts in range(1, 11):
        m.dispatch(txn(ts))
    wait(lambda: len(a.got) == 10)
    cp = m.advance()
    m.stop()
    m.join()
    a2, new = Recorder("a"), Recorder("new")
    m2, _, _ = make(tmp_path, [a2, new], cp=cp)
    assert m2.new_senders == ["new"]
    m2.start()
    for ts in range(11, 16):
        m2.dispatch(txn(ts))
    wait(lambda: len(new.got) == 5 and len(a2.got) == 5)
    cp2 = m2.advance()
    m2.stop()
    m2.join()
    m3, _, _ = make(tmp_path, [Recorder("new")], cp=cp2)
    assert set(m3.advance().senders) == {"new"}


def test_the_destination_key_skips_what_reached_it_after_the_checkpoint(tmp_path: Path) -> None:
    s = Recorder("s", key=(5, "r", 0))  # its destination says it has everything up to ts 5
    m, _, _ = make(tmp_path, [s])
    m.start()
    for ts in range(1, 9):
        m.dispatch(txn(ts))
    wait(lambda: s.acked_seq == 8)
    assert s.got == [("r", 6), ("r", 7), ("r", 8)]
    cp = m.advance()
    assert cp.senders["s"].key == (8, "r", 0) and s.queue.skipped_txns == 5
    m.stop()
    m.join()


def test_a_retried_batch_sends_only_what_the_destination_lacks(tmp_path: Path) -> None:
    """Duplicates within a run: a batch that failed half way is retried from the
    destination's own position (resume_key), not from its start."""

    class HalfWay(Recorder):
        max_backoff = 0.05

        def __init__(self) -> None:
            super().__init__("h")
            self.failed = False

        def send(self, batch: list[Txn]) -> None:
            if not self.failed and len(batch) > 2:
                self.failed = True
                super().send(batch[:2])  # two land, then the link breaks
                self.key = stream_key(batch[1])
                from capturer.errors import SinkError
                raise SinkError("link broke", retriable=True)
            super().send(batch)
            self.key = stream_key(batch[-1])

    h = HalfWay()
    m, _, _ = make(tmp_path, [h])
    for ts in range(1, 7):
        m.dispatch(txn(ts, n=1))
    m.start()
    wait(lambda: h.acked_seq == 6)
    assert h.got == [("r", ts) for ts in range(1, 7)] and h.retries == 1
    m.stop()
    m.join()


def test_detach_policy_lets_the_others_go_on_and_attach_resumes_at_the_head(tmp_path: Path) -> None:
    gate = threading.Event()
    fast, slow = Recorder("fast"), Recorder("slow", gate)
    m, stream, b = make(tmp_path, [fast, slow], max_bytes=20_000, policy="detach")
    m.start()
    for ts in range(1, 401):
        m.dispatch(txn(ts))
    wait(lambda: len(fast.got) == 400)
    assert m.cursors["slow"].detached and m.stream_state(slow) == "detached"
    assert b.bytes <= 20_000 + 4096
    cp = m.advance()
    assert cp.senders["slow"].detached and cp.senders["fast"].key == (400, "r", 0)
    assert cp.commit_ts >= 399  # the detached one does not hold the checkpoint
    gate.set()
    assert m.attach("slow") and not m.cursors["slow"].detached
    for ts in range(401, 411):
        m.dispatch(txn(ts))
    wait(lambda: ("r", 410) in slow.got)
    assert [g for g in slow.got if g[1] > 400] == [("r", ts) for ts in range(401, 411)]
    m.stop()
    m.join()


def test_block_policy_waits_for_the_sender_furthest_behind(tmp_path: Path) -> None:
    gate = threading.Event()
    fast, slow = Recorder("fast"), Recorder("slow", gate)
    m, stream, b = make(tmp_path, [fast, slow], max_bytes=20_000, policy="block")
    m.start()
    done = threading.Event()
    threading.Thread(target=lambda: ([m.dispatch(txn(ts)) for ts in range(1, 401)], done.set()), daemon=True).start()
    time.sleep(1.0)
    assert not done.is_set() and stream.holding() == ["slow"] and not m.cursors["slow"].detached
    gate.set()
    wait(done.is_set)
    wait(lambda: len(slow.got) == 400)
    assert slow.got == [("r", ts) for ts in range(1, 401)]
    m.stop()
    m.join()


def test_a_damaged_or_missing_segment_stops_the_start_naming_the_file(tmp_path: Path) -> None:
    gate = threading.Event()
    fast, slow = Recorder("fast"), Recorder("slow", gate)
    m, stream, b = make(tmp_path, [fast, slow])
    m.start()
    for ts in range(1, 201):
        m.dispatch(txn(ts))
    wait(lambda: len(fast.got) == 200)
    cp = m.advance()
    m.stop()
    gate.set()
    m.join()
    seg = sorted((tmp_path / "backlog").glob("*.seg"))[0]
    data = bytearray(seg.read_bytes())
    data[100] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(BacklogError, match=rf"{seg}.*checksum.*--rebuild-backlog"):
        make(tmp_path, [Recorder("fast"), Recorder("slow")], cp=cp)
    seg.unlink()
    with pytest.raises(BacklogError, match="needed by a sender that is behind"):
        make(tmp_path, [Recorder("fast"), Recorder("slow")], cp=cp)


def test_records_written_after_the_checkpoint_are_cut_at_start(tmp_path: Path) -> None:
    gate = threading.Event()
    fast, slow = Recorder("fast"), Recorder("slow", gate)
    m, stream, b = make(tmp_path, [fast, slow])
    m.start()
    for ts in range(1, 101):
        m.dispatch(txn(ts))
    wait(lambda: len(fast.got) == 100)
    cp = m.advance()
    assert cp.backlog is not None
    for ts in range(101, 201):  # more goes to disk after the checkpoint, then the crash
        m.dispatch(txn(ts))
    wait(lambda: len(fast.got) == 200)
    m.stop()
    gate.set()
    m.join()
    last = tmp_path / "backlog" / cp.backlog.segment
    assert sum(p.stat().st_size for p in (tmp_path / "backlog").glob("*.seg")) > cp.backlog.bytes
    _, stream2, b2 = make(tmp_path, [Recorder("fast"), Recorder("slow")], cp=cp)
    assert last.stat().st_size == cp.backlog.bytes and b2.segments[-1].path == last
    assert stream2.next == cp.backlog.next


def test_checkpoint_v1_is_read_and_v2_round_trips(tmp_path: Path) -> None:
    p = tmp_path / "cp.json"
    p.write_text('{"version": 1, "commit_ts": 12, "regions": {"r": {"file": "b.000001", "pos": 100}}}')
    cp = load_checkpoint(p)
    assert cp is not None and cp.senders == {} and cp.backlog is None
    s = Recorder("s")
    m, _, _ = make(tmp_path, [s], cp=cp)
    m.start()
    m.dispatch(txn(13, pos=200))
    wait(lambda: s.acked_seq == 1)
    cp2 = m.advance()
    save_checkpoint(p, cp2)
    back = load_checkpoint(p)
    assert back is not None and back.senders["s"].key == (13, "r", 0)
    assert back.regions == {"r": Position("bin.000001", 200)} and back.backlog == cp2.backlog
    assert dataclasses.asdict(back.senders["s"]) == dataclasses.asdict(cp2.senders["s"])
    m.stop()
    m.join()


def test_heartbeats_and_ddl_preludes_keep_their_keys_through_the_backlog(tmp_path: Path) -> None:
    from capturer.model import Ddl

    gate = threading.Event()
    fast, slow = Recorder("fast"), Recorder("slow", gate)
    m, _, _ = make(tmp_path, [fast, slow], window=5)
    m.start()
    items: list[Any] = []
    for ts in range(1, 61):
        if ts % 10 == 0:
            items.append(Txn("r", ts, Position("bin.000001", ts * 100), (), Ddl("d", "ALTER TABLE t ADD c INT", "t",
                                                                                 seq=-1)))
        items.append(txn(ts))
        items.append(Heartbeat("q", ts, Position("other", ts * 10 + 4)))
    for it in items:
        m.dispatch(it)
    wait(lambda: fast.acked_seq == len(items))
    gate.set()
    wait(lambda: slow.acked_seq == len(items))
    assert slow.got == fast.got and len(slow.got) == 66
    cp = m.advance()
    assert cp.regions["q"] == Position("other", 604) and cp.senders["slow"].key == (60, "r", 0)
    m.stop()
    m.join()


def test_a_batch_in_a_senders_hands_is_on_disk_before_it_leaves_memory(tmp_path: Path) -> None:
    """A sender took a batch and hangs on it (read, not acknowledged) while memory
    turns over: the batch must be in the backlog, or a crash would lose it."""
    gate = threading.Event()
    fast, slow = Recorder("fast"), Recorder("slow", gate)
    m, stream, b = make(tmp_path, [fast, slow])
    for ts in range(1, 11):
        m.dispatch(txn(ts))
    m.start()
    wait(lambda: slow.queue.next == 11)  # it holds items 1..10
    for ts in range(11, 301):
        m.dispatch(txn(ts))
    wait(lambda: len(fast.got) == 300)
    assert stream.base > 11  # its batch left memory
    cp = m.advance()
    slow.crashed.set()
    m.stop()
    gate.set()
    m.join()
    assert cp.senders["slow"].offset == 0 and slow.got == []
    slow2 = Recorder("slow")
    m2, _, _ = make(tmp_path, [Recorder("fast"), slow2], cp=cp)
    m2.start()
    wait(lambda: len(slow2.got) >= 300 - (cp.backlog.next - 1 if cp.backlog else 0))
    assert slow2.got[:10] == [("r", ts) for ts in range(1, 11)]
    m2.stop()
    m2.join()


def test_a_start_refuses_a_damaged_backlog_and_rebuild_backlog_reads_the_sources_again(tmp_path: Path) -> None:
    """Through the composition root, as ``python -m capturer [--rebuild-backlog]`` builds it
    (the constructor connects to nothing)."""
    from capturer.app import Capturer, load_config
    from capturer.pipeline.backlog import BacklogMark
    from capturer.pipeline.checkpoint import SenderPosition

    (tmp_path / "senderConfig.cfg").write_text(
        f"[global]\ntype=local\n[local]\nfilepath={tmp_path / 'out.jsonl'}\n")
    (tmp_path / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={tmp_path / 'cp.json'}\nsenderConfig={tmp_path / 'senderConfig.cfg'}\n"
        "filterRuleDict=\nhttpPort=0\n[region:r]\nhost=127.0.0.1\nport=1\nuser=u\nserver_id=5\n")
    slow_cut = {"r": Position("bin.000001", 400)}
    cp = Checkpoint(700, {"r": Position("bin.000001", 900)}, {"r": 900},
                    {"local": SenderPosition(3, (400, "r", 0), 400, slow_cut, {"r": 400})},
                    BacklogMark(9, "00000000000000000004.seg", 100))
    save_checkpoint(tmp_path / "cp.json", cp)
    cfg = load_config(tmp_path / "config.cfg")
    with pytest.raises(BacklogError, match=r"cp.json.backlog.*segment .*00000000000000000004.seg is missing.*"
                                           r"--rebuild-backlog"):
        Capturer(cfg)
    (tmp_path / "cp.json.backlog").mkdir()
    (tmp_path / "cp.json.backlog" / "junk").write_text("x")
    cap = Capturer(cfg, rebuild_backlog=True)
    assert cap.regions[0].ctx.start == Position("bin.000001", 400)  # the sources again from the slowest sender
    assert cap.manager.cursors["local"].next == 9 and cap.manager.cursors["local"].skip_key == (400, "r", 0)
    assert list(tmp_path.glob("cp.json.backlog.broken-*"))


def test_segments_stay_until_no_checkpoint_on_disk_needs_them(tmp_path: Path) -> None:
    """The senders' acknowledgements run ahead of the checkpoint file: a segment they all
    passed is removed only once a written checkpoint no longer needs it (a kill -9 before
    the next checkpoint restarts from the one on disk, which still reads it)."""
    from capturer.pipeline.checkpoint import SenderPosition

    b = Backlog(tmp_path / "bl", 1 << 30, segment_bytes=2000)
    b.open(None, None)
    for off in range(1, 201):
        b.append(off, off, stream_key(txn(off)), txn(off), False)
    assert len(b.segments) > 3
    b.keep_for_checkpoint({"a": SenderPosition(offset=10), "gone": SenderPosition(offset=1, detached=True)},
                          {"a"}, 201)
    b.release(150)  # acknowledged in memory up to 149; the checkpoint on disk says 10
    assert b.segments[0].first <= 11 and b.segment_for(11).path.exists()
    b.keep_for_checkpoint({"a": SenderPosition(offset=149)}, {"a"}, 201)
    b.release(150)
    assert all(s.last >= 150 for s in b.segments)


def test_a_sender_at_a_commit_ts_without_a_time_has_no_lag(tmp_path: Path) -> None:
    """A first start's copy sends its CREATE statements at commit_ts 1, 2, ... (right after a
    floor of 0): a sender that has acknowledged only those has no lag to show, not the ~56
    years since the epoch (/status said lag_seconds 1795977619 after a kill -9 mid-copy)."""
    s = Recorder("s")
    m, _, _ = make(tmp_path, [s])
    s.acked_ts = 11
    assert m.status()["s"]["lag_seconds"] is None
    s.acked_ts = (int(time.time() * 1000) - 2000) << 18
    assert 1.5 <= m.status()["s"]["lag_seconds"] < 3600
