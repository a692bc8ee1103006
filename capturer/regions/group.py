"""Work across the regions of one capturer (its ``Capturer`` keeps one ``RegionGroup``):
which other regions deliver a table (``tables_elsewhere``, asked by a region before a
copy that empties a table downstream), the region that takes part in a coordinated
copy of a table several regions deliver (``peer``, capturer/regions/snaphost.py), and
an on-demand snapshot checked across every region before any starts
(``request_snapshot``, POST /snapshot), and the tables a filter reload adds
(``tables_added``, ``hold``, ``strip_held``: copied by that same path, their changes
held back in each region until the region's copy of them starts).

A region takes part by what it can do, not by its kind: ``tables_info(tables)`` (it
knows which of them its source has), and the snapshot host (``SnapshotHostMixin``:
it copies tables in this process)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from capturer.errors import SourceError
from capturer.model import RowChange, Txn
from capturer.model.ddl import renamed_tables
from capturer.model.spill import SpilledChanges
from capturer.pipeline.filter import split_table_name
from capturer.regions.copies import CopyJournal
from capturer.regions.snaphost import SnapshotHostMixin
from capturer.regions.snapshot_plan import truncate_conflict

log = logging.getLogger(__name__)


class RegionGroup:
    def __init__(self) -> None:
        self.regions: list[Any] = []  # set once the regions are built (they are handed this group's methods)
        # region -> tables a filter reload added whose copy has not started there yet (replaced, never
        # changed in place: the merge thread reads it without a lock)
        self._held: dict[str, frozenset[tuple[str, str]]] = {}
        self._held_lock = threading.Lock()
        # copies asked for that no checkpoint on disk carries yet (capturer/regions/copies.py; None: not kept),
        # and those of them a start asks for again once their regions stream
        self.journal: CopyJournal | None = None
        self._again: list[dict[str, Any]] = []
        self._fresh: set[tuple[str, str]] = set()  # (region, table) of copies this run decided (renames)
        self._again_at = 0.0

    def peer(self, name: str) -> Any:
        """The region ``name`` if it copies tables in this process (a coordinated copy of a
        table several regions deliver needs every one of them here); else None."""
        r = next((x for x in self.regions if x.name == name), None)
        return r if isinstance(r, SnapshotHostMixin) else None

    def tables_elsewhere(self, region: str, tables: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
        """For each of ``tables``: the other regions (MySQL/MariaDB, PostgreSQL, local or
        served by agents) that deliver a table of that name (it exists on their server
        and the filter selects it)."""
        out: dict[tuple[str, str], list[str]] = {}
        for r in self.regions:
            if r.name == region or not hasattr(r, "tables_info"):
                continue
            for t in r.tables_info(tables):
                out.setdefault(t, []).append(r.name)
        return out

    # --- tables a filter reload adds ----------------------------------------------------
    #
    # A table the new rules select and the old did not is copied by the on-demand path
    # (``request_tables``) in every region that copies tables here. Until the region's copy
    # of it starts in its stream (its CREATE/TRUNCATE go out, or a coordinated copy delivers
    # it: ``SnapshotHostMixin._opened``), the region's changes to it are taken out of its
    # transactions: the copy's chunks are all read after that point, so they hold those
    # changes, and a sink never gets a change to a table before the table's CREATE.

    def tables_added(self, was: Callable[[str, str], bool],
                     now: Callable[[str, str], bool]) -> dict[str, list[tuple[str, str]]]:
        """For each region that copies tables in this process: its source's tables that
        ``now`` selects and ``was`` did not. SourceError if a source does not answer."""
        out: dict[str, list[tuple[str, str]]] = {}
        for r in self.regions:
            if isinstance(r, SnapshotHostMixin):
                added = [t for t in r.source_tables(now) if not was(*t)]
                if added:
                    out[r.name] = added
        return out

    def hold(self, added: dict[str, list[tuple[str, str]]]) -> None:
        """Hold back each region's changes to its ``added`` tables until their copy starts
        in its stream (a start of an earlier copy does not count)."""
        with self._held_lock:
            held = dict(self._held)
            for name, tables in added.items():
                host = self.peer(name)
                if host is None:
                    continue
                for t in tables:  # (no emission lock: a region blocked on a full queue holds it)
                    host.opened_from.pop(t, None)
                held[name] = held.get(name, frozenset()) | frozenset(tables)
            self._held = held

    def unhold(self, keep: Callable[[str, tuple[str, str]], bool]) -> None:
        """Stop holding what ``keep(region, table)`` says no longer needs it."""
        with self._held_lock:
            self._held = {n: f for n, f in ((n, frozenset(t for t in ts if keep(n, t)))
                                            for n, ts in self._held.items()) if f}

    def held(self) -> dict[str, list[str]]:
        """(status) region -> the tables held back until their copy starts there (not yet started)."""
        out = {}
        for name, tables in self._held.items():
            host = self.peer(name)
            opened = host.opened_from if host is not None else {}
            waiting = sorted(f"{db}.{t}" for db, t in tables if (db, t) not in opened)
            if waiting:
                out[name] = waiting
        return out

    def strip_held(self, txn: Txn) -> Txn:
        """(the merge thread) ``txn`` without its changes to tables held back in its
        region; a table whose copy started at or below ``txn``'s commit_ts is let go."""
        held = self._held.get(txn.region)
        if not held:
            return txn
        host = self.peer(txn.region)
        opened = host.opened_from if host is not None else {}
        started = {t for t in held if (cut := opened.get(t)) is not None and txn.commit_ts >= cut}
        if started:
            self.unhold(lambda n, t: n != txn.region or t not in started)
            held = held - started
            if not held:
                return txn
        d = txn.ddl
        if d is not None:
            # a DDL of it before its copy starts: the copy's CREATE (described after it) has its
            # effect, and a sink without the table could not apply an ALTER; a DROP passes (a
            # sink may hold the table from an earlier inclusion)
            if (d.db, d.table) in held and not d.sql.lstrip().upper().startswith("DROP"):
                return dataclasses.replace(txn, ddl=None)
            return txn

        def keep(ch: RowChange) -> RowChange | None:
            return None if (ch.db, ch.table) in held else ch

        if isinstance(txn.changes, SpilledChanges):
            if not any((s.db, s.table) in held for s in txn.changes.schemas):
                return txn
            return dataclasses.replace(txn, changes=txn.changes.filter_map(keep))  # type: ignore[arg-type]
        kept = tuple(ch for ch in txn.changes if (ch.db, ch.table) not in held)
        return txn if len(kept) == len(txn.changes) else dataclasses.replace(txn, changes=kept)

    def request_snapshot(self, tables: list[str], region: str | None = None, truncate: bool = False,
                         reason: str = "on demand") -> dict[str, Any]:
        """Copy tables again while streaming, in every MySQL/MariaDB or PostgreSQL region that has
        them (or only ``region``). Everything is checked before any region starts:
        ValueError for a bad name, a server without snapshots, or a copy that would
        empty a table other regions also deliver (``truncate``, or a keyless table);
        LookupError if no region has a table; SourceError if a source does not
        answer (nothing started then either)."""
        names = list(dict.fromkeys(split_table_name(t) for t in tables))
        return self.request_tables(names, region, truncate, reason)

    def request_tables(self, names: list[tuple[str, str]], region: str | None = None, truncate: bool = False,
                       reason: str = "on demand") -> dict[str, Any]:
        """``request_snapshot`` of (db, table) names; ``reason`` shows on /status."""
        every = [r for r in self.regions if isinstance(r, SnapshotHostMixin)]
        regions = every
        # regions that copy no table here (served by agents) but know theirs count as holders
        pool: list[Any] = every + [r for r in self.regions if r not in every and hasattr(r, "tables_info")]
        if region is not None:
            regions = [r for r in regions if r.name == region]
            if not regions:
                raise LookupError(f"no MySQL/MariaDB or PostgreSQL region named {region!r}")
        if not regions:
            raise LookupError("snapshots are for MySQL/MariaDB and PostgreSQL regions (not BaikalDB); none is "
                              "configured")
        # 1. what the regions asked deliver; the others only when a copy empties a
        # table downstream (another region's rows are at stake then): an unrelated
        # region that does not answer must not fail the request
        info = {r.name: r.tables_info(names) for r in regions}
        have = {r.name: [t for t in names if t in info[r.name]] for r in regions}
        found = {t for ts in have.values() for t in ts}
        missing = [f"{db}.{t}" for db, t in names if (db, t) not in found]
        if not found:
            raise LookupError(f"no region has (or the filter selects) {', '.join(missing)}")
        if truncate or any(info[r.name][t] for r in regions for t in have[r.name]):
            for r in pool:
                if r.name not in info:
                    info[r.name] = r.tables_info(names)
        # 2. a copy that empties a table downstream must be the table's only source
        for r in regions:
            for t in have[r.name]:
                if not (truncate or info[r.name][t]):
                    continue
                holders = [x.name for x in pool if t in info[x.name]]
                # the holders copy it in one coordinated step (capturer/regions/snaphost.py), if they all can
                outside = [h for h in holders if self.peer(h) is None]
                if len(holders) > 1 and outside:
                    why = ("the request truncates it" if truncate else
                           "it has no key, so its copy starts with a TRUNCATE") + \
                        f", and region(s) {', '.join(outside)} (served by an agent) cannot take part in the " \
                        "coordinated copy that needs"
                    raise ValueError("snapshot refused: " + truncate_conflict(t[0], t[1], holders, why))
        # 3. every server can give a consistent-snapshot position
        for r in regions:
            if have[r.name]:
                r.check_snapshot_support()
        # 4. then start: no I/O, and never waiting on a region's emission lock
        out: dict[str, Any] = {}
        for r in regions:
            if have[r.name]:
                out[r.name] = {"run": r.start_snapshot_request(have[r.name], truncate, reason),
                               "tables": [f"{db}.{t}" for db, t in have[r.name]]}
        log.info("snapshot requested (%s): %s%s", reason, out, f"; not found: {missing}" if missing else "")
        got: dict[str, Any] = {"regions": out, "missing": missing, "truncate": truncate}
        if self.journal is not None:
            try:
                self.journal.add(got, reason)
            except OSError as exc:
                log.error("%s: the copies asked for are not recorded (%s): they run, but a crash before the next "
                          "checkpoint forgets them", self.journal.path, exc)
                got["warning"] = f"not recorded in {self.journal.path} ({exc}): a crash before the next checkpoint " \
                                 "forgets this copy"
        return got

    # --- copies kept across a crash (capturer/regions/copies.py) ------------------------
    def keep_copies(self, journal: CopyJournal, restored: dict[str, Any]) -> None:
        """Record every copy asked for from now on in ``journal``; the lines it holds that
        the ``restored`` positions do not carry are asked for again (``ask_again``)."""
        self.journal = journal
        self._again = journal.to_ask_again(restored)
        # a table a filter reload added is held back again until its copy starts (the stream is read again from
        # before the reload: a sink must not get a change to a table before its CREATE)
        reload_added: dict[str, list[tuple[str, str]]] = {}
        for e in self._again:
            if e["reason"].startswith(("filter reload", "renamed into the filter")):
                reload_added.setdefault(e["region"], []).append(split_table_name(e["table"]))
        self.hold(reload_added)
        if self._again:
            log.warning("%s: %d copy(ies) asked for before the last stop that no checkpoint carried: asked for "
                        "again once their regions stream: %s", journal.path, len(self._again),
                        ", ".join(f"{e['region']}:{e['table']}" for e in self._again))

    def _unhold_in(self, region: str, names: set[tuple[str, str]]) -> None:
        self.unhold(lambda n, t: n != region or t not in names)

    def renamed_in(self, txn: Txn, selected: Callable[[str, str], bool], mode: str) -> None:
        """(the merge thread, before ``strip_held``) A ``RENAME TABLE`` of a table the filter
        leaves out to a name it selects brings rows the stream never carried: the new name
        is held back in the region and copied (``snapshotNewTables``; never: nothing), asked
        for by the run loop (``ask_again``) and recorded first (a crash in between asks
        again). PostgreSQL renames arrive as relation changes, not as this statement."""
        d = txn.ddl
        if d is None or mode == "never" or self.peer(txn.region) is None:
            return
        added = [new for old, new in renamed_tables(d.sql, d.db) if not selected(*old) and selected(*new)]
        if not added:
            return
        self.hold({txn.region: added})
        lines: list[dict[str, Any]] = [{"region": txn.region, "table": f"{db}.{t}", "run": "", "truncate": mode == "truncate",
                  "reason": "renamed into the filter"} for db, t in added]
        log.info("region %s: %s renamed into the filter: copied (snapshotNewTables=%s)", txn.region,
                 ", ".join(e["table"] for e in lines), mode)
        if self.journal is not None:
            try:
                self.journal.add_due(lines)
            except OSError as exc:
                log.error("%s: the copies of tables renamed into the filter are not recorded (%s): a crash before "
                          "they start forgets them", self.journal.path, exc)
        self._fresh |= {(e["region"], e["table"]) for e in lines}
        self._again = self._again + lines

    def copies_status(self) -> dict[str, Any]:
        j = self.journal
        if j is None:
            return {}
        return {"not_yet_in_a_checkpoint": [f"{e['region']}:{e['table']}" for e in j.entries],
                "asked_again_after_a_restart": j.asked_again,
                "to_ask_again": [f"{e['region']}:{e['table']}" for e in self._again]}

    def settle_copies(self, positions: dict[str, Any], region_ts: dict[str, int]) -> None:
        """A checkpoint with these positions is on disk: the copies it carries leave the journal."""
        if self.journal is None:
            return

        def open_run(region: str, run: str) -> bool | None:
            r = self.peer(region)
            return None if r is None else bool(r.snapshot_run_open(run))

        def clock(region: str) -> int:
            r = self.peer(region)
            return int(r.clock.last_emitted) if r is not None else 1 << 62

        self.journal.settle(positions, region_ts, open_run, clock)

    def ask_again(self, now: float) -> None:
        """(the capturer's run loop) The copies a start found in the journal, asked for
        again once each of their regions streams; a source that does not answer: tried
        again 5 s later; a table no region has or the filter no longer selects: dropped,
        with a warning."""
        if not self._again or now < self._again_at or self.journal is None:
            return
        groups: dict[tuple[str, bool, str], list[dict[str, Any]]] = {}
        for e in self._again:
            groups.setdefault((e["region"], e["truncate"], e["reason"]), []).append(e)
        for (region, truncate, reason), lines in groups.items():
            r = self.peer(region)
            names = {split_table_name(e["table"]) for e in lines}
            if r is None:
                log.warning("%s: region %s does not copy tables here (any more): copies %s dropped",
                            self.journal.path, region, [e["table"] for e in lines])
                self._unhold_in(region, names)
            elif getattr(r, "position", None) is None:
                continue  # not streaming yet
            else:
                try:
                    again = not all((e["region"], e["table"]) in self._fresh for e in lines)
                    self.request_tables([split_table_name(e["table"]) for e in lines], region, truncate,
                                        f"{reason}, asked again after a restart"
                                        if again and "asked again" not in reason else reason)
                    self.journal.asked_again += len(lines) if again else 0
                except SourceError as exc:
                    log.warning("copies asked for again in %s: %s; trying again in 5 s", region, exc)
                    self._again_at = now + 5.0
                    continue
                except (ValueError, LookupError) as exc:
                    log.warning("copies %s of region %s asked for before the last stop are not made again: %s",
                                [e["table"] for e in lines], region, exc)
                    self._unhold_in(region, names)
            self.journal.drop(lines)
            self._again = [e for e in self._again if e not in lines]
