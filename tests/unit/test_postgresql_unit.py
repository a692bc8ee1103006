"""PostgreSQL regions without a server: pgoutput parsing (messages built by hand
from the protocol documentation), type mapping, DDL derivation, the relation
journal, LSN positions and lifts, config."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from capturer.app import load_config
from capturer.errors import CheckpointError, ConfigError
from capturer.model import LsnPosition, format_lsn, parse_lsn, position_from_json, ts_logical, ts_physical_ms
from capturer.regions.clock import LiftJournal, RegionClock
from capturer.regions.postgresql import pgoutput as po
from capturer.regions.postgresql import types as T
from capturer.regions.postgresql.region import PostgresRegion, commit_tso
from capturer.regions.postgresql.relations import _PG_C, RelationJournal, RelDef, align_attnums, ddl_for, uk_name


def s(text: str) -> bytes:
    return text.encode() + b"\0"


def tup(*cols: tuple[str, str | None]) -> bytes:
    out = struct.pack(">h", len(cols))
    for kind, text in cols:
        out += kind.encode()
        if kind == "t":
            b = text.encode()  # type: ignore[union-attr]
            out += struct.pack(">i", len(b)) + b
    return out


def test_begin_commit_relation() -> None:
    b = po.parse(b"B" + struct.pack(">Qqi", 0x16B374D848, 789, 42))
    assert b == po.Begin(0x16B374D848, 789, 42)
    c = po.parse(b"C" + struct.pack(">bQQq", 0, 10, 20, 30))
    assert c == po.Commit(0, 10, 20, 30)
    rel = po.parse(b"R" + struct.pack(">I", 16384) + s('we"ird') + s("t é") + b"d" + struct.pack(">h", 2)
                   + b"\x01" + s("id") + struct.pack(">Ii", 23, -1) + b"\x00" + s("v") + struct.pack(">Ii", 1043, 44))
    assert rel == po.Relation(16384, 'we"ird', "t é", "d", (po.Column("id", 23, -1, True), po.Column("v", 1043, 44, False)))


def test_row_messages_and_tuple_kinds() -> None:
    ins = po.parse(b"I" + struct.pack(">I", 7) + b"N" + tup(("t", "1"), ("n", None), ("u", None)))
    assert ins == po.Insert(7, (("t", "1"), ("n", None), ("u", None)))
    upd = po.parse(b"U" + struct.pack(">I", 7) + b"K" + tup(("t", "1"), ("n", None)) + b"N" + tup(("t", "2"), ("t", "x")))
    assert upd.old_kind == "K" and upd.old == (("t", "1"), ("n", None)) and upd.new == (("t", "2"), ("t", "x"))
    plain = po.parse(b"U" + struct.pack(">I", 7) + b"N" + tup(("t", "2")))
    assert plain.old is None and plain.old_kind == ""
    full = po.parse(b"U" + struct.pack(">I", 7) + b"O" + tup(("t", "1")) + b"N" + tup(("t", "2")))
    assert full.old_kind == "O"
    dele = po.parse(b"D" + struct.pack(">I", 7) + b"O" + tup(("t", "é")))
    assert dele == po.Delete(7, (("t", "é"),), "O")
    tr = po.parse(b"T" + struct.pack(">ib", 2, 3) + struct.pack(">II", 5, 6))
    assert tr == po.Truncate((5, 6), True, True)
    assert po.parse(b"Y" + struct.pack(">I", 99) + s("public") + s("mood")) == po.TypeMsg(99, "public", "mood")
    assert po.parse(b"O" + struct.pack(">Q", 1) + s("origin")) == po.Other("O")


@pytest.mark.parametrize("raw", [b"", b"B\x00", b"I" + struct.pack(">I", 7) + b"X", b"D" + struct.pack(">I", 1) + b"N",
                                 b"I" + struct.pack(">I", 7) + b"N" + struct.pack(">h", 1) + b"t" + struct.pack(">i", 9) + b"ab",
                                 b"I" + struct.pack(">I", 7) + b"N" + struct.pack(">h", 1) + b"z",
                                 b"R" + struct.pack(">I", 1) + b"no terminator"])
def test_malformed_messages_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(po.ProtocolError):
        po.parse(raw)


def test_type_mapping_and_values() -> None:
    assert T.pg_type(T.BOOL, -1).parse("t") == 1 and T.pg_type(T.BOOL, -1).parse("f") == 0
    assert T.pg_type(T.INT8, -1).parse("-9223372036854775808") == -(1 << 63)
    num = T.pg_type(T.NUMERIC, ((12 << 16) | 2) + 4)
    assert (num.sql, num.code, num.precision, num.scale) == ("DECIMAL(12,2)", 246, 12, 2)
    assert num.parse("-0.01") == decimal.Decimal("-0.01")
    wide = T.pg_type(T.NUMERIC, -1)
    assert wide.sql == "LONGTEXT" and wide.parse("1" + "0" * 100) == decimal.Decimal("1" + "0" * 100)
    for bad, t in (("NaN", T.NUMERIC), ("NaN", T.FLOAT8), ("-Infinity", T.FLOAT4), ("infinity", T.DATE),
                   ("0044-03-15 BC", T.DATE), ("-infinity", T.TIMESTAMPTZ), ("2024-01-01 00:00:00 BC", T.TIMESTAMP)):
        with pytest.raises(T.Unrepresentable):
            T.pg_type(t, -1).parse(bad)
    assert T.pg_type(T.BYTEA, -1).parse("\\x00ff") == b"\x00\xff"
    assert T.pg_type(T.BYTEA, -1).parse("a\\\\b\\001") == b"a\\b\x01"  # bytea_output = escape
    assert T.pg_type(T.TIME, -1).parse("24:00:00") == dt.timedelta(hours=24)
    assert T.pg_type(T.TIME, -1).parse("01:02:03.5") == dt.timedelta(hours=1, minutes=2, seconds=3, microseconds=500000)
    assert T.pg_type(T.TIMESTAMPTZ, -1).parse("2024-01-02 03:04:05.123456+05:30") == \
        dt.datetime(2024, 1, 1, 21, 34, 5, 123456)
    assert T.pg_type(T.TIMESTAMP, -1).parse("2024-01-02 03:04:05") == dt.datetime(2024, 1, 2, 3, 4, 5)
    assert T.pg_type(T.DATE, -1).parse("2024-02-29") == dt.date(2024, 2, 29)
    bit = T.pg_type(T.BIT, 8)
    assert bit.code == 16 and bit.sql == "BIT(8)" and bit.parse("00000101") == "00000101"
    assert T.pg_type(T.VARCHAR, 44).sql == "VARCHAR(40)"
    assert T.pg_type(T.VARCHAR, 5004).sql == "LONGTEXT" and T.pg_type(T.VARCHAR, 5004).key_sql == "VARCHAR(255)"
    assert T.pg_type(T.NUMERIC, ((40 << 16) | 35) + 4).sql == "LONGTEXT"  # scale past MySQL's 30
    assert T.pg_type(T.BPCHAR, 9).sql == "VARCHAR(5)" and T.pg_type(T.BPCHAR, 9).parse("ab   ") == "ab   "
    assert T.pg_type(T.JSONB, -1).code == 245 and T.pg_type(T.UUID, -1).sql == "CHAR(36)"
    arr = T.pg_type(1007, -1)  # int4[]
    assert arr.sql == "LONGTEXT" and arr.key_sql == "VARCHAR(255)" and arr.parse("{1,2}") == "{1,2}"
    assert T.pg_type(T.BYTEA, -1).column_info().binary


def rel(cols: list[tuple[str, int, int, bool]], pk: tuple[str, ...] = ("id",), name: str = "t", uks=(),
        relid: int = 1) -> RelDef:
    return RelDef(relid, "s`x", name, "d", tuple(po.Column(*c) for c in cols), pk, uks)


def test_ddl_create_alter_rename() -> None:
    r1 = rel([("id", T.INT4, -1, True), ("code", T.TEXT, -1, False), ("v", T.TEXT, -1, False)], uks=(("code",),))
    stmts = ddl_for(None, r1)
    assert stmts[0] == ("s`x", "CREATE DATABASE IF NOT EXISTS `s``x`", "")
    create = stmts[1][1]
    assert "`id` INT NOT NULL" in create and "`code` VARCHAR(255) COLLATE utf8mb4_nopad_bin NULL" in create and "`v` LONGTEXT NULL" in create
    assert "PRIMARY KEY (`id`)" in create and f"UNIQUE KEY `{uk_name(('code',))}` (`code`)" in create
    r2 = rel([("id", T.INT4, -1, True), ("code", T.TEXT, -1, False), ("w", T.TEXT, -1, False)], uks=(("code",),))
    assert ddl_for(r1, r2) == [("s`x", "ALTER TABLE `s``x`.`t` CHANGE COLUMN `v` `w` LONGTEXT NULL", "t")]
    r3 = rel([("id", T.INT8, -1, True), ("code", T.TEXT, -1, False), ("n", T.INT4, -1, False)], uks=(("code",),))
    (_, sql, _), = ddl_for(r2, r3, {"n": "42"})
    assert sql == ("ALTER TABLE `s``x`.`t` DROP COLUMN `w`, MODIFY COLUMN `id` BIGINT NOT NULL, "
                   "ADD COLUMN `n` INT NULL DEFAULT 42")
    r4 = rel([("id", T.INT8, -1, True), ("code", T.TEXT, -1, False), ("n", T.INT4, -1, False)], name="t2",
             uks=(("code",),))
    assert ddl_for(r3, r4) == [("s`x", "RENAME TABLE `s``x`.`t` TO `s``x`.`t2`", "t2")]
    assert ddl_for(r4, r4) == []
    r5 = rel([("id", T.INT8, -1, True), ("code", T.TEXT, -1, True), ("n", T.INT4, -1, False)], pk=("id", "code"),
             name="t2")
    # the unique key goes, the primary key changes; code stays a key column (NOT NULL now)
    assert ddl_for(r4, r5)[-1][1] == (
        f"ALTER TABLE `s``x`.`t2` DROP INDEX `{uk_name(('code',))}`, DROP PRIMARY KEY, "
        "MODIFY COLUMN `code` VARCHAR(255) COLLATE utf8mb4_nopad_bin NOT NULL, ADD PRIMARY KEY (`id`, `code`)")
    # a text column that becomes a key gets an indexable type; one that leaves every key gets its own back
    r6 = rel([("id", T.INT8, -1, True), ("code", T.TEXT, -1, False), ("n", T.TEXT, -1, False)], name="t2",
             uks=(("n",),))
    r7 = rel([("id", T.INT8, -1, True), ("code", T.TEXT, -1, False), ("n", T.TEXT, -1, False)], name="t2")
    assert ddl_for(r6, r7)[-1][1] == (f"ALTER TABLE `s``x`.`t2` DROP INDEX `{uk_name(('n',))}`, "
                                      "MODIFY COLUMN `n` LONGTEXT NULL")
    assert ddl_for(r7, r6)[-1][1] == ("ALTER TABLE `s``x`.`t2` MODIFY COLUMN `n` VARCHAR(255) COLLATE utf8mb4_nopad_bin NULL, "
                                      f"ADD UNIQUE KEY `{uk_name(('n',))}` (`n`)")


def _cols(*names: str, typ: int = T.TEXT) -> tuple[po.Column, ...]:
    return tuple(po.Column(n, T.INT4 if n == "id" else typ, -1, n == "id") for n in names)


def test_align_attnums_from_a_catalog_newer_than_the_message() -> None:
    """The attnum of each column of a relation message, read from the catalog as it is now: a column
    renamed or dropped since is placed by the attributes around it; one renamed since the message and
    nothing after it (the last added column) by the live attributes after the last known one."""
    cat = [(1, "id", False, T.INT4), (2, "........pg.dropped.2........", True, 0), (3, "b renamed", False, T.TEXT),
           (4, "c", False, T.TEXT), (5, "d later", False, T.TEXT), (6, "e", False, T.TEXT)]
    # as sent before a was dropped and b, d renamed (and e added)
    assert align_attnums(_cols("id", "a", "b", "c", "d"), cat) == (1, 2, 3, 4, 5)
    # as sent after a was dropped: b and d renamed since
    assert align_attnums(_cols("id", "b", "c", "d"), cat) == (1, 3, 4, 5)
    assert align_attnums(_cols("id", "b renamed", "c", "d later", "e"), cat) == (1, 3, 4, 5, 6)
    # two columns for one live attribute and one dropped: which is which is not known when another was
    # dropped before (three candidates, two columns): left unknown
    cat2 = [(1, "id", False, T.INT4), (2, "x", True, 0), (3, "y", True, 0), (4, "z2", False, T.TEXT),
            (5, "c", False, T.TEXT)]
    assert align_attnums(_cols("id", "y", "z", "c"), cat2) == (1, 0, 0, 5)
    # a type that does not fit is no match; a table dropped since (no catalog): nothing known
    assert align_attnums(_cols("id", "b", typ=T.INT8), cat)[1] == 0
    assert align_attnums(_cols("id", "b"), []) == (0, 0)
    # sent before v was dropped and added again under its name (now after w): v is the dropped attribute
    cat3 = [(1, "id", False, T.INT4), (2, "........pg.dropped.2........", True, 0), (3, "w", False, T.TEXT),
            (4, "v", False, T.TEXT)]
    assert align_attnums(_cols("id", "v", "w"), cat3) == (1, 2, 3)
    assert align_attnums(_cols("id", "w", "v"), cat3) == (1, 3, 4)
    # sent between DROP/ADD c and DROP/ADD b, read after both: both ways place three; the definition before
    # (b at 3) keeps b where it was and agrees more (before: b at the new b's 6, its DROP and ADD too early)
    cat4 = [(1, "id", False, T.INT4), (2, "a", False, T.TEXT), (3, "........pg.dropped.3........", True, 0),
            (4, "........pg.dropped.4........", True, 0), (5, "c", False, T.TEXT), (6, "b", False, T.TEXT)]
    known = RelDef(1, "s", "t", "d", _cols("id", "a", "b", "c"), ("id",), (), (1, 2, 3, 4))
    assert align_attnums(_cols("id", "a", "b", "c"), cat4) == (1, 2, 6, 0)
    assert align_attnums(_cols("id", "a", "b", "c"), cat4, known) == (1, 2, 3, 5)
    assert align_attnums(_cols("id", "a", "c", "b"), cat4, known) == (1, 2, 5, 6)


def test_same_shape_tells_a_column_dropped_and_added_under_its_name() -> None:
    """The relation message after ``DROP COLUMN w; ADD COLUMN w`` of the last column is the one before it;
    only the attnum differs. Before, same_shape said nothing changed: no DDL, and rows there kept their
    old values of w downstream (NULL in the source)."""
    def r(nums: tuple[int, ...]) -> RelDef:
        return RelDef(1, "s", "t", "d", _cols("id", "v", "w"), ("id",), (), nums)

    assert r((1, 2, 3)).same_shape(r((1, 2, 3))) and r((1, 2, 3)).same_shape(r(()))
    assert r((1, 2, 0)).same_shape(r((1, 2, 4)))  # (not known on one side: the names decide)
    assert not r((1, 2, 3)).same_shape(r((1, 2, 4)))
    assert [x[1] for x in ddl_for(r((1, 2, 3)), r((1, 2, 4)))] == [
        "ALTER TABLE `s`.`t` DROP COLUMN `w`", "ALTER TABLE `s`.`t` ADD COLUMN `w` LONGTEXT NULL"]


def test_ddl_for_by_attnum_a_rename_with_other_changes() -> None:
    """Before, a rename was told only when it was the one change between two relation messages:
    a DROP COLUMN and a RENAME COLUMN before the next row change sent DROP + ADD, and every row
    lost the renamed column's values downstream (NULL in the target, the file, the lake)."""
    def r(names: tuple[str, ...], nums: tuple[int, ...]) -> RelDef:
        return RelDef(1, "s", "t", "d", _cols(*names), ("id",), (), nums)

    old = r(("id", "a,b", "tick`q", "n"), (1, 2, 3, 4))
    new = r(("id", "tick`q re.named", "n", "added"), (1, 3, 4, 5))
    assert ddl_for(old, new, {"added": "7"}) == [("s", "ALTER TABLE `s`.`t` DROP COLUMN `a,b`, CHANGE COLUMN "
                                                 "`tick``q` `tick``q re.named` LONGTEXT NULL, ADD COLUMN `added` "
                                                 "LONGTEXT NULL DEFAULT 7", "t")]
    # a column dropped and another added under its name is no rename; a rename onto a dropped column's name is one
    # (the ADD in a statement of its own: the lake and the file's replay read a statement's ADDs first)
    assert [x[1] for x in ddl_for(r(("id", "a"), (1, 2)), r(("id", "a"), (1, 3)), {"a": "'d'"})] == [
        "ALTER TABLE `s`.`t` DROP COLUMN `a`", "ALTER TABLE `s`.`t` ADD COLUMN `a` LONGTEXT NULL DEFAULT 'd'"]
    assert [x[1] for x in ddl_for(r(("id", "a", "b"), (1, 2, 3)), r(("id", "c", "a"), (1, 2, 4)))] == [
        "ALTER TABLE `s`.`t` DROP COLUMN `b`, CHANGE COLUMN `a` `c` LONGTEXT NULL",
        "ALTER TABLE `s`.`t` ADD COLUMN `a` LONGTEXT NULL"]
    assert ddl_for(r(("id", "a", "b"), (1, 2, 3)), r(("id", "a"), (1, 3)))[0][1] == \
        "ALTER TABLE `s`.`t` DROP COLUMN `a`, CHANGE COLUMN `b` `a` LONGTEXT NULL"
    # a journal from before attnums: the old rule (one column renamed in place)
    assert RelDef.from_json(old.to_json()) == old and "attnums" not in RelDef.from_json(
        {**old.to_json(), "attnums": []}).to_json()
    assert ddl_for(r(("id", "a"), ()), r(("id", "b"), ()))[0][1] == "ALTER TABLE `s`.`t` CHANGE COLUMN `a` `b` LONGTEXT NULL"


def test_relation_journal_state_at_prune_and_torn_line(tmp_path: Path) -> None:
    p = tmp_path / "j"
    j = RelationJournal(p)
    a = rel([("id", T.INT4, -1, True)])
    b = rel([("id", T.INT4, -1, True), ("x", T.TEXT, -1, False)])
    j.record(100, a)
    j.record(200, b)
    assert RelationJournal(p).state_at(150) == {1: a}
    assert RelationJournal(p).state_at(200)[1].columns == b.columns
    assert RelationJournal(p).state_at(99) == {}
    j.prune(250)
    assert len(p.read_text().splitlines()) == 1 and RelationJournal(p).state_at(250)[1].columns == b.columns
    with open(p, "a") as f:
        f.write('{"lsn": "0/1", "rel": {"relid"')  # torn by kill -9
    assert RelationJournal(p).state_at(300)[1].columns == b.columns
    p.write_text('garbage\n{"lsn": "0/1", "rel": {}}\n')
    with pytest.raises(CheckpointError, match=":1: corrupt relation journal"):
        RelationJournal(p)


def test_lsn_positions_and_lifts(tmp_path: Path) -> None:
    assert format_lsn(0x16B374D848) == "16/B374D848" and parse_lsn("16/B374D848") == 0x16B374D848
    for bad in ("", "16", "x/1", "123456789/0", None, -1, True):
        with pytest.raises(ValueError):
            parse_lsn(bad)
    p = LsnPosition(0x16B374D848)
    assert position_from_json(json.loads(json.dumps(p.to_json()))) == p
    assert LsnPosition(1) < LsnPosition(2)
    j = LiftJournal(tmp_path / "lifts")
    clock = RegionClock("pg", 0, j)
    promise = clock.heartbeat(2_000_000_000_000)  # a promise in 2033
    ts = clock.commit(1, LsnPosition(500), commit_tso(0))  # a commit of 2000 arrives after it: lifted, journaled
    assert ts > promise and clock.lifts == 1
    again = RegionClock("pg", 0, LiftJournal(tmp_path / "lifts"))
    assert again.commit(1, LsnPosition(500), commit_tso(0)) == ts  # a replay gives the same commit_ts
    j.prune({"pg": LsnPosition(500)})
    assert LiftJournal(tmp_path / "lifts").entries("pg") == []


def test_commit_tso_keeps_microsecond_order() -> None:
    a, b = commit_tso(1_000_000_000_000_001), commit_tso(1_000_000_000_000_002)
    assert a < b and ts_physical_ms(a) == ts_physical_ms(b)
    unix_ms = (1_000_000_000_000_001 + 946_684_800_000_000) // 1000
    assert ts_physical_ms(a) == unix_ms and ts_logical(commit_tso(999)) == 999 << 8


def write_cfg(tmp: Path, region: str) -> Path:
    (tmp / "s.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp / 'o.jsonl'}\n")
    cfg = tmp / "c.cfg"
    cfg.write_text(f"[global]\nsenderConfig={tmp / 's.cfg'}\nfilterRuleDict=\n{region}")
    return cfg


def test_config_defaults_and_errors(tmp_path: Path) -> None:
    c = load_config(write_cfg(tmp_path, "[region:Pg-1]\ntype=postgresql\nhost=h\nuser=u\npassword=secret\ndbname=d\n"))
    r = c.regions[0]
    assert (r.slot, r.publication, r.port, r.create_slot, r.create_publication) == \
        ("capturer_pg_1", "capturer_pg_1", 5432, True, "no")
    assert "secret" not in json.dumps(c.masked())
    for body, want in (("slot=Bad-Name\n", "slot"), ("create_publication=public\n", "create_publication"),
                       ("", "dbname")):
        text = "[region:p]\ntype=postgresql\nhost=h\nuser=u\n" + ("dbname=d\n" if want != "dbname" else "") + body
        with pytest.raises(ConfigError, match=want):
            load_config(write_cfg(tmp_path, text))
    two = ("[region:a]\ntype=postgresql\nhost=h\nuser=u\ndbname=d\nslot=s\n"
           "[region:b]\ntype=postgresql\nhost=h\nuser=u\ndbname=d\nslot=s\n")
    with pytest.raises(ConfigError, match="same replication slot 's'"):
        load_config(write_cfg(tmp_path, two))
    ok = load_config(write_cfg(tmp_path, "[region:p]\ntype=postgresql\nhost=h\nuser=u\ndbname=d\n"
                                         "create_publication=public.a, s.b\n"))
    assert ok.regions[0].create_publication == "public.a,s.b"


def test_probe_at_a_wal_page_start_is_the_previous_record_end() -> None:
    """pg_current_wal_insert_lsn() at a page start points past the page header; the
    stream reports record ends, so the probe must be the page boundary itself (else an
    idle server would never resolve it and heartbeats would stop)."""
    from capturer.regions.postgresql.region import PostgresRegion

    r = PostgresRegion.__new__(PostgresRegion)
    r._block, r._segment = 8192, 16 << 20
    assert r._record_boundary(5 * 8192 + 24) == 5 * 8192
    assert r._record_boundary(3 * (16 << 20) + 40) == 3 * (16 << 20)
    assert r._record_boundary(5 * 8192 + 100) == 5 * 8192 + 100
    assert r._record_boundary(5 * 8192) == 5 * 8192


def test_snapshot_visibility_by_transaction_id_across_the_32_bit_wrap() -> None:
    """A chunk's read sees a transaction when it committed before the read's snapshot:
    below xmin, or below xmax and not in progress; pgoutput's 32-bit ids are placed
    next to the snapshot's 64-bit ones (also right after a wrap of the low 32 bits)."""
    from capturer.regions.postgresql.snapshot import PgSnapshot

    s = PgSnapshot.parse("100:110:103,107")
    assert s.visible(99) and s.visible(100) and s.visible(105)
    assert not s.visible(103) and not s.visible(107)
    assert not s.visible(110) and not s.visible(500)  # began after the snapshot
    assert s.in_progress32() == {103, 107}
    epoch = 5 << 32
    w = PgSnapshot.parse(f"{epoch - 10}:{epoch + 3}:{epoch - 2},{epoch + 1}")
    assert w.visible(0xFFFFFFF7) and w.visible(0) and w.visible(2)  # before and after the wrap
    assert not w.visible(0xFFFFFFFE) and not w.visible(1)  # in progress on both sides of it
    assert not w.visible(3) and not w.visible(4)
    assert w.in_progress32() == {0xFFFFFFFE, 1}


def test_a_delivered_transaction_the_snapshot_does_not_see_makes_the_chunk_read_again() -> None:
    """Transactions the stream delivered before a chunk began must be visible to the
    chunk's read: one still in progress for its snapshot, or at or past its xmax (a
    synchronous standby holding every commit: nothing completed after it, so it is not
    in the in-progress list), makes the chunk be read again; one delivered after the
    chunk began does not (the chunk's rules take it into account)."""
    import threading
    from types import SimpleNamespace

    from capturer.regions.postgresql.region import PostgresRegion
    from capturer.regions.postgresql.snapshot import PgSnapshot

    host = SimpleNamespace(_lock=threading.Condition(), _recent_xids={90: 1000, 103: 1100})
    check = PostgresRegion.delivered_unseen
    s = PgSnapshot.parse("100:110:103")
    assert check(host, s, (1100,))  # 103 delivered at 1100 <= the chunk's start, in progress for s
    assert not check(host, s, (1050,))  # delivered after the chunk began: fine
    host._recent_xids[110] = 1200  # at xmax: not in the in-progress list, not visible either
    assert check(host, PgSnapshot.parse("100:110:"), (1300,))
    assert not check(host, PgSnapshot.parse("100:111:"), (1300,))  # all visible now


# --- the C tuple decoder (capturer/_native/ pg_plan) against the Python path ---------------

_TYPED = [("id", T.INT4, -1, True), ("big", T.INT8, -1, False), ("txt", T.TEXT, -1, False),
          ("vc", T.VARCHAR, 44, False), ("ok", T.BOOL, -1, False), ("price", T.NUMERIC, ((12 << 16) | 2) + 4, False),
          ("wide", T.NUMERIC, -1, False), ("ts", T.TIMESTAMP, -1, False), ("tstz", T.TIMESTAMPTZ, -1, False),
          ("d", T.DATE, -1, False), ("f", T.FLOAT8, -1, False), ("raw", T.BYTEA, -1, False),
          ("tm", T.TIME, -1, False), ("doc", T.JSONB, -1, False), ("arr", 1007, -1, False), ("sm", T.INT2, -1, False)]

_ROWS: list[list[tuple[str, str | None]]] = [
    [("t", "1"), ("t", "-9223372036854775808"), ("t", "héllo \"q\" \\ ☃"), ("t", "x" * 40), ("t", "t"),
     ("t", "-1234567890.12"), ("t", "1" + "0" * 80 + ".5"), ("t", "2026-01-01 12:00:00.123456"),
     ("t", "2024-01-02 03:04:05.5+00"), ("t", "2024-02-29"), ("t", "1.5e300"), ("t", "\\x00ff"),
     ("t", "24:00:00"), ("t", '{"a": [1, 2]}'), ("t", "{1,2}"), ("t", "-32768")],
    # unrepresentable values (None, counted), other forms the parsers take, NULLs
    [("t", "2"), ("n", None), ("t", ""), ("n", None), ("t", "f"), ("t", "NaN"), ("t", "-Infinity"),
     ("t", "10000-01-01 00:00:00"), ("t", "2024-01-02 03:04:05.123456+05:30"), ("t", "0044-03-15 BC"),
     ("t", "NaN"), ("t", "a\\\\b\\001"), ("t", "01:02:03.5"), ("n", None), ("n", None), ("t", "0")],
    [("t", "3"), ("t", "0"), ("n", None), ("t", ""), ("n", None), ("t", "0.00"), ("t", "Infinity"),
     ("t", "infinity"), ("t", "-infinity"), ("t", "infinity"), ("t", "-Infinity"), ("t", "\\x"),
     ("t", "00:00:00"), ("t", "null"), ("t", "{}"), ("n", None)],
    [("t", "4"), ("t", "7"), ("t", "a"), ("t", "b"), ("t", "t"), ("t", "5"), ("t", "-0.000001"),
     ("t", "0001-01-01 00:00:00"), ("t", "9999-12-31 23:59:59.999999+00"), ("t", "0001-01-01"),
     ("t", "-0"), ("n", None), ("t", "838:59:59"), ("t", "[]"), ("t", "{NULL}"), ("t", "1")],
]


class _Region:
    """What PostgresRegion.image / _fast_change and _TxnBuilder.change use of a region."""

    where = "pg test"
    image = PostgresRegion.image
    _fast_change = PostgresRegion._fast_change

    def __init__(self) -> None:
        self.unrepresentable = 0
        self.ctx = SimpleNamespace(table_selected=lambda db, t: True)

    def fill_toast(self, rel: RelDef, row: dict, cols: list, tup: object) -> None:
        row.update({c: f"read {c}" for c in cols})


class _Changes(list):
    def append(self, ch, xid) -> None:  # type: ignore[override]
        super().append((ch, xid))


def _both(msg: bytes, r: RelDef) -> tuple[object, object]:
    """(the Python path's changes and count, the C path's), or the exception each raised."""
    from capturer.regions.postgresql.region import _TxnBuilder

    out = []
    for fast in (False, True):
        reg = _Region()
        b = SimpleNamespace(r=reg, changes=_Changes(), begin=SimpleNamespace(xid=9))
        buf = b"w" + bytes(24) + msg
        try:
            if fast:
                if not reg._fast_change(b, {r.relid: r}, buf, 25):
                    out.append("declined")
                    continue
            else:
                _TxnBuilder.change(b, r, po.parse(msg))
            out.append((list(b.changes), reg.unrepresentable))
        except Exception as e:  # (compared)
            out.append(type(e).__name__)
    return out[0], out[1]


@pytest.mark.skipif(_PG_C is None, reason="the C extension is not built")
def test_c_tuple_decoder_gives_what_the_python_path_gives() -> None:
    r = RelDef(7, "s", "t", "f", tuple(po.Column(*c) for c in _TYPED), ("id",))
    rid = struct.pack(">I", 7)
    for n, row in enumerate(_ROWS):
        other = _ROWS[(n + 1) % len(_ROWS)]
        for msg in (b"I" + rid + b"N" + tup(*row), b"D" + rid + b"O" + tup(*row),
                    b"D" + rid + b"K" + tup(row[0], *[("n", None)] * (len(row) - 1)),
                    b"U" + rid + b"N" + tup(*row), b"U" + rid + b"O" + tup(*other) + b"N" + tup(*row),
                    b"U" + rid + b"K" + tup(*other) + b"N" + tup(*row)):
            py, c = _both(msg, r)
            assert py == c, msg
            assert isinstance(py, tuple) and py[0], msg
    # a value of the first row, typed as the Python path types it, through C
    (ch, _), = _both(b"I" + rid + b"N" + tup(*_ROWS[0]), r)[1][0]
    assert ch.after["price"] == decimal.Decimal("-1234567890.12") and ch.after["ts"] == dt.datetime(2026, 1, 1, 12, 0, 0, 123456)
    assert ch.after["tstz"] == dt.datetime(2024, 1, 2, 3, 4, 5, 500000) and ch.after["big"] == -(1 << 63)
    # the counted unrepresentable values of the second row: numeric NaN and -Infinity, year 10000, a BC date, NaN
    assert _both(b"I" + rid + b"N" + tup(*_ROWS[1]), r)[1][1] == 5
    # unchanged TOASTed values: left to the general path (which takes them from the old row or reads them)
    upd = b"U" + rid + b"N" + tup(("t", "1"), *[("u", None)] * (len(_TYPED) - 1))
    assert _both(upd, r)[1] == "declined"
    # a value its parser refuses, a cut message, a binary value: the general path says what is wrong
    for bad in (b"I" + rid + b"N" + tup(("t", "x1"), *_ROWS[0][1:]),
                b"I" + rid + b"N" + tup(*_ROWS[0])[:-3],
                b"I" + rid + b"N" + struct.pack(">h", 1) + b"b" + struct.pack(">i", 1) + b"x",
                b"I" + rid + b"X" + tup(*_ROWS[0])):
        py, c = _both(bad, r)
        assert c == "declined" and py in ("FatalSourceError", "ProtocolError"), (bad, py)
    # a text that is not UTF-8 (surrogate escapes, as the Python path decodes it)
    raw = b"I" + rid + b"N" + struct.pack(">h", 3) + b"t" + struct.pack(">i", 1) + b"5" + b"n" + b"t" + \
        struct.pack(">i", 2) + b"\xff\xfe"
    py, c = _both(raw, r)
    assert py == c and c[0][0][0].after["txt"] == "\udcff\udcfe"


def test_timestamps_python_3_10_cannot_read_are_rewritten_to_forms_it_can() -> None:
    for text, want in (("2024-01-02 03:04:05.5", "2024-01-02 03:04:05.500000"),
                       ("2024-01-02 03:04:05.5+00", "2024-01-02 03:04:05.500000+00:00"),
                       ("2024-01-02 03:04:05-03", "2024-01-02 03:04:05-03:00"),
                       ("1900-01-01 00:00:00+05:53:28", "1900-01-01 00:00:00+05:53:28"),
                       ("2024-01-02 03:04:05.123456", "2024-01-02 03:04:05.123456"),
                       ("10000-01-01 00:00:00", "10000-01-01 00:00:00")):  # (a year past 9999: left alone)
        assert T._iso_for_310(text) == want
        if not text.startswith("10000"):
            assert dt.datetime.fromisoformat(want) == dt.datetime.fromisoformat(text)


def test_key_collation_named_as_the_target_names_it() -> None:
    """Text key columns are created with MariaDB's binary NO PAD collation; the MySQL sender names it as
    its target does (MySQL 8: utf8mb4_0900_bin; neither: utf8mb4_bin), asking the target once."""
    from types import SimpleNamespace

    from senders.mysql.sender import MySQLSender

    sql = ddl_for(None, RelDef(1, "s", "t", "d", _cols("id", "k"), ("id", "k"), (), (1, 2)))[1][1]
    assert "`k` VARCHAR(255) COLLATE utf8mb4_nopad_bin NOT NULL" in sql
    for have, want in ((["utf8mb4_nopad_bin"], "utf8mb4_nopad_bin"), (["utf8mb4_0900_bin"], "utf8mb4_0900_bin"),
                       ([], "utf8mb4_bin")):
        asked: list[str] = []
        cur = SimpleNamespace(execute=asked.append, fetchall=lambda have=have: [(c,) for c in have])
        s = SimpleNamespace(_NOPAD=MySQLSender._NOPAD, _nopad_as=None)
        got = MySQLSender._collated(s, cur, sql)  # type: ignore[arg-type]
        assert got == sql.replace("utf8mb4_nopad_bin", want) and len(asked) == 1
        assert MySQLSender._collated(s, cur, sql) == got and len(asked) == 1  # (asked once)
        assert MySQLSender._collated(s, cur, "ALTER TABLE t DROP COLUMN c") == "ALTER TABLE t DROP COLUMN c"
