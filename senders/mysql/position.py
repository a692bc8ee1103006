"""The MySQL sender's position, kept in the target: exact per lane, per change
(``<meta_database>.lanes``).

A batch is applied in **phases**: the sender places a phase's changes on
``threadnum`` lanes (one causal group always on one lane, in stream order;
senders/mysql/causality.py) and worker *l* applies lane *l*'s share, committing it
in one or more target transactions (a chunk of ``commit_rows`` rows, or one source
transaction with ``txn_atomic``). A phase is handed out only once the one before
has committed everywhere, so at most one phase, the last, is ever partly at the
target.

**What is written.** Each phase has a number, increasing for the sender across
runs, and a **manifest**: the stream keys it was handed out after and completes
(``before``, ``whole``), its first and last change (``start``, ``end``: each
``(commit_ts, region, seq)``), every source transaction it holds changes of
(``commit_ts``, region, its number of changes, the ``seq`` range handed out), and
the lane of each change, in stream order. Every chunk a worker commits writes, **in
the same target transaction**, its lane's row: ``(sender, lane) -> (phase, done)``,
``done`` being how many changes of the lane's share (its changes of the phase in
stream order) are committed; the first chunk of a lane in a phase writes the
manifest with it.

**What is read back** (``Resume.read``). The last phase is the greatest number in the
sender's rows. Every change before its ``start`` is at the target (earlier phases
committed everywhere); of its own changes, exactly the first ``done`` of each lane's
share are (a row of an older phase: none); changes after its ``end`` are not. So a
restart, a retried batch or a new active capturer (high availability) applies
**nothing twice and skips nothing**: each change the stream hands again is looked up
(``Resume.at_target``); the lanes' missing tails are applied by the lanes that had
them, from where each stopped, as the same phase (a crash meanwhile only moves
``done`` on), and only then does the next phase start. The stream is handed again
from ``before`` (the phase incomplete) or ``whole`` (complete).

Nothing here depends on how the sender cut phases or placed groups in the run that
wrote them: another ``threadnum`` or ``txn_atomic`` after a restart reads the same
answer (a lane beyond the new ``threadnum`` is finished by worker ``lane %
threadnum``). What it depends on is the stream: a change's identity ``(commit_ts,
region, seq)`` must name the same change when handed again. A transaction of the
phase that comes back with another number of changes, or one that was not in the
phase (a sender filter changed before a restart), is a **mismatch**: the sender
then falls back to applying the phase's changes again from ``start`` (keyed rows
converge by upsert, rows of tables without keys are skipped by ``applied``), counts
``position_mismatches`` and logs it.

A DDL is a phase without changes (worker 0's row, in a transaction of its own right
after the DDL: MySQL commits a DDL implicitly, so a crash in between hands it again;
its intent row, written before it ran with the schema state it started from, tells
whether it ran: senders/mysql/ddlstate.py).

Chosen over per-worker "last transaction whole" rows (the previous design: a crash
while a phase was partly committed re-applied its committed rows, and readers saw
older row images and non-source states for a few seconds; issue 43) and over XA
(a prepare log write and three more round trips per commit, every worker's row
locks held until the slowest prepared, a recovery step of its own at start).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from capturer.model import StreamKey
from capturer.model.encode import _fastrows, quote_ident
from senders.sqlbuild import param_ident

LANES = "lanes"
LEGACY = "position"  # the table of the previous design, read once for its position when no lane row exists

Ident = tuple[int, str, int]  # (commit_ts, region, seq): a change's place in the merged stream


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


def sessions_create_sql(meta_db: str) -> str:
    """High availability: ``<meta_database>.sessions``, the target connections of each
    capturer (by epoch), so that a new active one can end a deposed one's (frozen,
    holding the fence row in open transactions) instead of waiting for them. ``boot``:
    when the server started (connection ids start again at a restart)."""
    return (f"CREATE TABLE IF NOT EXISTS {quote_ident(meta_db)}.`sessions` (sender VARCHAR(200) NOT NULL, "
            "boot BIGINT NOT NULL, conn_id BIGINT UNSIGNED NOT NULL, epoch BIGINT UNSIGNED NOT NULL, "
            "updated TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), "
            "PRIMARY KEY (sender, boot, conn_id)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin")


def session_register_sql(meta_db: str) -> str:
    """This connection's row (parameters: sender, boot, epoch)."""
    return (f"INSERT INTO {param_ident(meta_db)}.`sessions` (sender, boot, conn_id, epoch) "
            "VALUES (%s, %s, CONNECTION_ID(), %s) ON DUPLICATE KEY UPDATE epoch = VALUES(epoch)")


def create_sql(meta_db: str) -> str:
    """The ``lanes`` table (no parameters: the name is not %-escaped)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {quote_ident(meta_db)}.`{LANES}` ("
        "sender VARCHAR(200) NOT NULL, lane SMALLINT UNSIGNED NOT NULL, "
        "phase BIGINT UNSIGNED NOT NULL, done INT UNSIGNED NOT NULL, manifest MEDIUMBLOB NULL, "
        "updated TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), "
        "PRIMARY KEY (sender, lane)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
    )


def select_sql(meta_db: str) -> str:
    """A sender's lane rows (one parameter: the sender's name)."""
    return f"SELECT lane, phase, done, manifest FROM {param_ident(meta_db)}.`{LANES}` WHERE sender = %s"


def upsert_sql(meta_db: str) -> str:
    """One lane's row (parameters: sender, lane, phase, done, manifest or None to keep it)."""
    return (f"INSERT INTO {param_ident(meta_db)}.`{LANES}` (sender, lane, phase, done, manifest) "
            "VALUES (%s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE phase=VALUES(phase), done=VALUES(done), "
            "manifest=COALESCE(VALUES(manifest), manifest)")


def legacy_select_sql(meta_db: str) -> str:
    return (f"SELECT worker, run, phase, parts, before_ts, before_region, before_sub, whole_ts, whole_region, "
            f"whole_sub FROM {param_ident(meta_db)}.`{LEGACY}` WHERE sender = %s")


def legacy_whole_key(rows: Iterable[Sequence[Any]]) -> StreamKey | None:
    """The position of the previous design's rows (``position``: a row per worker with
    the phase it last committed whole): the greatest ``before`` of any row, and
    ``whole`` of a phase every worker with a share wrote its row for."""
    rows = list(rows)
    done: dict[tuple[int, int], int] = {}
    for r in rows:
        done[(int(r[1]), int(r[2]))] = done.get((int(r[1]), int(r[2])), 0) + 1
    best: StreamKey | None = None
    for r in rows:
        keys = [_key(r[4], r[5], r[6])]
        if done[(int(r[1]), int(r[2]))] >= int(r[3]):
            keys.append(_key(r[7], r[8], r[9]))
        for k in keys:
            if k is not None and (best is None or k > best):
                best = k
    return best


def _key(ts: Any, region: Any, sub: Any) -> StreamKey | None:
    if ts is None or region is None or sub is None:
        return None
    return (int(ts), region.decode() if isinstance(region, bytes) else str(region), int(sub))


def _j(key: tuple[int, str, int] | None) -> list[Any] | None:
    return None if key is None else [key[0], key[1], key[2]]


def _k(v: Any) -> Any:
    return None if v is None else (int(v[0]), str(v[1]), int(v[2]))


#: the "txns" array of Manifest.encode in C (capturer/_native/causality.c), or None
_manifest_txns = getattr(_fastrows, "manifest_txns", None)


@dataclass(slots=True)
class Manifest:
    """One phase as handed out: see the module docstring. ``txns``: per source
    transaction ``(commit_ts, region, changes in it, first seq, seq after the last)``
    in stream order; ``lanes``: the lane of each change handed out, in stream order."""

    phase: int
    before: StreamKey | None
    whole: StreamKey | None
    start: Ident | None = None
    end: Ident | None = None
    txns: list[tuple[int, str, int, int, int]] = field(default_factory=list)
    lanes: bytearray = field(default_factory=bytearray)

    def encode(self) -> bytes:
        made = _manifest_txns(self.txns) if _manifest_txns is not None else None
        if made is not None:  # the same bytes, the transactions' part written in C
            text, regions_c = made
            doc = {"v": 1, "phase": self.phase, "before": _j(self.before), "whole": _j(self.whole),
                   "start": _j(self.start), "end": _j(self.end), "regions": regions_c, "txns": []}
            head = json.dumps(doc, separators=(",", ":"))
            body = head[:-3].encode() + text + b"}"  # (head ends in "txns":[]})
            return zlib.compress(len(body).to_bytes(4, "big") + body + bytes(self.lanes), 1)
        return self.encode_py()

    def encode_py(self) -> bytes:
        """``encode``'s specification (and its path where the C extension is not built)."""
        regions: dict[str, int] = {}
        txns = []
        prev = 0
        for ts, region, total, lo, hi in self.txns:
            txns.append([ts - prev, regions.setdefault(region, len(regions)), total, lo, hi])
            prev = ts
        doc = {"v": 1, "phase": self.phase, "before": _j(self.before), "whole": _j(self.whole),
               "start": _j(self.start), "end": _j(self.end), "regions": list(regions), "txns": txns}
        body = json.dumps(doc, separators=(",", ":")).encode()
        return zlib.compress(len(body).to_bytes(4, "big") + body + bytes(self.lanes), 1)

    @classmethod
    def decode(cls, blob: bytes) -> Manifest:
        raw = zlib.decompress(blob)
        n = int.from_bytes(raw[:4], "big")
        doc = json.loads(raw[4:4 + n])
        if doc.get("v") != 1:
            raise ValueError(f"manifest version {doc.get('v')!r}")
        regions = doc["regions"]
        txns = []
        ts = 0
        for d, r, total, lo, hi in doc["txns"]:
            ts += int(d)
            txns.append((ts, str(regions[r]), int(total), int(lo), int(hi)))
        return cls(int(doc["phase"]), _k(doc["before"]), _k(doc["whole"]), _k(doc["start"]), _k(doc["end"]), txns,
                   bytearray(raw[4 + n:]))


class Placer:
    """Builds a phase's manifest while the sender places its changes, with each
    change's place in its lane's share (kept cheap: it runs once per change)."""

    __slots__ = ("phase", "before", "_txns", "_cur", "lanes", "counts")

    def __init__(self, phase: int, before: StreamKey | None, threads: int = 256):
        self.phase, self.before = phase, before
        self._txns: list[list[Any]] = []
        self._cur: list[Any] | None = None  # the entry of the transaction being placed
        self.lanes = bytearray()
        self.counts = [0] * threads

    def add(self, commit_ts: int, region: str, total: int, seq: int, lane: int, n: int = 1) -> int:
        """Hand out changes ``seq .. seq + n - 1`` of a transaction on ``lane`` (stream
        order); the place in the lane's share of the first."""
        cur = self._cur
        if cur is not None and cur[4] == seq and cur[0] == commit_ts and cur[1] == region:
            cur[4] = seq + n
        else:
            self._cur = cur = [commit_ts, region, total, seq, seq + n]
            self._txns.append(cur)
        if n == 1:
            self.lanes.append(lane)
        else:
            self.lanes.extend(bytes((lane,)) * n)
        pos = self.counts[lane]
        self.counts[lane] = pos + n
        return pos

    def manifest(self, whole: StreamKey | None) -> Manifest:
        txns = [(t[0], t[1], t[2], t[3], t[4]) for t in self._txns]
        first, last = txns[0], txns[-1]
        return Manifest(self.phase, self.before, whole, (first[0], first[1], first[3]), (last[0], last[1], last[4] - 1),
                        txns, self.lanes)

    def __len__(self) -> int:
        return len(self.lanes)


@dataclass(slots=True)
class Place:
    """Where a change of the last phase sits: its lane, its place in the lane's share,
    and whether it is committed at the target."""

    lane: int
    pos: int
    committed: bool


class Resume:
    """What the target holds of the stream, read from a sender's lane rows: see the
    module docstring. ``key``: the stream is handed again after it."""

    def __init__(self, manifest: Manifest | None, done: dict[int, int], legacy: StreamKey | None = None,
                 blob: bytes = b""):
        self.manifest = manifest
        self.blob = blob or (manifest.encode() if manifest is not None else b"")
        self.done = dict(done)
        self.legacy = legacy
        self.places: dict[tuple[int, str], tuple[int, int, int, list[tuple[int, int]]]] = {}
        self.shares: dict[int, int] = {}
        self.complete = True
        if manifest is None:
            return
        counts: dict[int, int] = {}
        i = 0
        for ts, region, total, lo, hi in manifest.txns:
            spots = []
            for _ in range(lo, hi):
                lane = manifest.lanes[i]
                pos = counts.get(lane, 0)
                counts[lane] = pos + 1
                spots.append((lane, pos))
                i += 1
            self.places[(ts, region)] = (total, lo, hi, spots)
        self.shares = counts
        self.complete = all(self.done.get(lane, 0) >= n for lane, n in counts.items())

    @property
    def phase(self) -> int:
        return 0 if self.manifest is None else self.manifest.phase

    @property
    def key(self) -> StreamKey | None:
        m = self.manifest
        if m is None:
            return self.legacy
        return m.whole if self.complete else m.before

    def pending(self) -> dict[int, int]:
        """Lanes with changes of the last phase not yet committed: lane -> how many."""
        return {lane: n - self.done.get(lane, 0) for lane, n in self.shares.items() if self.done.get(lane, 0) < n}

    def find(self, commit_ts: int, region: str, total: int, seq: int) -> Place | bool | None:
        """Change ``seq`` of the transaction ``(commit_ts, region)`` with ``total`` changes,
        handed again: True (at the target: before the last phase), False (after it: not
        at the target), a ``Place`` (one of the last phase's), or None: a mismatch (the
        transaction is not the one the phase recorded)."""
        m = self.manifest
        if m is None or m.start is None or m.end is None:
            return False
        ident = (commit_ts, region, seq)
        if ident < m.start:
            return True
        if ident > m.end:
            return False
        got = self.places.get((commit_ts, region))
        if got is None or got[0] != total or not got[1] <= seq < got[2]:
            return None
        lane, pos = got[3][seq - got[1]]
        return Place(lane, pos, pos < self.done.get(lane, 0))

    @classmethod
    def read(cls, rows: Iterable[Sequence[Any]], legacy: StreamKey | None = None) -> Resume:
        """From ``select_sql``'s rows (lane, phase, done, manifest)."""
        rows = [(int(r[0]), int(r[1]), int(r[2]), r[3]) for r in rows]
        if not rows:
            return cls(None, {}, legacy)
        last = max(r[1] for r in rows)
        blob = next((r[3] for r in rows if r[1] == last and r[3] is not None), None)
        if blob is None:
            raise ValueError(f"the rows of phase {last} carry no manifest")
        manifest = Manifest.decode(bytes(blob))
        return cls(manifest, {r[0]: r[2] for r in rows if r[1] == last}, blob=bytes(blob))
