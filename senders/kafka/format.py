"""The Kafka sender's message formats, both ways: the bodies it writes, one message per
row change (encode), and what ``verify`` reads back from them (``decode``).

* ``json``: a Debezium-like envelope ``{before, after, op (c/u/d/r; t: a TRUNCATE), ts_ms, source}``
* ``canal``: Canal's flatMessage JSON (values as strings, ``old`` holds changed columns)
* ``sql``: the idempotent SQL statement (the seed's behaviour)
* ``protobuf``: ``capturer.RowChange`` from ``proto/capturer.proto``

Every message also carries the identity ``(region, commit_ts, seq)`` in its
headers, so a consumer can drop duplicates after a crash replay. ``decode`` gives
``(table, op, before, after)`` of a json, canal or protobuf message (the appliers'
regrouping reads json and protobuf itself: capturer/apply/regroup.py, which may not
import a kind; a protobuf column's value is read by ``protogen.value_of`` for both).
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable
from typing import Any

from capturer.model import Ddl, LsnPosition, Position, RowChange, Txn, protogen, ts_physical_ms
from capturer.model.ddl import clean
from capturer.model.encode import dumps_compact, encode_line_bytes, json_value, type_name
from senders.sqlbuild import build

OP_CODE = {"insert": "c", "update": "u", "delete": "d", "read": "r"}
CANAL_TYPE = {"insert": "INSERT", "update": "UPDATE", "delete": "DELETE", "read": "INSERT"}
# java.sql.Types for Canal's sqlType
_JDBC = {
    "tinyint": -6, "smallint": 5, "mediumint": 4, "int": 4, "bigint": -5, "decimal": 3, "float": 7,
    "double": 8, "bit": -7, "date": 91, "time": 92, "datetime": 93, "timestamp": 93, "year": 12,
    "varchar": 12, "char": 1, "json": 12, "enum": 4, "set": -7, "blob": 2004, "tinyblob": 2004,
    "mediumblob": 2004, "longblob": 2004, "geometry": -2,
}


def source_block(txn: Txn, ch_db: str, ch_table: str, seq: int) -> dict[str, Any]:
    return {
        "region": txn.region,
        "db": ch_db,
        "table": ch_table,
        "commit_ts": txn.commit_ts,
        "ts_ms": ts_physical_ms(txn.commit_ts),
        "position": txn.position.to_json(),
        "gtid": txn.gtid,
        "seq": seq,
        **snapshot_fields(txn, seq),
    }


def snapshot_fields(txn: Txn, seq: int) -> dict[str, Any]:
    """Debezium's ``snapshot``: "true" on a snapshot row, "last" on the last row of a
    table's copy, "false" otherwise; ``snapshot_chunk``: which run and chunk the row
    came with, its table and the binlog position the chunk was read at."""
    m = txn.snapshot
    if m is None:
        return {"snapshot": "false"}
    last = m.last and seq == len(txn.changes) - 1
    return {"snapshot": "last" if last else "true", "snapshot_chunk": m.to_json()}


_TRUNCATE = re.compile(r"^\s*TRUNCATE\b", re.I)


def is_truncate(ddl: Ddl) -> bool:
    """A TRUNCATE of one table (a snapshot's, or the source's own)."""
    return bool(ddl.table) and bool(_TRUNCATE.match(clean(ddl.sql)))


def truncate_message(txn: Txn, ddl: Ddl, fmt: str) -> bytes:
    """A TRUNCATE as an event of the table's own topic, so that its consumers see
    the table emptied in their stream: Debezium's ``op: "t"`` (json), Canal's
    ``TRUNCATE`` (canal), the statement (sql), a DDL change carrying it (protobuf)."""
    if fmt == "json":
        d = {"before": None, "after": None, "op": "t", "ts_ms": int(time.time() * 1000),
             "source": source_block(txn, ddl.db, ddl.table, ddl.seq)}
        return json.dumps(d, ensure_ascii=False).encode()
    if fmt == "canal":
        d2 = {"id": 0, "database": ddl.db, "table": ddl.table, "isDdl": True, "type": "TRUNCATE",
              "es": ts_physical_ms(txn.commit_ts), "ts": int(time.time() * 1000), "sql": ddl.sql,
              "data": None, "old": None, "gtid": txn.gtid}
        return json.dumps(d2, ensure_ascii=False).encode()
    return ddl_message(txn, ddl, fmt)  # sql: the statement; protobuf: op DDL with it


def json_envelope(txn: Txn, seq: int, ch: RowChange, op: str, now_ms: int | None = None) -> bytes:
    d: dict[str, Any] = {
        "before": ch.before if op in ("u", "d") else None,
        "after": ch.after if op in ("c", "u", "r") else None,
        "op": op,
        "ts_ms": int(time.time() * 1000) if now_ms is None else now_ms,
        "source": source_block(txn, ch.db, ch.table, seq),
        "transaction": {"id": f"{txn.region}:{txn.commit_ts}", "total_order": seq + 1,
                        "rows": len(txn.changes)},
    }
    return encode_line_bytes(d, compact=True)


def _j(v: Any) -> bytes:
    return dumps_compact(v).encode()


def _n(v: int) -> bytes:
    """``_j`` of an int: its digits (json writes an int as int.__repr__; str() is that for an exact int)."""
    return str(v).encode() if type(v) is int else _j(v)


def json_txn_pieces(txn: Txn, now_ms: int) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """The parts of a transaction's ``json_envelope`` messages that do not depend on
    the row, for the C encoder: what comes after ``"op"`` up to the table, after the
    table up to the seq, after the seq up to total_order (another one for the last
    row, which a snapshot's last chunk marks), and after total_order."""
    n = len(txn.changes)
    region, ts = txn.region, txn.commit_ts
    rj = _jstr(region)
    # the id "region:ts": the region's text then the digits, which need no escaping
    tid = rj[:-1] + b":" + str(ts).encode() + b'"' if type(ts) is int else _j(f"{region}:{ts}")
    txn_id = b'},"transaction":{"id":' + tid + b',"total_order":'

    def tail(seq: int) -> bytes:
        return b"," + _j(snapshot_fields(txn, seq))[1:-1] + txn_id

    head = b',"ts_ms":' + _n(now_ms) + b',"source":{"region":' + rj + b","
    mid = (b'"commit_ts":' + _n(ts) + b',"ts_ms":' + _n(ts_physical_ms(ts)) + b',"position":'
           + _j(txn.position.to_json()) + b',"gtid":' + _j(txn.gtid) + b',"seq":')
    if txn.snapshot is None:  # (snapshot_fields reads seq only in a snapshot's chunk: one tail for every row)
        first = last = _NOT_SNAPSHOT + txn_id
    else:
        first = tail(0)
        last = first if n == 1 else tail(n - 1)
    return head, mid, first, last, b',"rows":' + _n(n) + b"}"


_NOT_SNAPSHOT = b',"snapshot":"false"'  # "," + _j(snapshot_fields(a transaction not of a snapshot, seq))[1:-1]


@functools.lru_cache(maxsize=1024)
def _jstr(s: str) -> bytes:
    """``_j`` of a str that recurs (a region's name)."""
    return _j(s)


@functools.lru_cache(maxsize=4096)
def json_table_piece(db: str, table: str) -> bytes:
    """``"db":...,"table":...,`` of a table's json_envelope messages."""
    return b'"db":' + _j(db) + b',"table":' + _j(table) + b","


def _canal_str(v: Any) -> Any:
    if v is None:
        return None
    jv, is_b64 = json_value(v)
    return jv if isinstance(jv, str) else json.dumps(jv) if isinstance(jv, (list, dict)) else str(jv)


def canal_message(txn: Txn, seq: int, ch: RowChange, op: str) -> bytes:
    s = ch.schema
    kind = {"c": "INSERT", "u": "UPDATE", "d": "DELETE", "r": "INSERT"}[op]
    row = ch.after if op != "d" else ch.before
    data = [{k: _canal_str(v) for k, v in (row or {}).items()}]
    old = None
    if op == "u" and ch.before is not None and ch.after is not None:
        old = [{k: _canal_str(v) for k, v in ch.before.items() if ch.after.get(k) != v}]
    types = {c: type_name(t) for c, t in zip(s.columns, s.column_types)}
    d = {
        "id": seq,
        "database": ch.db,
        "table": ch.table,
        "pkNames": list(s.pk) or None,
        "isDdl": False,
        "type": kind,
        "es": ts_physical_ms(txn.commit_ts),
        "ts": int(time.time() * 1000),
        "sql": "",
        "sqlType": {c: _JDBC.get(t, 12) for c, t in types.items()},
        "mysqlType": types,
        "data": data,
        "old": old,
        "gtid": txn.gtid,
    }
    return json.dumps(d, ensure_ascii=False, separators=(",", ":")).encode()


def sql_message(txn: Txn, seq: int, ch: RowChange, op: str) -> bytes:
    if ch.absent:
        # a partial image (columns left out) is UPDATE ... WHERE <old key> (``build``), both halves of a key
        # change alike (the second changes nothing): a DELETE then an INSERT would lose the absent values
        sql, _ = build(ch, literal=True)
        return sql.encode()
    if op == "d" and ch.op != "delete":  # the delete half of a key change
        ch = RowChange(ch.schema, "delete", ch.before, None)
    elif op == "c" and ch.op not in ("insert", "read"):
        ch = RowChange(ch.schema, "insert", None, ch.after)
    sql, _ = build(ch, literal=True)
    return sql.encode()


def _pb_value(pb: Any, v: Any) -> Any:
    val = pb.Value()
    if v is None:
        val.is_null = True
    elif isinstance(v, bool):
        val.int_value = int(v)
    elif isinstance(v, int):
        if v < (1 << 63):
            val.int_value = v
        else:
            val.uint_value = v
    elif isinstance(v, float):
        val.double_value = v
    elif isinstance(v, (bytes, bytearray)):
        val.bytes_value = bytes(v)
    else:
        jv, _ = json_value(v)
        val.string_value = jv if isinstance(jv, str) else json.dumps(jv)
    return val


def fill_position(m: Any, txn: Txn) -> None:
    """``capturer.Position`` of a transaction: file/pos for MySQL, ts for BaikalDB, lsn for PostgreSQL."""
    p = txn.position
    m.kind = p.kind
    m.gtid = txn.gtid
    if isinstance(p, Position):
        m.file, m.pos = p.file, p.pos
    elif isinstance(p, LsnPosition):
        m.lsn = p.lsn
    else:
        m.ts = p.ts


def protobuf_message(txn: Txn, seq: int, ch: RowChange, op: str) -> bytes:

    pb = protogen.load()
    m = pb.RowChange()
    m.region, m.commit_ts, m.seq = txn.region, txn.commit_ts, seq
    m.db, m.table = ch.db, ch.table
    m.op = {"c": pb.RowChange.INSERT, "u": pb.RowChange.UPDATE, "d": pb.RowChange.DELETE,
            "r": pb.RowChange.READ}[op]
    for image, target in ((ch.before if op != "c" else None, m.before), (ch.after if op != "d" else None, m.after)):
        for k, v in (image or {}).items():
            col = target.add()
            col.name = k
            col.value.CopyFrom(_pb_value(pb, v))
    m.pk.extend(ch.schema.pk)
    fill_position(m.position, txn)
    m.txn_rows = len(txn.changes)
    m.last = seq == len(txn.changes) - 1
    m.source_ts = txn.source_ts
    return m.SerializeToString()


FORMATS: dict[str, Callable[[Txn, int, RowChange, str], bytes]] = {
    "json": json_envelope,
    "canal": canal_message,
    "sql": sql_message,
    "protobuf": protobuf_message,
}


def ddl_message(txn: Txn, ddl: Ddl, fmt: str) -> bytes:
    if fmt == "protobuf":

        pb = protogen.load()
        m = pb.RowChange(region=txn.region, commit_ts=txn.commit_ts, db=ddl.db, table=ddl.table,
                         op=pb.RowChange.DDL, sql=ddl.sql, source_ts=txn.source_ts, last=True,
                         seq=ddl.seq)
        fill_position(m.position, txn)
        return m.SerializeToString()
    if fmt == "canal":
        d = {"id": 0, "database": ddl.db, "table": ddl.table, "isDdl": True, "type": "QUERY",
             "es": ts_physical_ms(txn.commit_ts), "ts": int(time.time() * 1000), "sql": ddl.sql,
             "data": None, "old": None, "gtid": txn.gtid}
        return json.dumps(d, ensure_ascii=False).encode()
    if fmt == "sql":
        return ddl.sql.encode()
    d2 = {"source": {**source_block(txn, ddl.db, ddl.table, ddl.seq), "session_db": ddl.session_db},
          "ddl": ddl.sql, "ts_ms": int(time.time() * 1000)}
    return json.dumps(d2, ensure_ascii=False).encode()


def change_events(ch: RowChange) -> list[tuple[str, dict[str, Any] | None]]:
    """(op code, key image) pairs for one change: a primary-key change becomes a
    delete under the old key and a create under the new one (as Debezium does)."""
    pk = ch.schema.pk
    if ch.op == "insert":
        return [("c", ch.after)]
    if ch.op == "read":
        return [("r", ch.after)]
    if ch.op == "delete":
        return [("d", ch.before)]
    if pk and ch.before is not None and ch.after is not None and any(ch.before.get(c) != ch.after.get(c) for c in pk):
        return [("d", ch.before), ("c", ch.after)]
    return [("u", ch.after)]


def key_bytes(ch: RowChange, image: dict[str, Any] | None) -> bytes | None:
    """The message key: the primary key as JSON, e.g. ``{"id":1}``; None without one."""
    pk = ch.schema.pk
    if not pk or image is None:
        return None
    return dumps_compact({c: image.get(c) for c in pk}).encode()


# --- decoding (verify reads the topics back with it) ---------------------------------

Name = tuple[str, str]
Change = tuple[Name, str, "dict[str, Any] | None", "dict[str, Any] | None"]
_CANAL_OP = {"INSERT": "c", "UPDATE": "u", "DELETE": "d", "TRUNCATE": "t"}


def decode_protobuf(value: bytes) -> Change | None:
    """``decode`` of a ``format=protobuf`` message (``capturer.RowChange``, proto/capturer.proto)."""

    pb = protogen.load()
    m = pb.RowChange.FromString(value)
    name = (m.db, m.table)
    if m.op == pb.RowChange.DDL:
        return (name, "t", None, None) if m.table and _TRUNCATE.match(m.sql) else None
    op = {pb.RowChange.INSERT: "c", pb.RowChange.UPDATE: "u", pb.RowChange.DELETE: "d", pb.RowChange.READ: "r"}[m.op]
    before = {c.name: protogen.value_of(c.value) for c in m.before} if len(m.before) else None
    after = {c.name: protogen.value_of(c.value) for c in m.after} if len(m.after) else None
    return name, op, before, after


def decode(value: bytes, fmt: str = "json") -> Change | None:
    """``(table, op, before, after)`` of a ``format=json``, ``canal`` or ``protobuf`` message
    (op as Debezium's: c, u, d, r, t), or None for anything else."""
    if fmt == "protobuf":
        return decode_protobuf(value)
    d = json.loads(value)
    if not isinstance(d, dict):
        return None
    if "source" in d and "op" in d:  # json
        return (d["source"]["db"], d["source"]["table"]), d["op"], d.get("before"), d.get("after")
    if "database" in d and "type" in d:  # canal: data is the row (the old one for a delete), old the changed columns
        op = _CANAL_OP.get(str(d["type"]))
        if op is None or (d.get("isDdl") and op != "t"):
            return None
        row = (d.get("data") or [None])[0]
        name = (d["database"], d["table"])
        if op == "u":
            return name, op, {**row, **((d.get("old") or [{}])[0])}, row
        return name, op, row if op == "d" else None, row if op == "c" else None
    return None
