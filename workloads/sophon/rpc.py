"""The gRPC code of ``protos/data_transfer.proto``: generated, never committed.

``python -m workloads.sophon.rpc`` runs protoc (the ``grpcio-tools`` package) and writes
``data_transfer_pb2.py`` and ``data_transfer_pb2_grpc.py`` beside the ``.proto``; the workload
images run it at build time (``images/Dockerfile.workload``). :func:`modules` returns the two
modules, generating them first when they are missing or older than the ``.proto`` (on the host,
on first use). The files are written to a temporary directory and renamed into place, so
processes generating at the same time never import a half-written file.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from core.errors import UserError

PROTOS = Path(__file__).resolve().parent / "protos"
PROTO = PROTOS / "data_transfer.proto"
#: The directory the proto's import path is relative to (the repository, or /opt/twintrace).
ROOT = PROTOS.parents[2]
PACKAGE = "workloads.sophon.protos"
GENERATED = ("data_transfer_pb2.py", "data_transfer_pb2_grpc.py")


def _stale() -> bool:
    proto_mtime = PROTO.stat().st_mtime_ns
    for name in GENERATED:
        path = PROTOS / name
        if not path.exists() or path.stat().st_mtime_ns < proto_mtime:
            return True
    return False


def generate() -> list[Path]:
    """Run protoc over the ``.proto``; return the generated files."""
    try:
        from grpc_tools import protoc
    except ImportError:
        raise UserError(
            "grpcio-tools is not installed: run `make setup` (it installs requirements.lock)"
        ) from None
    include = Path(protoc.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory(prefix=".protoc-", dir=PROTOS) as tmp:
        args = [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO),
        ]
        if protoc.main(args) != 0:
            raise UserError(f"protoc could not compile {PROTO}")
        made = Path(tmp) / PROTO.parent.relative_to(ROOT)
        out = []
        for name in GENERATED:
            os.replace(made / name, PROTOS / name)
            out.append(PROTOS / name)
    return out


def modules() -> tuple[ModuleType, ModuleType]:
    """``(data_transfer_pb2, data_transfer_pb2_grpc)``, generated first when needed."""
    if _stale():
        generate()
    pb2 = importlib.import_module(f"{PACKAGE}.data_transfer_pb2")
    grpc_mod = importlib.import_module(f"{PACKAGE}.data_transfer_pb2_grpc")
    return pb2, grpc_mod


if __name__ == "__main__":
    for path in generate():
        print(path)
    sys.exit(0)
