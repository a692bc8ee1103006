"""The lease keeper process (capturer/ha/keeper.py) against a real etcd.

A stand-in capturer (a child process: the keeper's parent must be another process than
pytest) wins the lease and starts the keeper; the guard reads the keeper's renewals from
the file they share. Checked:

* a capturer whose interpreter is kept busy (threads spinning in pure Python, and two
  CPU-busy processes beside it on this 2-core machine) keeps its lease for many lease
  lengths: the renewals come from the keeper, and the guard never lapses;
* a stopped capturer (SIGSTOP) gets no renewal: its leader key is gone within the lease
  and a second, so a standby can take over;
* a capturer killed with ``kill -9`` leaves no keeper behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_for

from capturer.ha.coord import Coordinator
from capturer.ha.keeper import _stopped
from devtools.local_etcd import EtcdCluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LEASE = 3

STAND_IN = textwrap.dedent("""
    import json, sys, threading, time
    from capturer.ha.coord import Coordinator
    from capturer.ha.keeper import LOST, LeaseKeeper
    from capturer.util.fencing import GUARD
    endpoints, busy = sys.argv[1], int(sys.argv[2])
    c = Coordinator((endpoints,), "k", %(lease)d)
    epoch, until = c.campaign({"id": "stand-in"})
    GUARD.arm(epoch, until - 0.6)
    k = LeaseKeeper((endpoints,), "k", %(lease)d, c.lease_id, epoch, 0.6, until - 0.6)
    GUARD.attach(k.shared, LOST)
    k.start()
    def spin():
        x = 0
        while True:
            for i in range(100000):
                x += i * i
    for _ in range(busy):
        threading.Thread(target=spin, daemon=True).start()
    print(json.dumps({"epoch": epoch, "keeper": k.proc.pid}), flush=True)
    low = 1e9
    while True:
        time.sleep(0.2)
        low = min(low, GUARD.remaining())
        print(json.dumps({"remaining": GUARD.remaining(), "low": low, "lost": GUARD.lost,
                          "renewals": k.shared.renewals()}), flush=True)
""") % {"lease": LEASE}


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    c = EtcdCluster(tmp_path / "etcd", 1).start()
    try:
        yield c
    finally:
        c.stop()


def stand_in(etcd: EtcdCluster, busy: int) -> tuple[subprocess.Popen[str], dict[str, int]]:
    p = subprocess.Popen([sys.executable, "-c", STAND_IN, etcd.endpoints, str(busy)], stdout=subprocess.PIPE,
                         text=True, cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout is not None
    first = json.loads(p.stdout.readline())
    return p, first


def last_line(p: subprocess.Popen[str]) -> dict[str, object]:
    assert p.stdout is not None
    return json.loads(p.stdout.readline())


def hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_a_busy_capturer_keeps_its_lease_and_a_stopped_one_loses_it(etcd: EtcdCluster) -> None:
    burners = hogs(2)
    p, first = stand_in(etcd, busy=3)
    try:
        t0 = time.monotonic()
        got: dict[str, object] = {}
        while time.monotonic() - t0 < 6 * LEASE:  # many lease lengths, under load
            got = last_line(p)
            assert not got["lost"], got
        assert float(got["low"]) > 0, got  # type: ignore[arg-type]  # the guard never lapsed
        assert int(got["renewals"]) >= 6 * LEASE / (LEASE / 4) * 0.5, got  # type: ignore[call-overload]
        c = Coordinator((etcd.endpoints,), "k", LEASE)
        assert (c.leader() or ({}, 0))[1] == first["epoch"]

        # stopped: no renewal; the leader key goes within the lease (+ a second), for a standby to take
        os.kill(p.pid, signal.SIGSTOP)
        wait_for(lambda: _stopped(p.pid), 5, "the stand-in to be stopped")
        stopped = time.monotonic()
        wait_for(lambda: c.leader() is None, LEASE + 3, "the stopped capturer's lease to run out")
        assert time.monotonic() - stopped <= LEASE + 1.5
        os.kill(p.pid, signal.SIGCONT)
        wait_for(lambda: bool(last_line(p)["lost"]), 10, "the guard to say the lease is lost")
    finally:
        for b in burners:
            b.kill()
        p.kill()
        p.wait()
    # kill -9 of the capturer: its keeper ends too
    keeper = first["keeper"]
    wait_for(lambda: not Path(f"/proc/{keeper}").exists() or _stopped(keeper) or
             "Z" in Path(f"/proc/{keeper}/stat").read_text().split(")")[-1][:3], 5, "the keeper to end")
