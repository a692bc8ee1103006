"""Spark's Kafka source (``org.apache.spark:spark-sql-kafka-0-10_2.13``) for the streaming applier
(``python -m capturer spark-apply``, capturer/apply/spark_stream.py): resolved by Maven once, as the
Delta jars are (``deltajars``), into ``~/.cache/binlog-capturer/spark-kafka-<version>/lib``
(``$CAPTURER_DELTA_CACHE`` overrides the parent); a second start resolves nothing and needs no network.

The version is the Spark minor the Delta pin runs on (``deltajars.SPARK_MINOR``, as ``SPARK_VERSION``).
Only the connector, its token provider, ``kafka-clients`` and ``commons-pool2`` are put on Spark's class
path: the rest the pom brings (Scala, Hadoop, lz4, snappy, slf4j) pyspark has already.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from capturer.errors import SinkError
from senders.spark import deltajars
from senders.spark.deltasink import build_delta_session

SPARK_VERSION = f"{deltajars.SPARK_MINOR}.0"
POM = Path(__file__).resolve().parent / "kafka-pom.xml"
# the artifacts kept (name prefixes of the copied jars)
KEEP = ("spark-sql-kafka-0-10_2.13-", "spark-token-provider-kafka-0-10_2.13-", "kafka-clients-", "commons-pool2-")


def cache_dir() -> Path:
    return deltajars.cache_dir().parent / f"spark-kafka-{SPARK_VERSION}"


def jars() -> list[str]:
    """The paths of the jars for ``spark.jars``, resolving them with Maven the first time (a file lock:
    several processes at once resolve once). Raises RuntimeError naming what is missing or Maven's error."""
    cache = cache_dir()
    lib = cache / "lib"
    want = hashlib.sha256(POM.read_bytes() + SPARK_VERSION.encode()).hexdigest()
    stamp = lib / ".complete"

    def listed() -> list[str]:
        return sorted(str(p) for p in lib.glob("*.jar"))

    if stamp.exists() and stamp.read_text().strip() == want:
        return listed()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text().strip() == want:
            return listed()
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("Spark's Kafka source is resolved with Maven, and mvn is not on PATH (apt-get install "
                               f"maven; or put the jars of org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION} "
                               f"and its kafka-clients and commons-pool2 into {lib}, with a .complete file holding "
                               f"{want})")
        tmp = Path(tempfile.mkdtemp(prefix="lib.", dir=cache))
        r = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
                            f"-Dspark.version={SPARK_VERSION}", f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
                           capture_output=True, text=True, timeout=900)
        got = list(tmp.iterdir()) if tmp.is_dir() else []
        if r.returncode != 0 or not all(any(f.name.startswith(k) for f in got) for k in KEEP):
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"mvn could not resolve spark-sql-kafka {SPARK_VERSION}:\n{(r.stdout + r.stderr)[-3000:]}")
        for f in got:
            if not f.name.startswith(KEEP):
                f.unlink()
        shutil.rmtree(lib, ignore_errors=True)
        tmp.rename(lib)
        stamp.write_text(want + "\n")
    return listed()


def stream_session(options: dict[str, Any]) -> Any:
    """The Spark session of ``spark-apply``: the Delta runtime and Spark's Kafka source loaded (the
    sender's ``master``, ``warehouse`` and ``conf.*``). SinkError (not retriable) when Delta cannot run
    on the installed PySpark or the jars cannot be resolved."""
    why = deltajars.incompatible()
    if why:
        raise SinkError(why, retriable=False)
    try:
        paths = deltajars.jars() + jars()
    except RuntimeError as exc:
        raise SinkError(str(exc), retriable=False) from None
    opts = dict(options)
    opts["conf.*"] = {**(options.get("conf.*") or {}), "spark.jars": ",".join(paths)}
    return build_delta_session(opts, Path(options["warehouse"]).resolve())


def main() -> int:
    """``python -m senders.spark.kafkajars``: resolve the jars now (an image build)."""
    for j in jars():
        print(j)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
