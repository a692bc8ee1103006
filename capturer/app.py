"""The composition root: builds the pipeline from the config and runs it.

    regions -> bounded queues -> MergeStage -> filter -> SenderManager -> senders
                                                         checkpoint <- acks

Stop order: regions and the merger first, then senders drain what is queued
(bounded by a timeout), then a final checkpoint of what was truly acknowledged.
A fatal error in any stage stops everything the same way and exits non-zero.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from capturer import config
from capturer.config import AppConfig
from capturer.errors import CapturerError, CheckpointError, ConfigError, Fenced, SourceError
from capturer.ha.check import probes as ha_probes
from capturer.model import Item, Txn, stream_key, ts_physical_ms
from capturer.ops import verify
from capturer.ops.check import Root
from capturer.ops.status import StatusServer
from capturer.pipeline.backlog import Cut, StreamLog
from capturer.pipeline.checkpoint import Checkpoint, CheckpointKeeper, StateDir, load_checkpoint
from capturer.pipeline.fanout import SenderManager
from capturer.pipeline.filter import Filter, ReloadWindow, load_filter, parse_filter_text
from capturer.pipeline.merger import MergeStage
from capturer.pipeline.segments import Backlog, BacklogMark
from capturer.regions import make_region
from capturer.regions.base import RegionContext
from capturer.regions.clock import LiftJournal
from capturer.regions.copies import CopyJournal
from capturer.regions.group import RegionGroup
from capturer.util.bqueue import WeightedQueue
from capturer.util.durable import rewrite_lines
from capturer.util.ini import read_text_file
from senders import CATALOG, check_module, extra, sender_class
from senders import verify_factories as senders_verify_factories
from senders.process import ProcessSender

log = logging.getLogger(__name__)


def load_config(path: Path | str, base_dir: Path | None = None) -> AppConfig:
    """The capturer's config with senderConfig validated against the sender registry
    (this module is the one place that knows both the capture side and the senders)."""
    return config.load_config(path, base_dir, senders=CATALOG)


def verify_factories() -> dict[str, Any]:
    """How ``verify`` reads each sender's destination (senders/<kind>/verify.py)."""
    return senders_verify_factories()


def check_root() -> Root:
    """What ``--check`` needs of this root (capturer/ops/check.py ``Root``)."""
    return Root(lambda cfg: Capturer(cfg, check_only=True), check_module, ha_probes)


def sender_extra(name: str, options: dict[str, Any]) -> str:
    """The setup.py extra sender ``name`` needs with ``options`` (start.sh installs it)."""
    return extra(name, options)


class HaHooks(Protocol):
    """What the capturer needs of its high-availability node (capturer/ha/node.py)."""

    def publish(self, cp: Checkpoint) -> None: ...
    def status(self) -> dict[str, Any]: ...
    def handover(self) -> tuple[int, dict[str, Any]]: ...


class Capturer:
    def __init__(self, cfg: AppConfig, rebuild_backlog: bool = False, check_only: bool = False,
                 ha: HaHooks | None = None):
        """Builds the pipeline; connects to nothing. ``check_only`` (``--check``): the
        backlog is checked, not repaired (nothing on disk changes)."""
        self.check_only = check_only
        self.ha = ha  # high availability: the node this capturer is the active of (capturer/ha/node.py)
        if not cfg.senders:
            raise ConfigError(f"{cfg.sender_config_path}: no sender loaded: the config was read without the sender "
                              "catalog (use capturer.app.load_config)")
        self.cfg = cfg
        self.stop_event = threading.Event()
        # the rules in force, and the window of a reload waiting for its copies (one
        # attribute: the merge thread reads both at once)
        self._rules: tuple[Filter, ReloadWindow | None] = (load_filter(cfg.filter_path), None)
        # the rules' text in force (told to regions served by agents when a reload is undone)
        self._filter_text = read_text_file(cfg.filter_path, "filter rule file (filterRuleDict)") \
            if cfg.filter_path is not None else ""
        cp = load_checkpoint(cfg.checkpoint_path)
        if cp is None:
            log.info("no checkpoint at %s: first start", cfg.checkpoint_path)
            cp = Checkpoint()
        else:
            log.info("resuming from checkpoint %s: commit_ts=%d %s", cfg.checkpoint_path,
                     cp.commit_ts, {r: str(p) for r, p in cp.regions.items()})
        names = {r.name for r in cfg.regions}
        stale = sorted(set(cp.regions) - names)
        if stale:
            # a renamed region would otherwise start again from its `start` setting: rows lost or repeated
            raise CheckpointError(
                f"{cfg.checkpoint_path}: names region(s) {', '.join(map(repr, stale))} that {cfg.path} does not "
                f"configure (configured: {', '.join(sorted(names)) or 'none'}). If a region was renamed, use its "
                "old name again; if it was removed on purpose, delete its entry under \"regions\" in the "
                "checkpoint (plain JSON) while the capturer is stopped")
        if rebuild_backlog:
            cp = self._rebuild_backlog(cp)
        cp = dataclasses.replace(
            cp, regions={r: p for r, p in cp.regions.items() if r in names},
            region_ts={r: t for r, t in cp.region_ts.items() if r in names},
            senders={n: dataclasses.replace(sp, regions={r: p for r, p in sp.regions.items() if r in names},
                                            region_ts={r: t for r, t in sp.region_ts.items() if r in names})
                     for n, sp in cp.senders.items()})
        self.state_dir = StateDir(cfg.checkpoint_path)
        self.journal = LiftJournal(self.state_dir.side(StateDir.LIFTS))
        self.queues: dict[str, WeightedQueue[Item]] = {
            r.name: WeightedQueue(cfg.queue_rows) for r in cfg.regions
        }
        self._floors = {r.name: cp.floor(r.name) for r in cfg.regions}  # where each region's clock starts
        self.group = RegionGroup()  # work across the regions (coordinated copies, on-demand snapshots)
        self.regions = [
            make_region(r, RegionContext(self.queues[r.name], cp.regions.get(r.name),
                                         cp.floor(r.name), self.journal, self.stop_event,
                                         cfg.spill_rows, cfg.spill_dir, cfg.checkpoint_path,
                                         self._table_selected, self.pin_start, self.group.tables_elsewhere,
                                         peer=self.group.peer, filter_path=cfg.filter_path,
                                         config_path=cfg.path, copy_new=self._copy_new))
            for r in cfg.regions
        ]
        self.group.regions = self.regions
        if not check_only:  # copies asked for survive a crash before a checkpoint carries them
            self.group.keep_copies(CopyJournal(self.state_dir.side(StateDir.COPIES)), cp.regions)
        self.senders = [ProcessSender(s.name, s.options, cfg.queue_rows, cfg.log_level, cfg.spill_rows, cfg.spill_dir)
                        if s.options.get("process") else sender_class(s.name)(s.name, s.options, cfg.queue_rows)
                        for s in cfg.senders]
        self.stream = self._open_stream(cp)
        self.manager = SenderManager(self.senders, cp, self.stop_event, self.stream)
        self.keeper = CheckpointKeeper(cfg.checkpoint_path, cfg.checkpoint_interval, cp, self.manager.advance,
                                       self._checkpoint_written, ha.publish if ha is not None else None,
                                       due=self.manager.ddl_acknowledged)
        self.merge = MergeStage(self.queues, self._on_item, self.stop_event)
        self.status_server: StatusServer | None = None
        self.started_at = time.time()
        self.failure: str = ""
        self.stop_requested = threading.Event()  # POST /stop
        self.filter_loaded_at = time.time()
        self._reload_lock = threading.Lock()
        self.new_tables: dict[str, Any] | None = None  # the last reload that added tables (status)
        self.verify_state: dict[str, Any] = {"state": "idle"}
        self._verify_proc: Any = None  # the running verify's process (POST /verify)
        self._verify_lock = threading.Lock()
        # senders an operator paused stay paused across restarts (as a paused connector does)
        self.paused_path = self.state_dir.side(StateDir.PAUSED)
        # a region silent (not even a heartbeat) for this long holds the merge back
        self._silence = {r.name: max(3.0, 3 * getattr(r, "heartbeat_ms", 1000) / 1000) for r in cfg.regions}
        self._restore_paused()

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint as last written."""
        return self.keeper.current

    @property
    def checkpoint_written_at(self) -> float:
        return self.keeper.written_at

    def _open_stream(self, cp: Checkpoint) -> StreamLog:
        """The stream's memory window and its backlog on disk, as the checkpoint left them."""
        cfg = self.cfg
        window = max([cfg.queue_rows] + [s.queue.capacity for s in self.senders])
        mark = cp.backlog
        nxt = mark.next if mark is not None else 1  # offsets start at 1
        names = {s.name for s in self.senders}
        behind = [sp.offset + 1 for n, sp in cp.senders.items()
                  if n in names and not sp.detached and sp.offset + 1 < nxt]
        backlog = None
        if cfg.backlog_max_mb > 0:
            backlog = Backlog(cfg.backlog_path, cfg.backlog_max_mb << 20)
            try:
                nxt = backlog.open(mark, min(behind) if behind else None, read_only=self.check_only)
                backlog.keep_for_checkpoint(cp.senders, names, nxt)  # the loaded checkpoint is on disk
            except OSError as exc:
                raise CheckpointError(f"backlog {cfg.backlog_path}: {exc}") from None
        elif behind:
            raise CheckpointError(
                f"{cfg.checkpoint_path}: sender(s) were behind and read the backlog ({cfg.backlog_path}), but "
                "backlogMaxMB is 0 now: set it back, or start once with --rebuild-backlog (the sources are read "
                "again from the position of the sender furthest behind)")
        return StreamLog(window, backlog, nxt, Cut(dict(cp.regions), dict(cp.region_ts)), cfg.backlog_full,
                         cfg.spill_rows, cfg.spill_dir, mark.rows if mark is not None else 0)

    def _rebuild_backlog(self, cp: Checkpoint) -> Checkpoint:
        """--rebuild-backlog: forget the backlog on disk (moved aside), read the sources
        again from the sender furthest behind; every sender skips what it has by key."""
        cfg = self.cfg
        live = [sp for sp in cp.senders.values() if not sp.detached]
        nxt = cp.backlog.next if cp.backlog is not None else 1
        if cfg.backlog_path.exists():
            aside = cfg.backlog_path.with_name(f"{cfg.backlog_path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
            cfg.backlog_path.rename(aside)
            log.warning("--rebuild-backlog: the backlog was moved aside to %s (delete it once the senders "
                        "caught up)", aside)
        if not live:
            return dataclasses.replace(cp, backlog=BacklogMark(nxt, rows=cp.backlog.rows if cp.backlog else 0))
        slow = min(live, key=lambda sp: sp.offset)
        log.warning("--rebuild-backlog: the sources are read again from the position of the sender furthest "
                    "behind (commit_ts %d: %s)", slow.commit_ts, {r: str(p) for r, p in slow.regions.items()})
        regions = {**cp.regions, **slow.regions}
        region_ts = {**cp.region_ts, **slow.region_ts}
        senders = {n: dataclasses.replace(sp, offset=max(sp.offset, nxt - 1)) for n, sp in cp.senders.items()}
        return dataclasses.replace(cp, regions=regions, region_ts=region_ts, senders=senders,
                                   backlog=BacklogMark(nxt, rows=cp.backlog.rows if cp.backlog else 0))

    def _restore_paused(self) -> None:
        try:
            names = self.paused_path.read_text(encoding="utf-8").split()
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{self.paused_path}: unreadable list of paused senders: {exc}") from None
        known = {s.name: s for s in self.senders}
        for name in names:
            if name in known:
                known[name].pause()
                log.warning("sender %s starts paused: an operator paused it before this start (%s); resume it "
                            "with POST /senders/%s/resume or python -m capturer resume %s", name,
                            self.paused_path, name, name)
            else:
                log.warning("%s names sender %r, which senderConfig no longer has: ignored", self.paused_path, name)

    def _save_paused(self) -> None:
        names = [s.name for s in self.senders if s.paused]
        if names:
            rewrite_lines(self.paused_path, names)
        else:
            self.paused_path.unlink(missing_ok=True)

    @property
    def filter(self) -> Filter:
        """The rules in force (the new ones as soon as a reload swaps them in)."""
        return self._rules[0]

    def _table_selected(self, db: str, table: str) -> bool:
        return self.filter.table_selected(db, table)  # the current rules, also after a reload

    # --- pipeline -----------------------------------------------------------
    def _on_item(self, item: Item) -> None:
        key = stream_key(item)  # as the region made it (a filter may strip a DDL prelude)
        if isinstance(item, Txn):
            rules, window = self._rules
            if item.ddl is not None:  # a table renamed into the filter is copied (snapshotNewTables)
                self.group.renamed_in(item, rules.table_selected, self.cfg.snapshot_new_tables)
            item = rules.apply(self.group.strip_held(item))
            if window is not None:
                item = window.narrow(item)
        self.manager.dispatch(item, key)

    def start(self) -> None:
        self.status_server = StatusServer(self.cfg.http_host, self.cfg.http_port, self.snapshot, self.health,
                                          self.control, self.cfg.control_token, self.cfg.http_allowed_hosts)
        self.status_server.start()
        log.info("status on http://%s:%d/status", self.status_server.host, self.status_server.port)
        self.manager.start()
        self.merge.start()
        for r in self.regions:
            r.start()

    def write_checkpoint(self) -> None:
        self.keeper.write()

    def pin_start(self, region: str, position: Any) -> None:
        """A region's first start, made durable before it emits anything: the
        checkpoint gets ``position`` for ``region`` (commit_ts unchanged) if it holds
        no position for it yet, written now. Without this a crash before the first
        regular checkpoint would start the region again from a new start (its
        ``start=latest``, or a new snapshot run), and what changed in between would
        never be delivered. Any region kind (a position of its kind)."""
        with self.keeper.lock:
            if not self.manager.pin(region, position, self._floors[region]):
                return
            self.keeper.write(force=True)
        log.info("region %s: start position %s written to %s before anything is sent", region, position,
                 self.cfg.checkpoint_path)

    def _checkpoint_written(self, cp: Checkpoint) -> None:
        """A checkpoint is on disk: lifts older than the rebuild point go, regions learn
        where their sources now resume (a PostgreSQL slot confirms it)."""
        if self.ha is not None:
            # high availability: a takeover reads the sources again from the sender furthest behind *in this
            # checkpoint* (the backlog stays on this machine): nothing before that may be let go (a PostgreSQL
            # slot confirmed past it, a lift forgotten)
            floor = self._slowest_cut(cp)
            self.journal.prune(floor)
            slowest = min((sp for sp in cp.senders.values() if not sp.detached), key=lambda sp: sp.offset,
                          default=None)
            self.group.settle_copies(floor, {**cp.region_ts, **(slowest.region_ts if slowest else {})})
            for r in self.regions:
                if r.name in floor:
                    r.checkpointed(floor[r.name])
            return
        self.journal.prune(self.manager.rebuild_cut().positions)
        self.group.settle_copies(cp.regions, cp.region_ts)
        if self.stream.backlog is not None:  # backlog segments go only once no checkpoint on disk needs them
            self.stream.backlog.keep_for_checkpoint(cp.senders, {s.name for s in self.senders},
                                                    cp.backlog.next if cp.backlog is not None else 1 << 62)
        for r in self.regions:
            if r.name in cp.regions:
                r.checkpointed(cp.regions[r.name])

    @staticmethod
    def _slowest_cut(cp: Checkpoint) -> dict[str, Any]:
        """Where the sources are read again from after a takeover from ``cp`` (as
        ``_rebuild_backlog``): the cut of the attached sender furthest behind, over the
        checkpoint's own positions."""
        live = [sp for sp in cp.senders.values() if not sp.detached]
        if not live:
            return dict(cp.regions)
        return {**cp.regions, **min(live, key=lambda sp: sp.offset).regions}

    def _find_failure(self) -> str:
        for r in self.regions:
            if r.error is not None:
                return f"region {r.name}: {r.error}"
        if self.merge.error is not None:
            return f"merger: {self.merge.error}"
        s = self.manager.failed()
        if s is not None:
            return f"sender {s.name}: {s.error}"
        return ""

    def run(self, until: Callable[[Capturer], bool] | None = None,
            should_stop: threading.Event | None = None) -> int:
        """Run until ``should_stop`` is set, ``until(self)`` is true, or a stage fails.
        Returns the exit code (0 clean, 1 failure)."""
        try:
            while True:
                time.sleep(0.1)
                self.failure = self._find_failure()
                if self.failure:
                    log.error("stopping: %s", self.failure)
                    break
                try:
                    self.keeper.tick()
                except Fenced as exc:
                    self.failure = str(exc)
                    log.error("stopping: %s", exc)
                    break
                self.group.ask_again(time.monotonic())  # copies a crash left unmade (capturer/regions/copies.py)
                if should_stop is not None and should_stop.is_set():
                    break
                if self.stop_requested.is_set():
                    log.info("stopping: asked to (POST /stop)")
                    break
                if until is not None and until(self):
                    break
        finally:
            self.shutdown()
        return 1 if self.failure else 0

    def shutdown(self, drain_timeout: float = 15.0) -> None:
        if getattr(self, "_shut", False):
            return
        self._shut = True
        if self._verify_proc is not None:  # a verify in progress goes with the capturer
            try:
                self._verify_proc.terminate()
            except OSError:
                pass
        log.info("stopping: regions, merger, then senders")
        self.stop_event.set()
        for r in self.regions:
            r.join(10)
        if self.merge.thread.is_alive():
            self.merge.thread.join(10)
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline and not self.failure:
            if all(len(s.queue) == 0 or s.paused or s.state in ("retrying", "failed") for s in self.senders):
                break
            time.sleep(0.05)
        self.manager.stop()
        self.manager.join(30)
        try:
            self.keeper.write()  # rewritten only if it changed: a start that failed leaves the file as it was
            log.info("final checkpoint: commit_ts=%d %s", self.checkpoint.commit_ts,
                     {r: str(p) for r, p in self.checkpoint.regions.items()})
        except (OSError, CapturerError) as exc:
            log.error("final checkpoint could not be written: %s", exc)
        if self.stream.backlog is not None:
            try:
                self.stream.backlog.close()
            except OSError as exc:
                log.error("backlog %s: %s", self.stream.backlog.dir, exc)
        if self.status_server is not None:
            self.status_server.stop()

    # --- control --------------------------------------------------------------
    #: POST endpoints (the status server checks the token before calling ``control``)
    CONTROL_HELP = ("POST /senders/<name>/pause, POST /senders/<name>/resume, POST /senders/<name>/attach, "
                    "POST /filter/reload, POST /snapshot {\"tables\": [...]}, POST /verify {\"senders\": [...], "
                    "\"tables\": [...], \"wait\": 60}, POST /stop, POST /handover (with [ha])")

    def control(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The control endpoints: ``CONTROL_HELP``."""
        parts = path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "senders" and parts[2] in ("pause", "resume"):
            return self._pause_resume(parts[1], parts[2])
        if len(parts) == 3 and parts[0] == "senders" and parts[2] == "attach":
            return self._attach(parts[1])
        if path == "/filter/reload":
            return self.reload_filter()
        if path == "/stop":
            self.stop_requested.set()
            return 202, {"stopping": True, "detail": "regions and the merger stop, the senders drain what is "
                                                      "queued, then a final checkpoint is written"}
        if path == "/handover":
            if self.ha is None:
                return 409, {"error": "no [ha] section in the config: there is no standby to hand over to"}
            return self.ha.handover()
        if path == "/snapshot":
            return self._snapshot_endpoint(body)
        if path == "/verify":
            return self.start_verify(body)
        return 404, {"error": f"unknown control endpoint {path}; known: {self.CONTROL_HELP}"}

    def start_verify(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST /verify: compare every sender (or ``senders``) with the sources, for every
        captured table (or ``tables``): ``python -m capturer verify`` in a child process
        (off this process's GIL and memory: it replays files and topics); its progress and
        last result on /status (``verify``), /metrics and the page (capturer/ops/verify.py)."""
        with self._verify_lock:
            if self.verify_state.get("state") == "running":
                return 409, {"error": "a verify is running; its progress is under verify on /status"}
            try:
                senders = body.get("senders")
                if senders is not None and (not isinstance(senders, list) or
                                            not all(isinstance(x, str) for x in senders)):
                    raise ValueError("senders: a list of sender names")
                unknown = [x for x in senders or [] if x not in {s.name for s in self.senders}]
                if unknown:
                    raise ValueError(f"no sender {', '.join(unknown)}; senders: "
                                     f"{', '.join(s.name for s in self.senders)}")
                tables = body.get("tables")
                if tables is not None and (not isinstance(tables, list) or
                                           not all(isinstance(x, str) for x in tables)):
                    raise ValueError("tables: a list of db.table names")
                wait = body.get("wait", 60)
                if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= 3600:
                    raise ValueError("wait: seconds, 0 to 3600")
                opts = verify.Options(senders=senders, tables=verify.parse_tables(tables) if tables else None)
            except (ValueError, AttributeError) as exc:
                return 400, {"error": str(exc)}

            cmd = [sys.executable, "-m", "capturer", "verify", "--config", str(self.cfg.path), "--json", "--progress",
                   "--wait", str(float(wait))]
            for name in senders or []:
                cmd += ["--sender", name]
            for db, table in opts.tables or []:
                cmd += ["--table", f"`{db.replace('`', '``')}`.`{table.replace('`', '``')}`"]
            self.verify_state.update({"state": "running", "started": time.time(),
                                      "progress": {"tables_done": 0, "tables_total": 0, "current": ""}})
            threading.Thread(target=self._run_verify, args=(cmd,), name="verify", daemon=True).start()
        return 202, {"verify": "started", "detail": "progress and result: GET /status (verify)"}

    def _run_verify(self, cmd: list[str]) -> None:
        import subprocess

        tail: list[str] = []
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self._verify_proc = proc
            assert proc.stderr is not None and proc.stdout is not None
            for line in proc.stderr:
                if line.startswith('{"progress":'):
                    try:
                        self.verify_state["progress"] = json.loads(line)["progress"]
                        continue
                    except (ValueError, KeyError):
                        pass
                tail = (tail + [line.rstrip()])[-20:]
            out = proc.stdout.read()
            code = proc.wait()
            try:
                self.verify_state["last"] = json.loads(out)
            except ValueError:
                self.verify_state["last"] = {"finished": time.time(), "exit_code": code if code else 2, "tables": [],
                                             "errors": [line for line in tail if line] or [f"verify exited {code}"]}
        except OSError as exc:  # reported, never fatal to the capture
            log.error("verify could not run: %s", exc)
            self.verify_state["last"] = {"finished": time.time(), "exit_code": 2, "tables": [],
                                         "errors": [f"verify could not run: {exc}"]}
        finally:
            self._verify_proc = None
            self.verify_state["state"] = "idle"

    def _pause_resume(self, name: str, verb: str) -> tuple[int, dict[str, Any]]:
        sender = next((s for s in self.senders if s.name == name), None)
        if sender is None:
            return 404, {"error": f"no sender {name!r}; senders: {', '.join(s.name for s in self.senders)}"}
        with self.keeper.lock:
            changed = sender.pause() if verb == "pause" else sender.resume()
            try:
                self._save_paused()
            except OSError as exc:  # the pause holds in this run; say that a restart would lose it
                log.error("cannot record the paused senders in %s: %s", self.paused_path, exc)
                return 200, {"sender": name, "paused": sender.paused, "changed": changed,
                             "warning": f"not recorded in {self.paused_path} ({exc}): a restart forgets it"}
        return 200, {"sender": name, "paused": sender.paused, "changed": changed}

    def _attach(self, name: str) -> tuple[int, dict[str, Any]]:
        if name not in self.manager.cursors:
            return 404, {"error": f"no sender {name!r}; senders: {', '.join(s.name for s in self.senders)}"}
        changed = self.manager.attach(name)
        if changed:
            self.keeper.write(force=True)
        return 200, {"sender": name, "attached": True, "changed": changed,
                     "detail": "it goes on from the stream's head; what it missed while detached is not sent to it: "
                               "copy its tables again with an on-demand snapshot" if changed else "it was attached"}

    def reload_filter(self) -> tuple[int, dict[str, Any]]:
        """Read filterRuleDict again. The new rules apply to every transaction the
        merger hands out from now on (not to what senders already queued). A file
        with an error changes nothing: the answer names the file and line. Tables the
        new rules add are copied while streaming (``snapshotNewTables``, docs/snapshots.md
        "New tables"); if they cannot be (a source does not answer, a copy is refused),
        the old rules stay."""
        path = self.cfg.filter_path
        if path is None:
            return 409, {"error": f"{self.cfg.path}: no filterRuleDict is configured: nothing to reload"}
        with self._reload_lock:
            try:
                text = read_text_file(path, "filter rule file (filterRuleDict)")
                new = parse_filter_text(text, path)
            except (ConfigError, OSError) as exc:
                log.error("filter reload refused, the old rules stay: %s", exc)
                return 400, {"error": f"the old rules stay: {exc}"}
            old = self.filter
            try:
                added = self._copy_added(old, new, text)
            except (ValueError, LookupError, SourceError) as exc:
                log.error("filter reload refused, the old rules stay: %s", exc)
                return 503 if isinstance(exc, SourceError) else 400, {"error": f"the old rules stay: {exc}"}
            self._filter_text = text
            self.filter_loaded_at = time.time()
            # a table the new rules leave out is no longer held back anywhere
            self.group.unhold(lambda _region, t: new.table_selected(*t))
        log.info("filter reloaded from %s: %d table rule(s), %d row rule(s)%s", path,
                 len(new.table_rules), len(new.row_rules),
                 f"; table(s) added, copied (snapshotNewTables={self.cfg.snapshot_new_tables}): {added['regions']}"
                 if added else "")
        out: dict[str, Any] = {"filter": str(path), "table_rules": len(new.table_rules),
                               "row_rules": len(new.row_rules)}
        if added:
            out["added"] = added
        return 200, out

    def _tell_regions(self, text: str) -> None:
        """Regions served by agents (or worker processes) select tables with the rules
        too (what they copy, a PostgreSQL region what it reads): they subscribe again
        with ``text``."""
        assert self.cfg.filter_path is not None
        for r in self.regions:
            hook = getattr(r, "filter_reloaded", None)
            if hook is not None:
                hook(self.cfg.filter_path, text)

    def _copy_added(self, old: Filter, new: Filter, text: str) -> dict[str, Any] | None:
        """Swap in ``new`` (``text``, also told to the regions served by agents); the
        tables it adds (in the regions that copy tables here) are held back and copied
        (``snapshotNewTables``). Returns what was requested (None: nothing added, or
        snapshotNewTables = never). Raises (ValueError, LookupError, SourceError) with
        ``old`` back in place and nothing held when the tables cannot be listed or
        copied."""
        mode = self.cfg.snapshot_new_tables
        added = self.group.tables_added(old.table_selected, new.table_selected) if mode != "never" else {}
        if added:
            self.group.hold(added)  # before the swap: no change to them passes before their copy starts
        if not added:
            self._rules = (new, None)
            self._tell_regions(text)
            return None
        # until the copies are granted only the old rules' tables and the held ones pass
        self._rules = (new, ReloadWindow(old, {r: frozenset(ts) for r, ts in added.items()}))
        # (before the copy is asked for: its check of who else delivers a table asks them with the new rules)
        self._tell_regions(text)
        names = sorted({t for ts in added.values() for t in ts})
        try:
            got = self.group.request_tables(names, None, mode == "truncate", "filter reload")
        except (ValueError, LookupError, SourceError) as exc:
            self._rules = (old, None)
            self._tell_regions(self._filter_text)
            self.group.unhold(lambda region, t: t not in added.get(region, ()))
            listed = ", ".join(f"{db}.{t}" for db, t in names)
            why = (f"the table(s) the new rules add ({listed}) cannot be copied (snapshotNewTables = {mode} in "
                   f"[global] of {self.cfg.path}; copy or never there are the ways around a refusal): {exc}")
            kind = SourceError if isinstance(exc, SourceError) else LookupError if isinstance(
                exc, LookupError) else ValueError
            raise kind(why) from None
        self._rules = (new, None)
        copied = {(r, t) for r, v in got["regions"].items() for t in v["tables"]}
        # a table gone since it was listed is not copied: nothing of it to hold back
        self.group.unhold(lambda region, t: t not in added.get(region, ()) or (region, f"{t[0]}.{t[1]}") in copied)
        self.new_tables = {"at": round(time.time(), 3), "mode": mode, **got}
        return got

    def _copy_new(self, region: str, tables: list[tuple[str, str]], reason: str) -> None:
        """Tables that came to ``region``'s source (a PostgreSQL table added to the
        publication): held back and copied as a filter reload's new tables are
        (``snapshotNewTables``; ``never``: only their changes from now on). Raises as
        ``request_tables`` does, nothing held then (the region asks again later)."""
        mode = self.cfg.snapshot_new_tables
        if mode == "never":
            log.info("region %s: %s: not copied (snapshotNewTables = never): %s", region, reason,
                     ", ".join(f"{db}.{t}" for db, t in tables))
            return
        self.group.hold({region: tables})
        try:
            got = self.group.request_tables(tables, region, mode == "truncate", reason)
        except BaseException:
            self.group.unhold(lambda r, t: r != region or t not in tables)
            raise
        copied = {t for v in got["regions"].values() for t in v["tables"]}
        # a table gone since it was listed is not copied: nothing of it to hold back
        self.group.unhold(lambda r, t: r != region or t not in tables or f"{t[0]}.{t[1]}" in copied)
        self.new_tables = {"at": round(time.time(), 3), "mode": mode, "reason": reason, **got}

    def _snapshot_endpoint(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        tables = body.get("tables")
        if not isinstance(tables, list) or not tables or not all(isinstance(t, str) for t in tables):
            return 400, {"error": 'expected {"tables": ["db.table", ...], "region": optional, '
                                  '"truncate": optional true}'}
        region = body.get("region")
        if region is not None and not isinstance(region, str):
            return 400, {"error": "region must be a string"}
        truncate = body.get("truncate", False)
        if not isinstance(truncate, bool):
            return 400, {"error": "truncate must be true or false"}
        try:
            return 202, self.request_snapshot(tables, region, truncate)
        except ValueError as exc:
            return 400, {"error": str(exc)}
        except LookupError as exc:
            return 404, {"error": str(exc)}
        except SourceError as exc:  # a source did not answer: nothing was started
            return 503, {"error": f"nothing started: {exc}"}

    def request_snapshot(self, tables: list[str], region: str | None = None,
                         truncate: bool = False) -> dict[str, Any]:
        """Copy tables again while streaming (capturer/regions/group.py ``request_snapshot``)."""
        return self.group.request_snapshot(tables, region, truncate)

    # --- status -------------------------------------------------------------
    def health(self) -> tuple[bool, str]:
        failure = self._find_failure()
        if failure:
            return False, failure
        for r in self.regions:
            if r.state in ("reconnecting", "failed"):
                return False, f"region {r.name}: {r.state}: {r.last_error}"
        for s in self.senders:
            if s.state in ("retrying", "failed"):
                return False, f"sender {s.name}: {s.state}: {s.last_error}"
        detached = [n for n, c in self.manager.cursors.items() if c.detached]
        if detached:
            return False, (f"sender(s) {', '.join(detached)} detached: the backlog reached backlogMaxMB while they "
                           "were behind; attach again with POST /senders/<name>/attach, then copy their tables")
        if self.keeper.publish_error:
            return False, f"checkpoint not written (etcd): {self.keeper.publish_error}"
        paused = [s.name for s in self.senders if s.paused]
        if paused:  # on purpose: healthy, but say so
            return True, f"ok; paused by an operator: {', '.join(paused)}"
        return True, "ok"

    def snapshot(self) -> dict[str, Any]:
        cp = self.checkpoint
        return {
            "started_at": round(self.started_at, 3),
            "now": round(time.time(), 3),
            "uptime_seconds": round(time.time() - self.started_at, 1),
            "config": str(self.cfg.path),
            "control": {"enabled": bool(self.cfg.control_token), "endpoints": self.CONTROL_HELP},
            "filter": {"path": str(self.cfg.filter_path or ""), "loaded_at": round(self.filter_loaded_at, 3),
                       "table_rules": len(self.filter.table_rules), "row_rules": len(self.filter.row_rules),
                       # the tables the last reload that added some added, and their copies' runs
                       "added": self.new_tables, "held": self.group.held(),
                       # copies (reload, on demand) not yet carried by a checkpoint on disk, and those a start
                       # asked for again (capturer/regions/copies.py)
                       "copies": self.group.copies_status()},
            "stopping": self.stop_event.is_set() or self.stop_requested.is_set(),
            "checkpoint": {
                **{k: v for k, v in cp.to_json().items() if k != "written_at"},
                "age_seconds": round(time.time() - self.checkpoint_written_at, 1),
                "path": str(self.cfg.checkpoint_path),
            },
            "acked_ts": self.manager.acked_ts(),
            "regions": {r.name: {"kind": rc.type + (" (worker process)" if getattr(rc, "process", False) else ""),
                                 **r.status()} for r, rc in zip(self.regions, self.cfg.regions)},
            "merger": {
                "merged_txns": self.merge.merged_txns,
                "watermark": self.merge.merger.watermark(),
                "waiting_for": self.merge.waiting_for(self._silence),
                "region_ts": self.merge.merger.region_ts(),
                # the senders the stream waits for (memory full, and no room in the backlog)
                "full_senders": self.stream.holding(),
                "dispatched_ts": self.manager.dispatched_ts,
                "dispatched_txns": self.manager.dispatched_txns,
                "dispatched_rows": self.manager.dispatched_rows,
            },
            "senders": self.manager.status(),
            "verify": dict(self.verify_state),
            "ha": self.ha.status() if self.ha is not None else {"role": "single"},
            "stream": self.stream.status(),
            "lag_ms_behind_sources": max(
                0, int(time.time() * 1000) - ts_physical_ms(self.manager.acked_ts())
            ) if ts_physical_ms(self.manager.acked_ts()) else None,
        }
