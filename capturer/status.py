"""HTTP status: ``GET /status`` (JSON), ``GET /health``, ``GET /metrics`` (Prometheus),
and the control endpoint ``POST /snapshot``.

Binds 127.0.0.1 unless ``httpHost`` says otherwise. The GET endpoints only read a
snapshot function. A control endpoint acts only with the configured
``controlToken`` (``Authorization: Bearer <token>``, compared in constant
time); with no token configured they are off, and the port stays read-only.
"""

from __future__ import annotations

import hmac
import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

Snapshot = Callable[[], dict[str, Any]]


class _Collector(Collector):
    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        s = self.snapshot()
        cp = GaugeMetricFamily("capturer_checkpoint_commit_ts", "checkpoint commit_ts (TSO)")
        cp.add_metric([], s["checkpoint"]["commit_ts"])
        yield cp
        age = GaugeMetricFamily("capturer_checkpoint_age_seconds", "seconds since the checkpoint was written")
        age.add_metric([], s["checkpoint"].get("age_seconds") or 0)
        yield age
        lag = GaugeMetricFamily("capturer_region_lag_seconds", "region lag", labels=["region"])
        rtx = CounterMetricFamily("capturer_region_txns", "transactions read", labels=["region"])
        rrow = CounterMetricFamily("capturer_region_rows", "row changes read", labels=["region"])
        rq = GaugeMetricFamily("capturer_region_queue_rows", "rows queued after a region", labels=["region"])
        rre = CounterMetricFamily("capturer_region_reconnects", "reconnects", labels=["region"])
        for name, r in s["regions"].items():
            lag.add_metric([name], r["lag_seconds"])
            rtx.add_metric([name], r["txns"])
            rrow.add_metric([name], r["rows"])
            rq.add_metric([name], r["queue_rows"])
            rre.add_metric([name], r["reconnects"])
        yield from (lag, rtx, rrow, rq, rre)
        # BaikalDB regions: each binlog region of the binlog table
        slag = GaugeMetricFamily("capturer_baikaldb_store_region_lag_seconds",
                                 "seconds behind the clock of the newest ts read from a binlog region",
                                 labels=["region", "store_region"])
        sev = CounterMetricFamily("capturer_baikaldb_store_region_events",
                                  "leader redirects, peer failures, follower reads, VERSION_OLD answers, retries",
                                  labels=["region", "store_region", "event"])
        for name, r in s["regions"].items():
            for rid, sr in (r.get("store_regions") or {}).items():
                if sr.get("lag_seconds") is not None:
                    slag.add_metric([name, rid], sr["lag_seconds"])
                for ev in ("not_leader", "peer_failures", "follower_reads", "version_old", "retries"):
                    sev.add_metric([name, rid, ev], sr.get(ev, 0))
        yield from (slag, sev)
        snrows = GaugeMetricFamily("capturer_snapshot_rows", "rows delivered by a table snapshot",
                                   labels=["region", "table"])
        snest = GaugeMetricFamily("capturer_snapshot_estimated_rows", "estimated rows of a table being copied",
                                  labels=["region", "table"])
        snrate = GaugeMetricFamily("capturer_snapshot_rows_per_second", "copy rate of a table snapshot",
                                   labels=["region", "table"])
        sndone = GaugeMetricFamily("capturer_snapshot_done", "1 when a table's snapshot is done (or dropped)",
                                   labels=["region", "table"])
        for name, r in s["regions"].items():
            for table, t in ((r.get("snapshot") or {}).get("tables") or {}).items():
                snrows.add_metric([name, table], t["rows"])
                snest.add_metric([name, table], t["estimated_rows"])
                snrate.add_metric([name, table], t["rows_per_s"])
                sndone.add_metric([name, table], 1 if t["state"] in ("done", "dropped") else 0)
        yield from (snrows, snest, snrate, sndone)
        srow = CounterMetricFamily("capturer_sender_rows", "rows delivered", labels=["sender"])
        stx = CounterMetricFamily("capturer_sender_txns", "transactions delivered", labels=["sender"])
        sack = GaugeMetricFamily("capturer_sender_acked_ts", "acknowledged commit_ts", labels=["sender"])
        serr = CounterMetricFamily("capturer_sender_errors", "delivery errors", labels=["sender"])
        sret = CounterMetricFamily("capturer_sender_retries", "delivery retries", labels=["sender"])
        sq = GaugeMetricFamily("capturer_sender_queue_rows", "rows queued for a sender", labels=["sender"])
        for name, snd in s["senders"].items():
            srow.add_metric([name], snd["rows"])
            stx.add_metric([name], snd["txns"])
            sack.add_metric([name], snd["acked_ts"])
            serr.add_metric([name], snd["errors"])
            sret.add_metric([name], snd["retries"])
            sq.add_metric([name], snd["queue_rows"])
        yield from (srow, stx, sack, serr, sret, sq)


MAX_BODY = 64 * 1024
READ_ONLY = ("/status", "/health", "/metrics")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets its connection is not an error; anything else goes to
        the log (socketserver would print a bare traceback on stderr)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("http: client %s went away: %s", client_address, exc)
        else:
            log.error("http: request from %s failed", client_address, exc_info=True)


Control = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]


class StatusServer:
    def __init__(self, host: str, port: int, snapshot: Snapshot, healthy: Callable[[], tuple[bool, str]],
                 control: Control | None = None, token: str = ""):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(snapshot))
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
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
                self._send(code, json.dumps(d, default=str).encode(), "application/json")

            def do_POST(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                if path in READ_ONLY:
                    self._send(405, json.dumps({"error": f"{path} is read-only: use GET"}).encode(),
                               "application/json", (("Allow", "GET"),))
                    return
                if path not in ("/snapshot",) or control is None:
                    self._json(404, {"error": "not found; control endpoints: POST /snapshot"})
                    return
                if not token:
                    self._json(403, {"error": "control endpoints are off: set controlToken in [global] of the "
                                              "config to enable them"})
                    return
                given = self.headers.get("Authorization", "")
                given = given[7:] if given.startswith("Bearer ") else self.headers.get("X-Capturer-Token", "")
                if not hmac.compare_digest(given.encode(), token.encode()):
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
                except Exception as exc:  # noqa: BLE001
                    log.exception("http POST %s failed", path)
                    code, out = 500, {"error": str(exc)}
                self._json(code, out)

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/status":
                        body = json.dumps(snapshot(), indent=2, default=str).encode()
                        self._send(200, body, "application/json")
                    elif path == "/health":
                        ok, why = healthy()
                        self._send(200 if ok else 503, json.dumps({"ok": ok, "reason": why}).encode(),
                                   "application/json")
                    elif path == "/metrics":
                        self._send(200, generate_latest(registry), "text/plain; version=0.0.4")
                    else:
                        self._send(404, b'{"error": "not found; try /status /health /metrics"}',
                                   "application/json")
                except Exception as exc:  # noqa: BLE001
                    log.exception("http %s failed", path)
                    self._send(500, json.dumps({"error": str(exc)}).encode(), "application/json")

        try:
            self.httpd = _Server((host, port), Handler)
        except OSError as exc:  # port taken, address not local, name unknown
            err = OSError(f"cannot serve the status port on {host}:{port} (httpHost, httpPort): "
                          f"{exc.strerror or exc}")
            err.errno = exc.errno
            raise err from None
        self.port = int(self.httpd.server_address[1])
        self.host = host
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
