"""capturer.util.memory.gc_paused: no automatic collection inside the block, collection as it was
after it; nested and concurrent blocks share one pause; a collector switched off before stays off."""

from __future__ import annotations

import gc
import threading

from capturer.util.memory import gc_paused


def _restore(was: bool) -> None:
    (gc.enable if was else gc.disable)()


def test_paused_inside_resumed_after_even_on_an_error() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled()
        try:
            with gc_paused():
                raise KeyError("x")
        except KeyError:
            pass
        assert gc.isenabled()
    finally:
        _restore(was)


def test_nested_and_concurrent_blocks_share_one_pause() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        inside, leave = threading.Event(), threading.Event()

        def other() -> None:
            with gc_paused():
                inside.set()
                leave.wait(30)

        t = threading.Thread(target=other)
        with gc_paused():
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
            t.start()
            assert inside.wait(30)
        assert not gc.isenabled()  # the other block is still in
        leave.set()
        t.join(30)
        assert gc.isenabled()
    finally:
        _restore(was)


def test_a_collector_switched_off_before_stays_off() -> None:
    was = gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        _restore(was)


def test_a_pause_held_on_by_another_block_still_collects_the_young_when_far_past() -> None:
    """Blocks that overlap without end (read-ahead readers) must not defer collection for the whole
    copy: a leaver that leaves the pause on collects the young generation once it is far past its
    threshold; below that it does not."""
    from capturer.util import memory

    was, thresholds = gc.isenabled(), gc.get_threshold()
    young: list[int] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0:
            young.append(1)

    gc.enable()
    gc.set_threshold(100, 10, 10)
    gc.callbacks.append(on_gc)
    try:
        inside, leave = threading.Event(), threading.Event()

        def holder() -> None:
            with gc_paused():
                inside.set()
                leave.wait(30)

        t = threading.Thread(target=holder)
        t.start()
        assert inside.wait(30)
        keep: list[list[int]] = []
        gc.collect()
        young.clear()
        with gc_paused():
            keep.extend([i] for i in range(50))  # (under 8 x 100 young allocations)
        assert young == [] and not gc.isenabled()
        with gc_paused():
            keep.extend([i] for i in range(100 * memory.PAUSE_YOUNG_LIMIT + 100))
            assert young == []  # (paused inside)
        assert young and not gc.isenabled()  # collected on leaving; the holder's pause stays
        leave.set()
        t.join(30)
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(on_gc)
        gc.set_threshold(*thresholds)
        _restore(was)
