"""Row-conflict detection (senders/mysql/causality.py) and the weighted bounded queue
(capturer/util/bqueue.py)."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from capturer.model import RowChange, TableSchema
from capturer.util.bqueue import Closed, WeightedQueue
from senders.mysql.causality import Causality, conflict_keys, stable_hash

U = TableSchema("d", "u", ("id", "email", "a", "b"), ("id",), (("email",), ("a", "b")))
KEYLESS = TableSchema("d", "log", ("msg",), ())


def ch(before: dict | None, after: dict | None, s: TableSchema = U) -> RowChange:  # type: ignore[type-arg]
    return RowChange(s, "update" if before and after else ("insert" if after else "delete"), before, after)


def test_keys_cover_primary_and_unique_keys_of_both_images() -> None:
    keys = conflict_keys(ch({"id": 1, "email": "x", "a": 1, "b": None}, {"id": 2, "email": "y", "a": 1, "b": 2}),
                         "d", "u")
    # before: pk 1, email x (the (a, b) key has a NULL: never collides); after: pk 2, email y, (1, 2)
    assert len(keys) == 5 and len(set(keys)) == 5


def test_collation_folding_and_types_keep_distinct_values_apart() -> None:
    def k(v: object) -> list[str]:
        return conflict_keys(ch(None, {"id": 1, "email": v, "a": None, "b": None}), "d", "u")

    assert k("Élan ") == k("elan")  # case, accents, trailing spaces: equal under MySQL's default collations
    assert k("1") != k(1) and k(b"a") != k("a") and k("a b") != k("ab")
    same_db_table = conflict_keys(ch(None, {"id": 1, "email": None, "a": None, "b": None}), "d", "u")
    other_table = conflict_keys(ch(None, {"id": 1, "email": None, "a": None, "b": None}), "d", "u2")
    assert same_db_table != other_table
    # a name with the separator in it cannot pose as another table's key
    assert conflict_keys(ch(None, {"id": 1, "email": None, "a": None, "b": None}), "d|", "u") != same_db_table


def test_keyless_tables_are_one_key() -> None:
    a = conflict_keys(ch(None, {"msg": "a"}, KEYLESS), "d", "log")
    b = conflict_keys(ch(None, {"msg": "b"}, KEYLESS), "d", "log")
    assert a == b and len(a) == 1


@pytest.mark.parametrize("impl", ["c", "py"])
def test_a_row_whose_unique_keys_are_null_is_named_by_the_table(impl: str) -> None:
    """A table without a primary key whose only unique key is nullable: two updates of one row, the first
    in a NULL key state throughout, the second giving it a key (UPDATE nu SET v='z' WHERE v='b'; UPDATE nu
    SET u=2 WHERE v='z'). They must conflict (one worker, in order): else the second ran first on the
    target, found no row and inserted one, and the first then left the old row there too (an extra row,
    seen through the applier)."""
    from senders.mysql.causality import conflict_keys_py

    keys_of = conflict_keys if impl == "c" else conflict_keys_py
    nu = TableSchema("d", "nu", ("u", "v"), (), (("u",),))
    first = keys_of(ch({"u": None, "v": "b"}, {"u": None, "v": "z"}, nu), "d", "nu")
    second = keys_of(ch({"u": None, "v": "z"}, {"u": 2, "v": "z"}, nu), "d", "nu")
    third = keys_of(ch({"u": 2, "v": "z"}, {"u": 3, "v": "z"}, nu), "d", "nu")
    assert set(first) & set(second) and set(second) & set(third)
    assert len(second) == 2  # the table's key and u=2
    # with a key, NULLs in unique keys change nothing; a row with a unique value keeps its own key
    assert conflict_keys(ch({"id": 1, "email": None, "a": None, "b": None}, None), "d", "u") == \
        conflict_keys_py(ch({"id": 1, "email": None, "a": None, "b": None}, None), "d", "u")
    assert len(conflict_keys(ch({"id": 1, "email": None, "a": None, "b": None}, None), "d", "u")) == 1
    assert keys_of(ch({"u": 5, "v": "z"}, {"u": 6, "v": "z"}, nu), "d", "nu") == \
        [k for k in keys_of(ch({"u": 5, "v": "z"}, {"u": 6, "v": "z"}, nu), "d", "nu") if not k.endswith("|*")]


def test_causality_groups_and_conflicts() -> None:
    c = Causality()
    g1 = c.place(["k1", "k2"])
    g2 = c.place(["k3"])
    assert g1 is not None and g2 is not None and g1 != g2
    assert c.place(["k2", "k4"]) == g1  # joins the group it touches
    assert c.place(["k1", "k4", "k9"]) == g1
    assert c.place(["k4"]) == g1 and c.place(["k5"]) == "k5"  # one key: its group, or a new one
    n = len(c)
    assert c.place(["k4", "k3"]) is None  # links two groups: a barrier is needed first
    assert len(c) == n  # and nothing was placed
    c.reset()
    assert len(c) == 0 and c.place(["k4", "k3"]) is not None


def test_causality_place_matches_a_union_model() -> None:
    """Random key sets against a plain model: a set of keys gets the group one of
    them is in (or a new one), is refused exactly when they touch two groups, and
    keys placed together stay together until a reset."""
    rng = random.Random(5)
    for _ in range(200):
        c, model = Causality(), {}  # model: key -> group number
        for _ in range(60):
            keys = [f"k{rng.randrange(12)}" for _ in range(rng.choice([1, 1, 2, 3]))]
            touched = {model[k] for k in keys if k in model}
            got = c.place(keys)
            if len(touched) > 1:
                assert got is None
                c.reset()
                model.clear()
                got = c.place(keys)
                touched = set()
            assert got is not None
            gid = touched.pop() if touched else len(model) + 1000 + rng.randrange(10**9)
            for k in keys:
                model[k] = gid
            for a in model:  # same model group <=> same causality group
                for b in model:
                    assert (model[a] == model[b]) == (c.relations[a] == c.relations[b])


def test_stable_hash_is_stable_across_processes() -> None:
    key = conflict_keys(ch(None, {"id": 42, "email": "é", "a": None, "b": None}), "d", "u")[0]
    out = subprocess.run([sys.executable, "-c", f"from senders.mysql.causality import stable_hash; print(stable_hash({key!r}))"],
                         capture_output=True, text=True, env={"PYTHONHASHSEED": "123", "PATH": ""},
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == stable_hash(key)


def test_queue_bounds_weight_and_lets_a_heavy_item_pass_alone() -> None:
    q: WeightedQueue[str] = WeightedQueue(10)
    q.put("a", 6)
    done = threading.Event()

    def put_heavy() -> None:
        q.put("heavy", 50)  # heavier than the capacity: waits for an empty queue, then passes
        done.set()

    t = threading.Thread(target=put_heavy)
    t.start()
    time.sleep(0.3)
    assert not done.is_set() and q.weight == 6
    assert q.get(1) == "a"
    t.join(5)
    assert done.is_set() and q.weight == 50 and q.get(1) == "heavy" and q.weight == 0


def test_queue_get_many_and_timeouts() -> None:
    q: WeightedQueue[int] = WeightedQueue(100)
    assert q.get(0.05) is None and q.get_many(10, 0.05) == []
    for i in range(6):
        q.put(i, 3)
    assert q.get_many(7) == [0, 1, 2]  # the first, then more while under 7 rows
    assert q.get_many(100) == [3, 4, 5] and len(q) == 0


def test_queue_close_wakes_waiters_and_stop_interrupts_a_full_put() -> None:
    q: WeightedQueue[int] = WeightedQueue(1)
    q.put(1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            q.put(2, stop=stop)
        except Closed as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.3)
    stop.set()
    t.join(5)
    assert len(errors) == 1 and not t.is_alive()
    q.close()
    assert q.get(0) == 1  # what was queued is still drained
    with pytest.raises(Closed):
        q.get(1)
    with pytest.raises(Closed):
        q.put(3)
