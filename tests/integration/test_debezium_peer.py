"""The bench's peer (devtools/local_connect.py): Kafka Connect standalone with Debezium's MariaDB connector
captures a private MariaDB into a private Apache Kafka broker; every key and operation is read back.

Marked slow (a broker JVM, a Connect JVM and a MariaDB start: well over a minute on the busy 2-core
machine); run with --runslow."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from devtools import local_connect, local_kafka
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.slow


def consume(servers: str, topic: str, want: int, timeout: float = 120) -> list[tuple[dict, dict | None]]:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": servers, "group.id": "peer-smoke", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[tuple[dict, dict | None]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            for msg in c.consume(500, 1.0):
                if msg.error() is None:
                    v = msg.value()
                    out.append((json.loads(msg.key()), json.loads(v) if v else None))
    finally:
        c.close()
    return out


def test_debezium_captures_mariadb(tmp_path: Path) -> None:
    for why in (local_kafka.unavailable(), local_connect.unavailable()):
        if why:
            pytest.skip(why)
    m = MariaDBInstance(tmp_path / "r0", server_id=1).start()
    broker = local_kafka.Broker(partitions=1).start()
    connect = local_connect.Connect(broker.servers, heap="512m", directory=tmp_path / "connect")
    try:
        m.execute("CREATE DATABASE bench",
                  "CREATE TABLE bench.t (id INT PRIMARY KEY, name VARCHAR(32), price DECIMAL(10,2))")
        local_connect.grant_debezium(m)
        # snapshot.mode=never: the binlog from its first file, so no change is missed however late the
        # connector has found its start (no_data starts at the binlog's end when it gets there: a race
        # with the inserts below, lost once on the busy machine even with the task RUNNING)
        connect.start([local_connect.debezium_mariadb("smoke", m, server_id=901, prefix="dbz",
                                                      servers=broker.servers, snapshot_mode="never")])
        m.execute("INSERT INTO bench.t VALUES (1,'a',1.50),(2,'b',2.00),(3,'c',3.25)",
                  "UPDATE bench.t SET name='bb' WHERE id=2",
                  "DELETE FROM bench.t WHERE id=3")
        got = consume(broker.servers, "dbz.bench.t", 5)
        assert connect.failed() == ""
        ops = [(k["id"], v["op"] if v else None) for k, v in got]
        assert ops == [(1, "c"), (2, "c"), (3, "c"), (2, "u"), (3, "d")], (ops, connect.tail())
        assert got[3][1] is not None and got[3][1]["after"]["name"] == "bb"
        assert got[0][1] is not None and got[0][1]["after"]["price"] == "1.50"
    finally:
        connect.cleanup()
        broker.cleanup()
        m.stop()
