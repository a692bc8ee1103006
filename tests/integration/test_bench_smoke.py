"""The benchmark's smoke size: every row reaches every sender (no speed is asserted)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import ROOT

pytestmark = pytest.mark.integration


def test_bench_smoke_every_row_arrives() -> None:
    r = subprocess.run(
        [sys.executable, "bench/bench.py", "--rows", "5000", "--smoke", "--only", "file,mysql,apply,kafka,spark,all,senderprocs"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for part in ("capturer -> file", "capturer -> mysql", "capturer -> kafka (kafka-python)",
                 "capturer -> kafka (confluent)", "capturer -> spark", "capturer -> all four at once",
                 # process=true: each sender in a process of its own
                 "capturer -> file, sender in its own process", "capturer -> mysql, sender in its own process",
                 "capturer -> kafka (confluent), sender in its own process", "capturer -> spark, sender in its own process",
                 "capturer -> all four, each sender in its own process"):
        assert part in r.stdout
    assert "INCOMPLETE" not in r.stdout
