"""An applier: reads the topics one capturer's Kafka sender writes, regroups the row
messages into their source transactions (capturer/apply/regroup.py) and drives our own
senders with them (MySQL, file, Spark lake), as the capturer drives them from its
merged stream.

Order: transactions leave in the spine's order (``txn_topic``: the capturer's stream
order), whole; each sender applies them as it does in the capturer (the MySQL sender
with its conflict detection and workers, ``txn_atomic`` where asked).

Positions: each sender keeps its own position **with its destination** (the MySQL
sender's position rows, written in the same target transactions as the rows; the
file's last whole transaction; the lake's high-water mark) and, after a restart,
skips every transaction at or below it. Consumer-group offsets are committed only
behind what every sender acknowledged (``Regrouper.commit_offsets``), so a restart
(also after ``kill -9``) reads again at most what was in flight: nothing lost, and
what a destination holds is not applied twice.

The senders of one applier are chained as they were in the capturer before independent
sinks: the slowest holds the others (its queue fills). For independent destinations
run one applier per destination: Kafka is their backlog, each reads at its own pace.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from pathlib import Path
from typing import Any, cast

from capturer.apply.check import check_apply
from capturer.apply.config import ApplyConfig, load_apply_config
from capturer.apply.regroup import BadMessage, Regrouper, owned_by
from capturer.apply.status import ApplyCollector, pages
from capturer.errors import CapturerError, ConfigError, FatalSourceError, SourceError
from capturer.model import Heartbeat, Item, StreamKey, Txn, stream_key, ts_physical_ms
from capturer.model.message import TP, Consumer, Msg
from capturer.ops.status import StatusServer
from capturer.util.bqueue import WeightedQueue
from senders import CATALOG, check_module, consumer_factory, extra, sender_class
from senders.base import Sender
from senders.process import ProcessSender

log = logging.getLogger(__name__)

Pair = tuple[int, Item]
SPINE_ENTRIES = 100_000  # transactions read from the spine but not complete, before the spine waits


class _SenderQueue(WeightedQueue[Pair]):
    """A sender's queue that hands out, in place of a transaction its destination holds
    already (``skip_through``, from the sender's ``resume_key``), a heartbeat: acknowledged,
    not sent."""

    skip: StreamKey | None = None

    def skip_through(self, key: StreamKey) -> None:
        self.skip = key

    def get_many(self, max_weight: int, timeout: float | None = None) -> list[Pair]:
        out = super().get_many(max_weight, timeout)
        skip = self.skip
        if skip is None:
            return out
        return [(n, Heartbeat(it.region, it.commit_ts)) if isinstance(it, Txn) and stream_key(it) <= skip else (n, it)
                for n, it in out]


def make_senders(cfg: ApplyConfig) -> list[Sender]:
    """Each sender named ``<applier>.<type>`` (its position rows in a shared target are its own);
    ``process = true``: its work in a process of its own (senders/process.py), off the GIL of the
    consumer and the regrouping."""
    out: list[Sender] = []
    for sc in cfg.senders:
        name = f"{cfg.name}.{sc.name}"
        s: Sender
        if sc.options.get("process"):
            s = ProcessSender(name, sc.options, cfg.queue_rows, cfg.log_level, kind=sc.name)
        else:
            s = sender_class(sc.name)(name, {k: v for k, v in sc.options.items() if k != "process"}, cfg.queue_rows)
        s.attach(_SenderQueue(s.queue.capacity))
        out.append(s)
    return out


class Applier:
    def __init__(self, cfg: ApplyConfig, consumer: Consumer | None = None):
        self.cfg = cfg
        self.owns = owned_by(cfg.tables)
        untabled = cfg.untabled_ddl == "apply" or (cfg.untabled_ddl == "auto" and self.owns("\0any", "\0any"))
        self.regroup = Regrouper(cfg.txn_topic, cfg.format, self.owns, untabled_ddl=untabled)
        self.senders = make_senders(cfg)
        self.consumer = consumer
        self.failure: str = ""
        self.state = "new"
        self.started_at = time.time()
        self.seq = 0  # dispatch number of the last transaction handed to the senders
        self.inflight: collections.deque[tuple[int, StreamKey, int]] = collections.deque()  # (n, key, ts_ms)
        self.assigned: set[TP] = set()
        self.txns = self.rows = self.ddls = 0
        self.bad_messages = self.dead_letters = 0
        self.last_bad = ""
        self.last_applied: StreamKey | None = None
        self.last_applied_ms = 0  # commit time of the last transaction every sender acknowledged
        self.commit_errors = 0
        self.last_commit_error = ""
        self.committed: dict[TP, int] = {}
        self.last_ts: dict[TP, int] = {}  # Kafka timestamp of the last message read, per partition
        self.paused: set[TP] = set()
        self.kafka_error = ""
        self.status_server: Any = None
        self._lag: dict[TP, int] = {}
        self._lag_at = 0.0

    # --- lifecycle -----------------------------------------------------------------
    def start(self) -> None:

        self.status_server = StatusServer(self.cfg.http_host, self.cfg.http_port, self.snapshot, self.healthy,
                                          collector=ApplyCollector(self.snapshot), pages=pages())
        self.status_server.start()
        log.info("applier %s: status on http://%s:%d/", self.cfg.name, self.cfg.http_host, self.status_server.port)
        for s in self.senders:
            s.start(0)

    def run(self, stop: threading.Event) -> int:
        """Until ``stop`` is set (0) or something fails (1, ``failure`` says what)."""
        code = 0
        try:
            if self.consumer is None:
                self.consumer = consumer_factory("kafka")(self.cfg.client, self.cfg.servers, self.cfg.group, self.cfg.security,
                                              f"applier {self.cfg.name}", where=f"[global] of {self.cfg.path}")
            self._wait_for_spine(stop)
            self.state = "running"
            last_commit = time.monotonic()
            while not stop.is_set():
                self._check_senders()
                self._assign_new_topics()
                self._add_all(self.consumer.poll(5000, 0.2))
                self._dispatch(stop)
                self._acks()
                self._backpressure()
                if time.monotonic() - self._lag_at > 1.0:  # (the consumer is this thread's alone)
                    self._lag_at = time.monotonic()
                    try:
                        self._lag = self.consumer.lag()
                    except Exception:
                        log.debug("lag unknown", exc_info=True)
                if time.monotonic() - last_commit >= self.cfg.commit_interval:
                    self._commit()
                    last_commit = time.monotonic()
            self._drain(30.0)
        except CapturerError as exc:
            self.failure = str(exc)
            code = 1
        except Exception as exc:
            log.exception("applier failed")
            self.failure = f"{type(exc).__name__}: {exc}"
            code = 1
        finally:
            self.state = "failed" if code else "stopping"
            if code:
                log.error("applier %s stopped on failure: %s", self.cfg.name, self.failure)
            self._acks()
            self._commit()
            for s in self.senders:
                s.stop()
            for s in self.senders:
                s.join(30)
            self._acks()
            self._commit()
            if self.consumer is not None:
                try:
                    self.consumer.close()
                except Exception:
                    log.debug("consumer close failed", exc_info=True)
            if self.status_server is not None:
                self.status_server.stop()
            self.state = "failed" if code else "stopped"
        return code

    def _wait_for_spine(self, stop: threading.Event) -> None:
        assert self.consumer is not None
        warned = False
        while not stop.is_set():
            try:
                topics = self.consumer.topics()
            except FatalSourceError:
                raise  # a refused login, a certificate the CA did not sign: retrying cannot help
            except SourceError as exc:
                topics, self.kafka_error = {}, str(exc)
            if self.cfg.txn_topic in topics:
                self.kafka_error = ""
                self.consumer.add([(self.cfg.txn_topic, 0)])
                return
            if not self.kafka_error:
                self.kafka_error = (f"txn_topic {self.cfg.txn_topic!r} does not exist on {self.cfg.servers}: "
                                    "set txn_topic in the capturer's [kafka] sender section to the same name "
                                    "(the applier waits for it)")
            if not warned:
                log.error("applier %s: %s", self.cfg.name, self.kafka_error)
                warned = True
            stop.wait(2.0)

    def _drain(self, timeout: float) -> None:
        """A clean stop: let the senders finish what they were given (up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self.inflight and time.monotonic() < deadline and not any(s.state == "failed" for s in self.senders):
            self._acks()
            time.sleep(0.05)

    # --- the loop ------------------------------------------------------------------
    def _check_senders(self) -> None:
        for s in self.senders:
            if s.state == "failed":
                raise CapturerError(f"sender {s.name} failed: {s.last_error}")

    def _assign_new_topics(self) -> None:
        """Read every partition an END record named for this applier's tables (each from the
        group's committed offset, else its beginning)."""
        assert self.consumer is not None
        if len(self.regroup.partitions) == len(self.assigned):
            return
        tps = sorted(self.regroup.partitions - self.assigned)
        log.info("applier %s: reading %s", self.cfg.name, ", ".join(f"{t}[{p}]" for t, p in tps))
        self.consumer.add(tps)
        self.assigned.update(tps)

    def _add_all(self, msgs: list[Msg]) -> None:
        add, last_ts = self.regroup.add, self.last_ts
        for m in msgs:  # (``_add``, inline: once per message)
            if m.ts_ms:
                last_ts[(m.topic, m.partition)] = m.ts_ms
            try:
                add(m)
            except BadMessage as exc:
                self._bad(m, exc)

    def _bad(self, m: Msg, exc: BadMessage) -> None:
        self.bad_messages += 1
        self.last_bad = str(exc)
        if self.cfg.on_bad_message != "dead_letter" or m.topic == self.cfg.txn_topic:
            raise CapturerError(f"a message that does not decode: {exc} (on_bad_message="
                                f"{self.cfg.on_bad_message}; nothing after it was applied)") from None
        assert self.consumer is not None
        self.consumer.dead_letter(self.cfg.dead_letter_topic, m, exc.why)
        self.dead_letters += 1
        counted = self.regroup.add_bad(m)
        log.error("applier %s: %s: copied to %s%s", self.cfg.name, exc, self.cfg.dead_letter_topic,
                  "; its transaction is applied without it" if counted else "")

    def _dispatch(self, stop: threading.Event) -> None:
        try:
            ready = self.regroup.ready()
        except ValueError as exc:
            raise CapturerError(f"a transaction cannot be rebuilt: {exc}") from None
        for key, txn in ready:
            ts_ms = ts_physical_ms(key[0])
            if txn is None:
                if self.inflight:
                    self.inflight.append((self.seq, key, ts_ms))
                else:
                    self.regroup.done_through(key)
                    self.last_applied = key
                continue
            self.seq += 1
            w = txn.weight
            for s in self.senders:
                q = cast(_SenderQueue, s.queue)  # (attached by make_senders)
                # room first (the loop is this queue's only writer): a sender that fails meanwhile
                # never drains it, and the wait must see that
                while len(q) and q.weight + w > q.capacity:
                    if stop.is_set():
                        return
                    if s.state == "failed":
                        raise CapturerError(f"sender {s.name} failed: {s.last_error}")
                    time.sleep(0.02)
                q.put((self.seq, txn), w)
            self.inflight.append((self.seq, key, ts_ms))
            if txn.ddl is not None:
                self.ddls += 1
            else:
                self.txns += 1
                self.rows += len(txn.changes)

    def _acks(self) -> None:
        if not self.senders:
            return
        acked = min(s.acked_seq for s in self.senders)
        done = None
        while self.inflight and self.inflight[0][0] <= acked:
            _n, done, ts_ms = self.inflight.popleft()
            self.last_applied_ms = ts_ms
        if done is not None:
            self.regroup.done_through(done)
            self.last_applied = done

    def _backpressure(self) -> None:
        """Memory bounds, decided again every turn: with more than ``maxBufferedRows`` rows held
        for incomplete transactions, the table partitions that have read past the transaction
        the spine waits for are paused (its rows in them were read: a partition keeps the
        stream's order), the others read on; below half, all read. With more than
        ``SPINE_ENTRIES`` transactions known but not complete, the spine waits too."""
        assert self.consumer is not None
        held = self.regroup.rows_buffered
        want: set[TP] = set()
        if held > self.cfg.max_buffered_rows or (self.paused and held > self.cfg.max_buffered_rows // 2):
            front = self.regroup.order[0].key if self.regroup.order else None
            want = {tp for tp in self.regroup.next_offset if tp[0] != self.cfg.txn_topic and self._ahead(tp, front)}
        spine = (self.cfg.txn_topic, 0)
        if len(self.regroup.order) > SPINE_ENTRIES or (spine in self.paused and
                                                       len(self.regroup.order) > SPINE_ENTRIES // 2):
            want.add(spine)
        resume, pause = self.paused - want, want - self.paused
        if resume:
            self.consumer.resume(sorted(resume))
        if pause:
            log.info("applier %s: %d rows held for %d incomplete transactions: pausing %d partition(s) read ahead",
                     self.cfg.name, held, len(self.regroup.order), len(pause))
            self.consumer.pause(sorted(pause))
        self.paused = want

    def _ahead(self, tp: TP, front: StreamKey | None) -> bool:
        """Whether partition ``tp`` has read past the transaction the spine waits for."""
        lk = self.regroup.last_key.get(tp)
        return lk is not None and front is not None and lk > front

    def _commit(self) -> None:
        if self.consumer is None:
            return
        offsets = self.regroup.commit_offsets()
        changed = {tp: off for tp, off in offsets.items() if self.committed.get(tp) != off}
        if not changed:
            return
        try:
            self.consumer.commit(changed)
            self.committed.update(changed)
            self.last_commit_error = ""
        except Exception as exc:
            self.commit_errors += 1
            self.last_commit_error = f"{type(exc).__name__}: {exc}"
            log.warning("applier %s: committing offsets failed (%s); retried at the next interval", self.cfg.name,
                        exc)

    # --- status --------------------------------------------------------------------
    def healthy(self) -> tuple[bool, str]:
        if self.state == "failed":
            return False, self.failure
        bad = [s.name for s in self.senders if s.state in ("failed", "retrying")]
        if bad:
            return False, f"sender(s) {', '.join(bad)} failing"
        if self.kafka_error:
            return False, self.kafka_error
        return True, "ok"

    def snapshot(self) -> dict[str, Any]:
        """The status (HTTP threads call it while the loop changes what it reads: a copy that
        met a change is taken again)."""
        for _ in range(5):
            try:
                return self._snapshot()
            except RuntimeError:  # a dict or deque changed size while it was copied
                time.sleep(0.01)
        return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        now = time.time()
        lags = dict(self._lag)
        parts = {}
        for tp, off in sorted(dict(self.regroup.next_offset).items()):
            lag = lags.get(tp, 0)
            last = self.last_ts.get(tp, 0)
            parts[f"{tp[0]}[{tp[1]}]"] = {
                "topic": tp[0], "partition": tp[1], "next_offset": off, "committed": self.committed.get(tp),
                "lag_messages": lag, "lag_seconds": round(max(0.0, now - last / 1000.0), 3) if lag and last else 0.0,
                "paused": tp in self.paused}
        waiting = self.regroup.waiting()
        senders = {s.name: s.status() for s in self.senders}
        lag_s = 0.0
        if self.inflight or waiting or any(p["lag_messages"] for p in parts.values()):
            lag_s = max(0.0, now - self.last_applied_ms / 1000.0) if self.last_applied_ms else 0.0
        return {
            "kind": "applier", "name": self.cfg.name, "state": self.state, "failure": self.failure,
            "started_at": self.started_at, "group": self.cfg.group, "txn_topic": self.cfg.txn_topic,
            "format": self.cfg.format, "client": self.cfg.client, "tables": list(self.cfg.tables),
            "applied": {"txns": self.txns, "rows": self.rows, "ddls": self.ddls,
                        "last": None if self.last_applied is None else list(self.last_applied),
                        "last_commit_ms": self.last_applied_ms, "lag_seconds": round(lag_s, 3)},
            "in_flight": len(self.inflight), "waiting": waiting, "regroup": self.regroup.stats(),
            "partitions": parts,
            "errors": {"bad_messages": self.bad_messages, "dead_letters": self.dead_letters,
                       "last_bad": self.last_bad, "commit_errors": self.commit_errors,
                       "last_commit_error": self.last_commit_error, "kafka": self.kafka_error},
            "senders": senders,
            # what the senders wait for at their destinations now (a target holding a lock, a hung receiver)
            "waiting_for": [f"sender {n}: {st['waiting_for']} ({st.get('waiting_seconds')} s)"
                            for n, st in senders.items() if st.get("waiting_for")],
        }


def apply_main(argv: list[str], stop: threading.Event) -> int:
    """``python -m capturer apply --config conf/apply.cfg [--check [--connect]]``."""
    import argparse
    import json
    import sys


    ap = argparse.ArgumentParser(prog="capturer apply",
                                 description="Apply the capturer's Kafka topics to MySQL, files or the Spark lake.")
    ap.add_argument("--config", default="conf/apply.cfg")
    ap.add_argument("--check", action="store_true", help="validate the config (and with --connect, reach Kafka, "
                    "the txn topic and every destination), then exit: 0 OK, 2 bad config, 3 unreachable")
    ap.add_argument("--connect", action="store_true")
    ap.add_argument("--print-extras", action="store_true", help="the setup.py extras it needs (for start.sh)")
    args = ap.parse_args(argv)
    if args.connect and not args.check:
        ap.error("--connect goes with --check")
    try:
        cfg = load_apply_config(Path(args.config), CATALOG)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.print_extras:

        extras = ["confluent" if cfg.client == "confluent" else "kafka"]  # the applier's own consumer
        extras += [extra(s.name, s.options) for s in cfg.senders]
        print(",".join(dict.fromkeys(e for e in extras if e)))
        return 0
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("applier config: %s", json.dumps(cfg.masked(), default=str))
    if args.check:

        return check_apply(cfg, args.connect, check_module, consumer_factory("kafka"))
    app = Applier(cfg)
    try:
        app.start()
    except OSError as exc:
        print(f"start-up failed: {exc} (config {args.config})", file=sys.stderr)
        return 2
    code = app.run(stop)
    if code:
        print(f"applier stopped on failure: {app.failure}", file=sys.stderr)
    return code
