"""Micro-bench of the webhook sender's cost per POST: ``WebhookSender.send`` of a small batch
against a bare ``requests.Session.post`` of the same body and headers, to the same local receiver
(http.server, keep-alive), interleaved rounds in one process. What the sender adds per request
(the whole-request deadline, the connection tracking, the status's waiting fields) shows as the
ratio; small batches (one transaction of ``--rows`` rows) make it as large as it gets.

    .venv/bin/python bench/webhook_posts.py [--posts 1500] [--rounds 8] [--rows 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from capturer.model import Position, RowChange, TableSchema, Txn
from senders.local.sender import txn_blocks_json
from senders.webhook.sender import WebhookSender


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--posts", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--rows", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/in"
    schema = TableSchema("app", "t", ("id", "v"), ("id",))
    batch = [Txn("r1", 1, Position("bin.000001", 100),
                 tuple(RowChange(schema, "insert", None, {"id": i, "v": f"value {i}"}) for i in range(a.rows)))]
    keys = {k.name: k.default for k in WebhookSender.KEYS}

    def sender() -> float:
        s = WebhookSender("hook", {**keys, "url": url})
        s.open()
        t0 = time.perf_counter()
        for _ in range(a.posts):
            s.send(batch)
        dt_ = time.perf_counter() - t0
        s.close()
        return a.posts / dt_

    def bare() -> float:
        import requests

        body = b"".join(b for t in batch for b in txn_blocks_json(t))
        headers = {"Content-Type": "application/x-ndjson", "Idempotency-Key": "k", "X-Capturer-Position": "[1]",
                   "X-Capturer-Rows": str(a.rows), "X-Capturer-Txns": "1"}
        with requests.Session() as s:
            t0 = time.perf_counter()
            for _ in range(a.posts):
                s.post(url, data=body, headers=headers, timeout=30, allow_redirects=False).raise_for_status()
            return a.posts / (time.perf_counter() - t0)

    res: dict[str, list[float]] = {"bare": [], "sender": []}
    for r in range(a.rounds):
        order = (("bare", bare), ("sender", sender)) if r % 2 == 0 else (("sender", sender), ("bare", bare))
        for name, fn in order:
            res[name].append(fn())
    srv.shutdown()
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    out = {"bench": "webhook_posts", "date": dt.date.today().isoformat(), "posts": a.posts, "rows": a.rows,
           "rounds": a.rounds, "posts_per_s": {k: [round(x) for x in v] for k, v in res.items()},
           "median": {k: round(v) for k, v in med.items()}, "best": {k: round(max(v)) for k, v in res.items()},
           "sender_over_bare_median": round(med["sender"] / med["bare"], 3),
           "sender_over_bare_best": round(max(res["sender"]) / max(res["bare"]), 3)}
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
