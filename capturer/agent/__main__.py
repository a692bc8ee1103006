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
import time
from pathlib import Path

from capturer.__main__ import setup_logging
from capturer.agent.config import load_agent_config, p_listen, worker_config
from capturer.agent.server import Agent
from capturer.errors import ConfigError
from capturer.util.memory import tune

_STOP = threading.Event()


def _on_signal(signum: int, _frame: object) -> None:
    logging.getLogger("capturer.agent").info("signal %d: stopping", signum)
    _STOP.set()


def _follow_parent(pid: int) -> None:
    """A worker stops when the capturer that started it is gone (even after kill -9)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        # (also after a SIGTERM: PR_SET_PDEATHSIG sends one when the capturer dies)
        while os.getppid() == pid:
            time.sleep(0.5)
        logging.getLogger("capturer.agent").info("the capturer (pid %d) is gone: stopping", pid)
        _STOP.set()
        # nothing of a worker needs saving (the capturer's checkpoint is the state): a stop that hangs
        # (a region blocked in a read) must not leave the process behind
        time.sleep(10)
        logging.getLogger("capturer.agent").warning("still running 10 s after the capturer died: exiting")
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    tune()
    ap = argparse.ArgumentParser(prog="capturer.agent",
                                 description="Region agent: serves regions to capturers over gRPC")
    ap.add_argument("--config", default="conf/agent.cfg", help="path to agent.cfg")
    ap.add_argument("--listen", help="override [agent] listen (host:port or unix:PATH)")
    ap.add_argument("--check", action="store_true", help="validate the config and exit")
    ap.add_argument("--port-file", help="write the port served on to this file once serving (for listen=...:0)")
    # the capturer's worker processes (process=true): one region of the capturer's own config
    ap.add_argument("--capturer-config", help=argparse.SUPPRESS)
    ap.add_argument("--region", help=argparse.SUPPRESS)
    ap.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    try:
        if args.capturer_config:
            if not (args.region and args.listen):
                ap.error("--capturer-config needs --region and --listen")
            cfg = worker_config(Path(args.capturer_config), args.region, args.listen)
        else:
            cfg = load_agent_config(Path(args.config))
        if args.listen and not args.capturer_config:
            from dataclasses import replace

            try:
                cfg = replace(cfg, listen=p_listen(args.listen))
            except ValueError as exc:
                raise ConfigError(f"--listen {args.listen}: {exc}") from None
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.capturer_config:
        logging.basicConfig(level=getattr(logging, cfg.log_level.upper(), logging.INFO), stream=sys.stderr,
                            format=f"%(asctime)s %(levelname)s [worker {args.region}] %(name)s: %(message)s")
        if args.parent_pid:
            _follow_parent(args.parent_pid)
    else:
        setup_logging(cfg.log_level)
    log = logging.getLogger("capturer.agent")
    log.info("effective config: %s", json.dumps(cfg.masked(), default=str))
    if args.check:
        print("config OK")
        return 0

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
