"""Two MariaDB regions -> the Spark lake (writer=arrow) under a steady load, the
capturer killed again and again: every table's changelog holds each change
identity once, and the merged view equals the sources.

The runs, one after the other on the same lake and checkpoint, the load going on:

1. the sender in the capturer's process; kill -9 of the capturer mid-load;
2. process=true, the sender's child killing itself right after every 3rd commit
   (failpoint ``spark.committed``: committed, not published, no answer; the
   capturer retries the batch in a new child), then kill -9 of the capturer
   (its child dies with it);
3. in-process, the capturer killing itself right after a commit (the same
   failpoint: the batch committed but its files still staged);
4. a clean run that catches up; then the checks (pyarrow for the changelogs, as
   an outside checker counts; Spark for the merged view).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, checkpoint_covers, wait_for, write_config
from workload import SCHEMA, TABLES, Workload

from capturer.util import failpoints
from senders.spark import commits

pytestmark = pytest.mark.integration
pytest.importorskip("pyspark")


def senders_cfg(wh: Path, **extra: object) -> str:
    opts: dict[str, object] = {"master": "local[1]", "warehouse": wh, "writer": "arrow", "batch_interval": 0.2,
                               "compaction_interval": 0}
    opts.update(extra)
    return "[global]\ntype=spark\n[spark]\n" + "".join(f"{k}={v}\n" for k, v in opts.items())


def last_batch(wh: Path) -> int:
    c = commits.CommitLog(wh).last()  # (a reader: never cuts anything)
    return 0 if c is None else c.batch


def changelog_duplicates(wh: Path) -> dict[str, tuple[int, int]]:
    """Per lake table: (changelog rows, identities seen more than once), read with
    pyarrow from every Parquet file under ``changelog/``."""
    import pyarrow.parquet as pq

    out = {}
    for cl in sorted(wh.glob("*/changelog")):
        seen: set[tuple[Any, ...]] = set()
        rows = dups = 0
        for f in sorted(cl.rglob("*.parquet")):
            for r in pq.read_table(f, columns=["_region", "_commit_ts", "_seq", "_sub"]).to_pylist():
                k = (r["_region"], r["_commit_ts"], r["_seq"], r["_sub"])
                rows += 1
                dups += k in seen
                seen.add(k)
        out[cl.parent.name] = (rows, dups)
    return out


def test_kill9_again_and_again_under_load_leaves_each_identity_once(
        tmp_path: Path, two_servers: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for m in two_servers:
        m.execute(*SCHEMA)
    wh = tmp_path / "wh"
    cfg = write_config(tmp_path, two_servers, senders=senders_cfg(wh))
    log = tmp_path / "capturer.log"
    loads = [Workload(m, i + 1, 90 + i) for i, m in enumerate(two_servers)]
    threads = [w.thread(10**7) for w in loads]  # until stopped
    t0 = time.monotonic()

    def run_until(more_batches: int, what: str) -> CapturerProcess:
        before = last_batch(wh)
        proc = CapturerProcess(cfg, log).start()
        wait_for(lambda: last_batch(wh) >= before + more_batches, 120, what)
        return proc

    # 1. in-process: kill -9 mid-load
    proc = run_until(8, "run 1: batches committed")
    time.sleep(0.37)
    proc.kill9()
    # 2. process=true: the child dies after every 3rd commit, then kill -9 of the capturer
    (tmp_path / "senderConfig.cfg").write_text(senders_cfg(wh, process="true"))
    monkeypatch.setenv(failpoints.ENV, "spark.committed=kill@3")
    proc = run_until(10, "run 2: batches committed by children that die")
    restarts = log.read_text(errors="replace").count("the sender's process exited")
    proc.kill9()
    # 3. in-process: the capturer kills itself right after its 4th commit
    (tmp_path / "senderConfig.cfg").write_text(senders_cfg(wh))
    monkeypatch.setenv(failpoints.ENV, "spark.committed=kill@4")
    before = last_batch(wh)
    proc = CapturerProcess(cfg, log).start()
    assert proc.proc is not None
    assert proc.proc.wait(120) == -9
    assert last_batch(wh) == before + 4
    assert list(wh.glob(f"*/{commits.STAGING}/part-*")), "run 3 should leave its last commit's files staged"
    monkeypatch.delenv(failpoints.ENV)
    # 4. a clean run catches up
    proc = run_until(3, "run 4: batches committed")
    time.sleep(1)
    for w in loads:
        w.stop.set()
    for t in threads:
        t.join(60)
    assert not any(w.errors for w in loads), [w.errors for w in loads]
    wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 180, "catch-up after the kills")
    assert proc.stop() == 0
    print(f"load and 4 runs: {time.monotonic() - t0:.1f}s; {sum(w.txns for w in loads)} source transactions, "
          f"{last_batch(wh)} batches committed; sender processes restarted in run 2: {restarts}")
    assert restarts >= 2, "run 2's children should have died after their commits"

    # every changelog: each identity once; nothing staged; the commit log in order
    dups = changelog_duplicates(wh)
    print("changelog rows, duplicate identities:", dups)
    assert set(dups) == {f"app__{t}" for t in TABLES}
    assert all(d == 0 for _, d in dups.values()), dups
    assert not list(wh.glob(f"*/{commits.STAGING}/*"))
    lines = [commits.Commit.parse(x) for x in (wh / "_capturer" / "commits.jsonl").read_bytes().splitlines()]
    assert all(c is not None for c in lines)
    assert [c.batch for c in lines if c] == list(range(1, len(lines) + 1))
    keys = [c.key for c in lines if c]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)

    # the merged view equals the sources
    from senders.spark.lakecli import verify
    from senders.spark.sender import build_session

    spark = build_session({"master": "local[2]"}, tmp_path / "sparkhome")
    try:
        srcs = [{"host": "127.0.0.1", "port": m.port, "user": "root", "password": ""} for m in two_servers]
        for t in TABLES:
            r = verify(spark, wh, "cdc", "app", t, srcs)
            assert r["equal"], r
    finally:
        spark.stop()
