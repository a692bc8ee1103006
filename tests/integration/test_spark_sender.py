"""MySQL -> Spark lake with real local Spark (one session shared by the module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, CapturerProcess, checkpoint_covers, wait_for, write_config
from workload import SCHEMA, Workload

from senders.spark import lake
from senders.spark.lakecli import canon, verify

pytestmark = pytest.mark.integration
pyspark = pytest.importorskip("pyspark")


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from senders.spark.sender import build_session

    s = build_session({"master": "local[2]"}, tmp_path_factory.mktemp("sparkhome"))
    yield s
    s.stop()


def spark_senders(warehouse: Path, **extra: object) -> str:
    opts: dict[str, object] = {"master": "local[2]", "warehouse": warehouse, "batch_interval": 0.3,
                               "compaction_interval": 0}
    opts.update(extra)
    return "[global]\ntype=spark\n[spark]\n" + "".join(f"{k}={v}\n" for k, v in opts.items())


def sources(servers: list[Any]) -> list[dict[str, Any]]:
    return [{"host": "127.0.0.1", "port": m.port, "user": "root", "password": ""} for m in servers]


def lake_state(spark: Any, wh: Path, name: str) -> list[tuple[str, ...]]:
    lake.register_tables(spark, wh)
    return sorted(tuple(canon(v) for v in r) for r in spark.sql(f"SELECT * FROM cdc.{name}").collect())


def test_snapshot_equals_source_and_compaction_keeps_it(tmp_path: Path, two_servers, spark, capturer_running) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute(*SCHEMA)
    wh = tmp_path / "wh"
    cfg = write_config(tmp_path, two_servers, senders=spark_senders(wh))
    with capturer_running(cfg) as cap:
        loads = [Workload(m, i + 1, 50 + i) for i, m in enumerate(two_servers)]
        for t in [w.thread(300) for w in loads]:
            t.join()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 180, "Spark to catch up")
        sender = cap.senders[0]
        for table in ("users", "pairs", "log"):
            r = verify(spark, wh, "cdc", "app", table, sources(two_servers))
            assert r["equal"], r
        before = {t: lake_state(spark, wh, f"app__{t}") for t in ("users", "pairs", "log")}
        t0 = time.monotonic()
        sender.compact_all()  # runs in the sender's session; same answer afterwards
        print(f"compaction of 3 tables: {time.monotonic() - t0:.1f}s")
        after = {t: lake_state(spark, wh, f"app__{t}") for t in ("users", "pairs", "log")}
        assert before == after
        st = lake.TableState.load(wh / "app__users")
        assert st is not None and st.generation == 1 and st.watermark > 0
        # more changes after the compaction: snapshot + newer changelog still give the source
        for t in [w.thread(150) for w in loads]:
            t.join()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 180)
        for table in ("users", "pairs", "log"):
            r = verify(spark, wh, "cdc", "app", table, sources(two_servers))
            assert r["equal"], r
    rows = spark.read.parquet(str(wh / "app__users" / "changelog")).count()
    assert rows >= sum(w.rows for w in loads) // 2


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_add_column_and_types_and_truncate(tmp_path: Path, two_servers, spark, capturer_running, writer: str) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute(
        "CREATE DATABASE ty",
        """CREATE TABLE ty.t (id INT PRIMARY KEY, d DECIMAL(20,6), dt6 DATETIME(6), ts TIMESTAMP(6) NULL,
           j JSON, b BLOB, bits BIT(5), s VARCHAR(50), u BIGINT UNSIGNED, dd DATE, tm TIME(3), f DOUBLE,
           e ENUM('x','y'), st SET('a','b','c'), y YEAR)""",
        "CREATE TABLE ty.gone (id INT PRIMARY KEY)",
        "CREATE TABLE ty.d1 (id INT PRIMARY KEY)", "CREATE TABLE ty.d2 (id INT PRIMARY KEY)",
        "CREATE DATABASE dd", "CREATE TABLE dd.x (id INT PRIMARY KEY)",
    )
    wh = tmp_path / "wh"
    cfg = write_config(tmp_path, two_servers[:1], senders=spark_senders(wh, writer=writer))
    with capturer_running(cfg):
        m1.execute(
            "SET time_zone='+00:00'",
            """INSERT INTO ty.t VALUES (1, -12345678901234.123456, '2024-02-29 23:59:59.999999',
               '2024-01-02 03:04:05.123456', '{"k": [1]}', X'00ff', b'10101', 'héllo 😀', 18446744073709551615,
               '1999-12-31', '-838:59:59.000', 1.5e300, 'y', 'a,c', 2155), (2, NULL, NULL, NULL, NULL, NULL,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
            "ALTER TABLE ty.t ADD COLUMN added VARCHAR(10) DEFAULT 'dflt'",
            "INSERT INTO ty.t (id, added) VALUES (3, 'new')",
            "UPDATE ty.t SET added = 'set' WHERE id = 1",
            "INSERT INTO ty.gone VALUES (1), (2)",
            "TRUNCATE TABLE ty.gone",
            "INSERT INTO ty.gone VALUES (3)",
            "INSERT INTO ty.d1 VALUES (1)", "INSERT INTO ty.d2 VALUES (1), (2)", "INSERT INTO dd.x VALUES (1)",
        )
        wait_for(lambda: all((wh / n / "_state.json").exists() for n in ("ty__d1", "ty__d2", "dd__x")), 120,
                 "the lake tables to be dropped")
        # every table of a DROP TABLE a, b, and every table of a DROP DATABASE (only the first table was)
        m1.execute("DROP TABLE ty.d1, ty.d2", "DROP DATABASE dd")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 120)
    r = verify(spark, wh, "cdc", "ty", "t", sources(two_servers[:1]))
    assert r["equal"], json.dumps(r, default=str)
    r = verify(spark, wh, "cdc", "ty", "gone", sources(two_servers[:1]))
    assert r["equal"] and r["lake_rows"] == 1, r
    for name in ("ty__d1", "ty__d2", "dd__x"):
        st = lake.TableState.load(wh / name)
        assert st is not None and st.reset_ts > 0, (name, st)
        assert spark.sql(f"SELECT * FROM cdc.{name}").count() == 0, name
    row = spark.sql("SELECT * FROM cdc.ty__t WHERE id = 1").collect()[0]
    assert row["added"] == "set" and row["bits"] == 21 and row["b"] == bytearray(b"\x00\xff")
    types = dict(spark.table("cdc.ty__t").dtypes)
    assert types["dt6"] == "timestamp_ntz" and types["u"] == "decimal(20,0)" and types["d"] == "decimal(38,6)"
    files = list((wh / "ty__t" / "changelog").glob("*.parquet"))
    assert files and not list((wh / "ty__t" / "changelog").glob(".*.tmp"))
    # who wrote the files: pyarrow in the capturer, or Spark's own writer
    import pyarrow.parquet as pq

    created_by = pq.ParquetFile(files[0]).metadata.created_by
    assert ("parquet-cpp" in created_by) == (writer == "arrow"), created_by


def test_incompatible_type_change_is_a_clear_error(tmp_path: Path, two_servers, spark) -> None:  # type: ignore[no-untyped-def]
    from capturer.app import Capturer, load_config

    m1 = two_servers[0]
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)", "INSERT INTO d.t VALUES (1, 1)",
               "ALTER TABLE d.t MODIFY v VARCHAR(10)", "INSERT INTO d.t VALUES (2, 'two')")
    wh = tmp_path / "wh"
    cap = Capturer(load_config(write_config(tmp_path, two_servers[:1], senders=spark_senders(wh))))
    cap.start()
    code = cap.run(until=lambda c: time.sleep(0.1) or False if not c.failure else True)
    assert code == 1
    assert "column 'v' changed type from bigint to string" in cap.failure
    assert "Way out" in cap.failure and str(wh / "d__t") in cap.failure


def test_kill9_replay_is_deduplicated(tmp_path: Path, two_servers, spark) -> None:  # type: ignore[no-untyped-def]
    for m in two_servers:
        m.execute(*SCHEMA)
    wh = tmp_path / "wh"
    cfg = write_config(tmp_path, two_servers, senders=spark_senders(wh))
    log = tmp_path / "capturer.log"
    loads = [Workload(m, i + 1, 70 + i) for i, m in enumerate(two_servers)]
    threads = [w.thread(500) for w in loads]
    proc = CapturerProcess(cfg, log).start()
    wait_for(lambda: (wh / "app__users" / "changelog").exists() and (tmp_path / "checkpoint.json").exists(),
             120, "first appends")
    time.sleep(2)
    proc.kill9()
    for t in threads:
        t.join()
    proc = CapturerProcess(cfg, log).start()
    wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 180, "catch-up after kill -9")
    assert proc.stop() == 0
    cl = spark.read.parquet(str(wh / "app__users" / "changelog"))
    total = cl.count()
    distinct = cl.select("_region", "_commit_ts", "_seq", "_sub").distinct().count()
    print(f"changelog rows {total}, distinct identities {distinct}")
    assert total == distinct  # each batch is committed to the lake once (senders/spark/commits.py)
    for table in ("users", "pairs", "log"):
        r = verify(spark, wh, "cdc", "app", table, sources(two_servers))
        assert r["equal"], r


def test_lakecli_verify_and_show(tmp_path: Path, two_servers, capturer_running, spark) -> None:  # type: ignore[no-untyped-def]
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(10))")
    wh = tmp_path / "wh"
    cfg = write_config(tmp_path, two_servers[:1], senders=spark_senders(wh))
    with capturer_running(cfg):
        m1.execute("INSERT INTO d.t VALUES (1, 'a'), (2, 'b')", "DELETE FROM d.t WHERE id = 2")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 120)
    m1.execute("INSERT INTO d.t VALUES (9, 'late')")  # the capturer is stopped: lake is behind
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "senders.spark.lakecli", "verify", "--config", str(cfg), "--table", "d.t"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    report = json.loads(r.stdout[r.stdout.index("{"):])
    assert report["missing"] == 1 and report["extra"] == 0 and report["examples"]["missing"] == [["9"]]
    r = subprocess.run([sys.executable, "-m", "senders.spark.lakecli", "show", "d.t", "--warehouse", str(wh)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    import re

    assert r.returncode == 0 and re.search(r"\|1\s*\|a\s*\|", r.stdout), r.stdout + r.stderr[-2000:]
    assert not re.search(r"\|2\s*\|", r.stdout)


@pytest.mark.slow  # CI time (sender processes: test_agents.py::test_senders_in_their_own_processes)
def test_compaction_in_a_sender_process_starts_its_session_on_demand(tmp_path: Path, two_servers, spark,  # type: ignore[no-untyped-def]
                                                                     capturer_running) -> None:
    """process=true: the child writes with pyarrow and has no Spark session until a
    compaction comes due; then it starts one (its own JVM) between batches, and the
    capturer's housekeeping messages let it compact while no batch comes."""
    for m in two_servers:
        m.execute(*SCHEMA)
    wh = tmp_path / "wh"
    cfg = write_config(tmp_path, two_servers, senders=spark_senders(wh, process="true", compaction_interval=3))
    with capturer_running(cfg) as cap:
        sender = cap.senders[0]
        loads = [Workload(m, i + 1, 70 + i) for i, m in enumerate(two_servers)]
        for t in [w.thread(150) for w in loads]:
            t.join()
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers), 180, "Spark to catch up")
        st = sender.status()
        assert st["process"]["pid"] and st["writer"] == "arrow"
        # the stream is idle now: only housekeeping reaches the child
        wait_for(lambda: sender.status().get("compactions", 0) >= 1, 180, "a compaction in the sender's process")
        assert sender.status()["session"] == "ready"
    state = lake.TableState.load(wh / "app__users")
    assert state is not None and state.generation >= 1
    for table in ("users", "pairs", "log"):
        r = verify(spark, wh, "cdc", "app", table, sources(two_servers))
        assert r["equal"], r


def test_rename_table_in_the_changelog_lake(tmp_path: Path, two_servers, spark, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """RENAME TABLE (one pair, a swap through a third name, ALTER TABLE ... RENAME) in the changelog lake:
    each source table's lake view equals it afterwards."""
    m1 = two_servers[0]
    m1.execute("CREATE DATABASE rn", "CREATE TABLE rn.a (id INT PRIMARY KEY, who VARCHAR(10))",
               "CREATE TABLE rn.b (id INT PRIMARY KEY, who VARCHAR(10))",
               "CREATE TABLE rn.c (id INT PRIMARY KEY, v INT)")
    wh = tmp_path / "wh"
    cfg = write_config(tmp_path, two_servers[:1], senders=spark_senders(wh))
    with capturer_running(cfg):
        m1.execute("INSERT INTO rn.a VALUES (1, 'a'), (2, 'a')", "INSERT INTO rn.b VALUES (1, 'b')",
                   "INSERT INTO rn.c VALUES (1, 1), (2, 2)")
        wait_for(lambda: all((wh / f"rn__{t}" / "_state.json").exists() for t in "abc"), 120, "the lake tables")
        m1.execute("RENAME TABLE rn.a TO rn.tmp, rn.b TO rn.a, rn.tmp TO rn.b",
                   "UPDATE rn.a SET who = 'b2' WHERE id = 1", "INSERT INTO rn.b VALUES (3, 'a3')",
                   "ALTER TABLE rn.c RENAME TO rn.d", "UPDATE rn.d SET v = 20 WHERE id = 2")
        wait_for(lambda: checkpoint_covers(tmp_path, two_servers[:1]), 120)
    for table in ("a", "b", "d"):
        r = verify(spark, wh, "cdc", "rn", table, sources(two_servers[:1]))
        assert r["equal"], json.dumps(r, default=str)
