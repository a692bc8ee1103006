"""The applier's ``/metrics`` (Prometheus) and its status page (``GET /``: a table of
what ``/status`` says, refreshed every 2 s)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

UI = Path(__file__).resolve().parent / "ui"


def pages() -> dict[str, tuple[bytes, str]]:
    return {"/": ((UI / "index.html").read_bytes(), "text/html; charset=utf-8"),
            "/ui/apply.js": ((UI / "apply.js").read_bytes(), "text/javascript; charset=utf-8")}


class ApplyCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        s = self.snapshot()
        a = s["applied"]
        for name, doc, v in (("txns", "transactions applied", a["txns"]), ("rows", "rows applied", a["rows"]),
                             ("ddls", "DDL statements applied", a["ddls"]),
                             ("bad_messages", "messages that did not decode", s["errors"]["bad_messages"]),
                             ("dead_letters", "messages copied to the dead-letter topic", s["errors"]["dead_letters"]),
                             ("commit_errors", "failed consumer-offset commits", s["errors"]["commit_errors"]),
                             ("duplicates", "messages dropped as read before", s["regroup"]["duplicates"])):
            c = CounterMetricFamily(f"capturer_apply_{name}", doc)
            c.add_metric([], v)
            yield c
        g = GaugeMetricFamily("capturer_apply_lag_seconds", "age of the last transaction applied while more waits")
        g.add_metric([], a["lag_seconds"])
        yield g
        g = GaugeMetricFamily("capturer_apply_waiting_txns", "transactions of the spine waiting for missing parts")
        g.add_metric([], len(s["waiting"]))
        yield g
        g = GaugeMetricFamily("capturer_apply_buffered_rows", "rows held for incomplete transactions")
        g.add_metric([], s["regroup"]["rows_buffered"])
        yield g
        g = GaugeMetricFamily("capturer_apply_up", "1 unless the applier failed")
        g.add_metric([], 0 if s["state"] == "failed" else 1)
        yield g
        lm = GaugeMetricFamily("capturer_apply_partition_lag_messages", "messages not yet read",
                               labels=["topic", "partition"])
        ls = GaugeMetricFamily("capturer_apply_partition_lag_seconds", "age of the last message read while more "
                               "waits", labels=["topic", "partition"])
        for p in s["partitions"].values():
            lm.add_metric([p["topic"], str(p["partition"])], p["lag_messages"])
            ls.add_metric([p["topic"], str(p["partition"])], p["lag_seconds"])
        yield lm
        yield ls
        sa = GaugeMetricFamily("capturer_apply_sender_acked_ts_seconds", "commit time of the last transaction a "
                               "sender acknowledged", labels=["sender"])
        se = CounterMetricFamily("capturer_apply_sender_errors", "a sender's errors", labels=["sender"])
        sw = GaugeMetricFamily("capturer_apply_sender_waiting_seconds", "how long a sender has waited for its "
                               "destination's answer (a statement, commit or request in flight; 0 when none)",
                               labels=["sender"])
        for name, st in s["senders"].items():
            sa.add_metric([name], (st.get("acked_ts", 0) >> 18) / 1000.0)
            se.add_metric([name], st.get("errors", 0))
            sw.add_metric([name], st.get("waiting_seconds") or 0.0)
        yield sa
        yield se
        yield sw


def spark_pages() -> dict[str, tuple[bytes, str]]:
    """``python -m capturer spark-apply``'s page: its ``/status`` as a table, refreshed every 2 s."""
    return {"/": ((UI / "spark.html").read_bytes(), "text/html; charset=utf-8")}


class SparkApplyCollector(Collector):
    """``/metrics`` of ``spark-apply`` (capturer/apply/spark_stream.py ``BatchApplier.snapshot``)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        s = self.snapshot()
        a, e = s["applied"], s["errors"]
        for name, doc, v in (("batches", "micro-batches done", a["batches"]),
                             ("txns", "transactions applied", a["txns"]), ("rows", "rows applied", a["rows"]),
                             ("bad_messages", "messages that did not decode", e["bad_messages"]),
                             ("dead_letters", "messages copied to the dead-letter topic", e["dead_letters"])):
            c = CounterMetricFamily(f"capturer_spark_apply_{name}", doc)
            c.add_metric([], v)
            yield c
        for name, doc, v in (("lag_seconds", "age of the last transaction applied while more waits", a["lag_seconds"]),
                             ("held_messages", "messages held for transactions not yet whole", s["held_messages"]),
                             ("up", "1 unless the job failed", 0 if s["state"] == "failed" else 1)):
            g = GaugeMetricFamily(f"capturer_spark_apply_{name}", doc)
            g.add_metric([], v)
            yield g
