"""``--demo full --once``: all four senders (file, MySQL target, Apache Kafka, the
Spark lake) checked row by row against the sources; and the checks themselves
(devtools/verify_sinks.py) can fail: a deliberately wrong row in any sink's rows
is reported."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devtools import demo_full
from devtools.verify_sinks import KafkaMessage, SourceTable, canon, compare, rebuild_kafka, replay_file

ROOT = Path(__file__).resolve().parents[2]
SENDERS = ("local", "mysql", "kafka", "spark")


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_demo_full_once_checks_all_four_senders(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8")
    r = subprocess.run([sys.executable, "-m", "capturer", "--demo", "full", "--once", "--demo-dir",
                        str(tmp_path / "demo")], capture_output=True, text=True, encoding="utf-8",
                       errors="replace", env=env, cwd=str(ROOT), timeout=840)
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-4000:]
    assert "status page http://127.0.0.1:" in out and "controlToken in" in out
    assert "skipped" not in out, out  # this machine has everything (tests/run.sh installs it)
    summary = out[out.index("== demo summary =="):]
    for name in SENDERS:
        assert re.search(rf"^sender {name}:\s+EQUAL: 3 tables, [1-9]\d* rows", summary, re.M), summary
    assert "OK: every sender equals the sources (local, mysql, kafka, spark)" in summary
    assert "the lake compacted" in out, out
    no_delta = demo_full.delta_missing()  # (this machine: PySpark 4.2 and the Delta jars cached by the tests)
    if no_delta:
        # the changelog: its views merged a compacted snapshot with newer changelog rows
        assert f"spark writes the Parquet changelog, not Delta tables: {no_delta}" in out, out
        assert re.search(r"shop\.orders: gen [1-9]", summary), out
    else:
        # Delta tables, compared with the sources by the demo (read by deltalake); OPTIMIZEd midway
        assert "Parquet changelog" not in out, out
        assert re.search(r"^sender spark:\s+EQUAL: 3 tables, [1-9]\d* rows; Delta tables read by deltalake "
                         r"\(delta-rs; shop\.audit: v\d+, shop\.customers: v\d+, shop\.orders: v\d+\)", summary, re.M), summary
        assert "query the lake:         Spark SQL: " in summary and "deltalake (no JVM)" in summary
        # and here, by a reader of this test's own: each Delta table holds as many rows as the file's replay
        # (which the demo found equal to the sources)
        replayed, _ = replay_file(tmp_path / "demo" / "out" / "changes.jsonl")
        for (db, table), rows in replayed.items():
            assert delta_count(tmp_path / "demo" / "lake" / f"{db}__{table}") == len(rows) > 0, (db, table)
    # what was checked is really there: the file has key changes, deletes and binary values
    lines = [json.loads(x) for x in (tmp_path / "demo" / "out" / "changes.jsonl").read_text().splitlines()]
    assert any(d["op"] == "delete" for d in lines) and any(d.get("b64") for d in lines)
    assert any(d["op"] == "update" and d["before"]["id"] != d["after"]["id"] for d in lines
               if d["table"] == "customers")


def delta_count(tdir: Path) -> int:
    """A Delta table's current rows by delta-rs's SQL (an append-only table: 'i' rows less 'd' rows)."""
    import deltalake
    import pyarrow as pa

    keyless = not json.loads((tdir / "_capturer.json").read_text())["pk"]
    sql = ("SELECT sum(CASE WHEN _op = 'i' THEN 1 ELSE -1 END) AS n FROM t" if keyless else
           "SELECT count(*) AS n FROM t")
    t = pa.table(deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(tdir))).execute(sql).read_all())
    return int(t.column("n")[0].as_py())


# --- the comparison can fail ------------------------------------------------------------

def orders() -> SourceTable:
    st = SourceTable("shop", "orders", ["id", "amount", "created", "receipt", "note"],
                     {"id": "int", "amount": "decimal", "created": "datetime", "receipt": "bytes", "note": "text"},
                     ["id"])
    st.rows = [
        {"id": 1, "amount": decimal.Decimal("19.90"), "created": dt.datetime(2026, 1, 2, 3, 4, 5, 123000),
         "receipt": b"\x00\xff\x10", "note": "a\nb"},
        {"id": 2, "amount": decimal.Decimal("5.00"), "created": None, "receipt": None, "note": "Zoë 😀"},
    ]
    return st


def audit() -> SourceTable:
    st = SourceTable("shop", "audit", ["kind", "detail"], {"kind": "text", "detail": "text"}, [])
    st.rows = [{"kind": "signup", "detail": "x"}, {"kind": "signup", "detail": "x"}]
    return st


def sources() -> dict[tuple[str, str], SourceTable]:
    return {("shop", "orders"): orders(), ("shop", "audit"): audit()}


def json_form() -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The rows as the file and Kafka carry them: DECIMAL as text, binary as base64."""
    return {
        ("shop", "orders"): [
            {"id": 1, "amount": "19.9", "created": "2026-01-02 03:04:05.123000",
             "receipt": base64.b64encode(b"\x00\xff\x10").decode(), "note": "a\nb"},
            {"id": 2, "amount": "5", "created": None, "receipt": None, "note": "Zoë 😀"},
        ],
        ("shop", "audit"): [{"kind": "signup", "detail": "x"}, {"kind": "signup", "detail": "x"}],
    }


def test_equal_values_in_other_types_compare_equal() -> None:
    assert canon("19.990", "decimal") == canon(decimal.Decimal("19.99"), "decimal")
    assert canon("2026-01-02 03:04:05", "datetime") == dt.datetime(2026, 1, 2, 3, 4, 5)
    assert canon("AP8Q", "bytes") == b"\x00\xff\x10" == canon(bytearray(b"\x00\xff\x10"), "bytes")
    assert canon("101", "bit") == 5 == canon(b"\x05", "bit")
    assert canon({"b", "a"}, "set") == canon("a,b", "set")
    assert canon('{"b": 1, "a": [1]}', "json") == canon('{"a":[1],"b":1}', "json")
    check = compare("local", sources(), json_form())
    assert check.equal, check.problems
    assert (check.tables, check.rows) == (2, 4)


@pytest.mark.parametrize("breakage", ["value", "decimal", "bytes", "missing", "extra", "column", "keyless", "table"])
def test_a_wrong_row_is_detected(breakage: str) -> None:
    got = json_form()
    o, a = got[("shop", "orders")], got[("shop", "audit")]
    if breakage == "value":
        o[1]["note"] = "Zoe"
    elif breakage == "decimal":
        o[0]["amount"] = "19.91"
    elif breakage == "bytes":
        o[0]["receipt"] = base64.b64encode(b"\x00\xff\x11").decode()
    elif breakage == "missing":
        del o[1]
    elif breakage == "extra":
        o.append({**o[1], "id": 3})
    elif breakage == "column":
        del o[0]["created"]
    elif breakage == "keyless":
        del a[1]  # one of two equal rows: a multiset, not a set
    else:
        got[("shop", "other")] = [{"id": 1}]
    check = compare("kafka", sources(), got)
    assert not check.equal and len(check.problems) == 1, check.problems
    assert ("shop.other" if breakage == "table" else "shop.audit" if breakage == "keyless" else "shop.orders") \
        in check.problems[0]


def msg(offset: int, key: Any, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None,
        seq: int = 0, partition: int = 0, table: str = "orders") -> KafkaMessage:
    value = {"before": before, "after": after, "op": op, "source": {"db": "shop", "table": table}}
    return KafkaMessage(f"capturer.shop.{table}", partition, offset,
                        None if key is None else json.dumps({"id": key}).encode(), json.dumps(value).encode(),
                        {"region": "shard1", "commit_ts": str(100 + offset), "seq": str(seq), "op": op})


def test_kafka_rebuild_honours_deletes_key_changes_duplicates_and_truncates() -> None:
    o = json_form()[("shop", "orders")]
    first = {**o[0], "id": 7}
    msgs = [
        msg(0, 7, "c", None, first),
        msg(1, 7, "d", first, None),  # a key change 7 -> 1: delete under the old key ...
        msg(0, 1, "c", None, o[0], partition=1),  # ... then create under the new one (another partition)
        msg(1, 1, "c", None, o[0], partition=1),  # not a duplicate (another commit_ts): sets it again
        msg(2, 9, "c", None, {**o[1], "id": 9}),
        msg(3, 9, "d", {**o[1], "id": 9}, None),
        msg(4, 2, "c", None, {**o[1], "note": "old"}),
        msg(5, 2, "u", {**o[1], "note": "old"}, o[1]),
        msg(6, 2, "u", {**o[1], "note": "old"}, o[1]),
        msg(0, None, "c", None, {"kind": "gone", "detail": "x"}, table="audit"),
        msg(1, None, "t", None, None, table="audit"),  # a TRUNCATE empties the table
        msg(2, None, "c", None, {"kind": "signup", "detail": "x"}, table="audit"),
        msg(3, None, "c", None, {"kind": "signup", "detail": "x"}, table="audit"),
        msg(4, None, "c", None, {"kind": "signup", "detail": "x"}, table="audit"),
        msg(5, None, "d", {"kind": "signup", "detail": "x"}, None, table="audit"),  # one of three equal rows
    ]
    dup = msg(4, 2, "c", None, {**o[1], "note": "old"})  # sent again after a retry: same identity
    msgs.append(KafkaMessage(dup.topic, 0, 7, dup.key, json.dumps({
        "before": None, "after": {**o[1], "note": "stale"}, "op": "c",
        "source": {"db": "shop", "table": "orders"}}).encode(), dup.headers))
    rows = rebuild_kafka(msgs)
    check = compare("kafka", sources(), rows)
    assert check.equal, check.problems
    # and the same messages without the key change's delete leave a row too many
    broken = rebuild_kafka([m for m in msgs if not (m.offset == 1 and m.partition == 0 and m.key)])
    bad = compare("kafka", sources(), broken)
    assert not bad.equal and "1 extra" in bad.problems[0]


def test_without_delta_the_lake_is_the_changelog_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Maven Central unreachable (an mvn that fails as it does then) and no cached jars: the Spark part
    falls back to the changelog with the reason; another PySpark than Delta's: the same."""
    pytest.importorskip("pyspark")
    from senders.spark import deltajars

    if deltajars.incompatible():
        assert "Delta Lake" in demo_full.delta_missing() and "pip install -e '.[delta]'" in demo_full.delta_missing()
    else:
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "mvn").write_text("#!/bin/sh\necho '[ERROR] Could not transfer artifact io.delta:delta-spark_2.13:pom:"
                                    "4.4.0 from/to central: Network is unreachable' >&2\nexit 1\n")
        (bindir / "mvn").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '')}")
        monkeypatch.setenv("CAPTURER_DELTA_CACHE", str(tmp_path / "cache"))
        why = demo_full.delta_missing()
        assert why.startswith("the Delta Lake jars could not be resolved: mvn could not resolve Delta Lake"), why
        assert "\n" not in why  # one line
        monkeypatch.setattr(deltajars, "incompatible", lambda *a: "PySpark 4.3")
        assert demo_full.delta_missing().startswith(f"PySpark {pyspark_version()} is installed and Delta Lake")
    lake = demo_full.SparkSink(tmp_path / "lake", 5, delta=False)
    assert "writer=arrow" in lake.section() and "table_format" not in lake.section() and not lake.query_hints()
    lake = demo_full.SparkSink(tmp_path / "lake", 15, delta=True)
    assert "table_format=delta" in lake.section() and len(lake.query_hints()) == 2


def pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def test_what_cannot_run_is_named_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    why = demo_full.spark_missing()
    assert f"JAVA_HOME={tmp_path} has no bin/java" in why and "sh start.sh --demo full" in why
    path = os.environ.get("PATH", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no java (JAVA_HOME has none either), no mvn
    why = demo_full.kafka_missing()
    assert "no Apache Kafka broker" in why and "java is not on PATH" in why, why
    monkeypatch.setenv("PATH", path)
    real = demo_full.importlib.util.find_spec
    monkeypatch.setattr(demo_full.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("confluent_kafka", "pyspark") else real(name, *a))
    assert "confluent-kafka is not installed" in demo_full.kafka_missing()
    assert demo_full.spark_missing().startswith("pyspark not installed")
