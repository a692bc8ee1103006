"""Store regions: each reads one source's log and yields committed transactions
in its own commit order, plus heartbeats, into a bounded queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capturer.config import AnyRegionConfig
    from capturer.regions.base import Region, RegionContext


def make_region(cfg: AnyRegionConfig, ctx: RegionContext) -> Region:
    """The region of kind ``cfg.type``; CheckpointError when the checkpoint holds a
    position of another kind for it."""
    if getattr(cfg, "process", False):
        from capturer.regions.remote.worker import WorkerRegion

        return WorkerRegion(cfg, ctx)
    if cfg.type in ("mysql", "mariadb"):
        from capturer.model import Position
        from capturer.regions.base import require_start_kind

        require_start_kind(ctx, cfg.name, cfg.type, Position)
        from capturer.regions.mysql.region import MySQLRegion

        return MySQLRegion(cfg, ctx)  # type: ignore[arg-type]
    if cfg.type == "remote":
        from capturer.regions.remote.region import RemoteRegion

        return RemoteRegion(cfg, ctx)
    if cfg.type == "postgresql":
        from capturer.regions.postgresql.region import PostgresRegion

        return PostgresRegion(cfg, ctx)
    if cfg.type == "baikaldb":
        from capturer.regions.baikaldb.region import BaikalRegion

        return BaikalRegion(cfg, ctx)
    raise ValueError(f"unknown region type {cfg.type!r}")
