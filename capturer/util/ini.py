"""A strict INI reader that remembers line numbers, and typed key schemas.

We do not use configparser: it interpolates ``%`` (which breaks passwords),
silently lower-cases keys and cannot say on which line a bad value is.
Keys are matched case-insensitively (``binlogCheckPointPath`` or
``binlogcheckpointpath``).

Comments (docs/configuration.md, "Comments and quoting"): a line whose first
non-blank character is ``#`` or ``;`` is a comment; so is the rest of a line
from a ``#`` or ``;`` that follows whitespace (``user = capturer   # the role``
reads ``capturer``). A ``#`` or ``;`` that does not follow whitespace is part of
the value (``password = pa#ss``). A value that must hold whitespace followed by
``#`` or ``;`` is written in double quotes (``password = "pa #ss"``; a ``"``
inside is doubled: ``""``). A value that still looks as if it carried a comment
(a ``#`` or ``;`` followed by whitespace but not preceded by it:
``user = capturer# the role``) is an error naming file, line, section and key,
never a silent surprise.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capturer.errors import ConfigError


@dataclass
class IniValue:
    key: str  # as written
    value: str
    line: int


@dataclass
class IniSection:
    name: str
    line: int
    values: dict[str, IniValue] = field(default_factory=dict)  # lower-cased key -> value


@dataclass
class IniFile:
    path: Path
    sections: dict[str, IniSection]

    def where(self, section: str, key: str | None = None) -> str:
        sec = self.sections.get(section)
        if sec is None:
            return f"{self.path}: [{section}]"
        if key is None:
            return f"{self.path}:{sec.line}: [{section}]"
        val = sec.values.get(key.lower())
        line = val.line if val else sec.line
        return f"{self.path}:{line}: [{section}] {key}"


def read_text_file(path: Path, what: str = "file") -> str:
    """The file as UTF-8 text (a leading BOM is dropped). A byte that is not UTF-8,
    or a NUL byte, is a ConfigError naming the line; a file that cannot be read
    is a ConfigError naming it (``what`` says which file it is)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(f"{path}:{line}: byte 0x{raw[exc.start]:02x} at column {col} is not UTF-8; "
                          "save the file as UTF-8") from None
    if "\0" in text:
        raise ConfigError(f"{path}:{text.count(chr(10), 0, text.index(chr(0))) + 1}: NUL byte in the file")
    return text


def read_ini(path: Path) -> IniFile:
    text = read_text_file(path)
    sections: dict[str, IniSection] = {}
    current: IniSection | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in COMMENT_CHARS:
            continue
        if line.startswith("["):
            header = _SECTION.match(line)
            if header is None or not header.group(1).strip():
                raise ConfigError(f"{path}:{lineno}: malformed section header {raw.strip()!r}")
            name = header.group(1).strip()
            if name in sections:
                raise ConfigError(
                    f"{path}:{lineno}: section [{name}] appears twice "
                    f"(first on line {sections[name].line})"
                )
            current = sections[name] = IniSection(name, lineno)
            continue
        sep = [i for i in (line.find("="), line.find(":")) if i > 0]
        if not sep:
            # the line is not echoed: it may be a password written without '='
            raise ConfigError(f"{path}:{lineno}: expected 'key = value' (the line has no '=')")
        i = min(sep)
        key = line[:i].strip()
        if not _KEY.match(key):
            # not echoed either: "password hunter2=x" must not print "hunter2"
            raise ConfigError(f"{path}:{lineno}: expected 'key = value' (what precedes the '=' is not a key)")
        if current is None:
            raise ConfigError(f"{path}:{lineno}: key {key!r} outside any [section]")
        try:
            value = parse_value(line[i + 1 :])
        except ValueError as exc:
            # the value is never echoed: it may be a password
            raise ConfigError(f"{path}:{lineno}: [{current.name}] {key}: {exc}") from None
        if key.lower() in current.values:
            prev = current.values[key.lower()]
            raise ConfigError(
                f"{path}:{lineno}: [{current.name}] {key} is set twice (first on line {prev.line})"
            )
        current.values[key.lower()] = IniValue(key, value, lineno)
    return IniFile(path, sections)


COMMENT_CHARS = "#;"
_SECTION = re.compile(r"\[([^\]]*)\](?:\s+[#;].*)?\Z")
# a '#' or ';' that whitespace follows but does not precede: a comment written without the space before it
_COMMENT_LOOKALIKE = re.compile(r"(?<!\s)[#;]\s")
_QUOTE_HINT = ("to keep it in the value, put the value in double quotes "
               '(key = "..."; a " inside is written ""), see docs/configuration.md')


def parse_value(text: str) -> str:
    """The value of a ``key = value`` line, given what follows the separator.

    * ``"..."``: a quoted value, taken as written between the quotes (``""`` is one
      ``"``); after the closing quote only whitespace and a comment may follow.
    * otherwise the text up to a ``#`` or ``;`` that follows whitespace (the
      comment), stripped of the whitespace around it. A ``#``/``;`` that follows
      no whitespace is part of the value (``pa#ss``).

    ValueError (whose message never contains the value) for an unterminated quote,
    text after a closing quote, and a value that looks as if it carried a comment
    written without whitespace before it (``capturer# the role``).
    """
    body = text.lstrip()
    if body.startswith('"'):
        out: list[str] = []
        i = 1
        while True:
            j = body.find('"', i)
            if j < 0:
                raise ValueError("the quoted value has no closing '\"'")
            out.append(body[i:j])
            if body.startswith('"', j + 1):  # "" inside quotes: one "
                out.append('"')
                i = j + 2
                continue
            rest = body[j + 1 :]
            if rest.strip() and not (rest[0].isspace() and rest.lstrip()[0] in COMMENT_CHARS):
                raise ValueError("text after the closing '\"' of the quoted value (a comment must follow "
                                 "whitespace and start with # or ;)")
            return "".join(out)
    cut = len(text)
    for k in range(1, len(text)):
        if text[k] in COMMENT_CHARS and text[k - 1].isspace():
            cut = k
            break
    value = text[:cut].strip()
    found = _COMMENT_LOOKALIKE.search(value)
    if found:
        raise ValueError(
            f"the value has a '{found.group(0)[0]}' followed by a space that does not follow whitespace, "
            f"so it is not read as a comment; for a comment put whitespace before the "
            f"'{found.group(0)[0]}' (key = value  # comment); {_QUOTE_HINT}")
    return value


# --- typed keys -------------------------------------------------------------

Parser = Callable[[str], Any]

_KEY = re.compile(r"[A-Za-z0-9_.\-]+\Z")
_INT = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")


@dataclass(frozen=True)
class Key:
    name: str
    parse: Parser
    default: Any = None
    required: bool = False
    secret: bool = False
    doc: str = ""


def p_str(v: str) -> str:
    return v


def p_nonempty(v: str) -> str:
    if not v:
        raise ValueError("must not be empty")
    return v


def p_int(lo: int | None = None, hi: int | None = None) -> Parser:
    def parse(v: str) -> int:
        # ASCII digits only: int() would also take "1_000" and other scripts' digits
        if not _INT.match(v):
            raise ValueError("expected an integer")
        n = int(v) if len(v) <= 30 else None
        if n is None or (lo is not None and n < lo) or (hi is not None and n > hi):
            raise ValueError(f"expected an integer in [{lo}, {hi}]")
        return n

    return parse


def p_float(lo: float | None = None, hi: float | None = None) -> Parser:
    def parse(v: str) -> float:
        if not _FLOAT.match(v):
            raise ValueError("expected a number")
        n = float(v)
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            raise ValueError(f"expected a number in [{lo}, {hi}]")
        return n

    return parse


def p_bool(v: str) -> bool:
    low = v.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {v!r}")


def p_choice(*choices: str) -> Parser:
    def parse(v: str) -> str:
        if v.lower() not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return v.lower()

    return parse


def p_list(v: str) -> list[str]:
    return [x.strip() for x in v.split(",") if x.strip()]


def p_names(v: str) -> list[str]:
    """A comma-separated list of ``db.table`` names or patterns whose parts may be quoted in backticks: a
    comma inside backticks belongs to the name (```a,b`.t``); an unterminated backtick is refused."""
    out: list[str] = []
    cur: list[str] = []
    quoted = False
    for c in v:
        if c == "`":
            quoted = not quoted  # (a doubled backtick inside a quoted part toggles twice: it stays quoted)
        if c == "," and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if quoted:
        raise ValueError(f"unterminated backtick in {v!r}")
    out.append("".join(cur))
    return [x.strip() for x in out if x.strip()]


def parse_section(ini: IniFile, section: str, keys: list[Key]) -> dict[str, Any]:
    """Validate one section against its keys; unknown keys are an error."""
    sec = ini.sections.get(section)
    values = sec.values if sec else {}
    known = {k.name.lower(): k for k in keys}
    prefixes = [k for k in keys if k.name.endswith(".*")]
    for low, given in values.items():
        if low not in known and not any(low.startswith(p.name[:-1].lower()) for p in prefixes):
            raise ConfigError(
                f"{ini.where(section, given.key)}: unknown key {given.key!r}; "
                f"known keys: {', '.join(k.name for k in keys)}"
            )
    out: dict[str, Any] = {}
    for k in prefixes:
        # "conf.*": every key with that prefix, as written (case kept), into one dict
        pre = k.name[:-1].lower()
        out[k.name] = {v.key[len(pre):]: v.value for low, v in values.items() if low.startswith(pre)}
    for k in keys:
        if k.name.endswith(".*"):
            continue
        val = values.get(k.name.lower())
        if val is None:
            if k.required:
                where = ini.where(section) if sec else f"{ini.path}: [{section}]"
                raise ConfigError(f"{where}: missing required key {k.name!r}")
            out[k.name] = k.default
            continue
        try:
            out[k.name] = k.parse(val.value)
        except ValueError as exc:
            shown = "***" if k.secret else repr(val.value if len(val.value) <= 80 else val.value[:80] + "...")
            raise ConfigError(f"{ini.where(section, k.name)}: bad value {shown}: {exc}") from None
    return out
