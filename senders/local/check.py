"""``--check`` of the local file sender: the file can be written (made, or appended to)."""

from __future__ import annotations

import os
from pathlib import Path

from capturer.util.probe import Outcome, Probe, SenderCheck, not_writable


def offline(c: SenderCheck) -> list[str]:
    f = Path(c.options["filepath"])
    why = not_writable(f.parent)
    if not why and f.exists():
        why = f"{f} is not a file" if not f.is_file() else \
            f"{f} is not writable by this user" if not os.access(f, os.R_OK | os.W_OK) else ""
    return [f"{c.at('filepath')} = {f}: the sender cannot write it: {why}"] if why else []


def probe(c: SenderCheck) -> Probe:
    def run(out: Outcome) -> None:
        out.detail = "its directory is writable"

    return Probe(f"sender {c.name} ({c.options.get('filepath', '')})", run)
