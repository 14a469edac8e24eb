"""A run whose tracer lost events says so: status ``lossy``, the count in the manifest and the
summary, and an error that says what to do; the workload's run still counts as finished."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core import rundir
from tracing import runner

RAW = Path(__file__).parent / "data" / "raw"


def processed(tmp_path: Path, lost: int) -> tuple[str, str | None, dict]:
    run_dir = tmp_path / "run"
    shutil.copytree(RAW, run_dir / "raw")
    if lost:
        with (run_dir / "raw" / "syscalls.txt").open("a") as fh:
            fh.write(f"Lost {lost} events\n")
    manifest: dict = {"start_ns": 1, "end_ns": 2}
    status, error = runner._process(run_dir, manifest, [], "completed", None)
    return status, error, manifest | {"summary": rundir.load_summary(run_dir)}


@pytest.mark.parametrize("lost", [0, 17])
def test_lost_events_make_the_run_lossy(tmp_path: Path, lost: int) -> None:
    status, error, manifest = processed(tmp_path, lost)
    assert manifest["lost_events"] == manifest["summary"]["lost_events"] == lost
    assert manifest["summary"]["status"] == status
    if lost:
        assert status == "lossy"
        assert error is not None and "lost 17 events" in error and "lower bounds" in error
    else:
        assert (status, error) == ("completed", None)
    outcome = runner.RunOutcome(tmp_path / "run", status, error)
    assert outcome.ok and outcome.check() == tmp_path / "run"


def test_a_failed_run_stays_failed_whatever_it_lost(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(RAW, run_dir / "raw")
    with (run_dir / "raw" / "syscalls.txt").open("a") as fh:
        fh.write("Lost 3 events\n")
    status, error = runner._process(run_dir, {}, [], "failed", "container exited with code 1")
    assert (status, error) == ("failed", "container exited with code 1")
