"""GTID states of a MySQL/MariaDB source: the position that survives a change of server.

A region's ``Position.gtid`` holds the source's GTID state after the transaction
the position ends: every transaction up to there, named so that any server of the
replication topology can tell whether it holds them.

- MariaDB: the ``gtid_binlog_pos`` shape, one ``domain-server-seq`` per replication
  domain, sorted by domain (``0-1-105,1-2-30``). A domain's sequence numbers grow
  along its binlog order, so "server S holds our position" is: for each of our
  domains, S's own position in that domain has at least our seq (else S is
  *behind*), and S's oldest binlog still starts at or before it (else the
  transactions after ours were *purged*). Whether S's history holds our very
  GTID (not another server's transaction with the same seq, after a split brain)
  is the server's own check when the dump starts (``@slave_gtid_strict_mode=1``:
  error 1236, which the region reports the same way).
- MySQL (unit-tested only: no MySQL server runs in our tests): a GTID set,
  ``uuid:1-5:7,uuid2:1-3`` (``gtid_executed``). S holds it when it is a subset of
  S's ``gtid_executed`` and nothing of S's ``gtid_purged`` lies outside it.

``GtidTracker`` follows a stream: the state at its start, then every GTID read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MARIA = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


# --- MariaDB: domain-server-seq lists --------------------------------------------------

def parse_maria(text: str) -> dict[int, tuple[int, int]]:
    """``0-1-105,1-2-30`` -> {domain: (server_id, seq)}; ValueError on anything else."""
    out: dict[int, tuple[int, int]] = {}
    for part in (p.strip() for p in (text or "").replace("\n", ",").split(",")):
        if not part:
            continue
        m = _MARIA.match(part)
        if m is None:
            raise ValueError(f"not a MariaDB GTID (domain-server-seq): {part!r}")
        d, s, n = (int(x) for x in m.groups())
        if d in out and out[d][1] >= n:
            continue
        out[d] = (s, n)
    return out


def format_maria(state: dict[int, tuple[int, int]]) -> str:
    return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(state.items()))


def maria_behind(ours: str, theirs: str, state: str = "") -> list[str]:
    """Our GTIDs that a server at ``theirs`` (its gtid_binlog_pos) has not reached:
    its domain's seq below ours, or the domain unknown to it; and, given its
    ``gtid_binlog_state`` (the last seq of each domain and server), those it never
    had though it went further: it was behind when it was promoted and wrote
    transactions of its own with the same sequence numbers (a domain's seq only
    grows, so the server that wrote ours also wrote everything of its before it)."""
    mine, have = parse_maria(ours), parse_maria(theirs)
    last: dict[tuple[int, int], int] = {}
    for part in (p.strip() for p in state.replace("\n", ",").split(",")):
        m = _MARIA.match(part)
        if m is not None:
            d, s, n = (int(x) for x in m.groups())
            last[(d, s)] = max(n, last.get((d, s), 0))
    return [f"{d}-{s}-{n}" for d, (s, n) in sorted(mine.items())
            if have.get(d, (0, 0))[1] < n or (state and last.get((d, s), 0) < n)]


def maria_purged(ours: str, oldest: str) -> list[str]:
    """Our GTIDs after which the server no longer has every transaction: ``oldest``
    is the state its oldest binlog starts at (BINLOG_GTID_POS(oldest file, 4)); a
    domain whose start is past our seq lost the transactions in between."""
    mine, first = parse_maria(ours), parse_maria(oldest)
    return [f"{d}-{s}-{n}" for d, (s, n) in sorted(mine.items()) if first.get(d, (0, 0))[1] > n]


def maria_contains(outer: str, inner: str) -> bool:
    """Each GTID of ``inner`` is exactly one of ``outer`` (the same server's history at
    a binlog position: an old checkpoint kept only its last GTID)."""
    a, b = parse_maria(outer), parse_maria(inner)
    return bool(b) and all(a.get(d) == v for d, v in b.items())


# --- MySQL: GTID sets --------------------------------------------------------------------

@dataclass
class GtidSet:
    """A MySQL GTID set: per source uuid, sorted disjoint closed intervals."""

    sets: dict[str, list[tuple[int, int]]]

    @classmethod
    def parse(cls, text: str) -> GtidSet:
        sets: dict[str, list[tuple[int, int]]] = {}
        for part in (p.strip() for p in (text or "").replace("\n", "").split(",")):
            if not part:
                continue
            uuid, *ranges = part.split(":")
            uuid = uuid.strip().lower()
            if not _UUID.match(uuid) or not ranges:
                raise ValueError(f"not a MySQL GTID set member (uuid:n[-m]...): {part!r}")
            for r in ranges:
                lo, _, hi = r.strip().partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise ValueError(f"bad interval {r!r} in {part!r}")
                cls._add(sets.setdefault(uuid, []), int(lo), int(hi or lo))
        return cls(sets)

    @staticmethod
    def _add(iv: list[tuple[int, int]], lo: int, hi: int) -> None:
        if hi < lo:
            raise ValueError(f"bad interval {lo}-{hi}")
        iv.append((lo, hi))
        iv.sort()
        merged: list[tuple[int, int]] = []
        for a, b in iv:
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        iv[:] = merged

    def add(self, gtid: str) -> None:
        """One transaction's GTID ``uuid:n``."""
        uuid, _, n = gtid.strip().rpartition(":")
        if not _UUID.match(uuid) or not n.isdigit():
            raise ValueError(f"not a MySQL GTID (uuid:n): {gtid!r}")
        iv = self.sets.setdefault(uuid.lower(), [])
        k = int(n)
        if iv and iv[-1][1] + 1 == k:  # the common case: the next one
            iv[-1] = (iv[-1][0], k)
        else:
            self._add(iv, k, k)

    def minus(self, other: GtidSet) -> GtidSet:
        """The GTIDs of this set that ``other`` lacks."""
        out: dict[str, list[tuple[int, int]]] = {}
        for uuid, iv in self.sets.items():
            rest = list(iv)
            for a, b in other.sets.get(uuid, []):
                nxt: list[tuple[int, int]] = []
                for lo, hi in rest:
                    if b < lo or a > hi:
                        nxt.append((lo, hi))
                        continue
                    if lo < a:
                        nxt.append((lo, a - 1))
                    if hi > b:
                        nxt.append((b + 1, hi))
                rest = nxt
            if rest:
                out[uuid] = rest
        return GtidSet(out)

    def __bool__(self) -> bool:
        return any(self.sets.values())

    def __str__(self) -> str:
        return ",".join(uuid + "".join(f":{a}" if a == b else f":{a}-{b}" for a, b in iv)
                        for uuid, iv in sorted(self.sets.items()) if iv)


def mysql_behind(ours: str, executed: str) -> str:
    """Our GTIDs the server (its gtid_executed) lacks: it was behind ('' if none)."""
    return str(GtidSet.parse(ours).minus(GtidSet.parse(executed)))


def mysql_purged(ours: str, purged: str) -> str:
    """GTIDs the server purged (its gtid_purged) that we have not read: lost to us ('' if none)."""
    return str(GtidSet.parse(purged).minus(GtidSet.parse(ours)))


# --- following a stream ------------------------------------------------------------------

class GtidTracker:
    """The GTID state of a stream: set at its start, advanced by each transaction's
    GTID. ``state`` is '' while unknown (a MySQL stream that did not start where
    the server's gtid_executed could be read): a failover then cannot resume."""

    def __init__(self, mariadb: bool, start: str = ""):
        self.mariadb = mariadb
        self._maria: dict[int, tuple[int, int]] = {}
        self._mysql: GtidSet | None = None
        self.state = ""
        self.reset(start)

    def reset(self, start: str) -> None:
        if self.mariadb:
            self._maria = parse_maria(start)
            self.state = format_maria(self._maria)
        else:
            self._mysql = GtidSet.parse(start) if start else None
            self.state = str(self._mysql) if self._mysql is not None else ""

    def advance(self, gtid: str) -> str:
        """The state after the transaction with ``gtid`` (its own GTID; '' leaves it)."""
        if not gtid:
            return self.state
        if self.mariadb:
            m = _MARIA.match(gtid)
            if m is None:
                return self.state
            d, s, n = (int(x) for x in m.groups())
            self._maria[d] = (s, n)
            self.state = format_maria(self._maria)
        elif self._mysql is not None:
            self._mysql.add(gtid)
            self.state = str(self._mysql)
        return self.state
