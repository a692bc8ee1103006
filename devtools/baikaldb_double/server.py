"""Meta and store servers of the BaikalDB double: real HTTP servers on
127.0.0.1, speaking brpc's HTTP+JSON rules (shared/reference/baikaldb-protocol.md §2)
and answering like BaikalDB's ``MetaService`` and ``StoreService.query_binlog``
(§4, §5), with fault injection (§13).
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from capturer.regions.baikaldb import brpc_json

from .cluster import Cluster, Region, pb

NO_LEADER = "0.0.0.0:0"
FOLLOWER_OK = {"OP_READ_BINLOG", "OP_QUERY_BINLOG", "OP_RECOVER_BINLOG", "OP_QUERY_OFFLINE_BINLOG"}


from devtools.local_mariadb import free_port


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (kill -9 of the capturer) is not news


class _Server:
    """One brpc-like HTTP server; ``handle(service, method, body) -> dict``."""

    def __init__(self, port: int, handle: Callable[[str, str, dict[str, Any]], dict[str, Any]], name: str):
        self.port = port
        self.name = name
        self.addr = f"127.0.0.1:{port}"
        self.handle = handle
        self.httpd: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.conns: set[Any] = set()
        self.malformed = 0  # the next N answers are not JSON
        self.delay = 0.0
        self.requests = 0

    def start(self) -> _Server:
        srv = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with srv.lock:
                    srv.conns.add(self.connection)

            def finish(self) -> None:
                with srv.lock:
                    srv.conns.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def log_message(self, *a: Any) -> None:
                pass

            def _reply(self, code: int, body: bytes, ctype: str, errno: int = 0) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                if errno:
                    self.send_header("x-bd-error-code", str(errno))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                srv.requests += 1
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if len(parts) != 2:
                    self._reply(404, f"Fail to find method on `{self.path}'".encode(), "text/plain", 1002)
                    return
                service = parts[0].rsplit(".", 1)[-1]  # /baikaldb.pb.StoreService/... resolves too
                ctype = self.headers.get("Content-Type", "")
                if ctype.startswith(("application/proto", "application/x-protobuf")):
                    self._reply(400, b"the double speaks brpc JSON only", "text/plain", 1003)
                    return
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError as exc:
                    self._reply(400, f"Fail to parse JSON: {exc}".encode(), "text/plain", 1003)
                    return
                if srv.delay:
                    time.sleep(srv.delay)
                try:
                    out = srv.handle(service, parts[1], body)
                except KeyError as exc:
                    self._reply(404, f"Fail to find method on `{self.path}' ({exc})".encode(), "text/plain", 1002)
                    return
                except brpc_json.JsonPbError as exc:
                    self._reply(400, str(exc).encode(), "text/plain", 1003)
                    return
                except Exception as exc:
                    self._reply(500, f"{type(exc).__name__}: {exc}".encode(), "text/plain", 2001)
                    return
                if srv.malformed > 0:
                    srv.malformed -= 1
                    self._reply(200, b'{"errcode": "SUCC', "application/json")
                    return
                self._reply(200, json.dumps(out).encode(), "application/json")

        self.httpd = _QuietServer(("127.0.0.1", self.port), H)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name=self.name)
        self.thread.start()
        return self

    def stop(self) -> None:
        """Refuse connections from now on (the peer is down)."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
            with self.lock:
                conns, self.conns = list(self.conns), set()
            for conn in conns:  # kept-alive connections die with the peer
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @property
    def up(self) -> bool:
        return self.httpd is not None


class BaikalDouble:
    """A cluster served by ``n_meta`` meta servers and ``n_stores`` stores.

    Fault switches: ``store(i).stop()/start()`` (refused peer), ``.malformed = N``,
    ``cluster.regions[rid].leader = ...`` (leader change), ``.leader_unknown``,
    ``.lag[peer] = ts`` (a lagging leader or follower), ``.follower_reads = False``,
    ``.meta_leader`` (stale leader in RegionInfo), ``cluster.purge(...)``,
    ``Txn.prewrite()`` without commit (held check point), ``region.version += 1``
    (VERSION_OLD), ``cluster.meta_init = False`` (HAVE_NOT_INIT), ``region.peer_oldest[peer] = ts``
    (a new peer whose binlog starts late), ``freeze_meta(i)`` (a meta peer that lags: it keeps
    answering QUERY_SCHEMA with the schemas of now), ``legacy_scan = True`` (a store before
    master: the scan includes a FAKE at ``binlog_ts`` itself, and OP_QUERY_BINLOG is unknown)."""

    def __init__(self, n_stores: int = 3, n_meta: int = 2, seed: int = 1, fake_ms: int = 200):
        self.cluster = Cluster(seed)
        self.stores = [_Server(free_port(), self._store_handler(i), f"store-{i}") for i in range(n_stores)]
        self.metas = [_Server(free_port(), self._meta_handler(i), f"meta-{i}") for i in range(n_meta)]
        self.cluster.stores = [s.addr for s in self.stores]
        self.cluster.meta_peers = [m.addr for m in self.metas]
        self.cluster.meta_leader = self.metas[0].addr
        self.fake_ms = fake_ms
        self._stop = threading.Event()
        self._faker: threading.Thread | None = None
        self.fakes_paused: set[int] = set()
        self.legacy_scan = False
        self.frozen_meta: dict[int, list[dict[str, Any]]] = {}  # meta index -> QUERY_SCHEMA infos it serves

    @property
    def meta_servers(self) -> str:
        return ",".join(m.addr for m in self.metas)

    def start(self) -> BaikalDouble:
        for s in self.stores + self.metas:
            s.start()
        if self.fake_ms:
            self._faker = threading.Thread(target=self._fakes, daemon=True, name="baikal-fakes")
            self._faker.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for s in self.stores + self.metas:
            s.stop()

    def freeze_meta(self, i: int) -> None:
        """Meta peer ``i`` keeps answering QUERY_SCHEMA with today's schemas (it lags)."""
        P = pb()
        self.frozen_meta[i] = self._query(P.QueryRequest(op_type=P.QUERY_SCHEMA))["schema_infos"]

    def restart_store(self, i: int) -> None:
        s = self.stores[i]
        if not s.up:
            s.start()

    def _fakes(self) -> None:
        while not self._stop.wait(self.fake_ms / 1000):
            with self.cluster.lock:
                rids = [rid for rid in self.cluster.regions if rid not in self.fakes_paused]
            self.cluster.fake(rids)

    # --- store ---------------------------------------------------------------------------
    def _store_handler(self, i: int) -> Callable[[str, str, dict[str, Any]], dict[str, Any]]:
        def handle(service: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
            if service != "StoreService" or method != "query_binlog":
                raise KeyError(f"{service}/{method}")
            P = pb()
            req = brpc_json.from_json(body, P.StoreReq())
            return self.query_binlog(self.stores[i].addr, req)

        return handle

    def query_binlog(self, me: str, req: Any) -> dict[str, Any]:
        """``Store::query_binlog`` + ``Region::query_binlog`` (§5), step by step."""
        P = pb()
        c = self.cluster
        res = P.StoreRes(errcode=P.SUCCESS)
        op = P.OpType.Name(req.op_type)
        with c.lock:
            r = c.regions.get(req.region_id)
            # 1. not on this store
            if r is None or me not in r.peers:
                res.errcode = P.REGION_NOT_EXIST
                res.errmsg = b"region_id not exist in store"
                return brpc_json.to_json(res)
            leader = NO_LEADER if r.leader_unknown else r.leader
            is_leader = (me == r.leader) and not r.leader_unknown
            # 2. a follower that may not serve this op
            if not is_leader and (op not in FOLLOWER_OK or not r.follower_reads or r.leader_unknown):
                res.errcode = P.NOT_LEADER
                res.errmsg = b"not leader"
                res.leader = leader
                return brpc_json.to_json(res)
            # 3. leader is set from here on
            res.leader = leader
            version = r.peer_version.get(me, r.version)
            # 4. stale version
            if req.region_version < version:
                res.errcode = P.VERSION_OLD
                res.errmsg = b"region version too old"
                bt = c.binlogs[r.table_id]
                for x in [r] + [c.regions[a] for a in r.announce]:
                    brpc_json.from_json(x.info(bt.name, bt.partitions), res.regions.add())
                return brpc_json.to_json(res)
            if op == "OP_QUERY_BINLOG" and not self.legacy_scan:
                bi = res.binlog_info
                bi.region_id, bi.oldest_ts, bi.check_point_ts = r.region_id, r.oldest_ts, self._check_point(r, me)
                bi.region_oldest_ts = bi.binlog_cf_oldest_ts = bi.data_cf_oldest_ts = r.oldest_ts
                return brpc_json.to_json(res)
            if op != "OP_READ_BINLOG":
                res.errcode = P.UNSUPPORT_REQ_TYPE
                res.errmsg = b"unsupport op_type"
                return brpc_json.to_json(res)
            # 5. a follower behind the requested version
            if req.region_version > version:
                res.errcode = P.NOT_LEADER
                res.errmsg = b"not leader"
                return brpc_json.to_json(res)
            begin = req.binlog_desc.binlog_ts
            cp = self._check_point(r, me)
            # 7.
            if begin == 0 or cp < 0:
                res.errcode = P.GET_VALUE_FAIL
                res.errmsg = b"get binlog check point ts"
                return brpc_json.to_json(res)
            # 8.
            oldest = max(r.oldest_ts, r.peer_oldest.get(me, 0))
            if begin < oldest:
                res.errcode = P.LESS_THAN_OLDEST_TS
                res.errmsg = b"begin ts gt oldest ts"
                return brpc_json.to_json(res)
            # 9.
            if begin >= cp:
                res.errmsg = b"begin_ts >= check_point_ts"
                return brpc_json.to_json(res)
            # 10. ascending scan from begin (exclusive) up to the check point
            remaining = req.binlog_desc.read_binlog_cnt if req.binlog_desc.HasField("read_binlog_cnt") else 1000
            lo = _first_after(r, begin - 1 if self.legacy_scan else begin)
            for rec in r.records[lo:]:
                if rec.ts > cp:
                    break
                if rec.ts == begin and not rec.fake:
                    continue
                if rec.fake:
                    fake = P.StoreReq(op_type=P.OP_FAKE_BINLOG, region_id=r.region_id, region_version=1)
                    fake.binlog_desc.binlog_ts = rec.ts
                    fake.binlog.type, fake.binlog.start_ts, fake.binlog.commit_ts = P.FAKE, rec.ts, rec.ts
                    res.binlogs.append(fake.SerializeToString())
                    res.commit_ts.append(rec.ts)
                    continue
                if rec.start_ts < oldest:
                    res.Clear()
                    res.errcode = P.LESS_THAN_OLDEST_TS
                    res.errmsg = b"start ts gt oldest ts"
                    res.leader = leader
                    return brpc_json.to_json(res)
                if remaining < 0:
                    break
                remaining -= max(1, rec.row_cnt)
                res.binlogs.append(r.prewrites[rec.start_ts])
                res.commit_ts.append(rec.ts)
            res.errmsg = b"read binlog success"
            return brpc_json.to_json(res)

    def _check_point(self, r: Region, me: str) -> int:
        """What ``me`` may serve: the region's check point, or less on a peer that lags."""
        cp = r.check_point()
        lag = r.lag.get(me)
        return cp if lag is None else min(cp, lag)

    # --- meta ----------------------------------------------------------------------------
    def _meta_handler(self, i: int) -> Callable[[str, str, dict[str, Any]], dict[str, Any]]:
        def handle(service: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
            if service != "MetaService":
                raise KeyError(f"{service}/{method}")
            me = self.metas[i].addr
            P = pb()
            if method == "raft_control":
                req = brpc_json.from_json(body, P.RaftControlRequest())
                if req.op_type != P.GetLeader:
                    return {"region_id": req.region_id, "errcode": "UNSUPPORT_REQ_TYPE", "errmsg": "unsupported"}
                return {"region_id": req.region_id, "errcode": "SUCCESS", "leader": self.cluster.meta_leader}
            if method == "query":
                req = brpc_json.from_json(body, P.QueryRequest())
                if i in self.frozen_meta and req.op_type == P.QUERY_SCHEMA and not req.table_name:
                    return {"errcode": "SUCCESS", "errmsg": "success", "schema_infos": self.frozen_meta[i]}
                return self._query(req)
            if method == "tso_service":
                req = brpc_json.from_json(body, P.TsoRequest())
                if me != self.cluster.meta_leader:
                    return {"op_type": "OP_GEN_TSO", "errcode": "NOT_LEADER", "leader": self.cluster.meta_leader}
                with self.cluster.lock:
                    ts = self.cluster.tso.alloc(max(1, req.count))
                return {"op_type": "OP_GEN_TSO", "errcode": "SUCCESS", "count": max(1, req.count),
                        "start_timestamp": {"physical": ts >> 18, "logical": ts & ((1 << 18) - 1)}}
            raise KeyError(f"{service}/{method}")

        return handle

    def _query(self, req: Any) -> dict[str, Any]:
        c = self.cluster
        P = pb()
        if not c.meta_init:
            return {"errcode": "HAVE_NOT_INIT", "errmsg": "have not init"}
        with c.lock:
            if req.op_type == P.QUERY_SCHEMA:
                infos = [t.schema_info() for t in c.tables.values()]
                for bt in c.binlogs.values():
                    targets = [t.table_id for t in c.tables.values() if t.binlog_table_id == bt.table_id]
                    infos.append(bt.schema_info(targets))
                if req.table_name:
                    infos = [s for s in infos if (s["namespace_name"], s["database"], s["table_name"])
                             == (req.namespace_name, req.database, req.table_name)]
                    if not infos:
                        return {"errcode": "INPUT_PARAM_ERROR", "errmsg": "table not exist"}
                    tid = infos[0]["table_id"]
                    regions = [r.info(bt.name, bt.partitions) for bt in c.binlogs.values() for r in bt.regions
                               if r.table_id == tid]
                    return {"errcode": "SUCCESS", "errmsg": "success", "schema_infos": infos,
                            **({"region_infos": regions} if regions else {})}
                if req.database:
                    infos = [s for s in infos if (s["namespace_name"], s["database"])
                             == (req.namespace_name, req.database)]
                return {"errcode": "SUCCESS", "errmsg": "success", "schema_infos": infos}
            if req.op_type == P.QUERY_REGION:
                all_regions = [(bt, r) for bt in c.binlogs.values() for r in bt.regions]
                if req.region_ids:
                    found = [r.info(bt.name, bt.partitions) for bt, r in all_regions if r.region_id in req.region_ids]
                    out: dict[str, Any] = {"errcode": "SUCCESS", "errmsg": "success"}
                    if len(found) < len(set(req.region_ids)):
                        out = {"errcode": "REGION_NOT_EXIST", "errmsg": "region info not exist"}
                    if found:
                        out["region_infos"] = found
                    return out
                found = [r.info(bt.name, bt.partitions) for bt, r in all_regions
                         if not req.table_id or r.table_id == req.table_id]
                return {"errcode": "SUCCESS", "errmsg": "success", **({"region_infos": found} if found else {})}
            return {"errcode": "UNSUPPORT_REQ_TYPE", "errmsg": "unsupported query"}


def _first_after(r: Region, ts: int) -> int:
    """Index of the first record with ts > ``ts`` (records are sorted)."""
    lo, hi = 0, len(r.records)
    while lo < hi:
        mid = (lo + hi) // 2
        if r.records[mid].ts <= ts:
            lo = mid + 1
        else:
            hi = mid
    return lo


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
