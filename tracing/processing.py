"""A traced run's raw trace made into its tables: ``events.parquet`` (every host's part, each
on the coordinator's clock, merged), ``samples.parquet``, ``phases.parquet`` and
``summary.json`` (:func:`process`), what the samples and the trace add to a failed run's error,
and the message of a run that lost events. Called by :mod:`tracing.runner` when a run ends and
by ``./cli.py ingest`` (:func:`tracing.runner.reingest`) to do it again."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from core.atomic import atomic_write_text
from core.errors import no_room
from core.units import format_size
from store import rundir
from tracing import dlio, ingest
from tracing.placement import Host


@dataclasses.dataclass(frozen=True)
class Placed:
    """A container of the run as the processing of its trace needs it: its role, the host it
    ran on and its first process (0: not known)."""

    role: str
    host: Host
    main_pid: int


def process(
    run_dir: Path,
    manifest: dict,
    placed: Sequence[Placed],
    status: str,
    error: str | None,
    hosts: Sequence[Host] = (),
    progress: Callable[[str], None] = lambda msg: None,
) -> tuple[str, str | None]:
    """Write events/samples/phases parquet and summary.json from raw/ (each host's part of it,
    its times brought onto the coordinator's clock; no ``hosts``: raw/ is this host's).
    ``progress`` hears how far the events
    are, every :data:`PROGRESS_EVERY_S` (a big trace only: a small one is done before).
    Returns (status, error); an error of the processing itself is kept whole, its traceback in
    ``raw/processing-error.txt``, so that ``./cli.py ingest RUN`` can be tried again."""
    raw = run_dir / "raw"
    roles = [p.role for p in placed]
    if not hosts:
        hosts = [Host((manifest.get("host") or {}).get("hostname"), None)]
    try:
        events, stats = ingest.EventTotals(), ingest.ParseStats()
        parts = []
        for h in hosts:
            part = raw / h.host_dir / "events.parquet" if h.host_dir else run_dir / "events.parquet"
            roots = {p.main_pid: p.role for p in placed if p.host is h and p.main_pid}
            where = f" of {h.name}" if len(hosts) > 1 else ""
            totals, parsed = ingest.write_events(
                raw / h.host_dir,
                part,
                roots,
                host=h.name,
                shift_ns=h.shift_ns,
                progress=_every(
                    PROGRESS_EVERY_S,
                    lambda rows, where=where: progress(
                        f"processing the trace{where}: {rows / 1e6:.1f} M events so far"
                    ),
                ),
            )
            record = manifest["hosts"][h.name] if h.host_dir else manifest
            stopped_ns = record.get("tracer_stopped_ns")
            if parsed.behind and stopped_ns is not None:  # marks of the stop are no loss
                parsed.behind = ingest.behind_before(raw / h.host_dir, stopped_ns)
            events.merge(totals)
            stats.merge(parsed)
            parts.append(part)
        if len(hosts) > 1:
            ingest.merge_events(parts, run_dir / "events.parquet")
            for part in parts:
                part.unlink()
            _release_skew(run_dir / "events.parquet", manifest)
        elif parts[0] != run_dir / "events.parquet":  # one node of a cluster: its part is all
            parts[0].replace(run_dir / "events.parquet")
        samples = pd.concat(
            [ingest.build_samples(raw / h.host_dir, h.name, h.shift_ns) for h in hosts],
            ignore_index=True,
        ).sort_values("ts_ns", kind="stable", ignore_index=True)
        phases = ingest.build_phases(
            raw,
            roles,
            manifest.get("realtime_offset_ns"),
            manifest.get("peer"),
            host=hosts[0].name if len(hosts) == 1 else None,
            placement={p.role: (p.host.name, p.host.shift_ns) for p in placed},
        )
        rundir.write_table(run_dir / "samples.parquet", samples, rundir.SAMPLES_COLUMNS)
        rundir.write_table(run_dir / "phases.parquet", phases, rundir.PHASES_COLUMNS)
        if status == "failed":  # what the samples and the trace add to why
            said = [pids_refused(samples, manifest)]
            if manifest.get("cluster"):
                said.append(traced_memory_kills(run_dir / "events.parquet", manifest))
            error = "; ".join(filter(None, [error, *said])) or None
        manifest["lost_events"] = stats.lost_events
        manifest["tracer_behind"] = stats.behind
        missed = manifest.get("missed_probes") or {}
        # Every lane is exact, so a probe hit the kernel skipped in any script makes the run
        # lossy. The one hook that fires in interrupts, block.bt's completion, is a raw
        # tracepoint, which the kernel skips only while the same program runs on that CPU
        # (docs/run-format.md, "What can be lost"; bench/block_exact.py).
        skipped = sum(missed.values())
        if status == "completed" and (stats.lost_events or skipped or stats.behind):
            status, error = "lossy", lost_message(stats.lost_events, skipped, stats.behind)
        start, end = manifest.get("start_ns"), manifest.get("end_ns")
        rundir.write_json(
            run_dir / rundir.SUMMARY,
            {
                "run_id": run_dir.name,
                "status": status,
                "duration_s": (end - start) / 1e9 if start and end else None,
                **ingest.summarize(events, phases, stats),
                "missed_probes": missed,
                **_peer_summary(raw, roles),
            },
        )
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # keep raw/ and say why the tables are missing
        rundir.give_back_room(run_dir)  # room for the traceback and the manifest
        kept = raw / PROCESSING_ERROR
        with contextlib.suppress(OSError):
            atomic_write_text(kept, traceback.format_exc())
        full = no_room(exc)
        what = (
            f"the file system of {run_dir.parent} filled while writing the tables ({exc})"
            if full
            else repr(exc)
        )
        why = (
            f"{what} (its traceback: raw/{PROCESSING_ERROR}; raw/ is whole: "
            f"`./cli.py ingest {run_dir}` tries again{', once there is room' if full else ''})"
        )
        if status == "completed":
            status, error = "failed", f"processing the trace failed: {why}"
        else:
            error = f"{error}; processing the trace also failed: {why}"
    return status, error


#: Where a failed processing of the trace keeps its traceback, in raw/.
PROCESSING_ERROR = "processing-error.txt"


def traced_memory_kills(events: Path, manifest: dict) -> str:
    """What to add to a failed run's error across nodes for each container a process of which
    the kernel chose to kill for memory: the trace's ``oom_kill`` rows (proc.bt), since a
    swarm's task does not say why it ended. "" when there were none."""
    table = pq.read_table(events, columns=["container"], filters=[("kind", "==", "oom_kill")])
    roles = table.column("container").to_pandas().astype(str)
    limits = {c.get("role"): c.get("memory_limit_bytes") for c in manifest.get("containers") or []}
    return "; ".join(
        f"the kernel killed {n} process{'es' if n > 1 else ''} of container {role} for memory "
        f"(traced){at_limit(limits.get(role))}"
        for role, n in roles.value_counts().sort_index().items()
    )


def pids_refused(samples: pd.DataFrame, manifest: dict) -> str:
    """What to add to a failed run's error for each container the kernel refused a process or
    thread at its limit (``--pids-limit``: the sampled ``container_pids_refused``); "" when
    none was. A container that ends within one sample interval of its first refusal may show
    none: its output's last lines then say what failed."""
    rows = samples[samples["metric"] == "container_pids_refused"]
    counts = rows.groupby("container", observed=True)["value"].max()
    limits = {c.get("role"): c.get("pids_limit") for c in manifest.get("containers") or []}
    said = [
        f"container {role} reached its limit of {limits.get(role) or '?'} processes and threads "
        f"(fork or clone refused {int(n)} time{'s' if n != 1 else ''}: --pids-limit: give it "
        "more)"
        for role, n in counts.items()
        if n > 0
    ]
    return "; ".join(said)


def _release_skew(events: Path, manifest: dict) -> None:
    """The joint release's skew: the spread of the hosts' first exec events (each host's
    containers run their command as they are released), on the coordinator's clock."""
    execs = pq.read_table(
        events,
        columns=["ts_ns", "container", "host"],
        filters=[("kind", "=", "exec")],  # decoded, but no other row reaches pandas
    ).to_pandas()
    execs = execs[execs["container"].notna()]
    first = execs.groupby("host", observed=True)["ts_ns"].min()
    for name, ts in first.items():
        manifest["hosts"][str(name)]["first_exec_ns"] = int(ts)
    if len(first) == len(manifest["hosts"]):
        manifest["release_skew_ns"] = int(first.max() - first.min())


def lost_message(lost: int, missed: int = 0, behind: int = 0) -> str:
    """The error of a ``lossy`` run: what was lost and what to do."""
    what = []
    if lost:
        what.append(
            f"the tracer lost {lost} events (bpftrace's output buffer overflowed, or a kernel "
            "map was full)"
        )
    if missed:
        what.append(f"the kernel skipped {missed} probe hits")
    if behind:
        what.append(
            f"bpftrace fell more than 300 ms behind its probes {behind} times (events of those "
            "moments may be missing)"
        )
    return (
        "; ".join(what) + ": this run's counts and bytes are lower bounds; trace fewer "
        "containers at once, or give the host more CPU while tracing"
    )


def _peer_summary(raw: Path, roles: list[str]) -> dict:
    """A DLIO run's own figures (AU, throughput) from its summary.json: ``{"dlio": {...}}``,
    empty for other runs."""
    for role in roles:
        found = dlio.dlio_summary(raw / role / "dlio")
        if found is not None:
            return {"dlio": found}
    return {}


#: Seconds between two progress lines of long work (the trace's processing).
PROGRESS_EVERY_S = 5.0


def _every(seconds: float, report: Callable[[int], None]) -> Callable[[int], None]:
    """``report``, called at most once every ``seconds`` (the first time after ``seconds``)."""
    due = [time.monotonic() + seconds]

    def call(value: int) -> None:
        now = time.monotonic()
        if now >= due[0]:
            due[0] = now + seconds
            report(value)

    return call


def at_limit(limit: int | None) -> str:
    if limit is None:
        return " (the host ran out; no limit set)"
    return f", at its limit of {format_size(limit)} (--memory-limit: give it more)"
