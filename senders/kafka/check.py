"""``--check [--connect]`` of the Kafka sender: its client library is installed, and
the bootstrap servers give a metadata answer to the client the sender is configured
with, with its security settings (a refused login or an unknown CA named)."""

from __future__ import annotations

import importlib.util
import logging

from capturer.util.kafkasec import Watch
from capturer.util.probe import Outcome, Probe, SenderCheck
from senders.kafka.client import confluent_brokers, kafka_python_brokers

log = logging.getLogger(__name__)


def offline(c: SenderCheck) -> list[str]:
    module = "confluent_kafka" if c.options["client"] == "confluent" else "kafka"
    if importlib.util.find_spec(module) is None:
        return [f"{c.at('client')} = {c.options['client']}: its library ({module}) is not installed: .venv/bin/pip "
                "install -e '.[" + ("confluent" if module == "confluent_kafka" else "kafka") + "]' (start.sh "
                "installs it)"]
    return []


def probe(c: SenderCheck) -> Probe:
    return Probe(f"sender {c.name} ({c.options['servers']})", lambda out: _target(c, out),
                 f"check servers in {c.section}")


def _target(c: SenderCheck, out: Outcome) -> None:
    """A metadata answer within the sender's own time limit (before the probe's)."""
    servers = c.options["servers"]
    wait = max(0.5, c.timeout - 2)  # (kafka-python takes a while past its own limit)
    watch = Watch()  # what the client said: a refused login, a certificate the CA did not sign
    try:
        if c.options["client"] == "confluent":
            brokers = confluent_brokers(servers, wait, dict(c.options), watch)
        else:
            brokers = kafka_python_brokers(servers, wait, dict(c.options), watch)
    except Exception as exc:  # each client's own error types
        explained = watch.explain(f"sender {c.name} ({servers})", dict(c.options), exc, c.section)
        if explained is not None:
            out.problems.append(explained)
            return
        why = str(exc) if str(exc).startswith(type(exc).__name__) else f"{type(exc).__name__}: {exc}"
        out.problems.append(f"sender {c.name} ({servers}): no metadata answer within {wait:g} s ({why}); check "
                            f"servers in {c.section}")
        return
    out.detail = f"{brokers} broker(s) answered ({c.options['client']})"
