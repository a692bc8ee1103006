"""capturer/regions/copies.py: the copies asked for, kept until a checkpoint carries them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from capturer.errors import CheckpointError
from capturer.model import TableProgress
from capturer.regions.copies import CopyJournal


def got(region: str, run: str, *tables: str, truncate: bool = False) -> dict[str, Any]:
    return {"regions": {region: {"run": run, "tables": list(tables)}}, "missing": [], "truncate": truncate}


def pos(*runs: tuple[str, str]) -> Any:
    return SimpleNamespace(snapshot=tuple(TableProgress("d", t, run) for run, t in runs))


def test_a_copy_leaves_once_a_checkpoint_carries_its_run_or_its_end(tmp_path: Path) -> None:
    path = tmp_path / "cp.json.copies"
    j = CopyJournal(path)
    j.add(got("r1", "A", "d.x", "d.y"), "filter reload")
    j.add(got("r2", "B", "d.z", truncate=True), "on demand")
    assert [(e["region"], e["table"], e["run"], e["truncate"]) for e in CopyJournal(path).entries] == [
        ("r1", "d.x", "A", False), ("r1", "d.y", "A", False), ("r2", "d.z", "B", True)]
    running = {("r1", "A"): True, ("r2", "B"): True}
    clocks = {"r1": 100, "r2": 200}

    def settle(positions: dict[str, Any], ts: dict[str, int]) -> None:
        j.settle(positions, ts, lambda r, run: running.get((r, run)), lambda r: clocks[r])

    settle({}, {"r1": 10, "r2": 10})  # nothing carried, nothing finished
    assert len(CopyJournal(path).entries) == 3
    settle({"r1": pos(("A", "x"))}, {"r1": 10})  # the checkpoint carries run A: both of its tables go
    assert [e["run"] for e in CopyJournal(path).entries] == ["B"]
    running[("r2", "B")] = False  # B finished (left the positions) by r2's clock 200
    settle({}, {"r2": 150})  # the checkpoint is before that
    assert [e["run"] for e in CopyJournal(path).entries] == ["B"]
    clocks["r2"] = 999  # (the finish was first seen at 200: a later clock does not move it)
    settle({}, {"r2": 200})
    assert CopyJournal(path).entries == [] and not path.exists()


def test_a_start_asks_again_for_what_the_restored_positions_do_not_carry(tmp_path: Path) -> None:
    path = tmp_path / "cp.json.copies"
    j = CopyJournal(path)
    j.add(got("r1", "A", "d.x"), "filter reload")
    j.add(got("r2", "B", "d.z"), "on demand")
    j.add(got("r1", "C", "d.x"), "on demand")  # a newer run of d.x replaces A's line
    assert [e["run"] for e in j.entries] == ["B", "C"]
    again = CopyJournal(path).to_ask_again({"r2": pos(("B", "z"))})
    assert [(e["region"], e["table"], e["run"]) for e in again] == [("r1", "d.x", "C")]
    j.drop(again)
    assert [e["run"] for e in CopyJournal(path).entries] == ["B"]


def test_a_damaged_side_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "cp.json.copies"
    path.write_text('{"region": "r1"}\n{"region": "r1", "table": "d.x", "run": "A"}\n')
    with pytest.raises(CheckpointError, match=r"cp\.json\.copies:1: corrupt list of copies asked for"):
        CopyJournal(path)
    path.write_text('{"region": "r1", "table": "d.x", "run": "A"}\n{"region": "r1", "tab')  # torn last line
    assert [e["run"] for e in CopyJournal(path).entries] == ["A"]


@pytest.mark.parametrize(("sql", "want"), [
    ("RENAME TABLE d.stage TO d.live", [(("d", "stage"), ("d", "live"))]),
    ("rename table `a,b` to `c`, x.y TO z", [(("cur", "a,b"), ("cur", "c")), (("x", "y"), ("cur", "z"))]),
    ("/* c */ ALTER TABLE stage RENAME TO live;", [(("cur", "stage"), ("cur", "live"))]),
    ("ALTER ONLINE TABLE stage RENAME AS `d2`.`li``ve`", [(("cur", "stage"), ("d2", "li`ve"))]),
    ("ALTER TABLE stage RENAME COLUMN a TO b", []),
    ("ALTER TABLE stage RENAME INDEX a TO b", []),
    ("RENAME USER a TO b", []),
    ("RENAME TABLE a TO b, c", []),
])
def test_renamed_tables(sql: str, want: list[Any]) -> None:
    from capturer.model.ddl import renamed_tables

    assert renamed_tables(sql, "cur") == want
