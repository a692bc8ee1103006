"""The status server's page, files and control routing; a sender's pause/resume;
the terminal view. (The page in a real browser: tests/integration/test_status_page.py.)"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from capturer.errors import SinkError
from capturer.model import ColumnInfo, Position, RowChange, TableSchema, Txn
from capturer.ops.cli import render
from capturer.ops.status import UI_DIR, StatusServer
from senders.base import Sender

TOKEN = "tok-123"
S = TableSchema("db", "t", ("id",), ("id",), (), (3,), (ColumnInfo(3),))


def snapshot() -> dict[str, Any]:
    ts = (int(time.time() * 1000) - 1500) << 18
    return {
        "started_at": time.time() - 60, "now": time.time(), "uptime_seconds": 60.0, "config": "c.cfg",
        "control": {"enabled": True}, "stopping": False,
        "filter": {"path": "f.txt", "loaded_at": time.time(), "table_rules": 1, "row_rules": 0},
        "checkpoint": {"commit_ts": ts, "age_seconds": 1.0, "path": "cp.json", "regions": {}},
        "acked_ts": ts, "lag_ms_behind_sources": 1500,
        "regions": {"r<1>": {"kind": "mysql", "state": "streaming", "position_text": "b.000001:4", "lag_seconds": 0.2,
                             "txns": 5, "rows": 10, "queue_rows": 0, "reconnects": 1, "last_error": "<b>x</b>"}},
        "merger": {"watermark": ts, "waiting_for": ["r<1>"], "full_senders": [], "dispatched_rows": 10,
                   "dispatched_txns": 5},
        "senders": {"local": {"state": "paused", "paused": True, "rows": 10, "txns": 5, "acked_ts": ts,
                              "queue_rows": 3, "queue_capacity_rows": 100, "errors": 0, "retries": 2,
                              "last_error": ""}},
    }


@pytest.fixture
def server() -> Any:
    calls: list[tuple[str, dict[str, Any]]] = []

    def control(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        calls.append((path, body))
        return 200, {"did": path}

    srv = StatusServer("127.0.0.1", 0, snapshot, lambda: (True, "ok"), control, TOKEN)
    srv.start()
    srv.calls = calls  # type: ignore[attr-defined]
    yield srv
    srv.stop()


def test_vendored_chart_library_is_the_published_one() -> None:
    readme = (UI_DIR / "vendor" / "README.md").read_text()
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        want = re.search(r"([0-9a-f]{64})  " + re.escape(name), readme)
        assert want, name
        assert hashlib.sha256((UI_DIR / "vendor" / name).read_bytes()).hexdigest() == want.group(1), name
    assert "MIT" in (UI_DIR / "vendor" / "LICENSE-uPlot").read_text()


def test_page_and_its_files_are_served_with_a_strict_policy(server: StatusServer) -> None:
    base = f"http://127.0.0.1:{server.port}"
    r = requests.get(base + "/", timeout=5)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    # everything the page loads is served here (no CDN), and nothing is inline script
    srcs = [u for u in re.findall(r'(?:src|href)="([^"]+)"', r.text) if u != "data:,"]  # data:, = no favicon
    assert "<script>" not in r.text
    for src in srcs:
        assert src.startswith("/"), src
        assert requests.get(base + src, timeout=5).status_code == 200, src
    assert requests.get(base + "/ui/app.js", timeout=5).headers["Content-Type"].startswith("text/javascript")
    for path in ("/ui/../status.py", "/ui/vendor/LICENSE-uPlot", "/ui/", "/index.html", "/ui/%2e%2e/app.py"):
        assert requests.get(base + path, timeout=5).status_code == 404, path
    assert requests.post(base + "/", timeout=5).status_code == 405
    # the page never puts server text into HTML
    js = (UI_DIR / "app.js").read_text()
    assert "innerHTML" not in js and "insertAdjacentHTML" not in js and "eval(" not in js


def test_control_routing_and_token(server: StatusServer) -> None:
    base = f"http://127.0.0.1:{server.port}"
    calls = server.calls  # type: ignore[attr-defined]
    ok = {"Authorization": f"Bearer {TOKEN}"}
    for path in ("/senders/local/pause", "/senders/local/resume", "/filter/reload", "/stop", "/snapshot"):
        assert requests.post(base + path, timeout=5).status_code == 401, path
        assert requests.post(base + path, headers={"Authorization": "Bearer tok-12"}, timeout=5).status_code == 401
        assert requests.post(base + path, headers={"X-Capturer-Token": TOKEN + "4"}, timeout=5).status_code == 401
    assert calls == []
    for path in ("/senders/local/pause", "/filter/reload", "/stop"):
        r = requests.post(base + path, headers=ok, json={}, timeout=5)
        assert r.status_code == 200 and r.json() == {"did": path}
    assert requests.post(base + "/senders/local/pause", headers={"X-Capturer-Token": TOKEN}, timeout=5).ok
    for path in ("/senders/pause", "/senders/a/b/pause", "/senders/local/kill", "/stop/now"):
        assert requests.post(base + path, headers=ok, timeout=5).status_code == 404, path
    assert [c[0] for c in calls] == ["/senders/local/pause", "/filter/reload", "/stop", "/senders/local/pause"]


def test_other_host_names_are_refused_on_loopback(server: StatusServer) -> None:
    """DNS rebinding: a page of another site whose name now points to 127.0.0.1
    sends its own Host; the loopback-bound port answers only to loopback names."""
    base = f"http://127.0.0.1:{server.port}"
    for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.evil.example", "[::2]:80"):
        r = requests.get(base + "/status", headers={"Host": host}, timeout=5)
        assert r.status_code == 403 and "DNS rebinding" in r.json()["error"], host
        assert requests.post(base + "/stop", headers={"Host": host, "Authorization": f"Bearer {TOKEN}"},
                             timeout=5).status_code == 403
    for host in (f"127.0.0.1:{server.port}", "localhost", f"LOCALHOST:{server.port}", "[::1]:80", "127.0.0.2"):
        assert requests.get(base + "/health", headers={"Host": host}, timeout=5).status_code == 200, host
    assert server.calls == []  # type: ignore[attr-defined]
    proxied = StatusServer("127.0.0.1", 0, snapshot, lambda: (True, "ok"), None, "", ("status.example",))
    proxied.start()
    try:
        url = f"http://127.0.0.1:{proxied.port}/health"
        assert requests.get(url, headers={"Host": "Status.Example:443"}, timeout=5).status_code == 200
        r = requests.get(url, headers={"Host": "other.example"}, timeout=5)
        assert r.status_code == 403 and "httpAllowedHosts" in r.json()["error"]
    finally:
        proxied.stop()


def test_control_is_off_without_a_token() -> None:
    srv = StatusServer("127.0.0.1", 0, snapshot, lambda: (True, "ok"), lambda p, b: (200, {}), "")
    srv.start()
    try:
        r = requests.post(f"http://127.0.0.1:{srv.port}/senders/local/pause", headers={"Authorization": "Bearer "},
                          timeout=5)
        assert r.status_code == 403 and "controlToken" in r.json()["error"]
    finally:
        srv.stop()


class Recorder(Sender):
    def __init__(self, fail: int = 0):
        super().__init__("rec", {}, queue_rows=1000)
        self.sent: list[int] = []
        self.attempts = 0
        self.fail = fail
        self.max_backoff = 0.05

    opened = 0

    def open(self) -> None:
        self.opened += 1

    def send(self, batch: list[Txn]) -> None:
        self.attempts += 1
        if self.fail:
            self.fail -= 1
            raise SinkError("target down", retriable=True)
        self.sent += [t.commit_ts for t in batch]


def put(s: Sender, seq: int) -> None:
    s.queue.put((seq, Txn("r", seq, Position("b.000001", seq), (RowChange(S, "insert", None, {"id": seq}),))), 1)


def wait(pred: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_paused_sender_takes_and_acknowledges_nothing_until_resumed() -> None:
    s = Recorder()
    s.start(0)
    try:
        put(s, 1)
        wait(lambda: s.acked_seq == 1, "first ack")
        assert s.pause() and not s.pause()
        wait(lambda: s.state == "paused", "paused state")
        for i in (2, 3, 4):
            put(s, i)
        time.sleep(0.5)
        assert s.sent == [1] and s.acked_seq == 1 and s.acked_ts == 1 and len(s.queue) == 3
        assert s.status()["paused"] and s.status()["paused_since"]
        assert s.resume() and not s.resume()
        wait(lambda: s.acked_seq == 4, "acks after resume")
        assert s.sent == [1, 2, 3, 4] and s.state == "running" and not s.status()["paused"]
    finally:
        s.stop()
        s.join(5)


def test_pause_holds_a_retry_loop_and_stop_ends_a_pause() -> None:
    s = Recorder(fail=1000)
    s.start(0)
    try:
        put(s, 1)
        wait(lambda: s.attempts >= 2 and s.state == "retrying", "retrying")
        s.pause()
        wait(lambda: s.state == "paused", "paused while retrying")
        n = s.attempts
        time.sleep(0.5)
        assert s.attempts <= n + 1  # at most the attempt in hand when it paused
        s.fail = 0
        s.resume()
        wait(lambda: s.acked_seq == 1, "delivered after resume")
        assert s.sent == [1]
        s.pause()
        wait(lambda: s.state == "paused", "paused")
    finally:
        t = time.monotonic()
        s.stop()
        s.join(5)
    assert time.monotonic() - t < 2 and s.state == "stopped"


def test_sender_started_paused_opens_nothing_until_resumed() -> None:
    s = Recorder()
    s.pause()
    s.start(0)
    try:
        put(s, 1)
        wait(lambda: s.state == "paused", "paused from the start")
        time.sleep(0.3)
        assert s.opened == 0 and s.sent == []
        s.resume()
        wait(lambda: s.acked_seq == 1, "delivered")
        assert s.opened == 1 and s.state == "running"
    finally:
        s.stop()
        s.join(5)


def test_terminal_view() -> None:
    d = snapshot()
    old = {**d, "now": d["now"] - 2, "regions": {"r<1>": {**d["regions"]["r<1>"], "rows": 4}},
           "senders": {"local": {**d["senders"]["local"], "rows": 6}}}
    text = render("http://x", d, {"ok": True, "reason": "ok"}, old)
    lines = text.splitlines()
    assert lines[0].startswith("capturer at http://x") and "healthy" in lines[0]
    assert "held back by: region r<1>" in text  # a paused sender holds nobody back (issue 30)
    region = next(ln for ln in lines if ln.startswith("r<1>"))
    assert region.split()[:4] == ["r<1>", "mysql", "streaming", "b.000001:4"] and " 3.0 " in region
    sender = next(ln for ln in lines if ln.startswith("local"))
    assert sender.split()[:3] == ["local", "paused", "2.0"]
    # a restarted capturer (other started_at): no rates from the old counters
    again = render("http://x", {**d, "started_at": d["started_at"] + 1}, {"ok": False, "reason": "r"}, old)
    assert "UNHEALTHY" in again and next(ln for ln in again.splitlines() if ln.startswith("local")).split()[2] == "-"


def test_status_cli_exit_codes(server: StatusServer) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "capturer", "status", "--url", f"http://127.0.0.1:{server.port}",
                          "--watch", "0.2", "--count", "2"], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("capturer at http://127.0.0.1") == 2
    dead = subprocess.run([sys.executable, "-m", "capturer", "status", "--url", "http://127.0.0.1:1"], cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert dead.returncode == 1 and "cannot reach the capturer" in dead.stderr


def test_merge_waits_only_for_silent_regions() -> None:
    """An idle region that sends heartbeats does not hold the merge back; one that
    sent nothing for its silence period does (and not while items are queued)."""
    from capturer.model import Heartbeat
    from capturer.pipeline.merger import MergeStage
    from capturer.util.bqueue import WeightedQueue

    queues: dict[str, WeightedQueue[Any]] = {"a": WeightedQueue(10), "b": WeightedQueue(10)}
    stage = MergeStage(queues, lambda item: None, threading.Event())
    now = time.monotonic()
    stage.received_at = {"a": now - 10, "b": now - 0.5}
    assert stage.waiting_for() == ["a"]
    assert stage.waiting_for({"a": 20.0}) == []
    stage.received_at["b"] = now - 12
    assert stage.waiting_for() == ["b", "a"]  # silent longest first
    queues["a"].put(Heartbeat("a", 5), 1)
    assert stage.waiting_for() == ["b"]


def test_commit_ts_without_a_time_shows_no_lag() -> None:
    """Acknowledged only up to a first start's CREATE statements (commit_ts 1, 2, ...): the
    metrics and the terminal view show no lag and no time, not the time since the epoch."""
    snap = snapshot()
    snap["checkpoint"]["commit_ts"] = snap["acked_ts"] = snap["senders"]["local"]["acked_ts"] = 11
    snap["senders"]["local"]["lag_seconds"] = None
    srv = StatusServer("127.0.0.1", 0, lambda: snap, lambda: (True, "ok"), lambda p, b: (200, {}), TOKEN)
    srv.start()
    try:
        text = requests.get(f"http://127.0.0.1:{srv.port}/metrics", timeout=5).text
    finally:
        srv.stop()
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    for name in ("capturer_sender_lag_seconds", "capturer_lag_seconds", "capturer_checkpoint_lag_seconds",
                 "capturer_sender_acked_timestamp_seconds", "capturer_checkpoint_timestamp_seconds"):
        assert not [x for x in samples if x.startswith((name + " ", name + "{"))], name
    assert any(x.startswith("capturer_sender_acked_ts{") for x in samples)
    view = render("http://x", snap, {"ok": True}, None)
    assert "1970-01-01" not in view
