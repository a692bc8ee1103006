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
import importlib.util
import logging
import os
import re
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer import app
from capturer.config import (
    AnyRegionConfig,
    AppConfig,
    BaikalRegionConfig,
    PostgresRegionConfig,
    RegionConfig,
    RemoteRegionConfig,
    SenderConfig,
)
from capturer.errors import CapturerError, CheckpointError, ConfigError
from capturer.model import LsnPosition
from capturer.regions import make_region
from capturer.regions.base import require_start_kind
from capturer.util.ini import IniFile, read_ini

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


def run_check(cfg: AppConfig, connect: bool = False, timeout: float = CONNECT_TIMEOUT) -> CheckReport:
    """``--check`` (and ``--connect``) of a loaded config. Secrets of the config never
    appear in the report."""
    report = CheckReport()
    built = build(cfg, report)
    try:
        report.problems += offline_problems(cfg, report)
        if connect:
            if built.cap is None:
                report.notes.append("--connect: nothing was tried: a start stops at the problem above before it "
                                    "connects to anything")
            else:
                connect_checks(cfg, built, report, timeout)
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

    cap: app.Capturer | None
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


def build(cfg: AppConfig, report: CheckReport) -> Built:
    """``Capturer(cfg)`` as a start builds it, with the backlog opened read-only. A
    refusal goes into ``report.problems`` worded as a start words it."""
    report.problems += _journal_bytes(cfg)
    try:
        cap = app.Capturer(cfg, check_only=True)
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
            local: Any = rc  # (a local kind: mysql, postgresql, baikaldb)
            built.kind_regions.append(make_region(dataclasses.replace(local, process=False), r.ctx))
        except CapturerError as exc:
            report.problems.append(f"{exc} (region {rc.name} runs in a worker process: process = true)")
            built.release()
            return Built(None)
    for r, rc in zip(built.kind_regions, cfg.regions):
        if isinstance(rc, PostgresRegionConfig):
            try:  # (a PostgreSQL region refuses it when it connects)
                require_start_kind(r.ctx, rc.name, "postgresql", LsnPosition)
            except CheckpointError as exc:
                report.problems.append(f"{cfg.checkpoint_path}: {exc}")
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
        cp.with_name(f"{cp.name}.{r.type}.{r.name}") for r in cfg.regions if r.type in ("postgresql", "baikaldb")]
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


def offline_problems(cfg: AppConfig, report: CheckReport) -> list[str]:
    """Paths the capturer and its senders write, TLS files, client libraries and Java:
    what the Capturer's constructor does not look at, and a start finds later (then a
    stage fails). Independent of whether the Capturer could be built."""
    ini = _ini(cfg.path)
    out: list[str] = []
    where_cp = ini.where("global", "binlogCheckPointPath") if ini else str(cfg.path)
    why = _not_writable(cfg.checkpoint_path.parent)
    if why:
        out.append(f"{where_cp} = {cfg.checkpoint_path}: the checkpoint cannot be written: {why}")
    if cfg.backlog_max_mb > 0:
        why = _not_writable(cfg.backlog_path)
        if why:
            key = "backlogDir" if cfg.backlog_dir is not None else "binlogCheckPointPath"
            out.append(f"{ini.where('global', key) if ini else cfg.path}: the backlog {cfg.backlog_path} cannot be "
                       f"written: {why} (or set backlogMaxMB = 0 to run without one)")
    if cfg.spill_dir and cfg.spill_rows:
        d = Path(cfg.spill_dir)
        why = "does not exist" if not d.is_dir() else _not_writable(d)
        if why:
            out.append(f"{ini.where('global', 'spillDir') if ini else cfg.path} = {d}: {why}: transactions past "
                       "spillRows are kept there (create it, or leave spillDir empty for the system's temp dir)")
    for rc in cfg.regions:
        if isinstance(rc, RemoteRegionConfig):
            out += _tls_problems(rc, ini, cfg.path)
    sender_ini = _ini(cfg.sender_config_path)
    for s in cfg.senders:
        out += _sender_offline(s, sender_ini, cfg)
    report.checked += ["paths to write", "TLS files", "client libraries", "Java for Spark"]
    return out


def _ini(path: Path) -> IniFile | None:
    try:
        return read_ini(path)
    except ConfigError:
        return None


def _where(ini: IniFile | None, path: Path, section: str, key: str) -> str:
    return ini.where(section, key) if ini is not None else f"{path}: [{section}] {key}"


def _not_writable(directory: Path) -> str:
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


def _tls_problems(rc: RemoteRegionConfig, ini: IniFile | None, path: Path) -> list[str]:
    out = []
    section = f"region:{rc.name}"
    for key in ("tls_ca", "tls_cert", "tls_key"):
        value = getattr(rc, key)
        if value:
            why = _unreadable(Path(value).expanduser())
            if why:
                out.append(f"{_where(ini, path, section, key)} = {value}: {why}")
    if out:
        return out
    try:
        if rc.tls_ca:
            ssl.create_default_context(cafile=str(Path(rc.tls_ca).expanduser()))
    except (ssl.SSLError, ValueError) as exc:
        out.append(f"{_where(ini, path, section, 'tls_ca')} = {rc.tls_ca}: not a PEM CA certificate ({exc})")
    try:
        if rc.tls_cert:
            ssl.create_default_context().load_cert_chain(str(Path(rc.tls_cert).expanduser()),
                                                         str(Path(rc.tls_key).expanduser()))
    except (ssl.SSLError, ValueError) as exc:
        out.append(f"{_where(ini, path, section, 'tls_cert')} = {rc.tls_cert} with tls_key = {rc.tls_key}: not a "
                   f"PEM certificate and its key ({exc})")
    return out


def _unreadable(p: Path) -> str:
    try:
        with open(p, "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return ""


# a sender option naming a TLS file (e.g. conf.spark.ssl.keyStore); none of the senders has one of its own yet
_TLS_OPTION = re.compile(r"(ssl|tls).*(ca|ca_?file|cert|cert_?file|key|key_?file|key_?store|trust_?store|location|"
                         r"file|path)$", re.I)


def _sender_offline(s: SenderConfig, ini: IniFile | None, cfg: AppConfig) -> list[str]:
    out = []
    opts = s.options
    for key, value in [*opts.items(), *(opts.get("conf.*") or {}).items()]:
        if isinstance(value, str) and value and _TLS_OPTION.search(key):
            why = _unreadable(Path(value).expanduser())
            if why:
                out.append(f"{_where(ini, s.path, s.name, key)} = {value}: {why}")
    if s.name == "local":
        f = Path(opts["filepath"])
        why = _not_writable(f.parent)
        if not why and f.exists():
            why = f"{f} is not a file" if not f.is_file() else \
                f"{f} is not writable by this user" if not os.access(f, os.R_OK | os.W_OK) else ""
        if why:
            out.append(f"{_where(ini, s.path, s.name, 'filepath')} = {f}: the sender cannot write it: {why}")
    elif s.name == "kafka":
        module = "confluent_kafka" if opts["client"] == "confluent" else "kafka"
        if importlib.util.find_spec(module) is None:
            out.append(f"{_where(ini, s.path, s.name, 'client')} = {opts['client']}: its library ({module}) is not "
                       "installed: .venv/bin/pip install -e '.[" +
                       ("confluent" if module == "confluent_kafka" else "kafka") + "]' (start.sh installs it)")
    elif s.name == "spark":
        out += _spark_offline(s, ini, cfg)
    return out


def _spark_offline(s: SenderConfig, ini: IniFile | None, cfg: AppConfig) -> list[str]:
    out = []
    missing = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        out.append(f"{_where(ini, s.path, 'global', 'type')}: the spark sender needs {' and '.join(missing)}: "
                   "sh start.sh installs them (or: .venv/bin/pip install -e '.[spark]')")
    why = _not_writable(Path(s.options["warehouse"]))
    if why:
        out.append(f"{_where(ini, s.path, s.name, 'warehouse')} = {s.options['warehouse']}: the lake cannot be "
                   f"written: {why}")
    sender = _plain_sender(s, cfg)
    needs, found = _spark_java(sender)
    if needs and not found:
        reason = ("writer=spark" if s.options["writer"] == "spark" else "a persistent catalog"
                  if sender._session_at_open() else f"compaction_interval={s.options['compaction_interval']:g}")
        home = os.environ.get("JAVA_HOME")
        out.append(f"{_where(ini, s.path, s.name, 'compaction_interval')}: the spark sender will start a Spark "
                   f"session ({reason}) and needs Java (17): " +
                   (f"JAVA_HOME={home} has no bin/java" if home else "none on PATH and no JAVA_HOME") +
                   "; sh start.sh installs it (apt-get install openjdk-17-jre-headless), or set compaction_interval "
                   "= 0 (with writer = arrow and the in-memory catalog no session is started)")
    return out


def _plain_sender(s: SenderConfig, cfg: AppConfig) -> Any:
    """The sender as it runs (in the capturer, or in its own process with
    ``process = true``): built, not opened."""
    return app.sender_class(s.name)(s.name, {k: v for k, v in s.options.items() if k != "process"}, cfg.queue_rows)


def _spark_java(sender: Any) -> tuple[bool, bool]:
    """(the Spark sender will start a session, a Java is found): the sender's own rule
    (its ``open``) and its module's way of finding Java (JAVA_HOME, else PATH)."""
    needs = bool(sender._session_at_open() or float(sender.options["compaction_interval"]))
    java_found: Callable[[], bool] = sys.modules[type(sender).__module__]._java_found
    return needs, java_found()


# --- --connect ---------------------------------------------------------------------


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


def connect_checks(cfg: AppConfig, built: Built, report: CheckReport, timeout: float = CONNECT_TIMEOUT) -> None:
    """Every source and destination at once, each within ``timeout`` seconds."""
    assert built.cap is not None
    probes = [_region_probe(rc, r, cfg, timeout) for rc, r in zip(cfg.regions, built.kind_regions)]
    probes += [_sender_probe(s, f"[{s.name}] of {s.path}", cfg, timeout) for s in cfg.senders]
    if cfg.ha is not None:
        probes.append(_ha_probe(cfg, timeout))
    for out in run_probes(probes, timeout):
        report.unreachable += out.problems
        report.notes += out.notes
        if not out.problems:
            report.passed.append(f"{out.name}: {out.detail}" if out.detail else out.name)
    report.checked.append(f"{len(probes)} connection(s)")


def _ha_probe(cfg: AppConfig, timeout: float) -> Probe:
    """[ha]: every etcd endpoint answers; who is active now."""
    from capturer.ha.coord import CoordinationError, Coordinator

    assert cfg.ha is not None
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

    return Probe(f"etcd ({', '.join(hc.endpoints)})", run, f"[ha] endpoints of {cfg.path}")


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


def _region_probe(rc: AnyRegionConfig, region: Any, cfg: AppConfig, timeout: float) -> Probe:
    section = f"[region:{rc.name}] of {cfg.path}"
    if isinstance(rc, RegionConfig):
        return Probe(f"region {rc.name} ({rc.type} {rc.host}:{rc.port})",
                     lambda out: _mysql_source(region, rc, out, cfg), f"check host, port, user, password in {section}")
    if isinstance(rc, PostgresRegionConfig):
        return Probe(f"region {rc.name} (postgresql {rc.host}:{rc.port}/{rc.dbname})",
                     lambda out: _postgres_source(region, rc, out),
                     f"check host, port, user, password, dbname in {section}")
    if isinstance(rc, BaikalRegionConfig):
        return Probe(f"region {rc.name} (baikaldb meta {','.join(rc.metaServer)})",
                     lambda out: _baikal_source(rc, out, timeout), f"check metaServer in {section}")
    return Probe(f"region {rc.name} (agent {','.join(rc.address)})", lambda out: _remote_source(region, rc, out),
                 f"check address, token, agent_region and the TLS settings in {section}")


# MySQL privilege names as SHOW GRANTS writes them (and the aliases newer servers accept)
_REPL_SLAVE = {"REPLICATION SLAVE", "REPLICATION REPLICA"}
_BINLOG_MONITOR = {"BINLOG MONITOR", "REPLICATION CLIENT"}


def _mysql_source(region: Any, rc: RegionConfig, out: Outcome, cfg: AppConfig) -> None:
    import pymysql

    from capturer.errors import FatalSourceError
    from capturer.regions.mysql.region import check_server

    where = region.where
    conn = region._connect()  # the region's own connection (FatalSourceError: access denied)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION(), @@server_id, CURRENT_USER()")
            version, server_id, user = cur.fetchone()
            account = _account(str(user))
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                        "('log_bin','binlog_format','binlog_row_image','binlog_row_metadata','log_bin_compress')")
            variables = {str(k).lower(): str(v) for k, v in cur.fetchall()}
            try:
                check_server(variables, where)
            except FatalSourceError as exc:
                out.problems.append(str(exc))
            if int(server_id or 0) == 0:
                out.problems.append(f"{where}: the server's server_id is 0: a source needs a non-zero server_id "
                                    "(server_id = 1 in its [mariadbd] / [mysqld] section, then restart it)")
            elif int(server_id) == rc.server_id:
                out.notes.append(f"{where}: [region:{rc.name}] server_id = {rc.server_id} is the source's own "
                                 "server_id: give the capturer one of its own (unique among the source's replicas)")
            grants = Grants.read(cur)
            if not grants.has_global(_REPL_SLAVE):
                grants.missing(out, where, f"the REPLICATION SLAVE privilege (reading the binlog): GRANT "
                                           f"REPLICATION SLAVE ON *.* TO {account}")
            logs: list[str] | None = None
            if variables.get("log_bin", "").upper() == "ON":
                try:
                    cur.execute("SHOW BINARY LOGS")
                    logs = [str(r[0]) for r in cur.fetchall()]
                except pymysql.err.MySQLError as exc:
                    out.problems.append(f"{where}: SHOW BINARY LOGS failed ({exc.args[-1]}): grant BINLOG MONITOR "
                                        f"(MariaDB) or REPLICATION CLIENT (MySQL): GRANT BINLOG MONITOR ON *.* TO "
                                        f"{account}")
            if rc.snapshot != "never":
                if not (grants.has_global({"SELECT"}) or grants.db_level({"SELECT"})):
                    grants.missing(out, where, f"the SELECT privilege: snapshot = {rc.snapshot} copies the selected "
                                               f"tables: GRANT SELECT ON *.* TO {account} (or on their databases)")
                try:
                    region.check_snapshot_support()
                except ValueError as exc:
                    out.problems.append(f"{exc}; or set snapshot = never in [region:{rc.name}]")
                else:
                    if region.snap_method == "watermark":
                        out.notes.append(f"{where}: snapshots use the watermark method (no consistent-snapshot "
                                         "binlog position on this server): each chunk is a locking read (LOCK IN "
                                         "SHARE MODE NOWAIT); before MySQL 8.0.22 that needs the LOCK TABLES "
                                         "privilege as well as SELECT")
        if logs is not None:
            _binlog_position(region, rc, logs, out, cfg)
        if not out.problems:
            out.detail = (f"{version}, server_id {server_id}, binlog " +
                          "/".join(variables.get(k, "-") for k in ("binlog_format", "binlog_row_image",
                                                                   "binlog_row_metadata")) +
                          f", {len(logs or [])} binary log(s)" +
                          (f", resumes at {region.ctx.start}" if region.ctx.start is not None else ""))
    finally:
        conn.close()


def _binlog_position(region: Any, rc: RegionConfig, logs: list[str], out: Outcome, cfg: AppConfig) -> None:
    where = region.where
    if not logs:
        out.problems.append(f"{where}: the server lists no binary logs")
        return
    pos = region.ctx.start  # the checkpoint's position for the region
    if pos is not None:
        if pos.file in logs:
            return
        text = (f"{where}: the checkpoint's position {pos} ({cfg.checkpoint_path}) is no longer on the server "
                f"(purged?); the oldest binlog is {logs[0]}")
        if rc.snapshot == "when_needed":
            out.notes.append(text + ": snapshot = when_needed: a start copies every selected table again")
        else:
            out.problems.append(text + ". Rows between would be lost: re-seed the destinations and delete the "
                                       "checkpoint to start over, or set snapshot = when_needed in "
                                       f"[region:{rc.name}] to copy every table again")
    elif rc.snapshot == "never" and rc.start not in ("earliest", "latest"):
        file = rc.start.rpartition(":")[0]
        if file not in logs:
            out.problems.append(f"{where}: [region:{rc.name}] start = {rc.start}: the server has no binlog {file} "
                                f"(it has {logs[0]} .. {logs[-1]})")


def _account(user: str) -> str:
    name, _, host = user.rpartition("@")
    return f"'{name}'@'{host}'" if name else f"'{user}'"


_GRANT = re.compile(r"^GRANT\s+(.+?)\s+ON\s+(?:(?:TABLE|FUNCTION|PROCEDURE|PACKAGE(?:\s+BODY)?)\s+)?(\S+)\s+TO\s",
                    re.I | re.S)


@dataclass
class Grants:
    """What ``SHOW GRANTS`` says the current user holds: global privileges, and per
    database (a LIKE pattern). Column and table grants are not counted (they never
    cover a whole database). Roles: their grants are what the server lists."""

    global_: set[str] = field(default_factory=set)
    dbs: dict[str, set[str]] = field(default_factory=dict)
    roles: bool = False
    readable: bool = True

    @classmethod
    def read(cls, cur: Any) -> Grants:
        import pymysql

        try:
            cur.execute("SHOW GRANTS")
            lines = [str(r[0]) for r in cur.fetchall()]
        except pymysql.err.MySQLError:
            return cls(readable=False)
        return cls.parse(lines)

    @classmethod
    def parse(cls, lines: Iterable[str]) -> Grants:
        g = cls()
        for line in lines:
            m = _GRANT.match(line.strip())
            if m is None:
                if re.match(r"^GRANT\s+\S+\s+TO\s", line.strip(), re.I):
                    g.roles = True  # GRANT role TO user
                continue
            privs = {p.strip().upper() for p in re.sub(r"\([^)]*\)", "", m.group(1)).split(",")}
            if privs & {"ALL", "ALL PRIVILEGES"}:
                privs.add("ALL")
            db, _, table = m.group(2).partition(".")
            if db == "*" and table == "*":
                g.global_ |= privs
            elif table == "*":
                g.dbs.setdefault(_unquote(db), set()).update(privs)
        return g

    def has_global(self, any_of: set[str]) -> bool:
        return bool(self.global_ & (any_of | {"ALL"}))

    def db_level(self, any_of: set[str]) -> list[str]:
        return [db for db, p in self.dbs.items() if p & (any_of | {"ALL"})]

    def on_db(self, db: str, priv: str) -> bool:
        if self.has_global({priv}):
            return True
        return any(p & {priv, "ALL"} and _like(pattern, db) for pattern, p in self.dbs.items())

    def missing(self, out: Outcome, where: str, what: str) -> None:
        """A privilege not seen: a problem, unless the grants could not be read or
        come through roles (then a note: the check cannot tell)."""
        if not self.readable or self.roles:
            out.notes.append(f"{where}: could not confirm {what} (SHOW GRANTS "
                             f"{'failed' if not self.readable else 'lists roles'})")
        else:
            out.problems.append(f"{where}: the user lacks {what}")


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "`'\"":
        return name[1:-1].replace(name[0] * 2, name[0])
    return name


def _like(pattern: str, name: str) -> bool:
    """SQL LIKE as GRANT uses it for database names (``_``, ``%``, ``\\`` escapes)."""
    rx, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            rx.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        rx.append("." if c == "_" else ".*" if c == "%" else re.escape(c))
        i += 1
    return re.fullmatch("".join(rx), name, re.S) is not None


def _postgres_source(region: Any, rc: PostgresRegionConfig, out: Outcome) -> None:
    from capturer.model import parse_lsn
    from capturer.regions.postgresql.region import quote_pg

    where = region.where
    region._connect_side()  # the region's own connection settings
    try:
        q = region._query
        (wal_level, version, superuser, replication, user), = q(
            "SELECT current_setting('wal_level'), current_setting('server_version'), r.rolsuper, r.rolreplication, "
            "current_user::text FROM pg_roles r WHERE r.rolname = current_user")
        if wal_level != "logical":
            out.problems.append(f"{where}: wal_level is {wal_level!r}; logical decoding needs wal_level = logical "
                                "(set it in postgresql.conf, or ALTER SYSTEM SET wal_level = logical, and restart "
                                "PostgreSQL)")
        if not (superuser or replication):
            out.problems.append(f"{where}: role {user!r} has neither REPLICATION nor SUPERUSER: "
                                f"ALTER ROLE {quote_pg(user)} WITH REPLICATION")
        pub = rc.publication
        if not q("SELECT 1 FROM pg_publication WHERE pubname = %s", (pub,)):
            if rc.create_publication == "no":
                out.problems.append(
                    f"{where}: publication {pub!r} does not exist in database {rc.dbname!r}; create it "
                    f"(CREATE PUBLICATION {quote_pg(pub)} FOR ALL TABLES) or set create_publication = all")
            elif rc.create_publication == "all" and not superuser:
                out.problems.append(f"{where}: publication {pub!r} does not exist, and creating it FOR ALL TABLES "
                                    f"(create_publication = all) needs a superuser; {user!r} is not one: create it "
                                    "as one, or list the tables in create_publication")
            else:
                out.notes.append(f"{where}: publication {pub!r} does not exist: a start creates it "
                                 f"(create_publication = {rc.create_publication})")
        start = region.ctx.start
        slot = rc.slot
        rows = q("SELECT plugin, database, confirmed_flush_lsn::text, wal_status FROM pg_replication_slots "
                 "WHERE slot_name = %s", (slot,))
        if rows:
            plugin, database, confirmed, wal_status = rows[0]
            if plugin != "pgoutput" or database != rc.dbname:
                out.problems.append(f"{where}: replication slot {slot!r} uses plugin {plugin!r} in database "
                                    f"{database!r}; this region needs a pgoutput slot in {rc.dbname!r} (drop it, or "
                                    f"name another in slot =)")
            if wal_status == "lost":
                out.problems.append(f"{where}: replication slot {slot!r} lost WAL it needed (wal_status lost); "
                                    "the changes since are gone")
            if start is not None and confirmed and parse_lsn(confirmed) > start.lsn:
                out.problems.append(f"{where}: replication slot {slot!r} was confirmed up to {confirmed}, past the "
                                    f"checkpoint's LSN {start}: the changes in between are gone from it")
        elif start is not None:
            out.problems.append(f"{where}: replication slot {slot!r} does not exist, but the checkpoint needs the "
                                f"changes after LSN {start}; they are gone with the slot")
        elif not rc.create_slot:
            out.problems.append(f"{where}: replication slot {slot!r} does not exist; create it (SELECT "
                                f"pg_create_logical_replication_slot('{slot}', 'pgoutput')) or set create_slot = true")
        else:
            (slots, max_slots, senders, max_senders), = q(
                "SELECT (SELECT count(*) FROM pg_replication_slots), current_setting('max_replication_slots')::int, "
                "(SELECT count(*) FROM pg_stat_replication), current_setting('max_wal_senders')::int")
            if slots >= max_slots:
                out.problems.append(f"{where}: replication slot {slot!r} must be created, but all "
                                    f"max_replication_slots = {max_slots} are taken: raise it in postgresql.conf "
                                    "(and restart), or drop an unused slot")
            if senders >= max_senders:
                out.problems.append(f"{where}: all max_wal_senders = {max_senders} WAL senders are busy: raise it "
                                    "in postgresql.conf (and restart)")
            out.notes.append(f"{where}: replication slot {slot!r} does not exist: a start creates it "
                             "(create_slot = true)")
        if rc.snapshot != "never":
            # a snapshot reads every published table the filter selects
            unreadable = [f"{db}.{t}" for db, t, ok in region._query(
                "SELECT schemaname::text, tablename::text, has_table_privilege(format('%%I.%%I', schemaname, "
                "tablename), 'SELECT') FROM pg_publication_tables WHERE pubname = %s", (rc.publication,))
                if not ok and region.ctx.table_selected(db, t)]
            if unreadable:
                out.problems.append(f"{where}: snapshot = {rc.snapshot} copies the published tables, but role {user} "
                                    f"may not read {', '.join(unreadable[:5])}"
                                    + (f" ({len(unreadable) - 5} more)" if len(unreadable) > 5 else "")
                                    + f": GRANT SELECT ON ... TO {quote_pg(user)}")
        _toast_advice(region, rc, out)
        if not out.problems:
            out.detail = f"PostgreSQL {version}, wal_level {wal_level}, role {user}" + \
                (f", slot {slot}" if rows else "")
    finally:
        region._after_attempt()


def _toast_advice(region: Any, rc: PostgresRegionConfig, out: Outcome) -> None:
    """Published tables under REPLICA IDENTITY DEFAULT with columns PostgreSQL may TOAST:
    an update that leaves such a value unchanged does not log it, and the region reads
    it back from the table (``toast_fill``); REPLICA IDENTITY FULL logs it with the old
    row (docs/regions-postgresql.md weighs the two)."""
    tables = [f"{db}.{t}" for db, t in region._query(
        "SELECT p.schemaname::text, p.tablename::text FROM pg_publication_tables p "
        "JOIN pg_namespace n ON n.nspname = p.schemaname JOIN pg_class c ON c.relnamespace = n.oid "
        "AND c.relname = p.tablename WHERE p.pubname = %s AND c.relreplident = 'd' AND EXISTS (SELECT 1 FROM "
        "pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attlen = -1 "
        "AND a.attstorage <> 'p') ORDER BY 1, 2", (rc.publication,)) if region.ctx.table_selected(db, t)]
    if not tables:
        return
    names = ", ".join(tables[:5]) + (f" ({len(tables) - 5} more)" if len(tables) > 5 else "")
    fill = ("the region reads them back from the table by key once the transaction is visible (toast_fill)"
            if rc.toast_fill else "toast_fill = false: those changes leave the values out")
    out.notes.append(f"{region.where}: {names}: REPLICA IDENTITY DEFAULT with columns PostgreSQL may TOAST: an update "
                     f"that leaves such a value unchanged does not log it; {fill}. ALTER TABLE ... REPLICA IDENTITY "
                     "FULL logs it with the old row (no read back; more WAL per update and delete: see "
                     "docs/regions-postgresql.md)")


def _baikal_source(rc: BaikalRegionConfig, out: Outcome, timeout: float) -> None:
    from capturer.regions.baikaldb.client import MetaClient

    where = f"region {rc.name} (BaikalDB binlog table {rc.binlogTableID})"
    meta = MetaClient(list(rc.metaServer), min(rc.connect_timeout, timeout), timeout, where)
    try:
        regions = meta.query_regions(rc.binlogTableID)
    finally:
        meta.close()
    ids = {int(r.region_id) for r in regions}
    if not ids:
        out.problems.append(f"{where}: the meta server knows no region of table {rc.binlogTableID}: check "
                            f"binlogTableID in [region:{rc.name}]")
    missing = sorted(set(rc.binlogRegionID) - ids)
    if ids and missing:
        out.problems.append(f"{where}: binlogRegionID {','.join(map(str, missing))} is not a region of table "
                            f"{rc.binlogTableID} (it has {','.join(map(str, sorted(ids)))})")
    out.detail = f"the meta answered: {len(ids)} binlog region(s)"


def _remote_source(region: Any, rc: RemoteRegionConfig, out: Outcome) -> None:
    # the request a capturer makes before a snapshot: the agent checks the token and the
    # region's name; with no table asked, it does not reach for its source
    from capturer.errors import SourceError

    try:
        region.tables_info([])
    except SourceError as exc:
        raise SourceError(f"region {rc.name} (agent {','.join(rc.address)}): no agent answered: "
                          + str(exc).split(" (", 1)[-1].removesuffix(")")) from None
    out.detail = f"the agent serves region {rc.remote_name!r}" + (" over TLS" if rc.uses_tls else "")


# --- destinations ---


def _sender_probe(s: SenderConfig, section: str, cfg: AppConfig, timeout: float) -> Probe:
    opts = s.options
    if s.name == "mysql":
        return Probe(f"sender mysql ({opts['host']}:{opts['port']})", lambda out: _mysql_target(s, cfg, out),
                     f"check host, port, user, password in {section}")
    if s.name == "kafka":
        return Probe(f"sender kafka ({opts['servers']})", lambda out: _kafka_target(s, out, timeout),
                     f"check servers in {section}")
    if s.name == "spark":
        return Probe(f"sender spark ({Path(opts['warehouse'])})", lambda out: _spark_target(s, cfg, out))
    return Probe(f"sender {s.name} ({opts.get('filepath', '')})",
                 lambda out: setattr(out, "detail", "its directory is writable"))


def _mysql_target(s: SenderConfig, cfg: AppConfig, out: Outcome) -> None:
    sender = _plain_sender(s, cfg)
    where = f"sender {s.name} ({s.options['host']}:{s.options['port']})"
    try:
        conn = sender.workers[0].connect()  # the sender's own connection and session set-up
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION(), CURRENT_USER()")
            version, user = cur.fetchone()
            account = _account(str(user))
            grants = Grants.read(cur)
            db = s.options["database"]
            need = ["SELECT", "INSERT", "UPDATE", "DELETE"]
            if s.options["ddl"] == "apply":
                need += ["CREATE", "ALTER", "DROP", "INDEX"]
            if db:
                cur.execute("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (db,))
                if cur.fetchone() is None:
                    out.problems.append(f"{where}: database {db!r} (database = in [{s.name}] of {s.path}) does not "
                                        f"exist on the target, and the sender does not create it: CREATE DATABASE "
                                        f"`{db}`")
                lacking = [p for p in need if not grants.on_db(db, p)]
                if lacking:
                    grants.missing(out, where, f"{', '.join(lacking)} on database {db!r}: GRANT "
                                               f"{', '.join(lacking)} ON `{db}`.* TO {account}")
            else:
                lacking = [p for p in need if not grants.has_global({p})]
                dbs = grants.db_level(set(need))
                if lacking and not dbs:
                    grants.missing(out, where, f"{', '.join(lacking)} (database = is empty: tables go to databases "
                                               f"of the sources' names): GRANT {', '.join(lacking)} ON *.* TO "
                                               f"{account}, or on those databases")
                elif lacking:
                    out.notes.append(f"{where}: {', '.join(lacking)} are granted on database(s) "
                                     f"{', '.join(sorted(dbs))} only: database = is empty, so tables go to "
                                     "databases of the sources' names; they must be among these")
            meta = s.options["meta_database"]
            if meta and not all(grants.on_db(meta, p) for p in ("CREATE", "SELECT", "INSERT", "UPDATE")):
                out.notes.append(f"{where}: the user cannot keep replay protection in {meta!r} (meta_database): "
                                 "tables without keys are not protected against replays; GRANT CREATE, SELECT, "
                                 f"INSERT, UPDATE ON `{meta}`.* TO {account}, or set meta_database = to silence this")
        conn.rollback()
        if not out.problems:
            out.detail = f"{version}, user {user}" + (f", database {db}" if db else "")
    finally:
        sender.close()


def _kafka_target(s: SenderConfig, out: Outcome, timeout: float) -> None:
    """A metadata answer from the bootstrap servers, with the client the sender is
    configured with, within its own time limit (before the probe's)."""
    from capturer.util.kafkasec import Watch

    servers = s.options["servers"]
    wait = max(0.5, timeout - 2)  # (kafka-python takes a while past its own limit)
    watch = Watch()  # what the client said: a refused login, a certificate the CA did not sign
    try:
        if s.options["client"] == "confluent":
            brokers = _confluent_brokers(servers, wait, s.options, watch)
        else:
            brokers = _kafka_python_brokers(servers, wait, s.options, watch)
    except Exception as exc:  # each client's own error types
        explained = watch.explain(f"sender {s.name} ({servers})", s.options, exc, f"[{s.name}] of {s.path}")
        if explained is not None:
            out.problems.append(explained)
            return
        why = str(exc) if str(exc).startswith(type(exc).__name__) else f"{type(exc).__name__}: {exc}"
        out.problems.append(f"sender {s.name} ({servers}): no metadata answer within {wait:g} s ({why}); check "
                            f"servers in [{s.name}] of {s.path}")
        return
    out.detail = f"{brokers} broker(s) answered ({s.options['client']})"


def _confluent_brokers(servers: str, wait: float, opts: dict[str, Any] | None = None, watch: Any = None) -> int:
    from confluent_kafka.admin import AdminClient

    from capturer.util.kafkasec import librdkafka_conf

    conf: dict[str, Any] = {**librdkafka_conf(opts or {}), "bootstrap.servers": servers, "logger": log}
    if watch is not None:
        conf["error_cb"] = watch
    admin = AdminClient(conf)
    try:
        return len(admin.list_topics(timeout=wait).brokers)
    except Exception:
        admin.poll(0)  # serves error_cb: what the broker connections said
        raise


def _kafka_python_brokers(servers: str, wait: float, opts: dict[str, Any] | None = None, watch: Any = None) -> int:
    from kafka.admin import KafkaAdminClient

    from capturer.util.kafkasec import Watch, kafka_python_conf

    kw: dict[str, Any] = {"bootstrap_servers": servers.split(","), "request_timeout_ms": int(wait * 1000),
                          **kafka_python_conf(opts or {})}
    if "bootstrap_timeout_ms" in KafkaAdminClient.DEFAULT_CONFIG:
        kw["bootstrap_timeout_ms"] = int(wait * 1000)
    # it logs every failed attempt; the outcome says it once (what it said goes to the watch)
    with (watch or Watch()).kafka_python(quiet=True):
        client = KafkaAdminClient(**kw)
        try:
            return len(client.describe_cluster().get("brokers", []))
        finally:
            client.close()


def _spark_target(s: SenderConfig, cfg: AppConfig, out: Outcome) -> None:
    needs, found = _spark_java(_plain_sender(s, cfg))
    if needs and found:
        import pyspark  # a session will be started: the module must import, not only be there

        out.detail = f"pyspark {pyspark.__version__}, Java found"
    else:
        out.detail = "no Spark session needed at start (writer=arrow, compaction_interval=0)" if not needs else ""


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
