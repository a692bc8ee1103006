"""The one SQL builder (senders/sqlbuild.py): exact text and parameters of the
statements the MySQL sender and ``build`` make."""

from __future__ import annotations

from typing import Any, cast

import pymysql

from capturer.model import RowChange, TableSchema
from capturer.model.encode import T_BIT
from senders.mysql.sender import Op, Worker
from senders.sqlbuild import Table, build, param_ident, row_params

KEYED = TableSchema("d", "t", ("id", "v"), ("id",))
PK2 = TableSchema("d", "t", ("a", "b", "v"), ("a", "b"))
KEYLESS = TableSchema("d", "k", ("a", "b"), ())
HOSTILE = TableSchema("d`b%", "t%s`", ("i`d", "v%s"), ("i`d",))


def ins(s: TableSchema, row: dict[str, Any]) -> RowChange:
    return RowChange(s, "insert", None, row)


def dele(s: TableSchema, row: dict[str, Any]) -> RowChange:
    return RowChange(s, "delete", row, None)


def upd(s: TableSchema, before: dict[str, Any], after: dict[str, Any]) -> RowChange:
    return RowChange(s, "update", before, after)


def test_multi_row_upsert_and_replace_of_a_keyed_table() -> None:
    rows = [ins(KEYED, {"id": 1, "v": "a"}), ins(KEYED, {"id": 2, "v": None})]
    assert Table("d", "t").insert(rows, upsert=True) == (
        "INSERT INTO `d`.`t` (`id`, `v`) VALUES (%s, %s), (%s, %s) "
        "ON DUPLICATE KEY UPDATE `id`=VALUES(`id`), `v`=VALUES(`v`)", [1, "a", 2, None])
    assert Table("x", "t").insert(rows, "REPLACE") == (
        "REPLACE INTO `x`.`t` (`id`, `v`) VALUES (%s, %s), (%s, %s)", [1, "a", 2, None])


def test_delete_by_a_list_of_keys() -> None:
    one = [dele(KEYED, {"id": 1, "v": "a"}), dele(KEYED, {"id": 2, "v": "b"}), dele(KEYED, {"id": 3, "v": "c"})]
    assert Table("d", "t").delete_keys(one) == (
        "DELETE FROM `d`.`t` WHERE `id` IN ((%s), (%s), (%s))", [1, 2, 3])
    two = [dele(PK2, {"a": 1, "b": "x", "v": 0}), dele(PK2, {"a": 2, "b": "y", "v": 0})]
    assert Table("d", "t").delete_keys(two) == (
        "DELETE FROM `d`.`t` WHERE (`a`, `b`) IN ((%s, %s), (%s, %s))", [1, "x", 2, "y"])


def test_update_and_delete_by_the_old_key() -> None:
    t = Table("d", "t")
    ch = upd(PK2, {"a": 1, "b": "x", "v": 5}, {"a": 1, "b": "z", "v": 6})
    assert t.update(ch) == ("UPDATE `d`.`t` SET `a`=%s, `b`=%s, `v`=%s WHERE `a` <=> %s AND `b` <=> %s",
                            [1, "z", 6, 1, "x"])
    assert t.delete(ch) == ("DELETE FROM `d`.`t` WHERE `a` <=> %s AND `b` <=> %s", [1, "x"])
    # an old image without the key (a minimal row image): every column it has, still no LIMIT
    assert t.delete(dele(PK2, {"v": 5})) == ("DELETE FROM `d`.`t` WHERE `v` <=> %s", [5])


def test_keyless_table_matches_the_whole_row_null_safely_one_row_only() -> None:
    t = Table("d", "k")
    ch = upd(KEYLESS, {"a": 1, "b": None}, {"a": None, "b": 2})
    assert t.update(ch) == ("UPDATE `d`.`k` SET `a`=%s, `b`=%s WHERE `a` <=> %s AND `b` <=> %s LIMIT 1",
                            [None, 2, 1, None])
    assert t.delete(ch) == ("DELETE FROM `d`.`k` WHERE `a` <=> %s AND `b` <=> %s LIMIT 1", [1, None])
    assert build(ch, literal=True) == ("UPDATE `d`.`k` SET `a`=NULL, `b`=2 WHERE `a` <=> 1 AND `b` <=> NULL LIMIT 1",
                                       [])
    # no key, so a plain INSERT (an upsert would need a key to collide on)
    assert build(ins(KEYLESS, {"a": 1, "b": None})) == ("INSERT INTO `d`.`k` (`a`, `b`) VALUES (%s, %s)", [1, None])


def test_hostile_identifiers_are_quoted_and_percent_escaped_only_with_parameters() -> None:
    assert param_ident("a`b%s") == "`a``b%%s`"
    ch = upd(HOSTILE, {"i`d": 1, "v%s": "x"}, {"i`d": 2, "v%s": "'); DROP TABLE t; --"})
    sql, params = build(ch)
    assert sql == "UPDATE `d``b%%`.`t%%s``` SET `i``d`=%s, `v%%s`=%s WHERE `i``d` <=> %s"
    assert params == [2, "'); DROP TABLE t; --", 1]
    assert sql % ("?", "?", "?") == "UPDATE `d``b%`.`t%s``` SET `i``d`=?, `v%s`=? WHERE `i``d` <=> ?"
    text, none = build(ch, literal=True)
    assert none == []
    assert text == ("DELETE FROM `d``b%`.`t%s``` WHERE `i``d` <=> 1; INSERT INTO `d``b%`.`t%s``` (`i``d`, `v%s`) "
                    "VALUES (2, '\\'); DROP TABLE t; --') ON DUPLICATE KEY UPDATE `i``d`=VALUES(`i``d`), "
                    "`v%s`=VALUES(`v%s`)")
    assert Table("d", "t%").delete_keys([dele(HOSTILE, {"i`d": 7, "v%s": 0})]) == (
        "DELETE FROM `d`.`t%%` WHERE `i``d` IN ((%s))", [7])


def test_target_database_override() -> None:
    sql, params = build(dele(KEYED, {"id": 4, "v": "a"}), target_db="o`ther")
    assert (sql, params) == ("DELETE FROM `o``ther`.`t` WHERE `id` <=> %s", [4])
    sql, _ = build(ins(KEYED, {"id": 4, "v": "a"}), target_db="x", literal=True)
    assert sql == "INSERT INTO `x`.`t` (`id`, `v`) VALUES (4, 'a') ON DUPLICATE KEY UPDATE `id`=VALUES(`id`), `v`=VALUES(`v`)"


def test_values_of_bit_and_set_columns_become_parameters_pymysql_takes() -> None:
    s = TableSchema("d", "t", ("id", "b", "s"), ("id",), (), (3, T_BIT, 248))
    assert row_params(s, {"id": 1, "b": "101", "s": {"y", "x"}}, ["id", "b", "s"]) == [1, 5, "x,y"]
    untyped = TableSchema("d", "t", ("id", "s"), ("id",))  # types unknown: every value converted
    assert row_params(untyped, {"id": 1, "s": frozenset({"b", "a"})}, ["s", "id"]) == ["a,b", 1]
    assert Table("d", "t").insert([ins(s, {"id": 1, "b": "", "s": set()})]) == (
        "INSERT INTO `d`.`t` (`id`, `b`, `s`) VALUES (%s, %s, %s)", [1, 0, ""])


class _Cursor:
    """Records statements; an UPDATE matches the rows listed in ``found``."""

    def __init__(self, found: list[int]):
        self.found = found
        self.log: list[tuple[str, list[Any]]] = []
        self.pending: list[int] = []
        self.rowcount = 0

    def execute(self, sql: str, params: list[Any]) -> int:
        self.log.append((sql, list(params)))
        if sql.startswith("INSERT") and "`dup`" in sql:
            raise pymysql.err.IntegrityError(1062, "Duplicate entry")
        self.pending = self.found[1:sql.count(";\n") + 1]
        return self.found[0]

    def nextset(self) -> bool:
        if not self.pending:
            return False
        self.rowcount = self.pending.pop(0)
        return True


class _Sender:
    def __init__(self) -> None:
        self.counters: dict[str, int] = {}

    def count(self, what: str, n: int = 1) -> None:
        self.counters[what] = self.counters.get(what, 0) + n


def _worker() -> Worker:
    w = Worker(cast(Any, _Sender()), 0)
    w.pool.shutdown()
    return w


def test_mysql_sender_batches_the_builders_statements() -> None:
    w = _worker()
    run = [Op((1, "r", i), upd(KEYED, {"id": i, "v": "a"}, {"id": i + 10, "v": "b"}), "tgt", "t") for i in (1, 2)]
    cur = _Cursor(found=[1, 0])
    w._update(cur, run)
    assert cur.log == [
        ("UPDATE `tgt`.`t` SET `id`=%s, `v`=%s WHERE `id` <=> %s;\n"
         "UPDATE `tgt`.`t` SET `id`=%s, `v`=%s WHERE `id` <=> %s", [11, "b", 1, 12, "b", 2]),
        # the second found no row at its old key: its new image is upserted
        ("INSERT INTO `tgt`.`t` (`id`, `v`) VALUES (%s, %s) ON DUPLICATE KEY UPDATE `id`=VALUES(`id`), "
         "`v`=VALUES(`v`)", [12, "b"]),
    ]
    assert w.s.counters == {"upsert_fallbacks": 1}
    cur = _Cursor(found=[1])
    w._delete(cur, [Op((1, "r", i), dele(KEYLESS, {"a": i, "b": None}), "d", "k") for i in (1, 2)])
    assert cur.log == [("DELETE FROM `d`.`k` WHERE `a` <=> %s AND `b` <=> %s LIMIT 1;\n"
                        "DELETE FROM `d`.`k` WHERE `a` <=> %s AND `b` <=> %s LIMIT 1", [1, None, 2, None])]


def test_mysql_sender_falls_back_to_replace_on_a_unique_key_collision() -> None:
    w = _worker()
    cur = _Cursor(found=[1])
    w._insert(cur, [Op((1, "r", 0), ins(KEYED, {"id": 1, "v": "a"}), "d", "dup")])
    assert [sql.split(" (")[0] for sql, _ in cur.log] == ["INSERT INTO `d`.`dup`", "REPLACE INTO `d`.`dup`"]
    assert cur.log[1] == ("REPLACE INTO `d`.`dup` (`id`, `v`) VALUES (%s, %s)", [1, "a"])
    assert w.s.counters == {"replace_fallbacks": 1}


class _Conn:
    def __init__(self, cur: _Cursor):
        self.cur = cur

    def cursor(self) -> Any:
        import contextlib

        return contextlib.nullcontext(self.cur)


def test_updates_that_keep_their_key_are_upserted_with_the_inserts() -> None:
    """A full-image update that keeps its primary key joins the multi-row upsert; a
    key change, a partial image (binlog_row_image=MINIMAL) and a keyless table keep
    ``UPDATE ... WHERE <old key>``, in stream order."""
    w = _worker()
    sender = cast(Any, w.s)
    sender.stmt_rows, sender.meta_db, sender.progress = 1000, "", {}
    changes = [
        ins(KEYED, {"id": 1, "v": "a"}),
        upd(KEYED, {"id": 2, "v": "x"}, {"id": 2, "v": "b"}),  # keeps its key: upserted with the insert
        upd(KEYED, {"id": 2, "v": "b"}, {"id": 2, "v": "c"}),  # the same row again: later in the statement
        upd(KEYED, {"id": 3, "v": "x"}, {"id": 4, "v": "x"}),  # a key change
        upd(KEYED, {"id": 5, "v": "x"}, {"id": 5}),  # a partial image
        upd(KEYLESS, {"a": 1, "b": 2}, {"a": 1, "b": 3}),
    ]
    cur = _Cursor(found=[1, 1])
    w._apply_ops(cast(Any, _Conn(cur)), [Op((1, "r", i), ch, "d", ch.schema.table) for i, ch in enumerate(changes)])
    assert cur.log == [
        ("INSERT INTO `d`.`t` (`id`, `v`) VALUES (%s, %s), (%s, %s), (%s, %s) ON DUPLICATE KEY UPDATE "
         "`id`=VALUES(`id`), `v`=VALUES(`v`)", [1, "a", 2, "b", 2, "c"]),
        ("UPDATE `d`.`t` SET `id`=%s, `v`=%s WHERE `id` <=> %s", [4, "x", 3]),
        ("UPDATE `d`.`t` SET `id`=%s WHERE `id` <=> %s", [5, 5]),
        ("UPDATE `d`.`k` SET `a`=%s, `b`=%s WHERE `a` <=> %s AND `b` <=> %s LIMIT 1", [1, 3, 1, 2]),
    ]


def test_a_unique_key_collision_in_a_multi_row_upsert_replaces_only_that_row() -> None:
    class Clash(_Cursor):
        def execute(self, sql: str, params: list[Any]) -> int:
            self.log.append((sql, list(params)))
            if sql.startswith("INSERT") and "clash" in params:
                raise pymysql.err.IntegrityError(1062, "Duplicate entry 'clash' for key 'v'")
            return 1

    w = _worker()
    run = [Op((1, "r", 0), ins(KEYED, {"id": 1, "v": "a"}), "d", "t"),
           Op((1, "r", 1), upd(KEYED, {"id": 2, "v": "x"}, {"id": 2, "v": "clash"}), "d", "t"),
           Op((1, "r", 2), upd(KEYED, {"id": 3, "v": "x"}, {"id": 3, "v": "c"}), "d", "t")]
    cur = Clash(found=[])
    w._insert(cur, run)
    assert [(sql.split(" (")[0], p) for sql, p in cur.log] == [
        ("INSERT INTO `d`.`t`", [1, "a", 2, "clash", 3, "c"]),  # rolled back whole by the server
        ("INSERT INTO `d`.`t`", [1, "a"]),
        ("INSERT INTO `d`.`t`", [2, "clash"]),
        ("REPLACE INTO `d`.`t`", [2, "clash"]),  # only the row that collides is replaced
        ("INSERT INTO `d`.`t`", [3, "c"]),
    ]
    assert w.s.counters == {"replace_fallbacks": 1}


def test_columns_a_mysql_target_takes_as_one() -> None:
    """PostgreSQL columns whose names differ only in case ("ID" and "id"): the MySQL sender stops naming
    both (before: its CREATE TABLE's "Duplicate column name" was taken for a statement applied before)."""
    from capturer.model.ddl import create_columns
    from senders.sqlbuild import case_clash

    assert case_clash(TableSchema("d", "t", ("ID", "x", "id"), ("ID",))) == ("ID", "id")
    assert case_clash(TableSchema("d", "t", ("Ünï", "üNÏ"), ())) == ("Ünï", "üNÏ")
    # what MariaDB keeps apart: accents, and ß from ss
    assert case_clash(TableSchema("d", "t", ("é", "e", "ß", "ss", "a b", "a_b"), ())) is None
    sql = ("CREATE TABLE IF NOT EXISTS `a(b`.`c``,d` (\n  `ID` INT NOT NULL,\n  `id` DECIMAL(5,2) NULL DEFAULT "
           "'a,)\\'b',\n  `x,y` LONGTEXT NULL,\n  PRIMARY KEY (`ID`),\n  UNIQUE KEY `uk` (`id`)\n) DEFAULT CHARSET=utf8mb4")
    assert create_columns(sql) == ["ID", "id", "x,y"]


def test_the_lake_stops_on_columns_differing_only_in_case(tmp_path: Any) -> None:
    """Spark (and so the lake's Parquet and Delta tables as Spark reads them) compares column names
    case-insensitively: the changelog sender stops naming the table and both columns, also when the
    second one comes later (an ADD COLUMN "ID" to a table with "id")."""
    import pytest

    from capturer.errors import SinkError
    from senders.spark import sender as sp

    opts = {k.name: k.default for k in sp.SparkSender.KEYS}
    opts.update({"warehouse": str(tmp_path), "compaction_interval": 0, "conf.*": {}})
    s = sp.SparkSender("spark", opts)
    with pytest.raises(SinkError, match=r"S\.T x: columns 'ID' and 'id' differ only in case") as e:
        s._state_for(TableSchema("S", "T x", ("ID", "id"), ("ID",)), [["ID", "bigint"], ["id", "bigint"]])
    assert not e.value.retriable
    s._state_for(TableSchema("S", "u", ("id", "é", "e"), ("id",)), [["id", "bigint"], ["é", "string"], ["e", "string"]])
    with pytest.raises(SinkError, match=r"'id' and 'Id'"):
        s._state_for(TableSchema("S", "u", ("id", "Id"), ("id",)), [["id", "bigint"], ["Id", "bigint"]])
    from capturer.model import Position, Txn
    from senders.spark.deltasink import DeltaSender

    d = DeltaSender("spark", {**opts, "table_format": "delta"})
    sch = TableSchema("S", "T x", ("ID", "id"), ("ID",))
    txn = Txn("r0", 10, Position("b.1", 4), (RowChange(sch, "insert", None, {"ID": 1, "id": 2}),))
    with pytest.raises(SinkError, match=r"S\.T x: columns 'ID' and 'id' differ only in case"):
        d._table_for([(txn, 0, txn.changes[0])], {"ID": "bigint", "id": "bigint"})


def test_keyless_tables_have_one_applied_row_each_whatever_their_names() -> None:
    """``<meta_db>.applied`` keys a keyless table's progress: "a.b" + "c" and "a" + "b.c" were one key, so after
    a crash one table's rows could be skipped (lost) or applied twice by the other's progress. Plain names keep
    the key they had (a target written before reads the same rows)."""
    from senders.mysql.worker import applied_key

    assert applied_key("shop", "orders") == "shop.orders"
    keys = {applied_key(d, t) for d, t in [("a.b", "c"), ("a", "b.c"), ("a", "b`.`c"), ("a`.`b", "c"), ("a", "b_c"),
                                           ("a`", "b"), ("a", "`b")]}
    assert len(keys) == 7 and "a.b_c" in keys


def test_two_tables_on_one_kafka_topic_by_their_names_stop_the_sender() -> None:
    """Tables whose topics are one only because a topic name keeps a-z A-Z 0-9 . _ - ("a b" and "a_b",
    "Ä" and "Ö") or because of a dot in a name ("a.b" + "c", "a" + "b.c"): their rows went to one topic under
    the same keys (the message key is the primary key), so a compacted topic kept only one table's row of a
    key. Now the sender stops naming both; a pattern that puts tables together by choice still may."""
    import pytest

    from capturer.errors import SinkError
    from senders.kafka.sender import KafkaSender

    def sender(topic: str) -> KafkaSender:
        options = {k.name: k.default for k in KafkaSender.KEYS}
        options.update(servers="127.0.0.1:9", process=False, topic=topic)
        return KafkaSender("k", options)

    s = sender("capturer.{db}.{table}")
    assert s.topic_for("S", "a b", "r1") == "capturer.S.a_b" == s.topic_for("S", "a b", "r2")
    for db, table in (("S", "a_b"), ("S", "a;b")):
        with pytest.raises(SinkError, match=r"`S`\.`a b` \(region r1\) and .* would both go to Kafka topic "
                                            r"'capturer\.S\.a_b'") as e:
            s.topic_for(db, table, "r1")
        assert not e.value.retriable
    # 'capturer.S.a.b' next to 'capturer.S.a_b': Kafka refuses the second ('.' and '_' are one to it)
    with pytest.raises(SinkError, match=r"`S`\.`a b` \(region r1\) and `S`\.`a\.b` \(region r1\) go to Kafka "
                                        r"topics 'capturer\.S\.a_b' and 'capturer\.S\.a\.b'"):
        s.topic_for("S", "a.b", "r1")
    d = sender("capturer.{db}.{table}")
    assert d.topic_for("S", "a.b", "r1") == "capturer.S.a.b"
    with pytest.raises(SinkError, match=r"`S`\.`a\.b` \(region r1\) and `S\.a`\.`b` \(region r1\)"):
        d.topic_for("S.a", "b", "r1")
    assert s.topic_for("S", "Ä", "r1") == "capturer.S._"
    with pytest.raises(SinkError):
        s.topic_for("S", "Ö", "r1")
    one = sender("all-{region}")  # every table in one topic per region: chosen, not by the names
    assert one.topic_for("a", "b", "r") == one.topic_for("c", "d", "r") == "all-r"
