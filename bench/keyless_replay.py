"""verify's readers of a keyless table (the file's replay and the Kafka read-back): a delete finds
its equal row by an index (now) or by a scan of the table (before 2026-11-29, kept here as the
baseline). Both on the same changes, alternated, CPU time per run.

    .venv/bin/python bench/keyless_replay.py [rows=30000] [rounds=2]
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from senders.local import replay


def changes(n: int) -> list[dict[str, Any]]:
    r = random.Random(1)
    rows: list[dict[str, Any]] = []
    out = []
    for i in range(n):
        row = {"a": i % 50, "b": "v" * (i % 7) + str(i % 1000)}
        out.append({"op": "insert", "db": "d", "table": "kl", "pk": [], "before": None, "after": row})
        rows.append(row)
        if i % 3 == 0:
            old = rows.pop(r.randrange(len(rows)))
            out.append({"op": "delete", "db": "d", "table": "kl", "pk": [], "before": old, "after": None})
    return out


def scan_rebuild(chs: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """The baseline: the scan per delete the replay did before."""
    t: dict[Any, dict[str, Any]] = {}
    n = 0
    for d in chs:
        if d["before"] is not None:
            for k, row in t.items():
                if row == d["before"]:
                    del t[k]
                    break
        if d["after"] is not None:
            n += 1
            t[("#", n)] = d["after"]
    return t


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    chs = changes(n)
    out: dict[str, list[float]] = {"scan": [], "index": []}
    sizes: list[int] = []
    for _ in range(rounds):
        for name, fn in (("scan", scan_rebuild), ("index", lambda c: replay.rebuild(iter(c))[("d", "kl")])):
            t0 = time.process_time()
            got = fn(chs)
            out[name].append(round(time.process_time() - t0, 3))
            sizes.append(len(got))  # (the same rows either way)
    print(json.dumps({"changes": len(chs), "rows_left": sizes, "cpu_s": out,
                      "ratio": [round(b / a, 3) for a, b in zip(out["scan"], out["index"])]}))


if __name__ == "__main__":
    main()
