"""mypy over the code, with the project's mypy.ini (CI runs it as part of the tests)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_is_clean() -> None:
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent)) or shutil.which("mypy")
    if mypy is None:
        pytest.skip("mypy is not installed (it is in the 'test' extra: sh tests/run.sh installs it)")
    # the files to check (capturer, senders) and the settings come from mypy.ini
    r = subprocess.run([mypy, "--config-file", "mypy.ini"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
