"""A PostgreSQL region's columns changed under the same name: a column dropped and added
again under its name (rows there before get NULL or the new default in PostgreSQL,
without a logged change) must reach the targets as such, not as the old column."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import wait_for

from devtools.local_mariadb import MariaDBInstance
from devtools.local_postgres import PostgresInstance
from devtools.pg_workload import file_rows, mysql_rows, pg_rows
from integration.test_postgresql import config, covered, current_lsn, file_and_mysql, pg_region, streaming
from senders.local.replay import read_changes, rebuild

pytestmark = pytest.mark.integration


def _equal(pg: PostgresInstance, target: MariaDBInstance, tmp: Path, tables: list[str]) -> None:
    state = rebuild(read_changes(tmp / "out" / "changes.jsonl"))
    bad = []
    for t in tables:
        want = pg_rows(pg, "public", t)
        for sink, got in (("mysql", mysql_rows(target, "public", t)), ("file", file_rows(state, "public", t, ()))):
            if got != want:
                bad.append(f"{sink} {t}: source {want}, sink {got}")
    assert not bad, "\n".join(bad)


def test_column_dropped_and_added_under_its_name(tmp_path: Path, target: MariaDBInstance,
                                                 capturer_running) -> None:  # type: ignore[no-untyped-def]
    pg = PostgresInstance().start()
    try:
        with pg.connect() as c:
            for t in ("caught", "behind", "dflt", "retyped"):
                c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, w int)")
        cfg = config(tmp_path, pg_region("pg", pg), file_and_mysql(tmp_path, target))
        with capturer_running(cfg) as cap:
            streaming(cap)
            with pg.connect() as c:
                for t in ("caught", "dflt", "retyped"):
                    c.execute(f"INSERT INTO {t} VALUES (1, 'old one', 1), (2, 'old two', 2)")
            end = current_lsn(pg)
            wait_for(lambda: covered(tmp_path, "pg", end), 60, "the first rows")
            with pg.connect() as c:
                # the capturer has seen the first relation message: it is behind for none of these
                c.execute("ALTER TABLE caught DROP COLUMN v")
                c.execute("ALTER TABLE caught ADD COLUMN v text")
                c.execute("INSERT INTO caught VALUES (3, 3, 'new')")
                c.execute("ALTER TABLE dflt DROP COLUMN v")
                c.execute("ALTER TABLE dflt ADD COLUMN v text DEFAULT 'dflt'")
                c.execute("UPDATE dflt SET w = 20 WHERE id = 2")
                c.execute("ALTER TABLE retyped DROP COLUMN w")
                c.execute("ALTER TABLE retyped ADD COLUMN w int")
                c.execute("UPDATE retyped SET v = 'x' WHERE id = 2")
                # here the first relation message is read after the catalog changed
                c.execute("INSERT INTO behind VALUES (1, 'old one', 1), (2, 'old two', 2)")
                c.execute("ALTER TABLE behind DROP COLUMN v")
                c.execute("ALTER TABLE behind ADD COLUMN v text")
                c.execute("INSERT INTO behind VALUES (3, 3, 'new')")
            end = current_lsn(pg)
            wait_for(lambda: covered(tmp_path, "pg", end), 60, "every change")
        _equal(pg, target, tmp_path, ["caught", "dflt", "retyped", "behind"])
    finally:
        pg.destroy()
