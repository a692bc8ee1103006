"""A PostgreSQL region's replication stream on one connection (``PgStream``): the
CopyBoth messages read (XLogData with pgoutput's messages, keepalives), status
updates sent, heartbeat probes taken when idle, transactions assembled (txn.py).

The region is a PostgresRegion, typed Any: region.py imports this module."""

from __future__ import annotations

import select
import struct
import time
from typing import Any

from capturer.errors import SourceError
from capturer.model import format_lsn, parse_lsn
from capturer.regions.postgresql import pgoutput as po
from capturer.regions.postgresql.relations import RelDef
from capturer.regions.postgresql.txn import TxnBuilder, fast_change

_XLOG_HEADER = struct.Struct(">QQq")
_ROW_TAGS = (b"I", b"U", b"D")
_KEEPALIVE = struct.Struct(">QqB")


class PgStream:
    """The stream's state: the transaction being received, what was received and
    observed (everything that committed before it has arrived), the heartbeat probe
    awaiting the stream, and when status updates and probes are due."""

    def __init__(self, region: Any, conn: Any, start: int):
        self.r = region
        self.conn = conn
        self.session: dict[int, RelDef] = {}  # relation messages of this connection
        self.txn: TxnBuilder | None = None
        self.received = start
        self.observed = start  # everything that committed before this LSN has arrived
        self.probe: tuple[int, int] | None = None  # (server insert LSN, its clock in Unix ms) awaiting the stream
        self.hb_every = region.cfg.heartbeat_ms / 1000.0
        self.status_every = region.cfg.status_interval
        self.next_hb = 0.0
        self.next_status = time.monotonic() + self.status_every
        self.sent_confirmed = region.confirmed

    def run(self) -> None:
        r, conn = self.r, self.conn
        sock = conn.socket
        while not r.ctx.stop.is_set():
            nbytes, data = conn.get_copy_data(1)
            if nbytes == 0:
                self._idle(sock)
                continue
            if nbytes < 0:
                self._ended(nbytes)
            buf = bytes(data)
            kind = buf[:1]
            if kind == b"k":
                self._keepalive(buf)
                continue
            if kind != b"w":
                raise SourceError(f"{r.where}: unexpected replication message {kind!r}")
            data_start, _wal_end, _send = _XLOG_HEADER.unpack_from(buf, 1)
            self.received = max(self.received, data_start)
            if r.confirmed != self.sent_confirmed and time.monotonic() >= self.next_status - self.status_every + 1.0:
                # a stream that never pauses still lets the slot move (at most once a second)
                self._status()
            off = 1 + _XLOG_HEADER.size
            txn = self.txn
            if txn is not None and buf[off:off + 1] in _ROW_TAGS and fast_change(r, txn, self.session, buf, off):
                continue
            self._message(po.parse(buf[off:]))

    def _status(self) -> None:
        self.sent_confirmed = self.r.confirmed
        self.r._send_status(self.conn, self.received)
        self.next_status = time.monotonic() + self.status_every

    def _idle(self, sock: Any) -> None:
        """Nothing to read: a heartbeat probe and a status update when due, the probe's
        heartbeat once the stream passed it, else a short wait for the socket."""
        r = self.r
        now = time.monotonic()
        if self.txn is None and now >= self.next_hb:
            self.next_hb = now + self.hb_every
            if self.probe is None:
                self._take_probe(now)
        if now >= self.next_status or r.confirmed != self.sent_confirmed:
            self.sent_confirmed = r.confirmed
            r._send_status(self.conn, self.received)
            self.next_status = now + self.status_every
        if self.probe is not None and self.txn is None and self.observed >= self.probe[0]:
            r._heartbeat(self.probe[1], self.observed)
            self.probe = None
            return
        ready, _, _ = select.select([sock], [], [], 0.05 if self.probe is not None else 0.2)
        if ready:
            self.conn.consume_input()

    def _take_probe(self, now: float) -> None:
        """The server's WAL insert position and clock (and the WAL it keeps for the slot),
        and a keepalive asked for: the heartbeat waits for the stream to pass it."""
        r = self.r
        (lsn, clock_ms, held), = r._query(
            "SELECT pg_current_wal_insert_lsn()::text, "
            "(extract(epoch from clock_timestamp()) * 1000)::bigint, "
            "(SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), restart_lsn)::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s)", (r.cfg.slot,))
        self.probe = (r._record_boundary(parse_lsn(lsn)), int(clock_ms))
        r.slot_wal_held = None if held is None else max(0, int(held))
        r._send_status(self.conn, self.received, reply=True)
        self.next_status = now + self.status_every

    def _ended(self, nbytes: int) -> None:
        conn = self.conn
        if nbytes == -1:
            res = conn.get_result()
            msg = (res.error_message or b"").decode("utf-8", "replace").strip() if res is not None else ""
            raise SourceError(f"{self.r.where}: the server ended the replication stream {msg}".strip())
        raise SourceError(f"{self.r.where}: replication stream: "
                          f"{conn.error_message.decode('utf-8', 'replace').strip()}")

    def _keepalive(self, buf: bytes) -> None:
        r = self.r
        wal_end, _send_time, reply = _KEEPALIVE.unpack_from(buf, 1)
        if self.txn is None:
            self.observed = max(self.observed, wal_end)
            if reply:
                r._send_status(self.conn, self.received)
            if self.probe is not None and self.observed >= self.probe[0]:
                r._heartbeat(self.probe[1], self.observed)
                self.probe = None
        elif reply:
            r._send_status(self.conn, self.received)

    def _message(self, msg: Any) -> None:
        r = self.r
        if isinstance(msg, po.Begin):
            self.txn = TxnBuilder(r, msg)
        elif isinstance(msg, po.Commit):
            if self.txn is None:
                raise po.ProtocolError(f"{r.where}: COMMIT without BEGIN at {format_lsn(msg.end_lsn)}")
            r._commit(self.txn, msg)
            self.txn = None
            self.observed = max(self.observed, msg.end_lsn)
            self.received = max(self.received, msg.end_lsn)
        elif isinstance(msg, po.Relation):
            rel = r._reldef(msg, self.txn.begin.final_lsn if self.txn is not None else 0)
            self.session[rel.relid] = rel
            if self.txn is not None:
                self.txn.relation(rel)
        elif isinstance(msg, (po.Insert, po.Update, po.Delete)):
            self._change(msg)
        elif isinstance(msg, po.Truncate):
            if self.txn is None:
                raise po.ProtocolError(f"{r.where}: TRUNCATE outside a transaction")
            for relid in msg.relids:
                emptied = self.session.get(relid)
                if emptied is not None:
                    self.txn.truncate(emptied)

    def _change(self, msg: po.Insert | po.Update | po.Delete) -> None:
        if self.txn is None:
            raise po.ProtocolError(f"{self.r.where}: a change outside a transaction")
        changed = self.session.get(msg.relid)
        if changed is None:
            raise po.ProtocolError(f"{self.r.where}: a change of relation {msg.relid} before its description")
        self.txn.change(changed, msg)
