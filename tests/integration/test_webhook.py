"""The webhook sender end to end (a kind added through the plugin face alone:
senders/webhook/ and one registry line): two MariaDB shards under load, the capturer
as a real process posting to a real HTTP receiver (in this test: it stores each batch
and its position together, as the docs ask of one, and answers 503 now and then),
kill -9 twice under load -> the receiver holds every change exactly once, and its
state equals the sources."""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, checkpoint_covers, wait_for, write_config
from workload import SCHEMA, Workload, file_state_equals

from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


class StoringReceiver:
    """Appends each accepted batch to ``path`` (the file sender's JSON lines) and keeps
    its position, both under one lock; refuses ~10 % of the posts with a 503."""

    def __init__(self, path: Path, seed: int = 3):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.position: Any = None
        self.rng = random.Random(seed)
        self.accepted = self.refused = 0
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with recv.lock:
                    busy = recv.rng.random() < 0.1
                    if not busy:
                        with open(recv.path, "ab") as f:
                            f.write(body)
                        recv.position = json.loads(self.headers["X-Capturer-Position"])
                        recv.accepted += 1
                    else:
                        recv.refused += 1
                self.send_response(503 if busy else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                with recv.lock:
                    body = json.dumps({"position": recv.position}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_kill9_under_load_every_change_reaches_the_receiver_once(tmp_path: Path,
                                                                 two_servers: list[MariaDBInstance]) -> None:
    two = two_servers
    for m in two:
        for stmt in SCHEMA:
            m.execute(stmt)
    recv = StoringReceiver(tmp_path / "out" / "changes.jsonl")
    senders = (f"[global]\ntype=webhook\n[webhook]\nurl={recv.url}/batches\nposition_url={recv.url}/position\n"
               "batch_rows=200\nlinger_ms=20\nmax_backoff=0.5\n")
    cfg = write_config(tmp_path, two, senders=senders)
    loads = [Workload(m, i + 1, seed=40 + i) for i, m in enumerate(two)]
    threads = [w.thread(6000) for w in loads]
    cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    rng = random.Random(5)
    for _ in range(2):
        cap.wait_ready()
        before = recv.accepted
        wait_for(lambda: recv.accepted > before + 5, 60, "batches at the receiver")
        time.sleep(rng.uniform(0.2, 1.0))
        assert any(t.is_alive() for t in threads), "the load ended before the kill: make it longer"
        cap.kill9()
        cap.start()
    for t in threads:
        t.join(300)
    assert not any(w.errors for w in loads), [w.errors for w in loads]
    wait_for(lambda: checkpoint_covers(tmp_path, two), 180, "the webhook sender to acknowledge everything")
    assert cap.stop() == 0
    lines = [json.loads(x) for x in (tmp_path / "out" / "changes.jsonl").read_text().splitlines()]
    ids = [(d["region"], d["commit_ts"], d["seq"]) for d in lines if d.get("op") != "ddl"]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} changes reached the receiver twice"
    assert recv.refused > 0  # the 503s were met and retried
    file_state_equals(tmp_path, two)  # the receiver's state equals the sources
    assert sum(w.rows for w in loads) > 1000
