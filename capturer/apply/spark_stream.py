"""The streaming applier on Spark (issue 47 item 5): ``python -m capturer spark-apply --config
conf/apply.cfg --checkpoint DIR``, a Structured Streaming job that reads one capturer's Kafka topics
(Spark's Kafka source, ``spark-sql-kafka``: ``senders/spark/kafkajars.py``) and MERGEs every micro-batch
into the Delta tables of the applier's ``[spark] table_format = delta`` sender: the same lake tables,
written by the same code (``senders/spark/deltasink.py``) as the Spark sender and ``capturer apply``.

Config: the applier's (``conf/apply.cfg``, capturer/apply/config.py: ``servers``, ``txn_topic``,
``format`` json or protobuf, ``tables``, ``name``, ``senderConfig``), whose senderConfig must name one
sender, ``spark`` with ``table_format = delta``. Kafka's consumer group and ``commitInterval`` do not
apply: the job's position is Spark's checkpoint.

Each micro-batch (``foreachBatch``, on the driver): its messages (every partition of the subscribed
topics, the spine ``txn_topic`` with them), together with those of the transactions left incomplete
by the batch before, are regrouped into whole source transactions (capturer/apply/regroup.py: a
transaction is whole when its END record and every row message it counts have been read, in the
spine's order); the whole ones go to the Delta sender, which, per table, keeps each key's last change
by (commit_ts, seq) (a key change is a delete of the old key and an upsert of the new one) and runs
one MERGE (one Delta commit) per table. The messages of the transactions still incomplete are written
to ``<checkpoint>/pending/<batch id>`` before the batch ends, and read by the next batch.

Exactly-once after a kill -9 of the driver: Spark's checkpoint replays the micro-batch it had not
committed, with the same offsets and batch id; that batch reads the pending file of the batch before
it (never its own), so it rebuilds the same transactions; and each Delta table's commits carry the
Delta sender's idempotent-write pair (``txnAppId`` = ``binlog-capturer/<name>.spark/<table>``,
``txnVersion`` = the commit_ts of the table's last transaction; the stream key in ``userMetadata``):
the sender drops, table by table, what a table holds already. (The micro-batch id is not used as
``txnVersion``: a batch with a DDL makes several commits to one table, and the tables are shared with
the Spark sender's and ``capturer apply``'s position scheme.)

Status: ``httpPort``/``httpHost`` of the applier's config serve ``GET /status`` (JSON: batches,
transactions and rows applied, the last batch, what is held for incomplete transactions, the lag, bad
messages, the Delta sender's status, Spark's last query progress), ``/health``, ``/metrics`` and a page.
A message that does not decode stops the job (``on_bad_message = stop``) or, with ``dead_letter``, is
copied to ``dead_letter_topic`` with the error and its transaction applied without it, as ``capturer
apply`` does (the spine's own messages always stop it). Dead letters are at-least-once: a micro-batch
replayed after a kill -9 of the driver may copy its bad messages again (their headers name topic,
partition and offset: a reader can drop the repeats).

Scale-out: the MERGEs are Spark jobs (more executors, more partitions: ``--master``, the sender's
``conf.*``); the decoding and regrouping of the messages run on the driver (the messages of a batch
are collected there: ``--max-offsets`` bounds a batch).
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from capturer.apply.config import ApplyConfig, load_apply_config
from capturer.apply.regroup import BadMessage, Regrouper, owned_by
from capturer.apply.status import SparkApplyCollector, spark_pages
from capturer.errors import ConfigError, SinkError
from capturer.model import StreamKey, key_to_json, ts_physical_ms
from capturer.model.message import Msg
from capturer.ops.status import StatusServer
from capturer.util.kafkasec import security_of
from senders import CATALOG, consumer_factory, sender_class, stream_session_factory

log = logging.getLogger(__name__)


def delta_sender_options(cfg: ApplyConfig) -> dict[str, Any]:
    """The options of the applier's one ``spark`` sender with ``table_format = delta`` (ConfigError else)."""
    names = [s.name for s in cfg.senders]
    if names != ["spark"] or cfg.senders[0].options.get("table_format") != "delta":
        raise ConfigError(f"{cfg.sender_config_path}: spark-apply drives one sender, [spark] with "
                          f"table_format = delta (found: {', '.join(names) or 'none'})")
    return {k: v for k, v in cfg.senders[0].options.items() if k != "process"}


class Pending:
    """``<checkpoint>/pending/<batch id>``: what batch N leaves for batch N+1 (the applied stream key and the
    messages of the transactions not yet whole). Batch N reads the newest file below N (a replayed batch
    reads what it read the first time)."""

    def __init__(self, root: Path):
        self.dir = root / "pending"
        self.dir.mkdir(parents=True, exist_ok=True)

    def _ids(self) -> list[int]:
        return sorted(int(p.name) for p in self.dir.iterdir() if p.name.isdigit())

    def before(self, batch_id: int) -> tuple[StreamKey | None, list[Msg], set[tuple[str, int, int]]]:
        """The applied key, the held messages and which of them went to the dead-letter topic."""
        ids = [i for i in self._ids() if i < batch_id]
        if not ids:
            return None, [], set()
        with open(self.dir / str(ids[-1]), "rb") as f:
            got = pickle.load(f)
        # (a file of a release before dead letters holds two things)
        return got[0], got[1], (set(got[2]) if len(got) > 2 else set())

    def write(self, batch_id: int, done: StreamKey | None, msgs: list[Msg],
              dead: set[tuple[str, int, int]] | None = None) -> None:
        tmp = self.dir / f".{batch_id}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump((done, msgs, sorted(dead or ())), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / str(batch_id))
        for i in self._ids():
            if i < batch_id - 1:  # the one before stays: a replay of this batch reads it
                (self.dir / str(i)).unlink(missing_ok=True)


class BatchApplier:
    """The ``foreachBatch`` function: regroup, hand whole transactions to the Delta sender, keep the rest;
    what it did is its status (``snapshot``, read by the status port's threads)."""

    def __init__(self, cfg: ApplyConfig, sender: Any, checkpoint: Path, dead_letters: Any = None):
        """``dead_letters``: what writes a bad message to the dead-letter topic (``.dead_letter(topic, msg,
        why)``); made on first use from the applier's Kafka client when None."""
        self.cfg = cfg
        self.sender = sender
        self.checkpoint = checkpoint
        self.pending = Pending(checkpoint)
        self.owns = owned_by(cfg.tables)
        self.untabled = cfg.untabled_ddl == "apply" or (cfg.untabled_ddl == "auto" and self.owns("\0any", "\0any"))
        self.txns = self.rows = self.batches = 0
        self.read_seconds = 0.0  # the batch in hand: its messages read from Kafka and collected on the driver
        self.bad_messages = self.dead_letter_count = 0
        self.last_bad = ""
        self.applied: StreamKey | None = None
        self.last_commit_ms = 0
        self.held = 0
        self.last_batch: dict[str, Any] | None = None
        self.progress: dict[str, Any] | None = None  # Spark's last query progress (the main loop sets it)
        self.state, self.failure = "starting", ""
        self.started_at = time.time()
        self._dead = dead_letters

    def _add(self, reg: Regrouper, m: Msg, dead: set[tuple[str, int, int]], dead_now: set[tuple[str, int, int]]) \
            -> None:
        ident = (m.topic, m.partition, m.offset)
        if ident in dead:  # put aside by a batch before (its transaction still incomplete then)
            reg.add_bad(m)
            dead_now.add(ident)
            return
        try:
            reg.add(m)
        except BadMessage as exc:
            self.bad_messages += 1
            self.last_bad = str(exc)
            if self.cfg.on_bad_message != "dead_letter" or m.topic == self.cfg.txn_topic:
                raise RuntimeError(f"spark-apply: a message that does not decode: {exc} (on_bad_message="
                                   f"{self.cfg.on_bad_message}; nothing after it applied)") from None
            if self._dead is None:
                self._dead = consumer_factory("kafka")(self.cfg.client, self.cfg.servers,
                                                       f"{self.cfg.name}.spark-apply.dead-letters", {})
            self._dead.dead_letter(self.cfg.dead_letter_topic, m, exc.why)
            self.dead_letter_count += 1
            dead_now.add(ident)
            counted = reg.add_bad(m)
            log.error("spark-apply %s: %s: copied to %s%s", self.cfg.name, exc, self.cfg.dead_letter_topic,
                      "; its transaction is applied without it" if counted else "")

    def apply(self, msgs: list[Msg], batch_id: int) -> None:
        t0 = time.monotonic()
        done, held, dead = self.pending.before(batch_id)
        seen = {(m.topic, m.partition, m.offset) for m in held}
        allm = held + [m for m in msgs if (m.topic, m.partition, m.offset) not in seen]
        allm.sort(key=lambda m: (m.topic != self.cfg.txn_topic, m.topic, m.partition, m.offset))
        reg = Regrouper(self.cfg.txn_topic, self.cfg.format, self.owns, untabled_ddl=self.untabled)
        reg.skip_through(done)
        dead_now: set[tuple[str, int, int]] = set()
        for m in allm:
            self._add(reg, m, dead, dead_now)
        ready = reg.ready()
        txns = [t for _, t in ready if t is not None]
        t_regrouped = time.monotonic()
        if txns:
            self.sender.send(txns)
        t_merged = time.monotonic()
        if ready:
            done = ready[-1][0]
            reg.done_through(done)
        start = reg.commit_offsets()
        keep = [m for m in allm if m.offset >= start.get((m.topic, m.partition), 1 << 62)]
        kept = {(m.topic, m.partition, m.offset) for m in keep}
        self.pending.write(batch_id, done, keep, dead_now & kept)
        # where the batch's time went (bench/spark_apply.py reads them from the log line below)
        split = {"read": round(self.read_seconds, 3), "regroup": round(t_regrouped - t0, 3),
                 "merge": round(t_merged - t_regrouped, 3), "pending": round(time.monotonic() - t_merged, 3)}
        rows = sum(len(t.changes) for t in txns)
        self.batches += 1
        self.txns += len(txns)
        self.rows += rows
        self.held = len(keep)
        if ready:
            self.applied = done
            self.last_commit_ms = ts_physical_ms(done[0]) if done is not None else self.last_commit_ms
        self.last_batch = {"id": batch_id, "messages": len(msgs), "txns": len(txns), "rows": rows, "held": len(keep),
                           "seconds": round(time.monotonic() - t0, 3), "split_seconds": split,
                           "finished_at": time.time()}
        self.state = "running"
        log.info("spark-apply %s: batch %d: %d messages, %d transactions applied (%d rows), %d messages held "
                 "for incomplete transactions; applied through %s; seconds: read %.3f, regroup %.3f, merge %.3f, "
                 "pending %.3f", self.cfg.name, batch_id, len(msgs), len(txns), rows, len(keep), done,
                 split["read"], split["regroup"], split["merge"], split["pending"])

    def __call__(self, df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        rows = df.select("topic", "partition", "offset", "key", "value", "headers").collect()
        msgs = [Msg(r["topic"], int(r["partition"]), int(r["offset"]),
                    None if r["key"] is None else bytes(r["key"]), None if r["value"] is None else bytes(r["value"]),
                    [(h["key"], b"" if h["value"] is None else bytes(h["value"])) for h in (r["headers"] or [])])
                for r in rows]
        self.read_seconds = time.monotonic() - t0
        self.apply(msgs, batch_id)

    def close(self) -> None:
        if self._dead is not None and hasattr(self._dead, "close"):
            self._dead.close()

    # --- status ---------------------------------------------------------------------------
    def healthy(self) -> tuple[bool, str]:
        if self.state == "failed":
            return False, self.failure
        st = getattr(self.sender, "state", "")
        if st in ("failed", "retrying"):
            return False, f"the Delta sender is {st}"
        return True, "ok"

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        waiting = self.held or bool(self.progress and self.progress.get("numInputRows"))
        lag = max(0.0, now - self.last_commit_ms / 1000.0) if waiting and self.last_commit_ms else 0.0
        try:
            sender = self.sender.status()
        except Exception as exc:  # (a status read never fails the page)
            sender = {"error": str(exc)}
        return {
            "kind": "spark-apply", "name": self.cfg.name, "state": self.state, "failure": self.failure,
            "started_at": self.started_at, "txn_topic": self.cfg.txn_topic, "format": self.cfg.format,
            "tables": list(self.cfg.tables), "checkpoint": str(self.checkpoint),
            "applied": {"batches": self.batches, "txns": self.txns, "rows": self.rows,
                        "last": key_to_json(self.applied), "last_commit_ms": self.last_commit_ms,
                        "lag_seconds": round(lag, 3)},
            "held_messages": self.held, "last_batch": self.last_batch, "query": self.progress,
            "errors": {"bad_messages": self.bad_messages, "dead_letters": self.dead_letter_count,
                       "last_bad": self.last_bad, "on_bad_message": self.cfg.on_bad_message,
                       "dead_letter_topic": self.cfg.dead_letter_topic},
            "senders": {getattr(self.sender, "name", "spark"): sender},
        }


def query_progress(query: Any) -> dict[str, Any] | None:
    """The figures of Spark's last progress report that the status shows."""
    p = query.lastProgress
    if not p:
        return None
    return {"batch_id": p.get("batchId"), "numInputRows": p.get("numInputRows"),
            "inputRowsPerSecond": p.get("inputRowsPerSecond"),
            "processedRowsPerSecond": p.get("processedRowsPerSecond"),
            "trigger_ms": (p.get("durationMs") or {}).get("triggerExecution"), "timestamp": p.get("timestamp")}


def serve_status(cfg: ApplyConfig, batch: BatchApplier) -> StatusServer:
    server = StatusServer(cfg.http_host, cfg.http_port, batch.snapshot, batch.healthy,
                          collector=SparkApplyCollector(batch.snapshot), pages=spark_pages())
    server.start()
    log.info("spark-apply %s: status on http://%s:%d/", cfg.name, cfg.http_host, server.port)
    return server


def default_pattern(txn_topic: str) -> str:
    """The topics read by default: every topic sharing the txn topic's first dotted part (``capturer.``)."""
    head = txn_topic.split(".", 1)[0]
    return f"{re.escape(head)}\\..*" if "." in txn_topic else re.escape(txn_topic) + ".*"


def spark_apply_main(argv: list[str], stop: threading.Event) -> int:
    """``python -m capturer spark-apply --config conf/apply.cfg --checkpoint DIR [--master URL]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="capturer spark-apply",
                                 description="A Spark Structured Streaming job: the capturer's Kafka topics MERGEd "
                                             "into the Delta tables of the applier's [spark] table_format=delta sender.")
    ap.add_argument("--config", default="conf/apply.cfg")
    ap.add_argument("--checkpoint", required=True, help="Spark's checkpoint location (and the pending messages)")
    ap.add_argument("--master", help="Spark master URL (overrides the sender's master)")
    ap.add_argument("--topics", help="regex of the topics to read (default: the txn topic's prefix, e.g. capturer\\..*)")
    ap.add_argument("--trigger", type=float, default=2.0, help="seconds between micro-batches")
    ap.add_argument("--max-offsets", type=int, default=0, help="maxOffsetsPerTrigger (0 = no limit)")
    ap.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                    help="a Kafka consumer setting for Spark's source (kafka.security.protocol=SSL, ...)")
    args = ap.parse_args(argv)
    try:
        cfg = load_apply_config(Path(args.config), CATALOG)
        opts = delta_sender_options(cfg)
        if cfg.security != security_of({}):
            raise ConfigError(f"{cfg.path}: spark-apply does not read the [global] SASL/TLS keys: give them to "
                              "Spark's Kafka source with --kafka-option kafka.security.protocol=... (and the rest)")
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.master:
        opts["master"] = args.master
    checkpoint = Path(args.checkpoint).resolve()
    checkpoint.mkdir(parents=True, exist_ok=True)
    try:
        spark = stream_session_factory("spark")(opts)
    except SinkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sender = sender_class("spark")(f"{cfg.name}.spark", opts, cfg.queue_rows)
    batch = BatchApplier(cfg, sender, checkpoint)
    try:
        server = serve_status(cfg, batch)
    except OSError as exc:
        spark.stop()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return _run_query(spark, sender, batch, cfg, args, stop)
    finally:
        batch.state = "stopped" if batch.state != "failed" else "failed"
        server.stop()
        batch.close()


def _open_sender(spark: Any, sender: Any, cfg: ApplyConfig, stop: threading.Event) -> bool:
    deadline = time.monotonic() + 120
    while True:  # the lake's lock: a killed driver's JVM may still be exiting
        try:
            sender.open()
            return True
        except SinkError as exc:
            if not exc.retriable or time.monotonic() > deadline or stop.is_set():
                spark.stop()
                print(f"error: {exc}", file=sys.stderr)
                return False
            log.warning("spark-apply %s: %s", cfg.name, exc)
            time.sleep(1)


def _run_query(spark: Any, sender: Any, batch: BatchApplier, cfg: ApplyConfig, args: Any,
               stop: threading.Event) -> int:
    if not _open_sender(spark, sender, cfg, stop):
        batch.state, batch.failure = "failed", "the Delta sender could not open its tables"
        return 1
    code = 0
    query = None
    try:
        reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg.servers)
                  .option("subscribePattern", args.topics or default_pattern(cfg.txn_topic))
                  .option("startingOffsets", "earliest").option("includeHeaders", "true")
                  .option("failOnDataLoss", "true"))
        for kv in args.kafka_option:  # SASL/TLS and any other consumer setting, as Spark's kafka.<setting>
            k, _, v = kv.partition("=")
            reader = reader.option(k if k.startswith("kafka.") else f"kafka.{k}", v)
        if args.max_offsets:
            reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets))
        query = (reader.load().writeStream.foreachBatch(batch)
                 .option("checkpointLocation", str(batch.checkpoint / "spark"))
                 .trigger(processingTime=f"{args.trigger} seconds").queryName(f"spark-apply-{cfg.name}").start())
        batch.state = "running"
        log.info("spark-apply %s: running (checkpoint %s)", cfg.name, batch.checkpoint)
        while not stop.is_set():
            if query.awaitTermination(1):
                break
            batch.progress = query_progress(query)
        failed = query.exception()
        if failed is not None:
            log.error("spark-apply %s: the query failed: %s", cfg.name, failed)
            batch.state, batch.failure = "failed", str(failed)[:2000]
            code = 1
    finally:
        if query is not None and query.isActive:
            query.stop()
        try:
            sender.close()
        finally:
            spark.stop()
    return code
