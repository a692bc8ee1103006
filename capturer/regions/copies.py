"""Copies asked for and not yet carried by a checkpoint on disk: ``<checkpoint>.copies``.

A copy started while streaming (the tables a filter reload adds, ``snapshotNewTables``;
``POST /snapshot``) lives in its region's snapshot progress, which reaches the checkpoint
only with the positions of the items the region emits after it, once the stream has
taken them (every checkpoint interval; longer while a sender is paused). A ``kill -9``
in between started the capturer again from a checkpoint without the copy: the reload's
rules were on disk (the filter file), the copy was not, and the added tables had no
history downstream (issue 49). So each copy is also written here, fsync'd, before the
request is answered, one JSON line per region and table::

    {"region": "r1", "table": "d.t", "run": "4f0c...", "truncate": false, "reason": "filter reload"}

and leaves the file once a checkpoint on disk carries it: its run is in the region's
position there (``Position.snapshot``), or the run had finished (a finished run leaves
the positions) before the item at the checkpoint's ``region_ts``. At a start, the lines
left whose run the restored positions do not carry are asked for again (same tables,
same ``truncate``), once the regions stream; a table the filter no longer selects is
dropped with a warning. A copy asked for again can repeat one that had finished just
before the crash (its rows arrive twice as snapshot rows: keyed sinks converge);
nothing is lost. High availability ships this side file with the others
(``StateDir``)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capturer.util.durable import read_journal, rewrite_lines

log = logging.getLogger(__name__)

SUFFIX = ".copies"


def _parse(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("region", "table", "run")):
        raise ValueError("expected region, table and run")
    return {"region": d["region"], "table": d["table"], "run": d["run"], "truncate": bool(d.get("truncate")),
            "reason": str(d.get("reason") or "on demand")}


class CopyJournal:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self.entries: list[dict[str, Any]] = read_journal(path, _parse, "list of copies asked for")
        self._gone: dict[str, int] = {}  # run -> the region's clock when the run was first seen finished
        self.asked_again = 0  # copies asked for again at a start (status)

    def _write(self) -> None:
        """(under the lock)"""
        if self.entries:
            rewrite_lines(self.path, (json.dumps(e, sort_keys=True) for e in self.entries))
        else:
            self.path.unlink(missing_ok=True)

    def add(self, got: dict[str, Any], reason: str) -> None:
        """A request that started (``RegionGroup.request_tables``' answer): written before
        the request is answered. OSError: the copy runs, but a crash before the next
        checkpoint forgets it (the caller says so)."""
        new = [{"region": region, "table": t, "run": v["run"], "truncate": bool(got.get("truncate")),
                "reason": reason} for region, v in got.get("regions", {}).items() for t in v["tables"]]
        if not new:
            return
        with self._lock:
            keys = {(e["region"], e["table"]) for e in new}
            # a newer run of a table replaces the older one's line
            self.entries = [e for e in self.entries if (e["region"], e["table"]) not in keys] + new
            self._write()

    def add_due(self, lines: list[dict[str, Any]]) -> None:
        """Copies decided in the stream (a table renamed into the filter) and not asked for
        yet: ``run`` is "" until ``add`` replaces the line with the request's."""
        with self._lock:
            keys = {(e["region"], e["table"]) for e in lines}
            self.entries = [e for e in self.entries if (e["region"], e["table"]) not in keys] + lines
            self._write()

    def settle(self, positions: dict[str, Any], region_ts: dict[str, int],
               open_run: Callable[[str, str], bool | None], clock: Callable[[str], int]) -> None:
        """A checkpoint is on disk with ``positions``/``region_ts`` (where a restart reads
        the sources again): the lines it carries go. ``open_run(region, run)``: whether
        the region still has the run to copy (None: no such region here); ``clock(region)``:
        the region's last emitted commit_ts."""
        with self._lock:
            if not self.entries:
                return
            keep = []
            for e in self.entries:
                region, run = e["region"], e["run"]
                if not run:  # not asked for yet (add_due)
                    keep.append(e)
                    continue
                progress = getattr(positions.get(region), "snapshot", ()) or ()
                if any(p.run == run for p in progress):
                    continue  # the checkpoint carries the run: a restart goes on with it
                if run not in self._gone and open_run(region, run) is False:
                    self._gone[run] = clock(region)  # finished (it left the positions) by this item at latest
                if run in self._gone and region_ts.get(region, -1) >= self._gone[run]:
                    continue  # finished before the checkpoint's position
                keep.append(e)
            if len(keep) != len(self.entries):
                self.entries = keep
                try:
                    self._write()
                except OSError as exc:  # (the next checkpoint tries again; a restart may copy them again)
                    log.warning("%s: cannot rewrite the copies asked for: %s", self.path, exc)

    def to_ask_again(self, positions: dict[str, Any]) -> list[dict[str, Any]]:
        """At a start: the lines whose run the restored positions do not carry."""
        with self._lock:
            return [e for e in self.entries
                    if not any(p.run == e["run"] for p in getattr(positions.get(e["region"]), "snapshot", ()) or ())]

    def drop(self, lines: list[dict[str, Any]]) -> None:
        with self._lock:
            ids = {(e["region"], e["table"], e["run"]) for e in lines}
            self.entries = [e for e in self.entries if (e["region"], e["table"], e["run"]) not in ids]
            self._write()
