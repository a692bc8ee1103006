"""SASL and TLS for every Kafka client we ship: the sender's producer, admin client and
read-back consumer, the applier's consumer and dead-letter producer, ``verify``'s reader
and ``--check --connect``'s probe. One set of keys (``SECURITY_KEYS``, in the sender's
``[kafka]`` section and the applier's ``[global]``), checked once at config time
(``check_security``), mapped here to each library's settings (``kafka_python_conf``,
``librdkafka_conf``), and the two failures retrying cannot mend, a refused login and a
certificate the CA did not sign, explained naming the setting (``explain``).

Nothing here imports a Kafka library."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from capturer.errors import ConfigError
from capturer.util.ini import Key, p_bool, p_str

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _p_upper(*choices: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        up = v.strip().upper().replace("_", "-") if "SCRAM" in v.upper() else v.strip().upper()
        if up not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return up

    return parse


SECURITY_KEYS = [
    Key("security_protocol", _p_upper(*PROTOCOLS), "PLAINTEXT",
        doc="PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (SASL over TLS: MSK, Confluent Cloud, Aiven)"),
    Key("sasl_mechanism", _p_upper(*MECHANISMS), "PLAIN", doc="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL_*)"),
    Key("sasl_username", p_str, "", doc="SASL user (an API key on Confluent Cloud)"),
    Key("sasl_password", p_str, "", secret=True, doc="SASL password (an API secret on Confluent Cloud)"),
    Key("ssl_ca", p_str, "", doc="PEM file of the CA that signed the brokers' certificates (SSL, SASL_SSL); "
        "empty = the system's roots"),
    Key("ssl_cert", p_str, "", doc="PEM file of a client certificate (mutual TLS; with ssl_key)"),
    Key("ssl_key", p_str, "", doc="PEM file of the client certificate's private key (unencrypted)"),
    Key("ssl_check_hostname", p_bool, True, doc="check that the broker's certificate names the host connected to"),
]
SECURITY_KEY_NAMES = tuple(k.name for k in SECURITY_KEYS)


def security_of(opts: dict[str, Any]) -> dict[str, Any]:
    """The security keys of a section's options (defaults where absent)."""
    return {k.name: opts.get(k.name, k.default) for k in SECURITY_KEYS}


def _tls(opts: dict[str, Any]) -> bool:
    return str(opts.get("security_protocol") or "PLAINTEXT") in ("SSL", "SASL_SSL")


def _sasl(opts: dict[str, Any]) -> bool:
    return str(opts.get("security_protocol") or "PLAINTEXT").startswith("SASL_")


def check_security(opts: dict[str, Any], where: Callable[[str], str]) -> None:
    """ConfigError (``where(key)`` names file, line, section and key) for settings that cannot work:
    a certificate without its key, a file that does not exist, SASL without a user or password,
    TLS files or SASL credentials given with a protocol that does not use them."""
    s = security_of(opts)
    if bool(s["ssl_cert"]) != bool(s["ssl_key"]):
        k = "ssl_cert" if s["ssl_cert"] else "ssl_key"
        raise ConfigError(f"{where(k)}: ssl_cert and ssl_key go together (a client certificate for mutual TLS)")
    for k in ("ssl_ca", "ssl_cert", "ssl_key"):
        if s[k] and not Path(s[k]).expanduser().is_file():
            raise ConfigError(f"{where(k)}: no such file: {s[k]}")
    proto = s["security_protocol"]
    if not _tls(s):
        given = [k for k in ("ssl_ca", "ssl_cert", "ssl_key") if s[k]]
        if given:
            raise ConfigError(f"{where(given[0])}: security_protocol = {proto} does not use TLS: set "
                              "security_protocol = SSL or SASL_SSL, or remove the TLS files")
    if _sasl(s):
        if not s["sasl_username"]:
            raise ConfigError(f"{where('sasl_username')}: security_protocol = {proto} needs sasl_username")
        if not s["sasl_password"]:
            raise ConfigError(f"{where('sasl_password')}: security_protocol = {proto} needs sasl_password")
    elif s["sasl_username"] or s["sasl_password"]:
        raise ConfigError(f"{where('sasl_username' if s['sasl_username'] else 'sasl_password')}: "
                          f"security_protocol = {proto} does not use SASL: set security_protocol = SASL_SSL "
                          "(or SASL_PLAINTEXT), or remove the SASL credentials")


def kafka_python_conf(opts: dict[str, Any]) -> dict[str, Any]:
    """kafka-python's keyword arguments (KafkaProducer, KafkaConsumer, KafkaAdminClient)."""
    s = security_of(opts)
    proto = s["security_protocol"]
    out: dict[str, Any] = {"security_protocol": proto}
    if _sasl(s):
        out.update(sasl_mechanism=s["sasl_mechanism"], sasl_plain_username=s["sasl_username"],
                   sasl_plain_password=s["sasl_password"])
    if _tls(s):
        out["ssl_check_hostname"] = bool(s["ssl_check_hostname"])
        if s["ssl_ca"]:
            out["ssl_cafile"] = str(Path(s["ssl_ca"]).expanduser())
        if s["ssl_cert"]:
            out["ssl_certfile"] = str(Path(s["ssl_cert"]).expanduser())
            out["ssl_keyfile"] = str(Path(s["ssl_key"]).expanduser())
    return out


def librdkafka_conf(opts: dict[str, Any]) -> dict[str, Any]:
    """confluent-kafka's (librdkafka's) settings (Producer, Consumer, AdminClient)."""
    s = security_of(opts)
    proto = s["security_protocol"]
    out: dict[str, Any] = {"security.protocol": proto.lower()}
    if _sasl(s):
        out.update({"sasl.mechanisms": s["sasl_mechanism"], "sasl.username": s["sasl_username"],
                    "sasl.password": s["sasl_password"]})
    if _tls(s):
        out["ssl.endpoint.identification.algorithm"] = "https" if s["ssl_check_hostname"] else "none"
        if s["ssl_ca"]:
            out["ssl.ca.location"] = str(Path(s["ssl_ca"]).expanduser())
        if s["ssl_cert"]:
            out["ssl.certificate.location"] = str(Path(s["ssl_cert"]).expanduser())
            out["ssl.key.location"] = str(Path(s["ssl_key"]).expanduser())
    return out


def explain(text: str, who: str, opts: dict[str, Any], where: str = "") -> str | None:
    """A readable cause naming the setting, for a client error (``text``) that is a refused SASL
    login or a TLS certificate check that failed; None for anything else. ``who`` names the client
    ("sender kafka", "applier a1"; "": none, a caller says it), ``where`` its settings ("[kafka] of
    FILE")."""
    s = security_of(opts)
    low = text.lower()
    at = f" in {where}" if where else ""
    who = f"{who}: " if who else ""
    if "authentication failed" in low or "authenticationfailed" in low or "invalid credentials" in low \
            or "authentication error" in low or "saslauthenticationfailed" in low:
        return (f"{who}Kafka refused the SASL login of sasl_username = {s['sasl_username']!r} "
                f"(sasl_mechanism = {s['sasl_mechanism']}): check sasl_password{at} (and sasl_username, "
                f"sasl_mechanism); retrying cannot help: {text}")
    if "certificate verify failed" in low or "certificate_verify_failed" in low:
        if "hostname" in low or "ip address mismatch" in low or "doesn't match" in low:
            return (f"{who}TLS: the broker's certificate does not name the host connected to "
                    f"(ssl_check_hostname = true{at}): {text}")
        ca = f"ssl_ca = {s['ssl_ca']}" if s["ssl_ca"] else "a CA the system trusts (set ssl_ca)"
        return f"{who}TLS: the broker's certificate is not signed by {ca}{at}: {text}"
    if _tls(s) and ("wrong_version_number" in low or "wrong version number" in low):
        return (f"{who}TLS handshake failed: is the listener at servers a TLS one (security_protocol = "
                f"{s['security_protocol']}{at})? {text}")
    return None


def masked(opts: dict[str, Any]) -> dict[str, Any]:
    """The security keys for a log or a status page: the password as ***."""
    s = security_of(opts)
    if s["sasl_password"]:
        s["sasl_password"] = "***"
    return s


class Watch:
    """What a client said went wrong, to explain a failure that its exception does not (kafka-python
    answers a refused login with "Unable to bootstrap", librdkafka with "Broker transport failure"):
    librdkafka's ``error_cb`` (pass the Watch itself; served by ``poll``), kafka-python's log records
    (``with watch.kafka_python():``)."""

    def __init__(self) -> None:
        self.texts: deque[str] = deque(maxlen=32)
        self.lock = threading.Lock()

    def __call__(self, err: Any) -> None:  # librdkafka's error_cb
        with self.lock:
            self.texts.append(str(err))

    def explain(self, who: str, opts: dict[str, Any], exc: BaseException | str | None = None,
                where: str = "") -> str | None:
        """The first explained cause among ``exc`` and what the client said (the newest first)."""
        with self.lock:
            texts = list(self.texts)
        for t in ([str(exc)] if exc is not None else []) + texts[::-1]:
            why = explain(t, who, opts, where)
            if why is not None:
                return why
        return None

    @contextlib.contextmanager
    def kafka_python(self, quiet: bool = False) -> Iterator[Watch]:
        """kafka-python's log records (errors and warnings) go to the watch too while inside;
        ``quiet``: only to the watch (a probe that says the outcome once)."""
        watch = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    watch(record.getMessage())
                except Exception:
                    pass

        logger = logging.getLogger("kafka")
        handler = _Handler(logging.WARNING)
        level, propagate = logger.level, logger.propagate
        logger.addHandler(handler)
        if quiet:
            logger.propagate = False
        if quiet or logger.getEffectiveLevel() > logging.WARNING:
            logger.setLevel(logging.WARNING)
        try:
            yield self
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
