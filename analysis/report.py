"""Plain-text views of runs: the run list and a run's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.tables import container_codes, is_value
from core.errors import UserError
from core.units import format_size
from store import rundir

#: The groups of event kinds of a summary, in the order summary.json has them.
SUMMARY_GROUPS: tuple[str, ...] = ("syscalls", "block", "page_cache")


def load_summary(run_dir: Path, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """summary.json with the manifest's final status (``manifest``: already read); a run
    without one gets a minimal summary."""
    manifest = manifest if manifest is not None else rundir.load_manifest(run_dir)
    summary = (
        rundir.load_summary(run_dir)
        if (run_dir / rundir.SUMMARY).exists()
        else {"schema_version": manifest["schema_version"], "run_id": run_dir.name}
    )
    summary["status"] = rundir.run_status(manifest)
    summary["error"] = manifest.get("error")
    if summary["status"] == rundir.INCOMPLETE:
        summary["error"] = (
            "the process that ran it ended before it finished: its tables may be missing or "
            f"partial; `./cli.py ingest {run_dir}` processes raw/ again"
        )
    return summary


def run_summary_lines(run_dir: Path) -> list[str]:
    """A few lines saying how a run went and what it did; for a run of several containers,
    then a line per container (:func:`container_lines`)."""
    run = rundir.load_run(run_dir)
    s = load_summary(run_dir, run.manifest)
    lines = [f"run {s['run_id']}: {s['status']}" + (f" ({s['error']})" if s.get("error") else "")]
    if s.get("duration_s") is not None:
        lines.append(
            f"  duration {s['duration_s']:.1f} s, {s.get('steps', 0)} steps, lost events {s.get('lost_events', 0)}"
        )
    missed = {k: v for k, v in (s.get("missed_probes") or {}).items() if v}
    if missed:
        lines.append(
            "  probe hits the kernel skipped (another BPF program ran on that CPU): "
            + ", ".join(f"{k} {v}" for k, v in sorted(missed.items()))
        )
    for group in SUMMARY_GROUPS:
        kinds = s.get(group) or {}
        if kinds:
            parts = [
                f"{k} {v['count']}" + (f" ({format_size(v['bytes'])})" if v["bytes"] else "")
                for k, v in sorted(kinds.items())
            ]
            lines.append(f"  {group}: " + ", ".join(parts))
    if len(run.containers) > 1 and "events" not in run.missing:
        lines += container_lines(container_counts(run.events, run.phases, run.containers))
    lines += demand_lines(run)
    return lines


def demand_lines(run: rundir.Run) -> list[str]:
    """The steps of an instrumented or sleep run: time split, AU, and the data rate delivered
    vs needed to keep the accelerators busy (:func:`analysis.breakdown.storage_demand`)."""
    from analysis.breakdown import step_table, storage_demand

    if run.variant not in ("instrumented", "sleep", "dlio") or "phases" in run.missing:
        return []
    try:
        steps = step_table(run)
        d = storage_demand(run, steps)
    except UserError:
        return []
    if not d["steps"]:
        return []
    what = "accelerator" if run.variant == "instrumented" else "emulated accelerator"

    def rate(value: float) -> str:
        return f"{format_size(value)}/s" if np.isfinite(value) else "n/a"

    lines = [
        f"  steps: {d['steps']} measured, median {d['step_s']:.3f} s = compute "
        f"{d['compute_s']:.3f} s + waiting for data {d['load_s']:.3f} s; AU {d['au']:.1%}, "
        f"{d['samples_per_s']:.1f} samples/s",
        f"  data: read at {rate(d['delivered_bytes_per_s'])}; keeping the {what} "
        f"busy needs {rate(d['needed_bytes_per_s'])}",
    ]
    from analysis.sustain import page_cache_note

    note = page_cache_note(run, d, steps)
    if note:
        lines.append(f"  page cache: {note}")
    peer = _dlio_figures(run)
    if peer is not None and peer.get("au_percent") is not None:
        ours = 100 * d["au"]
        # DLIO counts its own samples (DLRM's are whole batches): in ours
        scale = int((run.manifest.get("peer") or {}).get("samples_per_dlio_sample") or 1)
        throughput = (peer.get("throughput_samples_per_s") or float("nan")) * scale
        lines.append(
            f"  DLIO's own AU {peer['au_percent']:.1f}% (ours, from its steps: {ours:.1f}%; "
            f"difference {ours - peer['au_percent']:+.1f} points), DLIO's throughput "
            f"{throughput:.1f} samples/s"
        )
    return lines


def _dlio_figures(run: rundir.Run) -> dict[str, Any] | None:
    """DLIO's own figures of a dlio run (summary.json's ``dlio``), or None."""
    if run.variant != "dlio" or not (run.path / rundir.SUMMARY).exists():
        return None
    found = rundir.load_summary(run.path).get("dlio")
    return found if isinstance(found, dict) else None


def container_counts(events: pd.DataFrame, phases: pd.DataFrame, roles: list[str]) -> pd.DataFrame:
    """Per container and event kind: ``count`` (summed ``count`` column) and ``bytes``, in the
    columns ``container, kind, count, bytes``; ``container`` is ``roles`` order, then
    ``(no container)`` for host-wide rows (block requests of no container). A ``steps`` row
    per container counts ``step_end`` points of its lowest rank."""
    labels = np.array([*roles, "(no container)"], dtype=object)
    frame = pd.DataFrame(
        {
            "container": labels[container_codes(events, roles)],
            "kind": events["kind"].astype("category").array,  # grouped by code, not string
            "count": events["count"].to_numpy(),
            "bytes": events["bytes"].to_numpy(),
        }
    )
    table = frame.groupby(["container", "kind"], sort=False, observed=True).sum().reset_index()
    table["kind"] = table["kind"].astype(str)
    ends = phases[is_value(phases["key"], "step_end")]
    ends = ends.assign(container=labels[container_codes(ends, roles)])
    lowest = ends["rank"] == ends.groupby("container")["rank"].transform("min")
    steps = ends[lowest].groupby("container").size()
    steps = pd.DataFrame(
        {"container": steps.index, "kind": "steps", "count": steps.to_numpy(), "bytes": 0}
    )
    table = pd.concat([table, steps], ignore_index=True)
    order = {label: i for i, label in enumerate(labels)}
    return table.sort_values(
        ["container", "kind"], key=lambda c: c.map(order) if c.name == "container" else c
    ).reset_index(drop=True)


def container_lines(counts: pd.DataFrame) -> list[str]:
    """``  container rank0 · syscalls: read 10 (10.0 MiB), ...; block: ...; steps 5``: the
    counts of :func:`container_counts`, one line per container, kinds grouped as in the
    summary (process events left out)."""
    lines = []
    for container, rows in counts.groupby("container", sort=False):
        parts: dict[str, list[str]] = {}
        for kind, count, nbytes in zip(rows["kind"], rows["count"], rows["bytes"], strict=True):
            group = _summary_group(kind)
            if group is not None:
                size = f" ({format_size(nbytes)})" if nbytes else ""
                parts.setdefault(group, []).append(f"{kind} {count}{size}")
        text = [f"{group}: {', '.join(p)}" for group, p in sorted(parts.items(), key=_by_group)]
        steps = rows.loc[rows["kind"] == "steps", "count"]
        if len(steps):
            text.append(f"steps {int(steps.iloc[0])}")
        lines.append(f"  container {container} · " + "; ".join(text))
    return lines


def _summary_group(kind: str) -> str | None:
    """The summary.json group of an event kind; None for process events and steps."""
    if kind.startswith("block_"):
        return "block"
    if kind.startswith(("cache_", "shm_")):
        return "page_cache"
    if kind in (*rundir.PROCESS_KINDS, "steps"):
        return None
    return "syscalls"


def _by_group(item: tuple[str, list[str]]) -> int:
    return SUMMARY_GROUPS.index(item[0])


def list_runs(runs_root: Path) -> list[dict[str, Any]]:
    """One row per run directory under ``runs_root`` (newest last: run ids begin with their
    start time): its id, status, workload, variant, start, images and containers; from
    summary.json its duration, steps, events (syscalls and block requests), bytes read (the
    read calls') and lost events; a failed run's ``error``. A run whose manifest or summary
    cannot be read is ``damaged``, its ``error`` naming the file."""
    rows: list[dict[str, Any]] = []
    if not runs_root.is_dir():
        return rows
    for run_dir in sorted(p for p in runs_root.iterdir() if (p / rundir.MANIFEST).exists()):
        try:
            manifest = rundir.load_manifest(run_dir)
        except UserError as exc:
            bare = rundir.Run(path=run_dir, manifest={})  # workload and variant from its id
            rows.append(
                {
                    "run_id": run_dir.name,
                    "status": "damaged",
                    "workload": bare.workload,
                    "variant": bare.variant,
                    "error": str(exc),
                }
            )
            continue
        containers = manifest.get("containers") or []
        run = rundir.Run(path=run_dir, manifest=manifest)
        row = {
            "run_id": run_dir.name,
            "status": rundir.run_status(manifest),
            "workload": run.workload,
            "variant": run.variant,
            "started_at": manifest.get("started_at"),
            "image": ", ".join(sorted({str(c.get("image")) for c in containers})) or None,
            "containers": len(containers),
            "lost_events": manifest.get("lost_events"),
        }
        if manifest.get("error"):
            row["error"] = str(manifest["error"])
        if run.start_ns is not None and run.end_ns is not None:
            row["duration_s"] = (run.end_ns - run.start_ns) / 1e9
        if (run_dir / rundir.SUMMARY).exists():
            try:
                summary = rundir.load_summary(run_dir)
            except UserError as exc:
                row.update(status="damaged", error=str(exc))
                rows.append(row)
                continue
            syscalls = summary.get("syscalls") or {}
            row["duration_s"] = summary.get("duration_s")
            row["steps"] = summary.get("steps")
            row["events"] = sum(
                v["count"] for g in ("syscalls", "block") for v in (summary.get(g) or {}).values()
            )
            row["bytes_read"] = sum(
                int(v.get("bytes") or 0) for k, v in syscalls.items() if k in rundir.READ_KINDS
            )
            row["lost_events"] = summary.get("lost_events", row["lost_events"])
        rows.append(row)
    return rows
