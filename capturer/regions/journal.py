"""A journal keyed by position: what a region must find again after a crash to
give a replayed stretch of its stream the same items (the clock's lifts, the
PostgreSQL region's relation definitions, the BaikalDB region's schema epochs).

Each kind says how an entry is written (``dump``) and read back (``parse``);
the file, its crash rules and its locking live here once. Region kinds reach it
through ``capturer.regions.base``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from capturer.util.durable import append_line, read_journal, rewrite_lines

K = TypeVar("K")
V = TypeVar("V")


#: high availability (capturer/ha): called after every durable ``put`` with the journal's path and all its
#: lines, under the journal's lock: the entry is in etcd before an item that depends on it leaves the region,
#: so that a standby replaying from the last checkpoint gives that item the same commit_ts. It waits while
#: etcd is unreachable and raises Fenced once this capturer lost its lease.
REPLICATE: Callable[[Path, list[str]], None] | None = None


class PositionJournal(Generic[K, V]):
    """``key -> value`` entries, each a JSON line of ``path`` (None: kept in memory only).

    Contract:

    * **Start.** The file is read when the journal is made. A torn last line (kill -9
      during an append: nothing that left the region refers to it) is skipped with a
      warning; any other bad line is a ``CheckpointError`` naming the file, the line
      and ``what``. A key written twice keeps its last value, in the place of its first.
    * **Append.** ``put`` writes the line and fsyncs it *before* it returns and before
      the entry is kept: an item that depends on the entry may leave the region once
      ``put`` has returned. Putting the value a key already has writes nothing.
    * **Prune.** ``forget`` forgets the entries its argument names (entries the
      checkpoint has passed: a region calls it from ``Region.checkpointed``) and
      rewrites the file atomically (temp file, fsync, rename), in the entries' order,
      only when something went.

    The region's thread puts while the app's checkpoint thread prunes: every method
    holds ``_lock``.
    """

    #: names the journal in errors ("corrupt <what>")
    what = "journal"

    def __init__(self, path: Path | None):
        self.path = path
        self._lock = threading.Lock()
        self._entries: dict[K, V] = dict(read_journal(path, self.parse, self.what))

    # --- a kind's line format ------------------------------------------------
    def parse(self, d: Any) -> tuple[K, V]:
        """``(key, value)`` from one line's JSON (KeyError / ValueError / TypeError when malformed)."""
        raise NotImplementedError

    def dump(self, key: K, value: V) -> dict[str, Any]:
        """The JSON object of one line; ``parse`` reads it back."""
        raise NotImplementedError

    # --- use -------------------------------------------------------------------
    def lookup(self, key: K) -> V | None:
        with self._lock:
            return self._entries.get(key)

    def items(self) -> list[tuple[K, V]]:
        """Every entry, in the order they were first written."""
        with self._lock:
            return list(self._entries.items())

    def put(self, key: K, value: V) -> bool:
        """Journal ``key -> value`` durably (see the class); False when it was already so."""
        with self._lock:
            if key in self._entries and self._entries[key] == value:
                return False
            if self.path is not None:
                append_line(self.path, json.dumps(self.dump(key, value)))
            self._entries[key] = value
            if REPLICATE is not None and self.path is not None:
                REPLICATE(self.path, [json.dumps(self.dump(k, v)) for k, v in self._entries.items()])
            return True

    def put_many(self, pairs: Iterable[tuple[K, V]]) -> int:
        """Journal several entries durably at once: their lines in one append and one
        fsync (the contract of ``put`` for each); returns how many were written."""
        with self._lock:
            todo = [(k, v) for k, v in pairs if not (k in self._entries and self._entries[k] == v)]
            if not todo:
                return 0
            if self.path is not None:
                append_line(self.path, "\n".join(json.dumps(self.dump(k, v)) for k, v in todo))
            for k, v in todo:
                self._entries[k] = v
            if REPLICATE is not None and self.path is not None:
                REPLICATE(self.path, [json.dumps(self.dump(k, v)) for k, v in self._entries.items()])
            return len(todo)

    def forget(self, stale: Callable[[Mapping[K, V]], Iterable[K]]) -> int:
        """Forget the keys ``stale`` names (it is called under the lock with every
        entry, so an entry put meanwhile is never judged on a stale view); returns
        how many went."""
        with self._lock:
            gone = [k for k in dict.fromkeys(stale(self._entries)) if k in self._entries]
            if not gone:
                return 0
            for k in gone:
                del self._entries[k]
            if self.path is not None:
                rewrite_lines(self.path, (json.dumps(self.dump(k, v)) for k, v in self._entries.items()))
            return len(gone)
