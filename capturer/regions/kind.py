"""A region kind's descriptor: what the capturer, ``--check``, ``verify`` and
``start.sh`` know of a kind, all in its folder's ``__init__.py`` as ``KIND``.

A kind is one folder, ``capturer/regions/<kind>/``, reached by the ``type =`` of a
``[region:NAME]`` section; ``capturer/regions/__init__.py`` maps each type to its
folder (one line per type). The descriptor holds dotted paths, so naming it imports
no client library:

* ``factory``: ``"module:Class"``, the region (``Class(cfg, ctx)``; it refuses a
  checkpoint position of another kind);
* ``check``: a module with ``probe(c: RegionCheck) -> Probe`` (``--connect``), and
  optionally ``offline(c) -> list[str]`` (files the section names; ``c.region`` is
  None there) and ``refusals(c) -> list[str]`` (what a start refuses that building
  the region does not find);
* ``verify``: ``"module:function"``, ``function(cfg)`` giving ``verify``'s reader of
  the source (a ``capturer.util.compare.SqlSource``), or ``""`` with ``no_verify``
  saying why verify cannot read it;
* ``keys``, ``parse``, ``claim``: ``"module:name"`` of the kind's ``[region:NAME]``
  keys (a list of ``capturer.util.ini.Key``), ``parse(ini, section, name)`` giving its
  typed config, and ``claim(cfg, ids, path)`` refusing (ConfigError) a second region
  that reads the same source (``ids``: what earlier regions read -> their name);
* ``agent``: a region served by a region agent (an agent's own config refuses it);
* ``extra``: the ``setup.py`` extra the kind needs (``start.sh`` installs it);
* ``journal``: the kind keeps a journal next to the checkpoint
  (``<checkpoint>.<type>.<region>``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RegionKind:
    name: str
    factory: str
    check: str = ""
    verify: str = ""
    no_verify: str = ""  # why verify cannot read this kind's source
    keys: str = ""
    parse: str = ""
    claim: str = ""
    agent: bool = False
    extra: str = ""
    journal: bool = False
