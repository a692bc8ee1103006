"""URLs shown without the secrets they carry: a password (``user:password@host``) and
the query string's values (``?token=...``, ``?sig=...``: any of them can be a key, so
none is shown), and the same secrets scrubbed from any text (an exception's message,
a server's answer, a log line) that may repeat them."""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit, urlunsplit

MASK = "***"
#: shorter secrets are not scrubbed from free text (they would blank out common words)
MIN_SCRUBBED = 3


def shown(url: str) -> str:
    """``url`` without its password and with every query value replaced by ``***``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return MASK
    netloc = parts.netloc
    if parts.password is not None:
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{parts.username}:{MASK}@{host}" + (f":{port}" if port else "")
    query = parts.query
    if query:
        query = "&".join(f"{p.split('=', 1)[0]}={MASK}" if "=" in p else MASK for p in query.split("&") if p)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> list[str]:
    """The secrets ``url`` carries (its password, its query values), as written and decoded."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    out: list[str] = []
    if parts.password:
        out.append(parts.password)
    if parts.query:
        out.extend(v.split("=", 1)[1] if "=" in v else v for v in parts.query.split("&") if v)
        out.extend(v for _, v in parse_qsl(parts.query, keep_blank_values=True))
    return _forms(out)


def basic_secrets(url: str) -> list[str]:
    """The ``Authorization: Basic`` credentials a client makes of ``url``'s user:password."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    if parts.password is None:
        return []
    pair = f"{unquote(parts.username or '')}:{unquote(parts.password)}".encode()
    return _forms([base64.b64encode(pair).decode()])


def header_secrets(value: str) -> list[str]:
    """An ``Authorization`` value and its credentials part (``Bearer <token>``: the token)."""
    value = value.strip()
    parts = value.split(None, 1)
    return _forms([value] + ([parts[1]] if len(parts) == 2 else []))


def _forms(values: Iterable[str]) -> list[str]:
    out: set[str] = set()
    for v in values:
        for form in (v, unquote(v), quote(v, safe=""), quote_plus(v, safe="")):
            if len(form) >= MIN_SCRUBBED:
                out.add(form)
    return sorted(out, key=len, reverse=True)  # the longest first: a secret inside another one


def scrub(text: str, secrets: Iterable[str]) -> str:
    for s in secrets:
        if s in text:
            text = text.replace(s, MASK)
    return text


class _LogScrubber(logging.Filter):
    """Scrubs the registered secrets from the records of a library's loggers (urllib3
    logs each request's path and query at debug level)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = sorted(self.secrets, key=len, reverse=True)
        if secrets:
            msg = record.getMessage()
            clean = scrub(msg, secrets)
            if clean != msg:
                record.msg, record.args = clean, None
        return True


_SCRUBBER = _LogScrubber()
_LOGGERS = ("urllib3.connectionpool", "urllib3.connection", "urllib3.util.retry", "requests")


def keep_out_of_logs(secrets: Iterable[str]) -> None:
    """Never let the HTTP client's own log records show these."""
    with _SCRUBBER.lock:
        if not _SCRUBBER.secrets:
            for name in _LOGGERS:
                logging.getLogger(name).addFilter(_SCRUBBER)
        _SCRUBBER.secrets.update(secrets)
