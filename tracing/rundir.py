"""The run directory: creation, atomic writes, the manifest and host metadata.

See docs/run-format.md. The manifest is written first with status ``running`` and finalised
last; every file is written to a temporary name and renamed, so readers never see half a file.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import workloads
from workloads.errors import UserError

SCHEMA_VERSION = 1
STATUSES = ("running", "completed", "failed", "interrupted")
REPO_ROOT = Path(__file__).resolve().parent.parent


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(
        path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode()
    )


def atomic_write_parquet(path: Path, table: pa.Table) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def new_run_dir(root: Path, label: str, variant: str | None) -> Path:
    """Create a fresh, uniquely named run directory under ``root``; never reuse one.

    The returned path is absolute: it is bind-mounted into the container."""
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)[:40]
    parts = [stamp, safe] + ([variant] if variant else [])
    for _ in range(20):
        path = root / "-".join([*parts, secrets.token_hex(2)])
        try:
            path.mkdir()
        except FileExistsError:
            continue
        for sub in ("raw", "ctl", "out"):
            (path / sub).mkdir()
        return path
    raise UserError(f"could not create a new run directory under {root}")


def git_revision() -> str | None:
    """HEAD of the twintrace checkout, with -dirty when there are local changes."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _first_line(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def host_metadata(docker_version: str | None = None) -> dict[str, Any]:
    """What the run ran on: enough to refuse comparing runs from different setups."""
    os_name = None
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "os": os_name,
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "docker_version": docker_version,
        "bpftrace_version": _first_line(["bpftrace", "--version"]),
        "python_version": platform.python_version(),
    }


def initial_manifest(run_dir: Path, **fields: Any) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "twintrace_version": workloads.__version__,
        "run_id": run_dir.name,
        "status": "running",
        "error": None,
        "git_revision": git_revision(),
        "started_at": utc_now(),
        "ended_at": None,
        "start_ns": None,
        "end_ns": None,
        "exit_code": None,
        "lost_events": None,
        **fields,
    }


def load_json_checked(path: Path, what: str) -> dict[str, Any]:
    """Load a manifest or summary and check its schema version."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{path} does not exist: is {path.parent} a twintrace run directory? (`./cli.py runs` lists runs)"
        ) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}): the run directory is damaged") from None
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UserError(
            f"{what} {path} has schema_version {version!r}; this twintrace reads version "
            f"{SCHEMA_VERSION}: use the twintrace version that wrote it ({data.get('twintrace_version', 'unknown')})"
        )
    return data
