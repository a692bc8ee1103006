"""pymysql connections that share one TLS context and read in bigger pieces.

pymysql (2.x) tries TLS on every connection that has no TLS options of its own
("preferred": encrypted where the server offers it, certificate not checked) and
builds a new ``ssl.create_default_context()`` for each, which loads the system's
CA certificates: about 50 ms of CPU per connection, under the GIL. A region
opens several connections when it starts, and 16 regions or 8 MySQL workers
spent seconds there. ``connect`` behaves exactly as ``pymysql.connect`` but
builds that preferred-mode context once per process (an ``SSLContext`` is safe
to share between connections and threads); explicit TLS options still get a
context of their own.

It also reads the socket through a ``READ_BUFFER`` (256 KiB) buffer instead of
8 KiB: a binlog stream is a long run of packets, and with the small buffer each
rows event larger than it was one or more ``recv`` calls of its own, each of
which lets go of the GIL and waits to get it back from the other threads."""

from __future__ import annotations

import io
import threading
from typing import Any

import pymysql.connections

_lock = threading.Lock()
_preferred: Any = None


READ_BUFFER = 256 * 1024


class Connection(pymysql.connections.Connection):
    def connect(self, sock: Any = None) -> None:
        super().connect(sock)
        old: Any = getattr(self, "_rfile", None)
        if READ_BUFFER > io.DEFAULT_BUFFER_SIZE and old is not None:
            # the handshake and the session set-up are answered and read: nothing is
            # buffered in the old reader (the server sends nothing unasked)
            conn_sock: Any = self._sock
            self._rfile = conn_sock.makefile("rb", buffering=READ_BUFFER)
            old.close()

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        if sslp:  # TLS options given: pymysql's own context for them
            return super()._create_ssl_ctx(sslp)
        global _preferred
        with _lock:
            if _preferred is None:
                _preferred = super()._create_ssl_ctx(sslp)
            return _preferred


def connect(*args: Any, **kwargs: Any) -> Connection:
    """``pymysql.connect`` with the shared preferred-mode TLS context."""
    return Connection(*args, **kwargs)


def connect_utc(**kwargs: Any) -> Connection:
    """``connect``, then the session in UTC (TIMESTAMPs read as the binlog carries them)."""
    conn = connect(**kwargs)
    with conn.cursor() as cur:
        cur.execute("SET time_zone='+00:00'")
    return conn
