"""Transaction shapes of a MySQL/MariaDB binlog, without a server (capturer/regions/mysql/binlog.py).

Savepoints inside a transaction's group: the server logs ``ROLLBACK TO name`` (instead of
cutting its cache) when the transaction also changed a non-transactional table, so the rows
between the savepoint and the rollback are in the group but not in the source; the region
drops them, also from a spilled transaction. Trigger statements are not passed on (their
rows are in the binlog). The real binlog shapes: tests/integration/test_source_txn_shapes.py."""

from __future__ import annotations

import pytest

from capturer.model import RowChange, TableSchema
from capturer.regions.mysql.binlog import TxnAssembler, savepoint_statement

S = TableSchema("d", "t", ("id",), ("id",))


def ins(*ids: int) -> list[RowChange]:
    return [RowChange(S, "insert", None, {"id": i}) for i in ids]


def test_statements_as_the_binlog_writes_them() -> None:
    assert savepoint_statement("SAVEPOINT `s``p 1`") == ("SAVEPOINT", "s`p 1")
    assert savepoint_statement("ROLLBACK TO `s``p 1`") == ("ROLLBACK TO", "s`p 1")
    assert savepoint_statement("rollback work to savepoint A") == ("ROLLBACK TO", "a")
    assert savepoint_statement("RELEASE SAVEPOINT `x`") == ("RELEASE", "x")
    for other in ("ROLLBACK", "COMMIT", "SAVEPOINTS", "XA ROLLBACK X'01',X'',1", "SELECT 'SAVEPOINT a'"):
        assert savepoint_statement(other) is None, other


@pytest.mark.parametrize("spill_rows", [0, 3, 1000])
def test_rollback_to_drops_what_came_after_and_later_savepoints(tmp_path, spill_rows: int) -> None:  # type: ignore[no-untyped-def]
    t = TxnAssembler(spill_rows, str(tmp_path), "test")
    t.begin("0-1-1")
    t.add(ins(1, 2), "at 1")
    t.savepoint("SAVEPOINT", "a")
    t.add(ins(3, 4, 5, 6, 7), "at 2")
    t.savepoint("SAVEPOINT", "b")
    t.add(ins(8), "at 3")
    t.savepoint("ROLLBACK TO", "a")  # b goes with it
    t.savepoint("ROLLBACK TO", "b")  # (unknown now: nothing)
    assert t.rows == 2
    t.add(ins(9, 10, 11, 12), "at 4")
    t.savepoint("SAVEPOINT", "c")
    t.add(ins(13), "at 5")
    t.savepoint("ROLLBACK TO", "c")
    t.savepoint("ROLLBACK TO", "a")  # (a is kept after a rollback to it)
    t.add(ins(14), "at 6")
    _, rows, _, spilled = t.finish()
    assert [ch.after["id"] for ch in rows] == [1, 2, 14]
    assert spilled == (spill_rows == 3)


def test_a_cut_inside_a_spilled_chunk(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = TxnAssembler(4, str(tmp_path), "test")
    t.begin("0-1-1")
    t.add(ins(*range(10)), "at 1")
    t.savepoint("SAVEPOINT", "a")
    t.add(ins(*range(10, 30)), "at 2")
    t.savepoint("ROLLBACK TO", "a")
    t.savepoint("SAVEPOINT", "a")
    t.add(ins(*range(100, 103)), "at 3")
    t.savepoint("RELEASE", "a")
    t.savepoint("ROLLBACK TO", "a")  # (released: nothing)
    _, rows, _, spilled = t.finish()
    assert spilled and [ch.after["id"] for ch in rows] == [*range(10), 100, 101, 102]


def test_trigger_statements_are_not_passed_on() -> None:
    """A trigger's rows are in the binlog: a target that had the trigger would write them twice."""
    from capturer.model.ddl import is_data_ddl

    for q in ("CREATE DEFINER=`root`@`127.0.0.1` TRIGGER s.t AFTER INSERT ON s.x FOR EACH ROW SET @a = 1",
              "CREATE TRIGGER t BEFORE UPDATE ON x FOR EACH ROW SET @a = 1",
              "CREATE OR REPLACE DEFINER='a b'@'%' TRIGGER `t``1` AFTER DELETE ON x FOR EACH ROW SET @a = 1",
              "/* c */ DROP TRIGGER IF EXISTS s.t", "drop\ttrigger t"):
        assert not is_data_ddl(q), q
    for q in ("CREATE TABLE `trigger` (id INT)", "CREATE TABLE t (`trigger` INT)", "DROP TABLE triggers",
              "CREATE DEFINER=`root`@`localhost` VIEW v AS SELECT 1", "ALTER TABLE t ADD COLUMN `trigger` INT"):
        assert is_data_ddl(q), q


def test_system_versioned_rows_become_the_current_rows() -> None:
    """The binlog's rows of a system-versioned table: history rows go, an ended row is a delete,
    the period columns go from every image and from the keys (versioning.py)."""
    from capturer.regions.mysql.versioning import current_changes, current_schema

    full = TableSchema("s", "v", ("id", "v", "row_start", "row_end"), ("id", "row_end"), (("v", "row_end"),),
                       (3, 15, 17, 17))
    cur = current_schema(full, "row_start", "row_end")
    assert (cur.columns, cur.pk, cur.unique_keys, cur.column_types) == (("id", "v"), ("id",), (("v",),), (3, 15))
    end, then = "2038-01-19 03:14:07.999999", "2026-11-30 00:36:44.556412"

    def img(i: int, v: str, e: str) -> dict[str, object]:
        return {"id": i, "v": v, "row_start": "2026-11-30 00:00:00", "row_end": e}

    changes = [
        RowChange(full, "insert", None, img(1, "a", end)),               # a new row
        RowChange(full, "update", img(1, "a", end), img(1, "b", end)),   # UPDATE: the current row ...
        RowChange(full, "insert", None, img(1, "a", then)),              # ... and its history row
        RowChange(full, "update", img(1, "b", end), img(1, "b", then)),  # DELETE: the row ended
        RowChange(full, "delete", img(1, "a", then), None),              # DELETE HISTORY
        RowChange(full, "update", img(2, "x", then), img(2, "x", end)),  # (a history row made current)
    ]
    out = [(c.op, c.before, c.after) for c in current_changes(changes, cur, "row_start", "row_end")]
    assert out == [("insert", None, {"id": 1, "v": "a"}), ("update", {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),
                   ("delete", {"id": 1, "v": "b"}, None), ("insert", None, {"id": 2, "v": "x"})]
    # transaction-precise history: the end is the largest BIGINT UNSIGNED
    trx = TableSchema("s", "t", ("id", "s", "e"), ("id", "e"))
    rows = [RowChange(trx, "insert", None, {"id": 1, "s": 5, "e": (1 << 64) - 1}),
            RowChange(trx, "insert", None, {"id": 1, "s": 5, "e": 9})]
    assert [c.after for c in current_changes(rows, current_schema(trx, "s", "e"), "s", "e")] == [{"id": 1}]


def test_library_decoder_timestamps_past_2038() -> None:
    """The library (pymysqlreplication) reads a TIMESTAMP's seconds signed: a value past 2038
    (MariaDB 11.5+ keeps them up to 2106) came out as a 1901-1969 date; the region moves it back
    to the server's value, as the fast decoders read it. DATETIME columns are left as they are."""
    import datetime as dt

    from pymysqlreplication.row_event import WriteRowsEvent

    from capturer.model import ColumnInfo
    from capturer.regions.mysql.binlog import library_changes

    schema = TableSchema("d", "t", ("id", "ts", "dt"), ("id",),
                         column_info=(ColumnInfo(3), ColumnInfo(17), ColumnInfo(18)))
    ev = WriteRowsEvent.__new__(WriteRowsEvent)
    ev._RowsEvent__rows = [{"values": {"id": 1, "ts": dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
                                       "dt": dt.datetime(1960, 1, 1)}, "none_sources": {}},
                           {"values": {"id": 2, "ts": dt.datetime(2038, 1, 19, 3, 14, 7), "dt": None},
                            "none_sources": {}}]
    (a, b) = library_changes(ev, schema)
    assert a.after == {"id": 1, "ts": dt.datetime(2106, 2, 7, 6, 28, 15, 999999), "dt": dt.datetime(1960, 1, 1)}
    assert b.after == {"id": 2, "ts": dt.datetime(2038, 1, 19, 3, 14, 7), "dt": None}
