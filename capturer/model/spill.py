"""Big transactions on disk.

A region holds a transaction's row changes in memory until it commits. Past
``spill_rows`` rows, it writes them in chunks to a temporary file instead, and
the transaction it emits carries a ``SpilledChanges``: a read-only sequence
that loads one chunk at a time. Senders iterate it like the usual tuple, so a
one-million-row transaction costs a chunk of memory per sender, not the whole
transaction.

The file is unlinked as soon as it is created (``tempfile.TemporaryFile``): it
disappears with the last reference to the transaction, and after a crash there
is nothing to clean up. Readers use ``os.pread`` on the shared descriptor, so
any number of senders can read it at once from their own threads.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable, Iterator
from itertools import islice
from typing import IO, Any

from capturer.model import RowChange, TableSchema
from capturer.util import failpoints

DEFAULT_CHUNK_ROWS = 20_000


class SpilledChanges:
    """The row changes of one transaction, pickled in chunks to an unlinked file."""

    def __init__(self, f: IO[bytes], chunks: list[tuple[int, int, int]], schemas: list[TableSchema],
                 directory: str | None, chunk_rows: int):
        self._f = f
        self._chunks = chunks  # (offset, length, rows)
        self._schemas = schemas
        self._len = sum(n for _, _, n in chunks)
        self.directory = directory
        self.chunk_rows = chunk_rows

    @property
    def schemas(self) -> tuple[TableSchema, ...]:
        """Every table schema the changes refer to."""
        return tuple(self._schemas)

    # in-memory weight for bounded queues: about one chunk is ever loaded per reader
    @property
    def memory_rows(self) -> int:
        return min(self._len, self.chunk_rows)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def _load(self, off: int, length: int) -> list[RowChange]:
        data = os.pread(self._f.fileno(), length, off)
        if len(data) != length:
            raise OSError(f"spill file truncated: wanted {length} bytes at {off}, got {len(data)}")
        schemas = self._schemas
        return [RowChange(schemas[si], op, before, after) for si, op, before, after in pickle.loads(data)]

    def chunks(self) -> Iterator[list[RowChange]]:
        for off, length, _ in self._chunks:
            yield self._load(off, length)

    def __iter__(self) -> Iterator[RowChange]:
        for chunk in self.chunks():
            yield from chunk

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._len)
            return tuple(islice(self, start, stop, step))
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("row change index out of range")
        for off, length, n in self._chunks:
            if i < n:
                return self._load(off, length)[i]
            i -= n
        raise IndexError("row change index out of range")  # pragma: no cover

    def filter_map(self, fn: Callable[[RowChange], RowChange | None]) -> SpilledChanges | tuple[RowChange, ...]:
        """``fn`` on every change, None dropped: a new spill, or a tuple when no
        more than a chunk is left (then nothing is written)."""
        w: SpillWriter | None = None
        kept: list[RowChange] = []
        for chunk in self.chunks():
            kept.extend(out for out in map(fn, chunk) if out is not None)
            if len(kept) > self.chunk_rows:
                w = w or SpillWriter(self.directory, self.chunk_rows)
                w.add(kept)
                kept = []
        if w is None:
            return tuple(kept)
        if kept:
            w.add(kept)
        return w.finish()

    def __repr__(self) -> str:
        return f"SpilledChanges({self._len} rows in {len(self._chunks)} chunks)"


def write_blob(f: Any, data: bytes, directory: str | None, what: str) -> None:
    """Append ``data`` to the spill file ``f``; a failure (disk full) names the
    directory and what was being spilled."""
    try:
        failpoints.hit("spill.write")
        f.write(data)
        f.flush()
    except OSError as exc:
        where = directory or tempfile.gettempdir()
        raise OSError(exc.errno, f"spilling {what} to {where} failed: {exc.strerror or exc}") from exc


class SpillWriter:
    def __init__(self, directory: str | None = None, chunk_rows: int = DEFAULT_CHUNK_ROWS):
        self.directory = directory
        self.chunk_rows = chunk_rows
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._f = tempfile.TemporaryFile(dir=directory, prefix="capturer-spill-")
        self._chunks: list[tuple[int, int, int]] = []
        self._schemas: list[TableSchema] = []
        self._schema_index: dict[int, int] = {}
        self._off = 0

    def add(self, changes: list[RowChange]) -> None:
        """Write ``changes`` (in chunks of at most ``chunk_rows``)."""
        for start in range(0, len(changes), self.chunk_rows):
            part = changes[start:start + self.chunk_rows]
            rows = []
            for ch in part:
                si = self._schema_index.get(id(ch.schema))
                if si is None or self._schemas[si] is not ch.schema:
                    si = len(self._schemas)
                    self._schemas.append(ch.schema)
                    self._schema_index[id(ch.schema)] = si
                rows.append((si, ch.op, ch.before, ch.after))
            data = pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)
            write_blob(self._f, data, self.directory, "a big transaction")
            failpoints.hit("spill.chunk")
            self._chunks.append((self._off, len(data), len(part)))
            self._off += len(data)

    @property
    def rows(self) -> int:
        return sum(n for _, _, n in self._chunks)

    def truncate(self, rows: int) -> None:
        """Keep only the first ``rows`` changes written (a ``ROLLBACK TO SAVEPOINT`` inside a
        spilled transaction): the chunks after go, the chunk across the cut is written again."""
        total = 0
        for i, (off, length, n) in enumerate(self._chunks):
            if total + n > rows:
                data = os.pread(self._f.fileno(), length, off)
                part = [RowChange(self._schemas[si], op, before, after)
                        for si, op, before, after in pickle.loads(data)][: rows - total]
                del self._chunks[i:]
                self._f.flush()
                self._f.truncate(off)
                self._f.seek(off)
                self._off = off
                if part:
                    self.add(part)
                return
            total += n

    def finish(self) -> SpilledChanges:
        self._f.flush()
        return SpilledChanges(self._f, self._chunks, self._schemas, self.directory, self.chunk_rows)
