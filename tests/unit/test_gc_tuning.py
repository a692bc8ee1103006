"""capturer.util.memory.tune_gc: the collector's thresholds as every capturer
process sets them, and CAPTURER_GC=default keeps Python's (each case in a child
process, as ``python -m capturer`` starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = r"""
import gc, json
from capturer.util.memory import GC_THRESHOLDS, tune
before = gc.get_threshold()
tune()
print(json.dumps({"before": before, "after": gc.get_threshold(), "want": GC_THRESHOLDS}))
"""


def _probe(**env: str) -> dict[str, list[int]]:
    e = {k: v for k, v in os.environ.items() if k != "CAPTURER_GC"}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=e, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_tune_raises_the_thresholds() -> None:
    r = _probe()
    assert r["after"] == r["want"] != r["before"]
    # young collections far rarer than Python's 700 allocations, full ones not more often than its
    assert r["after"][0] >= 10_000 and r["after"][1] * r["after"][2] >= 100


def test_capturer_gc_default_keeps_pythons_values() -> None:
    r = _probe(CAPTURER_GC=" Default ")
    assert r["after"] == r["before"] != r["want"]


MAIN = r"""
import gc, json, sys
import capturer.__main__ as m
sys.argv = ["capturer", "--help"]
try:
    m.main()
except SystemExit:
    pass
print(json.dumps(gc.get_threshold()))
"""


def test_the_capturer_main_tunes_before_anything_else() -> None:
    """``python -m capturer``'s main() itself (here with --help, which returns early)."""
    out = subprocess.run([sys.executable, "-c", MAIN], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != "CAPTURER_GC"})
    assert out.returncode == 0, out.stderr
    from capturer.util.memory import GC_THRESHOLDS

    assert json.loads(out.stdout.strip().splitlines()[-1]) == list(GC_THRESHOLDS)
