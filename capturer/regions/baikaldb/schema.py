"""Source tables of a BaikalDB binlog table, as the meta server describes them.

A ``TableDef`` is one version of a source table's ``SchemaInfo``: its fields
(``field_id`` = the protobuf field number of a row), their BaikalDB types,
which are dropped (``deleted``: ids are never reused), the primary and unique
keys. It gives the ``TableSchema`` the rest of the pipeline sees (MySQL type
codes, so every sender treats BaikalDB columns like MySQL ones) and the MySQL
DDL that brings a target from one version to the next (BaikalDB's binlog
carries no DDL: the capturer writes it from the schema difference).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

from capturer.model import ColumnInfo, TableSchema
from capturer.model.encode import qualified, quote_ident

# PrimitiveType (proto/baikaldb.proto)
NULL_TYPE, BOOL, INT8, INT16, INT32, INT64 = 1, 2, 3, 4, 5, 6
UINT8, UINT16, UINT32, UINT64 = 7, 8, 9, 10
FLOAT, DOUBLE, STRING, DATETIME, TIMESTAMP, DATE, HLL, TIME = 11, 12, 13, 14, 15, 16, 17, 18
HEX, BITMAP, TDIGEST, JSON = 20, 21, 22, 23

TYPE_NAMES = {
    1: "NULL_TYPE", 2: "BOOL", 3: "INT8", 4: "INT16", 5: "INT32", 6: "INT64", 7: "UINT8", 8: "UINT16",
    9: "UINT32", 10: "UINT64", 11: "FLOAT", 12: "DOUBLE", 13: "STRING", 14: "DATETIME", 15: "TIMESTAMP",
    16: "DATE", 17: "HLL", 18: "TIME", 19: "PLACE_HOLDER", 20: "HEX", 21: "BITMAP", 22: "TDIGEST",
    23: "JSON", 24: "MAXVALUE_TYPE",
}

# How a value is written in a row (BaikalDB's primitive_to_other_type), as the
# decoder's kinds. The numbers are shared with capturer/_native/.
K_SINT32, K_SINT64, K_UINT, K_BOOL, K_FLOAT, K_DOUBLE = 1, 2, 3, 4, 5, 6
K_TEXT, K_BYTES, K_DATETIME, K_DATE, K_TIME, K_TIMESTAMP = 7, 8, 9, 10, 11, 12

KIND = {
    INT8: K_SINT32, INT16: K_SINT32, INT32: K_SINT32, INT64: K_SINT64,
    UINT8: K_UINT, UINT16: K_UINT, UINT32: K_UINT, UINT64: K_UINT,
    BOOL: K_BOOL, NULL_TYPE: K_BOOL, FLOAT: K_FLOAT, DOUBLE: K_DOUBLE,
    STRING: K_TEXT, JSON: K_TEXT, HLL: K_BYTES, BITMAP: K_BYTES, TDIGEST: K_BYTES, HEX: K_BYTES,
    DATETIME: K_DATETIME, DATE: K_DATE, TIME: K_TIME, TIMESTAMP: K_TIMESTAMP,
}
# protobuf wire type of each kind: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit
WIRE = {
    K_SINT32: 0, K_SINT64: 0, K_UINT: 0, K_BOOL: 0, K_FLOAT: 5, K_DOUBLE: 1,
    K_TEXT: 2, K_BYTES: 2, K_DATETIME: 1, K_DATE: 5, K_TIME: 5, K_TIMESTAMP: 5,
}

# MySQL column type codes the pipeline knows (capturer/model/encode.py, lake.py)
_MYSQL_CODE = {
    INT8: 1, UINT8: 1, BOOL: 1, NULL_TYPE: 1, INT16: 2, UINT16: 2, INT32: 3, UINT32: 3,
    INT64: 8, UINT64: 8, FLOAT: 4, DOUBLE: 5, STRING: 15, DATETIME: 18, TIMESTAMP: 17,
    DATE: 10, TIME: 19, JSON: 245,
}
_UNSIGNED = {UINT8, UINT16, UINT32, UINT64}

# charset of a table (SchemaInfo.charset) -> Python codec of its STRING values
CHARSETS = {0: "utf-8", 1: "gbk", 2: "utf-8"}


@dataclass(frozen=True)
class FieldDef:
    field_id: int
    name: str
    mysql_type: int
    can_null: bool = True
    deleted: bool = False
    default: bytes | None = None  # the text form of the default, as the meta stores it

    @property
    def kind(self) -> int:
        return KIND.get(self.mysql_type, K_BYTES)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.field_id, "name": self.name, "type": self.mysql_type,
                             "null": self.can_null, "deleted": self.deleted}
        if self.default is not None:
            d["default"] = base64.b64encode(self.default).decode()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FieldDef:
        default = d.get("default")
        return cls(int(d["id"]), str(d["name"]), int(d["type"]), bool(d.get("null", True)),
                   bool(d.get("deleted", False)), base64.b64decode(default) if default is not None else None)


@dataclass(frozen=True)
class TableDef:
    table_id: int
    namespace: str
    db: str
    table: str
    version: int
    fields: tuple[FieldDef, ...]
    pk: tuple[str, ...] = ()
    unique_keys: tuple[tuple[str, ...], ...] = ()
    charset: int = 0
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # --- derived ------------------------------------------------------------
    @property
    def live(self) -> tuple[FieldDef, ...]:
        c = self._cache.get("live")
        if c is None:
            c = self._cache["live"] = tuple(f for f in self.fields if not f.deleted)
        return c

    @property
    def known_ids(self) -> frozenset[int]:
        """Every field id this version knows, dropped ones included (rows written
        before a DROP COLUMN still carry them)."""
        c = self._cache.get("known")
        if c is None:
            c = self._cache["known"] = frozenset(f.field_id for f in self.fields)
        return c

    @property
    def schema(self) -> TableSchema:
        s = self._cache.get("schema")
        if s is None:
            live = self.live
            s = self._cache["schema"] = TableSchema(
                self.db, self.table, tuple(f.name for f in live), self.pk, self.unique_keys,
                tuple(_MYSQL_CODE.get(f.mysql_type, 252) for f in live),
                tuple(ColumnInfo(_MYSQL_CODE.get(f.mysql_type, 252), f.mysql_type in _UNSIGNED, 0, 0,
                                 f.kind == K_BYTES) for f in live),
            )
        return s

    @property
    def encoding(self) -> str:
        return CHARSETS.get(self.charset, "utf-8")

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    # --- (de)serialisation for the schema journal -----------------------------
    def to_json(self) -> dict[str, Any]:
        return {"table_id": self.table_id, "namespace": self.namespace, "db": self.db, "table": self.table,
                "version": self.version, "charset": self.charset, "pk": list(self.pk),
                "unique_keys": [list(u) for u in self.unique_keys],
                "fields": [f.to_json() for f in self.fields]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TableDef:
        return cls(int(d["table_id"]), str(d["namespace"]), str(d["db"]), str(d["table"]), int(d["version"]),
                   tuple(FieldDef.from_json(f) for f in d["fields"]), tuple(d.get("pk", ())),
                   tuple(tuple(u) for u in d.get("unique_keys", ())), int(d.get("charset", 0)))

    @classmethod
    def from_schema_info(cls, si: Any) -> TableDef:
        """From a ``SchemaInfo`` message (proto/baikaldb.proto)."""
        fields = []
        for f in si.fields:
            fields.append(FieldDef(
                field_id=int(f.field_id), name=f.field_name, mysql_type=int(f.mysql_type),
                can_null=bool(f.can_null) if f.HasField("can_null") else True,
                deleted=bool(f.deleted),
                default=bytes(f.default_value) if f.HasField("default_value") else None,
            ))
        by_id = {f.field_id: f.name for f in fields}
        live_names = {f.name for f in fields if not f.deleted}
        pk: tuple[str, ...] = ()
        uks: list[tuple[str, ...]] = []
        for idx in si.indexs:
            names = tuple(idx.field_names) or tuple(by_id.get(i, "") for i in idx.field_ids)
            if not names or not all(n in live_names for n in names):
                continue
            if idx.index_type == 1 or (not idx.HasField("index_type") and idx.index_name == "primary_key"):
                pk = names
            elif idx.index_type == 2:
                uks.append(names)
        return cls(int(si.table_id), si.namespace_name, si.database, si.table_name, int(si.version),
                   tuple(sorted(fields, key=lambda f: f.field_id)), pk, tuple(uks), int(si.charset))


def linked_binlog_tables(si: Any) -> set[int]:
    """The binlog tables a source table is linked to: ``binlog_info`` (the first
    link) and ``binlog_infos`` (later ones)."""
    out = set()
    if si.HasField("binlog_info") and si.binlog_info.binlog_table_id:
        out.add(int(si.binlog_info.binlog_table_id))
    for bi in si.binlog_infos:
        if bi.binlog_table_id:
            out.add(int(bi.binlog_table_id))
    return out


# --- DDL ----------------------------------------------------------------------

def _sql_type(f: FieldDef, in_key: bool) -> str:
    t = f.mysql_type
    base = {
        INT8: "TINYINT", UINT8: "TINYINT UNSIGNED", INT16: "SMALLINT", UINT16: "SMALLINT UNSIGNED",
        INT32: "INT", UINT32: "INT UNSIGNED", INT64: "BIGINT", UINT64: "BIGINT UNSIGNED",
        BOOL: "TINYINT(1)", NULL_TYPE: "TINYINT(1)", FLOAT: "FLOAT", DOUBLE: "DOUBLE",
        DATETIME: "DATETIME(6)", TIMESTAMP: "TIMESTAMP", DATE: "DATE", TIME: "TIME",
        JSON: "LONGTEXT",
    }.get(t)
    if base is not None:
        return base
    if t == STRING:
        return "VARCHAR(255)" if in_key else "LONGTEXT"
    return "VARBINARY(255)" if in_key else "LONGBLOB"


_NUMERIC = {INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64, BOOL, FLOAT, DOUBLE}


def _default_sql(f: FieldDef) -> str:
    if f.default is None:
        return ""
    text = f.default.decode("utf-8", "replace")
    if text.upper() == "NULL":
        return " DEFAULT NULL"
    if f.mysql_type in (DATETIME, TIMESTAMP) and re.fullmatch(r"(?i)current_timestamp(\(\d?\))?|now\(\)", text):
        return " DEFAULT CURRENT_TIMESTAMP" + ("(6)" if f.mysql_type == DATETIME else "")
    if f.mysql_type in _NUMERIC and re.fullmatch(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", text):
        return f" DEFAULT {text}"
    return " DEFAULT '" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def column_sql(f: FieldDef, keys: set[str]) -> str:
    null = " NULL" if f.can_null else " NOT NULL"
    return f"{quote_ident(f.name)} {_sql_type(f, f.name in keys)}{null}{_default_sql(f)}"


def _key_columns(t: TableDef) -> set[str]:
    return set(t.pk) | {c for uk in t.unique_keys for c in uk}


def create_table_sql(t: TableDef) -> str:
    keys = _key_columns(t)
    parts = [column_sql(f, keys) for f in t.live]
    if t.pk:
        parts.append("PRIMARY KEY (" + ", ".join(quote_ident(c) for c in t.pk) + ")")
    for i, uk in enumerate(t.unique_keys):
        parts.append(f"UNIQUE KEY {quote_ident('uk_' + str(i + 1))} (" + ", ".join(quote_ident(c) for c in uk) + ")")
    return (f"CREATE TABLE IF NOT EXISTS {qualified(t.db, t.table)} (\n  " + ",\n  ".join(parts)
            + "\n) DEFAULT CHARSET=utf8mb4")


def alter_table_sql(old: TableDef, new: TableDef) -> str | None:
    """One ALTER TABLE that turns the ``old`` columns into the ``new`` ones, matched
    by field id (ADD, DROP, CHANGE for renames and type or nullability changes);
    None when the columns are the same."""
    keys = _key_columns(new)
    before = {f.field_id: f for f in old.live}
    after = {f.field_id: f for f in new.live}
    clauses = []
    for fid, f in before.items():
        if fid not in after:
            clauses.append(f"DROP COLUMN {quote_ident(f.name)}")
    for fid, f in after.items():
        o = before.get(fid)
        if o is None:
            clauses.append("ADD COLUMN " + column_sql(f, keys))
        elif (o.name, o.mysql_type, o.can_null) != (f.name, f.mysql_type, f.can_null):
            clauses.append(f"CHANGE COLUMN {quote_ident(o.name)} " + column_sql(f, keys))
    if not clauses:
        return None
    return f"ALTER TABLE {qualified(new.db, new.table)} " + ", ".join(clauses)


def transition_def(old: TableDef, new: TableDef) -> TableDef:
    """The columns both versions have, named as in ``new`` but decoded with their
    ``old`` types: how rows written before a schema change are read when the DDL
    has to be placed in front of them."""
    after = {f.field_id: f for f in new.live}
    fields = tuple(FieldDef(o.field_id, after[o.field_id].name if o.field_id in after else o.name, o.mysql_type,
                            o.can_null, o.field_id not in after or o.deleted, o.default) for o in old.fields)
    live = {f.name for f in fields if not f.deleted}
    pk = new.pk if all(c in live for c in new.pk) else ()
    uks = tuple(u for u in new.unique_keys if all(c in live for c in u))
    return TableDef(new.table_id, new.namespace, new.db, new.table, old.version, fields, pk, uks, old.charset)
