"""The Spark lake layout: a Parquet changelog per source table, a compacted
snapshot, and the SQL that gives the current state (merge on read).

Per source table ``db.table`` under the warehouse directory::

    <warehouse>/<name>/changelog/      append-only Parquet: one row per change
    <warehouse>/<name>/_staging/       files of a batch not committed yet (read by no one)
    <warehouse>/<name>/snapshots/gen-N/ the newest compacted snapshot
    <warehouse>/<name>/_state.json      manifest: columns, primary key, snapshot
                                        generation and its watermark (swapped atomically)
    <warehouse>/_capturer/commits.jsonl the commit log (``senders.spark.commits``)

Changelog rows carry ``_op`` ('i', 'u', 'd'), ``_commit_ts``, ``_region``,
``_seq`` (index in the source transaction) and ``_sub`` (0, or 1 for the
insert half of a key change), then the row's columns (the new image; the old
one for a delete). ``(_region, _commit_ts, _seq, _sub)`` identifies a change.
The sender commits each batch once (``senders.spark.commits``): a changelog
holds each identity once, and only files of committed batches. The SQL below
still counts an identity once if one is there twice (a changelog written
before the commit log existed).

Catalog (database ``cdc`` by default), registered by the sender in its session
and by ``register_tables`` in any other session (the CLI, a notebook)::

    cdc.<name>_changelog   the changelog table (Parquet, schema merged)
    cdc.<name>             current state: newest row per key, deletes dropped
"""

from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.model import ColumnInfo
from capturer.model.ddl import alter_columns, constant_default, split_clauses, string_value, unknown_adds
from capturer.model.encode import T_BIT, decimal_text, format_timedelta
from capturer.util.durable import fsync_dir
from senders.spark.commits import recover_if_idle

META_COLS = ["_op", "_commit_ts", "_region", "_seq", "_sub"]
STATE_FILE = "_state.json"

# MySQL type codes
_INTS = {1, 2, 3, 8, 9, 13}  # tiny, short, long, longlong, int24, year
_FLOATS = {4, 5}
_DECIMALS = {0, 246}
_DATETIMES = {7, 12, 17, 18}  # timestamp, datetime, timestamp2, datetime2
_DATES = {10, 14}
_TIMES = {11, 19}
_BLOBS = {249, 250, 251, 252, 15, 253, 254, 255}


def table_name(db: str, table: str) -> str:
    """A catalog-safe name ``db__table``; names that needed changing get a short
    hash so that two source tables never share a lake table."""
    raw = f"{db}__{table}"
    safe = re.sub(r"[^A-Za-z0-9_]", "_", raw)
    if safe != raw or safe[:1].isdigit():
        safe = f"t_{safe}_{zlib.crc32(raw.encode()):08x}"
    return safe.lower() if safe == safe.lower() else f"{safe.lower()}_{zlib.crc32(raw.encode()):08x}"


def q(name: str) -> str:
    """A Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def spark_type(ci: ColumnInfo | None) -> str:
    """The Spark SQL type a MySQL column is stored as."""
    if ci is None:
        return "string"
    t = ci.type
    if t == T_BIT:
        return "bigint"
    if t in _INTS:
        return "decimal(20,0)" if (t == 8 and ci.unsigned) else "bigint"
    if t in _FLOATS:
        return "double"
    if t in _DECIMALS:
        if ci.precision and ci.precision <= 38:
            return f"decimal(38,{min(ci.scale, 38)})"
        return "string"
    if t in _DATETIMES:
        return "timestamp_ntz"
    if t in _DATES:
        return "date"
    if t in _TIMES:
        return "string"
    if t == 255 or ((t in _BLOBS) and ci.binary):
        return "binary"
    return "string"


def lake_value(v: Any, stype: str) -> Any:
    """A binlog value as the Python value Arrow/Spark expects for ``stype``."""
    if v is None:
        return None
    if stype == "bigint" and isinstance(v, str):  # BIT comes as a bit string
        n = int(v, 2) if v else 0
        # a BIT(64) with its top bit set is kept as its 64-bit pattern (two's complement, as a Java long):
        # it reads negative in the lake (add 2**64); a bigint cannot hold it otherwise
        return n - (1 << 64) if n >= 1 << 63 else n
    if stype == "string" and not isinstance(v, str):
        import datetime as dt
        import decimal

        if isinstance(v, dt.timedelta):
            return format_timedelta(v)
        if isinstance(v, (set, frozenset)):
            return ",".join(sorted(str(x) for x in v))
        if isinstance(v, (bytes, bytearray)):
            return bytes(v).decode("utf-8", "replace")
        if isinstance(v, decimal.Decimal):

            return decimal_text(v)
        return str(v)
    if stype == "binary" and isinstance(v, str):
        return v.encode("utf-8")
    return v


@dataclass
class TableState:
    """The manifest of one lake table (``_state.json``)."""

    db: str
    table: str
    name: str
    pk: list[str]
    columns: list[list[str]] = field(default_factory=list)  # [name, spark type], in order
    generation: int = 0  # snapshot generation; 0 = none yet
    snapshot_columns: list[list[str]] = field(default_factory=list)
    watermark: int = 0  # every change with _commit_ts <= watermark is in the snapshot
    reset_ts: int = 0  # TRUNCATE / DROP: rows at or below this are gone
    added: dict[str, list[Any]] = field(default_factory=dict)  # column -> [ALTER's commit_ts, default literal]
    # DROP / RENAME COLUMN: a column -> [[ALTER's commit_ts, the name rows older than it have the column
    # under, the snapshot generation then], ...] (oldest first); and the names dropped or renamed away
    # (-> the ALTER's commit_ts), which rows staged again after a crash do not bring back
    moved: dict[str, list[list[Any]]] = field(default_factory=dict)
    gone: dict[str, int] = field(default_factory=dict)
    # the RENAME TABLEs that brought this table's directory here: [db, table it was, stream key, pair index]
    renamed_from: list[list[Any]] = field(default_factory=list)
    # the stream key of the last ALTER applied to ``columns`` (saved at once, before its batch commits): the
    # same ALTER handed again after a crash is not applied twice (``DROP COLUMN a, CHANGE b a`` again would
    # drop the renamed column)
    altered: list[Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    @classmethod
    def load(cls, tdir: Path) -> TableState | None:
        p = tdir / STATE_FILE
        if not p.exists():
            return None
        return cls(**json.loads(p.read_text()))

    def save(self, tdir: Path) -> None:
        tdir.mkdir(parents=True, exist_ok=True)
        tmp = tdir / (STATE_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, tdir / STATE_FILE)
        fsync_dir(tdir)



def fsync_tree(d: Path, done: set[str]) -> None:
    """fsync every file under ``d`` not fsync'd before, and the directories."""
    for root, _dirs, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            if p in done:
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            done.add(p)
        fsync_dir(Path(root))


def _cols_sql(cols: list[list[str]], have: set[str] | None = None,
              added: dict[str, list[Any]] | None = None, moved: dict[str, list[list[Any]]] | None = None,
              generation: int | None = None) -> str:
    """The select list of the state's columns over files that have the columns ``have``: rows older
    than an ADD COLUMN read its default (``added``), rows older than a RENAME COLUMN read the
    column under the name they have it (``moved``; for a snapshot of ``generation``, only the
    renames it was made before: a later one wrote the columns renamed)."""
    out = []
    for name, typ in cols:
        expr = q(name) if have is None or name in have else f"CAST(NULL AS {typ})"
        branches: list[tuple[int, str]] = []
        if added and name in added and added[name][1] is not None:
            # rows from before the ALTER read the column's default, as on the source
            ts, lit = added[name]
            branches.append((int(ts), f"CAST({lit} AS {typ})"))
        for ts, old, gen in (moved or {}).get(name, ()):
            if generation is not None and gen < generation:
                continue
            branches.append((int(ts), q(old) if have is None or old in have else f"CAST(NULL AS {typ})"))
        if branches:
            expr = ("CASE " + " ".join(f"WHEN _commit_ts < {ts} THEN {e}" for ts, e in sorted(branches))
                    + f" ELSE {expr} END")
        out.append(expr if expr == q(name) else f"{expr} AS {q(name)}")
    return ", ".join(out)


def column_named(name: str, columns: Any) -> str | None:
    """The column of ``columns`` that is ``name`` (MySQL and Spark compare column names
    case-insensitively: ``DROP COLUMN ID`` drops ``id``), or None."""
    names = [c[0] if isinstance(c, (list, tuple)) else c for c in columns]
    if name in names:
        return name
    return next((c for c in names if c.lower() == name.lower()), None)


def changes_sql(st: TableState, database: str, include_snapshot: bool, warehouse: Path) -> str:
    """All changes the current state is made of: snapshot rows plus newer changelog rows."""
    data_cols = st.columns
    meta = [["_op", "string"], ["_commit_ts", "bigint"], ["_region", "string"], ["_seq", "int"], ["_sub", "int"]]
    allc = meta + data_cols
    cl_have = getattr(st, "_cl_cols", None)  # columns the changelog files really have
    parts = [f"SELECT {_cols_sql(allc, cl_have, st.added, st.moved)} FROM {q(database)}.{q(st.name + '_changelog')} "
             f"WHERE _commit_ts > {max(st.watermark, st.reset_ts)}"]
    if include_snapshot and st.generation:
        snap = warehouse / st.name / "snapshots" / f"gen-{st.generation:06d}"
        have = {c[0] for c in st.snapshot_columns} | set(META_COLS)
        parts.append(f"SELECT {_cols_sql(allc, have, st.added, st.moved, st.generation)} FROM parquet.{q(str(snap))} "
                     f"WHERE _commit_ts > {st.reset_ts}")
    return " UNION ALL ".join(parts)


def state_sql(st: TableState, database: str, warehouse: Path, with_meta: bool = False,
              keyless_ts: int = 0) -> str:
    """The current state: newest row per primary key (deletes dropped); for a table
    without a key, the multiset of rows (inserts minus deletes)."""
    src = changes_sql(st, database, True, warehouse)
    data = [c[0] for c in st.columns]
    if st.pk:
        order = "struct(_commit_ts, _region, _seq, _sub)"
        keys = ", ".join(q(c) for c in st.pk)
        out = ", ".join("r." + q(c) for c in (META_COLS + data if with_meta else data))
        return (f"SELECT {out} FROM ("
                f"SELECT max_by(struct(*), {order}) AS r FROM ({src}) GROUP BY {keys}) WHERE r._op <> 'd'")
    cols = ", ".join(q(c) for c in data)
    # snapshot rows of a keyless table: identical rows stay distinct through _sub (the copy number)
    meta_out = (f"'i' AS _op, {keyless_ts}L AS _commit_ts, '' AS _region, 0 AS _seq, CAST(_i AS INT) AS _sub, "
                if with_meta else "")
    return (f"SELECT {meta_out}{cols} FROM ("
            f"SELECT {cols}, SUM(CASE WHEN _op = 'd' THEN -1 ELSE 1 END) AS _n FROM "
            f"(SELECT DISTINCT * FROM ({src})) GROUP BY {cols}) "
            f"LATERAL VIEW explode(sequence(1, CAST(_n AS INT))) x AS _i WHERE _n > 0")


def register(spark: Any, st: TableState, database: str, warehouse: Path) -> None:
    """(Re)create the changelog table and the current-state view in the session catalog."""
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {q(database)}")
    cl = warehouse / st.name / "changelog"
    spark.sql(f"DROP TABLE IF EXISTS {q(database)}.{q(st.name + '_changelog')}")
    spark.sql(f"CREATE TABLE {q(database)}.{q(st.name + '_changelog')} USING parquet "
              f"OPTIONS (path {sql_str(str(cl))}, mergeSchema 'true')")
    st._cl_cols = set(spark.table(f"{q(database)}.{q(st.name + '_changelog')}").columns)  # type: ignore[attr-defined]
    spark.sql(f"CREATE OR REPLACE VIEW {q(database)}.{q(st.name)} AS {state_sql(st, database, warehouse)}")


def sql_str(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def list_tables(warehouse: Path) -> list[TableState]:
    out = []
    if warehouse.exists():
        for d in sorted(warehouse.iterdir()):
            # (not a table's directory set aside to be removed: .<name>.replaced.<id>)
            st = TableState.load(d) if d.is_dir() and not d.name.startswith(".") else None
            if st is not None and (d / "changelog").exists():
                out.append(st)
    return out


def register_tables(spark: Any, warehouse: Path | str, database: str = "cdc") -> list[TableState]:
    """Register every lake table of a warehouse in this Spark session. If no sender
    writes the lake now, committed files a crash left staged are published first
    (``commits.recover_if_idle``)."""
    warehouse = Path(warehouse).resolve()
    recover_if_idle(warehouse)
    tables = list_tables(warehouse)
    for st in tables:
        register(spark, st, database, warehouse)
    return tables


def compact(spark: Any, st: TableState, database: str, warehouse: Path) -> TableState:
    """Write the current state as a new snapshot generation and switch to it
    atomically (the manifest is replaced by a rename). Must not run while the same
    table is being appended to (the sender runs it between batches).
    Returns the new manifest, already saved."""
    tdir = warehouse / st.name
    max_ts = spark.sql(f"SELECT max(_commit_ts) FROM {q(database)}.{q(st.name + '_changelog')}").collect()[0][0]
    if max_ts is None or max_ts <= max(st.watermark, st.reset_ts):
        return st
    gen = st.generation + 1
    dest = tdir / "snapshots" / f"gen-{gen:06d}"
    df = spark.sql(state_sql(st, database, warehouse, with_meta=True, keyless_ts=int(max_ts)))
    df.write.mode("overwrite").parquet(str(dest))
    if str(dest).startswith("/"):
        fsync_tree(dest, set())
    new = TableState(**{**st.to_json(), "generation": gen, "watermark": int(max_ts),
                        "snapshot_columns": [list(c) for c in st.columns]})
    new.save(tdir)
    register(spark, new, database, warehouse)
    # the previous generation is read by no one who reads the new manifest
    import shutil

    old = tdir / "snapshots" / f"gen-{st.generation:06d}"
    if st.generation and old.exists():
        shutil.rmtree(old, ignore_errors=True)
    return new


# --- ALTER TABLE ... ADD COLUMN ----------------------------------------------
# Rows written before an ADD COLUMN have no value for it in the changelog; the
# source shows them with the column's DEFAULT. The manifest remembers, per added
# column, the commit_ts of the ALTER and the default, and the state SQL fills it in.

_TYPE_WORDS = [
    (r"(tiny|small|medium|big)?int(eger)?|year|bool(ean)?", "bigint"),
    (r"bit", "bigint"),
    (r"decimal|numeric|dec|fixed", "decimal"),
    (r"float|double|real", "double"),
    (r"datetime|timestamp", "timestamp_ntz"),
    (r"date", "date"),
    (r"(tiny|medium|long)?blob|(var)?binary", "binary"),
]


_split_top = split_clauses  # (where it was first; tests/unit/test_spark_delta_unit.py names it)


def _ddl_type(spec: str) -> str | None:
    m = re.match(r"\s*([a-zA-Z]+)\s*(\(([^)]*)\))?(\s+unsigned)?", spec)
    if not m:
        return None
    word = m.group(1).lower()
    for pat, st in _TYPE_WORDS:
        if re.fullmatch(pat, word):
            if st == "decimal":
                args = [a.strip() for a in (m.group(3) or "10,0").split(",")]
                p, s = int(args[0]), int(args[1]) if len(args) > 1 else 0
                return f"decimal(38,{s})" if p <= 38 else "string"
            if word == "bigint" and m.group(4):
                return "decimal(20,0)"
            return st
    return "string"


def case_clash_error(db: str, table: str, pair: tuple[str, str]) -> str:
    """Two columns of one source table whose names differ only in case (PostgreSQL's "ID" and "id")."""
    return (f"{db}.{table}: columns {pair[0]!r} and {pair[1]!r} differ only in case: the lake's tables (Spark, "
            "Parquet and Delta as Spark reads them) compare column names case-insensitively, so it cannot keep "
            "them apart (rename one at the source, or exclude the table in the filter)")


def spark_string(v: str) -> str:
    """A Spark SQL string literal of ``v`` (Spark reads backslash escapes; a doubled quote
    is two literals run together there, not a quote)."""
    return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse_add_columns(sql: str) -> list[tuple[str, str | None, str | None]]:
    """``(column, spark type, default as a Spark SQL literal)`` for each ADD COLUMN of an
    ALTER TABLE (capturer/model/ddl.py ``alter_columns``); the default is None when there
    is none or it is not a constant."""
    out = []
    for what, name, definition in alter_columns(sql):
        if what != "add":
            continue
        lit = constant_default(definition)
        default = spark_string(string_value(lit)) if lit is not None and lit.startswith("'") else lit
        out.append((name, _ddl_type(definition), default))
    return out


def warn_unknown_adds(log: Any, sender: str, db: str, table: str, sql: str) -> None:
    """A warning naming the statement and the columns it adds whose values on the rows already there
    only the source computes (capturer/model/ddl.py ``unknown_adds``: a generated column, a default
    that is not a constant): the lake has NULL there until those rows change (docs/limits.md)."""
    cols = unknown_adds(sql)
    if cols:
        log.warning("sender %s: %s.%s: the DDL %r adds %s whose values on the rows already there the source "
                    "computes and the binlog does not carry: the lake has NULL there until those rows change "
                    "(verify reports them different)", sender, db, table, sql[:300], ", ".join(map(repr, cols)))


def parse_alter(sql: str) -> list[tuple[str, str, str]]:
    """The column changes of an ALTER TABLE this format applies: ``('drop', col, '')``,
    ``('rename', old, new)``, and ``('rename_table', '', new)`` (which it cannot)."""
    return [c for c in alter_columns(sql) if c[0] != "add"]
