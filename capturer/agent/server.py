"""The region agent: serves the regions of its config to capturers over gRPC.

Each ``Stream`` call is one *session*: the capturer subscribes to one region with
the resume point from its checkpoint, and the agent runs a fresh region there
(the same region code the capturer runs in-process) and streams its items in
batches. A new subscription to a region that is being served replaces the old
session (the capturer reconnected; two binlog dumps with one server_id would
push each other off). The agent keeps no position of its own: when the capturer
goes away the region stops, and it starts again where the next subscription says.

Ordering inside a session: lifts of commit_ts, floors (a snapshot chunk's
commit_ts at its point of the stream) and a pinned start position are recorded
by the region *before* it queues the items they concern, and a batch carries
every lift, floor and pin recorded by the time its items were taken, so the
capturer journals them before it passes the items on.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, NoReturn, Protocol

from capturer.agent.config import AgentConfig
from capturer.errors import CheckpointError, ConfigError, SourceError
from capturer.model import Item, LsnPosition, Position, protogen, wire
from capturer.pipeline.filter import Filter, parse_filter_text
from capturer.regions import make_region
from capturer.regions.base import Region, RegionContext
from capturer.regions.clock import FLOOR, LiftJournal
from capturer.util.bqueue import WeightedQueue

log = logging.getLogger(__name__)


class _CallContext(Protocol):
    """What the handlers use of a grpc.ServicerContext (grpc has no type stubs)."""

    def peer(self) -> str: ...

    def abort(self, code: Any, details: str) -> NoReturn:
        """Ends the call with ``code``: raises, never returns."""
        ...


SERVICE = "capturer.agent.RegionAgent"
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]
BATCH_WEIGHT = 5000  # rows taken from the region's queue at once


class RelayJournal(LiftJournal):
    """A lift journal in memory, preloaded with the capturer's entries for the
    region (its lifts and its floors); every new lift and every floor set (a
    snapshot chunk's, ``RegionClock.extra``; a settled reservation) is also queued
    for the capturer, which journals it durably before the items after it go on.
    A floor kept only here would be gone with a capturer killed -9: the replay
    would stamp what the first run never delivered below a chunk a sender holds,
    and that sender would skip it as held."""

    def __init__(self, region: str, entries: list[Any], floors: list[Any] | None = None):
        super().__init__(None)
        self.region = region
        for file, pos, ts in entries:
            self._entries[(region, str(file), int(pos))] = int(ts)
        for file, pos, ts in floors or ():
            self._entries[(region + FLOOR, str(file), int(pos))] = int(ts)
        self.pending: list[list[Any]] = []
        self.pending_floors: list[list[Any]] = []

    def record(self, region: str, pos: Position | LsnPosition, commit_ts: int,
               floors: list[tuple[tuple[str, int], int]] | None = None) -> None:
        if floors:
            self.set_floors(region, floors)
        with self._lock:
            file, at = pos.lift_key()
            if self._entries.get((region, file, at)) == commit_ts:
                return
            self._entries[(region, file, at)] = commit_ts
            self.pending.append([file, at, commit_ts])

    def put(self, key: tuple[str, str, int], value: int) -> bool:
        with self._lock:
            changed = self._entries.get(key) != value
            self._entries[key] = value
            if changed and key[0].endswith(FLOOR):
                self.pending_floors.append([key[1], key[2], value])
            return changed

    def put_many(self, pairs: Iterable[tuple[tuple[str, str, int], int]]) -> int:
        return sum(self.put(k, v) for k, v in pairs)

    def take(self) -> tuple[list[list[Any]], list[list[Any]]]:
        """(lifts, floors) recorded since the last take, each in the order set."""
        with self._lock:
            out, floors = self.pending, self.pending_floors
            self.pending, self.pending_floors = [], []
            return out, floors

    def waiting(self) -> bool:
        return bool(self.pending or self.pending_floors)


class Session:
    """One capturer's subscription to one region."""

    def __init__(self, agent: Agent, rcfg: Any, sub: Any, peer: str):
        self.agent = agent
        self.name = rcfg.name
        self.peer = peer
        self.capturer = sub.capturer
        self.stop = threading.Event()
        self.done = threading.Event()
        self.out: WeightedQueue[Item] = WeightedQueue(agent.cfg.queue_rows)
        try:
            start = wire.read_position(wire.unpackb(sub.position)) if sub.position else None
            lifts = wire.unpackb(sub.lifts) if sub.lifts else []
            floors = wire.unpackb(sub.floors) if sub.floors else []
        except (wire.WireError, ValueError) as exc:
            raise ValueError(f"bad subscription: {exc}") from None
        self.journal = RelayJournal(rcfg.name, lifts, floors)
        flt = parse_filter_text(sub.filter_rules, Path(sub.filter_source or "<the capturer's filter rules>")) \
            if sub.filter_rules else Filter.empty()
        self._pin: Any = None
        self._pin_lock = threading.Lock()
        self._ask: list[bytes] = []  # questions not sent yet (snapshot workers may ask at once)
        self._asks = 0
        self._answers: dict[int, Any] = {}
        self._answered = threading.Condition(self._pin_lock)
        agent.cfg.state_dir.mkdir(parents=True, exist_ok=True)
        ctx = RegionContext(self.out, start, int(sub.floor), self.journal, self.stop, agent.cfg.spill_rows,
                            agent.cfg.spill_dir, agent.cfg.state_path or agent.cfg.state_dir / "agent",
                            flt.table_selected, self._pin_start,
                            self._tables_elsewhere, promised=int(sub.promised))
        self.region: Region = make_region(rcfg, ctx)
        self.start = start

    def _pin_start(self, region: str, position: Any) -> None:
        with self._pin_lock:
            self._pin = position

    def _tables_elsewhere(self, region: str, tables: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
        """Asked by the region before a copy empties tables downstream: the capturer
        knows the other regions (the batch's ``ask``; the answer comes as a Request)."""
        with self._pin_lock:
            self._asks += 1
            ask_id = self._asks
            self._ask.append(wire.packb([ask_id, [list(t) for t in tables]]))
            deadline = time.monotonic() + 120
            while ask_id not in self._answers:
                if self.stop.is_set() or time.monotonic() > deadline:
                    raise SourceError(f"region {self.name}: the capturer did not say which other regions deliver "
                                      f"{', '.join(f'{d}.{t}' for d, t in tables)}")
                self._answered.wait(0.2)
            answer = self._answers.pop(ask_id)
        if isinstance(answer, str):
            raise SourceError(f"region {self.name}: the capturer could not tell which other regions deliver "
                              f"{', '.join(f'{d}.{t}' for d, t in tables)}: {answer}")
        return {(str(db), str(t)): [str(r) for r in regions] for db, t, regions in answer}

    def _answer(self, a: Any) -> None:
        try:
            value: Any = a.error if a.error else wire.unpackb(a.tables)
        except (wire.WireError, ValueError) as exc:
            value = f"bad answer: {exc}"
        with self._pin_lock:
            self._answers[int(a.id)] = value
            self._answered.notify_all()

    def _take_ask(self) -> bytes:
        with self._pin_lock:
            return self._ask.pop(0) if self._ask else b""

    def _take_pin(self) -> bytes:
        with self._pin_lock:
            p, self._pin = self._pin, None
        return wire.packb(wire.position_json(p)) if p is not None else b""

    def _read_requests(self, requests: Iterator[Any]) -> None:
        try:
            for req in requests:
                if req.HasField("answer"):
                    self._answer(req.answer)
                elif req.HasField("checkpointed"):
                    try:
                        pos = wire.read_position(wire.unpackb(req.checkpointed.position))
                    except (wire.WireError, ValueError) as exc:
                        log.warning("region %s: ignoring a bad checkpoint notice: %s", self.name, exc)
                        continue
                    self.region.checkpointed(pos)
        except Exception as exc:
            log.debug("region %s: request stream ended: %s", self.name, exc)
        finally:
            self.stop.set()

    def run(self, requests: Iterator[Any], context: Any, pb: Any) -> Iterator[Any]:
        enc = wire.Encoder()
        interval = self.agent.cfg.status_interval
        reader = threading.Thread(target=self._read_requests, args=(requests,), name=f"agent-{self.name}-requests",
                                  daemon=True)
        reader.start()
        self.region.start()
        log.info("region %s: serving %s from %s", self.name, self.peer,
                 self.start if self.start is not None else "its start setting (no checkpoint yet)")
        last_status = 0.0
        try:
            while not self.stop.is_set() and context.is_active():
                items = self.out.get_many(BATCH_WEIGHT, timeout=0.2)
                pieces: list[bytes] = []
                size = rows = 0
                for item in items:
                    for piece, n in enc.item(item):
                        pieces.append(piece)
                        size += len(piece)
                        rows += n
                        if size >= wire.BATCH_BYTES:
                            yield self._batch(pb, pieces, rows, False)
                            pieces, size, rows = [], 0, 0
                now = time.monotonic()
                status = now - last_status >= interval
                if pieces or status or self.journal.waiting() or self._pin is not None or self._ask:
                    yield self._batch(pb, pieces, rows, status)
                    if status:
                        last_status = now
                if self.region.error is not None and len(self.out) == 0:
                    log.error("region %s failed: %s", self.name, self.region.last_error or self.region.error)
                    yield pb.Batch(fatal=self.region.last_error or str(self.region.error),
                                   status=self._status())
                    return
                if self.region.state == "stopped" and len(self.out) == 0 and not self.stop.is_set():
                    return
        finally:
            self.stop.set()
            self.region.stop()
            self.region.join(15)
            self.done.set()
            log.info("region %s: session of %s ended", self.name, self.peer)

    def _status(self) -> bytes:
        try:
            return wire.packb(self.region.status())
        except (TypeError, ValueError):
            return b""

    def _batch(self, pb: Any, pieces: list[bytes], rows: int, status: bool) -> Any:
        lifts, floors = self.journal.take()
        return pb.Batch(lifts=wire.packb(lifts) if lifts else b"", floors=wire.packb(floors) if floors else b"",
                        pin=self._take_pin(), items=b"".join(pieces),
                        rows=rows, status=self._status() if status else b"", ask=self._take_ask())


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.regions = {r.name: r for r in cfg.regions}
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._region_locks = {name: threading.Lock() for name in self.regions}
        self.server: Any = None
        self.port = 0

    def start(self) -> None:
        import grpc


        pb = protogen.load("agent")
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Stream": grpc.stream_stream_rpc_method_handler(
                lambda req, ctx: self._stream(req, ctx, pb),
                request_deserializer=pb.Request.FromString, response_serializer=pb.Batch.SerializeToString),
            "Tables": grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: self._tables(req, ctx, pb),
                request_deserializer=pb.TablesRequest.FromString,
                response_serializer=pb.TablesReply.SerializeToString),
        })
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2 * len(self.regions) + 8,
                                                              thread_name_prefix="agent-rpc"),
                                  options=SERVER_OPTIONS)
        self.server.add_generic_rpc_handlers((handler,))
        if self.cfg.tls_cert:
            def read(p: str) -> bytes:
                return Path(p).read_bytes()

            creds = grpc.ssl_server_credentials(
                [(read(self.cfg.tls_key), read(self.cfg.tls_cert))],
                root_certificates=read(self.cfg.tls_client_ca) if self.cfg.tls_client_ca else None,
                require_client_auth=bool(self.cfg.tls_client_ca))
            self.port = self.server.add_secure_port(self.cfg.listen, creds)
        else:
            self.port = self.server.add_insecure_port(self.cfg.listen)
        if not self.cfg.listen.startswith("unix:") and self.port == 0:
            raise OSError(f"{self.cfg.path}: [agent] listen = {self.cfg.listen}: cannot bind (in use?)")
        self.server.start()
        host = self.cfg.listen.rsplit(":", 1)[0]
        if not self.cfg.listen.startswith("unix:") and host not in ("127.0.0.1", "localhost", "[::1]") \
                and not (self.cfg.token and self.cfg.tls_cert):
            log.warning("serving on %s without %s: anyone who reaches this port can read the regions' data",
                        self.cfg.listen, "a token and TLS" if not self.cfg.token else "TLS")
        log.info("agent serving %s on %s", ", ".join(self.regions), self.address)

    @property
    def address(self) -> str:
        if self.cfg.listen.startswith("unix:"):
            return self.cfg.listen
        return f"{self.cfg.listen.rsplit(':', 1)[0]}:{self.port}"

    def stop(self, grace: float = 5.0) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            s.stop.set()
        if self.server is not None:
            self.server.stop(grace).wait(grace + 1)
        for s in sessions:
            s.done.wait(15)

    def _authorized(self, context: Any) -> bool:
        if not self.cfg.token:
            return True
        got = dict(context.invocation_metadata()).get("authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {self.cfg.token}".encode())

    def _tables(self, req: Any, context: _CallContext, pb: Any) -> Any:
        import grpc

        if not self._authorized(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token (the region's token=)")
        rcfg = self.regions.get(req.region)
        if rcfg is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"this agent ({self.cfg.path}) serves no region {req.region!r}; "
                                                     f"it serves: {', '.join(sorted(self.regions))}")
        try:
            tables = [(str(db), str(t)) for db, t in wire.unpackb(req.tables)]
            flt = parse_filter_text(req.filter_rules, Path(req.filter_source or "<the capturer's filter rules>")) \
                if req.filter_rules else Filter.empty()
        except (wire.WireError, ValueError, TypeError, ConfigError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc}")
        ctx = RegionContext(WeightedQueue(1), None, 0, LiftJournal(None), threading.Event(),
                            table_selected=flt.table_selected)
        region = make_region(rcfg, ctx)
        info = getattr(region, "tables_info", None)
        if info is None:
            return pb.TablesReply(tables=wire.packb([]))
        try:
            found = info(tables)
        except SourceError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return pb.TablesReply(tables=wire.packb([[db, t, keyless] for (db, t), keyless in found.items()]))

    def _stream(self, requests: Iterator[Any], context: _CallContext, pb: Any) -> Iterator[Any]:
        import grpc

        peer = context.peer()
        if not self._authorized(context):
            log.warning("refused %s: missing or wrong token", peer)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token (the region's token=)")
        first = next(requests, None)
        if first is None or not first.HasField("subscribe"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Subscribe")
        sub = first.subscribe
        if sub.protocol != wire.PROTOCOL:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"protocol {sub.protocol} (capturer) != {wire.PROTOCOL} (agent): run the same version")
        rcfg = self.regions.get(sub.region)
        if rcfg is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"this agent ({self.cfg.path}) serves no region {sub.region!r}; "
                                                     f"it serves: {', '.join(sorted(self.regions))}")
        lock = self._region_locks[rcfg.name]
        with lock:  # one session per region: a new subscription replaces the old one
            with self._lock:
                old = self._sessions.get(rcfg.name)
            if old is not None and old.capturer != sub.capturer and not old.done.is_set():
                # two capturers on one agent region would push each other off in turn
                log.warning("region %s: refused %s (%s): it is read by %s (%s)", rcfg.name, sub.capturer, peer,
                            old.capturer, old.peer)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"region {rcfg.name} of this agent is being read by another capturer ({old.capturer}, "
                              f"{old.peer}); an agent region serves one capturer at a time")
            if old is not None:
                log.info("region %s: %s subscribes again; ending the session of %s", rcfg.name, peer, old.peer)
                old.stop.set()
                old.done.wait(20)
            try:
                session = Session(self, rcfg, sub, peer)
            except (ValueError, CheckpointError, ConfigError) as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"region {rcfg.name}: {exc}")
            with self._lock:
                self._sessions[rcfg.name] = session
        try:
            yield from session.run(requests, context, pb)
        finally:
            session.done.set()  # also when the call ended before the session ran
            with self._lock:
                if self._sessions.get(rcfg.name) is session:
                    del self._sessions[rcfg.name]
