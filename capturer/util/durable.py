"""Small durable files shared by the checkpoint's side files (lift journal,
BaikalDB schema journal, PostgreSQL relation journal): JSON lines read back
after a crash, an fsync'd append, and an atomic rewrite."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from capturer.errors import CheckpointError

log = logging.getLogger(__name__)
T = TypeVar("T")


def fsync_dir(d: Path) -> None:
    """fsync a directory, so that the names created, renamed or removed in it last."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_journal(path: Path | None, parse: Callable[[Any], T], what: str) -> list[T]:
    """Each JSON line of ``path`` (none if it does not exist) through ``parse``. A
    torn last line (kill -9 during an append: nothing refers to it) is skipped with
    a warning; any other bad line is a CheckpointError naming file, line and ``what``."""
    if path is None or not path.exists():
        return []
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = raw[:exc.start].count(b"\n") + 1
        raise CheckpointError(f"{path}:{lineno}: the {what} is not UTF-8 text (byte {exc.start}): it is damaged; "
                              "restore it, or delete it together with the checkpoint to start over") from None
    lines = text.splitlines()
    out: list[T] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(parse(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if n == len(lines):
                log.warning("%s:%d: ignoring torn last line", path, n)
                continue
            raise CheckpointError(f"{path}:{n}: corrupt {what}: {exc}") from None
    return out


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
