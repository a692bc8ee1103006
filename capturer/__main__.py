"""Command line: ``python -m capturer [--config conf/config.cfg] [--demo [--once]]``,
``python -m capturer snapshot db.table ...`` (copy tables again, on demand),
``python -m capturer apply --config conf/apply.cfg`` (an applier: the Kafka sender's
topics into MySQL, files, the lake; capturer/apply), and the
operator commands of capturer/ops/cli.py: ``status [--watch]``, ``pause SENDER``,
``resume SENDER``, ``attach SENDER``, ``reload-filter``, ``stop``; ``verify`` (capturer/ops/verify.py:
every sender's destination compared with the sources).
``--rebuild-backlog``: start once with the backlog moved aside, reading the sources
again from the sender furthest behind (the way out of a damaged or lost backlog).

``start.sh`` wraps this (virtualenv, background, pid file, log). Exit codes:
0 clean stop, 1 a stage failed, 2 bad configuration or checkpoint. ``snapshot``:
0 started, 2 refused (HTTP 4xx: bad or refused request, token) or bad config,
1 the capturer could not be reached or failed to answer.

``--check`` (capturer/ops/check.py) builds what a start builds and connects to
nothing: 0 ("config OK" on stdout), 2 a start would refuse (a config, filter,
checkpoint, journal or paused-senders file, a path a sender or the checkpoint
cannot write, a TLS file, a missing client library or Java): one line per
problem on stderr, naming the file (and line, section and key where known).
``--check --connect`` also tries every source and destination at once (5 s each):
0 all answered as needed (one "ok:" line each on stdout), 2 as above, 3 a source
or destination failed its check (one line each on stderr, naming it).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from capturer.errors import CapturerError, CheckpointError, ConfigError
from capturer.util.memory import tune

if TYPE_CHECKING:
    from capturer.config import AppConfig


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


def check_cli(cfg: AppConfig, connect: bool) -> int:
    """``--check [--connect]`` of a loaded config: problems on stderr, "config OK" on stdout."""
    from capturer.app import check_root
    from capturer.ops.check import run_check

    report = run_check(cfg, check_root(), connect=connect)
    for line in report.problems:
        print(f"error: {line}", file=sys.stderr)
    if not report.problems:
        print("config OK", flush=True)
    for line in report.passed:
        print(f"ok: {line}", flush=True)
    for line in report.unreachable:
        print(f"error: {line}", file=sys.stderr)
    for line in report.notes:
        print(f"note: {line}", file=sys.stderr)
    if report.problems:
        print(f"check failed: {len(report.problems)} problem(s) a start would refuse", file=sys.stderr)
    elif report.unreachable:
        print(f"check failed: {len(report.unreachable)} source(s) or destination(s) failed", file=sys.stderr)
    elif connect:
        print("connections OK")
    return report.exit_code


# every sub-command of ``python -m capturer`` and what it does (``--help`` lists them; each has its own --help)
SUBCOMMANDS = {
    "verify": "compare every sink with the sources, table by table (exit 0 equal, 1 a difference)",
    "apply": "an applier: read the capturer's Kafka topics into its own senders (a MySQL target, ...)",
    "spark-apply": "a Spark Structured Streaming job: the capturer's Kafka topics MERGEd into Delta tables",
    "status": "print a running capturer's status (its HTTP port)",
    "snapshot": "ask a running capturer to copy tables (an initial or incremental snapshot)",
    "pause": "pause a sender of a running capturer",
    "resume": "resume a paused sender",
    "attach": "attach a detached sender again (it catches up from its position)",
    "reload-filter": "read the filter rules again without a restart",
    "stop": "stop a running capturer cleanly (drain, final checkpoint)",
    "handover": "hand the active role of an [ha] group to a standby",
}


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "snapshot":
        return snapshot_cli(argv)
    if name == "verify":
        setup_logging("warning")
        from capturer.app import load_config as load_app_config
        from capturer.app import verify_factories
        from capturer.ha.check import published_checkpoint
        from capturer.ops.verify import verify_cli

        return verify_cli(argv, load_app_config, verify_factories(), published_checkpoint)
    if name == "apply":
        from capturer.apply.app import apply_main

        return apply_main(argv, _STOP)
    if name == "spark-apply":
        from capturer.apply.spark_stream import spark_apply_main

        return spark_apply_main(argv, _STOP)
    if name == "status":
        from capturer.ops.cli import status_cli

        return status_cli(argv)
    from capturer.ops.cli import control_cli

    return control_cli(name, argv)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="capturer", description="Ordered binlog capturer: with no sub-command, runs the capturer of --config.",
        usage="%(prog)s [OPTIONS]  (run, check or demo)\n       %(prog)s COMMAND [COMMAND OPTIONS]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="an agent (a region read on another host): python -m capturer.agent --config AGENT.cfg")
    # each sub-command parses its own options (its own --help): here it is named, and the rest handed on
    sub = ap.add_subparsers(dest="command", metavar="COMMAND",
                            title="sub-commands (python -m capturer COMMAND --help for each one's options)")
    for name, what in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=what, add_help=False, prog=f"capturer {name}")
        sp.add_argument("rest", nargs=argparse.REMAINDER)
    ap.add_argument("--config", default="conf/config.cfg", help="path to config.cfg")
    ap.add_argument("--check", action="store_true",
                    help="refuse what a start would refuse (config, filter, checkpoint, journals, paths, TLS files, "
                         "Java), connecting to nothing, and exit: 0 OK, 2 a problem")
    ap.add_argument("--connect", action="store_true",
                    help="with --check: also try every source and destination (5 s each, at once); 3 if one fails")
    ap.add_argument("--rebuild-backlog", action="store_true",
                    help="the backlog is damaged or lost: move it aside and read the sources again from the position "
                         "of the sender furthest behind (each sender skips what it already has)")
    ap.add_argument("--print-extras", action="store_true",
                    help="print the setup.py extras the configured senders need (for start.sh)")
    ap.add_argument("--demo", nargs="?", const="mariadb", choices=["mariadb", "baikaldb", "postgresql", "full", "ha"],
                    help="run the self-contained demo: two MariaDB regions (default); full: the same with all "
                         "four senders (file, MySQL, Kafka, Spark lake; what cannot run here is skipped); baikaldb: "
                         "BaikalDB binlog tables served by the test double; postgresql: a MariaDB and a "
                         "PostgreSQL region; ha: two capturers in an active/standby group with a private etcd")
    ap.add_argument("--once", action="store_true", help="with --demo: exit when all demo rows arrived")
    ap.add_argument("--demo-dir", help="with --demo: where its servers live (default: data/demo)")
    return ap


_TAKES_VALUE = ("--config", "--demo-dir", "--demo")


def _stray(argv: list[str]) -> str | None:
    """The first word that is neither an option, an option's value nor a sub-command."""
    after_value = False
    for a in argv:
        if after_value:
            after_value = False
            continue
        if a.startswith("-"):
            after_value = a in _TAKES_VALUE  # (--demo takes the next word too: argparse judges it)
            continue
        return None if a in SUBCOMMANDS else a
    return None


def _parse(ap: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    stray = _stray(argv)
    if stray is not None:  # (argparse would call it an invalid sub-command choice)
        ap.error(f"unrecognized arguments: {stray} (a config file goes with --config FILE; the sub-commands: "
                 f"{', '.join(SUBCOMMANDS)})")
    args = ap.parse_args(argv)
    if args.command:  # (main dispatches a sub-command named first before parsing)
        ap.error(f"the options of {args.command} go after it: python -m capturer {args.command} [OPTIONS]")
    # options that would be silently ignored are refused (exit code 2, as argparse does)
    if not args.demo and (args.once or args.demo_dir is not None):
        ap.error("--once and --demo-dir go with --demo")
    if sum(map(bool, (args.demo, args.check, args.print_extras))) > 1:
        ap.error("--demo, --check and --print-extras exclude each other")
    if args.connect and not args.check:
        ap.error("--connect goes with --check")
    if args.check and getattr(args, "rebuild_backlog", False):
        ap.error("--rebuild-backlog goes with a start, not with --check (it moves the backlog aside)")
    if not args.config.strip():
        ap.error("--config: empty path")
    args.demo_dir = args.demo_dir or "data/demo"
    return args


def _demo(args: argparse.Namespace) -> int:
    setup_logging("info")
    from devtools.demo import run_baikaldb_demo, run_demo, run_postgresql_demo

    if args.demo == "baikaldb":
        return run_baikaldb_demo(Path(args.demo_dir), once=args.once, stop=_STOP)
    if args.demo == "postgresql":
        return run_postgresql_demo(Path(args.demo_dir), once=args.once, stop=_STOP)
    if args.demo == "ha":
        from devtools.demo_ha import run_ha_demo

        return run_ha_demo(Path(args.demo_dir), once=args.once, stop=_STOP)
    if args.demo == "full":
        from devtools.demo_full import run_full_demo

        return run_full_demo(Path(args.demo_dir), once=args.once, stop=_STOP)
    return run_demo(Path(args.demo_dir), once=args.once, stop=_STOP)


def main(argv: list[str] | None = None) -> int:
    # first thing: a SIGTERM during start-up must still mean "stop cleanly"
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    tune()
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    args = _parse(_parser(), argv)
    if args.demo:
        return _demo(args)

    from capturer.app import Capturer, load_config

    try:
        cfg = load_config(Path(args.config))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.print_extras:
        from capturer.app import sender_extra
        from capturer.regions import kind as region_kind

        extras = [region_kind(r.type).extra for r in cfg.regions] + [sender_extra(s.name, s.options)
                                                                   for s in cfg.senders]
        print(",".join(dict.fromkeys(e for e in extras if e)))
        return 0
    setup_logging(cfg.log_level)
    log = logging.getLogger("capturer")
    log.info("effective config: %s", json.dumps(cfg.masked(), default=str))
    if args.check:
        return check_cli(cfg, args.connect)

    if cfg.ha is not None:  # one of an active/standby group (capturer/ha)
        if args.rebuild_backlog:
            print("--rebuild-backlog does not go with [ha]: the active rebuilds its backlog from the sources at "
                  "every takeover", file=sys.stderr)
            return 2
        from capturer.ha.node import run_node
        from capturer.ops.status import StatusServer

        return run_node(cfg, argv, _STOP, Capturer, StatusServer)
    return _run(cfg, args)


def _run(cfg: AppConfig, args: argparse.Namespace) -> int:
    """One capturer (no [ha]): built, started, run until stopped or failed."""
    from capturer.app import Capturer

    try:
        cap = Capturer(cfg, rebuild_backlog=args.rebuild_backlog)
    except (ConfigError, CheckpointError) as exc:
        msg = str(exc)
        if isinstance(exc, CheckpointError) and str(cfg.checkpoint_path) not in msg:
            msg = f"{cfg.checkpoint_path}: {msg}"  # every refusal names the file at fault
        print(f"start-up refused: {msg}", file=sys.stderr)
        return 2
    except (CapturerError, ImportError, OSError) as exc:  # e.g. a region kind's client library is missing
        print(f"start-up refused: {exc} (config {args.config}; python -m capturer --config {args.config} --check "
              "lists every problem)", file=sys.stderr)
        return 2
    try:
        cap.start()
    except OSError as exc:
        print(f"start-up failed: {exc} (config {args.config})", file=sys.stderr)
        if cap.status_server is not None:  # something did start: stop it (a final checkpoint)
            cap.shutdown()
        return 2
    code = cap.run(should_stop=_STOP)
    if code:
        print(f"capturer stopped on failure: {cap.failure}", file=sys.stderr)
    return code

if __name__ == "__main__":
    sys.exit(main())
