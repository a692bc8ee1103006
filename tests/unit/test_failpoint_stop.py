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
