"""ruff over the code, with the project's ruff.toml (CI runs it as part of the tests)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the 'test' extra: sh tests/run.sh installs it)")
    r = subprocess.run([ruff, "check", "capturer", "senders", "devtools", "tests", "bench"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
