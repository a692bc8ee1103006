"""MariaDB system-versioned tables (``WITH SYSTEM VERSIONING``) as the current rows only.

The binlog carries such a table's rows with its period columns (``row_start`` and
``row_end``, invisible, or the columns ``PERIOD FOR SYSTEM_TIME`` names), and its
history as rows: an UPDATE is the current row updated plus a history row inserted (its
``row_end`` the time of the change), a DELETE is the current row's ``row_end`` set
(an update), ``DELETE HISTORY`` deletes history rows. Passed on as they are, every sink
got the history rows as rows of the table (under the current row's key) and a MySQL
target refused the period columns (``Unknown column 'row_start'``: the capturer stopped).

So the region passes on what ``SELECT * FROM t`` shows: the current rows, without the
period columns, keyed by the table's own key (without ``row_end``): a row is current
when its ``row_end`` is the period's end (the largest TIMESTAMP(6), or the largest
BIGINT UNSIGNED for transaction-precise history). A MySQL target created by the
table's DDL keeps its own history."""

from __future__ import annotations

import re
from typing import Any

from capturer.model import RowChange, TableSchema
from capturer.model.encode import qualified

_PERIOD = re.compile(r"PERIOD\s+FOR\s+SYSTEM_TIME\s*\(\s*`((?:[^`]|``)+)`\s*,\s*`((?:[^`]|``)+)`\s*\)", re.I)
#: the period's end as the binlog's rows carry it (TIMESTAMP(6): 2038 up to MariaDB 11.4, 2106 from 11.5 on;
#: transaction-precise history: BIGINT UNSIGNED)
_ENDS = ("2038-01-19 03:14:07.999999", "2106-02-07 06:28:15.999999")
_TRX_END = (1 << 64) - 1


def period_columns(cur: Any, db: str, table: str) -> tuple[str, str] | None:
    """(row start, row end) column names of a system-versioned table; None for any other table."""
    cur.execute("SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                (db, table))
    row = cur.fetchone()
    if row is None or str(row[0]).upper() != "SYSTEM VERSIONED":
        return None
    cur.execute(f"SHOW CREATE TABLE {qualified(db, table)}")
    create = str(cur.fetchone()[1])
    m = _PERIOD.search(create)
    if m is None:  # (implicit: the invisible columns the server names itself)
        return ("row_start", "row_end")
    return (m.group(1).replace("``", "`"), m.group(2).replace("``", "`"))


def current_schema(schema: TableSchema, start: str, end: str) -> TableSchema:
    """The table as the current rows show it: without the period columns (nor in its keys)."""
    keep = [i for i, c in enumerate(schema.columns) if c not in (start, end)]
    return TableSchema(
        schema.db, schema.table, tuple(schema.columns[i] for i in keep),
        tuple(c for c in schema.pk if c not in (start, end)),
        tuple(u for u in (tuple(c for c in uk if c not in (start, end)) for uk in schema.unique_keys) if u),
        tuple(schema.column_types[i] for i in keep) if schema.column_types else (),
        tuple(schema.column_info[i] for i in keep) if schema.column_info else ())


def is_current(end_value: Any) -> bool:
    if isinstance(end_value, int):
        return end_value == _TRX_END
    return end_value is not None and str(end_value).startswith(_ENDS)


def current_changes(changes: list[RowChange], schema: TableSchema, start: str, end: str) -> list[RowChange]:
    """The changes of the current rows (``schema``: ``current_schema``'s): history rows
    inserted or deleted go, a current row ended is deleted, one made current (a history
    row restored) is inserted; the period columns go from every image."""
    def strip(img: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in img.items() if k != start and k != end}

    out: list[RowChange] = []
    for ch in changes:
        before = ch.before if ch.before is not None and is_current(ch.before.get(end)) else None
        after = ch.after if ch.after is not None and is_current(ch.after.get(end)) else None
        if before is not None and after is not None:
            out.append(RowChange(schema, "update", strip(before), strip(after)))
        elif before is not None:
            out.append(RowChange(schema, "delete", strip(before), None))
        elif after is not None:
            out.append(RowChange(schema, "insert", None, strip(after)))
    return out
