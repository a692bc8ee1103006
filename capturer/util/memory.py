"""Where freed memory goes: glibc's malloc, tuned for a process that holds big,
short-lived buffers.

glibc serves a request of more than ``M_MMAP_THRESHOLD`` bytes (128 KiB at
start) with its own ``mmap``, given back to the system on ``free``. But it
raises that threshold to the size of every such block that is freed (up to 32
MiB on 64-bit), so after the first spill chunk, rendered block or big packet
has come and gone, blocks of that size come from the heap and its per-thread
arenas instead, where a freed block under a live one keeps its pages. The
capturer's threads (regions, senders) free such blocks all the time; measured
with a one-million-row transaction to the file sender (bench ``bigtxn``): peak
RSS 149 MB in-process and 192 MB in the capturer with its region in a worker
process, against 121 MB and 145 MB with the threshold fixed at its start value
(``mallopt`` of a value turns the raising off). The cost is an ``mmap`` and
``munmap`` per such block: tens of microseconds against the milliseconds of
work that fill a block that big.

Set ``CAPTURER_MALLOC=default`` to leave glibc as it is (and a threshold set
through glibc's own ``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES`` is kept).
Not glibc (musl, macOS): nothing is done.

And how often Python's cyclic garbage collector runs (``tune_gc``). Its
defaults (700, 10, 10) make a young collection every 700 net allocations of
container objects and a full one every 100 young ones, when the objects
promoted since the last full one exceed a quarter of the old ones. A capturer
holds hundreds of thousands of rows in its queues (containers that live for
seconds, so they are promoted, then freed by reference counting), which sets
off a full collection over everything it holds every few seconds: measured
with all four senders in one process (405k changes), 18-19 full collections
took 2.2-2.6 s and the others 1.0-1.5 s of a 13.7 s run. With (10,000, 50,
20): no full collection, 4 middle ones (0.2-0.3 s) and young ones of about
4 ms each (0.8 s in all), the run 1.2 times faster; (50,000, 20, 10) was as
fast with young pauses of 20-30 ms. Reference counting frees the rows either
way; only garbage in cycles (rare here) waits longer. ``CAPTURER_GC=default``
keeps Python's values.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
from collections.abc import Iterator

M_MMAP_THRESHOLD = -3  # from glibc's malloc.h
THRESHOLD = 128 * 1024


def tune_malloc(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold``; True when it was set."""
    if os.environ.get("CAPTURER_MALLOC", "").strip().lower() == "default":
        return False
    # the operator chose one (glibc's variable or tunable)
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        # glibc only: musl's mallopt is a stub that returns 0
        libc.gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError, TypeError):  # TypeError: CDLL(None) where there is no such thing
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))


GC_THRESHOLDS = (10_000, 50, 20)


def tune_gc(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> bool:
    """Collect cyclic garbage less often (see the module's text); True when set."""
    if os.environ.get("CAPTURER_GC", "").strip().lower() == "default":
        return False
    gc.set_threshold(*thresholds)
    return True


def tune() -> None:
    """Both settings, as every process of the capturer starts."""
    tune_malloc()
    tune_gc()


PAUSE_YOUNG_LIMIT = 8  # (young collections' worth of allocations a pause may defer while another block holds it)
_pause_lock = threading.Lock()
_pause_depth = 0
_pause_owned = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic cyclic collection while the block runs (in any thread: the switch is the
    process's), for a block that makes many short-lived containers at once and frees them
    before it ends: a snapshot chunk's rows as the driver gives them (20,000 tuples, then a
    dict each). A young collection that ran inside it would walk every one of those tuples
    (each of its values' headers: cache misses) only to find them still referenced; paused,
    they are freed by reference counting before any collection sees them. Collection resumes
    at the block's end (the next allocation of a container then collects what accumulated,
    if the count calls for it). Nested and concurrent blocks (read-ahead readers) share one
    pause: the last to leave resumes it, and only if it was on when the first came in (one
    switched off by someone else stays off); one that leaves the pause on to another block collects
    the young generation itself once allocations are ``PAUSE_YOUNG_LIMIT`` thresholds past it."""
    global _pause_depth, _pause_owned
    with _pause_lock:
        if _pause_depth == 0:
            _pause_owned = gc.isenabled()
            if _pause_owned:
                gc.disable()
        _pause_depth += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pause_depth -= 1
            if _pause_depth == 0 and _pause_owned:
                _pause_owned = False
                gc.enable()
                collect = False
            else:
                # readers whose blocks overlap without end (read-ahead) would keep the pause on for the
                # whole copy: a leaver that leaves it on collects the young generation itself once it is
                # far past its threshold, so that what the pause defers stays bounded
                young = gc.get_threshold()[0]  # (0: no automatic collection at all)
                collect = _pause_owned and young > 0 and gc.get_count()[0] > PAUSE_YOUNG_LIMIT * young
        if collect:
            gc.collect(0)
