from __future__ import annotations

import datetime as dt
import decimal

from capturer.model import RowChange, TableSchema
from capturer.model.encode import T_BIT, json_value, quote_ident, sql_literal
from senders.sqlbuild import build


def test_quote_ident_doubles_backticks() -> None:
    assert quote_ident("we`ird") == "`we``ird`"


def test_upsert_is_parameterised_and_quotes_hostile_names() -> None:
    s = TableSchema("d`b", "t%s", ("id", "na`me"), ("id",))
    sql, params = build(RowChange(s, "insert", None, {"id": 1, "na`me": "x'); DROP TABLE t; --"}))
    assert sql.startswith("INSERT INTO `d``b`.`t%%s` (`id`, `na``me`) VALUES (%s, %s)")
    assert "ON DUPLICATE KEY UPDATE" in sql
    assert params == [1, "x'); DROP TABLE t; --"]
    assert sql % tuple("?" for _ in params)  # pymysql-style formatting works with the %% escape


def test_update_by_old_key_and_delete_without_pk() -> None:
    s = TableSchema("d", "t", ("id", "v"), ("id",))
    sql, params = build(RowChange(s, "update", {"id": 1, "v": "a"}, {"id": 2, "v": "b"}))
    assert sql == "UPDATE `d`.`t` SET `id`=%s, `v`=%s WHERE `id` <=> %s"
    assert params == [2, "b", 1]
    nopk = TableSchema("d", "t", ("a", "b"), ())
    sql, params = build(RowChange(nopk, "delete", {"a": 1, "b": None}, None))
    assert sql == "DELETE FROM `d`.`t` WHERE `a` <=> %s AND `b` <=> %s LIMIT 1"


def test_literals() -> None:
    assert sql_literal("it's \\ ok") == "'it\\'s \\\\ ok'"
    assert sql_literal(b"\x00\xff") == "X'00ff'"
    assert sql_literal("10101", T_BIT) == "21"
    assert sql_literal(None) == "NULL"
    assert sql_literal(dt.timedelta(hours=-1, minutes=-2)) == "'-01:02:00'"


def test_json_values() -> None:
    assert json_value(decimal.Decimal("12345678901234.123456")) == ("12345678901234.123456", False)
    assert json_value(dt.datetime(2024, 1, 2, 3, 4, 5, 6)) == ("2024-01-02 03:04:05.000006", False)
    assert json_value(b"\x00\x01") == ("AAE=", True)
    assert json_value({"b", "a"}) == ("a,b", False)
    assert json_value(18446744073709551615) == (18446744073709551615, False)
    assert json_value(dt.timedelta(hours=838, seconds=59)) == ("838:00:59", False)
