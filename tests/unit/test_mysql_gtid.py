"""GTID states (capturer/regions/mysql/gtid.py) and the region's failover decisions, without a server.

MariaDB's domain-server-seq lists (several domains); MySQL GTID sets (unit-tested only: no
MySQL server runs here), as a region decides whether a server it fails over to holds its
position (behind, purged); the ``replicas`` key.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from capturer.app import load_config
from capturer.errors import ConfigError
from capturer.model import Position
from capturer.regions.mysql.gtid import (
    GtidSet,
    GtidTracker,
    format_maria,
    maria_behind,
    maria_contains,
    maria_purged,
    mysql_behind,
    mysql_purged,
    parse_maria,
)
from capturer.regions.mysql.region import MySQLRegion

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "4e11fa47-71ca-11e1-9e33-c80aa9429563"


def test_mariadb_states_per_domain() -> None:
    assert parse_maria("1-2-30, 0-1-105\n") == {0: (1, 105), 1: (2, 30)}
    assert format_maria(parse_maria("1-2-30,0-1-105")) == "0-1-105,1-2-30"
    assert parse_maria("") == {}
    with pytest.raises(ValueError):
        parse_maria("0-1")
    t = GtidTracker(True, "0-1-5")
    assert t.advance("1-1-1") == "0-1-5,1-1-1"
    assert t.advance("0-2-6") == "0-2-6,1-1-1"  # a new primary's server id in domain 0
    assert t.advance("") == "0-2-6,1-1-1"


def test_mariadb_behind_purged_contains() -> None:
    ours = "0-1-105,1-1-30"
    assert maria_behind(ours, "0-1-105,1-1-30") == []
    assert maria_behind(ours, "0-2-200,1-2-31") == []  # further on, written by the new primary
    assert maria_behind(ours, "0-1-100,1-1-30") == ["0-1-105"]
    assert maria_behind(ours, "0-1-105") == ["1-1-30"]  # a domain it never saw
    # further on, but without our 1-1-30: promoted at 1-1-25, it wrote 1-2-26.. in its place
    assert maria_behind(ours, "0-2-200,1-2-40", "0-1-105,0-2-200,1-1-25,1-2-40") == ["1-1-30"]
    assert maria_behind(ours, "0-2-200,1-2-40", "0-1-105,0-2-200,1-1-30,1-2-40") == []
    assert maria_purged(ours, "0-1-90,1-1-30") == []
    assert maria_purged(ours, "0-1-106") == ["0-1-105"]  # 106 starts its oldest binlog: 106 itself is gone
    assert maria_contains("0-1-105,1-1-30", "1-1-30")  # an old checkpoint kept its last GTID only
    assert not maria_contains("0-1-105,1-1-30", "1-2-30")
    assert not maria_contains("0-1-105", "")


def test_mysql_gtid_sets() -> None:
    s = GtidSet.parse(f"{U2}:1-3,\n{U1.upper()}:1-5:7-9")
    assert str(s) == f"{U1}:1-5:7-9,{U2}:1-3"
    s.add(f"{U1}:6")
    assert str(s) == f"{U1}:1-9,{U2}:1-3"
    s.add(f"{U2}:10")
    assert str(s) == f"{U1}:1-9,{U2}:1-3:10"
    assert str(GtidSet.parse(f"{U1}:1-9").minus(GtidSet.parse(f"{U1}:2-3:5"))) == f"{U1}:1:4:6-9"
    assert not GtidSet.parse(f"{U1}:1-9").minus(GtidSet.parse(f"{U1}:1-10"))
    assert mysql_behind(f"{U1}:1-9", f"{U1}:1-20,{U2}:1-4") == ""
    assert mysql_behind(f"{U1}:1-9,{U2}:1-2", f"{U1}:1-8") == f"{U1}:9,{U2}:1-2"
    assert mysql_purged(f"{U1}:1-9", f"{U1}:1-5") == ""
    assert mysql_purged(f"{U1}:1-9", f"{U1}:1-12") == f"{U1}:10-12"
    t = GtidTracker(False, f"{U1}:1-5")
    assert t.advance(f"{U1}:6") == f"{U1}:1-6"
    assert GtidTracker(False).advance(f"{U1}:6") == ""  # unknown start: unknown state
    for bad in ("x:1", f"{U1}", f"{U1}:a-b", f"{U1}:5-3"):
        with pytest.raises(ValueError):
            GtidSet.parse(bad)


class Cursor:
    """Answers the region's queries from a dict of SQL prefix -> row."""

    def __init__(self, answers: dict[str, tuple[Any, ...]]):
        self.answers = answers
        self.row: tuple[Any, ...] | None = None

    def execute(self, sql: str, params: Any = None) -> None:
        self.row = next(v for k, v in self.answers.items() if sql.startswith(k))

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.row


def problem(gtid: str, mariadb: bool, answers: dict[str, tuple[Any, ...]]) -> str:
    region = SimpleNamespace(position=Position("b.000001", 4, gtid), name="r1", mariadb=mariadb,
                             cfg=SimpleNamespace(host="10.0.0.2", port=3306))
    region._gtid_at = lambda cur, pos: MySQLRegion._gtid_at(region, cur, pos)  # type: ignore[arg-type]
    return MySQLRegion._gtid_problem(region, Cursor(answers), [("b.000001", 1000)], gtid)  # type: ignore[arg-type]


def test_a_server_that_was_behind_or_purged_is_named_with_the_gtids() -> None:
    ok = problem("0-1-105,1-1-30", True, {"SELECT @@GLOBAL.gtid_binlog_pos": ("0-2-120,1-1-30", "0-1-105,1-1-30"),
                                          "SELECT BINLOG_GTID_POS": ("0-1-50,1-1-10",)})
    assert ok == ""
    behind = problem("0-1-105,1-1-30", True, {"SELECT @@GLOBAL.gtid_binlog_pos": ("0-1-100,1-1-30", ""),
                                              "SELECT BINLOG_GTID_POS": ("",)})
    assert "region r1" in behind and "10.0.0.2:3306" in behind and "0-1-105,1-1-30" in behind
    assert "lacks 0-1-105" in behind and "0-1-100,1-1-30" in behind
    diverged = problem("0-1-105", True, {"SELECT @@GLOBAL.gtid_binlog_pos": ("0-2-120", "0-1-100,0-2-120"),
                                         "SELECT BINLOG_GTID_POS": ("",)})
    assert "lacks 0-1-105" in diverged and "of its own in their place" in diverged
    purged = problem("0-1-105", True, {"SELECT @@GLOBAL.gtid_binlog_pos": ("0-1-300", "0-1-300"),
                                       "SELECT BINLOG_GTID_POS": ("0-1-200",)})
    assert "purged" in purged and "b.000001 starts at 0-1-200" in purged
    # MySQL: GTID sets (unverified against a server)
    assert problem(f"{U1}:1-9", False, {"SELECT @@GLOBAL.gtid_executed": (f"{U1}:1-20", f"{U1}:1-3")}) == ""
    behind = problem(f"{U1}:1-9", False, {"SELECT @@GLOBAL.gtid_executed": (f"{U1}:1-8", "")})
    assert f"lacks {U1}:9" in behind and "10.0.0.2:3306" in behind
    purged = problem(f"{U1}:1-9", False, {"SELECT @@GLOBAL.gtid_executed": (f"{U1}:1-20", f"{U1}:1-12")})
    assert f"purged GTIDs the region has not read ({U1}:10-12" in purged


BASE = """[global]
binlogCheckPointPath=./cp.json
senderConfig=./senderConfig.cfg
filterRuleDict=./filter_rule.txt
httpPort=8080
[region:a]
host=10.0.0.1
user=u
server_id=10
"""


def test_replicas_key(tmp_path: Path) -> None:
    (tmp_path / "senderConfig.cfg").write_text("[global]\ntype=local\n[local]\nfilepath=./x.jsonl\n")
    (tmp_path / "filter_rule.txt").write_text("")
    p = tmp_path / "config.cfg"
    p.write_text(BASE + "replicas = 10.0.0.2:3306, 10.0.0.3:3307\n")
    cfg = load_config(p, base_dir=tmp_path)
    assert cfg.regions[0].replicas == ("10.0.0.2:3306", "10.0.0.3:3307")  # type: ignore[union-attr]
    p.write_text(BASE)
    assert load_config(p, base_dir=tmp_path).regions[0].replicas == ()  # type: ignore[union-attr]
    p.write_text(BASE + "replicas = 10.0.0.2\n")
    with pytest.raises(ConfigError, match=r"\[region:a\] replicas"):
        load_config(p, base_dir=tmp_path)
