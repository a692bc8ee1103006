"""A strict INI reader that remembers line numbers, and typed key schemas.

We do not use configparser: it interpolates ``%`` (which breaks passwords),
silently lower-cases keys and cannot say on which line a bad value is.
Keys are matched case-insensitively (``binlogCheckPointPath`` or
``binlogcheckpointpath``).
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
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise ConfigError(f"{path}:{lineno}: malformed section header {raw.strip()!r}")
            name = line[1:-1].strip()
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
        key, value = line[:i].strip(), line[i + 1 :].strip()
        if not _KEY.match(key):
            # not echoed either: "password hunter2=x" must not print "hunter2"
            raise ConfigError(f"{path}:{lineno}: expected 'key = value' (what precedes the '=' is not a key)")
        if current is None:
            raise ConfigError(f"{path}:{lineno}: key {key!r} outside any [section]")
        if key.lower() in current.values:
            prev = current.values[key.lower()]
            raise ConfigError(
                f"{path}:{lineno}: [{current.name}] {key} is set twice (first on line {prev.line})"
            )
        current.values[key.lower()] = IniValue(key, value, lineno)
    return IniFile(path, sections)


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
