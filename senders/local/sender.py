"""The local-file sender: one JSON line per row change (or SQL text), fsync'd
before acknowledging, rotated by size.

Files: ``filepath`` is the file being written; full ones are renamed to
``filepath.000001``, ``filepath.000002``, ... (read them in that order, then
``filepath``). A file is rotated only between batches, so a transaction never
spans two files.

No duplicates, no loss: the file itself says how far it got. At start (and
before a failed batch is retried) the sender reads the end of the file: a torn
last line, and the lines of a transaction whose last line (``"last": true``;
``COMMIT;`` or the statement of a DDL in the SQL format) is not there, are cut
(they were never acknowledged), and the key of the last whole transaction is
the sender's position (``resume_key``): the stream hands it nothing at or below
it, so what was written after the last checkpoint is not written again.
``(region, commit_ts, seq)`` still identifies every line.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar

from capturer.errors import SinkError
from capturer.model import LsnPosition, Position, RowChange, StreamKey, TableSchema, Txn
from capturer.model.encode import _fallback, _fastrows, encode_line_bytes
from capturer.model.spill import SpilledChanges
from capturer.util import failpoints
from capturer.util.durable import fsync_dir
from capturer.util.ini import Key, p_bool, p_choice, p_int, p_nonempty
from senders.base import Sender
from senders.sqlbuild import build

log = logging.getLogger(__name__)


def txn_lines_json(txn: Txn) -> Iterator[bytes]:
    """One JSON line per row change (without the newline): the reference encoding."""
    head = _head(txn)
    if txn.ddl is not None:
        d = {**head, "seq": txn.ddl.seq, "db": txn.ddl.db, "table": txn.ddl.table, "op": "ddl",
             "sql": txn.ddl.sql, "txn_rows": 0, "last": True}
        yield json.dumps(d, ensure_ascii=False).encode()
        return
    n = len(txn.changes)
    # the transaction's fields are the same on every line: encode them once
    prefix = encode_line_bytes(head)[:-1] + b", "
    for i, ch in enumerate(txn.changes):
        yield prefix + _line_tail(i, ch, n)


def _line_tail(i: int, ch: RowChange, n: int) -> bytes:
    d: dict[str, Any] = {
        "seq": i,
        "db": ch.db,
        "table": ch.table,
        "op": ch.op,
        "pk": list(ch.schema.pk),
        "before": ch.before,
        "after": ch.after,
        "txn_rows": n,
        "last": i == n - 1,
    }
    return encode_line_bytes(d)[1:]


SLICE_ROWS = 10_000  # lines rendered at once: a huge transaction is never rendered whole in memory


def _head(txn: Txn) -> dict[str, Any]:
    head = {
        "region": txn.region,
        "commit_ts": txn.commit_ts,
        "position": txn.position.to_json(),
        "gtid": txn.gtid,
        "source_ts": txn.source_ts,
    }
    if txn.snapshot is not None:
        head["snapshot"] = txn.snapshot.to_json()
    return head


def _schema_piece(schema: TableSchema) -> tuple[bytes, bytes]:
    """The parts of a line that depend only on its table (for the C encoder)."""
    a = encode_line_bytes({"db": schema.db, "table": schema.table, "op": ""})
    b = encode_line_bytes({"pk": list(schema.pk), "before": None})
    return a[1:a.rindex(b'""')], b", " + b[1:-5]


def txn_blocks_json(txn: Txn) -> Iterator[bytes]:
    """``txn_lines_json`` as blocks of whole lines, each line ending in a newline;
    the C encoder renders a slice of lines in one call where it was built."""
    if txn.ddl is not None or _fastrows is None:
        yield from _join_slices(txn_lines_json(txn))
        return
    n = len(txn.changes)
    prefix = encode_line_bytes(_head(txn))[:-1] + b", "
    seq0 = 0
    slices = txn.changes.chunks() if isinstance(txn.changes, SpilledChanges) else (
        txn.changes[i:i + SLICE_ROWS] for i in range(0, n, SLICE_ROWS))
    for part in slices:
        try:
            yield _fastrows.json_lines(prefix, part, _schema_piece, _fallback, seq0, n)
        except (TypeError, ValueError, UnicodeError):  # e.g. a lone surrogate: the exact per-line path decides
            yield b"".join(prefix + _line_tail(seq0 + i, ch, n) + b"\n" for i, ch in enumerate(part))
        seq0 += len(part)


def _join_slices(lines: Iterator[bytes]) -> Iterator[bytes]:
    block: list[bytes] = []
    for line in lines:
        block.append(line)
        if len(block) >= SLICE_ROWS:
            yield b"\n".join(block) + b"\n"
            block = []
    if block:
        yield b"\n".join(block) + b"\n"


def txn_blocks_sql(txn: Txn) -> Iterator[bytes]:
    return _join_slices(txn_lines_sql(txn))


def txn_lines_sql(txn: Txn) -> Iterator[bytes]:
    for line in _txn_lines_sql(txn):
        yield line.encode("utf-8")


def _txn_lines_sql(txn: Txn) -> Iterator[str]:
    p = txn.position
    where = f"{p.file}:{p.pos}" if isinstance(p, Position) else f"lsn:{p}" if isinstance(p, LsnPosition) else f"ts:{p.ts}"
    tag = f"-- region={txn.region} commit_ts={txn.commit_ts} position={where}"
    if txn.ddl is not None:
        use = f"USE `{txn.ddl.db.replace('`', '``')}`; " if txn.ddl.db else ""
        yield tag + (f" ddl seq={txn.ddl.seq}" if txn.ddl.seq else " ddl")
        yield f"{use}{txn.ddl.sql};"
        yield "-- ddl end"  # the statement may span lines: this says it is whole
        return
    yield tag + f" rows={len(txn.changes)}"
    yield "BEGIN;"
    for i, ch in enumerate(txn.changes):
        sql, _ = build(ch, literal=True)
        yield f"/* seq={i} */ {sql};"
    yield "COMMIT;"


_TAG = re.compile(rb"^-- region=(.*) commit_ts=(\d+) position=\S* (?:rows=(\d+)|ddl(?: seq=(-?\d+))?)$")


def _tail_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(start offset, line without its newline) of the file's lines, last first (the
    piece after the final newline, if any, comes first: a torn line)."""
    with open(path, "rb") as f:
        pos = f.seek(0, os.SEEK_END)
        carry = b""  # the start of a line whose beginning is in an earlier chunk
        chunk = 1 << 16
        while True:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start) + carry
            lines = buf.split(b"\n")
            end = start + len(buf)
            for i in range(len(lines) - 1, 0, -1):
                line = lines[i]
                end -= len(line)
                yield end, line
                end -= 1
            if start == 0:
                yield 0, lines[0]
                return
            carry, pos = lines[0], start
            chunk = min(chunk * 2, 1 << 24)


def _last_whole_txn(path: Path, sql: bool) -> tuple[int, StreamKey | None]:
    """(byte offset just after the file's last whole transaction, its key)."""
    size = path.stat().st_size
    if size == 0:
        return 0, None
    whole_end = None  # SQL: the end of the last line of a whole transaction, once seen
    for off, line in _tail_lines(path):
        end_of_line = off + len(line) + 1
        if end_of_line > size:  # no newline at the end: a torn line
            continue
        if not sql:
            # a transaction's last line says "last": true at its top level (a column named "last" in an image is
            # nested: the line is parsed to tell)
            if b'"last": true' not in line:
                continue
            try:
                d = json.loads(line)
            except ValueError as exc:
                raise SinkError(f"{path}: the line at byte {off} is not JSON ({exc}): not a file this sender "
                                "wrote; move it away", retriable=False) from None
            if not isinstance(d, dict) or d.get("last") is not True:
                continue
            sub = d["seq"] if d.get("op") == "ddl" and d["seq"] < 0 else 0
            return end_of_line, (int(d["commit_ts"]), str(d["region"]), int(sub))
        # SQL: a transaction ends with COMMIT;, a DDL with "-- ddl end"; its tag line gives its key
        if whole_end is None and line in (b"COMMIT;", b"-- ddl end"):
            whole_end = end_of_line
            continue
        m = _TAG.match(line)
        if m is not None and whole_end is not None:
            region, ts, seq = m.group(1).decode("utf-8", "surrogateescape"), int(m.group(2)), m.group(4)
            return whole_end, (ts, region, int(seq) if seq and int(seq) < 0 else 0)
    return (0, None) if not sql else (_sql_header_end(path), None)


def _sql_header_end(path: Path) -> int:
    with open(path, "rb") as f:
        first = f.readline()
    return len(first) if first.startswith(b"SET time_zone") and first.endswith(b"\n") else 0


class LocalSender(Sender):
    KEYS: ClassVar[list[Key]] = [
        Key("filepath", p_nonempty, "./data/binlog.jsonl", doc="file to write"),
        Key("format", p_choice("json", "sql"), "json", doc="json lines or SQL statements"),
        Key("rotate_mb", p_int(1, 1_000_000), 256, doc="rotate when the file exceeds this size"),
        Key("fsync", p_bool, True, doc="fsync before acknowledging (turning it off risks loss)"),
    ]
    batch_rows = 20000

    def __init__(self, name: str, options: dict[str, Any], queue_rows: int = 100_000):
        super().__init__(name, options, queue_rows)
        self.path = Path(options["filepath"])
        self.rotate_bytes = int(options["rotate_mb"]) * 1024 * 1024
        self.fsync = bool(options["fsync"])
        self.render = txn_blocks_sql if options["format"] == "sql" else txn_blocks_json
        self._f: IO[bytes] | None = None
        self._size = 0
        self._rotated = 0  # the number of the newest rotated file (learnt at open)
        self._lock_fd: int | None = None  # the flock on <path>.lock while open

    def _lock(self) -> None:
        """Become the file's one writer: an flock on ``<path>.lock`` (released by close,
        or when the process ends, even by kill -9). Another capturer writing the same
        file (high availability: a deposed one that still runs) makes this one wait."""
        if self._lock_fd is not None:
            return
        lock = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            # (polled every 0.2 s: the writer, once it stops, frees the file at once; a takeover must not
            # then sit in a growing back-off)
            raise SinkError(f"{self.path} is being written by another process (pid {holder}, {lock}): waiting for "
                            "it to stop", poll=0.2) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock()
            self._rotated = self._rotation()
            self._cut_torn_tail()
            self._f = open(self.path, "ab")
            self._size = self._f.tell()
        except OSError as exc:
            raise SinkError(f"cannot open {self.path}: {exc}") from exc
        if self.options["format"] == "sql" and self._size == 0:
            self._write(b"SET time_zone='+00:00';\n")

    def resume_key(self) -> StreamKey | None:
        """The key of the file's last whole transaction, after cutting what follows it
        (a torn line, a transaction cut short by a crash or a failed write)."""
        reopen = self._f is not None
        self._close_file()
        try:
            key = self._cut_to_whole_transaction()
            if reopen:
                self._f = open(self.path, "ab")
                self._size = self._f.tell()
        except OSError as exc:
            raise SinkError(f"cannot read the end of {self.path}: {exc}") from exc
        return key

    def _rotation(self) -> int:
        """The number of the newest rotated file (0: none)."""
        pat = re.compile(re.escape(self.path.name) + r"\.(\d{6,})$")
        return max((int(m.group(1)) for p in self.path.parent.iterdir() if (m := pat.match(p.name))), default=0)

    def _acked_bytes(self, path: Path) -> int:
        """How much of ``path`` the checkpoint says was acknowledged (0 if it does not know)."""
        st = self.position_state if self.position_state is not None else self.resume_state
        if not st or path != self.path or st.get("rotation") != self._rotated:
            return 0
        v = st.get("bytes", 0)
        return v if isinstance(v, int) and v >= 0 else 0

    def _files_newest_first(self) -> list[Path]:
        pat = re.compile(re.escape(self.path.name) + r"\.(\d{6,})$")
        rotated = sorted(((int(m.group(1)), p) for p in self.path.parent.iterdir() if (m := pat.match(p.name))),
                         reverse=True)
        return [self.path] + [p for _, p in rotated]

    def _cut_to_whole_transaction(self) -> StreamKey | None:
        for path in self._files_newest_first():
            if not path.exists():
                continue
            end, key = _last_whole_txn(path, self.options["format"] == "sql")
            size = path.stat().st_size
            acked = self._acked_bytes(path)
            if end < acked:
                raise SinkError(f"{path}: its last whole transaction ends at byte {end}, but {acked} bytes of it were "
                                "acknowledged (the checkpoint's state of this sender): the file was changed by "
                                "something else; nothing was cut: restore it or move it away", retriable=False)
            if end < size:
                if path != self.path:  # only the file being written can hold a transaction cut short
                    raise SinkError(f"{path}: its last transaction is incomplete ({size - end} bytes after its last "
                                    "whole transaction); it was rotated, so it should be whole: restore it")
                log.warning("%s: cutting %d bytes after the last whole transaction (written, never acknowledged)",
                            path, size - end)
                with open(path, "rb+") as f:
                    f.truncate(end)
                    f.flush()
                    os.fsync(f.fileno())
            if key is not None:
                return key
        return None

    def _cut_torn_tail(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            pos = size
            chunk = 65536
            while pos > 0:
                start = max(0, pos - chunk)
                f.seek(start)
                buf = f.read(pos - start)
                k = buf.rfind(b"\n")
                if k >= 0:
                    end = start + k + 1
                    break
                pos = start
            else:
                end = 0
            if end != size:
                log.warning("%s: cutting %d bytes of a torn last line", self.path, size - end)
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())

    def _write(self, data: bytes) -> None:
        assert self._f is not None
        failpoints.hit("local.write")
        self._f.write(data)
        self._size += len(data)

    def send(self, batch: list[Txn]) -> None:
        try:
            if self._f is None:
                self.open()
            # written in blocks of lines, so a huge transaction is never rendered whole in memory
            pending: list[bytes] = []
            size = 0
            for txn in batch:
                for block in self.render(txn):
                    pending.append(block)
                    size += len(block)
                    if size >= 4 << 20:
                        self._write(b"".join(pending))
                        pending, size = [], 0
            if pending:
                self._write(b"".join(pending))
            self._f.flush()  # type: ignore[union-attr]
            if self.fsync:
                os.fsync(self._f.fileno())  # type: ignore[union-attr]
            if self._size >= self.rotate_bytes:
                self._rotate()
            # what an acknowledgement of this batch covers: a start never cuts below it
            self.position_state = {"rotation": self._rotated, "bytes": self._size}
        except OSError as exc:
            # the file may now hold part of the batch; reopen and rewrite it whole
            # on retry (a duplicate line is identifiable, a lost one is not)
            self._close_file()
            raise SinkError(f"write to {self.path} failed: {exc}") from exc

    def _rotate(self) -> None:
        self._close_file()
        pat = re.compile(re.escape(self.path.name) + r"\.(\d{6,})$")
        nums = [int(m.group(1)) for p in self.path.parent.iterdir() if (m := pat.match(p.name))]
        self._rotated = max(nums) + 1 if nums else 1
        dest = self.path.with_name(f"{self.path.name}.{self._rotated:06d}")
        os.rename(self.path, dest)
        fsync_dir(self.path.parent)
        log.info("%s: rotated to %s", self.path, dest.name)
        self._f = open(self.path, "ab")
        self._size = 0

    def _close_file(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None

    def close(self) -> None:
        self._close_file()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
