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

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

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
    """The paths of the jars for ``spark.jars``, resolving them with Maven the first time
    (Maven given ``timeout`` seconds: the full demo gives it less, and falls back when it cannot).

    Safe to call from several processes at once (a file lock; one resolves, the others wait and reuse).
    The cache is complete once ``lib/.complete`` holds the pom's checksum, so an edited pom resolves again.
    Raises RuntimeError naming what is missing (mvn) or Maven's own error."""
    cache = cache_dir()
    lib = cache / "lib"
    want = hashlib.sha256(POM.read_bytes() + DELTA_VERSION.encode()).hexdigest()
    stamp = lib / ".complete"
    out = [str(lib / j) for j in JARS]
    if stamp.exists() and stamp.read_text().strip() == want:
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text().strip() == want:
            return out
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("the Delta Lake jars are resolved with Maven, and mvn is not on PATH "
                               "(apt-get install maven; or put the jars of io.delta:delta-spark_2.13:"
                               f"{DELTA_VERSION} and delta-storage into {lib} yourself, with a .complete "
                               f"file holding {want})")
        tmp = Path(tempfile.mkdtemp(prefix="lib.", dir=cache))
        try:
            r = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
                                f"-Ddelta.version={DELTA_VERSION}", f"-DoutputDirectory={tmp}",
                                "-DincludeGroupIds=io.delta", "-DincludeScope=runtime"],
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"mvn did not resolve Delta Lake {DELTA_VERSION}'s jars within {timeout:g}s "
                               "(is Maven Central reachable?)") from None
        if r.returncode != 0 or not all((tmp / j).exists() for j in JARS):
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"mvn could not resolve Delta Lake {DELTA_VERSION}'s jars:\n"
                               f"{(r.stdout + r.stderr)[-3000:]}")
        for f in tmp.iterdir():  # only the two: the kernel jars the pom brings too are not loaded
            if f.name not in JARS:
                f.unlink()
        shutil.rmtree(lib, ignore_errors=True)
        tmp.rename(lib)
        stamp.write_text(want + "\n")
    return out


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
