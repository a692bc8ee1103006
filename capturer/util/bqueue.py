"""A bounded queue weighted by rows, so one region or sender cannot buffer without end."""

from __future__ import annotations

import collections
import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class Closed(Exception):
    """The queue was closed; no more items will come."""


class WeightedQueue(Generic[T]):
    """FIFO bounded by total weight. An item heavier than the capacity is let in
    when the queue is empty, so a huge transaction still passes (alone)."""

    def __init__(self, capacity: int):
        self.capacity = max(1, capacity)
        self._items: collections.deque[tuple[T, int]] = collections.deque()
        self._weight = 0
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: T, weight: int = 1, stop: threading.Event | None = None) -> None:
        weight = max(1, weight)
        with self._cond:
            while self._items and self._weight + weight > self.capacity and not self._closed:
                if stop is not None and stop.is_set():
                    raise Closed()
                self._cond.wait(0.2)
            if self._closed:
                raise Closed()
            self._items.append((item, weight))
            self._weight += weight
            self._cond.notify_all()

    def get(self, timeout: float | None = None) -> T | None:
        """Next item, or None after ``timeout``. Raises Closed once closed and drained."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._items:
                if self._closed:
                    raise Closed()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining if remaining is not None else 0.5)
            item, w = self._items.popleft()
            self._weight -= w
            self._cond.notify_all()
            return item

    def get_many(self, max_weight: int, timeout: float | None = None) -> list[T]:
        """Block for at least one item, then take more while under ``max_weight``."""
        first = self.get(timeout)
        if first is None:
            return []
        out = [first]
        with self._cond:
            taken = 0
            while self._items and taken + self._items[0][1] <= max_weight:
                item, w = self._items.popleft()
                self._weight -= w
                taken += w
                out.append(item)
            self._cond.notify_all()
        return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def weight(self) -> int:
        return self._weight
