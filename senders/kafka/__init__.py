"""The Kafka sender and its message formats."""
