"""The region clock's floor journal (capturer/regions/clock.py, RegionClock's
invariants I1 and I2): a snapshot chunk's commit_ts survives kill -9 as a floor, so a
restart never stamps a transaction it had not delivered at or below a chunk a sender
may hold, and stamps every transaction it had delivered the same again, while chunks
within a floor reserved ahead cost no journal write."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from capturer.model import Position, make_ts
from capturer.regions.clock import LiftJournal, RegionClock

SECOND = 1_700_000_000


def _lines(p: Path) -> int:
    return len(p.read_text().splitlines()) if p.exists() else 0


def test_chunks_within_a_reservation_write_once_and_stay_below_the_durable_floor(tmp_path: Path) -> None:
    j = LiftJournal(tmp_path / "lifts")
    c = RegionClock("r", 0, j)
    here = Position("b.000001", 100)
    now = SECOND * 1000
    given = [c.extra(now + 10 * i, here) for i in range(50)]  # 50 chunks in half a second, one point
    assert given == sorted(set(given))
    assert _lines(tmp_path / "lifts") == 1  # one reservation, not one fsync per chunk
    assert LiftJournal(tmp_path / "lifts").floors("r")[0][1] >= given[-1]  # I1, as a restart reads it
    later = c.extra(now + RegionClock.RESERVE_MS + 1, here)  # past the reservation: a new one
    assert _lines(tmp_path / "lifts") == 2
    assert LiftJournal(tmp_path / "lifts").floors("r")[0][1] >= later


def test_a_transaction_after_a_reservation_settles_it_before_it_leaves(tmp_path: Path) -> None:
    """Not lifted, yet below the reserved floor: the floor goes down to the chunk's
    commit_ts first, or a replay (raised to the reserved floor) would stamp it anew."""
    j = LiftJournal(tmp_path / "lifts")
    c = RegionClock("r", 0, j)
    chunk = c.extra(SECOND * 1000 + 100, Position("b.000001", 100))
    t = c.commit(SECOND + 0, Position("b.000001", 200), derived=make_ts(SECOND * 1000 + 300))
    assert t == make_ts(SECOND * 1000 + 300) > chunk and c.lifts == 0
    assert LiftJournal(tmp_path / "lifts").floors("r") == [(("b.000001", 100), chunk)]
    replay = RegionClock("r", 0, LiftJournal(tmp_path / "lifts"))
    replay.at(Position("b.000001", 200))
    assert replay.commit(SECOND, Position("b.000001", 200), derived=make_ts(SECOND * 1000 + 300)) == t


def test_a_settled_floor_keeps_what_a_run_before_the_crash_journaled(tmp_path: Path) -> None:
    first = RegionClock("r", 0, LiftJournal(tmp_path / "lifts"))
    high = first.extra(SECOND * 1000 + 900, Position("b.000001", 100))  # delivered, then kill -9
    again = RegionClock("r", 0, LiftJournal(tmp_path / "lifts"))  # same point, an earlier "now"
    again.extra(SECOND * 1000 + 100, Position("b.000001", 100))
    again.at(Position("b.000001", 200))
    t = again.commit(SECOND, Position("b.000001", 200))
    assert t > high
    assert LiftJournal(tmp_path / "lifts").floors("r")[0][1] >= high


def _run(rng: random.Random, journal: Path, delivered: list[tuple[str, Position, int, int]],
         pos: int, steps: int, snaps: list[tuple[str, int]]) -> int:
    """One run of a region: replays what earlier runs delivered (each the same again),
    then ``steps`` random steps; after each, the journal's bytes and how much was
    delivered go into ``snaps`` (a crash point)."""
    c = RegionClock("r", 0, LiftJournal(journal))
    for kind, p, arg, ts in delivered:
        if kind == "txn":
            c.at(p)
            assert c.commit(arg, p) == ts, "a delivered transaction stamped anew after a restart (I2)"
    now = SECOND * 1000 + rng.randrange(0, 3000)
    for _ in range(steps):
        now += rng.choice((0, 1, 5, 40, 300, 900, 1500))
        op = rng.random()
        if op < 0.5:
            ts = c.extra(now, Position("b.000001", pos))
            delivered.append(("chunk", Position("b.000001", pos), now, ts))
        elif op < 0.9:
            pos += rng.randrange(1, 50)
            sec = now // 1000 - rng.choice((0, 0, 1, 3))  # the stream lags at times
            c.at(Position("b.000001", pos))
            ts = c.commit(sec, Position("b.000001", pos))
            delivered.append(("txn", Position("b.000001", pos), sec, ts))
        else:
            c.heartbeat(now - rng.choice((0, 500, 2000)))
        snaps.append((journal.read_text() if journal.exists() else "", len(delivered)))
    return pos


@pytest.mark.parametrize("seed", range(12))
def test_every_crash_point_keeps_the_floor_and_the_replay(tmp_path: Path, seed: int) -> None:
    """kill -9 after any step (also after a journal write whose item never left): the
    restart stamps every delivered transaction the same (I2) and a transaction it had
    not delivered above every item delivered (I1); then it runs on and crashes again."""
    rng = random.Random(seed)
    journal = tmp_path / "lifts"
    delivered: list[tuple[str, Position, int, int]] = []
    pos = _run(rng, journal, delivered, 100, 40, snaps := [])
    for k, (text, n) in enumerate(snaps):
        for kept in {n, snaps[k - 1][1] if k else 0}:  # the item left / the write done but not the item
            crashed = tmp_path / f"crash{k}-{kept}"
            crashed.write_text(text)
            got = delivered[:kept]
            last = max((p.pos for _, p, _, _ in got), default=100)
            top = max((ts for *_, ts in got), default=0)
            c = RegionClock("r", 0, LiftJournal(crashed))
            for kind, p, arg, ts in got:
                if kind == "txn":
                    c.at(p)
                    assert c.commit(arg, p) == ts, f"crash point {k}: a delivered transaction stamped anew (I2)"
            c.at(Position("b.000001", last + 1))
            assert c.commit(SECOND - 5, Position("b.000001", last + 1)) > top, \
                f"crash point {k}: a transaction never delivered at or below a delivered item (I1)"
    # a second run from the last crash point, crashing again: it keeps what the first journaled
    second = tmp_path / "second"
    shutil.copy(journal, second) if journal.exists() else None
    more: list[tuple[str, int]] = []
    _run(rng, second, delivered, pos, 30, more)
    c = RegionClock("r", 0, LiftJournal(second))
    for kind, p, arg, ts in delivered:
        if kind == "txn":
            c.at(p)
            assert c.commit(arg, p) == ts
    end = Position("b.000001", max(p.pos for _, p, _, _ in delivered) + 1)
    c.at(end)
    assert c.commit(SECOND - 5, end) > max(ts for *_, ts in delivered)
