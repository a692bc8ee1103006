"""The local sender's file, read back for ``verify`` (capturer/ops/verify.py): the
JSON lines replayed (``senders/local/replay.py``: duplicates dropped, DDL applied,
keyless tables as multisets), every table at once; each later read applies only
what the sender appended since (``Replay``). ``format=sql`` files are not
read back (they are statements for a server to run): their tables are "cannot check"."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from senders.local.replay import Replay


class FileReader:
    kind = "file"

    def __init__(self, name: str, options: dict[str, Any], regions: list[tuple[str, str, str]]):
        self.name = name
        self.path = Path(options["filepath"])
        self.cannot = "" if options.get("format", "json") == "json" else \
            f"format={options.get('format')}: only JSON lines are read back"
        self._replay = Replay(self.path)

    def destination(self, db: str, table: str) -> tuple[str, str]:
        return (db, table)

    def where(self, dest: tuple[str, str]) -> str:
        return f"file {self.path}"

    def refresh(self) -> None:
        if not self.cannot:
            self._replay.update()  # what was appended since the last read

    def rows(self, dest: tuple[str, str], columns: Sequence[str]) -> list[dict[str, Any]]:
        return list(self._replay.state.get(dest, {}).values())

    def close(self) -> None:
        self._replay = Replay(self.path)
