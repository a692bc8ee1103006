"""The Spark lake, read back for ``verify`` (capturer/ops/verify.py): each table's
merged view (the newest row per key over the compacted snapshot and the newer
changelog, deletes dropped; a keyless table as the multiset of its rows), as a
user's query sees it. The views are registered again before each read, so a read
sees every batch committed until then. Reading needs Spark (and Java), also with
``writer=arrow``; in the capturer's own process the Spark sender's session is shared,
never stopped."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from senders.spark import lake
from senders.spark.deltasink import META, build_delta_session, keyless_state_sql
from senders.spark.sender import build_session


class LakeReader:
    kind = "lake"

    def __new__(cls, name: str, options: dict[str, Any], regions: list[tuple[str, str, str]]) -> LakeReader:
        if cls is LakeReader and options.get("table_format", "changelog") == "delta":
            return super().__new__(DeltaReader)
        return super().__new__(cls)

    def __init__(self, name: str, options: dict[str, Any], regions: list[tuple[str, str, str]]):
        self.name = name
        self.o = options
        self.warehouse = Path(options["warehouse"]).resolve()
        self.database = options["database"]
        self._spark: Any = None
        self._own = False
        self._tables: dict[tuple[str, str], lake.TableState] = {}

    def _session(self) -> Any:
        if self._spark is None:
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                self._spark = active
            else:
                opts = dict(self.o)
                opts["app_name"] = "capturer-verify"
                self._spark = self._build(opts, self.warehouse)
                self._own = True
        return self._spark

    @staticmethod
    def _build(opts: dict[str, Any], warehouse: Path) -> Any:
        return build_session(opts, warehouse)

    def destination(self, db: str, table: str) -> tuple[str, str]:
        return (db, table)

    def where(self, dest: tuple[str, str]) -> str:
        if not dest[1]:
            return f"lake {self.warehouse}"
        return f"lake {self.database}.{lake.table_name(*dest)}"

    def refresh(self) -> None:
        spark = self._session()
        self._tables = {(t.db, t.table): t for t in lake.register_tables(spark, self.warehouse, self.database)}

    def rows(self, dest: tuple[str, str], columns: Sequence[str]) -> list[dict[str, Any]]:
        st = self._tables.get(dest)
        if st is None:
            return []
        have = {c[0] for c in st.columns}
        cols = [c for c in columns if c in have] + sorted(have - set(columns))
        df = self._session().sql(f"SELECT {', '.join(lake.q(c) for c in cols)} FROM "
                                 f"{lake.q(self.database)}.{lake.q(st.name)}")
        if hasattr(df, "toArrow"):
            out: list[dict[str, Any]] = []
            for batch in df.toArrow().to_batches():
                out += batch.to_pylist()
            return out
        return [r.asDict() for r in df.collect()]

    def close(self) -> None:
        if self._spark is not None and self._own:
            self._spark.stop()
        self._spark = None


class DeltaReader(LakeReader):
    """``table_format=delta``: each table's Delta table as Spark reads it (its current
    state; an append-only table's rows as the multiset of its 'i' rows less its 'd'
    rows). Needs a Spark session with Delta Lake: the capturer's own (shared) or one
    started with ``deltasink.build_delta_session``."""

    @staticmethod
    def _build(opts: dict[str, Any], warehouse: Path) -> Any:
        return build_delta_session(opts, warehouse)

    def where(self, dest: tuple[str, str]) -> str:
        if not dest[1]:
            return f"Delta lake {self.warehouse}"
        return f"Delta table {self.warehouse / lake.table_name(*dest)}"

    def refresh(self) -> None:
        self._session()

    def rows(self, dest: tuple[str, str], columns: Sequence[str]) -> list[dict[str, Any]]:
        import json

        tdir = self.warehouse / lake.table_name(*dest)
        if not (tdir / "_delta_log").is_dir():
            return []
        spark = self._session()
        have = [f.name for f in spark.read.format("delta").load(str(tdir)).schema.fields if f.name not in META]
        cols = [c for c in columns if c in have] + sorted(set(have) - set(columns))
        src = f"delta.`{tdir}`"
        pk = json.loads((tdir / "_capturer.json").read_text()).get("pk") or []
        sql = (f"SELECT {', '.join(lake.q(c) for c in cols)} FROM {src}" if pk
               else keyless_state_sql(src, cols))
        df = spark.sql(sql)
        if hasattr(df, "toArrow"):
            out: list[dict[str, Any]] = []
            for batch in df.toArrow().to_batches():
                out += batch.to_pylist()
            return out
        return [r.asDict() for r in df.collect()]
