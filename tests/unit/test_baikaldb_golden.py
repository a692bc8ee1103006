"""Golden test: real BaikalDB binlog payloads captured from a 2020 cluster decode
to the values the protocol document gives (shared/reference/baikaldb-protocol.md
§7.2), and the document's hand-built §4.6 response decodes byte for byte.

The base64 strings are data, copied from BaikalDB's own repository (commit
5bf03a2, src/tools/sync_out/BinlogCapturer/protoout/get_binlog.py): the only
bytes in this project that a real BaikalDB wrote. Their table is
``binlog_testtable {sint64 id = 1; string name = 2; string addr = 3}``.
"""

from __future__ import annotations

import base64
import datetime as dt

import pytest

from capturer.model import protogen
from capturer.regions.baikaldb.client import StoreClient, StoreRegionInfo
from capturer.regions.baikaldb.rows import RowPlan, mutation_changes, parse_entry
from capturer.regions.baikaldb.schema import INT64, STRING, FieldDef, TableDef
from capturer.regions.baikaldb.tso import describe, to_commit_ts, unix_ms

# table 3 on binlog region 2 (2020-10-26/27), in commit order
REGION2 = [
    "CD0YAiABOe1h38P7zgJTkQEFAAAAAAkAANIBHAiBgODh9ZyIDBCBgICAgKACGIGA4OH1nIgMIAPaASUIABCBgODh9ZyIDCoYEhYIAxIQCAISBW5hbWUxGgVhZGRyMSgA",
    "CD0YAiABOfMy811ANC7PkQEFAAAAAAkAANIBHAiBgOCTip2IDBCCgICAgKACGIGA4JOKnYgMIAPaASUIABCBgOCTip2IDCoYEhYIAxIQCAQSBW5hbWUyGgVhZGRyMSgA",
    "CD0YAiABOa1bax5yPxtakQEFAAAAAAkAANIBHAiBgND2op2IDBCDgICAgKACGIGA0PainYgMIAPaATcIABCBgND2op2IDCoqEigIAyIQCAISBW5hbWUxGgVhZGRyMSIQCAQSBW5hbWUyGgVhZGRyMSgC",
    "CD0YAiABOcfluy8ZIPilkQEFAAAAAAkAANIBHAiBgNDrtJ2IDBCEgICAgKACGIGA0Ou0nYgMIAPaASUIABCBgNDrtJ2IDCoYEhYIAxIQCAYSBW5hbWUxGgVhZGRyMigA",
    "CD0YAiABOX0sZFfyvrKzkQEBAAAAAAoAANIBHAiBgJCp4J+NDBCBgICAgMACGIGAkKngn40MIAPaAU8IABCBgJCp4J+NDCpCEkAIAxISCAgSBm5hbWUxMRoGYWRkcjExEhIIChIGbmFtZTEyGgZhZGRyMTISEggMEgZuYW1lMTMaBmFkZHIxMygA",
    "CD0YAiABOZWE/+TKjIEnkQEBAAAAAAoAANIBHAiBgKDMgaCNDBCCgICAgMACGIGAoMyBoI0MIAPaAY8BCAAQgYCgzIGgjQwqgQESfwgDEhMIBhIFbmFtZTEaCGFkZHIgMTExEhQIChIGbmFtZTEyGghhZGRyIDExMRIUCAwSBm5hbWUxMxoIYWRkciAxMTEiEAgGEgVuYW1lMRoFYWRkcjIiEggKEgZuYW1lMTIaBmFkZHIxMiISCAwSBm5hbWUxMxoGYWRkcjEzKAE=",
    "CD0YAiABOYptTA5b/q0NkQEBAAAAAAoAANIBHAiBgLCuq6ONDBCDgICAgMACGIGAsK6ro40MIAPaAYkCCAAQgYCwrqujjQwq+wESRggDEhQIDhIHbmFtZTExMRoHYWRkcjExMRIUCBASB25hbWUxMTIaB2FkZHIxMTISFAgSEgduYW1lMTEzGgdhZGRyMTEzKAASYQgDEhcIBhIJbmFtZSB0ZXN0GghhZGRyIDExMRIXCAoSCW5hbWUgdGVzdBoIYWRkciAxMTEiEwgGEgVuYW1lMRoIYWRkciAxMTEiFAgKEgZuYW1lMTIaCGFkZHIgMTExKAESGggDIhQIDBIGbmFtZTEzGghhZGRyIDExMSgCEjIIAxIVCBQSCG5hbWUxMTExGgdhZGRyMTExEhUIFhIIbmFtZTExMTIaB2FkZHIxMTIoAA==",
]
# table 2 on binlog region 3 (2020-10-28 .. 11-02)
REGION3 = [
    "CD0YAyABOc/U/5rBkfk1kQEHAAAAAAcAANIBHAiBgLDB2/mRDBCCgICAgOABGIGAsMHb+ZEMIALaASUIABCBgLDB2/mRDCoYEhYIAhIQCAISBW5hbWUxGgVhZGRyMSgA",
    "CD0YAyABOct1DD+I+TFDkQERAAAAAAkAANIBHAiBgIDGlaySDBCCgICAgKACGIGAgMaVrJIMIALaASUIABCBgIDGlaySDCoYEhYIAhIQCAYSBW5hbWUxGgVhZGRyMSgA",
    "CD0YAyABOWA/6zkcWwCykQERAAAAAAkAANIBHAiBgNDWoaySDBCDgICAgKACGIGA0NahrJIMIALaASUIABCBgNDWoaySDCoYEhYIAhIQCAQSBW5hbWUxGgVhZGRyMSgA",
    "CD0YAyABOZ1hDlJV2q0BkQEIAAAAAAoAANIBHAiBgODpga2SDBCCgICAgMACGIGA4OmBrZIMIALaAUkIABCBgODpga2SDCo8EjoIAiIQCAISBW5hbWUxGgVhZGRyMSIQCAQSBW5hbWUxGgVhZGRyMSIQCAYSBW5hbWUxGgVhZGRyMSgC",
    "CD0YAyABOX0Z4uWqQJPCkQEIAAAAAAoAANIBHAiBgOCbs62SDBCDgICAgMACGIGA4JuzrZIMIALaASUIABCBgOCbs62SDCoYEhYIAhIQCAISBW5hbWUxGgVhZGRyMSgA",
    "CD0YAyABOVn5C60PZFtpkQEFAAAAAAsAANIBHAiBgNDoka6SDBCDgICAgOACGIGA0OiRrpIMIALaASUIABCBgNDoka6SDCoYEhYIAhIQCAYSBW5hbWUyGgVhZGRyMigA",
    "CD0YAyABOQSmf9sW4GORkQEJAAAAAAsAANIBHAiBgNDN+66SDBCGgICAgOACGIGA0M37rpIMIALaATcIABCBgNDN+66SDCoqEigIAiIQCAISBW5hbWUxGgVhZGRyMSIQCAYSBW5hbWUyGgVhZGRyMigC",
    "CD0YAyABOQ5wlP2kqx0WkQESAAAAAAwAANIBHAiBgKDOxLmSDBCMgICAgIADGIGAoM7EuZIMIALaASUIABCBgKDOxLmSDCoYEhYIAhIQCAQSBW5hbWUyGgVhZGRyMigA",
    "CD0YAyABOX3qxyNz/ghEkQEBAAAAAA0AANIBHAiBgLCb3b6SDBCCgICAgKADGIGAsJvdvpIMIALaASUIABCBgLCb3b6SDCoYEhYIAhIQCAYSBW5hbWUyGgVhZGRyMigA",
    "CD0YAyABOWZLgZ3w8AexkQEDAAAAAAUAANIBHAiBgPDN+bSqDBCFgICAgKABGIGA8M35tKoMIALaASUIABCBgPDN+bSqDCoYEhYIAhIQCAoSBW5hbWU1GgVhZGRyNSgA",
]
FAKE = "CEAYAyAB0gEJCOSA0OS7+ZEM2gEUCAQQ5IDQ5Lv5kQwY5IDQ5Lv5kQw="


def pb():  # type: ignore[no-untyped-def]
    return protogen.load("baikaldb")


def fixture_table(table_id: int) -> TableDef:
    return TableDef(table_id, "TEST", "db", "binlog_testtable", 1,
                    (FieldDef(1, "id", INT64), FieldDef(2, "name", STRING), FieldDef(3, "addr", STRING)), ("id",))


def replay(fixtures: list[str], table_id: int) -> dict[int, dict[str, object]]:
    plan = RowPlan(fixture_table(table_id))
    state: dict[int, dict[str, object]] = {}
    for f in fixtures:
        e = parse_entry(pb(), base64.b64decode(f), 1, 2)
        assert not e.fake
        for m in e.mutations:
            assert m.table_id == table_id
            changes, unknown = mutation_changes(plan, m, split_unpaired=False)
            assert unknown == ()
            for ch in changes:
                if ch.before is not None:
                    del state[ch.before["id"]]  # type: ignore[arg-type]
                if ch.after is not None:
                    state[ch.after["id"]] = ch.after  # type: ignore[index]
    return state


def test_first_payload_is_what_the_document_says() -> None:
    req = pb().StoreReq()
    req.ParseFromString(base64.b64decode(REGION2[0]))
    assert req.op_type == 61 and req.region_id == 2 and req.region_version == 1
    assert req.HasField("log_id") and req.HasField("db_conn_id")
    d = req.binlog_desc
    assert d.binlog_ts == d.start_ts == 6791577497763841 and d.primary_region_id == 3
    assert req.binlog.type == 0 and req.binlog.start_ts == 6791577497763841
    m = req.binlog.prewrite_value.mutations[0]
    assert m.table_id == 3 and list(m.sequence) == [0]
    assert list(m.insert_rows) == [b"\x08\x02\x12\x05name1\x1a\x05addr1"]
    row, unknown = RowPlan(fixture_table(3)).decode(m.insert_rows[0])
    assert row == {"id": 1, "name": "name1", "addr": "addr1"} and unknown == ()
    # the TSO: 2020-10-26 20:36:52.110 +08:00, logical 1
    ts = d.binlog_ts
    t = dt.datetime.fromtimestamp(unix_ms(ts) / 1000, dt.timezone(dt.timedelta(hours=8)))
    assert t.replace(tzinfo=None) == dt.datetime(2020, 10, 26, 20, 36, 52, 110000)
    assert ts & ((1 << 18) - 1) == 1
    assert describe(ts).endswith("(2020-10-26T12:36:52.110+00:00)")
    # as a capturer commit_ts: the same instant from the Unix epoch
    assert to_commit_ts(ts) >> 18 == unix_ms(ts)


def test_delete_fixture_has_two_deleted_rows() -> None:
    e = parse_entry(pb(), base64.b64decode(REGION2[2]), 5, 2)
    (m,) = e.mutations
    assert list(m.sequence) == [2] and len(m.deleted_rows) == 2 and not m.insert_rows
    changes, _ = mutation_changes(RowPlan(fixture_table(3)), m, False)
    assert [(c.op, c.before) for c in changes] == [
        ("delete", {"id": 1, "name": "name1", "addr": "addr1"}),
        ("delete", {"id": 2, "name": "name2", "addr": "addr1"})]


def test_region2_history_replays_to_its_final_table() -> None:
    """Seven real transactions (inserts, a 3-row UPDATE paired by key, a
    four-statement transaction) give the table the tool's author ended with."""
    state = replay(REGION2, 3)
    assert state == {
        3: {"id": 3, "name": "name test", "addr": "addr 111"},
        4: {"id": 4, "name": "name11", "addr": "addr11"},
        5: {"id": 5, "name": "name test", "addr": "addr 111"},
        7: {"id": 7, "name": "name111", "addr": "addr111"},
        8: {"id": 8, "name": "name112", "addr": "addr112"},
        9: {"id": 9, "name": "name113", "addr": "addr113"},
        10: {"id": 10, "name": "name1111", "addr": "addr111"},
        11: {"id": 11, "name": "name1112", "addr": "addr112"},
    }


def test_update_fixture_pairs_old_and_new_images() -> None:
    e = parse_entry(pb(), base64.b64decode(REGION2[5]), 5, 2)
    (m,) = e.mutations
    assert list(m.sequence) == [1] and len(m.deleted_rows) == len(m.insert_rows) == 3
    changes, _ = mutation_changes(RowPlan(fixture_table(3)), m, False)
    assert [(c.op, c.before["id"], c.after["id"], c.after["addr"]) for c in changes] == [  # type: ignore[index]
        ("update", 3, 3, "addr 111"), ("update", 5, 5, "addr 111"), ("update", 6, 6, "addr 111")]


def test_region3_history_and_commit_order() -> None:
    tss = []
    for f in REGION3:
        req = pb().StoreReq()
        req.ParseFromString(base64.b64decode(f))
        assert req.region_id == 3 and req.binlog_desc.primary_region_id == 2
        tss.append(req.binlog_desc.start_ts)
    assert tss == sorted(tss)
    assert replay(REGION3, 2) == {2: {"id": 2, "name": "name2", "addr": "addr2"},
                                  3: {"id": 3, "name": "name2", "addr": "addr2"},
                                  5: {"id": 5, "name": "name5", "addr": "addr5"}}


def test_real_fake_heartbeat() -> None:
    raw = base64.b64decode(FAKE)
    req = pb().StoreReq()
    req.ParseFromString(raw)
    assert req.op_type == 64 and req.region_id == 3 and req.region_version == 1
    assert req.binlog.type == 4
    assert req.binlog_desc.binlog_ts == req.binlog.start_ts == req.binlog.commit_ts == 6834339808804964
    e = parse_entry(pb(), raw, 6834339808804964, 3)
    assert e.fake and not e.mutations


DOC_RESPONSE = {
    "errcode": "SUCCESS", "errmsg": "cmVhZCBiaW5sb2cgc3VjY2Vzcw==", "leader": "10.0.0.1:8110",
    "binlogs": ["CD0YqUYgAdIBHAiDgICR/NzpOhCVmu86GIOAgJH83Ok6INk2OAHaAV8IABCDgICR/NzpOipQEk4IChIPCAoSAmFiIQAAAAUxRLIZ"
                "KAAyN2luc2VydCBpbnRvIG9yZGVycyB2YWx1ZXMoNSwnYWInLCcyMDI0LTAxLTAyIDAzOjA0OjA1JylAAA==",
                "CEAYqUYgAdIBCQiAgICO/dzpOtoBFAgEEICAgI793Ok6GICAgI793Ok6"],
    "commit_ts": [33116086601515009, 33116086861824000],
}


def test_document_response_4_6() -> None:
    """§4.6's hand-built response: an INSERT (id=5, name='ab', created=2024-01-02
    03:04:05) and a FAKE, read by the client's response checks and the decoder."""
    client = StoreClient("t", 1, 1, 10)
    sr = StoreRegionInfo(9001, 0, 1, ["10.0.0.1:8110"])
    entries = client._entries(DOC_RESPONSE, sr, "10.0.0.1:8110", 33116086599000000)
    assert [ts for ts, _ in entries] == DOC_RESPONSE["commit_ts"]
    first = parse_entry(pb(), entries[0][1], entries[0][0], 9001)
    assert not first.fake and first.txn_id == 123456789 and first.start_ts == 33116086599680003
    assert first.mutations[0].sql == b"insert into orders values(5,'ab','2024-01-02 03:04:05')"
    t = TableDef(10, "TEST", "TestDB", "orders", 3, (FieldDef(1, "id", INT64), FieldDef(2, "name", STRING),
                                                     FieldDef(3, "old", 5, deleted=True), FieldDef(4, "created", 14)),
                 ("id",))
    row, _ = RowPlan(t).decode(first.mutations[0].insert_rows[0])
    assert row == {"id": 5, "name": "ab", "created": dt.datetime(2024, 1, 2, 3, 4, 5)}
    assert parse_entry(pb(), entries[1][1], entries[1][0], 9001).fake


@pytest.mark.parametrize("bad", [
    {**DOC_RESPONSE, "commit_ts": DOC_RESPONSE["commit_ts"][:1]},  # unpaired
    {**DOC_RESPONSE, "binlogs": ["not base64!", DOC_RESPONSE["binlogs"][1]]},
])
def test_response_checks(bad: dict[str, object]) -> None:
    from capturer.regions.baikaldb.client import PeerFailure

    client = StoreClient("t", 1, 1, 10)
    with pytest.raises(PeerFailure):
        client._entries(bad, StoreRegionInfo(9001, 0, 1, []), "p", 33116086599000000)
