"""Sender registry: the names used in senderConfig.cfg ``[global] type=``.

Sender modules are imported on first use; heavy clients (kafka, pyspark) are
imported inside their sender, not here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capturer.util.ini import Key
    from senders.base import Sender

_REGISTRY: dict[str, str] = {
    "local": "senders.local.sender:LocalSender",
    "mysql": "senders.mysql.sender:MySQLSender",
    "kafka": "senders.kafka.sender:KafkaSender",
    "spark": "senders.spark.sender:SparkSender",
}


# what ``verify`` reads each sender's destination with (capturer/ops/verify.py)
_VERIFY: dict[str, str] = {
    "local": "senders.local.verify:FileReader",
    "mysql": "senders.mysql.verify:MySQLTargetReader",
    "kafka": "senders.kafka.verify:KafkaReader",
    "spark": "senders.spark.verify:LakeReader",
}


def verify_reader(name: str, options: dict[str, Any], regions: list[tuple[str, str, str]]) -> Any:
    """The reader ``verify`` compares sender ``name``'s destination with (imported on use)."""
    mod, cls = _VERIFY[name].split(":")
    return getattr(importlib.import_module(mod), cls)(name, options, regions)


def verify_factories() -> dict[str, Any]:
    return dict.fromkeys(_VERIFY, verify_reader)


def known_senders() -> list[str]:
    return sorted(_REGISTRY)


def sender_class(name: str) -> type[Sender]:
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown sender {name!r}; known: {', '.join(known_senders())}") from None
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)


def sender_keys(name: str) -> list[Key]:
    """The keys of a sender's section: its own, and ``process`` that every sender takes."""
    from capturer.util.ini import Key, p_bool

    process = Key("process", p_bool, False, doc="true: the sender's work (messages, SQL, files) runs in a "
                  "process of its own, off the capturer's GIL (senders/process.py)")
    return list(sender_class(name).KEYS) + [process]


class Catalog:
    """The registry as the config loader sees it (``capturer.config.SenderCatalog``):
    names, and the keys each sender takes."""

    def names(self) -> list[str]:
        return known_senders()

    def keys(self, name: str) -> list[Key]:
        return sender_keys(name)

    def check(self, name: str, opts: dict[str, Any], where: Any) -> None:
        """A sender's checks across its keys at config time (its class's ``check_options(opts,
        where)``, where it has one; ``where(key)`` names file, line, section and key)."""
        fn = getattr(sender_class(name), "check_options", None)
        if fn is not None:
            fn(opts, where)


CATALOG = Catalog()
