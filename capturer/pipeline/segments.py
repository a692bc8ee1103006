"""The stream log's backlog on disk (capturer/pipeline/backlog.py is the stream log).

The backlog's files (``<backlogDir>/<first offset>.seg``) are a sequence of
records, each ``HEADER`` (payload length, CRC-32 of the payload, offset, the
stream's running row count at the item, flags) and a payload of msgpack values
in the agents' wire format (``capturer.model.wire``): a schema record before the
first item that uses a table definition (in each segment), then per item
``["k", commit_ts, region, sub]`` and the item's values. A segment is fsync'd
when it is closed and before every checkpoint that refers to it (the checkpoint
names the last segment and its length then): a power loss can cost only records
that no checkpoint refers to, and those are read again from the sources. A
segment goes once every attached sender has acknowledged its last item. A record
that does not match its checksum, or a segment the checkpoint needs that is
missing, is an error naming the file (``BacklogError``): never a silent skip.
"""


from __future__ import annotations

import collections
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capturer.errors import CheckpointError
from capturer.model import Item, StreamKey, Txn, wire
from capturer.util import failpoints
from capturer.util.durable import fsync_dir

log = logging.getLogger(__name__)

HEADER = struct.Struct("<IIqqB")  # payload length, crc32, offset, running rows, flags
F_SCHEMA, F_ITEM, F_SAMEPOS = 1, 2, 4
SEGMENT_BYTES = 64 << 20
# the segment files' buffers, the writer's and each reader's: records are a few to some hundred KB, and
# memory holds what is written until a flush (before a reader reads it, and the fsync of a checkpoint)
SEGMENT_BUFFER = 1 << 20
DECODED_ROWS = 50_000  # rows of items read back kept decoded for the other senders reading there (Backlog.decoded)
_SCHEMA_PREFIX = b"\x99\xa1s"  # a packed ["s", ...] value (9 elements): a table definition


class BacklogError(CheckpointError):
    """The backlog cannot be trusted (a bad record, a missing segment): start-up stops."""


@dataclass
class BacklogMark:
    """What a checkpoint keeps of the backlog: the offset the next item gets, and the
    last segment with its length when the checkpoint was written (everything up to
    there is fsync'd)."""

    next: int = 0
    segment: str = ""
    bytes: int = 0
    rows: int = 0  # the stream's running row count at ``next`` (for lag in rows)

    def to_json(self) -> dict[str, Any]:
        return {"next": self.next, "segment": self.segment, "bytes": self.bytes, "rows": self.rows}

    @classmethod
    def from_json(cls, d: Any) -> BacklogMark:
        if not isinstance(d, dict):
            raise ValueError(f"backlog must be an object, got {d!r}")
        nxt, seg, size, rows = d.get("next", 0), d.get("segment", ""), d.get("bytes", 0), d.get("rows", 0)
        if not isinstance(nxt, int) or isinstance(nxt, bool) or nxt < 0:
            raise ValueError(f"backlog.next must be a non-negative integer, got {nxt!r}")
        if not isinstance(seg, str) or (seg and not _segment_name_ok(seg)):
            raise ValueError(f"backlog.segment must be a segment file name, got {seg!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"backlog.bytes must be a non-negative integer, got {size!r}")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise ValueError(f"backlog.rows must be a non-negative integer, got {rows!r}")
        return cls(nxt, seg, size, rows)


def _segment_name(first: int) -> str:
    return f"{first:020d}.seg"


def _segment_name_ok(name: str) -> bool:
    return len(name) == 24 and name.endswith(".seg") and name[:20].isdigit()


# --- the disk --------------------------------------------------------------------------

@dataclass
class _Segment:
    path: Path
    first: int  # offset of its first item
    last: int = -1  # offset of its last item (-1: none yet)
    size: int = 0


class Backlog:
    """The segment files. Written by the stream's evictions (one writer, under the
    StreamLog's lock), read by any number of ``SegmentReader``."""

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int = SEGMENT_BYTES):
        self.dir = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.segments: list[_Segment] = []
        self._file: Any = None  # the last segment, open for appending
        self._encoder = wire.Encoder()
        self._last_pos: dict[str, Any] = {}
        self.written_items = 0
        self.written_bytes = 0
        self.flushed_to = -1  # every record up to this offset is in the OS (readable)
        self.lock = threading.Lock()  # segment list changes vs. readers looking for a segment
        # the first item the checkpoint on disk may still need (None: no limit): set at open
        # and after each checkpoint is written (``keep_for_checkpoint``)
        self.durable_below: int | None = None
        # items read back lately, by offset: senders reading the same stretch decode it once
        self._decoded: collections.OrderedDict[int, Item] = collections.OrderedDict()
        self._decoded_rows = 0
        self._decoded_lock = threading.Lock()
        self.decoded_hits = 0

    # -- start-up --
    def open(self, mark: BacklogMark | None, need_from: int | None, read_only: bool = False) -> int:
        """Take the directory as a checkpoint left it: records after ``mark`` (written
        after that checkpoint, never referred to) are cut, every record from
        ``need_from`` (the oldest offset a sender still needs) to the mark is checked
        against its checksum, and segments nobody needs go. Returns the offset the
        next item gets. BacklogError if something needed is missing or corrupt.

        ``read_only`` (``--check``): the same checks, and nothing is cut or removed
        (a check may run while a capturer runs on the same directory)."""
        listing = list(self.dir.iterdir()) if self.dir.is_dir() else []  # made at the first write
        names = sorted(p.name for p in listing if _segment_name_ok(p.name))
        others = [p.name for p in listing if not _segment_name_ok(p.name) and not p.name.startswith(".")]
        if others and not read_only:
            log.warning("backlog %s: ignoring files that are not segments: %s", self.dir, ", ".join(sorted(others)[:5]))
        nxt = mark.next if mark is not None else 1  # offsets start at 1
        if mark is None or not mark.segment:
            self._open_empty(names, need_from, nxt, read_only)
            return nxt
        segs = self._cut_to_mark(names, mark, need_from, nxt, read_only)
        # check what is needed, and learn every segment's last offset
        start = need_from if need_from is not None else nxt
        last = self.dir / mark.segment
        for s in segs:
            s.size = mark.bytes if s.path == last else s.path.stat().st_size
            for off, _rows, flags, _payload in _records(s.path, verify=True, end=s.size):
                if flags & F_ITEM:
                    s.last = off
        keep = [s for s in segs if s.last >= start]
        if not read_only:
            for s in segs:
                if s not in keep:
                    s.path.unlink()
        if keep and keep[0].first > start and need_from is not None and need_from < nxt:
            raise BacklogError(self._lost(start, keep[0].first, "its segments begin later"))
        if not keep and need_from is not None and need_from < nxt:
            raise BacklogError(self._lost(start, nxt, "no segment holds it"))
        if read_only:
            return nxt
        self.segments = keep
        self.flushed_to = nxt - 1
        if keep:
            log.info("backlog %s: %d segment(s), %d bytes, items %d..%d kept for senders behind", self.dir,
                     len(keep), self.bytes, keep[0].first, nxt - 1)
        return nxt

    def _open_empty(self, names: list[str], need_from: int | None, nxt: int, read_only: bool) -> None:
        """(``open``) No checkpoint refers to any segment: whatever is here was never
        acknowledged as durable, and goes; a sender that needs items before ``nxt`` has lost them."""
        if not read_only:
            for n in names:
                (self.dir / n).unlink()
            if names:
                log.info("backlog %s: removed %d segment(s) no checkpoint refers to", self.dir, len(names))
        if need_from is not None and need_from < nxt:
            raise BacklogError(self._lost(need_from, nxt, "the backlog holds no segment"))

    def _cut_to_mark(self, names: list[str], mark: BacklogMark, need_from: int | None, nxt: int,
                     read_only: bool) -> list[_Segment]:
        """(``open``) The segments up to the mark's, the mark's cut to its checkpointed length
        (segments begun after it removed); BacklogError when the mark's segment is missing
        or shorter than the checkpoint says."""
        if mark.segment not in names:
            raise BacklogError(self._lost(need_from if need_from is not None else nxt, nxt,
                                          f"segment {self.dir / mark.segment} is missing"))
        cut = names.index(mark.segment)
        if not read_only:
            for n in names[cut + 1:]:  # begun after the checkpoint
                (self.dir / n).unlink()
        names = names[:cut + 1]
        last = self.dir / mark.segment
        size = last.stat().st_size
        if size < mark.bytes:
            raise BacklogError(f"backlog segment {last}: {size} bytes, the checkpoint says {mark.bytes} were "
                               f"written and fsync'd; {self._way_out()}")
        if size > mark.bytes and not read_only:
            with open(last, "r+b") as f:
                f.truncate(mark.bytes)
                os.fsync(f.fileno())
        return [_Segment(self.dir / n, int(n[:20])) for n in names]

    def _way_out(self) -> str:
        return ("restore the directory as it was, or start once with --rebuild-backlog: the sources are read "
                "again from the position of the sender furthest behind (their logs must still hold it), and "
                "each sender skips what it already has")

    def _lost(self, need: int, upto: int, why: str) -> str:
        return (f"backlog {self.dir}: items {need}..{upto - 1} of the stream are needed by a sender that is "
                f"behind, but {why}; {self._way_out()}")

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- writing (under the StreamLog's lock) --
    def full(self, extra: int = 0) -> bool:
        return self.bytes + extra > self.max_bytes

    def append(self, offset: int, rows_at: int, key: StreamKey, item: Item, samepos: bool) -> None:
        if self._file is None or self.segments[-1].size >= self.segment_bytes:
            self._rotate(offset)
        seg = self.segments[-1]
        # the item's record is one msgpack array (one unpack): its key, then its values; its schemas go
        # before it, in records of their own
        parts = [b"", wire.packb(["k", key[0], key[1], key[2]])]
        out = []
        for data, _rows in self._encoder.item(item):
            if data[:3] == _SCHEMA_PREFIX:
                out.append(HEADER.pack(len(data), zlib.crc32(data), offset, rows_at, F_SCHEMA))
                out.append(data)
            else:
                parts.append(data)
        parts[0] = _array_header(len(parts) - 1)
        n = crc = 0
        for p in parts:  # (the payload's length and checksum without joining it)
            n += len(p)
            crc = zlib.crc32(p, crc)
        out.append(HEADER.pack(n, crc, offset, rows_at, F_ITEM | (F_SAMEPOS if samepos else 0)))
        out += parts
        f = self._file
        size = 0
        for p in out:  # into the file's buffer (SEGMENT_BUFFER): a write to the OS per megabyte, not per item
            f.write(p)
            size += len(p)
        failpoints.hit("backlog.write")
        seg.size += size
        seg.last = offset
        self.written_items += 1
        self.written_bytes += size

    def _rotate(self, first: int) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        path = self.dir / _segment_name(first)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab", buffering=SEGMENT_BUFFER)
        with self.lock:
            self.segments.append(_Segment(path, first))
        fsync_dir(self.dir)
        self._encoder = wire.Encoder()  # a segment is read from its start: its schemas are its own

    def flush(self, upto: int) -> None:
        if self._file is not None:
            self._file.flush()
        self.flushed_to = max(self.flushed_to, upto)

    def sync(self, nxt: int) -> BacklogMark:
        """fsync what was written; the mark a checkpoint keeps."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
        if not self.segments:
            return BacklogMark(nxt)
        seg = self.segments[-1]
        return BacklogMark(nxt, seg.path.name, seg.size)

    def release(self, below: int) -> int:
        """Remove segments whose every item is below ``below`` and below ``durable_below``
        (what the checkpoint on disk still needs: the senders' acknowledgements run ahead
        of it, and a kill -9 before the next checkpoint restarts from the one on disk);
        bytes freed."""
        freed = 0
        if self.durable_below is not None:
            below = min(below, self.durable_below)
        with self.lock:
            while self.segments and self.segments[0].last < below and self.segments[0].last >= 0 \
                    and (len(self.segments) > 1 or self._file is None):
                s = self.segments.pop(0)
                freed += s.size
                s.path.unlink(missing_ok=True)
            # the last segment, open for writing: once everything in it is released, start a new one
            if len(self.segments) == 1 and self._file is not None and 0 <= self.segments[0].last < below:
                s = self.segments.pop(0)
                self._file.close()
                self._file = None
                freed += s.size
                s.path.unlink(missing_ok=True)
        return freed

    def keep_for_checkpoint(self, senders: dict[str, Any], names: set[str], default: int) -> None:
        """A checkpoint is on disk: what its senders (those in ``names``, not detached) will
        read from at a restart is what ``release`` must keep (``default`` when none is behind)."""
        needs = [sp.offset + 1 for n, sp in senders.items() if n in names and not sp.detached]
        self.durable_below = min(needs, default=default)

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def decoded(self, offset: int) -> Item | None:
        """The item at ``offset`` if a reader decoded it lately (items are never changed
        once made: memory hands the same objects to every sender too)."""
        with self._decoded_lock:
            item = self._decoded.get(offset)
            if item is not None:
                self.decoded_hits += 1
            return item

    def remember(self, offset: int, item: Item) -> None:
        if isinstance(item, Txn) and not isinstance(item.changes, tuple):
            return  # (a big transaction spilled to a reader's own files)
        weight = item.weight if isinstance(item, Txn) else 1
        with self._decoded_lock:
            if offset in self._decoded:  # (two readers decoded it at once)
                return
            self._decoded[offset] = item
            self._decoded_rows += weight
            while self._decoded_rows > DECODED_ROWS and self._decoded:
                _, old = self._decoded.popitem(last=False)
                self._decoded_rows -= old.weight if isinstance(old, Txn) else 1

    def segment_for(self, offset: int) -> _Segment:
        """The segment that holds ``offset`` (the last one that begins at or before it)."""
        with self.lock:
            found = None
            for s in self.segments:
                if s.first <= offset:
                    found = s
                else:
                    break
        if found is None:
            raise BacklogError(f"backlog {self.dir}: item {offset} is needed but no segment holds it (the oldest "
                               f"begins at {self.segments[0].first if self.segments else 'none'})")
        return found


def _array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` elements (the elements follow, packed)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")



def _records(path: Path, verify: bool = True, end: int | None = None) -> Iterator[tuple[int, int, int, bytes]]:
    """(offset, running rows, flags, payload) of each record of a segment file (up to
    byte ``end``: a record running past it is an error)."""
    with open(path, "rb") as f:
        pos = 0
        limit = end if end is not None else f.seek(0, os.SEEK_END)
        f.seek(0)
        while pos < limit:
            head = f.read(HEADER.size)
            if len(head) < HEADER.size or pos + HEADER.size > limit:
                raise BacklogError(f"backlog segment {path}: a record header is cut short at byte {pos}")
            n, crc, off, rows, flags = HEADER.unpack(head)
            payload = f.read(n)
            if len(payload) < n or pos + HEADER.size + n > limit or (verify and zlib.crc32(payload) != crc):
                raise BacklogError(f"backlog segment {path}: the record at byte {pos} (item {off}) does not match "
                                   "its checksum or runs past the end the checkpoint names (the file was damaged); "
                                   "restore it, or start once with --rebuild-backlog (the sources are read again "
                                   "from the position of the sender furthest behind)")
            yield off, rows, flags, payload
            pos += HEADER.size + n


class SegmentReader:
    """Reads items from the backlog for one cursor, in offset order. A segment is
    read from its start (its table definitions are its own); the last one may still
    grow: a reader stops at the first record it is not asked for."""

    def __init__(self, backlog: Backlog, spill_rows: int = 0, spill_dir: str = ""):
        self.backlog = backlog
        self.spill_rows, self.spill_dir = spill_rows, spill_dir
        self._seg: _Segment | None = None
        self._f: Any = None
        self._pos = 0
        self._decoder = self._new_decoder()

    @staticmethod
    def _new_decoder() -> wire.Decoder:
        d = wire.Decoder("")
        d.reuse_positions = True
        return d

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def _open(self, seg: _Segment) -> None:
        self.close()
        self._seg = seg
        self._f = open(seg.path, "rb", buffering=SEGMENT_BUFFER)
        self._pos = 0
        self._decoder = self._new_decoder()

    def _record(self, upto: int) -> tuple[int, int, int, bytes] | None:
        """The next record if it is complete and before ``upto``; None at the end (or at ``upto``)."""
        f = self._f
        f.seek(self._pos)
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            return None
        n, crc, off, rows, flags = HEADER.unpack(head)
        if off >= upto:
            return None
        payload = f.read(n)
        if len(payload) < n or zlib.crc32(payload) != crc:
            assert self._seg is not None
            raise BacklogError(f"backlog segment {self._seg.path}: the record at byte {self._pos} (item {off}) does "
                               "not match its checksum (the file was damaged); restore it, or start once with "
                               "--rebuild-backlog (the sources are read again from the position of the sender "
                               "furthest behind)")
        self._pos += HEADER.size + n
        return off, rows, flags, payload

    def read(self, start: int, upto: int, max_weight: int) -> list[tuple[int, int, Item, bool]]:
        """Items with offsets from ``start`` up to ``upto`` (excluded), at most about
        ``max_weight`` rows: (offset, running rows before it, item, samepos)."""
        out: list[tuple[int, int, Item, bool]] = []
        weight = 0
        while start < upto and weight < max_weight:
            if self._seg is None:
                self._open(self.backlog.segment_for(start))
            rec = self._record(upto)
            if rec is None:  # the end of this segment: the next one holds what follows
                nxt = self._following()
                if nxt is None:
                    raise BacklogError(f"backlog {self.backlog.dir}: item {start} is not in any segment")
                self._open(nxt)
                continue
            off, _rows, flags, payload = rec
            if flags & F_SCHEMA:
                for v in wire.unpacker(payload):
                    self._decoder.schema(v)
                continue
            if off < start:
                continue
            item = self.backlog.decoded(off)
            if item is None:
                item = self._decode(payload)
                self.backlog.remember(off, item)
            out.append((off, rec[1], item, bool(flags & F_SAMEPOS)))
            weight += item.weight if isinstance(item, Txn) else 1
            start = off + 1
        return out

    def _following(self) -> _Segment | None:
        with self.backlog.lock:
            segs = self.backlog.segments
            for i, s in enumerate(segs):
                if s is self._seg:
                    return segs[i + 1] if i + 1 < len(segs) else None
            # ours was removed (everything in it acknowledged): the first one left
            return segs[0] if segs else None

    def _decode(self, payload: bytes) -> Item:
        item = self._decode_fast(payload)
        if item is not None:
            return item
        try:
            values = iter(wire.unpackb(payload))
        except ValueError as exc:
            raise BacklogError(f"backlog segment {self._seg.path if self._seg else '?'}: an unreadable record: "
                               f"{exc}") from None
        head = next(values)
        if not (isinstance(head, list) and len(head) == 4 and head[0] == "k"):
            raise BacklogError(f"backlog segment {self._seg.path if self._seg else '?'}: a record without its key")
        self._decoder.region = str(head[2])
        got: list[Item] = []
        reader = wire.TxnReader(self._decoder, self.spill_rows, self.spill_dir,
                                lambda fields, changes, _spilled: got.append(Txn(changes=changes, **fields)),
                                got.append)
        reader.feed(values)
        if len(got) != 1:
            raise BacklogError(f"backlog segment {self._seg.path if self._seg else '?'}: a record holds "
                               f"{len(got)} items")
        return got[0]

    def _decode_fast(self, payload: bytes) -> Item | None:
        """``_decode`` for what the writer makes, in one pass (``wire.unpack_item``: the rows read in C
        straight into RowChange objects, no lists in between); None for anything else (no C build, a
        transaction to spill, a record that does not read as expected): ``_decode`` reads it."""
        dec = self._decoder
        try:
            values = wire.unpack_item(payload, dec, self.spill_rows)
        except Exception:  # (the reference path reads it again, and raises what it raises)
            return None
        if values is None or len(values) < 2:
            return None
        head, v = values[0], values[1]
        if not (head.__class__ is list and len(head) == 4 and head[0] == "k" and v.__class__ is list and v):
            return None
        dec.region = str(head[2])
        try:
            if v[0] == "h" and len(values) == 2:
                return dec.heartbeat(v)
            if v[0] != "t" or len(v) != 9:
                return None
            fields, total = dec.fields(v)
        except wire.WireError:
            return None
        changes = v[8]
        for c in values[2:]:  # (the reference refuses a value after the transaction's last row)
            if not (c.__class__ is list and len(c) == 2 and c[0] == "c") or len(changes) >= total:
                return None
            changes += c[1]
        if len(changes) != total:
            return None
        return Txn(changes=tuple(changes), **fields)


# --- the stream and its cursors ------------------------------------------------------------
