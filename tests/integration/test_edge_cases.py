"""Hostile names, DDL mid-stream, source restarts and binlog rotation, start=latest."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import checkpoint_covers, read_lines, wait_for, write_config

pytestmark = pytest.mark.integration


def test_hostile_identifiers_and_values(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute(
        "CREATE DATABASE `we``ird.db`",
        "CREATE TABLE `we``ird.db`.`ta ble;--` (`i d` INT PRIMARY KEY, `va``l` TEXT, `ключ` VARCHAR(20), `%s` INT)",
    )
    cfg = write_config(tmp_path, two_servers, filter_text="include `we``ird.db`.*\n")
    nasty = "'); DROP TABLE x; -- \\ \" ` \x00 \n 😀"
    with capturer_running(cfg):
        c = m1.connect()
        with c.cursor() as cur:
            cur.execute("INSERT INTO `we``ird.db`.`ta ble;--` VALUES (1, %s, 'значение', 5)", (nasty,))
            cur.execute("UPDATE `we``ird.db`.`ta ble;--` SET `i d` = 2 WHERE `i d` = 1")
        c.close()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
    rows = [x for x in read_lines(tmp_path) if x["op"] != "ddl"]
    assert [x["db"] for x in rows] == ["we`ird.db", "we`ird.db"]
    assert rows[0]["table"] == "ta ble;--"
    assert rows[0]["after"] == {"i d": 1, "va`l": nasty, "ключ": "значение", "%s": 5}
    assert rows[0]["pk"] == ["i d"]
    assert rows[1]["op"] == "update" and rows[1]["before"]["i d"] == 1 and rows[1]["after"]["i d"] == 2
    ddl = [x for x in read_lines(tmp_path) if x["op"] == "ddl"]
    assert {(x["db"], x["table"]) for x in ddl} == {("we`ird.db", ""), ("we`ird.db", "ta ble;--")}


def test_ddl_mid_stream_and_keys(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (a INT, b INT, c VARCHAR(10), PRIMARY KEY (a, b), UNIQUE KEY (c))")
    cfg = write_config(tmp_path, two_servers)
    with capturer_running(cfg) as cap:
        m1.execute("INSERT INTO d.t VALUES (1, 1, 'x')",
                   "ALTER TABLE d.t ADD COLUMN d DATETIME(3) NULL AFTER b",
                   "INSERT INTO d.t VALUES (2, 2, '2024-05-06 07:08:09.123', 'y')",
                   "TRUNCATE TABLE d.t",
                   "INSERT INTO d.t VALUES (3, 3, NULL, 'z')",
                   "CREATE TABLE d.nopk (x INT, y TEXT)",
                   "INSERT INTO d.nopk VALUES (1, 'a'), (1, 'a')",
                   "DELETE FROM d.nopk LIMIT 1")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
        # the region knows the unique keys (for conflict detection by senders)
        region = cap.regions[0]
        schemas = {(s.db, s.table): s for s in region._schemas.values()}
        assert schemas[("d", "t")].pk == ("a", "b")
        assert schemas[("d", "t")].unique_keys == (("c",),)
    lines = read_lines(tmp_path)
    kinds = [(x["op"], x.get("table")) for x in lines]
    assert kinds == [
        ("ddl", ""), ("ddl", "t"), ("insert", "t"), ("ddl", "t"), ("insert", "t"), ("ddl", "t"),
        ("insert", "t"), ("ddl", "nopk"), ("insert", "nopk"), ("insert", "nopk"), ("delete", "nopk")]
    assert lines[2]["after"] == {"a": 1, "b": 1, "c": "x"}
    assert lines[4]["after"] == {"a": 2, "b": 2, "d": "2024-05-06 07:08:09.123000", "c": "y"}
    assert lines[4]["pk"] == ["a", "b"]
    assert lines[5]["sql"].upper().startswith("TRUNCATE")
    assert lines[8]["pk"] == [] and lines[8]["seq"] == 0 and lines[9]["seq"] == 1


def test_source_restart_and_binlog_rotation(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1, m2 = two_servers
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY)")
    cfg = write_config(tmp_path, two_servers)
    with capturer_running(cfg) as cap:
        m1.execute(*[f"INSERT INTO d.t VALUES ({i})" for i in range(10)])
        m1.execute("FLUSH BINARY LOGS")
        m1.execute(*[f"INSERT INTO d.t VALUES ({i})" for i in range(10, 20)])
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
        m1.stop()  # the source goes away; the region must reconnect, not fail
        wait_for(lambda: cap.regions[0].state == "reconnecting", 30, "region to notice")
        assert cap.health()[0] is False
        time.sleep(1)
        m1.start()
        m1.execute(*[f"INSERT INTO d.t VALUES ({i})" for i in range(20, 30)])
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 90, "catch-up after source restart")
        assert cap.regions[0].reconnects >= 1
    ids = [x["after"]["id"] for x in read_lines(tmp_path) if x["op"] == "insert"]
    assert ids == list(range(30))
    files = {x["position"]["file"] for x in read_lines(tmp_path)}
    assert len(files) >= 2  # positions moved across the rotation


def test_start_latest_skips_history_and_is_remembered(tmp_path: Path, two_servers, capturer_running) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY)", "INSERT INTO d.t VALUES (1)")
    cfg = write_config(tmp_path, two_servers, region_extra="start=latest\n")
    with capturer_running(cfg):
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
    # written while stopped: must be picked up from the remembered position
    m1.execute("INSERT INTO d.t VALUES (2)")
    with capturer_running(cfg):
        m1.execute("INSERT INTO d.t VALUES (3)")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 60)
    assert [x["after"]["id"] for x in read_lines(tmp_path) if x["op"] == "insert"] == [2, 3]
