"""capturer.util.memory: glibc's mmap threshold stays where it starts, so big
blocks freed by one thread go back to the system (each case in a child process:
the setting cannot be undone in the test process)."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys

import pytest

# after a freed 8 MiB block, is a 1 MiB block its own mapping (then freeing it
# gives its pages back) or carved from the heap? glibc's mallinfo2 counts mappings
PROBE = r"""
import ctypes, json, sys
from capturer.util.memory import tune_malloc

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
tuned = tune_malloc(*map(int, sys.argv[1:]))
p = libc.malloc(8 << 20)
libc.free(p)  # glibc's default would now serve blocks up to 8 MiB from the heap

def mapped(size):
    before = libc.mallinfo2().hblks
    q = libc.malloc(size)
    n = libc.mallinfo2().hblks - before
    libc.free(q)
    return n

print(json.dumps({"tuned": tuned, "256k": mapped(256 << 10), "1m": mapped(1 << 20)}))
"""


def _probe(*args: str, **env: str) -> dict[str, object]:
    e = {k: v for k, v in os.environ.items() if k not in ("CAPTURER_MALLOC", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env=e, capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "mallinfo2")
    except (OSError, TypeError):
        return False


glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not _has_mallinfo2(),
                           reason="mallopt and mallinfo2 (2.33) are glibc's")


@glibc
def test_big_blocks_stay_mappings_after_a_bigger_one_was_freed() -> None:
    assert _probe() == {"tuned": True, "256k": 1, "1m": 1}  # the start value: 128 KiB
    # the threshold itself, not just any setting that stops glibc moving it
    assert _probe(str(512 << 10)) == {"tuned": True, "256k": 0, "1m": 1}


@glibc
def test_glibc_default_when_asked() -> None:
    # the control: glibc's own behaviour raises the threshold (the block comes from the heap)
    assert _probe(CAPTURER_MALLOC="default") == {"tuned": False, "256k": 0, "1m": 0}
    # a threshold the operator set through glibc's variable or tunable is theirs
    assert _probe(MALLOC_MMAP_THRESHOLD_="4194304") == {"tuned": False, "256k": 0, "1m": 0}
    assert _probe(GLIBC_TUNABLES="glibc.malloc.mmap_threshold=4194304") == {"tuned": False, "256k": 0, "1m": 0}
