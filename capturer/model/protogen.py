"""Generated protobuf code for ``proto/*.proto``, made by the build.

``bootstrap.sh`` runs ``python -m capturer.model.protogen`` after installing; if a
generated module is missing or older than its .proto (a source checkout used
directly), ``load()`` generates it on first use. Generated files are never
committed or edited by hand.

* ``capturer``: ``proto/capturer.proto``, the change format at the edges
  (Kafka ``format=protobuf``).
* ``baikaldb``: ``proto/baikaldb.proto``, BaikalDB's binlog read protocol.
* ``agent``: ``proto/agent.proto``, the region agents' stream (services are
  registered with grpc's generic handlers: no generated stubs).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto"
PROTO = PROTO_DIR / "capturer.proto"
NAMES = ("capturer", "baikaldb", "agent")
OUT = Path(__file__).resolve().parent / "_generated"
_modules: dict[str, ModuleType] = {}
_lock = threading.Lock()


def generate(name: str = "capturer") -> Path:
    from grpc_tools import protoc  # build-time dependency (grpcio-tools)

    proto = PROTO_DIR / f"{name}.proto"
    OUT.mkdir(exist_ok=True)
    target = OUT / f"{name}_pb2.py"
    if target.exists() and target.stat().st_mtime >= proto.stat().st_mtime:
        return target
    rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--python_out={OUT}", str(proto)])
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc}) on {proto}")
    return target


def load(name: str = "capturer") -> ModuleType:
    mod = _modules.get(name)
    if mod is not None:
        return mod
    with _lock:
        if name not in _modules:
            path = generate(name)
            modname = f"{name}_pb2"
            spec = importlib.util.spec_from_file_location(modname, path)
            assert spec is not None and spec.loader is not None
            m = importlib.util.module_from_spec(spec)
            sys.modules[modname] = m
            spec.loader.exec_module(m)
            _modules[name] = m
        return _modules[name]


def value_of(v: Any) -> Any:
    """The Python value a ``capturer.Value`` holds (None for ``is_null``): a column of a
    ``format=protobuf`` message read back (senders/kafka/format.py writes them; verify and
    the appliers read them)."""
    kind = v.WhichOneof("kind")
    return None if kind in (None, "is_null") else getattr(v, kind)


if __name__ == "__main__":
    for n in NAMES:
        print(generate(n))
