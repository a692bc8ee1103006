"""Spark's Kafka source (``org.apache.spark:spark-sql-kafka-0-10_2.13``) for the streaming applier
(``python -m capturer spark-apply``, capturer/apply/spark_stream.py): resolved by Maven once, as the
Delta jars are (``deltajars``), into ``~/.cache/binlog-capturer/spark-kafka-<version>/lib``
(``$CAPTURER_DELTA_CACHE`` overrides the parent); a second start resolves nothing and needs no network.

The version is the Spark minor the Delta pin runs on (``deltajars.SPARK_MINOR``, as ``SPARK_VERSION``).
Only the connector, its token provider, ``kafka-clients`` and ``commons-pool2`` are put on Spark's class
path: the rest the pom brings (Scala, Hadoop, lz4, snappy, slf4j) pyspark has already.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capturer.errors import SinkError
from capturer.util.maven import maven_lib
from senders.spark import deltajars
from senders.spark.deltasink import build_delta_session

SPARK_VERSION = f"{deltajars.SPARK_MINOR}.0"
POM = Path(__file__).resolve().parent / "kafka-pom.xml"
# the artifacts kept (name prefixes of the copied jars)
KEEP = ("spark-sql-kafka-0-10_2.13-", "spark-token-provider-kafka-0-10_2.13-", "kafka-clients-", "commons-pool2-")


def cache_dir() -> Path:
    return deltajars.cache_dir().parent / f"spark-kafka-{SPARK_VERSION}"


def jars() -> list[str]:
    """The paths of the jars for ``spark.jars``, resolving them with Maven the first time
    (``capturer.util.maven``: a file lock, a checksum stamp; several processes at once resolve once).
    Raises RuntimeError naming what is missing or Maven's error."""
    lib = maven_lib(cache_dir(), POM, {"spark.version": SPARK_VERSION}, KEEP, f"spark-sql-kafka {SPARK_VERSION}'s jars",
                    keep_only=True,
                    hint=" (apt-get install maven; or put the jars of org.apache.spark:spark-sql-kafka-0-10_2.13:"
                         f"{SPARK_VERSION} and its kafka-clients and commons-pool2 into {{lib}}, with a .complete "
                         "file holding {stamp})")
    return sorted(str(p) for p in lib.glob("*.jar"))


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
