"""The lake's commit log: each batch of the Spark sender becomes visible once,
whole, with the sender's position recorded in the same atomic step.

Layout (next to the tables of ``senders.spark.lake``)::

    <warehouse>/_capturer/commits.jsonl   the commit log: one JSON line per committed batch
    <warehouse>/_capturer/lock            flock'ed by the one sender that writes the lake
    <warehouse>/<name>/_staging/          a batch's files until it is committed

A batch is written in three steps:

1. **Stage.** Every Parquet file of the batch (all its tables) is written into
   its table's ``_staging/`` directory under its final name,
   ``part-b<batch, 12 digits>-<n>-<token>.snappy.parquet``, and fsync'd; then
   the staging directories are fsync'd. No reader looks there (Spark reads
   ``<name>/changelog``).
2. **Commit.** One line is appended to ``commits.jsonl`` and fdatasync'd: the
   batch number, the stream key of the batch's last transaction, and its files.
   This append is the commit point: a batch whose line is whole in the log is
   committed, any other never was.
3. **Publish.** Each staged file is renamed into ``<name>/changelog/``.

Recovery (``CommitLog.recover``, run by the sender at open, before a retried
batch and after a failed attempt): a torn last line of the log (a crash during
the append) is cut; staged files of a committed batch (number <= the log's
last) are renamed into the changelog (a crash between commit and publish),
those of any later batch are deleted (never committed). Batches are committed
one at a time in stream order, so after recovery the changelog holds exactly
the batches up to the log's last line, each once, and that line's key is the
sender's position (``resume_key``).

A log line (keys in this order; ``crc`` is the CRC-32, as 8 hex digits, of the
line's bytes before ``,"crc":``)::

    {"batch":12,"key":[commit_ts,"region",sub],"files":{"<name>":["part-b...parquet"]},
     "rows":5000,"time":"2026-01-01T00:00:00Z","crc":"1a2b3c4d"}

The log is rewritten (a temp file, fsync'd, renamed over it) with its last
lines only once it passes ``MAX_LOG_BYTES``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from capturer.errors import SinkError
from capturer.model import StreamKey, key_from_json, key_to_json
from capturer.util.durable import fsync_dir

log = logging.getLogger(__name__)

META_DIR = "_capturer"
LOG_FILE = "commits.jsonl"
LOCK_FILE = "lock"
STAGING = "_staging"
MAX_LOG_BYTES = 4 << 20  # rewritten with its last KEEP_LINES lines beyond this
KEEP_LINES = 1000
_TAIL = 64 << 10  # the log's end is read in pieces of this size

_PART = re.compile(r"^part-b(\d{12})-")
_SPARK_DIR = re.compile(r"^spark-b(\d{12})-")


def part_name(batch: int, n: int, token: str) -> str:
    """The name of the ``n``-th file of a batch, staged and published alike."""
    return f"part-b{batch:012d}-{n}-{token}.snappy.parquet"


def spark_dir_name(batch: int, n: int, token: str) -> str:
    """The directory Spark's writer writes the ``n``-th piece of a batch into (in ``_staging``)."""
    return f"spark-b{batch:012d}-{n}-{token}"


def batch_of(name: str) -> int | None:
    """The batch number a staged or published file name carries, None for other names
    (changelog files written before the commit log existed: ``part-<uuid>``)."""
    m = _PART.match(name) or _SPARK_DIR.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Commit:
    """One line of the commit log."""

    batch: int
    key: StreamKey
    files: dict[str, list[str]] = field(default_factory=dict)  # lake table name -> published file names
    rows: int = 0
    time: str = ""

    def line(self) -> bytes:
        body = json.dumps({"batch": self.batch, "key": key_to_json(self.key), "files": self.files,
                           "rows": self.rows, "time": self.time or _now()},
                          separators=(",", ":"), ensure_ascii=True)[:-1]
        return f'{body},"crc":"{zlib.crc32(body.encode()):08x}"}}\n'.encode()

    @classmethod
    def parse(cls, line: bytes) -> Commit | None:
        """The commit a whole line (without its newline) holds; None if it is not one
        (torn, or not written by ``line``)."""
        i = line.rfind(b',"crc":"')
        if i < 0 or not line.endswith(b'"}') or len(line) != i + 18:
            return None
        if line[i + 8:i + 16] != f"{zlib.crc32(line[:i]):08x}".encode():
            return None
        try:
            d = json.loads(line)
            key = key_from_json(d["key"])
            files = d.get("files") or {}
            batch = d["batch"]
            if (key is None or not isinstance(batch, int) or batch < 1 or not isinstance(files, dict)
                    or not all(isinstance(v, list) for v in files.values())):
                return None
            return cls(batch, key, files, int(d.get("rows", 0)), str(d.get("time", "")))
        except (ValueError, KeyError, TypeError):
            return None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())



class CommitLog:
    """The commit log of one warehouse, as its writer (the sender) or a reader sees it.

    Only a holder of the lock (``lock()``) appends, recovers or cuts a torn tail;
    ``last()`` without the lock only reads."""

    def __init__(self, warehouse: Path):
        self.warehouse = warehouse
        self.dir = warehouse / META_DIR
        self.path = self.dir / LOG_FILE
        self._lock_fd: int | None = None
        self._fd: int | None = None  # the log, opened for appending (the lock's holder)

    # --- the lock -------------------------------------------------------------
    def lock(self) -> bool:
        """Become the lake's one writer (an flock on ``_capturer/lock``, released by
        ``unlock`` or when the process ends, even by kill -9). False if another
        process (or another CommitLog of this one) holds it."""
        if self._lock_fd is not None:
            return True
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        return True

    def holder(self) -> str:
        """The pid written by the lock's holder (for messages)."""
        try:
            return (self.dir / LOCK_FILE).read_text().strip() or "?"
        except OSError:
            return "?"

    def unlock(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # (closing the descriptor releases the flock)
            self._lock_fd = None

    @property
    def locked(self) -> bool:
        return self._lock_fd is not None

    # --- reading --------------------------------------------------------------
    def last(self) -> Commit | None:
        """The last committed batch (None: none yet, or no log). With the lock, a torn
        tail (bytes after the last whole line: a crash during an append) is cut.
        More than one bad line at the end is corruption, not a crash: a non-retriable
        SinkError (a crash tears at most the one line it was appending)."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SinkError(f"cannot read the lake's commit log {self.path}: {exc}") from exc
        with f:
            size = f.seek(0, os.SEEK_END)
            end = size  # bytes [0, end) are read into buf
            buf = b""
            while True:
                start = max(0, end - _TAIL)
                f.seek(start)
                buf = f.read(end - start) + buf
                end = start
                found = self._last_in(buf, start)
                if found is not None or start == 0:
                    break
        commit, good_end = found if found is not None else (None, 0)
        tail = size - good_end
        if tail:
            torn = buf[len(buf) - tail:] if tail <= len(buf) else b""
            if torn.count(b"\n") > 1 or (commit is None and size > _TAIL):
                raise SinkError(
                    f"the lake's commit log {self.path} is corrupt: the {tail} bytes after its last good line "
                    f"(which ends at byte {good_end}) are more than the one torn line a crash leaves. Restore it, "
                    "or move the warehouse aside and rebuild the lake", retriable=False)
            if self.locked:
                log.warning("%s: cutting a torn last line (%d bytes: a crash while a batch was being committed; "
                            "that batch was never committed)", self.path, tail)
                with open(self.path, "r+b") as w:
                    w.truncate(good_end)
                    w.flush()
                    os.fsync(w.fileno())
        return commit

    @staticmethod
    def _last_in(buf: bytes, start: int) -> tuple[Commit, int] | None:
        """The last good line in ``buf`` (the file's bytes from ``start`` to its end) and
        the file offset just after it; None if ``buf`` holds none."""
        stop = len(buf)  # lines end before stop
        while stop > 0:
            nl = buf.rfind(b"\n", 0, stop)
            if nl < 0:
                return None
            begin = buf.rfind(b"\n", 0, nl) + 1
            if begin == 0 and start > 0:
                return None  # the line may start before buf: read more
            c = Commit.parse(buf[begin:nl])
            if c is not None:
                return c, start + nl + 1
            stop = nl
        return None

    # --- writing --------------------------------------------------------------
    def append(self, commit: Commit) -> None:
        """Commit a batch: its line appended and fdatasync'd (the lock's holder only).
        A failed write is retriable (the torn line is cut by the next ``last()``); a
        failed fdatasync is not (what reached the disk is unknown)."""
        assert self.locked, "only the lock's holder appends"
        line = commit.line()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                fsync_dir(self.dir)  # (the log's name, and the directory's, when this created them)
                fsync_dir(self.warehouse)
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            self._close_fd()
            raise SinkError(f"cannot commit batch {commit.batch} to {self.path}: {exc}") from exc
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            self._close_fd()
            raise SinkError(f"fsync of the lake's commit log {self.path} failed ({exc}): whether batch "
                            f"{commit.batch} reached the disk is unknown; check the disk, then restart",
                            retriable=False) from exc
        if os.fstat(self._fd).st_size > MAX_LOG_BYTES:
            self._rewrite()

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _rewrite(self) -> None:
        """Keep the log's last KEEP_LINES lines (a temp file, fsync'd, renamed over it)."""
        self._close_fd()
        lines = self.path.read_bytes().splitlines(keepends=True)[-KEEP_LINES:]
        tmp = self.path.with_name(LOG_FILE + ".tmp")
        with open(tmp, "wb") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.dir)

    # --- recovery -------------------------------------------------------------
    def recover(self) -> Commit | None:
        """Bring the lake to its last committed batch (the lock's holder only): cut a
        torn log line, publish the staged files of committed batches, delete those of
        uncommitted ones (and any leftovers of a crash mid-write). Returns the last
        commit. Idempotent; safe after any crash."""
        assert self.locked, "only the lock's holder recovers"
        self._close_fd()  # (a failed append may have left a torn line: cut by last())
        last = self.last()
        done = last.batch if last is not None else 0
        listed = {n for names in last.files.values() for n in names} if last is not None else set()
        published = removed = 0
        if self.warehouse.exists():
            for tdir in sorted(p for p in self.warehouse.iterdir() if p.is_dir()):
                stage = tdir / STAGING
                if stage.is_dir():
                    p, r = _recover_staging(stage, tdir / "changelog", done, listed)
                    published += p
                    removed += r
                cl = tdir / "changelog"
                if cl.is_dir():
                    for old in cl.glob(".part-*.tmp"):  # (half-written files of the sender before commits)
                        old.unlink(missing_ok=True)
        if published or removed:
            log.warning("lake %s: recovered to batch %d: %d staged file(s) of committed batches published, "
                        "%d of uncommitted ones removed", self.warehouse, done, published, removed)
        return last


def _recover_staging(stage: Path, changelog: Path, done: int, listed: set[str]) -> tuple[int, int]:
    """Publish the staged files of committed batches (of the last one: those its line
    names), delete the rest; (published, removed of uncommitted batches)."""
    published = removed = 0
    for p in sorted(stage.iterdir()):
        b = batch_of(p.name)
        if (b is not None and (b < done or (b == done and p.name in listed)) and p.is_file()
                and _PART.match(p.name)):
            dest = changelog / p.name
            if dest.exists():
                p.unlink()
            else:
                changelog.mkdir(parents=True, exist_ok=True)
                os.replace(p, dest)
                published += 1
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed += b is not None and b > done
    if published:
        fsync_dir(changelog)
    if published or removed:
        fsync_dir(stage)
    return published, removed


def recover_if_idle(warehouse: Path) -> None:
    """For a reader (``lake.register_tables``): if no sender holds the lake, bring it
    to its last committed batch (a crash between a commit and its publication leaves
    committed files staged until the sender's next start). Best effort: a read-only
    warehouse, or a sender that runs (it recovered at its start), leaves it as is."""
    if not (warehouse / META_DIR / LOG_FILE).exists():
        return
    cl = CommitLog(warehouse)
    try:
        if not cl.lock():
            return
        cl.recover()
    except (OSError, SinkError) as exc:
        log.warning("lake %s: not recovered for reading: %s", warehouse, exc)
    finally:
        cl.unlock()
