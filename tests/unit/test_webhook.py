"""The webhook sender (senders/webhook/) against a real HTTP server in this process
(http.server on a private port: the receiver is the user's side, so a small real one
is the test's; nothing is mocked): what it posts, which answers it retries, which
stop it, the position it resumes after, and the config and --check errors."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from capturer import config
from capturer.errors import ConfigError, SinkError
from capturer.model import Position, RowChange, TableSchema, Txn, stream_key
from senders import CATALOG, known_senders, sender_class
from senders.webhook.sender import WebhookSender, batch_key, shown

S = TableSchema("app", "t", ("id", "v"), ("id",))


def txn(ts: int, n: int = 2) -> Txn:
    ch = tuple(RowChange(S, "insert", None, {"id": ts * 10 + i, "v": f"x'\"{ts}é"}) for i in range(n))
    return Txn("r1", ts, Position("bin.000001", ts * 100), ch)


class Receiver:
    """Stores every accepted batch with its headers; answers from ``script`` first
    (a list of (status, headers) for the next POSTs), then 200."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], list[dict[str, Any]]]] = []
        self.attempts: list[dict[str, str]] = []
        self.script: list[tuple[int, dict[str, str]]] = []
        self.position: Any = None
        self.position_body: bytes | None = None
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                recv.attempts.append(dict(self.headers))
                code, extra = recv.script.pop(0) if recv.script else (200, {})
                if code == 200:
                    recv.posts.append((dict(self.headers), [json.loads(x) for x in body.splitlines()]))
                    recv.position = json.loads(self.headers["X-Capturer-Position"])
                self.send_response(code)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"nope" if code != 200 else b"okay")

            def do_GET(self) -> None:
                body = recv.position_body if recv.position_body is not None else \
                    json.dumps({"position": recv.position}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_HEAD(self) -> None:
                self.send_response(405)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def sender(url: str, **opts: Any) -> WebhookSender:
    keys = {k.name: k.default for k in WebhookSender.KEYS}
    return WebhookSender("webhook", {**keys, "url": url + "/in", **opts})


def test_the_webhook_kind_is_reached_by_name_through_the_registry() -> None:
    assert "webhook" in known_senders() and sender_class("webhook") is WebhookSender


def test_a_batch_is_one_post_of_json_lines_with_its_key_and_position(receiver: Receiver) -> None:
    s = sender(receiver.url, auth_header="Bearer s3cret")
    s.open()
    batch = [txn(5), txn(6, 3)]
    s.send(batch)
    (headers, lines), = receiver.posts
    assert [(d["commit_ts"], d["seq"], d["txn_rows"], d["last"]) for d in lines] == \
        [(5, 0, 2, False), (5, 1, 2, True), (6, 0, 3, False), (6, 1, 3, False), (6, 2, 3, True)]
    assert lines[0]["after"] == {"id": 50, "v": "x'\"5é"} and lines[0]["op"] == "insert"
    assert headers["Content-Type"] == "application/x-ndjson" and headers["Authorization"] == "Bearer s3cret"
    assert json.loads(headers["X-Capturer-Position"]) == list(stream_key(batch[-1]))
    assert headers["X-Capturer-Rows"] == "5" and headers["X-Capturer-Txns"] == "2"
    assert headers["Idempotency-Key"] == batch_key("webhook", batch) != batch_key("webhook", batch[:1])
    s.close()


def test_busy_answers_are_retried_with_the_same_key_and_refusals_stop_it(receiver: Receiver) -> None:
    s = sender(receiver.url, max_backoff=2)
    s.open()
    receiver.script = [(503, {}), (429, {"Retry-After": "7"})]
    with pytest.raises(SinkError) as e1:
        s.send([txn(1)])
    assert e1.value.retriable and e1.value.poll is None and "503" in str(e1.value)
    with pytest.raises(SinkError) as e2:
        s.send([txn(1)])
    assert e2.value.retriable and e2.value.poll == 2  # Retry-After, capped by max_backoff
    s.send([txn(1)])
    assert len({a["Idempotency-Key"] for a in receiver.attempts}) == 1 and len(receiver.posts) == 1
    receiver.script = [(401, {})]
    with pytest.raises(SinkError) as e3:
        s.send([txn(2)])
    assert not e3.value.retriable and "401" in str(e3.value) and "auth_header" in str(e3.value)
    receiver.script = [(302, {"Location": "/elsewhere"})]
    with pytest.raises(SinkError) as e4:
        s.send([txn(3)])
    assert not e4.value.retriable and "redirects are not followed" in str(e4.value)
    s.close()


def test_no_answer_is_retried_and_names_the_url_without_its_password() -> None:
    s = sender("http://alice:pw1234@127.0.0.1:9", timeout=1)  # (port 9: nothing listens)
    with pytest.raises(SinkError) as e:
        s.send([txn(1)])
    assert e.value.retriable and "no answer" in str(e.value) and "pw1234" not in str(e.value)
    assert shown("https://u:p@h:8443/x?y") == "https://u:***@h:8443/x?y"


def test_it_resumes_after_the_position_the_receiver_stored(receiver: Receiver) -> None:
    s = sender(receiver.url, position_url=receiver.url + "/position")
    s.open()
    assert s.resume_key() is None
    s.send([txn(7)])
    assert s.resume_key() == (7, "r1", 0)
    receiver.position_body = b'{"position": "seven"}'
    with pytest.raises(SinkError) as e:
        s.resume_key()
    assert not e.value.retriable and "/position" in str(e.value) and "commit_ts, region, sub" in str(e.value)
    s.close()


def test_config_errors_name_the_file_line_and_key(tmp_path: Path) -> None:
    p = tmp_path / "senderConfig.cfg"
    p.write_text("[global]\ntype=webhook\n[webhook]\nurl=ftp://x/\n")
    with pytest.raises(ConfigError, match=r"senderConfig.cfg:4.*url.*http:// or https://"):
        config.load_sender_config(p, CATALOG)
    p.write_text("[global]\ntype=webhook\n[webhook]\nurl=http://x/\ntls_cert=/c.pem\n")
    with pytest.raises(ConfigError, match=r"tls_cert and tls_key go together"):
        config.load_sender_config(p, CATALOG)
    p.write_text("[global]\ntype=webhook\n[webhook]\nurl=http://x/\nauth_header=Bearer zz9top\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    assert "auth_header" in sc.secret and sc.options["batch_rows"] == 1000


def test_check_connect_asks_the_receiver(receiver: Receiver) -> None:
    from capturer.util.probe import Outcome, SenderCheck
    from senders.webhook import check

    keys = {k.name: k.default for k in WebhookSender.KEYS}
    c = SenderCheck("webhook", {**keys, "url": receiver.url + "/in", "tls_ca": "/nonexistent.pem"},
                    Path("senderConfig.cfg"), 1000)
    assert check.offline(c) == ["senderConfig.cfg: [webhook] tls_ca = /nonexistent.pem: cannot be read: "
                                "No such file or directory"]
    out = Outcome("x")
    check.probe(SenderCheck("webhook", {**keys, "url": receiver.url + "/in"}, Path("s.cfg"), 1000)).run(out)
    assert out.detail.endswith("answered 405") and not out.problems
    dead = SenderCheck("webhook", {**keys, "url": "http://127.0.0.1:9/in"}, Path("s.cfg"), 1000, timeout=2)
    with pytest.raises(Exception, match="Connection refused|Max retries"):
        check.probe(dead).run(Outcome("y"))
