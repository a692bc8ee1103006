"""Best-effort reading of which database and table a DDL statement changes."""

from __future__ import annotations

import re
from typing import Any

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


# --- the column changes of an ALTER TABLE (the lake, the file's replay and Kafka's verify) --------

def split_clauses(s: str) -> list[str]:
    """``s`` split at the commas outside parentheses, quotes and backquotes (a string's
    backslash escape, ``\\'``, does not end it)."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote, escaped = 0, "", False
    for ch in s:
        if quote:
            cur.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\" and quote != "`":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return out


_NOT_A_COLUMN = ("INDEX", "KEY", "UNIQUE", "PRIMARY", "FOREIGN", "CONSTRAINT", "CHECK", "FULLTEXT", "SPATIAL",
                 "PARTITION", "SYSTEM", "PERIOD")


def alter_columns(sql: str) -> list[tuple[str, str, str]]:
    """The column changes of an ALTER TABLE, in the order of its clauses: ``('add', col,
    its definition)``, ``('drop', col, '')``, ``('rename', old, new)`` (RENAME COLUMN, or
    CHANGE to another name), ``('rename_table', '', new name as written)``; none for
    another statement. Names may be backquoted with spaces, commas or backquotes inside."""
    body = alter_clauses(sql)
    if body is None:
        return []
    name = f"({_NAME})"
    out = []
    for clause in split_clauses(body):
        c = re.match(r"\s*ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?" + name + r"\s+(.*)$", clause, re.I | re.S)
        if c and c.group(1).upper() not in _NOT_A_COLUMN:
            if not c.group(2).lstrip().startswith("("):  # (ADD (a INT, b INT): not read)
                out.append(("add", _unquote(c.group(1)), c.group(2)))
            continue
        c = re.match(r"\s*DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?" + name + r"\s*$", clause, re.I | re.S)
        if c and c.group(1).upper() not in _NOT_A_COLUMN:
            out.append(("drop", _unquote(c.group(1)), ""))
            continue
        c = re.match(r"\s*RENAME\s+COLUMN\s+" + name + r"\s+TO\s+" + name + r"\s*$", clause, re.I | re.S)
        if c:
            out.append(("rename", _unquote(c.group(1)), _unquote(c.group(2))))
            continue
        c = re.match(r"\s*CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?" + name + r"\s+" + name + r"\s", clause,
                     re.I | re.S)
        if c and _unquote(c.group(1)) != _unquote(c.group(2)):
            out.append(("rename", _unquote(c.group(1)), _unquote(c.group(2))))
            continue
        c = re.match(r"\s*RENAME\s+(?:TO\s+|AS\s+)?(" + _NAME + r"(?:\s*\.\s*" + _NAME + r")?)\s*$", clause,
                     re.I | re.S)
        if c and c.group(1).upper() not in ("INDEX", "KEY", "COLUMN"):
            out.append(("rename_table", "", c.group(1)))
    return out


_LITERAL = r"'(?:[^'\\]|\\.|'')*'|X'[0-9a-f]*'|-?[\d.]+(?:e-?\d+)?|NULL|TRUE|FALSE"
_DEFAULT = re.compile(r"\bDEFAULT\s+(\((?:[^()]|\([^()]*\))*\)|" + _LITERAL + ")", re.I)


def constant_default(definition: str) -> str | None:
    """The DEFAULT of a column definition as its literal's text (``'a''b'``, ``7``,
    ``X'ff'``, ``NULL``), or None: no DEFAULT, or one that is not a constant
    (``CURRENT_TIMESTAMP``, an expression)."""
    d = _DEFAULT.search(definition)
    if not d:
        return None
    lit = d.group(1)
    if lit.startswith("(") and lit.endswith(")"):
        lit = lit[1:-1].strip()
    return lit if re.fullmatch(_LITERAL, lit, re.I) else None


def literal_value(text: str | None) -> Any:
    """The value of a constant literal (``constant_default``'s): None, an int, a float,
    a str, or bytes for ``X'...'``."""
    if text is None or text.upper() == "NULL":
        return None
    if text.upper() in ("TRUE", "FALSE"):
        return 1 if text.upper() == "TRUE" else 0
    if text[:1] in ("'", '"'):
        return string_value(text)
    if text[:2] in ("X'", "x'"):
        return bytes.fromhex(text[2:-1])
    try:
        return int(text)
    except ValueError:
        return float(text)


RowStep = tuple[str, str, Any]


def row_steps(sql: str) -> list[RowStep]:
    """What an ALTER TABLE does to a row written before it, in clause order: ``('add', col,
    value)`` (the column's constant DEFAULT; None without one: NULL), ``('drop', col, None)``,
    ``('rename', old, new)``. Applied by ``apply_row_steps``."""
    out: list[RowStep] = []
    for what, a, b in alter_columns(sql):
        if what == "add":
            out.append(("add", a, literal_value(constant_default(b))))
        elif what == "drop":
            out.append(("drop", a, None))
        elif what == "rename":
            out.append(("rename", a, b))
    return out


def apply_row_steps(row: dict[str, Any], steps: list[RowStep]) -> dict[str, Any]:
    """``row`` as the ALTERs ``steps`` leave it (a new dict: added columns take their
    default unless the row has them, dropped ones go, renamed ones move)."""
    row = dict(row)
    for what, a, b in steps:
        if what == "add":
            row.setdefault(a, b)
        elif what == "drop":
            row.pop(a, None)
        elif a in row:
            row[b] = row.pop(a)
    return row


def table_renames(sql: str, db: str, table: str, session_db: str = "") -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """The ``((db, old), (db, new))`` pairs a DDL on ``db.table`` renames, in order: a
    RENAME TABLE's, or an ALTER TABLE's RENAME [TO|AS] clause (also among other clauses,
    after which the column changes are done)."""
    pairs = renamed_tables(sql, session_db or db)
    if pairs or not table:
        return pairs
    for what, _, to in alter_columns(sql):
        if what == "rename_table":
            to_db, to_table = split_qname(to)
            return [((db, table), (to_db or db, to_table))]
    return []
