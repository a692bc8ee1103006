"""A strict INI reader that remembers line numbers, and typed key schemas.

We do not use configparser: it interpolates ``%`` (which breaks passwords),
silently lower-cases keys and cannot say on which line a bad value is.
Keys are matched case-insensitively (``binlogCheckPointPath`` or
``binlogcheckpointpath``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError


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


def read_ini(path: Path) -> IniFile:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
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
            raise ConfigError(f"{path}:{lineno}: expected 'key = value', got {raw.strip()!r}")
        if current is None:
            raise ConfigError(f"{path}:{lineno}: key outside any [section]: {raw.strip()!r}")
        i = min(sep)
        key, value = line[:i].strip(), line[i + 1 :].strip()
        if key.lower() in current.values:
            prev = current.values[key.lower()]
            raise ConfigError(
                f"{path}:{lineno}: [{current.name}] {key} is set twice (first on line {prev.line})"
            )
        current.values[key.lower()] = IniValue(key, value, lineno)
    return IniFile(path, sections)


# --- typed keys -------------------------------------------------------------

Parser = Callable[[str], Any]


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
        try:
            n = int(v)
        except ValueError:
            raise ValueError(f"expected an integer, got {v!r}") from None
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            raise ValueError(f"expected an integer in [{lo}, {hi}], got {n}")
        return n

    return parse


def p_float(lo: float | None = None, hi: float | None = None) -> Parser:
    def parse(v: str) -> float:
        try:
            n = float(v)
        except ValueError:
            raise ValueError(f"expected a number, got {v!r}") from None
        if n != n or (lo is not None and n < lo) or (hi is not None and n > hi):
            raise ValueError(f"expected a number in [{lo}, {hi}], got {v}")
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
    for low, val in values.items():
        if low not in known and not any(low.startswith(p.name[:-1].lower()) for p in prefixes):
            raise ConfigError(
                f"{ini.where(section, val.key)}: unknown key {val.key!r}; "
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
            shown = "***" if k.secret else repr(val.value)
            raise ConfigError(f"{ini.where(section, k.name)}: bad value {shown}: {exc}") from None
    return out
