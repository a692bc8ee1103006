"""HTTP status: ``GET /`` (a live status page, capturer/ui), ``GET /status`` (JSON),
``GET /health``, ``GET /metrics`` (Prometheus), and the control endpoints
``POST /senders/<name>/pause|resume``, ``/filter/reload``, ``/snapshot``, ``/stop``.

Binds 127.0.0.1 unless ``httpHost`` says otherwise. The GET endpoints only read a
snapshot function. A control endpoint acts only with the configured
``controlToken`` (``Authorization: Bearer <token>``, compared in constant
time); with no token configured they are off, and the port stays read-only.
The page sends the token in that header (never in a cookie), so another site
cannot make a browser call a control endpoint.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from capturer.model import ts_physical_ms

log = logging.getLogger(__name__)

Snapshot = Callable[[], dict[str, Any]]


REGION_STATES = ("new", "connecting", "streaming", "reconnecting", "failed", "stopped")
SENDER_STATES = ("new", "running", "retrying", "paused", "failed", "stopped")
STREAM_STATES = ("live", "catching up", "paused", "failing", "detached")


def _ts_seconds(ts: int | None) -> float:
    """A TSO's physical part (ms since the epoch) in seconds; 0 for none (also a commit_ts
    without a time: the CREATE statements a first start's copy sends take 1, 2, ...)."""
    return ts_physical_ms(ts) / 1000.0 if ts else 0.0


class _Collector(Collector):
    """The status snapshot as Prometheus metrics (prometheus_client names counters
    ``..._total``; units are in the names: ``_seconds``, ``_rows``)."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        s = self.snapshot()
        now = time.time()
        up = GaugeMetricFamily("capturer_start_time_seconds", "when this capturer process started (unix time)")
        up.add_metric([], s.get("started_at") or 0)
        yield up
        yield from _ha_metrics(s.get("ha") or {})
        if (s.get("ha") or {}).get("role") == "standby":
            return  # a standby runs no pipeline
        yield from _checkpoint_metrics(s, now)
        yield from _region_metrics(s["regions"])
        yield from _merger_metrics(s.get("merger") or {}, s["regions"])
        yield from _store_region_metrics(s["regions"])
        yield from _snapshot_metrics(s["regions"])
        yield from _sender_metrics(s["senders"], now)
        yield from _verify_metrics(s.get("verify") or {})
        yield from _stream_metrics(s.get("stream"))


def _checkpoint_metrics(s: dict[str, Any], now: float) -> Iterator[Any]:
    """The checkpoint (its commit_ts, age and lag) and the lag every sender has acknowledged."""
    cp = GaugeMetricFamily("capturer_checkpoint_commit_ts", "checkpoint commit_ts (TSO)")
    cp.add_metric([], s["checkpoint"]["commit_ts"])
    yield cp
    age = GaugeMetricFamily("capturer_checkpoint_age_seconds", "seconds since the checkpoint was written")
    age.add_metric([], s["checkpoint"].get("age_seconds") or 0)
    yield age
    cpt = GaugeMetricFamily("capturer_checkpoint_timestamp_seconds",
                            "commit time the checkpoint holds (unix time)")
    if _ts_seconds(s["checkpoint"]["commit_ts"]):
        cpt.add_metric([], _ts_seconds(s["checkpoint"]["commit_ts"]))
    yield cpt
    cplag = GaugeMetricFamily("capturer_checkpoint_lag_seconds",
                              "seconds between now and the commit time the checkpoint holds")
    if _ts_seconds(s["checkpoint"]["commit_ts"]):
        cplag.add_metric([], max(0.0, now - _ts_seconds(s["checkpoint"]["commit_ts"])))
    yield cplag
    lag = GaugeMetricFamily("capturer_lag_seconds",
                            "seconds between now and the commit time every sender has acknowledged")
    if _ts_seconds(s.get("acked_ts")):
        lag.add_metric([], max(0.0, now - _ts_seconds(s["acked_ts"])))
    yield lag


def _region_metrics(regions: dict[str, Any]) -> Iterator[Any]:
    """Per region: lag, counts, queue, state, failovers, server, heartbeats, a PostgreSQL slot's WAL."""
    rlag = GaugeMetricFamily("capturer_region_lag_seconds", "region lag", labels=["region"])
    rtx = CounterMetricFamily("capturer_region_txns", "transactions read", labels=["region"])
    rrow = CounterMetricFamily("capturer_region_rows", "row changes read", labels=["region"])
    rq = GaugeMetricFamily("capturer_region_queue_rows", "rows queued after a region", labels=["region"])
    rre = CounterMetricFamily("capturer_region_reconnects", "reconnects", labels=["region"])
    rst = GaugeMetricFamily("capturer_region_state", "1 for the state the region is in, 0 for the others",
                            labels=["region", "kind", "state"])
    rerr = GaugeMetricFamily("capturer_region_failing", "1 while the region reconnects or has failed",
                             labels=["region"])
    rfo = CounterMetricFamily("capturer_region_failovers", "changes of the server a region reads (a primary "
                              "failed over to a replica), where the region has several", labels=["region"])
    rsrv = GaugeMetricFamily("capturer_region_server", "1 for the server the region reads now",
                             labels=["region", "server"])
    rhb = CounterMetricFamily("capturer_region_heartbeats", "heartbeats a region passed on (an idle or "
                              "filtered-only source's position moves with them)", labels=["region"])
    rhba = GaugeMetricFamily("capturer_region_heartbeat_age_seconds", "seconds since the region's newest "
                             "heartbeat", labels=["region"])
    rwal = GaugeMetricFamily("capturer_postgresql_slot_wal_held_bytes", "WAL the server keeps for the "
                             "region's replication slot (insert position - restart_lsn)", labels=["region"])
    for name, r in regions.items():
        rlag.add_metric([name], r["lag_seconds"])
        rtx.add_metric([name], r["txns"])
        rrow.add_metric([name], r["rows"])
        rq.add_metric([name], r["queue_rows"])
        rre.add_metric([name], r["reconnects"])
        for st in sorted(set(REGION_STATES) | {r["state"]}):
            rst.add_metric([name, r.get("kind", ""), st], 1 if st == r["state"] else 0)
        rerr.add_metric([name], 1 if r["state"] in ("reconnecting", "failed") else 0)
        if "failovers" in r:
            rfo.add_metric([name], r["failovers"])
        if r.get("server"):
            rsrv.add_metric([name, r["server"]], 1)
        rhb.add_metric([name], r.get("heartbeats", 0))
        if r.get("heartbeat_age_seconds") is not None:
            rhba.add_metric([name], r["heartbeat_age_seconds"])
        if r.get("slot_wal_held_bytes") is not None:
            rwal.add_metric([name], r["slot_wal_held_bytes"])
    yield from (rlag, rtx, rrow, rq, rre, rst, rerr, rfo, rsrv, rhb, rhba, rwal)


def _merger_metrics(merger: dict[str, Any], regions: dict[str, Any]) -> Iterator[Any]:
    """The merge's watermark and the regions it waits for."""
    wm = GaugeMetricFamily("capturer_merger_watermark_ts", "the merge's watermark (TSO): the lowest newest "
                                                           "commit_ts over the regions")
    wmt = GaugeMetricFamily("capturer_merger_watermark_timestamp_seconds",
                            "the merge's watermark as a commit time (unix time)")
    if merger.get("watermark"):
        wm.add_metric([], merger["watermark"])
        wmt.add_metric([], _ts_seconds(merger["watermark"]))
    yield wm
    yield wmt
    wait = GaugeMetricFamily("capturer_merger_waiting_for_region", "1 for a region the merge waits for now",
                             labels=["region"])
    waiting = set(merger.get("waiting_for") or ())
    for name in regions:
        wait.add_metric([name], 1 if name in waiting else 0)
    yield wait


def _store_region_metrics(regions: dict[str, Any]) -> Iterator[Any]:
    """BaikalDB regions: each binlog region of the binlog table."""
    slag = GaugeMetricFamily("capturer_baikaldb_store_region_lag_seconds",
                             "seconds behind the clock of the newest ts read from a binlog region",
                             labels=["region", "store_region"])
    sev = CounterMetricFamily("capturer_baikaldb_store_region_events",
                              "leader redirects, peer failures, follower reads, VERSION_OLD answers, retries",
                              labels=["region", "store_region", "event"])
    for name, r in regions.items():
        for rid, sr in (r.get("store_regions") or {}).items():
            if sr.get("lag_seconds") is not None:
                slag.add_metric([name, rid], sr["lag_seconds"])
            for ev in ("not_leader", "peer_failures", "follower_reads", "version_old", "retries"):
                sev.add_metric([name, rid, ev], sr.get(ev, 0))
    yield from (slag, sev)


def _snapshot_metrics(regions: dict[str, Any]) -> Iterator[Any]:
    """Per region and table being copied: rows, estimate, rate, done."""
    snrows = GaugeMetricFamily("capturer_snapshot_rows", "rows delivered by a table snapshot",
                               labels=["region", "table"])
    snest = GaugeMetricFamily("capturer_snapshot_estimated_rows", "estimated rows of a table being copied",
                              labels=["region", "table"])
    snrate = GaugeMetricFamily("capturer_snapshot_rows_per_second", "copy rate of a table snapshot",
                               labels=["region", "table"])
    sndone = GaugeMetricFamily("capturer_snapshot_done", "1 when a table's snapshot is done (or dropped)",
                               labels=["region", "table"])
    for name, r in regions.items():
        for table, t in ((r.get("snapshot") or {}).get("tables") or {}).items():
            snrows.add_metric([name, table], t["rows"])
            snest.add_metric([name, table], t["estimated_rows"])
            snrate.add_metric([name, table], t["rows_per_s"])
            sndone.add_metric([name, table], 1 if t["state"] in ("done", "dropped") else 0)
    yield from (snrows, snest, snrate, sndone)


def _sender_metrics(senders: dict[str, Any], now: float) -> Iterator[Any]:
    """Per sender: counts, acknowledged position and lag, errors, queue, state, process, backlog."""
    srow = CounterMetricFamily("capturer_sender_rows", "rows delivered", labels=["sender"])
    stx = CounterMetricFamily("capturer_sender_txns", "transactions delivered", labels=["sender"])
    sack = GaugeMetricFamily("capturer_sender_acked_ts", "acknowledged commit_ts", labels=["sender"])
    sackt = GaugeMetricFamily("capturer_sender_acked_timestamp_seconds",
                              "commit time the sender has acknowledged (unix time)", labels=["sender"])
    slg = GaugeMetricFamily("capturer_sender_lag_seconds",
                            "seconds between now and the commit time the sender has acknowledged",
                            labels=["sender"])
    serr = CounterMetricFamily("capturer_sender_errors", "delivery errors", labels=["sender"])
    sret = CounterMetricFamily("capturer_sender_retries", "delivery retries", labels=["sender"])
    sq = GaugeMetricFamily("capturer_sender_queue_rows", "rows queued for a sender", labels=["sender"])
    sqc = GaugeMetricFamily("capturer_sender_queue_capacity_rows", "rows a sender's queue holds before "
                                                                   "the stream waits", labels=["sender"])
    sp = GaugeMetricFamily("capturer_sender_paused", "1 while an operator has paused the sender",
                           labels=["sender"])
    sst = GaugeMetricFamily("capturer_sender_state", "1 for the state the sender is in, 0 for the others",
                            labels=["sender", "state"])
    sprs = CounterMetricFamily("capturer_sender_process_restarts", "times a sender's own process "
                               "(process=true) was started again after it died", labels=["sender"])
    sss = GaugeMetricFamily("capturer_sender_stream_state", "1 for where the sender stands in the stream "
                            "(live, catching up, paused, failing, detached), 0 for the others",
                            labels=["sender", "state"])
    slr = GaugeMetricFamily("capturer_sender_lag_rows", "rows of the stream the sender has not acknowledged yet",
                            labels=["sender"])
    sbb = GaugeMetricFamily("capturer_sender_backlog_bytes", "bytes of the backlog on disk kept for the sender",
                            labels=["sender"])
    sdt = GaugeMetricFamily("capturer_sender_detached", "1 while the sender is detached (the backlog limit was "
                            "reached while it was behind): it receives nothing until attached again",
                            labels=["sender"])
    for name, snd in senders.items():
        if "stream_state" in snd:
            for st in STREAM_STATES:
                sss.add_metric([name, st], 1 if st == snd["stream_state"] else 0)
            slr.add_metric([name], snd.get("lag_rows", 0))
            sbb.add_metric([name], snd.get("backlog_bytes", 0))
            sdt.add_metric([name], 1 if snd.get("detached") else 0)
        if isinstance(snd.get("process"), dict):
            sprs.add_metric([name], snd["process"].get("restarts", 0))
        srow.add_metric([name], snd["rows"])
        stx.add_metric([name], snd["txns"])
        sack.add_metric([name], snd["acked_ts"])
        if _ts_seconds(snd["acked_ts"]):
            sackt.add_metric([name], _ts_seconds(snd["acked_ts"]))
            slg.add_metric([name], max(0.0, now - _ts_seconds(snd["acked_ts"])))
        serr.add_metric([name], snd["errors"])
        sret.add_metric([name], snd["retries"])
        sq.add_metric([name], snd["queue_rows"])
        sqc.add_metric([name], snd.get("queue_capacity_rows", 0))
        sp.add_metric([name], 1 if snd.get("paused") else 0)
        for st in sorted(set(SENDER_STATES) | {snd["state"]}):
            sst.add_metric([name, st], 1 if st == snd["state"] else 0)
    yield from (srow, stx, sack, sackt, slg, serr, sret, sq, sqc, sp, sst, sprs, sss, slr, sbb, sdt)


def _stream_metrics(st: dict[str, Any] | None) -> Iterator[Any]:
    """The merged stream: the backlog on disk, rows in memory, waits."""
    if not st:
        return
    yield GaugeMetricFamily("capturer_backlog_bytes", "bytes of the backlog on disk", value=st["backlog_bytes"])
    yield GaugeMetricFamily("capturer_backlog_max_bytes", "backlogMaxMB in bytes (0: no backlog)",
                            value=st["backlog_max_bytes"])
    yield GaugeMetricFamily("capturer_stream_memory_rows", "rows of the merged stream held in memory",
                            value=st["memory_rows"])
    yield CounterMetricFamily("capturer_backlog_items_written", "items written to the backlog",
                              value=st["evicted_to_disk"])
    yield CounterMetricFamily("capturer_stream_waits", "times the stream waited for the senders furthest "
                              "behind (memory full and no room in the backlog)", value=st["waits"])

def _ha_metrics(ha: dict[str, Any]) -> Iterator[Any]:
    """High availability (capturer/ha): this capturer's role, the epoch, the last takeover."""
    if ha.get("role") not in ("active", "standby"):
        return
    g = GaugeMetricFamily("capturer_ha_active", "1 if this capturer holds the lease and runs, 0 if it is a standby",
                          labels=["id", "group"])
    g.add_metric([str(ha.get("id")), str(ha.get("name"))], 1 if ha["role"] == "active" else 0)
    yield g
    g = GaugeMetricFamily("capturer_ha_epoch", "the epoch (fencing token) of the active capturer's lease")
    g.add_metric([], ha.get("epoch") or 0)
    yield g
    g = GaugeMetricFamily("capturer_ha_lease_remaining_seconds", "how long this active capturer's lease surely lasts")
    if ha.get("lease_remaining_seconds") is not None:
        g.add_metric([], ha["lease_remaining_seconds"])
    yield g
    g = GaugeMetricFamily("capturer_ha_last_takeover_timestamp_seconds", "when the last takeover happened (unix time)")
    if ha.get("last_takeover"):
        g.add_metric([], ha["last_takeover"]["at"])
    yield g
    g = GaugeMetricFamily("capturer_ha_members", "capturers of the group that etcd knows are running")
    g.add_metric([], len(ha.get("members") or []))
    yield g
    g = GaugeMetricFamily("capturer_ha_etcd_up", "0 while the last call to etcd failed")
    g.add_metric([], 0 if (ha.get("etcd") or {}).get("error") else 1)
    yield g
    yield CounterMetricFamily("capturer_ha_step_downs", "times this capturer lost its lease unplanned and stepped "
                              "down (a handover or a stop is not one)", value=int(ha.get("step_downs") or 0))


def _verify_metrics(v: dict[str, Any]) -> Iterator[Any]:
    """The last ``verify`` (POST /verify): per sender and table, what it found."""
    run = GaugeMetricFamily("capturer_verify_running", "1 while a verify runs", value=1 if v.get("state") == "running"
                            else 0)
    yield run
    last = v.get("last") or {}
    fin = GaugeMetricFamily("capturer_verify_finished_timestamp_seconds", "when the last verify finished (unix time)")
    if last.get("finished"):
        fin.add_metric([], last["finished"])
    yield fin
    code = GaugeMetricFamily("capturer_verify_exit_code", "the last verify's outcome: 0 equal, 1 different, "
                             "2 a source or destination unreadable, 3 not settled")
    if last:
        code.add_metric([], last.get("exit_code", 0))
    yield code
    labels = ["sender", "table"]
    fams = {k: GaugeMetricFamily(f"capturer_verify_{k}_rows", doc, labels=labels) for k, doc in (
        ("compared", "source rows compared by the last verify"), ("missing", "rows missing in the sink"),
        ("extra", "rows in the sink the sources do not have"), ("different", "rows that differ"),
        ("unsettled", "rows that kept changing while compared"))}
    equal = GaugeMetricFamily("capturer_verify_equal", "1 when the table was found equal, 0 otherwise",
                              labels=labels)
    when = GaugeMetricFamily("capturer_verify_checked_timestamp_seconds", "when the table was checked",
                             labels=labels)
    for t in last.get("tables") or []:
        lv = [t["sender"], t["table"]]
        fams["compared"].add_metric(lv, t["rows"])
        for k in ("missing", "extra", "different", "unsettled"):
            fams[k].add_metric(lv, t[k])
        equal.add_metric(lv, 1 if t["status"] == "equal" else 0)
        when.add_metric(lv, t["checked_at"])
    yield from fams.values()
    yield equal
    yield when


MAX_BODY = 64 * 1024
READ_ONLY = ("/", "/status", "/health", "/metrics")
UI_DIR = Path(__file__).resolve().parent / "ui"
#: what GET serves from capturer/ui (read once; nothing else of the disk is reachable)
UI_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/app.css": ("app.css", "text/css; charset=utf-8"),
    "/ui/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/ui/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
}
PAGE_HEADERS = (
    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                "base-uri 'none'; form-action 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
)


LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def host_allowed(header: str | None, extra: tuple[str, ...] = ()) -> bool:
    """For a port bound to loopback: the Host a browser sent names loopback, or one
    of ``extra`` (httpAllowedHosts); a page of another site whose name was rebound
    to 127.0.0.1 sends its own name."""
    if not header:
        return True  # not a browser (HTTP/1.0 clients, scripts): nothing to rebind
    name = header.strip().lower()
    if name.startswith("["):
        name = name[1:name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    return name in LOOPBACK_NAMES or _is_loopback(name) or name in extra


def is_control_path(path: str) -> bool:
    parts = path.strip("/").split("/")
    if len(parts) == 3 and parts[0] == "senders" and parts[2] in ("pause", "resume", "attach"):
        return True
    return path in ("/snapshot", "/filter/reload", "/stop", "/verify", "/handover")


def _load_ui() -> dict[str, tuple[bytes, str]]:
    out = {}
    for path, (name, ctype) in UI_FILES.items():
        try:
            out[path] = ((UI_DIR / name).read_bytes(), ctype)
        except OSError as exc:  # an install without the page: the JSON endpoints still work
            log.warning("status page file %s missing (%s): GET %s answers 404", UI_DIR / name, exc, path)
    return out


class _Server(ThreadingHTTPServer):
    """The status port's server; StatusServer sets what its requests answer with."""

    daemon_threads = True
    snapshot: Snapshot
    healthy: Callable[[], tuple[bool, str]]
    control: Control | None
    token: str
    allowed_hosts: tuple[str, ...]
    check_host: bool
    registry: CollectorRegistry
    ui: dict[str, tuple[bytes, str]]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets its connection is not an error; anything else goes to
        the log (socketserver would print a bare traceback on stderr)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("http: client %s went away: %s", client_address, exc)
        else:
            log.error("http: request from %s failed", client_address, exc_info=True)


Control = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]


class _Handler(BaseHTTPRequestHandler):
    """One request; what it answers with is its server's (``_Server``): the snapshot, health,
    control and metrics callbacks, the token and the Host check."""

    server: _Server

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet
        log.debug("http: " + fmt, *args)

    def _send(self, code: int, body: bytes, ctype: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        except ConnectionError:  # the client went away before its answer: not our error
            self.close_connection = True

    timeout = 30  # a client that sends nothing (or too slowly) is dropped

    def _json(self, code: int, d: dict[str, Any]) -> None:
        self._send(code, json.dumps(d, default=str).encode(), "application/json",
                   (("Cache-Control", "no-store"),))

    def _refuse_host(self) -> bool:
        if self.server.check_host and not host_allowed(self.headers.get("Host"), self.server.allowed_hosts):
            self._json(403, {"error": "this status port answers only to 127.0.0.1, localhost, [::1] and "
                                      "the names in httpAllowedHosts (a Host of another name is refused: "
                                      "DNS rebinding)"})
            return True
        return False

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if self._refuse_host():
            return
        if path in READ_ONLY or path in UI_FILES:
            self._send(405, json.dumps({"error": f"{path} is read-only: use GET"}).encode(),
                       "application/json", (("Allow", "GET"),))
            return
        control = self.server.control
        if not is_control_path(path) or control is None:
            self._json(404, {"error": "not found; control endpoints: POST /senders/<name>/pause, "
                                      "/senders/<name>/resume, /senders/<name>/attach, /filter/reload, /snapshot, /stop"})
            return
        token = self.server.token
        if not token:
            self._json(403, {"error": "control endpoints are off: set controlToken in [global] of the "
                                      "config to enable them"})
            return
        given = self.headers.get("Authorization", "")
        given = given[7:] if given.startswith("Bearer ") else self.headers.get("X-Capturer-Token", "")
        if not hmac.compare_digest(given.encode(), token.encode()):
            log.warning("http: POST %s from %s refused: missing or wrong token", path, self.client_address[0])
            self._json(401, {"error": "missing or wrong token (Authorization: Bearer <controlToken>)"})
            return
        try:
            n = int(self.headers.get("Content-Length") or 0)
            if n < 0:
                raise ValueError(n)
        except ValueError:
            self._json(400, {"error": "bad Content-Length"})
            return
        if n > MAX_BODY:
            self._json(413, {"error": f"body larger than {MAX_BODY} bytes"})
            return
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as exc:
            self._json(400, {"error": f"bad JSON body: {exc}"})
            return
        try:
            code, out = control(path, body)
        except Exception as exc:
            log.exception("http POST %s failed", path)
            code, out = 500, {"error": str(exc)}
        log.info("http: POST %s from %s: %d", path, self.client_address[0], code)
        self._json(code, out)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if self._refuse_host():
            return
        try:
            if path == "/status":
                self._send(200, json.dumps(self.server.snapshot(), indent=2, default=str).encode(), "application/json",
                           (("Cache-Control", "no-store"),))
            elif path == "/health":
                ok, why = self.server.healthy()
                self._json(200 if ok else 503, {"ok": ok, "reason": why})
            elif path == "/metrics":
                self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
            elif path in self.server.ui:
                body, ctype = self.server.ui[path]
                self._send(200, body, ctype, PAGE_HEADERS + (("Cache-Control", "no-cache"),))
            else:
                self._json(404, {"error": "not found; try / (the status page), /status, /health, "
                                          "/metrics"})
        except Exception as exc:
            log.exception("http %s failed", path)
            self._json(500, {"error": str(exc)})


class StatusServer:
    """``GET /`` (the live status page), ``GET /status`` ``/health`` ``/metrics``, and
    the POST control endpoints (see ``is_control_path``), which act only with the
    token."""

    def __init__(self, host: str, port: int, snapshot: Snapshot, healthy: Callable[[], tuple[bool, str]],
                 control: Control | None = None, token: str = "", allowed_hosts: tuple[str, ...] = (),
                 collector: Collector | None = None, pages: dict[str, tuple[bytes, str]] | None = None):
        """``collector``/``pages``: another process's metrics and page (the applier's) instead
        of the capturer's."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector or _Collector(snapshot))
        try:
            ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes
        except Exception:
            log.debug("no process metrics here", exc_info=True)
        ui = _load_ui() if pages is None else pages
        check_host = _is_loopback(host)
        if not check_host:
            log.warning("the status port is bound to %s (httpHost): /status and /metrics are readable from the "
                        "network%s; keep 127.0.0.1 and reach it through an SSH tunnel or a TLS proxy", host,
                        ", and the control token travels in clear text" if token else "")

        try:
            self.httpd = _Server((host, port), _Handler)
        except OSError as exc:  # port taken, address not local, name unknown
            err = OSError(f"cannot serve the status port on {host}:{port} (httpHost, httpPort): "
                          f"{exc.strerror or exc}")
            err.errno = exc.errno
            raise err from None
        self.httpd.snapshot, self.httpd.healthy, self.httpd.control = snapshot, healthy, control
        self.httpd.token, self.httpd.allowed_hosts, self.httpd.check_host = token, allowed_hosts, check_host
        self.httpd.registry, self.httpd.ui = self.registry, ui
        self.port = int(self.httpd.server_address[1])
        self.host = host
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
