"""Store regions: each reads one source's log and yields committed transactions
in its own commit order, plus heartbeats, into a bounded queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import RegionConfig
    from .base import Region, RegionContext


def make_region(cfg: "RegionConfig", ctx: "RegionContext") -> "Region":
    if cfg.type in ("mysql", "mariadb"):
        from .mysql import MySQLRegion

        return MySQLRegion(cfg, ctx)
    raise ValueError(f"unknown region type {cfg.type!r}")
