"""``verify`` against Kafka after DDL, with real servers (a MariaDB source, Apache Kafka, the
capturer as ``python -m capturer``): rows written before an ``ADD COLUMN ... DEFAULT``, a ``DROP
COLUMN``, a ``RENAME COLUMN``, a ``CHANGE COLUMN`` and a ``RENAME TABLE`` (names with a space and a
backquote) are equal to the source as it is now, read as a consumer applying the stream would (the
DDL of the schema topic, the renamed table's old topic); a row changed in the source behind the
capturer's back is still found. Before senders/kafka/verify.py applied the stream's DDL, the untouched
rows were "different" and the renamed table's rows "missing". The file sender rides along (its
replay now reads RENAME COLUMN through the same parser)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, checkpoint_covers, shared_broker, start_servers, wait_for, write_config

from integration.test_verify import by_table, run_verify

pytestmark = pytest.mark.integration

OLD, NEW = "app.or`ders x", "app.new `name"


@pytest.fixture()
def rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    (src,) = start_servers(tmp_path, 1)
    src.execute("CREATE DATABASE IF NOT EXISTS app",
                "CREATE TABLE app.`or``ders x` (id INT PRIMARY KEY, `v x` VARCHAR(20), gone INT, c INT)",
                "CREATE TABLE app.bag (m VARCHAR(10))")
    broker = shared_broker()
    cfg = write_config(tmp_path, [src], "[global]\ntype=kafka,local\n"
                       f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
                       f"[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n")
    cap = CapturerProcess(cfg, tmp_path / "capturer.log").start()
    try:
        cap.wait_ready()
        yield {"src": src, "tmp": tmp_path, "cfg": cfg, "broker": broker}
    finally:
        cap.stop()
        broker.kill()
        src.stop()


def _caught_up(rig: dict[str, Any]) -> None:
    wait_for(lambda: checkpoint_covers(rig["tmp"], [rig["src"]]), 180, "every sender caught up")


def test_rows_written_before_ddl_and_a_renamed_table_verify_equal_and_a_real_difference_is_found(
        rig: dict[str, Any]) -> None:
    src = rig["src"]
    src.execute(*[f"INSERT INTO app.`or``ders x` VALUES ({i}, 'v{i}', {i}, {10 * i})" for i in range(1, 31)],
                *[f"INSERT INTO app.bag VALUES ('m{i}')" for i in range(5)])
    _caught_up(rig)
    src.execute("ALTER TABLE app.`or``ders x` ADD COLUMN `n``c` INT NOT NULL DEFAULT 7, ADD COLUMN s VARCHAR(9) "
                "DEFAULT 'a, ''b'",
                "ALTER TABLE app.`or``ders x` DROP COLUMN gone",
                "ALTER TABLE app.`or``ders x` RENAME COLUMN `v x` TO `w y`",
                "USE app",
                "ALTER TABLE `or``ders x` CHANGE c c2 BIGINT",
                "RENAME TABLE app.`or``ders x` TO app.`new ``name`",
                "ALTER TABLE app.bag ADD COLUMN k VARCHAR(5) DEFAULT 'k'")
    src.execute("UPDATE app.`new ``name` SET `w y`='after', `n``c`=8 WHERE id IN (2, 3)",
                "DELETE FROM app.`new ``name` WHERE id IN (4, 5)",
                "INSERT INTO app.`new ``name` (id, `w y`, c2) VALUES (100, 'new', 1000)",
                "UPDATE app.`new ``name` SET id = 200 WHERE id = 6",  # a key change after the RENAME
                "DELETE FROM app.bag WHERE m = 'm0'",
                "INSERT INTO app.bag VALUES ('m9', 'z')")
    _caught_up(rig)
    code, report = run_verify(rig["cfg"], "--wait", "20")
    t = by_table(report)
    assert code == 0, json.dumps(report, indent=1)[:4000]
    for sender in ("kafka", "local"):
        assert t[(sender, NEW)]["status"] == "equal" and t[(sender, NEW)]["rows"] == 29, t[(sender, NEW)]
        assert t[(sender, "app.bag")]["status"] == "equal" and t[(sender, "app.bag")]["rows"] == 5, t
    assert (("kafka", OLD)) not in t  # (the source has no such table now)

    # a row untouched since the DDL changed in the source behind the capturer's back (not in the binlog)
    src.execute("SET SESSION sql_log_bin=0", "UPDATE app.`new ``name` SET `w y`='planted' WHERE id = 1",
                "UPDATE app.bag SET k='p' WHERE m = 'm1'")
    code, report = run_verify(rig["cfg"], "--wait", "10", "--rounds", "1")
    assert code == 1, json.dumps(report, indent=1)[:4000]
    t = by_table(report)
    for sender in ("kafka", "local"):
        got = t[(sender, NEW)]
        assert got["status"] == "different" and (got["different"], got["missing"], got["extra"]) == (1, 0, 0), got
        assert "id=1" in " ".join(got["examples"]), got
        assert t[(sender, "app.bag")]["status"] == "different", t[(sender, "app.bag")]
