"""The read-back's two passes (senders/kafka/client.py, ``ConfluentReadBack.last_records_of``).

A partition's end is known when a fetch comes back with nothing after it; such a fetch waits the
consumer's ``fetch.wait.max.ms``. The first pass waits ``READ_BACK_FAST_WAIT_MS`` (Apache Kafka answers
at once); a partition that gives the first pass nothing for ``READ_BACK_FAST_STALL`` s (a broker on slow
storage answers every short wait empty) is read again from its start with the client's default wait.

The consumers here are fakes (a broker that answers short fetches empty cannot be run here: Tansu on S3,
which did, is no longer the test broker); the real broker's path is covered by
tests/integration/test_kafka_read_back.py.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import KafkaError

from senders.kafka import client as kclient


class _Err:
    def __init__(self, code: int):
        self._code = code

    def code(self) -> int:
        return self._code

    def retriable(self) -> bool:
        return False


class _Msg:
    def __init__(self, topic: str, part: int, offset: int, eof: bool = False):
        self.t, self.p, self.off, self.eof = topic, part, offset, eof

    def error(self) -> Any:
        return _Err(KafkaError._PARTITION_EOF) if self.eof else None

    def topic(self) -> str:
        return self.t

    def partition(self) -> int:
        return self.p

    def headers(self) -> list[tuple[str, bytes]]:
        return [("offset", str(self.off).encode())]

    def value(self) -> bytes:
        return b"v"


class _Consumer:
    """Serves each assigned partition's messages from its start to ``ends[tp]``, then its EOF; a
    partition in ``silent`` gives nothing (a short fetch answered empty), one in ``stops_at`` stops
    giving anything after that offset."""

    def __init__(self, wait_ms: int | None, ends: dict[tuple[str, int], int], silent: set[tuple[str, int]],
                 stops_at: dict[tuple[str, int], int]):
        self.wait_ms, self.ends, self.silent, self.stops_at = wait_ms, ends, silent, stops_at
        self.assigned: dict[tuple[str, int], int] = {}
        self.queue: list[_Msg] = []
        self.closed = False

    def assign(self, tps: list[Any]) -> None:
        for tp in tps:
            key = (tp.topic, tp.partition)
            self.assigned[key] = tp.offset
            if key in self.silent:
                continue
            end = min(self.ends[key], self.stops_at.get(key, 1 << 62))
            self.queue += [_Msg(tp.topic, tp.partition, o) for o in range(tp.offset, end)]
            if key not in self.stops_at:
                self.queue.append(_Msg(tp.topic, tp.partition, end, eof=True))

    def poll(self, timeout: float) -> Any:
        if not self.queue:
            import time

            time.sleep(min(timeout, 0.01))
            return None
        return self.queue.pop(0)

    def consume(self, n: int, timeout: float) -> list[Any]:
        out, self.queue = self.queue[:n], self.queue[n:]
        return out

    def close(self) -> None:
        self.closed = True


def _reader(monkeypatch: pytest.MonkeyPatch, ends: dict[tuple[str, int], int], slow_storage: set[tuple[str, int]],
            stops_at: dict[tuple[str, int], int] | None = None) -> tuple[Any, list[_Consumer]]:
    made: list[_Consumer] = []

    def fresh(self: Any, fetch_wait_ms: int | None = None) -> _Consumer:
        # the broker on slow storage: a short wait answers those partitions empty; the default one serves them
        c = _Consumer(fetch_wait_ms, ends, slow_storage if fetch_wait_ms is not None else set(),
                      (stops_at or {}) if fetch_wait_ms is not None else {})
        made.append(c)
        return c

    monkeypatch.setattr(kclient.ConfluentReadBack, "_fresh", fresh)
    monkeypatch.setattr(kclient, "READ_BACK_FAST_STALL", 0.3)
    return kclient.ConfluentReadBack("127.0.0.1:9"), made


def _offset(rec: Any) -> int:
    return int(dict(rec[0])["offset"])


def test_the_first_pass_waits_short_and_reads_every_partition_of_a_quick_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    ends = {("a", 0): 10, ("a", 1): 4, ("b", 0): 7}
    rb, made = _reader(monkeypatch, ends, set())
    got, errors = rb.last_records_of({tp: max(e - 3, 0) for tp, e in ends.items()}, timeout=10)
    assert errors == {}
    assert {tp: _offset(r) for tp, r in got.items()} == {tp: e - 1 for tp, e in ends.items()}
    # one consumer, with the short fetch wait (the default 500 ms wait was paid at every read-back)
    assert [c.wait_ms for c in made] == [kclient.READ_BACK_FAST_WAIT_MS]
    assert kclient.READ_BACK_FAST_WAIT_MS < 100
    assert all(c.closed for c in made)


def test_a_partition_a_short_wait_never_serves_is_read_again_with_the_default_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ends = {("a", 0): 10, ("a", 1): 6, ("b", 0): 5}
    rb, made = _reader(monkeypatch, ends, slow_storage={("a", 1)})
    starts = {("a", 0): 8, ("a", 1): 2, ("b", 0): 0}
    got, errors = rb.last_records_of(starts, timeout=10)
    assert errors == {}
    assert {tp: _offset(r) for tp, r in got.items()} == {("a", 0): 9, ("a", 1): 5, ("b", 0): 4}
    assert [c.wait_ms for c in made] == [kclient.READ_BACK_FAST_WAIT_MS, None]
    assert made[1].assigned == {("a", 1): 2}  # only the slow partition, from its start


def test_a_partition_that_stops_in_the_first_pass_is_read_whole_by_the_second(monkeypatch: pytest.MonkeyPatch) -> None:
    # served up to offset 3, then nothing more to a short wait: its first-pass record (2) must not be kept
    # as its last one (the partition goes on to 8)
    ends = {("a", 0): 8, ("b", 0): 3}
    rb, made = _reader(monkeypatch, ends, set(), stops_at={("a", 0): 3})
    got, errors = rb.last_records_of({("a", 0): 0, ("b", 0): 1}, timeout=10)
    assert errors == {}
    assert {tp: _offset(r) for tp, r in got.items()} == {("a", 0): 7, ("b", 0): 2}
    assert made[1].assigned == {("a", 0): 0}


def test_a_partition_nothing_serves_gives_no_record_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    # silent to both waits (the second pass's stall is shortened too): no record, no error (the caller
    # steps back further), as a single pass did
    monkeypatch.setattr(kclient, "READ_BACK_STALL", 0.3)
    ends = {("a", 0): 8}
    made: list[_Consumer] = []

    def fresh(self: Any, fetch_wait_ms: int | None = None) -> _Consumer:
        c = _Consumer(fetch_wait_ms, ends, {("a", 0)}, {})
        made.append(c)
        return c

    monkeypatch.setattr(kclient.ConfluentReadBack, "_fresh", fresh)
    monkeypatch.setattr(kclient, "READ_BACK_FAST_STALL", 0.3)
    got, errors = kclient.ConfluentReadBack("127.0.0.1:9").last_records_of({("a", 0): 5}, timeout=10)
    assert got == {} and errors == {}
    assert len(made) == 2


def test_the_second_pass_gets_half_the_time_at_least(monkeypatch: pytest.MonkeyPatch) -> None:
    # the first pass reads a long partition for most of the read's time while another gives it nothing:
    # the second pass must still get time enough to read the slow one
    import time

    ends = {("a", 0): 40, ("b", 0): 5}
    timeouts: list[float] = []
    real = kclient.ConfluentReadBack._read_pass

    def read_pass(self: Any, starts: Any, timeout: float, patient: Any, wait: Any, stall: float) -> Any:
        timeouts.append(timeout)
        if wait is not None:
            time.sleep(0.9 * timeout)  # (most of the read's time spent on the long partition)
        return real(self, starts, timeout, patient, wait, stall)

    rb, made = _reader(monkeypatch, ends, slow_storage={("b", 0)})
    monkeypatch.setattr(kclient.ConfluentReadBack, "_read_pass", read_pass)
    got, errors = rb.last_records_of({("a", 0): 0, ("b", 0): 0}, timeout=4.0)
    assert errors == {}
    assert {tp: _offset(r) for tp, r in got.items()} == {("a", 0): 39, ("b", 0): 4}
    assert timeouts[0] == 4.0 and timeouts[1] >= 2.0
