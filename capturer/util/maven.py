"""Jars resolved once by Maven into a cache: ``mvn dependency:copy-dependencies`` of a pom (the pinned
versions as -D properties) into ``<cache>/lib``, under a file lock (several processes at once resolve
once: one resolves, the others wait and reuse), complete once ``lib/.complete`` holds the checksum of
the pom and the properties' values (an edited pom or another version resolves again). A second start
resolves nothing and needs no network. Used by the Spark sender (the Delta runtime, Spark's Kafka
source) and the devtools' private JVMs (Apache Kafka, Kafka Connect)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path


def stamp_of(pom: Path, props: dict[str, str]) -> str:
    """The checksum ``lib/.complete`` holds once the jars of ``pom`` with ``props`` are there."""
    return hashlib.sha256(pom.read_bytes() + "".join(props.values()).encode()).hexdigest()


def maven_lib(cache: Path, pom: Path, props: dict[str, str], need: Sequence[str], what: str, *,
              keep_only: bool = False, flags: Sequence[str] = (), hint: str = "", timeout: float = 900) -> Path:
    """``<cache>/lib`` holding the runtime dependencies of ``pom`` (``props`` passed as -D properties),
    copied there by Maven the first time; each name prefix of ``need`` must match a jar (else Maven's
    answer is an error), and with ``keep_only`` the other jars are removed. ``flags`` are more arguments
    for Maven (not part of the checksum), given ``timeout`` seconds. Raises RuntimeError naming ``what``
    when mvn is missing (with ``hint``: how to get it, or the jars; ``{lib}`` and ``{stamp}`` in it are
    filled in), fails or runs out of time."""
    lib = cache / "lib"
    want = stamp_of(pom, props)
    stamp = lib / ".complete"
    if stamp.exists() and stamp.read_text().strip() == want:
        return lib
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text().strip() == want:
            return lib
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError(f"{what} are resolved with Maven, and mvn is not on PATH"
                               + hint.format(lib=lib, stamp=want))
        tmp = Path(tempfile.mkdtemp(prefix="lib.", dir=cache))
        try:
            r = subprocess.run([mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                                *(f"-D{k}={v}" for k, v in props.items()), f"-DoutputDirectory={tmp}", *flags,
                                "-DincludeScope=runtime"], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"mvn did not resolve {what} within {timeout:g}s (is Maven Central reachable?)") from None
        got = list(tmp.iterdir()) if tmp.is_dir() else []
        if r.returncode != 0 or not all(any(f.name.startswith(n) for f in got) for n in need):
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"mvn could not resolve {what}:\n{(r.stdout + r.stderr)[-3000:]}")
        if keep_only:
            for f in got:
                if not f.name.startswith(tuple(need)):
                    f.unlink()
        shutil.rmtree(lib, ignore_errors=True)
        tmp.rename(lib)
        stamp.write_text(want + "\n")
    return lib
