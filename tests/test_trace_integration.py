"""Integration: real containers traced by real bpftrace, checked against ground truth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, bpftrace_running
from tracing.container import RUN_LABEL, BindMount, client
from tracing.runner import TraceRequest, trace
from workloads.errors import UserError

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.bpftrace]

BASE = "twintrace/base:latest"
SIZES = [1, 4096, 10_000, 123_457, 3 * 65_536 + 7, 1_000_003]


def _events(run_dir: Path) -> pd.DataFrame:
    df = pd.read_parquet(run_dir / "events.parquet")
    df["kind"] = df["kind"].astype(str)
    return df


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def test_reading_n_known_files_shows_n_opens_and_their_bytes(images, tmp_path: Path, runs_root: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i, size in enumerate(SIZES):
        (data / f"file{i}.bin").write_bytes(os.urandom(size))
    script = (
        "import os\n"
        "for name in sorted(os.listdir('/data')):\n"
        "    with open(os.path.join('/data', name), 'rb') as fh:\n"
        "        fh.read()\n"
    )
    # Cold cache, so the page-cache lane must show the files coming in.
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    run_dir = trace(TraceRequest(image=BASE, command=["python3", "-c", script], label="groundtruth",
                                 runs_root=runs_root, mounts=(BindMount(data, "/data", True),)))
    manifest = _manifest(run_dir)
    assert manifest["status"] == "completed" and manifest["exit_code"] == 0
    assert manifest["lost_events"] == 0
    events = _events(run_dir)
    for i, size in enumerate(SIZES):
        path = f"/data/file{i}.bin"
        opens = events[(events["kind"] == "openat") & (events["path"] == path)]
        assert len(opens) == 1, path
        reads = events[events["kind"].isin(["read", "pread64", "readv"]) & (events["path"] == path)]
        assert reads["bytes"].sum() == size, path
        closes = events[(events["kind"] == "close") & (events["path"] == path)]
        assert len(closes) == 1, path
    # Nothing else under /data was opened, and the process tree was captured.
    data_opens = events[(events["kind"] == "openat") & events["path"].str.startswith("/data/", na=False)]
    assert len(data_opens) == len(SIZES)
    assert (events["kind"] == "exec").sum() >= 1
    cache_pages = events.loc[events["kind"] == "cache_add", "count"].sum()
    assert cache_pages * 4096 >= sum(SIZES)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["syscalls"]["openat"]["count"] == int((events["kind"] == "openat").sum())
    samples = pd.read_parquet(run_dir / "samples.parquet")
    assert {"container_cpu", "host_cpu_user"} <= set(samples["metric"].astype(str))


def test_failed_workload_leaves_a_failed_run(images, runs_root: Path) -> None:
    with pytest.raises(UserError, match="exited with code 3"):
        trace(TraceRequest(image=BASE, command=["python3", "-c", "import sys; sys.exit(3)"], label="fails", runs_root=runs_root))
    (run_dir,) = runs_root.iterdir()
    manifest = _manifest(run_dir)
    assert manifest["status"] == "failed" and manifest["exit_code"] == 3
    assert "exited with code 3" in manifest["error"]
    assert not client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"})


def test_ctrl_c_leaves_no_container_no_bpftrace_and_an_interrupted_manifest(images, runs_root: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "cli.py"), "trace", "--image", BASE, "--out", str(runs_root), "--",
         "python3", "-c", "import time\nwhile True: time.sleep(0.1)"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        run_dir = None
        while time.monotonic() < deadline:
            dirs = list(runs_root.glob("*")) if runs_root.exists() else []
            if dirs and (dirs[0] / "manifest.json").exists() and _manifest(dirs[0]).get("start_ns"):
                run_dir = dirs[0]  # released: bpftrace is attached and the workload runs
                assert bpftrace_running()
                break
            time.sleep(0.2)
        assert run_dir is not None, "the trace never started"
        time.sleep(2)  # let the workload run for a moment after release
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert proc.returncode == 130, stderr.decode()
    manifest = _manifest(run_dir)
    assert manifest["status"] == "interrupted"
    assert manifest["ended_at"] is not None
    assert not client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"})
    assert bpftrace_running() == []
    # The run directory is still consistent: the tables exist and the summary says interrupted.
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert (run_dir / "events.parquet").exists()
