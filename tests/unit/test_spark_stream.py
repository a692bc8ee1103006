"""The streaming applier's micro-batch step (capturer/apply/spark_stream.py), without Spark: the
messages of a capturer's Kafka sender cut into batches at arbitrary offsets (a transaction's messages
spread over several batches), one batch replayed as Spark replays the batch it had not committed when
the driver was killed: every transaction reaches the sender whole, in order, once past what it holds."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from test_apply_regroup import assert_same_txn, interleave, messages, produce, workload

from capturer.apply.config import ApplyConfig
from capturer.apply.spark_stream import BatchApplier, default_pattern
from capturer.model import StreamKey, Txn, stream_key


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
