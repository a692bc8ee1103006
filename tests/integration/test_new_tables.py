"""Tables a filter reload adds (``snapshotNewTables``, docs/snapshots.md "New tables"): a
table with rows that the filter left out, written all along, is copied while the
stream goes on once a reload includes it, in every region that has it, into the file
and the MySQL target: both end equal to the sources, nothing twice, no change to the
table before its CREATE, every other table still equal. MariaDB shards (a table only
one shard has; a keyed and a keyless table both have: one coordinated step) and a
PostgreSQL region."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import checkpoint_covers, read_lines, start_servers, wait_for, write_config

from devtools.local_mariadb import MariaDBInstance
from devtools.local_postgres import PostgresInstance
from devtools.pg_workload import file_rows, mysql_rows, pg_rows
from integration.test_postgresql import config, covered, current_lsn, file_and_mysql, pg, pg_region, streaming
from integration.test_snapshot import FILE_AND_MYSQL, file_tables, source_rows, union_rows
from senders.local.replay import read_changes, rebuild

pytestmark = pytest.mark.integration
__all__ = ["pg"]  # (the fixture, imported)

TOKEN = "new-tables-t0ken"
ADDED = ("late", "bag", "solo")


class Writer(threading.Thread):
    """Inserts, updates and deletes on every table of every source, the excluded ones
    too, at a steady pace, through the reload and the copies."""

    def __init__(self, statements: list[Any]):
        super().__init__(daemon=True)
        self.statements = statements  # per source: (connect, [(sql, args(n))...])
        self.done, self.n, self.error = threading.Event(), 0, None

    def run(self) -> None:
        conns = [(connect(), stmts) for connect, stmts in self.statements]
        try:
            while not self.done.wait(0.01):
                self.n += 1
                c, stmts = conns[self.n % len(conns)]
                with c.cursor() as cur:
                    for sql, args in stmts:
                        cur.execute(sql, args(self.n))
                c.commit()
        except BaseException as exc:
            self.error = exc
        finally:
            for c, _ in conns:
                c.close()

    def stop(self) -> int:
        self.done.set()
        self.join(60)
        assert self.error is None, self.error
        return self.n


def mariadb_statements(i: int) -> list[tuple[str, Any]]:
    base = i * 100_000
    out: list[tuple[str, Any]] = [
        ("INSERT INTO d.t VALUES (%s, %s) ON DUPLICATE KEY UPDATE v = v + 1", lambda n: (base + n % 300, n)),
        ("INSERT INTO d.late VALUES (%s, %s) ON DUPLICATE KEY UPDATE v = v + 1", lambda n: (base + n % 2500, n)),
        ("DELETE FROM d.late WHERE id = %s", lambda n: (base + (n * 7) % 2500,)),
        ("INSERT INTO d.bag VALUES (%s, %s)", lambda n: (f"w{n % 40}", i)),
        ("DELETE FROM d.bag WHERE msg = %s AND n = %s LIMIT 1", lambda n: (f"m{n % 30}", i)),
    ]
    if i == 0:
        out += [("UPDATE d.solo SET v = %s WHERE id = %s", lambda n: (f"u{n}", n % 3000)),
                ("INSERT INTO d.solo VALUES (%s, %s) ON DUPLICATE KEY UPDATE v = 'again'", lambda n: (5000 + n % 50, "w")),
                ("DELETE FROM d.solo WHERE id = %s", lambda n: ((n * 11) % 3000,))]
    return out


def reload(url: str) -> requests.Response:
    return requests.post(url + "/filter/reload", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)


def copies_done(cap: Any, regions: list[str]) -> bool:
    for name in regions:
        snap = cap.snapshot()["regions"][name].get("snapshot") or {}
        tables = snap.get("tables") or {}
        if not tables or any(t["state"] not in ("done", "dropped") for t in tables.values()):
            return False
    return True


def assert_no_change_before_create(tmp: Path, db: str, tables: tuple[str, ...]) -> None:
    """In the file, every line of an added table comes after the table's first CREATE
    TABLE or TRUNCATE (a sink never gets a change to a table it does not have yet), and
    the stream's own changes to it come through after its copy (the stream went on)."""
    lines = read_lines(tmp)
    for t in tables:
        mine = [x for x in lines if (x.get("db"), x.get("table")) == (db, t)]
        assert mine, f"nothing of {db}.{t} in the file"
        first = mine[0]
        assert first["op"] == "ddl" and first["sql"].split()[0] in ("CREATE", "TRUNCATE"), (t, first)
        assert any(x["op"] == "read" for x in mine), f"{db}.{t}: no row of a copy"
        assert any(x["op"] in ("insert", "update", "delete") for x in mine), f"{db}.{t}: no change after the copy"
    # nothing twice: every change line's identity (region, commit_ts, seq) is unique
    ids = Counter((x["region"], x["commit_ts"], x["seq"]) for x in lines if x["op"] != "ddl")
    assert not [k for k, n in ids.items() if n > 1], "a change delivered twice"



def include_everything(cap: Any, tmp: Path) -> Any:
    """Once every region streams: the filter emptied (every table included) and reloaded."""
    url = f"http://127.0.0.1:{cap.status_server.port}"
    wait_for(lambda: all(x["state"] == "streaming" for x in cap.snapshot()["regions"].values()), 60,
             "both regions streaming")
    (tmp / "filter_rule.txt").write_text("")
    return reload(url)

def test_mariadb_tables_a_reload_adds_are_copied_under_load(tmp_path: Path, target: MariaDBInstance,
                                                             capturer_running) -> None:  # type: ignore[no-untyped-def]
    servers = start_servers(tmp_path, 2)
    try:
        for i, m in enumerate(servers):
            m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)",
                      "CREATE TABLE d.late (id INT PRIMARY KEY, v INT)", "CREATE TABLE d.bag (msg VARCHAR(20), n INT)",
                      f"INSERT INTO d.late SELECT seq + {i * 100_000}, seq FROM d.seq_1_to_2000",
                      f"INSERT INTO d.bag SELECT CONCAT('m', seq % 30), {i} FROM d.seq_1_to_600")
        servers[0].execute("CREATE TABLE d.solo (id INT PRIMARY KEY, v VARCHAR(20))",
                           "INSERT INTO d.solo SELECT seq, CONCAT('s', seq) FROM d.seq_1_to_3000")
        # the target held d.late from an earlier inclusion: a row the source no longer has
        target.execute("CREATE DATABASE d", "CREATE TABLE d.late (id INT PRIMARY KEY, v INT)",
                       "INSERT INTO d.late VALUES (-1, -1)")
        cfg = write_config(tmp_path, servers, filter_text="".join(f"exclude d.{t}\n" for t in ADDED),
                           extra_global=f"controlToken={TOKEN}\n",
                           senders=FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port),
                           region_extra="snapshot_chunk_rows=500\n")
        writer = Writer([(m.connect, mariadb_statements(i)) for i, m in enumerate(servers)])
        with capturer_running(cfg) as cap:
            url = f"http://127.0.0.1:{cap.status_server.port}"  # type: ignore[union-attr]
            writer.start()
            wait_for(lambda: writer.n > 100 and cap.snapshot()["senders"]["mysql"]["rows"] > 100, 60,
                     "load on every table")
            assert not any(x.get("table") in ADDED for x in read_lines(tmp_path)), "an excluded table was delivered"
            (tmp_path / "filter_rule.txt").write_text("exclude d.nothing_here\n")
            r = reload(url)
            assert r.status_code == 200, r.text
            added = r.json()["added"]
            assert added["truncate"] is True and not added["missing"], added
            assert {n: v["tables"] for n, v in added["regions"].items()} == {
                "r1": ["d.bag", "d.late", "d.solo"], "r2": ["d.bag", "d.late"]}, added
            st = cap.snapshot()
            assert st["filter"]["added"]["mode"] == "truncate"
            assert st["regions"]["r1"]["snapshot"]["tables"]["d.solo"]["reason"] == "filter reload"
            wait_for(lambda: copies_done(cap, ["r1", "r2"]), 180, "the copies of the added tables")
            assert cap.snapshot()["filter"]["held"] == {}, cap.snapshot()["filter"]
            # a reload that adds nothing copies nothing
            again = reload(url)
            assert again.status_code == 200 and "added" not in again.json(), again.text
            n = writer.n
            wait_for(lambda: writer.n > n + 100, 60, "load after the copies")
            writer.stop()
            wait_for(lambda: checkpoint_covers(tmp_path, servers), 120, "every sender to catch up")
        files = file_tables(tmp_path)
        for table in ("t", *ADDED):
            want = union_rows(servers if table != "solo" else servers[:1], "d", table)
            assert source_rows(target, "d", table) == want, f"MySQL target d.{table}"
            assert files.get(("d", table), []) == want, f"file d.{table}"
        assert_no_change_before_create(tmp_path, "d", ADDED)
    finally:
        for m in servers:
            m.stop()


class PgWriter(threading.Thread):
    def __init__(self, p: PostgresInstance):
        super().__init__(daemon=True)
        self.p, self.done, self.n, self.error = p, threading.Event(), 0, None

    def run(self) -> None:
        try:
            with self.p.connect(autocommit=False) as c:
                while not self.done.wait(0.01):
                    n = self.n = self.n + 1
                    c.execute("INSERT INTO public.nt_keep VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = "
                              "nt_keep.v + 1", (n % 200, n))
                    c.execute("INSERT INTO public.nt_late VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = %s",
                              (n % 2500, f"w{n}", f"u{n}"))
                    c.execute("DELETE FROM public.nt_late WHERE id = %s", ((n * 7) % 2500,))
                    c.execute("INSERT INTO public.nt_bag VALUES (%s, %s)", (n % 40, "w"))
                    c.execute("DELETE FROM public.nt_bag WHERE ctid = (SELECT ctid FROM public.nt_bag WHERE a = %s "
                              "LIMIT 1)", (n % 30,))
                    c.commit()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> int:
        self.done.set()
        self.join(60)
        assert self.error is None, self.error
        return self.n


def test_postgresql_tables_a_reload_adds_are_copied_under_load(tmp_path: Path, pg: PostgresInstance,
                                                                target: MariaDBInstance,
                                                                capturer_running) -> None:  # type: ignore[no-untyped-def]
    with pg.connect() as c:
        c.execute("CREATE TABLE public.nt_keep (id int PRIMARY KEY, v int)")
        c.execute("CREATE TABLE public.nt_late (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO public.nt_late SELECT g, 'v' || g FROM generate_series(1, 2000) g")
        c.execute("CREATE TABLE public.nt_bag (a int, b text)")
        c.execute("ALTER TABLE public.nt_bag REPLICA IDENTITY FULL")
        c.execute("INSERT INTO public.nt_bag SELECT g % 30, 'm' FROM generate_series(1, 500) g")
    cfg = config(tmp_path, pg_region("pg", pg, "snapshot_chunk_rows=300\n"), file_and_mysql(tmp_path, target),
                 f"controlToken={TOKEN}\nsnapshotNewTables=copy\n")
    (tmp_path / "filter_rule.txt").write_text("include public.nt_keep\n")
    writer = PgWriter(pg)
    with capturer_running(cfg) as cap:
        streaming(cap)
        url = f"http://127.0.0.1:{cap.status_server.port}"  # type: ignore[union-attr]
        writer.start()
        wait_for(lambda: writer.n > 100 and cap.snapshot()["senders"]["mysql"]["rows"] > 100, 60,
                 "load on every table")
        (tmp_path / "filter_rule.txt").write_text("include public.nt_*\n")
        r = reload(url)
        assert r.status_code == 200, r.text
        added = r.json()["added"]
        assert added["truncate"] is False and added["regions"]["pg"]["tables"] == ["public.nt_bag", "public.nt_late"]
        wait_for(lambda: copies_done(cap, ["pg"]), 180, "the copies of the added tables")
        reasons = {t["reason"] for t in cap.snapshot()["regions"]["pg"]["snapshot"]["tables"].values()}
        assert reasons == {"filter reload"}
        n = writer.n
        wait_for(lambda: writer.n > n + 100, 60, "load after the copies")
        writer.stop()
        end = current_lsn(pg)
        wait_for(lambda: covered(tmp_path, "pg", end), 120, "every sender to catch up")
    state = rebuild(read_changes(tmp_path / "out" / "changes.jsonl"))
    for table in ("nt_keep", "nt_late", "nt_bag"):
        want = pg_rows(pg, "public", table)
        assert mysql_rows(target, "public", table) == want, f"MySQL target public.{table}"
        assert file_rows(state, "public", table) == want, f"file public.{table}"
    assert_no_change_before_create(tmp_path, "public", ("nt_late", "nt_bag"))
    assert json.loads((tmp_path / "checkpoint.json").read_text())["regions"]["pg"].get("snapshot") in (None, [])


def test_a_copy_that_cannot_be_made_keeps_the_old_rules(tmp_path: Path, capturer_running) -> None:  # type: ignore[no-untyped-def]
    """``truncate`` of a table a region read in a worker process also delivers is refused
    (that region cannot take part in the coordinated copy): the reload answers 400 naming
    the table and the way around, the old rules stay, nothing is held back, and the
    table's changes stay out; with ``copy`` the same reload goes through."""
    def late_reads() -> list[int]:
        return [x["after"]["id"] for x in read_lines(tmp_path) if x.get("table") == "late" and x["op"] == "read"]

    servers = start_servers(tmp_path, 2)
    try:
        for m in servers:
            m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)",
                      "CREATE TABLE d.late (id INT PRIMARY KEY, v INT)", "INSERT INTO d.late VALUES (1, 1)")
        cfg = write_config(tmp_path, servers, filter_text="exclude d.late\n", extra_global=f"controlToken={TOKEN}\n")
        text = cfg.read_text()
        cfg.write_text(text.replace("[region:r2]\n", "[region:r2]\nprocess=true\n"))
        with capturer_running(cfg) as cap:
            r = include_everything(cap, tmp_path)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err.startswith("the old rules stay") and "d.late" in err and "snapshotNewTables" in err, err
            st = cap.snapshot()["filter"]
            assert st["table_rules"] == 1 and st["held"] == {} and st["added"] is None, st
            for m in servers:
                m.execute("INSERT INTO d.late VALUES (2, 2)", "INSERT INTO d.t VALUES (1, 1)")
            wait_for(lambda: sum(x.get("table") == "t" for x in read_lines(tmp_path)) >= 2, 60, "the rows of d.t")
            assert not [x for x in read_lines(tmp_path) if x.get("table") == "late"]
        # (the file still has the refused rules: a start would read them, without a copy)
        (tmp_path / "filter_rule.txt").write_text("exclude d.late\n")
        cfg.write_text(cfg.read_text().replace("[global]\n", "[global]\nsnapshotNewTables=copy\n", 1))
        with capturer_running(cfg) as cap:
            r = include_everything(cap, tmp_path)
            assert r.status_code == 200, r.text
            # the region in the worker process copies nothing: it gets the rules at its next subscription
            assert list(r.json()["added"]["regions"]) == ["r1"], r.text
            wait_for(lambda: copies_done(cap, ["r1"]), 60, "the copy")
            wait_for(lambda: len(late_reads()) >= 2, 60, "the file to hold the copy")
        assert sorted(late_reads()) == [1, 2]
    finally:
        for m in servers:
            m.stop()


def target_rows(target: MariaDBInstance, db: str, table: str) -> list[str] | None:
    """``source_rows`` of a sender's target, None while the table is not there yet (the MySQL sender
    creates it after the file sender, which may have all of its rows first)."""
    import pymysql

    try:
        return source_rows(target, db, table)
    except pymysql.err.ProgrammingError as exc:
        if exc.args[0] == 1146:
            return None
        raise


def test_a_copy_a_reload_asked_for_survives_kill9_before_a_checkpoint_carries_it(
        tmp_path: Path, target: MariaDBInstance) -> None:
    """The filter reload adds a table with history and the capturer is killed (kill -9)
    at once, before any checkpoint carries the copy (checkpointInterval 60 s): the copy
    was recorded in ``<checkpoint>.copies`` before the reload answered, so the restarted
    capturer asks for it again (the restored positions do not carry it) and the table's
    history reaches the file and the MySQL target (before: never copied, its rows lost
    downstream for good; issue 49); the line leaves the side file once a checkpoint
    carries the copy."""
    from helpers import CapturerProcess

    servers = start_servers(tmp_path, 1)
    m = servers[0]
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)",
                  "CREATE TABLE d.late (id INT PRIMARY KEY, v VARCHAR(20))",
                  "INSERT INTO d.late SELECT seq, CONCAT('old', seq) FROM d.seq_1_to_1500",
                  "INSERT INTO d.t VALUES (1, 1)")
        cfg = write_config(tmp_path, servers, filter_text="exclude d.late\n", extra_global=f"controlToken={TOKEN}\n",
                           senders=FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port))
        cfg.write_text(cfg.read_text().replace("checkpointInterval=0.5", "checkpointInterval=60"))
        port = int(cfg.read_text().split("httpPort=")[1].split()[0])
        url = f"http://127.0.0.1:{port}"
        log = tmp_path / "capturer.log"
        cap = CapturerProcess(cfg, log).start()
        cap.wait_ready()
        wait_for(lambda: requests.get(url + "/status", timeout=5).json()["regions"]["r1"]["state"] == "streaming",
                 60, "the region streaming")
        m.execute("INSERT INTO d.t VALUES (2, 2)", "UPDATE d.late SET v = 'changed' WHERE id = 7")
        time.sleep(1)
        (tmp_path / "filter_rule.txt").write_text("")
        r = reload(url)
        assert r.status_code == 200 and r.json()["added"]["regions"]["r1"]["tables"] == ["d.late"], r.text
        cap.kill9()
        side = tmp_path / "checkpoint.json.copies"
        cp = json.loads((tmp_path / "checkpoint.json").read_text())
        run = json.loads(side.read_text().splitlines()[0])["run"]
        assert run not in json.dumps(cp), "the checkpoint carried the copy: the case did not happen"
        m.execute("INSERT INTO d.late VALUES (5000, 'after')", "DELETE FROM d.late WHERE id = 3")
        cfg.write_text(cfg.read_text().replace("checkpointInterval=60", "checkpointInterval=0.5"))
        cap = CapturerProcess(cfg, log).start()
        cap.wait_ready()
        want = union_rows(servers, "d", "late")
        wait_for(lambda: file_tables(tmp_path).get(("d", "late"), []) == want, 120, "d.late's history in the file")
        wait_for(lambda: target_rows(target, "d", "late") == want, 120, "d.late's history in the MySQL target")
        assert "asked for again" in log.read_text()
        assert requests.get(url + "/status", timeout=5).json()["filter"]["copies"]["asked_again_after_a_restart"] == 1
        wait_for(lambda: not side.exists(), 120, "a checkpoint to carry the copy (the side file gone)")
        assert cap.stop() == 0
        for table in ("t", "late"):
            want = union_rows(servers, "d", table)
            assert file_tables(tmp_path).get(("d", table), []) == want, f"file d.{table}"
            assert source_rows(target, "d", table) == want, f"MySQL target d.{table}"
    finally:
        m.stop()


def test_a_table_renamed_into_the_filter_is_copied(tmp_path: Path, target: MariaDBInstance,
                                                   capturer_running) -> None:  # type: ignore[no-untyped-def]
    """``RENAME TABLE d.stage TO d.live`` (stage left out by the filter, live selected) and
    ``ALTER TABLE d.stage2 RENAME TO d.live2`` under a steady writer: the new names are held
    back and copied, so the file and the MySQL target get their rows (before: none of the
    rows written before the rename, and the MySQL sender stopped at the first change to
    the new name: "Table 'd.live' doesn't exist"); a rename out of the filter and one
    between selected names copy nothing."""
    servers = start_servers(tmp_path, 1)
    m = servers[0]
    try:
        m.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY, v INT)",
                  "CREATE TABLE d.stage (id INT PRIMARY KEY, v VARCHAR(20))",
                  "CREATE TABLE d.stage2 (msg VARCHAR(20), n INT)",
                  "CREATE TABLE d.kept (id INT PRIMARY KEY)",
                  "INSERT INTO d.stage SELECT seq, CONCAT('s', seq) FROM d.seq_1_to_2000",
                  "INSERT INTO d.stage2 SELECT CONCAT('m', seq % 7), seq FROM d.seq_1_to_300",
                  "INSERT INTO d.kept VALUES (1), (2)")
        cfg = write_config(tmp_path, servers, filter_text="exclude d.stage\nexclude d.stage2\n",
                           extra_global=f"controlToken={TOKEN}\n",
                           senders=FILE_AND_MYSQL.format(out=tmp_path / "out" / "changes.jsonl", port=target.port),
                           region_extra="snapshot_chunk_rows=300\n")
        with capturer_running(cfg) as cap:
            wait_for(lambda: cap.snapshot()["regions"]["r1"]["state"] == "streaming", 60, "the region streaming")
            m.execute("INSERT INTO d.t VALUES (1, 1)", "UPDATE d.stage SET v = 'x' WHERE id < 10")
            m.execute("RENAME TABLE d.stage TO d.live", "ALTER TABLE d.stage2 RENAME TO d.live2",
                      "RENAME TABLE d.kept TO d.kept_too")  # selected -> selected: passed on, nothing copied
            for i in range(200):  # changes right after the renames: held back until the copies start
                m.execute(f"UPDATE d.live SET v = 'u{i}' WHERE id = {i + 1}", f"DELETE FROM d.live WHERE id = {1000 + i}",
                          f"INSERT INTO d.live2 VALUES ('w{i}', {i})")
            m.execute("INSERT INTO d.live VALUES (5000, 'after')", "INSERT INTO d.t VALUES (2, 2)")
            wait_for(lambda: copies_done(cap, ["r1"]), 120, "the copies of the renamed tables")
            tables = cap.snapshot()["regions"]["r1"]["snapshot"]["tables"]
            assert {t: v["reason"] for t, v in tables.items()} == {
                "d.live": "renamed into the filter", "d.live2": "renamed into the filter"}, tables
            wait_for(lambda: checkpoint_covers(tmp_path, servers), 120, "every sender to catch up")
        files = file_tables(tmp_path)
        for table in ("t", "live", "live2", "kept_too"):
            want = union_rows(servers, "d", table)
            assert source_rows(target, "d", table) == want, f"MySQL target d.{table}"
            assert files.get(("d", table), []) == want, f"file d.{table}"  # (the file's replay follows a RENAME)
        assert_no_change_before_create(tmp_path, "d", ("live", "live2"))
        assert not (tmp_path / "checkpoint.json.copies").exists()
    finally:
        m.stop()


@pytest.mark.parametrize("mode", ["truncate", "copy"])
def test_a_table_added_to_the_publication_is_copied_live(tmp_path: Path, pg: PostgresInstance,
                                                        target: MariaDBInstance, mode: str,
                                                        capturer_running) -> None:  # type: ignore[no-untyped-def]
    """ALTER PUBLICATION ... ADD TABLE of a table with rows, written all along (also while it
    joins): the region sees the publication grow (its look every publication_check_s, or the
    new relation in the stream) and the table is copied live as snapshotNewTables says, in the
    file and the MySQL target: both end equal to the source, no change of it before its
    CREATE/TRUNCATE, the other table still equal; the look is kept in <checkpoint>.pgpub.pg, and
    a restart copies nothing again. A table added that the filter leaves out is not copied."""
    pub = f"pubadd_{mode}"
    with pg.connect() as c:
        for t in ("nt_keep", "nt_late", "nt_bag"):
            c.execute(f"DROP TABLE IF EXISTS public.{t}")
        c.execute("CREATE TABLE public.nt_keep (id int PRIMARY KEY, v int)")
        c.execute("CREATE TABLE public.nt_late (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO public.nt_late SELECT g, 'v' || g FROM generate_series(1, 2000) g")
        c.execute("CREATE TABLE public.nt_bag (a int, b text)")  # (keyless; left out by the filter below)
        c.execute("ALTER TABLE public.nt_bag REPLICA IDENTITY FULL")
        c.execute(f"DROP PUBLICATION IF EXISTS {pub}")
        c.execute(f"CREATE PUBLICATION {pub} FOR TABLE public.nt_keep")
    region = pg_region("pg", pg, f"snapshot_chunk_rows=300\npublication={pub}\nslot=slot_{pub}\n"
                                 "publication_check_s=1\n").replace("create_publication=all\n", "")
    cfg = config(tmp_path, region, file_and_mysql(tmp_path, target), f"snapshotNewTables={mode}\n")
    (tmp_path / "filter_rule.txt").write_text("include public.nt_keep\ninclude public.nt_late\n")
    writer = PgWriter(pg)
    with capturer_running(cfg) as cap:
        streaming(cap)
        writer.start()
        wait_for(lambda: writer.n > 100 and cap.snapshot()["senders"]["mysql"]["rows"] > 100, 60, "load")
        watch = cap.snapshot()["regions"]["pg"]["publication_watch"]
        assert watch["looks"] >= 1 and watch["copies_asked"] == 0, watch
        with pg.connect() as c:
            c.execute(f"ALTER PUBLICATION {pub} ADD TABLE public.nt_late, public.nt_bag")
        wait_for(lambda: cap.snapshot()["regions"]["pg"]["publication_watch"]["copies_asked"] == 1, 60,
                 "the region to see the publication grow")
        wait_for(lambda: copies_done(cap, ["pg"]), 180, "the copy of the added table")
        st = cap.snapshot()
        tables = st["regions"]["pg"]["snapshot"]["tables"]
        assert sorted(tables) == ["public.nt_late"] and tables["public.nt_late"]["reason"] == "added to the publication"
        assert st["regions"]["pg"]["publication_watch"]["last_added"]["tables"] == ["public.nt_late"]
        n = writer.n
        wait_for(lambda: writer.n > n + 100, 60, "load after the copy")
        writer.stop()
        end = current_lsn(pg)
        wait_for(lambda: covered(tmp_path, "pg", end), 120, "every sender to catch up")
    saved = json.loads((tmp_path / "checkpoint.json.pgpub.pg").read_text())
    assert sorted(map(tuple, saved["tables"])) == [("public", "nt_bag"), ("public", "nt_keep"), ("public", "nt_late")]
    state = rebuild(read_changes(tmp_path / "out" / "changes.jsonl"))
    for table in ("nt_keep", "nt_late"):
        want = pg_rows(pg, "public", table)
        assert mysql_rows(target, "public", table) == want, f"MySQL target public.{table}"
        assert file_rows(state, "public", table) == want, f"file public.{table}"
    assert_no_change_before_create(tmp_path, "public", ("nt_late",))
    assert not any(x.get("table") == "nt_bag" for x in read_lines(tmp_path))
    # a restart: the publication as the file has it, nothing copied again
    with capturer_running(cfg) as cap:
        streaming(cap)
        wait_for(lambda: cap.snapshot()["regions"]["pg"]["publication_watch"]["looks"] >= 2, 30, "two looks")
        assert cap.snapshot()["regions"]["pg"]["publication_watch"]["copies_asked"] == 0
        assert not (cap.snapshot()["regions"]["pg"].get("snapshot") or {}).get("tables")
