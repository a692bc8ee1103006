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
from capturer.errors import ConfigError, SinkError
from capturer.model import StreamKey
from capturer.model.message import Msg
from capturer.util.kafkasec import security_of
from senders import CATALOG, sender_class, stream_session_factory

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

    def before(self, batch_id: int) -> tuple[StreamKey | None, list[Msg]]:
        ids = [i for i in self._ids() if i < batch_id]
        if not ids:
            return None, []
        with open(self.dir / str(ids[-1]), "rb") as f:
            done, msgs = pickle.load(f)
        return done, msgs

    def write(self, batch_id: int, done: StreamKey | None, msgs: list[Msg]) -> None:
        tmp = self.dir / f".{batch_id}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump((done, msgs), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / str(batch_id))
        for i in self._ids():
            if i < batch_id - 1:  # the one before stays: a replay of this batch reads it
                (self.dir / str(i)).unlink(missing_ok=True)


class BatchApplier:
    """The ``foreachBatch`` function: regroup, hand whole transactions to the Delta sender, keep the rest."""

    def __init__(self, cfg: ApplyConfig, sender: Any, checkpoint: Path):
        self.cfg = cfg
        self.sender = sender
        self.pending = Pending(checkpoint)
        self.owns = owned_by(cfg.tables)
        self.untabled = cfg.untabled_ddl == "apply" or (cfg.untabled_ddl == "auto" and self.owns("\0any", "\0any"))
        self.txns = self.rows = self.batches = 0

    def apply(self, msgs: list[Msg], batch_id: int) -> None:
        done, held = self.pending.before(batch_id)
        seen = {(m.topic, m.partition, m.offset) for m in held}
        allm = held + [m for m in msgs if (m.topic, m.partition, m.offset) not in seen]
        allm.sort(key=lambda m: (m.topic != self.cfg.txn_topic, m.topic, m.partition, m.offset))
        reg = Regrouper(self.cfg.txn_topic, self.cfg.format, self.owns, untabled_ddl=self.untabled)
        reg.skip_through(done)
        for m in allm:
            try:
                reg.add(m)
            except BadMessage as exc:
                raise RuntimeError(f"spark-apply: a message that does not decode: {exc} (nothing after it applied)") \
                    from None
        ready = reg.ready()
        txns = [t for _, t in ready if t is not None]
        if txns:
            self.sender.send(txns)
        if ready:
            done = ready[-1][0]
            reg.done_through(done)
        start = reg.commit_offsets()
        keep = [m for m in allm if m.offset >= start.get((m.topic, m.partition), 1 << 62)]
        self.pending.write(batch_id, done, keep)
        self.batches += 1
        self.txns += len(txns)
        self.rows += sum(len(t.changes) for t in txns)
        log.info("spark-apply %s: batch %d: %d messages, %d transactions applied (%d rows), %d messages held "
                 "for incomplete transactions; applied through %s", self.cfg.name, batch_id, len(msgs), len(txns),
                 sum(len(t.changes) for t in txns), len(keep), done)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("topic", "partition", "offset", "key", "value", "headers").collect()
        msgs = [Msg(r["topic"], int(r["partition"]), int(r["offset"]),
                    None if r["key"] is None else bytes(r["key"]), None if r["value"] is None else bytes(r["value"]),
                    [(h["key"], b"" if h["value"] is None else bytes(h["value"])) for h in (r["headers"] or [])])
                for r in rows]
        self.apply(msgs, batch_id)


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
    deadline = time.monotonic() + 120
    while True:  # the lake's lock: a killed driver's JVM may still be exiting
        try:
            sender.open()
            break
        except SinkError as exc:
            if not exc.retriable or time.monotonic() > deadline or stop.is_set():
                spark.stop()
                print(f"error: {exc}", file=sys.stderr)
                return 1
            log.warning("spark-apply %s: %s", cfg.name, exc)
            time.sleep(1)
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
        batch = BatchApplier(cfg, sender, checkpoint)
        query = (reader.load().writeStream.foreachBatch(batch)
                 .option("checkpointLocation", str(checkpoint / "spark"))
                 .trigger(processingTime=f"{args.trigger} seconds").queryName(f"spark-apply-{cfg.name}").start())
        log.info("spark-apply %s: running (checkpoint %s)", cfg.name, checkpoint)
        while not stop.is_set():
            if query.awaitTermination(1):
                break
        failed = query.exception()
        if failed is not None:
            log.error("spark-apply %s: the query failed: %s", cfg.name, failed)
            code = 1
    finally:
        if query is not None and query.isActive:
            query.stop()
        try:
            sender.close()
        finally:
            spark.stop()
    return code
