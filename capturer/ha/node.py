"""One capturer of an active/standby group (``[ha]`` in the config; docs/ha.md).

A node starts as a **standby**: it serves its status port (role, who is active,
the epoch), registers itself under ``members/`` and polls the leader key. When
there is none it campaigns; of the nodes campaigning at once, one wins (etcd's
create-if-absent). The winner becomes **active**:

1. it arms the process's lease guard (capturer/util/fencing.py) with its epoch
   and keeps the lease alive from a thread of its own;
2. it rebuilds its local directory (``<checkpoint dir>/ha-<id>/``) from the state
   in etcd: the checkpoint and its side files (lift journal, paused senders, the
   regions' journals). Nothing of an earlier run's backlog is trusted: the sources
   are read again from the position of the sender furthest behind (as
   ``--rebuild-backlog``), every sender skipping what its destination holds;
3. it runs the capturer with every sender told the epoch (the MySQL fence row,
   the Kafka epoch header) and every checkpoint published to etcd by a fenced
   transaction before it is written locally (a PostgreSQL slot is confirmed only
   after that, so no standby ever needs WAL the slot let go).

It **steps down** when its lease is lost (etcd said it expired, the leader key is
not its own, or etcd stayed unreachable for the lease's length) or a destination
reports a newer epoch: the guard refuses every write from then on, the node kills
its child processes and executes itself again as a standby (same pid, same
arguments), without a final checkpoint. ``POST /stop`` of the active drains, writes
a final checkpoint, and gives the lease up (a standby takes over within its poll
interval); ``POST /handover`` does the same and stays as a standby.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capturer.config import AppConfig
from capturer.errors import FENCED_MARK, CapturerError, CheckpointError, ConfigError, Fenced
from capturer.ha.coord import CoordinationError, CoordinationRefused, Coordinator, pack_state, unpack_state
from capturer.ha.keeper import LOST, LeaseKeeper
from capturer.pipeline.checkpoint import Checkpoint, StateDir
from capturer.regions import journal
from capturer.util.fencing import GUARD

log = logging.getLogger(__name__)

POLL = 0.5  # how often a standby looks at the leader key (seconds)
DEFER_ENV = "CAPTURER_HA_DEFER_UNTIL"  # a node that handed over waits until then before campaigning
STEPDOWN_ENV = "CAPTURER_HA_STEP_DOWNS"  # this node's unplanned step-downs, across its re-executions
MAX_STATE = 1_000_000  # bytes (etcd's default request limit is 1.5 MiB)
COMPACT_EVERY = 300.0  # seconds: the active compacts etcd's history up to the revision it saw this long ago


def _journal_text(raw: bytes) -> str:
    try:
        return zlib.decompress(raw).decode()
    except zlib.error:
        raise CoordinationError("a journal in etcd cannot be read (not zlib)") from None


def default_id(port: int) -> str:
    host = socket.gethostname() or "localhost"
    return f"{host}-{port}" if port else f"{host}-pid{os.getpid()}"


def _safe(ident: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", ident) or "node"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found, then theirs)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class HaNode:
    """``make_capturer(cfg, rebuild_backlog=, ha=)`` builds the capturer an active runs
    (capturer.app.Capturer) and ``status_server(host, port, snapshot, health, control,
    token, allowed_hosts)`` the standby's status port (capturer.ops.status.StatusServer):
    both handed in by the command line, the composition root, so this module names
    neither."""

    def __init__(self, cfg: AppConfig, argv: list[str], stop: threading.Event, make_capturer: Callable[..., Any],
                 status_server: Callable[..., Any]):
        assert cfg.ha is not None
        self.make_capturer = make_capturer
        self.status_server = status_server
        self.cfg = cfg
        self.hc = cfg.ha
        self.argv = argv
        self.stop = stop
        self.id = self.hc.id or default_id(cfg.http_port)
        self.coord = Coordinator(self.hc.endpoints, self.hc.name, self.hc.lease_seconds)
        self.local_dir = cfg.checkpoint_path.parent / f"ha-{_safe(self.id)}"
        self.role = "standby"
        self.role_since = time.time()
        self.started_at = time.time()
        self.holder: dict[str, Any] | None = None
        self.holder_epoch = 0
        self.epoch = 0
        self.members: list[dict[str, Any]] = []
        self.takeovers: list[dict[str, Any]] = []
        self.etcd_error = ""
        self.server: Any = None  # the standby's status server
        self.port = cfg.http_port
        self.cap: Any = None
        self._handover = threading.Event()
        self._ka_stop = threading.Event()
        self.lease_renewals = 0
        self.keeper: LeaseKeeper | None = None
        # unplanned step-downs of this node (kept across its re-executions: STEPDOWN_ENV)
        self.step_downs: dict[str, Any] = {}
        try:
            self.step_downs = dict(json.loads(os.environ.pop(STEPDOWN_ENV, "") or "{}"))
        except (ValueError, TypeError):
            pass
        self._journal_lock = threading.Lock()
        self._journal_coord = Coordinator(self.hc.endpoints, self.hc.name, self.hc.lease_seconds)
        try:
            self.defer_until = float(os.environ.pop(DEFER_ENV, "0") or 0)
        except ValueError:
            self.defer_until = 0.0

    # --- what operators see -------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "id": self.id,
            "name": self.hc.name,
            "since": round(self.role_since, 3),
            "epoch": self.epoch or self.holder_epoch,
            "holder": self.holder,
            "lease_seconds": self.hc.lease_seconds,
            "lease_remaining_seconds": round(GUARD.remaining(), 2) if self.role == "active" else None,
            "lease_renewals": self.lease_renewals,
            "step_downs": int(self.step_downs.get("count", 0)),
            "last_step_down": self.step_downs.get("last"),
            "members": self.members,
            "last_takeover": self.takeovers[-1] if self.takeovers else None,
            "takeovers": self.takeovers[-10:],
            "etcd": {"endpoints": list(self.hc.endpoints), "using": self.coord.endpoints[self.coord._current],
                     "error": self.etcd_error, "failovers": self.coord.failovers},
        }

    def _record(self, role: str) -> dict[str, Any]:
        return {"id": self.id, "role": role, "host": socket.gethostname(), "port": self.port, "pid": os.getpid(),
                "since": round(self.role_since, 3)}

    def _standby_snapshot(self) -> dict[str, Any]:
        return {"started_at": round(self.started_at, 3), "now": round(time.time(), 3),
                "uptime_seconds": round(time.time() - self.started_at, 1), "config": str(self.cfg.path),
                "control": {"enabled": bool(self.cfg.control_token), "endpoints": ["/stop"]},
                "stopping": self.stop.is_set(), "ha": self.status()}

    def _standby_health(self) -> tuple[bool, str]:
        if self.etcd_error:
            return False, f"standby: etcd: {self.etcd_error}"
        h = self.holder or {}
        return True, f"standby (active: {h.get('id', 'none')})"

    def _standby_control(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/stop":
            self.stop.set()
            return 202, {"stopping": True, "detail": "this standby stops"}
        return 409, {"error": f"{path}: this capturer is a standby (the active one is "
                              f"{(self.holder or {}).get('id', 'none')}); ask the active one"}

    def handover(self) -> tuple[int, dict[str, Any]]:
        """POST /handover of the active: drain, final checkpoint, give the lease up, stay a standby."""
        try:  # (asked now: the keep-alive refreshes its list only every few seconds)
            self.members = Coordinator(self.hc.endpoints, self.hc.name, self.hc.lease_seconds).members()
        except CoordinationError as exc:
            return 503, {"error": f"etcd: {exc}"}
        others = [m for m in self.members if m.get("id") != self.id]
        if not others:
            return 409, {"error": "no standby is running to take over (members: only this capturer)"}
        self._handover.set()
        if self.cap is not None:
            self.cap.stop_requested.set()
        return 202, {"handing_over": True, "to": [m.get("id") for m in others],
                     "detail": "the senders drain, a final checkpoint is written, then the lease is given up"}

    # --- standby --------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.server = self.status_server(self.cfg.http_host, self.cfg.http_port, self._standby_snapshot,
                                       self._standby_health, self._standby_control, self.cfg.control_token,
                                       self.cfg.http_allowed_hosts)
        except OSError as exc:
            print(f"start-up failed: {exc}", file=sys.stderr)
            return 2
        self.port = self.server.port
        self.server.start()
        log.info("ha: %s is a standby of group %r (etcd %s); status on http://%s:%d/status", self.id, self.hc.name,
                 ",".join(self.hc.endpoints), self.server.host, self.port)
        won = None
        quiet_until = 0.0
        while not self.stop.is_set():
            try:
                self.coord.register(self.id, self._record("standby"))
                self.members = self.coord.members()
                got = self.coord.leader()
                if got is None and time.time() >= self.defer_until:
                    won = self.coord.campaign(self._record("active"))
                    if won is not None:
                        break
                    got = self.coord.leader()
                self.holder, self.holder_epoch = got if got else (None, 0)
                self.etcd_error = ""
            except CoordinationError as exc:
                self.etcd_error = str(exc)
                if time.monotonic() >= quiet_until:
                    log.warning("ha: %s (a standby waits for etcd)", exc)
                    quiet_until = time.monotonic() + 30
            self.stop.wait(POLL)
        if won is None:
            self.coord.unregister()
            self.server.stop()
            log.info("ha: standby %s stopped", self.id)
            return 0
        return self._run_active(*won)

    # --- active ---------------------------------------------------------------------
    def begin(self, epoch: int, until: float) -> tuple[AppConfig, bool]:
        """Won the lease: arm the guard, keep the lease alive, rebuild the local files from
        etcd. The config to run with, and whether a checkpoint was restored."""
        vacant_since = time.time()
        prev = self.holder
        GUARD.arm(epoch, until - self._margin())
        self.epoch = epoch
        self.role, self.role_since = "active", time.time()
        self.holder, self.holder_epoch = self._record("active"), epoch
        log.warning("ha: %s is now the active capturer of group %r (epoch %d)", self.id, self.hc.name, epoch)
        # the lease's file before any sender starts: the senders' own processes (process = true) follow it too
        self.keeper = LeaseKeeper(self.hc.endpoints, self.hc.name, self.hc.lease_seconds, self.coord.lease_id,
                                  self.epoch, self._margin(), GUARD.remaining() + time.monotonic())
        threading.Thread(target=self._keepalive, name="ha-lease", daemon=True).start()
        cfg, restored = self._restore()
        self._note_takeover(prev, vacant_since)
        return cfg, restored

    def attach(self, cap: Any) -> None:
        """The capturer this node runs: its checkpoints and journal entries go to etcd."""
        self.cap = cap
        self._journal_coord.epoch = self.epoch
        journal.REPLICATE = self.replicate_journal

    def _run_active(self, epoch: int, until: float) -> int:
        try:
            cfg, restored = self.begin(epoch, until)
        except Fenced as exc:
            self.step_down(str(exc))
        except (CoordinationError, OSError) as exc:  # etcd went away meanwhile: a standby again
            log.error("ha: taking over failed: %s; giving the lease up, standing by again", exc)
            self._resign()
            self._exec_standby(defer=time.time() + self.hc.lease_seconds)
        except CheckpointError as exc:  # the state cannot be used: every member would fail the same way
            log.error("ha: taking over failed: %s; giving the lease up", exc)
            self._resign()
            print(f"ha: taking over failed: {exc}", file=sys.stderr)
            return 2
        assert self.server is not None
        self.server.stop()  # the capturer serves the same port from now on
        try:
            cap = self.make_capturer(cfg, rebuild_backlog=restored, ha=self)
        except (ConfigError, CheckpointError) as exc:
            log.error("ha: start-up refused: %s", exc)
            print(f"start-up refused: {exc}", file=sys.stderr)
            self._resign()
            return 2
        self.attach(cap)
        try:
            cap.start()
            cap.keeper.write(force=True)  # the restored state, in etcd under this epoch at once
        except OSError as exc:
            print(f"start-up failed: {exc}", file=sys.stderr)
            if cap.status_server is not None:
                cap.shutdown()
            self._resign()
            return 2
        except Fenced as exc:
            self.step_down(str(exc))
        code = cap.run(should_stop=self.stop)
        if GUARD.lost or FENCED_MARK in (cap.failure or ""):
            self.step_down(GUARD.lost or cap.failure)
        self._ka_stop.set()
        self._resign()
        if code:
            print(f"capturer stopped on failure: {cap.failure}", file=sys.stderr)
            return code
        if self._handover.is_set():
            log.warning("ha: %s handed over: it stays as a standby", self.id)
            self._exec_standby(defer=time.time() + 3 * POLL + 2)
        return 0

    def _margin(self) -> float:
        """How much earlier than etcd this node counts its lease as gone (clock rates, scheduling)."""
        return min(1.0, 0.2 * self.hc.lease_seconds)

    def _keepalive(self) -> None:
        """Keep the lease from the keeper process (capturer/ha/keeper.py: renewals that a
        busy interpreter cannot starve; the guard reads them from the file they share)
        and watch: a lost or lapsed lease steps this node down; every few rounds, the
        members' list and etcd's compaction (nothing there is urgent)."""
        every = max(0.2, self.hc.lease_seconds / 4)
        ka = Coordinator(self.hc.endpoints, self.hc.name, self.hc.lease_seconds)  # its own connection
        ka.epoch = self.epoch
        keeper = self.keeper
        assert keeper is not None  # (made by begin)
        GUARD.attach(keeper.shared, LOST)
        keeper.start()
        n = 0
        quiet_until = 0.0
        compact_at, next_compact = 0, time.monotonic() + COMPACT_EVERY
        try:
            while not self._ka_stop.wait(every):
                self.lease_renewals = keeper.shared.renewals()
                if GUARD.lost:
                    break
                if GUARD.remaining() <= 0:
                    GUARD.lose("its lease ran out before it could be renewed")
                    break
                if not keeper.alive() and not self._ka_stop.is_set():
                    log.warning("ha: the lease keeper process ended (code %s); starting it again",
                                keeper.proc.returncode if keeper.proc else None)
                    if keeper.starts >= 5:
                        GUARD.lose(LOST[4])
                        break
                    keeper.start()
                n += 1
                try:
                    if n % 4 == 1:
                        ka.register(self.id, self._record("active"))
                        self.members = ka.members()
                    if time.monotonic() >= next_compact:  # keep etcd's history short: compact what is old
                        if compact_at:
                            ka.compact(compact_at)
                        compact_at, next_compact = ka.revision, time.monotonic() + COMPACT_EVERY
                    self.etcd_error = ""
                except CoordinationError as exc:
                    self.etcd_error = str(exc)
                    if time.monotonic() >= quiet_until:
                        log.warning("ha: etcd: %s (the lease holds %.1f s more)", exc, GUARD.remaining())
                        quiet_until = time.monotonic() + 10
        finally:
            if GUARD.lost or self._ka_stop.is_set():
                keeper.stop()
        if GUARD.lost and not self._ka_stop.is_set():
            self.step_down(GUARD.lost)

    def step_down(self, why: str) -> None:
        """This node may no longer write: refuse every write, kill the children, start again as a standby."""
        GUARD.lose(why or "stepped down")
        if self.stop.is_set():  # asked to stop (SIGTERM) meanwhile: no standby again, no final checkpoint
            log.error("ha: %s lost its lease while it stopped (%s): nothing more is written", self.id, why)
            for pid in descendants(os.getpid()):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            logging.shutdown()
            os._exit(1)
        log.error("ha: %s steps down: %s; nothing more is written; it starts again as a standby", self.id, why)
        self.step_downs = {"count": int(self.step_downs.get("count", 0)) + 1,
                           "last": {"at": round(time.time(), 3), "epoch": self.epoch, "why": why or "stepped down"}}
        try:  # a lease still running (a destination said another took over): let it go now
            Coordinator(self.hc.endpoints, self.hc.name, self.hc.lease_seconds, timeout=1).revoke(self.coord.lease_id)
        except CoordinationError:
            pass
        self._exec_standby(defer=0.0)

    def _exec_standby(self, defer: float) -> None:
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if defer:
            os.environ[DEFER_ENV] = str(defer)
        if self.step_downs:
            os.environ[STEPDOWN_ENV] = json.dumps(self.step_downs)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "capturer", *self.argv])

    def _resign(self) -> None:
        """Give the lease up. Every write of this process is refused from now on (a thread the
        shutdown left behind must not write after a standby took over)."""
        GUARD.lose("it gave its lease up")
        self._ka_stop.set()
        try:
            self.coord.resign()
        except CoordinationError as exc:
            log.warning("ha: giving the lease up: %s (it expires within %d s)", exc, self.hc.lease_seconds)
        self.coord.unregister()

    # --- state --------------------------------------------------------------------
    def _restore(self) -> tuple[AppConfig, bool]:
        """The config of this run (local files in ``local_dir``, senders told the epoch),
        and whether a checkpoint was restored (the backlog is then rebuilt from the sources)."""
        cp_name = self.cfg.checkpoint_path.name
        if self.local_dir.exists():
            shutil.rmtree(self.local_dir)
        self.local_dir.mkdir(parents=True)
        got = self.coord.get("state")
        restored = False
        journals = {k[len("journal"):]: _journal_text(v) for k, v in self.coord.get_prefix("journal.").items()}
        if got is not None:
            st = unpack_state(got[0])
            files: dict[str, str] = dict(st.get("files") or {})
            for suffix, text in journals.items():  # entries put since that checkpoint: the union of both
                lines = [x for x in files.get(suffix, "").splitlines() if x.strip()]
                known = set(lines)
                files[suffix] = "\n".join(lines + [x for x in text.splitlines() if x.strip() and x not in known]) + "\n"
            for suffix, text in files.items():
                if "/" in suffix or not suffix.startswith("."):
                    raise CoordinationError(f"the state in etcd names a bad file {suffix!r}")
                (self.local_dir / (cp_name + suffix)).write_text(text, encoding="utf-8")
            import json

            (self.local_dir / cp_name).write_text(json.dumps(st["checkpoint"], indent=2) + "\n", encoding="utf-8")
            restored = True
            log.warning("ha: state restored from etcd (written by %s at epoch %s): checkpoint commit_ts %s; the "
                        "sources are read again from the sender furthest behind", st.get("holder"), st.get("epoch"),
                        st["checkpoint"].get("commit_ts"))
        elif self.cfg.checkpoint_path.exists():
            # the first start of a group: the checkpoint of the single capturer it was before
            for p in [self.cfg.checkpoint_path, *StateDir(self.cfg.checkpoint_path).side_files().values()]:
                shutil.copy2(p, self.local_dir / p.name)
            restored = True
            log.warning("ha: no state in etcd yet: starting from %s (the checkpoint of the capturer before HA)",
                        self.cfg.checkpoint_path)
        else:
            log.info("ha: no state in etcd and no checkpoint: a first start")
        backlog = self.cfg.backlog_dir
        if backlog is not None:  # a backlog directory set in the config: this node's own under it
            backlog = backlog / f"ha-{_safe(self.id)}"
            if backlog.exists():
                shutil.rmtree(backlog)
        senders = tuple(dataclasses.replace(s, options={**s.options, "ha_epoch": self.epoch,
                                                         "ha_lease": self.hc.lease_seconds,
                                                         "ha_group": self.hc.name,
                                                         "ha_lease_file": str(self.keeper.path) if self.keeper else ""})
                        for s in self.cfg.senders)
        cfg = dataclasses.replace(self.cfg, checkpoint_path=self.local_dir / cp_name, backlog_dir=backlog,
                                  http_port=self.port, senders=senders)
        return cfg, restored

    def replicate_journal(self, path: Path, lines: list[str]) -> None:
        """journal.REPLICATE while active: a journal's lines to etcd (``journal<suffix>``), fenced;
        waits while etcd does not answer, Fenced once the lease is gone."""
        assert self.cap is not None
        suffix = StateDir(self.cap.cfg.checkpoint_path).suffix_of(path)
        if suffix is None or path.parent != self.local_dir:
            return  # (not one of this capturer's side files)
        key = "journal" + suffix
        value = zlib.compress(("\n".join(lines) + "\n").encode(), 6)
        with self._journal_lock:
            while True:
                GUARD.check(f"journal {path.name}")
                try:
                    self._journal_coord.put_fenced({key: value})
                    return
                except CoordinationRefused:
                    raise  # (too large, etcd full: the region stops with etcd's answer)
                except CoordinationError as exc:
                    log.warning("ha: %s not in etcd yet (%s): the region waits", path.name, exc)
                    time.sleep(0.2)

    def publish(self, cp: Checkpoint) -> None:
        """Before a checkpoint is written locally: the state to etcd, fenced by the epoch.
        Fenced if this node is no longer the active one; CoordinationError if etcd did not
        answer (the checkpoint is then not written anywhere this time)."""
        GUARD.check("checkpoint")
        assert self.cap is not None
        path = self.cap.cfg.checkpoint_path
        files = {suffix: p.read_text(encoding="utf-8") for suffix, p in StateDir(path).side_files().items()}
        raw = pack_state({"version": 1, "checkpoint": cp.to_json(), "files": files, "epoch": self.epoch,
                          "holder": self.id, "written_at": time.time()})
        if len(raw) > MAX_STATE:
            raise CoordinationError(f"the state is {len(raw)} bytes compressed, more than etcd takes "
                                    f"({MAX_STATE}); files: {', '.join(files)}")
        self.coord.put_fenced({"state": raw})

    def _note_takeover(self, prev: dict[str, Any] | None, vacant_since: float) -> None:
        import json

        got = self.coord.get("takeovers")
        try:
            past = json.loads(got[0]) if got else []
        except ValueError:
            past = []
        entry = {"at": round(time.time(), 3), "epoch": self.epoch, "to": self.id,
                 "from": (prev or {}).get("id"), "restore_seconds": round(time.time() - vacant_since, 3)}
        self.takeovers = (past if isinstance(past, list) else [])[-19:] + [entry]
        self.coord.put_fenced({"takeovers": json.dumps(self.takeovers).encode()})


def run_node(cfg: AppConfig, argv: list[str], stop: threading.Event, make_capturer: Callable[..., Any],
             status_server: Callable[..., Any]) -> int:
    try:
        node = HaNode(cfg, argv, stop, make_capturer, status_server)
    except (ImportError, CapturerError) as exc:
        print(f"start-up refused: [ha]: {exc}", file=sys.stderr)
        return 2
    return node.run()

