"""The binlog position a MySQL/MariaDB server writes next, across versions.

``SHOW MASTER STATUS`` is what MariaDB and MySQL up to 8.3 know; MySQL 8.4 removed
it in favour of ``SHOW BINARY LOG STATUS`` (which MariaDB 10.5.2+ knows too). The
first is asked first; the second only when the server does not know the first
(a syntax error), so that a real failure (no privilege, binlog off) is reported
as it is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

STATEMENTS = ("SHOW MASTER STATUS", "SHOW BINARY LOG STATUS")
_SYNTAX = 1064  # ER_PARSE_ERROR: the server does not know the statement


def errno_of(exc: BaseException) -> int:
    v = getattr(exc, "errno", None)
    if isinstance(v, int):
        return v
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0


def binlog_end(query: Callable[[str], Sequence[Sequence[Any]]]) -> tuple[str, int] | None:
    """(file, position) from the first statement the server knows; None when the
    binlog is off (an empty answer). ``query(sql)`` returns the rows."""
    for i, sql in enumerate(STATEMENTS):
        try:
            rows = query(sql)
        except Exception as exc:
            if errno_of(exc) == _SYNTAX and i + 1 < len(STATEMENTS):
                continue
            raise
        if not rows:
            return None
        return str(rows[0][0]), int(rows[0][1])
    return None
