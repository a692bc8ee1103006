"""What a preflight check (``python -m capturer --check [--connect]``) is made of,
shared by the checks of every region kind and sender kind (each kind's ``check``
module) and the runner in ``capturer/ops/check.py``.

A **probe** tries one source or destination (``Probe.run`` fills an ``Outcome``:
problems fail the check, notes do not, ``detail`` says what was seen); the runner
runs every probe at once, each within its time limit. **Offline** checks look at
what a start finds only later (paths to write, files to read, client libraries)
and connect to nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Outcome:
    """What one source or destination check found."""

    name: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass
class Probe:
    name: str  # what is tried, with its address: "region r1 (mysql 10.0.0.5:3306)"
    run: Callable[[Outcome], None]
    hint: str = ""  # where to change it, for a failure that does not say


@dataclass(frozen=True)
class SenderCheck:
    """A configured sender as its kind's check sees it (plain values: the kinds do not
    import the capturer's config)."""

    name: str
    options: Mapping[str, Any]
    path: Path  # its senderConfig file
    queue_rows: int
    timeout: float = 5.0  # --connect: seconds for the probe
    where: Callable[[str, str], str] | None = None  # (section, key) -> "file:line: [section] key"

    @property
    def section(self) -> str:
        return f"[{self.name}] of {self.path}"

    def at(self, key: str, section: str = "") -> str:
        """Where ``key`` of this sender's section (or of ``section``) is set."""
        sec = section or self.name
        return self.where(sec, key) if self.where is not None else f"{self.path}: [{sec}] {key}"


def not_writable(directory: Path) -> str:
    """"" if files can be made in ``directory``: it is a writable directory, or it can
    be created (its nearest existing ancestor is a writable directory); else why not."""
    p = directory
    try:
        while not p.exists():
            if p.parent == p:
                break
            p = p.parent
        if not p.is_dir():
            return f"{p} is not a directory" if p == directory else \
                f"{directory} cannot be created: {p} is not a directory"
    except OSError as exc:
        return f"{p}: {exc.strerror or exc}"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{p} is not writable by this user" if p == directory else \
            f"{directory} cannot be created: {p} is not writable by this user"
    return ""


def unreadable(p: Path) -> str:
    """"" if the file can be read; else why not."""
    try:
        with open(p, "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return ""


@dataclass(frozen=True)
class RegionCheck:
    """A configured region as its kind's check sees it."""

    config: Any  # its [region:NAME] section, parsed (the kind's config dataclass)
    region: Any  # the region as its kind builds it, not started (None for offline checks)
    path: Path  # config.cfg
    checkpoint_path: Path
    timeout: float = 5.0
    where: Callable[[str, str], str] | None = None  # (section, key) -> "file:line: [section] key"

    @property
    def name(self) -> str:
        return str(self.config.name)

    @property
    def section(self) -> str:
        return f"[region:{self.name}] of {self.path}"

    def at(self, key: str) -> str:
        """Where ``key`` of this region's section is set."""
        sec = f"region:{self.name}"
        return self.where(sec, key) if self.where is not None else f"{self.path}: [{sec}] {key}"
