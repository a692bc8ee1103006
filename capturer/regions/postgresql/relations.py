"""PostgreSQL relations as the region keeps them: a relation's definition (``RelDef``,
from pgoutput's Relation message and the catalog's keys, with its C decoding plan),
its journal by LSN (``RelationJournal``, ``<checkpoint>.postgresql.<region>``), and
the MySQL DDL made from a new or changed definition (``create_table_sql``,
``ddl_for``)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from capturer.model import TableSchema, format_lsn, parse_lsn
from capturer.model.encode import _fastrows, qualified, quote_ident
from capturer.regions.base import PositionJournal
from capturer.regions.postgresql import pgoutput as po
from capturer.regions.postgresql import types as pgt
from capturer.regions.postgresql.types import PgType, Unrepresentable, pg_type

# the C tuple decoder (capturer/_native/ pg_plan; None where the extension is not built, or is an older build)
_PG_C: Any = _fastrows if _fastrows is not None and hasattr(_fastrows, "pg_plan") else None


def _c_kind(oid: int, t: PgType) -> int:
    """The C decoder's kind for a column (0: it calls the column's parser)."""
    p = t.parse
    if p is pgt._text:
        return 1
    if p is int:
        return 2
    if p is pgt._bool:
        return 3
    if p is pgt._timestamp:
        return 5 if oid == pgt.TIMESTAMPTZ else 4
    if p is pgt._date:
        return 6
    if p is pgt._numeric:
        return 7
    return 0


def quote_pg(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class RelDef:
    """One version of a source table: its relation message plus its keys."""

    relid: int
    db: str  # the PostgreSQL schema (namespace): the "database" downstream
    table: str
    replident: str
    columns: tuple[po.Column, ...]
    pk: tuple[str, ...]
    unique_keys: tuple[tuple[str, ...], ...] = ()
    # each column's attnum in the catalog (0: not known): what tells a column renamed from one dropped and
    # another added, whatever else changed meanwhile (``align_attnums``); () where none is known
    attnums: tuple[int, ...] = ()
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def types(self) -> list[PgType]:
        t = self._cache.get("types")
        if t is None:
            t = self._cache["types"] = [pg_type(c.type_oid, c.typmod) for c in self.columns]
        return t

    @property
    def plan(self) -> Any:
        """The C decoder of this relation's tuples (None without the C build)."""
        if _PG_C is None:
            return None
        p = self._cache.get("plan")
        if p is None:
            p = self._cache["plan"] = _PG_C.pg_plan(
                tuple((c.name, _c_kind(c.type_oid, t), t.parse) for c, t in zip(self.columns, self.types)),
                Unrepresentable)
        return p

    @property
    def schema(self) -> TableSchema:
        s = self._cache.get("schema")
        if s is None:
            s = self._cache["schema"] = TableSchema(
                self.db, self.table, tuple(c.name for c in self.columns), self.pk, self.unique_keys,
                tuple(t.code for t in self.types), tuple(t.column_info() for t in self.types))
        return s

    def same_shape(self, other: RelDef) -> bool:
        """The same table downstream: names, columns, keys, and no column of the same name another
        attribute in the catalog (dropped and added again under its name: the same relation message,
        but the rows there hold NULL or the new default in it now)."""
        return (self.db, self.table, self.columns, self.pk, self.unique_keys) == \
            (other.db, other.table, other.columns, other.pk, other.unique_keys) and \
            all(not (a and b) or a == b for a, b in zip(self.attnums, other.attnums))

    def to_json(self) -> dict[str, Any]:
        return {"relid": self.relid, "db": self.db, "table": self.table, "replident": self.replident,
                "columns": [[c.name, c.type_oid, c.typmod, c.key] for c in self.columns],
                "pk": list(self.pk), "unique_keys": [list(u) for u in self.unique_keys],
                **({"attnums": list(self.attnums)} if self.attnums else {})}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RelDef:
        return cls(int(d["relid"]), str(d["db"]), str(d["table"]), str(d.get("replident", "d")),
                   tuple(po.Column(str(n), int(o), int(m), bool(k)) for n, o, m, k in d["columns"]),
                   tuple(d.get("pk", ())), tuple(tuple(u) for u in d.get("unique_keys", ())),
                   tuple(int(n) for n in d.get("attnums", ())))

    def attnum(self, name: str) -> int:
        """The catalog's attnum of column ``name`` (0: not known)."""
        for c, n in zip(self.columns, self.attnums):
            if c.name == name:
                return n
        return 0


def base_columns(query: Any, columns: tuple[po.Column, ...]) -> tuple[po.Column, ...]:
    """A relation message's columns with each domain's base type (``types.resolve_domains``): the
    message names the domain; its values are the base type's."""
    got = pgt.resolve_domains(query, [(c.type_oid, c.typmod) for c in columns])
    return tuple(c if (c.type_oid, c.typmod) == t else po.Column(c.name, t[0], t[1], c.key)
                 for c, t in zip(columns, got))


def align_attnums(columns: tuple[po.Column, ...], catalog: list[tuple[int, str, bool, int]],
                  known: RelDef | None = None) -> tuple[int, ...]:
    """The attnum of each of a relation message's ``columns`` (0 where it cannot be told), from
    the catalog as it is now: ``(attnum, name, dropped, type oid)`` of every attribute, in attnum
    order. The message is older than the catalog: a column may have been renamed or dropped since,
    and columns added since come after all of its own (PostgreSQL only appends). Its columns are
    the attributes alive when it was sent, in attnum order: a name alive now is that column; the
    columns between two such are the attributes between them (dropped or renamed since) when
    their number says which; after the last one, the first attributes alive now of the same types
    when no dropped attribute lies among them.

    ``known``: the table's definition before this message (its attnums as they were aligned then,
    closer to the message's time). It breaks a tie between two alignments, and a column left unknown
    keeps its attnum there when that attribute is dropped now or still has its name, in order: under
    DDL the catalog is often newer than the message by more than one change (a message sent between
    ``DROP/ADD COLUMN c`` and ``DROP/ADD COLUMN b``, read after both: b's name alive now is the new b)."""
    live = {name: (num, typ) for num, name, dropped, typ in catalog if not dropped}
    before = {c.name: n for c, n in zip(known.columns, known.attnums) if n} if known is not None else {}
    # the anchors (names alive now, in increasing attnum order) taken from the first column on and from the
    # last one back: where they differ (a column dropped and added again under its name since the message:
    # its name alive now comes after columns that came after it then), the one that places more columns
    # (a tie: the one agreeing with ``known`` on more columns, else the first, from the first column on)
    ways = [_kept(columns, catalog, _aligned(columns, catalog, _anchors(columns, live, backward)), before)
            for backward in (False, True)]
    return max(ways, key=lambda w: (sum(1 for n in w if n),
                                    sum(1 for c, n in zip(columns, w) if n and before.get(c.name) == n)))


def _kept(columns: tuple[po.Column, ...], catalog: list[tuple[int, str, bool, int]], got: tuple[int, ...],
          before: dict[str, int]) -> tuple[int, ...]:
    """``got`` with each column it left unknown at its attnum in the definition before (``before``: name ->
    attnum) where that attribute is dropped now or still has the column's name and type, in order."""
    out = list(got)
    if not before or all(out):
        return got
    by_num = {a[0]: a for a in catalog}
    for i, c in enumerate(columns):
        n = before.get(c.name, 0)
        a = by_num.get(n)
        if out[i] or a is None or n in out or not (a[2] or (a[1] == c.name and a[3] == c.type_oid)):
            continue
        lo = max((x for x in out[:i] if x), default=0)
        hi = min((x for x in out[i + 1:] if x), default=1 << 31)
        if lo < n < hi:
            out[i] = n
    return tuple(out)


def _anchors(columns: tuple[po.Column, ...], live: dict[str, tuple[int, int]], backward: bool) -> list[int]:
    out = [0] * len(columns)
    last = 1 << 31 if backward else 0
    for i in (range(len(columns) - 1, -1, -1) if backward else range(len(columns))):
        got = live.get(columns[i].name)
        if got is not None and (got[0] < last if backward else got[0] > last) and got[1] == columns[i].type_oid:
            out[i] = last = got[0]
    return out


def _aligned(columns: tuple[po.Column, ...], catalog: list[tuple[int, str, bool, int]],
             out: list[int]) -> tuple[int, ...]:
    """``align_attnums`` from its anchors: the columns between them."""
    anchored = set(out)
    i = 0
    while i < len(columns):
        if out[i]:
            i += 1
            continue
        j = i
        while j < len(columns) and not out[j]:
            j += 1
        lo = out[i - 1] if i else 0
        run = columns[i:j]
        if j < len(columns):  # between two anchors: every attribute there was alive then or dropped before
            cand = [a for a in catalog if lo < a[0] < out[j] and a[0] not in anchored]
            alive = [a for a in cand if not a[2]]
            pick = cand if len(cand) == len(run) else alive if len(alive) == len(run) else None
        else:
            cand = [a for a in catalog if a[0] > lo and a[0] not in anchored]
            alive = [a for a in cand if not a[2]][:len(run)]
            pick = alive if len(alive) == len(run) and not any(
                a[2] for a in cand if alive and a[0] < alive[-1][0]) else None
        if pick is not None and all(a[2] or a[3] == c.type_oid for a, c in zip(pick, run)):
            out[i:j] = [a[0] for a in pick]
        i = j
    return tuple(out)


class RelationJournal(PositionJournal[tuple[int, int], RelDef]):
    """The table definitions the region sent downstream, keyed by the LSN from
    which each applies (the end LSN of the transaction that first used it) and the
    table's relid: ``{lsn, rel}`` lines, fsync'd before the DDL leaves; a restart at
    LSN L starts from the newest definition of each table at or before L."""

    what = "relation journal"

    def parse(self, d: Any) -> tuple[tuple[int, int], RelDef]:
        rel = RelDef.from_json(d["rel"])
        return (parse_lsn(d["lsn"]), rel.relid), rel

    def dump(self, key: tuple[int, int], value: RelDef) -> dict[str, Any]:
        return {"lsn": format_lsn(key[0]), "rel": value.to_json()}

    @staticmethod
    def _newest(entries: Iterable[tuple[tuple[int, int], RelDef]], lsn: int) -> dict[int, tuple[int, int]]:
        """relid -> the key of its newest definition at or before ``lsn``."""
        out: dict[int, tuple[int, int]] = {}
        for key, _ in sorted(entries, key=lambda e: e[0][0]):  # (stable: the later line wins a tie)
            if key[0] <= lsn:
                out[key[1]] = key
        return out

    def state_at(self, lsn: int) -> dict[int, RelDef]:
        entries = dict(self.items())
        return {relid: entries[key] for relid, key in self._newest(entries.items(), lsn).items()}

    def record(self, lsn: int, rel: RelDef) -> None:
        self.put((lsn, rel.relid), rel)

    def prune(self, lsn: int) -> None:
        """Keep the newest definition of each table at or before ``lsn`` and everything after it."""
        def stale(entries: Mapping[tuple[int, int], RelDef]) -> list[tuple[int, int]]:
            keep = set(self._newest(entries.items(), lsn).values())
            return [k for k in entries if k[0] <= lsn and k not in keep]
        self.forget(stale)


# PostgreSQL compares text keys byte by byte (deterministic collations): 'abc', 'ABC', 'é', 'e' and 'abc '
# are five keys. A MySQL table's default collation (utf8mb4_general_ci, PAD SPACE) takes them for two, and
# the target merged their rows (ON DUPLICATE KEY UPDATE): a key column's text is compared in binary, NO PAD
# (MariaDB's name; the MySQL sender uses the target's own: utf8mb4_0900_bin on MySQL 8)
KEY_COLLATION = "utf8mb4_nopad_bin"


def _column_sql(c: po.Column, t: PgType, keys: set[str], pk: tuple[str, ...]) -> str:
    """A column definition: key columns (primary or unique) get a type MySQL can index, text compared
    as PostgreSQL compares it (``KEY_COLLATION``)."""
    sql = (t.key_sql or t.sql) if c.name in keys else t.sql
    if c.name in keys and sql.startswith(("VARCHAR", "CHAR")):
        sql += f" COLLATE {KEY_COLLATION}"
    return f"{quote_ident(c.name)} {sql}{' NOT NULL' if c.name in pk else ' NULL'}"


def _key_set(rel: RelDef) -> set[str]:
    return set(rel.pk) | {c for uk in rel.unique_keys for c in uk}


def uk_name(cols: tuple[str, ...]) -> str:
    """A unique key's index name downstream, from its columns (stable across versions)."""
    return "uk_{:08x}".format(zlib.crc32("\x1f".join(cols).encode("utf-8", "surrogatepass")))


def _cols(cols: tuple[str, ...]) -> str:
    return "(" + ", ".join(quote_ident(c) for c in cols) + ")"


def _same_columns(old: RelDef, new: RelDef) -> dict[str, str]:
    """Each column of ``new`` that is a column of ``old``: new name -> old name. The same
    attnum where both are known (a rename, whatever else changed); else the same name."""
    by_num = {n: c.name for c, n in zip(old.columns, old.attnums) if n}
    out: dict[str, str] = {}
    for c in new.columns:
        n = new.attnum(c.name)
        if n in by_num:
            out[c.name] = by_num[n]
    used = set(out.values())
    names = {c.name for c in old.columns}
    for c in new.columns:
        if c.name in out or c.name not in names or c.name in used:
            continue
        n, o = new.attnum(c.name), old.attnum(c.name)
        if not (n and o and n != o):  # (not a column dropped and another added under its name)
            out[c.name] = c.name
            used.add(c.name)
    return out


def create_table_sql(rel: RelDef) -> str:
    keys = _key_set(rel)
    parts = [_column_sql(c, t, keys, rel.pk) for c, t in zip(rel.columns, rel.types)]
    if rel.pk:
        parts.append("PRIMARY KEY " + _cols(rel.pk))
    for uk in rel.unique_keys:
        parts.append(f"UNIQUE KEY {quote_ident(uk_name(uk))} " + _cols(uk))
    return (f"CREATE TABLE IF NOT EXISTS {qualified(rel.db, rel.table)} (\n  " + ",\n  ".join(parts)
            + "\n) DEFAULT CHARSET=utf8mb4")


def ddl_for(old: RelDef | None, new: RelDef, defaults: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """MySQL statements ``(db, sql, table)`` that bring a target from ``old`` to ``new``.
    ``defaults``: SQL literals of added columns' values in existing rows (PostgreSQL
    gives rows that were there the column's default without logging a change)."""
    if old is None:
        return [(new.db, f"CREATE DATABASE IF NOT EXISTS {quote_ident(new.db)}", ""),
                (new.db, create_table_sql(new), new.table)]
    out: list[tuple[str, str, str]] = []
    if (old.db, old.table) != (new.db, new.table):
        if old.db != new.db:
            out.append((new.db, f"CREATE DATABASE IF NOT EXISTS {quote_ident(new.db)}", ""))
        out.append((new.db, f"RENAME TABLE {qualified(old.db, old.table)} TO {qualified(new.db, new.table)}",
                    new.table))
    old_keys, keys = _key_set(old), _key_set(new)
    before = {c.name: (i, c) for i, c in enumerate(old.columns)}
    after = {c.name: (i, c) for i, c in enumerate(new.columns)}
    old_types = dict(zip((c.name for c in old.columns), old.types))
    types = dict(zip((c.name for c in new.columns), new.types))
    # keys first go (an index on a column that changes or goes), then columns, then keys come
    clauses = [f"DROP INDEX {quote_ident(uk_name(u))}" for u in old.unique_keys if u not in new.unique_keys]
    if old.pk and old.pk != new.pk:
        clauses.append("DROP PRIMARY KEY")
    same = _same_columns(old, new)  # new name -> old name
    renamed = {n: o for n, o in same.items() if n != o}
    kept = set(same.values())
    gone = [n for n in before if n not in kept]
    added = [n for n in after if n not in same]
    if not renamed and len(gone) == 1 and len(added) == 1 and len(old.columns) == len(new.columns):
        (oi, oc), (ni, nc) = before[gone[0]], after[added[0]]
        if oi == ni and (oc.type_oid, oc.typmod) == (nc.type_oid, nc.typmod) and not (
                old.attnum(oc.name) and new.attnum(nc.name)):  # a column renamed in place (attnums unknown)
            renamed, gone, added = {nc.name: oc.name}, [], []
    clauses += [f"DROP COLUMN {quote_ident(n)}" for n in gone]
    for n, o in renamed.items():  # (its new definition too, if that changed)
        clauses.append(f"CHANGE COLUMN {quote_ident(o)} " + _column_sql(after[n][1], types[n], keys, new.pk))
    for n in after:
        if n in renamed:
            continue
        if n in added:
            d = (defaults or {}).get(n)
            clauses.append("ADD COLUMN " + _column_sql(after[n][1], types[n], keys, new.pk)
                           + (f" DEFAULT {d}" if d is not None else ""))
        else:
            was = _column_sql(before[n][1], old_types[n], old_keys, old.pk)
            now = _column_sql(after[n][1], types[n], keys, new.pk)
            if was != now:  # its type, or its being in a key (an indexable type, NOT NULL), changed
                clauses.append("MODIFY COLUMN " + now)
    if new.pk and old.pk != new.pk:
        clauses.append("ADD PRIMARY KEY " + _cols(new.pk))
    clauses += [f"ADD UNIQUE KEY {quote_ident(uk_name(u))} " + _cols(u)
                for u in new.unique_keys if u not in old.unique_keys]
    # a column added under the name of one that goes or is renamed (dropped and added again, a rename onto
    # it): its ADD in a statement of its own after the rest; the file's replay and the lake read a statement's
    # ADD COLUMNs first, so in one statement they took the added column for the one already there
    reused = set(added) & (set(gone) | set(renamed.values()))
    later = [c for c in clauses if c.startswith(("ADD COLUMN", "ADD PRIMARY KEY", "ADD UNIQUE KEY"))] \
        if reused else []
    for part in ([c for c in clauses if c not in later], later):
        if part:
            out.append((new.db, f"ALTER TABLE {qualified(new.db, new.table)} " + ", ".join(part), new.table))
    return out
