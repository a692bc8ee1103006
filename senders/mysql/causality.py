"""Row-conflict detection for parallel apply (the tidb-binlog loader model).

Every change has conflict keys: its table's primary key and each unique key,
from both the before and the after image, qualified by target db and table.
An image of a table without a primary key whose unique keys are all NULL there
(NULLs never collide, so no key names that row) gets the table-wide key.
Changes whose keys fall into one causal group go to one worker, in order; a
change whose keys link two groups cannot be placed without risking reorder, so
the caller flushes (a barrier), resets, and places it again. A table with no
primary or unique key gets a single table-wide key: its rows are applied in
order by one worker.

This module is the specification (``conflict_keys_py``, ``CausalityPy``,
``stable_hash_py``); where the C extension is built, ``conflict_keys``,
``Causality`` and ``stable_hash`` are its twins in ``capturer/_native/causality.c``
(the same keys, groups and hashes: tests/unit/test_fuzz_causality.py), which fold
ints, bytes and strings themselves (a non-ASCII character through ``_fold_char``, once
per character) and give every other value to ``_canon``.
"""

from __future__ import annotations

import dataclasses
import types
import unicodedata
import zlib
from functools import partial
from typing import Any

from capturer.model import RowChange
from capturer.model.encode import _fastrows

Key = str


def _canon(v: Any) -> str:
    if type(v) is int:
        return f"int:{v}"
    if isinstance(v, (bytes, bytearray)):
        return "b:" + bytes(v).hex()
    if isinstance(v, str):
        # MySQL's default collations compare case-, accent- and trailing-space-
        # insensitively: keys equal under them must conflict too (folding more
        # than a collation does only costs parallelism, never order)
        folded = unicodedata.normalize("NFKD", v.rstrip(" ").casefold())
        return "s:" + "".join(c for c in folded if not unicodedata.combining(c))
    return f"{type(v).__name__}:{v}"


def _fold_char(c: str) -> str:
    """One character's part of ``_canon``'s fold (the C twin folds a string character by character: casefold
    and NFKD map each character alone, and NFKD only reorders combining marks, which are dropped)."""
    return "".join(x for x in unicodedata.normalize("NFKD", c.casefold()) if not unicodedata.combining(x))


_plans: dict[tuple[int, str, str], tuple[Any, str, list[tuple[str, tuple[str, ...]]]]] = {}


def _plan(s: Any, db: str, table: str) -> tuple[str, list[tuple[str, tuple[str, ...]]]]:
    """(key prefix, [(index key prefix, columns)]) of a table, made once per schema."""
    hit = _plans.get((id(s), db, table))
    if hit is not None and hit[0] is s:
        return hit[1], hit[2]
    prefix = f"{len(db)}:{db}{len(table)}:{table}"
    indexes: list[tuple[str, tuple[str, ...]]] = []
    if s.pk:
        indexes.append((prefix + "|PRIMARY|", tuple(s.pk)))
    indexes.extend((f"{prefix}|uk{i}|", tuple(uk)) for i, uk in enumerate(s.unique_keys))
    if len(_plans) > 10_000:
        _plans.clear()
    _plans[(id(s), db, table)] = (s, prefix, indexes)  # s kept: its id cannot be reused meanwhile
    return prefix, indexes


def conflict_keys_py(ch: RowChange, db: str, table: str) -> list[Key]:
    prefix, indexes = _plan(ch.schema, db, table)
    if not indexes:
        return [prefix + "|*"]
    keys: list[Key] = []
    nopk = not ch.schema.pk
    for image in (ch.before, ch.after):
        if image is None:
            continue
        n = len(keys)
        for head, cols in indexes:
            if len(cols) == 1:
                v = image.get(cols[0])
                if v is not None:  # NULLs never collide in a unique index
                    keys.append(head + _canon(v))
                continue
            vals = [image.get(c) for c in cols]
            if any(v is None for v in vals):
                continue
            keys.append(head + "\x1f".join(_canon(v) for v in vals))
        if nopk and len(keys) == n and prefix + "|*" not in keys:
            # a row of a table without a primary key whose unique keys are all NULL in this image: no key
            # names the row, so the table-wide key does (its other changes in that state have it too, and the
            # change that gives it a unique value carries both: they stay in order on one worker)
            keys.append(prefix + "|*")
    return keys or [prefix + "|*"]


def stable_hash_py(key: Key) -> int:
    """Never Python's salted hash(): the same key goes to the same worker in every run."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass"))


class CausalityPy:
    def __init__(self) -> None:
        self.relations: dict[Key, Key] = {}

    def place(self, keys: list[Key]) -> Key | None:
        """Place ``keys`` in one group and return it: the group one of them is in
        already, else a new one; None (nothing placed) when they fall into two
        groups (the caller flushes, resets and places them again)."""
        rel = self.relations
        if len(keys) == 1:  # most changes: one primary key
            k = keys[0]
            group = rel.get(k)
            if group is None:
                rel[k] = group = k
            return group
        groups = {rel[k] for k in keys if k in rel}
        if len(groups) > 1:
            return None
        group = groups.pop() if groups else keys[0]
        for k in keys:
            rel[k] = group
        return group

    def reset(self) -> None:
        self.relations.clear()

    def __len__(self) -> int:
        return len(self.relations)


_c_keys = getattr(_fastrows, "conflict_keys", None)
_c_place: Any = getattr(_fastrows, "causality_place", None)
_c_hash = getattr(_fastrows, "stable_hash", None)
_c_run = getattr(_fastrows, "place_txns", None)


class CausalityC(CausalityPy):
    """CausalityPy, its ``place`` in C (capturer/_native/causality.c) on the same ``relations``."""

    def __init__(self) -> None:
        super().__init__()
        self.place = partial(_c_place, self.relations)  # type: ignore[method-assign]


conflict_keys: Any = conflict_keys_py
stable_hash: Any = stable_hash_py
Causality: type[CausalityPy] = CausalityPy
if _c_keys is not None and _c_place is not None and _c_hash is not None:
    # conflict_keys(ch, db, table) -> [Key]: conflict_keys_py's keys, made in C (the partial's one bound
    # argument keeps the call on the stack)
    conflict_keys = partial(_c_keys, (_plans, _plan, _canon, conflict_keys_py, _fold_char))
    stable_hash = _c_hash
    Causality = CausalityC


def make_place_txns(op_type: type) -> Any:
    """The C build of the MySQL sender's placing of a batch's transactions (``place_txns`` in
    capturer/_native/causality.c: ``_Phases.place`` of each change as ``_send`` and ``_place_each`` call
    it, with these keys, groups and hashes), making ``op_type``'s instances (a slots dataclass of the
    fields ident, ch, db, table, pos) itself; None where the extension (or its keys) is not built."""
    if _c_run is None or conflict_keys is conflict_keys_py:
        return None
    names = ("ident", "ch", "db", "table", "pos")
    if tuple(f.name for f in dataclasses.fields(op_type)) != names:
        return None
    descrs = tuple(op_type.__dict__.get(n) for n in names)
    if not all(isinstance(d, types.MemberDescriptorType) for d in descrs):
        return None
    return partial(_c_run, (conflict_keys.args[0], op_type, descrs))
