"""Atomic file writes: a reader sees the old file or the whole new one, never half of one.

Every writer of the project goes through :func:`atomic_path` (or the helpers built on it): the
data goes to a fresh temporary name in the target's directory (a rename within one file
system), which is renamed over the target on success and removed on any failure, Ctrl-C
included. The temporary name carries the pid and a random suffix, so two writers never share
one, and starts with a dot, so listings skip it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def temp_path(path: str | os.PathLike[str]) -> Path:
    """A fresh temporary name next to ``path`` (same directory, hidden, unique)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; rename it to ``path`` on success, remove it on failure.

    ``fsync``: flush the file and its directory, so the new file survives a power cut (the
    caller's writer must have closed the file before the block ends).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
        if fsync:
            _fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path, fsync=fsync) as tmp, open(tmp, "xb") as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, fsync: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def atomic_write_json(
    path: str | os.PathLike[str], obj: Any, fsync: bool = False, indent: int | None = 2
) -> None:
    """Write ``obj`` as JSON (one trailing newline) to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent, default=str) + "\n", fsync=fsync)
