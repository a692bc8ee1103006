"""Sender registry: the names used in senderConfig.cfg ``[global] type=``, each the
folder of one kind (``senders/<kind>/``, its descriptor ``KIND`` in its
``__init__.py``: senders/kind.py says what one holds). Adding a kind is its folder
and one line here.

Descriptors are light: a kind's sender module, and its client library (kafka,
pyspark), is imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from capturer.util.dotted import kind_of, load
from capturer.util.ini import Key, p_bool
from senders.kind import SenderKind

if TYPE_CHECKING:
    from capturer.util.ini import Key
    from senders.base import Sender

_KINDS: dict[str, str] = {
    "local": "senders.local",
    "mysql": "senders.mysql",
    "kafka": "senders.kafka",
    "spark": "senders.spark",
    "webhook": "senders.webhook",
}


def known_senders() -> list[str]:
    return sorted(_KINDS)


def kind(name: str) -> SenderKind:
    """The descriptor of sender kind ``name`` (KeyError naming the known ones)."""
    k: SenderKind = kind_of(_KINDS, name, "sender")
    return k


def sender_class(name: str) -> type[Sender]:
    cls: type[Sender] = load(kind(name).sender)
    return cls


def verify_reader(name: str, options: dict[str, Any], regions: list[tuple[str, str, str]]) -> Any:
    """The reader ``verify`` compares sender ``name``'s destination with (imported on use)."""
    return load(kind(name).verify)(name, options, regions)


def verify_factories() -> dict[str, Any]:
    """``verify``'s reader factory per kind that can be read back."""
    return {n: verify_reader for n in known_senders() if kind(n).verify}


def consumer_factory(name: str) -> Any:
    """``make_consumer`` of sender kind ``name``'s topics (senders/kind.py ``consumer``):
    what an applier reads them with (imported on use); KeyError when the kind has none."""
    target = kind(name).consumer
    if not target:
        raise KeyError(f"sender kind {name!r} has no consumer of its output")
    return load(target)


def stream_session_factory(name: str) -> Any:
    """``stream_session(options)`` of sender kind ``name`` (senders/kind.py): the Spark session of a
    streaming applier into its tables (imported on use); KeyError when the kind has none."""
    target = kind(name).stream_session
    if not target:
        raise KeyError(f"sender kind {name!r} has no streaming applier")
    return load(target)


def extra(name: str, options: Mapping[str, Any]) -> str:
    """The setup.py extra sender ``name`` needs with these options ("" for none)."""
    return kind(name).extra(options)


def check_module(name: str) -> Any:
    """The kind's preflight checks (``offline``, ``probe``: senders/kind.py), or None."""
    target = kind(name).check
    return load(target) if target else None


def sender_keys(name: str) -> list[Key]:
    """The keys of a sender's section: its own, and ``process`` that every sender takes."""

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
