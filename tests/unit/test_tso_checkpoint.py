from __future__ import annotations

import json
from pathlib import Path

import pytest

from capturer.errors import CheckpointError
from capturer.model import Position, make_ts, ts_logical, ts_physical_ms
from capturer.pipeline.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from capturer.regions.clock import LiftJournal, RegionClock


def test_ts_shape() -> None:
    ts = make_ts(1_700_000_000_123, 5)
    assert ts_physical_ms(ts) == 1_700_000_000_123 and ts_logical(ts) == 5
    assert ts < 1 << 63


def test_commit_ts_strictly_increasing_even_when_source_time_steps_back() -> None:
    c = RegionClock("r", 0, LiftJournal(None))
    seen = [c.commit(s, Position("f", 100 + i)) for i, s in enumerate([100, 100, 99, 101, 101, 50])]
    assert all(a < b for a, b in zip(seen, seen[1:]))
    assert ts_physical_ms(seen[0]) == 100_000


def test_heartbeat_lift_is_replayed_identically(tmp_path: Path) -> None:
    """A txn lifted above a heartbeat gets the same commit_ts when re-read after a crash."""
    journal_path = tmp_path / "cp.lifts"
    c = RegionClock("r", 0, LiftJournal(journal_path))
    positions = [Position("f", 100 * i) for i in range(1, 6)]
    original = [c.commit(100, positions[0]), c.commit(100, positions[1])]
    floor = original[-1]  # pretend the checkpoint is here
    hb = c.heartbeat(105_000)  # an idle promise: nothing at or below 105 s follows
    original.append(c.commit(101, positions[2]))  # a late txn: must be lifted above hb
    original.append(c.commit(106, positions[3]))
    original.append(c.commit(106, positions[4]))
    assert original[2] > hb and c.lifts == 1
    # replay from the checkpoint (floor) with the journal, without the heartbeat
    replay = RegionClock("r", floor, LiftJournal(journal_path))
    again = [replay.commit(s, p) for s, p in zip([101, 106, 106], positions[2:])]
    assert again == original[2:]


def test_journal_prune_and_torn_line(tmp_path: Path) -> None:
    p = tmp_path / "j"
    j = LiftJournal(p)
    j.record("r", Position("f", 10), 5)
    j.record("r", Position("f", 20), 6)
    j.prune({"r": Position("f", 10)})
    assert LiftJournal(p).get("r", Position("f", 10)) == 0
    assert LiftJournal(p).get("r", Position("f", 20)) == 6
    with open(p, "a") as f:
        f.write('{"region": "r", "fi')  # kill -9 mid-write
    assert LiftJournal(p).get("r", Position("f", 20)) == 6


def test_checkpoint_roundtrip_atomic(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "cp.json"
    assert load_checkpoint(p) is None
    cp = Checkpoint(make_ts(1_700_000_000_000), {"a": Position("bin.000002", 1234, "0-1-9")})
    save_checkpoint(p, cp)
    assert load_checkpoint(p) == cp
    assert not list(p.parent.glob(".*tmp"))
    d = json.loads(p.read_text())
    assert d["commit_time"].startswith("2023-11-14")


@pytest.mark.parametrize(
    "content,needle",
    [
        ("", "not valid JSON"),
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"version": 1, "commit_ts": -1, "regions": {}}', "commit_ts"),
        ('{"version": 1, "commit_ts": 5, "regions": {"a": {"file": "", "pos": 4}}}', "regions.a"),
        ('{"version": 9, "commit_ts": 5, "regions": {}}', "unsupported checkpoint version"),
    ],
)
def test_corrupt_checkpoint_is_an_error_never_a_reset(tmp_path: Path, content: str, needle: str) -> None:
    p = tmp_path / "cp.json"
    p.write_text(content)
    with pytest.raises(CheckpointError) as ei:
        load_checkpoint(p)
    assert str(p) in str(ei.value) and needle in str(ei.value)
