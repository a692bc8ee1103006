"""BaikalDB's TSO and the capturer's commit_ts.

A BaikalDB TSO is ``(physical_ms_since_base << 18) + logical`` with the base
1577808000000 ms (2020-01-01 00:00:00 +08:00). The capturer's commit_ts has the
same shape with the Unix epoch as base, so a BaikalDB commit_ts becomes a
capturer commit_ts by adding ``base << 18``: exact, invertible and order
preserving (it is the same instant, written from another origin). That is what
lets BaikalDB and MySQL regions merge in one commit order.
"""

from __future__ import annotations

import datetime as dt

from capturer.model import LOGICAL_BITS

BASE_MS = 1577808000000
OFFSET = BASE_MS << LOGICAL_BITS


def to_commit_ts(tso: int) -> int:
    """BaikalDB TSO -> capturer commit_ts (Unix-epoch TSO)."""
    return tso + OFFSET


def from_commit_ts(commit_ts: int) -> int:
    return commit_ts - OFFSET


def unix_ms(tso: int) -> int:
    return (tso >> LOGICAL_BITS) + BASE_MS


def unix_seconds(tso: int) -> int:
    return unix_ms(tso) // 1000


def from_unix_ms(ms: int, logical: int = 0) -> int:
    return ((ms - BASE_MS) << LOGICAL_BITS) + logical


def describe(tso: int) -> str:
    """``<tso> (2024-01-02T03:04:05.123+00:00)`` for messages."""
    t = dt.datetime.fromtimestamp(unix_ms(tso) / 1000, dt.timezone.utc)
    return f"{tso} ({t.isoformat(timespec='milliseconds')})"
