"""A run whose tracer lost events says so: status ``lossy``, the count in the manifest and the
summary, and an error that says what to do; the workload's run still counts as finished."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from store import rundir
from tracing import bpftrace, processing, runner

RAW = Path(__file__).parent / "data" / "raw"


def processed(tmp_path: Path, lost: int) -> tuple[str, str | None, dict]:
    run_dir = tmp_path / "run"
    shutil.copytree(RAW, run_dir / "raw")
    if lost:
        with (run_dir / "raw" / "syscalls.txt").open("a") as fh:
            fh.write(f"Lost {lost} events\n")
    manifest: dict = {"start_ns": 1, "end_ns": 2}
    status, error = processing.process(run_dir, manifest, [], "completed", None)
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
    status, error = processing.process(run_dir, {}, [], "failed", "container exited with code 1")
    assert (status, error) == ("failed", "container exited with code 1")


@pytest.mark.parametrize(
    ("missed", "expected"),
    [
        ({"syscalls": 0, "block": 0, "cache": 0, "proc": 0}, "completed"),
        ({"syscalls": 0, "block": 4, "cache": 0, "proc": 0}, "lossy"),
        ({"syscalls": 0, "block": 0, "cache": 1, "proc": 0}, "lossy"),
        ({"syscalls": 2, "block": 0, "cache": 0, "proc": 0}, "lossy"),
        ({"syscalls": 0, "block": 0, "cache": 0, "proc": 1}, "lossy"),
    ],
)
def test_probe_hits_the_kernel_skipped(tmp_path: Path, missed: dict, expected: str) -> None:
    """Every lane is exact (block.bt's completion, in interrupts, is a raw tracepoint, which
    the kernel does not skip for another program): a probe hit the kernel skipped in any
    script makes the run lossy."""
    run_dir = tmp_path / "run"
    shutil.copytree(RAW, run_dir / "raw")
    manifest: dict = {"start_ns": 1, "end_ns": 2, "missed_probes": missed}
    status, error = processing.process(run_dir, manifest, [], "completed", None)
    summary = rundir.load_summary(run_dir)
    assert summary["missed_probes"] == missed and summary["status"] == status == expected
    if expected == "lossy":
        assert error is not None and "skipped" in error and "lower bounds" in error


def test_a_tracer_that_fell_behind_makes_the_run_lossy(tmp_path: Path) -> None:
    """A script's "BEHIND" line (bpftrace's user space had not cleared a map its probes were
    about to write again) is counted in the manifest and the summary, and the run is lossy."""
    run_dir = tmp_path / "run"
    shutil.copytree(RAW, run_dir / "raw")
    with (run_dir / "raw" / "block.txt").open("a") as fh:
        fh.write("BEHIND 5\n")
    manifest: dict = {"start_ns": 1, "end_ns": 2}
    status, error = processing.process(run_dir, manifest, [], "completed", None)
    assert manifest["tracer_behind"] == rundir.load_summary(run_dir)["tracer_behind"] == 1
    assert status == "lossy"
    assert error is not None and "fell more than 300 ms behind" in error and "lower bounds" in error


@pytest.mark.parametrize("node", [None, "node-1"])
@pytest.mark.parametrize(("stopped_ns", "behind"), [(None, 3), (10, 2), (7, 1), (6, 0)])
def test_marks_of_the_stop_are_no_loss(
    tmp_path: Path, node: str | None, stopped_ns: int | None, behind: int
) -> None:
    """ "BEHIND" marks at or after the moment the agent interrupted the scripts
    (``tracer_stopped_ns``, on one host or a node of a cluster) are not counted: the run's
    containers had all ended. Earlier ones are; without the moment (a run traced before it
    was recorded) every one is."""
    from tracing.placement import Host

    raw = tmp_path / "run" / "raw" / (node or "")
    shutil.copytree(RAW, raw)
    with (raw / "syscalls.txt").open("a") as fh:
        fh.write("BEHIND 6\nBEHIND 12\n")
    with (raw / "cache.txt").open("a") as fh:
        fh.write("BEHIND 7\n")
    record = {"tracer_stopped_ns": stopped_ns}
    manifest: dict = {"start_ns": 1, "end_ns": 2}
    hosts = []
    if node:
        manifest["hosts"] = {node: record}
        hosts = [Host(node, None, host_dir=node, swarm=True)]  # type: ignore[arg-type]
    else:
        manifest |= record
    status, error = processing.process(tmp_path / "run", manifest, [], "completed", None, hosts)
    assert manifest["tracer_behind"] == behind
    assert (status == "lossy") == (behind > 0), error


def test_program_misses_read_from_fdinfo(tmp_path: Path) -> None:
    """``recursion_misses`` of every BPF program a process holds, summed; other descriptors
    and a process that has gone give nothing."""
    fdinfo = tmp_path / "42" / "fdinfo"
    fdinfo.mkdir(parents=True)
    prog = "pos:\t0\nflags:\t02000002\nprog_type:\t5\nprog_id:\t{}\nrecursion_misses:\t{}\n"
    (fdinfo / "3").write_text(prog.format(10, 4))
    (fdinfo / "4").write_text("pos:\t0\nflags:\t02\nmnt_id:\t17\n")  # a plain file
    (fdinfo / "5").write_text(prog.format(11, 3))
    (fdinfo / "6").write_text("map_type:\t1\nkey_size:\t8\n")  # a map
    assert bpftrace.program_misses(42, proc=tmp_path) == 7
    assert bpftrace.program_misses(43, proc=tmp_path) == 0


def test_a_run_on_one_node_of_a_cluster_has_its_events_at_the_top(tmp_path: Path) -> None:
    """`--nodes 1`: the node's agent wrote raw/<node>/; its events become the run's
    events.parquet (with no other host to merge), and every row carries the node."""
    from tracing.placement import Host

    run_dir = tmp_path / "run"
    shutil.copytree(RAW, run_dir / "raw" / "node-1")
    manifest: dict = {"start_ns": 1, "end_ns": 2, "hosts": {"node-1": {}}}
    node = Host("node-1", None, host_dir="node-1", swarm=True)  # type: ignore[arg-type]
    status, error = processing.process(run_dir, manifest, [], "completed", None, [node])
    assert (status, error) == ("completed", None)
    assert not (run_dir / "raw" / "node-1" / "events.parquet").exists()
    events = pd.read_parquet(run_dir / "events.parquet", columns=["host"])
    assert len(events) > 0 and set(events["host"]) == {"node-1"}
