"""HTTP status: ``GET /status`` (JSON), ``GET /health``, ``GET /metrics`` (Prometheus).

Binds 127.0.0.1 unless ``httpHost`` says otherwise. It only reads a snapshot
function; it never changes the pipeline.
"""

from __future__ import annotations

import json
import logging
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


class StatusServer:
    def __init__(self, host: str, port: int, snapshot: Snapshot, healthy: Callable[[], tuple[bool, str]]):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(snapshot))
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:  # quiet
                log.debug("http: " + fmt, *args)

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

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

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.host = host
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
