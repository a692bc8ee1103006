"""The Delta Lake runtime of the Spark sender's ``table_format=delta``: the jars of
``io.delta:delta-spark_2.13`` (pinned: DELTA_VERSION, and ``delta-pom.xml`` beside this file) and
``delta-storage``, resolved by Maven once into ``~/.cache/binlog-capturer/delta-<version>/lib``
(``$CAPTURER_DELTA_CACHE`` overrides the parent), so a second start resolves nothing and needs no
network; then given to the Spark session as ``spark.jars`` with Delta's SQL extension and catalog.

Only delta-spark and delta-storage are put on Spark's class path: Spark (from pyspark) already has
the Scala library, Hadoop, Parquet and Jackson those jars were built against, and the Delta kernel
jars the pom also brings are not used by the Spark connector's writes (copying them would put a
second, older Hadoop and Jackson beside Spark's).

Each Delta release is built against one Spark minor version: ``SPARK_MINOR`` says which this pin
needs. ``incompatible()`` says why the installed PySpark cannot run it ('' when it can), so the
sender fails at open with that sentence rather than with a NoSuchMethodError in the middle of a MERGE.
"""

from __future__ import annotations

import os
from pathlib import Path

from capturer.util.maven import maven_lib

DELTA_VERSION = "4.4.0"
# the Spark minor version DELTA_VERSION is built against (its pom's spark-sql_2.13 version): Delta
# 4.4.0 with Spark 4.3 fails its first read of a table (NoSuchMethodError: LogicalRDD.<init>)
SPARK_MINOR = "4.2"
POM = Path(__file__).resolve().parent / "delta-pom.xml"
# the jars the Spark session loads (names in the copied directory)
JARS = (f"delta-spark_2.13-{DELTA_VERSION}.jar", f"delta-storage-{DELTA_VERSION}.jar")
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def cache_dir() -> Path:
    """Where the jars of DELTA_VERSION live (created on first use)."""
    base = os.environ.get("CAPTURER_DELTA_CACHE") or str(Path.home() / ".cache" / "binlog-capturer")
    return Path(base) / f"delta-{DELTA_VERSION}"


def incompatible(pyspark_version: str | None = None) -> str:
    """Why the installed PySpark cannot run Delta DELTA_VERSION ('' when it can)."""
    if pyspark_version is None:
        try:
            import pyspark

            pyspark_version = str(pyspark.__version__)
        except ImportError:
            return "table_format=delta needs pyspark (pip install -e '.[delta]')"
    minor = ".".join(pyspark_version.split(".")[:2])
    if minor == SPARK_MINOR:
        return ""
    return (f"table_format=delta: Delta Lake {DELTA_VERSION} (the newest release on Maven Central) runs on "
            f"Spark {SPARK_MINOR}.x, and PySpark {pyspark_version} is installed (no Delta release supports it "
            f"yet); install the delta extra, which pins PySpark {SPARK_MINOR}: "
            f".venv/bin/pip install -e '.[delta]'")


def jars(timeout: float = 900) -> list[str]:
    """The paths of the jars for ``spark.jars``, resolving them with Maven the first time, given
    ``timeout`` seconds (the full demo gives it less, and falls back when it cannot)
    (``capturer.util.maven``: a file lock, a checksum stamp; an edited pom resolves again). Only the
    two are kept: the kernel jars the pom brings too are not loaded. Raises RuntimeError naming what
    is missing (mvn) or Maven's own error."""
    lib = maven_lib(cache_dir(), POM, {"delta.version": DELTA_VERSION}, JARS, f"Delta Lake {DELTA_VERSION}'s jars",
                    keep_only=True, flags=("-DincludeGroupIds=io.delta",),
                    hint=" (apt-get install maven; or put the jars of io.delta:delta-spark_2.13:"
                         f"{DELTA_VERSION} and delta-storage into {{lib}} yourself, with a .complete "
                         "file holding {stamp})", timeout=timeout)
    return [str(lib / j) for j in JARS]


def session_conf() -> dict[str, str]:
    """The Spark settings that load Delta: its jars, SQL extension and catalog."""
    return {"spark.jars": ",".join(jars()), "spark.sql.extensions": EXTENSION,
            "spark.sql.catalog.spark_catalog": CATALOG}


def main() -> int:
    """``python -m senders.spark.deltajars``: resolve the jars now (bootstrap.sh, an image build)."""
    for j in jars():
        print(j)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
