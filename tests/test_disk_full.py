"""A full file system, for real: a small tmpfs mounted for the test (as root; CI runs as root).

Data generation refuses up front a dataset its file system cannot hold, before the directory
is touched; one whose file system fills while it writes (tmpfs rounds every small file up to a
page, so 2 MB of 16 kB images do not fit in 2 MiB) stops with one line, exit 1, only whole
files and no manifest: it is never taken for a dataset.

A traced run refuses a runs directory without room for a run; one whose file system fills
while it traces fails saying so (its manifest has the room it kept for that), keeps raw/ as far
as it was written and leaves nothing running."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.errors import UserError
from datagen.common import load_manifest
from tests.conftest import bpftrace_running, error_line, require, run_cli, traced_events
from tracing.container import RUN_LABEL, client
from workloads.config import BASE_TAG

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["2m"])
def small_fs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tmpfs of ``request.param`` (2 MiB unless parametrized) at ``tmp_path / "fs"``,
    unmounted after the test."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={request.param}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    require(done.returncode == 0, f"cannot mount a tmpfs (root needed): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_dataset_larger_than_the_free_space_is_refused_before_anything_is_written(
    small_fs: Path,
) -> None:
    out = small_fs / "unet3d"
    done = run_cli("datagen", "unet3d", "--out", str(out), "--size", "8MB", "--scale", "0.2")
    assert error_line(done) == (
        f"Error: {out}: its file system has 2.0 MiB free and the dataset needs 7.6 MiB: free "
        "some space, write it elsewhere (--out), or give a smaller --size"
    )
    assert not out.exists()


def test_a_file_system_filling_while_generating_leaves_whole_files_and_no_dataset(
    small_fs: Path,
) -> None:
    out = small_fs / "images"
    args = ("images", "--out", str(out), "--size", "2000000", "--mean-kb", "16")
    done = run_cli("datagen", *args, "--size-sigma", "0.1")
    assert error_line(done) == (
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
    done = run_cli("datagen", *args, "--size-sigma", "0.1", "--force", "--size", "1000000")
    assert done.returncode == 0, done.stderr
    assert len(load_manifest(out)["files"]) > 10


STORM = (
    "import os\n"
    "for i in range(300000):\n"
    "    fd = os.open('/etc/hostname', os.O_RDONLY)\n"
    "    os.read(fd, 10)\n"
    "    os.close(fd)\n"
)


@pytest.mark.docker
@pytest.mark.bpftrace
@pytest.mark.integration
@pytest.mark.parametrize("small_fs", ["3m"], indirect=True)
def test_a_file_system_filling_while_tracing_fails_the_run_saying_so(
    images, small_fs: Path
) -> None:
    runs = small_fs / "runs"
    done = run_cli("trace", "--image", BASE_TAG, "--out", str(runs), "--", "python3", "-c", STORM)
    last = error_line(done)
    (run_dir,) = runs.iterdir()
    says = f"the file system of {runs} filled while tracing"
    assert last.startswith(f"Error: {says} (")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["error"].startswith(says)
    assert (run_dir / "raw" / "syscalls.txt").stat().st_size > 1 << 20  # kept as written
    assert not (run_dir / ".reserve").exists()
    assert not client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"})
    assert bpftrace_running() == []
    # With the room back, `ingest` processes what raw/ holds; the run stays failed.
    (run_dir / "raw" / "syscalls.txt").write_bytes(b"")
    done = run_cli("ingest", str(run_dir))
    assert done.returncode == 1 and (run_dir / "events.parquet").exists()
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until its file system has no room left."""
    chunk = bytes(1 << 16)
    with path.open("wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


@pytest.mark.docker
@pytest.mark.bpftrace
@pytest.mark.integration
@pytest.mark.parametrize("small_fs", ["16m"], indirect=True)
def test_a_file_system_filling_while_processing_fails_the_run_and_ingest_finishes_it(
    images, small_fs: Path
) -> None:
    """The run's own CLI stopped (SIGSTOP) as it starts processing, the file system filled by
    another writer, the CLI let go: the tables do not fit. The run fails saying so, keeps raw/
    whole and the traceback, writes no table (not even a part of one) and leaves nothing
    running; with the room back, `ingest` makes its tables and it is completed."""
    runs = small_fs / "runs"
    reads = "for i in range(200): open('/etc/hostname').read()"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "trace", "--image", BASE_TAG, "--out", str(runs)]
        + ["--", "python3", "-c", reads],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:
        said.append(line)
        if "processing the trace" in line:
            os.kill(proc.pid, signal.SIGSTOP)
            break
    (run_dir,) = runs.iterdir()
    raw = {p.name: p.stat().st_size for p in (run_dir / "raw").iterdir()}
    try:
        _fill(small_fs / "filler")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    said.append(err)
    assert proc.returncode == 1, "".join(said)
    assert "Traceback" not in "".join(said)
    last = "".join(said).strip().splitlines()[-1]
    says = f"processing the trace failed: the file system of {runs} filled while writing the tables"
    assert last.startswith(f"Error: {says} ("), last
    assert f"`./cli.py ingest {run_dir}` tries again, once there is room" in last
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["error"].startswith(says)
    # raw/ as it was, the traceback beside it; no table and no part of one.
    assert {p.name: p.stat().st_size for p in (run_dir / "raw").iterdir() if p.name in raw} == raw
    assert "No space left on device" in (run_dir / "raw" / "processing-error.txt").read_text()
    leftovers = sorted(p.name for p in run_dir.iterdir() if p.is_file())
    assert leftovers == ["manifest.json"], leftovers
    assert not client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"})
    assert bpftrace_running() == []
    # With the room back, `ingest` processes raw/: the run had completed, and now is.
    (small_fs / "filler").unlink()
    done = run_cli("ingest", str(run_dir))
    assert done.returncode == 0, done.stderr
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "completed"
    events = traced_events(run_dir)
    opens = events[(events["kind"] == "openat") & (events["path"] == "/etc/hostname")]
    assert len(opens) >= 200


@pytest.mark.docker
@pytest.mark.integration
def test_a_runs_directory_without_room_for_a_run_is_refused(images, small_fs: Path) -> None:
    (small_fs / "fill").write_bytes(bytes(1 << 20))  # 1 MiB of 2 left: under the 2 MiB a run needs
    runs = small_fs / "runs"
    done = run_cli("trace", "--image", BASE_TAG, "--out", str(runs), "--", "true")
    assert error_line(done) == (
        f"Error: {runs}: its file system has no room for a run (at least 2.0 MiB free, and as "
        "much as the trace takes): free some space or give another --out"
    )
    assert list(runs.iterdir()) == []
