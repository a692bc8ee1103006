"""K-way merge of region streams into one stream ordered by (commit_ts, region).

``Merger`` is pure (no threads, no sockets) so it can be property-tested.
Each region offers items in its own strictly increasing commit_ts order
(except that DDL preludes, ``Ddl.seq < 0``, share the commit_ts of the
transaction they precede).
An item is released only when every region has an item at its head (a
transaction or a heartbeat): then the smallest head is below every region's
watermark, and nothing smaller can come later.

``MergeStage`` is the thread that feeds a ``Merger`` from the regions' bounded
queues and hands merged items to a consumer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from capturer.model import Heartbeat, Item, Txn
from capturer.util.bqueue import Closed, WeightedQueue

log = logging.getLogger(__name__)


def _key(item: Item) -> tuple[int, int, str]:
    # at equal commit_ts a transaction goes before a heartbeat (the heartbeat's
    # promise is about *later* ts), then by region name
    return (item.commit_ts, 1 if isinstance(item, Heartbeat) else 0, item.region)


class OrderError(RuntimeError):
    """A region broke its promise of strictly increasing commit_ts."""


class Merger:
    def __init__(self, regions: Iterable[str]):
        self.regions = list(regions)
        if len(set(self.regions)) != len(self.regions) or not self.regions:
            raise ValueError("regions must be a non-empty list of distinct names")
        self._heads: dict[str, Item | None] = dict.fromkeys(self.regions)
        self._last: dict[str, int] = dict.fromkeys(self.regions, -1)
        # the region's last item was a DDL prelude: the next transaction may share its commit_ts
        self._prelude: dict[str, bool] = dict.fromkeys(self.regions, False)
        self.last_emitted: tuple[int, int, str] | None = None

    def needs(self) -> list[str]:
        """Regions with no item at their head: the merge cannot go on without them."""
        return [r for r, h in self._heads.items() if h is None]

    def region_ts(self) -> dict[str, int]:
        """The newest commit_ts each region has offered (-1: nothing yet)."""
        return dict(self._last)

    def offer(self, item: Item) -> None:
        r = item.region
        if r not in self._heads:
            raise KeyError(f"unknown region {r!r}")
        if self._heads[r] is not None:
            raise RuntimeError(f"region {r!r} already has a head item")
        last = self._last[r]
        if isinstance(item, Txn):
            if item.commit_ts < last or (item.commit_ts == last and not self._prelude[r]):
                raise OrderError(f"region {r}: commit_ts {item.commit_ts} after {last}")
        elif item.commit_ts < last:
            raise OrderError(f"region {r}: heartbeat {item.commit_ts} after {last}")
        self._last[r] = item.commit_ts
        self._prelude[r] = isinstance(item, Txn) and item.ddl is not None and item.ddl.prelude
        self._heads[r] = item

    def watermark(self) -> int | None:
        """min over regions of the newest ts each offered (nothing below it can come
        any more); None until every region offered something."""
        low = min(self._last.values())
        return None if low < 0 else low

    def pop(self) -> Item | None:
        """The next item in merged order, or None if some region must be heard first."""
        if any(h is None for h in self._heads.values()):
            return None
        item = min(self._heads.values(), key=_key)  # type: ignore[arg-type]
        assert item is not None
        self._heads[item.region] = None
        self.last_emitted = _key(item)
        return item


class MergeStage:
    """Thread: region queues -> Merger -> ``emit``. Heartbeats are passed on as well
    (merged into one heartbeat per release) so an idle pipeline still advances."""

    def __init__(
        self,
        queues: dict[str, WeightedQueue[Item]],
        emit: Callable[[Item], None],
        stop: threading.Event,
    ):
        self.queues = queues
        self.merger = Merger(queues.keys())
        self.emit = emit
        self.stop = stop
        self.thread = threading.Thread(target=self._run, name="merger", daemon=True)
        self.error: BaseException | None = None
        self.merged_txns = 0
        self.started_at = time.monotonic()
        self.received_at: dict[str, float] = {}  # region -> when its last item arrived (monotonic)

    def start(self) -> None:
        self.thread.start()

    def waiting_for(self, silent_for: dict[str, float] | None = None) -> list[str]:
        """The regions holding the merge back: nothing at their head, nothing queued,
        and nothing (no transaction, no heartbeat) received for ``silent_for[region]``
        seconds (default 3); the one silent longest first. Empty when the merge is not waiting
        on a region (then a full sender queue may be what holds it). An idle but
        healthy region sends heartbeats, so it is not listed."""
        now = time.monotonic()
        idle = [r for r in self.merger.needs()
                if len(self.queues[r]) == 0
                and now - self.received_at.get(r, self.started_at) > (silent_for or {}).get(r, 3.0)]
        return sorted(idle, key=lambda r: (self.received_at.get(r, self.started_at), r))

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                progressed = False
                for r in self.merger.needs():
                    item = self.queues[r].get(timeout=0.1)
                    if item is not None:
                        self.received_at[r] = time.monotonic()
                        self.merger.offer(item)
                        progressed = True
                while True:
                    item = self.merger.pop()
                    if item is None:
                        break
                    progressed = True
                    if isinstance(item, Txn):
                        self.merged_txns += 1
                    self.emit(item)
                if not progressed:
                    continue
        except Closed:
            log.info("merger: a region queue closed; stopping")
        except BaseException as exc:
            self.error = exc
            log.exception("merger failed")
