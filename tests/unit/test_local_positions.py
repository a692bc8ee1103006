"""The file sender's own position (senders/local/sender.py ``resume_key``): after a
crash it cuts what follows its last whole transaction and says where that is, in
both formats; a batch retried after a failed write is not written twice."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from capturer.model import Ddl, Position, Txn
from capturer.pipeline.checkpoint import Checkpoint
from capturer.pipeline.fanout import SenderManager
from tests.unit.test_senders_unit import local, txn


def _crash_in_third(tmp: Path, fmt: str, keep: int) -> tuple[bytes, Path]:
    """Write txns 1 and 2 whole, then txn 3 of which only ``keep`` bytes land."""
    s = local(tmp, format=fmt)
    s.open()
    s.send([txn(1, n=3), txn(2, n=2)])
    s.close()
    out = tmp / "out.jsonl"
    good = out.read_bytes()
    s = local(tmp, format=fmt)
    s.open()
    s.send([txn(3, n=3)])
    s.close()
    out.write_bytes(out.read_bytes()[:len(good) + keep])
    return good, out


@pytest.mark.parametrize("fmt", ["json", "sql"])
@pytest.mark.parametrize("keep", [0, 5, 80, 200])
def test_a_transaction_cut_short_is_cut_and_the_key_is_the_last_whole_one(tmp_path: Path, fmt: str, keep: int) -> None:
    good, out = _crash_in_third(tmp_path, fmt, keep)
    s = local(tmp_path, format=fmt)
    s.open()
    assert s.resume_key() == (2, "r", 0)
    assert out.read_bytes() == good
    s.send([txn(3, n=3)])  # the stream hands it what comes after its key
    s.close()
    if fmt == "json":
        ids = [(d["commit_ts"], d["seq"]) for d in map(json.loads, out.read_text().splitlines())]
        assert len(ids) == len(set(ids)) == 8


def test_a_whole_file_keeps_everything_and_a_ddl_prelude_has_its_sub(tmp_path: Path) -> None:
    for fmt in ("json", "sql"):
        d = tmp_path / fmt
        d.mkdir()
        s = local(d, format=fmt)
        s.open()
        ddl = Txn("r", 5, Position("bin.000001", 500), (), Ddl("d", "ALTER TABLE t\n  ADD c INT", "t", seq=-1))
        s.send([txn(4), ddl])
        s.close()
        before = (d / "out.jsonl").read_bytes()
        s = local(d, format=fmt)
        s.open()
        assert s.resume_key() == (5, "r", -1), fmt
        s.close()
        assert (d / "out.jsonl").read_bytes() == before


def test_after_a_rotation_the_key_comes_from_the_newest_rotated_file(tmp_path: Path) -> None:
    s = local(tmp_path, rotate_mb=1)
    s.open()
    from capturer.model import RowChange
    from tests.unit.test_senders_unit import S

    big = Txn("r", 7, Position("f", 9), tuple(RowChange(S, "insert", None, {"id": i, "v": "y" * 300})
                                               for i in range(4000)))
    s.send([big])
    s.close()
    assert (tmp_path / "out.jsonl.000001").exists() and (tmp_path / "out.jsonl").stat().st_size == 0
    s = local(tmp_path)
    s.open()
    assert s.resume_key() == (7, "r", 0)
    s.close()


def test_a_batch_retried_after_a_failed_write_is_not_written_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lines of a batch land, then its fsync fails: the retry must not write them again."""
    import senders.local.sender as mod

    real = mod.os.fsync
    calls = {"n": 0}

    def flaky_fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(5, "injected: fsync failed after the write")
        real(fd)

    monkeypatch.setattr(mod.os, "fsync", flaky_fsync)
    s = local(tmp_path)
    s.batch_rows = 40
    s.max_backoff = 0.05
    m = SenderManager([s], Checkpoint(), threading.Event())
    for ts in range(1, 31):
        m.dispatch(txn(ts, n=3))
    m.start()
    deadline = time.time() + 10
    while s.acked_seq < 30 and time.time() < deadline:
        time.sleep(0.02)
    m.stop()
    m.join()
    assert s.retries >= 1 and s.acked_seq == 30
    ids = [(d["commit_ts"], d["seq"]) for d in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())]
    assert len(ids) == len(set(ids)) == 90


def test_lines_with_base64_values_and_a_column_named_last(tmp_path: Path) -> None:
    """The end of a transaction is the top-level "last": true, wherever it is on the line."""
    from capturer.model import ColumnInfo, RowChange, TableSchema

    s2 = TableSchema("d", "t2", ("id", "last", "raw"), ("id",), column_types=(3, 1, 252),
                     column_info=(ColumnInfo(3), ColumnInfo(1), ColumnInfo(252, binary=True)))
    t1 = Txn("r", 1, Position("bin.000001", 100), (RowChange(s2, "insert", None, {"id": 1, "last": True,
                                                                                 "raw": b"\xff\x00"}),))
    t2 = Txn("r", 2, Position("bin.000001", 200), tuple(
        RowChange(s2, "insert", None, {"id": i, "last": True, "raw": b"\x01"}) for i in range(2, 5)))
    s = local(tmp_path)
    s.open()
    s.send([t1])
    s.close()
    good = (tmp_path / "out.jsonl").read_bytes()
    s = local(tmp_path)
    s.open()
    s.send([t2])
    s.close()
    out = tmp_path / "out.jsonl"
    out.write_bytes(out.read_bytes()[:len(good) + 300])  # two of t2's three lines, each with "last": true nested
    s = local(tmp_path)
    s.open()
    assert s.resume_key() == (1, "r", 0) and out.read_bytes() == good
    s.close()


def test_it_never_cuts_what_the_checkpoint_says_was_acknowledged(tmp_path: Path) -> None:
    from capturer.errors import SinkError

    s = local(tmp_path)
    s.open()
    s.send([txn(1, n=3), txn(2, n=2)])
    state = s.position_state
    s.close()
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"not what this sender wrote\n")  # someone else's hand
    s = local(tmp_path)
    s.resume_state = state
    s.open()
    with pytest.raises(SinkError, match="acknowledged") as err:
        s.resume_key()
    assert not err.value.retriable and out.read_bytes() == b"not what this sender wrote\n"
    s.close()
