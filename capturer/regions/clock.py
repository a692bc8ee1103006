"""Per-region commit_ts assignment (TSO shape), deterministic across replays.

A MariaDB binlog gives whole-second timestamps that may even step backwards
(an event carries the time its statement *started*). A region therefore assigns

    commit_ts = max(source_seconds * 1000 << 18, previous_commit_ts + 1)

which is strictly increasing and, replayed from the same position with the
same floor, gives the same values: a replayed change keeps its
``(region, commit_ts, seq)`` identity.

Heartbeats promise that nothing at or below their ts will follow. A
transaction that arrives after such a promise with an older source time is
*lifted* above it. Lifts depend on timing, so each one is written (with fsync)
to a small journal before the transaction leaves the region; a replay reads
the journal and gives the lifted transaction the same commit_ts again.
"""

from __future__ import annotations

import logging
from typing import Any

from capturer.model import LsnPosition, Position, make_ts
from capturer.regions.journal import PositionJournal

log = logging.getLogger(__name__)


_FLOOR = "\x00floor"  # a floor's key: (region + _FLOOR, file, pos) (a region name holds no NUL)


class LiftJournal(PositionJournal[tuple[str, str, int], int]):
    """``{region, file, pos, commit_ts}`` lines: the commit_ts of each lifted
    transaction, by region and the position it ends at (``Position.lift_key``);
    and ``{region, file, pos, floor}`` lines: the highest commit_ts the region gave
    an item it inserted at that point of its stream where timing decided (a
    snapshot chunk: ``RegionClock.extra``), so that a replay reaching that point
    raises its clock as the first run did (``RegionClock.at``)."""

    what = "lift journal"

    def parse(self, d: Any) -> tuple[tuple[str, str, int], int]:
        if "floor" in d:
            return (d["region"] + _FLOOR, d["file"], int(d["pos"])), int(d["floor"])
        return (d["region"], d["file"], int(d["pos"])), int(d["commit_ts"])

    def dump(self, key: tuple[str, str, int], value: int) -> dict[str, Any]:
        region, file, pos = key
        if region.endswith(_FLOOR):
            return {"region": region[:-len(_FLOOR)], "file": file, "pos": pos, "floor": value}
        return {"region": region, "file": file, "pos": pos, "commit_ts": value}

    def entries(self, region: str) -> list[tuple[str, int, int]]:
        """``(file, pos, commit_ts)`` of every lift kept for ``region``."""
        return [(f, p, ts) for (r, f, p), ts in self.items() if r == region]

    def floors(self, region: str) -> list[tuple[tuple[str, int], int]]:
        """``((file, pos), commit_ts)`` of every floor kept for ``region``, in position order."""
        return sorted(((f, p), ts) for (r, f, p), ts in self.items() if r == region + _FLOOR)

    def record_floor(self, region: str, pos: Position | LsnPosition, commit_ts: int) -> None:
        """Journal that an item with ``commit_ts`` was inserted at ``pos`` (fsync'd: it may then leave)."""
        key = (region + _FLOOR, *pos.lift_key())
        if commit_ts > (self.lookup(key) or 0):
            self.put(key, commit_ts)

    def get(self, region: str, pos: Position | LsnPosition) -> int:
        """The commit_ts journaled for the transaction of ``region`` ending at ``pos``; 0 if none."""
        return self.lookup((region, *pos.lift_key())) or 0

    def record(self, region: str, pos: Position | LsnPosition, commit_ts: int) -> None:
        """Journal a lift (fsync'd before it returns: the lifted transaction may then leave)."""
        self.put((region, *pos.lift_key()), commit_ts)

    def prune(self, positions: dict[str, Any]) -> None:
        """Forget lifts at or before each (MySQL, PostgreSQL) region's checkpointed
        position, and floors before it (a replay from that very position still passes
        a floor at it)."""
        mine = {r: p.lift_key() for r, p in positions.items() if isinstance(p, (Position, LsnPosition))}

        def stale(k: tuple[str, str, int]) -> bool:
            if k[0].endswith(_FLOOR):
                r = k[0][:-len(_FLOOR)]
                return r in mine and (k[1], k[2]) < mine[r]
            return k[0] in mine and (k[1], k[2]) <= mine[k[0]]

        self.forget(lambda entries: [k for k in entries if stale(k)])


class RegionClock:
    """Assigns strictly increasing commit_ts for one region."""

    def __init__(self, region: str, floor: int, journal: LiftJournal, promised: int = 0):
        """``floor``: every commit_ts is above it (the checkpoint's); ``promised``: a
        heartbeat already passed on at this ts (a region an agent serves again), so
        every later item is above it too."""
        self.region = region
        self.last_txn = floor
        self.last_emitted = max(floor, promised)
        self.journal = journal
        self.lifts = 0
        # the floors a run before this one journaled (``at``), in position order, and the next one to pass
        self._floors = journal.floors(region)
        self._next_floor = 0

    def commit(self, source_seconds: int, position: Position | LsnPosition, derived: int = 0) -> int:
        """The commit_ts of the transaction that ends at ``position``: its source time
        (``derived``, a TSO, when the source gives better than seconds) made strictly
        increasing, and above every heartbeat already sent (a lift, journaled)."""
        derived = derived or make_ts(source_seconds * 1000)
        natural = max(derived, self.last_txn + 1)
        ts = max(natural, self.last_emitted + 1, self.journal.get(self.region, position))
        if ts > natural:
            self.lifts += 1
            self.journal.record(self.region, position, ts)
        self.last_txn = self.last_emitted = ts
        return ts

    def at(self, end: Position | LsnPosition) -> None:
        """A transaction that ends at ``end`` is about to be stamped: every item a run
        before this one inserted before that point (a snapshot chunk at "now", journaled
        by ``extra``) raised the clock then; a replay raises it again, so that what
        follows, also what a crash kept from being read the first time, stays above
        that item's commit_ts (a sender may hold it, and skips what is at or below)."""
        floors, i = self._floors, self._next_floor
        if i >= len(floors):
            return
        key = end.lift_key()
        while i < len(floors) and floors[i][0] < key:
            if floors[i][1] > self.last_emitted:
                self.last_emitted = floors[i][1]
            i += 1
        self._next_floor = i

    def extra(self, source_now_ms: int, position: Position | LsnPosition | None = None) -> int:
        """A commit_ts for an item the capturer inserts into the stream where timing
        decides (a snapshot chunk, a table copy's CREATE/TRUNCATE): above everything
        this region ever sent, at the source's clock (minus the heartbeat lag). After
        a restart the item is made again somewhere else in the stream; at "now" it
        can never take the identity of an item sent before the crash. A later
        transaction that falls at or below it is lifted (journaled), so its commit_ts
        stays the same on replay. (A region whose stream lags thus moves its next
        transactions up to the source's clock while it copies: across regions they
        are ordered by that time, not by their binlog time.)

        ``position``: where the stream is (the item goes out there); journaled as a
        floor (``at``): a transaction read after a crash at that point, which the first
        run never got to, must not take a commit_ts below this item's."""
        self.last_emitted = max(self.last_emitted + 1, make_ts(source_now_ms))
        if position is not None:
            self.journal.record_floor(self.region, position, self.last_emitted)
        return self.last_emitted

    def next(self) -> int:
        """A commit_ts right after the last emitted one, for items at a fixed point
        of the stream (the CREATE statements sent at a snapshot's start, before
        anything else): made again at the same point, they get the same values."""
        self.last_emitted += 1
        return self.last_emitted

    def lift_to(self, ts: int, position: Any = None) -> None:
        """Everything this region sends from now on is above ``ts`` (another region sent
        an item there for a table both deliver: a coordinated copy). Journaled as a
        floor at ``position``, as ``extra`` does, so a replay stays above it too."""
        if ts > self.last_emitted:
            self.last_emitted = ts
        if position is not None:
            self.journal.record_floor(self.region, position, self.last_emitted)

    def heartbeat(self, source_now_ms: int) -> int:
        """The ts a heartbeat may promise now (never below what was already emitted)."""
        ts = max(make_ts(source_now_ms), self.last_emitted)
        self.last_emitted = ts
        return ts
