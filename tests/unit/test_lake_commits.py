"""The Spark lake commits each batch once (senders/spark/commits.py): no JVM here.

The sender writes real Parquet files with pyarrow (writer=arrow; writer=spark
through a stand-in for Spark's DataFrame writer that writes what Spark writes: a
directory of part files, ``_SUCCESS`` and ``.crc`` files). Checked, as an outside
checker counts them: every change identity ``(_region, _commit_ts, _seq, _sub)``
once in each table's changelog, after a batch that fails half way and is retried
(in the sender's own process and with process=true), after crashes (kill -9 of a
child process at each step of a commit), with a torn commit log line; the
position (``resume_key``) is the committed batch's; compaction reads committed
files only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")

import pyarrow.parquet as pq

from capturer import config
from capturer.errors import SinkError
from capturer.model import Ddl, Position, RowChange, StreamKey, TableSchema, Txn, key_to_json, stream_key
from capturer.util import failpoints
from senders import CATALOG
from senders.spark import commits, lake
from senders.spark import sender as spark_sender
from senders.spark.sender import SparkSender

ROOT = Path(__file__).resolve().parents[2]
T = TableSchema("d", "t", ("id", "v"), ("id",), (), (3, 15))
U = TableSchema("d", "u", ("k", "w"), ("k",), (), (3, 3))
Identity = tuple[str, int, int, int]


def txns(n0: int, n: int, region: str = "r1") -> list[Txn]:
    """``n`` transactions, each with rows of two tables (a key change in every third:
    a delete and an insert, ``_sub`` 0 and 1)."""
    out = []
    for i in range(n0, n0 + n):
        ch = [RowChange(T, "insert", None, {"id": i, "v": f"x{i}"}),
              RowChange(U, "insert", None, {"k": i, "w": i * 2})]
        if i % 3 == 0:
            ch.append(RowChange(U, "update", {"k": i, "w": i * 2}, {"k": -1 - i, "w": i}))
        out.append(Txn(region, (1000 + i) << 18, Position("bin.000001", 100 + i), tuple(ch)))
    return out


def make(wh: Path, extra: str = "") -> SparkSender:
    p = wh.parent / "s.cfg"
    p.write_text(f"[global]\ntype=spark\n[spark]\nwarehouse={wh}\nbatch_interval=0\ncompaction_interval=0\n{extra}")
    (sc,) = config.load_sender_config(p, CATALOG)
    return SparkSender("spark", sc.options)


def identities(wh: Path) -> dict[str, Counter[Identity]]:
    """Per lake table, how often each identity is in its changelog: every Parquet file
    under ``changelog/`` (as an outside checker reads it, hidden names included)."""
    out: dict[str, Counter[Identity]] = {}
    for cl in sorted(wh.glob("*/changelog")):
        c: Counter[Identity] = Counter()
        for f in sorted(cl.rglob("*.parquet")):
            for r in pq.read_table(f, columns=["_region", "_commit_ts", "_seq", "_sub"]).to_pylist():
                c[(r["_region"], r["_commit_ts"], r["_seq"], r["_sub"])] += 1
        out[cl.parent.name] = c
    return out


def expected(batches: list[list[Txn]]) -> dict[str, Counter[Identity]]:
    """The identities the batches make, each once."""
    out: dict[str, Counter[Identity]] = {"d__t": Counter(), "d__u": Counter()}
    for b in batches:
        for t in b:
            for seq, ch in enumerate(t.changes):
                name = f"d__{ch.schema.table}"
                if ch.op == "update":  # (a key change: the delete and the insert half)
                    out[name][(t.region, t.commit_ts, seq, 0)] += 1
                    out[name][(t.region, t.commit_ts, seq, 1)] += 1
                else:
                    out[name][(t.region, t.commit_ts, seq, 0)] += 1
    return out


def staged(wh: Path) -> list[str]:
    return sorted(p.name for p in wh.glob(f"*/{commits.STAGING}/*"))


def log_lines(wh: Path) -> list[bytes]:
    return (wh / commits.META_DIR / commits.LOG_FILE).read_bytes().splitlines(keepends=True)


class FakeFrame:
    """What the sender uses of a Spark DataFrame; ``parquet`` writes what Spark's writer
    writes into a directory (part files, ``_SUCCESS``, ``.crc`` side files)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.write = self

    def coalesce(self, n: int) -> FakeFrame:
        return self

    def mode(self, m: str) -> FakeFrame:
        assert m == "overwrite"
        return self

    def parquet(self, path: str) -> None:
        d = Path(path)
        d.mkdir(parents=True)
        pq.write_table(self.table, d / "part-00000-abc-c000.snappy.parquet")
        (d / ".part-00000-abc-c000.snappy.parquet.crc").write_bytes(b"crc")
        (d / "_SUCCESS").write_bytes(b"")


class FakeSession:
    def createDataFrame(self, table: Any) -> FakeFrame:
        return FakeFrame(table)

    def stop(self) -> None:
        pass


@pytest.fixture
def fake_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_sender, "build_session", lambda options, wh: FakeSession())
    monkeypatch.setattr(spark_sender.lake, "register", lambda spark, st, db, wh: None)
    monkeypatch.setattr(spark_sender, "_java_found", lambda: True)


@pytest.fixture
def fail_at() -> Any:
    yield failpoints.set_rules
    failpoints.set_rules("")


# --- a batch that fails half way, retried in the same run ---------------------------------------------------------

@pytest.mark.parametrize("writer", ["arrow", "spark"])
@pytest.mark.parametrize("point", ["spark.stage=eio@2", "spark.commit=eio@1", "spark.committed=eio@1"])
def test_a_batch_that_fails_half_way_is_retried_and_each_identity_is_there_once(
        tmp_path: Path, fake_spark: None, fail_at: Any, writer: str, point: str) -> None:
    """Fails after the first table's file (stage@2), after every file but before the
    commit (commit@1), after the commit before the files are published (committed@1);
    the base's retry path (``_send_once_more``: resume_key, then send what the lake
    lacks) then leaves every identity once and one commit log line per batch."""
    wh = tmp_path / "wh"
    s = make(wh, f"writer={writer}\n")
    s.open()
    first, second = txns(0, 5), txns(5, 5)
    s.send(first)
    fail_at(point)
    with pytest.raises(SinkError, match="injected at failpoint"):
        s._send_once_more(list(second), [True])
    assert identities(wh) == expected([first])  # meanwhile: nothing of the second (not published)
    s._send_once_more(list(second), [False])  # the retry, as the base makes it
    s._send_once_more(txns(10, 2), [True])
    assert identities(wh) == expected([first, second, txns(10, 2)])
    assert staged(wh) == []
    assert [commits.Commit.parse(x.rstrip(b"\n")).batch for x in log_lines(wh)] == [1, 2, 3]  # type: ignore[union-attr]
    assert s.resume_key() == stream_key(txns(10, 2)[-1])
    s.close()


def test_a_failed_attempt_sent_again_directly_is_not_written_twice(tmp_path: Path, fail_at: Any) -> None:
    """Without the base's trimming (``send`` called again with the whole batch, as a new
    sender process gets it): the sender itself recovers and skips what the lake has."""
    wh = tmp_path / "wh"
    s = make(wh)
    s.open()
    b = txns(0, 4)
    fail_at("spark.committed=eio@1")
    with pytest.raises(SinkError):
        s.send(b)
    s.send(b)
    s.send(b + txns(4, 2))  # the first 4 are in the lake: only the 2 new ones are written
    assert identities(wh) == expected([b, txns(4, 2)])
    s.close()


# --- crashes: a child process killed at each step of a commit ------------------------------------------------------

def child_main(wh: str, start: int) -> None:
    """Run in a child (``crash_child``): two batches of 5 transactions from ``start``,
    the second killed by its failpoint."""
    s = make(Path(wh))
    s.open()
    s.send(txns(start, 5))
    s.send(txns(start + 5, 5))
    raise SystemExit("not killed")


def crash_child(wh: Path, point: str, start: int = 0) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{failpoints.ENV: point})
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_lake_commits as t; " \
           f"t.child_main({str(wh)!r}, {start})"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr[-3000:]


@pytest.mark.parametrize("point, committed", [
    ("spark.stage=kill@3", False),      # the second batch's first table staged
    ("spark.commit=kill@2", False),     # every file staged, the commit log line not written
    ("spark.committed=kill@2", True),   # the line written, the files not published
])
def test_a_crash_leaves_the_lake_at_its_last_committed_batch(tmp_path: Path, point: str, committed: bool) -> None:
    wh = tmp_path / "wh"
    (tmp_path / "wh").mkdir()
    crash_child(wh, point)
    assert staged(wh)  # the crash left the second batch's files staged
    # a reader sees committed batches only (the second: only once published)
    assert identities(wh) == expected([txns(0, 5)])
    s = make(wh)
    s.open()  # recovers: staged files of a committed batch published, the others removed
    assert staged(wh) == []
    want = [txns(0, 5), txns(5, 5)] if committed else [txns(0, 5)]
    assert identities(wh) == expected(want)
    key = s.resume_key()
    assert key == stream_key(want[-1][-1])
    # the stream resumes after the key: what the lake has is not sent again
    rest = [t for t in txns(5, 10) if stream_key(t) > key]
    s.send(rest)
    assert identities(wh) == expected([txns(0, 15)])
    s.close()


def test_a_reader_publishes_a_committed_batch_when_no_sender_runs(tmp_path: Path) -> None:
    """A crash between commit and publication: ``lake.register_tables`` (the CLI, a
    notebook) publishes it when no sender holds the lake, and leaves it to the sender
    when one does."""
    wh = tmp_path / "wh"
    wh.mkdir()
    crash_child(wh, "spark.committed=kill@2")
    s = make(wh)
    s.open()  # holds the lake (and recovers)
    s.close()
    crash_child(wh, "spark.committed=kill@2", start=10)  # the lake's batch 4 committed, not published
    # a sender runs: the reader leaves the lake alone
    holder = commits.CommitLog(wh)
    assert holder.lock()
    commits.recover_if_idle(wh)
    assert staged(wh)
    holder.unlock()
    assert identities(wh) == expected([txns(0, 15)])
    commits.recover_if_idle(wh)
    assert staged(wh) == []
    assert identities(wh) == expected([txns(0, 20)])


# --- the commit log ----------------------------------------------------------------------------------------------

def test_a_torn_commit_log_line_is_cut_and_its_batch_was_never_committed(tmp_path: Path) -> None:
    """A crash in the middle of the commit log's append (staged files present, the
    line half there): the batch is not committed; its files are removed, the line cut."""
    wh = tmp_path / "wh"
    wh.mkdir()
    crash_child(wh, "spark.committed=kill@2")  # batch 2 committed, its files staged
    path = wh / commits.META_DIR / commits.LOG_FILE
    lines = log_lines(wh)
    assert len(lines) == 2
    path.write_bytes(lines[0] + lines[1][:len(lines[1]) // 2])  # the second line torn
    s = make(wh)
    s.open()
    assert staged(wh) == [] and identities(wh) == expected([txns(0, 5)])
    assert s.resume_key() == stream_key(txns(0, 5)[-1])
    assert path.read_bytes() == lines[0]  # cut back to the last whole line
    s.send(txns(5, 5))
    assert identities(wh) == expected([txns(0, 10)])
    assert len(log_lines(wh)) == 2 and commits.CommitLog(wh).last().batch == 2  # type: ignore[union-attr]
    s.close()


@pytest.mark.parametrize("tail, ok", [
    (b"\0" * 300, True),                      # a power failure: the file's end zero-filled
    (b'{"batch":3,"key":[1,"r1",0]', True),   # half a line
    (b'{"batch":3}\n', True),                 # one whole line that is not a commit (no crc)
    (b"junk\nmore junk\n", False),            # two bad lines: not what a crash leaves
])
def test_what_follows_the_last_good_line(tmp_path: Path, tail: bytes, ok: bool) -> None:
    wh = tmp_path / "wh"
    s = make(wh)
    s.open()
    s.send(txns(0, 3))
    s.close()
    path = wh / commits.META_DIR / commits.LOG_FILE
    good = path.read_bytes()
    path.write_bytes(good + tail)
    s = make(wh)
    if not ok:
        with pytest.raises(SinkError, match="corrupt") as ei:
            s.open()
        assert not ei.value.retriable
        return
    s.open()
    assert path.read_bytes() == good and s.resume_key() == stream_key(txns(0, 3)[-1])
    s.close()


def test_a_commit_line_is_checked_by_its_crc() -> None:
    c = commits.Commit(7, (123 << 18, "r2", -1), {"a__b": ["part-b000000000007-0-x.snappy.parquet"]}, 9)
    line = c.line()
    assert line.endswith(b"\n") and b'"crc":"' in line
    assert commits.Commit.parse(line[:-1]) == commits.Commit(7, (123 << 18, "r2", -1), c.files, 9,
                                                             commits.Commit.parse(line[:-1]).time)  # type: ignore[union-attr]
    assert commits.Commit.parse(line[:-1].replace(b'"r2"', b'"r3"')) is None  # a flipped byte
    assert commits.Commit.parse(line[:-10]) is None


@pytest.mark.parametrize("piece", [16, 37, 101, 64 << 10])
@pytest.mark.parametrize("tail", [b"", b'{"batch":21,"key":[5', b"\0" * 700])
def test_the_last_line_is_found_whatever_the_size_of_the_pieces_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int, tail: bytes) -> None:
    monkeypatch.setattr(commits, "_TAIL", piece)
    log = commits.CommitLog(tmp_path)
    assert log.last() is None and log.lock()
    for b in range(1, 21):
        log.append(commits.Commit(b, (b << 18, "r1", 0), {"t": [f"part-b{b:012d}-0-x.snappy.parquet"] * (b % 4)}))
    good = log.path.read_bytes()
    log.path.write_bytes(good + tail)
    assert log.last() == commits.Commit.parse(good.splitlines()[-1])
    assert log.path.read_bytes() == good
    log.unlock()


def test_the_log_is_rewritten_with_its_last_lines_when_it_grows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commits, "MAX_LOG_BYTES", 2000)
    monkeypatch.setattr(commits, "KEEP_LINES", 3)
    wh = tmp_path / "wh"
    s = make(wh)
    s.open()
    for i in range(12):
        s.send(txns(i, 1))
    assert len(log_lines(wh)) < 12 and commits.CommitLog(wh).last().batch == 12  # type: ignore[union-attr]
    assert os.path.getsize(wh / commits.META_DIR / commits.LOG_FILE) <= 2000 + 400
    s.close()
    s = make(wh)
    s.open()
    assert s.resume_key() == stream_key(txns(11, 1)[0])
    s.close()


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    a, b = make(wh), make(wh)
    a.open()
    with pytest.raises(SinkError, match=f"another process \\(pid {os.getpid()}") as ei:
        b.open()
    assert ei.value.retriable
    a.close()
    b.open()
    b.close()


# --- compaction ------------------------------------------------------------------------------------------------------

def test_compaction_reads_committed_files_only(tmp_path: Path, fake_spark: None, fail_at: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction that comes after a failed attempt (files of one table staged) reads,
    as Spark reads the changelog directory, the committed batches only."""
    seen: dict[str, Counter[Identity]] = {}

    def compact(spark: Any, st: Any, db: str, wh: Path) -> Any:
        import pyarrow.dataset as ds  # (skips hidden names, as Spark's file listing does)

        t = ds.dataset(wh / st.name / "changelog", format="parquet").to_table(
            columns=["_region", "_commit_ts", "_seq", "_sub"]).to_pylist()
        seen[st.name] = Counter((r["_region"], r["_commit_ts"], r["_seq"], r["_sub"]) for r in t)
        return st

    monkeypatch.setattr(spark_sender.lake, "compact", compact)
    wh = tmp_path / "wh"
    s = make(wh)
    s.open()
    s.send(txns(0, 4))
    fail_at("spark.commit=eio@1")
    with pytest.raises(SinkError):
        s.send(txns(4, 4))
    assert staged(wh)
    s.compact_all()
    assert seen == expected([txns(0, 4)])
    s.close()
    # after a crash between commit and publication, the batch is published at open, then compacted
    (tmp_path / "wh2").mkdir()
    crash_child(tmp_path / "wh2", "spark.committed=kill@2")
    s = make(tmp_path / "wh2")
    s.open()
    s.compact_all()
    assert seen == expected([txns(0, 10)])
    s.close()


# --- process = true -----------------------------------------------------------------------------------------------

def test_a_sender_process_killed_after_its_commit_is_not_written_twice(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """process=true: the child commits a batch and dies (kill -9) before it answers. The
    capturer's side retries the whole batch in a new child (it cannot know); that
    child's sender finds the batch in the lake and writes nothing twice."""
    from senders.process import ProcessSender

    wh = tmp_path / "wh"
    p = tmp_path / "s.cfg"
    p.write_text(f"[global]\ntype=spark\n[spark]\nwarehouse={wh}\nbatch_interval=0\ncompaction_interval=0\n"
                 "process=true\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    ps = ProcessSender("spark", sc.options)
    monkeypatch.setenv(failpoints.ENV, "spark.committed=kill@2")
    ps.open()  # the first child: dies right after committing its second batch
    monkeypatch.delenv(failpoints.ENV)
    try:
        assert ps._with_retries("send", ps._send_once_more, txns(0, 3), [True])
        first_pid = ps.status()["process"]["pid"]
        assert ps._with_retries("send", ps._send_once_more, txns(3, 3), [True])
        assert ps.restarts == 1 and ps.status()["process"]["pid"] != first_pid
        assert ps._with_retries("send", ps._send_once_more, txns(6, 3), [True])
    finally:
        ps.close()
    assert identities(wh) == expected([txns(0, 9)])
    assert staged(wh) == []
    s = make(wh)
    s.open()
    key: StreamKey | None = s.resume_key()
    assert key == stream_key(txns(6, 3)[-1])
    s.close()


# --- RENAME TABLE in the changelog lake -----------------------------------------------------------------------------

T2 = TableSchema("d", "t2", ("id", "v"), ("id",), (), (3, 15))


def rename_batch() -> list[Txn]:
    """Rows of d.t and d.u, then RENAME TABLE d.t TO d.t2, then rows of d.t2 (in one batch)."""
    rn = Txn("r1", 1100 << 18, Position("bin.000001", 300), (), Ddl("d", "RENAME TABLE d.t TO d.t2", "t", "d"))
    after = [Txn("r1", (1101 + i) << 18, Position("bin.000001", 301 + i),
                 (RowChange(T2, "insert", None, {"id": 100 + i, "v": "new"}),)) for i in range(3)]
    return [*txns(0, 4), rn, *after]


def renamed_identities() -> dict[str, Counter[Identity]]:
    """The identities of ``rename_batch``, by the lake table holding them after the RENAME."""
    b = rename_batch()
    want = expected([b[:4]])
    want["d__t2"] = want.pop("d__t") + Counter((t.region, t.commit_ts, 0, 0) for t in b[5:])
    return want


def rename_child_main(wh: str) -> None:
    s = make(Path(wh))
    s.open()
    s.send(rename_batch())
    raise SystemExit("not killed")


def test_a_rename_moves_the_table_with_its_history_and_survives_a_crash_between_its_steps(tmp_path: Path) -> None:
    """The changelog lake before: a RENAME TABLE left the old table's rows under the old name (its view showed a
    table the source no longer has) and the new name started empty (its view missed every older row)."""
    wh = tmp_path / "wh"
    wh.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{failpoints.ENV: "spark.rename=kill@1"})
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_lake_commits as t; " \
           f"t.rename_child_main({str(wh)!r})"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr[-3000:]
    # killed with the new name written into the old directory, not moved yet; the rows before it committed
    assert json.loads((wh / "d__t" / "_state.json").read_text())["name"] == "d__t2"
    s = make(wh)
    s.open()  # finishes the move
    assert not (wh / "d__t").exists() and (wh / "d__t2" / "changelog").is_dir()
    key = s.resume_key()
    assert key == stream_key(rename_batch()[3])  # committed before the RENAME
    s.send([t for t in rename_batch() if stream_key(t) > key])  # the replayed RENAME finds its work done
    assert identities(wh) == renamed_identities()
    st = lake.TableState.load(wh / "d__t2")
    assert st is not None and (st.db, st.table) == ("d", "t2") and st.renamed_from == [["d", "t", list(key_to_json(
        stream_key(rename_batch()[4])) or []), 0]]
    s.close()
    # a new sender reads the journal back: the same RENAME sent again is done already
    s = make(wh)
    s.open()
    s._recover()
    s._key = None  # (as if the stream replayed the whole batch past the lake's own position)
    s.send(rename_batch()[4:5])
    assert identities(wh) == renamed_identities() and not (wh / "d__t").exists()
    s.close()


def test_a_rename_without_a_crash_and_a_swap_through_a_third_name(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    wh.mkdir()
    s = make(wh)
    s.open()
    s.send(rename_batch())
    assert identities(wh) == renamed_identities() and not (wh / "d__t").exists()
    swap = Txn("r1", 1200 << 18, Position("bin.000001", 400), (),
               Ddl("d", "RENAME TABLE d.t2 TO d.tmp, d.u TO d.t2, d.tmp TO d.u", "t2", "d"))
    s.send([swap])
    got = identities(wh)
    want = renamed_identities()
    assert got == {"d__t2": want["d__u"], "d__u": want["d__t2"]}, got
    assert {(st.db, st.table, st.name) for st in lake.list_tables(wh)} == {("d", "t2", "d__t2"), ("d", "u", "d__u")}
    s.close()
