"""Command line: ``python -m capturer [--config conf/config.cfg] [--demo [--once]]``.

``start.sh`` wraps this (virtualenv, background, pid file, log). Exit codes:
0 clean stop, 1 a stage failed, 2 bad configuration or checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from .errors import CheckpointError, ConfigError


def setup_logging(level: str = "info") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


_STOP = threading.Event()


def _on_signal(signum: int, _frame: object) -> None:
    logging.getLogger("capturer").info("signal %d: stopping", signum)
    _STOP.set()


def main(argv: list[str] | None = None) -> int:
    # first thing: a SIGTERM during start-up must still mean "stop cleanly"
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    ap = argparse.ArgumentParser(prog="capturer", description="Ordered binlog capturer")
    ap.add_argument("--config", default="conf/config.cfg", help="path to config.cfg")
    ap.add_argument("--check", action="store_true", help="validate the config and exit")
    ap.add_argument("--print-extras", action="store_true",
                    help="print the setup.py extras the configured senders need (for start.sh)")
    ap.add_argument("--demo", action="store_true", help="run the self-contained demo")
    ap.add_argument("--once", action="store_true", help="with --demo: exit when all demo rows arrived")
    ap.add_argument("--demo-dir", default="data/demo", help="with --demo: where its servers live")
    args = ap.parse_args(argv)

    if args.demo:
        setup_logging("info")
        from .demo import run_demo

        return run_demo(Path(args.demo_dir), once=args.once, stop=_STOP)

    from .config import load_config

    try:
        cfg = load_config(Path(args.config))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.print_extras:
        extras = []
        for s in cfg.senders:
            if s.name == "spark":
                extras.append("spark")
            if s.name == "kafka" and s.options.get("client") == "confluent":
                extras.append("confluent")
        print(",".join(extras))
        return 0
    setup_logging(cfg.log_level)
    log = logging.getLogger("capturer")
    log.info("effective config: %s", json.dumps(cfg.masked(), default=str))
    if args.check:
        print("config OK")
        return 0

    from .app import Capturer

    try:
        cap = Capturer(cfg)
    except (ConfigError, CheckpointError) as exc:
        print(f"start-up refused: {exc}", file=sys.stderr)
        return 2
    stop = _STOP
    try:
        cap.start()
    except OSError as exc:
        print(f"start-up failed: {exc}", file=sys.stderr)
        cap.shutdown()
        return 2
    code = cap.run(should_stop=stop)
    if code:
        print(f"capturer stopped on failure: {cap.failure}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
