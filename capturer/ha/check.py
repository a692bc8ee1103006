"""What the operators' tools read of ``[ha]``: ``--check --connect`` (every etcd endpoint
answers, and who is active) and ``verify`` (the checkpoint the active published)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from capturer.config import AppConfig
from capturer.ha.coord import CoordinationError, Coordinator, unpack_state
from capturer.pipeline.checkpoint import load_checkpoint
from capturer.util.probe import Outcome, Probe


def probes(cfg: AppConfig, timeout: float) -> list[Probe]:
    """[ha]: every etcd endpoint answers; who is active now (none without [ha])."""
    if cfg.ha is None:
        return []
    hc = cfg.ha

    def run(out: Outcome) -> None:
        answered = []
        for ep in hc.endpoints:
            try:
                Coordinator((ep,), hc.name, hc.lease_seconds, timeout=min(timeout, 3)).get("leader")
                answered.append(ep)
            except CoordinationError as exc:
                out.problems.append(f"[ha] endpoints of {cfg.path}: {exc}")
        if answered:
            got = Coordinator(tuple(answered), hc.name, hc.lease_seconds, timeout=min(timeout, 3)).leader()
            out.detail = (f"{len(answered)}/{len(hc.endpoints)} answered; active capturer of {hc.name!r}: "
                          + (f"{got[0].get('id')} (epoch {got[1]})" if got else "none"))

    return [Probe(f"etcd ({', '.join(hc.endpoints)})", run, f"[ha] endpoints of {cfg.path}")]


def published_checkpoint(hc: Any) -> Any:
    """The checkpoint the active capturer of an [ha] group last wrote to etcd (None: none yet)."""
    got = Coordinator(hc.endpoints, hc.name, hc.lease_seconds).get("state")
    if got is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "checkpoint.json"
        p.write_text(json.dumps(unpack_state(got[0])["checkpoint"]))
        return load_checkpoint(p)
