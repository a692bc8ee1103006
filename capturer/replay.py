"""Read the local sender's JSON lines back and rebuild table state from them.

Used by ``--demo --once`` to prove that the file holds every change, and handy
for users checking a file against a source. Duplicates (after a crash) are
dropped by their ``(region, commit_ts, seq)`` identity.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

RowKey = tuple[Any, ...]


def output_files(filepath: Path) -> list[Path]:
    """Rotated files in order, then the active one."""
    pat = re.compile(re.escape(filepath.name) + r"\.(\d{6,})$")
    rotated = sorted(
        (int(m.group(1)), p) for p in filepath.parent.glob(filepath.name + ".*")
        if (m := pat.match(p.name))
    )
    files = [p for _, p in rotated]
    if filepath.exists():
        files.append(filepath)
    return files


def read_changes(filepath: Path, dedupe: bool = True) -> Iterator[dict[str, Any]]:
    seen: set[tuple[str, int, int]] = set()
    for p in output_files(filepath):
        with open(p, encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                ident = (d["region"], d["commit_ts"], d["seq"])
                if dedupe:
                    if ident in seen:
                        continue
                    seen.add(ident)
                yield d


def _key(d: dict[str, Any], row: dict[str, Any]) -> RowKey:
    pk = d.get("pk") or sorted(row)
    return tuple(row.get(c) for c in pk)


def rebuild(changes: Iterator[dict[str, Any]]) -> dict[tuple[str, str], dict[RowKey, dict[str, Any]]]:
    """State per (db, table): primary key -> row. Applies changes in file order."""
    state: dict[tuple[str, str], dict[RowKey, dict[str, Any]]] = {}
    for d in changes:
        if d["op"] == "ddl":
            continue
        t = state.setdefault((d["db"], d["table"]), {})
        if d["before"] is not None:
            t.pop(_key(d, d["before"]), None)
        if d["after"] is not None:
            t[_key(d, d["after"])] = d["after"]
    return state
