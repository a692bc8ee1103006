"""Store regions: each reads one source's log and yields committed transactions
in its own commit order, plus heartbeats, into a bounded queue.

The registry: ``[region:NAME] type =`` -> the folder of its kind
(``capturer/regions/<kind>/``, its descriptor ``KIND``: capturer/regions/kind.py
says what one holds). Adding a kind is its folder and one line here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from capturer.regions.kind import RegionKind
from capturer.util.dotted import kind_of, load

if TYPE_CHECKING:
    from capturer.regions.base import Region, RegionContext


class RegionSection(Protocol):
    """A ``[region:NAME]`` section's typed config (capturer/config.py), as seen here."""

    @property
    def type(self) -> str: ...


_KINDS: dict[str, str] = {
    "mysql": "capturer.regions.mysql",
    "mariadb": "capturer.regions.mysql",
    "baikaldb": "capturer.regions.baikaldb",
    "postgresql": "capturer.regions.postgresql",
    "remote": "capturer.regions.remote",
}

DEFAULT_TYPE = "mysql"  # a section without type =


def types(allow_agent: bool = True) -> list[str]:
    """The region types, in the order an error lists them; without the kinds an agent
    serves when ``allow_agent`` is false (an agent's own config)."""
    return [t for t in _KINDS if allow_agent or not kind(t).agent]


def kind(region_type: str) -> RegionKind:
    """The descriptor of region type ``region_type`` (ValueError naming the known ones)."""
    k: RegionKind = kind_of(_KINDS, region_type, "region type", ValueError)
    return k


def check_module(region_type: str) -> Any:
    """The kind's preflight checks (capturer/regions/kind.py), or None."""
    target = kind(region_type).check
    return load(target) if target else None


def make_region(cfg: RegionSection, ctx: RegionContext) -> Region:
    """The region of kind ``cfg.type``; CheckpointError when the checkpoint holds a
    position of another kind for it."""
    if getattr(cfg, "process", False):
        from capturer.regions.remote.worker import WorkerRegion

        return WorkerRegion(cfg, ctx)
    region: Region = load(kind(cfg.type).factory)(cfg, ctx)
    return region
