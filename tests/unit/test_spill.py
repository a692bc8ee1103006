"""Big transactions on disk (capturer/model/spill.py)."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import threading
from pathlib import Path

import pytest

from capturer.model import Position, RowChange, TableSchema, Txn
from capturer.model.spill import SpilledChanges, SpillWriter

A = TableSchema("d", "a", ("id", "v"), ("id",), (), (3, 15))
B = TableSchema("d", "b", ("k", "w"), ("k",), (), (3, 246))


def changes(n: int) -> list[RowChange]:
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(RowChange(A, "insert", None, {"id": i, "v": f"é{i}"}))
        elif i % 3 == 1:
            out.append(RowChange(B, "update", {"k": i, "w": decimal.Decimal("1.50")},
                                 {"k": i + 1, "w": dt.datetime(2020, 1, 1, 0, 0, 0, i % 1000)}))
        else:
            out.append(RowChange(A, "delete", {"id": i, "v": b"\x00\xff"}, None))
    return out


def test_round_trip_in_chunks_and_nothing_left_on_disk(tmp_path: Path) -> None:
    original = changes(2500)
    w = SpillWriter(str(tmp_path), chunk_rows=1000)
    w.add(original[:1700])
    w.add(original[1700:])
    sp = w.finish()
    assert isinstance(sp, SpilledChanges)
    assert len(sp) == 2500 and bool(sp) and sp.memory_rows == 1000
    assert [len(c) for c in sp.chunks()] == [1000, 700, 800]
    assert list(sp) == original
    assert sp[0] == original[0] and sp[-1] == original[-1] and sp[1234] == original[1234]
    assert sp[10:13] == tuple(original[10:13])
    with pytest.raises(IndexError):
        sp[2500]
    # schemas are stored once and shared again on load, not copied per row
    loaded = list(sp)
    assert {id(ch.schema) for ch in loaded} == {id(A), id(B)}
    assert set(sp.schemas) == {A, B}
    # the file was unlinked at creation: nothing to clean up, even after a crash
    assert os.listdir(tmp_path) == []


def test_many_readers_at_once(tmp_path: Path) -> None:
    original = changes(3000)
    w = SpillWriter(str(tmp_path), chunk_rows=500)
    w.add(original)
    sp = w.finish()
    results: list[list[RowChange]] = []
    ts = [threading.Thread(target=lambda: results.append(list(sp))) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(results) == 4 and all(r == original for r in results)


def test_filter_map_and_weight(tmp_path: Path) -> None:
    original = changes(3000)
    w = SpillWriter(str(tmp_path), chunk_rows=500)
    w.add(original)
    sp = w.finish()
    only_a = sp.filter_map(lambda ch: ch if ch.table == "a" else None)
    assert isinstance(only_a, SpilledChanges) and list(only_a) == [c for c in original if c.table == "a"]
    few = sp.filter_map(lambda ch: ch if ch.table == "a" and ch.before is None and ch.after["id"] < 30 else None)
    assert isinstance(few, tuple) and len(few) == 10
    txn = Txn("r1", 5, Position("f", 4), sp)  # type: ignore[arg-type]
    assert txn.weight == 501 and txn.rows == 3000
    assert Txn("r1", 5, Position("f", 4), tuple(original)).weight == 3001
