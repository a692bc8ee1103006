"""The Spark sender on a real standalone Spark cluster (a master and one or two workers
started from the pyspark package with spark-class, on 127.0.0.1): the changelog format,
and ``table_format=delta`` (its jars shipped to the executors by ``spark.jars``)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, checkpoint_covers, wait_for, write_config
from workload import SCHEMA, TABLES, Workload

from devtools.local_mariadb import free_port

pytestmark = pytest.mark.integration
pyspark = pytest.importorskip("pyspark")


class Cluster:
    def __init__(self, tmp: Path):
        self.home = str(Path(pyspark.__file__).parent)
        self.port, self.ui = free_port(), free_port()
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def _run(self, *args: str, log: str) -> None:
        env = dict(os.environ, SPARK_HOME=self.home, SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.tmp), SPARK_WORKER_DIR=str(self.tmp / "work"))
        with open(self.tmp / log, "wb") as out:
            self.procs.append(subprocess.Popen(["bash", f"{self.home}/bin/spark-class", *args], env=env,
                                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as r:
            return json.loads(r.read())

    def start(self, workers: int = 1, cores: int = 2) -> Cluster:
        self._run("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                  "--webui-port", str(self.ui), log="master.log")
        wait_for(lambda: self._alive(), 90, "spark master")
        for i in range(workers):
            self._run("org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
                      "--memory", "1g", "--webui-port", str(free_port()), "--work-dir", str(self.tmp / f"work{i}"),
                      self.url, log=f"worker{i}.log")
        wait_for(lambda: self._alive() and len(self.state().get("workers", [])) == workers, 90, "spark workers")
        return self

    def _alive(self) -> bool:
        try:
            self.state()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path).start()
    yield c
    c.stop()


@pytest.mark.slow  # (CI time: the Delta case below runs on a cluster in every run)
def test_spark_sender_on_a_standalone_cluster(tmp_path: Path, two_servers, cluster) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute(*SCHEMA)
    wh = tmp_path / "wh"
    senders = (f"[global]\ntype=spark\n[spark]\nmaster={cluster.url}\nwarehouse={wh}\nbatch_interval=0.5\n"
               "compaction_interval=5\napp_name=capturer-cluster-test\nconf.spark.executor.memory=512m\n"
               "conf.spark.cores.max=2\n")
    cfg = write_config(tmp_path, two_servers, senders=senders)
    proc = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    try:
        loads = [Workload(m, i + 1, 90 + i) for i, m in enumerate(two_servers)]
        for t in [w.thread(300) for w in loads]:
            t.join()
        wait_for(lambda: any(a["name"] == "capturer-cluster-test" for a in cluster.state().get("activeapps", [])),
                 120, "the capturer's application on the cluster")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 240, "the cluster to catch up")
        time.sleep(6)  # let a compaction run on the cluster too
    finally:
        assert proc.stop(120) == 0
    done = [a for a in cluster.state().get("completedapps", []) if a["name"] == "capturer-cluster-test"]
    assert done, "the application did not run on the cluster"
    # read the lake back (a separate local session) and compare with the sources
    from senders.spark.lakecli import verify
    from senders.spark.sender import build_session

    spark = build_session({"master": "local[1]"}, tmp_path / "verify")
    try:
        for table in ("users", "pairs", "log"):
            r = verify(spark, wh, "cdc", "app", table,
                       [{"host": "127.0.0.1", "port": m.port, "user": "root", "password": ""} for m in two_servers])
            assert r["equal"], r
    finally:
        spark.stop()


def test_delta_tables_on_a_standalone_cluster_with_two_workers(tmp_path: Path, two_servers) -> None:  # type: ignore[no-untyped-def]
    """``table_format=delta`` with ``master = spark://``: the MERGEs run as jobs on two workers (one
    core each, an executor on each), the Delta jars reach the executors through ``spark.jars``, and
    the tables, read by Spark SQL with the Delta runtime and by delta-rs, equal the sources."""
    pytest.importorskip("deltalake")
    import shutil

    from senders.spark import deltajars

    if deltajars.incompatible():
        pytest.skip(deltajars.incompatible())
    if shutil.which("mvn") is None and not (deltajars.cache_dir() / "lib" / ".complete").exists():
        pytest.skip("table_format=delta needs mvn or the cached Delta jars")
    from integration.test_spark_delta import assert_equal
    from senders.spark.deltasink import build_delta_session

    cluster = Cluster(tmp_path).start(workers=2, cores=1)
    try:
        for m in two_servers:
            m.execute(*SCHEMA)
        wh = tmp_path / "wh"
        senders = (f"[global]\ntype=spark\n[spark]\ntable_format=delta\nmaster={cluster.url}\nwarehouse={wh}\n"
                   "batch_interval=1\napp_name=capturer-delta-cluster\nconf.spark.executor.memory=512m\n"
                   "conf.spark.cores.max=2\nconf.spark.driver.memory=512m\nconf.spark.sql.shuffle.partitions=2\n")
        cfg = write_config(tmp_path, two_servers, senders=senders)
        proc = CapturerProcess(cfg, tmp_path / "capturer.log").start()
        used: set[str] = set()
        try:
            loads = [Workload(m, i + 1, 190 + i) for i, m in enumerate(two_servers)]
            threads = [w.thread(150) for w in loads]

            def busy() -> bool:  # the application holds a core on both workers
                st = cluster.state()
                used.update(w["id"] for w in st.get("workers", []) if w.get("coresused", 0) > 0)
                return len(used) == 2

            wait_for(busy, 180, "the capturer's application on both workers")
            for t in threads:
                t.join()
            assert not any(w.errors for w in loads), [w.errors for w in loads]
            wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 420, "Delta on the cluster to catch up")
        finally:
            assert proc.stop(180) == 0
        done = [a for a in cluster.state().get("completedapps", []) if a["name"] == "capturer-delta-cluster"]
        assert done, "the application did not run on the cluster"
    finally:
        cluster.stop()
    # read back in a local session of this process (and by delta-rs, in assert_equal)
    spark = build_delta_session({"master": "local[1]", "conf.*": {"spark.driver.memory": "512m"}},
                                tmp_path / "verify")
    try:
        for table in TABLES:
            assert_equal(spark, wh, two_servers, "app", table)
    finally:
        spark.stop()
