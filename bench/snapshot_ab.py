"""The snapshot part's core, A/B: one MariaDB table of the bench's shape (``load_sequence``), then, in
rounds, for each tree given (a checkout of this repository: e.g. a worktree of the commit before a change,
and this one), the raw chunked read (``raw_chunked_read``: the baseline) and the capturer copying the table
to a file (``snapshot_run``, snapshot=initial), each in a fresh process of that tree, against the same server.
A ratio is the copy's rows/s over the raw read's measured just before it, in the same process.

    .venv/bin/python bench/snapshot_ab.py --rows 500000 --rounds 3 --tree before=/tmp/old --tree after=.
        [--variant one,ahead] [--out bench/results/x.json]

A noisy machine moves both figures of a pair together; compare trees by their ratios, interleaved.
Each run also gives the process's CPU seconds through the copy and the cyclic collector's collections
and wall seconds during it, by generation (``gc.callbacks``)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OPTS = {"one": "", "ahead": "snapshot_read_ahead=true\n", "process": "process=true\n"}


def one_run(port: int, rows: int, variant: str) -> dict[str, Any]:
    """(in the tree's own process: its checkout is the working directory) The raw read, then the copy;
    rows/s of each and the capturer's cores."""
    tree = Path.cwd()
    sys.path[:0] = [str(tree / "bench"), str(tree)]
    import bench as b  # (the tree's bench and capturer)
    from capturer.util.memory import tune_gc, tune_malloc

    tune_malloc()
    tune_gc()

    class Server:
        pass

    srv: Any = Server()
    srv.port = port
    raw = b.raw_chunked_read(srv, "snap.t")
    # the cyclic collector during the copy: collections and their wall seconds, by generation
    gc_s, gc_n, started = [0.0, 0.0, 0.0], [0, 0, 0], {}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        me = threading.get_ident()
        if phase == "start":
            started[me] = time.perf_counter()
        elif me in started:
            gc_s[info["generation"]] += time.perf_counter() - started.pop(me)
            gc_n[info["generation"]] += 1

    gc.callbacks.append(on_gc)
    cpu0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="snap-ab-") as tmp:
        d = Path(tmp)
        r = b.snapshot_run(d, srv, f"[global]\ntype=local\n[local]\nfilepath={d / 'o.jsonl'}\nrotate_mb=100000\n",
                           rows, region_extra=OPTS[variant])
    cpu = time.process_time() - cpu0
    gc.callbacks.remove(on_gc)
    cores = r.get("cpu_cores", {}).get("capturer") or 0
    return {"raw_rows_per_s": raw["rows_per_s"], "raw_client_cpu_s": raw["client_cpu_s"],
            "rows_per_s": r["rows_per_s"], "rows": r["rows"], "exit": r["exit"], "capturer_cores": cores,
            "rows_per_capturer_cpu_s": round(r["rows_per_s"] / cores) if cores else None,
            "ratio": round(r["rows_per_s"] / raw["rows_per_s"], 3),
            # (the process's CPU through the copy: the capturer's start and stop included)
            "copy_process_cpu_s": round(cpu, 3), "gc_collections": gc_n, "gc_seconds": [round(x, 3) for x in gc_s]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", action="append", default=[], help="name=path (repeat); default: this tree")
    ap.add_argument("--variant", default="one", help="one (the default reader), ahead (read-ahead), process")
    ap.add_argument("--out", help="results JSON")
    ap.add_argument("--one-run", nargs=3, help=argparse.SUPPRESS)  # port rows variant (in a tree's process)
    args = ap.parse_args()
    if args.one_run:
        print(json.dumps(one_run(int(args.one_run[0]), int(args.one_run[1]), args.one_run[2])))
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    import bench as b

    trees = [t.split("=", 1) for t in args.tree] or [["this", str(ROOT)]]
    with tempfile.TemporaryDirectory(prefix="snap-ab-src-") as tmp:
        src = b.MariaDBInstance(Path(tmp) / "src", server_id=41).start()
        try:
            b.load_sequence(src, "snap.t", args.rows)
            runs: list[dict[str, Any]] = []
            for i in range(args.rounds):
                for name, path in trees:
                    for variant in args.variant.split(","):
                        py = Path(path) / ".venv" / "bin" / "python"
                        out = subprocess.run(
                            [str(py if py.exists() else sys.executable), str(Path(__file__).resolve()),
                             "--one-run", str(src.port), str(args.rows), variant],
                            cwd=path, env=dict(os.environ, PYTHONPATH=str(path)), capture_output=True, text=True,
                            check=True)
                        x = {"round": i, "tree": name, "variant": variant, **json.loads(out.stdout.strip().splitlines()[-1])}
                        runs.append(x)
                        print(json.dumps(x), flush=True)
        finally:
            src.stop()
    summary = {}
    for name, _ in trees:
        for variant in args.variant.split(","):
            xs = [x for x in runs if x["tree"] == name and x["variant"] == variant]
            summary[f"{name}/{variant}"] = {
                "ratio_median": statistics.median(x["ratio"] for x in xs),
                "rows_per_s_median": statistics.median(x["rows_per_s"] for x in xs),
                "raw_rows_per_s_median": statistics.median(x["raw_rows_per_s"] for x in xs),
                "rows_per_capturer_cpu_s_median": statistics.median(x["rows_per_capturer_cpu_s"] or 0 for x in xs),
                "copy_process_cpu_s_median": statistics.median(x["copy_process_cpu_s"] for x in xs),
                "young_gc_seconds_median": statistics.median(x["gc_seconds"][0] for x in xs)}
    result = {"rows": args.rows, "rounds": args.rounds, "trees": dict(trees), "cpu": os.cpu_count(),
              "load_avg_end": os.getloadavg(), "runs": runs, "summary": summary}
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
