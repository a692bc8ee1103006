"""ruff over the code, with the project's ruff.toml (CI runs it as part of the tests), and the
length of the shipped functions (ruff has no rule for it)."""

from __future__ import annotations

import ast
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


#: the longest a shipped function may be (issue 46: a longer one is split into named steps)
MAX_FUNCTION_LINES = 100
SHIPPED = ("capturer", "senders", "devtools", "bench")


def long_functions(source: str, where: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function (methods and nested ones too) of ``source`` over ``limit`` lines, def to last line."""
    out = []
    for n in ast.walk(ast.parse(source, where)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (n.end_lineno or n.lineno) - n.lineno + 1
            if lines > limit:
                out.append(f"{where}:{n.lineno}: {n.name}() is {lines} lines (at most {limit})")
    return out


def test_no_shipped_function_over_100_lines() -> None:
    files = [p for top in SHIPPED for p in sorted((ROOT / top).rglob("*.py")) if "_generated" not in p.parts]
    assert len(files) > 50  # (the walk sees the code)
    bad = [line for p in files for line in long_functions(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not bad, "\n".join(bad)


def test_the_length_check_can_fail() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(99))
    assert long_functions(f"def f():\n{body}", "a.py") == []  # 100 lines: allowed
    method = "".join(f"        x{i} = {i}\n" for i in range(100))
    long = long_functions(f"class C:\n    def g(self):\n{method}", "b.py")  # 101 lines
    assert long == ["b.py:2: g() is 101 lines (at most 100)"]
