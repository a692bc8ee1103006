"""What every region kind shares: its context, lifecycle and status."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ..bqueue import WeightedQueue
from ..model import Item, Position
from ..tso import LiftJournal


@dataclass
class RegionContext:
    out: WeightedQueue[Item]
    start: Position | None  # from the checkpoint; None on a first start
    floor: int  # every emitted commit_ts is above this (the checkpoint's commit_ts)
    journal: LiftJournal
    stop: threading.Event
    spill_rows: int = 50_000  # a bigger transaction goes to disk (capturer/spill.py); 0 = never
    spill_dir: str = ""


class Region:
    """Lifecycle: ``start()``, ``stop()``, ``join()``. A fatal problem is kept in
    ``error`` and the thread ends; the app then stops the whole pipeline."""

    name: str

    def __init__(self, name: str, ctx: RegionContext):
        self.name = name
        self.ctx = ctx
        self.error: BaseException | None = None
        self.state = "new"
        self.last_error = ""
        self.reconnects = 0
        self.txns = 0
        self.rows = 0
        self.spilled_txns = 0  # transactions kept on disk (past spill_rows)
        self.position: Position | None = ctx.start
        self.last_commit_ts = ctx.floor
        self.last_source_time = 0.0  # source clock (s) of the newest event seen
        self.caught_up_at = 0.0  # local time when the source last said "nothing more"
        self._thread = threading.Thread(target=self._run, name=f"region-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.ctx.stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError

    def lag_seconds(self) -> float:
        now = time.time()
        if self.caught_up_at and now - self.caught_up_at < 5:
            return 0.0
        if not self.last_source_time:
            return 0.0
        return max(0.0, now - self.last_source_time)

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "position": self.position.to_json() if self.position else None,
            "last_commit_ts": self.last_commit_ts,
            "lag_seconds": round(self.lag_seconds(), 3),
            "txns": self.txns,
            "rows": self.rows,
            "queue_items": len(self.ctx.out),
            "queue_rows": self.ctx.out.weight,
            "reconnects": self.reconnects,
            "spilled_txns": self.spilled_txns,
            "decoded_fast": getattr(self, "fast_events", 0),
            "decoded_library": getattr(self, "library_events", 0),
            "last_error": self.last_error,
        }
