"""The ``[spark]`` keys of ``table_format=delta``'s upkeep and change data feed: defaults and
validation (no Spark needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capturer import config
from capturer.errors import ConfigError
from senders import CATALOG


def load(tmp_path: Path, extra: str) -> dict[str, object]:
    p = tmp_path / "s.cfg"
    p.write_text(f"[global]\ntype=spark\n[spark]\ntable_format=delta\nwarehouse={tmp_path / 'wh'}\n{extra}")
    (sc,) = config.load_sender_config(p, CATALOG)
    return dict(sc.options)


def test_defaults(tmp_path: Path) -> None:
    o = load(tmp_path, "")
    assert o["change_data_feed"] is False and o["vacuum_retention_hours"] == 168.0
    assert o["upkeep_budget"] == 60.0 and o["compaction_interval"] == 300.0


def test_values_are_parsed(tmp_path: Path) -> None:
    o = load(tmp_path, "change_data_feed=true\nvacuum_retention_hours=0\nupkeep_budget=5\n")
    assert o["change_data_feed"] is True and o["vacuum_retention_hours"] == 0.0 and o["upkeep_budget"] == 5.0


@pytest.mark.parametrize("line", ["change_data_feed=maybe", "vacuum_retention_hours=-1",
                                  "vacuum_retention_hours=abc", "upkeep_budget=0"])
def test_bad_values_are_refused(tmp_path: Path, line: str) -> None:
    with pytest.raises(ConfigError):
        load(tmp_path, line + "\n")
