"""The one SQL builder: statement text from row changes, for the MySQL sender
(multi-row statements, values as parameters) and for ``build`` (one statement
per change: ``format=sql`` files and Kafka messages, values as literals).

``Table(db, table)`` makes the statements on one target table, each as
``(text, params)``:

* ``insert``: ``INSERT`` (or ``REPLACE``) of the new images of many changes,
  with ``ON DUPLICATE KEY UPDATE`` of every column if ``upsert``;
* ``delete``: ``DELETE ... WHERE <key>``; ``delete_keys``: one ``DELETE ...
  WHERE (pk) IN (...)`` for many changes;
* ``update``: ``UPDATE ... SET <new image> WHERE <old key>``.

The key is the primary key; without one (or when the row lacks a key column),
every column of the row, with NULL-safe ``<=>`` and ``LIMIT 1``. Identifiers are
always quoted. Values are parameters (``%s`` for pymysql; a ``%`` inside an
identifier is doubled), or literals (``literal=True``).

``build`` makes idempotent SQL: a replay converges to the same target state.

* insert -> ``INSERT ... ON DUPLICATE KEY UPDATE`` (an upsert)
* update -> in SQL text (``literal``: ``format=sql`` files and Kafka messages):
  the upsert of the new row, after ``DELETE ... WHERE <old key>`` if the key
  changed. A target being filled by a snapshot may not have the old row yet
  (its chunk is still to come, or was read before this change and leaves the
  key to it): an ``UPDATE`` would then change nothing and the row would be
  lost, where the upsert converges. With parameters (``literal=False``):
  ``UPDATE ... WHERE <old key>`` (for a target known to hold the row). A table
  without a key: ``UPDATE ... LIMIT 1`` either way (its snapshot copy is a
  TRUNCATE plus its rows, so the target always holds it). A partial image
  (``RowChange.absent``: columns left out) is always the ``UPDATE``: an insert
  would make the absent columns up (NULL or their defaults).
* delete -> ``DELETE ... WHERE <key>``
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from capturer.model import RowChange, TableSchema

log = logging.getLogger(__name__)
from capturer.model.encode import quote_ident, sql_literal, sql_param

Stmt = tuple[str, list[Any]]  # (text, parameters)

_CONVERTED_TYPES = (16, 248)  # BIT (bit string -> int) and SET (set -> "a,b") need sql_param


@lru_cache(maxsize=4096)
def param_ident(name: str) -> str:
    """A quoted identifier safe inside a pymysql query with parameters."""
    return quote_ident(name).replace("%", "%%")


def converted(s: TableSchema) -> frozenset[str | None]:
    """The columns whose values ``sql_param`` converts (``None`` in it: types unknown,
    every column); made once per schema."""
    conv = s.__dict__.get("_sql_converted")
    if conv is None:
        if len(s.column_types) == len(s.columns):
            conv = frozenset(c for c, t in zip(s.columns, s.column_types) if t in _CONVERTED_TYPES)
        else:
            conv = frozenset(s.columns) | {None}
        s.__dict__["_sql_converted"] = conv  # a frozen dataclass: set through __dict__
    return conv


def case_clash(s: TableSchema) -> tuple[str, str] | None:
    """Two columns whose names differ only in case (a PostgreSQL table may have ``"ID"`` and
    ``"id"``): a MySQL target compares column names case-insensitively, so it cannot hold both;
    found once per schema."""
    got = s.__dict__.get("_case_clash", False)
    if got is False:
        got = s.__dict__["_case_clash"] = name_clash(s.columns)  # a frozen dataclass: set through __dict__
    return got


def name_clash(names: Iterable[str]) -> tuple[str, str] | None:
    """The first two of ``names`` that differ only in case (as MariaDB and Spark compare
    column names: lower case, accents kept), or None."""
    seen: dict[str, str] = {}
    for c in names:
        other = seen.setdefault(c.lower(), c)
        if other != c:
            return (other, c)
    return None


def row_params(s: TableSchema, row: dict[str, Any], cols: list[str]) -> list[Any]:
    """The values of ``cols`` as pymysql parameters (``sql_param`` where the type needs it)."""
    conv = converted(s)
    if not conv:
        return [row[c] for c in cols]
    if None in conv:
        return [sql_param(row[c], s.type_of(c)) for c in cols]
    return [sql_param(row[c], s.type_of(c)) if c in conv else row[c] for c in cols]


#: renders ``(v, ...), (v, ...)`` from rows and columns (values that need no ``sql_param``)
Render = Callable[[list[dict[str, Any]], list[str]], str]


class Table:
    """Statements on the table ``db``.``table``; values as ``%s`` parameters, or as
    SQL literals (``literal``: no parameters, identifiers not ``%``-escaped)."""

    def __init__(self, db: str, table: str, literal: bool = False):
        self.literal = literal
        self.ident: Callable[[str], str] = quote_ident if literal else param_ident
        self.name = f"{self.ident(db)}.{self.ident(table)}"

    def _values(self, s: TableSchema, row: dict[str, Any], cols: list[str], params: list[Any]) -> list[str]:
        if self.literal:
            return [sql_literal(row[c], s.type_of(c)) for c in cols]
        params += row_params(s, row, cols)
        return ["%s"] * len(cols)

    def _tuples(self, rows: list[tuple[TableSchema, dict[str, Any]]], cols: list[str], params: list[Any]) -> str:
        """``(v, ...), (v, ...)``: the values of ``cols`` of each row."""
        if self.literal:
            return ", ".join("(" + ", ".join(self._values(s, row, cols, params)) + ")" for s, row in rows)
        for s, row in rows:
            params += row_params(s, row, cols)
        return ", ".join(["(" + ", ".join(["%s"] * len(cols)) + ")"] * len(rows))

    def _where(self, ch: RowChange, params: list[Any]) -> str:
        """The old image's key (NULL-safe), and ``LIMIT 1`` for a table without a primary key."""
        s, row = ch.schema, ch.before or {}
        cols = list(s.pk) if s.pk and all(c in row for c in s.pk) else list(row)
        vals = self._values(s, row, cols, params)
        return " AND ".join(f"{self.ident(c)} <=> {v}" for c, v in zip(cols, vals)) + ("" if s.pk else " LIMIT 1")

    def insert(self, chs: list[RowChange], verb: str = "INSERT", upsert: bool = False,
               render: Render | None = None) -> Stmt:
        """``verb`` (INSERT or REPLACE) of the new images, which have the first one's columns.
        ``render`` (a literal Table only): the values as SQL text from it, no parameters."""
        cols = list(chs[0].after or {})
        params: list[Any] = []
        if render is not None:
            assert self.literal
            rows = render([ch.after or {} for ch in chs], cols)
        else:
            rows = self._tuples([(ch.schema, ch.after or {}) for ch in chs], cols, params)
        sql = f"{verb} INTO {self.name} ({', '.join(map(self.ident, cols))}) VALUES {rows}"
        if upsert:
            sql += " ON DUPLICATE KEY UPDATE " + ", ".join(f"{q}=VALUES({q})" for q in map(self.ident, cols))
        return sql, params

    def delete(self, ch: RowChange) -> Stmt:
        params: list[Any] = []
        return f"DELETE FROM {self.name} WHERE {self._where(ch, params)}", params

    def delete_keys(self, chs: list[RowChange], render: Render | None = None) -> Stmt:
        """One statement for many rows, by the first one's primary key (every old image has it);
        ``render`` as for ``insert``."""
        pk = list(chs[0].schema.pk)
        params: list[Any] = []
        if render is not None:
            assert self.literal
            keys = render([ch.before or {} for ch in chs], pk)
        else:
            keys = self._tuples([(ch.schema, ch.before or {}) for ch in chs], pk, params)
        cols = ", ".join(map(self.ident, pk))
        return f"DELETE FROM {self.name} WHERE {f'({cols})' if len(pk) > 1 else cols} IN ({keys})", params

    def update(self, ch: RowChange) -> Stmt:
        after = ch.after or {}
        params: list[Any] = []
        vals = self._values(ch.schema, after, list(after), params)
        sets = ", ".join(f"{self.ident(c)}={v}" for c, v in zip(after, vals))
        return f"UPDATE {self.name} SET {sets} WHERE {self._where(ch, params)}", params


def build(ch: RowChange, target_db: str | None = None, literal: bool = False) -> Stmt:
    s = ch.schema
    t = Table(target_db or s.db, s.table, literal)
    if ch.op == "insert" or ch.op == "read":
        return t.insert([ch], upsert=bool(s.pk))
    if ch.op == "delete":
        return t.delete(ch)
    if literal and s.pk and ch.after is not None and all(c in ch.after for c in s.pk) and not ch.absent:
        # converges whether or not the target already holds the old row (see above)
        sql, _ = t.insert([ch], upsert=True)
        before, after = ch.before or {}, ch.after
        if before and any(before.get(c) != after.get(c) for c in s.pk):
            sql = f"{t.delete(ch)[0]}; {sql}"
        return sql, []
    return t.update(ch)


def skip_partial(ch: RowChange, count: Callable[[str, int], None], why: str) -> bool:
    """Whether an update its ``UPDATE ... WHERE <old key>`` could not apply (``why``: no
    row at the old key, or its new key taken) must be left out instead of inserted or
    replaced: its image leaves columns out (``RowChange.absent``), and inserting it
    would make them up. Counted (``partial_skipped``) and logged with the table and
    key. A PostgreSQL region sends such an image only for a row deleted or moved by a
    later transaction, which then carries the row's newer state (a delete, or a whole
    image at its next key): leaving it out converges; anything else is repaired by
    copying the table again (docs/regions-postgresql.md)."""
    absent = ch.absent
    if not absent:
        return False
    count("partial_skipped", 1)
    key = {c: (ch.after or {}).get(c) for c in ch.schema.pk}
    log.warning("an update of %s.%s (new key %s) leaves out column(s) %s and %s: not inserted (their values are not "
                "known); partial_skipped counts it", ch.schema.db, ch.schema.table, key, ", ".join(absent), why)
    return True
