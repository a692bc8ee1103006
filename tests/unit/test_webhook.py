"""The webhook sender (senders/webhook/) against a real HTTP server in this process
(http.server on a private port: the receiver is the user's side, so a small real one
is the test's; nothing is mocked): what it posts, which answers it retries, which
stop it, the position it resumes after, and the config and --check errors."""

from __future__ import annotations

import json
import socket
import threading
import time
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
        self.echo = False  # refusals answer with the request's path and Authorization header in the body
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
                answer = b"okay" if code == 200 else b"nope"
                if recv.echo and code != 200:
                    answer = f"nope: {self.path} {self.headers.get('Authorization')}".encode()
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

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
    receiver.script = [(503, {"Retry-After": "0"})]  # (no wait at all would be a tight loop: backs off as usual)
    with pytest.raises(SinkError) as e0:
        s.send([txn(1)])
    assert e0.value.retriable and e0.value.poll is None
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
    for body in (b'{"status": "ok"}', b"<html>login</html>", b"[1, 2]"):  # not the protocol's answer
        receiver.position_body = body
        with pytest.raises(SinkError) as e:
            s.resume_key()
        assert not e.value.retriable and "expected {\"position\"" in str(e.value), body
    receiver.position_body = b'{"position": null}'
    assert s.resume_key() is None
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
    dead = SenderCheck("webhook", {**keys, "url": "http://127.0.0.1:9/in?token=t0psecret"}, Path("s.cfg"), 1000,
                       timeout=2)
    with pytest.raises(Exception, match="Connection refused|Max retries") as e:
        check.probe(dead).run(Outcome("y"))
    assert "t0psecret" not in str(e.value) and "token=***" in str(e.value)


SECRET_Q, SECRET_PW, SECRET_BEARER = "q7Sekret-in-query", "pw7Sekret", "b7Sekret-bearer"


def test_no_token_in_the_url_or_the_header_is_ever_shown(receiver: Receiver, caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """A token in the URL's query, a password in it, the Authorization header: none is in an
    error (no answer, 400 echoing the header, a redirect to a URL with the token, TLS), in the
    status or in the HTTP client's own debug log."""
    secrets = (SECRET_Q, SECRET_PW, SECRET_BEARER, "YWxpY2U6cHc3U2VrcmV0")  # (the last: alice:pw as Basic)

    def clean(text: str) -> str:
        assert not any(x in text for x in secrets), text
        return text

    caplog.set_level("DEBUG")
    query = f"?token={SECRET_Q}"
    shapes = [(receiver.url.replace("http://", f"http://alice:{SECRET_PW}@"), "", "Basic YWxpY2U6cHc3U2VrcmV0",
               "http://alice:***@127.0.0.1:"),
              (receiver.url, f"Bearer {SECRET_BEARER}", f"Bearer {SECRET_BEARER}", "http://127.0.0.1:")]
    for base, auth, sent, where in shapes:
        s = sender(base, auth_header=auth)
        s = WebhookSender("webhook", {**s.options, "url": s.url + query})
        s.open()
        s.send([txn(1)])
        assert receiver.posts[-1][0]["Authorization"] == sent
        receiver.echo = True  # the refusals below repeat the request's header and path in their body
        for code, extra, retried in [(400, {}, False), (503, {}, True),
                                     (307, {"Location": f"/moved{query}&b=1"}, False)]:
            receiver.script = [(code, extra)]
            with pytest.raises(SinkError) as e:
                s.send([txn(2)])
            assert e.value.retriable is retried and str(code) in clean(str(e.value))
            assert f"sender webhook (POST {where}" in str(e.value) and "token=***" in str(e.value)
            s.last_error = str(e.value)
            clean(json.dumps(s.status()))
        assert "/moved?token=***&b=***" in s.last_error  # where the redirect points, without its token
        dead = WebhookSender("webhook", {**s.options, "url": f"{base.replace(str(receiver.server.server_address[1]), '9')}"
                                                             f"/in{query}", "timeout": 1})
        with pytest.raises(SinkError) as e:
            dead.send([txn(3)])
        assert e.value.retriable and "Connection refused" in clean(str(e.value)) and "token=***" in str(e.value)
        tls = WebhookSender("webhook", {**s.options, "url": s.url.replace("http://", "https://")})
        with pytest.raises(SinkError) as e:
            tls.send([txn(4)])
        assert not e.value.retriable and "TLS failed" in clean(str(e.value)) and "tls_ca" in str(e.value)
        for x in (s, dead, tls):
            x.close()
    clean(caplog.text)
    assert "token=***" in caplog.text  # (urllib3 logged the requests, scrubbed)
    assert shown("https://u:p@h:8443/x?y=1&z") == "https://u:***@h:8443/x?y=***&***"


def test_a_password_in_the_url_and_auth_header_together_are_refused(tmp_path: Path) -> None:
    """requests would send the URL's user:password as Basic and drop auth_header unsaid."""
    p = tmp_path / "senderConfig.cfg"
    p.write_text("[global]\ntype=webhook\n[webhook]\nurl=https://u:pw@h/in\nauth_header=Bearer x\n")
    with pytest.raises(ConfigError, match=r"url.*user:password.*auth_header.*one of them"):
        config.load_sender_config(p, CATALOG)


class Hanging:
    """Accepts connections and never answers (``trickle``: sends a byte of a status line
    now and then, never the whole answer: each read gets something, so a read timeout
    alone never fires)."""

    def __init__(self, trickle: bool, head: bytes = b""):
        self.head = head  # sent at once, before the trickle (e.g. a whole "200 OK" status line)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        self.trickle = trickle
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        line = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000
        i = 0
        if self.head:
            line = b"X-Slow: " + b"a" * 100_000
            try:
                c.sendall(self.head)
            except OSError:
                return
        while not self.stop.wait(0.2):
            if self.trickle:
                try:
                    c.send(line[i:i + 1])
                except OSError:
                    return
                i += 1

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("trickle,head", [(False, b""), (True, b""), (True, b"HTTP/1.1 200 OK\r\n")],
                         ids=["silent", "trickling", "200-then-trickling"])
def test_a_hung_receiver_is_cut_at_timeout_and_shown_as_waiting(trickle: bool, head: bytes) -> None:
    """200-then-trickling: a receiver that sent its status line, never the rest of its answer. Cut at the
    deadline, the answer read so far was taken for a whole ``200 OK`` (the client ends the headers at the
    connection's end) and the batch acknowledged though the receiver never finished answering."""
    hung = Hanging(trickle, head)
    s = sender(hung.url, timeout=1.5)
    got: list[BaseException] = []

    def post() -> None:
        try:
            s.send([txn(1)])
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=post, daemon=True)
    try:
        t.start()
        wait_for(lambda: (s.status()["waiting_seconds"] or 0) > 0, 30, "the status to show the request waiting")
        assert s.status()["waiting_for"].startswith(f"POST {hung.url}/in: posting 1 transaction(s)")
        t.join(60)  # (without the deadline a trickling receiver holds the request for as long as it trickles)
        assert not t.is_alive(), "the request outlived its timeout"
        (e,) = got
        assert isinstance(e, SinkError) and e.retriable and "no whole answer within timeout = 1.5 s" in str(e)
        assert s.status()["waiting_seconds"] is None and s.refused == 1
    finally:
        hung.close()
        s.close()


def wait_for(cond: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_stop_cuts_the_request_a_hung_receiver_holds() -> None:
    """The capturer's stop does not wait up to ``timeout`` for a hung receiver: the request in
    hand is cut (its batch not acknowledged) and the sender's thread ends."""
    hung = Hanging(trickle=False)
    s = sender(hung.url, timeout=600)
    s.queue.put((1, txn(1)), 2)
    s.start(0)
    try:
        wait_for(lambda: (s.status()["waiting_seconds"] or 0) > 0, 30, "the post to wait for the receiver")
        s.stop()
        s.join(20)
        assert not s._thread.is_alive(), "the sender waited for the hung receiver"
        assert s.acked_seq == 0 and s.state == "stopped" and s.error is None
    finally:
        hung.close()


def test_a_413_for_one_transaction_says_batch_rows_cannot_help(receiver: Receiver) -> None:
    s = sender(receiver.url)
    receiver.script = [(413, {}), (413, {})]
    with pytest.raises(SinkError) as e:
        s.send([txn(1, 3)])
    assert not e.value.retriable and "one transaction of 3 row(s)" in str(e.value) and "never split" in str(e.value)
    with pytest.raises(SinkError) as e:
        s.send([txn(2), txn(3)])
    assert "lower batch_rows in [webhook]" in str(e.value)
    s.close()


def test_a_tls_handshake_cut_by_the_receiver_is_retried_a_bad_certificate_is_not(receiver: Receiver) -> None:
    """A receiver (or its proxy) that closes the connection mid-handshake, as when it restarts
    or sheds load, is retried like no answer; TLS to a server that does not speak it stops."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def cut() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.shutdown(socket.SHUT_WR)  # (the client's hello unanswered: EOF)
            time.sleep(0.2)
            c.close()

    threading.Thread(target=cut, daemon=True).start()
    s = sender(f"https://127.0.0.1:{srv.getsockname()[1]}", timeout=5)
    try:
        with pytest.raises(SinkError) as e:
            s.send([txn(1)])
        assert e.value.retriable and "closed during the TLS handshake" in str(e.value), e.value
    finally:
        srv.close()
        s.close()
    plain = sender(receiver.url.replace("http://", "https://"))
    with pytest.raises(SinkError) as e:
        plain.send([txn(1)])
    assert not e.value.retriable and "TLS failed" in str(e.value) and "tls_ca" in str(e.value)
    plain.close()


def test_a_hung_receiver_shows_as_waiting_with_the_sender_in_its_own_process(tmp_path: Path) -> None:
    """process = true: the capturer's side shows the child's request waiting: first as the child's
    answer awaited, then, from the status the busy child sends once a second, the request itself (the
    URL with its token masked); the child's timeout comes back as a retry."""
    from senders.process import ProcessSender

    hung = Hanging(trickle=True)
    p = tmp_path / "senderConfig.cfg"
    p.write_text(f"[global]\ntype=webhook\n[webhook]\nurl={hung.url}/in?token=t0psecret\ntimeout=8\nprocess=true\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    ps = ProcessSender("webhook", sc.options)
    got: list[BaseException] = []

    def post() -> None:
        try:
            ps.send([txn(1)])
        except BaseException as exc:
            got.append(exc)

    try:
        ps.open()
        t = threading.Thread(target=post, daemon=True)
        t.start()
        wait_for(lambda: (ps.status()["waiting_seconds"] or 0) > 0.2, 30, "the status to show the child waiting")
        first = ps.status()["waiting_for"]
        assert first.startswith(("the answer of the sender's process", "POST ")), first
        host = hung.url.split("//", 1)[1]
        wait_for(lambda: (ps.status()["waiting_for"] or "").startswith("POST "), 30,
                 "the status to name the child's request")
        shown = ps.status()["waiting_for"]
        assert host in shown and "t0psecret" not in shown, shown
        t.join(60)
        assert not t.is_alive()
        (e,) = got
        assert isinstance(e, SinkError) and e.retriable and "no whole answer within timeout = 8 s" in str(e)
        assert "t0psecret" not in str(e) and "t0psecret" not in json.dumps(ps.status())
        assert ps.status()["waiting_seconds"] is None
    finally:
        ps.close()
        hung.close()
