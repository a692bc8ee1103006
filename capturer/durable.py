"""Small durable file writes shared by the checkpoint's side files (lift
journal, BaikalDB schema journal): an fsync'd append, and an atomic rewrite."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable


def append_line(path: Path, line: str) -> None:
    """Append one line and fsync it before returning."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def rewrite_lines(path: Path, lines: Iterable[str]) -> None:
    """Replace the file with ``lines``: a temp file, fsync'd, renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
