"""The agent transport's ceiling: an agent process serves a synthetic region (no
source, no decoding: transactions of 100 ten-column rows made in memory), and
this process reads them with the capturer's remote region (gRPC on loopback,
msgpack, rows rebuilt as RowChange) into its queue, which a thread drains.

    python bench/agent_transport.py [--rows N]     prints {"rows": N, "rows_per_s": ...} as JSON
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def serve(port_file: str, rows: int) -> None:
    from capturer.agent import server
    from capturer.agent.config import AgentConfig
    from capturer.model import Heartbeat, Position, RowChange, TableSchema, Txn, make_ts
    from capturer.regions.base import Region
    from capturer.regions.mysql.keys import RegionConfig

    cols = ("id", "name", "city", "price", "rate", "created", "updated", "n", "big", "note")
    schema = TableSchema("bench", "t", cols, ("id",), (), (3, 15, 15, 246, 246, 18, 18, 3, 8, 15))
    now = dt.datetime(2026, 1, 1)

    class Synthetic(Region):
        def _connect_and_stream(self) -> None:
            i, ts = 0, make_ts(int(time.time() * 1000))
            while i < rows and not self.ctx.stop.is_set():
                ch = tuple(RowChange(schema, "insert", None, {
                    "id": j, "name": f"name-{j}", "city": "Oslo", "price": decimal.Decimal("12.34"),
                    "rate": decimal.Decimal("1.500"), "created": now, "updated": now, "n": j, "big": j * 1000,
                    "note": "x" * 60}) for j in range(i, i + 100))
                ts += 1
                i += 100
                self.ctx.out.put(Txn(self.name, ts, Position("b.000001", 4 + i), ch), 101, stop=self.ctx.stop)
            while not self.ctx.stop.wait(0.2):
                ts += 1
                self.ctx.out.put(Heartbeat(self.name, ts, None), 1, stop=self.ctx.stop)

    server.make_region = lambda cfg, ctx: Synthetic(cfg.name, ctx)  # type: ignore[assignment]
    region = RegionConfig("syn", "mysql", "127.0.0.1", 1, "u", "", 1)
    agent = server.Agent(AgentConfig(Path("<bench>"), "127.0.0.1:0", Path("/tmp/capturer-bench-agent"),
                                     (region,), queue_rows=100_000, status_interval=1.0))
    agent.start()
    Path(port_file).write_text(str(agent.port))
    threading.Event().wait()


def measure(rows: int) -> dict[str, Any]:
    import tempfile

    from capturer.model import Txn
    from capturer.regions.base import RegionContext
    from capturer.regions.clock import LiftJournal
    from capturer.regions.remote.keys import RemoteRegionConfig
    from capturer.regions.remote.region import RemoteRegion
    from capturer.util.bqueue import WeightedQueue

    pf = Path(tempfile.mkdtemp()) / "port"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(pf), "--rows", str(rows)])
    try:
        while not pf.exists():
            time.sleep(0.05)
        port = int(pf.read_text())
        stop = threading.Event()
        q: WeightedQueue[Any] = WeightedQueue(100_000)
        r = RemoteRegion(RemoteRegionConfig("syn", "remote", (f"127.0.0.1:{port}",)),
                         RegionContext(q, None, 0, LiftJournal(None), stop, spill_rows=0))
        got = [0]
        t0 = time.perf_counter()
        r.start()
        while got[0] < rows:
            item = q.get(60)
            if item is None:
                break
            if isinstance(item, Txn):
                got[0] += len(item.changes)
        secs = time.perf_counter() - t0
        stop.set()
        r.stop()
        r.join(10)
        return {"rows": got[0], "seconds": round(secs, 2), "rows_per_s": round(got[0] / secs),
                "batches": r.batches, "mb": round(r.bytes / 1e6, 1)}
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--serve")
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.rows)
    else:
        print(json.dumps(measure(a.rows)))
