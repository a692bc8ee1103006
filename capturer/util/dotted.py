"""Objects named by dotted paths (``"package.module:name"``), as the kinds' descriptors
and registries name them (senders/__init__.py, capturer/regions/__init__.py): naming
a kind imports no client library, its module is imported on first use."""

from __future__ import annotations

import importlib
from typing import Any


def load(target: str) -> Any:
    """The object a ``"module:name"`` (or ``"module"``) path names, imported now."""
    mod, _, name = target.partition(":")
    m = importlib.import_module(mod)
    return getattr(m, name) if name else m


def kind_of(registry: dict[str, str], name: str, what: str, error: type[Exception] = KeyError) -> Any:
    """The descriptor (``KIND``) of the folder ``registry`` maps ``name`` to; ``error``
    naming the known ones for a name it does not have."""
    try:
        package = registry[name]
    except KeyError:
        raise error(f"unknown {what} {name!r}; known: {', '.join(sorted(registry))}") from None
    return importlib.import_module(package).KIND
