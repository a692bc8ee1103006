"""``python -m capturer.agent --config conf/agent.cfg``: run a region agent.

Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 a failure, 2 a bad config or a port
that cannot be bound."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from ..__main__ import setup_logging
from ..errors import ConfigError

_STOP = threading.Event()


def _on_signal(signum: int, _frame: object) -> None:
    logging.getLogger("capturer.agent").info("signal %d: stopping", signum)
    _STOP.set()


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    ap = argparse.ArgumentParser(prog="capturer.agent",
                                 description="Region agent: serves regions to capturers over gRPC")
    ap.add_argument("--config", default="conf/agent.cfg", help="path to agent.cfg")
    ap.add_argument("--listen", help="override [agent] listen (host:port or unix:PATH)")
    ap.add_argument("--check", action="store_true", help="validate the config and exit")
    ap.add_argument("--port-file", help="write the port served on to this file once serving (for listen=...:0)")
    args = ap.parse_args(argv)
    from .config import load_agent_config, p_listen

    try:
        cfg = load_agent_config(Path(args.config))
        if args.listen:
            from dataclasses import replace

            try:
                cfg = replace(cfg, listen=p_listen(args.listen))
            except ValueError as exc:
                raise ConfigError(f"--listen {args.listen}: {exc}") from None
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    setup_logging(cfg.log_level)
    log = logging.getLogger("capturer.agent")
    log.info("effective config: %s", json.dumps(cfg.masked(), default=str))
    if args.check:
        print("config OK")
        return 0
    from .server import Agent

    agent = Agent(cfg)
    try:
        agent.start()
    except (OSError, RuntimeError) as exc:
        print(f"start-up failed: {exc}", file=sys.stderr)
        return 2
    if args.port_file:
        tmp = f"{args.port_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{agent.port}\n")
        os.replace(tmp, args.port_file)
    try:
        while not _STOP.wait(0.5):
            pass
    finally:
        agent.stop()
    log.info("agent stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
