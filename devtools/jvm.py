"""What devtools/local_kafka.py (the broker) and devtools/local_connect.py (Kafka Connect) share: the java
binary, jars resolved once from Maven Central into a cache by a pom (never built; capturer/util/maven.py),
and one JVM process started with its output in a log file, read back, stopped and killed."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from capturer.util.maven import maven_lib


def java() -> str:
    """The java binary ($JAVA_HOME/bin/java, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    j = shutil.which("java")
    if j is None:
        raise RuntimeError("Apache Kafka and Kafka Connect need a Java runtime (17+), and java is not on PATH "
                           "(apt-get install openjdk-17-jre-headless)")
    return j


def resolve_jars(cache: Path, pom: Path, props: dict[str, str], marker: str, what: str, hint: str = "") -> str:
    """The classpath ``<cache>/lib/*``, the pom's runtime dependencies copied there by Maven the first time
    (``capturer.util.maven``: a file lock, a checksum stamp of the pom and ``props``' values).

    ``props`` are passed as -D properties (the pinned versions); ``marker`` is a jar file name that must be
    among them. Raises RuntimeError naming ``what`` (mvn missing, or Maven's error)."""
    return f"{maven_lib(cache, pom, props, (marker,), what, hint=hint)}/*"


def launch(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` (a JVM) with its stdout and stderr appended to ``log``, no stdin."""
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def tail(log: Path, n: int = 4000) -> str:
    """The last ``n`` characters of ``log`` ('' when it is not there)."""
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def stop(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM and wait; SIGKILL after ``timeout`` seconds."""
    if proc is not None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL (as kill -9) and reap."""
    if proc is not None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
