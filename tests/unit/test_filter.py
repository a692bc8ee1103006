from __future__ import annotations

from pathlib import Path
from typing import Any

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


def _reload_rig(tmp_path: Path) -> tuple[Any, list[Txn]]:
    """A Capturer over two MySQL regions that are never started (nothing connects), its
    filter rule file excluding d.late and what its merge callback dispatches."""
    from capturer.app import Capturer, load_config

    (tmp_path / "senders.cfg").write_text(f"[global]\ntype=local\n[local]\nfilepath={tmp_path / 'out.jsonl'}\n")
    (tmp_path / "filter.txt").write_text("exclude d.late\n")
    (tmp_path / "config.cfg").write_text(
        f"[global]\nbinlogCheckPointPath={tmp_path / 'cp.json'}\nsenderConfig={tmp_path / 'senders.cfg'}\n"
        f"filterRuleDict={tmp_path / 'filter.txt'}\nsnapshotNewTables=copy\nhttpPort=0\n\n"
        "[region:r1]\ntype=mysql\nhost=127.0.0.1\nport=1\nuser=u\npassword=\nserver_id=9\n"
        "\n[region:r2]\ntype=mysql\nhost=127.0.0.1\nport=2\nuser=u\npassword=\nserver_id=10\n")
    cap = Capturer(load_config(tmp_path / "config.cfg"))
    out: list[Txn] = []
    cap.manager.dispatch = lambda item, key=None: out.append(item)  # type: ignore[method-assign]
    # r2 stands for a region that copies nothing here (one served by an agent): only r1's
    # source lists d.late as added
    cap.group.tables_added = lambda was, now: {"r1": [("d", "late")]}  # type: ignore[method-assign]
    return cap, out


def _both(region: str, ts: int) -> Txn:
    return Txn(region, ts, Position("f.000001", ts), (RowChange(schema("d", "late"), "insert", None, {"id": ts}),
                                                      RowChange(schema("d", "t"), "insert", None, {"id": ts})))


@pytest.mark.parametrize("granted", [False, True])
def test_a_reload_waiting_for_its_copies_lets_no_added_table_through(tmp_path: Path, granted: bool) -> None:
    """While a reload asks for the copies of the tables it adds, changes to them from a
    region whose copy is not being made (r2) stay out, as they do in the region whose
    copy is held back (r1) until it starts; refused, the old rules stay; granted, the
    new ones pass. Before: r2's d.late change passed during the ask, and stayed in the
    sinks even though the reload was refused (a CI failure of
    test_a_copy_that_cannot_be_made_keeps_the_old_rules)."""
    cap, out = _reload_rig(tmp_path)
    seen: list[list[str]] = []

    def request_tables(names: object, region: object, truncate: bool, reason: str) -> dict[str, object]:
        for i, r in enumerate(("r1", "r2")):  # the merge thread emits while the ask is under way
            cap._on_item(_both(r, 10 + i))  # type: ignore[attr-defined]
        seen.extend([ch.table for ch in t.changes] for t in out)
        if not granted:
            raise ValueError("refused")
        return {"regions": {"r1": {"tables": ["d.late"]}}, "truncate": False}

    cap.group.request_tables = request_tables  # type: ignore[attr-defined]
    (tmp_path / "filter.txt").write_text("")
    code, body = cap.reload_filter()  # type: ignore[attr-defined]
    assert seen == [["t"], ["t"]], seen
    out.clear()
    cap._on_item(_both("r2", 20))  # type: ignore[attr-defined]
    if granted:
        assert code == 200 and out[0].changes == _both("r2", 20).changes, body
    else:
        assert code == 400 and "the old rules stay" in body["error"], body
        assert [ch.table for ch in out[0].changes] == ["t"]
        assert cap.filter.table_rules and cap.group.held() == {}  # type: ignore[attr-defined]


def test_a_name_with_glob_characters_is_selected_exactly_by_bracketing_them() -> None:
    """As docs/configuration.md says: quoted or not a name is a glob; `a[[]1]` is the table a[1] only."""
    f = parse_filter_text("include `d.b`.`a[[]1]`\ninclude x.`t[*]`\n", Path("filter_rule.txt"))
    assert f.table_selected("d.b", "a[1]") and not f.table_selected("d.b", "a1")
    assert f.table_selected("x", "t*") and not f.table_selected("x", "tx")
