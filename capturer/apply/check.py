"""``python -m capturer apply --check [--connect]``: what an applier's start would
refuse, and with ``--connect`` whether Kafka, the transaction topic and every
destination answer. The senders are checked by the capturer's own checks
(capturer/ops/check.py). Exit codes as the capturer's: 0 OK, 2 refused, 3 unreachable."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any, cast

from capturer.apply.config import ApplyConfig
from capturer.model.message import Consumer
from capturer.ops import check as cc
from capturer.util.ini import read_ini


def _kafka_probe(cfg: ApplyConfig, timeout: float, make_consumer: Callable[..., Consumer]) -> cc.Probe:
    def run(out: cc.Outcome) -> None:
        c = make_consumer(cfg.client, cfg.servers, cfg.group, cfg.security,
                          f"applier {cfg.name}", max(0.5, timeout - 2), f"[global] of {cfg.path}")
        try:
            topics = c.topics()
        finally:
            c.close()
        if cfg.txn_topic not in topics:
            out.problems.append(f"kafka ({cfg.servers}): txn_topic {cfg.txn_topic!r} (in [global] of {cfg.path}) does "
                                "not exist: the capturer's [kafka] sender must set txn_topic to it (the applier "
                                "waits for it to appear)")
        if cfg.on_bad_message == "dead_letter" and cfg.dead_letter_topic not in topics:
            out.notes.append(f"kafka ({cfg.servers}): dead_letter_topic {cfg.dead_letter_topic!r} does not exist yet "
                             "(made on first use where the broker creates topics automatically; create it otherwise)")
        out.detail = f"{len(topics)} topic(s), txn_topic {cfg.txn_topic!r}" + \
            (" found" if cfg.txn_topic in topics else " missing")

    return cc.Probe(f"kafka ({cfg.servers})", run, f"check servers in [global] of {cfg.path}")


def check_apply(cfg: ApplyConfig, connect: bool, sender_checks: Callable[[str], Any],
                make_consumer: Callable[..., Consumer], timeout: float = cc.CONNECT_TIMEOUT) -> int:
    """``sender_checks(name)``: a sender kind's check module; ``make_consumer``: the Kafka kind's
    consumer factory (both the registry's, from the applier's root)."""
    problems: list[str] = []
    module = "confluent_kafka" if cfg.client == "confluent" else "kafka"
    if importlib.util.find_spec(module) is None:
        problems.append(f"{cfg.path}: client = {cfg.client}: its library ({module}) is not installed: .venv/bin/pip "
                        "install -e '.[" + ("confluent" if module == "confluent_kafka" else "kafka") + "]'")
    try:
        ini = read_ini(cfg.sender_config_path)
    except Exception:
        ini = None
    app_like = cast(Any, cfg)  # the sender checks need queue_rows and the sender file, which it has
    for s in cfg.senders:
        problems += cc._sender_offline(s, ini, app_like, sender_checks)
    unreachable: list[str] = []
    passed: list[str] = []
    notes: list[str] = []
    if connect and not problems:
        probes = [_kafka_probe(cfg, timeout, make_consumer)]
        probes += [cc._sender_probe(s, app_like, timeout, sender_checks) for s in cfg.senders]
        for out in cc.run_probes(probes, timeout):
            unreachable += out.problems
            notes += out.notes
            if not out.problems:
                passed.append(f"{out.name}: {out.detail}" if out.detail else out.name)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if not problems:
        print("config OK", flush=True)
    for line in passed:
        print(f"ok: {line}", flush=True)
    for line in unreachable:
        print(f"error: {line}", file=sys.stderr)
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    if problems:
        return 2
    return 3 if unreachable else 0
