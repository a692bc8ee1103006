from __future__ import annotations

from pathlib import Path

import pytest

from capturer.errors import ConfigError
from capturer.model import Position, RowChange, TableSchema, Txn
from capturer.pipeline.filter import parse_filter_text

P = Path("conf/filter_rule.txt")


def schema(db: str = "shop", table: str = "orders") -> TableSchema:
    return TableSchema(db, table, ("id", "country", "amount"), ("id",))


def test_table_selection_first_match_wins() -> None:
    f = parse_filter_text("exclude shop.tmp_*\ninclude shop.*\ninclude /^crm\\.(a|b)$/\n", P)
    assert f.table_selected("shop", "orders")
    assert not f.table_selected("shop", "tmp_x")
    assert f.table_selected("crm", "a")
    assert not f.table_selected("crm", "c")  # an include exists: unmatched tables are out
    assert not f.table_selected("other", "t")


def test_no_include_means_everything_but_excluded_and_system() -> None:
    f = parse_filter_text("exclude logs.*\n", P)
    assert f.table_selected("shop", "orders")
    assert not f.table_selected("logs", "x")
    assert not f.table_selected("mysql", "user")
    assert parse_filter_text("include mysql.*\n", P).table_selected("mysql", "user")


def test_backtick_names_with_dots() -> None:
    f = parse_filter_text("include `my.db`.`t.1`\n", P)
    assert f.table_selected("my.db", "t.1")
    assert not f.table_selected("my", "db.t.1")


@pytest.mark.parametrize(
    "text,line,needle",
    [
        ("include shop.*\nfrobnicate x\n", 2, "expected 'include PATTERN'"),
        ("\n\ninclude /unclosed(/\n", 3, "bad regex"),
        ("include\n", 1, "needs a pattern"),
        ("shop\tcountry\t=~\t'NL'\n", 1, "unknown operator"),
        ("# c\nshop\tcountry\t==\t__import__('os').system('true')\n", 2, "not a literal"),
        ("shop\tcountry\t==\n", 1, "4 TAB-separated"),
        ("shop\tid\tin\t5\n", 1, "needs a list"),
        ("include `unterminated.t\n", 1, "unterminated backtick"),
    ],
)
def test_bad_lines_name_their_line(text: str, line: int, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_filter_text(text, P)
    msg = str(ei.value)
    assert f"{P}:{line}:" in msg and needle in msg


def test_row_rules_never_eval() -> None:
    # a value that would run code under eval is rejected, not executed
    with pytest.raises(ConfigError):
        parse_filter_text("shop\tid\t==\t(lambda: 1)()\n", P)


def test_row_rules_split_updates_to_keep_targets_consistent() -> None:
    f = parse_filter_text("shop\tcountry\t==\t'NL'\nshop\tamount\t>=\t10\n", P)
    s = schema()
    nl = {"id": 1, "country": "NL", "amount": 20}
    de = {"id": 1, "country": "DE", "amount": 20}
    assert f.apply_change(RowChange(s, "insert", None, nl)) is not None
    assert f.apply_change(RowChange(s, "insert", None, de)) is None
    out = f.apply_change(RowChange(s, "update", nl, de))
    assert out is not None and out.op == "delete" and out.before == nl
    out = f.apply_change(RowChange(s, "update", de, nl))
    assert out is not None and out.op == "insert" and out.after == nl
    assert f.apply_change(RowChange(s, "update", de, de)) is None
    assert f.apply_change(RowChange(s, "delete", nl, None)) is not None
    small = {"id": 2, "country": "NL", "amount": 5}
    assert f.apply_change(RowChange(s, "insert", None, small)) is None
    # NULL compares false; a table without the field is not affected
    assert f.apply_change(RowChange(s, "insert", None, {"id": 3, "country": None, "amount": 50})) is None
    other = TableSchema("shop", "users", ("id",), ("id",))
    assert f.apply_change(RowChange(other, "insert", None, {"id": 9})) is not None


def test_txn_filter_keeps_empty_txn_for_positions() -> None:
    f = parse_filter_text("exclude shop.orders\n", P)
    t = Txn("r", 5, Position("f", 100), (RowChange(schema(), "insert", None, {"id": 1}),))
    out = f.apply(t)
    assert out.changes == () and out.position == t.position and out.commit_ts == 5


def test_in_operator_and_db_table_target() -> None:
    f = parse_filter_text("shop.orders\tcountry\tin\t['NL', 'BE']\n", P)
    s = schema()
    assert f.apply_change(RowChange(s, "insert", None, {"id": 1, "country": "BE", "amount": 1}))
    assert not f.apply_change(RowChange(s, "insert", None, {"id": 1, "country": "FR", "amount": 1}))
    other = schema(table="refunds")
    assert f.apply_change(RowChange(other, "insert", None, {"id": 1, "country": "FR", "amount": 1}))
