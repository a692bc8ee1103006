"""Best-effort reading of which database and table a DDL statement changes."""

from __future__ import annotations

import re

_NAME = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_QNAME = rf"({_NAME}(?:\s*\.\s*{_NAME})?)"
_COMMENT = re.compile(r"/\*.*?\*/|--[^\n]*\n|#[^\n]*\n", re.S)
_TABLE_DDL = re.compile(
    r"^(?:CREATE|ALTER|DROP|TRUNCATE|RENAME)\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?"
    r"(?:ONLINE\s+|IGNORE\s+)?TABLE\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?" + _QNAME,
    re.I,
)
_TRUNCATE = re.compile(r"^TRUNCATE\s+(?!TABLE\b)" + _QNAME, re.I)
_INDEX_DDL = re.compile(
    r"^(?:CREATE|DROP)\s+(?:OR\s+REPLACE\s+)?(?:ONLINE\s+)?(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?"
    r"INDEX\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?" + _NAME + r"\s+(?:USING\s+\w+\s+)?ON\s+" + _QNAME,
    re.I,
)
_DB_DDL = re.compile(
    r"^(?:CREATE|DROP|ALTER)\s+(?:OR\s+REPLACE\s+)?(?:DATABASE|SCHEMA)\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?("
    + _NAME + ")",
    re.I,
)


_ALTER_BODY = re.compile(r"\s*ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE(?:\s+|(?=`))(?:IF\s+EXISTS\s+)?" + _QNAME + r"\s*(.*)$",
                         re.I | re.S)
NAME = _NAME  # one identifier, bare or backquoted (a backquote inside doubled)


def alter_clauses(sql: str) -> str | None:
    """What follows the table's name in an ALTER TABLE (comments removed), or None for
    another statement. The name may be backquoted with spaces, dots, commas or
    backquotes inside it."""
    m = _ALTER_BODY.match(re.sub(r"/\*.*?\*/", " ", sql, flags=re.S))
    return m.group(2) if m else None


def _unquote(n: str) -> str:
    n = n.strip()
    if n.startswith("`") and n.endswith("`"):
        return n[1:-1].replace("``", "`")
    return n


def split_qname(q: str) -> tuple[str | None, str]:
    parts = re.findall(_NAME, q)
    if len(parts) == 2:
        return _unquote(parts[0]), _unquote(parts[1])
    return None, _unquote(parts[0])


def ddl_target(sql: str, current_db: str) -> tuple[str, str]:
    """(db, table) a statement changes; table is "" for a database-level one."""
    s = _COMMENT.sub(" ", sql).strip()
    for rx in (_TABLE_DDL, _TRUNCATE, _INDEX_DDL):
        m = rx.match(s)
        if m:
            db, table = split_qname(m.group(1))
            return db or current_db, table
    m = _DB_DDL.match(s)
    if m:
        return _unquote(m.group(1)), ""
    return current_db, ""


_IGNORED = re.compile(r"^(?:SAVEPOINT|ROLLBACK\s+TO|RELEASE\s+SAVEPOINT|XA\s)", re.I)


def is_ignorable(sql: str) -> bool:
    """Statements inside a transaction that change no data by themselves."""
    return bool(_IGNORED.match(_COMMENT.sub(" ", sql).strip()))


_DATA_DDL = re.compile(
    r"^(?:CREATE|ALTER|DROP|RENAME|TRUNCATE)\b(?!\s+(?:USER|ROLE|SERVER|EVENT|LOGFILE|TABLESPACE)\b)",
    re.I,
)


def is_data_ddl(sql: str) -> bool:
    """Statements that change data objects (tables, databases, indexes, views...);
    account and server statements (GRANT, CREATE USER, FLUSH ...) are not passed on."""
    return bool(_DATA_DDL.match(_COMMENT.sub(" ", sql).strip()))


_RENAME = re.compile(r"^RENAME\s+TABLES?\s+(.*)$", re.I | re.S)
_RENAME_PAIR = re.compile(rf"^\s*{_QNAME}\s+TO\s+{_QNAME}\s*$", re.I | re.S)
_ALTER_RENAME = re.compile(
    rf"^ALTER\s+(?:ONLINE\s+|IGNORE\s+)?TABLE\s+{_QNAME}\s+RENAME\s+(?:TO\s+|AS\s+)?{_QNAME}\s*;?\s*$", re.I | re.S)


def _split_top(s: str) -> list[str]:
    """``s`` split at the commas outside backquotes."""
    out: list[str] = []
    cur: list[str] = []
    quoted = False
    for ch in s:
        if ch == "`":
            quoted = not quoted
        if ch == "," and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


_DROP_TABLES = re.compile(r"^DROP\s+(TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.*?)"
                          r"(?:\s+(?:WAIT\s+\d+|NOWAIT))?(?:\s+(?:RESTRICT|CASCADE))?\s*;?\s*$", re.I | re.S)


def dropped_tables(sql: str, current_db: str) -> list[tuple[str, str]]:
    """The ``(db, table)`` pairs a ``DROP TABLE a[, b ...]`` drops, ``[(db, "")]`` for a
    ``DROP DATABASE`` / ``DROP SCHEMA`` (every table of it), none for a ``DROP TEMPORARY
    TABLE`` (a session's table: the binlog's rows never named it) or any other statement."""
    s = _COMMENT.sub(" ", sql).strip()
    m = _DB_DDL.match(s)
    if m and s[:4].upper() == "DROP":
        return [(_unquote(m.group(1)), "")]
    m = _DROP_TABLES.match(s)
    if m is None or m.group(1):
        return []
    out = []
    for piece in _split_top(m.group(2)):
        if not re.fullmatch(_QNAME, piece.strip()):
            return []
        db, table = split_qname(piece.strip())
        out.append((db or current_db, table))
    return out


def renamed_tables(sql: str, current_db: str) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """The ``((db, old), (db, new))`` pairs a ``RENAME TABLE a TO b[, c TO d]`` or an
    ``ALTER TABLE a RENAME [TO|AS] b`` statement renames (none for any other statement)."""
    s = _COMMENT.sub(" ", sql).strip().rstrip(";")
    m = _ALTER_RENAME.match(s)
    parts: list[tuple[str, str]] = []
    if m:
        parts = [(m.group(1), m.group(2))]
    else:
        m = _RENAME.match(s)
        if m is None:
            return []
        for piece in _split_top(m.group(1)):
            pm = _RENAME_PAIR.match(piece)
            if pm is None:
                return []
            parts.append((pm.group(1), pm.group(2)))
    out = []
    for a, b in parts:
        (da, ta), (db_, tb) = split_qname(a), split_qname(b)
        out.append(((da or current_db, ta), (db_ or current_db, tb)))
    return out


_STRING_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a"}


def string_value(lit: str) -> str:
    """The value of a MySQL string literal (``'...'`` or ``"..."``): backslash escapes
    (``\\%`` and ``\\_`` keep their backslash, as MySQL keeps them) and a doubled quote."""
    q, body = lit[0], lit[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append("\\" + nxt if nxt in "%_" else _STRING_ESCAPES.get(nxt, nxt))
            i += 2
        elif ch == q and body[i + 1:i + 2] == q:
            out.append(q)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def create_columns(sql: str) -> list[str]:
    """The column names a CREATE TABLE defines (best effort: each definition of its
    parenthesised list that begins with a name that is not a key or constraint word)."""
    pieces: list[str] = []
    cur: list[str] = []
    depth, quote, escaped = 0, "", False
    for ch in _COMMENT.sub(" ", sql):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote != "`":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "`'\"":
            quote = ch
        elif ch == "(":
            depth += 1
            if depth == 1:
                continue
        elif ch == ")":
            depth -= 1
            if depth == 0:
                pieces.append("".join(cur))
                break
        elif ch == "," and depth == 1:
            pieces.append("".join(cur))
            cur = []
            continue
        if depth >= 1:
            cur.append(ch)
    out = []
    for piece in pieces:
        m = re.match(r"\s*(" + _NAME + r")", piece)
        if m and m.group(1).upper() not in ("PRIMARY", "UNIQUE", "KEY", "INDEX", "CONSTRAINT", "FOREIGN", "CHECK",
                                            "FULLTEXT", "SPATIAL", "PERIOD", "SYSTEM"):
            out.append(_unquote(m.group(1)))
    return out
