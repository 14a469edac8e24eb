"""A run whose process died: ``incomplete``, never ``running`` forever; ``./cli.py ingest RUN``
processes its raw/ again (store/rundir.py ``run_status``, tracing/runner.py ``reingest``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from core.errors import UserError
from store import rundir
from tests.conftest import require_tracing, run_cli
from tests.synthetic import make_run
from tracing.runner import reingest

ROOT = Path(__file__).resolve().parent.parent


def _dead_process() -> dict[str, object]:
    """The coordinator record of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    record = {**rundir.this_process(), "pid": child.pid}
    record["started"] = rundir._process_start(child.pid)
    child.kill()
    child.wait()
    return record


def test_a_running_run_whose_process_is_gone_is_incomplete(tmp_path: Path) -> None:
    alive = rundir.this_process()
    assert rundir.run_status({"status": "running", "coordinator": alive}) == "running"
    assert rundir.coordinator_alive({"coordinator": alive}) is True
    dead = _dead_process()
    assert rundir.run_status({"status": "running", "coordinator": dead}) == rundir.INCOMPLETE
    rebooted = {**alive, "boot_id": "another boot"}
    assert rundir.run_status({"status": "running", "coordinator": rebooted}) == "incomplete"
    elsewhere = {**dead, "hostname": "another-host"}  # this host cannot tell: as it says
    assert rundir.run_status({"status": "running", "coordinator": elsewhere}) == "running"
    assert rundir.run_status({"status": "running"}) == "running"  # an old run: not recorded
    assert rundir.run_status({"status": "completed", "coordinator": dead}) == "completed"
    run_dir = make_run(tmp_path, status="running", coordinator=dead)
    assert rundir.load_run(run_dir).status == "incomplete"


def test_ingest_refuses_a_run_still_being_run_and_one_without_raw(tmp_path: Path) -> None:
    running = make_run(tmp_path, status="running", coordinator=rundir.this_process())
    with pytest.raises(UserError, match=r"is still being run here \(process \d+\): wait"):
        reingest(running)
    other = make_run(tmp_path, "20261121-163006-unet3d-sleep-0b0b", coordinator=_dead_process())
    with pytest.raises(UserError, match="has no raw/: there is no trace to process"):
        reingest(other)


def _trace_args(data: Path, runs_root: Path) -> list[str]:
    return [
        "trace", "--workload", "unet3d", "--variant", "sleep", "--data", str(data),
        "--epochs", "1", "--max-steps", "3", "--set", "patch_size=32", "--quiet",
        "--out", str(runs_root),
    ]  # fmt: skip


@pytest.mark.integration
@pytest.mark.docker
@pytest.mark.bpftrace
def test_ingest_again_gives_the_same_rows_and_finishes_a_killed_run(
    images: object, tiny_unet3d: Path, tmp_path: Path
) -> None:
    """A completed run processed again by `ingest`: the same events, samples and phases. A run
    whose CLI is killed (SIGKILL) while it processes the trace: `runs` lists it `incomplete`,
    `show` says how to finish it, `ingest` does (status completed, every table there), and
    nothing of the run is left running."""
    require_tracing()
    runs_root = tmp_path / "runs"
    done = run_cli(*_trace_args(tiny_unet3d, runs_root))
    assert done.returncode == 0, done.stderr
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    tables = {n: pd.read_parquet(run_dir / f) for n, (f, _) in rundir.TABLES.items()}
    again = run_cli("ingest", str(run_dir))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == str(run_dir)
    for name, (file_name, _) in rundir.TABLES.items():
        pd.testing.assert_frame_equal(pd.read_parquet(run_dir / file_name), tables[name])
    manifest = rundir.load_manifest(run_dir)
    assert manifest["status"] == "completed" and manifest["processed_again_at"]

    # Killed while processing: stopped at once when it says so, then killed.
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), *_trace_args(tiny_unet3d, runs_root)],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "processing the trace" in line:
            os.kill(proc.pid, signal.SIGSTOP)
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = max(p for p in runs_root.iterdir() if p.name != run_dir.name and p.is_dir())
    manifest = rundir.load_manifest(killed)
    assert manifest["status"] == "running" and manifest["outcome"]["status"] == "completed"
    rows = json.loads(run_cli("runs", "--json", "--out", str(runs_root)).stdout)
    assert {r["run_id"]: r["status"] for r in rows}[killed.name] == "incomplete"
    shown = run_cli("show", str(killed))
    assert "incomplete" in shown.stderr and f"./cli.py ingest {killed}" in shown.stderr
    finished = run_cli("ingest", str(killed))
    assert finished.returncode == 0, finished.stderr
    assert rundir.load_manifest(killed)["status"] == "completed"
    run = rundir.load_run(killed)
    assert not run.missing and len(run.events) and len(run.phases)
    from tests.conftest import bpftrace_running

    assert bpftrace_running() == []
    import docker

    left = docker.from_env().containers.list(all=True, filters={"name": killed.name})
    assert left == []


def test_a_failed_processing_keeps_its_traceback_and_ingest_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processing of a run's trace fails (here: a planted error in the events' writer):
    the run is failed, its error names the traceback kept in raw/ and the command that tries
    again; `ingest` then processes the same raw/ into a completed run."""
    import shutil

    from tracing import ingest, processing

    run_dir = make_run(tmp_path, status="running", coordinator=_dead_process(), skip=rundir.TABLES)
    shutil.copytree(Path(__file__).parent / "data" / "raw", run_dir / "raw")
    manifest = rundir.load_manifest(run_dir)

    def broken(*args: object, **kw: object) -> None:
        raise RuntimeError("a planted fault")

    with monkeypatch.context() as m:
        m.setattr(ingest, "write_events", broken)
        status, error = processing.process(run_dir, manifest, [], "completed", None)
    assert status == "failed" and error is not None
    assert error.startswith("processing the trace failed: RuntimeError('a planted fault')")
    assert "raw/processing-error.txt" in error and f"./cli.py ingest {run_dir}" in error
    kept = (run_dir / "raw" / processing.PROCESSING_ERROR).read_text()
    assert "Traceback" in kept and "RuntimeError: a planted fault" in kept
    manifest.update(status=status, error=error, outcome={"status": "completed", "error": None})
    rundir.write_manifest(run_dir, manifest)
    outcome = reingest(run_dir)
    assert (outcome.status, outcome.error) == ("completed", None)
    assert rundir.load_run(run_dir).missing == frozenset()
