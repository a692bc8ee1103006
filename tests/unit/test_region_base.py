"""What the region kinds share (capturer/regions/base.py, journal.py): the journal
keyed by position, the clock set-up and heartbeats, closing on exit, the row
buffer that spills, the checkpoint's position-kind check."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from capturer.errors import CheckpointError, FatalSourceError, SourceError
from capturer.model import Heartbeat, Item, LsnPosition, Position, RowChange, TableSchema, TsPosition, Txn
from capturer.model.spill import DEFAULT_CHUNK_ROWS
from capturer.regions.baikaldb.region import Epoch, SchemaJournal
from capturer.regions.baikaldb.schema import FieldDef, TableDef
from capturer.regions.base import (
    ChangeBuffer,
    ClockedRegion,
    PositionJournal,
    Region,
    RegionContext,
    close_quietly,
    require_start_kind,
)
from capturer.regions.clock import LiftJournal
from capturer.regions.postgresql import pgoutput as po
from capturer.regions.postgresql.relations import RelationJournal, RelDef
from capturer.util.bqueue import WeightedQueue


class PairJournal(PositionJournal[int, str]):
    """A journal of ``{at, v}`` lines, as a region kind would define one."""

    what = "pair journal"

    def parse(self, d: Any) -> tuple[int, str]:
        return int(d["at"]), str(d["v"])

    def dump(self, key: int, value: str) -> dict[str, Any]:
        return {"at": key, "v": value}


def ctx(tmp_path: Path | None = None, **kw: Any) -> RegionContext:
    return RegionContext(WeightedQueue(1_000_000), kw.pop("start", None), kw.pop("floor", 0),
                         kw.pop("journal", LiftJournal(None)), threading.Event(),
                         state_path=tmp_path / "cp.json" if tmp_path else None, **kw)


def drain(c: RegionContext) -> list[Item]:
    return c.out.get_many(1_000_000, timeout=0)


# --- the journal keyed by position -------------------------------------------------

def test_journal_appends_reads_back_and_writes_nothing_for_a_value_it_has(tmp_path: Path) -> None:
    p = tmp_path / "j"
    j = PairJournal(p)
    assert j.put(10, "a") and j.put(20, "b")
    assert p.read_text().splitlines() == ['{"at": 10, "v": "a"}', '{"at": 20, "v": "b"}']
    assert not j.put(10, "a")  # already so: no line
    assert len(p.read_text().splitlines()) == 2
    j.put(10, "c")  # a key written again: its last value, in its first place
    again = PairJournal(p)
    assert again.items() == [(10, "c"), (20, "b")] and again.lookup(20) == "b" and again.lookup(30) is None


def test_journal_skips_a_torn_last_line(tmp_path: Path) -> None:
    p = tmp_path / "j"
    PairJournal(p).put(10, "a")
    with open(p, "a") as f:
        f.write('{"at": 20, "v"')  # kill -9 during an append
    assert PairJournal(p).items() == [(10, "a")]


def test_journal_refuses_a_bad_line_before_the_last_naming_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "j"
    p.write_text('{"at": 10, "v": "a"}\ngarbage\n{"at": 30, "v": "c"}\n')
    with pytest.raises(CheckpointError, match=rf"^{p}:2: corrupt pair journal"):
        PairJournal(p)
    p.write_text('{"at": 10, "v": "a"}\n{"v": "no key"}\n{"at": 30, "v": "c"}\n')  # JSON, but not an entry
    with pytest.raises(CheckpointError, match=rf"^{p}:2: corrupt pair journal"):
        PairJournal(p)


def test_journal_forget_prunes_at_a_position_and_rewrites_only_when_something_went(tmp_path: Path) -> None:
    p = tmp_path / "j"
    j = PairJournal(p)
    for at in (10, 20, 30):
        j.put(at, str(at))
    assert j.forget(lambda e: [k for k in e if k <= 20]) == 2
    assert p.read_text() == '{"at": 30, "v": "30"}\n' and PairJournal(p).items() == [(30, "30")]
    before = p.stat().st_mtime_ns
    p.touch()
    touched = p.stat().st_mtime_ns
    assert j.forget(lambda e: [k for k in e if k <= 20]) == 0
    assert p.stat().st_mtime_ns == touched >= before  # nothing went: not rewritten
    assert not (tmp_path / "j.tmp").exists()


def test_journal_in_memory_only() -> None:
    j = PairJournal(None)
    j.put(1, "x")
    j.forget(lambda e: list(e))
    assert j.items() == []


def test_the_kinds_journals_read_files_written_before_they_shared_one(tmp_path: Path) -> None:
    """The lines the lift, relation and schema journals wrote before they were built on
    PositionJournal are read as before, and new lines are written in the same shape."""
    lifts = tmp_path / "cp.json.lifts"
    lifts.write_text('{"region": "r", "file": "f.000001", "pos": 10, "commit_ts": 5}\n'
                     '{"region": "pg", "file": "lsn", "pos": 77, "commit_ts": 9}\n')
    lj = LiftJournal(lifts)
    assert lj.get("r", Position("f.000001", 10)) == 5 and lj.get("pg", LsnPosition(77)) == 9
    assert lj.entries("r") == [("f.000001", 10, 5)]
    lj.record("r", Position("f.000001", 20), 6)
    assert json.loads(lifts.read_text().splitlines()[-1]) == {"region": "r", "file": "f.000001", "pos": 20,
                                                              "commit_ts": 6}
    lj.prune({"r": Position("f.000001", 10)})
    assert LiftJournal(lifts).items() == [(("pg", "lsn", 77), 9), (("r", "f.000001", 20), 6)]

    rels = tmp_path / "cp.json.postgresql.p"
    cols = [["id", 23, -1, True]]
    line = {"lsn": "0/64", "rel": {"relid": 1, "db": "s", "table": "t", "replident": "d", "columns": cols,
                                   "pk": ["id"], "unique_keys": []}}
    rels.write_text(json.dumps(line) + "\n")
    rj = RelationJournal(rels)
    assert rj.state_at(100)[1].columns == (po.Column("id", 23, -1, True),) and rj.state_at(99) == {}
    rj.record(200, RelDef(1, "s", "t2", "d", (po.Column("id", 23, -1, True),), ("id",)))
    assert json.loads(rels.read_text().splitlines()[-1])["lsn"] == "0/C8"
    rj.prune(200)
    assert [json.loads(x)["rel"]["table"] for x in rels.read_text().splitlines()] == ["t2"]

    schemas = tmp_path / "cp.json.baikaldb.b"
    tdef = TableDef(7, "ns", "db", "t", 1, (FieldDef(1, "id", 5),), ("id",))
    schemas.write_text(json.dumps({"epoch": 1, "tables": {"7": tdef.to_json()}}) + "\n"
                       + json.dumps({"epoch": 2, "tables": {"7": tdef.to_json()}, "from_ts": 50, "at_ts": 51}) + "\n")
    sj = SchemaJournal(schemas)
    assert sj.epoch(1) == Epoch({7: tdef}) and sj.next_epoch() == 3
    assert sj.scheduled_after(1, 40) == [(2, Epoch({7: tdef}, 50, 51))]
    sj.write(3, Epoch({7: tdef}, first=True))
    assert json.loads(schemas.read_text().splitlines()[-1]) == {"epoch": 3, "tables": {"7": tdef.to_json()},
                                                                "first": True}
    sj.prune(2)
    assert [json.loads(x)["epoch"] for x in schemas.read_text().splitlines()] == [2, 3]


def test_relation_journal_prune_keeps_each_tables_newest_definition_at_the_position(tmp_path: Path) -> None:
    p = tmp_path / "j"
    j = RelationJournal(p)
    col = (po.Column("id", 23, -1, True),)
    a1, a2, b1 = (RelDef(1, "s", "a", "d", col, ("id",)), RelDef(1, "s", "a2", "d", col, ("id",)),
                  RelDef(2, "s", "b", "d", col, ("id",)))
    j.record(100, a1)
    j.record(100, b1)
    j.record(200, a2)
    j.record(300, RelDef(1, "s", "a3", "d", col, ("id",)))
    j.prune(250)  # a1 is superseded by a2 at or before 250; b1 stays (its table's newest); 300 is after
    assert [(k[0], v.table) for k, v in RelationJournal(p).items()] == [(100, "b"), (200, "a2"), (300, "a3")]
    assert RelationJournal(p).state_at(250) == {1: a2, 2: b1}


# --- the clock and heartbeats -------------------------------------------------------

class Clocked(ClockedRegion):
    """A region of made-up transactions: (source seconds, position) pairs."""

    def __init__(self, c: RegionContext):
        super().__init__("r", c)

    def commit(self, source_s: int, pos: Position) -> int:
        ts = self.clock.commit(source_s, pos)
        self._deliver(Txn(self.name, ts, pos, (), None, source_s))
        return ts


def test_a_clocked_region_gives_the_same_commit_ts_on_replay(tmp_path: Path) -> None:
    lifts = tmp_path / "cp.json.lifts"
    first = Clocked(ctx(journal=LiftJournal(lifts)))
    p = [Position("f", 100 * i) for i in range(1, 5)]
    sent = [first.commit(100, p[0])]
    floor = sent[0]  # the checkpoint
    first._clock_heartbeat(105_000, p[0])  # idle: a promise up to 105 s
    promise = drain(first.ctx)[-1].commit_ts
    sent += [first.commit(101, p[1]), first.commit(101, p[2]), first.commit(106, p[3])]
    assert sent[1] > promise and first.clock.lifts == 1  # the late one was lifted above the promise (journaled)
    again = Clocked(ctx(floor=floor, journal=LiftJournal(lifts)))  # replay from the checkpoint, no heartbeat
    assert [again.commit(s, x) for s, x in zip([101, 101, 106], p[1:])] == sent[1:]


def test_a_clocked_region_starts_above_its_floor_and_what_was_promised() -> None:
    r = Clocked(ctx(floor=1000, promised=5000))
    r._alive(Position("f", 4))
    hb = drain(r.ctx)[0]
    assert isinstance(hb, Heartbeat) and hb.commit_ts == 5000 and r.caught_up_at == 0.0  # nothing new promised
    assert r.commit(0, Position("f", 10)) == 5001  # above the promise
    assert Clocked(ctx(floor=1000)).commit(0, Position("f", 10)) == 1001  # above the floor


def test_heartbeats_and_delivered_transactions_move_the_region() -> None:
    r = Clocked(ctx())
    r._clock_heartbeat(2_000, Position("f", 50))
    assert r.position == Position("f", 50) and r.caught_up_at > 0
    r.commit(1, Position("f", 60))
    r.commit(1, Position("f", 70))
    items = drain(r.ctx)
    assert [type(i).__name__ for i in items] == ["Heartbeat", "Txn", "Txn"]
    assert items[0].commit_ts < items[1].commit_ts < items[2].commit_ts  # type: ignore[union-attr]
    assert (r.position, r.last_commit_ts, r.txns) == (Position("f", 70), items[2].commit_ts, 2)  # type: ignore[union-attr]


def test_heartbeats_are_counted_shown_and_logged_at_most_once_a_period(caplog: pytest.LogCaptureFixture) -> None:
    """Operators see that heartbeats fire: counted, their age in the status, and a line
    at INFO at the first one and then at most once per ``HEARTBEAT_LOG_SECONDS`` (with
    how many fired since and where the region stands)."""
    caplog.set_level(logging.INFO, logger="capturer.regions.base")
    r = Clocked(ctx())
    assert r.status()["heartbeats"] == 0 and r.status()["heartbeat_age_seconds"] is None
    for i in range(5):
        r._clock_heartbeat(2_000 + i, Position("f", 50 + i))
    r._alive(Position("f", 60))  # (a position moved past filtered-out work: a heartbeat too)

    def lines() -> list[str]:
        return [x.getMessage() for x in caplog.records if "heartbeats:" in x.getMessage()]

    assert lines() == ["region r: heartbeats: 1 since the start, position f:50"]
    st = r.status()
    assert st["heartbeats"] == 6 and 0 <= st["heartbeat_age_seconds"] < 60, st
    when, count = r._heartbeats_logged
    r._heartbeats_logged = (when - r.HEARTBEAT_LOG_SECONDS, count)  # a period went by
    r._clock_heartbeat(3_000, Position("f", 70))
    r._clock_heartbeat(3_001, Position("f", 80))
    assert lines()[1:] == ["region r: heartbeats: 6 in the last 60 s, position f:70"]
    assert r.status()["heartbeats"] == 8


# --- lifecycle: what an attempt and a run held ----------------------------------------

class Scripted(Region):
    """Attempts that raise what ``script`` says; records the hooks' calls."""

    def __init__(self, script: list[BaseException | None]):
        super().__init__("s", ctx())
        self.script = script
        self.calls: list[str] = []

    def _connect_and_stream(self) -> None:
        self.calls.append("attempt")
        exc = self.script.pop(0) if self.script else None
        if exc is None:
            self.ctx.stop.set()
            return
        raise exc

    def _after_attempt(self) -> None:
        self.calls.append("after")

    def _on_exit(self) -> None:
        self.calls.append("exit")


@pytest.mark.parametrize("script,state", [
    ([SourceError("gone"), None], "stopped"),
    ([FatalSourceError("no")], "failed"),
    ([RuntimeError("bug")], "failed"),
])
def test_after_each_attempt_and_once_on_exit(script: list[BaseException | None], state: str) -> None:
    r = Scripted(script)
    r.RETRYABLE = (SourceError,)
    r.ctx.stop.wait = lambda t=None: False  # type: ignore[method-assign]  # (no back-off in a test)
    r.start()
    r.join(5)
    attempts = r.calls.count("attempt")
    assert r.calls == ["attempt", "after"] * attempts + ["exit"] and r.state == state


def test_close_quietly_finishes_or_closes_and_ignores_errors() -> None:
    done: list[str] = []

    class Pq:
        def finish(self) -> None:
            done.append("finish")

    class Broken:
        def close(self) -> None:
            done.append("close")
            raise OSError("already gone")

    close_quietly(None, Pq(), Broken(), Pq())
    assert done == ["finish", "close", "finish"]


# --- the row buffer that spills ---------------------------------------------------------

SCHEMA = TableSchema("d", "t", ("id",), ("id",))


def rows(a: int, b: int) -> list[RowChange]:
    return [RowChange(SCHEMA, "insert", None, {"id": i}) for i in range(a, b)]


def test_change_buffer_spills_at_spill_rows_and_hands_over_every_change_in_order(tmp_path: Path) -> None:
    b = ChangeBuffer(5, str(tmp_path), "region r")
    b.extend(rows(0, 4), "at f:1")
    assert b.spill is None and b.rows == 4
    b.append(rows(4, 5)[0], "at f:1")
    assert b.spill is not None and b.rows == 5  # reached spill_rows: on disk
    b.extend(rows(5, 8), "at f:2")  # in memory until the next chunk is full
    assert b.spill.rows == 5 and len(b.changes) == 3
    got, spilled = b.take()  # (the rest goes to disk too)
    assert spilled and [c.after for c in got] == [{"id": i} for i in range(8)]
    assert b.empty and b.take() == ((), False)


def test_change_buffer_spills_later_chunks_of_chunk_rows() -> None:
    b = ChangeBuffer(DEFAULT_CHUNK_ROWS + 5000, "", "region r")
    b.extend(rows(0, DEFAULT_CHUNK_ROWS + 5000), "at f:1")
    assert b.spill is not None and b.spill.chunk_rows == DEFAULT_CHUNK_ROWS and not b.changes
    b.extend(rows(0, DEFAULT_CHUNK_ROWS), "at f:1")  # then chunks of DEFAULT_CHUNK_ROWS, not of spill_rows
    assert not b.changes and b.rows == 2 * DEFAULT_CHUNK_ROWS + 5000
    got, spilled = b.take()
    assert spilled and len(got) == 2 * DEFAULT_CHUNK_ROWS + 5000


def test_change_buffer_never_spills_with_spill_rows_0() -> None:
    b = ChangeBuffer(0, "", "region r")
    b.extend(rows(0, 50_000), "at f:1")
    got, spilled = b.take()
    assert not spilled and isinstance(got, tuple) and len(got) == 50_000


# --- state files and the checkpoint's position kind ---------------------------------------

def test_state_file_is_next_to_the_checkpoint(tmp_path: Path) -> None:
    assert Clocked(ctx(tmp_path)).state_file("postgresql") == tmp_path / "cp.json.postgresql.r"
    assert Clocked(ctx()).state_file("postgresql") is None


def test_require_start_kind() -> None:
    require_start_kind(ctx(start=TsPosition(5)), "b", "baikaldb", TsPosition)
    require_start_kind(ctx(), "b", "baikaldb", TsPosition)
    with pytest.raises(CheckpointError, match=r"^checkpoint: regions.b is a mysql position, but \[region:b\] is "
                                              r"type=baikaldb; remove that entry"):
        require_start_kind(ctx(start=Position("f", 4)), "b", "baikaldb", TsPosition)
    with pytest.raises(CheckpointError, match=r"is type=postgresql$"):
        require_start_kind(ctx(start=Position("f", 4)), "p", "postgresql", LsnPosition, remedy="")


def test_a_transaction_first_read_after_a_crash_stays_above_a_chunk_inserted_before_it(tmp_path: Path) -> None:
    """A snapshot chunk goes out at "now" (RegionClock.extra), above the binlog's
    whole-second times; a sender may hold it. A transaction the crash kept from being
    read, in the same second, must not get a commit_ts below it after the restart (a
    sender that skips what is at or below its position would lose it): the chunk's
    commit_ts is journaled as a floor at its point, and a replay passing that point
    raises the clock again."""
    from capturer.model import Position, make_ts
    from capturer.regions.clock import LiftJournal, RegionClock

    j = LiftJournal(tmp_path / "lifts")
    second = 1_700_000_000
    c = RegionClock("r", 0, j)
    a = c.commit(second, Position("b.000001", 100))  # a transaction, then a chunk inserted after it
    chunk = c.extra(second * 1000 + 700, Position("b.000001", 100))
    assert chunk > a and chunk >= make_ts(second * 1000 + 700)
    # crash; the restart resumes from the checkpoint at (b.000001, 100), floor = a's commit_ts
    again = RegionClock("r", a, LiftJournal(tmp_path / "lifts"))
    d = again.commit(second, Position("b.000001", 200))  # never read before the crash, same second
    assert d <= chunk  # without the floor: below the chunk a sender may hold
    replay = RegionClock("r", a, LiftJournal(tmp_path / "lifts"))
    replay.at(Position("b.000001", 200))
    assert replay.commit(second, Position("b.000001", 200)) > chunk
    # the floor stays while the checkpoint is at its point, and goes once it is passed
    j2 = LiftJournal(tmp_path / "lifts")
    j2.prune({"r": Position("b.000001", 100)})
    [(at, floor)] = j2.floors("r")  # (reserved ahead: at or above the chunk, RegionClock's I1)
    assert at == ("b.000001", 100) and floor >= chunk
    j2.prune({"r": Position("b.000001", 150)})
    assert j2.floors("r") == []
