"""The data model shared by regions, the merger, the SenderManager and senders.

Everything here is immutable. ``commit_ts`` is a 64-bit TSO value
(``physical_ms << 18 | logical``): strictly increasing within a region, and the
merge order across regions is ``(commit_ts, region)``.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

LOGICAL_BITS = 18
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1

Op = Literal["insert", "update", "delete", "read"]
"""``read``: a row copied by a snapshot (applied like an insert: an upsert of the
row as it was at that point of the stream)."""


def make_ts(physical_ms: int, logical: int = 0) -> int:
    """Compose a TSO commit_ts from milliseconds since the epoch and a logical counter."""
    return (physical_ms << LOGICAL_BITS) | (logical & LOGICAL_MASK)


def ts_physical_ms(ts: int) -> int:
    return ts >> LOGICAL_BITS


def ts_logical(ts: int) -> int:
    return ts & LOGICAL_MASK


# --- snapshot progress (carried by MySQL positions) ----------------------------------

def encode_key(key: tuple[Any, ...] | None) -> list[Any] | None:
    """A snapshot key (primary-key values) as JSON: each value tagged with its type."""
    if key is None:
        return None
    out: list[Any] = []
    for v in key:
        if v is None:
            out.append(None)
        elif isinstance(v, bool):
            out.append(["i", int(v)])
        elif isinstance(v, int):
            out.append(["i", v])
        elif isinstance(v, float):
            out.append(["f", repr(v)])
        elif isinstance(v, str):
            out.append(["s", v])
        elif isinstance(v, (bytes, bytearray)):
            out.append(["b", base64.b64encode(bytes(v)).decode()])
        elif isinstance(v, decimal.Decimal):
            out.append(["d", str(v)])
        elif isinstance(v, dt.datetime):
            out.append(["dt", v.isoformat()])
        elif isinstance(v, dt.date):
            out.append(["da", v.isoformat()])
        elif isinstance(v, dt.timedelta):
            out.append(["td", v.days, v.seconds, v.microseconds])
        elif isinstance(v, (set, frozenset)):
            out.append(["set", sorted(str(x) for x in v)])
        else:
            raise ValueError(f"cannot keep a key value of type {type(v).__name__}")
    return out


def decode_key(d: Any) -> tuple[Any, ...] | None:
    if d is None:
        return None
    if not isinstance(d, list):
        raise ValueError(f"a snapshot key must be a list, got {d!r}")
    out: list[Any] = []
    for v in d:
        if v is None:
            out.append(None)
            continue
        if not isinstance(v, list) or not v:
            raise ValueError(f"bad snapshot key value {v!r}")
        tag = v[0]
        if tag == "i":
            out.append(int(v[1]))
        elif tag == "f":
            out.append(float(v[1]))
        elif tag == "s":
            out.append(str(v[1]))
        elif tag == "b":
            out.append(base64.b64decode(v[1]))
        elif tag == "d":
            out.append(decimal.Decimal(v[1]))
        elif tag == "dt":
            out.append(dt.datetime.fromisoformat(v[1]))
        elif tag == "da":
            out.append(dt.date.fromisoformat(v[1]))
        elif tag == "td":
            out.append(dt.timedelta(days=v[1], seconds=v[2], microseconds=v[3]))
        elif tag == "set":
            out.append(set(v[1]))
        else:
            raise ValueError(f"bad snapshot key tag {tag!r}")
    return tuple(out)


SNAPSHOT_STATES = ("pending", "running", "done", "dropped")


@dataclass(frozen=True)
class TableProgress:
    """How far the snapshot of one table got, as of a position: every row with a
    key up to ``last_key`` (in key order) has been delivered (``chunks`` chunks,
    ``rows`` rows). ``run`` names the snapshot run (stable across restarts)."""

    db: str
    table: str
    run: str
    state: str = "pending"  # pending | running | done | dropped
    last_key: tuple[Any, ...] | None = None
    chunks: int = 0
    rows: int = 0
    truncate: bool = False  # TRUNCATE the table downstream before its first chunk
    created: bool = False  # its CREATE TABLE went out at the run's start (a restart does not send it again)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"db": self.db, "table": self.table, "run": self.run, "state": self.state,
                             "last_key": encode_key(self.last_key), "chunks": self.chunks, "rows": self.rows}
        if self.truncate:
            d["truncate"] = True
        if self.created:
            d["created"] = True
        return d

    @classmethod
    def from_json(cls, d: Any) -> TableProgress:
        if not isinstance(d, dict):
            raise ValueError(f"snapshot entry must be an object, got {d!r}")
        try:
            state = d.get("state", "pending")
            if state not in SNAPSHOT_STATES:
                raise ValueError(f"unknown snapshot state {state!r}")
            return cls(str(d["db"]), str(d["table"]), str(d["run"]), state, decode_key(d.get("last_key")),
                       int(d.get("chunks", 0)), int(d.get("rows", 0)), bool(d.get("truncate", False)),
                       bool(d.get("created", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad snapshot entry {d!r}: {exc}") from None


@dataclass(frozen=True)
class SnapshotMark:
    """On a transaction of snapshot rows: which run, table chunk, and whether it is
    the table's last. A chunk read again after a crash has the same (run, table,
    chunk); its rows may be newer (they were read again)."""

    run: str
    chunk: int
    last: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "chunk": self.chunk, "last": self.last}


@dataclass(frozen=True)
class ChunkMark(SnapshotMark):
    """The snapshot mark of a chunk's rows, with its table and the binlog position P
    it was read at (rows of two chunks, or a chunk read again after a crash, can be
    told apart and placed: P <= the transaction's position). The regions' snapshot
    engine makes it (capturer/regions/snapshot.py ``chunk_mark``); the wire format
    carries it whole (the backlog, sender processes, agents)."""

    db: str = ""
    table: str = ""
    read_at: Any = None  # Position; LsnPosition (without the progress it carries)

    def to_json(self) -> dict[str, Any]:
        d = super().to_json()
        d["db"], d["table"] = self.db, self.table
        if self.read_at is not None:
            r = self.read_at
            d["read_at"] = {"file": r.file, "pos": r.pos} if isinstance(r, Position) else r.to_json()
        return d


@dataclass(frozen=True)
class PreparedXa:
    """An XA transaction the source has prepared (MariaDB 10.5+, MySQL 5.7+ write its rows to
    the binlog at ``XA PREPARE``, in a group of their own) and not yet decided (``XA COMMIT``
    or ``XA ROLLBACK``, later, as a group of its own). ``xid``: ``format_id:gtrid:bqual``
    (the two in hex); ``file``/``pos``: where its group starts in the binlog (a region
    resuming past the group reads its rows again from there); ``gtid``: the group's GTID."""

    xid: str
    file: str
    pos: int
    gtid: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"xid": self.xid, "file": self.file, "pos": self.pos, "gtid": self.gtid}

    @classmethod
    def from_json(cls, d: Any) -> PreparedXa:
        if not isinstance(d, dict):
            raise ValueError(f"position.xa entries must be objects, got {d!r}")
        xid, file, pos, gtid = d.get("xid"), d.get("file"), d.get("pos"), d.get("gtid", "")
        if not isinstance(xid, str) or not xid or not isinstance(file, str) or not file:
            raise ValueError(f"position.xa entry needs a non-empty xid and file, got {d!r}")
        if not isinstance(pos, int) or isinstance(pos, bool) or pos < 4 or not isinstance(gtid, str):
            raise ValueError(f"position.xa entry: bad pos or gtid in {d!r}")
        return cls(xid, file, pos, gtid)


@dataclass(frozen=True, order=True)
class Position:
    """A resume point in a MySQL/MariaDB binlog: the byte offset *after* a transaction.

    Ordered by (file, pos); binlog file names sort in creation order
    (``name.000001`` < ``name.000002``) of one server. ``gtid``: the source's GTID
    state after the transaction (MariaDB ``domain-server-seq`` per domain, or a MySQL
    GTID set; '' where unknown): where a region resumes on another server of the
    topology (failover, capturer/regions/mysql/gtid.py); not compared. ``snapshot``:
    the progress of a running table snapshot at this point (kept in the checkpoint
    only, not in every change). ``xa``: the XA transactions prepared before this point
    and not decided at it (``PreparedXa``): their rows are read again from their own
    groups when the region resumes here (kept in the checkpoint and the wire format)."""

    file: str
    pos: int
    gtid: str = field(default="", compare=False)
    snapshot: tuple[TableProgress, ...] = field(default=(), compare=False, repr=False)
    xa: tuple[PreparedXa, ...] = field(default=(), compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "pos": self.pos, "gtid": self.gtid}

    def checkpoint_json(self) -> dict[str, Any]:
        d = self.to_json()
        if self.snapshot:
            d["snapshot"] = [t.to_json() for t in self.snapshot]
        if self.xa:
            d["xa"] = [x.to_json() for x in self.xa]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Position:
        if not isinstance(d, dict):
            raise ValueError(f"position must be an object, got {d!r}")
        file, pos, gtid = d.get("file"), d.get("pos"), d.get("gtid", "")
        if not isinstance(file, str) or not file:
            raise ValueError(f"position.file must be a non-empty string, got {file!r}")
        if not isinstance(pos, int) or isinstance(pos, bool) or pos < 4:
            raise ValueError(f"position.pos must be an integer >= 4, got {pos!r}")
        if not isinstance(gtid, str):
            raise ValueError(f"position.gtid must be a string, got {gtid!r}")
        snap = d.get("snapshot", [])
        if not isinstance(snap, list):
            raise ValueError("position.snapshot must be a list")
        xa = d.get("xa", [])
        if not isinstance(xa, list):
            raise ValueError("position.xa must be a list")
        return cls(file, pos, gtid, tuple(TableProgress.from_json(t) for t in snap),
                   tuple(PreparedXa.from_json(x) for x in xa))

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}" + (f" ({self.gtid})" if self.gtid else "")

    def lift_key(self) -> tuple[str, int]:
        """Where the lift journal (capturer/regions/clock.py) files a lifted transaction."""
        return (self.file, self.pos)

    kind: ClassVar[str] = "mysql"


@dataclass(frozen=True)
class TsPosition:
    """A resume point in a BaikalDB binlog table: read every binlog region strictly
    after ``ts`` (a BaikalDB TSO), except where ``regions`` gives a region its own,
    later, resume ts (a region that started later, e.g. at its own oldest binlog).

    ``epoch`` names the version of the source tables' schemas in effect at this
    point (the region's schema journal keeps them), so that a restart decodes
    rows the way the destinations expect them."""

    ts: int
    regions: tuple[tuple[int, int], ...] = ()  # (binlog region id, resume ts), every region read
    epoch: int = 0

    kind: ClassVar[str] = "baikaldb"

    def resume_ts(self, region_id: int) -> int:
        for rid, ts in self.regions:
            if rid == region_id:
                return max(ts, self.ts)
        return self.ts

    def to_json(self) -> dict[str, Any]:
        """Compact (carried by every change): regions only where they differ from ``ts``."""
        d: dict[str, Any] = {"kind": self.kind, "ts": self.ts, "epoch": self.epoch}
        own = {str(r): t for r, t in self.regions if t > self.ts}
        if own:
            d["regions"] = own
        return d

    def checkpoint_json(self) -> dict[str, Any]:
        """Every region with its resume ts, for the checkpoint file."""
        return {"kind": self.kind, "ts": self.ts, "epoch": self.epoch,
                "regions": {str(r): max(t, self.ts) for r, t in self.regions}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TsPosition:
        if not isinstance(d, dict):
            raise ValueError(f"position must be an object, got {d!r}")
        ts, epoch, regions = d.get("ts"), d.get("epoch", 0), d.get("regions", {})
        if not isinstance(ts, int) or isinstance(ts, bool) or ts <= 0 or ts >= 1 << 63:
            raise ValueError(f"position.ts must be a positive 64-bit integer (a BaikalDB TSO), got {ts!r}")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"position.epoch must be a non-negative integer, got {epoch!r}")
        if not isinstance(regions, dict):
            raise ValueError(f"position.regions must be an object, got {regions!r}")
        out = []
        for k, v in regions.items():
            if not (isinstance(k, str) and k.isdigit()) or not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"position.regions: expected \"<region id>\": <ts>, got {k!r}: {v!r}")
            out.append((int(k), v))
        return cls(ts, tuple(sorted(out)), epoch)

    def __str__(self) -> str:
        return f"ts {self.ts}"


def wal_record_end(insert_lsn: int, block: int = 8192, segment: int = 16 << 20) -> int:
    """A PostgreSQL insert position (``pg_current_wal_insert_lsn()``) as the end of the
    last record written: at the start of a WAL page the server gives the position after
    the page's header, which a replication stream (that reports record ends) never
    reaches while nothing more is written. ``block``/``segment``: the server's WAL page
    and segment sizes."""
    if segment and insert_lsn % segment == 40:  # a segment's first page: long header
        return insert_lsn - 40
    if block and insert_lsn % block == 24:  # short page header
        return insert_lsn - 24
    return insert_lsn


def format_lsn(lsn: int) -> str:
    """A PostgreSQL LSN as PostgreSQL writes it: ``16/B374D848``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(v: Any) -> int:
    """``16/B374D848`` (or a non-negative integer) as an integer LSN."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64:
        return v
    if isinstance(v, str):
        hi, sep, lo = v.partition("/")
        try:
            if sep and hi and lo and len(hi) <= 8 and len(lo) <= 8:
                return (int(hi, 16) << 32) | int(lo, 16)
        except ValueError:
            pass
    raise ValueError(f"expected a PostgreSQL LSN like 16/B374D848, got {v!r}")


@dataclass(frozen=True, order=True)
class LsnPosition:
    """A resume point in a PostgreSQL logical replication slot: the end LSN of the
    last transaction read (its commit record's end), or a WAL position an idle
    slot reported with nothing in flight. Reading resumes with the first
    transaction that commits after it."""

    lsn: int
    # the progress of a running table snapshot at this point (kept in the checkpoint only)
    snapshot: tuple[TableProgress, ...] = field(default=(), compare=False, repr=False)

    kind: ClassVar[str] = "postgresql"

    def lift_key(self) -> tuple[str, int]:
        return ("lsn", self.lsn)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "lsn": format_lsn(self.lsn)}

    def checkpoint_json(self) -> dict[str, Any]:
        d = self.to_json()
        if self.snapshot:
            d["snapshot"] = [t.to_json() for t in self.snapshot]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LsnPosition:
        if not isinstance(d, dict):
            raise ValueError(f"position must be an object, got {d!r}")
        try:
            lsn = parse_lsn(d.get("lsn"))
        except ValueError as exc:
            raise ValueError(f"position.lsn: {exc}") from None
        snap = d.get("snapshot", [])
        if not isinstance(snap, list):
            raise ValueError("position.snapshot must be a list")
        return cls(lsn, tuple(TableProgress.from_json(t) for t in snap))

    def __str__(self) -> str:
        return format_lsn(self.lsn)


AnyPosition = Position | TsPosition | LsnPosition


def position_from_json(d: Any) -> AnyPosition:
    """A checkpointed position of any region kind (``kind``; MySQL when absent)."""
    if not isinstance(d, dict):
        raise ValueError(f"position must be an object, got {d!r}")
    kind = d.get("kind", "mysql")
    if kind == "mysql":
        return Position.from_json(d)
    if kind == "baikaldb":
        return TsPosition.from_json(d)
    if kind == "postgresql":
        return LsnPosition.from_json(d)
    raise ValueError(f"unknown position kind {kind!r}")


@dataclass(frozen=True)
class ColumnInfo:
    """Per-column facts from the binlog's table map."""

    type: int  # MySQL type code
    unsigned: bool = False
    precision: int = 0  # DECIMAL
    scale: int = 0  # DECIMAL
    binary: bool = False  # a string/blob column without a character set (bytes values)
    # BINARY(n): its n. The binlog carries such a value without its trailing zero bytes; the region pads it
    # back, as the server stores and returns it (0 for every other column)
    length: int = 0


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


def schema_json(s: TableSchema) -> dict[str, Any]:
    """A table schema as JSON (the Kafka sender's END records; ``schema_from_json`` reads it)."""
    return {"db": s.db, "table": s.table, "columns": list(s.columns), "pk": list(s.pk),
            "unique_keys": [list(u) for u in s.unique_keys], "types": list(s.column_types),
            "info": [[c.type, c.unsigned, c.precision, c.scale, c.binary] for c in s.column_info]}


def schema_from_json(d: Any) -> TableSchema:
    """``schema_json``'s output back; ValueError naming what is wrong."""
    if not isinstance(d, dict):
        raise ValueError(f"a schema must be an object, got {type(d).__name__}")
    try:
        def names(v: Any) -> tuple[str, ...]:
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"expected a list of names, got {v!r}")
            return tuple(v)

        columns = names(d["columns"])
        types = tuple(int(t) for t in d.get("types", ()))
        info = tuple(ColumnInfo(int(c[0]), bool(c[1]), int(c[2]), int(c[3]), bool(c[4])) for c in d.get("info", ()))
        if types and len(types) != len(columns) or info and len(info) != len(columns):
            raise ValueError("types/info do not match the columns")
        return TableSchema(str(d["db"]), str(d["table"]), columns, names(d.get("pk", [])),
                           tuple(names(u) for u in d.get("unique_keys", ())), types, info)
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"bad schema: {exc!r}") from None


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
    def absent(self) -> tuple[str, ...]:
        """Columns of the table an update's new image leaves out (a partial image: an
        unchanged TOASTed value of a PostgreSQL row gone since, a MySQL
        ``binlog_row_image=MINIMAL``); () for a whole image, an insert or a delete.
        A column left out is not NULL: its value is unknown, and no sender makes one up."""
        after = self.after
        cols = self.schema.columns
        if self.op != "update" or after is None or len(after) == len(cols):
            return ()
        return tuple(c for c in cols if c not in after)

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
    database that was current when it ran (unqualified names refer to it).

    ``seq``: the statement's place in the change identity ``(region, commit_ts,
    seq)``. 0 for a statement of its own; a region that must apply a schema
    change in front of a transaction (BaikalDB writes no DDL, so the region
    derives it) gives the k statements the transaction's commit_ts and seq -k
    .. -1: they leave just before it and never share an identity with its rows."""

    db: str
    sql: str
    table: str = ""
    session_db: str = ""
    seq: int = 0

    @property
    def prelude(self) -> bool:
        """Emitted in front of a transaction of the same region at the same commit_ts."""
        return self.seq < 0


@dataclass(frozen=True)
class Txn:
    """A committed transaction (or one DDL statement) from one region.

    ``position`` is where to resume to read the *next* transaction. ``seq`` of a
    change is its index in ``changes``; ``(region, commit_ts, seq)`` identifies a
    change across replays.
    """

    region: str
    commit_ts: int
    position: AnyPosition
    changes: tuple[RowChange, ...] = ()
    ddl: Ddl | None = None
    source_ts: int = 0  # seconds, as the source wrote it in the binlog event header
    gtid: str = ""
    snapshot: SnapshotMark | None = None  # set on a transaction of snapshot rows (op "read")

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
    position: AnyPosition | None = None


Item = Txn | Heartbeat


StreamKey = tuple[int, str, int]
"""An item's place in the merged stream: ``(commit_ts, region, sub)``. ``sub`` orders a
region's items at one commit_ts: a DDL prelude's ``seq`` (-k .. -1), then 0 for the
transaction; ``HEARTBEAT_SUB`` for a heartbeat. Merged order is key order, and a
transaction read again after a restart gets the key it had (regions keep their
commit_ts across replays), so a sender's position survives restarts as a key."""

HEARTBEAT_SUB = 1 << 30


def stream_key(item: Item) -> StreamKey:
    """The key of ``item`` as a region made it (take it before a filter strips a DDL)."""
    if isinstance(item, Txn):
        d = item.ddl
        return (item.commit_ts, item.region, d.seq if d is not None and d.seq < 0 else 0)
    return (item.commit_ts, item.region, HEARTBEAT_SUB)


def key_to_json(key: StreamKey | None) -> list[Any] | None:
    return None if key is None else [key[0], key[1], key[2]]


def key_from_json(d: Any) -> StreamKey | None:
    if d is None:
        return None
    if (not isinstance(d, list) or len(d) != 3 or not isinstance(d[0], int) or isinstance(d[0], bool)
            or not isinstance(d[1], str) or not isinstance(d[2], int) or isinstance(d[2], bool)
            or not 0 <= d[0] < 1 << 63):
        raise ValueError(f"a stream key is [commit_ts, region, sub], got {d!r}")
    return (d[0], d[1], d[2])
