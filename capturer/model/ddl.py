"""Best-effort reading of which database and table a DDL statement changes."""

from __future__ import annotations

import re
from typing import Any

_NAME = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_QNAME = rf"({_NAME}(?:\s*\.\s*{_NAME})?)"

# --- the one scanner of DDL text: quotes, backquotes, comments, parentheses ------------------------
#
# Every reader of DDL text here (which table, the column changes of an ALTER, the columns of a
# CREATE, the pairs of a RENAME) goes through ``strip_comments`` and ``split_top``: a ``#``, ``--``,
# ``/*``, comma or parenthesis inside a string or a backquoted name is text, never syntax.

_EXEC_OPEN = re.compile(r"/\*M?!\d{0,6}")


def strip_comments(sql: str) -> str:
    """``sql`` with its comments (``/* */``, ``-- `` to the line's end, ``#`` to the line's end)
    each replaced by a space, outside strings and backquoted names only. An executable comment
    (``/*!50100 ... */``, MariaDB's ``/*M!100100 ... */``) is SQL the server runs: its text is
    kept, its markers become spaces."""
    out: list[str] = []
    i, n = 0, len(sql)
    quote = ""
    in_exec = False
    while i < n:
        ch = sql[i]
        if quote:
            out.append(ch)
            if ch == "\\" and quote != "`" and i + 1 < n:
                out.append(sql[i + 1])
                i += 2
                continue
            if ch == quote:
                quote = ""
            i += 1
            continue
        if ch in "'\"`":
            quote = ch
        elif ch == "/" and sql.startswith("/*", i):
            m = _EXEC_OPEN.match(sql, i)
            if m and not in_exec:
                in_exec = True
                out.append(" ")
                i = m.end()
                continue
            end = sql.find("*/", i + 2)
            out.append(" ")
            i = n if end < 0 else end + 2
            continue
        elif ch == "*" and in_exec and sql.startswith("*/", i):
            in_exec = False
            out.append(" ")
            i += 2
            continue
        elif ch == "#" or (ch == "-" and sql.startswith("--", i) and (i + 2 == n or sql[i + 2] in " \t\r\n\f\v")):
            end = sql.find("\n", i)
            out.append(" ")
            i = n if end < 0 else end  # (the newline stays)
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _scan(s: str) -> list[tuple[int, int, str]]:
    """Per character of comment-free ``s``: (parenthesis depth, 1 inside a string or backquoted
    name else 0, the character); a string's backslash escape and a doubled quote stay inside."""
    out: list[tuple[int, int, str]] = []
    depth, quote, escaped = 0, "", False
    for ch in s:
        if quote:
            out.append((depth, 1, ch))
            if escaped:
                escaped = False
            elif ch == "\\" and quote != "`":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "'\"`":
            quote = ch
            out.append((depth, 1, ch))
            continue
        if ch == ")":
            depth -= 1
        out.append((depth, 0, ch))
        if ch == "(":
            depth += 1
    return out


def split_top(s: str, at: int = 0) -> list[str]:
    """Comment-free ``s`` split at the commas at parenthesis depth ``at`` outside strings and
    backquoted names (a ``\\'`` escape or a doubled quote does not end a string); with ``at=1``
    the pieces of the first parenthesised list only (a CREATE TABLE's definitions)."""
    out: list[str] = []
    cur: list[str] = []
    started = at == 0
    for depth, quoted, ch in _scan(s):
        if at and not started:
            if not quoted and ch == "(" and depth == 0:
                started = True
            continue
        if at and not quoted and ch == ")" and depth == 0:
            break
        if not quoted and ch == "," and depth == at:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if started:
        out.append("".join(cur))
    return out


def _top_level(s: str) -> str:
    """Comment-free ``s`` with everything inside strings, backquoted names and parentheses
    replaced by spaces (same length): keywords are then searched where they are syntax."""
    return "".join(ch if not quoted and depth == 0 else " " for depth, quoted, ch in _scan(s))


def statement_head(sql: str) -> str:
    """The first word of a statement (upper case), past its comments: ``ALTER``, ``DROP`` ..."""
    m = re.match(r"\s*([A-Za-z]+)", strip_comments(sql))
    return m.group(1).upper() if m else ""


def clean(sql: str) -> str:
    """``sql`` without its comments, stripped, without a trailing ``;``."""
    return strip_comments(sql).strip().rstrip(";").strip()
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
    """What follows the table's name in an ALTER TABLE (comments removed: ``strip_comments``), or None for
    another statement. The name may be backquoted with spaces, dots, commas or
    backquotes inside it."""
    m = _ALTER_BODY.match(clean(sql))
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
    s = clean(sql)
    for rx in (_TABLE_DDL, _TRUNCATE, _INDEX_DDL):
        m = rx.match(s)
        if m:
            db, table = split_qname(m.group(1))
            return db or current_db, table
    m = _DB_DDL.match(s)
    if m:
        return _unquote(m.group(1)), ""
    return current_db, ""


def names_several_tables(sql: str) -> bool:
    """Whether a statement may change tables besides the one ``ddl_target`` names: a DROP
    (``DROP TABLE a, b``, a database) or a RENAME anywhere in it (``RENAME TABLE a TO b, c TO
    d``; ``ALTER TABLE a ... RENAME TO b``, on a line of its own too). A name or string that
    holds the word errs on the side of several."""
    s = clean(sql)
    return s[:4].upper() == "DROP" or bool(re.search(r"\bRENAME\b", s, re.I))


_IGNORED = re.compile(r"^(?:SAVEPOINT|ROLLBACK\s+TO|RELEASE\s+SAVEPOINT|XA\s)", re.I)


def is_ignorable(sql: str) -> bool:
    """Statements inside a transaction that change no data by themselves."""
    return bool(_IGNORED.match(clean(sql)))


_DATA_DDL = re.compile(
    r"^(?:CREATE|ALTER|DROP|RENAME|TRUNCATE)\b(?!\s+(?:USER|ROLE|SERVER|EVENT|LOGFILE|TABLESPACE)\b)",
    re.I,
)


_IDENT_OR_STR = r"(?:`(?:[^`]|``)*`|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|[^\s@`'\"]+)"
#: triggers: their rows are in the binlog already (a row-based replica does not run them either); a
#: target that had the trigger would run it again on the rows applied (its rows twice)
_TRIGGER_DDL = re.compile(
    rf"^(?:CREATE(?:\s+OR\s+REPLACE)?(?:\s+DEFINER\s*=\s*{_IDENT_OR_STR}(?:\s*@\s*{_IDENT_OR_STR})?)?|DROP)"
    r"\s+TRIGGER\b", re.I)


def is_data_ddl(sql: str) -> bool:
    """Statements that change data objects (tables, databases, indexes, views...);
    account and server statements (GRANT, CREATE USER, FLUSH ...) and triggers
    (their effects are in the binlog as rows) are not passed on."""
    text = clean(sql)
    return bool(_DATA_DDL.match(text)) and not _TRIGGER_DDL.match(text)


_RENAME = re.compile(r"^RENAME\s+TABLES?\s+(.*)$", re.I | re.S)
_RENAME_PAIR = re.compile(rf"^\s*{_QNAME}\s+TO\s+{_QNAME}\s*$", re.I | re.S)
_ALTER_RENAME = re.compile(
    rf"^ALTER\s+(?:ONLINE\s+|IGNORE\s+)?TABLE\s+{_QNAME}\s+RENAME\s+(?:TO\s+|AS\s+)?{_QNAME}\s*;?\s*$", re.I | re.S)


_DROP_TABLES = re.compile(r"^DROP\s+(TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.*?)"
                          r"(?:\s+(?:WAIT\s+\d+|NOWAIT))?(?:\s+(?:RESTRICT|CASCADE))?\s*;?\s*$", re.I | re.S)


def dropped_tables(sql: str, current_db: str) -> list[tuple[str, str]]:
    """The ``(db, table)`` pairs a ``DROP TABLE a[, b ...]`` drops, ``[(db, "")]`` for a
    ``DROP DATABASE`` / ``DROP SCHEMA`` (every table of it), none for a ``DROP TEMPORARY
    TABLE`` (a session's table: the binlog's rows never named it) or any other statement."""
    s = clean(sql)
    m = _DB_DDL.match(s)
    if m and s[:4].upper() == "DROP":
        return [(_unquote(m.group(1)), "")]
    m = _DROP_TABLES.match(s)
    if m is None or m.group(1):
        return []
    out = []
    for piece in split_top(m.group(2)):
        if not re.fullmatch(_QNAME, piece.strip()):
            return []
        db, table = split_qname(piece.strip())
        out.append((db or current_db, table))
    return out


def renamed_tables(sql: str, current_db: str) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """The ``((db, old), (db, new))`` pairs a ``RENAME TABLE a TO b[, c TO d]`` or an
    ``ALTER TABLE a RENAME [TO|AS] b`` statement renames (none for any other statement)."""
    s = clean(sql)
    m = _ALTER_RENAME.match(s)
    parts: list[tuple[str, str]] = []
    if m:
        parts = [(m.group(1), m.group(2))]
    else:
        m = _RENAME.match(s)
        if m is None:
            return []
        for piece in split_top(m.group(1)):
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


# what begins a definition (or an ADD / DROP without COLUMN) that is not a column's: a bare
# keyword (a column of such a name is backquoted, or named after the COLUMN keyword)
_NOT_A_COLUMN = re.compile(
    r"\s*(?:PRIMARY\s+KEY|UNIQUE\b|KEY\b|INDEX\b|CONSTRAINT\b|FOREIGN\s+KEY|CHECK\b|FULLTEXT\b|SPATIAL\b|"
    r"PERIOD\s+FOR\b|SYSTEM\s+VERSIONING\b|PARTITION\b|PARTITIONING\b)", re.I)


def create_columns(sql: str) -> list[str]:
    """The column names a CREATE TABLE defines: each definition of its parenthesised list
    that begins with a name that is not a key or constraint word (none for ``CREATE TABLE
    ... LIKE`` or ``... AS SELECT`` without a list)."""
    s = clean(sql)
    m = _TABLE_DDL.match(s)
    if m is None or not s[m.end():].lstrip().startswith("("):
        return []
    out = []
    for piece in split_top(s[m.end():], at=1):
        m2 = re.match(r"\s*(" + _NAME + r")", piece)
        if m2 and not _NOT_A_COLUMN.match(piece):
            out.append(_unquote(m2.group(1)))
    return out


# --- the column changes of an ALTER TABLE (the lake, the file's replay and Kafka's verify) --------

split_clauses = split_top  # (the name the lake knew it by)


def alter_columns(sql: str) -> list[tuple[str, str, str]]:
    """The column changes of an ALTER TABLE, in the order of its clauses: ``('add', col,
    its definition)`` (``ADD [COLUMN] [IF NOT EXISTS] c ...`` and each column of ``ADD
    [COLUMN] (a ..., b ...)``), ``('drop', col, '')``, ``('rename', old, new)`` (RENAME
    COLUMN, or CHANGE to another name), ``('rename_table', '', new name as written)``; none
    for another statement. Names may be backquoted with anything inside (doubled backquotes,
    commas, parentheses, quotes, ``#``, ``--``); comments anywhere (``strip_comments``)."""
    body = alter_clauses(sql)
    if body is None:
        return []
    name = f"({_NAME})"
    out: list[tuple[str, str, str]] = []
    for clause in split_top(body):
        c = re.match(r"\s*ADD\s+(COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(.*)$", clause, re.I | re.S)
        if c:
            rest = c.group(2)
            if rest.startswith("("):  # ADD [COLUMN] (a INT, b INT, INDEX (a) ...)
                for piece in split_top(rest, at=1):
                    d = re.match(r"\s*" + name + r"\s+(.*)$", piece, re.S)
                    if d and not _NOT_A_COLUMN.match(piece):
                        out.append(("add", _unquote(d.group(1)), d.group(2).strip()))
                continue
            d = re.match(name + r"\s+(.*)$", rest, re.S)
            if d and (c.group(1) or not _NOT_A_COLUMN.match(rest)):
                out.append(("add", _unquote(d.group(1)), d.group(2).strip()))
            continue
        c = re.match(r"\s*DROP\s+(COLUMN\s+)?(?:IF\s+EXISTS\s+)?" + name + r"\s*(?:RESTRICT|CASCADE)?\s*$", clause,
                     re.I | re.S)
        if c and (c.group(1) or not _NOT_A_COLUMN.match(c.group(2))):
            out.append(("drop", _unquote(c.group(2)), ""))
            continue
        c = re.match(r"\s*RENAME\s+COLUMN\s+" + name + r"\s+TO\s+" + name + r"\s*$", clause, re.I | re.S)
        if c:
            out.append(("rename", _unquote(c.group(1)), _unquote(c.group(2))))
            continue
        c = re.match(r"\s*CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?" + name + r"\s*" + name + r"\s", clause,
                     re.I | re.S)
        if c and _unquote(c.group(1)) != _unquote(c.group(2)):
            out.append(("rename", _unquote(c.group(1)), _unquote(c.group(2))))
            continue
        c = re.match(r"\s*RENAME\s+(?:TO\s+|AS\s+)?(" + _NAME + r"(?:\s*\.\s*" + _NAME + r")?)\s*$", clause,
                     re.I | re.S)
        if c and c.group(1).upper() not in ("INDEX", "KEY", "COLUMN"):
            out.append(("rename_table", "", c.group(1)))
    return _as_steps(out)


#: the temporary names ``_as_steps`` renames through (a swap of two columns in one ALTER)
RENAME_TMP = "__capturer_renaming_"


def _as_steps(out: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """An ALTER's column clauses as steps applied one after another (what every reader does). MySQL
    applies them to the table as it was before the statement: a DROP, CHANGE or RENAME COLUMN names a
    column of before, and the renames happen at once (``CHANGE a b ..., CHANGE b a ...`` swaps the two;
    ``CHANGE a b ..., CHANGE b c ...`` moves both). One after another, a rename whose new name another
    rename of the statement takes away goes through a temporary name (``RENAME_TMP``: to it in its
    place, from it after the statement's last rename), and a DROP of a name an earlier rename gave
    (``CHANGE a b ..., DROP b``: the column b of before) comes before the renames. Other statements'
    clauses are returned as they are."""
    sources = {a.lower() for w, a, _b in out if w == "rename"}
    clash = {i for i, (w, a, b) in enumerate(out) if w == "rename" and b.lower() in sources and b.lower() != a.lower()}
    late = set()
    for i, (w, a, _b) in enumerate(out):
        if w == "drop" and any(w2 == "rename" and b2.lower() == a.lower() for w2, _a2, b2 in out[:i]):
            late.add(i)
    if not clash and not late:
        return out
    last = max(i for i, c in enumerate(out) if c[0] == "rename")
    first = min(i for i, c in enumerate(out) if c[0] == "rename")
    steps: list[tuple[str, str, str]] = []
    after: list[tuple[str, str, str]] = []
    for i, (w, a, b) in enumerate(out):
        if i == first:
            steps.extend(out[j] for j in sorted(late))
        if i in late:
            continue
        if i in clash:
            tmp = f"{RENAME_TMP}{len(after)}"
            steps.append(("rename", a, tmp))
            after.append(("rename", tmp, b))
        else:
            steps.append((w, a, b))
        if i == last:
            steps.extend(after)
    return steps


def added_if_not_exists(sql: str) -> set[str]:
    """The columns an ALTER TABLE adds with ``ADD COLUMN IF NOT EXISTS`` (a column already
    there is left as it is, its values too: no default is set on it)."""
    body = alter_clauses(sql)
    out: set[str] = set()
    for clause in split_top(body or ""):
        c = re.match(r"\s*ADD\s+(?:COLUMN\s+)?IF\s+NOT\s+EXISTS\s+(.*)$", clause, re.I | re.S)
        if c:
            rest = c.group(1)
            pieces = split_top(rest, at=1) if rest.startswith("(") else [rest]
            for piece in pieces:
                d = re.match(r"\s*(" + _NAME + r")\s", piece)
                if d and not _NOT_A_COLUMN.match(piece):
                    out.add(_unquote(d.group(1)))
    return out


_LITERAL = r"'(?:[^'\\]|\\.|'')*'|X'[0-9a-f]*'|-?[\d.]+(?:e-?\d+)?|NULL|TRUE|FALSE"
_INTRODUCER = re.compile(r"(?:_\w+|N)(?=')", re.I)  # _utf8mb4'x', N'x': the string is the value


def _default_text(definition: str) -> str | None:
    """The text of a column definition's DEFAULT (its literal, or its expression in parentheses
    without them), read where DEFAULT is syntax: not inside a COMMENT's string, an ENUM's
    members or a CHECK's parentheses. None without a DEFAULT."""
    d = re.search(r"\bDEFAULT\b", _top_level(definition), re.I)
    if d is None:
        return None
    rest = definition[d.end():].lstrip()
    if rest.startswith("("):
        inner = split_top(rest, at=1)
        return ",".join(inner).strip()
    m = re.match(r"(?:" + _INTRODUCER.pattern + ")?(" + _LITERAL + r")(?![\w.])", rest, re.I)
    if m:
        return m.group(1)
    m = re.match(r"[^\s,]+", rest)
    return m.group(0) if m else ""


def constant_default(definition: str) -> str | None:
    """The DEFAULT of a column definition as its literal's text (``'a''b'``, ``7``,
    ``X'ff'``, ``NULL``), or None: no DEFAULT, or one that is not a constant
    (``CURRENT_TIMESTAMP``, an expression). A ``NOT NULL`` column without a DEFAULT takes
    the type's implied one (``implied_default``)."""
    lit = _default_text(definition)
    if lit is None:
        return implied_default(definition)
    lit = _INTRODUCER.sub("", lit, count=1) if _INTRODUCER.match(lit) else lit
    return lit if re.fullmatch(_LITERAL, lit, re.I) else None


_ZERO_TYPES = re.compile(r"(?:tiny|small|medium|big)?int(?:eger)?|bit|bool(?:ean)?|decimal|numeric|dec|fixed|float|"
                         r"double|real", re.I)
_EMPTY_TYPES = re.compile(r"(?:var)?char|(?:tiny|medium|long)?text|json|set|character|nchar|nvarchar", re.I)


def _is_generated(top: str) -> bool:
    return bool(re.search(r"\b(?:AS\s*\(|GENERATED\b|AUTO_INCREMENT\b)", top, re.I))


def implied_default(definition: str) -> str | None:
    """The literal a ``NOT NULL`` column without a DEFAULT takes in the rows that were there
    when it was added (the server's implied default): ``0`` for numbers, ``''`` for strings,
    JSON and SET, ``X''`` for VARBINARY and BLOBs, an ENUM's first member. None otherwise:
    a column that may be NULL (NULL), a generated or AUTO_INCREMENT one, and the types whose
    implied value is not written here (dates and times, TIMESTAMP's CURRENT_TIMESTAMP, BINARY(n),
    YEAR: ``unknown_adds`` names those)."""
    top = _top_level(definition)
    if not re.search(r"\bNOT\s+NULL\b", top, re.I) or _is_generated(top) or re.search(r"\bDEFAULT\b", top, re.I):
        return None
    m = re.match(r"\s*([A-Za-z]+)", definition)
    word = m.group(1) if m else ""
    if _ZERO_TYPES.fullmatch(word):
        return "0"
    if _EMPTY_TYPES.fullmatch(word):
        return "''"
    if re.fullmatch(r"varbinary|(?:tiny|medium|long)?blob", word, re.I):
        return "X''"
    if word.upper() == "ENUM":
        first = split_top(definition[m.end():] if m else "", at=1)
        lit = first[0].strip() if first else ""
        return lit if re.fullmatch(_LITERAL, lit, re.I) and lit[:1] in "'\"" else None
    return None


def unknown_adds(sql: str) -> list[str]:
    """The columns an ALTER TABLE adds whose values in the rows already there only the source
    knows (it computed them: a generated column, an AUTO_INCREMENT, a DEFAULT that is not a
    constant, a NOT NULL one whose implied default is not written here): the stream carries
    none of them, so a sink that keeps those rows (the lake, the file's replay, Kafka's verify)
    has NULL there until the rows change."""
    out = []
    for what, col, definition in alter_columns(sql):
        if what != "add":
            continue
        top = _top_level(definition)
        text = _default_text(definition)
        if _is_generated(top) or (text is not None and constant_default(definition) is None) or (
                text is None and re.search(r"\bNOT\s+NULL\b", top, re.I) and implied_default(definition) is None):
            out.append(col)
    return out


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
    default unless the row has them, dropped ones go, renamed ones move; names matched
    regardless of case, as MySQL matches them)."""
    row = dict(row)
    for what, a, b in steps:
        have = _column(row, a)
        if what == "add":
            if have is None:
                row[a] = b
        elif have is None:
            continue
        elif what == "drop":
            del row[have]
        else:
            row[b] = row.pop(have)
    return row


def _column(row: dict[str, Any], name: str) -> str | None:
    """The key of ``row`` that is column ``name`` (MySQL compares column names case-insensitively:
    ``DROP COLUMN ID`` drops ``id``), or None."""
    if name in row:
        return name
    low = name.lower()
    return next((k for k in row if k.lower() == low), None)


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
