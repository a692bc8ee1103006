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
from pathlib import Path
from typing import Any

import pymysql.connections

from capturer.errors import ConfigError
from capturer.util.ini import Key, p_choice, p_str

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


# --- TLS to MySQL/MariaDB (a region, the MySQL sender, snapshots, verify) -------------------------------
SSL_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")
"""As the mysql client's ``--ssl-mode``: ``preferred`` (the default) encrypts where the server
offers TLS and checks nothing; ``required`` refuses a server without TLS; ``verify_ca`` also
checks the server's certificate against ``ssl_ca`` (the system's roots without it);
``verify_identity`` also checks that it names the host connected to."""


def tls_kwargs(mode: str, ca: str = "", cert: str = "", key: str = "") -> dict[str, Any]:
    """pymysql's connection arguments for ``mode`` (``SSL_MODES``) and the PEM files. pymysql
    refuses a server without TLS whenever TLS options are given (``required`` and stricter)."""
    if mode == "disabled":
        return {"ssl_disabled": True}
    out: dict[str, Any] = {}
    if cert:
        out["ssl_cert"] = cert
        if key:
            out["ssl_key"] = key
    if mode == "preferred":
        return out  # (with a client certificate pymysql asks for TLS: the server wants it then)
    if mode == "required":
        if ca:
            out["ssl_ca"] = ca
        out["ssl_verify_cert"] = False
        if not ca and not cert:
            out["ssl"] = {"check_hostname": False, "verify_mode": False}
        return out
    if ca:
        out["ssl_ca"] = ca
        out["ssl_verify_cert"] = True
        out["ssl_verify_identity"] = mode == "verify_identity"
        return out
    import ssl

    ctx = ssl.create_default_context()  # the system's roots
    ctx.check_hostname = mode == "verify_identity"
    if cert:
        ctx.load_cert_chain(cert, keyfile=key or None)
    return {"ssl": ctx}


def mariadb_tls_kwargs(mode: str, ca: str = "", cert: str = "", key: str = "") -> dict[str, Any]:
    """The same for MariaDB Connector/Python (the snapshot's reader)."""
    if mode == "disabled":
        return {}
    out: dict[str, Any] = {}
    if cert:
        out["ssl_cert"], out["ssl_key"] = cert, key
    if ca:
        out["ssl_ca"] = ca
    if mode != "preferred" or ca or cert:
        out["ssl"] = True
    if mode in ("verify_ca", "verify_identity"):
        out["ssl_verify_cert"] = True
    return out


def explain_tls(exc: BaseException, where: str, mode: str, ca: str) -> str | None:
    """A readable cause for a failed TLS handshake (naming the setting), or None when ``exc``
    is not one."""
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text.lower():
        if "IP address mismatch" in text or "Hostname mismatch" in text or "doesn't match" in text:
            return (f"{where}: TLS: the server's certificate does not name the host connected to (ssl_mode = {mode}; "
                    f"ssl_mode = verify_ca checks the CA only): {text}")
        return (f"{where}: TLS: the server's certificate is not signed by "
                + (f"ssl_ca = {ca}" if ca else "a CA the system trusts (set ssl_ca)") + f" (ssl_mode = {mode}): {text}")
    if "SSL" in text and ("WRONG_VERSION" in text or "UNEXPECTED_EOF" in text or "handshake" in text.lower()):
        return f"{where}: TLS handshake failed (ssl_mode = {mode}): {text}"
    if "requires SSL" in text or "secure transport" in text.lower():
        return f"{where}: the server accepts TLS connections only (require_secure_transport): set ssl_mode: {text}"
    code = exc.args[0] if getattr(exc, "args", None) else 0
    if code == 1045 and mode == "disabled":
        # (MariaDB answers a clear-text connection to a server that accepts TLS connections only so)
        return (f"{where}: {exc.args[1] if len(exc.args) > 1 else text}: with ssl_mode = disabled; if the server "
                "accepts TLS connections only (require_secure_transport = ON), it refuses clear text so: set "
                "ssl_mode (and ssl_ca)")
    return None


#: TLS to a MySQL/MariaDB server (a region's source, the MySQL sender's target): as the mysql client's options
SSL_KEYS = [
    Key("ssl_mode", p_choice(*SSL_MODES), "preferred",
        doc="TLS: disabled; preferred (where the server offers it, nothing checked); required; verify_ca (the "
            "server's certificate signed by ssl_ca, or the system's roots); verify_identity (and naming the host)"),
    Key("ssl_ca", p_str, "", doc="PEM file of the CA that signed the server's certificate"),
    Key("ssl_cert", p_str, "", doc="PEM file of a client certificate (mutual TLS; with ssl_key)"),
    Key("ssl_key", p_str, "", doc="PEM file of the client certificate's private key"),
]


def check_ssl_keys(ini: Any, section: str, v: dict[str, Any]) -> None:
    """The TLS keys of a section: files that exist, a certificate with its key."""
    if bool(v.get("ssl_cert")) != bool(v.get("ssl_key")):
        raise ConfigError(f"{ini.where(section, 'ssl_cert' if v.get('ssl_cert') else 'ssl_key')}: "
                          "ssl_cert and ssl_key go together (a client certificate for mutual TLS)")
    for k in ("ssl_ca", "ssl_cert", "ssl_key"):
        if v.get(k) and not Path(v[k]).expanduser().is_file():
            raise ConfigError(f"{ini.where(section, k)}: no such file: {v[k]}")
    if v.get("ssl_mode") == "disabled" and any(v.get(k) for k in ("ssl_ca", "ssl_cert", "ssl_key")):
        raise ConfigError(f"{ini.where(section, 'ssl_mode')}: ssl_mode = disabled, but TLS files are given")
