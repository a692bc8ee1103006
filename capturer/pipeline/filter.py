"""``filter_rule.txt``: which tables are captured, and which rows.

Two kinds of line (blank lines and ``#`` comments are ignored):

* Table selection, first match wins::

      include shop.*            # glob on db and table, split at the first dot
      exclude shop.tmp_*
      include `my.db`.`t*`      # backticks quote names that contain dots
      exclude /^log_\\d+\\.audit$/   # a regex, matched against "db.table"

  With no ``include`` line everything not excluded is captured; once there is
  an ``include`` line, a table no line matches is left out. The system schemas
  (mysql, information_schema, performance_schema, sys) are left out unless a
  line includes them explicitly.

* Row rules, the seed's format ``db<TAB>field<TAB>op<TAB>value``: a row of a
  table in ``db`` (a glob, or ``db.table``) is kept only if it satisfies every
  rule for it. ``op`` is one of ``== != > >= < <= in not in``; ``value`` is a
  literal (number, 'string', None, True/False, or a list for ``in``) read with
  ``ast.literal_eval``: never ``eval``. A rule on a field the table does not have
  does not apply to that table. Comparing with NULL is false (except ``== None``).

  Updates are filtered on both images, so a target stays consistent: if only
  the old row matched, the update is sent as a delete; if only the new row
  matched, it is sent as an insert.
"""

from __future__ import annotations

import ast
import fnmatch
import logging
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from capturer.errors import ConfigError
from capturer.model import RowChange, Txn
from capturer.model.spill import SpilledChanges
from capturer.util.ini import read_text_file

log = logging.getLogger(__name__)

SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
}


@dataclass(frozen=True)
class TableRule:
    include: bool
    line: int
    text: str
    db_glob: str | None = None
    table_glob: str | None = None
    regex: re.Pattern[str] | None = None
    explicit_system: bool = False

    def matches(self, db: str, table: str) -> bool:
        if self.regex is not None:
            return self.regex.search(f"{db}.{table}") is not None
        assert self.db_glob is not None and self.table_glob is not None
        return fnmatch.fnmatchcase(db, self.db_glob) and fnmatch.fnmatchcase(table, self.table_glob)


@dataclass(frozen=True)
class RowRule:
    line: int
    db_glob: str
    table_glob: str
    field: str
    op: str
    value: Any

    def applies(self, db: str, table: str) -> bool:
        return fnmatch.fnmatchcase(db, self.db_glob) and fnmatch.fnmatchcase(table, self.table_glob)

    def test(self, row: dict[str, Any]) -> bool | None:
        """True/False, or None if the table has no such field (rule does not apply)."""
        if self.field not in row:
            return None
        v = row[self.field]
        if v is None and self.op not in ("==", "!="):
            return False
        try:
            return bool(_OPS[self.op](v, self.value))
        except TypeError:
            return False


def _split_name(text: str, path: Path, lineno: int) -> tuple[str, str]:
    """``db.table`` with optional backtick quoting of either part."""
    parts: list[str] = []
    i, n = 0, len(text)
    while i < n and len(parts) < 2:
        if text[i] == "`":
            j = i + 1
            buf = []
            while True:
                k = text.find("`", j)
                if k < 0:
                    raise ConfigError(f"{path}:{lineno}: unterminated backtick in {text!r}")
                buf.append(text[j:k])
                if k + 1 < n and text[k + 1] == "`":  # `` is a literal backtick
                    buf.append("`")
                    j = k + 2
                    continue
                i = k + 1
                break
            parts.append("".join(buf))
        else:
            k = text.find(".", i) if not parts else n
            k = n if k < 0 else k
            parts.append(text[i:k])
            i = k
        if len(parts) == 1:
            if i < n and text[i] == ".":
                i += 1
            elif i < n:
                raise ConfigError(f"{path}:{lineno}: expected '.' after the database in {text!r}")
    if i != n:
        raise ConfigError(f"{path}:{lineno}: unexpected text after the table in {text!r}")
    if len(parts) == 1:
        parts.append("*")
    if not parts[0] or not parts[1]:
        raise ConfigError(f"{path}:{lineno}: expected db.table, got {text!r}")
    return parts[0], parts[1]


class Filter:
    def __init__(self, table_rules: list[TableRule], row_rules: list[RowRule], source: str = ""):
        self.table_rules = table_rules
        self.row_rules = row_rules
        self.source = source
        self._has_include = any(r.include for r in table_rules)
        self._cache: dict[tuple[str, str], bool] = {}
        self._row_cache: dict[tuple[str, str], list[RowRule]] = {}

    @classmethod
    def empty(cls) -> Filter:
        return cls([], [])

    def table_selected(self, db: str, table: str) -> bool:
        key = (db, table)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._decide(db, table)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def _decide(self, db: str, table: str) -> bool:
        for rule in self.table_rules:
            if rule.matches(db, table):
                if rule.include and db.lower() in SYSTEM_SCHEMAS and not rule.explicit_system:
                    continue
                return rule.include
        if db.lower() in SYSTEM_SCHEMAS:
            return False
        return not self._has_include

    def _rules_for(self, db: str, table: str) -> list[RowRule]:
        key = (db, table)
        rules = self._row_cache.get(key)
        if rules is None:
            rules = [r for r in self.row_rules if r.applies(db, table)]
            self._row_cache[key] = rules
        return rules

    def _row_ok(self, rules: list[RowRule], row: dict[str, Any] | None) -> bool:
        if row is None:
            return False
        return all(r.test(row) is not False for r in rules)

    def apply_change(self, ch: RowChange) -> RowChange | None:
        if not self.table_selected(ch.db, ch.table):
            return None
        rules = self._rules_for(ch.db, ch.table)
        if not rules:
            return ch
        if ch.op == "insert" or ch.op == "read":
            return ch if self._row_ok(rules, ch.after) else None
        if ch.op == "delete":
            return ch if self._row_ok(rules, ch.before) else None
        b, a = self._row_ok(rules, ch.before), self._row_ok(rules, ch.after)
        if b and a:
            return ch
        if b:
            return replace(ch, op="delete", after=None)
        if a:
            return replace(ch, op="insert", before=None)
        return None

    def apply(self, txn: Txn) -> Txn:
        """The transaction with only the selected changes (possibly none; it is
        still passed on so that positions and the checkpoint advance)."""
        if txn.ddl is not None:
            # DDL is kept when its database (and table, where we could tell) is selected
            if self.ddl_selected(txn.ddl.db, txn.ddl.table):
                return txn
            return replace(txn, ddl=None)
        spilled = isinstance(txn.changes, SpilledChanges)
        if not self.table_rules and not self.row_rules:
            # one look per run of changes to the same table (their schema object is shared)
            schemas: Any = txn.changes.schemas if isinstance(txn.changes, SpilledChanges) \
                else (ch.schema for ch in txn.changes)
            last = None
            for s in schemas:
                if s is not last:
                    if s.db.lower() in SYSTEM_SCHEMAS:
                        break
                    last = s
            else:
                return txn
        if not self.row_rules and not spilled:
            # tables only: one decision per run of changes to the same table (a snapshot
            # chunk is one table); the transaction is passed on as it is if all are kept
            last = None
            for ch in txn.changes:
                s = ch.schema
                if s is not last:
                    if not self.table_selected(s.db, s.table):
                        break
                    last = s
            else:
                return txn
        if isinstance(txn.changes, SpilledChanges):  # a big transaction: filtered chunk by chunk, on disk
            # Txn.changes is typed as a tuple; a SpilledChanges stands in for one (duck-typed)
            return replace(txn, changes=txn.changes.filter_map(self.apply_change))  # type: ignore[arg-type]
        kept = []
        changed = False
        for ch in txn.changes:
            out = self.apply_change(ch)
            if out is not ch:
                changed = True
            if out is not None:
                kept.append(out)
        return replace(txn, changes=tuple(kept)) if changed else txn

    def ddl_selected(self, db: str, table: str) -> bool:
        if table:
            return self.table_selected(db, table)
        # a database-level statement (CREATE DATABASE ...): kept if the first rule
        # that names this database includes it, or excludes only some of its tables
        for rule in self.table_rules:
            if rule.regex is not None:
                if rule.regex.search(f"{db}."):
                    return rule.include
                continue
            if fnmatch.fnmatchcase(db, rule.db_glob or ""):
                if rule.include:
                    if db.lower() in SYSTEM_SCHEMAS and not rule.explicit_system:
                        continue
                    return True
                if rule.table_glob == "*":
                    return False
        if db.lower() in SYSTEM_SCHEMAS:
            return False
        return not self._has_include


def parse_filter_text(text: str, path: Path) -> Filter:
    table_rules: list[TableRule] = []
    row_rules: list[RowRule] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "\t" in raw:
            row_rules.append(_parse_row_rule(raw, path, lineno))
            continue
        word, _, rest = stripped.partition(" ")
        word = word.lower()
        rest = rest.strip()
        if word not in ("include", "exclude"):
            raise ConfigError(
                f"{path}:{lineno}: expected 'include PATTERN', 'exclude PATTERN' or a "
                f"TAB-separated row rule 'db<TAB>field<TAB>op<TAB>value', got {_short(stripped)}"
            )
        if not rest:
            raise ConfigError(f"{path}:{lineno}: '{word}' needs a pattern (db.table glob or /regex/)")
        include = word == "include"
        if rest.startswith("/"):
            if len(rest) < 3 or not rest.endswith("/"):
                raise ConfigError(f"{path}:{lineno}: a regex must be written /like this/, got {rest!r}")
            try:
                rx = re.compile(rest[1:-1])
            except re.error as exc:
                raise ConfigError(f"{path}:{lineno}: bad regex {rest!r}: {exc}") from None
            table_rules.append(TableRule(include, lineno, stripped, regex=rx, explicit_system=True))
        else:
            db, table = _split_name(rest, path, lineno)
            explicit = db.lower() in SYSTEM_SCHEMAS
            table_rules.append(TableRule(include, lineno, stripped, db, table, explicit_system=explicit))
    return Filter(table_rules, row_rules, str(path))


_SCALARS = (int, float, str, bytes, bool, type(None))


def _plain_value(v: Any) -> bool:
    """A value a row can hold: a scalar, or a list/tuple/set of scalars (a SET column
    is a Python set). Complex numbers, dicts and Ellipsis would only ever compare
    false, so a rule with them would silently drop every row."""
    if isinstance(v, _SCALARS):
        return True
    return isinstance(v, (list, tuple, set, frozenset)) and all(isinstance(x, _SCALARS) for x in v)


def _short(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _parse_row_rule(raw: str, path: Path, lineno: int) -> RowRule:
    parts = raw.rstrip("\r\n").split("\t")
    parts = [p.strip() for p in parts]
    if len(parts) != 4:
        raise ConfigError(
            f"{path}:{lineno}: a row rule has 4 TAB-separated fields db, field, op, value; "
            f"got {len(parts)}: {_short(raw.strip())}"
        )
    target, field, op, literal = parts
    if not target or not field:
        raise ConfigError(f"{path}:{lineno}: row rule needs a db and a field")
    op_norm = " ".join(op.split()).lower()
    if op_norm not in _OPS:
        raise ConfigError(
            f"{path}:{lineno}: unknown operator {_short(op)}; use one of {', '.join(_OPS)}"
        )
    try:
        value = ast.literal_eval(literal)
        if not _plain_value(value):
            raise ValueError("no row value is ever of that type")
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ConfigError(
            f"{path}:{lineno}: value {_short(literal)} is not a literal (number, 'string', None, "
            f"True/False, or a list/tuple of them)"
        ) from None
    if op_norm in ("in", "not in") and not isinstance(value, (list, tuple, set, frozenset, str)):
        raise ConfigError(f"{path}:{lineno}: '{op_norm}' needs a list, e.g. [1, 2, 3]")
    if isinstance(value, list):
        value = tuple(value)
    if "." in target and not target.startswith("`") or target.startswith("`"):
        db, table = _split_name(target, path, lineno)
    else:
        db, table = target, "*"
    return RowRule(lineno, db, table, field, op_norm, value)


def load_filter(path: Path | None) -> Filter:
    if path is None:
        return Filter.empty()
    return parse_filter_text(read_text_file(path, "filter rule file (filterRuleDict)"), path)


def split_pattern(text: str) -> tuple[str, str]:
    """``db.table`` glob patterns as filter rules read them (backticks quote a part, ```` `` ```` is a backtick
    in it; ``db`` alone is ``db.*``); ValueError for anything else."""
    try:
        return _split_name(text.strip(), Path("<pattern>"), 1)
    except ConfigError as exc:
        raise ValueError(str(exc).replace("<pattern>:1: ", "")) from None


def split_table_name(text: str) -> tuple[str, str]:
    """``db.table`` (backticks quote a part that holds dots, as in filter rules);
    ValueError for anything else (no globs here)."""
    try:
        db, table = _split_name(text.strip(), Path("<request>"), 1)
    except ConfigError as exc:
        raise ValueError(str(exc).replace("<request>:1: ", "")) from None
    if table == "*" and not text.strip().endswith("*"):
        raise ValueError(f"expected db.table, got {text!r}")
    return db, table


@dataclass(frozen=True)
class ReloadWindow:
    """While a filter reload that adds tables waits for their copies to be granted, the
    new rules are in force (the copies' checks and the regions served by agents use
    them) but only the old rules' tables pass, and those ``added`` asks to copy in each
    region (held back there until their copy starts, ``RegionGroup.strip_held``).
    Without it a change to an added table from a region that copies nothing here (one
    served by an agent) passed while the copy was being asked for, even when the copy
    was then refused and the old rules put back."""
    old: Filter
    added: dict[str, frozenset[tuple[str, str]]]

    def narrow(self, txn: Txn) -> Txn:
        mine = self.added.get(txn.region, frozenset())
        old = self.old
        d = txn.ddl
        if d is not None:
            keep = (d.db, d.table) in mine or old.ddl_selected(d.db, d.table)
            return txn if keep else replace(txn, ddl=None)

        def keep_change(ch: RowChange) -> RowChange | None:
            return ch if (ch.db, ch.table) in mine or old.table_selected(ch.db, ch.table) else None

        if isinstance(txn.changes, SpilledChanges):
            return replace(txn, changes=txn.changes.filter_map(keep_change))  # type: ignore[arg-type]
        kept = tuple(ch for ch in txn.changes if keep_change(ch) is not None)
        return txn if len(kept) == len(txn.changes) else replace(txn, changes=kept)
