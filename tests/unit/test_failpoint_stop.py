"""The ``stop`` failpoint action (capturer/util/failpoints.py): the process freezes itself (SIGSTOP) at the
point, and goes on from there when continued."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_stop_freezes_the_process_at_the_point_until_sigcont() -> None:
    code = ("from capturer.util import failpoints\n"
            "for i in range(3):\n"
            "    print('before', i, flush=True)\n"
            "    failpoints.hit('x.y')\n"
            "print('done', flush=True)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CAPTURER_FAILPOINTS="x.y=stop@2")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        state = ""
        deadline = time.monotonic() + 30
        while state != "T" and time.monotonic() < deadline:
            stat = Path(f"/proc/{p.pid}/stat").read_text()
            state = stat[stat.rindex(")") + 2]
            time.sleep(0.02)
        assert state == "T", state
        time.sleep(0.3)
        assert p.poll() is None  # still frozen
        os.kill(p.pid, signal.SIGCONT)
        out, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0
    assert out.split("\n")[:4] == ["before 0", "before 1", "before 2", "done"], out


def test_stop_freezes_a_thread_that_is_not_the_main_one_at_the_point() -> None:
    """The point is in a thread of its own (as a sender's), the main thread waits: the thread stops at the
    call, not a moment later. (``os.kill(os.getpid(), SIGSTOP)`` gives the signal to the main thread; the
    calling thread ran on until the stop reached it, here in about half the hits: a ``kafka.commit=stop``
    committed the transaction it was to freeze before, issue 45.)"""
    code = ("import os, sys, threading\n"
            "from capturer.util import failpoints\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n"
            "def run():\n"
            "    for i in range(20):\n"
            "        os.write(fd, b'before %d\\n' % i)\n"
            "        failpoints.hit('x.y')\n"
            "        os.write(fd, b'after %d\\n' % i)\n"
            "t = threading.Thread(target=run)\n"
            "t.start()\n"
            "t.join()\n")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"failpoint-stop-{os.getpid()}.txt"
    out.write_text("")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CAPTURER_FAILPOINTS="x.y=stop@*")
    p = subprocess.Popen([sys.executable, "-c", code, str(out)], env=env, cwd=ROOT)
    ran_on = []
    try:
        for i in range(20):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                stat = Path(f"/proc/{p.pid}/stat").read_text()
                if stat[stat.rindex(")") + 2] == "T" and f"before {i}\n" in out.read_text():
                    break
                time.sleep(0.005)
            else:  # (a thread that ran on may hit the point again while the first stop is pending: one stop)
                ran_on.append(f"{i} (no stop after it)")
                break
            time.sleep(0.02)  # (a thread that ran on has written its line by now)
            if not out.read_text().endswith(f"before {i}\n"):
                ran_on.append(str(i))
            os.kill(p.pid, signal.SIGCONT)
        else:
            assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        out.unlink()
    assert not ran_on, f"the thread ran on past the stop at hits {ran_on}"
