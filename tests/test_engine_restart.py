"""The Docker engine stopped in the middle of a traced run, for real, then started again.

The run fails saying why (its tracer agent was stopped with the engine's containers, and the
engine did not answer), without a traceback; it keeps what it traced; once the engine is back,
the next run removes what the first left, and nothing of either is left.

This stops the host's Docker engine, and every container on it: it runs in CI (which owns its
machine) and, elsewhere, only when TWINTRACE_TEST_ENGINE_RESTART=1 says the machine may."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO, bpftrace_running
from tracing.container import RUN_LABEL, client
from workloads.config import BASE_TAG

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.bpftrace]

LOOP = "import time\nwhile True: time.sleep(0.1)"


def _engine_pids() -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "comm").read_text().strip() == "dockerd":
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _stop_engine() -> None:
    """Stop dockerd as its manager would: systemd's unit where systemd runs it, else SIGTERM
    (tracing/setup-host.sh starts it without systemd); wait until it is gone."""
    if Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "stop", "docker.socket", "docker"], check=False)
    for pid in _engine_pids():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _engine_pids():
        assert time.monotonic() < deadline, "dockerd did not stop within 60 s"
        time.sleep(0.2)


def _start_engine() -> None:
    subprocess.run(
        ["sh", str(REPO / "tracing" / "setup-host.sh")],
        check=True,
        capture_output=True,
        start_new_session=True,  # the engine is not this test's child process
    )


def _trace(runs: Path, *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(REPO / "cli.py"), "trace", "--image", BASE_TAG]
        + ["--out", str(runs), "--", *command],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_engine_stopped_mid_run_fails_it_in_one_line_and_the_next_run_cleans_up(
    images, tmp_path: Path
) -> None:
    if not (IN_CI or os.environ.get("TWINTRACE_TEST_ENGINE_RESTART") == "1"):
        pytest.skip("stops the Docker engine: set TWINTRACE_TEST_ENGINE_RESTART=1 (CI does)")
    runs = tmp_path / "runs"
    proc = _trace(runs, "python3", "-c", LOOP)
    try:
        deadline = time.monotonic() + 120
        while True:
            manifests = list(runs.glob("*/manifest.json"))
            if manifests and json.loads(manifests[0].read_text()).get("start_ns"):
                break  # released: traced and running
            assert time.monotonic() < deadline and proc.poll() is None, "the run never started"
            time.sleep(0.2)
        time.sleep(1)
        _stop_engine()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _start_engine()
    assert proc.returncode == 1 and "Traceback" not in err, err
    error = err[err.rindex("Error: ") :]
    assert "engine" in error and "what is left" in error, error
    (run_dir,) = runs.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "engine" in manifest["error"]
    assert (run_dir / "raw" / "syscalls.txt").stat().st_size > 0  # what it traced is kept
    # The engine is back: the next run removes what the first left, and completes.
    after = _trace(runs, "true")
    _, err = after.communicate(timeout=300)
    assert after.returncode == 0, err
    assert f"removed the containers of run {run_dir.name}" in err
    assert (
        client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"}) == []
    )
    assert bpftrace_running() == []
