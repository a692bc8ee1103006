"""An applier into Delta Lake tables (issue 47 item 6, "apply can target them"): two MariaDB
sources under the hostile OLTP mix of tests/workload.py (primary-key changes, unique-key
swaps, rollbacks, deletes, a keyless append-only table) and a few cases of their own (a key
change inside a transaction, a rollback, a delete, an ADD COLUMN with a default), the capturer
writing Apache Kafka (json, ``txn_topic``), and ``python -m capturer apply`` (a child process,
as start.sh runs it) whose sender is ``[spark] table_format = delta`` (real local Spark with the
Delta runtime).

* the Delta tables equal the sources, read by Spark SQL with the Delta runtime and, independently,
  by delta-rs (the helpers of test_spark_delta.py);
* kill -9 of the applier in the middle of the load, and once more right after a table's MERGE
  committed (the ``spark.committed`` failpoint, often between the tables of one batch), each
  followed by a restart: equal again, no change applied twice (the keyless ``app.log`` would show
  a duplicate as a row too many, and each change identity once), every table's commits of the
  applier carry strictly growing txnVersions and stream keys.

Skipped exactly where test_spark_delta.py is (``deltajars.incompatible()``: e.g. PySpark 4.3 with
Delta 4.4.0; no Java; neither mvn nor the cached jars; no ``deltalake``)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import CapturerProcess, shared_broker, start_servers, wait_for
from workload import SCHEMA, TABLES, Workload

from capturer.util import failpoints
from integration.test_apply import TXN_TOPIC, ApplierProcess, capturer_config, keep_logs, tear_down, write_applier
from senders.spark import deltajars

pytestmark = pytest.mark.integration
pytest.importorskip("pyspark")
pytest.importorskip("deltalake")
if deltajars.incompatible():
    pytest.skip(deltajars.incompatible(), allow_module_level=True)
if shutil.which("java") is None or (not (deltajars.cache_dir() / "lib" / ".complete").exists()
                                    and shutil.which("mvn") is None):
    pytest.skip("table_format=delta needs java, and mvn or the cached Delta jars", allow_module_level=True)

APPLIER = "dl"  # the applier's name: its Delta sender is "dl.spark", its txnAppIds binlog-capturer/dl.spark/<table>
MARKS = "CREATE DATABASE mk", "CREATE TABLE mk.done (n INT PRIMARY KEY, r INT)"


@pytest.fixture(scope="module")
def spark_of(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    """The module's Spark session with Delta (for the comparisons), started at its first use: after
    the applier's own Spark has caught up and stopped (two JVMs at work slow both on two cores)."""
    held: list[Any] = []

    def get() -> Any:
        if not held:
            from senders.spark.deltasink import build_delta_session

            held.append(build_delta_session({"master": "local[2]", "conf.*": {"spark.driver.memory": "512m"}},
                                            tmp_path_factory.mktemp("sparkhome")))
        return held[0]

    yield get
    if held:
        held[0].stop()


@pytest.fixture()
def rig(tmp_path: Path) -> Iterator[dict[str, Any]]:
    sources = start_servers(tmp_path, 2)
    for m in sources:
        m.execute(*SCHEMA)
        m.execute(*MARKS)
    sources[0].execute("CREATE DATABASE ty", "CREATE TABLE ty.t (id INT PRIMARY KEY, v VARCHAR(20), "
                       "d DECIMAL(12,3), at DATETIME(6))", "CREATE TABLE ty.k (v VARCHAR(10), n INT)")
    broker = shared_broker()
    procs: list[Any] = []
    try:
        yield {"sources": sources, "tmp": tmp_path, "broker": broker, "procs": procs, "wh": tmp_path / "wh"}
    finally:
        tear_down(tmp_path, procs, broker)
        for m in sources:
            try:
                m.stop()
            except Exception:
                pass


def hostile(m: Any) -> None:
    """On the first source, during the load: a key change (alone and inside a transaction that then
    updates the moved row), a rollback, deletes, an ADD COLUMN with a default and rows written after
    it; a keyless table with duplicate rows, one of them deleted."""
    m.execute(
        "INSERT INTO ty.t VALUES (1, 'one', 1.5, '2024-02-29 23:59:59.999999'), (2, 'two', NULL, NULL), "
        "(3, 'three', -3.125, '1999-12-31 00:00:00'), (5, 'five', 5, NULL)",
        "UPDATE ty.t SET id = 10, v = 'moved' WHERE id = 5",
        "BEGIN", "UPDATE ty.t SET id = 20 WHERE id = 3", "UPDATE ty.t SET v = 'after move' WHERE id = 20", "COMMIT",
        "BEGIN", "DELETE FROM ty.t WHERE id = 1", "INSERT INTO ty.k VALUES ('gone', 0)", "ROLLBACK",
        "INSERT INTO ty.k VALUES ('dup', 1), ('dup', 1), ('one', 2)",
        "DELETE FROM ty.k WHERE v = 'dup' LIMIT 1",
        "ALTER TABLE ty.t ADD COLUMN added VARCHAR(10) DEFAULT 'dflt'",
        "INSERT INTO ty.t (id, v, added) VALUES (6, 'six', 'new')",
        "UPDATE ty.t SET added = 'set' WHERE id = 1",
        "DELETE FROM ty.t WHERE id = 2",
        "UPDATE ty.k SET n = 3 WHERE v = 'one'",
    )


def start_pipeline(rig: dict[str, Any], **sender: object) -> tuple[CapturerProcess, Path, int]:
    """The capturer (Kafka sender, json, txn_topic) running, and the applier's config (not started)."""
    from integration.test_spark_delta import delta_senders

    tmp, broker = rig["tmp"], rig["broker"]
    cap = CapturerProcess(capturer_config(tmp, rig["sources"], broker.servers), tmp / "capturer.log").start()
    rig["procs"].append(cap)
    cap.wait_ready()
    cfg, port = write_applier(tmp, APPLIER, broker.servers, delta_senders(rig["wh"], **sender))
    return cap, cfg, port


def delta_count(tdir: Path) -> int:
    """Rows of a Delta table by delta-rs in this process (-1 while it does not exist)."""
    import deltalake
    import pyarrow as pa

    if not (tdir / "_delta_log").is_dir() or not any((tdir / "_delta_log").glob("[0-9]*.json")):
        return -1  # (the directory is made before the table's first commit)
    try:
        dt = deltalake.DeltaTable(str(tdir))
    except deltalake.exceptions.TableNotFoundError:
        return -1
    t = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT count(*) AS n FROM t").read_all())
    return int(t.column("n")[0].as_py())


def mark_and_wait(rig: dict[str, Any], n0: int, timeout: float, appliers: list[ApplierProcess]) -> None:
    """A marker transaction on each source after everything else; until the applier has merged both
    (the spine's order: everything before them is in the Delta tables then)."""
    for i, m in enumerate(rig["sources"]):
        m.execute(f"INSERT INTO mk.done VALUES ({n0 + i}, {i + 1})")
    want = n0 + len(rig["sources"]) - 1
    tdir = rig["wh"] / "mk__done"
    try:
        wait_for(lambda: delta_count(tdir) >= want, timeout, "the applier to merge the markers")
    except AssertionError as exc:
        states = []
        for a in appliers:
            try:
                states.append(json.dumps(a.status(), default=str)[:6000])
            except Exception as e:
                states.append(repr(e))
        raise AssertionError(f"{exc}; appliers: {states}") from None


def check_equal(rig: dict[str, Any], spark: Any) -> None:
    """Every table equal to its sources by Spark SQL and by delta-rs; every table's commits of the
    applier with strictly growing txnVersions and stream keys, each key once; each change identity of
    the append-only table once; delta-rs reads the same last txnVersion."""
    from integration.test_spark_delta import assert_equal, commit_keys, deltars_rows

    wh, sources = rig["wh"], rig["sources"]
    for table in TABLES:
        assert_equal(spark, wh, sources, "app", table)
    for table in ("t", "k"):
        assert_equal(spark, wh, sources[:1], "ty", table)
    types = dict(spark.read.format("delta").load(str(wh / "ty__t")).dtypes)
    assert types["added"] == "string" and types["d"] == "decimal(38,3)" and types["at"] == "timestamp_ntz", types
    for db, table in [("app", t) for t in TABLES] + [("ty", "t"), ("ty", "k")]:
        name = f"{db}__{table}"
        keys = commit_keys(wh / name)
        versions = [v for v, _ in keys]
        assert keys and all(a < b for a, b in zip(versions, versions[1:])), f"{name}: txnVersions {versions}"
        assert all(a < b for a, b in zip((k for _, k in keys), (k for _, k in keys[1:]))), \
            f"{name}: a commit went back in the stream, or a batch was merged twice"
        app_id = f"binlog-capturer/{APPLIER}.spark/{name}"
        _, d = deltars_rows(wh, db, table, [], (app_id,))
        assert d["txn"][app_id] == versions[-1], (name, d["txn"], versions[-1])
    for table in ("app__log", "ty__k"):
        ids = spark.read.format("delta").load(str(wh / table)).select("_commit_ts", "_region", "_seq", "_sub")
        assert ids.count() == ids.distinct().count() > 0, f"{table}: a change appended twice"


def test_applier_into_delta_equals_the_sources(rig: dict[str, Any], spark_of: Callable[[], Any]) -> None:
    t0 = time.monotonic()
    _cap, cfg, port = start_pipeline(rig)
    ap = ApplierProcess(cfg, rig["tmp"] / "apply.log", port).start()
    rig["procs"].append(ap)
    sources = rig["sources"]
    loads = [Workload(m, i + 1, 40 + i) for i, m in enumerate(sources)]
    threads = [w.thread(100) for w in loads]
    hostile(sources[0])
    for t in threads:
        t.join(300)
    assert not any(w.errors for w in loads), [w.errors for w in loads]
    mark_and_wait(rig, 1, 360, [ap])
    st = ap.status()
    s = st["senders"][f"{APPLIER}.spark"]
    assert s["table_format"] == "delta" and st["state"] == "running" and st["errors"]["bad_messages"] == 0, st
    print(f"load + catch-up: {time.monotonic() - t0:.1f}s; {st['applied']['txns']} transactions, "
          f"{st['applied']['rows']} rows; {s['merges']} MERGEs of {s['merged_rows']} changes in "
          f"{s['merge_seconds']:.1f}s")
    assert ap.stop() == 0
    check_equal(rig, spark_of())
    keep_logs(rig["tmp"])


def _paced(w: Workload, pace: float) -> threading.Thread:
    """``w`` until ``w.stop`` is set, a transaction every ``pace`` seconds at most."""
    def go() -> None:
        try:
            while not w.stop.is_set():
                w.step()
                time.sleep(pace)
        except BaseException as exc:
            w.errors.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def replayed_but_merged(rig: dict[str, Any]) -> int:
    """How many transactions a restarted applier reads again (its group's committed offset in the
    spine on) that some Delta table holds already (at or below the table's newest stream key): what
    the Delta sender must drop, table by table, for no change to be applied twice."""
    import confluent_kafka

    from integration.test_spark_delta import commit_keys

    merged = max((commit_keys(d)[-1][1] for d in rig["wh"].iterdir() if (d / "_delta_log").is_dir()
                  and commit_keys(d)), default=None)
    assert merged is not None
    servers = rig["broker"].servers
    c = confluent_kafka.Consumer({"bootstrap.servers": servers, "group.id": f"capturer-apply-{APPLIER}",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        (tp,) = c.committed([confluent_kafka.TopicPartition(TXN_TOPIC, 0)], timeout=30)
        start = max(tp.offset, 0)
        _, end = c.get_watermark_offsets(confluent_kafka.TopicPartition(TXN_TOPIC, 0), timeout=30)
        c.assign([confluent_kafka.TopicPartition(TXN_TOPIC, 0, start)])
        n, offset = 0, start
        while offset < end - 1:
            m = c.poll(10)
            assert m is not None, f"the spine read stalled at {offset} of {end}"
            if m.error() or m.value() is None:
                continue
            offset = int(m.offset() or 0)
            d = json.loads(m.value() or b"{}")
            if d["status"] == "END" and [d["commit_ts"], d["region"], 0] <= merged:
                n += 1
        return n
    finally:
        c.close()


def _merges(rig: dict[str, Any]) -> int:
    """Commits of the applier in app.users's Delta table so far."""
    logdir = rig["wh"] / "app__users" / "_delta_log"
    return len(list(logdir.glob("[0-9]*.json"))) if logdir.is_dir() else 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_applier_kill9_mid_load_and_after_a_merge_applies_nothing_twice(
        rig: dict[str, Any], spark_of: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = time.monotonic()
    _cap, cfg, port = start_pipeline(rig)
    log = rig["tmp"] / "apply.log"
    sources = rig["sources"]
    loads = [Workload(m, i + 1, 60 + i) for i, m in enumerate(sources)]
    threads = [_paced(w, 0.05) for w in loads]
    try:
        # 1. kill -9 in the middle of the load, a few MERGEs in
        ap = ApplierProcess(cfg, log, port).start()
        rig["procs"].append(ap)
        wait_for(lambda: _merges(rig) >= 3, 240, "the applier's first MERGEs")
        hostile(sources[0])
        time.sleep(1.5)
        ap.kill9()
        # 2. kill -9 right after a table's MERGE committed (and before the offsets hold its batch)
        monkeypatch.setenv(failpoints.ENV, "spark.committed=kill@4")
        ap = ApplierProcess(cfg, log, port).start()
        rig["procs"].append(ap)
        assert ap.proc is not None
        assert ap.proc.wait(240) == -9
        monkeypatch.delenv(failpoints.ENV)
        # the kill came after a MERGE and before its batch was acknowledged: the restart reads it again
        replayed = replayed_but_merged(rig)
        assert replayed > 0
        # 3. the last start: it catches up
        ap = ApplierProcess(cfg, log, port).start()
        rig["procs"].append(ap)
        wait_for(lambda: ap.rows() > 0, 180, "the restarted applier to apply rows")
    finally:
        for w in loads:
            w.stop.set()
        for t in threads:
            t.join(60)
    assert not any(w.errors for w in loads), [w.errors for w in loads]
    mark_and_wait(rig, 1, 360, [ap])
    st = ap.status()
    assert st["errors"]["bad_messages"] == 0 and st["state"] == "running", st
    print(f"load, 2 kills and a catch-up: {time.monotonic() - t0:.1f}s; {sum(w.txns for w in loads)} source "
          f"transactions; {replayed} transaction(s) merged already read again after the second kill")
    assert ap.stop() == 0
    check_equal(rig, spark_of())
    keep_logs(rig["tmp"])
