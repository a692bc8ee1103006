"""The pipeline's stages between regions and senders: bounded queues, the merge, the filter,
the fan-out to senders, the checkpoint."""
