"""Senders in processes of their own: ``process = true`` in a sender's section.

The sender's thread in the capturer keeps everything a sender has there: its
queue, batching, retries, pause, acknowledgements and status. Only ``send``
moves. The batch goes down a pipe, in the agents' wire format
(``capturer/model/wire.py``), to a child process that runs the real sender and
answers once the batch is durable at the target; the capturer acknowledges the
batch then, exactly as in-process. The child's CPU work (messages, SQL, Arrow)
then runs on another core than the capture side's decoding and merging, and
does not take the capturer's GIL.

Failures: a child that dies (kill -9, out of memory) fails the batch in hand as
a retriable error; the next attempt starts a new child, which opens the target
again and gets the same batch (every sender takes a batch sent twice, as after
any crash). A child dies at once with the capturer, even in the middle of a batch
(``PR_SET_PDEATHSIG`` and a watch on its parent): a batch of a dead capturer
must not land after its successor replayed it and what came next. It runs in a
session of its own, so a Ctrl-C in the terminal reaches the capturer only,
which then stops its senders in order. What the child's sender raises comes
back as the same ``SinkError`` (retriable or not).

Each transaction is encoded once, whatever the number of sender processes: one
encoder (``_SharedEncoding``) numbers the table schemas for all children and keeps a
transaction's encoded values on it while the stream holds it; each child is sent
the schema values it has not had yet before the first batch that may use them, then
the same bytes as every other child (a transaction beyond ``_CACHE_ROWS`` rows, or
spilled to disk, is encoded again for each, a piece at a time: never whole in
memory).

The pipe carries msgpack values. Capturer -> child: ``["open", sender, options,
log level, spillRows, spillDir]``, then per batch ``["r", region]`` before the
transactions of each region, the transactions' wire values, and ``["end"]``;
a batch's ``["end", 1]`` (instead of ``["end"]``) hands the batch to a sender that delivers it
later (``defer_settle``, the Kafka sender: produced, not flushed) and ``["settle"]`` waits for its
delivery, so the child's flush overlaps the next batch as in-process;
between batches, at most once a second, ``["hk"]`` for a sender that has
housekeeping of its own (the Spark sender's compaction); ``["key"]`` before a
batch is retried (the destination's position, ``resume_key()``); ``["close"]``
at the end. Child -> capturer, one answer per open, per batch, per ``settle``, per ``hk``
and per ``key``: ``["ok", status extras]`` or ``["err", retriable, message, poll]``; while a batch
takes longer than a second, the child also sends its sender's status extras once a second
(``["st", extras]``, before the batch's answer: what it waits for, e.g. the statement a target's lock
holds, shows in the capturer's /status while it waits). The
open message carries the checkpoint's ``resume_state`` (a seventh element) and the
sender's name when it is not its type (an eighth: an applier's ``<name>.mysql``); the
extras of its answer hold ``resume_key``, those of a batch's answer the sender's
``position_state``. A ``Fenced`` in the child (high availability: the lease below, or the
destination's own fence) answers ``["err", false, message, null, "fenced"]`` and is raised as
``Fenced`` in the capturer.

High availability: the child runs in a session of its own, so a capturer frozen (SIGSTOP)
leaves it running. With ``[ha]`` it follows the capturer's lease (the options' ``ha_epoch``
and ``ha_lease_file``, the file the lease keeper renews only while the capturer runs,
``capturer/util/fencing.py``): before it opens its destination and before every batch, as
the sender's thread in the capturer does, and inside the senders' own checks (the Kafka
sender's before each transaction, slice and commit).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import msgpack

from capturer.errors import Fenced, SinkError
from capturer.model import Txn, wire
from capturer.util import fencing
from capturer.util.bqueue import WeightedQueue
from capturer.util.memory import tune
from senders import sender_class
from senders.base import Sender

log = logging.getLogger(__name__)

_WRITE_BYTES = 1 << 20  # the pipe is written in pieces of about this size
_CACHE_ROWS = 20_000  # a transaction up to this size keeps its encoded values for the other children
_STATUS_EVERY = 1.0  # seconds: how often a child busy with a batch sends its sender's status
# what Sender.status() holds; the rest of a child's sender status is passed on
_BASE_STATUS = frozenset(("state", "paused", "paused_since", "rows", "txns", "acked_ts", "queue_items", "queue_rows",
                          "queue_capacity_rows", "errors", "retries", "last_error"))


class _FdReader:
    """``read(n)`` that returns what the pipe has (msgpack's Unpacker asks for more than one value)."""

    def __init__(self, fd: int):
        self.fd = fd

    def read(self, n: int) -> bytes:
        return os.read(self.fd, n)


def _unpacker(fd: int) -> Any:
    return wire.new_unpacker(_FdReader(fd), max_buffer_size=1 << 31)


class _SharedEncoding:
    """The wire values of the stream's transactions, made once for every sender process.

    Schema numbers are shared by all children (``schemas``: every schema value made so
    far, in order; each child is sent those it has not had). ``pieces(txn)``: the
    transaction's values without schema values, kept on the transaction (it is the
    same object for every sender reading it from memory, or from the backlog's
    decoded rows) when it has at most ``_CACHE_ROWS`` rows in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.schemas: list[bytes] = []
        self.users = 0  # ProcessSenders made: with one, a transaction's values are not kept for another
        shared = self

        class _Encoder(wire.Encoder):
            def _sid(self, schema: Any, out: list[bytes]) -> int:
                with shared._lock:  # (several senders' threads encode at once)
                    mark = len(out)
                    sid = super()._sid(schema, out)
                    shared.schemas.extend(out[mark:])  # a new schema: its value, for every child
                    del out[mark:]
                    return sid

        self._encoder = _Encoder()

    def pieces(self, txn: Any) -> Any:
        """(value, rows) pieces of an item, schema values left out (see ``schemas``)."""
        cached = txn.__dict__.get("_wire_pieces") if isinstance(txn, Txn) else None
        if cached is not None:
            return cached
        if (self.users < 2 or not isinstance(txn, Txn) or hasattr(txn.changes, "chunks")
                or len(txn.changes) > _CACHE_ROWS):
            return self._encoder.item(txn)  # a heartbeat (small), or big: a piece at a time
        out = list(self._encoder.item(txn))
        object.__setattr__(txn, "_wire_pieces", out)  # (a frozen dataclass: its own field-less attribute)
        return out


_SHARED = _SharedEncoding()


class ProcessSender(Sender):
    """The capturer's side: a Sender whose ``send`` is done by a child process."""

    def __init__(self, name: str, options: dict[str, Any], queue_rows: int = 100_000, log_level: str = "info",
                 spill_rows: int = 50_000, spill_dir: str = "", kind: str = ""):
        """``kind``: the sender's type when its ``name`` is another (an applier's ``<name>.mysql``)."""
        super().__init__(name, options, queue_rows)
        self.kind = kind or name
        # batching as the real sender would batch (some set it from their options); making one opens nothing
        probe = sender_class(self.kind)(name, {k: v for k, v in options.items() if k != "process"}, queue_rows)
        self.batch_rows, self.linger, self.max_backoff = probe.batch_rows, probe.linger, probe.max_backoff
        self.start_rows = probe.start_rows
        # a sender that delivers a batch in settle(): the child produces it, the next batch is read and
        # sent while the child's client delivers it, as in-process (senders/base.py defer_settle)
        self.defer_settle = bool(probe.defer_settle)
        self.queue = WeightedQueue(probe.queue.capacity)  # (its own, before any inbox is attached)
        self.log_level = log_level
        self.spill_rows, self.spill_dir = spill_rows, spill_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.extras: dict[str, Any] = {}
        self._pending: dict[str, Any] | None = None  # the child's sender's pending_state, as it last said it
        self.restarts = 0
        self._schemas_sent = 0  # how many of _SHARED.schemas the child has
        _SHARED.users += 1
        self._answers: Any = None
        # the child runs the sender's housekeeping (a compaction coming due) once a second between batches
        self._housekeeps = type(probe).housekeeping is not Sender.housekeeping
        self._last_housekeeping = 0.0
        self._resume_key: Any = None
        self._fresh_key = False  # _resume_key came with the open's answer, not asked for yet
        self._asked: float | None = None  # since when the child's answer is awaited

    def status(self) -> dict[str, Any]:
        st = dict(self.extras)
        st.update(super().status())
        proc = self.proc  # the sender's thread may replace it meanwhile
        st["process"] = {"pid": proc.pid if proc is not None and proc.poll() is None else None,
                         "restarts": self.restarts}
        asked = self._asked
        # how long the child has had the batch (or question) in hand: a destination that hangs shows here,
        # not only once its timeout passes (the child's own status fields are those of its last answer)
        st["waiting_seconds"] = round(time.monotonic() - asked, 1) if asked is not None else None
        if asked is not None and st.get("waiting_for") is None:
            st["waiting_for"] = f"the answer of the sender's process {st['process']['pid']}"
        elif asked is None:
            st["waiting_for"] = None
        return st

    # --- the child ------------------------------------------------------------
    def _spawn(self) -> None:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([sys.executable, "-m", "senders.process", "--parent", str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
                                     start_new_session=True)
        assert self.proc.stdout is not None
        self._answers = _unpacker(self.proc.stdout.fileno())
        self._schemas_sent = 0  # a new child knows no schema yet
        log.info("sender %s: runs in process %d", self.name, self.proc.pid)

    def _reap(self) -> int | None:
        """Forget the child: end of input (a live one closes its sender and exits), at most
        5 s, then SIGKILL; its exit code."""
        p, self.proc = self.proc, None
        if p is None:
            return None
        for f in (p.stdin, p.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:  # a dead child's pipe: what was buffered for it is gone with it
                pass
        try:
            code = p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            code = p.wait()
        return code

    def _gone(self) -> SinkError:
        code = self._reap()
        self.restarts += 1
        return SinkError(f"the sender's process exited (code {code}); starting a new one")

    def _write(self, pieces: list[bytes]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"".join(pieces))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._gone() from None

    def _answer(self) -> None:
        self._asked = time.monotonic()
        try:
            while True:
                v = next(self._answers)
                if not (isinstance(v, list) and len(v) == 2 and v[0] == "st"):
                    break
                if isinstance(v[1], dict):  # the busy child's status meanwhile: what it waits for
                    self.extras = dict(v[1])
        except (StopIteration, OSError, ValueError, msgpack.UnpackException):
            raise self._gone() from None
        finally:
            self._asked = None
        if not isinstance(v, list) or not v or v[0] not in ("ok", "err"):
            self.close()
            raise SinkError(f"the sender's process answered {v!r:.80}")
        if len(v) > 5 and v[0] == "err" and isinstance(v[5], dict):
            self._pending = v[5]
        if v[0] == "err":
            if len(v) > 4 and v[4] == "fenced":
                raise Fenced(str(v[2]))
            poll = v[3] if len(v) > 3 and isinstance(v[3], (int, float)) else None
            raise SinkError(str(v[2]), retriable=bool(v[1]), poll=poll)
        if len(v) > 1 and isinstance(v[1], dict):
            extras = dict(v[1])
            if "resume_key" in extras:
                k = extras.pop("resume_key")
                self._resume_key = tuple(k) if isinstance(k, list) and len(k) == 3 else None
            if "position_state" in extras:
                self.position_state = extras.pop("position_state")
            if "pending_state" in extras:
                pending = extras.pop("pending_state")
                self._pending = pending if isinstance(pending, dict) else None
            self.extras = extras

    # --- Sender ---------------------------------------------------------------
    def pending_state(self) -> dict[str, Any] | None:
        return self._pending

    def open(self) -> None:
        if self.proc is not None:
            self._reap()
        self._spawn()
        opts = {k: v for k, v in self.options.items() if k != "process"}
        self._write([wire.packb(["open", self.kind, opts, self.log_level, self.spill_rows, self.spill_dir,
                                 self.resume_state, self.name])])
        try:
            self._answer()
            self._fresh_key = True
        except SinkError:
            self._reap()  # a child whose sender could not open exits; the next attempt starts another
            raise

    def send(self, batch: list[Txn]) -> None:
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                log.warning("sender %s: %s", self.name, self._gone())
            self.open()
        encoded = [_SHARED.pieces(txn) for txn in batch]  # (its schemas now in _SHARED.schemas)
        pieces: list[bytes] = []
        size = 0
        region = None
        for txn, values in zip(batch, encoded):
            if txn.region != region:
                region = txn.region
                pieces.append(wire.packb(["r", region]))
            for data, _rows in values:
                if self._schemas_sent < len(_SHARED.schemas):  # new schemas (a big one's: met on its way)
                    new = _SHARED.schemas[self._schemas_sent:]
                    self._schemas_sent += len(new)
                    pieces.extend(new)
                pieces.append(data)
                size += len(data)
                if size >= _WRITE_BYTES:
                    self._write(pieces)
                    pieces, size = [], 0
        pieces.append(wire.packb(["end", 1] if self.settle_later and self.defer_settle else ["end"]))
        self._write(pieces)
        self._answer()

    def settle(self) -> None:
        """The child's sender's ``settle``: every batch it was handed with ``["end", 1]`` delivered.
        A child that died meanwhile is a retriable error (the loop sends those batches again)."""
        if not self.defer_settle:
            return
        if self.proc is None or self.proc.poll() is not None:
            raise self._gone()
        self._write([wire.packb(["settle"])])
        self._answer()

    def resume_key(self) -> Any:
        """The child's sender's answer. A dead child is replaced first: the new one reads
        the destination's position when it opens (what the dead one wrote of a batch is
        then known, and the retry sends only the rest)."""
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                log.warning("sender %s: %s", self.name, self._gone())
            self.open()
        if self._fresh_key:  # it came with the open's answer
            self._fresh_key = False
            return self._resume_key
        self._write([wire.packb(["key"])])
        self._answer()
        return self._resume_key

    def housekeeping(self) -> None:
        if not self._housekeeps or self.proc is None or time.monotonic() - self._last_housekeeping < 1.0:
            return
        self._last_housekeeping = time.monotonic()
        if self.proc.poll() is not None:
            return  # the next batch starts another
        self._write([wire.packb(["hk"])])
        self._answer()

    def close(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            assert p.stdin is not None
            p.stdin.write(wire.packb(["close"]))
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            log.warning("sender %s: its process %d did not stop in 30 s: killed", self.name, p.pid)
            p.kill()
            p.wait()


# --- the child process ----------------------------------------------------------
def _err(exc: BaseException, sender: Sender | None = None) -> list[Any]:
    """The error answer; a sixth element: the sender's ``pending_state`` (kept by the checkpoint although
    the batch failed)."""
    pending = sender.pending_state() if sender is not None else None
    if isinstance(exc, Fenced):  # (a fifth element: the capturer raises it as Fenced, never retried)
        return ["err", False, str(exc), None, "fenced", pending]
    if isinstance(exc, SinkError):
        return ["err", exc.retriable, str(exc), exc.poll, None, pending]
    return ["err", False, f"{type(exc).__name__}: {exc}", None, None, pending]


def _end_with_the_lease(name: str) -> None:
    """High availability: end this process once the capturer's lease is gone, as a kill -9 would. A
    capturer frozen past its lease (SIGSTOP, on the machine of its successor) leaves this process
    running in a session of its own: it would write nothing more (every batch is checked), but it
    would keep its destination's lock (the file's flock) and connections until the capturer runs
    again, and the new active's file sender would wait that long. Every sender takes a crash at
    any point: the file is cut to its last whole transaction, an open MySQL chunk or Kafka
    transaction is rolled back or aborted."""
    while True:
        time.sleep(0.2)
        why = fencing.GUARD.lost or ("its lease ran out" if fencing.GUARD.remaining() <= 0 else "")
        if why:
            log.error("sender %s: the capturer's lease is gone (%s): this process ends, writing nothing more",
                      name, why)
            logging.shutdown()
            os._exit(3)


def _die_with(parent: int) -> None:
    """Go at once when the capturer is gone, even in the middle of a batch."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass

    def watch() -> None:  # where prctl is missing, and for a parent gone before it was set
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class _Child:
    """The child's end of the pipe: its answers, and the batch being read (what broke it, if anything)."""

    def __init__(self, out: Any):
        self.out = out
        self._out_lock = threading.Lock()  # answers and the status sent while a batch is in hand
        self._busy: Sender | None = None  # the sender while it has a batch in hand (under _out_lock)
        self._busy_changed = threading.Condition(self._out_lock)
        self.batch: list[Txn] = []
        # a value of this batch could not be read or kept: the batch is refused at its end (the rest of it
        # is still read, so that the pipe stays in step), retriable or not
        self.broken: tuple[str, bool] | None = None

    def answer(self, v: list[Any]) -> None:
        data = wire.packb(v)
        with self._out_lock:
            self._busy = None  # (no status after the answer: the capturer reads one answer per request)
            self._busy_changed.notify_all()
            self.out.write(data)
            self.out.flush()

    @staticmethod
    def extras(sender: Sender) -> dict[str, Any]:
        return {k: x for k, x in sender.status().items() if k not in _BASE_STATUS}

    def answer_ok(self, sender: Sender) -> None:  # with the sender's own status fields and position state
        extras = self.extras(sender)
        extras["position_state"] = sender.position_state
        extras["pending_state"] = sender.pending_state()
        self.answer(["ok", extras])

    def _send_status(self) -> None:
        """While a batch is in hand for longer than ``_STATUS_EVERY``: the sender's status extras once
        every ``_STATUS_EVERY`` (what a destination that hangs holds it on, as the sender says it)."""
        while True:
            with self._out_lock:
                while self._busy is None:
                    self._busy_changed.wait()
                since = time.monotonic()
                while self._busy is not None and time.monotonic() - since < _STATUS_EVERY:
                    self._busy_changed.wait(_STATUS_EVERY)
                sender = self._busy
            if sender is None:
                continue
            try:
                extras = self.extras(sender)  # (outside the lock: the sender's status may take its own locks)
                data = wire.packb(["st", extras])
            except Exception:
                log.debug("sender status while busy failed", exc_info=True)
                continue
            with self._out_lock:
                if self._busy is sender:  # still in hand: the answer has not gone yet
                    self.out.write(data)
                    self.out.flush()

    def start_status(self) -> None:
        threading.Thread(target=self._send_status, name="busy-status", daemon=True).start()

    def answer_key(self, sender: Sender) -> None:
        k = sender.resume_key()
        self.answer(["ok", {"resume_key": None if k is None else list(k)}])

    def new_reader(self, spill_rows: Any, spill_dir: Any) -> wire.TxnReader:
        """What reads the batches' transactions into ``self.batch``."""
        return wire.TxnReader(wire.Decoder(""), int(spill_rows), str(spill_dir),
                              lambda fields, changes, _spilled: self.batch.append(Txn(changes=changes, **fields)))

    def serve(self, sender: Sender, values: Any, reader: wire.TxnReader) -> None:
        """The batches, ``hk`` and ``key`` until ``close`` or the end of the pipe."""
        for v in values:
            tag = v[0] if isinstance(v, list) and v else None
            if tag == "end":
                self._end_batch(sender, reader, len(v) == 2 and v[1] == 1)
            elif tag == "settle":  # what the batches handed over with ["end", 1] became
                try:
                    self._set_busy(sender)
                    sender.settle()
                    self.answer_ok(sender)
                except Exception as exc:
                    self.answer(_err(exc, sender))
            elif tag == "hk":  # between batches: the sender's own work
                try:
                    sender.housekeeping()
                    self.answer_ok(sender)
                except Exception as exc:
                    self.answer(_err(exc))
            elif tag == "key":  # a batch is about to be retried: where the destination stands
                try:
                    self.answer_key(sender)
                except Exception as exc:
                    self.answer(_err(exc))
            elif tag == "close":
                break
            elif tag == "r" and len(v) == 2:
                reader.decoder.region = str(v[1])
            elif self.broken is None or tag == "s":  # schemas are read even then: the capturer's encoder sent them
                self._feed(reader, v)

    def _set_busy(self, sender: Sender) -> None:
        with self._out_lock:
            self._busy = sender
            self._busy_changed.notify_all()

    def _end_batch(self, sender: Sender, reader: wire.TxnReader, later: bool = False) -> None:
        """``later``: the capturer settles it (``["settle"]``): ``send`` may leave its delivery to ``settle``."""
        try:
            if self.broken is None and reader.inside:
                self.broken = ("the batch ended inside a transaction", False)
            if self.broken is not None:
                raise SinkError(f"sender process: batch refused: {self.broken[0]}", retriable=self.broken[1])
            # high availability: the capturer checked its lease before it handed the batch over, but this
            # process runs on when the capturer is frozen (a session of its own): the lease once more here
            fencing.check(f"sender {sender.name}")
            self._set_busy(sender)
            sender.settle_later = later and sender.defer_settle
            sender.send(self.batch)
            self.answer_ok(sender)
        except Exception as exc:
            self.answer(_err(exc, sender))
        self.batch, self.broken = [], None
        reader.discard()

    def _feed(self, reader: wire.TxnReader, v: Any) -> None:
        try:
            reader.feed([v])
        except (wire.WireError, TypeError, ValueError, IndexError, KeyError) as exc:
            self.broken = (str(exc) or repr(exc), False)
            reader.discard()
        except OSError as exc:  # spilling a big transaction: a full or unwritable spillDir
            self.broken = (str(exc), True)
            reader.discard()


def _is_open(first: Any) -> bool:
    return isinstance(first, list) and len(first) in (6, 7, 8) and first[0] == "open"


def _new_sender(first: list[Any]) -> Sender:
    """The sender an ``open`` message names (the child's logging set up for it first)."""
    _, kind, options, level = first[:4]
    name = str(first[7]) if len(first) == 8 else kind  # (the sender's name, when not its type)
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [sender {name} pid {os.getpid()}] %(name)s: %(message)s")
    if options.get("ha_epoch") and options.get("ha_lease_file"):
        fencing.follow(int(options["ha_epoch"]), str(options["ha_lease_file"]))  # the capturer's lease, here too
        threading.Thread(target=_end_with_the_lease, args=(name,), name="lease-watch", daemon=True).start()
    sender = sender_class(kind)(name, options, 1)
    sender.resume_state = first[6] if len(first) >= 7 and isinstance(first[6], dict) else None
    return sender


def child_main(argv: list[str] | None = None) -> int:
    """Serve one sender on stdin/stdout until ``close`` or the capturer goes away."""
    tune()
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--parent" and args[1].isdigit():
        _die_with(int(args[1]))
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a print() in a library must not break the pipe
    values = _unpacker(sys.stdin.fileno())
    child = _Child(out)
    sender: Sender | None = None
    try:
        first: Any = next(values, None)
        if not _is_open(first):
            # not the message itself: it holds the sender's options (passwords)
            print(f"senders.process: expected an open message, got a {type(first).__name__}", file=sys.stderr)
            return 2
        sender = _new_sender(first)
        try:
            fencing.check(f"sender {sender.name}")
            sender.open()
            child.answer_key(sender)
        except Exception as exc:
            child.answer(_err(exc))
            return 1
        reader = child.new_reader(first[4], first[5])
        child.start_status()
        try:
            child.serve(sender, values, reader)
        except BrokenPipeError:
            raise
        except Exception as exc:
            child.answer(_err(exc))
            return 1
        return 0
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    finally:
        if sender is not None:
            try:
                sender.close()
            except Exception:
                log.exception("sender close failed")

if __name__ == "__main__":
    sys.exit(child_main())
