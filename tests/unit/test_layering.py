"""The import rules between the layers, checked on the source (an import added in
the wrong direction fails here, not in a review).

    capturer.errors, capturer.model (+ encode, spill, protogen, wire, ddl), capturer.util
        the shared layer: what the capture side hands the senders, and helpers
        that know nothing of the pipeline; imports nothing above it
    capturer.pipeline
        merger, filter, fanout, backlog, checkpoint: no region, agent, ops, app or config
    capturer.regions.<kind>
        a region kind imports the shared layer, the regions' base and clock, its config, and its
        own folder: never another kind, except the remote kind, which runs any kind in a worker
    capturer.regions, capturer.agent, capturer.ops, capturer.config ...
        the capture side; never names a sender
    senders
        use only the shared layer (the lake's command-line tool also reads the
        capturer's config, to find the lake); senders/process.py is the root of a
        sender's own process
    capturer.app, capturer.apply.app, capturer.apply.spark_stream
        the composition roots (the capturer's; an applier's, which drives senders from Kafka; the
        streaming applier on Spark):
        the modules of the capture side that name senders
    devtools
        the demo, private servers, the BaikalDB double and workloads: nothing under
        capturer/ or senders/ imports it, except the command line for --demo;
        nothing at all imports tests/
No two modules import each other (a small Protocol for what one needs of the other).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("capturer", "senders", "devtools", "bench")

# the composition roots: the capturer's, and an applier's (capturer/apply: Kafka -> senders)
CAPTURER_MAY_NAME_SENDERS = {"capturer/app.py", "capturer/apply/app.py", "capturer/apply/spark_stream.py"}
# a sender's command-line tool reads the capturer's config to find its target
TOOLS_MAY_READ_CONFIG = {"senders/spark/lakecli.py": {"capturer.config"}}
# the command line starts the demo (python -m capturer --demo)
MAY_IMPORT_DEVTOOLS = {"capturer/__main__.py"}
# what every region kind may use besides the shared layer and its own folder
REGION_COMMON = ("capturer.regions.base", "capturer.regions.clock", "capturer.regions.journal",
                 "capturer.regions", "capturer.regions.snapshot", "capturer.regions.snapshot_plan",
                 "capturer.regions.snaphost",  # the snapshot engine
                 "capturer.regions.snapshot_keys",  # the snapshot keys every kind with snapshots takes
                 "capturer.config",  # its section of the config
                 "capturer.regions.kind")  # its descriptor (KIND)


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            # from capturer import app / from capturer.model import wire: the submodule counts
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                    if (ROOT / node.module.replace(".", "/") / f"{a.name}.py").exists()
                    or (ROOT / node.module.replace(".", "/") / a.name / "__init__.py").exists()]
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


def _in(mod: str, *packages: str) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in packages)


def shared(mod: str) -> bool:
    return _in(mod, "capturer.model", "capturer.util", "capturer.errors", "capturer._fastrows")


def _files(top: str) -> list[tuple[str, Path]]:
    return [(p.relative_to(ROOT).as_posix(), p) for p in sorted((ROOT / top).rglob("*.py"))
            if "_generated" not in p.parts]


def _module(rel: str) -> str:
    return rel[:-3].replace("/", ".").removesuffix(".__init__")


def test_capturer_names_senders_only_in_the_composition_root() -> None:
    bad = [f"{rel}:{line}: imports {mod}" for rel, p in _files("capturer") for line, mod in imports(p)
           if _in(mod, "senders") and rel not in CAPTURER_MAY_NAME_SENDERS]
    assert not bad, "\n".join(bad)


def test_senders_use_only_the_shared_layer() -> None:
    bad = [f"{rel}:{line}: imports {mod}" for rel, p in _files("senders") for line, mod in imports(p)
           if (_in(mod, "capturer") and not shared(mod) and mod not in TOOLS_MAY_READ_CONFIG.get(rel, ()))
           or mod.startswith(".") or _in(mod, "devtools")]
    assert not bad, "\n".join(bad)


def test_the_shared_layer_imports_nothing_above_it() -> None:
    bad = []
    for rel, p in _files("capturer"):
        if not shared(_module(rel)):
            continue
        bad += [f"{rel}:{line}: imports {mod}" for line, mod in imports(p)
                if (_in(mod, "capturer") and not shared(mod) and mod != "capturer")
                or _in(mod, "senders", "devtools") or mod.startswith(".")]
    assert not bad, "\n".join(bad)


def test_the_pipeline_knows_no_region_agent_ops_app_or_config() -> None:
    bad = [f"{rel}:{line}: imports {mod}" for rel, p in _files("capturer/pipeline") for line, mod in imports(p)
           if _in(mod, "capturer.regions", "capturer.agent", "capturer.app", "capturer.ops", "capturer.config")]
    assert not bad, "\n".join(bad)


def test_a_region_kind_imports_only_the_shared_layer_the_region_base_and_itself() -> None:
    bad = []
    for kind_dir in sorted((ROOT / "capturer/regions").iterdir()):
        if not kind_dir.is_dir() or kind_dir.name.startswith("_"):
            continue
        own = f"capturer.regions.{kind_dir.name}"
        for rel, p in _files(f"capturer/regions/{kind_dir.name}"):
            for line, mod in imports(p):
                if not _in(mod, "capturer") or shared(mod) or _in(mod, own) or mod in REGION_COMMON:
                    continue
                if kind_dir.name == "remote" and _in(mod, "capturer.regions", "capturer.config", "capturer.agent"):
                    continue  # the remote kind runs any region kind (in a worker process or an agent)
                bad.append(f"{rel}:{line}: imports {mod}")
    assert not bad, "\n".join(bad)


# the wings that reach kinds only through the registries (capturer/regions/__init__.py, senders/__init__.py)
KIND_BLIND = ("capturer/ops/", "capturer/ha/", "capturer/apply/", "capturer/__main__.py", "capturer/config.py",
              "capturer/app.py",
              "capturer/pipeline/")
KIND_PACKAGES = tuple(f"capturer.regions.{d.name}" for d in (ROOT / "capturer/regions").iterdir()
                      if (d / "__init__.py").exists()) + \
    tuple(f"senders.{d.name}" for d in (ROOT / "senders").iterdir() if (d / "__init__.py").exists())


def test_ops_ha_apply_config_and_the_command_line_reach_kinds_only_through_the_registries() -> None:
    assert "capturer.regions.postgresql" in KIND_PACKAGES and "senders.kafka" in KIND_PACKAGES
    bad = [f"{rel}:{line}: imports {mod}" for rel, p in _files("capturer") if rel.startswith(KIND_BLIND)
           for line, mod in imports(p) if _in(mod, *KIND_PACKAGES)]
    assert not bad, "\n".join(bad)


def test_config_names_no_region_kind() -> None:
    """config.py validates a [region:NAME] section with the keys its kind's descriptor
    names: no type of the registry appears in it as a string (a dispatch by name)."""
    from capturer.regions import types

    text = (ROOT / "capturer/config.py").read_text()
    bad = [t for t in types() if f'"{t}"' in text or f"'{t}'" in text]
    assert not bad, f"capturer/config.py names region kinds {bad}"


def test_no_arrow_runs_back_up_to_the_roots_or_across_the_wings() -> None:
    """app.py and the command line are the roots: what they build (ops/, ha/) gets the
    Capturer, the status server and the registries handed in, and names neither them
    nor each other; util/ sits below model/."""
    bad = []
    for rel, p in _files("capturer"):
        for line, mod in imports(p):
            if rel.startswith(("capturer/ops/", "capturer/ha/", "capturer/regions/", "capturer/pipeline/",
                               "capturer/config.py")) and _in(mod, "capturer.app", "capturer.__main__"):
                bad.append(f"{rel}:{line}: imports {mod}")
            if rel.startswith("capturer/ops/") and _in(mod, "capturer.ha"):
                bad.append(f"{rel}:{line}: imports {mod}")
            if rel.startswith("capturer/ha/") and _in(mod, "capturer.ops"):
                bad.append(f"{rel}:{line}: imports {mod}")
            if rel.startswith("capturer/util/") and _in(mod, "capturer.model"):
                bad.append(f"{rel}:{line}: imports {mod}")
    assert not bad, "\n".join(bad)


def test_only_the_command_line_imports_devtools_and_nothing_imports_tests() -> None:
    bad = []
    for top in ("capturer", "senders", "devtools", "bench"):
        for rel, p in _files(top):
            for line, mod in imports(p):
                if _in(mod, "devtools") and top in ("capturer", "senders") and rel not in MAY_IMPORT_DEVTOOLS:
                    bad.append(f"{rel}:{line}: imports {mod}")
                if _in(mod, "tests", "helpers", "workload", "conftest"):
                    bad.append(f"{rel}:{line}: imports {mod} (tests/ is not importable by the product)")
            if "sys.path" in p.read_text(encoding="utf-8") and "tests" in p.read_text(encoding="utf-8") \
                    and top != "bench":
                bad.append(f"{rel}: edits sys.path (no module reaches into tests/)")
    assert not bad, "\n".join(bad)


def test_no_two_modules_import_each_other() -> None:
    graph: dict[str, set[str]] = {}
    for top in ("capturer", "senders", "devtools"):
        for rel, p in _files(top):
            me = _module(rel)
            graph[me] = {m for _, m in imports(p) if _in(m, "capturer", "senders", "devtools")}
    pairs = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps
                    if b != a and a in graph.get(b, set()) and not a.startswith(b + ".") and not b.startswith(a + ".")})
    assert not pairs, "\n".join(f"{a} <-> {b}" for a, b in pairs)


def test_the_rules_see_imports() -> None:
    """The checks above would pass on nothing: make sure they read real imports."""
    sender = {m: line for line, m in imports(ROOT / "senders/base.py")}
    assert "capturer.model" in sender and "capturer.util.bqueue" in sender
    assert any(_in(m, "senders") for _, m in imports(ROOT / "capturer/app.py"))
    assert shared("capturer.model.encode") and shared("capturer.model.wire") and not shared("capturer.pipeline.merger")
    assert any(_in(m, "devtools") for _, m in imports(ROOT / "capturer/__main__.py"))
    assert "capturer.regions.base" in {m for _, m in imports(ROOT / "capturer/regions/mysql/region.py")}


# where a function may import a module of the project (everywhere else: at the top, where the reader sees the
# module's dependencies and an import cycle shows at once): only for a heavy optional library or a real cycle;
# each with why
LOCAL_IMPORTS_MAY = {
    "capturer/__main__.py": "the command line imports what the sub-command it runs needs: a sub-command's start-up "
                            "(status, verify, snapshot...) does not import the whole capturer (its modules at the "
                            "top: ~0.9 s more per call), spark-apply pyspark, --demo devtools' servers and workloads",
    "capturer/regions/__init__.py": "a cycle: process=true's worker region (regions/remote/worker.py) imports "
                                    "capturer.regions.base, so this package cannot import it at load",
}


def test_project_imports_inside_functions_only_where_listed() -> None:
    bad = []
    for top in ("capturer", "senders"):
        for rel, p in _files(top):
            if rel in LOCAL_IMPORTS_MAY:
                continue
            for fn in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    bad += [f"{rel}:{n.lineno}: imports {n.module} inside {fn.name}()" for n in ast.walk(fn)
                            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module
                            and n.module.split(".")[0] in ("capturer", "senders", "devtools")]
    assert not bad, "\n".join(sorted(set(bad)))
