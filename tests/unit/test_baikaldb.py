"""BaikalDB region pieces without servers: brpc JSON rules, row decoding of every
type (against the test double's encoder, written independently from the
protocol document), UPDATE pairing, DDL from schema differences, TSO,
positions and config."""

from __future__ import annotations

import datetime as dt
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capturer.app import load_config
from capturer.errors import ConfigError
from capturer.model import Position, TsPosition, position_from_json, protogen
from capturer.pipeline.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from capturer.regions.baikaldb import brpc_json
from capturer.regions.baikaldb.keys import BaikalRegionConfig
from capturer.regions.baikaldb.rows import (
    RowDecodeError,
    RowPlan,
    UnpairedUpdate,
    mutation_changes,
    pair_update,
    unpack_date,
    unpack_datetime,
    unpack_time,
)
from capturer.regions.baikaldb.schema import (
    FieldDef,
    TableDef,
    alter_table_sql,
    create_table_sql,
    transition_def,
)
from capturer.regions.baikaldb.tso import BASE_MS, from_unix_ms, to_commit_ts, unix_ms
from devtools.baikaldb_double.cluster import TYPES, Field, Table, encode_field


def pb():  # type: ignore[no-untyped-def]
    return protogen.load("baikaldb")


# --- brpc json2pb -------------------------------------------------------------------------

def test_json_out_follows_brpc_rules() -> None:
    res = pb().StoreRes(errcode=pb().NOT_LEADER, errmsg=b"not leader", leader="10.0.0.2:8110")
    d = brpc_json.to_json(res)
    assert d == {"errcode": "NOT_LEADER", "errmsg": "bm90IGxlYWRlcg==", "leader": "10.0.0.2:8110"}
    assert "binlogs" not in d and "commit_ts" not in d  # empty repeated fields are omitted
    res.commit_ts.append(33116086861824000)  # above 2^53: an exact JSON integer
    assert brpc_json.to_json(res)["commit_ts"] == [33116086861824000]


def test_json_in_accepts_names_numbers_digit_strings_and_ignores_unknown_keys() -> None:
    req = brpc_json.from_json({"op_type": 60, "region_id": "9001", "region_version": 1, "nonsense": [1],
                               "binlog_desc": {"binlog_ts": "33116086599000000", "read_binlog_cnt": 1000}},
                              pb().StoreReq())
    assert req.op_type == 60 and req.region_id == 9001 and req.binlog_desc.binlog_ts == 33116086599000000
    req2 = brpc_json.from_json({"op_type": "OP_READ_BINLOG", "region_id": 1, "region_version": 1}, pb().StoreReq())
    assert req2.op_type == 60


@pytest.mark.parametrize("body,msg", [
    ({"op_type": "OP_READ_BINLOG", "region_id": 1}, "Missing required field: region_version"),
    ({"op_type": "OP_READ_BINLOG", "region_id": 1, "region_version": 1, "binlog_desc": {}},
     "Missing required field: binlog_desc.binlog_ts"),
    ({"op_type": "NO_SUCH_OP", "region_id": 1, "region_version": 1}, "not a value of OpType"),
    ({"op_type": 60, "region_id": 1.5, "region_version": 1}, "expected an integer"),
    ({"op_type": 60, "region_id": True, "region_version": 1}, "boolean"),
    ({"op_type": 60, "region_id": 1 << 63, "region_version": 1}, "out of range"),
])
def test_json_in_errors(body: dict[str, object], msg: str) -> None:
    with pytest.raises(brpc_json.JsonPbError, match=msg):
        brpc_json.from_json(body, pb().StoreReq())


def test_bytes_are_base64_both_ways() -> None:
    res = brpc_json.from_json({"errcode": "SUCCESS", "binlogs": ["AAEC/w=="]}, pb().StoreRes())
    assert list(res.binlogs) == [b"\x00\x01\x02\xff"]
    with pytest.raises(brpc_json.JsonPbError, match="base64"):
        brpc_json.from_json({"errcode": "SUCCESS", "binlogs": ["%%%"]}, pb().StoreRes())


def test_lenient_enums_for_a_newer_server() -> None:
    ri = brpc_json.from_json({"region_id": 1, "table_id": 2, "partition_id": 0, "replica_num": 3, "version": 1,
                              "conf_version": 1, "status": "SOMETHING_NEW"}, pb().RegionInfo(), lenient_enums=True)
    assert not ri.HasField("status")


# --- rows -------------------------------------------------------------------------------------

ALL = [(name, t) for name, t in TYPES.items() if name not in ("NULL_TYPE",)]


def make_table(cols: list[tuple[str, str]], charset: int = 0) -> tuple[Table, TableDef]:
    fields = [Field(i + 1, n, TYPES[t]) for i, (n, t) in enumerate(cols)]
    t = Table(7, "db", "t", fields, [cols[0][0]], charset=charset)
    d = TableDef(7, "NS", "db", "t", 1, tuple(FieldDef(f.field_id, f.name, f.type) for f in fields),
                 (cols[0][0],), charset=charset)
    return t, d


def f32(v: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", v))[0])


def test_every_type_and_null_versus_zero() -> None:
    cols = [("id", "INT64"), ("i8", "INT8"), ("i16", "INT16"), ("i32", "INT32"), ("u8", "UINT8"),
            ("u16", "UINT16"), ("u32", "UINT32"), ("u64", "UINT64"), ("b", "BOOL"), ("f", "FLOAT"),
            ("d", "DOUBLE"), ("s", "STRING"), ("dt", "DATETIME"), ("ts", "TIMESTAMP"), ("day", "DATE"),
            ("tm", "TIME"), ("h", "HLL"), ("bm", "BITMAP"), ("j", "JSON")]
    t, d = make_table(cols)
    plan = RowPlan(d)
    row = {"id": -(1 << 63), "i8": -128, "i16": -32768, "i32": -(1 << 31), "u8": 255, "u16": 65535,
           "u32": (1 << 32) - 1, "u64": (1 << 64) - 1, "b": True, "f": 1.5, "d": -2.25e300, "s": "Bé'`\\\x00😀",
           "dt": dt.datetime(9999, 12, 31, 23, 59, 59, 999999), "ts": dt.datetime(2038, 1, 19, 3, 14, 7),
           "day": dt.date(1, 1, 1), "tm": -dt.timedelta(hours=838, minutes=59, seconds=59), "h": b"\x00\xff",
           "bm": b"", "j": '{"a": [1, 2]}'}
    got, unknown = plan.decode(t.encode(row))
    assert unknown == ()
    assert got == {**row, "b": 1}
    # absent = NULL; a present 0 / "" / false is a value
    zeros = {"id": 0, "i8": 0, "u64": 0, "b": False, "f": 0.0, "s": "", "h": b""}
    got, _ = plan.decode(t.encode(zeros))
    assert got == {c: None for c, _ in cols} | {**zeros, "b": 0}


def test_uint64_above_2_32_is_not_truncated() -> None:
    t, d = make_table([("id", "UINT64")])
    for v in (1 << 32, (1 << 32) + 5, 1 << 63, (1 << 64) - 1):
        assert RowPlan(d).decode(t.encode({"id": v}))[0] == {"id": v}


def test_packed_temporal_values() -> None:
    v = (2024 * 13 + 1) << 46 | 2 << 41 | 3 << 36 | 4 << 30 | 5 << 24
    assert unpack_datetime(v) == dt.datetime(2024, 1, 2, 3, 4, 5)
    assert unpack_datetime(0) is None  # zero date
    assert unpack_datetime((2024 * 13 + 2) << 46 | 30 << 41) is None  # 2024-02-30
    assert unpack_date((2024 * 13 + 12) << 5 | 31) == dt.date(2024, 12, 31)
    assert unpack_time(-((838 << 12) | (59 << 6) | 58)) == -dt.timedelta(hours=838, minutes=59, seconds=58)
    assert unpack_time(0) == dt.timedelta(0)


def test_gbk_and_undecodable_strings() -> None:
    t, d = make_table([("id", "INT32"), ("s", "STRING")], charset=1)
    assert RowPlan(d).decode(t.encode({"id": 1, "s": "中文"}))[0]["s"] == "中文"
    t8, d8 = make_table([("id", "INT32"), ("s", "STRING")])
    assert RowPlan(d8).decode(t8.encode({"id": 1, "s": b"\xff\xfe"}))[0]["s"] == b"\xff\xfe"


def test_unknown_dropped_and_mismatched_fields() -> None:
    t, d = make_table([("id", "INT32"), ("a", "STRING"), ("b", "INT64")])
    raw = t.encode({"id": 1, "a": "x", "b": 2})
    dropped = TableDef(7, "NS", "db", "t", 2, (FieldDef(1, "id", 5), FieldDef(2, "a", 13, deleted=True),
                                                FieldDef(3, "b", 6)), ("id",))
    assert RowPlan(dropped).decode(raw) == ({"id": 1, "b": 2}, ())
    older = TableDef(7, "NS", "db", "t", 0, (FieldDef(1, "id", 5), FieldDef(2, "a", 13)), ("id",))
    assert RowPlan(older).decode(raw) == ({"id": 1, "a": "x"}, (3,))
    retyped = TableDef(7, "NS", "db", "t", 3, (FieldDef(1, "id", 5), FieldDef(2, "a", 5), FieldDef(3, "b", 6)),
                       ("id",))
    plan = RowPlan(retyped)
    assert plan.decode(raw)[0] == {"id": 1, "a": "x", "b": 2}  # "a" still has its old wire type
    assert plan.mismatches == 1


@pytest.mark.parametrize("data", [b"\x08", b"\x12\x05ab", b"\x21\x00\x00", b"\x0b\x00", b"\x00\x01",
                                  b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"])
def test_malformed_rows_raise(data: bytes) -> None:
    _, d = make_table([("id", "INT32"), ("s", "STRING"), ("d", "DOUBLE"), ("x", "INT64")])
    plan = RowPlan(d)
    with pytest.raises(RowDecodeError):
        plan.decode(data)
    with pytest.raises(RowDecodeError):
        plan.decode_py(data)


_values = {
    "INT8": st.integers(-128, 127), "INT16": st.integers(-32768, 32767),
    "INT32": st.integers(-(1 << 31), (1 << 31) - 1), "INT64": st.integers(-(1 << 63), (1 << 63) - 1),
    "UINT8": st.integers(0, 255), "UINT16": st.integers(0, 65535), "UINT32": st.integers(0, (1 << 32) - 1),
    "UINT64": st.integers(0, (1 << 64) - 1), "BOOL": st.booleans().map(int),
    "FLOAT": st.floats(width=32, allow_nan=False), "DOUBLE": st.floats(allow_nan=False),
    "STRING": st.text(), "DATETIME": st.datetimes(min_value=dt.datetime(1, 1, 1)),
    "TIMESTAMP": st.datetimes(min_value=dt.datetime(1970, 1, 1, 0, 0, 1), max_value=dt.datetime(2106, 2, 7)).map(
        lambda t: t.replace(microsecond=0)),
    "DATE": st.dates(), "TIME": st.integers(-(838 * 3600 + 3599), 838 * 3600 + 3599).map(
        lambda s: dt.timedelta(seconds=s)),
    "HLL": st.binary(), "JSON": st.text(),
}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_decoder_roundtrips_the_doubles_encoder(data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(sorted(_values)), min_size=1, max_size=8))
    cols = [(f"c{i}", n) for i, n in enumerate(names)]
    t, d = make_table(cols)
    row = {c: data.draw(st.none() | _values[n]) for c, n in cols}
    got, unknown = RowPlan(d).decode(t.encode(row))
    py, _ = RowPlan(d).decode_py(t.encode(row))
    assert got == py  # C and Python decoders agree
    assert unknown == ()
    assert got == row


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_c_and_python_decoders_agree_on_garbage(data: bytes) -> None:
    _, d = make_table([("id", "INT64"), ("s", "STRING"), ("d", "DOUBLE"), ("t", "DATETIME"), ("u", "UINT64"),
                       ("dt", "DATE"), ("tm", "TIME"), ("f", "FLOAT")])
    plan = RowPlan(d)

    def run(fn):  # type: ignore[no-untyped-def]
        try:
            return fn(data)
        except RowDecodeError:
            return "error"

    assert run(plan.decode) == run(plan.decode_py)


# --- UPDATE pairing ----------------------------------------------------------------------------

def schema() -> TableDef:
    return TableDef(7, "NS", "db", "t", 1, (FieldDef(1, "id", 5), FieldDef(2, "v", 13)), ("id",))


def test_pairing_by_key_then_position() -> None:
    s = schema().schema
    old = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]
    new = [{"id": 2, "v": "B"}, {"id": 1, "v": "A"}]  # listed in another order
    out = pair_update(s, old, new, False, "db.t")
    assert [(c.before["id"], c.after["v"]) for c in out] == [(1, "A"), (2, "B")]  # type: ignore[index]
    # a primary-key change stays one update, old key -> new key
    out = pair_update(s, [{"id": 1, "v": "a"}], [{"id": 9, "v": "a"}], False, "db.t")
    assert [(c.op, c.before["id"], c.after["id"]) for c in out] == [("update", 1, 9)]  # type: ignore[index]


def test_unequal_update_is_an_error_naming_the_table_or_split() -> None:
    s = schema().schema
    old = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]
    new = [{"id": 1, "v": "c"}]
    with pytest.raises(UnpairedUpdate, match="db.t has 2 old and 1 new"):
        pair_update(s, old, new, False, "db.t")
    out = pair_update(s, old, new, True, "db.t")
    assert [(c.op, (c.before or {}).get("id"), (c.after or {}).get("v")) for c in out] == [
        ("delete", 2, None), ("update", 1, "c")]


def test_mutation_kinds() -> None:
    d = schema()
    t = Table(7, "db", "t", [Field(1, "id", 5), Field(2, "v", 13)], ["id"])
    m = pb().TableMutation(table_id=7, sequence=[1])
    m.deleted_rows.append(t.encode({"id": 1, "v": "a"}))
    m.insert_rows.append(t.encode({"id": 1, "v": None}))
    changes, _ = mutation_changes(RowPlan(d), m, False)
    assert [(c.op, c.before, c.after) for c in changes] == [("update", {"id": 1, "v": "a"}, {"id": 1, "v": None})]
    bad = pb().TableMutation(table_id=7, sequence=[0, 2])
    with pytest.raises(ValueError, match="mixed kinds"):
        mutation_changes(RowPlan(d), bad, False)


# --- DDL ------------------------------------------------------------------------------------------

def test_create_and_alter_sql() -> None:
    v1 = TableDef(7, "NS", "shop", "o`rders", 1, (
        FieldDef(1, "id", 10, can_null=False), FieldDef(2, "code", 13, can_null=False),
        FieldDef(3, "note", 13), FieldDef(4, "at", 14, default=b"CURRENT_TIMESTAMP")), ("id",), (("code",),))
    sql = create_table_sql(v1)
    assert sql.startswith("CREATE TABLE IF NOT EXISTS `shop`.`o``rders` (")
    assert "`id` BIGINT UNSIGNED NOT NULL" in sql and "`code` VARCHAR(255) NOT NULL" in sql
    assert "`note` LONGTEXT NULL" in sql and "DEFAULT CURRENT_TIMESTAMP(6)" in sql
    assert "PRIMARY KEY (`id`)" in sql and "UNIQUE KEY `uk_1` (`code`)" in sql
    v2 = TableDef(7, "NS", "shop", "o`rders", 2, (
        FieldDef(1, "id", 10, can_null=False), FieldDef(2, "code", 13, can_null=False),
        FieldDef(3, "note", 13, deleted=True), FieldDef(4, "created", 14),
        FieldDef(5, "n", 5, default=b"5"), FieldDef(6, "s", 13, default=b"it's")), ("id",), (("code",),))
    assert alter_table_sql(v1, v2) == (
        "ALTER TABLE `shop`.`o``rders` DROP COLUMN `note`, CHANGE COLUMN `at` `created` DATETIME(6) NULL, "
        "ADD COLUMN `n` INT NULL DEFAULT 5, ADD COLUMN `s` LONGTEXT NULL DEFAULT 'it''s'")
    assert alter_table_sql(v2, v2) is None
    tr = transition_def(v1, v2)
    assert [f.name for f in tr.live] == ["id", "code", "created"]
    assert [f.mysql_type for f in tr.live] == [10, 13, 14]


# --- TSO, positions, checkpoint, config --------------------------------------------------------

def test_tso_and_commit_ts_are_the_same_instant() -> None:
    ms = 1795325704123
    tso = from_unix_ms(ms, 7)
    assert unix_ms(tso) == ms and tso & 0x3FFFF == 7
    assert to_commit_ts(tso) == (ms << 18) | 7
    assert from_unix_ms(BASE_MS) == 0


def test_ts_position_json_and_checkpoint(tmp_path: Path) -> None:
    p = TsPosition(100, ((9001, 100), (9002, 150)), 3)
    assert p.to_json() == {"kind": "baikaldb", "ts": 100, "epoch": 3, "regions": {"9002": 150}}
    assert p.checkpoint_json()["regions"] == {"9001": 100, "9002": 150}
    assert position_from_json(p.checkpoint_json()) == TsPosition(100, ((9001, 100), (9002, 150)), 3)
    assert p.resume_ts(9002) == 150 and p.resume_ts(9001) == 100 and p.resume_ts(1) == 100
    cp = Checkpoint(5, {"bk": p, "m": Position("mariadb-bin.000001", 400, "0-1-2")})
    save_checkpoint(tmp_path / "cp.json", cp)
    back = load_checkpoint(tmp_path / "cp.json")
    assert back is not None and back.regions["bk"] == p and back.regions["m"] == cp.regions["m"]
    for bad in ({"kind": "baikaldb", "ts": 0}, {"kind": "baikaldb", "ts": 5, "regions": {"x": 1}},
                {"kind": "postgres", "lsn": "0/1"}):
        with pytest.raises(ValueError):
            position_from_json(bad)


def _cfg(tmp_path: Path, region: str) -> Path:
    (tmp_path / "s.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp_path}/o.jsonl\n")
    p = tmp_path / "c.cfg"
    p.write_text(f"[global]\nsenderConfig={tmp_path}/s.cfg\nfilterRuleDict=\n" + region)
    return p


def test_baikaldb_config(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "[region:bk]\ntype=baikaldb\nmetaServer=10.0.0.1:8010, 10.0.0.2:8010\n"
                                     "binlogTableID=20\nbinlogRegionID=9001,9002\nstart=2024-01-02 03:04:05\n"
                                     "[region:m]\ntype=mysql\nhost=h\nuser=u\nserver_id=3\n"))
    bk = cfg.regions[0]
    assert isinstance(bk, BaikalRegionConfig)
    assert bk.metaServer == ("10.0.0.1:8010", "10.0.0.2:8010") and bk.binlogRegionID == (9001, 9002)
    assert bk.start == "2024-01-02T03:04:05+00:00" and bk.unpaired_update == "error"


@pytest.mark.parametrize("region,msg", [
    ("type=baikaldb\nbinlogTableID=20\n", "missing required key 'metaServer'"),
    ("type=baikaldb\nmetaServer=nohost\nbinlogTableID=20\n", "'nohost' is not host:port"),
    ("type=baikaldb\nmetaServer=h:1\nbinlogTableID=x\n", "binlogTableID: bad value 'x'"),
    ("type=baikaldb\nmetaServer=h:1\nbinlogTableID=2\nhost=h\n", "unknown key 'host'"),
    ("type=baikaldb\nmetaServer=h:1\nbinlogTableID=2\nstart=yesterday\n", "expected earliest, latest, a BaikalDB"),
    ("type=baikaldb\nmetaServer=h:1\nbinlogTableID=2\nstart=2019-01-01 00:00:00\n", "before 2020"),
    ("type=baikaldb\nmetaServer=h:1\nbinlogTableID=2\nunpaired_update=drop\n", "expected one of error, split"),
    ("type=oracle\n", "expected one of mysql, mariadb, baikaldb"),
])
def test_baikaldb_config_errors(tmp_path: Path, region: str, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg) as ei:
        load_config(_cfg(tmp_path, "[region:bk]\n" + region))
    assert "c.cfg:" in str(ei.value)


def test_two_sections_reading_one_binlog_table_are_refused(tmp_path: Path) -> None:
    two = "".join(f"[region:b{i}]\ntype=baikaldb\nmetaServer=h:1\nbinlogTableID=2\n" for i in range(2))
    with pytest.raises(ConfigError, match="both read binlog table 2"):
        load_config(_cfg(tmp_path, two))
    split = "".join(f"[region:b{i}]\ntype=baikaldb\nmetaServer=h:1\nbinlogTableID=2\nbinlogRegionID={i + 1}\n"
                    for i in range(2))
    assert len(load_config(_cfg(tmp_path, split)).regions) == 2


def test_encode_field_matches_the_document_example() -> None:
    """§8's example row: id=5, name='ab', created=2024-01-02 03:04:05."""
    raw = (encode_field(1, TYPES["INT64"], 5, "utf-8") + encode_field(2, TYPES["STRING"], "ab", "utf-8")
           + encode_field(4, TYPES["DATETIME"], dt.datetime(2024, 1, 2, 3, 4, 5), "utf-8"))
    assert raw == bytes.fromhex("080a 1202 6162 2100 0000 0531 44b2 19".replace(" ", ""))
