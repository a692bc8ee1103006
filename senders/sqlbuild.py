"""Idempotent SQL from row changes: a replay converges to the same target state.

* insert -> ``INSERT ... ON DUPLICATE KEY UPDATE`` (an upsert)
* update -> in SQL text (``literal``: ``format=sql`` files and Kafka messages):
  the upsert of the new row, after ``DELETE ... WHERE <old key>`` if the key
  changed. A target being filled by a snapshot may not have the old row yet
  (its chunk is still to come, or was read before this change and leaves the
  key to it): an ``UPDATE`` would then change nothing and the row would be
  lost, where the upsert converges. With parameters (``literal=False``):
  ``UPDATE ... WHERE <old key>`` (for a target known to hold the row). A table
  without a key: ``UPDATE ... LIMIT 1`` either way (its snapshot copy is a
  TRUNCATE plus its rows, so the target always holds it).
* delete -> ``DELETE ... WHERE <key>``

The key is the primary key; without one, every column of the old image, with
NULL-safe ``<=>`` and ``LIMIT 1``. Identifiers are always quoted. Values are
parameters (``%s`` for pymysql; a ``%`` inside an identifier is doubled), or
literals for ``format=sql`` files.
"""

from __future__ import annotations

from typing import Any

from capturer.encode import quote_ident, sql_literal, sql_param
from capturer.model import RowChange, TableSchema


class _Out:
    def __init__(self, literal: bool):
        self.literal = literal
        self.params: list[Any] = []

    def ident(self, name: str) -> str:
        q = quote_ident(name)
        return q if self.literal else q.replace("%", "%%")

    def value(self, v: Any, type_code: int | None) -> str:
        if self.literal:
            return sql_literal(v, type_code)
        self.params.append(sql_param(v, type_code))
        return "%s"


def key_columns(schema: TableSchema, row: dict[str, Any]) -> list[str]:
    if schema.pk and all(c in row for c in schema.pk):
        return list(schema.pk)
    return list(row)


def _where(o: _Out, schema: TableSchema, row: dict[str, Any]) -> str:
    cols = key_columns(schema, row)
    return " AND ".join(f"{o.ident(c)} <=> {o.value(row[c], schema.type_of(c))}" for c in cols)


def build(ch: RowChange, target_db: str | None = None, literal: bool = False) -> tuple[str, list[Any]]:
    o = _Out(literal)
    s = ch.schema
    name = f"{o.ident(target_db or s.db)}.{o.ident(s.table)}"
    limit = "" if s.pk else " LIMIT 1"
    if ch.op == "insert" or ch.op == "read":
        row = ch.after or {}
        cols = ", ".join(o.ident(c) for c in row)
        vals = ", ".join(o.value(v, s.type_of(c)) for c, v in row.items())
        sql = f"INSERT INTO {name} ({cols}) VALUES ({vals})"
        if s.pk:
            upd = ", ".join(f"{o.ident(c)}=VALUES({o.ident(c)})" for c in row)
            sql += f" ON DUPLICATE KEY UPDATE {upd}"
    elif ch.op == "delete":
        sql = f"DELETE FROM {name} WHERE {_where(o, s, ch.before or {})}{limit}"
    elif literal and s.pk and ch.after is not None and all(c in ch.after for c in s.pk):
        # converges whether or not the target already holds the old row (see above)
        after = ch.after
        before = ch.before or {}
        cols = ", ".join(o.ident(c) for c in after)
        vals = ", ".join(o.value(v, s.type_of(c)) for c, v in after.items())
        upd = ", ".join(f"{o.ident(c)}=VALUES({o.ident(c)})" for c in after)
        sql = f"INSERT INTO {name} ({cols}) VALUES ({vals}) ON DUPLICATE KEY UPDATE {upd}"
        if before and any(before.get(c) != after.get(c) for c in s.pk):
            sql = f"DELETE FROM {name} WHERE {_where(o, s, before)}; {sql}"
    else:
        after = ch.after or {}
        sets = ", ".join(f"{o.ident(c)}={o.value(v, s.type_of(c))}" for c, v in after.items())
        sql = f"UPDATE {name} SET {sets} WHERE {_where(o, s, ch.before or {})}{limit}"
    return sql, o.params
