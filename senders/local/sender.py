"""The local-file sender: one JSON line per row change (or SQL text), fsync'd
before acknowledging, rotated by size.

Files: ``filepath`` is the file being written; full ones are renamed to
``filepath.000001``, ``filepath.000002``, ... (read them in that order, then
``filepath``). After ``kill -9`` a torn last line is cut off at start-up: it
was never acknowledged, so it is read again from the checkpoint. Lines written
after the last checkpoint may appear twice after a crash; ``(region,
commit_ts, seq)`` identifies them.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar

from capturer.errors import SinkError
from capturer.model import LsnPosition, Position, RowChange, TableSchema, Txn
from capturer.model.encode import _fallback, _fastrows, encode_line_bytes
from capturer.model.spill import SpilledChanges
from capturer.util import failpoints
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
        yield tag + " ddl"
        yield f"{use}{txn.ddl.sql};"
        return
    yield tag + f" rows={len(txn.changes)}"
    yield "BEGIN;"
    for i, ch in enumerate(txn.changes):
        sql, _ = build(ch, literal=True)
        yield f"/* seq={i} */ {sql};"
    yield "COMMIT;"


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

    def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._cut_torn_tail()
            self._f = open(self.path, "ab")
            self._size = self._f.tell()
        except OSError as exc:
            raise SinkError(f"cannot open {self.path}: {exc}") from exc
        if self.options["format"] == "sql" and self._size == 0:
            self._write(b"SET time_zone='+00:00';\n")

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
        except OSError as exc:
            # the file may now hold part of the batch; reopen and rewrite it whole
            # on retry (a duplicate line is identifiable, a lost one is not)
            self._close_file()
            raise SinkError(f"write to {self.path} failed: {exc}") from exc

    def _rotate(self) -> None:
        self._close_file()
        pat = re.compile(re.escape(self.path.name) + r"\.(\d{6,})$")
        nums = [int(m.group(1)) for p in self.path.parent.iterdir() if (m := pat.match(p.name))]
        dest = self.path.with_name(f"{self.path.name}.{(max(nums) + 1 if nums else 1):06d}")
        os.rename(self.path, dest)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
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
