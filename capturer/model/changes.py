"""Row changes as the regions (and the applier) make them: one per row, in C where the
extension is built (``row_change``, ``row_changes`` in capturer/_native/wire_read.c), and then
left untracked by the cyclic collector when their images hold only atomic values. A
change made per row and kept in queues, windows and phases for a while would otherwise
be walked, with its values, by every young collection it lives through, for nothing:
nothing it holds refers back to it, so it cannot be in a cycle (reference counting frees
it). The same objects as ``RowChange(...)`` otherwise (tests/unit/test_gc_untracked.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from capturer.model import RowChange, TableSchema
from capturer.model.encode import _fastrows

_ROW_CHANGE = getattr(_fastrows, "row_change", None)  # (the C build; None without it)
_ROW_CHANGES = getattr(_fastrows, "row_changes", None)
KIND_OPS = ("update", "insert", "delete")  # make_changes' kinds

#: ``RowChange(schema, op, before, after)``, made as the module's text says
make_change: Callable[..., RowChange] = (
    functools.partial(_ROW_CHANGE, RowChange) if _ROW_CHANGE is not None else RowChange)


def make_changes(schema: TableSchema, kind: int, rows: list[Any]) -> list[RowChange]:
    """The row changes of one event, as ``make_change`` makes them: ``kind`` 0 updates from ``(before,
    after)`` pairs, 1 inserts and 2 deletes from images or ``(image, _)`` pairs (the fast decoder's)."""
    if _ROW_CHANGES is not None and type(rows) is list:
        return _ROW_CHANGES(RowChange, schema, KIND_OPS[kind], rows, kind)
    if kind == 0:
        return [RowChange(schema, "update", b, a) for b, a in rows]
    images = [r[0] if type(r) is tuple else r for r in rows]
    if kind == 1:
        return [RowChange(schema, "insert", None, img) for img in images]
    return [RowChange(schema, "delete", img, None) for img in images]
