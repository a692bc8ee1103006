"""One connection per thread, and every one of them closed at the end.

``verify`` computes chunk checksums in a thread pool, one query per server at once;
a DB-API connection must not be shared between threads, and a thread-local one
alone would be left to the garbage collector when the pool's threads end."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class PerThread:
    def __init__(self, connect: Callable[[], Any]):
        self._connect = connect
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[Any] = []

    def get(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
            self._local = threading.local()
        for conn in conns:
            try:
                conn.close()
            except Exception:
                pass
