"""``python -m capturer --check [--connect]``: what a start would refuse, found
without starting it.

``--check`` (connects to nothing, writes nothing):

* the config files (``capturer.app.load_config``, done by the caller);
* the very object a start builds, ``Capturer(cfg)``: the filter file, the
  checkpoint (corrupt, or naming a region the config does not have, or a position
  of another kind), the lift journal (``<checkpoint>.lifts``), the paused-senders
  file (``<checkpoint>.paused``), the region kinds' own journals (PostgreSQL
  relations, BaikalDB schemas: ``<checkpoint>.<kind>.<region>``; for a region with
  ``process = true`` the kind's region is built here as its worker would build
  it), the backlog (opened read-only: a start's repairs, cutting what no
  checkpoint refers to, are left to the start), the senders. Building it connects
  to nothing; the one thing it creates (a worker region's socket directory) is
  removed again;
* what a start finds only later: the checkpoint's and the backlog's directories,
  ``spillDir``, the local sender's file and the Spark lake (writable, or creatable),
  the TLS files the config names (readable, and loadable as PEM), the client
  libraries a sender needs (kafka-python / confluent-kafka, pyspark and pyarrow),
  and a Java runtime for a Spark sender that will start a session (the sender's own
  rule and its own way of finding Java).

``--connect`` then tries every source and destination at once, each within
``CONNECT_TIMEOUT`` seconds: MySQL/MariaDB (login, binlog settings, server_id,
privileges, the checkpoint's binlog file), PostgreSQL (wal_level, REPLICATION,
slot, publication, free slots and WAL senders when the slot is still to be made),
BaikalDB (the meta servers answer, the binlog table has regions), region agents
(they answer with the region's name and token), and the senders (MySQL target:
login, the database, privileges; Kafka: a metadata answer; local and Spark: as
above, and pyspark imports when a session will be needed).

Exit codes (``CheckReport.exit_code``): ``OK`` 0, ``REFUSED`` 2 (a start would
refuse: a config, checkpoint, journal or file problem), ``UNREACHABLE`` 3 (with
``--connect``: a source or destination failed its check).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.config import AnyRegionConfig, AppConfig, SenderConfig
from capturer.errors import CapturerError, CheckpointError, ConfigError
from capturer.regions import check_module as region_checks
from capturer.regions import kind as region_kind
from capturer.regions import make_region
from capturer.util.ini import IniFile, read_ini
from capturer.util.probe import Outcome, Probe, RegionCheck, SenderCheck, not_writable, unreadable

log = logging.getLogger(__name__)

OK, REFUSED, UNREACHABLE = 0, 2, 3
CONNECT_TIMEOUT = 5.0  # seconds for each source or destination (they are tried at once)


@dataclass
class CheckReport:
    """What the check found. ``problems``: a start would refuse (or fail on) them;
    ``unreachable``: a source or destination failed its ``--connect`` check;
    ``notes``: worth knowing, not failing; ``passed``: the ``--connect`` checks that
    passed, with what they saw; ``checked``: what was looked at."""

    problems: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return REFUSED if self.problems else UNREACHABLE if self.unreachable else OK


# --- the whole check ------------------------------------------------------------------


def _no_probes(cfg: AppConfig, timeout: float) -> list[Probe]:
    return []


@dataclass(frozen=True)
class Root:
    """What the check needs of the composition root (``capturer.app.check_root()``), handed
    in so that this module names neither the Capturer nor a sender kind: ``build(cfg)``
    the Capturer a start builds (``check_only``), ``sender_checks(name)`` a sender kind's
    check module (senders/<kind>/check.py) or None, ``probes(cfg, timeout)`` more
    ``--connect`` probes (etcd for ``[ha]``)."""

    build: Callable[[AppConfig], Any]
    sender_checks: Callable[[str], Any]
    probes: Callable[[AppConfig, float], list[Probe]] = _no_probes


def run_check(cfg: AppConfig, root: Root, connect: bool = False, timeout: float = CONNECT_TIMEOUT) -> CheckReport:
    """``--check`` (and ``--connect``) of a loaded config. Secrets of the config never
    appear in the report."""
    report = CheckReport()
    built = build(cfg, report, root)
    try:
        report.problems += offline_problems(cfg, report, root.sender_checks)
        if connect:
            if built.cap is None:
                report.notes.append("--connect: nothing was tried: a start stops at the problem above before it "
                                    "connects to anything")
            else:
                connect_checks(cfg, built, report, root, timeout)
    finally:
        built.release()
    log.info("checked: %s", "; ".join(report.checked))
    secrets = _secrets(cfg)
    for name in ("problems", "unreachable", "notes", "passed"):
        setattr(report, name, [_mask(line, secrets) for line in getattr(report, name)])
    return report


@dataclass
class Built:
    """The Capturer a start would build (None if it refused), and each region as
    its kind builds it (a ``process = true`` region's worker builds the kind's region
    in its own process: it is built here too, with the same context)."""

    cap: Any  # the Capturer (None: a start would refuse)
    kind_regions: list[Any] = field(default_factory=list)

    def release(self) -> None:
        """Let go of what building took (a worker region's socket directory, a meta
        client's HTTP session, the MySQL sender's worker pools). Nothing was started."""
        if self.cap is None:
            return
        for r in {id(r): r for r in [*self.cap.regions, *self.kind_regions]}.values():
            try:
                r._on_exit()
            except Exception as exc:
                log.debug("region %s: release: %s", r.name, exc)
        for s in self.cap.senders:
            try:
                s.close()
            except Exception as exc:
                log.debug("sender %s: release: %s", s.name, exc)


def build(cfg: AppConfig, report: CheckReport, root: Root) -> Built:
    """``Capturer(cfg)`` as a start builds it, with the backlog opened read-only. A
    refusal goes into ``report.problems`` worded as a start words it."""
    report.problems += _journal_bytes(cfg)
    try:
        cap = root.build(cfg)
    except (ConfigError, CheckpointError) as exc:
        msg = str(exc)
        if isinstance(exc, CheckpointError) and str(cfg.checkpoint_path) not in msg:
            msg = f"{cfg.checkpoint_path}: {msg}"  # (as the start's refusal names the file)
        report.problems.append(msg)
        return Built(None)
    except CapturerError as exc:  # e.g. a region kind whose client library is missing
        report.problems.append(str(exc))
        return Built(None)
    except Exception as exc:  # a start would end with a traceback
        if not report.problems:  # (a journal's bytes were named above already)
            report.problems.append(f"a start would fail: {type(exc).__name__}: {exc}")
        return Built(None)
    built = Built(cap)
    for r, rc in zip(cap.regions, cfg.regions):
        if not getattr(rc, "process", False):
            built.kind_regions.append(r)
            continue
        try:  # what the worker process builds (capturer/agent/config.py worker_config)
            local: Any = rc  # (a kind that reads its source itself)
            built.kind_regions.append(make_region(dataclasses.replace(local, process=False), r.ctx))
        except CapturerError as exc:
            report.problems.append(f"{exc} (region {rc.name} runs in a worker process: process = true)")
            built.release()
            return Built(None)
    for r, rc in zip(built.kind_regions, cfg.regions):
        checks = region_checks(rc.type)  # what a kind refuses only when it connects
        if checks is not None and hasattr(checks, "refusals"):
            report.problems += checks.refusals(_region_check(rc, r, cfg, _ini(cfg.path)))
    paused = [s.name for s in cap.senders if s.paused]
    if paused:
        report.notes.append(f"sender(s) {', '.join(paused)} start paused: {cap.paused_path} lists them (resume: "
                            "python -m capturer resume NAME once it runs)")
    report.checked += [f"filter {cfg.filter_path or '(none)'}", f"checkpoint {cfg.checkpoint_path}",
                       "its lift journal, paused senders and region journals",
                       f"backlog {cfg.backlog_path}" if cfg.backlog_max_mb else "no backlog",
                       f"{len(cap.regions)} region(s) and {len(cap.senders)} sender(s) built"]
    return built


def _journal_bytes(cfg: AppConfig) -> list[str]:
    """Journals next to the checkpoint that are not UTF-8 text: a start fails on them
    with a decoding error that does not name the file (``durable.read_journal``)."""
    cp = cfg.checkpoint_path
    paths = [cp.with_name(cp.name + ".lifts")] + [
        cp.with_name(f"{cp.name}.{r.type}.{r.name}") for r in cfg.regions if region_kind(r.type).journal]
    out = []
    for p in paths:
        try:
            p.read_bytes().decode("utf-8")
        except FileNotFoundError:
            continue
        except UnicodeDecodeError as exc:
            line = p.read_bytes()[:exc.start].count(b"\n") + 1
            out.append(f"{p}:{line}: not UTF-8 text (byte {exc.start}): this journal is damaged; restore it, or "
                       "delete it together with the checkpoint to start over")
        except OSError as exc:
            out.append(f"{p}: cannot read: {exc.strerror or exc}")
    return out


# --- what a start finds only later --------------------------------------------------


def offline_problems(cfg: AppConfig, report: CheckReport, sender_checks: Callable[[str], Any]) -> list[str]:
    """Paths the capturer and its senders write, TLS files, client libraries and Java:
    what the Capturer's constructor does not look at, and a start finds later (then a
    stage fails). Independent of whether the Capturer could be built."""
    ini = _ini(cfg.path)
    out: list[str] = []
    where_cp = ini.where("global", "binlogCheckPointPath") if ini else str(cfg.path)
    why = not_writable(cfg.checkpoint_path.parent)
    if why:
        out.append(f"{where_cp} = {cfg.checkpoint_path}: the checkpoint cannot be written: {why}")
    if cfg.backlog_max_mb > 0:
        why = not_writable(cfg.backlog_path)
        if why:
            key = "backlogDir" if cfg.backlog_dir is not None else "binlogCheckPointPath"
            out.append(f"{ini.where('global', key) if ini else cfg.path}: the backlog {cfg.backlog_path} cannot be "
                       f"written: {why} (or set backlogMaxMB = 0 to run without one)")
    if cfg.spill_dir and cfg.spill_rows:
        d = Path(cfg.spill_dir)
        why = "does not exist" if not d.is_dir() else not_writable(d)
        if why:
            out.append(f"{ini.where('global', 'spillDir') if ini else cfg.path} = {d}: {why}: transactions past "
                       "spillRows are kept there (create it, or leave spillDir empty for the system's temp dir)")
    for rc in cfg.regions:
        checks = region_checks(rc.type)
        if checks is not None and hasattr(checks, "offline"):
            out += checks.offline(_region_check(rc, None, cfg, ini))
    sender_ini = _ini(cfg.sender_config_path)
    for s in cfg.senders:
        out += _sender_offline(s, sender_ini, cfg, sender_checks)
    report.checked += ["paths to write", "TLS files", "client libraries", "Java for Spark"]
    return out


def _ini(path: Path) -> IniFile | None:
    try:
        return read_ini(path)
    except ConfigError:
        return None


def _where(ini: IniFile | None, path: Path, section: str, key: str) -> str:
    return ini.where(section, key) if ini is not None else f"{path}: [{section}] {key}"


# a sender option naming a TLS file (e.g. conf.spark.ssl.keyStore); none of the senders has one of its own yet
_TLS_OPTION = re.compile(r"(ssl|tls).*(ca|ca_?file|cert|cert_?file|key|key_?file|key_?store|trust_?store|location|"
                         r"file|path)$", re.I)


def _sender_offline(s: SenderConfig, ini: IniFile | None, cfg: AppConfig, sender_checks: Callable[[str], Any]
                    ) -> list[str]:
    """TLS files a sender's options name, and its kind's own offline checks."""
    out = []
    opts = s.options
    for key, value in [*opts.items(), *(opts.get("conf.*") or {}).items()]:
        if isinstance(value, str) and value and _TLS_OPTION.search(key):
            why = unreadable(Path(value).expanduser())
            if why:
                out.append(f"{_where(ini, s.path, s.name, key)} = {value}: {why}")
    checks = sender_checks(s.name)
    if checks is not None and hasattr(checks, "offline"):
        out += checks.offline(_sender_check(s, ini, cfg))
    return out


def _sender_check(s: SenderConfig, ini: IniFile | None, cfg: AppConfig, timeout: float = CONNECT_TIMEOUT
                  ) -> SenderCheck:
    return SenderCheck(s.name, s.options, s.path, cfg.queue_rows, timeout,
                       (lambda section, key: _where(ini, s.path, section, key)))


# --- --connect ---------------------------------------------------------------------


def connect_checks(cfg: AppConfig, built: Built, report: CheckReport, root: Root, timeout: float = CONNECT_TIMEOUT
                   ) -> None:
    """Every source and destination at once, each within ``timeout`` seconds."""
    assert built.cap is not None
    probes = [_region_probe(rc, r, cfg, timeout) for rc, r in zip(cfg.regions, built.kind_regions)]
    probes += [_sender_probe(s, cfg, timeout, root.sender_checks) for s in cfg.senders]
    probes += root.probes(cfg, timeout)
    for out in run_probes(probes, timeout):
        report.unreachable += out.problems
        report.notes += out.notes
        if not out.problems:
            report.passed.append(f"{out.name}: {out.detail}" if out.detail else out.name)
    report.checked.append(f"{len(probes)} connection(s)")


def run_probes(probes: list[Probe], timeout: float) -> list[Outcome]:
    """Run every probe in a thread of its own, all at once; one that has not finished
    after ``timeout`` seconds is a problem (its thread is left behind: it is a daemon)."""
    runs = []
    for p in probes:
        out = Outcome(p.name)
        t = threading.Thread(target=_run_probe, args=(p, out), name=f"check {p.name}", daemon=True)
        t.start()
        runs.append((p, out, t))
    deadline = time.monotonic() + timeout
    results = []
    for p, out, t in runs:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            out = Outcome(p.name, [f"{p.name}: no answer within {timeout:g} s (a host that is down, or a firewall "
                                   f"that drops the packets?){'; ' + p.hint if p.hint else ''}"])
        results.append(out)
    return results


def _run_probe(p: Probe, out: Outcome) -> None:
    try:
        p.run(out)
    except CapturerError as exc:  # these name their region or sender
        text = str(exc)
        out.problems.append(text if text.startswith(("region ", "sender ")) else f"{p.name}: {text}")
        if p.hint:
            out.problems[-1] += f"; {p.hint}"
    except Exception as exc:
        out.problems.append(f"{p.name}: {type(exc).__name__}: {exc}" + (f"; {p.hint}" if p.hint else ""))


# --- sources ---


def _region_check(rc: AnyRegionConfig, region: Any, cfg: AppConfig, ini: IniFile | None,
                  timeout: float = CONNECT_TIMEOUT) -> RegionCheck:
    return RegionCheck(rc, region, cfg.path, cfg.checkpoint_path, timeout,
                       (lambda section, key: _where(ini, cfg.path, section, key)))


def _region_probe(rc: AnyRegionConfig, region: Any, cfg: AppConfig, timeout: float) -> Probe:
    """The kind's ``--connect`` probe (capturer/regions/<kind>/check.py)."""
    checks = region_checks(rc.type)
    if checks is None or not hasattr(checks, "probe"):
        return Probe(f"region {rc.name} ({rc.type})", lambda out: None)
    p: Probe = checks.probe(_region_check(rc, region, cfg, _ini(cfg.path), timeout))
    return p


# --- destinations ---


def _sender_probe(s: SenderConfig, cfg: AppConfig, timeout: float, sender_checks: Callable[[str], Any]) -> Probe:
    """The kind's ``--connect`` probe (a kind without one: its config was checked)."""
    checks = sender_checks(s.name)
    if checks is not None and hasattr(checks, "probe"):
        p: Probe = checks.probe(_sender_check(s, _ini(s.path), cfg, timeout))
        return p
    return Probe(f"sender {s.name}", lambda out: None)


# --- output ---


def _secrets(cfg: AppConfig) -> list[str]:
    """The config's passwords and tokens, longest first (a password equal to a user
    name is no secret: the effective config shows user names)."""
    values = [cfg.control_token] + [getattr(r, k, "") for r in cfg.regions for k in ("password", "token")]
    values += [str(v) for s in cfg.senders for k, v in s.options.items() if k in s.secret]
    users = {getattr(r, "user", "") for r in cfg.regions} | {str(s.options.get("user", "")) for s in cfg.senders}
    return sorted({v for v in values if len(v) >= 3 and v not in users}, key=len, reverse=True)


def _mask(line: str, secrets: list[str]) -> str:
    for v in secrets:
        line = line.replace(v, "***")
    return line
