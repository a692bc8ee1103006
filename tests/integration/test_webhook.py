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
import requests
from helpers import CapturerProcess, checkpoint_covers, wait_for, write_config
from workload import SCHEMA, Workload, file_state_equals

from devtools.local_mariadb import MariaDBInstance, free_port

pytestmark = pytest.mark.integration


class StoringReceiver:
    """Appends each accepted batch to ``path`` (the file sender's JSON lines) and keeps
    its position, both under one lock; refuses ~10 % of the posts with a 503."""

    def __init__(self, path: Path, seed: int = 3, busy: float = 0.1):
        self.path = path
        self.bodies: list[bytes] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.position: Any = None
        self.rng = random.Random(seed)
        self.accepted = self.refused = 0
        self.poison = b""  # a batch holding these bytes is refused with a 400
        busy_share = busy
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if recv.poison and recv.poison in body:
                    with recv.lock:
                        recv.refused += 1
                    answer = b'{"error": "row 7 does not fit our schema"}'
                    self.send_response(400)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                    return
                with recv.lock:
                    busy = recv.rng.random() < busy_share
                    if not busy:
                        with open(recv.path, "ab") as f:
                            f.write(body)
                        recv.bodies.append(body)
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


# --- a receiver that hangs, or answers late, beside a file sender -----------------------------

TOKEN_Q, TOKEN_H = "qT0ken-in-the-url", "hT0ken-in-the-header"


class MoodyReceiver:
    """Stores each batch (the file sender's JSON lines) with its position and its
    ``Idempotency-Key``. ``mode``: "ok"; "slow": stores the batch, answers only after the
    sender's timeout (the sender sees no answer; the batch is in); "hang": takes the
    request, never answers (the connection dropped once the mode changes; nothing stored)."""

    def __init__(self, root: Path, slow_seconds: float):
        self.path = root / "out" / "changes.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.position: Any = None
        self.mode = "ok"
        self.batches: list[tuple[str, bytes]] = []  # every stored batch: its Idempotency-Key, its body
        self.slow_answers = self.hung = self.unauthorized = 0
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _hang(self) -> bool:
                if recv.mode != "hang":
                    return False
                with recv.lock:
                    recv.hung += 1
                while recv.mode == "hang":
                    time.sleep(0.05)
                self.close_connection = True  # (no answer at all)
                return True

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {TOKEN_H}" and f"token={TOKEN_Q}" in self.path:
                    return True
                with recv.lock:
                    recv.unauthorized += 1
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if not self._authorized() or self._hang():
                    return
                slow = recv.mode == "slow"
                with recv.lock:
                    with open(recv.path, "ab") as f:
                        f.write(body)
                    recv.position = json.loads(self.headers["X-Capturer-Position"])
                    recv.batches.append((self.headers["Idempotency-Key"], body))
                if slow:
                    time.sleep(slow_seconds)
                    with recv.lock:
                        recv.slow_answers += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                if not self._authorized() or self._hang():
                    return
                with recv.lock:
                    body = json.dumps({"position": recv.position}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _config(tmp: Path, two: list[MariaDBInstance], recv: MoodyReceiver, port: int, with_position: bool) -> Path:
    position = f"position_url={recv.url}/position?token={TOKEN_Q}\n" if with_position else ""
    (tmp / "senderConfig.cfg").write_text(
        "[global]\ntype=local,webhook\n"
        f"[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n"
        f"[webhook]\nurl={recv.url}/batches?token={TOKEN_Q}\n{position}auth_header=Bearer {TOKEN_H}\n"
        "batch_rows=200\nlinger_ms=20\ntimeout=1.5\nmax_backoff=0.5\n")
    (tmp / "filter_rule.txt").write_text("")
    regions = "".join(f"\n[region:r{i + 1}]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\n"
                      f"password=capturer\nserver_id={800 + i}\nheartbeat_ms=200\n" for i, m in enumerate(two))
    cfg = tmp / "config.cfg"
    cfg.write_text(f"[global]\nbinlogCheckPointPath={tmp / 'checkpoint.json'}\nsenderConfig={tmp / 'senderConfig.cfg'}\n"
                   f"filterRuleDict={tmp / 'filter_rule.txt'}\nhttpPort={port}\ncheckpointInterval=0.5\n" + regions)
    return cfg


@pytest.mark.parametrize("with_position", [True, False], ids=["position_url", "at_least_once"])
def test_a_hung_or_slow_receiver_holds_back_no_file_and_gets_everything(
        tmp_path: Path, two_servers: list[MariaDBInstance], with_position: bool) -> None:
    """Beside a file sender, under a steady load: the receiver answers after the timeout
    (having stored the batch), then hangs; the file keeps the load's pace all along, /status
    shows the webhook waiting, then retrying with its error (no token); kill -9 of the
    capturer while the receiver hangs, a restart, the receiver answers again: it has every
    change; with position_url none twice. Without it, the duplicates are counted by change
    identity and by Idempotency-Key (what a receiver that honours the key still sees)."""
    from integration.test_independent_senders import Load

    two = two_servers
    for m in two:
        m.execute(*SCHEMA)
    recv = MoodyReceiver(tmp_path / "recv", slow_seconds=2.5)
    port = free_port()
    cfg = _config(tmp_path, two, recv, port, with_position)
    status_url = f"http://127.0.0.1:{port}/status"

    def status() -> dict[str, Any]:
        text = requests.get(status_url, timeout=10).text
        assert TOKEN_Q not in text and TOKEN_H not in text, "a token on /status"
        return json.loads(text)  # type: ignore[no-any-return]

    def lags() -> dict[str, float]:
        return {n: (s["lag_seconds"] if s["lag_seconds"] is not None else 1e9) for n, s in status()["senders"].items()}

    cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    cap.wait_ready()
    with Load(two, pace=0.02) as load:
        wait_for(lambda: all(v < 5 for v in lags().values()), 120, "both senders streaming")
        # answers after the timeout: the batch is in, the sender saw no answer and retries
        recv.mode = "slow"
        wait_for(lambda: recv.slow_answers >= 3, 120, "three late answers")
        recv.mode = "ok"
        # hangs: the file goes on at the load's pace while the webhook falls behind
        before = load.rows
        recv.mode = "hang"
        wait_for(lambda: (status()["senders"]["webhook"]["waiting_seconds"] or 0) > 0.3, 60,
                 "/status to show the request waiting for the receiver")
        worst = 0.0
        while True:
            lg, hook = lags(), status()["senders"]["webhook"]
            worst = max(worst, lg["local"])
            if lg["webhook"] > 12 and hook["state"] == "retrying":
                break
            time.sleep(0.5)
        assert "no whole answer within timeout = 1.5 s" in hook["last_error"], hook
        assert "/batches?token=***" in hook["last_error"] or "/position?token=***" in hook["last_error"], hook
        assert worst < 8, worst  # the file was never held by the hung receiver
        assert load.rows - before > 100
        # kill -9 while it hangs; the new capturer's file catches up and goes on, the webhook still hung
        cap.kill9()
        cap.start()
        cap.wait_ready()
        wait_for(lambda: lags()["local"] < 5, 120, "the file to catch up after the restart")
        wait_for(lambda: status()["senders"]["webhook"]["state"] == "retrying", 60, "the webhook retrying")
        recv.mode = "ok"
        wait_for(lambda: lags()["webhook"] < 5, 180, "the webhook to catch up")
    wait_for(lambda: checkpoint_covers(tmp_path, two), 180, "both senders to acknowledge everything")
    assert cap.stop() == 0
    log = (tmp_path / "capturer.log").read_text()
    assert TOKEN_Q not in log and TOKEN_H not in log, "a token in the capturer's log"
    assert recv.unauthorized == 0 and recv.hung > 0
    file_state_equals(tmp_path, two)  # the file
    file_state_equals(tmp_path / "recv", two)  # the receiver: every change (copies collapsed by identity)
    lines = [json.loads(x) for x in recv.path.read_text().splitlines()]
    ids = [(d["region"], d["commit_ts"], d["seq"]) for d in lines if d.get("op") != "ddl"]
    by_identity = len(ids) - len(set(ids))
    seen: set[str] = set()
    got: set[tuple[Any, ...]] = set()
    kept = 0  # changes a receiver that drops a batch whose Idempotency-Key it has seen still gets twice
    for key, body in recv.batches:
        if key in seen:
            continue
        seen.add(key)
        for d in map(json.loads, body.splitlines()):
            ident = (d["region"], d["commit_ts"], d["seq"])
            kept += ident in got
            got.add(ident)
    print(f"\nwebhook duplicates ({'with' if with_position else 'without'} position_url): {by_identity} by change "
          f"identity (a receiver ignoring Idempotency-Key), {kept} for one that drops repeated keys; "
          f"{len(ids)} changes, {len(recv.batches)} batches stored")
    if with_position:
        assert by_identity == 0, f"{by_identity} changes reached the receiver twice"
    else:
        assert by_identity > 0  # the late answers' batches were posted again (at least once, as documented)
        assert kept < by_identity  # the key drops the same batch posted again, not the re-cut ones



# --- hostile identifiers and values: the receiver gets what the file gets ---------------------

HOSTILE_DB, HOSTILE_TABLE = "we`b h'o\"ok", "t `q'u\"o té€"
HOSTILE_COLS = ("id", "c 1", "c`2", "c'3\"", "üß€", "n\\ul")


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def test_hostile_names_and_values_reach_the_receiver_as_the_file_has_them(
        tmp_path: Path, two_servers: list[MariaDBInstance]) -> None:
    """Database, table and column names with quotes, backquotes, spaces, non-ASCII; values:
    bytes that are not UTF-8, NUL, emoji, DECIMAL(65,30) at its limits, zero dates, JSON, BIT(64),
    with a key change, a delete and a rolled-back transaction: every body the receiver gets
    parses as JSON, and each change equals the file sender's line for it (the reference)."""
    from integration.test_type_edges import EDGES, _row

    m = two_servers[0]
    t = f"{_q(HOSTILE_DB)}.{_q(HOSTILE_TABLE)}"
    cols = ", ".join(_q(c) for c in HOSTILE_COLS)
    m.execute("SET GLOBAL sql_mode = ''", "CREATE DATABASE d", EDGES, f"CREATE DATABASE {_q(HOSTILE_DB)}",
              f"CREATE TABLE {t} ({_q('id')} INT PRIMARY KEY, {_q('c 1')} VARCHAR(20), {_q('c`2')} VARBINARY(8), "
              f"{_q(chr(99) + chr(39) + '3' + chr(34))} JSON, {_q('üß€')} TEXT, {_q('n' + chr(92) + 'ul')} BIT(64)) "
              "DEFAULT CHARSET=utf8mb4")
    recv = StoringReceiver(tmp_path / "recv" / "changes.jsonl", busy=0.0)
    senders = ("[global]\ntype=local,webhook\n"
               f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[webhook]\nurl={recv.url}/batches\nposition_url={recv.url}/position\nbatch_rows=3\nlinger_ms=0\n")
    cfg = write_config(tmp_path, [m], senders=senders)
    cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    cap.wait_ready()
    m.execute("SET SESSION sql_mode = ''",
              "INSERT INTO d.edges VALUES " + ", ".join(_row(i) for i in range(5)),
              f"INSERT INTO {t} ({cols}) VALUES (1, 'a\\0b', 0xff00fe80, '{{\"k\": [1, 2.50, \"é😀\"]}}', "
              "'😀\\'\"`\\\\', b'1111111111111111111111111111111111111111111111111111111111111111'), "
              f"(2, '', X'', 'null', NULL, b'0'), (3, NULL, 0xc328, '{{\"big\": 123456789012345678901234567890}}', "
              "'x', b'1000000000000000000000000000000000000000000000000000000000000001')",
              f"UPDATE {t} SET {_q('id')} = 10, {_q('c 1')} = 'k\\0ey' WHERE {_q('id')} = 1",
              "UPDATE d.edges SET tx = CONCAT(COALESCE(tx, ''), '+'), i64 = i64 + id, id = id + 100 WHERE id < 3",
              f"DELETE FROM {t} WHERE {_q('id')} = 2", "DELETE FROM d.edges WHERE id = 4",
              f"ALTER TABLE {t} ADD COLUMN {_q('new `c é')} INT DEFAULT 7",
              f"UPDATE {t} SET {_q('new `c é')} = 8 WHERE {_q('id')} = 3")
    conn = m.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(f"INSERT INTO {t} ({_q('id')}) VALUES (99)")
            cur.execute("ROLLBACK")
    finally:
        conn.close()
    wait_for(lambda: checkpoint_covers(tmp_path, [m]), 120, "both senders to have every change")
    assert cap.stop() == 0
    bodies = recv.bodies
    assert bodies and all(b for b in bodies)
    got = [json.loads(line) for b in bodies for line in b.decode("utf-8").splitlines()]  # (strict: no bad UTF-8)
    want = [json.loads(line) for line in (tmp_path / "out" / "changes.jsonl").read_text(encoding="utf-8").splitlines()]

    def ident(d: dict[str, Any]) -> tuple[Any, ...]:
        return d["region"], d["commit_ts"], d["seq"], d.get("op")

    want_all = {ident(d): d for d in want}
    got_all = {ident(d): d for d in got}
    assert len(got_all) == len(got), "a change posted twice"
    assert set(got_all) == set(want_all)
    for k, d in want_all.items():
        assert got_all[k] == d, (k, got_all[k], d)
    (ddl,) = [d for d in got if d["op"] == "ddl" and d["sql"].startswith("ALTER")]
    assert (ddl["db"], ddl["table"]) == (HOSTILE_DB, HOSTILE_TABLE) and "new ``c é" in ddl["sql"], ddl
    got_rows = {k: d for k, d in got_all.items() if d["op"] != "ddl"}
    tables = {(d["db"], d["table"]) for d in got_rows.values()}
    assert tables == {("d", "edges"), (HOSTILE_DB, HOSTILE_TABLE)}, tables
    hostile = [d for d in got_rows.values() if d["table"] == HOSTILE_TABLE]
    assert {c for d in hostile for img in (d.get("before"), d.get("after")) if img for c in img} == \
        {*HOSTILE_COLS, "new `c é"}
    assert [d["op"] for d in hostile] == ["insert"] * 3 + ["update", "delete", "update"]  # (not the rolled back)
    assert hostile[-1]["after"]["new `c é"] == 8
    key_change = hostile[3]
    # the documented mapping: NUL kept, binary as base64 (named in b64), BIT(64) as its bit string, JSON as text
    assert key_change["before"]["id"] == 1 and key_change["after"]["id"] == 10
    assert key_change["before"]["c 1"] == "a\x00b" and key_change["after"]["c 1"] == "k\x00ey"
    assert key_change["after"]["c`2"] == "/wD+gA==" and "c`2" in key_change["b64"]
    assert key_change["after"]["n\\ul"] == "1" * 64 and key_change["after"]["üß€"] == "😀'\"`\\"
    assert json.loads(key_change["after"]["c'3\""]) == {"k": [1, 2.5, "é😀"]}


def test_a_batch_the_receiver_refuses_stops_the_capturer_with_a_clear_error_not_a_retry_loop(
        tmp_path: Path, two_servers: list[MariaDBInstance]) -> None:
    """A 400 for one batch: not retried forever, not skipped. The capturer stops (exit 1)
    after a final checkpoint, its log naming the sender, the URL (no token), the status and
    the receiver's answer; the file beside it has everything up to there. With the receiver
    fixed, a restart delivers everything, nothing twice."""
    m = two_servers[0]
    m.execute(*SCHEMA)
    recv = StoringReceiver(tmp_path / "recv" / "out" / "changes.jsonl", busy=0.0)
    recv.poison = b"poison-pill"
    senders = ("[global]\ntype=local,webhook\n"
               f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
               f"[webhook]\nurl={recv.url}/batches?token={TOKEN_Q}\nposition_url={recv.url}/position\n"
               "batch_rows=50\nlinger_ms=0\nmax_backoff=0.5\n")
    cfg = write_config(tmp_path, [m], senders=senders)
    w = Workload(m, 1, seed=7)
    w.run(20)
    cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    cap.wait_ready()
    wait_for(lambda: checkpoint_covers(tmp_path, [m]), 120, "the first changes everywhere")
    m.execute("INSERT INTO app.log (msg, n) VALUES ('poison-pill', 424242)")
    w.run(10)
    assert cap.proc is not None
    wait_for(lambda: cap.proc is not None and cap.proc.poll() is not None, 120, "the capturer to stop on the 400")
    assert cap.proc.returncode == 1
    log = (tmp_path / "capturer.log").read_text()
    assert TOKEN_Q not in log
    assert (f"sender webhook (POST {recv.url}/batches?token=***): posting" in log
            and "the receiver answered 400 Bad Request" in log and "row 7 does not fit our schema" in log), log[-3000:]
    assert recv.refused == 1  # once: not retried
    recv.poison = b""
    cap.start()
    cap.wait_ready()
    w.run(10)
    wait_for(lambda: checkpoint_covers(tmp_path, [m]), 120, "everything everywhere after the restart")
    assert cap.stop() == 0
    file_state_equals(tmp_path, [m])
    file_state_equals(tmp_path / "recv", [m])
    lines = [json.loads(x) for x in recv.path.read_text().splitlines()]
    ids = [(d["region"], d["commit_ts"], d["seq"]) for d in lines]
    assert len(ids) == len(set(ids)) and any((d.get("after") or {}).get("n") == 424242 for d in lines)
