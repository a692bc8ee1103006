"""A BaikalDB region's schema epochs: the source tables' schemas in effect from a
point of the stream on (``Epoch``), their journal (``SchemaJournal``,
``<checkpoint>.baikaldb.<region>``), a switch from one epoch to the next
(``Switch``) and the MySQL DDL that makes it (``ddl_statements``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capturer.model.encode import qualified, quote_ident
from capturer.regions.baikaldb.schema import TableDef, alter_table_sql, create_table_sql
from capturer.regions.base import PositionJournal


@dataclass
class Epoch:
    """The source tables' schemas in effect from a point of the stream on.

    ``from_ts``: the schemas apply to entries after this TSO; ``at_ts``: the
    commit TSO the switch's DDL preludes were given (the transaction they
    precede, or the heartbeat's TSO); ``first``: the first start's CREATE
    statements. None for the schemas a region started with."""

    tables: dict[int, TableDef]
    from_ts: int | None = None
    at_ts: int | None = None
    first: bool = False


class SchemaJournal(PositionJournal[int, Epoch]):
    """``epoch -> Epoch``: the schemas in effect at each position of this region
    (the position names its epoch; a line is fsync'd before any item names the
    epoch). A switch is journaled before its DDL leaves, with where it applies, so
    that a restart from before it makes the same switch at the same point with the
    same statements. Epochs are written in increasing order."""

    what = "schema journal"

    def parse(self, d: Any) -> tuple[int, Epoch]:
        tables = {int(k): TableDef.from_json(v) for k, v in d["tables"].items()}
        f, a = d.get("from_ts"), d.get("at_ts")
        return int(d["epoch"]), Epoch(tables, None if f is None else int(f), None if a is None else int(a),
                                      bool(d.get("first")))

    def dump(self, key: int, value: Epoch) -> dict[str, Any]:
        d: dict[str, Any] = {"epoch": key, "tables": {str(k): v.to_json() for k, v in value.tables.items()}}
        if value.from_ts is not None:
            d["from_ts"] = value.from_ts
        if value.at_ts is not None:
            d["at_ts"] = value.at_ts
        if value.first:
            d["first"] = True
        return d

    def epoch(self, epoch: int) -> Epoch | None:
        return self.lookup(epoch)

    def next_epoch(self) -> int:
        return max((e for e, _ in self.items()), default=0) + 1

    def write(self, epoch: int, ep: Epoch) -> None:
        self.put(epoch, ep)

    def scheduled_after(self, epoch: int, ts: int) -> list[tuple[int, Epoch]]:
        """Switches journaled after ``epoch`` that apply at or after ``ts``, in order."""
        return sorted((e, ep) for e, ep in self.items()
                      if e > epoch and ep.from_ts is not None and ep.from_ts >= ts and not ep.first)

    def first_start(self) -> tuple[int, Epoch] | None:
        return next(((e, ep) for e, ep in sorted(self.items(), key=lambda x: x[0]) if ep.first), None)

    def prune(self, keep_from: int) -> None:
        """Forget the epochs before ``keep_from`` (the checkpoint's)."""
        self.forget(lambda epochs: [e for e in epochs if e < keep_from])


@dataclass
class Switch:
    """A schema switch to make in front of a transaction (or at a heartbeat):
    ``changes`` tid -> (version in use or None for a new table, next version)."""

    changes: dict[int, tuple[TableDef | None, TableDef]]
    epoch: int | None = None  # a journaled switch being made again: its epoch number ...
    at: int | None = None  # ... the TSO its preludes had ...
    from_ts: int | None = None  # ... and the TSO after which its schemas apply


def ddl_statements(switches: dict[int, tuple[TableDef | None, TableDef]], tables: dict[int, TableDef],
                   create_tables: bool, known_dbs: set[str] | None = None) -> list[tuple[str, str, str]]:
    """(db, table, sql) of the DDL that brings a target to the switched versions:
    CREATE DATABASE/TABLE for new tables (``create_tables``), RENAME TABLE for a
    table that was renamed, ALTER TABLE for changed columns. ``tables``: the
    versions in use (their databases are known to the target unless ``known_dbs``
    says otherwise)."""
    if known_dbs is None:
        known_dbs = {d.db for d in tables.values()}
    out = []
    creates = sorted((d for old, d in switches.values() if old is None), key=lambda d: d.name)
    renamed = [(old, new) for old, new in switches.values() if old is not None and old.name != new.name]
    if create_tables:
        new_dbs = {d.db for d in creates} | {new.db for _, new in renamed}
        for db in sorted(new_dbs - known_dbs):
            out.append((db, "", f"CREATE DATABASE IF NOT EXISTS {quote_ident(db)}"))
        out += [(d.db, d.table, create_table_sql(d)) for d in creates]
    for old, new in sorted(renamed, key=lambda x: x[1].name):
        out.append((new.db, new.table, f"RENAME TABLE {qualified(old.db, old.table)} TO "
                                       f"{qualified(new.db, new.table)}"))
    for tid in sorted(switches):
        was, new = switches[tid]
        if was is not None:
            sql = alter_table_sql(was, new)
            if sql is not None:
                out.append((new.db, new.table, sql))
    return out
