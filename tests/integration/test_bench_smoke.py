"""The benchmark's smoke size: every row reaches every sender (no speed is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.integration


# The default run (~25 s): each sender kind and all four at once; --runslow: the full smoke list (~100 s),
# the applier, the lake alone, each sender in a process of its own and the [ha] parts too
SOME = ["capturer -> file", "capturer -> mysql", "capturer -> kafka (kafka-python)", "capturer -> kafka (confluent)",
        "capturer -> all four at once"]
PARTS = {
    "some": ("file,mysql,kafka,all", SOME),
    "all": ("file,mysql,apply,kafka,spark,all,senderprocs,ha", [
        *SOME, "capturer -> spark",
        # process=true: each sender in a process of its own
        "capturer -> file, sender in its own process", "capturer -> mysql, sender in its own process",
        "capturer -> kafka (confluent), sender in its own process", "capturer -> spark, sender in its own process",
        "capturer -> all four, each sender in its own process",
        "capturer -> all four as the active capturer of an [ha] group", "ha takeovers (lease 3 s"]),
}


@pytest.mark.parametrize("which", ["some", pytest.param("all", marks=pytest.mark.slow)])
def test_bench_smoke_every_row_arrives(tmp_path: Path, which: str) -> None:
    # a part that hangs prints its threads' stacks and ends the run (--part-timeout) well before pytest's own
    # timeout would end this test and lose the bench's output: stdout and stderr go to files kept for the report
    only, parts = PARTS[which]
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as o, err.open("w") as e:
        rc = subprocess.run(
            [sys.executable, "bench/bench.py", "--rows", "5000", "--smoke", "--part-timeout", "150", "--only", only],
            cwd=ROOT, stdout=o, stderr=e, text=True, timeout=560, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        ).returncode
    r = subprocess.CompletedProcess([], rc, out.read_text(), err.read_text())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    for part in parts:
        assert part in r.stdout, part
    assert "INCOMPLETE" not in r.stdout


def _injected() -> list[str]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if b"bench-injected-failure" in open(f"/proc/{d}/cmdline", "rb").read():
                    out.append(d)
            except OSError:
                pass
    return out


def test_bench_part_that_fails_does_not_end_the_run(tmp_path: Path) -> None:
    """A part that raises (with a process of its own still running) is marked in the results,
    the parts after it still run, what was measured is written, and nothing is left running."""
    out = tmp_path / "results.json"
    r = subprocess.run(
        [sys.executable, "bench/bench.py", "--rows", "2000", "--smoke", "--only", "file,workers",
         "--fail-part", "file", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "INCOMPLETE: file: failed (RuntimeError" in r.stdout
    assert "part 'file' failed" in r.stderr and "bench-injected-failure" in r.stderr  # stopped, and said so
    res = json.loads(out.read_text())
    assert res["complete"] is False
    assert "RuntimeError" in res["failed_parts"]["file"]
    assert "file" not in res  # (no figure for the failed part)
    assert res["file-workers"]["rows"] == 2000 + 2000 // 2 // 4 * 2 + 2000 // 2 // 10 * 2  # the next part ran
    assert any(row[0].startswith("capturer -> file, regions in worker processes") for row in res["table"])
    assert not _injected()


def test_bench_smoke_peers_both_sides_deliver_and_are_checked(tmp_path: Path) -> None:
    """The ``peers`` part at a tiny size (issue 48's CI smoke, ~90 s once the jars are cached): our
    capturer and Debezium in Kafka Connect, each streaming, snapshotting and (ours vs Debezium's JDBC
    sink) filling a MariaDB target; both outputs are checked against the sources by the part itself
    (counts, operations, the keys alive; the target's rows and sums), and any side found wrong is a
    problem that fails this test. No speed is asserted."""
    out = tmp_path / "results.json"
    with (tmp_path / "stdout").open("w") as o, (tmp_path / "stderr").open("w") as e:
        rc = subprocess.run(
            [sys.executable, "bench/bench.py", "--rows", "2000", "--smoke", "--part-timeout", "420", "--only",
             "peers", "--peers-snapshot-rows", "5000", "--out", str(out)],
            cwd=ROOT, stdout=o, stderr=e, text=True, timeout=560, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        ).returncode
    text = (tmp_path / "stdout").read_text()
    assert rc == 0, text[-3000:] + "\n".join(
        ln for ln in (tmp_path / "stderr").read_text().splitlines() if not ln.startswith("%"))[-6000:]
    p = json.loads(out.read_text())["peers"]
    assert p["problems"] == [] and p["mysql_target"]["problems"] == [], (p["problems"], p["mysql_target"])
    for part, ours, theirs, what in (("streaming", "ours", "debezium", "messages"),
                                      ("snapshot", "ours", "debezium", "messages"),
                                      ("mysql_target", "ours", "debezium_jdbc", "changes")):
        for side in (ours, theirs):
            got = p[part][side]
            assert got["check"] == "ok" and not got.get("failed"), (part, side, got)
            assert got[what] > 0 and got["cpu_s"] > 0, (part, side, got)
    assert p["streaming"]["ours"]["messages"] == p["streaming"]["debezium"]["messages"] == p["streaming"]["changes"]
    assert p["snapshot"]["ours"]["ops"] == p["snapshot"]["debezium"]["ops"] == {"r": p["snapshot"]["rows"]}
