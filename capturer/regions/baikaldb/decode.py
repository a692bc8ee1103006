"""A BaikalDB region's transactions, decoded (``prepare``): the parts of one
transaction (one entry per partition) become a ``Prepared`` with its row
changes (spilled past ``spill_rows``) and the schema switch it needs in front of
it: one journaled before a restart (``journaled_switch``), versions the meta
showed that are due by time, or a newer schema a row shows (an unknown table or
field number: the schemas are read again, ``refresh_for_evidence``).

The region is a BaikalRegion, typed Any: region.py imports this module."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model import RowChange
from capturer.model.spill import DEFAULT_CHUNK_ROWS, SpillWriter
from capturer.regions.baikaldb.epochs import Switch
from capturer.regions.baikaldb.rows import Entry, RowDecodeError, RowPlan, UnpairedUpdate, mutation_changes
from capturer.regions.baikaldb.tso import describe

log = logging.getLogger("capturer.regions.baikaldb.region")  # (the region's logger: its messages as before)


@dataclass
class Prepared:
    """A transaction decoded and ready to leave."""

    ts: int  # BaikalDB commit TSO (the last part's)
    entries: list[Entry]
    changes: Any = ()  # tuple[RowChange, ...] or SpilledChanges
    switch: Switch | None = None

    @property
    def first(self) -> int:
        """The first part's commit TSO (a position in front of it must stay below it)."""
        return self.entries[0].ts

    @property
    def txn_id(self) -> int:
        return self.entries[0].txn_id


def refresh_for_evidence(region: Any) -> None:
    """Read the schemas again because a row showed a newer one (at most once a
    second; rows of tables that are not linked any more must not turn every
    transaction into a full schema query). A failure is raised (the stream reads
    again from what was delivered, after a backoff): rows are never delivered
    without the columns they carry."""
    if time.monotonic() - region._last_evidence_refresh < 1.0:
        return
    region._last_evidence_refresh = time.monotonic()
    _, defs, _ = region._linked()
    region._note_versions(defs, region._now_tso())


def journaled_switch(region: Any, upto: int) -> Switch | None:
    """The next journaled switch (a restart making it again), if it applies to
    entries at or below ``upto``."""
    if not region.scheduled or region.scheduled[0][1].from_ts is None or region.scheduled[0][1].from_ts >= upto:
        return None
    epoch, ep = region.scheduled[0]
    changes = {tid: (region.tables.get(tid), d) for tid, d in ep.tables.items()
               if region.tables.get(tid) != d}
    return Switch(changes, epoch, ep.at_ts, ep.from_ts)


def prepare(region: Any, entries: list[Entry]) -> Prepared:
    p = Prepared(entries[-1].ts, entries)
    journaled = journaled_switch(region, p.first)
    if journaled is not None:
        # made before a restart: the same switch again, whatever the meta says now
        p.switch = journaled
        p.changes = decode(region, p)
        return p
    p.switch = Switch(region._due(p.ts))
    muts = [m for e in entries for m in e.mutations]
    touched = {int(m.table_id) for m in muts}
    unknown_tables = touched - set(region.tables) - set(p.switch.changes)
    if unknown_tables:
        refresh_for_evidence(region)
        p.switch.changes = region._due(p.ts)
        for tid in unknown_tables:
            if tid in region.pending and tid not in p.switch.changes:
                p.switch.changes[tid] = (region.tables.get(tid), region.pending[tid][0])
    known = set(p.switch.changes)
    p.changes = decode(region, p)
    if set(p.switch.changes) != known:
        # a row showed a newer schema half way: read the whole transaction with it
        p.changes = decode(region, p)
    if not p.switch.changes:
        p.switch = None
    return p


def plan_for(region: Any, tid: int, p: Prepared) -> RowPlan | None:
    """The plan a row of table ``tid`` decodes with in ``p`` (the next version's if
    ``p`` switches it)."""
    if p.switch is not None and tid in p.switch.changes:
        new = p.switch.changes[tid][1]
        plan = region.plans.get(-tid)
        if plan is None or plan.tdef is not new:
            plan = region.plans[-tid] = RowPlan(new)  # the next version's plan, kept apart
        return plan
    return region.plans.get(tid)


def decode(region: Any, p: Prepared) -> Any:
    """The row changes of a prepared transaction (spilled past spill_rows)."""
    spill_rows = region.ctx.spill_rows
    total = sum(len(m.insert_rows) + len(m.deleted_rows) for e in p.entries for m in e.mutations)
    spill: SpillWriter | None = None
    if spill_rows and total > spill_rows:
        spill = SpillWriter(region.ctx.spill_dir or None, min(spill_rows, DEFAULT_CHUNK_ROWS))
    out: list[RowChange] = []
    split = region.cfg.unpaired_update == "split"
    for e in p.entries:
        for m in e.mutations:
            tid = int(m.table_id)
            plan = plan_for(region, tid, p)
            if plan is None:
                region.counters["skipped_mutations"] += 1
                if ("table", tid) not in region._warned:
                    region._warned.add(("table", tid))
                    log.warning("%s: skipping mutations of table id %d: it is not linked to binlog table %d "
                                "(dropped or unlinked?)", region.where, tid, region.cfg.binlogTableID)
                continue
            try:
                changes, unknown = mutation_changes(plan, m, split)
            except UnpairedUpdate as exc:
                raise FatalSourceError(
                    f"{region.where}: {exc} in transaction {e.txn_id} (commit_ts TSO {describe(p.ts)}, binlog "
                    f"region {e.region_id}). BaikalDB writes such an UPDATE for REPLACE and INSERT ... ON "
                    "DUPLICATE KEY UPDATE; set unpaired_update=split in this [region:...] section to apply its "
                    "old rows as deletes and its new rows as inserts, then start again") from None
            except (RowDecodeError, ValueError) as exc:
                raise FatalSourceError(f"{region.where}: transaction {e.txn_id} at TSO {describe(p.ts)}, binlog "
                                       f"region {e.region_id}: {exc}") from None
            if unknown:
                changes = unknown_fields(region, p, tid, m, unknown, split)
            if len(set(map(len, (m.insert_rows, m.deleted_rows)))) > 1 and m.insert_rows and m.deleted_rows:
                region.counters["unpaired_updates_split"] += 1
            out.extend(changes)
            if spill is not None and len(out) >= spill.chunk_rows:
                spill.add(out)
                out = []
    if spill is not None:
        if out:
            spill.add(out)
        return spill.finish()
    return tuple(out)


def unknown_fields(region: Any, p: Prepared, tid: int, m: Any, unknown: tuple[int, ...],
                   split: bool) -> list[RowChange]:
    """Rows with field numbers this table version does not know: a newer schema."""
    assert p.switch is not None
    if p.switch.epoch is None:  # (a journaled switch is made exactly as before)
        region._last_evidence_refresh = 0.0
        refresh_for_evidence(region)
        pend = region.pending.get(tid)
        if pend is not None and set(unknown) <= pend[0].known_ids and tid not in p.switch.changes:
            p.switch.changes[tid] = (region.tables.get(tid), pend[0])
            changes, _ = mutation_changes(plan_for(region, tid, p), m, split)  # type: ignore[arg-type]
            return changes
    region.counters["unknown_fields"] += len(unknown)
    cur = p.switch.changes.get(tid, (None, region.tables.get(tid)))[1]
    raise SourceError(
        f"{region.where}: {cur.name if cur else tid}: transaction {p.txn_id} (TSO {describe(p.ts)}) carries field "
        f"numbers {sorted(set(unknown))} that the meta's schema (version {cur.version if cur else '?'}) does not "
        "know yet; reading it again once the meta knows them")
