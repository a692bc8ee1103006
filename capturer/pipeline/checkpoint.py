"""The checkpoint file: how far every sender has acknowledged, and where each
region resumes.

``commit_ts`` is the newest commit_ts at or below which *every* sender
acknowledged everything: all transactions at or below it, in merged order, are
durable in every destination. ``regions[name]`` is the position just after that
region's last item every sender acknowledged, and ``region_ts[name]`` that
item's commit_ts: the region's clock resumes above it, so a transaction read
again gets the commit_ts it had (two regions can share a commit_ts, so the
global ``commit_ts`` can be below a region's own). A restart reads each region
from its position, so nothing is lost; transactions after it may be delivered
again, with the same ``(region, commit_ts, seq)``.

The file is JSON, written atomically (temp file, fsync, rename, fsync of the
directory) and never moves backwards. A missing file means "first start"; an
unreadable or corrupt one stops start-up: it is never silently reset to 0.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.errors import CheckpointError
from capturer.model import AnyPosition, position_from_json, ts_physical_ms
from capturer.util import failpoints

VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    commit_ts: int = 0
    regions: dict[str, AnyPosition] = field(default_factory=dict)
    region_ts: dict[str, int] = field(default_factory=dict)  # commit_ts of each region's item at its position

    def floor(self, region: str) -> int:
        """What the region's commit_ts must stay above after a restart (a checkpoint
        written before region_ts existed: the global commit_ts, as then)."""
        return self.region_ts.get(region, self.commit_ts)

    def to_json(self) -> dict[str, Any]:
        ms = ts_physical_ms(self.commit_ts)
        return {
            "version": VERSION,
            "commit_ts": self.commit_ts,
            "commit_time": (
                dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat() if ms else None
            ),
            "regions": {r: getattr(p, "checkpoint_json", p.to_json)() for r, p in sorted(self.regions.items())},
            "region_ts": dict(sorted(self.region_ts.items())),
            "written_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        }


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A key given twice (a hand edit gone wrong) makes the file ambiguous."""
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            raise ValueError(f"key {k!r} appears twice")
        seen.add(k)
    return dict(pairs)


def load_checkpoint(path: Path) -> Checkpoint | None:
    """None if the file does not exist; CheckpointError if it cannot be trusted."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint: {exc}") from exc
    hint = (
        "fix or restore the file; to deliberately start over, delete it "
        "(regions then start from their 'start' setting)"
    )
    try:
        d = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: checkpoint is not valid JSON ({exc}); {hint}") from None
    except RecursionError:  # garbage nested thousands deep
        raise CheckpointError(f"{path}: checkpoint is not valid JSON (nested too deeply); {hint}") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: checkpoint must be a JSON object; {hint}")
    if d.get("version") != VERSION:
        raise CheckpointError(f"{path}: unsupported checkpoint version {d.get('version')!r}; {hint}")
    ts = d.get("commit_ts")
    if not isinstance(ts, int) or isinstance(ts, bool) or ts < 0 or ts >= 1 << 63:
        raise CheckpointError(f"{path}: 'commit_ts' must be a non-negative 64-bit integer; {hint}")
    regions_raw = d.get("regions")
    if not isinstance(regions_raw, dict):
        raise CheckpointError(f"{path}: 'regions' must be an object; {hint}")
    regions = {}
    for name, pos in regions_raw.items():
        try:
            regions[name] = position_from_json(pos)
        except ValueError as exc:
            raise CheckpointError(f"{path}: regions.{name}: {exc}; {hint}") from None
    rts_raw = d.get("region_ts", {})
    if not isinstance(rts_raw, dict):
        raise CheckpointError(f"{path}: 'region_ts' must be an object; {hint}")
    region_ts = {}
    for name, v in rts_raw.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v >= 1 << 63:
            raise CheckpointError(f"{path}: region_ts.{name} must be a non-negative 64-bit integer; {hint}")
        region_ts[name] = v
    return Checkpoint(ts, regions, region_ts)


def save_checkpoint(path: Path, cp: Checkpoint) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(cp.to_json(), indent=2) + "\n").encode()
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    failpoints.hit("checkpoint.write")
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
