"""A sender kind's descriptor: what the capturer, ``--check``, ``verify``, the applier
and ``start.sh`` know of a kind, all in its folder's ``__init__.py`` as ``KIND``.

A kind is one folder, ``senders/<kind>/``, reached by the name in senderConfig.cfg
``[global] type=``; ``senders/__init__.py`` maps that name to the folder (one line per
kind) and nothing else in the product names a kind. The descriptor holds dotted
paths, so naming it imports no client library:

* ``sender``: ``"module:Class"``, the ``Sender`` (its ``KEYS``, its optional
  ``check_options(opts, where)`` across keys);
* ``verify``: ``"module:Class"``, how ``python -m capturer verify`` reads the
  destination back (``""``: it cannot, and verify says so);
* ``check``: a module with ``offline(c: SenderCheck) -> list[str]`` (what a start
  finds only later: paths, files, libraries) and ``probe(c: SenderCheck) -> Probe``
  (``--connect``); ``""``: nothing to check beyond the config;
* ``consumer``: ``"module:function"``, ``make_consumer(client, servers, group,
  security, who, timeout, where)`` giving a reader of the kind's topics
  (``capturer.model.message.Consumer``: what an applier reads), or ``""``;
* ``stream_session``: ``"module:function"``, ``stream_session(options)`` giving the Spark session
  of a Structured Streaming applier writing the kind's tables (``python -m capturer spark-apply``),
  with the jars of Spark's Kafka source, or ``""``;
* ``extra(options)``: the ``setup.py`` extra the sender needs with these options
  (``start.sh`` installs it), or ``""``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


def _no_extra(options: Mapping[str, Any]) -> str:
    return ""


@dataclass(frozen=True)
class SenderKind:
    name: str
    sender: str
    verify: str = ""
    check: str = ""
    extra: Callable[[Mapping[str, Any]], str] = _no_extra
    consumer: str = ""
    stream_session: str = ""
    doc: str = ""  # one line: what it writes to
