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


FLOOR = _FLOOR = "\x00floor"  # a floor's key: (region + _FLOOR, file, pos) (a region name holds no NUL)


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

    def floor_at(self, region: str, key: tuple[str, int]) -> int:
        """The floor journaled for ``region`` at ``key`` (a ``lift_key``); 0 if none."""
        return self.lookup((region + _FLOOR, *key)) or 0

    def get(self, region: str, pos: Position | LsnPosition) -> int:
        """The commit_ts journaled for the transaction of ``region`` ending at ``pos``; 0 if none."""
        return self.lookup((region, *pos.lift_key())) or 0

    def record(self, region: str, pos: Position | LsnPosition, commit_ts: int,
               floors: list[tuple[tuple[str, int], int]] | None = None) -> None:
        """Journal a lift (fsync'd before it returns: the lifted transaction may then leave);
        ``floors``: ``(key, value)`` floors to set at the same time (``RegionClock``'s
        settled reservations), in the same append and fsync."""
        self.put_many([*self._floor_pairs(region, floors), ((region, *pos.lift_key()), commit_ts)])

    def set_floors(self, region: str, floors: list[tuple[tuple[str, int], int]]) -> None:
        """Journal ``(key, value)`` floors of ``region`` as given, also below what a key
        holds (``RegionClock`` settling a reservation), in one append and fsync."""
        self.put_many(self._floor_pairs(region, floors))

    @staticmethod
    def _floor_pairs(region: str, floors: list[tuple[tuple[str, int], int]] | None
                     ) -> list[tuple[tuple[str, str, int], int]]:
        return [((region + _FLOOR, f, p), v) for (f, p), v in floors or ()]

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


class _Reserved:
    """A floor journaled ahead at one point of the stream (``RegionClock.extra``)."""

    __slots__ = ("durable", "given", "before")

    def __init__(self, durable: int, given: int, before: int):
        self.durable = durable  # what the journal holds at the point (>= given)
        self.given = given  # the highest commit_ts this run really gave an item there
        self.before = before  # what the journal held there before this run reserved (a run before a crash)


class RegionClock:
    """Assigns strictly increasing commit_ts for one region.

    The floor journal (``extra``, ``at``) and its invariant. An item inserted where
    timing decides (a snapshot chunk) at stream point P with commit_ts T may be held
    by a sender once it leaves; a restart replays the stream from the checkpoint
    and must (a) give every transaction after P that the first run never delivered a
    commit_ts above T (a sender skips what is at or below what it holds: kill -9
    would otherwise lose it), and (b) give every transaction the first run did
    deliver the same commit_ts again. So, at every instant:

    * **I1** the floor durable at P is >= the commit_ts of every item this region
      gave out at P (it is journaled, fsync'd, before the item is returned to leave);
    * **I2** when a transaction after P is stamped, the floor durable at P is below
      its commit_ts (a replay, raised to that floor by ``at``, then computes the same
      value), made so before it is returned to leave.

    Writing the floor at each chunk's exact commit_ts keeps both, at one fsync per
    chunk. Instead ``extra`` *reserves*: it journals a floor ``RESERVE_MS`` of source
    time ahead of the item's commit_ts, and the chunks after it at the same point
    whose commit_ts stay within it need no write (I1 holds: the durable floor is
    above them). The first transaction stamped after a reservation whose commit_ts is
    not above it *settles* it (``_settle``): the floor is rewritten to the highest
    commit_ts really given there (never below what a run before this one journaled
    there), in the same append and fsync as the transaction's lift if it has one,
    before ``commit`` returns (I2). A crash with a reservation not settled leaves a
    floor above what was given: a replay lifts the transactions after P that the
    first run never delivered above it (journaled lifts, so later runs agree); one
    the first run delivered was above the reservation or settled it first. What the
    first run gives out is the same with or without reservations: only the journal's
    contents differ.
    """

    #: how far (ms of source time) ``extra`` journals a floor ahead of the item it stamps: one fsync per
    #: this much source time of chunks at one point instead of one per chunk; the price, only after a
    #: kill -9 while a reservation was open, is that the transactions replayed past that point go out up
    #: to this much ahead of the source's clock (and wait that long in the merge for the other regions)
    RESERVE_MS = 5000

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
        # floors journaled ahead by this run (``extra``), by ``lift_key``, not yet settled
        self._reserved: dict[tuple[str, int], _Reserved] = {}

    def commit(self, source_seconds: int, position: Position | LsnPosition, derived: int = 0) -> int:
        """The commit_ts of the transaction that ends at ``position``: its source time
        (``derived``, a TSO, when the source gives better than seconds) made strictly
        increasing, and above every heartbeat already sent (a lift, journaled)."""
        derived = derived or make_ts(source_seconds * 1000)
        natural = max(derived, self.last_txn + 1)
        ts = max(natural, self.last_emitted + 1, self.journal.get(self.region, position))
        settle = self._settle(ts) if self._reserved else None
        if ts > natural:
            self.lifts += 1
            self.journal.record(self.region, position, ts, settle)
        elif settle:
            self.journal.set_floors(self.region, settle)
        self.last_txn = self.last_emitted = ts
        return ts

    def _settle(self, ts: int) -> list[tuple[tuple[str, int], int]]:
        """(``commit``, stamping ``ts``) The floors to rewrite before a transaction at
        ``ts`` leaves (the class's I2): each reservation at or above ``ts``, down to
        what was really given at its point (and what a run before held there). Every
        reservation is done with after it: the ones below ``ts`` stay below everything
        stamped from now on."""
        out = [(key, max(r.given, r.before)) for key, r in self._reserved.items() if r.durable >= ts]
        self._reserved.clear()
        return out

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
        ts = self.last_emitted = max(self.last_emitted + 1, make_ts(source_now_ms))
        if position is not None:
            key = position.lift_key()
            r = self._reserved.get(key)
            if r is not None and ts <= r.durable:
                r.given = ts  # within the floor already durable there (I1): no write
                return ts
            before = r.before if r is not None else self.journal.floor_at(self.region, key)
            ahead = max(ts, make_ts(source_now_ms + self.RESERVE_MS), before)
            self.journal.record_floor(self.region, position, ahead)
            self._reserved[key] = _Reserved(ahead, ts, before)
        return ts

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
            r = self._reserved.get(position.lift_key())
            if r is not None:  # a reservation there: it now covers this too
                r.durable = max(r.durable, self.last_emitted)
                r.given = max(r.given, self.last_emitted)

    def heartbeat(self, source_now_ms: int) -> int:
        """The ts a heartbeat may promise now (never below what was already emitted)."""
        ts = max(make_ts(source_now_ms), self.last_emitted)
        self.last_emitted = ts
        return ts
