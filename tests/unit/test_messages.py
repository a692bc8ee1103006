from __future__ import annotations

import datetime as dt
import decimal
import json
import random

from capturer.model import Ddl, Position, RowChange, TableSchema, Txn
from senders.kafka.format import FORMATS, change_events, ddl_message, key_bytes
from senders.kafka.sender import murmur2, partition_for

S = TableSchema("shop", "orders", ("id", "amount", "at", "raw"), ("id",), (), (3, 246, 18, 252))


def txn(*changes: RowChange) -> Txn:
    return Txn("shard1", 123456789 << 18, Position("bin.000001", 99, "0-1-5"), changes, gtid="0-1-5")


def test_murmur2_matches_kafka_python() -> None:
    from kafka.partitioner.default import murmur2 as reference

    rng = random.Random(5)
    for n in range(40):
        data = bytes(rng.randrange(256) for _ in range(n))
        assert murmur2(data) & 0x7FFFFFFF == reference(data) & 0x7FFFFFFF
    assert partition_for(b'{"id":1}', 3) == (reference(b'{"id":1}') & 0x7FFFFFFF) % 3


def test_pk_change_is_delete_then_create() -> None:
    ch = RowChange(S, "update", {"id": 1, "amount": 1}, {"id": 2, "amount": 1})
    ev = change_events(ch)
    assert [op for op, _ in ev] == ["d", "c"]
    assert key_bytes(ch, ev[0][1]) == b'{"id":1}' and key_bytes(ch, ev[1][1]) == b'{"id":2}'
    same = RowChange(S, "update", {"id": 1, "amount": 1}, {"id": 1, "amount": 2})
    assert [op for op, _ in change_events(same)] == ["u"]


def test_json_envelope() -> None:
    row = {"id": 7, "amount": decimal.Decimal("1.50"), "at": dt.datetime(2024, 1, 1, 0, 0, 0, 5), "raw": b"\x01"}
    ch = RowChange(S, "insert", None, row)
    d = json.loads(FORMATS["json"](txn(ch), 0, ch, "c"))
    assert d["op"] == "c" and d["before"] is None
    assert d["after"] == {"id": 7, "amount": "1.50", "at": "2024-01-01 00:00:00.000005", "raw": "AQ=="}
    assert d["b64"] == ["raw"]
    assert d["source"]["region"] == "shard1" and d["source"]["commit_ts"] == 123456789 << 18
    assert d["source"]["position"] == {"file": "bin.000001", "pos": 99, "gtid": "0-1-5"}
    assert d["source"]["gtid"] == "0-1-5" and d["source"]["ts_ms"] == 123456789


def test_canal_flat_message() -> None:
    before = {"id": 7, "amount": decimal.Decimal("1.50"), "at": None, "raw": None}
    after = {"id": 7, "amount": decimal.Decimal("2.00"), "at": None, "raw": None}
    ch = RowChange(S, "update", before, after)
    d = json.loads(FORMATS["canal"](txn(ch), 0, ch, "u"))
    assert d["type"] == "UPDATE" and d["database"] == "shop" and d["pkNames"] == ["id"]
    assert d["data"] == [{"id": "7", "amount": "2.00", "at": None, "raw": None}]
    assert d["old"] == [{"amount": "1.50"}]
    assert d["mysqlType"]["amount"] == "decimal" and d["isDdl"] is False


def test_sql_and_protobuf_and_ddl() -> None:
    ch = RowChange(S, "update", {"id": 1, "amount": 1, "at": None, "raw": None},
                   {"id": 2, "amount": 1, "at": None, "raw": None})
    assert FORMATS["sql"](txn(ch), 0, ch, "d").decode().startswith("DELETE FROM `shop`.`orders` WHERE `id` <=> 1")
    from capturer.model import protogen

    pb = protogen.load()
    m = pb.RowChange()
    m.ParseFromString(FORMATS["protobuf"](txn(ch), 0, ch, "c"))
    assert m.op == pb.RowChange.INSERT and m.region == "shard1" and m.seq == 0
    assert {c.name: c.value.int_value for c in m.after if c.value.HasField("int_value")} == {"id": 2, "amount": 1}
    assert [c.name for c in m.after if c.value.is_null] == ["at", "raw"]
    big = RowChange(S, "insert", None, {"id": 18446744073709551615, "amount": None, "at": None, "raw": b"\xff"})
    m.ParseFromString(FORMATS["protobuf"](txn(big), 0, big, "c"))
    assert m.after[0].value.uint_value == 18446744073709551615 and m.after[3].value.bytes_value == b"\xff"
    t = Txn("r", 5, Position("f", 4), ddl=Ddl("shop", "ALTER TABLE orders ADD x INT", "orders", "shop"))
    d = json.loads(ddl_message(t, t.ddl, "json"))  # type: ignore[arg-type]
    assert d["ddl"].startswith("ALTER") and d["source"]["table"] == "orders"


def test_confluent_reports_undelivered_messages_without_success_reports() -> None:
    """The confluent client asks for delivery reports of failures only (a success costs
    no Python call); a message that is never acknowledged must still come back as an
    error from flush(), so the batch is retried and the checkpoint does not pass it.
    No broker here: a closed port, and a short message timeout."""
    import os
    import socket
    import time

    import confluent_kafka

    from capturer.util.kafkasec import Watch
    from senders.kafka.client import ConfluentClient, ConfluentReadBack, Reports

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    def threads() -> int:  # the process's OS threads (librdkafka's are not Python threads)
        return len(os.listdir("/proc/self/task"))

    before = threads()
    c = ConfluentClient.__new__(ConfluentClient)  # without __init__'s "is a broker there" probe
    c.reports, c._since_poll = Reports(), 0
    c.watch = Watch()
    c._read = ConfluentReadBack(f"127.0.0.1:{port}")  # lazy: no consumer until a read-back
    conf = c.conf(f"127.0.0.1:{port}", {"linger_ms": 5, "compression": "none"}, timeout_ms=1500)
    assert conf["delivery.report.only.error"] is True
    c.producer = confluent_kafka.Producer(conf)
    for i in range(3):
        c.produce("t", 0, b"k%d" % i, b"v", [("seq", b"0")])
    errors = c.flush(20)
    assert len(errors) == 3 and all("timed out" in e.lower() or "timeout" in e.lower() for e in errors), errors
    assert c.flush(5) == []  # reported once; nothing left
    # a client let go of takes its producer with it (no reference cycle through the
    # callback keeps a producer alive, retrying the broker forever): its threads end
    assert threads() > before
    c.close()
    del c, conf
    deadline = time.monotonic() + 10
    while threads() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threads() <= before
