"""The manual keeps its word: every configuration example in README.md and docs/*.md
passes what ``python -m capturer --config X --check`` runs, and every relative link
and ``#anchor`` in them resolves.

Examples are marked with the file they show, in an HTML comment on the line just
before the fence::

    <!-- example: senderConfig.cfg fragment -->
    ```ini
    [kafka]
    servers = 10.0.0.5:9092
    ```

Kinds: ``config.cfg``, ``senderConfig.cfg``, ``agent.cfg`` (whole files),
``config.cfg fragment``, ``senderConfig.cfg fragment``, ``agent.cfg fragment``
(completed here with what they lack: a ``[global]``/``[agent]`` section, a region,
the sender list), ``filter_rule.txt`` and ``apply.cfg`` (an applier's, docs/apply.md). A fenced block that looks like INI or like
filter rules and carries no mark fails, so a new example cannot go unchecked. A
failure names the document and the line of the block (and of the line at fault).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from capturer.agent.config import load_agent_config
from capturer.app import load_config
from capturer.errors import ConfigError
from capturer.pipeline.filter import load_filter
from capturer.util.ini import read_ini

ROOT = Path(__file__).resolve().parents[2]


def manual() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# --- fenced blocks and their marks ---------------------------------------------

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_MARK = re.compile(r"^\s*<!--\s*example:\s*(?P<kind>[^>]*?)\s*-->\s*$")
_ANY_MARK = re.compile(r"<!--\s*example\b")
KINDS = ("config.cfg", "config.cfg fragment", "senderConfig.cfg", "senderConfig.cfg fragment",
         "agent.cfg", "agent.cfg fragment", "filter_rule.txt", "apply.cfg")
INI_INFOS = {"ini", "cfg", "conf", "dosini", "properties", "toml"}


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # the line of the opening fence (1-based)
    info: str
    text: str
    kind: str | None  # from the mark on the line before the fence; None = no mark

    @property
    def where(self) -> str:
        return f"{_rel(self.doc)}:{self.line}"


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def blocks(doc: Path, text: str | None = None) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a Markdown file, and the problems with marks: a mark
    that is not right before a fence."""
    lines = (doc.read_text(encoding="utf-8") if text is None else text).splitlines()
    out: list[Block] = []
    problems: list[str] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            mark_line = lines[i].lstrip().startswith("<!--") and _ANY_MARK.search(lines[i])
            if mark_line and not (_MARK.match(lines[i]) and i + 1 < len(lines) and _FENCE.match(lines[i + 1])):
                problems.append(f"{_rel(doc)}:{i + 1}: an example mark must read '<!-- example: KIND -->' "
                                f"and be on the line just before a fence")
            i += 1
            continue
        fence, indent = m.group("fence"), len(m.group("indent"))
        close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [ln[indent:] if ln[:indent].isspace() else ln.lstrip() for ln in lines[i + 1 : j]]
        mark = _MARK.match(lines[i - 1]) if i > 0 else None
        out.append(Block(doc, i + 1, m.group("info").lower(), "\n".join(body) + "\n",
                         mark.group("kind") if mark else None))
        i = j + 1
    return out, problems


_SECTION_LINE = re.compile(r"^\s*\[[^\]\s][^\]]*\]\s*([#;].*)?$")
_KEY_LINE = re.compile(r"^\s*[A-Za-z0-9_.\-]+\s*[=:]")
_FILTER_LINE = re.compile(r"^\s*(include|exclude)\s+\S|^[^\t\n]+\t[^\t]+\t[^\t]+\t")


def looks_like_config(b: Block) -> bool:
    """An INI file or filter rules, by the fence's language or by its lines."""
    if b.info in INI_INFOS:
        return True
    if b.info not in ("", "text", "txt", "plain"):
        return False  # sh, json, python, ...: code, not a config file
    lines = [ln for ln in b.text.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", ";"))]
    if any(_SECTION_LINE.match(ln) for ln in lines) and any(_KEY_LINE.match(ln) for ln in lines):
        return True
    return bool(lines) and all(_FILTER_LINE.match(ln) for ln in lines)


def all_blocks() -> list[Block]:
    return [b for doc in manual() for b in blocks(doc)[0]]


def examples() -> list[Block]:
    return [b for b in all_blocks() if b.kind is not None]


# --- checking one example as --check would ----------------------------------------

MIN_GLOBAL = "[global]\nbinlogCheckPointPath = ./checkpoint.json\nsenderConfig = ./senderConfig.cfg\nfilterRuleDict =\n"
MIN_REGION = "[region:docs_complement]\ntype = mysql\nhost = complement.invalid\nuser = u\nserver_id = 4000000000\n"
MIN_SENDERS = "[global]\ntype = local\n[local]\nfilepath = ./out.jsonl\n"
MIN_AGENT = "[agent]\nlisten = 127.0.0.1:0\nstateDir = ./agent-state\n"


def _sections(path: Path) -> list[str]:
    return list(read_ini(path).sections)


def _complete(path: Path, text: str, *extra: str) -> None:
    """The fragment first (so its line numbers stay those of the block), then what it lacks."""
    path.write_text(text + "".join("\n" + e for e in extra if e), encoding="utf-8")


def _check_config(path: Path, tmp: Path) -> None:
    g = read_ini(path).sections.get("global")
    given = g.values.get("senderconfig") if g else None
    senders = tmp / (given.value if given else "conf/senderConfig.cfg")
    if not senders.exists():
        senders.parent.mkdir(parents=True, exist_ok=True)
        senders.write_text(MIN_SENDERS)
    load_config(path, base_dir=tmp)


def check_example(b: Block, tmp: Path) -> None:
    """Raise ConfigError when the example does not validate (what --check does)."""
    kind = b.kind or ""
    if kind == "filter_rule.txt":
        p = tmp / "filter_rule.txt"
        p.write_text(b.text, encoding="utf-8")
        load_filter(p)
        return
    if kind.startswith("config.cfg"):
        p = tmp / "config.cfg"
        p.write_text(b.text, encoding="utf-8")
        if kind.endswith("fragment"):
            secs = _sections(p)
            _complete(p, b.text, "" if "global" in secs else MIN_GLOBAL,
                      "" if any(s.startswith("region:") for s in secs) else MIN_REGION)
        _check_config(p, tmp)
        return
    if kind.startswith("senderConfig.cfg"):
        p = tmp / "senderConfig.cfg"
        p.write_text(b.text, encoding="utf-8")
        if kind.endswith("fragment"):
            secs = _sections(p)
            if "global" not in secs:
                _complete(p, b.text, f"[global]\ntype = {','.join(secs)}\n")
        cfg = tmp / "config.cfg"
        cfg.write_text(MIN_GLOBAL + MIN_REGION)
        load_config(cfg, base_dir=tmp)
        return
    if kind == "apply.cfg":
        from capturer.apply.config import load_apply_config
        from senders import CATALOG

        p = tmp / "apply.cfg"
        p.write_text(b.text, encoding="utf-8")
        g = read_ini(p).sections.get("global")
        given = g.values.get("senderconfig") if g else None
        senders = tmp / (given.value if given else "conf/applySender.cfg")
        if not senders.exists():
            senders.parent.mkdir(parents=True, exist_ok=True)
            senders.write_text(MIN_SENDERS)
        load_apply_config(p, CATALOG, base_dir=tmp)
        return
    if kind.startswith("agent.cfg"):
        p = tmp / "agent.cfg"
        p.write_text(b.text, encoding="utf-8")
        if kind.endswith("fragment"):
            secs = _sections(p)
            _complete(p, b.text, "" if "agent" in secs else MIN_AGENT,
                      "" if any(s.startswith("region:") for s in secs) else MIN_REGION)
        load_agent_config(p, base_dir=tmp)
        return
    raise AssertionError(f"{b.where}: unknown example kind {kind!r}; known: {', '.join(KINDS)}")


def explain(b: Block, exc: ConfigError, tmp: Path) -> str:
    """The error, with the line of the document it points at."""
    msg = str(exc)
    m = re.match(r"(?P<path>[^:]+):(?P<line>\d+):", msg)
    at = ""
    if m and Path(m.group("path")).parent == tmp:
        n = int(m.group("line"))
        if n <= b.text.count("\n"):
            at = f" (line {b.line + n} of {_rel(b.doc)})"
        msg = msg[m.end():].lstrip()
        msg = f"{Path(m.group('path')).name}:{n}: {msg}"
    return f"{b.where}: the {b.kind} example at this line does not pass --check{at}: {msg}"


@pytest.mark.parametrize("block", examples(), ids=lambda b: b.where)
def test_example_passes_check(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert block.kind in KINDS, f"{block.where}: unknown example kind {block.kind!r}; known: {', '.join(KINDS)}"
    failure = ""
    try:
        check_example(block, tmp_path)
    except ConfigError as exc:
        failure = explain(block, exc, tmp_path)
    if failure:
        pytest.fail(failure, pytrace=False)


def test_every_config_block_is_marked() -> None:
    unmarked = [f"{b.where}: a ```{b.info or ''} block that looks like a config file has no "
                f"'<!-- example: KIND -->' line before it (KIND: {', '.join(KINDS)})"
                for b in all_blocks() if b.kind is None and looks_like_config(b)]
    problems = [p for doc in manual() for p in blocks(doc)[1]]
    assert not unmarked + problems, "\n".join(unmarked + problems)


def test_the_shipped_conf_files_pass_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """conf/ is the first example a user copies: as start.sh runs it, from the project root."""
    monkeypatch.chdir(ROOT)
    load_config(ROOT / "conf" / "config.cfg", base_dir=ROOT)
    load_agent_config(ROOT / "conf" / "agent.cfg", base_dir=ROOT)
    load_filter(ROOT / "conf" / "filter_rule.txt")


def test_the_manual_has_examples_of_every_file() -> None:
    kinds = {b.kind for b in examples()}
    for k in ("config.cfg", "senderConfig.cfg", "agent.cfg", "filter_rule.txt"):
        assert any(x and x.startswith(k) for x in kinds), f"no {k} example left in the manual"


# --- links and anchors ---------------------------------------------------------------

_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced blocks."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for n, ln in enumerate(text.splitlines(), start=1):
        m = _FENCE.match(ln)
        if fence is None and m:
            fence = m.group("fence")
            continue
        if fence is not None:
            if re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", ln):
                fence = None
            continue
        out.append((n, ln))
    return out


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (code spans and links as their
    text), lower-cased, without punctuation but ``-`` and ``_``, spaces as ``-``."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = "".join(c for c in text if c.isalnum() or c in "-_ " or unicodedata.category(c).startswith("M"))
    return kept.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, ln in _prose(doc.read_text(encoding="utf-8")):
        m = _HEADING.match(ln)
        if not m:
            continue
        s = slug(m.group("text"))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(doc: Path, anchors_of: Callable[[Path], set[str]] = anchors) -> list[str]:
    bad: list[str] = []
    for n, ln in _prose(doc.read_text(encoding="utf-8")):
        for m in _LINK.finditer(_CODE_SPAN.sub("", ln)):
            target = m.group("target")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                bad.append(f"{_rel(doc)}:{n}: link to {target!r}: {_rel(dest)} does not exist")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
                bad.append(f"{_rel(doc)}:{n}: link to {target!r}: no heading with the anchor "
                           f"#{anchor} in {_rel(dest)}")
    return bad


def test_every_relative_link_and_anchor_resolves() -> None:
    bad = [b for doc in manual() for b in broken_links(doc)]
    assert not bad, "\n".join(bad)


def test_readme_and_docs_link_both_ways() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for doc in manual()[1:]:
        assert f"(docs/{doc.name}" in readme, f"README.md does not link to docs/{doc.name}"
        first = next(ln for ln in doc.read_text(encoding="utf-8").splitlines() if ln.strip())
        assert "](../README.md" in first, f"{_rel(doc)}: the first line must link back to ../README.md"
    assert "docs/status-page.png" in readme or any(
        "status-page.png" in d.read_text(encoding="utf-8") for d in manual()[1:]), "the status page screenshot"


# --- the checks above can fail -------------------------------------------------------

BROKEN_DOC = """A document with mistakes in it

# A heading

<!-- example: config.cfg fragment -->
```ini
[region:pg]
type = postgresql
host = h
user = u
dbname = d
slot = Not-A-Slot    # default: capturer_<region>
```

```ini
[kafka]
servers = x:1
```

<!-- example: filter_rule.txt -->
```text
include shop.*
frobnicate shop.t
```

[a link](#a-heading) [a bad anchor](#nowhere) [a missing file](nowhere.md)
"""


def test_the_checks_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    doc = tmp_path / "broken.md"
    doc.write_text(BROKEN_DOC)
    found, problems = blocks(doc)
    assert [b.kind for b in found] == ["config.cfg fragment", None, "filter_rule.txt"] and not problems
    # a bad value: the message names the document, the block's line and the line at fault
    work = tmp_path / "w1"
    work.mkdir()
    with pytest.raises(ConfigError) as ei:
        check_example(found[0], work)
    said = explain(found[0], ei.value, work)
    assert said.startswith(f"{doc}:6: the config.cfg fragment example") and f"(line 12 of {doc})" in said, said
    assert "slot: bad value 'Not-A-Slot'" in said, said
    # an unmarked INI block is found
    assert looks_like_config(found[1])
    # bad filter rules fail
    work = tmp_path / "w2"
    work.mkdir()
    with pytest.raises(ConfigError, match="frobnicate"):
        check_example(found[2], work)
    # links: the good anchor passes, the bad anchor and the missing file do not
    bad = broken_links(doc)
    assert len(bad) == 2 and "#nowhere" in bad[0] and "nowhere.md" in bad[1], bad
    # a mark that is not right before a fence
    assert blocks(doc, "<!-- example: config.cfg -->\n\n```ini\n[x]\n```\n")[1]


def test_the_good_parts_of_the_checks_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    doc = tmp_path / "good.md"
    doc.write_text(BROKEN_DOC.replace("Not-A-Slot", "a_slot").replace("frobnicate shop.t", "exclude shop.t"))
    found, _ = blocks(doc)
    for i, b in enumerate((found[0], found[2])):
        work = tmp_path / f"w{i}"
        work.mkdir()
        check_example(b, work)


@pytest.mark.parametrize("heading,expected", [
    ("Try it: the demo", "try-it-the-demo"),
    ("`[kafka]`: the Kafka sender", "kafka-the-kafka-sender"),
    ("Filter rules (`conf/filter_rule.txt`)", "filter-rules-conffilter_ruletxt"),
    ("The manual's examples", "the-manuals-examples"),
    ("Memory, 2026-11-25", "memory-2026-11-25"),
    ("Commit → ack", "commit--ack"),
])
def test_slug_is_githubs(heading: str, expected: str) -> None:
    assert slug(heading) == expected
