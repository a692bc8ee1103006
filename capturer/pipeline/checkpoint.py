"""The checkpoint file: where the sources resume, where every sender stands, and
what the backlog holds; and the one policy that writes it.

Version 2 (every sender with a position of its own):

* ``regions[name]`` / ``region_ts[name]``: where each region's source is read from
  at the next start (the position just after an item, and that item's commit_ts:
  the region's clock resumes above it, so an item read again gets its commit_ts
  again). It is the point after which nothing is on disk in the backlog: the
  position of the sender furthest behind, or, when the backlog holds what that
  sender still needs, the point where the backlog ends.
* ``senders[name]``: the offset in the merged stream the sender acknowledged, the
  key ``[commit_ts, region, sub]`` of the last transaction it acknowledged (a
  restart hands it nothing at or below that key: a sender that was ahead gets
  nothing twice), its cut (the regions' positions as of its offset: the sender
  furthest behind can be rebuilt from the sources from there if the backlog is
  lost), its acknowledged commit_ts, its own state (``state``, e.g. a file's
  length), and ``detached`` for a sender the backlog limit detached.
* ``backlog``: the offset the next item gets and the last segment with its
  fsync'd length.
* ``commit_ts``: every attached sender has acknowledged every transaction at or
  below it (the slowest one's).

Version 1 (one position for all senders) is still read: every sender then starts
from its regions' positions, as before.

The file is JSON, written atomically (temp file, fsync, rename, fsync of the
directory) and never moves backwards. A missing file means "first start"; an
unreadable or corrupt one stops start-up: it is never silently reset to 0.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.errors import CapturerError, CheckpointError, Fenced
from capturer.model import AnyPosition, StreamKey, key_from_json, key_to_json, position_from_json, ts_physical_ms
from capturer.pipeline.segments import BacklogMark
from capturer.util import failpoints
from capturer.util.durable import fsync_dir

log = logging.getLogger(__name__)

VERSION = 2
VERSIONS = (1, 2)


def _positions_json(regions: dict[str, AnyPosition]) -> dict[str, Any]:
    return {r: getattr(p, "checkpoint_json", p.to_json)() for r, p in sorted(regions.items())}


def _time(ts: int) -> str | None:
    ms = ts_physical_ms(ts)
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat() if ms else None


@dataclass(frozen=True)
class SenderPosition:
    """Where one sender stands (see the module docstring)."""

    offset: int = -1
    key: StreamKey | None = None
    commit_ts: int = 0
    regions: dict[str, AnyPosition] = field(default_factory=dict)
    region_ts: dict[str, int] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    detached: bool = False

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"offset": self.offset, "key": key_to_json(self.key), "commit_ts": self.commit_ts,
                             "commit_time": _time(self.commit_ts), "regions": _positions_json(self.regions),
                             "region_ts": dict(sorted(self.region_ts.items()))}
        if self.state is not None:
            d["state"] = self.state
        if self.detached:
            d["detached"] = True
        return d


@dataclass(frozen=True)
class Checkpoint:
    commit_ts: int = 0
    regions: dict[str, AnyPosition] = field(default_factory=dict)
    region_ts: dict[str, int] = field(default_factory=dict)  # commit_ts of each region's item at its position
    senders: dict[str, SenderPosition] = field(default_factory=dict)
    backlog: BacklogMark | None = None

    def floor(self, region: str) -> int:
        """What the region's commit_ts must stay above after a restart (a checkpoint
        written before region_ts existed: the global commit_ts, as then)."""
        return self.region_ts.get(region, self.commit_ts)

    def content(self) -> dict[str, Any]:
        """Everything but the time it is written (equal content: nothing moved)."""
        d: dict[str, Any] = {
            "version": VERSION,
            "commit_ts": self.commit_ts,
            "commit_time": _time(self.commit_ts),
            "regions": _positions_json(self.regions),
            "region_ts": dict(sorted(self.region_ts.items())),
            "senders": {n: sp.to_json() for n, sp in sorted(self.senders.items())},
        }
        if self.backlog is not None:
            d["backlog"] = self.backlog.to_json()
        return d

    def to_json(self) -> dict[str, Any]:
        return {**self.content(), "written_at": dt.datetime.now(dt.UTC).isoformat()}


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
    if d.get("version") not in VERSIONS or isinstance(d.get("version"), bool):
        raise CheckpointError(f"{path}: unsupported checkpoint version {d.get('version')!r} (this capturer reads "
                              f"versions {', '.join(map(str, VERSIONS))}); {hint}")
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
    region_ts = _region_ts(path, "region_ts", rts_raw, hint)
    senders: dict[str, SenderPosition] = {}
    raw_senders = d.get("senders", {})
    if not isinstance(raw_senders, dict):
        raise CheckpointError(f"{path}: 'senders' must be an object; {hint}")
    for name, sd in raw_senders.items():
        senders[name] = _sender(path, name, sd, hint)
    mark = None
    if d.get("backlog") is not None:
        try:
            mark = BacklogMark.from_json(d["backlog"])
        except ValueError as exc:
            raise CheckpointError(f"{path}: {exc}; {hint}") from None
    return Checkpoint(ts, regions, region_ts, senders, mark)


def _region_ts(path: Path, where: str, raw: Any, hint: str) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: '{where}' must be an object; {hint}")
    out = {}
    for name, v in raw.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v >= 1 << 63:
            raise CheckpointError(f"{path}: {where}.{name} must be a non-negative 64-bit integer; {hint}")
        out[name] = v
    return out


def _sender(path: Path, name: str, sd: Any, hint: str) -> SenderPosition:
    where = f"senders.{name}"
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path}: '{where}' must be an object; {hint}")
    off, ts = sd.get("offset", -1), sd.get("commit_ts", 0)
    if not isinstance(off, int) or isinstance(off, bool) or off < -1:
        raise CheckpointError(f"{path}: {where}.offset must be an integer >= -1; {hint}")
    if not isinstance(ts, int) or isinstance(ts, bool) or not 0 <= ts < 1 << 63:
        raise CheckpointError(f"{path}: {where}.commit_ts must be a non-negative 64-bit integer; {hint}")
    try:
        key = key_from_json(sd.get("key"))
    except ValueError as exc:
        raise CheckpointError(f"{path}: {where}.key: {exc}; {hint}") from None
    regions_raw = sd.get("regions", {})
    if not isinstance(regions_raw, dict):
        raise CheckpointError(f"{path}: {where}.regions must be an object; {hint}")
    regions = {}
    for r, pos in regions_raw.items():
        try:
            regions[r] = position_from_json(pos)
        except ValueError as exc:
            raise CheckpointError(f"{path}: {where}.regions.{r}: {exc}; {hint}") from None
    state = sd.get("state")
    if state is not None and not isinstance(state, dict):
        raise CheckpointError(f"{path}: {where}.state must be an object; {hint}")
    detached = sd.get("detached", False)
    if not isinstance(detached, bool):
        raise CheckpointError(f"{path}: {where}.detached must be true or false; {hint}")
    return SenderPosition(off, key, ts, regions, _region_ts(path, f"{where}.region_ts", sd.get("region_ts", {}), hint),
                          state, detached)


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
    fsync_dir(path.parent)


class StateDir:
    """The checkpoint file and its side files, named and listed in one place: each
    side file is ``<checkpoint>.<suffix>`` next to it (the lift journal ``.lifts``,
    the paused senders ``.paused``, the copies asked for ``.copies``, a region kind's
    journal ``.<type>.<region>``);
    ``.tmp`` files are writes in progress and the backlog (``.backlog``) is a
    directory, so neither is one. High availability ships exactly these to etcd and
    back (capturer/ha/node.py)."""

    LIFTS = ".lifts"
    PAUSED = ".paused"
    COPIES = ".copies"  # copies asked for that no checkpoint carries yet (capturer/regions/copies.py)

    def __init__(self, checkpoint_path: Path):
        self.path = checkpoint_path

    def side(self, suffix: str) -> Path:
        """The side file ``suffix`` (it starts with a dot)."""
        return self.path.with_name(self.path.name + suffix)

    def suffix_of(self, p: Path) -> str | None:
        """The suffix of ``p`` if it is one of this checkpoint's side files, else None."""
        name = self.path.name
        if p.parent != self.path.parent or not p.name.startswith(name + ".") or p.name.endswith(".tmp"):
            return None
        return p.name[len(name):]

    def side_files(self) -> dict[str, Path]:
        """Every side file on disk now, by suffix."""
        out: dict[str, Path] = {}
        if not self.path.parent.is_dir():
            return out
        for p in sorted(self.path.parent.iterdir()):
            suffix = self.suffix_of(p)
            if suffix is not None and p.is_file():
                out[suffix] = p
        return out


class CheckpointKeeper:
    """The one policy that writes the checkpoint: every ``interval`` seconds, soon
    after a DDL every sender acknowledged (``due()``: ``SenderManager.ddl_acknowledged``), when a region
    pins its first position (``write(force=True)``), and a final one at shutdown.
    ``compute`` gives the checkpoint as of now (it never moves backwards: the
    SenderManager's positions only grow); ``on_written`` is told once it is on
    disk (journals pruned, regions told). An unchanged checkpoint is rewritten
    only once a minute, so that its age shows the capturer is alive."""

    REFRESH = 60.0

    def __init__(self, path: Path, interval: float, current: Checkpoint,
                 compute: Callable[[], Checkpoint], on_written: Callable[[Checkpoint], None],
                 publish: Callable[[Checkpoint], None] | None = None, due: Callable[[], bool] = lambda: False):
        """``publish`` (high availability): called with each checkpoint before it is
        written; Fenced stops the writes, CapturerError skips this one (nothing is
        written, nothing pruned; the next tick tries again)."""
        self.path = path
        self.due = due
        self.publish = publish
        self.publish_failures = 0
        self.publish_error = ""
        self.interval = interval
        self.current = current
        self.compute = compute
        self.on_written = on_written
        self.written_at = time.time()
        self.writes = 0
        self._last = time.monotonic()
        self._content = current.content()
        self.lock = threading.RLock()  # the run loop's writes and a region's pin

    def tick(self) -> bool:
        """Write if it is due (the interval passed, or ``due()`` says so); True if it was."""
        if self.due() or time.monotonic() - self._last >= self.interval:
            self.write()
            return True
        return False

    def write(self, force: bool = False) -> Checkpoint:
        with self.lock:
            self._last = time.monotonic()
            cp = self.compute()
            content = cp.content()
            if not force and content == self._content and time.time() - self.written_at < self.REFRESH:
                return self.current
            while self.publish is not None:
                try:
                    self.publish(cp)
                    self.publish_error = ""
                    break
                except Fenced:
                    raise
                except CapturerError as exc:
                    self.publish_failures += 1
                    if not self.publish_error:
                        log.warning("checkpoint not written: %s (%s)", exc, "a forced one is tried until it is"
                                    if force else "tried again every checkpointInterval")
                    self.publish_error = str(exc)
                    if not force:
                        return self.current
                    time.sleep(0.5)  # a region's first position (pin_start): nothing leaves it before
            save_checkpoint(self.path, cp)
            self.current, self._content = cp, content
            self.written_at = time.time()
            self.writes += 1
        self.on_written(cp)
        return cp
