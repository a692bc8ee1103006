"""Snapshot logic without a server: the region's emission rules (start step, chunks,
keyless corrections), chunk keys, DDL bookkeeping, the clock, the output shapes."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from capturer.model import Ddl, Position, RowChange, TableProgress, TableSchema, Txn, make_ts
from capturer.regions.base import RegionContext
from capturer.regions.clock import LiftJournal, RegionClock
from capturer.regions.mysql.keys import RegionConfig
from capturer.regions.mysql.region import MySQLRegion
from capturer.regions.mysql.snapshot import MySQLPlan as TablePlan
from capturer.regions.snapshot import ChunkMark
from capturer.regions.snapshot_plan import Chunk, Column, Recorder, enum_members, key_matches, split_key
from capturer.util.bqueue import WeightedQueue
from senders.kafka.format import json_envelope, source_block, truncate_message
from senders.sqlbuild import build

SCHEMA = TableSchema("d", "t", ("id", "v"), ("id",), (), (3, 3))


def make_region(**ctx_kw: Any) -> tuple[MySQLRegion, WeightedQueue[Any]]:
    q: WeightedQueue[Any] = WeightedQueue(10**6)
    ctx = RegionContext(q, None, 0, LiftJournal(None), threading.Event(), **ctx_kw)
    r = MySQLRegion(RegionConfig("r1", "mysql", "h", 1, "u", "", 1), ctx)
    r.position = Position("f.000001", 100)
    return r, q


AT = Position("f.000001", 100)


def plan_of(schema: TableSchema = SCHEMA, at: Position = AT) -> TablePlan:
    cols = [Column(c, "int", "int(11)", 10, 0, False, c not in schema.pk) for c in schema.columns]
    p = TablePlan(schema.db, schema.table, cols, schema.pk, schema)
    p.described_at = at
    return p


def drain(q: WeightedQueue[Any]) -> list[Any]:
    out = []
    while True:
        it = q.get(timeout=0.01)
        if it is None:
            return out
        out.append(it)


def commit(r: MySQLRegion, pos: int, *changes: RowChange) -> None:
    """A binlog transaction read by the stream (what ``_commit`` does)."""
    with r._lock:
        p = Position("f.000001", pos, "", r.snap_progress)
        txn = Txn("r1", r.clock.commit(1, p), p, tuple(changes))
        r._record(txn)
        r._emit(txn)
        r.position = p


def sink(items: list[Any]) -> dict[Any, dict[str, Any]]:
    """What a keyed sink ends up with (TRUNCATE empties it)."""
    state: dict[Any, dict[str, Any]] = {}
    for it in items:
        if not isinstance(it, Txn):
            continue
        if it.ddl is not None:
            if it.ddl.sql.startswith("TRUNCATE"):
                state.clear()
            continue
        for ch in it.changes:
            if ch.before is not None:
                state.pop(ch.before["id"], None)
            if ch.after is not None:
                state[ch.after["id"]] = ch.after
    return state


def test_truncating_run_truncates_before_its_first_chunk_is_read() -> None:
    """The reviewer's case: a row changed between the chunk's read (P) and its
    delivery survives, because the TRUNCATE went out before P."""
    r, q = make_region()
    plan = plan_of()
    r.add_snapshot_progress((TableProgress("d", "t", "run1", "pending", truncate=True),), wait=True)
    p = r.emit_begin(plan, "run1", Position("f.000001", 100), "", truncate=True)
    assert isinstance(p, TableProgress) and p.state == "running" and p.truncate
    # the start step says it was delivered: its position carries "running"
    assert r.position is not None and r.position.snapshot[0].state == "running"
    tok = r.chunk_begin(plan)
    chunk = Chunk(plan, Position("f.000001", 120), [{"id": 1, "v": 0}, {"id": 2, "v": 0}],
                  (plan.key_signature(), 2), True, 0, "run1")
    commit(r, 150, RowChange(SCHEMA, "update", {"id": 1, "v": 0}, {"id": 1, "v": 1}))
    out = r.emit_chunk(chunk)
    r.chunk_end(plan, tok)
    assert isinstance(out, TableProgress) and out.state == "done"
    items = drain(q)
    assert [it.ddl.sql for it in items if isinstance(it, Txn) and it.ddl] == ["TRUNCATE TABLE `d`.`t`"]
    assert sink(items) == {1: {"id": 1, "v": 1}, 2: {"id": 2, "v": 0}}


def test_a_keyed_chunk_never_truncates_itself() -> None:
    """(A chunk made by older code with truncate set: the TRUNCATE is its run's start.)"""
    r, q = make_region()
    plan = plan_of()
    r.add_snapshot_progress((TableProgress("d", "t", "run1", "running", truncate=True),), wait=True)
    chunk = Chunk(plan, Position("f.000001", 100), [{"id": 1, "v": 0}], (plan.key_signature(), 1), False, 0,
                  "run1", True)
    assert isinstance(r.emit_chunk(chunk), TableProgress)
    assert not [it for it in drain(q) if isinstance(it, Txn) and it.ddl]


def test_start_step_is_redone_after_a_ddl_and_skipped_when_superseded() -> None:
    r, q = make_region()
    plan = plan_of(at=Position("f.000001", 90))
    r.add_snapshot_progress((TableProgress("d", "t", "run1", "pending", truncate=True),), wait=True)
    with r._lock:
        r._note_ddl(Ddl("D", "ALTER TABLE T ADD c INT", "T", "D"), Position("f.000001", 95))
    assert r.emit_begin(plan, "run1", Position("f.000001", 100), "", True) == "redo"  # (names without case)
    assert r.emit_begin(plan_of(at=Position("f.000001", 100)), "run0", Position("f.000001", 100), "",
                        True) == "superseded"
    assert not drain(q)


def test_restart_of_a_run_whose_start_was_delivered_does_not_truncate_again() -> None:
    """The progress in a checkpoint after the TRUNCATE: state running; the worker
    goes straight to chunks (only a pending table gets a start step)."""
    started = TableProgress("d", "t", "run1", "running", ("key=`id` int(11)", 100), 2, 200, truncate=True)
    pos = Position.from_json(json.loads(json.dumps(Position("f.000001", 100, "", (started,)).checkpoint_json())))
    (p,) = pos.snapshot
    assert p.state == "running" and p.truncate and p.chunks == 2
    assert split_key(p.last_key) == ("key=`id` int(11)", (100,))


def test_stored_keys_name_their_key() -> None:
    plan = plan_of()
    sig = plan.key_signature()
    assert sig == "key=`id` int(11)"
    assert key_matches(plan, None) and key_matches(plan, (sig, 5)) and key_matches(plan, (5,))  # (older: no key)
    assert not key_matches(plan, ("key=`v` int(11), `id` int(11)", 5, 6)) and not key_matches(plan, (5, 6))
    other = TablePlan("d", "t", [Column("id", "bigint", "bigint(20)", 19, 0, False, False)], ("id",), SCHEMA)
    assert not key_matches(other, (sig, 5))  # a type change orders differently too
    coll = TablePlan("d", "t", [Column("id", "varchar", "varchar(9)", 0, 0, False, False, "utf8mb4_bin")],
                     ("id",), SCHEMA)
    assert coll.key_signature() == "key=`id` varchar(9) COLLATE utf8mb4_bin"


def test_key_where_compares_each_type_exactly_and_sargably() -> None:
    cols = [Column("e", "enum", "enum('zz','Aa','m')", 0, 0, False, False),
            Column("f", "float", "float", 12, 0, False, False),
            Column("b", "bit", "bit(8)", 8, 0, False, False),
            Column("s", "set", "set('x','y')", 0, 0, False, False),
            Column("id", "int", "int(11)", 10, 0, False, False)]
    plan = TablePlan("d", "t", cols, ("e", "f", "b", "s", "id"), SCHEMA)
    assert plan.key_select() == ("CAST(`e` AS UNSIGNED), CAST(`f` AS DOUBLE), CAST(`b` AS UNSIGNED), "
                                 "CAST(`s` AS UNSIGNED), `id`")
    f = 0.699999988079071  # a FLOAT's exact value as a double (its shortest text is 0.7)
    sql, params = plan.key_where((2, f, 5, 3, 9), lambda n: f"`{n}`", "?")
    assert sql.startswith("(`e` IN (?)) OR (`e` = ? AND `f` > ?) OR (`e` = ? AND `f` = ? AND `b` > ?)")
    assert "CAST(`s` AS UNSIGNED) > ?" in sql and "`s` = ?" in sql
    assert params[:5] == ("m", "Aa", f, "Aa", f)
    sql, params = plan_of().key_where((7,), lambda n: f"`{n}`", "%s")
    assert (sql, params) == ("(`id` > %s)", (7,))
    last = TablePlan("d", "t", cols[:1], ("e",), SCHEMA)
    assert last.key_where((3,), lambda n: n, "?") == ("(0 = 1)", ())  # after the last member: nothing


def test_enum_members() -> None:
    assert enum_members("enum('a','b''c','Z z')") == ["a", "b'c", "Z z"]
    assert enum_members("enum('a','A')") is None  # would compare equal by name
    assert enum_members("enum('','a')") is None  # '' is also the invalid value's name
    assert enum_members("enum('a\\\\b')") is None
    assert enum_members("set('a')") is None


def test_ddl_seen_keeps_the_newest_and_ignores_case() -> None:
    r, _ = make_region()
    with r._lock:
        r._note_ddl(Ddl("Shop", "ALTER TABLE Orders ADD x INT", "Orders", "Shop"), Position("f.000001", 10))
        assert r._last_ddl("shop", "orders") == ("f.000001", 10)
        for i in range(12_000):
            r._note_ddl(Ddl("d", "ALTER TABLE t ADD x INT", f"t{i}", "d"), Position("f.000001", 100 + i))
        # the oldest entry was noted again: it must be kept, as the newest
        r._note_ddl(Ddl("shop", "ALTER TABLE orders ADD y INT", "orders", "shop"), Position("f.000002", 4))
        for i in range(12_000, 12_500):
            r._note_ddl(Ddl("d", "ALTER TABLE t ADD x INT", f"t{i}", "d"), Position("f.000002", 100 + i))
        assert len(r._ddl_seen) <= 10_001
        assert r._last_ddl("SHOP", "ORDERS") == ("f.000002", 4)
        # a table whose entry was pruned away: the pruned entries' newest position stands for it
        floor = r._last_ddl("d", "t5")
        assert floor is not None and floor >= ("f.000001", 100 + 5)


def test_clock_extra_is_above_everything_sent_and_next_follows_the_stream() -> None:
    """An item placed by timing (a chunk, a copy's TRUNCATE) is above everything the
    region sent, so the same item made again after a restart can never take the
    identity of one sent before the crash; an item at a fixed point of the stream
    (the CREATE statements at a snapshot's start) takes the next value, the same on
    a replay from the same floor."""
    c = RegionClock("r", 0, LiftJournal(None))
    t = c.commit(1_000, Position("f", 10))
    hb = c.heartbeat(2_000_000)  # idle: the heartbeats move on
    x = c.extra(1_500_000)  # made again after a restart at an earlier "now": still above all
    assert x == hb + 1 > t
    later = c.extra(3_000_000)
    assert later == make_ts(3_000_000)
    a = RegionClock("r", 77, LiftJournal(None))
    b = RegionClock("r", 77, LiftJournal(None))
    assert [a.next(), a.next()] == [b.next(), b.next()] == [78, 79]


def test_keyless_copy_spills_recorded_changes_and_corrects_the_rows(tmp_path: Any) -> None:
    schema = TableSchema("d", "k", ("m", "n"), (), (), (15, 3))
    r, q = make_region(spill_rows=4, spill_dir=str(tmp_path))
    plan = TablePlan("d", "k", [Column("m", "varchar", "varchar(9)", 0, 0, False, True),
                                Column("n", "int", "int(11)", 10, 0, False, True)], (), schema)
    plan.described_at = Position("f.000001", 100)
    r.add_snapshot_progress((TableProgress("d", "k", "run1", "running"),), wait=True)
    tok = r.chunk_begin(plan)
    from capturer.model.spill import SpillWriter

    w = SpillWriter(str(tmp_path), 3)
    w.add([RowChange(schema, "read", None, {"m": "a", "n": i % 3}) for i in range(9)])  # the rows at P
    chunk = Chunk(plan, Position("f.000001", 120), [], None, True, 0, "run1", True, w.finish())
    commit(r, 110, RowChange(schema, "insert", None, {"m": "a", "n": 0}))  # before P: in the rows read
    for i in range(10):  # after P: inserts, deletes, updates (more than spill_rows: on disk)
        commit(r, 130 + i, RowChange(schema, "insert", None, {"m": "b", "n": i}))
    commit(r, 150, RowChange(schema, "delete", {"m": "a", "n": 1}, None))
    commit(r, 151, RowChange(schema, "update", {"m": "b", "n": 3}, {"m": "c", "n": 3}))
    commit(r, 152, RowChange(schema, "delete", {"m": "b", "n": 9}, None))
    rec = r.recorders[("d", "k")]
    assert rec.spill is not None and rec.spill.rows >= 4 and len(rec.events) < 4
    drain(q)
    assert isinstance(r.emit_chunk(chunk), TableProgress)
    r.chunk_end(plan, tok)
    items = drain(q)
    assert items[0].ddl is not None and items[0].ddl.sql == "TRUNCATE TABLE `d`.`k`"
    got = sorted((ch.after["m"], ch.after["n"]) for ch in items[1].changes)
    want = sorted([("a", i % 3) for i in range(9) if not (i % 3 == 1 and i == 1)]
                  + [("b", i) for i in range(9) if i != 3] + [("c", 3)])
    assert got == want
    assert ("d", "k") not in r.recorders  # released (its spill file too)


def test_recorder_prunes_keyless_events_before_the_lowest_chunk() -> None:
    rec = Recorder((), ("m",), spill_rows=0)
    rec.lows[1] = ("f", 50)
    for p in (40, 60):
        rec.record(("f", p), None, {"m": p})
    rec.prune()
    assert [e[0] for e in rec.events] == [("f", 60)]
    rec.lows.clear()
    rec.prune()
    assert rec.events == [] and rec.spill is None


def test_request_does_not_wait_for_a_region_blocked_on_its_queue() -> None:
    r, _ = make_region()
    done = threading.Event()
    with r._lock:  # as an emission blocked on a full queue holds it
        t = threading.Thread(target=lambda: (r.add_snapshot_progress((TableProgress("d", "t", "run9"),)),
                                             done.set()))
        t.start()
        t.join(10)
        assert done.is_set()
    # applied at the lock's next use, before anything reads the progress
    p = r.table_progress("d", "t")
    assert p is not None and p.run == "run9"
    assert r.position is not None and r.position.snapshot == (p,)


def test_sql_text_of_an_update_converges_on_a_target_without_the_row() -> None:
    moved, _ = build(RowChange(SCHEMA, "update", {"id": 1, "v": 5}, {"id": 2, "v": 6}), literal=True)
    assert moved == ("DELETE FROM `d`.`t` WHERE `id` <=> 1; INSERT INTO `d`.`t` (`id`, `v`) VALUES (2, 6) "
                     "ON DUPLICATE KEY UPDATE `id`=VALUES(`id`), `v`=VALUES(`v`)")
    same, _ = build(RowChange(SCHEMA, "update", {"id": 1, "v": 5}, {"id": 1, "v": 6}), literal=True)
    assert same.startswith("INSERT INTO `d`.`t` (`id`, `v`) VALUES (1, 6) ON DUPLICATE KEY UPDATE")
    keyless = TableSchema("d", "k", ("a",), ())
    text, _ = build(RowChange(keyless, "update", {"a": 1}, {"a": 2}), literal=True)
    assert text == "UPDATE `d`.`k` SET `a`=2 WHERE `a` <=> 1 LIMIT 1"


def _snap_txn(last: bool, rows: int = 2) -> Txn:
    mark = ChunkMark("run1", 3, last, "d", "t", Position("f.000001", 120))
    return Txn("r1", 5 << 18, Position("f.000001", 130), tuple(
        RowChange(SCHEMA, "read", None, {"id": i, "v": 0}) for i in range(rows)), None, 0, "", mark)


def test_snapshot_mark_names_the_table_and_its_read_position() -> None:
    mark = _snap_txn(True).snapshot
    assert mark is not None and mark.to_json() == {"run": "run1", "chunk": 3, "last": True, "db": "d",
                                                   "table": "t", "read_at": {"file": "f.000001", "pos": 120}}


def test_debezium_snapshot_field_and_truncate_event() -> None:
    txn = _snap_txn(True)
    s0, s1 = (source_block(txn, "d", "t", i) for i in (0, 1))
    assert (s0["snapshot"], s1["snapshot"]) == ("true", "last")  # "last": the table's very last row
    assert s1["snapshot_chunk"]["read_at"] == {"file": "f.000001", "pos": 120}
    assert source_block(_snap_txn(False), "d", "t", 1)["snapshot"] == "true"
    plain = Txn("r1", 6 << 18, Position("f.000001", 140), (RowChange(SCHEMA, "insert", None, {"id": 9, "v": 1}),))
    d = json.loads(json_envelope(plain, 0, plain.changes[0], "c"))
    assert d["source"]["snapshot"] == "false" and "snapshot_chunk" not in d["source"]
    cut = Txn("r1", 7 << 18, Position("f.000001", 150), (), Ddl("d", "TRUNCATE TABLE `d`.`t`", "t", "d"))
    assert cut.ddl is not None
    ev = json.loads(truncate_message(cut, cut.ddl, "json"))
    assert ev["op"] == "t" and ev["before"] is None and ev["after"] is None
    assert (ev["source"]["db"], ev["source"]["table"], ev["source"]["commit_ts"]) == ("d", "t", 7 << 18)
    assert json.loads(truncate_message(cut, cut.ddl, "canal"))["type"] == "TRUNCATE"
    assert truncate_message(cut, cut.ddl, "sql") == b"TRUNCATE TABLE `d`.`t`"


class _FakeKafka:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, Any, Any, dict[str, bytes]]] = []
        self.learned: list[str] = []

    def partitions(self, topic: str) -> int:
        return 3

    def learn(self, topic: str) -> None:
        # the producer learns a topic before its first message goes to it
        assert not any(x[0] == topic for x in self.sent), topic
        self.learned.append(topic)

    def produce(self, topic: str, partition: int, key: Any, value: Any, headers: list[tuple[str, bytes]]) -> None:
        self.sent.append((topic, partition, key, value, dict(headers)))

    def flush(self, timeout: float) -> list[str]:
        return []


@pytest.mark.parametrize("sql", ["TRUNCATE TABLE `d`.`t`", "/* x */ truncate t"])
def test_kafka_sends_a_truncate_to_every_partition_of_the_tables_topic(sql: str) -> None:
    from senders.kafka.sender import KafkaSender

    s = KafkaSender("kafka", {"servers": "x:1", "topic": "capturer.{db}.{table}", "format": "json",
                              "client": "kafka-python", "tombstones": False, "txn_topic": "",
                              "schema_topic": "capturer.schema_changes", "partitions": 3, "replication_factor": 1,
                              "create_topics": True, "compression": "none", "linger_ms": 5, "read_back": False})
    fake = _FakeKafka()
    s.client = fake  # type: ignore[assignment]
    s._send_txn(Txn("r1", 7 << 18, Position("f.000001", 150), (), Ddl("d", sql, "t", "d")))
    data = [x for x in fake.sent if x[0] == "capturer.d.t"]
    assert sorted(x[1] for x in data) == [0, 1, 2] and all(x[2] is None for x in data)
    assert all(json.loads(x[3])["op"] == "t" and x[4]["op"] == b"t" for x in data)
    assert [x[0] for x in fake.sent if x[0] != "capturer.d.t"] == ["capturer.schema_changes"]
    fake.sent.clear()
    s._send_txn(Txn("r1", 8 << 18, Position("f.000001", 160), (), Ddl("d", "ALTER TABLE t ADD c INT", "t", "d")))
    assert [x[0] for x in fake.sent] == ["capturer.schema_changes"]
    assert fake.learned == ["capturer.schema_changes", "capturer.d.t"]  # once each


def test_pin_start_writes_a_first_start_once_and_keeps_it(tmp_path: Any) -> None:
    from capturer.app import Capturer, load_config
    from capturer.pipeline.checkpoint import load_checkpoint

    (tmp_path / "senders.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp_path / 'out.jsonl'}\n")
    (tmp_path / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={tmp_path / 'cp.json'}\nsenderConfig={tmp_path / 'senders.cfg'}\n"
        "httpPort=0\n\n[region:r1]\ntype=mysql\nhost=127.0.0.1\nport=1\nuser=u\npassword=\nserver_id=9\n"
        "\n[region:r2]\ntype=mysql\nhost=127.0.0.1\nport=2\nuser=u\npassword=\nserver_id=10\n")
    cap = Capturer(load_config(tmp_path / "config.cfg"))
    start = Position("bin.000003", 400, "", (TableProgress("d", "t", "run1"),))
    cap.pin_start("r1", start)
    cp = load_checkpoint(tmp_path / "cp.json")
    assert cp is not None and cp.commit_ts == 0 and cp.regions == {"r1": start}
    assert cp.regions["r1"].snapshot == start.snapshot  # the run travels with it
    cap.pin_start("r1", Position("bin.000009", 4))  # it has a position now: left alone
    cap.pin_start("r2", Position("bin.000001", 4))
    cap.write_checkpoint()  # a regular write (nothing acknowledged yet) keeps both
    cp = load_checkpoint(tmp_path / "cp.json")
    assert cp is not None and cp.regions == {"r1": start, "r2": Position("bin.000001", 4)}
    assert cap.manager.advance().regions == cp.regions


def test_binlog_end_asks_mysql_84s_statement_only_when_the_first_is_unknown() -> None:
    from capturer.util.binlogpos import binlog_end

    class Err(Exception):
        def __init__(self, code: int) -> None:
            super().__init__(code, "x")

    asked: list[str] = []

    def mysql84(sql: str) -> list[tuple[object, ...]]:
        asked.append(sql)
        if sql == "SHOW MASTER STATUS":
            raise Err(1064)
        return [("binlog.000007", 1234, "", "", "uuid:1-5")]

    assert binlog_end(mysql84) == ("binlog.000007", 1234)
    assert asked == ["SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"]
    assert binlog_end(lambda sql: []) is None  # binlog off

    def denied(sql: str) -> list[tuple[object, ...]]:
        raise Err(1227)  # no privilege: reported as it is, not hidden behind the second statement

    with pytest.raises(Err):
        binlog_end(denied)


def test_watermark_reads_lock_without_waiting_then_wait() -> None:
    """MariaDB: LOCK IN SHARE MODE NOWAIT; MySQL 8: FOR SHARE NOWAIT (NOWAIT after LOCK IN
    SHARE MODE is a syntax error there); MySQL 5.7 has no NOWAIT; after the tries
    without waiting, a read waits for the locks."""
    from capturer.regions.mysql.snapshot import _NOWAIT_TRIES, Reader, share_clause

    assert share_clause("10.11.19-MariaDB-0+deb12u1") == (" LOCK IN SHARE MODE", True)
    assert share_clause("8.0.36") == (" FOR SHARE", True)
    assert share_clause("8.4.3-commercial") == (" FOR SHARE", True)
    assert share_clause("5.7.44-log") == (" LOCK IN SHARE MODE", False)
    r = Reader.__new__(Reader)
    r.method = "watermark"
    r.share, r.nowait = share_clause("8.0.36")
    assert r.lock_clause(0) == " FOR SHARE NOWAIT"
    assert r.lock_clause(_NOWAIT_TRIES) == " FOR SHARE"
    r.share, r.nowait = share_clause("10.6.1-MariaDB")
    assert r.lock_clause(0) == " LOCK IN SHARE MODE NOWAIT"
    r.share, r.nowait = share_clause("5.7.44")
    assert r.lock_clause(0) == " LOCK IN SHARE MODE"
    r.method = "consistent"
    assert r.lock_clause(0) == ""


def test_recorder_keeps_both_forms_while_keyed_chunks_and_whole_reads_are_in_flight() -> None:
    """A keyed chunk and a whole-table read (a coordinated copy) of one table in flight
    at once: the changes are kept by key for the one and as events for the other."""
    rec = Recorder(("id",), ("id", "v"), spill_rows=0)
    rec.lows[1] = ("f", 10)
    rec.lows[2] = ("f", 10)
    rec.whole.add(2)
    rec.record(("f", 20), {"id": 1, "v": "a"}, {"id": 1, "v": "b"})
    assert (1,) in rec.changed and [e[2] for e in rec.events] == [-1, 1]
    rec.lows.pop(2)
    rec.prune()
    assert rec.whole == set()
    rec.record(("f", 30), None, {"id": 2, "v": "c"})
    assert (2,) in rec.changed and len(rec.events) == 2  # no more events once no whole read is in flight


def test_a_failover_voids_chunks_read_on_the_old_server_and_compares_the_new_binlog() -> None:
    """After a change of server resumed by GTID (``_rebase``), the positions are another binlog's:
    a chunk read on the old server is read again ("redo", at once: its position, past anything the
    new binlog's start reaches, is never waited for), a reader connected before reads on a new
    connection, and a chunk read on the new server follows the chunk rule in the new binlog."""
    from capturer.regions.mysql.snapshot import MySQLSnapshotter
    from capturer.regions.snapshot import ServerChanged

    r, q = make_region()
    plan = plan_of(at=Position("b.000009", 100))
    r.add_snapshot_progress((TableProgress("d", "t", "run1", "running"),), wait=True)
    r.position = Position("b.000009", 400, "0-1-10", r.snap_progress)
    gen0, cfg0, _ = r.snapshot_server()
    tok = r.chunk_begin(plan)
    old = Chunk(plan, Position("b.000009", 500), [{"id": 1, "v": 0}], (plan.key_signature(), 1), False, 0,
                "run1", gen=gen0)
    r._rebase(Position("b.000001", 4, "0-1-10"))  # (the new binlog's names sort before the old one's)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(r.emit_chunk(old)), daemon=True)
    t.start()
    t.join(5)
    assert got == ["redo"]
    r.chunk_end(plan, tok)
    gen1, cfg1, _ = r.snapshot_server()
    assert gen1 == gen0 + 1 and cfg1 is cfg0
    s = MySQLSnapshotter(r, 1, 10)
    reader = type("R", (), {"gen": gen0})()
    with pytest.raises(ServerChanged):
        s.check_reader(reader)
    reader.gen = gen1
    assert s.check_reader(reader) == gen1
    # the new server's chunk, read at b.000001:300; a change of key 1 after it, at b.000001:350
    plan2 = plan_of(at=Position("b.000001", 4))
    tok = r.chunk_begin(plan2)
    new = Chunk(plan2, Position("b.000001", 300), [{"id": 1, "v": 0}, {"id": 2, "v": 0}],
                (plan2.key_signature(), 2), True, 0, "run1", gen=gen1)
    with r._lock:
        p = Position("b.000001", 350, "0-1-11", r.snap_progress)
        txn = Txn("r1", r.clock.commit(1, p), p, (RowChange(SCHEMA, "update", {"id": 1, "v": 0}, {"id": 1, "v": 1}),))
        r._record(txn)
        r._emit(txn)
        r.position = p
    out = r.emit_chunk(new)
    r.chunk_end(plan2, tok)
    assert isinstance(out, TableProgress) and out.state == "done"
    assert sink(drain(q)) == {1: {"id": 1, "v": 1}, 2: {"id": 2, "v": 0}}


def test_chunk_rows_from_tuples_are_the_row_dicts() -> None:
    """A chunk's rows are read as tuples (its columns, then maybe the key selected again) and made dicts of
    the columns in order, each value fixed where its normalizer says: the same as one dict per row by hand."""
    from capturer.regions.mysql.snapshot import make_rows, normalizers, row_maker

    names = ["id", "bits", "s"]
    raw = [(i, b"\x01" if i % 2 else None, f"v{i}", i) for i in range(50)]  # (the key again at the end)
    plain = make_rows(raw, names, [None, None, None])
    assert plain == [{"id": r[0], "bits": r[1], "s": r[2]} for r in raw]
    assert all(list(d) == names for d in plain)
    cols = [Column("id", "int", "int(11)", 10, 0, False, False), Column("bits", "bit", "bit(3)", 3, 0, False, True),
            Column("s", "varchar", "varchar(8)", 0, 0, False, True)]
    p = TablePlan("d", "t", cols, ("id",), TableSchema("d", "t", tuple(names), ("id",), (), (3, 16, 15)))
    norm = normalizers(p, "mariadb")
    assert norm[0] is None and norm[1] is not None and norm[2] is None
    fixed = make_rows(raw, names, norm)
    assert fixed == list(map(row_maker(names, norm), raw))
    assert [d["bits"] for d in fixed[:2]] == [None, "001"]
    assert make_rows([], names, norm) == []


def test_a_zero_timestamp_is_read_as_null_as_the_binlog_decoder_gives_it() -> None:
    """SELECT reads a TIMESTAMP as UNIX_TIMESTAMP(...): 0 (an int, or a Decimal with a fraction) is the zero
    TIMESTAMP '0000-00-00 00:00:00', a date no calendar has: None, as the binlog decoder gives it (it arrived
    as 1970-01-01 00:00:00, below the type's range, until 2026-11-29); 1 s is 1970-01-01 00:00:01."""
    import datetime as dt
    import decimal

    from capturer.regions.mysql.snapshot import normalizers

    cols = [Column("id", "int", "int(11)", 10, 0, False, False), Column("ts", "timestamp", "timestamp(6)", 0, 6, False, True)]
    p = TablePlan("d", "t", cols, ("id",), TableSchema("d", "t", ("id", "ts"), ("id",), (), (3, 17)))
    for driver in ("pymysql", "mariadb"):
        f = normalizers(p, driver)[1]
        assert f is not None
        assert [f(v) for v in (0, decimal.Decimal("0.000000"), None)] == [None, None, None]
        assert f(decimal.Decimal("1.000001")) == dt.datetime(1970, 1, 1, 0, 0, 1, 1)
        assert f(2147483647) == dt.datetime(2038, 1, 19, 3, 14, 7)


def test_a_run_whose_unfinished_tables_all_went_to_a_newer_run_leaves_the_positions() -> None:
    """A run with d.k done and d.t still running: a request of d.t (a newer run) takes
    d.t over; the old run has nothing left to copy and leaves the positions, as when its
    last table is done (its done d.k stayed in every checkpoint for good before)."""
    r, _ = make_region()
    r.add_snapshot_progress((TableProgress("d", "k", "run1", "done"), TableProgress("d", "t", "run1", "running"),
                             TableProgress("d", "u", "run2", "done"), TableProgress("d", "v", "run2", "pending")),
                            wait=True)
    r.add_snapshot_progress((TableProgress("d", "t", "run3", "pending", truncate=True),), wait=True)
    assert [(p.table, p.run) for p in r.snap_progress] == [("u", "run2"), ("v", "run2"), ("t", "run3")]
    assert r.position is not None and [p.table for p in r.position.snapshot] == ["u", "v", "t"]


def test_integer_zerofill_columns_are_read_as_unsigned_numbers() -> None:
    """MariaDB Connector/Python 1.1 fails on an integer ZEROFILL column's values (a SystemError on 0): the
    snapshot reads them, and a chunk key of them, as CAST(... AS UNSIGNED); other columns as they are."""
    from capturer.regions.mysql.snapshot import MySQLPlan

    cols = [Column("id", "int", "int(6) unsigned zerofill", 10, 0, False, False),
            Column("z", "bigint", "bigint(20) unsigned zerofill", 20, 0, False, True),
            Column("d", "decimal", "decimal(10,2) unsigned zerofill", 10, 2, False, True),
            Column("n", "int", "int(11)", 10, 0, False, True)]
    p = MySQLPlan("d", "t", cols, ("id",), TableSchema("d", "t", ("id", "z", "d", "n"), ("id",), (), (3, 8, 246, 3)))
    assert p.select_list() == "CAST(`id` AS UNSIGNED), CAST(`z` AS UNSIGNED), `d`, `n`"
    assert p.key_select() == "CAST(`id` AS UNSIGNED)"
