"""Read the local sender's JSON lines back and rebuild table state from them.

Used by ``--demo --once`` to prove that the file holds every change, and handy
for users checking a file against a source. Duplicates (after a crash) are
dropped by their ``(region, commit_ts, seq)`` identity.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from capturer.model.ddl import renamed_tables, string_value
from senders.spark.lake import parse_add_columns

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
    """The changes of a file set in order. ``dedupe``: a change delivered again
    after a crash (the same ``(region, commit_ts, seq)``) is skipped. Snapshot
    rows (op ``read``) are never skipped: one read again after a crash is a newer
    read of the row, applied in its place in the stream."""
    seen: set[tuple[str, int, int]] = set()
    for p in output_files(filepath):
        with open(p, encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                if d["op"] == "read":
                    yield d
                    continue
                ident = (d["region"], d["commit_ts"], d["seq"])
                if dedupe:
                    if ident in seen:
                        continue
                    seen.add(ident)
                yield d


def _key(d: dict[str, Any], row: dict[str, Any]) -> RowKey:
    pk = d.get("pk") or sorted(row)
    return tuple(row.get(c) for c in pk)


def _keyless(t: dict[RowKey, dict[str, Any]], before: dict[str, Any] | None, after: dict[str, Any] | None,
             counter: list[int]) -> None:
    """A table without a primary key is a multiset: a delete removes one equal row."""
    if before is not None:
        for k, row in t.items():
            if row == before:
                del t[k]
                break
    if after is not None:
        counter[0] += 1
        t[("#", counter[0])] = after


def _literal(text: str | None) -> Any:
    """A DEFAULT literal of an ALTER TABLE as the JSON value rows carry."""
    if text is None or text.upper() == "NULL":
        return None
    if text.upper() in ("TRUE", "FALSE"):
        return 1 if text.upper() == "TRUE" else 0
    if text[:1] in ("'", '"'):
        return string_value(text)
    if text[:2] in ("X'", "x'"):  # (binary: base64 in the file's rows)
        return base64.b64encode(bytes.fromhex(text[2:-1])).decode("ascii")
    try:
        return int(text)
    except ValueError:
        return float(text)


def _apply_ddl(state: dict[tuple[str, str], dict[RowKey, dict[str, Any]]], d: dict[str, Any]) -> None:
    """What an ALTER TABLE does to the rows already there: ADD COLUMN (with its
    constant default), DROP COLUMN, CHANGE COLUMN (a rename); TRUNCATE and DROP
    TABLE empty the table."""
    sql = re.sub(r"/\*.*?\*/", " ", d.get("sql") or "", flags=re.S).strip()
    for src, dst in renamed_tables(sql, d["db"]):  # (RENAME TABLE, ALTER TABLE ... RENAME TO)
        moved = state.pop(src, None)
        if moved is not None:
            state[dst] = moved
    t = state.get((d["db"], d["table"]))
    if t is None:
        return
    head = sql.upper()
    if head.startswith(("TRUNCATE", "DROP TABLE")):
        t.clear()
        return
    if not head.startswith("ALTER"):
        return
    for name, _, default in parse_add_columns(sql):
        for row in t.values():
            row.setdefault(name, _literal(default))
    ident = r"(`(?:[^`]|``)+`|[\w$]+)"
    for m in re.finditer(r"\bDROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?" + ident, sql, re.I):
        col = m.group(1)
        if col.upper() in ("INDEX", "KEY", "PRIMARY", "FOREIGN", "CONSTRAINT", "CHECK", "PARTITION", "UNIQUE"):
            continue
        col = col[1:-1].replace("``", "`") if col.startswith("`") else col
        for row in t.values():
            row.pop(col, None)
    for m in re.finditer(r"\bCHANGE\s+(?:COLUMN\s+)?" + ident + r"\s+" + ident, sql, re.I):
        old, new = (c[1:-1].replace("``", "`") if c.startswith("`") else c for c in m.groups())
        if old != new:
            for row in t.values():
                if old in row:
                    row[new] = row.pop(old)


State = dict[tuple[str, str], dict[RowKey, dict[str, Any]]]


def apply_change(state: State, d: dict[str, Any], counter: list[int]) -> None:
    """One change (or DDL, ``_apply_ddl``) applied to ``state``."""
    if d["op"] == "ddl":
        _apply_ddl(state, d)
        return
    t = state.setdefault((d["db"], d["table"]), {})
    if not d.get("pk"):
        _keyless(t, d["before"], d["after"], counter)
        return
    old = t.pop(_key(d, d["before"]), None) if d["before"] is not None else None
    after = d["after"]
    if after is not None:
        # an update's image may leave columns out (an unchanged TOASTed value of a PostgreSQL row
        # gone since, a MySQL binlog_row_image=MINIMAL): they keep the values the row had
        t[_key(d, after)] = {**old, **after} if old is not None and d["op"] == "update" else after


def rebuild(changes: Iterator[dict[str, Any]]) -> State:
    """State per (db, table): primary key -> row. Applies changes in file order,
    and what DDL does to existing rows (``_apply_ddl``)."""
    state: State = {}
    counter = [0]
    for d in changes:
        apply_change(state, d, counter)
    return state


class Replay:
    """The state of a file set kept up to date while the sender appends to it: each
    ``update`` reads every file on from where the last one stopped (files known by
    inode: a rotation renames the active file and keeps its inode), complete lines
    only, duplicates dropped as ``read_changes`` drops them. A file that rotates while
    it is read ends that update there (the next one goes on in order); a file read
    before that is gone (the set was replaced or trimmed) starts the state again."""

    def __init__(self, filepath: Path):
        self.filepath = filepath
        self._reset()

    def _reset(self) -> None:
        self.state: State = {}
        self._seen: set[tuple[str, int, int]] = set()
        self._counter = [0]
        self._done: dict[int, int] = {}  # inode -> bytes applied

    def update(self) -> None:
        files = []
        for p in output_files(self.filepath):
            try:
                files.append((p, p.stat().st_ino))
            except FileNotFoundError:
                return  # rotating now: the next update lists it under its new name
        if set(self._done) - {ino for _, ino in files}:
            self._reset()
        for p, ino in files:
            try:
                f = open(p, "rb")
            except FileNotFoundError:
                return
            with f:
                if os.fstat(f.fileno()).st_ino != ino:
                    return  # renamed since listed: the next update goes on in order
                off = self._done.get(ino, 0)
                f.seek(off)
                data = f.read()
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                self._apply(json.loads(line))
            self._done[ino] = off + end

    def _apply(self, d: dict[str, Any]) -> None:
        if d["op"] != "read":
            ident = (d["region"], d["commit_ts"], d["seq"])
            if ident in self._seen:
                return
            self._seen.add(ident)
        apply_change(self.state, d, self._counter)
