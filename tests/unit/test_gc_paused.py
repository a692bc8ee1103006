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
