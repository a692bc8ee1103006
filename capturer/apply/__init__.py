"""Appliers: ``python -m capturer apply`` reads the topics of one capturer's Kafka sender,
regroups whole transactions and drives the MySQL, file and Spark senders (docs/apply.md)."""
