"""A PostgreSQL region's transactions as they arrive: the one being received (row
changes, DDL where a relation changed or a table was truncated), row images from
pgoutput tuples (``row_image``), and the C tuple decoder's fast path (``fast_change``).

The region is a PostgresRegion, typed Any: region.py imports this module."""

from __future__ import annotations

from typing import Any

from capturer.errors import FatalSourceError
from capturer.model import Ddl
from capturer.model.changes import make_change
from capturer.model.encode import qualified
from capturer.regions.base import ChangeBuffer
from capturer.regions.postgresql import pgoutput as po
from capturer.regions.postgresql.relations import RelDef, ddl_for
from capturer.regions.postgresql.types import Unrepresentable


def row_image(region: Any, rel: RelDef, tup: po.Tuple, old: dict[str, Any] | None = None,
              only_present: bool = False) -> tuple[dict[str, Any], list[str]]:
    """A row image from a tuple, and the columns sent as "unchanged TOAST" (taken
    from ``old`` when it has them)."""
    out: dict[str, Any] = {}
    unchanged: list[str] = []
    for col, t, (kind, text) in zip(rel.columns, rel.types, tup):
        if kind == po.TEXT:
            try:
                out[col.name] = t.parse(text)  # type: ignore[arg-type]
            except Unrepresentable:
                region.unrepresentable += 1
                out[col.name] = None
            except ValueError as exc:
                raise FatalSourceError(f"{region.where}: {rel.db}.{rel.table}.{col.name}: cannot read value "
                                       f"{str(text)[:80]!r}: {exc}") from None
        elif kind == po.NULL:
            if not only_present:
                out[col.name] = None
        elif kind == po.UNCHANGED:
            if old is not None and col.name in old:
                out[col.name] = old[col.name]
            else:
                unchanged.append(col.name)
        else:  # binary: never asked for
            raise po.ProtocolError(f"{region.where}: a binary value in {rel.db}.{rel.table}")
    return out, unchanged


def fast_change(region: Any, txn: TxnBuilder, session: dict[int, RelDef], buf: bytes, off: int) -> bool:
    """An INSERT, UPDATE or DELETE message at ``off`` through the C tuple decoder, as
    ``po.parse`` and ``TxnBuilder.change`` take it; False leaves it to them (no C build, a
    relation not described, a table the filter leaves out, unchanged TOASTed values to fill,
    anything the decoder refuses: the general path then says what is wrong)."""
    if len(buf) < off + 6:
        return False
    rel = session.get(int.from_bytes(buf[off + 1:off + 5], "big"))
    if rel is None or not region.ctx.table_selected(rel.db, rel.table):
        return False
    plan = rel.plan
    if plan is None:
        return False
    tag, k, i = buf[off], buf[off + 5], off + 6
    try:
        if tag == 0x49:  # I
            if k != 0x4E:
                return False
            after, _, _, bad = plan.image(buf, i, False)
            ch = make_change(rel.schema, "insert", None, after)
        elif tag == 0x44:  # D
            if k not in (0x4B, 0x4F):
                return False
            before, _, _, bad = plan.image(buf, i, k == 0x4B)
            ch = make_change(rel.schema, "delete", before, None)
        else:  # U
            old, bad = None, 0
            if k in (0x4B, 0x4F):
                old, _, i, bad = plan.image(buf, i, k == 0x4B)
                if i >= len(buf):
                    return False
                k, i = buf[i], i + 1
            if k != 0x4E:
                return False
            after, unchanged, _, bad_new = plan.image(buf, i, False)
            if unchanged:  # (the old row's values, or a read of the table: the general path)
                return False
            bad += bad_new
            before = old if old is not None else {c: after[c] for c in rel.pk if c in after}
            ch = make_change(rel.schema, "update", before, after)
    except ValueError:
        return False
    region.unrepresentable += bad
    txn.changes.append(ch, txn.begin.xid)
    return True


class TxnBuilder:
    """The transaction being received: its parts in order (row changes, spilled past
    ``spillRows``, and DDL where a relation changed or a table was truncated), and
    the relation definitions it introduced (journaled at its commit)."""

    def __init__(self, region: Any, begin: po.Begin):
        self.r = region
        self.begin = begin
        self.parts: list[Any] = []
        self.changes = ChangeBuffer(region.ctx.spill_rows, region.ctx.spill_dir, region.where)
        self.new_relations: list[RelDef] = []
        self.seen_relations: list[RelDef] = []  # every relation message's definition (region.seen)

    def _cut(self) -> None:
        if not self.changes.empty:
            rows, spilled = self.changes.take()
            self.parts.append(rows)
            if spilled:
                self.r.spilled_txns += 1

    def _ddl(self, stmts: list[tuple[str, str, str]]) -> None:
        if not stmts:
            return
        self._cut()
        for db, sql, table in stmts:
            self.parts.append(Ddl(db, sql, table, db))

    def relation(self, rel: RelDef) -> None:
        self.seen_relations.append(rel)
        known = self.r.rels_known.get(rel.relid)
        if known is not None and known.same_shape(rel):
            return
        # a new table under the name of one the targets have (dropped and created again in PostgreSQL,
        # which logs neither): the old one goes first
        replaced = known is None and any((k.db, k.table) == (rel.db, rel.table) and k.relid != rel.relid
                                         for k in self.r.rels_known.values())
        self.r.rels_known[rel.relid] = rel
        self.new_relations.append(rel)
        if known is None:  # maybe a table added to the publication: a look at it now
            self.r.pubwatch.wake.set()
        if self.r.cfg.ddl and self.r.ctx.table_selected(rel.db, rel.table):
            defaults = self.r.added_defaults(known, rel) if known is not None else None
            stmts = ddl_for(known, rel, defaults)
            if replaced:
                stmts.insert(1, (rel.db, f"DROP TABLE IF EXISTS {qualified(rel.db, rel.table)}", rel.table))
            self._ddl(stmts)

    def truncate(self, rel: RelDef) -> None:
        if self.r.ctx.table_selected(rel.db, rel.table):
            self._ddl([(rel.db, f"TRUNCATE TABLE {qualified(rel.db, rel.table)}", rel.table)])

    def change(self, rel: RelDef, m: po.Insert | po.Update | po.Delete) -> None:
        if not self.r.ctx.table_selected(rel.db, rel.table):
            return
        r = self.r
        if isinstance(m, po.Insert):
            after, _ = r.image(rel, m.new)
            ch = make_change(rel.schema, "insert", None, after)
        elif isinstance(m, po.Delete):
            before, _ = r.image(rel, m.old, only_present=m.old_kind == "K")
            ch = make_change(rel.schema, "delete", before, None)
        else:
            old = None
            if m.old is not None:
                old, _ = r.image(rel, m.old, only_present=m.old_kind == "K")
            after, unchanged = r.image(rel, m.new, old if m.old_kind == "O" else None)
            if unchanged:
                r.fill_toast(rel, after, unchanged, m.new, self.begin.xid)
            before = old if old is not None else {k: after[k] for k in rel.pk if k in after}
            ch = make_change(rel.schema, "update", before, after)
        self.changes.append(ch, self.begin.xid)

    def finish(self) -> list[Any]:
        self._cut()
        return self.parts
