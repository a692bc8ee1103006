"""The import rules between the layers, checked on the source (an import added in
the wrong direction fails here, not in a review).

    capturer.errors, capturer.model (+ encode, spill, protogen), capturer.util
        the shared layer: what the capture side hands the senders, and helpers
        that know nothing of the pipeline; imports nothing above it
    capturer.pipeline, capturer.regions, capturer.agent, status, config ...
        the capture side; never names a sender
    senders
        use only the shared layer (the lake's command-line tool also reads the
        capturer's config, to find the lake)
    capturer.app
        the composition root: the one module of the capture side that names
        senders (with capturer.senderproc, the composition root of a sender's
        own process, and the demo, which checks the file it wrote)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CAPTURER_MAY_NAME_SENDERS = {"capturer/app.py", "capturer/senderproc.py", "capturer/demo.py"}
# a sender's command-line tool reads the capturer's config to find its target
TOOLS_MAY_READ_CONFIG = {"senders/spark/lakecli.py": {"capturer.config"}}


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            if node.module in ("capturer", "capturer.model", "capturer.util"):  # from capturer import app
                out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


def _in(mod: str, *packages: str) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in packages)


def shared(mod: str) -> bool:
    return _in(mod, "capturer.model", "capturer.util", "capturer.errors", "capturer._fastrows")


def _files(top: str) -> list[tuple[str, Path]]:
    return [(p.relative_to(ROOT).as_posix(), p) for p in sorted((ROOT / top).rglob("*.py"))]


def test_capturer_names_senders_only_in_the_composition_root() -> None:
    bad = [f"{rel}:{line}: imports {mod}" for rel, p in _files("capturer") for line, mod in imports(p)
           if _in(mod, "senders") and rel not in CAPTURER_MAY_NAME_SENDERS]
    assert not bad, "\n".join(bad)


def test_senders_use_only_the_shared_layer() -> None:
    bad = [f"{rel}:{line}: imports {mod}" for rel, p in _files("senders") for line, mod in imports(p)
           if (_in(mod, "capturer") and not shared(mod) and mod not in TOOLS_MAY_READ_CONFIG.get(rel, ()))
           or mod.startswith(".")]
    assert not bad, "\n".join(bad)


def test_the_shared_layer_imports_nothing_above_it() -> None:
    bad = []
    for rel, p in _files("capturer"):
        if not shared(rel[:-3].replace("/", ".").removesuffix(".__init__")):
            continue
        bad += [f"{rel}:{line}: imports {mod}" for line, mod in imports(p)
                if (_in(mod, "capturer") and not shared(mod) and mod != "capturer")
                or _in(mod, "senders") or mod.startswith(".")]
    assert not bad, "\n".join(bad)


def test_the_pipeline_knows_no_region_agent_app_or_config() -> None:
    bad = [f"{rel}:{line}: imports {mod}" for rel, p in _files("capturer/pipeline") for line, mod in imports(p)
           if _in(mod, "capturer.regions", "capturer.agent", "capturer.app", "capturer.status", "capturer.config")]
    assert not bad, "\n".join(bad)


def test_the_rules_see_imports() -> None:
    """The checks above would pass on nothing: make sure they read real imports."""
    sender = dict((m, line) for line, m in imports(ROOT / "senders/base.py"))
    assert "capturer.model" in sender and "capturer.util.bqueue" in sender
    assert any(_in(m, "senders") for _, m in imports(ROOT / "capturer/app.py"))
    assert shared("capturer.model.encode") and not shared("capturer.pipeline.merger")
