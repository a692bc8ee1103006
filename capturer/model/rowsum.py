"""SQL that ``verify`` runs on MySQL/MariaDB servers: on the sources and on the MySQL
sender's target, the same text on both sides, so that their answers compare.

* ``checksum_sql``: ``COUNT(*)`` and ``SUM(CRC32(...))`` of a key range, computed in
  the server (the rows never travel). The row's text is its columns' values joined
  with a separator, plus one ``ISNULL`` flag per column (``CONCAT_WS`` skips NULLs:
  without the flags ``(NULL, 'a')`` and ``('a', NULL)`` would hash the same). A sum,
  not ``BIT_XOR``: a sum is additive, so the chunk's sums of several shards add up to
  the sum of their union, and two equal rows do not cancel out (a keyless table is a
  multiset). Both sides must read TIMESTAMPs in the same zone (``time_zone='+00:00'``).
  A chunk that differs is then compared row by row, by value (``verify``): a CRC32
  sum is a filter, never the proof of a difference.
* ``range_sql``: ``key > lo AND key <= hi`` for a (compound) primary key, spelled out
  column by column (``a > x OR (a = x AND b > y)``), which every server's range
  optimiser reads as an index range.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from capturer.model.encode import quote_ident


def row_text_sql(columns: Sequence[str]) -> str:
    """The row's text: each value's bytes (``CAST(... AS BINARY)``: columns of character sets that
    do not convert into one another, utf16 and sjis, made CONCAT_WS fail with "Illegal mix of
    collations" until 2026-11-29), joined, then the NULL flags."""
    cols = [quote_ident(c) for c in columns]
    flags = "CONCAT(" + ", ".join(f"ISNULL({c})" for c in cols) + ")"
    return f"CONCAT_WS(0x1f, {', '.join(f'CAST({c} AS BINARY)' for c in cols)}, {flags})"


def _after(pk: Sequence[str], vals: Sequence[Any], inclusive: bool, op: str) -> tuple[str, list[Any]]:
    """``pk op vals`` in key order (op ``>`` or ``<``; ``inclusive`` adds equality)."""
    ors: list[str] = []
    args: list[Any] = []
    for i, col in enumerate(pk):
        ands = [f"{quote_ident(c)} = %s" for c in pk[:i]]
        last = op + ("=" if inclusive and i == len(pk) - 1 else "")
        ands.append(f"{quote_ident(col)} {last} %s")
        args.extend(vals[:i + 1])
        ors.append("(" + " AND ".join(ands) + ")")
    return "(" + " OR ".join(ors) + ")", args


def range_sql(pk: Sequence[str], lo: Sequence[Any] | None, hi: Sequence[Any] | None) -> tuple[str, list[Any]]:
    """``WHERE`` text and arguments for the key range ``(lo, hi]`` (None: open end)."""
    parts: list[str] = []
    args: list[Any] = []
    if lo is not None:
        sql, a = _after(pk, lo, False, ">")
        parts.append(sql)
        args += a
    if hi is not None:
        sql, a = _after(pk, hi, True, "<")
        parts.append(sql)
        args += a
    return (" AND ".join(parts) or "1=1"), args


def keys_sql(pk: Sequence[str], keys: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
    """``WHERE`` text and arguments for rows whose key is one of ``keys``."""
    if len(pk) == 1:
        return f"{quote_ident(pk[0])} IN ({', '.join(['%s'] * len(keys))})", [k[0] for k in keys]
    one = "(" + " AND ".join(f"{quote_ident(c)} = %s" for c in pk) + ")"
    return "(" + " OR ".join([one] * len(keys)) + ")", [v for k in keys for v in k]


def checksum_sql(table_sql: str, columns: Sequence[str], where: str) -> str:
    return (f"SELECT COUNT(*), COALESCE(SUM(CRC32({row_text_sql(columns)})), 0) FROM {table_sql} "
            f"WHERE {where}")


def select_sql(table_sql: str, columns: Sequence[str], where: str, pk: Sequence[str] = (), limit: int = 0) -> str:
    cols = ", ".join(quote_ident(c) for c in columns)
    order = f" ORDER BY {', '.join(quote_ident(c) for c in pk)}" if pk else ""
    return f"SELECT {cols} FROM {table_sql} WHERE {where}{order}" + (f" LIMIT {int(limit)}" if limit else "")


def boundary_sql(table_sql: str, pk: Sequence[str], where: str, step: int) -> str:
    """The key ``step`` rows after the range's start (the next chunk's last key)."""
    cols = ", ".join(quote_ident(c) for c in pk)
    return f"SELECT {cols} FROM {table_sql} WHERE {where} ORDER BY {cols} LIMIT 1 OFFSET {max(0, int(step) - 1)}"
