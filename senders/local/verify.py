"""The local sender's file, read back for ``verify`` (capturer/ops/verify.py): the
JSON lines replayed (``senders/local/replay.py``: duplicates dropped, DDL applied,
keyless tables as multisets), every table at once. ``format=sql`` files are not
read back (they are statements for a server to run): their tables are "cannot check"."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from senders.local.replay import output_files, read_changes, rebuild


class FileReader:
    kind = "file"

    def __init__(self, name: str, options: dict[str, Any], regions: list[tuple[str, str, str]]):
        self.name = name
        self.path = Path(options["filepath"])
        self.cannot = "" if options.get("format", "json") == "json" else \
            f"format={options.get('format')}: only JSON lines are read back"
        self._state: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {}
        self._seen: Any = None  # the files (name, size, mtime) the state was built from

    def destination(self, db: str, table: str) -> tuple[str, str]:
        return (db, table)

    def where(self, dest: tuple[str, str]) -> str:
        return f"file {self.path}"

    def refresh(self) -> None:
        if self.cannot:
            return
        files = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in output_files(self.path))
        if files != self._seen:
            self._state = rebuild(read_changes(self.path))
            self._seen = files

    def rows(self, dest: tuple[str, str], columns: Sequence[str]) -> list[dict[str, Any]]:
        return list(self._state.get(dest, {}).values())

    def close(self) -> None:
        self._state = {}
