"""The data model shared by regions, the merger, the SenderManager and senders.

Everything here is immutable. ``commit_ts`` is a 64-bit TSO value
(``physical_ms << 18 | logical``): strictly increasing within a region, and the
merge order across regions is ``(commit_ts, region)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union

LOGICAL_BITS = 18
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1

Op = Literal["insert", "update", "delete"]


def make_ts(physical_ms: int, logical: int = 0) -> int:
    """Compose a TSO commit_ts from milliseconds since the epoch and a logical counter."""
    return (physical_ms << LOGICAL_BITS) | (logical & LOGICAL_MASK)


def ts_physical_ms(ts: int) -> int:
    return ts >> LOGICAL_BITS


def ts_logical(ts: int) -> int:
    return ts & LOGICAL_MASK


@dataclass(frozen=True, order=True)
class Position:
    """A resume point in a MySQL/MariaDB binlog: the byte offset *after* a transaction.

    Ordered by (file, pos); binlog file names sort in creation order
    (``name.000001`` < ``name.000002``). ``gtid`` is informational.
    """

    file: str
    pos: int
    gtid: str = field(default="", compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "pos": self.pos, "gtid": self.gtid}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Position":
        if not isinstance(d, dict):
            raise ValueError(f"position must be an object, got {d!r}")
        file, pos, gtid = d.get("file"), d.get("pos"), d.get("gtid", "")
        if not isinstance(file, str) or not file:
            raise ValueError(f"position.file must be a non-empty string, got {file!r}")
        if not isinstance(pos, int) or isinstance(pos, bool) or pos < 4:
            raise ValueError(f"position.pos must be an integer >= 4, got {pos!r}")
        if not isinstance(gtid, str):
            raise ValueError(f"position.gtid must be a string, got {gtid!r}")
        return cls(file, pos, gtid)

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}" + (f" ({self.gtid})" if self.gtid else "")


@dataclass(frozen=True)
class ColumnInfo:
    """Per-column facts from the binlog's table map."""

    type: int  # MySQL type code
    unsigned: bool = False
    precision: int = 0  # DECIMAL
    scale: int = 0  # DECIMAL
    binary: bool = False  # a string/blob column without a character set (bytes values)


@dataclass(frozen=True)
class TableSchema:
    """What a region knows about a table when a change is read."""

    db: str
    table: str
    columns: tuple[str, ...]
    pk: tuple[str, ...]
    unique_keys: tuple[tuple[str, ...], ...] = ()
    column_types: tuple[int, ...] = ()  # MySQL type codes, in column order
    column_info: tuple[ColumnInfo, ...] = ()

    def type_of(self, column: str) -> int | None:
        types = self.__dict__.get("_types")
        if types is None:  # built once per schema (a frozen dataclass: set through __dict__)
            types = dict(zip(self.columns, self.column_types))
            self.__dict__["_types"] = types
        return types.get(column)


@dataclass(slots=True, eq=True)
class RowChange:
    """One row change. ``before`` is None for inserts, ``after`` is None for deletes.

    Treated as immutable (filters make a new one with ``dataclasses.replace``);
    not declared frozen because a frozen dataclass's ``__init__`` costs about a
    microsecond more per row, and a region makes one per row."""

    schema: TableSchema
    op: Op
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @property
    def db(self) -> str:
        return self.schema.db

    @property
    def table(self) -> str:
        return self.schema.table

    @property
    def image(self) -> dict[str, Any]:
        """The row as it is after the change (the before image for a delete)."""
        img = self.after if self.after is not None else self.before
        assert img is not None
        return img


@dataclass(frozen=True)
class Ddl:
    """A schema change as the source wrote it.

    ``db``/``table``: what it changes (``table`` is "" for a database-level
    statement or when the statement could not be read); ``session_db``: the
    database that was current when it ran (unqualified names refer to it)."""

    db: str
    sql: str
    table: str = ""
    session_db: str = ""


@dataclass(frozen=True)
class Txn:
    """A committed transaction (or one DDL statement) from one region.

    ``position`` is where to resume to read the *next* transaction. ``seq`` of a
    change is its index in ``changes``; ``(region, commit_ts, seq)`` identifies a
    change across replays.
    """

    region: str
    commit_ts: int
    position: Position
    changes: tuple[RowChange, ...] = ()
    ddl: Ddl | None = None
    source_ts: int = 0  # seconds, as the source wrote it in the binlog event header
    gtid: str = ""

    @property
    def is_ddl(self) -> bool:
        return self.ddl is not None

    @property
    def rows(self) -> int:
        return len(self.changes)

    @property
    def weight(self) -> int:
        """Rows it holds in memory, for bounded queues (a spilled transaction holds about one chunk)."""
        spilled = getattr(self.changes, "memory_rows", None)
        return (len(self.changes) if spilled is None else spilled) + 1


@dataclass(frozen=True)
class Heartbeat:
    """A region's promise: every later transaction of ``region`` has commit_ts > ``commit_ts``."""

    region: str
    commit_ts: int
    position: Position | None = None


Item = Union[Txn, Heartbeat]
