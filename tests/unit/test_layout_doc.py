"""docs/layout.md names every module of capturer/, senders/ and devtools/ (each .py, .c and .h file) once,
and names none that does not exist. A package's ``__init__.py`` is named by its folder's line unless it
holds more than a few lines (then it gets a line of its own)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (".py", ".c", ".h")


def named() -> list[str]:
    """The paths the tree in docs/layout.md names (indentation: two spaces per level)."""
    block = (ROOT / "docs" / "layout.md").read_text().split("```", 2)[1]
    stack: list[str] = []
    out = []
    for line in block.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m:
            continue
        depth = len(m.group(1)) // 2
        stack = stack[:depth] + [m.group(2).rstrip("/")]
        out.append("/".join(stack))
    return out


def files() -> set[str]:
    have = set()
    for top in ("capturer", "senders", "devtools"):
        for p in (ROOT / top).rglob("*"):
            if p.suffix in SOURCES and not {"_generated", "__pycache__", "ui"} & set(p.parts):
                rel = str(p.relative_to(ROOT))
                small_init = p.name == "__init__.py" and len(p.read_text().splitlines()) <= 20
                if not small_init:
                    have.add(rel)
    return have


def test_every_module_is_named_once_and_nothing_else() -> None:
    names = named()
    sources = [n for n in names if n.endswith(SOURCES)]
    twice = [n for n, c in Counter(sources).items() if c > 1]
    assert not twice, f"docs/layout.md names these more than once: {twice}"
    have = files()
    missing = sorted(have - set(sources))
    assert not missing, f"docs/layout.md does not name: {missing}"
    stale = sorted(n for n in sources if not (ROOT / n).exists())
    assert not stale, f"docs/layout.md names files that do not exist: {stale}"
