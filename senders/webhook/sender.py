"""The webhook sender: each batch of whole transactions is one HTTP ``POST`` to
``url``, its body the changes as JSON lines (the file sender's format: one line per
row change, ``(region, commit_ts, seq)`` identifies each), acknowledged by a 2xx.

Contract with the receiver (docs/senders.md "Webhook"):

* headers: ``Content-Type: application/x-ndjson``; ``Idempotency-Key``, the same
  for every attempt at the same batch (a digest of the sender's name and the
  batch's first and last stream keys); ``X-Capturer-Position``, the stream key
  ``[commit_ts, region, sub]`` of the batch's last transaction, as JSON;
  ``X-Capturer-Rows`` and ``X-Capturer-Txns``; ``Authorization`` when
  ``auth_header`` is set.
* a 2xx means the batch is durable at the receiver; 408, 425, 429 and 5xx (and no
  answer within ``timeout``) are retried with capped exponential back-off
  (``Retry-After`` in seconds is honoured); any other answer stops the sender with
  the status and the start of the body (redirects are not followed: a POST must not
  turn into a GET).
* ``position_url`` (optional): a ``GET`` answering ``{"position": [commit_ts,
  region, sub]}`` (or ``{"position": null}``, or 404, for nothing yet) with the
  last position the receiver stored. At start, and before a failed batch is
  retried, the sender resumes after it: a receiver that stores each batch and its
  position atomically gets every change exactly once, even after a kill -9 between
  its answer and the capturer's checkpoint. Without it, delivery is at least once:
  a batch the receiver took just before a crash is posted again (the same
  changes; the receiver can drop them by their identity or by the batch's key
  when the batch is the same).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import threading
import time
from typing import Any, ClassVar
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from capturer.errors import ConfigError, SinkError
from capturer.model import StreamKey, Txn, key_from_json, stream_key
from capturer.util.ini import Key, p_bool, p_float, p_int, p_str
from capturer.util.urlsecrets import basic_secrets, header_secrets, keep_out_of_logs, scrub, shown, url_secrets
from senders.base import Sender
from senders.local.sender import txn_blocks_json

log = logging.getLogger(__name__)

RETRIED = frozenset({408, 425, 429})


def p_url(v: str) -> str:
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http:// or https:// URL with a host")
    return v


__all__ = ["WebhookSender", "batch_key", "shown"]

# the connection each thread has a request on (the deadline's watchdog shuts its socket down)
_IN_FLIGHT: dict[int, Any] = {}


class WebhookHTTPConnection(HTTPConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        _IN_FLIGHT[threading.get_ident()] = self
        super().request(*args, **kwargs)


class WebhookHTTPSConnection(HTTPSConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        _IN_FLIGHT[threading.get_ident()] = self
        super().request(*args, **kwargs)


class WebhookHTTPPool(HTTPConnectionPool):
    ConnectionCls = WebhookHTTPConnection


class WebhookHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = WebhookHTTPSConnection


class _Adapter(HTTPAdapter):
    """requests' adapter whose connections say which thread has a request on them."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": WebhookHTTPPool, "https": WebhookHTTPSPool}


class _Deadline:
    """``timeout`` for the whole request, answer and body included: requests' own timeout
    bounds each read, so a receiver that trickles a byte now and then would hold the sender
    forever. When it passes, the request's socket is shut down (the blocked read returns).
    Watched by one thread for every sender (``_WATCHDOG``): a timer thread a request cost
    half the posts per second of small batches."""

    def __init__(self, seconds: float):
        self.tid = threading.get_ident()
        self.at = time.monotonic() + seconds
        self.lock = threading.Lock()
        self.done = self.expired = False

    def __enter__(self) -> _Deadline:
        _IN_FLIGHT.pop(self.tid, None)
        _WATCHDOG.arm(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.done = True
        _WATCHDOG.disarm(self)
        _IN_FLIGHT.pop(self.tid, None)

    def cut(self) -> None:
        """End the request now (its timeout passed, or the sender stops)."""
        with self.lock:
            if self.done:
                return
            self.expired = True
            sock = getattr(_IN_FLIGHT.get(self.tid), "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _Watchdog:
    """Cuts the requests whose deadline passed (to within ``TICK`` seconds); sleeps while none waits."""

    TICK = 0.05

    def __init__(self) -> None:
        self.armed: dict[int, _Deadline] = {}
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def arm(self, d: _Deadline) -> None:
        self.armed[id(d)] = d
        if self.thread is None:
            with self.lock:
                if self.thread is None:
                    self.thread = threading.Thread(target=self._run, name="webhook-deadlines", daemon=True)
                    self.thread.start()
        if not self.wake.is_set():
            self.wake.set()

    def disarm(self, d: _Deadline) -> None:
        self.armed.pop(id(d), None)

    def _run(self) -> None:
        while True:
            if not self.armed:
                self.wake.wait()
                self.wake.clear()
                continue
            time.sleep(self.TICK)
            now = time.monotonic()
            for d in list(self.armed.values()):
                if now >= d.at:
                    self.armed.pop(id(d), None)
                    d.cut()


_WATCHDOG = _Watchdog()


def batch_key(sender: str, batch: list[Txn]) -> str:
    """The batch's idempotency key: the same for every attempt at the same transactions."""
    first, last = stream_key(batch[0]), stream_key(batch[-1])
    return hashlib.sha256(json.dumps([sender, list(first), list(last)]).encode()).hexdigest()[:32]


class WebhookSender(Sender):
    KEYS: ClassVar[list[Key]] = [
        Key("url", p_url, required=True, doc="where each batch is POSTed (http:// or https://)"),
        Key("position_url", p_str, "",
            doc="GET: the last position the receiver stored ({\"position\": [commit_ts, region, sub]}); the sender "
                "resumes after it (exactly once with a receiver that stores batch and position atomically). Empty: "
                "at least once"),
        Key("auth_header", p_str, "", secret=True, doc="the Authorization header's value (e.g. Bearer <token>)"),
        Key("timeout", p_float(0.1, 3600), 30.0, doc="seconds for one request (connect and answer)"),
        Key("batch_rows", p_int(1, 1_000_000), 1000, doc="rows per POST (a transaction is never split)"),
        Key("linger_ms", p_int(0, 60_000), 100, doc="wait this long for a batch to fill"),
        Key("max_backoff", p_float(0.1, 3600), 30.0, doc="the longest wait between retries (seconds)"),
        Key("tls_ca", p_str, "", doc="PEM file of the CA that signed the receiver's certificate; empty = system's"),
        Key("tls_verify", p_bool, True, doc="check the receiver's certificate and name (false: only for tests)"),
        Key("tls_cert", p_str, "", doc="PEM client certificate, for receivers that require one"),
        Key("tls_key", p_str, "", doc="PEM key of tls_cert"),
    ]

    def __init__(self, name: str, options: dict[str, Any], queue_rows: int = 100_000):
        super().__init__(name, options, queue_rows)
        self.url = str(options["url"])
        self.position_url = str(options["position_url"])
        self.timeout = float(options["timeout"])
        self.batch_rows = int(options["batch_rows"])
        self.linger = int(options["linger_ms"]) / 1000
        self.max_backoff = float(options["max_backoff"])
        self.posts = 0
        self.refused = 0  # answers that were retried (408/425/429/5xx, no answer)
        self._session: requests.Session | None = None
        self._waiting: tuple[float, str] | None = None  # (since, what) while a request waits for its answer
        self._deadline: _Deadline | None = None  # the request in hand's
        # what no error, status or log line may show: the URLs' passwords and query values, auth_header
        self._secrets = url_secrets(self.url) + url_secrets(self.position_url) + \
            header_secrets(str(options.get("auth_header") or "")) + basic_secrets(self.url) + \
            basic_secrets(self.position_url)
        self._secrets.sort(key=len, reverse=True)

    @staticmethod
    def check_options(opts: dict[str, Any], where: Any) -> None:
        if bool(opts["tls_cert"]) != bool(opts["tls_key"]):
            raise ConfigError(f"{where('tls_cert' if opts['tls_cert'] else 'tls_key')}: tls_cert and tls_key go "
                              "together (a client certificate)")
        if urlsplit(str(opts["url"])).password is not None and opts["auth_header"]:
            raise ConfigError(f"{where('auth_header')}: url has a user:password and auth_header is set: one of them "
                              "(the client would send the URL's as Basic and drop auth_header)")
        if opts["position_url"]:
            try:
                p_url(opts["position_url"])
            except ValueError as exc:
                raise ConfigError(f"{where('position_url')}: {exc}") from None

    # --- the contract -------------------------------------------------------
    def open(self) -> None:
        keep_out_of_logs(self._secrets)
        s = requests.Session()
        adapter = _Adapter()
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        s.headers["User-Agent"] = "binlog-capturer webhook sender"
        if self.options["auth_header"]:
            s.headers["Authorization"] = str(self.options["auth_header"])
        s.verify = str(self.options["tls_ca"]) if self.options["tls_ca"] else bool(self.options["tls_verify"])
        if self.options["tls_cert"]:
            s.cert = (str(self.options["tls_cert"]), str(self.options["tls_key"]))
        self._session = s

    def resume_key(self) -> StreamKey | None:
        if not self.position_url:
            return None
        r = self._request("GET", self.position_url, "reading the receiver's position", None, {})
        if r.status_code == 404:
            return None
        try:
            body = r.json()
            if isinstance(body, dict) and "position" not in body:
                # (e.g. a health endpoint's {"status": "ok"}: read as "nothing yet", every start would post
                # again what the receiver has, and exactly once would quietly be at least once)
                raise ValueError("no \"position\" in it")
            return key_from_json(body.get("position") if isinstance(body, dict) else body)
        except ValueError as exc:
            raise SinkError(self._scrub(f"sender {self.name}: {shown(self.position_url)} answered {r.text[:200]!r}: "
                                        f"expected {{\"position\": [commit_ts, region, sub]}} or "
                                        f"{{\"position\": null}} ({exc})"), retriable=False) from None

    def send(self, batch: list[Txn]) -> None:
        body = b"".join(block for t in batch for block in txn_blocks_json(t))
        rows = sum(len(t.changes) for t in batch)
        headers = {
            "Content-Type": "application/x-ndjson",
            "Idempotency-Key": batch_key(self.name, batch),
            "X-Capturer-Position": json.dumps(list(stream_key(batch[-1]))),
            "X-Capturer-Rows": str(rows),
            "X-Capturer-Txns": str(len(batch)),
        }
        self._request("POST", self.url, f"posting {len(batch)} transaction(s), {rows} row(s)", body, headers)
        self.posts += 1

    def stop(self) -> None:
        """Stop now, also when the receiver hangs: the request in hand is cut (its batch is
        not acknowledged), not waited for up to ``timeout``."""
        super().stop()
        deadline = self._deadline
        if deadline is not None:
            deadline.cut()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def status(self) -> dict[str, Any]:
        waiting = self._waiting
        st = super().status()
        return {**st, "last_error": self._scrub(st["last_error"]), "url": shown(self.url), "posts": self.posts,
                "refused": self.refused,
                # a receiver that hangs: how long the request in hand has waited for its answer
                "waiting_for": waiting[1] if waiting else None,
                "waiting_seconds": round(time.monotonic() - waiting[0], 1) if waiting else None}

    def _scrub(self, text: str) -> str:
        return scrub(text, self._secrets)

    # --- HTTP ---------------------------------------------------------------
    def _request(self, method: str, url: str, what: str, body: bytes | None, headers: dict[str, str]
                 ) -> requests.Response:
        if self._session is None:
            self.open()
        assert self._session is not None
        where = f"sender {self.name} ({method} {shown(url)})"
        self._waiting = (time.monotonic(), f"{method} {shown(url)}: {what}")
        try:
            with _Deadline(self.timeout) as deadline:
                self._deadline = deadline
                if self._stop.is_set():
                    deadline.cut()
                r = self._session.request(method, url, data=body, headers=headers, timeout=self.timeout,
                                          allow_redirects=False)
            if deadline.expired:
                # cut at the deadline after a status line: the client ended the headers at the connection's
                # end and made an answer of what it had read; the receiver never finished answering
                raise requests.exceptions.ReadTimeout("the whole-request deadline cut the answer")
        except requests.exceptions.SSLError as exc:
            if _tls_cut(exc) and not self._stop.is_set():
                self.refused += 1  # the receiver (or a proxy before it) closed the connection mid-handshake: retried
                raise SinkError(self._scrub(f"{where}: {what}: no answer (the connection was closed during the TLS "
                                            f"handshake: {_short(exc)})")) from None
            raise SinkError(self._scrub(f"{where}: TLS failed ({_short(exc)}): check tls_ca (and tls_cert, tls_key) "
                                        f"in [{self.name}]"), retriable=False) from None
        except requests.exceptions.RequestException as exc:
            if self._stop.is_set():  # (the batch is not acknowledged: the next start sends it again)
                raise SinkError(f"{where}: {what}: the capturer stops: the request was not answered") from None
            self.refused += 1
            if deadline.expired or isinstance(exc, requests.exceptions.ReadTimeout):
                raise SinkError(f"{where}: {what}: no whole answer within timeout = {self.timeout:g} s (the receiver "
                                "hangs or answers too slowly)") from None
            raise SinkError(self._scrub(f"{where}: {what}: no answer ({_short(exc)})")) from None
        finally:
            self._waiting = self._deadline = None
        code = r.status_code
        if 200 <= code < 300 or (method == "GET" and code == 404):
            return r
        text = self._scrub(" ".join(r.text[:200].split()))
        if code in RETRIED or code >= 500:
            self.refused += 1
            wait = _retry_after(r.headers.get("Retry-After"), self.max_backoff)
            raise SinkError(f"{where}: {what}: the receiver answered {code} {r.reason} ({text!r}); retrying", poll=wait)
        hint = {401: "check auth_header", 403: "check auth_header", 404: "check url",
                413: "the batch is too big for it: lower batch_rows"}.get(code, "")
        hint = f"; {hint} in [{self.name}]" if hint else ""
        if code == 413 and body is not None and headers.get("X-Capturer-Txns") == "1":
            hint = (f"; the batch is one transaction of {headers.get('X-Capturer-Rows')} row(s), {len(body):,} bytes, "
                    "never split (batch_rows does not cut it): raise the receiver's request size limit")
        raise SinkError(f"{where}: {what}: the receiver answered {code} {r.reason} ({text!r})"
                        + hint
                        + (f"; redirects are not followed: set url to where it points"
                           f" ({shown(self._scrub(r.headers.get('Location', '')))})" if 300 <= code < 400 else ""),
                        retriable=False)


_TLS_CUT = re.compile(r"UNEXPECTED_EOF_WHILE_READING|EOF occurred in violation of protocol|Connection reset by peer"
                      r"|timed out", re.I)


def _tls_cut(exc: BaseException) -> bool:
    """A TLS failure that is the connection's, not the configuration's: the peer closed it
    (or reset it, or was silent) during the handshake, as a receiver restarting or a proxy
    shedding load does. A certificate the CA does not sign, a name that does not match, a
    server that does not speak TLS, a refused client certificate stay fatal."""
    return bool(_TLS_CUT.search(str(exc)))


def _retry_after(value: str | None, cap: float) -> float | None:
    """``Retry-After`` in seconds (capped), or None to back off as usual. ``0`` backs off as
    usual too: taken as it is, a receiver answering ``503`` with ``Retry-After: 0`` for a
    while had the sender retry in a tight loop (no wait at all, the back-off never grew)."""
    if value and re.fullmatch(r"\d{1,6}", value.strip()) and int(value) > 0:
        return min(float(value), cap)
    return None


def _short(exc: BaseException) -> str:
    """The client's message, its root cause first (the socket's error: refused, reset, no such host)."""
    text = str(exc)
    cause = re.search(r"\[Errno -?\d+\] [^'\"()]+", text)
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{cause.group(0).strip()}: {text}" if cause else text
