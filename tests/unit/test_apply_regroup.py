"""The applier's regrouping (capturer/apply/regroup.py) against what the real Kafka
sender writes: transactions go through ``KafkaSender`` (json and protobuf) into a fake
client that keeps each partition's log (no broker: tests/integration/test_apply.py runs
the same with Tansu), the partitions are read back interleaved at random (each in its
own order, as a consumer reads them), with replayed stretches, and every transaction must
come out whole, in the stream's order, with the values the region gave."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
from pathlib import Path
from typing import Any

import pytest
from test_kafka_positions import FakeKafka, sender

from capturer.apply.regroup import BadMessage, Msg, Regrouper, owned_by
from capturer.model import ColumnInfo, Ddl, Position, RowChange, SnapshotMark, TableSchema, Txn, stream_key

RICH = TableSchema(
    "app", "rich", ("id", "email", "score", "at", "day", "dur", "blob", "bits", "tags", "f", "big", "doc"),
    ("id",), (("email",),),
    (3, 253, 246, 18, 10, 19, 252, 16, 248, 5, 8, 245),
    tuple(ColumnInfo(t, binary=(t == 252)) for t in (3, 253, 246, 18, 10, 19, 252, 16, 248, 5, 8, 245)))
PAIRS = TableSchema("app", "pairs", ("a", "b", "v"), ("a", "b"), (), (3, 253, 252))
LOG = TableSchema("odd.db", "lo`g", ("msg", "n"), (), (), (253, 3))


def rich_row(i: int, rng: random.Random) -> dict[str, Any]:
    return {"id": i, "email": f"u{i}-{rng.randrange(10**6)}@x.org'\"\\😀",
            "score": decimal.Decimal(rng.randrange(-10**8, 10**8)) / 100,
            "at": dt.datetime(2026, 1, 1) + dt.timedelta(microseconds=rng.randrange(10**13)),
            "day": dt.date(2000, 2, 29) + dt.timedelta(days=rng.randrange(9000)),
            "dur": dt.timedelta(microseconds=rng.randrange(-10**11, 10**11)),
            "blob": bytes(rng.randrange(256) for _ in range(rng.randrange(12))),
            "bits": format(rng.randrange(256), "b"), "tags": set(rng.sample(["a", "b", "c"], rng.randrange(4))),
            "f": rng.random() * 1e6, "big": rng.choice([0, -1, 2**63 - 1, -(2**63)]),
            "doc": rng.choice([None, '{"k": [1, 2]}', "[]"])}


def workload(seed: int) -> list[Txn]:
    rng = random.Random(seed)
    live: dict[int, dict[str, Any]] = {}
    txns: list[Txn] = []
    ts = 1_000 << 18
    pos = 4
    for n in range(60):
        ts += rng.randrange(1, 5000)
        pos += 100
        region = rng.choice(["r1", "r2"])
        if n == 20:
            txns.append(Txn(region, ts, Position("b.000001", pos), (), Ddl("app", "ALTER TABLE rich ADD x INT",
                                                                         "rich", "app")))
            continue
        changes: list[RowChange] = []
        for _ in range(rng.randrange(1, 12)):
            r = rng.random()
            if r < 0.35 or not live:
                i = rng.randrange(10**6)
                row = rich_row(i, rng)
                live[i] = row
                changes.append(RowChange(RICH, "insert", None, row))
            elif r < 0.55:
                i = rng.choice(sorted(live))
                new = {**rich_row(i, rng), "id": i}
                changes.append(RowChange(RICH, "update", live[i], new))
                live[i] = new
            elif r < 0.65:
                i = rng.choice(sorted(live))
                j = i + 10**7
                new = {**live.pop(i), "id": j}
                live[j] = new
                changes.append(RowChange(RICH, "update", {**new, "id": i}, new))  # a key change
            elif r < 0.75:
                i = rng.choice(sorted(live))
                changes.append(RowChange(RICH, "delete", live.pop(i), None))
            elif r < 0.88:
                a = rng.randrange(5)
                changes.append(RowChange(PAIRS, rng.choice(["insert", "delete"]),
                                         *((None, {"a": a, "b": "x", "v": b"\x00\xff"}) if rng.random() < 0.5
                                           else ({"a": a, "b": "x", "v": b"\x01"}, None))))
            else:
                changes.append(RowChange(LOG, "insert", None, {"msg": rng.choice(["hi", "", None]), "n": n}))
        fixed = []
        for ch in changes:  # (a pairs change drawn above may be a delete with an after image: made right)
            if ch.op == "delete" and ch.before is None:
                ch = RowChange(ch.schema, "insert", None, ch.after)
            elif ch.op == "insert" and ch.after is None:
                ch = RowChange(ch.schema, "delete", ch.before, None)
            fixed.append(ch)
        snap = SnapshotMark("run1", n, True) if n == 30 else None
        if snap:
            fixed = [RowChange(RICH, "read", None, rich_row(5_000_000 + k, rng)) for k in range(3)]
        txns.append(Txn(region, ts, Position("b.000001", pos, gtid=f"0-1-{n}"), tuple(fixed), None, ts >> 28,
                        f"0-1-{n}", snap))
    txns.sort(key=stream_key)
    return txns


def produce(txns: list[Txn], fmt: str, parts: int = 3) -> FakeKafka:
    fake = FakeKafka(parts=parts)
    s = sender(fake, format=fmt)
    for i in range(0, len(txns), 7):
        s.send(txns[i:i + 7])
    return fake


def messages(fake: FakeKafka) -> dict[tuple[str, int], list[Msg]]:
    return {tp: [Msg(tp[0], tp[1], off, k, v, list(h)) for off, (k, v, h) in enumerate(log)]
            for tp, log in fake.logs.items()}


def interleave(logs: dict[tuple[str, int], list[Msg]], rng: random.Random, replays: int = 3) -> list[Msg]:
    """Every partition in its own order, the partitions mixed at random, and a few stretches
    read again (a consumer that went back to a committed offset)."""
    cursors = dict.fromkeys(logs, 0)
    out: list[Msg] = []
    while cursors:
        tp = rng.choice(sorted(cursors))
        log = logs[tp]
        i = cursors[tp]
        take = rng.randrange(1, 6)
        out += log[i:i + take]
        if replays and rng.random() < 0.05 and i > 3:
            replays -= 1
            out += log[i - 3:i + take]  # read again
        cursors[tp] = i + take
        if cursors[tp] >= len(log):
            del cursors[tp]
    return out


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-9 * max(1.0, abs(a))
    return type(a) is type(b) and a == b or (a is None and b is None)


def same_image(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)


def assert_same_txn(want: Txn, got: Txn | None) -> None:
    assert got is not None
    assert (got.region, got.commit_ts, got.position, got.gtid) == (want.region, want.commit_ts, want.position,
                                                                    want.gtid)
    assert got.ddl == want.ddl
    assert got.snapshot == want.snapshot
    assert len(got.changes) == len(want.changes), (want, got)
    for w, g in zip(want.changes, got.changes):
        assert (g.op, g.db, g.table, g.schema.pk, g.schema.columns) == (w.op, w.db, w.table, w.schema.pk,
                                                                        w.schema.columns)
        assert same_image(w.before, g.before), (w.before, g.before)
        assert same_image(w.after, g.after), (w.after, g.after)


@pytest.mark.parametrize("fmt", ["json", "protobuf"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_transactions_come_out_whole_and_in_order(fmt: str, seed: int) -> None:
    txns = workload(seed)
    fake = produce(txns, fmt)
    assert any(tp[0] == "txns" for tp in fake.logs)
    rng = random.Random(seed)
    r = Regrouper("txns", fmt)
    out = []
    for m in interleave(messages(fake), rng):
        r.add(m)
        out += r.ready()
    assert [k for k, _ in out] == [stream_key(t) for t in txns]
    for want, (_k, got) in zip(txns, out):
        assert_same_txn(want, got)
    assert r.duplicates > 0  # the replayed stretches were dropped, not applied twice
    assert r.rows_buffered == 0 and not r.order


def test_a_transaction_waits_for_its_last_message() -> None:
    txns = workload(4)
    fake = produce(txns, "json")
    logs = messages(fake)
    # hold back the last message of one table partition: everything from its transaction on waits
    held_tp = next(tp for tp in sorted(logs) if tp[0] != "txns" and len(logs[tp]) > 2)
    held = logs[held_tp].pop()
    r = Regrouper("txns")
    out = []
    for m in interleave(logs, random.Random(4), replays=0):
        r.add(m)
        out += r.ready()
    stuck = next(i for i, t in enumerate(txns) if stream_key(t) == (int(dict(held.headers)["commit_ts"]),
                                                                    dict(held.headers)["region"].decode(), 0))
    assert len(out) == stuck
    assert r.waiting()[0]["missing"] == {f"{held_tp[0]}[{held_tp[1]}]": 1}
    # the offsets to commit stop at that transaction's first message in every partition that has one
    offs = r.commit_offsets()
    assert offs[held_tp] <= held.offset
    r.add(held)
    out += r.ready()
    assert [k for k, _ in out] == [stream_key(t) for t in txns]


def test_an_applier_that_owns_some_tables_counts_only_theirs() -> None:
    txns = workload(5)
    fake = produce(txns, "json")
    owns = owned_by(["app.rich"])
    r = Regrouper("txns", "json", owns)
    out = []
    # it reads only the topics its tables are in, as the applier assigns them
    logs = {tp: ms for tp, ms in messages(fake).items() if tp[0] in ("txns", "capturer.app.rich")}
    for m in interleave(logs, random.Random(5)):
        r.add(m)
        out += r.ready()
    assert [k for k, _ in out] == [stream_key(t) for t in txns]
    for want, (_k, got) in zip(txns, out):
        mine = tuple(c for c in want.changes if c.table == "rich")
        if want.ddl is not None:
            assert got is not None and got.ddl == want.ddl  # the DDL of its table
        elif not mine:
            assert got is None
        else:
            assert_same_txn(Txn(want.region, want.commit_ts, want.position, mine, None, want.source_ts, want.gtid,
                                want.snapshot), got)
    assert r.topics == {"capturer.app.rich"}
    assert owned_by(["`odd.db`.lo*"])("odd.db", "lo`g") and not owned_by(["app.*"])("odd.db", "lo`g")


def test_tables_with_hostile_names_are_read_whole(tmp_path: Path) -> None:
    """``tables`` naming a database and a table that hold commas, dots, doubled backticks and quotes, as
    filter rules quote them. Before: the list was cut at every comma (inside backticks too) and a doubled
    backtick ended the quoted name, so such an applier owned nothing of its table (or another's)."""
    from capturer.apply.config import load_apply_config
    from capturer.errors import ConfigError
    from senders import CATALOG

    db, table = 'Sch "q".d,c;`ü', 'Tab le."x",;`Ä'
    (tmp_path / "s.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp_path / 'x.jsonl'}\n")
    cfg = tmp_path / "a.cfg"
    cfg.write_text("[global]\nservers=k:9092\ntxn_topic=t\nsenderConfig=s.cfg\n"
                   "tables = `Sch \"q\".d,c;``ü`.`Tab le.\"x\",;``Ä`, `a,b`.*, plain.t?\n")
    c = load_apply_config(cfg, CATALOG, base_dir=tmp_path)
    assert c.tables == ('`Sch "q".d,c;``ü`.`Tab le."x",;``Ä`', "`a,b`.*", "plain.t?")
    owns = owned_by(c.tables)
    assert owns(db, table) and owns("a,b", "anything") and owns("plain", "t1")
    assert not owns(db, "Tab le") and not owns("Sch \"q\"", table) and not owns("a", "b") and not owns("plain", "t")
    cfg.write_text("[global]\nservers=k:9092\ntxn_topic=t\nsenderConfig=s.cfg\ntables = `open.t\n")
    with pytest.raises(ConfigError, match=r"a.cfg:5: .*unterminated backtick"):
        load_apply_config(cfg, CATALOG, base_dir=tmp_path)


def test_done_transactions_are_dropped_and_offsets_move_behind_them() -> None:
    txns = workload(6)
    fake = produce(txns, "json")
    logs = messages(fake)
    r = Regrouper("txns")
    out = []
    for m in interleave(logs, random.Random(6), replays=0):
        r.add(m)
        out += r.ready()
    ends = {tp: len(ms) for tp, ms in logs.items()}
    half = out[len(out) // 2][0]
    offs = r.commit_offsets()
    assert all(offs[tp] < ends[tp] for tp in offs if tp[0] == "txns")  # nothing done yet: behind
    r.done_through(half)
    mid = r.commit_offsets()
    r.done_through(out[-1][0])
    assert r.commit_offsets() == ends  # all done: the end of what was read
    # a restart from the middle's offsets, the destinations holding everything up to ``half``
    r2 = Regrouper("txns")
    r2.skip_through(half)
    again = []
    for tp, ms in logs.items():
        for m in ms[mid[tp]:]:
            r2.add(m)
            again += r2.ready()
    assert [k for k, _ in again] == [k for k, _ in out if k > half]


def test_bad_messages_are_named() -> None:
    txns = workload(7)
    fake = produce(txns, "json")
    logs = messages(fake)
    tp = next(tp for tp in sorted(logs) if tp[0] == "capturer.app.rich")
    victim = logs[tp][0]
    broken = Msg(victim.topic, victim.partition, victim.offset, victim.key, b"{not json", victim.headers)
    logs[tp][0] = broken
    r = Regrouper("txns")
    with pytest.raises(BadMessage, match=rf"topic 'capturer.app.rich' partition {tp[1]} offset 0: does not decode"):
        for m in [m for ms in logs.values() for m in ms]:
            r.add(m)
    # dead-lettered instead: counted for its transaction, the rest is applied
    r = Regrouper("txns")
    out = []
    for _tp, ms in sorted(logs.items(), key=lambda x: x[0][0] != "txns"):
        for m in ms:
            try:
                r.add(m)
            except BadMessage:
                assert r.add_bad(m)
            out += r.ready()
    assert len(out) == len(txns)
    # an END record of an older capturer (no parts): said plainly
    spine = logs[("txns", 0)]
    end = next(m for m in spine if json.loads(m.value or b"{}").get("status") == "END")
    d = json.loads(end.value or b"{}")
    del d["parts"]
    with pytest.raises(BadMessage, match="older than the applier"):
        Regrouper("txns").add(Msg("txns", 0, end.offset, end.key, json.dumps(d).encode(), end.headers))


def test_tables_sharing_a_topic_are_counted_per_table() -> None:
    """A topic pattern without {table} puts several tables in one topic: an applier that owns
    one of them counts exactly its messages (not the topic's), and loses none."""
    txns = workload(8)
    fake = FakeKafka(parts=3)
    s = sender(fake, format="json", topic="capturer.{db}")
    for i in range(0, len(txns), 7):
        s.send(txns[i:i + 7])
    for table in ("rich", "pairs"):
        r = Regrouper("txns", "json", owned_by([f"app.{table}"]))
        out = []
        for m in interleave(messages(fake), random.Random(8), replays=2):
            if m.topic in ("txns", "capturer.app"):
                r.add(m)
                out += r.ready()
        assert [k for k, _ in out] == [stream_key(t) for t in txns]
        got_rows = sum(len(t.changes) for _, t in out if t is not None and t.ddl is None)
        assert got_rows == sum(1 for t in txns for c in t.changes if c.table == table)
        for want, (_k, got) in zip(txns, out):
            mine = tuple(c for c in want.changes if c.table == table)
            if mine:
                assert_same_txn(Txn(want.region, want.commit_ts, want.position, mine, None, want.source_ts,
                                    want.gtid, want.snapshot), got)


def test_a_snapshot_chunk_sent_again_under_a_new_key_does_not_hold_the_applier() -> None:
    """The capturer killed while a chunk was half in Kafka reads the chunk again after its
    restart and sends it under a new commit_ts: the old, incomplete one is skipped (its BEGIN
    not followed by its END; or its END there but a partition past it without its rows)."""
    from capturer.errors import SinkError

    rng = random.Random(9)
    rows = [RowChange(RICH, "read", None, rich_row(i, rng)) for i in range(40)]
    chunk = Txn("r1", 200 << 20, Position("b.000001", 100), tuple(rows), None, 1, "", SnapshotMark("run9", 1))
    later = Txn("r1", (200 << 20) + 5, Position("b.000001", 200),
                (RowChange(RICH, "insert", None, rich_row(99_999, rng)),), None, 1, "")
    for cut in (8, 41):  # in the middle of the rows (no END yet); after the rows, the END lost with a row
        fake = FakeKafka(parts=3)
        s = sender(fake, format="json")
        fake.cut = cut
        with pytest.raises(SinkError, match="cut after"):
            s.send([chunk])
        if cut == 41:  # its END made it, one row of a partition did not (the batch was never acknowledged)
            s2 = sender(fake, format="json")
            fake.cut = None
            s2.send([chunk])
            tp = next(tp for tp in sorted(fake.logs) if tp[0] == "capturer.app.rich")
            fake.logs[tp].pop(0)
        fake.cut = None
        again = Txn("r1", (200 << 20) + 3, chunk.position, chunk.changes, None, 1, "", chunk.snapshot)
        sender(fake, format="json").send([again, later])
        r = Regrouper("txns")
        out = []
        for tp in sorted(fake.logs, key=lambda tp: tp[0] != "txns"):
            for m in messages(fake)[tp]:
                r.add(m)
                out += r.ready()
        out += r.ready()
        applied = [t for _, t in out if t is not None]
        assert [stream_key(t) for t in applied] == [stream_key(again), stream_key(later)], cut
        assert_same_txn(again, applied[0])
        assert r.abandoned == 1 and r.rows_buffered == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_last_rows_shortcut_changes_nothing(seed: int) -> None:
    """A row of the previous row's transaction in the same partition skips ``_entry_for`` (``_last_row``):
    step by step, with replays, done_through and a dead-lettered message between, the state is that of a
    regrouper that never takes the shortcut."""
    txns = workload(seed)
    logs = messages(produce(txns, "json"))
    rng = random.Random(seed)
    fast, slow = Regrouper("txns"), Regrouper("txns")
    outs: tuple[list[Any], list[Any]] = ([], [])
    took = 0
    for i, m in enumerate(interleave(logs, rng, replays=6)):
        took += fast._last_row is not None and m.topic != "txns"
        slow._last_row = None
        for r, out in ((fast, outs[0]), (slow, outs[1])):
            if i % 97 == 50 and m.topic != "txns":
                r.add_bad(m)
            else:
                r.add(m)
            if i % 13 == 0:
                out += [(k, None if t is None else len(t.changes)) for k, t in r.ready()]
            if i % 41 == 0 and out:
                r.done_through(out[len(out) // 2][0])
        assert fast.commit_offsets() == slow.commit_offsets()
        assert {tp: list(q) for tp, q in fast.pending.items()} == {tp: list(q) for tp, q in slow.pending.items()}
        assert fast.last_key == slow.last_key and fast.rows_buffered == slow.rows_buffered
        assert (fast.duplicates, fast.dropped) == (slow.duplicates, slow.dropped)
    assert outs[0] == outs[1] and outs[0]
    assert took > 100  # (the shortcut was taken)


def test_the_last_rows_shortcut_is_forgotten_after_a_dead_lettered_message() -> None:
    """A message put aside (``add_bad``) between two rows of one transaction in a partition notes its own
    transaction there: the next row notes its transaction again, as without the shortcut."""
    logs = messages(produce(workload(4), "json"))
    tp = next(tp for tp in sorted(logs) if tp[0] != "txns")
    ms = logs[tp]
    keys = [Regrouper._identity(m)[0] for m in ms]
    i = next(i for i in range(1, len(ms) - 1) if keys[i] == keys[i - 1] and keys[i + 1] == keys[i])
    j = next(j for j in range(len(ms)) if keys[j] != keys[i])
    fast, slow = Regrouper("txns"), Regrouper("txns")
    for r in (fast, slow):
        r.add(ms[i - 1])
        r.add_bad(ms[j])
        slow._last_row = None
        r.add(ms[i])
    assert list(fast.pending[tp]) == list(slow.pending[tp]) == [(keys[i], i - 1), (keys[j], j), (keys[i], i)]
