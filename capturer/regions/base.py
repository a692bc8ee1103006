"""What every region kind shares: its context, lifecycle and status."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model import AnyPosition, Item, Txn
from capturer.regions.clock import LiftJournal
from capturer.util.bqueue import Closed, WeightedQueue

log = logging.getLogger(__name__)


@dataclass
class RegionContext:
    out: WeightedQueue[Item]
    start: AnyPosition | None  # from the checkpoint; None on a first start
    floor: int  # every emitted commit_ts is above this (the checkpoint's commit_ts)
    journal: LiftJournal
    stop: threading.Event
    spill_rows: int = 50_000  # a bigger transaction goes to disk (capturer/model/spill.py); 0 = never
    spill_dir: str = ""
    state_path: Path | None = None  # the checkpoint file: a region keeps its own state files next to it
    table_selected: Callable[[str, str], bool] = lambda db, table: True  # the filter's table rules
    # makes a region's first start durable before it emits anything: the app writes the
    # checkpoint with this position for the region if the checkpoint has none for it yet
    pin_start: Callable[[str, Any], None] = lambda region, position: None
    # (region, tables) -> {table: [other regions that deliver a table of that name]}
    tables_elsewhere: Callable[[str, list[tuple[str, str]]], dict[tuple[str, str], list[str]]] = \
        lambda region, tables: {}
    # served by an agent to a capturer that already passed on a heartbeat at this ts: the region's
    # clock stays above it (its own floor is the commit_ts of the item at ``start``)
    promised: int = 0
    filter_path: Path | None = None  # filterRuleDict (sent to agents along with a subscription)
    config_path: Path | None = None  # the capturer's config.cfg (a worker process reads it: process=true)


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
        self.position: AnyPosition | None = ctx.start
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

    #: errors that mean "try again from the last position" (a kind adds its driver's)
    RETRYABLE: tuple[type[BaseException], ...] = (SourceError, OSError)
    where: str = ""

    def _connect_and_stream(self) -> None:
        """One attempt: connect, then read until stopped or an error."""
        raise NotImplementedError

    def _run(self) -> None:
        """Run attempts until stopped; retryable errors back off (0.5 s doubling to
        30 s) and retry from the last position; anything else is fatal."""
        delay = 0.5
        while not self.ctx.stop.is_set():
            try:
                self.state = "connecting"
                self._connect_and_stream()
                delay = 0.5
            except Closed:
                break
            except FatalSourceError as exc:
                self._fail(exc)
                log.error("%s", exc)
                return
            except self.RETRYABLE as exc:
                self.reconnects += 1
                self.state = "reconnecting"
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: %s; reconnecting in %.1fs", self.where or self.name, self.last_error, delay)
                if self.ctx.stop.wait(delay):
                    break
                delay = min(delay * 2, 30.0)
            except BaseException as exc:
                self._fail(exc, f"{type(exc).__name__}: {exc}")
                log.exception("%s: failed", self.where or self.name)
                return
            finally:
                self._after_attempt()
        self.state = "stopped"

    def _emit(self, item: Item) -> None:
        """Hand ``item`` to the merge (blocks while the region's queue is full; Closed when stopping)."""
        weight = item.weight if isinstance(item, Txn) else 1
        self.ctx.out.put(item, weight, stop=self.ctx.stop)

    def _after_attempt(self) -> None:
        """Release what one attempt held (connections)."""

    def _fail(self, exc: BaseException, text: str = "") -> None:
        self.error = exc
        self.state = "failed"
        self.last_error = text or str(exc)

    def checkpointed(self, position: Any) -> None:
        """The checkpoint now holds ``position`` for this region (state older than it may go)."""

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
            "position_text": str(self.position) if self.position else "",
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
