"""Command line: ``python -m capturer [--config conf/config.cfg] [--demo [--once]]``,
``python -m capturer snapshot db.table ...`` (copy tables again, on demand), and the
operator commands of capturer/opscli.py: ``status [--watch]``, ``pause SENDER``,
``resume SENDER``, ``reload-filter``, ``stop``.

``start.sh`` wraps this (virtualenv, background, pid file, log). Exit codes:
0 clean stop, 1 a stage failed, 2 bad configuration or checkpoint. ``snapshot``:
0 started, 2 refused (HTTP 4xx: bad or refused request, token) or bad config,
1 the capturer could not be reached or failed to answer.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from capturer.errors import CheckpointError, ConfigError
from capturer.util.memory import tune


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


def snapshot_cli(argv: list[str]) -> int:
    """``python -m capturer snapshot db.table ...``: ask the running capturer (its
    status port, with the config's controlToken) to copy tables again."""
    ap = argparse.ArgumentParser(prog="capturer snapshot",
                                 description="Copy tables again while the capturer streams (on demand).")
    ap.add_argument("tables", nargs="+", help="db.table (backticks quote names with dots: `my.db`.t)")
    ap.add_argument("--config", default="conf/config.cfg", help="the running capturer's config (port, token)")
    ap.add_argument("--region", help="only this region (default: every MySQL/MariaDB region that has the table)")
    ap.add_argument("--truncate", action="store_true",
                    help="empty the table downstream before its first chunk (rows the source no longer has go); "
                         "refused for a table that several regions deliver")
    ap.add_argument("--url", help="the status URL, e.g. http://127.0.0.1:8080 (default: from the config)")
    ap.add_argument("--token", help="the control token (default: controlToken of the config)")
    args = ap.parse_args(argv)
    from capturer.ops.cli import control_call

    code, out = control_call(args.config, args.url, args.token, "/snapshot",
                             {"tables": args.tables, "region": args.region, "truncate": args.truncate})
    if code:
        return code
    for region, r in out["regions"].items():
        print(f"{region}: snapshot run {r['run']}: {', '.join(r['tables'])}")
    if out.get("missing"):
        print(f"not found in any region: {', '.join(out['missing'])}")
    print("progress: GET /status (regions.<name>.snapshot), or the log")
    return 0


def main(argv: list[str] | None = None) -> int:
    # first thing: a SIGTERM during start-up must still mean "stop cleanly"
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    tune()
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "snapshot":
        return snapshot_cli(argv[1:])
    if argv and argv[0] == "status":
        from capturer.ops.cli import status_cli

        return status_cli(argv[1:])
    if argv and argv[0] in ("pause", "resume", "reload-filter", "stop"):
        from capturer.ops.cli import control_cli

        return control_cli(argv[0], argv[1:])
    ap = argparse.ArgumentParser(prog="capturer", description="Ordered binlog capturer")
    ap.add_argument("--config", default="conf/config.cfg", help="path to config.cfg")
    ap.add_argument("--check", action="store_true", help="validate the config and exit")
    ap.add_argument("--print-extras", action="store_true",
                    help="print the setup.py extras the configured senders need (for start.sh)")
    ap.add_argument("--demo", nargs="?", const="mariadb", choices=["mariadb", "baikaldb", "postgresql"],
                    help="run the self-contained demo: two MariaDB regions (default); baikaldb: "
                         "BaikalDB binlog tables served by the test double; postgresql: a MariaDB and a "
                         "PostgreSQL region")
    ap.add_argument("--once", action="store_true", help="with --demo: exit when all demo rows arrived")
    ap.add_argument("--demo-dir", help="with --demo: where its servers live (default: data/demo)")
    args = ap.parse_args(argv)
    # options that would be silently ignored are refused (exit code 2, as argparse does)
    if not args.demo and (args.once or args.demo_dir is not None):
        ap.error("--once and --demo-dir go with --demo")
    if sum(map(bool, (args.demo, args.check, args.print_extras))) > 1:
        ap.error("--demo, --check and --print-extras exclude each other")
    if not args.config.strip():
        ap.error("--config: empty path")
    args.demo_dir = args.demo_dir or "data/demo"

    if args.demo:
        setup_logging("info")
        from devtools.demo import run_baikaldb_demo, run_demo, run_postgresql_demo

        if args.demo == "baikaldb":
            return run_baikaldb_demo(Path(args.demo_dir), once=args.once, stop=_STOP)
        if args.demo == "postgresql":
            return run_postgresql_demo(Path(args.demo_dir), once=args.once, stop=_STOP)
        return run_demo(Path(args.demo_dir), once=args.once, stop=_STOP)

    from capturer.app import Capturer, load_config

    try:
        cfg = load_config(Path(args.config))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.print_extras:
        extras = []
        if any(r.type == "postgresql" for r in cfg.regions):
            extras.append("postgresql")
        for s in cfg.senders:
            if s.name == "spark":
                extras.append("spark")
            if s.name == "kafka":
                extras.append("confluent" if s.options.get("client") == "confluent" else "kafka")
        print(",".join(extras))
        return 0
    setup_logging(cfg.log_level)
    log = logging.getLogger("capturer")
    log.info("effective config: %s", json.dumps(cfg.masked(), default=str))
    if args.check:
        print("config OK")
        return 0

    try:
        cap = Capturer(cfg)
    except (ConfigError, CheckpointError) as exc:
        msg = str(exc)
        if isinstance(exc, CheckpointError) and str(cfg.checkpoint_path) not in msg:
            msg = f"{cfg.checkpoint_path}: {msg}"  # every refusal names the file at fault
        print(f"start-up refused: {msg}", file=sys.stderr)
        return 2
    stop = _STOP
    try:
        cap.start()
    except OSError as exc:
        print(f"start-up failed: {exc} (config {args.config})", file=sys.stderr)
        if cap.status_server is not None:  # something did start: stop it (a final checkpoint)
            cap.shutdown()
        return 2
    code = cap.run(should_stop=stop)
    if code:
        print(f"capturer stopped on failure: {cap.failure}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
