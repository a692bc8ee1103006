"""Store regions: each reads one source's log and yields committed transactions
in its own commit order, plus heartbeats, into a bounded queue.

The registry: ``[region:NAME] type =`` -> the folder of its kind
(``capturer/regions/<kind>/``, its descriptor ``KIND``: capturer/regions/kind.py
says what one holds). Adding a kind is its folder and one line here (and, until its
keys move into its folder, its keys in capturer/config.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capturer.regions.kind import RegionKind
from capturer.util.dotted import kind_of, load

if TYPE_CHECKING:
    from capturer.config import AnyRegionConfig
    from capturer.regions.base import Region, RegionContext

_KINDS: dict[str, str] = {
    "mysql": "capturer.regions.mysql",
    "mariadb": "capturer.regions.mysql",
    "postgresql": "capturer.regions.postgresql",
    "baikaldb": "capturer.regions.baikaldb",
    "remote": "capturer.regions.remote",
}


def kind(region_type: str) -> RegionKind:
    """The descriptor of region type ``region_type`` (ValueError naming the known ones)."""
    k: RegionKind = kind_of(_KINDS, region_type, "region type", ValueError)
    return k


def check_module(region_type: str) -> Any:
    """The kind's preflight checks (capturer/regions/kind.py), or None."""
    target = kind(region_type).check
    return load(target) if target else None


def make_region(cfg: AnyRegionConfig, ctx: RegionContext) -> Region:
    """The region of kind ``cfg.type``; CheckpointError when the checkpoint holds a
    position of another kind for it."""
    if getattr(cfg, "process", False):
        from capturer.regions.remote.worker import WorkerRegion

        return WorkerRegion(cfg, ctx)
    region: Region = load(kind(cfg.type).factory)(cfg, ctx)
    return region
