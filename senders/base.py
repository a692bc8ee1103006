"""The sender contract and the machinery every sender shares.

A sender gets every item of the merged stream, in order, through its own
bounded queue, and runs in its own thread. Subclasses implement
``open()``, ``send(batch)`` and ``close()``:

* ``send(batch)`` receives transactions in stream order (heartbeats are
  filtered out). When it returns, every row of the batch must be durable at
  the destination: the base class then acknowledges the batch, i.e. moves
  ``acked_seq`` to the dispatch number of its last item (the SenderManager
  numbers the merged stream) and ``acked_ts`` to its commit_ts.
* It raises ``SinkError(retriable=True)`` for a failure worth retrying (the
  base retries the same batch with capped exponential backoff, shows the error
  and the retry count in the status, and does not acknowledge meanwhile) or
  ``SinkError(retriable=False)`` for a fatal one (the capturer stops after a
  final checkpoint of what was truly acknowledged).

Positions: the SenderManager replaces ``queue`` with a cursor into the merged
stream (capturer/pipeline/backlog.py) that hands out ``(offset, item)`` pairs;
the sender acknowledges offsets, and each sender's position (the key of the last
transaction it acknowledged) goes into the checkpoint. After ``open()`` the loop
asks ``resume_key()``: a sender that can read its own position back from its
destination (a file's last whole transaction, a position row in a MySQL target,
a lake's high-water mark) says so, and the cursor hands it nothing at or below
it: what reached the destination after the last checkpoint is not sent again.
``resume_state`` is what the checkpoint kept of the sender's own
``position_state`` (set by ``send``, kept with each acknowledgement).

An operator can ``pause()`` a sender (control endpoint ``POST
/senders/<name>/pause``): it finishes the batch in hand and takes nothing more
until ``resume()``; a retry loop waits as well, and a sender started paused
opens its target only once resumed. Nothing is acknowledged while paused; the
others go on (what it has not read waits for it in the backlog).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, ClassVar, Protocol

from capturer.errors import SinkError
from capturer.model import Item, StreamKey, Txn, stream_key
from capturer.util import fencing
from capturer.util.bqueue import Closed, WeightedQueue
from capturer.util.ini import Key

log = logging.getLogger(__name__)


class Inbox(Protocol):
    """Where a sender takes its work from: ``(dispatch number, item)`` pairs in stream
    order, bounded by rows. Handed to the sender once, before it starts (``attach``):
    the capturer's SenderManager hands it a cursor into the stream
    (capturer/pipeline/backlog.py ``Cursor``), an applier a queue of its own; a sender
    built alone keeps the ``WeightedQueue`` it starts with. Optional:
    ``skip_through(key)`` (the destination holds the stream up to ``key``)."""

    capacity: int

    @property
    def weight(self) -> int: ...

    def __len__(self) -> int: ...

    def get_many(self, max_weight: int, timeout: float | None = None) -> list[tuple[int, Item]]: ...

    def close(self) -> None: ...


class Sender:
    KEYS: ClassVar[list[Key]] = []
    #: the most rows handed to one ``send`` call
    batch_rows: int = 5000
    #: the first batch after the start takes at most this many rows, each next one 4x more up to
    #: ``batch_rows`` (0: every batch ``batch_rows``): a sender whose first batch waits for something
    #: (the Kafka sender's read-back) gets it acknowledged early, so that a capturer killed a few seconds
    #: after its start has made progress (a snapshot's chunks acknowledged are not copied again)
    start_rows: int = 0
    #: wait up to this long for a batch to fill (senders with a high per-call cost)
    linger: float = 0.0
    max_backoff: float = 10.0
    #: ``send`` may hand a batch over and leave waiting for its delivery to ``settle``: the loop then
    #: sets ``settle_later`` and acknowledges a batch only after the ``settle`` that follows the next
    #: batch's ``send`` (at once when no batch is waiting), so a batch's delivery overlaps the next
    #: one's read and encoding. Any other caller of ``send`` (``settle_later`` False) gets it delivered.
    defer_settle: bool = False

    def __init__(self, name: str, options: dict[str, Any], queue_rows: int = 100_000):
        self.name = name
        self.options = options
        # (dispatch number, item) pairs in stream order, from the SenderManager
        self.queue: Inbox = WeightedQueue(queue_rows)
        self._attached = False
        self.acked_ts = 0
        self.acked_seq = 0
        self.rows = 0
        self.txns = 0
        self.errors = 0
        self.retries = 0
        self.last_error = ""
        self.state = "new"
        self.error: BaseException | None = None
        self.paused_since: float | None = None  # wall-clock time of pause(), None when running
        # the checkpoint's copy of this sender's own state (None on a first start); set before start()
        self.resume_state: dict[str, Any] | None = None
        # the sender's own state after the batch in hand (send() sets it); kept with each acknowledgement
        self.position_state: dict[str, Any] | None = None
        self._acked_state: dict[str, Any] | None = None
        self.settle_later = False  # (defer_settle) set by the loop while it settles batches itself
        self.resumed_at: Any = None  # the key resume_key() gave (shown in the status)
        self._stop = threading.Event()
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._thread = threading.Thread(target=self._run, name=f"sender-{name}", daemon=True)

    # --- to implement -------------------------------------------------------
    def open(self) -> None:
        """Connect / open files. May raise SinkError(retriable=True) to be retried."""

    def send(self, batch: list[Txn]) -> None:
        raise NotImplementedError

    def resume_key(self) -> StreamKey | None:
        """After ``open()``: the key ``(commit_ts, region, sub)`` of the last transaction
        the destination holds whole, read from the destination itself, or None if it
        cannot tell (then the checkpoint's key is all there is). Every transaction at
        or below it is acknowledged without being sent again."""
        return None

    def ack_state(self) -> dict[str, Any] | None:
        """``position_state`` as of the last acknowledged batch (for the checkpoint), with what
        ``pending_state`` says now."""
        st = self._acked_state
        pending = self.pending_state()
        if not pending:
            return st
        out = dict(st or {})
        for k, v in pending.items():
            if v:
                out[k] = v
            else:
                out.pop(k, None)
        return out if out or st is not None else None

    def pending_state(self) -> dict[str, Any] | None:
        """State the checkpoint keeps whether or not a batch was acknowledged since it changed (the Kafka
        sender's gaps: messages a failed batch could not deliver while later ones got through); a key
        with an empty value is dropped from the acknowledged state. None: nothing of the kind. Read
        from the checkpoint's thread."""
        return None

    def settle(self) -> None:
        """(``defer_settle``) Wait until everything ``send`` handed over is at the destination;
        SinkError if not (every batch not acknowledged yet is then sent again)."""

    def housekeeping(self) -> None:
        """Work of the sender's own between batches (the loop runs it before every
        batch, and every 0.2 s while none comes), e.g. a compaction coming due."""

    def close(self) -> None:
        """Release resources. Called once, from the sender's thread."""

    # --- machinery ----------------------------------------------------------
    def attach(self, inbox: Inbox) -> None:
        """Hand the sender the inbox it takes its work from: once, before ``start``."""
        if self._attached or self._thread.is_alive():
            raise RuntimeError(f"sender {self.name}: its inbox is handed once, before it starts")
        self.queue = inbox
        self._attached = True

    def start(self, acked_ts: int) -> None:
        self.acked_ts = acked_ts
        self._acked_state = self.resume_state  # kept until a batch of this run is acknowledged
        self._thread.start()

    def stop(self) -> None:
        """Stop after the batch in hand; what is still queued is not sent (it
        will be read again from the checkpoint)."""
        self._stop.set()
        self.queue.close()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def pause(self) -> bool:
        """Take nothing more from the queue after the batch in hand. False if it
        was paused already."""
        if self.paused:
            return False
        self.paused_since = time.time()
        self._running.clear()
        log.info("sender %s: paused", self.name)
        return True

    def resume(self) -> bool:
        """Go on where it paused. False if it was not paused."""
        if not self.paused:
            return False
        self.paused_since = None
        self._running.set()
        log.info("sender %s: resumed", self.name)
        return True

    def _wait_while_paused(self) -> bool:
        """Block while paused (state "paused"); False if stopped meanwhile."""
        if self._running.is_set():
            return not self._stop.is_set()
        before = self.state
        self.state = "paused"
        while not self._running.wait(0.2):
            if self._stop.is_set():
                return False
        if self.state == "paused":
            self.state = before if before in ("retrying", "new") else "running"
        return not self._stop.is_set()

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "paused": self.paused,
            "paused_since": self.paused_since,
            "rows": self.rows,
            "txns": self.txns,
            "acked_ts": self.acked_ts,
            "queue_items": len(self.queue),
            "queue_rows": self.queue.weight,
            "queue_capacity_rows": self.queue.capacity,
            "errors": self.errors,
            "retries": self.retries,
            "last_error": self.last_error,
        }

    def _with_retries(self, what: str, fn: Any, *args: Any) -> bool:
        """Run fn until it succeeds. False if stopped meanwhile."""
        delay = 0.2
        while True:
            try:
                fn(*args)
                if self.state == "retrying":
                    log.info("sender %s: %s succeeded after retrying", self.name, what)
                self.state = "running"
                return True
            except SinkError as exc:
                self.errors += 1
                self.last_error = f"{what}: {exc}"
                if not exc.retriable:
                    raise
                self.retries += 1
                self.state = "retrying"
                wait = delay if exc.poll is None else exc.poll
                if exc.poll is None or self.retries == 1 or self.retries % 50 == 0:
                    log.warning("sender %s: %s failed (%s); retrying in %.1fs", self.name, what, exc, wait)
                if self._stop.wait(wait) or not self._wait_while_paused():
                    return False
                if exc.poll is None:
                    delay = min(delay * 2, self.max_backoff)

    def _send_once_more(self, batch: list[Txn], first: list[bool]) -> None:
        """One attempt at a batch. A retry sends only what the destination does not
        hold yet (by ``resume_key()``): a batch that failed half way is not written twice."""
        if not first[0]:
            key = self.resume_key()
            if key is not None:
                kept = [t for t in batch if stream_key(t) > key]
                if len(kept) < len(batch):
                    log.info("sender %s: retrying the batch from %s on (the destination has the %d transaction(s) "
                             "before)", self.name, key, len(batch) - len(kept))
                batch[:] = kept
                if not batch:
                    return
        first[0] = False
        fencing.check(f"sender {self.name}")  # high availability: only the lease's holder writes
        self.send(batch)

    def _open_and_resume(self) -> None:
        fencing.check(f"sender {self.name}")
        self.open()
        key = self.resume_key()
        if key is not None:
            self.resumed_at = key
            skip = getattr(self.queue, "skip_through", None)
            if skip is not None:
                skip(key)

    def _ack(self, batch: list[Txn], pairs: list[tuple[int, Item]]) -> None:
        """The batch taken as ``pairs`` (its transactions ``batch``) is at the destination."""
        if batch:
            self.txns += len(batch)
            self.rows += sum(len(t.changes) for t in batch)
        self._acked_state = self.position_state
        self.acked_ts = max(self.acked_ts, pairs[-1][1].commit_ts)
        self.acked_seq = pairs[-1][0]

    def _deliver(self, unsettled: list[tuple[list[Txn], list[tuple[int, Item]]]],
                 new: tuple[list[Txn], list[tuple[int, Item]]] | None) -> bool:
        """(``defer_settle``) Send the ``new`` batch, if any; then, when two batches are unsettled or
        there is no new one, settle them all and acknowledge them. A failure sends every unsettled
        batch again (how much of them arrived is not known) and settles them, retried as one
        (``resume_key`` and the sender's own checks skip what the destination holds). False if
        stopped meanwhile."""
        if new is not None:
            unsettled.append(new)
        state = {"first": True, "settled": False}

        def attempt() -> None:
            if state["first"]:
                state["first"] = False
                if new is not None and new[0]:
                    fencing.check(f"sender {self.name}")  # high availability: only the lease's holder writes
                    self.send(new[0])
                if new is not None and len(unsettled) < 2:
                    return  # settled with the next batch, or when none is waiting
            else:
                again = [t for b, _ in unsettled for t in b]
                if again:
                    self._send_once_more(again, [False])
            self.settle()
            state["settled"] = True

        if not self._with_retries("send", attempt):
            return False
        if state["settled"]:
            for b, pairs in unsettled:
                self._ack(b, pairs)
            unsettled.clear()
        return True

    def _settle_at_stop(self, unsettled: list[tuple[list[Txn], list[tuple[int, Item]]]]) -> None:
        """Stopping: one try to settle what was sent (what is not acknowledged is sent again after a restart)."""
        if not unsettled:
            return
        try:
            self.settle()
            for b, pairs in unsettled:
                self._ack(b, pairs)
        except Exception as exc:
            log.warning("sender %s: stopping with %d batch(es) not known to be delivered (%s): they are sent "
                        "again after the restart", self.name, len(unsettled), exc)

    def _run(self) -> None:
        try:
            # a sender that starts paused (an operator paused it before a restart) opens nothing yet:
            # its target may be down for maintenance
            if not self._wait_while_paused() or not self._with_retries("open", self._open_and_resume):
                return
            deferred = self.settle_later = bool(self.defer_settle)
            unsettled: list[tuple[list[Txn], list[tuple[int, Item]]]] = []  # sent, not acknowledged (deferred)
            limit = min(self.start_rows, self.batch_rows) if self.start_rows > 0 else self.batch_rows
            while not self._stop.is_set():
                if unsettled and self.paused and not self._deliver(unsettled, None):
                    break  # (pausing: what was sent is settled and acknowledged first)
                if not self._wait_while_paused() or not self._with_retries("housekeeping", self.housekeeping):
                    break
                try:
                    # with a batch unsettled, only what is there now: none waiting, it is settled at once
                    pairs = self.queue.get_many(limit, timeout=0.0 if unsettled else 0.2)
                except Closed:
                    break
                if not pairs:
                    if unsettled and not self._deliver(unsettled, None):
                        break
                    continue
                if limit < self.batch_rows:
                    limit = min(limit * 4, self.batch_rows)
                if self.linger > 0:
                    deadline = time.monotonic() + self.linger
                    rows = sum(len(it.changes) for _, it in pairs if isinstance(it, Txn))
                    while rows < limit and time.monotonic() < deadline and not self._stop.is_set() \
                            and self._running.is_set():
                        try:
                            more = self.queue.get_many(limit - rows, timeout=0.05)
                        except Closed:
                            break
                        pairs.extend(more)
                        rows += sum(len(it.changes) for _, it in more if isinstance(it, Txn))
                # paused while this batch was taken: hold it, write nothing until resumed
                if not self._wait_while_paused():
                    break
                batch = [it for _, it in pairs if isinstance(it, Txn)]
                if deferred:
                    if not self._deliver(unsettled, (batch, pairs)):
                        break
                    continue
                if batch and not self._with_retries("send", self._send_once_more, batch, [True]):
                    break
                self._ack(batch, pairs)
            self._settle_at_stop(unsettled)
        except BaseException as exc:
            self.error = exc
            self.state = "failed"
            self.last_error = str(exc)
            log.exception("sender %s failed", self.name)
        finally:
            try:
                self.close()
            except Exception:
                log.exception("sender %s: close failed", self.name)
            if self.state != "failed":
                self.state = "stopped"
