"""``--check [--connect]`` of the webhook sender: the TLS files it names can be read,
and the receiver answers (its ``position_url`` with a position, else any HTTP answer
at ``url``: a HEAD request, which sends no batch)."""

from __future__ import annotations

from pathlib import Path

from capturer.errors import SinkError
from capturer.util.probe import Outcome, Probe, SenderCheck, unreadable
from senders.webhook.sender import WebhookSender, shown


def offline(c: SenderCheck) -> list[str]:
    out = []
    for key in ("tls_ca", "tls_cert", "tls_key"):
        value = c.options.get(key)
        if value:
            why = unreadable(Path(str(value)).expanduser())
            if why:
                out.append(f"{c.at(key)} = {value}: {why}")
    return out


def probe(c: SenderCheck) -> Probe:
    def ask(sender: WebhookSender, out: Outcome) -> None:
        if sender.position_url:
            key = sender.resume_key()
            out.detail = f"{shown(sender.position_url)}: position {list(key) if key else 'none yet'}"
        else:
            sender.open()
            assert sender._session is not None
            got = sender._session.head(sender.url, timeout=sender.timeout, allow_redirects=False)
            out.detail = f"{shown(sender.url)} answered {got.status_code}"

    def run(out: Outcome) -> None:
        opts = {**c.options, "timeout": min(float(c.options["timeout"]), max(0.5, c.timeout - 1))}
        sender = WebhookSender(c.name, {k: v for k, v in opts.items() if k != "process"}, c.queue_rows)
        try:
            ask(sender, out)
        except SinkError:
            raise  # (its message shows no secret)
        except Exception as exc:  # the client's own messages repeat the URL's path and query: a token there
            raise RuntimeError(sender._scrub(f"{type(exc).__name__}: {exc}")) from None
        finally:
            sender.close()

    return Probe(f"sender {c.name} ({shown(str(c.options['url']))})", run,
                 f"check url, position_url and the TLS settings in {c.section}")
