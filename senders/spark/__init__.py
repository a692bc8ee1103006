"""The Spark sender (a Parquet lake) and its tools (python -m senders.spark.lakecli)."""

from collections.abc import Mapping
from typing import Any

from senders.kind import SenderKind


def _extra(options: Mapping[str, Any]) -> str:
    # table_format=delta: Delta's runtime needs PySpark 4.2 (the delta extra)
    return "delta" if options.get("table_format") == "delta" else "spark"


KIND = SenderKind("spark", "senders.spark.sender:SparkSender", verify="senders.spark.verify:LakeReader",
                  check="senders.spark.check", extra=_extra,
                  stream_session="senders.spark.kafkajars:stream_session", doc="a lake of Spark tables")
