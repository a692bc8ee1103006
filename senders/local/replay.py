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

from capturer.model.ddl import apply_row_steps, clean, literal_value, row_steps, table_renames

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


class _Bag(dict[RowKey, dict[str, Any]]):
    """A table without a primary key: its rows (a multiset) and an index of their keys by the row's
    JSON text, so that a delete finds one equal row without a scan of the table (a scan per delete
    made replaying a keyless table of 100,000 rows with as many deletes take minutes: ``verify`` of
    the file under the hostile workload). A row whose text is not indexed (an equal row written
    otherwise: 1 and 1.0) is still found by the scan."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.reindex()

    def reindex(self) -> None:
        self.index: dict[str, list[RowKey]] = {}
        for k, row in self.items():
            self.index.setdefault(_text(row), []).append(k)

    def clear(self) -> None:
        super().clear()
        self.index = {}


def _text(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, ensure_ascii=False)


def _keyless(t: dict[RowKey, dict[str, Any]], before: dict[str, Any] | None, after: dict[str, Any] | None,
             counter: list[int]) -> None:
    """A table without a primary key is a multiset: a delete removes one equal row."""
    assert isinstance(t, _Bag)
    if before is not None:
        keys = t.index.get(_text(before))
        while keys:
            k = keys.pop()
            if k in t and t[k] == before:
                del t[k]
                break
        else:
            for k, row in t.items():
                if row == before:
                    del t[k]
                    break
    if after is not None:
        counter[0] += 1
        k = ("#", counter[0])
        t[k] = after
        t.index.setdefault(_text(after), []).append(k)


def _literal(text: str | None) -> Any:
    """A DEFAULT literal of an ALTER TABLE as the JSON value rows carry (binary: base64)."""
    v = literal_value(text)
    return base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else v


def _apply_ddl(state: dict[tuple[str, str], dict[RowKey, dict[str, Any]]], d: dict[str, Any]) -> None:
    """What a DDL does to the rows already there: TRUNCATE and DROP TABLE empty the table;
    an ALTER TABLE's ADD COLUMN (with its constant default), DROP COLUMN, RENAME COLUMN and
    CHANGE COLUMN (capturer/model/ddl.py ``row_steps``), then its RENAME TO; RENAME TABLE."""
    sql = clean(d.get("sql") or "")  # (comments out: capturer/model/ddl.py strip_comments)
    head = sql.upper()
    t = state.get((d["db"], d["table"]))
    if t is not None and head.startswith(("TRUNCATE", "DROP TABLE")):
        t.clear()
        return
    if t is not None and head.startswith("ALTER"):
        steps = [(w, a, base64.b64encode(b).decode("ascii") if isinstance(b, bytes) else b)
                 for w, a, b in row_steps(sql)]
        if steps:
            for k, row in t.items():
                t[k] = apply_row_steps(row, steps)
            if isinstance(t, _Bag):
                t.reindex()
    for src, dst in table_renames(sql, d["db"], d["table"], d.get("session_db") or ""):
        moved = state.pop(src, None)
        if moved is not None:
            state[dst] = moved


State = dict[tuple[str, str], dict[RowKey, dict[str, Any]]]


def apply_change(state: State, d: dict[str, Any], counter: list[int]) -> None:
    """One change (or DDL, ``_apply_ddl``) applied to ``state``."""
    if d["op"] == "ddl":
        _apply_ddl(state, d)
        return
    t = state.setdefault((d["db"], d["table"]), {})
    if not d.get("pk"):
        if not isinstance(t, _Bag):
            t = state[(d["db"], d["table"])] = _Bag(t)
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
