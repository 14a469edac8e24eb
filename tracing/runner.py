"""Trace one container run from start to a finished run directory.

Order of operations (docs/run-format.md describes the result):
1. check prerequisites, create the run directory, write the manifest (status ``running``);
2. start the container held at its barrier, find its cgroup;
3. start the samplers and bpftrace, wait until every probe is attached;
4. release the workload and wait for it to exit (or for Ctrl-C, or a tracer failure);
5. on every exit path: stop the container, bpftrace and the samplers;
6. turn the raw output into tables and a summary, finalise the manifest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from core.errors import UserError
from core.rundir import PHASES_COLUMNS, SAMPLES_COLUMNS, arrow_schema
from tracing import bpftrace, container, host, ingest
from tracing.cgroups import cgroups_of
from tracing.rundir import (
    atomic_write_json,
    atomic_write_parquet,
    host_metadata,
    initial_manifest,
    new_run_dir,
    utc_now,
)
from tracing.samplers import Sampler
from workloads.config import WorkloadConfig

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """Everything a traced run needs. ``config`` is None when tracing an arbitrary image."""

    image: str
    command: list[str] | None
    label: str
    runs_root: Path
    config: WorkloadConfig | None = None
    data_dir: Path | None = None
    mounts: tuple[container.BindMount, ...] = ()
    memory_limit: str | None = None
    cpus: float | None = None
    sample_interval: float = 0.1
    timeout_s: float | None = None
    environment: dict[str, str] = dataclasses.field(default_factory=dict)
    # False runs the same container without bpftrace and samplers: the baseline for overhead.
    tracing: bool = True


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so that `kill` also leaves a consistent run directory."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def trace(request: TraceRequest, progress: Progress = lambda msg: None) -> Path:
    """Run ``request`` under tracing; return the run directory (whatever the outcome).

    Raises UserError for problems found before the run directory exists. Failures during the
    run are recorded in the manifest (status ``failed``/``interrupted``) and re-raised as
    UserError/KeyboardInterrupt after the directory is finalised.
    """
    if request.tracing:
        host.require_tracing_prerequisites()
    cli = container.client()
    for orphan in container.remove_orphans(cli):
        progress(f"removed the container of run {orphan}, left behind by a killed tracer")
    image_id = container.image_id(cli, request.image)
    command = request.command or container.default_command(cli, request.image)

    run_dir = new_run_dir(
        request.runs_root, request.label, request.config.variant if request.config else None
    )
    raw, ctl, out = run_dir / "raw", run_dir / "ctl", run_dir / "out"
    mounts = list(request.mounts)
    if request.data_dir is not None:
        mounts.append(container.BindMount(request.data_dir.resolve(), container.DATA_MOUNT, True))
    mounts.append(container.BindMount(out.resolve(), container.OUT_MOUNT, False))
    if request.config is not None:
        request.config.save(ctl / "config.json")
    manifest = initial_manifest(
        run_dir,
        image={"tag": request.image, "id": image_id},
        command=command,
        config=request.config.to_dict() if request.config else None,
        trace={
            "sample_interval_s": request.sample_interval,
            "memory_limit": request.memory_limit,
            "cpus": request.cpus,
            "mounts": [
                {"source": str(m.source), "target": m.target, "read_only": m.read_only}
                for m in mounts
            ],
            "enabled": request.tracing,
            "bpftrace_scripts": list(bpftrace.SCRIPTS) if request.tracing else [],
        },
        host=host_metadata(cli.version().get("Version")),
        container_id=None,
        cgroup_id=None,
    )
    atomic_write_json(run_dir / "manifest.json", manifest)
    progress(f"run directory {run_dir}")

    status, error, pending = "failed", None, None
    ctr = tracer = sampler = None
    try:
        with _sigterm_as_interrupt():
            try:
                ctr = container.start_held(
                    cli,
                    request.image,
                    command,
                    ctl,
                    mounts,
                    run_dir.name,
                    request.memory_limit,
                    request.cpus,
                    request.environment,
                )
                manifest["container_id"] = ctr.id
                cgroups = cgroups_of(container.main_pid(ctr))
                manifest["cgroup_id"] = cgroups.v2_id
                if request.tracing:
                    sampler = Sampler(raw / "samples.csv", cgroups, request.sample_interval)
                    sampler.start()
                    progress("attaching bpftrace probes")
                    tracer = bpftrace.Tracer(raw, ctl, cgroups.v2_id)
                    tracer.start()
                container.release(ctl)
                manifest["start_ns"] = time.monotonic_ns()
                atomic_write_json(
                    run_dir / "manifest.json", manifest
                )  # still "running", now with ids
                progress(f"workload released ({request.image})")
                code = _wait(ctr, tracer, request.timeout_s)
                manifest["end_ns"] = time.monotonic_ns()
                manifest["exit_code"] = code
                if code == 0:
                    status = "completed"
                else:
                    status = "failed"
                    error = f"the workload exited with code {code}{_log_tail(ctr)}"
            except KeyboardInterrupt as exc:
                status, error, pending = "interrupted", "interrupted by the user", exc
            except UserError as exc:
                status, error, pending = "failed", str(exc), exc
            except BaseException as exc:  # a bug: record it, finish the directory, re-raise
                status, error, pending = "failed", f"internal error: {exc!r}", exc
            finally:
                _shutdown(cli, ctr, tracer, sampler, run_dir, manifest)
            progress("processing the trace")
            status, error = _process(run_dir, manifest, status, error)
    except KeyboardInterrupt as exc:  # a second Ctrl-C while shutting down or processing
        status, error, pending = "interrupted", "interrupted by the user", exc
    finally:
        manifest.update(status=status, error=error, ended_at=utc_now())
        atomic_write_json(run_dir / "manifest.json", manifest)
    if pending is not None:
        if isinstance(pending, UserError):
            raise UserError(f"{pending} (run directory: {run_dir})") from None
        raise pending
    if status == "failed":
        raise UserError(f"{error} (run directory: {run_dir})")
    return run_dir


def _wait(ctr: Any, tracer: bpftrace.Tracer | None, timeout_s: float | None) -> int:
    deadline = time.monotonic() + timeout_s if timeout_s else None
    while True:
        code = container.exit_code(ctr)
        if code is not None:
            return code
        failure = tracer.failed() if tracer is not None else None
        if failure:
            raise UserError(failure)
        if deadline and time.monotonic() > deadline:
            raise UserError(f"the workload did not finish within {timeout_s:.0f} s (--timeout)")
        time.sleep(0.1)


def _log_tail(ctr: Any, lines: int = 8) -> str:
    try:
        text = ctr.logs(tail=lines).decode(errors="replace").strip()
    except Exception:
        return ""
    return f"; its output ends with:\n{text}" if text else ""


def _shutdown(cli: Any, ctr: Any, tracer: Any, sampler: Any, run_dir: Path, manifest: dict) -> None:
    """Stop everything the run started. Each step runs even if an earlier one failed."""
    steps = []
    if ctr is not None:
        steps.append(lambda: container.stop_and_remove(ctr, run_dir / "raw" / "container.log"))
    # A short pause lets block completions of the last requests reach the tracer.
    if tracer is not None:
        steps.append(lambda: (time.sleep(0.2), tracer.stop()))
    if sampler is not None:
        steps.append(sampler.stop)
    steps.append(lambda: container.remove_run_containers(cli, run_dir.name))
    first_error = None
    for step in steps:
        try:
            step()
        except BaseException as exc:
            first_error = first_error or exc
    mllog = run_dir / "out" / "mllog.log"
    if mllog.exists():
        shutil.move(mllog, run_dir / "raw" / "mllog.log")
    if tracer is not None:
        manifest["bpftrace_exit_codes"] = {n: c.returncode for n, c in tracer.children.items()}
    if first_error is not None:
        raise first_error


def _process(
    run_dir: Path, manifest: dict, status: str, error: str | None
) -> tuple[str, str | None]:
    """Write events/samples/phases parquet and summary.json from raw/. Returns (status, error)."""
    raw = run_dir / "raw"
    try:
        events, stats = ingest.build_events(raw)
        samples = ingest.build_samples(raw)
        phases = ingest.build_phases(raw)
        atomic_write_parquet(run_dir / "events.parquet", events)
        for name, frame, columns in (
            ("samples", samples, SAMPLES_COLUMNS),
            ("phases", phases, PHASES_COLUMNS),
        ):
            table = pa.Table.from_pandas(
                frame[list(columns)], schema=arrow_schema(columns), preserve_index=False
            )
            atomic_write_parquet(run_dir / f"{name}.parquet", table)
        manifest["lost_events"] = stats.lost_events
        start, end = manifest.get("start_ns"), manifest.get("end_ns")
        summary = {
            "schema_version": manifest["schema_version"],
            "run_id": run_dir.name,
            "status": status,
            "duration_s": (end - start) / 1e9 if start and end else None,
            **ingest.summarize(events, phases, stats),
        }
        atomic_write_json(run_dir / "summary.json", summary)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # keep raw/ and say why the tables are missing
        if status == "completed":
            status, error = "failed", f"processing the trace failed: {exc!r}"
        else:
            error = f"{error}; processing the trace also failed: {exc!r}"
    return status, error
