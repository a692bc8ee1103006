"""Bench part ``spark_apply`` (issue 47): the streaming applier on Spark (``python -m capturer spark-apply``,
capturer/apply/spark_stream.py) draining the capturer's Kafka topics into Delta tables, on one core and on
two: its rows/s on ``local[1]``, then on a standalone Spark cluster (a master and workers started from the
pyspark package with spark-class, on 127.0.0.1, as tests/integration/test_spark_cluster.py starts them)
with **1 worker** of one core, then **2 workers** of one core each (the issue's goal: 2 workers >= 1.5x 1).

The topics are filled once, before the runs, by the Kafka sender itself (``send`` with ready-made
transactions: json, ``txn_topic``, 4 partitions a topic, into a private Apache Kafka broker as the tests
start it): ``changes`` row changes in 10-change transactions over two keyed tables (``bench.a``,
``bench.b``: 4/7 inserts of new keys, 2/7 updates and 1/7 deletes of recent keys), then one marker
transaction (``bench.mark``). Each run is a fresh ``spark-apply`` child process (its own Delta tables and
checkpoint) reading the topics from the earliest offset with ``--max-offsets`` per micro-batch (a backlog
drained in several micro-batches, as after an outage), until the marker is in its Delta table (the
applier applies whole transactions in the spine's order: every change before it is in then); then it is
stopped and its Delta tables are read by ``deltalake`` (delta-rs) and compared with the expected rows, row
by row.

Figures per run: ``wall_rows_per_s`` (all the changes over launch -> marker merged: the JVM's start, the
Kafka source's, the tables' creation included), and ``steady_rows_per_s`` (the rows of the micro-batches
after the first over the time between the end of the first and the end of the last, from the applier's
log lines), and where each batch's time went (the log line's ``seconds``: Spark's Kafka read + the collect
on the driver, the regrouping on the driver, the MERGEs as Spark jobs, the pending file). The three run
``rounds`` times (default 2), every other round in the reverse order (a shared machine's load drifts, which
favours whichever runs last); each configuration's rates are over all its rounds (rows over seconds), and
the ratios (2 workers / 1 worker, 1 worker / local[1]) come per round too.

Needs PySpark 4.2 with the Delta jars and spark-sql-kafka (Maven, cached), Java, the Kafka broker and
``deltalake``; skipped, saying why, otherwise."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from capturer import config
from capturer.model import ColumnInfo, Position, RowChange, TableSchema, Txn
from senders import CATALOG, sender_class

ROOT = Path(__file__).resolve().parents[1]
TXN_TOPIC = "capturer.txn"
PARTITIONS = 4
COLUMNS = ("id", "name", "qty", "price")
# BIGINT, VARCHAR, BIGINT, DOUBLE (with the table map's facts, as a region gives them: the applier types the
# JSON values by them)
TABLES = [TableSchema("bench", t, COLUMNS, ("id",), (), (8, 15, 8, 5), tuple(ColumnInfo(c) for c in (8, 15, 8, 5)))
          for t in ("a", "b")]
MARK = TableSchema("bench", "mark", ("id", "n"), ("id",), (), (8, 8), (ColumnInfo(8), ColumnInfo(8)))
BATCH_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*spark-apply \S+: batch (\d+): (\d+) messages, "
                        r"(\d+) transactions applied \((\d+) rows\).*seconds: read ([\d.]+), regroup ([\d.]+), "
                        r"merge ([\d.]+), pending ([\d.]+)")


def workload(changes: int, seed: int = 11) -> tuple[list[Txn], dict[str, dict[int, tuple[Any, ...]]]]:
    """The transactions (the marker last) and the expected rows of each table by key."""
    rnd = random.Random(seed)
    state: dict[str, dict[int, tuple[Any, ...]]] = {s.table: {} for s in TABLES}
    live: dict[str, list[int]] = {s.table: [] for s in TABLES}
    nxt = 0
    ts = 1_700_000_000_000 << 18
    txns: list[Txn] = []
    made = 0
    gen = 0
    while made < changes:
        gen += 1
        chs: list[RowChange] = []
        used: set[tuple[str, int]] = set()
        while len(chs) < 10:
            s = TABLES[rnd.randrange(len(TABLES))]
            st, lv = state[s.table], live[s.table]
            x = rnd.random()
            if x < 4 / 7 or not lv:
                r = {"id": nxt, "name": f"n-{nxt}-{gen}", "qty": nxt * 3 + gen, "price": nxt / 7}
                chs.append(RowChange(s, "insert", None, r))
                st[nxt] = tuple(r.values())
                lv.append(nxt)
                used.add((s.table, nxt))
                nxt += 1
                continue
            j = len(lv) - 1 - rnd.randrange(min(len(lv), 20_000))
            k = lv[j]
            if (s.table, k) in used:
                continue
            used.add((s.table, k))
            before = dict(zip(COLUMNS, st[k]))
            if x < 6 / 7:
                r = {"id": k, "name": f"n-{k}-{gen}", "qty": k * 3 + gen, "price": k / 7 + gen}
                chs.append(RowChange(s, "update", before, r))
                st[k] = tuple(r.values())
            else:
                chs.append(RowChange(s, "delete", before, None))
                del st[k]
                lv[j] = lv[-1]
                lv.pop()
        ts += 1
        txns.append(Txn("r1", ts, Position("bin.000001", 4 + 100 * gen), tuple(chs)))
        made += len(chs)
    ts += 1
    txns.append(Txn("r1", ts, Position("bin.000001", 4 + 100 * (gen + 1)),
                    (RowChange(MARK, "insert", None, {"id": 1, "n": made}),)))
    return txns, state


def fill(tmp: Path, servers: str, txns: list[Txn]) -> float:
    """The transactions into Kafka through the Kafka sender (json, txn_topic); seconds taken."""
    p = tmp / "kafka-sender.cfg"
    p.write_text(f"[global]\ntype=kafka\n[kafka]\nservers={servers}\nclient=confluent\ntxn_topic={TXN_TOPIC}\n"
                 f"partitions={PARTITIONS}\nformat=json\n")
    (sc,) = config.load_sender_config(p, CATALOG)
    s = sender_class("kafka")("kafka", sc.options)
    t0 = time.perf_counter()
    s.open()
    try:
        for i in range(0, len(txns), 500):
            s.send(txns[i:i + 500])
    finally:
        s.close()
    return time.perf_counter() - t0


class Cluster:
    """A standalone Spark master and ``workers`` workers of one core each (the pyspark package's spark-class)."""

    def __init__(self, tmp: Path, workers: int):
        import pyspark

        from devtools.local_mariadb import free_port

        self.home = str(Path(pyspark.__file__).parent)
        self.port, self.ui = free_port(), free_port()
        self.tmp, self.workers = tmp, workers
        self.procs: list[subprocess.Popen[bytes]] = []
        self._free_port = free_port
        tmp.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _run(self, *args: str, log: str) -> None:
        env = dict(os.environ, SPARK_HOME=self.home, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(self.tmp),
                   SPARK_WORKER_DIR=str(self.tmp / "work"))
        with open(self.tmp / log, "wb") as out:
            self.procs.append(subprocess.Popen(["bash", f"{self.home}/bin/spark-class", *args], env=env,
                                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def _workers_alive(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return -1

    def start(self) -> Cluster:
        self._run("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                  "--webui-port", str(self.ui), log="master.log")
        _wait(lambda: self._workers_alive() >= 0, 120, "the Spark master")
        for i in range(self.workers):
            self._run("org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                      "--memory", "1g", "--webui-port", str(self._free_port()), "--work-dir",
                      str(self.tmp / f"work{i}"), self.url, log=f"worker{i}.log")
        _wait(lambda: self._workers_alive() == self.workers, 120, f"{self.workers} Spark worker(s)")
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _wait(cond: Any, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"spark_apply: no {what} after {timeout:.0f}s")
        time.sleep(0.2)


def _delta_rows(tdir: Path) -> list[dict[str, Any]]:
    import deltalake
    import pyarrow as pa

    t = deltalake.DeltaTable(str(tdir))
    return pa.table(deltalake.QueryBuilder().register("t", t).execute("SELECT * FROM t").read_all()).to_pylist()


def _marked(wh: Path) -> bool:
    log = wh / "bench__mark" / "_delta_log"
    if not log.is_dir() or not any(log.glob("[0-9]*.json")):
        return False
    try:
        return len(_delta_rows(wh / "bench__mark")) >= 1
    except Exception:  # (a commit being written)
        return False


def run_applier(tmp: Path, label: str, master: str, servers: str, max_offsets: int, executors: str,
                timeout: float) -> dict[str, Any]:
    """One ``spark-apply`` child with ``--master master`` from the earliest offsets until the marker is merged."""
    d = tmp / label
    d.mkdir(parents=True)
    wh = d / "wh"
    senders = (f"[global]\ntype=spark\n[spark]\ntable_format=delta\nmaster=local[1]\nwarehouse={wh}\n"
               f"compaction_interval=0\napp_name=bench-spark-apply-{label}\nconf.spark.ui.enabled=false\n"
               "conf.spark.ui.showConsoleProgress=false\n"
               f"conf.spark.driver.memory=1g\n{executors}")
    (d / "senders.cfg").write_text(senders)
    cfg = d / "apply.cfg"
    cfg.write_text(f"[global]\nname=bench\nservers={servers}\ntxn_topic={TXN_TOPIC}\nclient=confluent\n"
                   f"tables=*.*\nsenderConfig={d / 'senders.cfg'}\nhttpPort=0\nlogLevel=info\n")
    log = d / "spark-apply.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "capturer", "spark-apply", "--config", str(cfg),
                                 "--checkpoint", str(d / "checkpoint"), "--master", master, "--trigger", "0.5",
                                 "--max-offsets", str(max_offsets)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT), start_new_session=True)
    first = None
    try:
        while not _marked(wh):
            if first is None and any(wh.glob("bench__[ab]/_delta_log/[0-9]*.json")):
                first = time.monotonic() - t0
            if proc.poll() is not None:
                raise RuntimeError(f"spark_apply {label}: the applier exited with {proc.returncode}: "
                                   f"{log.read_text(errors='replace')[-3000:]}")
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"spark_apply {label}: the marker not merged after {timeout:.0f}s: "
                                   f"{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        wall = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    batches = []
    for line in log.read_text(errors="replace").splitlines():
        m = BATCH_LINE.search(line)
        if m:
            at = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + int(m.group(1)[20:]) / 1000
            batches.append({"at": at, "id": int(m.group(2)), "messages": int(m.group(3)), "txns": int(m.group(4)),
                            "rows": int(m.group(5)), "read": float(m.group(6)), "regroup": float(m.group(7)),
                            "merge": float(m.group(8)), "pending": float(m.group(9))})
    work = [b for b in batches if b["rows"]]
    r: dict[str, Any] = {"master": master, "wall_seconds": round(wall, 1),
                         "first_commit_seconds": round(first, 1) if first is not None else None,
                         "batches": len(work), "wh": wh}
    if len(work) >= 2:
        steady_rows = sum(b["rows"] for b in work[1:])
        steady_s = work[-1]["at"] - work[0]["at"]
        r["steady_rows"] = steady_rows
        r["steady_seconds"] = round(steady_s, 2)
        r["steady_rows_per_s"] = round(steady_rows / max(steady_s, 1e-9))
        r["steady_split_seconds"] = {k: round(sum(b[k] for b in work[1:]), 2)
                                     for k in ("read", "regroup", "merge", "pending")}
    if work:
        r["first_batch"] = {k: work[0][k] for k in ("rows", "read", "regroup", "merge")}
        r["batch_list"] = [{k: b[k] for k in ("rows", "read", "regroup", "merge")} for b in work]
    return r


def check(wh: Path, want: dict[str, dict[int, tuple[Any, ...]]], marked: int) -> list[str]:
    """The Delta tables (by delta-rs) against the expected rows."""
    problems = []
    for s in TABLES:
        got = {r["id"]: tuple(r[c] for c in COLUMNS) for r in _delta_rows(wh / f"bench__{s.table}")}
        exp = want[s.table]
        if got != exp:
            missing = [k for k in exp if k not in got]
            extra = [k for k in got if k not in exp]
            diff = [k for k in exp if k in got and got[k] != exp[k]]
            problems.append(f"bench.{s.table}: {len(got)} rows, want {len(exp)}: {len(missing)} missing "
                            f"{missing[:3]}, {len(extra)} extra {extra[:3]}, {len(diff)} different "
                            f"{[(got[k], exp[k]) for k in diff[:2]]}")
    mark = _delta_rows(wh / "bench__mark")
    if [(r["id"], r["n"]) for r in mark] != [(1, marked)]:
        problems.append(f"bench.mark: {mark}")
    return problems


def run(tmp: Path, servers: str, changes: int = 60_000, max_offsets: int = 20_000, cluster: bool = True,
        rounds: int = 2, timeout: float = 900) -> dict[str, Any]:
    from senders.spark import deltajars

    why = deltajars.incompatible()
    if why:
        return {"skipped": why}
    if shutil.which("java") is None:
        return {"skipped": "no java"}
    try:
        import deltalake  # noqa: F401
    except ImportError:
        return {"skipped": "no deltalake (the check's reader)"}
    tmp.mkdir(parents=True, exist_ok=True)
    txns, want = workload(changes)
    n = sum(len(t.changes) for t in txns)
    res: dict[str, Any] = {"changes": n, "transactions": len(txns), "tables": len(TABLES) + 1,
                           "partitions_per_topic": PARTITIONS, "max_offsets_per_batch": max_offsets, "rounds": rounds,
                           "cpu": os.cpu_count(), "problems": []}
    res["kafka_fill_seconds"] = round(fill(tmp, servers, txns), 1)
    one_core = "conf.spark.executor.memory=512m\nconf.spark.executor.cores=1\n"
    runs = [("local1", "local[1]", 0)]
    if cluster:
        runs += [("cluster1", "", 1), ("cluster2", "", 2)]
    else:  # (no cluster: local[2] in its place, said in the results)
        runs += [("local2", "local[2]", 0)]
    per: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in runs}
    for rnd in range(rounds):
        # round 2 in the reverse order: the machine's load drifts over a run (other work on it), which would
        # favour whichever configuration runs last
        for label, master, workers in (runs if rnd % 2 == 0 else runs[::-1]):
            name = f"{label}-r{rnd + 1}"
            c = Cluster(tmp / f"cluster-{name}", workers).start() if workers else None
            try:
                r = run_applier(tmp, name, c.url if c else master, servers, max_offsets,
                                one_core + f"conf.spark.cores.max={workers}\n" if c else "", timeout)
                if c is not None:
                    apps = [a for a in c.state().get("completedapps", []) + c.state().get("activeapps", [])
                            if a.get("name") == f"bench-spark-apply-{name}"]
                    r["cluster_workers"] = workers
                    r["cluster_app_cores"] = apps[0].get("cores") if apps else None
                    if not apps:
                        res["problems"].append(f"{name}: the application did not run on the cluster")
            finally:
                if c is not None:
                    c.stop()
            wh = r.pop("wh")
            r["wall_rows_per_s"] = round(n / r["wall_seconds"])
            res["problems"] += [f"{name}: {p}" for p in check(wh, want, n - 1)]
            shutil.rmtree(wh.parent / "checkpoint", ignore_errors=True)
            per[label].append(r)
    for label, rs in per.items():
        # over the rounds: all their rows over all their seconds
        agg: dict[str, Any] = {"master": rs[0]["master"], "rounds": rs,
                               "wall_rows_per_s": round(n * len(rs) / sum(r["wall_seconds"] for r in rs))}
        if all("steady_rows_per_s" in r for r in rs):
            agg["steady_rows_per_s"] = round(sum(r["steady_rows"] for r in rs) / sum(r["steady_seconds"] for r in rs))
            agg["steady_split_seconds"] = {k: round(sum(r["steady_split_seconds"][k] for r in rs), 2)
                                           for k in ("read", "regroup", "merge", "pending")}
            agg["steady_seconds"] = round(sum(r["steady_seconds"] for r in rs), 2)
        agg["first_commit_seconds"] = [r["first_commit_seconds"] for r in rs]
        agg["batches"] = [r["batches"] for r in rs]
        res[label] = agg
    base = "cluster1" if cluster else "local1"
    top = "cluster2" if cluster else "local2"
    for k in ("wall_rows_per_s", "steady_rows_per_s"):
        if k in res[top] and k in res[base]:
            res[f"{top}_vs_{base}_{k}"] = round(res[top][k] / res[base][k], 3)
            res[f"{top}_vs_{base}_{k}_per_round"] = [round(a.get(k, 0) / max(b.get(k, 1), 1), 3) for a, b in
                                                     zip(res[top]["rounds"], res[base]["rounds"])]
    if cluster and "steady_rows_per_s" in res["cluster1"] and "steady_rows_per_s" in res["local1"]:
        res["cluster1_vs_local1_steady_rows_per_s"] = round(res["cluster1"]["steady_rows_per_s"]
                                                            / res["local1"]["steady_rows_per_s"], 3)
    res["scale"] = f"{top} vs {base}"
    return res


def summary(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"spark_apply: skipped ({r['skipped']})"
    lines = [f"spark_apply: spark-apply draining {r['changes']:,} changes ({r['transactions']:,} transactions, "
             f"{r['partitions_per_topic']} partitions a topic, <= {r['max_offsets_per_batch']:,} offsets a "
             f"micro-batch) into Delta:"]
    for label in ("local1", "local2", "cluster1", "cluster2"):
        if label not in r:
            continue
        x = r[label]
        split = x.get("steady_split_seconds", {})
        lines.append(f"  {label:<9} wall {x['wall_rows_per_s']:>6,} rows/s (first commit at {x['first_commit_seconds']} s); "
                     f"steady {x.get('steady_rows_per_s', 0):>6,} rows/s over the micro-batches after the first of {x['batches']} "
                     f"(of {x.get('steady_seconds')} s: read {split.get('read')} s, regroup {split.get('regroup')} s, "
                     f"merge {split.get('merge')} s)")
    key = "cluster2_vs_cluster1" if "cluster2" in r else "local2_vs_local1"
    rounds = f"{r['rounds']} rounds, the second in the reverse order" if r["rounds"] > 1 else "1 round"
    lines.append(f"  {r['scale']} ({rounds}): wall "
                 f"{r.get(key + '_wall_rows_per_s')}x (per round {r.get(key + '_wall_rows_per_s_per_round')}), steady "
                 f"{r.get(key + '_steady_rows_per_s')}x (per round {r.get(key + '_steady_rows_per_s_per_round')}) "
                 "[goal >= 1.5]")
    if r["problems"]:
        lines.append(f"  PROBLEMS: {r['problems']}")
    return "\n".join(lines)
