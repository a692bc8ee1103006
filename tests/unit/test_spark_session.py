"""When the Spark sender starts its Spark session (senders/spark/sender.py).

With writer=arrow the changelog is written by pyarrow, so the session (a JVM:
seconds of start-up and ~15 CPU-seconds taken from the capture while it
starts) is started only when something needs it: a compaction coming due, or a
caller of ``session()``; with writer=spark or a persistent catalog it starts with
the sender. ``build_session`` is replaced here by a stand-in that takes its time
(what is checked is *when* it is called and that nothing waits for it; the real
JVM and compaction run in tests/integration/test_spark_sender.py); the Parquet
files are real."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from capturer import config
from capturer.errors import SinkError
from capturer.model import Position, RowChange, TableSchema, Txn
from senders import CATALOG
from senders.spark import sender as spark_sender
from senders.spark.sender import SparkSender

S = TableSchema("d", "t", ("id", "v"), ("id",), (), (3, 15))


def batch(n0: int, n: int = 3) -> list[Txn]:
    return [Txn("r", (100 + i) << 18, Position("bin.000001", 10 + i),
                (RowChange(S, "insert", None, {"id": i, "v": f"x{i}"}),)) for i in range(n0, n0 + n)]


def make(tmp: Path, extra: str = "") -> SparkSender:
    p = tmp / "s.cfg"
    p.write_text(f"[global]\ntype=spark\n[spark]\nwarehouse={tmp / 'wh'}\nbatch_interval=0\n{extra}")
    (sc,) = config.load_sender_config(p, CATALOG)
    return SparkSender("spark", sc.options)


class FakeSession:
    """Stands in for a SparkSession: started by build_session after ``delay`` s."""

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


class Calls:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay: float = 0.0, fail: int = 0) -> None:
        self.starts: list[float] = []
        self.registered: list[str] = []
        self.compacted: list[str] = []
        self.release = threading.Event()
        self.delay, self.fail = delay, fail
        if not delay:
            self.release.set()
        monkeypatch.setattr(spark_sender, "build_session", self.build)
        monkeypatch.setattr(spark_sender.lake, "register", lambda spark, st, db, wh: self.registered.append(st.name))

        def compact(spark: Any, st: Any, db: str, wh: Path) -> Any:
            self.compacted.append(st.name)
            return st

        monkeypatch.setattr(spark_sender.lake, "compact", compact)
        monkeypatch.setattr(spark_sender, "_java_found", lambda: True)

    def build(self, options: dict[str, Any], warehouse: Path) -> FakeSession:
        self.starts.append(time.monotonic())
        self.release.wait(10)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("JAVA_GATEWAY_EXITED")
        return FakeSession()


def changelog_files(tmp: Path) -> list[Path]:
    return sorted((tmp / "wh" / "d__t" / "changelog").glob("part-*.parquet"))


def test_no_session_without_compaction_or_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls(monkeypatch)
    s = make(tmp_path, "compaction_interval=0\n")
    s.open()
    assert s.status()["session"] == "on demand"
    s.send(batch(0))
    s.housekeeping()
    s.send(batch(3))
    s.close()
    assert calls.starts == [] and calls.registered == []
    assert len(changelog_files(tmp_path)) == 2  # written by pyarrow all the same


def test_a_compaction_due_starts_the_session_and_nothing_waits_for_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls(monkeypatch, delay=1.0)
    s = make(tmp_path, "compaction_interval=0.2\n")
    s.open()
    assert calls.starts == []
    s.send(batch(0))
    time.sleep(0.25)
    t0 = time.monotonic()
    s.housekeeping()  # due: starts the session in the background
    s.send(batch(3))  # appends go on while it starts
    s.housekeeping()
    assert time.monotonic() - t0 < 0.5
    assert len(calls.starts) == 1 and calls.compacted == [] and s.status()["session"] == "starting"
    assert len(changelog_files(tmp_path)) == 2
    calls.release.set()
    deadline = time.monotonic() + 10
    while not calls.compacted and time.monotonic() < deadline:
        s.housekeeping()
        time.sleep(0.05)
    assert calls.compacted == ["d__t"] and calls.registered == ["d__t"]
    assert s.status()["session"] == "ready" and s.status()["compactions"] == 1
    s.close()
    assert len(calls.starts) == 1


def test_a_session_that_cannot_start_holds_up_nothing_and_is_tried_again_an_interval_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls(monkeypatch, fail=1)
    s = make(tmp_path, "compaction_interval=0.5\n")
    s.open()
    s.send(batch(0))
    time.sleep(0.55)
    deadline = time.monotonic() + 10
    while not s.housekeeping_error and time.monotonic() < deadline:
        s.housekeeping()  # never raises: the appends go on
        time.sleep(0.01)
    assert "cannot start Spark" in s.housekeeping_error and "JAVA_GATEWAY_EXITED" in s.housekeeping_error
    st = s.status()
    assert st["session"] == "failed" and st["housekeeping_error"] == s.housekeeping_error
    s.send(batch(3))  # appends are not held up, nor refused for a view
    assert len(changelog_files(tmp_path)) == 2
    for _ in range(10):  # not started again before one compaction_interval has passed
        s.housekeeping()
    assert len(calls.starts) == 1 and calls.compacted == []
    time.sleep(0.55)
    while not calls.compacted and time.monotonic() < deadline:
        s.housekeeping()
        time.sleep(0.01)
    assert len(calls.starts) == 2 and calls.compacted == ["d__t"]
    assert s.housekeeping_error == "" and s.status()["session"] == "ready"
    s.close()


def test_every_caller_waiting_for_a_failed_start_hears_of_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls(monkeypatch, delay=1.0, fail=1)
    s = make(tmp_path, "compaction_interval=0\n")
    s.open()
    got: list[object] = []

    def call() -> None:
        try:
            got.append(s.session())
        except SinkError as exc:
            got.append(exc)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    calls.release.set()
    for t in threads:
        t.join(10)
    assert len(calls.starts) == 1 and len(got) == 3
    assert all(isinstance(g, SinkError) and "JAVA_GATEWAY_EXITED" in str(g) for g in got), got
    assert isinstance(s.session(), FakeSession) and len(calls.starts) == 2  # the next call: a new attempt
    s.close()


def test_no_session_is_started_once_the_sender_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls(monkeypatch)
    s = make(tmp_path, "compaction_interval=0\n")
    s.open()
    s.close()
    with pytest.raises(SinkError, match="closed"):
        s.session()
    assert calls.starts == []


@pytest.mark.parametrize("extra", ["writer=spark\n", "conf.spark.sql.catalogImplementation=hive\n"])
def test_the_session_starts_with_the_sender_when_it_is_of_use_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str) -> None:
    calls = Calls(monkeypatch)
    s = make(tmp_path, "compaction_interval=0\n" + extra)
    s.open()
    deadline = time.monotonic() + 10
    while s.spark is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls.starts) == 1
    if "hive" in extra:  # the views are registered for other sessions
        s.send(batch(0))
        assert calls.registered == ["d__t"]
    s.close()


def test_session_starts_it_for_a_caller_and_views_follow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls(monkeypatch)
    s = make(tmp_path, "compaction_interval=0\n")
    s.open()
    s.send(batch(0))
    assert calls.starts == []
    spark = s.session()
    assert isinstance(spark, FakeSession) and len(calls.starts) == 1
    s.send(batch(3))  # the tables' views are registered in the session that now runs
    assert calls.registered == ["d__t"]
    s.close()
    assert spark.stopped


def test_no_java_is_found_at_open_when_a_session_will_be_needed(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    s = make(tmp_path, "compaction_interval=300\n")
    with pytest.raises(SinkError) as ei:
        s.open()
    assert "Java" in str(ei.value) and "JAVA_HOME" in str(ei.value) and not ei.value.retriable
    # no compaction, arrow writer: no Java needed at all
    s = make(tmp_path, "compaction_interval=0\n")
    s.open()
    s.send(batch(0))
    s.close()
    assert len(changelog_files(tmp_path)) == 1
