"""A full file system, for real: a small tmpfs mounted for the test (as root; CI runs as root).

Data generation refuses up front a dataset its file system cannot hold, before the directory
is touched; one whose file system fills while it writes (tmpfs rounds every small file up to a
page, so 2 MB of 16 kB images do not fit in 2 MiB) stops with one line, exit 1, only whole
files and no manifest: it is never taken for a dataset."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.errors import UserError
from datagen.common import load_manifest
from tests.conftest import REPO, require


@pytest.fixture()
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs at ``tmp_path / "fs"``, unmounted after the test."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    require(done.returncode == 0, f"cannot mount a tmpfs (root needed): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _datagen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "cli.py"), "datagen", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def test_a_dataset_larger_than_the_free_space_is_refused_before_anything_is_written(
    small_fs: Path,
) -> None:
    out = small_fs / "unet3d"
    done = _datagen("unet3d", "--out", str(out), "--size", "8MB", "--scale", "0.2")
    assert done.returncode == 1
    assert _last_line(done) == (
        f"Error: {out}: its file system has 2.0 MiB free and the dataset needs 7.6 MiB: free "
        "some space, write it elsewhere (--out), or give a smaller --size"
    )
    assert not out.exists()


def test_a_file_system_filling_while_generating_leaves_whole_files_and_no_dataset(
    small_fs: Path,
) -> None:
    out = small_fs / "images"
    args = ("images", "--out", str(out), "--size", "2000000", "--mean-kb", "16")
    done = _datagen(*args, "--size-sigma", "0.1")
    assert done.returncode == 1
    assert _last_line(done) == (
        "Error: No space left on device: free some space (df -h) or write less, then run the "
        "command again"
    )
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 10 and not (out / "manifest.json").exists()
    # Every file left is a whole JPEG (no temporary or cut file), and none is a dataset.
    for path in files:
        if path.name != ".twintrace-dataset":
            data = path.read_bytes()
            assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9", path
    with pytest.raises(UserError, match="manifest"):
        load_manifest(out)
    # With --force and a size that fits, the same directory becomes a whole dataset.
    done = _datagen(*args, "--size-sigma", "0.1", "--force", "--size", "1000000")
    assert done.returncode == 0, done.stderr
    assert len(load_manifest(out)["files"]) > 10
