"""The Spark sender (a Parquet lake) and its tools (python -m senders.spark.lakecli)."""
