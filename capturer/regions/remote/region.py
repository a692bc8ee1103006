"""``type = remote``: a region that a region agent runs next to its source
(``python -m capturer.agent``) and serves over gRPC (``proto/agent.proto``).

The capturer stays the only keeper of durable state. Each connection subscribes
with what this region already passed on: the position of its last item, the
commit_ts of its last transaction (the agent's clock goes on above it, so any
lift is journaled) and its newest heartbeat (nothing may come at or below it); on
a first connection, the checkpoint's. The agent starts a fresh region there. Lifts of commit_ts (``capturer/regions/clock.py``)
that the agent's region makes are sent ahead of the transaction and journaled here
before it goes on; a start position the region pins is written to the checkpoint
here. As the checkpoint moves the agent is told, so it can drop state older than it.

A dropped connection, an agent killed or moved to another address (``address``
lists several; each failure tries the next) is a reconnect from the last item
passed on: nothing lost, nothing repeated. A region the agent reports failed, a
wrong token or an unknown region name stop the capturer with that error.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model import Heartbeat, Item, Position, Txn, protogen, wire
from capturer.model.wire import position_json
from capturer.regions.base import Region, RegionContext

log = logging.getLogger(__name__)

METHOD = "/capturer.agent.RegionAgent/Stream"
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # reconnect attempts are this module's job (it rotates addresses)
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_FATAL_CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND", "FAILED_PRECONDITION", "INVALID_ARGUMENT",
                "UNIMPLEMENTED")


def _read_pem(path: str, key: str, where: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise FatalSourceError(f"{where}: {key} = {path}: {exc.strerror or exc}") from None


def channel_credentials(cfg: Any, where: str) -> Any:
    import grpc

    ca = _read_pem(cfg.tls_ca, "tls_ca", where) if cfg.tls_ca else None
    cert = _read_pem(cfg.tls_cert, "tls_cert", where) if cfg.tls_cert else None
    key = _read_pem(cfg.tls_key, "tls_key", where) if cfg.tls_key else None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


class RemoteRegion(Region):
    RETRYABLE = (SourceError, OSError)

    def __init__(self, cfg: Any, ctx: RegionContext):
        super().__init__(cfg.name, ctx)
        self.cfg = cfg
        self.where = f"region {cfg.name} (agent {','.join(cfg.address)}, region {cfg.remote_name})"
        self._addr_index = 0
        self.address = cfg.address[0]
        # a reconnect resumes the agent's clock as a local region's goes on: from the last transaction
        # passed on (above it every lift is journaled) and the newest heartbeat (nothing at or below it)
        self.last_txn_ts = ctx.floor
        self.promised = ctx.floor
        self._in_put = False
        self._last_recv = time.monotonic()
        self._pos_json: Any = None
        self.agent_status: dict[str, Any] = {}
        self.agent_status_at = 0.0
        self.batches = 0
        self.bytes = 0
        self.connected_since = 0.0
        self._requests: queue.Queue[Any] | None = None
        self._call: Any = None
        self._lock = threading.Lock()
        # who reads: a capturer started again is the same reader; another capturer is not
        import socket

        where_cp = str(ctx.state_path.resolve()) if ctx.state_path is not None else "?"
        self.identity = f"{socket.gethostname()}:{where_cp}:{cfg.name}"
        host = cfg.address[0].rsplit(":", 1)[0]
        if cfg.token and not cfg.uses_tls and any(a.rsplit(":", 1)[0] not in ("127.0.0.1", "localhost", "[::1]")
                                                  for a in cfg.address):
            log.warning("%s: the token goes to %s in clear text (no TLS): set tls_ca (or tls=true)", self.where, host)
        self._filter_rules = ("", "")
        self._resubscribe = threading.Event()  # set by a filter reload: the watchdog ends the stream
        path = ctx.filter_path
        if path is not None:  # the rules travel as text: the agent's region copies only selected tables
            try:
                self._filter_rules = (Path(path).read_text(encoding="utf-8"), str(path))
            except OSError as exc:
                raise FatalSourceError(f"{self.where}: cannot read the filter rules {path}: {exc}") from None

    def filter_reloaded(self, path: Path, text: str | None = None) -> None:
        """The capturer re-read its filter rules (``text``, as it read them; None: read
        ``path``): subscribe again with them (the agent's region selects tables with
        them: what it snapshots, and a PostgreSQL region the tables it reads). The new
        stream resumes at this region's position."""
        if text is None:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as exc:  # the capturer has just read it: keep the rules it has
                log.warning("%s: cannot read the reloaded filter rules %s: %s", self.where, path, exc)
                return
        self._filter_rules = (text, str(path))
        self._resubscribe.set()

    # --- one attempt ----------------------------------------------------------
    def _connect_and_stream(self) -> None:
        import grpc

        pb = protogen.load("agent")
        self.address = self.cfg.address[self._addr_index % len(self.cfg.address)]
        where = f"region {self.name} (agent {self.address})"
        channel = self._channel(self.address, where)
        try:
            try:
                grpc.channel_ready_future(channel).result(timeout=self.cfg.connect_timeout)
            except grpc.FutureTimeoutError:
                self._addr_index += 1
                raise SourceError(f"{where}: not reachable within {self.cfg.connect_timeout:g}s") from None
            self._stream(channel, pb, wire, where)
        finally:
            channel.close()

    def _channel(self, address: str, where: str) -> Any:
        import grpc

        if self.cfg.uses_tls:
            opts = list(CHANNEL_OPTIONS)
            if self.cfg.tls_server_name:
                opts.append(("grpc.ssl_target_name_override", self.cfg.tls_server_name))
            return grpc.secure_channel(address, channel_credentials(self.cfg, where), options=opts)
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.cfg.token}"),) if self.cfg.token else ()

    def tables_info(self, tables: list[tuple[str, str]]) -> dict[tuple[str, str], bool]:
        """Which of ``tables`` the agent's region captures, each with whether it is
        keyless (asked of the agent; SourceError if no address answers)."""
        import grpc

        pb = protogen.load("agent")
        errors = []
        for i in range(len(self.cfg.address)):
            address = self.cfg.address[(self._addr_index + i) % len(self.cfg.address)]
            where = f"region {self.name} (agent {address})"
            channel = self._channel(address, where)
            try:
                call = channel.unary_unary("/capturer.agent.RegionAgent/Tables",
                                           request_serializer=pb.TablesRequest.SerializeToString,
                                           response_deserializer=pb.TablesReply.FromString)
                reply = call(pb.TablesRequest(protocol=wire.PROTOCOL, region=self.cfg.remote_name,
                                              tables=wire.packb([list(t) for t in tables]),
                                              filter_rules=self._filter_rules[0], filter_source=self._filter_rules[1]),
                             metadata=self._metadata(), timeout=self.cfg.connect_timeout + 30)
                return {(str(db), str(t)): bool(k) for db, t, k in wire.unpackb(reply.tables)}
            except grpc.RpcError as exc:
                errors.append(f"{address}: {exc.code().name}: {exc.details()}")
            finally:
                channel.close()
        raise SourceError(f"region {self.name}: no agent could list its tables ({'; '.join(errors)})")

    def _answer(self, pb: Any, wire: Any, ask: bytes, requests: queue.Queue[Any]) -> None:
        """The agent's region asks which other regions deliver some tables (before a copy empties them)."""
        try:
            ask_id, tables = wire.unpackb(ask)
        except (wire.WireError, ValueError, TypeError) as exc:
            log.warning("%s: ignoring a malformed question from the agent: %s", self.where, exc)
            return
        try:
            found = self.ctx.tables_elsewhere(self.name, [(str(db), str(t)) for db, t in tables])
            answer = pb.Answer(id=int(ask_id), tables=wire.packb([[db, t, regions]
                                                                   for (db, t), regions in found.items()]))
        except Exception as exc:
            answer = pb.Answer(id=int(ask_id), error=f"{type(exc).__name__}: {exc}")
        requests.put(pb.Request(answer=answer))

    def _subscribe(self, pb: Any, wire: Any) -> Any:
        rules, source = self._filter_rules
        return pb.Request(subscribe=pb.Subscribe(
            protocol=wire.PROTOCOL, region=self.cfg.remote_name,
            position=wire.packb(wire.position_json(self.position)) if self.position is not None else b"",
            floor=self.last_txn_ts, promised=self.promised,
            lifts=wire.packb([list(e) for e in self.ctx.journal.entries(self.name)]),
            floors=wire.packb([[f, p, ts] for (f, p), ts in self.ctx.journal.floors(self.name)]),
            filter_rules=rules, filter_source=source, capturer=self.identity))

    def _stream(self, channel: Any, pb: Any, wire: Any, where: str) -> None:
        import grpc

        requests: queue.Queue[Any] = queue.Queue()
        requests.put(self._subscribe(pb, wire))

        def request_iter() -> Iterator[Any]:
            while True:
                r = requests.get()
                if r is None:
                    return
                yield r

        metadata = self._metadata()
        stub = channel.stream_stream(METHOD, request_serializer=pb.Request.SerializeToString,
                                     response_deserializer=pb.Batch.FromString)
        call = stub(request_iter(), metadata=metadata)
        self._last_recv = time.monotonic()
        done = threading.Event()
        idle = [False]
        resubscribe = [False]

        def watchdog() -> None:
            while not done.wait(0.2):
                if self.ctx.stop.is_set():
                    call.cancel()
                    return
                if self._resubscribe.is_set():
                    self._resubscribe.clear()
                    resubscribe[0] = True
                    call.cancel()
                    return
                # waiting for room in the queue (slow senders) is not the agent being silent
                if not self._in_put and time.monotonic() - self._last_recv > self.cfg.idle_timeout:
                    idle[0] = True
                    call.cancel()
                    return

        with self._lock:
            self._requests, self._call = requests, call
        dog = threading.Thread(target=watchdog, name=f"region-{self.name}-watchdog", daemon=True)
        dog.start()
        reader = wire.TxnReader(wire.Decoder(self.name), self.ctx.spill_rows, self.ctx.spill_dir, self._txn,
                                self._heartbeat)
        try:
            for batch in call:
                self._on_batch(batch, pb, wire, where, reader, requests)
            if self.ctx.stop.is_set():
                return
            raise SourceError(f"{where}: the agent ended the stream")
        except grpc.RpcError as exc:
            if self.ctx.stop.is_set():
                return
            raise self._rpc_error(exc, where, resubscribe[0], idle[0]) from None
        except wire.WireError as exc:
            raise SourceError(f"{where}: {exc}") from None
        except (TypeError, ValueError, IndexError, KeyError) as exc:  # a malformed batch: read it again
            raise SourceError(f"{where}: bad batch: {exc!r}") from None
        finally:
            done.set()
            requests.put(None)
            call.cancel()
            with self._lock:
                self._requests = self._call = None

    def _on_batch(self, batch: Any, pb: Any, wire: Any, where: str, reader: Any, requests: Any) -> None:
        """One batch of the stream: its status, lifts, pin, question, items, and a fatal error last."""
        self._last_recv = time.monotonic()
        if self.state != "streaming":
            self.state = "streaming"
            self.connected_since = time.time()
            log.info("%s: streaming from %s", where, wire.position_json(self.position) or "its start")
        self.batches += 1
        self.bytes += batch.ByteSize()
        if batch.status:
            self.agent_status = wire.unpackb(batch.status)
            self.agent_status_at = time.time()
        if batch.lifts:
            for file, pos, ts in wire.unpackb(batch.lifts):
                self.ctx.journal.record(self.name, Position(str(file), int(pos)), int(ts))
        if batch.floors:  # (as set there, also below what a key held: a settled reservation)
            self.ctx.journal.set_floors(self.name, [((str(f), int(p)), int(ts)) for f, p, ts in wire.unpackb(batch.floors)])
        if batch.pin:
            pinned = wire.read_position(wire.unpackb(batch.pin))
            self.ctx.pin_start(self.name, pinned)
            if self.position is None:  # a reconnect before the first item resumes here, not anew
                self.position = pinned
                self._pos_json = wire.position_json(pinned)
        if batch.ask:  # may ask other agents: not on this thread (the stream must go on being read)
            threading.Thread(target=self._answer, args=(pb, wire, batch.ask, requests),
                             name=f"region-{self.name}-answer", daemon=True).start()
        if batch.items:
            reader.feed(wire.unpacker(batch.items))
        if batch.fatal:
            raise FatalSourceError(f"{where}: the agent's region {self.cfg.remote_name} failed: "
                                   f"{batch.fatal}")

    def _rpc_error(self, exc: Any, where: str, resubscribe: bool, idle: bool) -> SourceError:
        """The error to raise for a gRPC error ending the stream (a refusal is fatal; anything
        else but a resubscription moves on to the next address)."""
        code = exc.code() if hasattr(exc, "code") else None
        name = getattr(code, "name", str(code))
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        if resubscribe:
            return SourceError(f"{where}: subscribing again with the reloaded filter rules")
        if name in _FATAL_CODES:
            return FatalSourceError(f"{where}: the agent refused: {name}: {detail}")
        self._addr_index += 1
        if idle:
            return SourceError(f"{where}: nothing received for {self.cfg.idle_timeout:g}s")
        return SourceError(f"{where}: {name}: {detail}")

    def _same_position(self, pos: Any) -> Any:
        """The position object this region passed on last when ``pos`` is the same
        point (the checkpoint's floor is the commit_ts of the first item at a position)."""
        j = position_json(pos)
        if pos is not None and self.position is not None and j == self._pos_json:
            return self.position
        self._pos_json = j
        return pos

    def _txn(self, fields: dict[str, Any], changes: Any, spilled: bool) -> None:
        if spilled:
            self.spilled_txns += 1
        pos = fields["position"]
        if pos is not None:
            fields["position"] = self._same_position(pos)
        txn = Txn(changes=changes, **fields)
        self._deliver(txn)
        self.last_txn_ts = txn.commit_ts
        self.promised = max(self.promised, txn.commit_ts)
        if txn.source_ts:
            self.last_source_time = float(txn.source_ts)

    def _emit(self, item: Item) -> None:
        """(waiting for room in the queue is not the agent being silent: the watchdog knows)"""
        self._in_put = True
        try:
            super()._emit(item)
        finally:
            self._in_put = False
            self._last_recv = time.monotonic()

    def _heartbeat(self, hb: Heartbeat) -> None:
        if hb.commit_ts < self.promised:
            return  # an agent's region starting again promises less than was passed on: nothing new
        pos = self._same_position(hb.position) if hb.position is not None else None
        self._promise(hb.commit_ts, pos)
        self.promised = hb.commit_ts
        self.last_commit_ts = max(self.last_commit_ts, hb.commit_ts)

    # --- capturer side ----------------------------------------------------------
    def checkpointed(self, position: Any) -> None:
        with self._lock:
            requests = self._requests
        if requests is not None:
            pb = protogen.load("agent")
            requests.put(pb.Request(checkpointed=pb.Checkpointed(
                position=wire.packb(wire.position_json(position)))))

    def stop(self) -> None:
        super().stop()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def lag_seconds(self) -> float:
        if self.agent_status and time.time() - self.agent_status_at < 5:
            return float(self.agent_status.get("lag_seconds") or 0.0)
        return super().lag_seconds()

    def status(self) -> dict[str, Any]:
        d = super().status()
        d["agent"] = {"address": self.address, "region": self.cfg.remote_name, "batches": self.batches,
                      "bytes": self.bytes, "status_age_seconds":
                          round(time.time() - self.agent_status_at, 1) if self.agent_status_at else None,
                      "region_status": self.agent_status}
        # the agent's region decodes; a MySQL/MariaDB one: which server it reads, its failovers
        for k in ("decoded_fast", "decoded_library", "server", "servers", "gtid", "failovers", "failover_history"):
            if k in self.agent_status:
                d[k] = self.agent_status[k]
        return d
