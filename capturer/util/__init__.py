"""Helpers that know nothing of the pipeline: config-key declarations, bounded queues, failpoints."""
