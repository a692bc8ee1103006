"""Generated protobuf code for ``proto/capturer.proto``, made by the build.

``bootstrap.sh`` runs ``python -m capturer.protogen`` after installing; if the
generated module is missing or older than the .proto (a source checkout
used directly), ``load()`` generates it on first use. The generated file is
never committed or edited by hand.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().parent.parent / "proto" / "capturer.proto"
OUT = Path(__file__).resolve().parent / "_generated"
_module: ModuleType | None = None


def generate() -> Path:
    from grpc_tools import protoc  # build-time dependency (grpcio-tools)

    OUT.mkdir(exist_ok=True)
    target = OUT / "capturer_pb2.py"
    if target.exists() and target.stat().st_mtime >= PROTO.stat().st_mtime:
        return target
    rc = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={OUT}", str(PROTO)])
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc}) on {PROTO}")
    return target


def load() -> ModuleType:
    global _module
    if _module is None:
        path = generate()
        spec = importlib.util.spec_from_file_location("capturer_pb2", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["capturer_pb2"] = mod
        spec.loader.exec_module(mod)
        _module = mod
    return _module


if __name__ == "__main__":
    print(generate())
