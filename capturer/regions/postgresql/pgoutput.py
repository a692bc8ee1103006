"""The pgoutput logical replication messages (protocol version 1), parsed.

Format: PostgreSQL documentation, "Logical Replication Message Formats".
Integers are big-endian; strings end with a zero byte. Each message is one
XLogData payload of the replication stream. Pure functions, no I/O: unit
tested with bytes built by hand (tests/unit/test_pgoutput.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from capturer.errors import SourceError

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")

# TupleData column kinds
NULL, UNCHANGED, TEXT, BINARY = "n", "u", "t", "b"


class ProtocolError(SourceError):
    """A replication message this parser cannot read (retried from the last position)."""


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    commit_time: int  # microseconds since 2000-01-01 UTC
    xid: int


@dataclass(frozen=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    key: bool  # part of the replica identity


@dataclass(frozen=True)
class Relation:
    relid: int
    namespace: str
    name: str
    replident: str  # d(efault) n(othing) f(ull) i(ndex)
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class TypeMsg:
    oid: int
    namespace: str
    name: str


# one column of a tuple: (kind, text); text is None for n and u
Tuple = tuple[tuple[str, str | bytes | None], ...]


@dataclass(frozen=True)
class Insert:
    relid: int
    new: Tuple


@dataclass(frozen=True)
class Update:
    relid: int
    old: Tuple | None  # the old key ('K') or old row ('O'), when the server sent it
    old_kind: str  # 'K', 'O' or ''
    new: Tuple


@dataclass(frozen=True)
class Delete:
    relid: int
    old: Tuple
    old_kind: str


@dataclass(frozen=True)
class Truncate:
    relids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True)
class Other:
    """Origin, logical decoding messages and anything else the region ignores."""

    tag: str


Message = Begin | Commit | Relation | TypeMsg | Insert | Update | Delete | Truncate | Other


class _Reader:
    __slots__ = ("b", "i")

    def __init__(self, b: bytes):
        self.b = b
        self.i = 0

    def take(self, n: int) -> bytes:
        if self.i + n > len(self.b):
            raise ProtocolError(f"pgoutput message cut short ({len(self.b)} bytes)")
        out = self.b[self.i:self.i + n]
        self.i += n
        return out

    def _num(self, st: struct.Struct) -> int:
        if self.i + st.size > len(self.b):
            raise ProtocolError(f"pgoutput message cut short ({len(self.b)} bytes)")
        (v,) = st.unpack_from(self.b, self.i)
        self.i += st.size
        return int(v)

    def i8(self) -> int:
        return self._num(_I8)

    def i16(self) -> int:
        return self._num(_I16)

    def i32(self) -> int:
        return self._num(_I32)

    def u32(self) -> int:
        return self._num(_U32)

    def i64(self) -> int:
        return self._num(_I64)

    def u64(self) -> int:
        return self._num(_U64)

    def byte(self) -> str:
        return chr(self.take(1)[0])

    def string(self) -> str:
        end = self.b.find(b"\0", self.i)
        if end < 0:
            raise ProtocolError("pgoutput string without its terminating zero byte")
        s = self.b[self.i:end].decode("utf-8", "surrogateescape")
        self.i = end + 1
        return s

    def tuple(self) -> Tuple:
        """TupleData (the hot path: one tight loop, no method calls per column)."""
        b, i = self.b, self.i
        end = len(b)
        if i + 2 > end:
            raise ProtocolError(f"pgoutput message cut short ({end} bytes)")
        n = (b[i] << 8) | b[i + 1]
        if n & 0x8000:
            raise ProtocolError(f"negative column count in a pgoutput tuple ({n - 0x10000})")
        i += 2
        cols: list[tuple[str, str | bytes | None]] = []
        append = cols.append
        for _ in range(n):
            if i >= end:
                raise ProtocolError(f"pgoutput message cut short ({end} bytes)")
            kind = b[i]
            i += 1
            if kind == 0x74 or kind == 0x62:  # 't', 'b'
                if i + 4 > end:
                    raise ProtocolError(f"pgoutput message cut short ({end} bytes)")
                ln = int.from_bytes(b[i:i + 4], "big", signed=True)
                i += 4
                if ln < 0 or i + ln > end:
                    raise ProtocolError(f"pgoutput value of {ln} bytes past the message's end ({end} bytes)")
                raw = b[i:i + ln]
                i += ln
                if kind == 0x74:
                    append((TEXT, raw.decode("utf-8", "surrogateescape")))
                else:
                    append((BINARY, raw))
            elif kind == 0x6E:  # 'n'
                append(_NULL_COL)
            elif kind == 0x75:  # 'u'
                append(_UNCHANGED_COL)
            else:
                raise ProtocolError(f"unknown tuple column kind {chr(kind)!r}")
        self.i = i
        return tuple(cols)


_NULL_COL: tuple[str, None] = (NULL, None)
_UNCHANGED_COL: tuple[str, None] = (UNCHANGED, None)


def parse(payload: bytes) -> Message:
    """One pgoutput message."""
    if not payload:
        raise ProtocolError("empty pgoutput message")
    r = _Reader(payload)
    tag = r.byte()
    if tag == "B":
        return Begin(r.u64(), r.i64(), r.u32())
    if tag == "C":
        return Commit(r.i8(), r.u64(), r.u64(), r.i64())
    if tag == "R":
        relid = r.u32()
        ns, name = r.string(), r.string()
        ident = r.byte()
        cols = []
        for _ in range(r.i16()):
            flags = r.i8()
            cname = r.string()
            cols.append(Column(cname, r.u32(), r.i32(), bool(flags & 1)))
        return Relation(relid, ns, name, ident, tuple(cols))
    if tag == "I":
        relid = r.u32()
        if r.byte() != "N":
            raise ProtocolError("INSERT without its new tuple")
        return Insert(relid, r.tuple())
    if tag == "U":
        relid = r.u32()
        kind = r.byte()
        old: Tuple | None = None
        old_kind = ""
        if kind in ("K", "O"):
            old, old_kind = r.tuple(), kind
            kind = r.byte()
        if kind != "N":
            raise ProtocolError(f"UPDATE: expected the new tuple, got {kind!r}")
        return Update(relid, old, old_kind, r.tuple())
    if tag == "D":
        relid = r.u32()
        kind = r.byte()
        if kind not in ("K", "O"):
            raise ProtocolError(f"DELETE: expected the old key or row, got {kind!r}")
        return Delete(relid, r.tuple(), kind)
    if tag == "T":
        n = r.i32()
        opts = r.i8()
        return Truncate(tuple(r.u32() for _ in range(n)), bool(opts & 1), bool(opts & 2))
    if tag == "Y":
        return TypeMsg(r.u32(), r.string(), r.string())
    return Other(tag)
