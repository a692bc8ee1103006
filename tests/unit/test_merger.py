"""The k-way merge: sorted and complete for any interleaving, idle regions included."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capturer.model import Heartbeat, Position, Txn
from capturer.pipeline.merger import Merger, OrderError

POS = Position("f", 4)


def region_stream(draw: st.DrawFn, name: str) -> list[Txn | Heartbeat]:
    """Strictly increasing txn ts, heartbeats sprinkled in (promising > their ts),
    always ending with a heartbeat far ahead (the region stays alive)."""
    n = draw(st.integers(0, 25))
    ts = sorted(set(draw(st.lists(st.integers(1, 10_000), min_size=n, max_size=n))))
    items: list[Txn | Heartbeat] = []
    last = 0
    for t in ts:
        if draw(st.booleans()) and t - 1 > last:
            hb = draw(st.integers(last, t - 1))
            items.append(Heartbeat(name, hb))
            last = hb
        items.append(Txn(name, t, POS))
        last = t
    items.append(Heartbeat(name, 1_000_000))
    return items


@st.composite
def scenario(draw: st.DrawFn) -> tuple[dict[str, list[Txn | Heartbeat]], list[str]]:
    k = draw(st.integers(1, 5))
    names = [f"r{i}" for i in range(k)]
    streams = {r: region_stream(draw, r) for r in names}
    # an arbitrary arrival order of the regions' items (each region's own order kept)
    order: list[str] = []
    left = {r: len(s) for r, s in streams.items()}
    while any(left.values()):
        r = draw(st.sampled_from([r for r, n in left.items() if n]))
        order.append(r)
        left[r] -= 1
    return streams, order


@given(scenario())
@settings(max_examples=300, deadline=None)
def test_merge_sorted_and_complete(sc: tuple[dict[str, list[Txn | Heartbeat]], list[str]]) -> None:
    streams, order = sc
    m = Merger(streams)
    cursors = dict.fromkeys(streams, 0)
    waiting: dict[str, list[Txn | Heartbeat]] = {r: [] for r in streams}
    out: list[Txn | Heartbeat] = []
    for r in order:
        waiting[r].append(streams[r][cursors[r]])
        cursors[r] += 1
        # feed whatever the merger needs and has arrived, then drain
        progress = True
        while progress:
            progress = False
            for need in m.needs():
                if waiting[need]:
                    m.offer(waiting[need].pop(0))
                    progress = True
            while (item := m.pop()) is not None:
                out.append(item)
                progress = True
    txns = [i for i in out if isinstance(i, Txn)]
    keys = [(t.commit_ts, t.region) for t in txns]
    assert keys == sorted(keys), "merged output not in (commit_ts, region) order"
    want = sorted((t.commit_ts, t.region) for s in streams.values() for t in s if isinstance(t, Txn))
    assert keys == want, "merged output is missing or duplicating transactions"
    # nothing was emitted that a heartbeat still to come could undercut
    for i, item in enumerate(out):
        assert all(later.commit_ts >= item.commit_ts for later in out[i + 1:] if isinstance(later, Txn))


def test_idle_region_blocks_until_heartbeat() -> None:
    m = Merger(["a", "b"])
    m.offer(Txn("a", 10, POS))
    assert m.pop() is None  # b has said nothing: 10 cannot be released yet
    m.offer(Heartbeat("b", 5))
    assert isinstance(m.pop(), Heartbeat)  # b's promise (5) is the smallest head
    assert m.pop() is None
    m.offer(Heartbeat("b", 20))
    item = m.pop()
    assert isinstance(item, Txn) and item.commit_ts == 10


def test_region_going_backwards_is_an_error() -> None:
    m = Merger(["a"])
    m.offer(Txn("a", 10, POS))
    m.pop()
    with pytest.raises(OrderError):
        m.offer(Txn("a", 10, POS))


def test_tie_between_regions_orders_by_region_name() -> None:
    m = Merger(["b", "a"])
    m.offer(Txn("b", 7, POS))
    m.offer(Txn("a", 7, POS))
    first = m.pop()
    assert first is not None and first.region == "a"


def test_ddl_preludes_share_the_commit_ts_of_the_transaction_they_precede() -> None:
    from capturer.model import Ddl

    m = Merger(["a", "b"])
    pre = [Txn("a", 7, POS, (), Ddl("d", f"ALTER TABLE t ADD c{i} INT", "t", "d", i - 2)) for i in range(2)]
    m.offer(pre[0])
    m.offer(Txn("b", 7, POS))
    out = [m.pop()]
    m.offer(pre[1])
    out.append(m.pop())
    m.offer(Txn("a", 7, POS))  # the data transaction, after its two preludes
    out.append(m.pop())
    m.offer(Heartbeat("a", 9))
    out.append(m.pop())  # b's transaction at 7 comes after all of a's items at 7
    assert [(x.region, x.commit_ts, x.ddl.seq if x.ddl else None) for x in out] == [
        ("a", 7, -2), ("a", 7, -1), ("a", 7, None), ("b", 7, None)]
    with pytest.raises(OrderError):  # only a prelude opens the same commit_ts to the next transaction
        m2 = Merger(["a"])
        m2.offer(Txn("a", 7, POS, (), Ddl("d", "CREATE TABLE x (i INT)")))
        m2.pop()
        m2.offer(Txn("a", 7, POS))
