"""The import rules between the capture side and the senders, checked on the source
(an import added in the wrong direction fails here, not in a review).

* ``capturer`` names ``senders`` only in the composition root (``app.py``), in
  ``config.py`` (it validates senderConfig against the sender registry) and in
  the demo (tooling that checks the file it wrote).
* ``senders`` use of the capture side only what a sender needs: the model, the
  errors, value encodings (``encode``, its C twin ``_fastrows``, the generated
  protobuf messages), config-key declarations, spilled changes, the bounded
  queue and failpoints; never the pipeline, the regions, the app, the status
  server or the config loader (except the lake's command-line tool, which reads
  the config to find the lake).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CAPTURER_MAY_NAME_SENDERS = {"capturer/app.py", "capturer/config.py", "capturer/demo.py"}
SENDERS_MAY_USE = {"capturer", "capturer.model", "capturer.errors", "capturer.encode", "capturer._fastrows",
                   "capturer.protogen", "capturer.ini", "capturer.spill", "capturer.failpoints",
                   "capturer.pipeline.bqueue"}
# a sender's command-line tool reads the capturer's config to find its target
TOOLS_MAY_READ_CONFIG = {"senders/spark/lakecli.py": {"capturer.config"}}


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            if node.module == "capturer":  # from capturer import failpoints
                out += [(node.lineno, f"capturer.{a.name}") for a in node.names]
    return out


def test_capturer_names_senders_only_in_the_composition_root() -> None:
    bad = []
    for p in sorted((ROOT / "capturer").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        for line, mod in imports(p):
            if (mod == "senders" or mod.startswith("senders.")) and rel not in CAPTURER_MAY_NAME_SENDERS:
                bad.append(f"{rel}:{line}: imports {mod}")
    assert not bad, "\n".join(bad)


def test_senders_use_only_the_sender_side_of_the_capturer() -> None:
    bad = []
    for p in sorted((ROOT / "senders").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        for line, mod in imports(p):
            if (mod == "capturer" or mod.startswith("capturer.")) and mod not in SENDERS_MAY_USE \
                    and mod not in TOOLS_MAY_READ_CONFIG.get(rel, ()):
                bad.append(f"{rel}:{line}: imports {mod}")
    assert not bad, "\n".join(bad)
