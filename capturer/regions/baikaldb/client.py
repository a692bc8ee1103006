"""HTTP+JSON calls to BaikalDB's meta servers and stores (brpc serves every
protobuf method as ``POST /<Service>/<method>``).

``MetaClient``: leader lookup, ``QUERY_SCHEMA``, ``QUERY_REGION``, TSO; any
meta peer answers queries, so a dead peer is skipped. ``StoreClient``:
``OP_READ_BINLOG`` / ``OP_QUERY_BINLOG`` against one binlog region, following
the store's answers:

* ``NOT_LEADER`` with a leader: retried there (at most 3 hops); without one
  (``0.0.0.0:0``): the other peers;
* a peer that refuses or times out: the next peer (the region's state shows it);
* the leader answers "nothing new" while the read position is more than
  ``follower_after`` seconds behind the clock: the followers are asked too (a
  lagging leader; a follower only serves what it has applied, so its answer is
  always a correct prefix);
* ``VERSION_OLD``: the region's info is replaced by the one the store sends
  (new regions are reported) and the read retried;
* ``LESS_THAN_OLDEST_TS`` from every peer: ``BinlogPurged`` (never skipped);
* brpc framework errors (HTTP 400/404: a request this client built wrong) are
  fatal; everything else is retried by the caller with backoff.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests

from capturer.errors import FatalSourceError, SourceError
from capturer.model import protogen
from capturer.regions.baikaldb import brpc_json
from capturer.regions.baikaldb.tso import describe, unix_ms

log = logging.getLogger(__name__)

NO_LEADER = "0.0.0.0:0"
# errcodes worth trying again (elsewhere or later)
RETRYABLE = {"NOT_LEADER", "GET_VALUE_FAIL", "INTERNAL_ERROR", "REGION_NOT_EXIST", "HAVE_NOT_INIT",
             "RETRY_LATER", "STORE_BUSY", "LEARNER_NOT_READY", "STORE_ROCKS_HANG", "REGION_ERROR_STATUS",
             "CONNECT_FAIL", "CANCELLED", "IN_PROCESS", "EXEC_FAIL", "VERSION_OLD"}
# errcodes that mean this client sent something wrong: retrying cannot help
CLIENT_BUG = {"UNSUPPORT_REQ_TYPE", "INPUT_PARAM_ERROR", "PARSE_FROM_PB_FAIL", "PARSE_TO_PB_FAIL"}


class PeerFailure(Exception):
    """No peer could answer (connection, timeout, HTTP 5xx, unreadable body, a
    retryable errcode). ``refresh``: the region's info should be read again from
    the meta servers before the next try."""

    def __init__(self, msg: str, refresh: bool = False):
        super().__init__(msg)
        self.refresh = refresh


class BadRequest(FatalSourceError):
    """HTTP 400/404 from brpc: a request this client built wrong, or not a BaikalDB server."""


class BinlogPurged(FatalSourceError):
    """The store no longer holds the binlog the capturer must read next."""


def _errcode(d: dict[str, Any]) -> str:
    """The answer's errcode name; "" when it has none (it is a required field)."""
    code = d.get("errcode", "")
    if isinstance(code, int) and not isinstance(code, bool):
        ev = protogen.load("baikaldb").ErrCode.DESCRIPTOR.values_by_number.get(code)
        return ev.name if ev is not None else str(code)
    return str(code)


def _store_errmsg(d: dict[str, Any]) -> str:
    """``StoreRes.errmsg`` is bytes, so base64 in brpc's JSON."""
    raw = d.get("errmsg")
    if not isinstance(raw, str):
        return ""
    try:
        return base64.b64decode(raw, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return raw


class Http:
    """One requests session (not shared across threads) and brpc's error shape."""

    def __init__(self, connect_timeout: float, timeout: float):
        self.session = requests.Session()
        self.timeouts = (connect_timeout, timeout)

    def post(self, peer: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"http://{peer}/{method}"
        try:
            r = self.session.post(url, data=json.dumps(body), headers={"Content-Type": "application/json"},
                                  timeout=self.timeouts)
        except requests.RequestException as exc:
            raise PeerFailure(f"{peer}: {type(exc).__name__}: {_short(exc)}") from None
        if r.status_code != 200:
            code = r.headers.get("x-bd-error-code", "")
            text = r.text[:300].strip()
            if r.status_code in (400, 404):
                raise BadRequest(
                    f"{url} refused the request: HTTP {r.status_code} (brpc error {code or '?'}): {text}. "
                    "This is a request the capturer built wrong or a server that is not a BaikalDB "
                    f"{method.split('/')[0]}; check the address")
            raise PeerFailure(f"{peer}: HTTP {r.status_code} (brpc error {code or '?'}): {text}")
        try:
            d = json.loads(r.content)
        except ValueError as exc:
            raise PeerFailure(f"{peer}: unreadable JSON body ({exc}): {r.content[:80]!r}") from None
        if not isinstance(d, dict):
            raise PeerFailure(f"{peer}: the JSON body is not an object: {r.content[:80]!r}")
        return d

    def close(self) -> None:
        self.session.close()


def _short(exc: BaseException) -> str:
    s = str(exc)
    return s if len(s) < 200 else s[:200] + "..."


class MetaClient:
    """The meta servers of one cluster (``metaServer``: comma-separated peers)."""

    def __init__(self, peers: list[str], connect_timeout: float, timeout: float, where: str):
        self.peers = list(peers)
        self.leader: str | None = None
        self.where = where
        self.http = Http(connect_timeout, timeout)
        self.lock = threading.Lock()

        self.pb = protogen.load("baikaldb")

    def _call(self, method: str, body: dict[str, Any], follow: bool = False) -> dict[str, Any]:
        order = ([self.leader] if self.leader else []) + [p for p in self.peers if p != self.leader]
        errors = []
        bad: list[BadRequest] = []
        hops = 0
        with self.lock:
            i = 0
            while i < len(order):
                peer = order[i]
                i += 1
                try:
                    d = self.http.post(peer, method, body)
                except PeerFailure as exc:
                    errors.append(str(exc))
                    continue
                except BadRequest as exc:  # another meta peer may still be a meta server
                    bad.append(exc)
                    errors.append(str(exc))
                    continue
                code = _errcode(d)
                if not code:
                    errors.append(f"{peer}: an answer without errcode")
                    continue
                if code == "HAVE_NOT_INIT":
                    errors.append(f"{peer}: HAVE_NOT_INIT (meta is starting)")
                    continue
                if code == "NOT_LEADER" and follow:
                    lead = d.get("leader")
                    errors.append(f"{peer}: NOT_LEADER (leader {lead or '?'})")
                    if isinstance(lead, str) and lead and lead != NO_LEADER and hops < 3:
                        hops += 1
                        order.insert(i, lead)
                    continue
                return d
        if bad and len(bad) == len(order):
            raise bad[0]
        raise SourceError(f"{self.where}: no meta server answered {method}: " + "; ".join(errors))

    def find_leader(self) -> str | None:
        """``raft_control GetLeader`` of the meta state machine (region 0)."""
        try:
            d = self._call("MetaService/raft_control", {"op_type": "GetLeader", "region_id": 0})
        except SourceError:
            return None
        lead = d.get("leader")
        if _errcode(d) == "SUCCESS" and isinstance(lead, str) and lead and lead != NO_LEADER:
            self.leader = lead
            return lead
        return None

    def _query(self, body: dict[str, Any]) -> Any:
        d = self._call("MetaService/query", body)
        resp = self.pb.QueryResponse()
        code = _errcode(d)
        if code not in ("SUCCESS", "REGION_NOT_EXIST"):
            if code == "INPUT_PARAM_ERROR" and body.get("table_name"):
                return resp  # "table not exist"
            raise SourceError(f"{self.where}: meta query {body.get('op_type')} failed: {code} {d.get('errmsg', '')}")
        try:
            brpc_json.from_json({"errcode": "SUCCESS", **{k: v for k, v in d.items()
                                                          if k in ("schema_infos", "region_infos")}},
                                resp, lenient_enums=True)
        except brpc_json.JsonPbError as exc:
            raise SourceError(f"{self.where}: meta answered {body.get('op_type')} with a body that does not fit "
                              f"QueryResponse: {exc}") from None
        return resp

    def query_schemas(self, namespace: str = "", database: str = "", table: str = "") -> list[Any]:
        body: dict[str, Any] = {"op_type": "QUERY_SCHEMA"}
        if table:
            body.update(namespace_name=namespace, database=database, table_name=table)
        return list(self._query(body).schema_infos)

    def query_regions(self, table_id: int, region_ids: list[int] | None = None) -> list[Any]:
        body: dict[str, Any] = {"op_type": "QUERY_REGION"}
        if region_ids:
            body["region_ids"] = region_ids
        else:
            body["table_id"] = table_id
        # a 2020 meta ignores table_id and answers every region: filter here too
        return [r for r in self._query(body).region_infos if int(r.table_id) == table_id]

    def gen_tso(self) -> int | None:
        """A fresh TSO from the meta's TSO service, or None if it does not answer."""
        try:
            d = self._call("MetaService/tso_service", {"op_type": "OP_GEN_TSO", "count": 1}, follow=True)
        except (SourceError, FatalSourceError):
            return None
        st = d.get("start_timestamp")
        if _errcode(d) != "SUCCESS" or not isinstance(st, dict):
            return None
        try:
            return (int(st.get("physical", 0)) << 18) + int(st.get("logical", 0))
        except (TypeError, ValueError):
            return None

    def close(self) -> None:
        self.http.close()


@dataclass
class StoreRegionInfo:
    """What the reader knows of one binlog region and how reading it goes."""

    region_id: int
    partition_id: int
    version: int
    peers: list[str]
    leader: str = ""
    # counters and state for /status
    state: str = "new"
    serving_peer: str = ""
    reads: int = 0
    entries: int = 0
    fakes: int = 0
    not_leader: int = 0
    version_old: int = 0
    follower_reads: int = 0
    repeats: int = 0  # entries at the read's own binlog_ts (older stores give the last fake back)
    peer_failures: int = 0
    retries: int = 0
    meta_refreshes: int = 0
    last_error: str = ""
    next_ts: int = 0  # binlog_ts of the next read
    start_ts: int = 0  # where this run started it
    latest_ts: int = 0  # newest ts handed to the merge
    dead_until: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_pb(cls, r: Any) -> StoreRegionInfo:
        return cls(int(r.region_id), int(r.partition_id), int(r.version), list(r.peers), r.leader or "")

    def update_from_pb(self, r: Any, trust_leader: bool = True) -> None:
        """From a RegionInfo. The meta's ``leader`` comes from heartbeats and may be
        stale: a periodic refresh (``trust_leader=False``) keeps the leader the
        stores named unless it is no longer a peer; versions never go back."""
        self.version = max(self.version, int(r.version))
        if r.peers:
            self.peers = list(r.peers)
        if r.leader and r.leader != NO_LEADER and (trust_leader or self.leader not in self.peers):
            self.leader = r.leader

    def status(self) -> dict[str, Any]:
        return {
            "partition": self.partition_id, "version": self.version, "state": self.state,
            "leader": self.leader, "peers": list(self.peers), "serving_peer": self.serving_peer,
            "next_ts": self.next_ts, "latest_ts": self.latest_ts,
            "lag_seconds": round(max(0.0, time.time() - unix_ms(self.latest_ts) / 1000), 3) if self.latest_ts else None,
            "reads": self.reads, "entries": self.entries, "fakes": self.fakes, "repeats": self.repeats,
            "not_leader": self.not_leader, "version_old": self.version_old,
            "follower_reads": self.follower_reads, "peer_failures": self.peer_failures,
            "retries": self.retries, "meta_refreshes": self.meta_refreshes, "last_error": self.last_error,
        }


@dataclass
class ReadResult:
    entries: list[tuple[int, bytes]]  # (commit_ts, serialized StoreReq), ascending
    peer: str
    follower: bool


@dataclass
class _ReadRound:
    """One StoreClient.read: the peers to ask in order (``i`` the next; answers may add to it)
    and what their answers said so far."""
    order: list[str]
    i: int = 0
    tried: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    refresh: bool = False
    purged: list[str] = field(default_factory=list)
    leader_purged: bool = False
    answered: int = 0
    empty_from: str | None = None
    hops: int = 0
    version_retries: int = 0


class StoreClient:
    """Reads one binlog region (one instance per reader thread)."""

    def __init__(self, where: str, connect_timeout: float, timeout: float, follower_after: float,
                 on_new_regions: Callable[[list[Any]], None] | None = None):
        self.where = where
        self.http = Http(connect_timeout, timeout)
        self.follower_after = follower_after
        self.on_new_regions = on_new_regions

    def _order(self, sr: StoreRegionInfo) -> list[str]:
        now = time.monotonic()
        peers = [p for p in sr.peers if p]
        lead = sr.leader if sr.leader and sr.leader != NO_LEADER else ""
        order = ([lead] if lead else []) + [p for p in peers if p != lead]
        alive = [p for p in order if sr.dead_until.get(p, 0) <= now]
        return alive + [p for p in order if p not in alive]  # dead ones last, not never

    def read(self, sr: StoreRegionInfo, binlog_ts: int, count: int) -> ReadResult:
        if binlog_ts <= 0:
            raise FatalSourceError(f"{self.where}: region {sr.region_id}: refusing to read from binlog_ts "
                                   f"{binlog_ts} (the store answers GET_VALUE_FAIL; 0 never means 'oldest')")
        order = self._order(sr)
        if not order:
            raise PeerFailure(f"region {sr.region_id} has no peers")
        rd = _ReadRound(order)
        while rd.i < len(rd.order):
            peer = rd.order[rd.i]
            rd.i += 1
            if peer in rd.tried:
                continue
            rd.tried.add(peer)
            body = {"op_type": "OP_READ_BINLOG", "region_id": sr.region_id, "region_version": sr.version,
                    "binlog_desc": {"binlog_ts": binlog_ts, "start_ts": binlog_ts, "read_binlog_cnt": count,
                                    "flash_back_read": False}}
            try:
                d = self.http.post(peer, "StoreService/query_binlog", body)
            except PeerFailure as exc:
                sr.peer_failures += 1
                sr.dead_until[peer] = time.monotonic() + 5.0
                rd.errors.append(str(exc))
                continue
            sr.dead_until.pop(peer, None)
            rd.answered += 1
            result = self._read_answer(rd, sr, peer, d, binlog_ts)
            if result is not None:
                return result
        # the leader no longer holds it (its word is final; a follower that answered
        # "nothing new" only lags), or every peer of the region says so: one follower
        # alone may be a new peer whose binlog starts late, so it is not believed
        if rd.leader_purged or (rd.purged and set(rd.purged) >= set(sr.peers)):
            raise BinlogPurged(self._purged_message(sr, binlog_ts, "the leader" if rd.leader_purged
                                                    else "every peer"))
        if rd.empty_from is not None:
            return ReadResult([], rd.empty_from, False)
        raise PeerFailure("; ".join(rd.errors) or "no peer answered", rd.refresh)

    def _read_answer(self, rd: _ReadRound, sr: StoreRegionInfo, peer: str, d: dict[str, Any],
                     binlog_ts: int) -> ReadResult | None:
        """One peer's answer to OP_READ_BINLOG: the result to return, or None to go on to the
        next peer of ``rd.order`` (which this may extend: the leader named, a follower, a retry)."""
        code = _errcode(d)
        lead = d.get("leader") if isinstance(d.get("leader"), str) else ""
        if not code:
            sr.peer_failures += 1
            rd.errors.append(f"{peer}: an answer without errcode")
            return None
        if code == "SUCCESS":
            return self._read_success(rd, sr, peer, d, binlog_ts, lead)
        if code == "NOT_LEADER":
            sr.not_leader += 1
            rd.errors.append(f"{peer}: NOT_LEADER (leader {lead or '?'})")
            if lead and lead != NO_LEADER:
                sr.leader = lead
                if lead not in rd.tried and rd.hops < 3:
                    rd.hops += 1
                    rd.order.insert(rd.i, lead)
            return None
        if code == "VERSION_OLD":
            sr.version_old += 1
            regions = d.get("regions") or []
            rd.errors.append(f"{peer}: VERSION_OLD (had version {sr.version})")
            if regions and rd.version_retries < 2:
                self._version_old(sr, regions, bool(d.get("is_merge")))
                rd.version_retries += 1
                rd.tried.discard(peer)
                rd.order.insert(rd.i, peer)
            else:
                rd.refresh = True  # no usable region info in the answer: ask the meta
            return None
        if code == "REGION_NOT_EXIST":
            rd.refresh = True
            rd.errors.append(f"{peer}: REGION_NOT_EXIST")
            return None
        if code == "LESS_THAN_OLDEST_TS":
            rd.purged.append(peer)
            if lead and lead == peer:
                rd.leader_purged = True
            rd.errors.append(f"{peer}: LESS_THAN_OLDEST_TS ({_store_errmsg(d)})")
            return None
        if code in CLIENT_BUG:
            raise FatalSourceError(f"{self.where}: store {peer} refused OP_READ_BINLOG of region {sr.region_id}: "
                                   f"{code} {_store_errmsg(d)}")
        rd.errors.append(f"{peer}: {code} {_store_errmsg(d)}".rstrip())
        return None

    def _read_success(self, rd: _ReadRound, sr: StoreRegionInfo, peer: str, d: dict[str, Any], binlog_ts: int,
                      lead: Any) -> ReadResult | None:
        """A SUCCESS answer: its entries, or nothing new (believed unless the position is far
        behind the clock, when every follower is asked too, or the leader said it was purged)."""
        entries = self._entries(d, sr, peer, binlog_ts)
        if lead and lead != NO_LEADER:
            sr.leader = lead
        follower = bool(lead) and peer != lead
        if entries:
            if follower:
                sr.follower_reads += 1
            return ReadResult(entries, peer, follower)
        if rd.empty_from is None:
            rd.empty_from = peer
        behind = time.time() - unix_ms(binlog_ts) / 1000
        if behind > self.follower_after:
            # nothing although the position is far behind the clock: the leader
            # may lag; ask every follower (each answer is a correct prefix)
            rd.order += [p for p in sr.peers if p not in rd.tried and p not in rd.order[rd.i:]]
            return None
        if rd.leader_purged:
            return None
        return ReadResult([], rd.empty_from, False)

    def _entries(self, d: dict[str, Any], sr: StoreRegionInfo, peer: str, binlog_ts: int) -> list[tuple[int, bytes]]:
        binlogs = d.get("binlogs") or []
        tss = d.get("commit_ts") or []
        if not isinstance(binlogs, list) or not isinstance(tss, list) or len(binlogs) != len(tss):
            nb = len(binlogs) if isinstance(binlogs, list) else "?"
            nt = len(tss) if isinstance(tss, list) else "?"
            raise PeerFailure(f"{peer}: binlogs ({nb}) and commit_ts ({nt}) do not pair up")
        out: list[tuple[int, bytes]] = []
        prev = binlog_ts
        for b, ts in zip(binlogs, tss):
            if isinstance(ts, str) and ts.isdigit():
                ts = int(ts)
            if not isinstance(ts, int) or isinstance(ts, bool):
                raise PeerFailure(f"{peer}: commit_ts {ts!r} is not an integer")
            if ts == binlog_ts and not out:
                # older stores scan from binlog_ts inclusive and give the fake at it back
                # (what was read last): delivered already, so skipped
                sr.repeats += 1
                continue
            if ts <= prev:
                raise FatalSourceError(
                    f"{self.where}: store {peer}, region {sr.region_id}: commit_ts {ts} follows {prev} in a "
                    f"read from {binlog_ts}: the store broke the ascending order it promises")
            prev = ts
            try:
                payload = base64.b64decode(b, validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise PeerFailure(f"{peer}: binlog at commit_ts {ts} is not base64") from None
            out.append((ts, payload))
        return out

    def _version_old(self, sr: StoreRegionInfo, regions: list[Any], is_merge: bool) -> None:
        pb = protogen.load("baikaldb")
        infos = []
        for r in regions:
            ri = pb.RegionInfo()
            try:
                brpc_json.from_json(r, ri, "regions", lenient_enums=True)
            except brpc_json.JsonPbError as exc:
                log.warning("%s: region %d: VERSION_OLD with unreadable regions: %s", self.where, sr.region_id, exc)
                return
            infos.append(ri)
        mine = [r for r in infos if int(r.region_id) == sr.region_id]
        if mine:
            sr.update_from_pb(mine[0])
            log.info("%s: region %d: now version %d (VERSION_OLD)", self.where, sr.region_id, sr.version)
        others = [r for r in infos if int(r.region_id) != sr.region_id]
        if others and self.on_new_regions is not None:
            self.on_new_regions(others)
        if is_merge:
            log.warning("%s: region %d was merged into %s; binlog regions are not expected to merge",
                        self.where, sr.region_id, [int(r.region_id) for r in others])

    def query_binlog(self, sr: StoreRegionInfo) -> dict[str, Any] | None:
        """``OP_QUERY_BINLOG``: the region's ``oldest_ts`` and ``check_point_ts``
        (from the first peer that answers), or None."""
        for peer in self._order(sr):
            try:
                d = self.http.post(peer, "StoreService/query_binlog",
                                   {"op_type": "OP_QUERY_BINLOG", "region_id": sr.region_id,
                                    "region_version": sr.version})
            except (PeerFailure, FatalSourceError):
                continue
            if _errcode(d) == "SUCCESS" and isinstance(d.get("binlog_info"), dict):
                return d["binlog_info"]
            if _errcode(d) == "NOT_LEADER" and isinstance(d.get("leader"), str) and d["leader"] != NO_LEADER:
                sr.leader = d["leader"]
        return None

    def oldest_ts(self, sr: StoreRegionInfo) -> int:
        """Where ``start=earliest`` begins: the newest ``oldest_ts`` any peer reports
        (a follower may still hold binlog its leader has purged; reading from the
        leader's oldest is what is safe)."""
        found: list[int] = []
        errors: list[str] = []
        for peer in self._order(sr):
            try:
                d = self.http.post(peer, "StoreService/query_binlog",
                                   {"op_type": "OP_QUERY_BINLOG", "region_id": sr.region_id,
                                    "region_version": sr.version})
            except (PeerFailure, FatalSourceError) as exc:
                errors.append(str(exc))
                continue
            code = _errcode(d)
            info = d.get("binlog_info")
            if code == "SUCCESS" and isinstance(info, dict) and isinstance(info.get("oldest_ts"), int) \
                    and info["oldest_ts"] > 0:
                found.append(int(info["oldest_ts"]))
            elif code == "UNSUPPORT_REQ_TYPE":
                raise FatalSourceError(
                    f"{self.where}: store {peer} does not know OP_QUERY_BINLOG (an older BaikalDB), so "
                    "start=earliest cannot find the oldest binlog of region "
                    f"{sr.region_id}; set start to a BaikalDB TSO, a UTC time (YYYY-MM-DD HH:MM:SS) or latest")
            else:
                errors.append(f"{peer}: {code or 'no errcode'}")
        if not found:
            raise SourceError(f"{self.where}: binlog region {sr.region_id}: no peer answered OP_QUERY_BINLOG with "
                              "its oldest_ts (needed for start=earliest): " + "; ".join(errors))
        return max(found)

    def _purged_message(self, sr: StoreRegionInfo, binlog_ts: int, who: str) -> str:
        info = self.query_binlog(sr)
        oldest = ""
        if info and isinstance(info.get("oldest_ts"), int):
            oldest = f"; the oldest binlog it still holds is at TSO {describe(int(info['oldest_ts']))}"
        return (f"{self.where}: binlog region {sr.region_id} (partition {sr.partition_id}) no longer holds "
                f"the binlog after TSO {describe(binlog_ts)} (LESS_THAN_OLDEST_TS from {who}: it was "
                f"purged){oldest}. Changes in between are lost for this capturer; nothing was skipped. "
                "To recover: re-seed the destinations from the source tables, then restart reading from a "
                "position the store still holds: stop the capturer, remove this region from the checkpoint "
                "file's \"regions\" (or delete the checkpoint), set start=earliest (or a later TSO) in its "
                "[region:...] section, and start again.")

    def close(self) -> None:
        self.http.close()
