"""BaikalDB regions end to end against the BaikalDB double (devtools/baikaldb_double:
meta and stores as real HTTP servers on 127.0.0.1; no BaikalDB server can be
installed here), with real MariaDB targets and the real senders."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import CapturerProcess, read_lines, wait_for

from capturer.app import Capturer, load_config
from devtools.baikaldb_double import BaikalDouble
from devtools.baikaldb_workload import (
    BAL,
    ORDERS,
    Workload,
    assert_file_equals,
    assert_mysql_equals,
    baikal_config,
    build,
    covered,
)
from devtools.local_mariadb import MariaDBInstance

pytestmark = pytest.mark.integration


@pytest.fixture
def double() -> Iterator[BaikalDouble]:
    d = BaikalDouble(n_stores=3, n_meta=2, fake_ms=200).start()
    build(d)
    yield d
    d.stop()


def file_sender(tmp: Path) -> str:
    return f"[global]\ntype=local\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n"


def file_and_mysql(tmp: Path, target: MariaDBInstance) -> str:
    return (f"[global]\ntype=local,mysql\n[local]\nfilepath={tmp / 'out' / 'changes.jsonl'}\n"
            f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n")


def streaming(cap: Capturer) -> None:
    """Until every region has discovered its tables (a schema change before that
    would be the schema the capturer starts with)."""
    wait_for(lambda: all(r.state == "streaming" for r in cap.regions), 60, "regions to stream")


def status(cap: Capturer) -> dict[str, Any]:
    return json.loads(requests.get(f"http://127.0.0.1:{cap.status_server.port}/status", timeout=5).text)  # type: ignore[union-attr]


def test_workload_with_schema_changes_to_file_and_mysql(tmp_path: Path, double: BaikalDouble,
                                                        target: MariaDBInstance, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """2 binlog tables x 3 regions, random region per transaction, every type,
    NULLs, PK changes, a unique-key swap, multi-partition transactions, rollbacks,
    ADD/DROP COLUMN mid-stream: the file and the MySQL target equal the double."""
    w = Workload(double.cluster, seed=11)
    w.run(40)  # some history before the capturer starts (read from the oldest binlog)
    cfg = baikal_config(tmp_path, double, file_and_mysql(tmp_path, target))
    with capturer_running(cfg) as cap:
        streaming(cap)
        w.run(250, schema_at={60: 1, 150: 2, 200: 3})
        wait_for(lambda: covered(tmp_path, w), 120, "the checkpoint to pass the last commit")
        # a dropped column shows in no row: it is seen by the next schema refresh
        # (schema_refresh=2 s, later on a loaded machine) and sent at a heartbeat
        wait_for(lambda: any("DROP COLUMN `note`" in x["sql"] for x in read_lines(tmp_path) if x["op"] == "ddl"),
                 60, "the DROP COLUMN to be seen by a schema refresh")
        st = status(cap)
        metrics = requests.get(f"http://127.0.0.1:{cap.status_server.port}/metrics", timeout=5).text
    assert w.rows > 500 and w.rollbacks > 0
    assert_file_equals(double.cluster, tmp_path / "out" / "changes.jsonl")
    assert_mysql_equals(double.cluster, target)
    shop, acct = st["regions"]["shop"], st["regions"]["acct"]
    assert len(shop["store_regions"]) == 3 and len(acct["store_regions"]) == 3 and acct["partitions"] == 3
    assert acct["counters"].get("multi_partition_txns", 0) > 0
    assert shop["counters"]["ddl"] >= 4  # CREATE DATABASE/TABLE x2, ADD COLUMN + DROP COLUMN (maybe one ALTER)
    assert st["senders"]["mysql"]["errors"] == 0
    assert 'capturer_region_lag_seconds{region="shop"}' in metrics
    lines = read_lines(tmp_path)
    ddl = [x["sql"] for x in lines if x["op"] == "ddl"]
    assert any("ADD COLUMN `extra` INT NULL DEFAULT 5" in s for s in ddl)
    assert any("DROP COLUMN `note`" in s for s in ddl)
    assert any("ADD COLUMN `tier` LONGTEXT NULL DEFAULT 'std'" in s for s in ddl)
    # one merged order: commit_ts never goes back in the file
    tss = [x["commit_ts"] for x in lines]
    assert tss == sorted(tss)
    assert not any(x.get("after") and x["after"].get("customer") == "rolled back" for x in lines)
    # a transfer that spanned partitions is one transaction downstream: a BaikalDB
    # transaction id never appears at two commit_ts, and some span partitions
    at: dict[str, set[int]] = {}
    for x in lines:
        if x["op"] != "ddl" and x.get("gtid"):
            at.setdefault(f'{x["region"]}/{x["gtid"]}', set()).add(x["commit_ts"])
    split = {g: sorted(t) for g, t in at.items() if len(t) > 1}
    assert not split, f"transactions split into several: {list(split.items())[:3]}"
    multi = [x for x in lines if x["region"] == "acct" and x["op"] == "update" and x["txn_rows"] >= 2]
    assert multi


def test_faults_leader_change_dead_peer_version_old_malformed(tmp_path: Path, double: BaikalDouble,
                                                             capturer_running) -> None:  # type: ignore[no-untyped-def]
    """Each fault while the capturer is reading, then more writes: nothing lost,
    and the status shows what happened."""
    c = double.cluster
    w = Workload(c, seed=5)
    w.run(20)
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path))
    shop_regions = c.binlogs[20].regions

    def phase(steps: int = 20) -> dict[str, Any]:
        w.run(steps)
        wait_for(lambda: covered(tmp_path, w), 60, "the checkpoint to pass the last commit")
        st = status(cap)
        regions = list(st["regions"]["shop"]["store_regions"].values()) + \
            list(st["regions"]["acct"]["store_regions"].values())
        return {k: sum(x[k] for x in regions) for k in ("not_leader", "peer_failures", "version_old", "retries")}

    with capturer_running(cfg) as cap:
        streaming(cap)
        base = phase()
        # 1. leader change; followers do not serve reads here, so the old leader
        # answers NOT_LEADER naming the new one
        r0 = shop_regions[0]
        r0.follower_reads = False
        r0.leader = r0.peers[1]
        after = phase()
        assert after["not_leader"] > base["not_leader"], after
        # 2. an election: no leader known (NOT_LEADER 0.0.0.0:0) for a while, then a new one
        r1 = shop_regions[1]
        r1.leader_unknown = True
        w.run(10)
        time.sleep(1.0)
        r1.leader_unknown = False
        r1.leader = r1.peers[2]
        before = after
        after = phase()
        assert after["retries"] > before["retries"], after
        # 3. a dead peer (connections refused, kept-alive ones cut): the other peers serve
        dead = next(i for i, s in enumerate(double.stores) if s.addr == shop_regions[2].leader)
        double.stores[dead].stop()
        before = after
        after = phase()
        assert after["peer_failures"] > before["peer_failures"], after
        # 4. VERSION_OLD: the regions' version moves on; the reader takes the new one
        for r in c.binlogs[30].regions:
            r.version += 1
        before = after
        after = phase()
        assert after["version_old"] > before["version_old"], after
        # 5. unreadable bodies from one store, and a meta server that is (re)starting
        double.restart_store(dead)
        for s in double.stores:
            s.malformed = 2
        c.meta_init = False
        w.run(20)
        time.sleep(2.5)  # longer than schema_refresh: the refresh fails and is retried
        c.meta_init = True
        before = after
        after = phase()
        assert after["peer_failures"] > before["peer_failures"], after
        # 6. the meta leader is down: the other meta peer answers the schema refresh,
        # which sees a schema change (its DDL arrives in order)
        double.metas[0].stop()
        w.schema_change(3)
        phase(30)
        st = status(cap)
    assert_file_equals(c, tmp_path / "out" / "changes.jsonl")
    shop = st["regions"]["shop"]["store_regions"]
    acct = st["regions"]["acct"]["store_regions"]
    assert all(x["version"] == 2 for x in acct.values())
    assert shop[str(r0.region_id)]["leader"] == r0.peers[1]
    assert shop[str(r1.region_id)]["leader"] == r1.peers[2]
    assert all(x["state"] == "streaming" for x in list(shop.values()) + list(acct.values()))
    assert any(x["op"] == "ddl" and "ADD COLUMN `tier`" in x["sql"] for x in read_lines(tmp_path))


def test_lagging_leader_is_read_through_followers(tmp_path: Path, double: BaikalDouble, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """The leader answers "nothing new" while the position is behind the clock by
    more than follower_read_after: the followers are asked (the C++ capturer's
    policy), and what they serve is delivered."""
    c = double.cluster
    w = Workload(c, seed=3)
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path), region_extra="follower_read_after=0\n")
    region = c.binlogs[20].regions[0]
    with capturer_running(cfg) as cap:
        w.run(10)
        wait_for(lambda: covered(tmp_path, w), 60)
        with c.lock:
            region.lag[region.leader] = region.check_point()  # the leader stops applying
        w.run(40)
        wait_for(lambda: covered(tmp_path, w), 60)
        # a follower that lags too (it serves a shorter prefix), and one still at an
        # older region version after a version change (NOT_LEADER for a newer version)
        f1, f2 = [p for p in region.peers if p != region.leader]
        with c.lock:
            region.lag[f1] = region.check_point()
            region.version += 1
            region.peer_version[f2] = region.version - 1
        w.run(40)
        with c.lock:
            region.lag.pop(f1)
        w.run(10)
        wait_for(lambda: covered(tmp_path, w), 60)
        st = status(cap)
    assert_file_equals(c, tmp_path / "out" / "changes.jsonl")
    sr = st["regions"]["shop"]["store_regions"][str(region.region_id)]
    assert sr["follower_reads"] > 0, sr
    assert sr["leader"] == region.leader
    assert sr["version_old"] >= 1 and sr["version"] == region.version


def test_held_check_point_holds_the_merge(tmp_path: Path, double: BaikalDouble, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """An outstanding prewrite holds its region's check point: nothing after it
    leaves (in any region), then everything does, in commit order."""
    c = double.cluster
    w = Workload(c, seed=9)
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path))
    with capturer_running(cfg):
        w.run(10)
        wait_for(lambda: covered(tmp_path, w), 60)
        held = c.begin().insert(ORDERS, w.order()).prewrite()
        before = len(read_lines(tmp_path))
        w.run(20)  # commits after the held prewrite's start_ts
        time.sleep(2.0)
        during = [x for x in read_lines(tmp_path)[before:] if x["op"] != "ddl" and x["region"] == "shop"]
        assert during == [], f"{len(during)} changes passed a held check point"
        ts = held.commit()
        w.last_ts[20] = max(w.last_ts.get(20, 0), ts)
        wait_for(lambda: covered(tmp_path, w), 60)
    assert_file_equals(c, tmp_path / "out" / "changes.jsonl")
    tss = [x["commit_ts"] for x in read_lines(tmp_path)]
    assert tss == sorted(tss)


def test_purged_binlog_is_a_fatal_error_naming_region_and_ts(tmp_path: Path, double: BaikalDouble,
                                                             capturer_running) -> None:  # type: ignore[no-untyped-def]
    c = double.cluster
    w = Workload(c, seed=2)
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path))
    with capturer_running(cfg):
        w.run(10)
        wait_for(lambda: covered(tmp_path, w), 60)
    cp = json.loads((tmp_path / "checkpoint.json").read_text())
    resume = cp["regions"]["shop"]["ts"]
    w.run(10)
    victim = c.binlogs[20].regions[1]
    c.purge(victim.region_id, c.tso.alloc())  # everything the capturer still needs is gone
    cap = Capturer(load_config(cfg))
    cap.start()
    code = cap.run()
    assert code == 1
    msg = cap.failure
    assert f"binlog region {victim.region_id}" in msg and str(resume) in msg and "LESS_THAN_OLDEST_TS" in msg
    assert "start=earliest" in msg and "re-seed" in msg
    after = json.loads((tmp_path / "checkpoint.json").read_text())
    assert after["regions"]["shop"]["ts"] == resume  # nothing skipped


@pytest.mark.parametrize("mode", ["error", "split"])
def test_unpaired_update(tmp_path: Path, double: BaikalDouble, mode: str) -> None:
    c = double.cluster
    w = Workload(c, seed=4)
    w.run(8)
    a, b = sorted(c.tables[BAL].rows)[:2]
    rows = c.tables[BAL].rows
    # REPLACE-like: two old images, one new
    c.begin().raw(BAL, 1, [rows[a], rows[b]], [{**rows[a], "owner": "merged"}]).commit()
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path), region_extra=f"unpaired_update={mode}\n")
    cap = Capturer(load_config(cfg))
    cap.start()
    if mode == "error":
        code = cap.run()
        assert code == 1
        assert "UPDATE of acct.balances has 2 old and 1 new row images" in cap.failure
        assert "unpaired_update=split" in cap.failure
        return
    stop = threading.Event()
    t = threading.Thread(target=lambda: cap.run(should_stop=stop))
    t.start()
    try:
        wait_for(lambda: any(x.get("after", {}) and x["after"].get("owner") == "merged"
                             for x in (read_lines(tmp_path) if (tmp_path / "out").exists() else [])), 60)
    finally:
        stop.set()
        t.join(60)
    ops = [(x["op"], (x["before"] or {}).get("id")) for x in read_lines(tmp_path) if x.get("table") == "balances"
           and x["txn_rows"] == 2 and x["op"] != "insert"]
    assert ("delete", b[0]) in ops and ("update", a[0]) in ops


def test_kill9_and_restart_lose_and_duplicate_nothing(tmp_path: Path, double: BaikalDouble,
                                                      target: MariaDBInstance) -> None:
    """kill -9 of the capturer (a real process) twice while the workload and a schema
    change run; the file (deduplicated by identity) and the MySQL target equal the double."""
    c = double.cluster
    w = Workload(c, seed=21)
    cfg = baikal_config(tmp_path, double, file_and_mysql(tmp_path, target))
    log = tmp_path / "capturer.log"
    proc = CapturerProcess(cfg, log).start()
    proc.wait_ready()
    done = threading.Event()

    def load() -> None:
        w.run(300, schema_at={150: 1}, pause=0.03)
        done.set()

    t = threading.Thread(target=load)
    t.start()
    for _ in range(2):
        time.sleep(2.5)
        proc.kill9()
        proc = CapturerProcess(cfg, log).start()
        proc.wait_ready()
    t.join()
    wait_for(lambda: covered(tmp_path, w), 120, "the restarted capturer to catch up")
    assert proc.stop() == 0
    assert_file_equals(c, tmp_path / "out" / "changes.jsonl")
    assert_mysql_equals(c, target)
    lines = read_lines(tmp_path)
    idents = [(x["region"], x["commit_ts"], x["seq"]) for x in lines]
    dups = len(idents) - len(set(idents))
    print(f"kill -9 x2: {len(lines)} lines, {dups} duplicates (identical by identity)")
    by_id: dict[Any, str] = {}
    for x in lines:  # a duplicate is the same change, byte for byte apart from nothing
        k = (x["region"], x["commit_ts"], x["seq"])
        s = json.dumps(x, sort_keys=True)
        assert by_id.setdefault(k, s) == s


def test_baikaldb_and_mariadb_regions_merge_in_one_commit_order(tmp_path: Path, double: BaikalDouble,
                                                                 capturer_running) -> None:  # type: ignore[no-untyped-def]
    from helpers import start_servers
    from workload import SCHEMA
    from workload import Workload as MariaWorkload

    (m,) = start_servers(tmp_path, 1)
    try:
        m.execute(*SCHEMA)
        extra = (f"\n[region:maria]\ntype=mysql\nhost=127.0.0.1\nport={m.port}\nuser=capturer\npassword=capturer\n"
                 "server_id=801\nheartbeat_ms=200\n")
        cfg = baikal_config(tmp_path, double, file_sender(tmp_path), extra_regions=extra)
        w = Workload(double.cluster, seed=8)
        mw = MariaWorkload(m, 1, 3)
        with capturer_running(cfg) as cap:
            streaming(cap)
            for _ in range(4):
                t = mw.thread(40)
                w.run(40, pause=0.01)
                t.join()
            assert not mw.errors
            wait_for(lambda: covered(tmp_path, w), 60)
            pos = m.master_position()
            wait_for(lambda: tuple(json.loads((tmp_path / "checkpoint.json").read_text())["regions"]["maria"][k]
                                   for k in ("file", "pos")) >= pos, 60)
        lines = read_lines(tmp_path)
        assert_file_equals(double.cluster, tmp_path / "out" / "changes.jsonl")
        from workload import rows_of

        from senders.local.replay import read_changes, rebuild

        state = rebuild(read_changes(tmp_path / "out" / "changes.jsonl"))
        users = sorted(tuple(r.values()) for r in state[("app", "users")].values())
        assert len(users) == len(rows_of(m, "app", "users")) > 0
        tss = [x["commit_ts"] for x in lines]
        assert tss == sorted(tss), "one commit order across MariaDB and BaikalDB regions"
        regions = [x["region"] for x in lines if x["op"] != "ddl"]
        switches = sum(1 for a, b in zip(regions, regions[1:]) if a != b)
        assert {"maria", "shop", "acct"} <= set(regions) and switches >= 6  # interleaved, not one after the other
    finally:
        m.stop()


def test_all_four_senders(tmp_path: Path, double: BaikalDouble, target: MariaDBInstance, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """File, MySQL, Kafka (Apache Kafka) and Spark (local) at once on BaikalDB changes."""
    pytest.importorskip("pyspark")
    from helpers import consume_all, shared_broker

    from capturer.model.encode import json_row
    from devtools.baikaldb_workload import NAMES, expected
    from senders.spark import lake
    from senders.spark.lakecli import canon

    broker = shared_broker()
    wh = tmp_path / "wh"
    try:
        senders = (f"[global]\ntype=local,mysql,kafka,spark\n[local]\nfilepath={tmp_path / 'out' / 'changes.jsonl'}\n"
                   f"[mysql]\nhost=127.0.0.1\nport={target.port}\nuser=root\npassword=\nthreadnum=4\n"
                   f"[kafka]\nservers={broker.servers}\nclient=confluent\n"
                   f"[spark]\nmaster=local[2]\nwarehouse={wh}\nbatch_interval=0.3\ncompaction_interval=0\n")
        cfg = baikal_config(tmp_path, double, senders)
        w = Workload(double.cluster, seed=31)
        w.run(20)
        with capturer_running(cfg) as cap:
            streaming(cap)
            w.run(150, schema_at={70: 1}, pause=0.005)
            wait_for(lambda: covered(tmp_path, w), 240, "every sender to catch up")
            st = status(cap)
            spark = cap.senders[3]._session()  # type: ignore[attr-defined]
            c = double.cluster
            assert_file_equals(c, tmp_path / "out" / "changes.jsonl")
            assert_mysql_equals(c, target)
            lake.register_tables(spark, wh)
            for tid, (db, name) in NAMES.items():
                t = c.tables[tid]
                cols = ", ".join(lake.q(f.name) for f in t.live)
                got = sorted(tuple(canon(v) for v in r)
                             for r in spark.sql(f"SELECT {cols} FROM cdc.{lake.table_name(db, name)}").collect())
                want = sorted(tuple(canon(v) for v in r) for r in expected(c, tid))
                assert got == want, f"lake {db}.{name} differs"
        records = consume_all(broker.servers)
        seen, state = set(), {}
        for r in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
            if r.value is None or not r.topic.startswith(("capturer.shop.", "capturer.acct.")):
                continue
            h = {k: v.decode() for k, v in r.headers}
            ident = (h["region"], h["commit_ts"], h["seq"], h["op"])
            if ident in seen:
                continue
            seen.add(ident)
            d = json.loads(r.value)
            topic = state.setdefault(r.topic, {})
            if d["op"] in ("c", "u"):
                topic[r.key] = d["after"]
            else:
                topic.pop(r.key, None)
        for tid, (db, name) in NAMES.items():
            t = double.cluster.tables[tid]
            topic = next(x for x in state if x.endswith("." + name.replace(" ", "_")) and f".{db}." in x)
            # a message from before an ADD COLUMN lacks it: a consumer reads the column's default
            got = sorted(json.dumps({f.name: row.get(f.name, f.default) for f in t.live}, sort_keys=True)
                         for row in state[topic].values())
            want = sorted(json.dumps(json_row(dict(zip([f.name for f in t.live], r)), set()), sort_keys=True)
                          for r in expected(double.cluster, tid))
            assert got == want, f"kafka {topic} differs"
        assert all(s["errors"] == 0 for s in st["senders"].values()), st["senders"]
    finally:
        broker.kill()


def test_big_transaction_is_spilled(tmp_path: Path, double: BaikalDouble, capturer_running) -> None:  # type: ignore[no-untyped-def]
    c = double.cluster
    w = Workload(c, seed=12)
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path), extra_global="spillRows=200\n")
    with capturer_running(cfg) as cap:
        w.run(10)
        tx = c.begin().insert(ORDERS, *(w.order() for _ in range(1500)))
        ts = tx.commit()
        w.last_ts[20] = max(w.last_ts.get(20, 0), ts)
        w.run(10)
        wait_for(lambda: covered(tmp_path, w), 60)
        assert cap.regions[0].spilled_txns >= 1
    assert_file_equals(c, tmp_path / "out" / "changes.jsonl")
    big = [x for x in read_lines(tmp_path) if x["txn_rows"] == 1500]
    assert len(big) == 1500 and [x["seq"] for x in big] == list(range(1500))


def test_older_store_lagging_meta_and_a_new_peer(tmp_path: Path, double: BaikalDouble,
                                                 capturer_running) -> None:  # type: ignore[no-untyped-def]
    """What older or lagging servers answer must neither stop the capturer nor
    lose anything:

    * stores before BaikalDB master give back the FAKE at the read's own binlog_ts
      (the last one read) and do not know OP_QUERY_BINLOG (start=earliest says so);
    * a meta follower that lags answers QUERY_SCHEMA with an older version of a
      table: ignored (no DROP COLUMN of the column the newer version added);
    * a new peer whose binlog starts later answers LESS_THAN_OLDEST_TS while the
      other peers are down: it is not believed on its own (no "purged" fatal error)."""
    c = double.cluster
    double.legacy_scan = True
    w = Workload(c, seed=21)
    # start=earliest needs OP_QUERY_BINLOG: a clear error at start
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path))
    cap = Capturer(load_config(cfg))
    cap.start()
    assert cap.run() == 1
    assert "does not know OP_QUERY_BINLOG" in cap.failure and "set start to" in cap.failure
    (tmp_path / "checkpoint.json").unlink(missing_ok=True)
    start = c.tso.alloc()
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path), region_extra=f"start={start}\n")
    with capturer_running(cfg) as cap:
        streaming(cap)
        w.run(30, pause=0.01)
        wait_for(lambda: covered(tmp_path, w), 60, "the checkpoint to pass the last commit")
        assert sum(x["repeats"] for x in status(cap)["regions"]["shop"]["store_regions"].values()) > 0
        # meta 1 lags at today's schemas; the change happens at meta 0 (the leader)
        double.freeze_meta(1)
        w.schema_change(1)  # ADD COLUMN extra
        w.run(20)
        wait_for(lambda: any(x["op"] == "ddl" and "ADD COLUMN `extra`" in x["sql"] for x in read_lines(tmp_path)),
                 60, "the ADD COLUMN")
        double.metas[0].stop()  # now only the lagging meta answers the refreshes
        w.run(20, pause=0.05)
        time.sleep(2.5)  # longer than schema_refresh
        wait_for(lambda: covered(tmp_path, w), 60)
        # a new peer of a region with its binlog starting now, while the leader is down
        region = c.binlogs[20].regions[0]
        new_peer = next(p for p in region.peers if p != region.leader)
        with c.lock:
            region.peer_oldest[new_peer] = c.tso.alloc()
        # ... and is for a while the only peer of that region that answers
        others = [i for i, s in enumerate(double.stores) if s.addr != new_peer]
        for i in others:
            double.stores[i].stop()
        w.run(20)
        time.sleep(2.0)
        for i in others:
            double.restart_store(i)
        w.run(10)
        wait_for(lambda: covered(tmp_path, w), 90)
        st = status(cap)
    assert cap.failure == ""
    lines = read_lines(tmp_path)
    assert not any(x["op"] == "ddl" and "DROP COLUMN" in x["sql"] for x in lines), \
        [x["sql"] for x in lines if x["op"] == "ddl"]
    assert st["regions"]["shop"]["tables"]["shop.orders"]["version"] >= 2
    assert_file_equals(c, tmp_path / "out" / "changes.jsonl")


def test_version_old_announcing_a_new_region(tmp_path: Path, double: BaikalDouble,
                                             capturer_running) -> None:  # type: ignore[no-untyped-def]
    """A store answers VERSION_OLD listing the region's new info and a new region
    (the generic case of the protocol's §6; BaikalDB does not split binlog regions).
    The meta refresh is off, so only that answer can tell the reader: the new region
    is read from the point the stream had reached, and what is written to it arrives."""
    c = double.cluster
    w = Workload(c, seed=31)
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path))
    cfg.write_text(cfg.read_text().replace("schema_refresh=2\n", "schema_refresh=86400\n"))
    with capturer_running(cfg) as cap:
        streaming(cap)
        w.run(20)
        wait_for(lambda: covered(tmp_path, w), 60)
        old = c.binlogs[20].regions[0]
        new = c.add_region(20, old.partition_id)
        with c.lock:
            old.announce = [new.region_id]
            old.version += 1
        w.run(60)
        wait_for(lambda: str(new.region_id) in status(cap)["regions"]["shop"]["store_regions"], 60,
                 "the new region to be read")
        w.run(20)
        wait_for(lambda: covered(tmp_path, w), 60)
        st = status(cap)["regions"]["shop"]["store_regions"]
    assert new.records, "the workload wrote nothing to the new region"
    assert st[str(old.region_id)]["version_old"] >= 1 and st[str(old.region_id)]["version"] == old.version
    assert st[str(new.region_id)]["entries"] > 0
    assert_file_equals(c, tmp_path / "out" / "changes.jsonl")


def test_kill9_before_the_first_checkpoint_keeps_the_start(tmp_path: Path, double: BaikalDouble) -> None:
    """start=latest, kill -9 before any regular checkpoint: the start chosen at the
    first start was written before anything left, so the restart reads from it
    (choosing "latest" again would skip what was written in between)."""
    c = double.cluster
    w = Workload(c, seed=41)
    cfg = baikal_config(tmp_path, double, file_sender(tmp_path), region_extra="start=latest\ncreate_tables=false\n",
                        extra_global="")
    cfg.write_text(cfg.read_text().replace("checkpointInterval=0.5", "checkpointInterval=600"))
    log = tmp_path / "capturer.log"
    proc = CapturerProcess(cfg, log).start()
    try:
        proc.wait_ready()
        def pinned_regions() -> set[str]:  # (each region pins its start on its own: one may come a moment later)
            try:
                return set(json.loads((tmp_path / "checkpoint.json").read_text())["regions"])
            except (OSError, ValueError, KeyError):
                return set()

        wait_for(lambda: pinned_regions() == {"shop", "acct"}, 30, "the pinned starts of both regions")
        pinned = json.loads((tmp_path / "checkpoint.json").read_text())
        assert pinned["commit_ts"] == 0 and set(pinned["regions"]) == {"shop", "acct"}
        w.run(30)
        time.sleep(1.0)
        proc.kill9()
        w.run(30)  # while it is down
        cfg.write_text(cfg.read_text().replace("checkpointInterval=600", "checkpointInterval=0.5"))
        proc = CapturerProcess(cfg, log).start()
        proc.wait_ready()
        wait_for(lambda: covered(tmp_path, w), 120, "the restarted capturer to catch up")
        assert proc.stop() == 0
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill9()
    assert_file_equals(c, tmp_path / "out" / "changes.jsonl")


def test_regions_in_worker_processes(tmp_path: Path, double: BaikalDouble, target: MariaDBInstance,  # type: ignore[no-untyped-def]
                                     capturer_running) -> None:
    """process=true on BaikalDB regions: each binlog table is read in a worker process
    (its schema journal where the in-process region keeps it); a worker killed -9
    mid-load is started again; the file and MySQL equal the double, in one order."""
    import os
    import signal

    w = Workload(double.cluster, seed=23)
    w.run(30)
    cfg = baikal_config(tmp_path, double, file_and_mysql(tmp_path, target), region_extra="process=true\n")
    with capturer_running(cfg) as cap:
        wait_for(lambda: all(r.state == "streaming" for r in cap.regions), 60, "the workers to stream")
        w.run(100, schema_at={50: 1})
        os.kill(cap.regions[0].proc.pid, signal.SIGKILL)
        w.run(100)
        wait_for(lambda: covered(tmp_path, w), 120, "the checkpoint to pass the last commit")
        st = status(cap)
    assert st["regions"]["shop"]["worker"]["starts"] == 2 and st["regions"]["acct"]["worker"]["starts"] == 1
    assert (tmp_path / "checkpoint.json.baikaldb.shop").exists(), "the schema journal is where the capturer keeps it"
    assert_file_equals(double.cluster, tmp_path / "out" / "changes.jsonl")
    assert_mysql_equals(double.cluster, target)
    tss = [x["commit_ts"] for x in read_lines(tmp_path)]
    assert tss == sorted(tss)
