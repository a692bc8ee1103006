"""The streaming applier on Spark (issue 47 item 5): ``python -m capturer spark-apply`` (a child
process: a Structured Streaming job with Spark's Kafka source, local Spark with the Delta runtime)
reads the topics a capturer writes to Apache Kafka (json, ``txn_topic``) from two MariaDB sources
under the hostile OLTP mix of tests/workload.py and a few cases of their own (a key change alone and
inside a transaction, a rollback, deletes, an ADD COLUMN), and MERGEs every micro-batch into the Delta
tables of its ``[spark] table_format = delta`` sender.

The driver is killed (kill -9) in the middle of the load and restarted on the same checkpoint: the
Delta tables equal the sources, read by Spark SQL with the Delta runtime and, independently, by
delta-rs; no change applied twice (the keyless tables' change identities each once; every table's
commits with strictly growing txnVersions and stream keys: test_apply_delta.check_equal).

Skipped where test_apply_delta.py is (PySpark not 4.2, no Java, no mvn nor cached jars, no deltalake)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import LIVE_PROCESSES, wait_for
from workload import Workload

from integration.test_apply_delta import (  # noqa: F401  (rig, spark_of: fixtures)
    _merges,
    _paced,
    check_equal,
    hostile,
    mark_and_wait,
    rig,
    spark_of,
    start_pipeline,
)

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


class StreamApplier:
    """``python -m capturer spark-apply --config CFG --checkpoint DIR`` as a child process."""

    def __init__(self, cfg: Path, checkpoint: Path, log: Path):
        self.cfg, self.checkpoint, self.log = cfg, checkpoint, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> StreamApplier:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "capturer", "spark-apply", "--config", str(self.cfg),
                                          "--checkpoint", str(self.checkpoint), "--trigger", "1"],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
                                         start_new_session=True)
        LIVE_PROCESSES.append(self.proc)
        return self

    def kill9(self) -> None:
        """The driver killed: the Python process and its Spark JVM (the whole process group)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_spark_apply_kill9_of_the_driver_equals_the_sources(rig: dict[str, Any],  # noqa: F811
                                                             spark_of: Callable[[], Any]) -> None:  # noqa: F811
    t0 = time.monotonic()
    _cap, cfg, port = start_pipeline(rig)
    tmp, sources = rig["tmp"], rig["sources"]
    log, ck = tmp / "spark-apply.log", tmp / "spark-apply-checkpoint"
    loads = [Workload(m, i + 1, 80 + i) for i, m in enumerate(sources)]
    threads = [_paced(w, 0.05) for w in loads]
    try:
        ap = StreamApplier(cfg, ck, log).start()
        rig["procs"].append(ap)
        wait_for(lambda: _merges(rig) >= 3, 600, "the streaming applier's first MERGEs")
        hostile(sources[0])
        time.sleep(2.0)
        ap.kill9()
        killed_at = _merges(rig)
        ap = StreamApplier(cfg, ck, log).start()
        rig["procs"].append(ap)
        try:
            wait_for(lambda: _merges(rig) > killed_at, 600, "the restarted streaming applier to MERGE")
        except AssertionError as exc:  # (seen once at load 10-14: say what the restarted driver did)
            raise AssertionError(f"{exc}; exit {ap.proc.poll() if ap.proc else None}; its log ends:\n"
                                 f"{log.read_text(errors='replace')[-4000:]}") from None
    finally:
        for w in loads:
            w.stop.set()
        for t in threads:
            t.join(60)
    assert not any(w.errors for w in loads), [w.errors for w in loads]
    mark_and_wait(rig, 1, 600, [])
    # the status port of the restarted driver: what it applied since its start
    st = requests.get(f"http://127.0.0.1:{port}/status", timeout=30).json()
    assert st["kind"] == "spark-apply" and st["state"] == "running", st
    assert st["applied"]["batches"] > 0 and st["applied"]["rows"] > 0 and st["errors"]["bad_messages"] == 0, st
    assert requests.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
    assert ap.stop() == 0, log.read_text()[-3000:]
    print(f"load, a kill -9 of the driver and a catch-up: {time.monotonic() - t0:.1f}s; "
          f"{sum(w.txns for w in loads)} source transactions")
    check_equal(rig, spark_of())
    assert (ck / "spark" / "commits").is_dir() and any((ck / "pending").iterdir())
