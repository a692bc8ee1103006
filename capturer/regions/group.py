"""Work across the regions of one capturer (its ``Capturer`` keeps one ``RegionGroup``):
which other regions deliver a table (``tables_elsewhere``, asked by a region before a
copy that empties a table downstream), the region that takes part in a coordinated
copy of a table several regions deliver (``peer``, capturer/regions/snaphost.py), and
an on-demand snapshot checked across every region before any starts
(``request_snapshot``, POST /snapshot).

A region takes part by what it can do, not by its kind: ``tables_info(tables)`` (it
knows which of them its source has), and the snapshot host (``SnapshotHostMixin``:
it copies tables in this process)."""

from __future__ import annotations

import logging
from typing import Any

from capturer.pipeline.filter import split_table_name
from capturer.regions.snaphost import SnapshotHostMixin
from capturer.regions.snapshot import truncate_conflict

log = logging.getLogger(__name__)


class RegionGroup:
    def __init__(self) -> None:
        self.regions: list[Any] = []  # set once the regions are built (they are handed this group's methods)

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

    def request_snapshot(self, tables: list[str], region: str | None = None, truncate: bool = False) -> dict[str, Any]:
        """Copy tables again while streaming, in every MySQL/MariaDB or PostgreSQL region that has
        them (or only ``region``). Everything is checked before any region starts:
        ValueError for a bad name, a server without snapshots, or a copy that would
        empty a table other regions also deliver (``truncate``, or a keyless table);
        LookupError if no region has a table; SourceError if a source does not
        answer (nothing started then either)."""
        names = list(dict.fromkeys(split_table_name(t) for t in tables))
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
                out[r.name] = {"run": r.start_snapshot_request(have[r.name], truncate),
                               "tables": [f"{db}.{t}" for db, t in have[r.name]]}
        log.info("on-demand snapshot requested: %s%s", out, f"; not found: {missing}" if missing else "")
        return {"regions": out, "missing": missing, "truncate": truncate}
