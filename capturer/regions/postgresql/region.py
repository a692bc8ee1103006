"""A PostgreSQL region: a logical replication slot read with the ``pgoutput`` plugin.

How it reads:

* **Connections.** A replication connection (``replication=database``) speaks
  the streaming replication protocol through libpq (psycopg 3's low-level
  ``pq`` API: psycopg 3 has no replication layer, and this keeps every
  status update under the region's control, which psycopg2's
  ``ReplicationCursor`` does not: it confirms positions on its own when idle).
  A second, ordinary connection checks the setup, reads keys from the catalog,
  and fills unchanged TOASTed values.
* **Setup checks** (fatal, naming what to change): ``wal_level`` must be
  ``logical``; the publication must exist (``create_publication`` creates it);
  the slot must exist (``create_slot`` creates it on a first start) and use
  ``pgoutput`` in this database; and the slot must not have been confirmed past
  the checkpoint's LSN (changes in between would be gone).
* **Whole transactions.** pgoutput sends a transaction when it commits,
  between BEGIN and COMMIT, so rolled-back work never arrives. A transaction
  is assembled (spilled to disk past ``spillRows``, like MySQL ones) and sent
  at COMMIT with ``commit_ts`` from its commit time (microseconds: the
  millisecond part is the TSO's physical part, the rest its logical part) made
  strictly increasing by the region clock. Its position is the commit's end
  LSN: a restart asks the slot for what committed after it.
* **The slot moves only behind the checkpoint.** The region confirms (status
  update ``flush``) only LSNs the capturer's checkpoint holds, so the server
  keeps every change the sinks have not acknowledged.
* **Heartbeats.** Every ``heartbeat_ms`` out of a transaction, the region reads
  the server's WAL insert position and clock on the ordinary connection and
  asks the walsender for a keepalive; once the stream has passed that position
  everything that committed before that clock minus ``heartbeat_lag_ms`` has
  arrived, and the heartbeat promises it. An idle slot's position moves with
  the keepalives (nothing is in flight there), so its WAL is released too.
* **Schemas.** Relation messages describe each table before its first change
  in a session and after it changes. The region compares them with what it
  last sent downstream (journaled in ``<checkpoint>.postgresql.<region>`` with
  the LSN they apply from) and sends MySQL DDL for the difference: CREATE
  TABLE on first sight, ALTER TABLE ADD/DROP/MODIFY COLUMN, a rename of one
  column in place (same position and type) as CHANGE COLUMN, RENAME TABLE.
  TRUNCATE goes out as TRUNCATE TABLE, in its place in the transaction.
"""

from __future__ import annotations

import logging
import re
import select
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

from capturer.errors import FatalSourceError, SourceError
from capturer.model import (
    Ddl,
    LsnPosition,
    RowChange,
    TableProgress,
    Txn,
    format_lsn,
    make_ts,
    parse_lsn,
)
from capturer.model.encode import qualified
from capturer.regions.base import (
    ChangeBuffer,
    ClockedRegion,
    RegionContext,
    close_quietly,
    require_start_kind,
)
from capturer.regions.postgresql import pgoutput as po
from capturer.regions.postgresql.relations import (
    RelationJournal,
    RelDef,
    ddl_for,
    quote_pg,
)
from capturer.regions.postgresql.snapshot import PgSnapshot
from capturer.regions.postgresql.types import Unrepresentable, pg_time_to_unix_us
from capturer.regions.snaphost import SnapshotHostMixin
from capturer.util import fencing

log = logging.getLogger(__name__)

# fixed text forms of values on both connections (types.py parses them)
SESSION_OPTIONS = "-c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=iso_8601 -c extra_float_digits=3 " \
                  "-c bytea_output=hex"
_FEEDBACK = struct.Struct(">cQQQqB")
_XLOG_HEADER = struct.Struct(">QQq")
_ROW_TAGS = (b"I", b"U", b"D")
_KEEPALIVE = struct.Struct(">QqB")


def now_pg_us() -> int:
    return int(time.time() * 1_000_000) - 946_684_800_000_000


def commit_tso(pg_commit_time: int) -> int:
    """A PostgreSQL commit time (µs since 2000) as a TSO: ms in the physical part,
    the microseconds within it scaled into the logical part (order kept)."""
    us = pg_time_to_unix_us(pg_commit_time)
    return make_ts(us // 1000, (us % 1000) << 8)


class PostgresRegion(SnapshotHostMixin, ClockedRegion):
    def __init__(self, cfg: Any, ctx: RegionContext):
        # a checkpoint position of another kind is refused at start, not when the slot is first read
        require_start_kind(ctx, cfg.name, "postgresql", LsnPosition, remedy="")
        super().__init__(cfg.name, ctx)
        self.cfg = cfg
        self.where = f"region {cfg.name} (postgresql {cfg.host}:{cfg.port}/{cfg.dbname}, slot {cfg.slot})"
        self.relations = RelationJournal(self.state_file("postgresql"))
        self.confirmed = 0  # the LSN the slot may be confirmed to (the checkpoint's)
        self.slot_confirmed = ""  # what the server said at connect
        self.unrepresentable = 0
        self.toast_filled = 0
        self.toast_missing = 0
        self.toast_waits = 0  # transactions whose fill waited for them to become visible
        self.toast_wait_ms = 0.0  # how long those waits took, in all
        self.toast_wait_timeouts = 0  # waits given up after toast_wait_ms (the fill read anyway)
        # WAL the server keeps for the slot (insert position - restart_lsn), as the newest heartbeat probe read it
        self.slot_wal_held: int | None = None
        # the visibility of the transaction being decoded, checked once for all its fills (_await_visible)
        self._snapshot_fn = "pg_current_snapshot()"
        self._last_snap: PgSnapshot | None = None
        self._xid_checked: int | None = None
        self.ddl_sent = 0
        self._warned: set[tuple[str, str]] = set()
        self.rels_known: dict[int, RelDef] = {}  # relid -> the definition the targets were given
        self._side: Any = None
        self._repl: Any = None
        self._block, self._segment = 8192, 16 << 20  # WAL page and segment sizes (read at connect)
        self._init_snapshot_host(ctx.start.snapshot if isinstance(ctx.start, LsnPosition) else ())
        # transaction id -> commit end LSN of the newest ones delivered (a snapshot chunk checks that
        # what the stream delivered before it began is visible to its read: snapshot.py)
        self._recent_xids: dict[int, int] = {}
        try:
            import psycopg
        except ImportError:
            raise FatalSourceError(f"{self.where}: PostgreSQL regions need psycopg 3: pip install 'psycopg[binary]' "
                                   "(the project's 'postgresql' extra; start.sh installs it)") from None
        # a broken connection (a server restart, a network cut) is retried from the last position
        self.RETRYABLE = (SourceError, OSError, psycopg.OperationalError)

    RETRYABLE: tuple[type[BaseException], ...] = (SourceError, OSError)

    # --- connections ------------------------------------------------------------
    def _conninfo(self, replication: bool) -> str:
        from psycopg.conninfo import make_conninfo

        kw: dict[str, Any] = {"host": self.cfg.host, "port": self.cfg.port, "user": self.cfg.user,
                                  "dbname": self.cfg.dbname, "connect_timeout": max(1, int(self.cfg.connect_timeout)),
                                  "application_name": f"capturer-{self.name}"[:63], "options": SESSION_OPTIONS,
                                  "client_encoding": "UTF8",
                                  "sslmode": self.cfg.sslmode}
        if self.cfg.password:
            kw["password"] = self.cfg.password
        if replication:
            kw["replication"] = "database"
        return make_conninfo("", **kw)

    def conninfo(self) -> str:
        """The ordinary connection's settings (snapshot readers use them too)."""
        return self._conninfo(False)

    def _query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            with self._side.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description else []
        except psycopg.OperationalError as exc:
            raise SourceError(f"{self.where}: {exc}".strip()) from None

    def _connect_side(self) -> None:
        import psycopg

        try:
            self._side = psycopg.connect(self._conninfo(False), autocommit=True)
        except psycopg.OperationalError as exc:
            raise SourceError(f"{self.where}: cannot connect: {str(exc).strip()}") from None

    def _after_attempt(self) -> None:
        close_quietly(self._repl, self._side)
        self._repl = self._side = None

    # --- setup ------------------------------------------------------------------
    def _prepare(self) -> int:
        """Check the server, publication and slot; the LSN to start after."""
        import psycopg

        (wal_level, self._block, self._segment, version), = self._query(
            "SELECT current_setting('wal_level'), current_setting('wal_block_size')::int, "
            "(SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'), "
            "current_setting('server_version_num')::int")
        # pg_current_snapshot() is PostgreSQL 13's name for txid_current_snapshot() (as in snapshot.py)
        self._snapshot_fn = "pg_current_snapshot()" if int(version) >= 130000 else "txid_current_snapshot()"
        self._last_snap, self._xid_checked = None, None
        if wal_level != "logical":
            raise FatalSourceError(
                f"{self.where}: wal_level is {wal_level!r}; logical decoding needs wal_level = logical "
                "(set it in postgresql.conf, or ALTER SYSTEM SET wal_level = logical, and restart PostgreSQL)")
        pub = self.cfg.publication
        if not self._query("SELECT 1 FROM pg_publication WHERE pubname = %s", (pub,)):
            if self.cfg.create_publication == "no":
                raise FatalSourceError(
                    f"{self.where}: publication {pub!r} does not exist in database {self.cfg.dbname!r}; create it "
                    f"(CREATE PUBLICATION {quote_pg(pub)} FOR ALL TABLES) or set create_publication = all")
            what = "ALL TABLES" if self.cfg.create_publication == "all" else "TABLE " + ", ".join(
                ".".join(quote_pg(p) for p in t.split(".", 1)) for t in self.cfg.create_publication.split(","))
            try:
                self._query(f"CREATE PUBLICATION {quote_pg(pub)} FOR {what}")
            except psycopg.Error as exc:
                raise FatalSourceError(f"{self.where}: cannot create publication {pub!r}: {str(exc).strip()}") from None
            log.info("%s: created publication %s FOR %s", self.where, pub, what)
        slot = self.cfg.slot
        rows = self._query("SELECT plugin, database, confirmed_flush_lsn::text, wal_status FROM pg_replication_slots "
                           "WHERE slot_name = %s", (slot,))
        # a retry resumes where this process got to (the checkpoint's position only at first)
        require_start_kind(self.ctx, self.name, "postgresql", LsnPosition, remedy="")
        start = self.position if isinstance(self.position, LsnPosition) else self.ctx.start
        assert start is None or isinstance(start, LsnPosition)
        purged = False
        copy = self.cfg.snapshot in ("initial", "when_needed")
        if rows and start is not None and self.cfg.snapshot == "when_needed":
            plugin, database, confirmed, wal_status = rows[0]
            gone = "lost WAL it needed" if wal_status == "lost" else (
                f"was confirmed up to {confirmed}, past the checkpoint's LSN {start}"
                if confirmed and parse_lsn(confirmed) > start.lsn else "")
            if gone:
                log.warning("%s: replication slot %s %s; snapshot=when_needed: copying every selected table again "
                            "(each emptied downstream first) and reading the slot from where it is", self.where,
                            slot, gone)
                if wal_status == "lost":
                    self._query("SELECT pg_drop_replication_slot(%s)", (slot,))
                    rows = []
                self._forget_start()
                start, purged = None, True
        if not rows and start is not None and self.cfg.snapshot == "when_needed":
            log.warning("%s: replication slot %s does not exist, but the checkpoint needs the changes after LSN %s; "
                        "snapshot=when_needed: creating it and copying every selected table again (each emptied "
                        "downstream first)", self.where, slot, start)
            self._forget_start()
            start, purged = None, True
        if not rows:
            if start is not None:
                raise FatalSourceError(
                    f"{self.where}: replication slot {slot!r} does not exist, but the checkpoint needs the changes "
                    f"after LSN {start}; they are gone with the slot. Start this region again from scratch "
                    "(remove it from the checkpoint) and fill the targets again, or set snapshot=when_needed "
                    f"in [region:{self.name}] to copy every table again")
            if not self.cfg.create_slot:
                raise FatalSourceError(
                    f"{self.where}: replication slot {slot!r} does not exist; create it "
                    f"(SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')) or set create_slot = true")
            try:
                (lsn,), = self._query("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
                                      (slot,))
            except SourceError:
                raise
            except psycopg.Error as exc:
                raise FatalSourceError(f"{self.where}: cannot create replication slot {slot!r}: "
                                       f"{str(exc).strip()}") from None
            log.info("%s: created replication slot %s at %s", self.where, slot, lsn)
            at = parse_lsn(lsn)
            self.slot_confirmed = lsn
            if copy:
                self._start_snapshot(fresh=True, at=at, truncate=purged)
                return at
            self.position = LsnPosition(at)
            self.ctx.pin_start(self.name, self.position)
            return at
        plugin, database, confirmed, wal_status = rows[0]
        if plugin != "pgoutput" or database != self.cfg.dbname:
            raise FatalSourceError(
                f"{self.where}: replication slot {slot!r} uses plugin {plugin!r} in database {database!r}; "
                f"this region needs a pgoutput slot in {self.cfg.dbname!r}")
        if wal_status == "lost":
            raise FatalSourceError(f"{self.where}: replication slot {slot!r} lost WAL it needed (wal_status lost, "
                                   "max_slot_wal_keep_size); the changes since are gone")
        self.slot_confirmed = confirmed or ""
        slot_at = parse_lsn(confirmed) if confirmed else 0
        if start is None:
            if copy:
                self._start_snapshot(fresh=True, at=slot_at, truncate=purged)
                return slot_at
            self.position = LsnPosition(slot_at)
            self.ctx.pin_start(self.name, self.position)
            return slot_at
        if slot_at > start.lsn:
            raise FatalSourceError(
                f"{self.where}: replication slot {slot!r} was confirmed up to {confirmed}, past the checkpoint's "
                f"LSN {start}: another consumer read this slot, or the checkpoint is older than the slot; the "
                "changes in between are gone from it (snapshot=when_needed copies every table again then)")
        self._start_snapshot(fresh=False)
        return start.lsn

    def _keys(self, relid: int, cols: tuple[po.Column, ...], replident: str,
              query: Any = None) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
        names = {c.name for c in cols}
        rows = (query or self._query)(
            "SELECT i.indisprimary, array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i "
            "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL "
            "GROUP BY i.indexrelid, i.indisprimary ORDER BY i.indisprimary DESC, i.indexrelid", (relid,))
        pk: tuple[str, ...] = ()
        uks: list[tuple[str, ...]] = []
        for primary, keycols in rows:
            kc = tuple(keycols)
            if not all(c in names for c in kc):
                continue
            if primary:
                pk = kc
            else:
                uks.append(kc)
        flagged = tuple(c.name for c in cols if c.key)
        if replident in ("d", "i") and flagged and set(flagged) != set(pk):
            # the replica identity is the key the log carries (the catalog's order when the same columns)
            if pk:
                uks.insert(0, pk)
            pk = next((u for u in uks if set(u) == set(flagged)), flagged)
        uks = [u for u in uks if u != pk]
        return pk, tuple(uks)

    # --- the stream --------------------------------------------------------------
    def _connect_and_stream(self) -> None:
        from psycopg import pq

        self.state = "connecting"
        self._connect_side()
        start = self._prepare()
        with self._lock:
            self._apply_requests()
            if not isinstance(self.position, LsnPosition) or self.position.lsn != start:
                self.position = LsnPosition(start, self.snap_progress)
            self._restamp()
        self.confirmed = max(self.confirmed, start)
        conn = pq.PGconn.connect(self._conninfo(True).encode())
        self._repl = conn
        if conn.status != pq.ConnStatus.OK:
            raise SourceError(f"{self.where}: replication connection: "
                              f"{conn.error_message.decode('utf-8', 'replace').strip()}")
        pubs = "'" + quote_pg(self.cfg.publication).replace("'", "''") + "'"
        cmd = (f"START_REPLICATION SLOT {quote_pg(self.cfg.slot)} LOGICAL {format_lsn(start)} "
               f"(proto_version '1', publication_names {pubs})")
        res = conn.exec_(cmd.encode())
        if res.status != pq.ExecStatus.COPY_BOTH:
            msg = (res.error_message or b"").decode("utf-8", "replace").strip()
            if "does not exist" in msg and "publication" in msg:
                raise FatalSourceError(f"{self.where}: {msg}")
            held = re.search(r"is active for PID (\d+)", msg)
            if held and fencing.GUARD.armed and not fencing.GUARD.lost and fencing.GUARD.remaining() > 0:
                # high availability: a deposed capturer (paused, cut off) still holds the slot; the lease is
                # this one's, so its replication connection goes (else it would hold until wal_sender_timeout)
                self._query("SELECT pg_terminate_backend(%s)", (int(held.group(1)),))
                log.warning("%s: replication slot %r was held by backend %s (a capturer that lost its lease): "
                            "terminated", self.where, self.cfg.slot, held.group(1))
            raise SourceError(f"{self.where}: START_REPLICATION: {msg}")
        log.info("%s: streaming from %s", self.where, format_lsn(start))
        self._stream(conn, start)

    def _send_status(self, conn: Any, received: int, reply: bool = False) -> None:
        flush = self.confirmed
        msg = _FEEDBACK.pack(b"r", max(received, flush), flush, flush, now_pg_us(), 1 if reply else 0)
        if conn.put_copy_data(msg) != 1 or conn.flush() != 0:
            raise SourceError(f"{self.where}: cannot send a status update to the server")

    def _stream(self, conn: Any, start: int) -> None:
        self.rels_known = self.relations.state_at(start)  # what the targets were given
        session: dict[int, RelDef] = {}  # relation messages of this connection
        txn: _TxnBuilder | None = None
        received = start
        observed = start  # everything that committed before this LSN has arrived
        probe: tuple[int, int] | None = None  # (server insert LSN, its clock in Unix ms) awaiting the stream
        hb_every = self.cfg.heartbeat_ms / 1000.0
        status_every = self.cfg.status_interval
        next_hb = 0.0
        next_status = time.monotonic() + status_every
        sent_confirmed = self.confirmed
        sock = conn.socket
        self.state = "streaming"
        with self._lock:
            self._alive(self.position)
        while not self.ctx.stop.is_set():
            nbytes, data = conn.get_copy_data(1)
            if nbytes == 0:
                now = time.monotonic()
                if txn is None and now >= next_hb:
                    next_hb = now + hb_every
                    if probe is None:
                        (lsn, clock_ms, held), = self._query(
                            "SELECT pg_current_wal_insert_lsn()::text, "
                            "(extract(epoch from clock_timestamp()) * 1000)::bigint, "
                            "(SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), restart_lsn)::bigint "
                            "FROM pg_replication_slots WHERE slot_name = %s)", (self.cfg.slot,))
                        probe = (self._record_boundary(parse_lsn(lsn)), int(clock_ms))
                        self.slot_wal_held = None if held is None else max(0, int(held))
                        self._send_status(conn, received, reply=True)
                        next_status = now + status_every
                if now >= next_status or self.confirmed != sent_confirmed:
                    sent_confirmed = self.confirmed
                    self._send_status(conn, received)
                    next_status = now + status_every
                if probe is not None and txn is None and observed >= probe[0]:
                    self._heartbeat(probe[1], observed)
                    probe = None
                    continue
                r, _, _ = select.select([sock], [], [], 0.05 if probe is not None else 0.2)
                if r:
                    conn.consume_input()
                continue
            if nbytes == -1:
                res = conn.get_result()
                msg = (res.error_message or b"").decode("utf-8", "replace").strip() if res is not None else ""
                raise SourceError(f"{self.where}: the server ended the replication stream {msg}".strip())
            if nbytes < 0:
                raise SourceError(f"{self.where}: replication stream: "
                                  f"{conn.error_message.decode('utf-8', 'replace').strip()}")
            buf = bytes(data)
            kind = buf[:1]
            if kind == b"k":
                wal_end, send_time, reply = _KEEPALIVE.unpack_from(buf, 1)
                if txn is None:
                    observed = max(observed, wal_end)
                    if reply:
                        self._send_status(conn, received)
                    if probe is not None and observed >= probe[0]:
                        self._heartbeat(probe[1], observed)
                        probe = None
                elif reply:
                    self._send_status(conn, received)
                continue
            if kind != b"w":
                raise SourceError(f"{self.where}: unexpected replication message {kind!r}")
            data_start, _wal_end, _send = _XLOG_HEADER.unpack_from(buf, 1)
            received = max(received, data_start)
            if self.confirmed != sent_confirmed and time.monotonic() >= next_status - status_every + 1.0:
                # a stream that never pauses still lets the slot move (at most once a second)
                sent_confirmed = self.confirmed
                self._send_status(conn, received)
                next_status = time.monotonic() + status_every
            off = 1 + _XLOG_HEADER.size
            if txn is not None and buf[off:off + 1] in _ROW_TAGS and self._fast_change(txn, session, buf, off):
                continue
            msg = po.parse(buf[off:])
            if isinstance(msg, po.Begin):
                txn = _TxnBuilder(self, msg)
            elif isinstance(msg, po.Commit):
                if txn is None:
                    raise po.ProtocolError(f"{self.where}: COMMIT without BEGIN at {format_lsn(msg.end_lsn)}")
                self._commit(txn, msg)
                txn = None
                observed = max(observed, msg.end_lsn)
                received = max(received, msg.end_lsn)
            elif isinstance(msg, po.Relation):
                rel = self._reldef(msg)
                session[rel.relid] = rel
                if txn is not None:
                    txn.relation(rel)
            elif isinstance(msg, (po.Insert, po.Update, po.Delete)):
                if txn is None:
                    raise po.ProtocolError(f"{self.where}: a change outside a transaction")
                changed = session.get(msg.relid)
                if changed is None:
                    raise po.ProtocolError(f"{self.where}: a change of relation {msg.relid} before its description")
                txn.change(changed, msg)
            elif isinstance(msg, po.Truncate):
                if txn is None:
                    raise po.ProtocolError(f"{self.where}: TRUNCATE outside a transaction")
                for relid in msg.relids:
                    emptied = session.get(relid)
                    if emptied is not None:
                        txn.truncate(emptied)

    def _fast_change(self, txn: _TxnBuilder, session: dict[int, RelDef], buf: bytes, off: int) -> bool:
        """An INSERT, UPDATE or DELETE message at ``off`` through the C tuple decoder, as
        ``po.parse`` and ``_TxnBuilder.change`` take it; False leaves it to them (no C build, a
        relation not described, a table the filter leaves out, unchanged TOASTed values to fill,
        anything the decoder refuses: the general path then says what is wrong)."""
        if len(buf) < off + 6:
            return False
        rel = session.get(int.from_bytes(buf[off + 1:off + 5], "big"))
        if rel is None or not self.ctx.table_selected(rel.db, rel.table):
            return False
        plan = rel.plan
        if plan is None:
            return False
        tag, k, i = buf[off], buf[off + 5], off + 6
        try:
            if tag == 0x49:  # I
                if k != 0x4E:
                    return False
                after, _, _, bad = plan.image(buf, i, False)
                ch = RowChange(rel.schema, "insert", None, after)
            elif tag == 0x44:  # D
                if k not in (0x4B, 0x4F):
                    return False
                before, _, _, bad = plan.image(buf, i, k == 0x4B)
                ch = RowChange(rel.schema, "delete", before, None)
            else:  # U
                old, bad = None, 0
                if k in (0x4B, 0x4F):
                    old, _, i, bad = plan.image(buf, i, k == 0x4B)
                    if i >= len(buf):
                        return False
                    k, i = buf[i], i + 1
                if k != 0x4E:
                    return False
                after, unchanged, _, bad_new = plan.image(buf, i, False)
                if unchanged:  # (the old row's values, or a read of the table: the general path)
                    return False
                bad += bad_new
                before = old if old is not None else {c: after[c] for c in rel.pk if c in after}
                ch = RowChange(rel.schema, "update", before, after)
        except ValueError:
            return False
        self.unrepresentable += bad
        txn.changes.append(ch, txn.begin.xid)
        return True

    def _record_boundary(self, insert_lsn: int) -> int:
        """The insert position as the end of the last record: at the start of a WAL page
        the server gives the position after the page's header, which the stream (that
        reports record ends) never reaches while nothing more is written."""
        if self._segment and insert_lsn % self._segment == 40:  # a segment's first page: long header
            return insert_lsn - 40
        if self._block and insert_lsn % self._block == 24:  # short page header
            return insert_lsn - 24
        return insert_lsn

    def _reldef(self, m: po.Relation) -> RelDef:
        pk, uks = self._keys(m.relid, m.columns, m.replident)
        rel = RelDef(m.relid, m.namespace, m.name, m.replident, m.columns, pk, uks)
        if uks and m.replident != "f" and (rel.db, rel.table) not in self._warned:
            self._warned.add((rel.db, rel.table))
            log.warning("%s: table %s.%s has unique keys besides its primary key but REPLICA IDENTITY %s: old values "
                        "of those keys are not in the log, so conflicts on them cannot be detected downstream; "
                        "ALTER TABLE ... REPLICA IDENTITY FULL fixes that", self.where, rel.db, rel.table,
                        {"d": "DEFAULT", "i": "USING INDEX", "n": "NOTHING"}.get(m.replident, m.replident))
        return rel

    def _heartbeat(self, clock_ms: int, observed: int) -> None:
        with self._lock:
            self._apply_requests()
            if self.position is None or observed > self.position.lsn:
                self.position = LsnPosition(observed, self.snap_progress)
            self.last_source_time = max(self.last_source_time, clock_ms / 1000.0)
            self._clock_heartbeat(clock_ms - self.cfg.heartbeat_lag_ms, self.position)
            self._lock.notify_all()

    def _commit(self, b: _TxnBuilder, c: po.Commit) -> None:
        parts = b.finish()
        unix_us = pg_time_to_unix_us(c.commit_time)
        source_s = unix_us // 1_000_000
        with self._lock:
            self._apply_requests()
            end = LsnPosition(c.end_lsn, self.snap_progress)
            self.clock.at(end)  # (items a run before a crash inserted before this point raised the clock)
            for lsn_rel in b.new_relations:
                self.relations.record(c.end_lsn, lsn_rel)
                # a chunk of it described before reads again (its columns may have changed)
                self._note_ddl_key((lsn_rel.db.lower(), lsn_rel.table.lower()), (c.end_lsn,))
            if not parts:  # nothing selected: the position moves on, behind a heartbeat
                self._alive(end)
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                ts = self.clock.commit(int(source_s), end, commit_tso(c.commit_time)) if i == 0 else self.clock.next()
                pos = end if last else (self.position or LsnPosition(0, self.snap_progress))
                if isinstance(part, Ddl):
                    txn = Txn(self.name, ts, pos, (), part, int(source_s))
                    self.ddl_sent += 1
                    if part.table:  # a TRUNCATE: a chunk read before it must not bring its rows back
                        self._note_ddl_key((part.db.lower(), part.table.lower()), (c.end_lsn,))
                else:
                    txn = Txn(self.name, ts, pos, part, None, int(source_s))
                    self.rows += len(part)
                    if self.recorders:
                        self._record(Txn(self.name, ts, end, part, None, 0), b.begin.xid)
                self._emit(txn)
                self.last_commit_ts = ts
            self.position = end
            self._recent_xids[b.begin.xid] = c.end_lsn
            if len(self._recent_xids) > 100_000:
                for x in list(self._recent_xids)[:25_000]:
                    del self._recent_xids[x]
            self._lock.notify_all()
        self.txns += 1
        self.last_source_time = unix_us / 1e6

    def _extra_ts(self) -> int:
        """(under the lock) The commit_ts of an item the region inserts where timing
        decides (a snapshot chunk, a table copy's CREATE/TRUNCATE): above everything
        it ever sent (``RegionClock.extra``), at this machine's clock."""
        return self.clock.extra(int(time.time() * 1000) + 1, self.position)

    # --- snapshots (capturer/regions/postgresql/snapshot.py) ----------------------
    def _pkey(self, pos: Any) -> tuple[Any, ...]:
        return (pos.lsn,)

    def _stamped(self, pos: Any, progress: tuple[TableProgress, ...]) -> LsnPosition:
        return LsnPosition(pos.lsn, progress)

    @property
    def snap_method(self) -> str:
        return "xid"

    def _new_snapshotter(self) -> Any:
        from capturer.regions.postgresql.snapshot import PgSnapshotter

        return PgSnapshotter(self, self.cfg.snapshot_workers, self.cfg.snapshot_chunk_rows)

    def _start_statements(self, plan: Any, create: Any, truncate: bool) -> list[tuple[str, str, str]]:
        """A table's run starts with its definition as the stream would have sent it
        (recorded as sent, so the stream does not send it again), and its TRUNCATE."""
        stmts: list[tuple[str, str, str]] = []
        rel = create
        if isinstance(rel, RelDef):
            known = self.rels_known.get(rel.relid)
            if known is None or not known.same_shape(rel):
                if self.cfg.ddl:
                    stmts += ddl_for(known, rel)
                self.rels_known[rel.relid] = rel
                at = self.position.lsn if isinstance(self.position, LsnPosition) else 0
                self.relations.record(at, rel)
            elif self.cfg.ddl:
                # known to the stream, but maybe never sent (the filter left the table out until a
                # reload added it): its CREATE ... IF NOT EXISTS again, as a MySQL region's copy starts
                stmts += ddl_for(None, rel)
        if truncate:
            stmts.append((plan.db, f"TRUNCATE TABLE {qualified(plan.db, plan.table)}", plan.table))
        return stmts

    def record_boundary(self, insert_lsn: int) -> int:
        return self._record_boundary(insert_lsn)

    def delivered_unseen(self, snap: Any, low: tuple[Any, ...]) -> bool:
        """Whether a transaction the stream delivered at or before ``low`` is not visible
        to snapshot ``snap`` (its commit record written, the transaction not visible yet:
        in the snapshot's in-progress list, or at or past its xmax when no transaction
        completed after it, e.g. every commit held by a synchronous standby)."""
        with self._lock:
            delivered = list(self._recent_xids.items())  # (copied: checked outside the emission lock)
        lsn = low[0] if low else 0
        lo = snap.xmin & 0xFFFFFFFF  # (below the snapshot's xmin every transaction is visible: skipped cheaply)
        return any(at <= lsn and ((x - lo) & 0xFFFFFFFF) < 0x80000000 and not snap.visible(x) for x, at in delivered)

    def catalog_reldef(self, query: Any, db: str, table: str) -> RelDef | None:
        """A table's definition from the catalog, as its relation message would give it
        (columns, their replica-identity flags, keys); None if it is not a table."""
        rows = query("SELECT c.oid, c.relreplident::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                     "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')", (db, table))
        if not rows:
            return None
        relid, ident = int(rows[0][0]), str(rows[0][1])
        keyset: set[int] = set()
        if ident in ("d", "i"):
            got = query("SELECT indkey::int2[] FROM pg_index WHERE indrelid = %s AND "
                        + ("indisprimary" if ident == "d" else "indisreplident"), (relid,))
            keyset = {int(x) for x in got[0][0]} if got else set()
        cols = query("SELECT attnum, attname::text, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s AND "
                     "attnum > 0 AND NOT attisdropped ORDER BY attnum", (relid,))
        columns = tuple(po.Column(str(name), int(oid), int(mod), ident == "f" or int(num) in keyset)
                        for num, name, oid, mod in cols)
        pk, uks = self._keys(relid, columns, ident, query)
        return RelDef(relid, db, table, ident, columns, pk, uks)

    def _forget_start(self) -> None:
        """(when_needed) The checkpoint's position is of no use: start over."""
        with self._lock:
            self.position = None
            self.snap_progress = ()
            self._snap_gen += 1  # chunks in flight were read against the old stream

    def _start_snapshot(self, fresh: bool, at: int = 0, truncate: bool = False) -> None:
        """On a first start (``fresh``) with snapshot=initial/when_needed: every table
        of the publication the filter selects (``truncate``: each emptied downstream
        first), from ``at``; on a restart: the snapshot in progress in the checkpoint."""
        if fresh:
            published = self._published()
            tables = sorted(published)
            cut = [t for t in tables if truncate or published[t]]
            self.refuse_outside_peers(cut, truncate)
            run = uuid.uuid4().hex[:12]
            progress = tuple(TableProgress(db, t, run, truncate=truncate) for db, t in tables)
            start = LsnPosition(at, progress)
            # durable before anything is emitted: a crash before the first checkpoint resumes
            # this run from this position (so changes made meanwhile are delivered)
            self.ctx.pin_start(self.name, start)
            with self._lock:
                self.snap_progress = progress
                self.position = start
                self._apply_requests()
            log.info("%s: snapshot=%s: copying %d table(s)%s while reading the slot from %s", self.where,
                     self.cfg.snapshot, len(tables), " (each emptied downstream first)" if truncate else "",
                     format_lsn(at))
        with self._snap_lock:
            if fresh or self.snapshotter is None:
                with self._lock:
                    self._apply_requests()
                    pending = tuple(p for p in self.snap_progress if p.state in ("pending", "running"))
                if pending:
                    if self.snapshotter is None:
                        self.snapshotter = self._new_snapshotter()
                    self.snapshotter.load(pending)

    def check_snapshot_support(self) -> None:
        """(every PostgreSQL server this region reads can be copied)"""

    def request_snapshot(self, tables: list[tuple[str, str]], truncate: bool) -> str:
        return self.start_snapshot_request(tables, truncate)

    def _on_exit(self) -> None:
        if self.snapshotter is not None:
            self.snapshotter.close()

    # --- values -------------------------------------------------------------------
    def image(self, rel: RelDef, tup: po.Tuple, old: dict[str, Any] | None = None,
              only_present: bool = False) -> tuple[dict[str, Any], list[str]]:
        """A row image from a tuple, and the columns sent as "unchanged TOAST" (taken
        from ``old`` when it has them)."""
        out: dict[str, Any] = {}
        unchanged: list[str] = []
        for col, t, (kind, text) in zip(rel.columns, rel.types, tup):
            if kind == po.TEXT:
                try:
                    out[col.name] = t.parse(text)  # type: ignore[arg-type]
                except Unrepresentable:
                    self.unrepresentable += 1
                    out[col.name] = None
                except ValueError as exc:
                    raise FatalSourceError(f"{self.where}: {rel.db}.{rel.table}.{col.name}: cannot read value "
                                           f"{str(text)[:80]!r}: {exc}") from None
            elif kind == po.NULL:
                if not only_present:
                    out[col.name] = None
            elif kind == po.UNCHANGED:
                if old is not None and col.name in old:
                    out[col.name] = old[col.name]
                else:
                    unchanged.append(col.name)
            else:  # binary: never asked for
                raise po.ProtocolError(f"{self.where}: a binary value in {rel.db}.{rel.table}")
        return out, unchanged

    def _await_visible(self, xid: int) -> bool:
        """Wait until transaction ``xid`` (delivered: it committed) is visible to new
        snapshots of the ordinary connection; False if it is not after ``toast_wait_ms``.

        PostgreSQL's walsender sends a transaction once its commit record is flushed,
        which can be before the committing backend leaves the ProcArray (under CPU
        load, for a while; a synchronous standby holds it there until it answers).
        A read in that window sees the row as it was before the transaction: no row at
        a new key, the old value of a column. So the fill first takes a snapshot
        (``pg_current_snapshot()``) and checks ``xid`` against it as the snapshot
        engine's chunk reads do (``PgSnapshot.visible``: not in progress, below xmax);
        once a snapshot sees it, every later one does (a completed transaction never
        comes back into the ProcArray), so the fill's own read, a later statement,
        sees it too. Checked once per transaction (the answer is kept for its other
        rows), and not at all when the last snapshot taken already sees it (a
        capturer behind the source). Waits are counted in ``toast_waits`` and
        ``toast_wait_ms``; one given up in ``toast_wait_timeouts`` (with a warning;
        the transaction's other rows then read at once: True)."""
        if xid == self._xid_checked:
            return True
        if self._last_snap is not None and self._last_snap.visible(xid):
            self._xid_checked = xid
            return True
        started = time.monotonic()
        deadline = started + self.cfg.toast_wait_ms / 1000.0
        delay, waited = 0.0005, False
        while True:
            (text,), = self._query(f"SELECT {self._snapshot_fn}::text")
            self._last_snap = snap = PgSnapshot.parse(str(text))
            if snap.visible(xid):
                break
            if not waited:
                waited = True
                self.toast_waits += 1
            if time.monotonic() >= deadline or self.ctx.stop.wait(delay):
                self.toast_wait_ms += (time.monotonic() - started) * 1000.0
                if not self.ctx.stop.is_set():
                    self.toast_wait_timeouts += 1
                    log.warning("%s: transaction %d stayed invisible to other sessions for %d ms after it was "
                                "delivered (a synchronous standby that does not answer?): its unchanged TOASTed "
                                "values are read anyway (toast_wait_ms)", self.where, xid, self.cfg.toast_wait_ms)
                self._xid_checked = xid  # (once per transaction: its other rows do not wait again)
                return False
            delay = min(delay * 2, 0.02)
        if waited:
            self.toast_wait_ms += (time.monotonic() - started) * 1000.0
        self._xid_checked = xid
        return True

    def fill_toast(self, rel: RelDef, row: dict[str, Any], cols: list[str], tup: po.Tuple, xid: int) -> None:
        """Unchanged TOASTed values (not in the log under REPLICA IDENTITY DEFAULT): read
        from the table by the row's new key, once transaction ``xid`` (the one being
        decoded) is visible to the read (``_await_visible``: never before, or a row
        that exists would look gone). The value read is the row's current one: the
        same one unless a later transaction changed it, and then that transaction
        carries the newer value too. A row deleted or moved to another key since
        (by a later transaction, which the stream delivers after this one) keeps the
        columns out of the image and counts in ``toast_missing``; so does a read that
        fails (the table or a column renamed, dropped or retyped since), and every
        such update when ``toast_fill`` is off or the table has no primary key.
        Senders never make up values for columns left out (docs/senders.md)."""
        texts = {c.name: text for c, (kind, text) in zip(rel.columns, tup) if kind == po.TEXT}
        if not self.cfg.toast_fill or not rel.pk or not all(k in texts for k in rel.pk):
            self.toast_missing += 1
            return
        types = dict(zip((c.name for c in rel.columns), rel.types))
        # the values in their output form (format('%s', c), as the log writes them; c::text differs for some
        # types), the key as the log wrote it: a parameter of unknown type, so the server reads it as the key's type
        sel = ", ".join(f"CASE WHEN {quote_pg(c)} IS NULL THEN NULL ELSE format('%%s', {quote_pg(c)}) END" for c in cols)
        where = " AND ".join(f"{quote_pg(k)} = %s" for k in rel.pk)
        keyvals = [texts[k] for k in rel.pk]
        import psycopg

        self._await_visible(xid)
        try:
            got = self._query(f"SELECT {sel} FROM {quote_pg(rel.db)}.{quote_pg(rel.table)} WHERE {where} LIMIT 1",
                              keyvals)
        except SourceError:
            raise
        except psycopg.Error as exc:  # the table or column was renamed or dropped since
            log.warning("%s: cannot read unchanged TOASTed values of %s.%s: %s", self.where, rel.db, rel.table,
                        str(exc).strip())
            got = []
        if not got:
            self.toast_missing += 1
            return
        for c, v in zip(cols, got[0]):
            try:
                row[c] = None if v is None else types[c].parse(v)
            except Unrepresentable:
                row[c] = None
            except ValueError:  # the column's type changed since: left as it is downstream
                self.toast_missing += 1
                return
        self.toast_filled += 1

    def added_defaults(self, old: RelDef, new: RelDef) -> dict[str, str]:
        """For columns ``new`` adds: the value rows already there have (PostgreSQL's
        "missing value" of a column added with a constant default), as a SQL literal."""
        from capturer.model.encode import sql_literal

        have = {c.name for c in old.columns}
        out: dict[str, str] = {}
        for c, t in zip(new.columns, new.types):
            if c.name in have:
                continue
            try:
                got = self._query("SELECT (attmissingval::text::text[])[1] FROM pg_attribute WHERE attrelid = %s "
                                  "AND attname = %s AND atthasmissing", (new.relid, c.name))
            except SourceError:
                raise
            except Exception:
                got = []
            if got and got[0][0] is not None:
                try:
                    out[c.name] = sql_literal(t.parse(got[0][0]), t.code)
                except (Unrepresentable, ValueError):
                    pass
        return out

    def tables_info(self, tables: list[tuple[str, str]]) -> dict[tuple[str, str], bool]:
        """Which of ``tables`` (schema, table) this region captures (in its publication and
        selected by the filter), each with whether it has no primary key."""
        tables = [t for t in tables if self.ctx.table_selected(*t)]
        if not tables:
            return {}
        want = set(tables)
        return {k: v for k, v in self._published().items() if k in want}

    def source_tables(self, selected: Callable[[str, str], bool]) -> list[tuple[str, str]]:
        """The publication's tables that ``selected`` chooses (the rules of a filter
        about to be loaded: which tables a reload adds)."""
        import psycopg

        try:
            with psycopg.connect(self._conninfo(False), autocommit=True) as c:
                rows = c.execute("SELECT schemaname::text, tablename::text FROM pg_publication_tables "
                                 "WHERE pubname = %s", (self.cfg.publication,)).fetchall()
        except psycopg.Error as exc:
            raise SourceError(f"{self.where}: cannot list tables: {str(exc).strip()}") from None
        return sorted((str(db), str(t)) for db, t in rows if selected(str(db), str(t)))

    def _published(self) -> dict[tuple[str, str], bool]:
        """Every table of the publication the filter selects, each with whether it has
        no primary key."""
        import psycopg

        try:
            with psycopg.connect(self._conninfo(False), autocommit=True) as c:
                rows = c.execute(
                    "SELECT t.schemaname::text, t.tablename::text, NOT EXISTS (SELECT 1 FROM pg_index i WHERE "
                    "i.indrelid = format('%%I.%%I', t.schemaname, t.tablename)::regclass AND i.indisprimary) "
                    "FROM pg_publication_tables t WHERE t.pubname = %s", (self.cfg.publication,)).fetchall()
        except psycopg.Error as exc:
            raise SourceError(f"{self.where}: cannot list tables: {str(exc).strip()}") from None
        return {(str(db), str(t)): bool(keyless) for db, t, keyless in rows if self.ctx.table_selected(str(db), str(t))}

    def heartbeat_note(self) -> str:
        held = "" if self.slot_wal_held is None else f", the server keeps {self.slot_wal_held / 1048576:.1f} MiB of WAL for it"
        return f"; slot {self.cfg.slot} confirmed to {format_lsn(self.confirmed) if self.confirmed else '-'}{held}"

    def checkpointed(self, position: Any) -> None:
        if isinstance(position, LsnPosition):
            self.confirmed = max(self.confirmed, position.lsn)
            self.relations.prune(position.lsn)

    def status(self) -> dict[str, Any]:
        d = super().status()
        d.update({
            "kind": "postgresql",
            "slot": self.cfg.slot,
            "publication": self.cfg.publication,
            "confirmed_lsn": format_lsn(self.confirmed) if self.confirmed else "",
            "slot_wal_held_bytes": self.slot_wal_held,
            "unrepresentable_values": self.unrepresentable,
            "toast_filled": self.toast_filled,
            "toast_missing": self.toast_missing,
            "toast_waits": self.toast_waits,
            "toast_wait_ms": round(self.toast_wait_ms, 1),
            "toast_wait_timeouts": self.toast_wait_timeouts,
            "ddl_sent": self.ddl_sent,
        })
        snap = self.snapshot_status()
        if snap is not None:
            d["snapshot"] = snap
        return d


class _TxnBuilder:
    """The transaction being received: its parts in order (row changes, spilled past
    ``spillRows``, and DDL where a relation changed or a table was truncated), and
    the relation definitions it introduced (journaled at its commit)."""

    def __init__(self, region: PostgresRegion, begin: po.Begin):
        self.r = region
        self.begin = begin
        self.parts: list[Any] = []
        self.changes = ChangeBuffer(region.ctx.spill_rows, region.ctx.spill_dir, region.where)
        self.new_relations: list[RelDef] = []

    def _cut(self) -> None:
        if not self.changes.empty:
            rows, spilled = self.changes.take()
            self.parts.append(rows)
            if spilled:
                self.r.spilled_txns += 1

    def _ddl(self, stmts: list[tuple[str, str, str]]) -> None:
        if not stmts:
            return
        self._cut()
        for db, sql, table in stmts:
            self.parts.append(Ddl(db, sql, table, db))

    def relation(self, rel: RelDef) -> None:
        known = self.r.rels_known.get(rel.relid)
        if known is not None and known.same_shape(rel):
            return
        # a new table under the name of one the targets have (dropped and created again in PostgreSQL,
        # which logs neither): the old one goes first
        replaced = known is None and any((k.db, k.table) == (rel.db, rel.table) and k.relid != rel.relid
                                         for k in self.r.rels_known.values())
        self.r.rels_known[rel.relid] = rel
        self.new_relations.append(rel)
        if self.r.cfg.ddl and self.r.ctx.table_selected(rel.db, rel.table):
            defaults = self.r.added_defaults(known, rel) if known is not None else None
            stmts = ddl_for(known, rel, defaults)
            if replaced:
                stmts.insert(1, (rel.db, f"DROP TABLE IF EXISTS {qualified(rel.db, rel.table)}", rel.table))
            self._ddl(stmts)

    def truncate(self, rel: RelDef) -> None:
        if self.r.ctx.table_selected(rel.db, rel.table):
            self._ddl([(rel.db, f"TRUNCATE TABLE {qualified(rel.db, rel.table)}", rel.table)])

    def change(self, rel: RelDef, m: po.Insert | po.Update | po.Delete) -> None:
        if not self.r.ctx.table_selected(rel.db, rel.table):
            return
        r = self.r
        if isinstance(m, po.Insert):
            after, _ = r.image(rel, m.new)
            ch = RowChange(rel.schema, "insert", None, after)
        elif isinstance(m, po.Delete):
            before, _ = r.image(rel, m.old, only_present=m.old_kind == "K")
            ch = RowChange(rel.schema, "delete", before, None)
        else:
            old = None
            if m.old is not None:
                old, _ = r.image(rel, m.old, only_present=m.old_kind == "K")
            after, unchanged = r.image(rel, m.new, old if m.old_kind == "O" else None)
            if unchanged:
                r.fill_toast(rel, after, unchanged, m.new, self.begin.xid)
            before = old if old is not None else {k: after[k] for k in rel.pk if k in after}
            ch = RowChange(rel.schema, "update", before, after)
        self.changes.append(ch, self.begin.xid)

    def finish(self) -> list[Any]:
        self._cut()
        return self.parts
