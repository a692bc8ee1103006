"""``--check [--connect]`` of the Spark sender: pyspark and pyarrow are installed, the
lake can be written, and Java is found when the sender will start a Spark session
(its own rule, ``SparkSender._session_at_open``, and its own way of finding Java)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from capturer.util.probe import Outcome, Probe, SenderCheck, not_writable
from senders.spark import sender as spark_sender
from senders.spark.sender import SparkSender


def _sender(c: SenderCheck) -> SparkSender:
    """The sender as it runs: built, not opened."""
    return SparkSender(c.name, {k: v for k, v in c.options.items() if k != "process"}, c.queue_rows)


def _java(sender: SparkSender) -> tuple[bool, bool]:
    """(the sender will start a session, a Java is found)."""
    return bool(sender._session_at_open() or float(sender.options["compaction_interval"])), \
        spark_sender._java_found()  # (looked up on use: tests stand in for it)


def offline(c: SenderCheck) -> list[str]:
    out = []
    missing = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        out.append(f"{c.at('type', 'global')}: the spark sender needs {' and '.join(missing)}: sh start.sh installs "
                   "them (or: .venv/bin/pip install -e '.[spark]')")
    why = not_writable(Path(c.options["warehouse"]))
    if why:
        out.append(f"{c.at('warehouse')} = {c.options['warehouse']}: the lake cannot be written: {why}")
    sender = _sender(c)
    needs, found = _java(sender)
    if needs and not found:
        reason = ("writer=spark" if c.options["writer"] == "spark" else "a persistent catalog"
                  if sender._session_at_open() else f"compaction_interval={c.options['compaction_interval']:g}")
        home = os.environ.get("JAVA_HOME")
        out.append(f"{c.at('compaction_interval')}: the spark sender will start a Spark session ({reason}) and needs "
                   "Java (17): " + (f"JAVA_HOME={home} has no bin/java" if home else "none on PATH and no JAVA_HOME")
                   + "; sh start.sh installs it (apt-get install openjdk-17-jre-headless), or set compaction_interval "
                   "= 0 (with writer = arrow and the in-memory catalog no session is started)")
    return out


def probe(c: SenderCheck) -> Probe:
    def run(out: Outcome) -> None:
        needs, found = _java(_sender(c))
        if needs and found:
            import pyspark  # a session will be started: the module must import, not only be there

            out.detail = f"pyspark {pyspark.__version__}, Java found"
        else:
            out.detail = "no Spark session needed at start (writer=arrow, compaction_interval=0)" if not needs else ""

    return Probe(f"sender {c.name} ({Path(c.options['warehouse'])})", run)
