"""What the micro-benches of bench/ share (no server): the bench table's shape and rows, as bench.py's
TABLE and load() make them, and how a result is reported. Import it once the tree under test is on
``sys.path`` (it imports ``capturer``)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
from pathlib import Path
from typing import Any

from capturer.model import ColumnInfo, TableSchema

COLS = ("id", "name", "city", "price", "qty", "created", "updated", "n", "big", "note")
INFO = (ColumnInfo(3), ColumnInfo(15), ColumnInfo(15), ColumnInfo(246, precision=12, scale=2),
        ColumnInfo(246, precision=10, scale=3), ColumnInfo(18), ColumnInfo(18), ColumnInfo(3), ColumnInfo(8),
        ColumnInfo(252))
SCHEMA = TableSchema("bench", "t", COLS, ("id",), (), tuple(c.type for c in INFO), INFO)


def bench_row(rng: random.Random, now: dt.datetime, i: int) -> dict[str, Any]:
    """Row ``i`` of the bench table (``rng`` draws its city and amounts)."""
    return {"id": i, "name": f"name-{i}", "city": rng.choice(["Paris", "Oslo", "Lima", "Pune"]),
            "price": decimal.Decimal(rng.randrange(100000)) / 100,
            "qty": decimal.Decimal(rng.randrange(100000)) / 1000, "created": now + dt.timedelta(microseconds=i),
            "updated": now, "n": i, "big": i * 1000, "note": "x" * 60}


def cpu_figures(runs: list[float], rows: int) -> dict[str, Any]:
    """CPU seconds of each run, and the best run's microseconds a row."""
    return {"cpu_s": [round(r, 3) for r in runs], "us_per_row": round(min(runs) / rows * 1e6, 3)}


def report(out: dict[str, Any], json_path: str | None) -> None:
    """The result on stdout (one JSON line), and in ``json_path`` too when given."""
    print(json.dumps(out))
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
