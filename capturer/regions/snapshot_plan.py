"""The snapshot engine's data (shared by the engine, capturer/regions/snapshot.py, the stream's side,
snaphost.py, and each kind's reader): a table's plan (its columns and key), a chunk of rows, row
keys, and the recorder of what the stream changed while chunks are in flight (on disk for a busy
keyless table: ``EventSpill``)."""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from capturer.model import TableSchema
from capturer.model.encode import quote_ident
from capturer.model.spill import write_blob

KEY_SIG = "key="  # first element of a stored last key: the key it is a value of


@dataclass
class Column:
    name: str
    data_type: str
    column_type: str  # as information_schema gives it (ENUM members keep their case)
    precision: int
    scale: int
    binary: bool
    nullable: bool
    collation: str = ""

    def enum_members(self) -> list[str] | None:
        """An ENUM's members in index order (index 1 first), when they can stand for
        their index in a comparison (distinct, none empty); else None."""
        if self.data_type != "enum":
            return None
        return enum_members(self.column_type)


def enum_members(column_type: str) -> list[str] | None:
    """``enum('a','b''c')`` -> ``["a", "b'c"]``; None if it is not such a list, or a
    member is empty or equal to another one but for case and trailing spaces (a
    comparison by name could then match another index than the one meant)."""
    t = column_type.strip()
    if not t.lower().startswith("enum(") or not t.endswith(")"):
        return None
    body, out, i = t[5:-1], [], 0
    while i < len(body):
        if body[i] != "'":
            return None
        j, cur = i + 1, []
        while True:
            if j >= len(body):
                return None
            if body[j] == "'":
                if j + 1 < len(body) and body[j + 1] == "'":
                    cur.append("'")
                    j += 2
                    continue
                break
            if body[j] == "\\":  # (how the server escapes it here is not certain: compare by number)
                return None
            cur.append(body[j])
            j += 1
        out.append("".join(cur))
        i = j + 1
        if i < len(body):
            if body[i] != ",":
                return None
            i += 1
    folded = [m.rstrip(" ").lower() for m in out]
    if not out or "" in folded or len(set(folded)) != len(folded):
        return None
    return out


@dataclass
class TablePlan:
    """How to read one table: its columns, chunk key and the schema its rows carry."""

    db: str
    table: str
    columns: list[Column]
    key: tuple[str, ...]  # primary key, or a NOT NULL unique key; () = keyless
    schema: TableSchema
    estimated: int = 0
    described_at: Any = None  # the region's position when the columns were read
    source: Any = None  # what the region kind describes the table with (PostgreSQL: its RelDef)

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    def key_columns(self) -> list[Column]:
        by = {c.name: c for c in self.columns}
        return [by[k] for k in self.key]

    def key_signature(self) -> str:
        """The chunk key as stored with a last key: its columns, types and collations
        (a key that changed in any of them orders rows differently)."""
        return KEY_SIG + ", ".join(f"{quote_ident(c.name)} {c.column_type}"
                                   + (f" COLLATE {c.collation}" if c.collation else "")
                                   for c in self.key_columns())


def split_key(last_key: tuple[Any, ...] | None) -> tuple[str | None, tuple[Any, ...] | None]:
    """A stored last key as (its key's signature or None for one stored without it,
    its values)."""
    if last_key is None:
        return None, None
    if last_key and isinstance(last_key[0], str) and last_key[0].startswith(KEY_SIG):
        return last_key[0], tuple(last_key[1:])
    return None, tuple(last_key)


def key_matches(plan: TablePlan, last_key: tuple[Any, ...] | None) -> bool:
    """Whether a stored last key is a value of ``plan``'s key (one stored without
    its key: whether it has as many values)."""
    sig, values = split_key(last_key)
    if values is None:
        return True
    if sig is None:
        return len(values) == len(plan.key)
    return sig == plan.key_signature()


def truncate_conflict(db: str, table: str, regions: list[str], why: str) -> str:
    """Why a copy that empties ``db.table`` downstream is refused when several
    regions deliver a table of that name, and the ways out."""
    return (f"table {db}.{table} is captured from regions {', '.join(sorted(set(regions)))}, and {why}: a "
            "TRUNCATE from one region would also empty, in every sink, the rows the other regions delivered "
            "to the same table. Ways out: copy a keyed table without truncate (rows the source no longer has "
            "then stay downstream: delete them there), give a keyless table a primary key or a NOT NULL "
            "unique key in every source, or leave it out in the filter (README: \"Snapshots: initial load "
            "and on demand\")")


@dataclass
class Chunk:
    plan: TablePlan
    at: Any  # the log position the rows are consistent with (Position; LsnPosition)
    rows: list[dict[str, Any]]  # (keyed tables) or a SpilledChanges-backed list (keyless: see spill)
    last_key: tuple[Any, ...] | None  # as stored: (key signature, values...)
    last: bool
    index: int
    run: str
    truncate: bool = False  # (keyless tables) TRUNCATE right before the rows; a keyed table's is its run's start
    spilled: Any = None  # keyless tables: the rows as a SpilledChanges of "read" changes
    gen: int = 0  # the region's snapshot generation when it was read (a binlog reset voids it)
    # where the reader tells what its read saw by transaction id (PostgreSQL): changes after
    # this position make a row stale (default: after ``at``), and which transactions it saw
    drop_after: tuple[Any, ...] | None = None
    visible: Callable[[int], bool] | None = None


def row_key(row: dict[str, Any], key: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(_hashable(row.get(c)) for c in key)


def _hashable(v: Any) -> Any:
    if isinstance(v, (set, frozenset)):
        return frozenset(v)
    if isinstance(v, bytearray):
        return bytes(v)
    return v


def image_key(row: dict[str, Any], cols: tuple[str, ...]) -> tuple[Any, ...]:
    """A whole row as a multiset element (keyless tables)."""
    return tuple(_hashable(row.get(c)) for c in cols)


class EventSpill:
    """Recorded changes of a keyless table, on disk (an unlinked temporary file), in
    batches: what a long consistent read of a busy keyless table would otherwise
    keep in memory."""

    def __init__(self, directory: str | None):
        if directory:
            os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self._f = tempfile.TemporaryFile(dir=directory or None, prefix="capturer-snaprec-")
        self._batches: list[tuple[int, int]] = []
        self._off = 0
        self.rows = 0

    def add(self, events: list[tuple[tuple[Any, ...], int, int, dict[str, Any]]]) -> None:
        data = pickle.dumps(events, protocol=pickle.HIGHEST_PROTOCOL)
        write_blob(self._f, data, self.directory, "the changes recorded during a snapshot")
        self._batches.append((self._off, len(data)))
        self._off += len(data)
        self.rows += len(events)

    def batches(self) -> Iterator[list[tuple[tuple[Any, ...], int, int, dict[str, Any]]]]:
        for off, length in self._batches:
            data = os.pread(self._f.fileno(), length, off)
            if len(data) != length:
                raise OSError(f"snapshot change spill truncated: wanted {length} bytes at {off}, got {len(data)}")
            yield pickle.loads(data)

    def close(self) -> None:
        try:
            self._f.close()
        except OSError:
            pass


@dataclass
class Recorder:
    """What the log changed in one table while chunks of it are in flight. Positions
    are the region's comparable position tuples (``_pkey``); ``tag``: the source's
    transaction id, where a chunk's visibility is told by it (PostgreSQL)."""

    key: tuple[str, ...]
    columns: tuple[str, ...]
    changed: dict[tuple[Any, ...], tuple[Any, ...]] = field(default_factory=dict)  # keyed: key -> last change
    # keyless: (position, tag, -1 deleted / +1 inserted, row), oldest first; past spill_rows on disk
    events: list[tuple[tuple[Any, ...], int, int, dict[str, Any]]] = field(default_factory=list)
    lows: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # in-flight chunk -> lower bound of its P
    whole: set[int] = field(default_factory=set)  # in-flight reads of the whole table (keyless: events kept)
    spill_rows: int = 0  # keyless: keep at most this many events in memory (0: no limit)
    spill_dir: str = ""
    spill: EventSpill | None = None

    def record(self, pos: tuple[Any, ...], before: dict[str, Any] | None, after: dict[str, Any] | None,
               tag: int = 0) -> None:
        if self.key:
            for img in (before, after):
                if img is not None:
                    self.changed[row_key(img, self.key)] = pos
        if not self.key or self.whole:  # (both while keyed chunks and whole reads are in flight)
            if before is not None:
                self.events.append((pos, tag, -1, before))
            if after is not None:
                self.events.append((pos, tag, 1, after))
            if self.spill_rows and len(self.events) >= self.spill_rows:
                if self.spill is None:
                    self.spill = EventSpill(self.spill_dir or None)
                self.spill.add(self.events)
                self.events = []

    def keyless_events(self, after: tuple[Any, ...]) -> Iterator[tuple[int, dict[str, Any], int]]:
        """(sign, row, tag) of the keyless changes recorded after ``after``, in order."""
        if self.spill is not None:
            for batch in self.spill.batches():
                for pos, tag, sign, row in batch:
                    if pos > after:
                        yield sign, row, tag
        for pos, tag, sign, row in self.events:
            if pos > after:
                yield sign, row, tag

    def prune(self) -> None:
        self.whole &= set(self.lows)
        if not self.lows:
            self.changed.clear()
            self.events.clear()
            if self.spill is not None:
                self.spill.close()
                self.spill = None
            return
        low = min(self.lows.values())
        self.changed = {k: p for k, p in self.changed.items() if p > low}
        self.events = [e for e in self.events if e[0] > low]
