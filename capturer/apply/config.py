"""``conf/apply.cfg``: an applier's settings (``[global]``), and its senders in a
senderConfig.cfg of the capturer's style (``[global] type=mysql,local,spark`` and a
section per sender). Parsed once; every problem a ConfigError naming file, line,
section and key."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.apply.regroup import owned_by
from capturer.config import SenderCatalog, SenderConfig, load_sender_config
from capturer.errors import ConfigError
from capturer.util.ini import Key, p_choice, p_float, p_int, p_names, p_nonempty, p_str, parse_section, read_ini
from capturer.util.kafkasec import SECURITY_KEYS, check_security, security_of

APPLY_SENDERS = ("mysql", "local", "spark")
"""The senders an applier drives (Kafka to Kafka is the broker's own job: MirrorMaker)."""

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def p_name(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError("expected 1-64 of A-Z a-z 0-9 _ . -")
    return v


KEYS = [
    Key("name", p_name, "applier", doc="this applier's name: its consumer group is capturer-apply-<name>, and "
        "its senders keep their positions under <name>.<sender> (two appliers into one target need two names)"),
    Key("servers", p_nonempty, required=True, doc="Kafka bootstrap servers host:port[,host:port]"),
    Key("txn_topic", p_nonempty, required=True,
        doc="the capturer Kafka sender's txn_topic (BEGIN/END/DDL records): the order of the stream"),
    Key("format", p_choice("json", "protobuf"), "json", doc="the capturer Kafka sender's format"),
    Key("client", p_choice("kafka-python", "confluent"), "kafka-python"),
    Key("tables", p_names, ["*.*"], doc="db.table patterns (* ?) this applier applies; every other table is "
        "another applier's (scale-out by table); backticks quote a part holding dots or commas (`` for a backtick)"),
    Key("untabled_ddl", p_choice("auto", "apply", "skip"), "auto",
        doc="DDL that names no table (CREATE/DROP DATABASE): apply or skip; auto = apply when tables is *.* "
            "(appliers that split one database's tables need its CREATE DATABASE: set apply)"),
    Key("senderConfig", p_nonempty, "./conf/applySender.cfg", doc="the senders this applier drives"),
    Key("httpPort", p_int(0, 65535), 8090, doc="status port; 0 = pick a free port, see the log"),
    Key("httpHost", p_nonempty, "127.0.0.1", doc="status bind address"),
    Key("on_bad_message", p_choice("stop", "dead_letter"), "stop",
        doc="a message that does not decode: stop (exit 1, nothing after it applied) or dead_letter (copied to "
            "dead_letter_topic with the error, its row left out, the rest goes on)"),
    Key("dead_letter_topic", p_str, "capturer.apply.dead_letter"),
    Key("commitInterval", p_float(0.1, 3600), 3.0, doc="seconds between consumer-offset commits"),
    Key("queueRows", p_int(1, 10_000_000), 100_000, doc="rows buffered per sender"),
    Key("maxBufferedRows", p_int(1000, 100_000_000), 1_000_000,
        doc="rows of incomplete transactions held in memory before table partitions read ahead are paused"),
    Key("logLevel", p_choice("debug", "info", "warning", "error"), "info"),
    # SASL and TLS to Kafka, as the capturer's [kafka] sender (capturer/util/kafkasec.py): the consumer and
    # the dead-letter producer
    *SECURITY_KEYS,
]


@dataclass(frozen=True)
class ApplyConfig:
    path: Path
    name: str
    servers: str
    txn_topic: str
    format: str
    client: str
    tables: tuple[str, ...]
    untabled_ddl: str
    sender_config_path: Path
    http_host: str
    http_port: int
    on_bad_message: str
    dead_letter_topic: str
    commit_interval: float
    queue_rows: int
    max_buffered_rows: int
    log_level: str
    senders: tuple[SenderConfig, ...]
    security: dict[str, Any] = field(default_factory=dict)  # SECURITY_KEYS: SASL and TLS to Kafka

    @property
    def group(self) -> str:
        return f"capturer-apply-{self.name}"

    def masked(self) -> dict[str, Any]:
        return {"name": self.name, "servers": self.servers, "txn_topic": self.txn_topic, "format": self.format,
                "client": self.client, "tables": list(self.tables), "http": f"{self.http_host}:{self.http_port}",
                "on_bad_message": self.on_bad_message,
                **{k: ("***" if k == "sasl_password" and v else v) for k, v in self.security.items()
                   if v != security_of({})[k]},
                "senders": {s.name: {k: ("***" if k in s.secret and v else v) for k, v in s.options.items()}
                            for s in self.senders}}


class _ApplyCatalog:
    """The sender registry, narrowed to what an applier drives."""

    def __init__(self, inner: SenderCatalog):
        self.inner = inner

    def names(self) -> list[str]:
        return [n for n in self.inner.names() if n in APPLY_SENDERS]

    def keys(self, name: str) -> list[Key]:
        return list(self.inner.keys(name))

    def check(self, name: str, opts: dict[str, Any], where: Any) -> None:
        check = getattr(self.inner, "check", None)
        if check is not None:
            check(name, opts, where)


def load_apply_config(path: Path | str, catalog: SenderCatalog, base_dir: Path | None = None) -> ApplyConfig:
    """``base_dir``: what a relative senderConfig is relative to (the working directory, as
    the capturer's config)."""
    path = Path(path)
    ini = read_ini(path)
    for name, sec in ini.sections.items():
        if name != "global":
            raise ConfigError(f"{path}:{sec.line}: unknown section [{name}]; an applier's config has [global] only "
                              "(its senders are in senderConfig)")
    if "global" not in ini.sections:
        raise ConfigError(f"{path}: missing section [global]")
    g = parse_section(ini, "global", KEYS)
    sp = Path(g["senderConfig"])
    sp = sp if sp.is_absolute() else (base_dir or Path.cwd()) / sp
    if g["on_bad_message"] == "dead_letter" and not g["dead_letter_topic"]:
        raise ConfigError(f"{ini.where('global', 'dead_letter_topic')}: on_bad_message=dead_letter needs a topic")
    check_security(g, lambda key: ini.where("global", key))
    try:
        owned_by(g["tables"])
    except ValueError as exc:
        raise ConfigError(f"{ini.where('global', 'tables')}: {exc}") from None
    senders = load_sender_config(sp, _ApplyCatalog(catalog))
    return ApplyConfig(path, g["name"], g["servers"], g["txn_topic"], g["format"], g["client"], tuple(g["tables"]),
                       g["untabled_ddl"], sp, g["httpHost"], g["httpPort"], g["on_bad_message"], g["dead_letter_topic"],
                       g["commitInterval"], g["queueRows"], g["maxBufferedRows"], g["logLevel"], senders,
                       security_of(g))
