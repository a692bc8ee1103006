"""The ``[region:NAME]`` keys every kind with snapshots takes (``snapshot``,
``snapshot_workers``, ``snapshot_chunk_rows``, ``snapshot_read_ahead``): one
definition, each kind's ``keys.py`` adding them with its own wording of what is copied."""

from __future__ import annotations

from capturer.regions.snapshot import MODES
from capturer.util.ini import Key, p_bool, p_choice, p_int


def snapshot_keys(what: str, when_needed: str, read_ahead: str) -> list[Key]:
    """``what``: what a snapshot copies (the selected tables, ...); ``when_needed``: when
    ``when_needed`` copies besides a first start; ``read_ahead``: the doc of read-ahead."""
    return [
        Key("snapshot", p_choice(*MODES), "never",
            doc=f"copy {what}: never; initial (on a first start); when_needed (also {when_needed}: then each "
                "table is emptied downstream first)"),
        Key("snapshot_workers", p_int(1, 64), 2, doc="tables copied at once"),
        Key("snapshot_chunk_rows", p_int(10, 10_000_000), 20_000, doc="rows per snapshot chunk"),
        Key("snapshot_read_ahead", p_bool, False, doc=read_ahead),
    ]
