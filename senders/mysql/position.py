"""The MySQL sender's position, kept in the target: ``<meta_database>.position``.

A batch is applied in phases, and a phase by up to ``threadnum`` workers, each
committing its share on its own connection in one or more target transactions.
There is no one transaction that holds a phase's rows, so there is no one place
to put "the stream is here". Instead every worker that has a share of a phase
writes **its own row** (``sender``, ``worker``) in the **same target transaction
as the last rows of its share** (its last chunk), saying:

* ``run``, ``phase``: which phase (``run`` is drawn at random at every ``open``:
  two runs' phases never share a name, even when a replay cuts the stream into
  other phases and routes a row to another worker);
* ``parts``: how many workers have a share of that phase;
* ``before``: the key of the last transaction the sender knew whole at the
  target when it handed the phase out (the phases before it had committed: a
  phase is handed out only then);
* ``whole``: the key of the last transaction whose rows all lie in this phase or
  earlier ones (a phase may end inside a transaction; then it is an earlier one).

A phase is **whole** when ``parts`` rows carry its ``(run, phase)``: every worker
with a share committed all of it, each in the same transaction as its row. The
sender's position (``resume_key``) is then the greatest of every row's
``before`` and every whole phase's ``whole`` (``whole_key``). Every transaction at
or below it is at the target, whole; rows after it may be partly there (a phase
some workers committed, a crash in between): a replay re-applies them, keyed
rows converge by upsert and rows of tables without keys are skipped by their
table's identity in ``<meta_database>.applied``, written in the same transactions.

With one worker (``threadnum=1``) the row is written in the transaction of the
phase's last rows: the position is exactly what the target holds. A DDL is
applied on its own (MySQL commits it implicitly); worker 0 writes the position
of the DDL in a small transaction right after it (a crash in between applies it
again, which the sender already takes: "table exists" and the like are skipped).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from capturer.model import StreamKey
from capturer.model.encode import quote_ident
from senders.sqlbuild import param_ident

TABLE = "position"


def fence_create_sql(meta_db: str) -> str:
    """High availability: ``<meta_database>.fence``, one row per sender with the epoch of
    the capturer that may write (see ``MySQLSender.fence_check``)."""
    return (f"CREATE TABLE IF NOT EXISTS {quote_ident(meta_db)}.`fence` (sender VARCHAR(200) NOT NULL PRIMARY KEY, "
            "epoch BIGINT UNSIGNED NOT NULL, "
            "updated TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)) "
            "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin")


def fence_claim_sql(meta_db: str) -> str:
    return (f"INSERT INTO {quote_ident(meta_db)}.`fence` (sender, epoch) VALUES (%s, %s) "
            "ON DUPLICATE KEY UPDATE epoch = GREATEST(epoch, VALUES(epoch))")


def fence_read_sql(meta_db: str, lock: bool) -> str:
    return f"SELECT epoch FROM {quote_ident(meta_db)}.`fence` WHERE sender = %s" + (" LOCK IN SHARE MODE" if lock else "")


def create_sql(meta_db: str) -> str:
    """The ``position`` table (no parameters: the name is not %-escaped)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {quote_ident(meta_db)}.`{TABLE}` ("
        "sender VARCHAR(200) NOT NULL, worker SMALLINT UNSIGNED NOT NULL, "
        "run BIGINT UNSIGNED NOT NULL, phase BIGINT UNSIGNED NOT NULL, parts SMALLINT UNSIGNED NOT NULL, "
        "before_ts BIGINT UNSIGNED NULL, before_region VARCHAR(64) NULL, before_sub INT NULL, "
        "whole_ts BIGINT UNSIGNED NULL, whole_region VARCHAR(64) NULL, whole_sub INT NULL, "
        "updated TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), "
        "PRIMARY KEY (sender, worker)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
    )


def select_sql(meta_db: str) -> str:
    """A sender's rows (one parameter: the sender's name)."""
    return (f"SELECT worker, run, phase, parts, before_ts, before_region, before_sub, whole_ts, whole_region, "
            f"whole_sub FROM {param_ident(meta_db)}.`{TABLE}` WHERE sender = %s")


def upsert_sql(meta_db: str) -> str:
    """One worker's row (parameters: ``Mark.params``)."""
    cols = ("run", "phase", "parts", "before_ts", "before_region", "before_sub", "whole_ts", "whole_region",
            "whole_sub")
    return (f"INSERT INTO {param_ident(meta_db)}.`{TABLE}` (sender, worker, {', '.join(cols)}) "
            f"VALUES ({', '.join(['%s'] * (len(cols) + 2))}) ON DUPLICATE KEY UPDATE "
            + ", ".join(f"{c}=VALUES({c})" for c in cols))


def _key_params(key: StreamKey | None) -> tuple[Any, Any, Any]:
    return (None, None, None) if key is None else (key[0], key[1], key[2])


def _key(ts: Any, region: Any, sub: Any) -> StreamKey | None:
    if ts is None or region is None or sub is None:
        return None
    return (int(ts), region.decode() if isinstance(region, bytes) else str(region), int(sub))


@dataclass(frozen=True, slots=True)
class Mark:
    """What a worker writes with the last rows of its share of a phase."""

    run: int
    phase: int
    parts: int
    before: StreamKey | None
    whole: StreamKey | None

    def params(self, sender: str, worker: int) -> tuple[Any, ...]:
        return (sender, worker, self.run, self.phase, self.parts, *_key_params(self.before),
                *_key_params(self.whole))


@dataclass(frozen=True, slots=True)
class Row:
    """A worker's row as read back."""

    worker: int
    run: int
    phase: int
    parts: int
    before: StreamKey | None
    whole: StreamKey | None

    @classmethod
    def from_db(cls, r: Sequence[Any]) -> Row:
        return cls(int(r[0]), int(r[1]), int(r[2]), int(r[3]), _key(r[4], r[5], r[6]), _key(r[7], r[8], r[9]))


def whole_key(rows: Iterable[Row]) -> StreamKey | None:
    """The key of the last transaction the target holds whole, by a sender's rows:
    the greatest ``before`` of any row, and ``whole`` of any phase whose every
    worker wrote its row (``parts`` rows with its ``(run, phase)``). None: nothing known."""
    rows = list(rows)
    done = Counter((r.run, r.phase) for r in rows)
    best: StreamKey | None = None
    for r in rows:
        for k in (r.before, r.whole if done[(r.run, r.phase)] >= r.parts else None):
            if k is not None and (best is None or k > best):
                best = k
    return best
