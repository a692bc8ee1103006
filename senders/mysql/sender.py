"""The MySQL sender: SQL built from the rows, applied by parallel workers with
row-conflict detection, idempotent after a crash.

Per batch of transactions (in stream order):

* every change gets its conflict keys (``senders.mysql.causality``); changes of one
  causal group go to one worker (``stable_hash(group) % threadnum``) in order;
  a change linking two groups first forces a barrier (the workers finish and
  commit what they have), as does every DDL;
* each worker groups consecutive changes of the same table and kind into
  multi-row statements: ``INSERT ... ON DUPLICATE KEY UPDATE`` (an upsert),
  ``DELETE ... WHERE (pk) IN (...)``, and ``UPDATE ... WHERE <old key>`` sent
  together in one round trip. Values are parameters (pymysql ``%s``, escaped
  by the driver), or, for multi-row upserts and key deletes, written into the
  text by the C build of the driver's own escaping (the same text); identifiers
  are always quoted;
* the batch is acknowledged only when every worker has committed its part.

Replays after a crash converge: an upsert that collides with another row on a
unique key is redone as ``REPLACE``; an update that finds no row at its old key
upserts its new image; an update whose new key collides deletes the old row
and replaces the new one. Tables without a primary or unique key cannot be made
idempotent by SQL: their rows go through one worker in order, and the identity
``(commit_ts, region, seq)`` of the last applied row is stored per table in
``<meta_database>.applied`` in the same transaction, so a replay skips them.

``txn_atomic=true`` applies whole source transactions only: each target
transaction holds one or more of them, never a part (whole transactions are
routed by the union of their keys; consecutive ones of a worker go together up
to ``commit_rows`` rows), so readers never see half a transaction.

**The position in the target** (``senders.mysql.position``; issue 30: nothing
applied twice after ``kill -9`` or a retried batch). Every worker with a share
of a phase writes its own row of ``<meta_database>.position`` in the same
target transaction as the last rows of its share; a phase is whole once every
worker that had a share wrote its row for it, and ``resume_key()`` is the last
transaction known whole that way. The stream hands the sender nothing at or
below it after a restart, and a retried batch drops what is at or below it;
rows after it that some worker committed are applied again: keyed rows converge
(upserts), rows of tables without keys are skipped by ``applied``. Chosen over

* one position row written once every worker committed the batch: the same
  guarantees, but the position would be written *after* the rows, in a
  transaction of its own, and lag a batch behind them; with a row per worker
  the position is in the same transaction as the rows it covers, with one
  statement per worker and phase (10,000 rows) in a transaction already open,
  and with ``threadnum=1`` it is exactly what the target holds;
* XA (each worker's share PREPAREd, the position committed, then the shares):
  MariaDB 10.11 keeps a prepared XA transaction across a disconnect (checked:
  ``XA RECOVER`` on another connection lists it), but it costs three more round
  trips and a prepare log write per commit, holds every worker's row locks until
  the slowest worker prepared, and needs a recovery step at start (``XA
  RECOVER``, then commit or roll back by the position) that a crash during it
  must survive too; the per-worker rows give the same answer without any of it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import zlib
from concurrent.futures import Future
from typing import Any, ClassVar

import pymysql
import pymysql.cursors

from capturer.errors import ConfigError, Fenced, SinkError
from capturer.model import Ddl, RowChange, StreamKey, Txn, key_to_json, stream_key
from capturer.model.ddl import create_columns
from capturer.model.encode import quote_ident
from capturer.util import failpoints, fencing
from capturer.util.ini import Key, p_bool, p_choice, p_float, p_int, p_nonempty, p_str
from capturer.util.mysqlconn import SSL_KEYS
from senders.base import Sender
from senders.mysql import ddlstate, position
from senders.mysql.causality import Causality, conflict_keys, make_place_txns, stable_hash
from senders.mysql.worker import (
    DDL_ALREADY_DONE,
    ER_DUP_FIELDNAME,
    ER_NO_SUCH_TABLE,
    Ident,
    LaneMark,
    Op,
    Worker,
    _classify,
)

log = logging.getLogger(__name__)

#: _send's placing of a batch's transactions, change after change as _place_each and _Phases.place place
#: them, in C (``_Phases.place_txns``; the same lanes, barriers, flushes, positions and Ops:
#: tests/unit/test_fuzz_mysql_placing.py); None: the Python path (the specification)
_place_txns: Any = make_place_txns(Op)

class MySQLSender(Sender):
    KEYS: ClassVar[list[Key]] = [
        Key("host", p_nonempty, required=True),
        Key("port", p_int(1, 65535), 3306),
        Key("user", p_nonempty, required=True),
        Key("password", p_str, "", secret=True),
        Key("database", p_str, "", doc="put every table into this database (default: same db as the source)"),
        Key("threadnum", p_int(1, 256), 8, doc="parallel workers (connections)"),
        Key("ddl", p_choice("apply", "skip"), "apply", doc="apply DDL to the target or skip it"),
        Key("txn_atomic", p_bool, False, doc="one target transaction per source transaction"),
        Key("batch_rows", p_int(1, 100_000), 1000, doc="rows per multi-row statement"),
        Key("meta_database", p_str, "_capturer",
            doc="database for the sender's position and the replay protection of tables without keys; "
                "empty disables both"),
        Key("connect_timeout", p_float(0.5, 600), 5.0),
        Key("timeout", p_float(1, 86_400), 600.0, doc="read/write timeout of one statement (s)"),
        *SSL_KEYS,
    ]
    batch_rows = 20_000
    commit_rows = 5_000

    def __init__(self, name: str, options: dict[str, Any], queue_rows: int = 100_000):
        super().__init__(name, options, queue_rows)
        if bool(options.get("ssl_cert")) != bool(options.get("ssl_key")):
            raise ConfigError(f"[{name}]: ssl_cert and ssl_key go together (a client certificate for mutual TLS)")
        self.n = int(options["threadnum"])
        self.stmt_rows = int(options["batch_rows"])
        self.atomic = bool(options["txn_atomic"])
        self.target_db = options["database"] or None
        self.meta_db = options["meta_database"] or ""
        self.lane_commit_sql = position.upsert_sql(self.meta_db) + ";\nCOMMIT" if self.meta_db else ""
        self.sessions_kept = False  # high availability: <meta_database>.sessions exists (connections noted)
        # high availability: the active capturer's epoch (the fencing token; 0 = no HA), and how long a
        # connection may sit idle (its server-side wait_timeout, a little above)
        self.epoch = int(options.get("ha_epoch") or 0)
        self.idle_limit = max(15.0, 3.0 * float(options.get("ha_lease") or 0)) if self.epoch else 0.0
        self.workers = [Worker(self, i) for i in range(self.n)]
        self._nopad_as: str | None = None  # the target's name of a binary NO PAD collation (_collated)
        self._schema = ddlstate.Fingerprint()  # the schema state a DDL starts from (its intent row)
        self.progress: dict[str, Ident] = {}
        self.progress_after_commit: dict[str, Ident] = {}
        # per target table, its NOT NULL date columns and their zero dates (worker.py _zero_dates); forgotten
        # at every DDL applied (workers fill it: a dict's item assignment is atomic)
        self.zero_date_columns: dict[tuple[str, str], dict[str, str]] = {}
        self._progress_loaded = False
        # the position (senders/mysql/position.py): the last phase number (across runs), what the target
        # holds of the last phase while the stream hands it again, and the key of the last transaction
        # known whole at the target (read from it, or committed since)
        self._phase = 0
        self._resume: position.Resume | None = None
        self._whole: StreamKey | None = None
        self._read_at: StreamKey | None = None  # what resume_key() read at open
        self._read_since_open = False
        self.counters: dict[str, int] = {"phases": 0, "barriers": 0, "ddl_applied": 0, "ddl_skipped": 0,
                                         "ddl_replays_skipped": 0,
                                         "replace_fallbacks": 0, "upsert_fallbacks": 0,
                                         "replayed_skips": 0, "deadlock_retries": 0,
                                         # changes handed again that the target holds (skipped), those of the
                                         # last phase the target lacked (applied by their lanes), mismatches
                                         "resume_skips": 0, "resume_applied": 0, "position_mismatches": 0}
        self._clock = threading.Lock()

    def count(self, what: str, n: int = 1) -> None:
        with self._clock:
            self.counters[what] = self.counters.get(what, 0) + n

    def status(self) -> dict[str, Any]:
        st = super().status()
        st.update(self.counters)
        st["workers"] = self.n
        st["position"] = key_to_json(self._whole)  # the last transaction known whole at the target
        st["phase"] = self._phase
        st["resumed_at"] = key_to_json(self._read_at)  # the target's position as read at open
        st.update(self._waiting())
        return st

    #: a statement, commit or DDL running at the target longer than this is shown as what the sender waits for
    WAIT_SHOWN = 1.0

    def _waiting(self) -> dict[str, Any]:
        """What the sender waits for at the target: the workers whose statement, commit or DDL has run
        for ``WAIT_SHOWN`` seconds or more (a row or metadata lock another session holds there, a slow or
        hung server), the longest first; ``waiting_for``/``waiting_seconds`` name the longest (as every
        sender that can hang shows them), ``workers_waiting`` all of them."""
        now = time.monotonic()
        busy = []
        for w in self.workers:
            doing = getattr(w, "doing", None)  # (one read: the worker's thread replaces it)
            if doing is not None and now - doing[0] >= self.WAIT_SHOWN:
                busy.append({"worker": w.index, "doing": doing[1], "seconds": round(now - doing[0], 1)})
        busy.sort(key=lambda b: -b["seconds"])
        if not busy:
            return {"waiting_for": None, "waiting_seconds": None, "workers_waiting": []}
        o, b = self.options, busy[0]
        more = f"; {len(busy) - 1} more worker(s) waiting" if len(busy) > 1 else ""
        return {"waiting_for": f"the target {o['host']}:{o['port']}: worker {b['worker']}'s {b['doing']}{more}",
                "waiting_seconds": b["seconds"], "workers_waiting": busy}

    # --- lifecycle ----------------------------------------------------------
    def open(self) -> None:
        conn = self.workers[0].connect()
        if self.meta_db:
            try:
                with conn.cursor() as cur:
                    # no parameters here: pymysql leaves the text as is, so the name is not %-escaped
                    cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote_ident(self.meta_db)}")
                    cur.execute(
                        f"CREATE TABLE IF NOT EXISTS {quote_ident(self.meta_db)}.`applied` ("
                        "tbl VARCHAR(600) NOT NULL PRIMARY KEY, commit_ts BIGINT UNSIGNED NOT NULL, "
                        "region VARCHAR(64) NOT NULL, seq INT UNSIGNED NOT NULL) "
                        "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
                    )
                    cur.execute(position.create_sql(self.meta_db))
                    cur.execute(ddlstate.create_sql(self.meta_db))
                    if self.epoch:
                        cur.execute(position.fence_create_sql(self.meta_db))
                        cur.execute(position.sessions_create_sql(self.meta_db))
                conn.commit()
            except pymysql.err.MySQLError as exc:
                err = _classify(exc, f"creating {self.meta_db}.applied and .lanes on the target")
                if err.retriable:
                    self.workers[0].drop()
                    raise err from exc
                log.warning("sender %s: %s; tables without keys are not protected against replays and the "
                            "sender keeps no position in the target (set meta_database= to silence this)",
                            self.name, err)
                self.meta_db = ""
        if self.epoch:
            if self.meta_db and not self.sessions_kept:
                try:
                    with conn.cursor() as cur:
                        self.register_session(cur)  # (worker 0 connected before the table existed)
                    conn.commit()
                except pymysql.err.MySQLError as exc:
                    self.workers[0].drop()
                    raise _classify(exc, f"registering the connection in {self.meta_db}.sessions") from exc
                self.sessions_kept = True
            self._end_deposed_sessions(conn)
            self._claim_fence(conn)
        self._progress_loaded = False
        self._resume = None
        self._whole = self._read_at = None
        self._read_since_open = False

    # --- high availability: the fence row ------------------------------------
    def register_session(self, cur: Any) -> None:
        """Note this connection in ``<meta_database>.sessions`` with this capturer's epoch
        (a new active capturer ends a deposed one's connections: ``_end_deposed_sessions``)."""
        cur.execute(position.session_register_sql(self.meta_db), (self.name, self._server_boot(cur), self.epoch))

    @staticmethod
    def _server_boot(cur: Any) -> int:
        """When the target server started (its clock): connection ids are counted from then."""
        cur.execute("SHOW GLOBAL STATUS LIKE 'Uptime'")
        row = cur.fetchone()
        cur.execute("SELECT UNIX_TIMESTAMP()")
        (now,) = cur.fetchone()
        return int(now) - int(row[1]) if row else 0

    def _end_deposed_sessions(self, conn: pymysql.connections.Connection) -> None:
        """Before claiming the fence row: end the target connections of every capturer of
        an older epoch (``KILL CONNECTION``). A deposed capturer that is frozen (SIGSTOP,
        a paused VM) holds the fence row in the open transactions of its chunks; killed,
        they roll back at once, so the claim (and so this capturer's writes) need not wait
        for its connections to time out. A capturer that comes back finds its connection
        gone, and then the fence row with a newer epoch than its own."""
        if not self.meta_db:
            return
        t0 = time.monotonic()
        ended = 0
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT conn_id, boot FROM {quote_ident(self.meta_db)}.`sessions` "
                            "WHERE sender = %s AND epoch < %s", (self.name, self.epoch))
                rows = cur.fetchall()
                boot = self._server_boot(cur)
                cur.execute("SELECT CONNECTION_ID()")
                (mine,) = cur.fetchone()
                for conn_id, at in rows:
                    if abs(int(at) - boot) > 5 or int(conn_id) == int(mine):
                        continue  # (a connection of before the server's restart: its id means another now)
                    try:
                        cur.execute(f"KILL CONNECTION {int(conn_id)}")
                        ended += 1
                    except pymysql.err.MySQLError as exc:
                        if not exc.args or exc.args[0] != 1094:  # (1094: gone already)
                            log.warning("sender %s: cannot end connection %s of a deposed capturer: %s", self.name,
                                        conn_id, exc)
                cur.execute(f"DELETE FROM {quote_ident(self.meta_db)}.`sessions` WHERE sender = %s AND epoch < %s",
                            (self.name, self.epoch))
            conn.commit()
        except pymysql.err.MySQLError as exc:
            self.workers[0].drop()
            raise _classify(exc, f"ending a deposed capturer's connections ({self.meta_db}.sessions)") from exc
        if ended:
            self.count("deposed_sessions_ended", ended)
            log.info("sender %s: ended %d target connection(s) of a deposed capturer (%.2f s)", self.name, ended,
                     time.monotonic() - t0)

    def _claim_fence(self, conn: pymysql.connections.Connection) -> None:
        """Write this capturer's epoch into ``<meta_database>.fence`` (never lowering
        it): from its commit on, a capturer with an older epoch has every chunk it
        tries rolled back (``fence_check``). The update waits for the chunks a deposed
        capturer has in flight (they hold the row shared): those commit before it."""
        if not self.meta_db:
            log.warning("sender %s: meta_database is empty: the target has no fence row, a deposed capturer is "
                        "stopped only by its own lease check", self.name)
            return
        try:
            with conn.cursor() as cur:
                cur.execute(position.fence_claim_sql(self.meta_db), (self.name, self.epoch))
                cur.execute(position.fence_read_sql(self.meta_db, lock=False), (self.name,))
                row = cur.fetchone()
            conn.commit()
        except pymysql.err.MySQLError as exc:
            self.workers[0].drop()
            raise _classify(exc, f"writing the fence row ({self.meta_db}.fence)") from exc
        if row is None or int(row[0]) != self.epoch:
            raise Fenced(f"sender {self.name}: {self.meta_db}.fence holds epoch {row and row[0]}, newer than this "
                         f"capturer's {self.epoch}: another capturer took over")
        log.info("sender %s: fence row %s.fence at epoch %d", self.name, self.meta_db, self.epoch)

    def fence_check(self, conn: pymysql.connections.Connection) -> None:
        """In the chunk's own transaction, before its rows: the fence row read in share
        mode still holds this capturer's epoch (held until the commit, so a takeover's
        claim waits for it); Fenced (the chunk is rolled back) if a newer one is there."""
        if not self.epoch or not self.meta_db:
            return
        with conn.cursor() as cur:
            cur.execute(position.fence_read_sql(self.meta_db, lock=True), (self.name,))
            row = cur.fetchone()
        if row is None or int(row[0]) != self.epoch:
            raise Fenced(f"sender {self.name}: not applied: {self.meta_db}.fence holds epoch {row and row[0]}, "
                         f"this capturer's is {self.epoch} (another capturer took over)")

    def resume_key(self) -> StreamKey | None:
        """The key of the last transaction the target holds whole, read from the sender's
        rows of ``<meta_database>.lanes`` (``position.Resume``), or None (nothing there
        yet, or ``meta_database`` empty). Also keeps what the target holds of the last
        phase: of the changes after the key that the stream hands again, ``send`` skips
        exactly those the target has and completes the others lane by lane. Called after
        ``open()`` and before a retried batch (the base drops what is at or below it)."""
        if not self.meta_db:
            return None
        conn = self.workers[0].connect()
        try:
            with conn.cursor() as cur:
                cur.execute(position.select_sql(self.meta_db), (self.name,))
                rows = cur.fetchall()
                legacy = None
                if not rows:
                    legacy = self._legacy_key(cur)
            conn.commit()
        except pymysql.err.MySQLError as exc:
            self.workers[0].drop()
            raise _classify(exc, "reading the position") from exc
        try:
            resume = position.Resume.read(rows, legacy)
        except (ValueError, KeyError, TypeError, IndexError, zlib.error) as exc:
            raise SinkError(f"sender {self.name}: {self.meta_db}.{position.LANES} holds a position that cannot be "
                            f"read ({exc}); to re-apply from the checkpoint (converging), delete the sender's rows: "
                            f"DELETE FROM {quote_ident(self.meta_db)}.`{position.LANES}` WHERE sender = "
                            f"'{self.name}'", retriable=False) from exc
        key = resume.key
        self._phase = max(self._phase, resume.phase)
        self._resume = resume if resume.manifest is not None and resume.manifest.start is not None else None
        if not self._read_since_open:
            self._read_since_open = True
            self._read_at = key
            if key is not None:
                pending = resume.pending()
                log.info("sender %s: the target holds the stream up to %s (%s.%s)%s", self.name, key, self.meta_db,
                         position.LANES, f", and of phase {resume.phase} all but {sum(pending.values())} change(s) "
                         f"on {len(pending)} lane(s)" if pending else "")
        if not resume.complete:
            self._whole = key  # (the phase in flight failed: nothing after its start is known whole)
        elif key is not None and (self._whole is None or key > self._whole):
            self._whole = key
        return self._whole

    def _legacy_key(self, cur: Any) -> StreamKey | None:
        """The position the previous design kept (``<meta_database>.position``), for a
        target that has no lane rows yet (upgraded): the stream is handed again after
        it and what follows converges, as it did then."""
        try:
            cur.execute(position.legacy_select_sql(self.meta_db), (self.name,))
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] == ER_NO_SUCH_TABLE:
                return None
            raise
        return position.legacy_whole_key(cur.fetchall())

    def _load_progress(self) -> None:
        self.progress = {}
        if self.meta_db:
            conn = self.workers[0].connect()
            try:
                with conn.cursor() as cur:
                    cur.execute(f"SELECT tbl, commit_ts, region, seq FROM {quote_ident(self.meta_db)}.`applied`")
                    for tbl, ts, region, seq in cur.fetchall():
                        self.progress[str(tbl)] = (int(ts), str(region), int(seq))
                conn.commit()
            except pymysql.err.MySQLError as exc:
                self.workers[0].drop()
                raise _classify(exc, "reading replay progress") from exc
        self._progress_loaded = True

    def close(self) -> None:
        for w in self.workers:
            w.close()

    # --- sending ------------------------------------------------------------
    def _target(self, ch: RowChange) -> tuple[str, str]:
        return (self.target_db or ch.db, ch.table)

    def send(self, batch: list[Txn]) -> None:
        """Apply ``batch``; transactions at or below the target's position are dropped
        first (a sender process started again after its predecessor applied them
        gets them once more)."""
        if self._whole is not None and batch and stream_key(batch[0]) <= self._whole:
            kept = [t for t in batch if stream_key(t) > self._whole]
            log.info("sender %s: the target has %d transaction(s) of the batch already (up to %s): dropped",
                     self.name, len(batch) - len(kept), self._whole)
            batch = kept
        try:
            if not self._progress_loaded:
                self._load_progress()
            start = (0, 0)
            if self._resume is not None:
                start = self._recover(batch)
            self._send(batch, start)
        except BaseException:
            self._progress_loaded = False  # a partial batch may have committed: re-read
            raise
        finally:
            self.progress.update(self.progress_after_commit)
            self.progress_after_commit = {}

    def _recover(self, batch: list[Txn]) -> tuple[int, int]:
        """The stream hands again the changes of the target's last phase
        (``self._resume``): skip those the target holds, apply the others on the lanes
        that had them, each from where it stopped, as that same phase (its lane rows
        say how far each got, so a crash meanwhile resumes further on), and return
        where the changes after the phase begin: (transaction, seq) in ``batch``. A
        mismatch (the stream is not what the phase recorded) falls back to applying
        the batch again from its start (the previous design: keyed rows converge)."""
        r = self._resume
        assert r is not None and r.manifest is not None
        todo: dict[int, list[tuple[int, int, int]]] = {}  # lane -> [(txn, seq, place in the lane's share)]
        skipped = 0
        beyond: tuple[int, int] | None = None
        for ti, txn in enumerate(batch):
            if txn.ddl is not None:  # (a DDL is a phase of its own: past the last one)
                beyond = (ti, 0)
                break
            total = len(txn.changes)
            for seq in range(total):
                got = r.find(txn.commit_ts, txn.region, total, seq)
                if got is True or (isinstance(got, position.Place) and got.committed):
                    skipped += 1
                elif got is False:
                    beyond = (ti, seq)
                    break
                elif got is None:
                    self.count("position_mismatches")
                    log.warning("sender %s: the stream handed again is not what phase %d of the target's position "
                                "recorded (transaction %s of %s with %d change(s)); was the filter changed? Applying "
                                "the batch again from its start: keyed rows converge, rows of tables without keys "
                                "are skipped by %s.applied", self.name, r.phase, txn.commit_ts, txn.region, total,
                                self.meta_db)
                    self._resume = None
                    return (0, 0)
                else:
                    todo.setdefault(got.lane, []).append((ti, seq, got.pos))
            if beyond is not None:
                break
        self.count("resume_skips", skipped)
        if todo:
            blob = r.blob
            futures: list[Future[int]] = []
            for lane, items in sorted(todo.items()):
                ops: list[Op] = []
                units: list[list[Op]] = []
                last_txn = -1
                for ti, seq, pos in items:
                    txn = batch[ti]
                    ch = txn.changes[seq]
                    op = Op((txn.commit_ts, txn.region, seq), ch, *self._target(ch), pos)
                    if self.atomic and ti == last_txn:
                        units[-1].append(op)
                    else:
                        units.append([op])
                    last_txn = ti
                    ops.append(op)
                mark = LaneMark(r.phase, lane, blob)
                futures.append(self.workers[lane % self.n].submit(units, self.atomic, mark))
            try:
                self._wait_phase(futures)
            finally:
                for f in futures:
                    try:
                        f.result()
                    except BaseException:
                        pass
            for lane, items in todo.items():
                r.done[lane] = max(r.done.get(lane, 0), items[-1][2] + 1)
                self.count("resume_applied", len(items))
            log.info("sender %s: phase %d completed where the target lacked it: %d change(s) on %d lane(s), %d "
                     "skipped (at the target)", self.name, r.phase, sum(len(v) for v in todo.values()), len(todo),
                     skipped)
        if not r.pending():
            self._advance(r.manifest.whole)
        if beyond is None:
            return (len(batch), 0)
        self._resume = None
        return beyond

    def _send(self, batch: list[Txn], start: tuple[int, int] = (0, 0)) -> None:
        """Place the batch's changes from ``start`` (transaction, seq) on phase by phase.
        A phase is applied by the workers while the next one is placed (conflict keys,
        groups, the manifest: computing only, nothing sent); it is handed to them only
        after the one before has committed, so phases never overlap at the target.
        Barriers (a change linking two groups, a DDL) end a phase early (``_Phases``).

        Each worker writes its lane's row with every chunk of its share
        (``position``: the phase, how much of the share is committed, the manifest);
        ``_whole`` moves once a phase has committed."""
        ph = _Phases(self)
        fast = _place_txns is not None and not self.atomic
        try:
            ti, first = start
            while ti < len(batch):
                if fast:  # as the loop below, in C, up to a DDL or a spilled transaction
                    ti, first = ph.place_txns(batch, ti, first)
                    if ti == len(batch):
                        break
                txn = batch[ti]
                key = stream_key(txn)
                if txn.ddl is not None:
                    ph.flush()
                    ph.wait()
                    self._apply_ddl(txn.ddl, key)
                elif self.atomic:
                    self._place_atomic(ph, txn, first)
                else:
                    self._place_each(ph, txn, first)
                ph.placed_whole = key
                if ph.placed >= self.phase_rows:  # (never after a DDL: its flush emptied the phase)
                    ph.flush()
                ti, first = ti + 1, 0
            ph.flush()
            ph.wait()
            self._advance(ph.placed_whole)  # the batch's last transactions may have had no rows
        finally:
            # an error while placing or applying: let a phase in flight finish before
            # the batch is retried (its workers are the ones the retry uses)
            ph.settle()

    def _place_atomic(self, ph: _Phases, txn: Txn, first: int) -> None:
        """One target transaction: the whole source transaction (from change ``first``) at once."""
        ops = [Op((txn.commit_ts, txn.region, i), ch, *self._target(ch))
               for i, ch in enumerate(txn.changes) if i >= first]
        if ops:
            keys = [k for op in ops for k in conflict_keys(op.ch, op.db, op.table)]
            ph.place(keys, ops, len(txn.changes))
            ph.placed += len(ops)

    def _place_each(self, ph: _Phases, txn: Txn, first: int) -> None:
        """Each change (from ``first``) placed on its own; a full phase is handed out meanwhile."""
        total = len(txn.changes)
        ts, region, tdb = txn.commit_ts, txn.region, self.target_db
        for i, ch in enumerate(txn.changes):  # a spilled transaction is read chunk by chunk
            if i < first:
                continue
            if ph.placed >= self.phase_rows:  # bounded memory; the next phase is placed meanwhile
                ph.flush()
            s = ch.schema
            op = Op((ts, region, i), ch, tdb or s.db, s.table)
            ph.place(conflict_keys(ch, op.db, op.table), [op], total)
            ph.placed += 1

    def _advance(self, whole: StreamKey | None) -> None:
        """Every transaction up to ``whole`` is committed at the target."""
        if whole is not None and (self._whole is None or whole > self._whole):
            self._whole = whole

    #: rows per phase: the workers apply one while the sender places the next
    phase_rows = 10_000

    def _wait_phase(self, futures: list[Future[int]]) -> None:
        errors = []
        for f in futures:
            try:
                f.result()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            # a fatal error wins over a retriable one: retrying would not help it
            fatal = [e for e in errors if isinstance(e, SinkError) and not e.retriable]
            raise (fatal or errors)[0]

    # --- DDL ----------------------------------------------------------------
    _DB_LEVEL = re.compile(r"^\s*(CREATE|DROP|ALTER)\s+(DATABASE|SCHEMA)\b", re.I)

    def _ddl_sql(self, ddl: Ddl) -> tuple[str | None, str] | None:
        """(database to USE, statement) for the target, or None to skip it."""
        if self.target_db is None:
            return (ddl.session_db or None), ddl.sql
        if self._DB_LEVEL.match(ddl.sql):
            return None  # everything goes into one database: its own DDL does not apply
        sql = ddl.sql
        for db in {d for d in (ddl.db, ddl.session_db) if d}:
            pat = r"(?:`" + re.escape(db.replace("`", "``")) + r"`|(?<![\w`$.])" + re.escape(db) + r"(?![\w$]))\s*\.\s*(?=[`\w$])"
            sql = re.sub(pat, "", sql)
        return self.target_db, sql

    def _apply_ddl(self, ddl: Ddl, key: StreamKey) -> None:
        """Apply ``ddl`` (its stream key ``key``) on worker 0, every phase before it
        committed, then write its position (lane 0's row, a phase without changes) in a
        transaction of its own: MySQL commits a DDL implicitly, so the two cannot share
        one (a crash in between applies it again: "already applied" is skipped)."""
        if self.options["ddl"] == "skip":
            self.count("ddl_skipped")
            self._advance(key)
            return
        plan = self._ddl_sql(ddl)
        if plan is None:
            self.count("ddl_skipped")
            log.info("sender %s: skipping %r (database mapping is on)", self.name, ddl.sql[:100])
            self._advance(key)
            return
        use, sql = plan
        w = self.workers[0]
        mark: LaneMark | None = None
        if self.meta_db:
            self._phase += 1
            mark = LaneMark(self._phase, 0, position.Manifest(self._phase, self._whole, key).encode())

        def run() -> None:
            conn = w.connect()
            try:
                self.fence_check(conn)  # (a DDL commits on its own: checked just before it)
                with conn.cursor() as cur:
                    if use:
                        try:
                            cur.execute(f"USE {quote_ident(use)}")
                        except pymysql.err.OperationalError as exc:
                            if exc.args[0] != 1049:  # unknown database: run it unqualified
                                raise
                    stmt = self._collated(cur, sql)
                    # (its intent, in the fenced transaction: the schema state it starts from)
                    ran = self._ddl_intent(cur, ddl, stmt, use, key) if self.meta_db else False
                conn.commit()
                fencing.check(f"sender {self.name}: DDL")  # (and the lease, right before it runs)
                with conn.cursor() as cur:
                    w.doing = (time.monotonic(), f"DDL {sql[:200]!r}")
                    try:
                        if ran:
                            self.count("ddl_replays_skipped")
                            log.warning("sender %s: DDL applied on the target before a crash (the schema is no "
                                        "longer the one it started from); not run again: %s", self.name, sql[:200])
                        else:
                            cur.execute(stmt)
                    except pymysql.err.MySQLError as exc:
                        code = exc.args[0] if exc.args else 0
                        renamed = code == ER_NO_SUCH_TABLE and " RENAME " in f" {sql.upper()} "
                        # a column renamed by this statement before a crash (its position not written yet): the
                        # replay finds no column of the old name
                        renamed = renamed or (code == ER_BAD_FIELD and _RENAMES_COLUMN.search(sql) is not None)
                        if code == ER_DUP_FIELDNAME and _CREATE_TABLE.match(sql):
                            # (not a statement applied before: CREATE TABLE IF NOT EXISTS of a table there
                            # is a note; two of its columns are one name to the target)
                            raise SinkError(_same_name(ddl, sql, exc), retriable=False) from exc
                        if code in DDL_ALREADY_DONE or renamed:
                            log.warning("sender %s: DDL already applied on the target (%s); "
                                        "going on: %s", self.name, exc, sql[:200])
                        else:
                            if self.meta_db and (0 < code < 2000 or _classify(exc, "").retriable is False):
                                # refused: it did not run (an error the server answered for it: a DDL is atomic;
                                # a lock wait timeout or deadlock too, retried). Its intent is no evidence now: a
                                # schema change by someone else before the retry or after the target was mended
                                # (another sender on the same target, an operator) is not taken for its effect.
                                # (A lost connection, 2006/2013, leaves it unknown: the intent decides then.)
                                self._forget_intent(cur, key)
                            raise
                conn.commit()
                self.zero_date_columns.clear()  # (a column added, made NOT NULL, a table renamed)
                self.count("ddl_applied")
                failpoints.hit("mysql.ddl")  # (the DDL committed, its position not written yet)
                if mark is not None:
                    with conn.cursor() as cur:
                        cur.execute(position.upsert_sql(self.meta_db), (self.name, 0, mark.phase, 0, mark.manifest))
                    conn.commit()
            except BaseException as exc:
                err = _classify(exc, f"applying DDL {sql[:200]!r}")
                if err.retriable:
                    w.drop()
                raise err from exc
            finally:
                w.doing = None

        w.pool.submit(run).result()
        self._advance(key)


    def _ddl_intent(self, cur: Any, ddl: Ddl, stmt: str, use: str | None, key: StreamKey) -> bool:
        """True if ``stmt`` (the DDL at ``key``) already ran at the target: its intent row (written
        before it ran, in a run that crashed before its position) holds the schema state it started
        from and the schema is no longer that. Else its intent is written (the caller commits it)
        and it is to run. See senders/mysql/ddlstate.py."""
        where = ddlstate.scope(ddl, stmt, use, mapped=self.target_db is not None)
        kt, digest = ddlstate.key_text(key), ddlstate.stmt_digest(stmt)
        cur.execute(ddlstate.read_sql(self.meta_db), (self.name,))
        row = cur.fetchone()
        if row is not None and str(row[0]) == kt and str(row[1]) == digest:
            before = str(row[2])
            ddlstate.wait_for_twin(cur, stmt, self.name)  # (the crashed run's, still at work at the target)
            mode = ddlstate.state_mode(before)
            now = self._schema_state(cur, where, mode) if mode else None
            if now is not None:
                if now != before:
                    return True
                log.info("sender %s: DDL handed again after a crash did not run (the schema is the one it "
                         "started from): running it: %s", self.name, stmt[:200])
                return False
            # (a state this run cannot make again: the errors that say "already there" decide)
        state = self._schema_state(cur, where)
        cur.execute(ddlstate.write_sql(self.meta_db), (self.name, kt, digest, state or "none"))
        return False

    def _schema_state(self, cur: Any, where: ddlstate.Scope, mode: str | None = None) -> str | None:
        """``Fingerprint.state``, or None where the target fails to answer its lookups (seen: an
        information_schema query's temporary table gone from a shared tmpdir, error 6): the DDL then
        goes without that evidence (a replay falls back to the errors that say "already there")
        rather than stop the sender; a lost connection is raised (retried)."""
        try:
            return self._schema.state(cur, where, mode)
        except pymysql.err.MySQLError as exc:
            if _classify(exc, "").retriable:
                raise
            log.warning("sender %s: the target's schema state cannot be read (%s): the DDL goes without it",
                        self.name, exc)
            return None

    def _forget_intent(self, cur: Any, key: StreamKey) -> None:
        try:
            cur.execute(ddlstate.clear_sql(self.meta_db), (self.name, ddlstate.key_text(key)))
            cur.connection.commit()
        except pymysql.err.MySQLError:
            log.warning("sender %s: cannot mark the intent row of a refused DDL", self.name, exc_info=True)

    _NOPAD = "utf8mb4_nopad_bin"

    def _collated(self, cur: Any, sql: str) -> str:
        """``sql`` with MariaDB's binary NO PAD collation (a PostgreSQL region's text key columns:
        relations.KEY_COLLATION) named as this target names it: utf8mb4_0900_bin on MySQL 8,
        utf8mb4_bin (PAD SPACE: trailing spaces ignored) where there is neither."""
        if self._NOPAD not in sql:
            return sql
        if self._nopad_as is None:
            cur.execute("SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN "
                        "('utf8mb4_nopad_bin', 'utf8mb4_0900_bin')")
            have = {str(r[0]) for r in cur.fetchall()}
            self._nopad_as = next((c for c in (self._NOPAD, "utf8mb4_0900_bin") if c in have), "utf8mb4_bin")
        if self._nopad_as == self._NOPAD:
            return sql
        return re.sub(r"(?<= COLLATE )utf8mb4_nopad_bin(?=[ ,)]|$)", self._nopad_as, sql)


def _same_name(ddl: Ddl, sql: str, exc: BaseException) -> str:
    """The error of a CREATE TABLE the target refused for two columns of one name to it."""
    seen: dict[str, str] = {}
    pair = next(((seen[c.lower()], c) for c in create_columns(sql) if seen.setdefault(c.lower(), c) != c), None)
    cols = f"columns {quote_ident(pair[0])} and {quote_ident(pair[1])}" if pair else "two columns"
    return (f"applying DDL {sql[:200]!r}: {exc}: the source table {quote_ident(ddl.db)}.{quote_ident(ddl.table)} has "
            f"{cols}, whose names differ only in case: a MySQL target compares column names case-insensitively, so "
            "it cannot keep them apart (rename one at the source, or exclude the table in the filter)")


_CREATE_TABLE = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\b", re.I)
_RENAMES_COLUMN = re.compile(r"(?is)^\s*ALTER\b.*\b(?:CHANGE|RENAME\s+COLUMN)\b")
ER_BAD_FIELD = 1054  # unknown column


class _Phases:
    """The phases of one ``MySQLSender._send``: the one being placed (its causal groups,
    the units of each lane, its manifest) and the ones handed to the workers."""

    def __init__(self, sender: MySQLSender):
        self.sender = sender
        self.causality = Causality()
        self.lanes: dict[int, list[list[Op]]] = {}
        self.placed = 0  # changes placed in this phase
        self.keep = bool(sender.meta_db)
        self.placer: position.Placer | None = None
        # the key of the last transaction whose every row is placed (in this phase or before)
        self.placed_whole: StreamKey | None = sender._whole
        # phases handed out: their futures and the key each makes whole
        self.in_flight: list[tuple[list[Future[int]], StreamKey | None]] = []

    def wait(self) -> None:
        """The phase handed out last has committed (its key is then whole)."""
        if self.in_flight:
            futures, whole = self.in_flight[-1]
            self.sender._wait_phase(futures)  # still listed while waited for: see settle
            self.in_flight.pop()
            self.sender._advance(whole)

    def flush(self) -> None:
        """Hand the phase placed so far to its workers (once the one before committed); start the next."""
        s = self.sender
        if self.lanes:
            self.wait()
            futures: list[Future[int]] = []
            self.in_flight.append((futures, self.placed_whole))
            s.count("phases")
            blob = b""
            p = self.placer
            if p is not None:
                s._phase += 1
                p.phase, p.before = s._phase, s._whole
                blob = p.manifest(self.placed_whole).encode()
            for w, units in self.lanes.items():  # each listed as soon as it is submitted
                mark = LaneMark(s._phase, w, blob) if p is not None else None
                futures.append(s.workers[w].submit(units, s.atomic, mark))
            self.lanes.clear()
        self.causality.reset()
        self.placed = 0
        self.placer = None

    def place(self, keys: list[str], unit: list[Op], total: int) -> None:
        """Put ``unit`` (consecutive changes of one transaction of ``total``, conflict keys ``keys``)
        on the lane of its causal group; a unit linking two groups ends the phase first (a barrier)."""
        s = self.sender
        group = self.causality.place(keys)
        if group is None:  # the keys link two groups
            s.count("barriers")
            self.flush()
            group = self.causality.place(keys)
            assert group is not None
        w = stable_hash(group) % s.n
        self.lanes.setdefault(w, []).append(unit)
        if self.keep:
            p = self.placer
            if p is None:
                # (numbered when handed out, after the phase in flight: see flush)
                p = self.placer = position.Placer(0, None, s.n)
            head = unit[0].ident
            pos = p.add(head[0], head[1], total, head[2], w, len(unit))
            for op in unit:  # (a unit: consecutive changes of one transaction)
                op.pos = pos
                pos += 1

    def place_txns(self, batch: list[Txn], ti: int, i: int) -> tuple[int, int]:
        """``_send``'s loop from transaction ``ti``, change ``i``, in C (``_place_txns``): runs of
        changes placed as ``_place_each`` and ``place`` place each, a full phase handed out and a barrier
        made between them; returns at the batch's end or at a transaction for the Python path (a DDL, a
        spilled transaction): where it is."""
        s = self.sender
        while ti < len(batch):
            if self.placed >= s.phase_rows:  # bounded memory; the next phase is placed meanwhile
                self.flush()
            if self.keep and self.placer is None:
                self.placer = position.Placer(0, None, s.n)
            ti, i, self.placed, barrier, whole = _place_txns(
                self.causality.relations, self.lanes, s.n, self.placer, batch, ti, i, self.placed, s.phase_rows,
                s.target_db)
            if whole >= 0:
                self.placed_whole = stream_key(batch[whole])
            if barrier:  # change i of transaction ti links two groups: the phase ends first
                s.count("barriers")
                self.flush()
            elif self.placed < s.phase_rows:
                break  # the batch's end, or a transaction for the Python path
        return ti, i

    def settle(self) -> None:
        """Let every phase handed out finish (after an error: the retry uses the same workers)."""
        for futures, _whole in self.in_flight:
            for f in futures:
                try:
                    f.result()
                except BaseException:
                    pass
