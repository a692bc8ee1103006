"""The streaming applier's micro-batch step (capturer/apply/spark_stream.py), without Spark: the
messages of a capturer's Kafka sender cut into batches at arbitrary offsets (a transaction's messages
spread over several batches), one batch replayed as Spark replays the batch it had not committed when
the driver was killed: every transaction reaches the sender whole, in order, once past what it holds."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest
import requests
from test_apply_regroup import assert_same_txn, interleave, messages, produce, workload

from capturer.apply.config import ApplyConfig
from capturer.apply.spark_stream import BatchApplier, default_pattern, serve_status
from capturer.model import StreamKey, Txn, stream_key
from capturer.model.message import Msg


class FakeDelta:
    """Drops what it holds (as the Delta sender does per table, by stream key)."""

    def __init__(self) -> None:
        self.got: list[Txn] = []

    def send(self, txns: list[Txn]) -> None:
        for t in txns:
            if not self.got or stream_key(t) > stream_key(self.got[-1]):
                self.got.append(t)


def cfg(tmp: Path) -> Any:
    return ApplyConfig(tmp / "apply.cfg", "s", "127.0.0.1:9092", "txns", "json", "confluent", ("*.*",), "auto",
                       tmp / "senders.cfg", "127.0.0.1", 0, "stop", "dl", 1.0, 1000, 1000, "info", ())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_batches_cut_anywhere_and_a_replayed_batch_apply_every_transaction_once(tmp_path: Path, seed: int) -> None:
    txns = workload(seed)
    msgs = interleave(messages(produce(txns, "json")), random.Random(seed), replays=0)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(msgs)), 12))
    batches = [msgs[a:b] for a, b in zip([0, *cuts], [*cuts, len(msgs)])]
    sender = FakeDelta()
    replay = rng.randrange(1, len(batches))
    done: StreamKey | None = None
    for i, b in enumerate(batches):
        BatchApplier(cfg(tmp_path), sender, tmp_path).apply(b, i)
        if i == replay:  # the driver killed after the MERGEs, before Spark committed batch i: a new driver
            BatchApplier(cfg(tmp_path), sender, tmp_path).apply(b, i)
        got = [stream_key(t) for t in sender.got]
        assert done is None or not got or got[-1] >= done
        done = got[-1] if got else None
    assert [stream_key(t) for t in sender.got] == [stream_key(t) for t in txns]
    for want, got_txn in zip(txns, sender.got):
        assert_same_txn(want, got_txn)
    # the pending files: only the last two batches' are kept, the last holds nothing
    assert sorted(int(p.name) for p in (tmp_path / "pending").iterdir()) == [len(batches) - 2, len(batches) - 1]


def test_default_topics() -> None:
    assert default_pattern("capturer.txn") == "capturer\\..*"


class DeadLetters:
    """Records what the step copies to the dead-letter topic (the producer itself, the applier's Kafka
    client's ``dead_letter``, is the one ``capturer apply`` uses, tested there against a real broker)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str, int, int, str]] = []

    def dead_letter(self, topic: str, msg: Msg, why: str) -> None:
        self.got.append((topic, msg.topic, msg.partition, msg.offset, why))


def broken_workload(seed: int) -> tuple[list[Txn], list[Msg], tuple[str, int, int]]:
    """The workload's messages with one row message of a table broken (not JSON)."""
    txns = workload(seed)
    logs = messages(produce(txns, "json"))
    tp = next(tp for tp in sorted(logs) if tp[0] == "capturer.app.rich")
    victim = logs[tp][1]
    logs[tp][1] = Msg(victim.topic, victim.partition, victim.offset, victim.key, b"{not json", victim.headers)
    msgs = interleave(logs, random.Random(seed), replays=0)
    return txns, msgs, (victim.topic, victim.partition, victim.offset)


@pytest.mark.parametrize("seed", [4, 5])
def test_a_bad_message_goes_to_the_dead_letter_topic_once_and_its_transaction_applies(tmp_path: Path,
                                                                                     seed: int) -> None:
    """``on_bad_message = dead_letter``: the message is copied once, even while its transaction waits
    over several batches (it is held with the pending messages); every transaction reaches the sender,
    the victim's without that row; the status counts it."""
    txns, msgs, bad = broken_workload(seed)
    c = dataclasses.replace(cfg(tmp_path), on_bad_message="dead_letter")
    cut = msgs.index(next(m for m in msgs if (m.topic, m.partition, m.offset) == bad)) + 1
    # the bad message ends a batch, and its transaction's END comes later: held over batches
    rng = random.Random(seed)
    cuts = sorted({cut, *rng.sample(range(cut + 1, len(msgs)), 5)})
    batches = [msgs[a:b] for a, b in zip([0, *cuts], [*cuts, len(msgs)])]
    sender, dead = FakeDelta(), DeadLetters()
    step = BatchApplier(c, sender, tmp_path, dead)
    for i, b in enumerate(batches):
        step.apply(b, i)
    assert [g[1:4] for g in dead.got] == [bad] and dead.got[0][0] == "dl" and "does not decode" in dead.got[0][4]
    assert [stream_key(t) for t in sender.got] == [stream_key(t) for t in txns]
    assert sum(len(t.changes) for t in sender.got) == sum(len(t.changes) for t in txns) - 1
    st = step.snapshot()
    assert st["errors"]["bad_messages"] == 1 and st["errors"]["dead_letters"] == 1, st["errors"]
    assert st["applied"]["txns"] == len(txns) and st["applied"]["batches"] == len(batches)


def test_a_bad_message_stops_the_job_by_default(tmp_path: Path) -> None:
    _txns, msgs, bad = broken_workload(6)
    with pytest.raises(RuntimeError, match=rf"topic '{bad[0]}' partition {bad[1]} offset {bad[2]}: does not "
                                           r"decode.*on_bad_message=stop"):
        BatchApplier(cfg(tmp_path), FakeDelta(), tmp_path, DeadLetters()).apply(msgs, 0)


def test_the_status_port_serves_what_the_batches_did(tmp_path: Path) -> None:
    """``/status``, ``/metrics``, ``/health`` and the page of a running step, over HTTP on 127.0.0.1."""
    txns = workload(8)
    msgs = interleave(messages(produce(txns, "json")), random.Random(8), replays=0)
    sender = FakeDelta()
    step = BatchApplier(cfg(tmp_path), sender, tmp_path)
    half = len(msgs) // 2
    step.apply(msgs[:half], 0)
    server = serve_status(cfg(tmp_path), step)
    try:
        url = f"http://127.0.0.1:{server.port}"
        first = requests.get(f"{url}/status", timeout=10).json()
        assert first["kind"] == "spark-apply" and first["state"] == "running" and first["applied"]["batches"] == 1
        assert first["applied"]["txns"] == len(sender.got) < len(txns)
        assert first["applied"]["last"] == list(stream_key(sender.got[-1]))
        step.apply(msgs[half:], 1)
        st = requests.get(f"{url}/status", timeout=10).json()
        assert st["applied"]["txns"] == len(txns) and st["held_messages"] == 0
        assert st["applied"]["rows"] == sum(len(t.changes) for t in txns)
        assert st["last_batch"]["id"] == 1 and st["last_batch"]["messages"] == len(msgs) - half
        metrics = requests.get(f"{url}/metrics", timeout=10).text
        assert f"capturer_spark_apply_rows_total {float(st['applied']['rows'])}" in metrics, metrics
        assert requests.get(f"{url}/health", timeout=10).status_code == 200
        assert "spark-apply" in requests.get(url, timeout=10).text
        step.state, step.failure = "failed", "boom"
        assert requests.get(f"{url}/health", timeout=10).status_code != 200
    finally:
        server.stop()


def test_each_batch_logs_where_its_time_went_as_the_bench_reads_it(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """bench/spark_apply.py reads each batch's rows and seconds (read, regroup, merge, pending) from the
    applier's log line, formatted as ``spark-apply`` formats it."""
    import logging
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import spark_apply

    txns = workload(4)
    msgs = interleave(messages(produce(txns, "json")), random.Random(4), replays=0)
    sender = FakeDelta()
    with caplog.at_level(logging.INFO, logger="capturer.apply.spark_stream"):
        for i in range(0, len(msgs), 7):
            BatchApplier(cfg(tmp_path), sender, tmp_path).apply(msgs[i:i + 7], i // 7)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")  # (spark_apply_main's)
    lines = [fmt.format(r) for r in caplog.records if "batch" in r.getMessage()]
    parsed = [spark_apply.BATCH_LINE.search(line) for line in lines]
    assert lines and all(parsed), lines[:2]
    assert sum(int(m.group(5)) for m in parsed if m) == sum(len(t.changes) for t in txns) > 0
    assert all(float(m.group(g)) >= 0 for m in parsed if m for g in (6, 7, 8, 9))
