"""Plain-text views of runs: the run list and a run's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core import rundir
from core.errors import UserError
from core.units import format_size


def load_summary(run_dir: Path) -> dict[str, Any]:
    """summary.json with the manifest's final status; a run without one gets a minimal summary."""
    manifest = rundir.load_manifest(run_dir)
    summary = (
        rundir.load_summary(run_dir)
        if (run_dir / rundir.SUMMARY).exists()
        else {"schema_version": manifest["schema_version"], "run_id": run_dir.name}
    )
    summary["status"] = manifest["status"]
    summary["error"] = manifest.get("error")
    return summary


def run_summary_lines(run_dir: Path) -> list[str]:
    """A few lines saying how a run went and what it did."""
    s = load_summary(run_dir)
    lines = [f"run {s['run_id']}: {s['status']}" + (f" ({s['error']})" if s.get("error") else "")]
    if s.get("duration_s") is not None:
        lines.append(
            f"  duration {s['duration_s']:.1f} s, {s.get('steps', 0)} steps, lost events {s.get('lost_events', 0)}"
        )
    for group in ("syscalls", "block", "page_cache"):
        kinds = s.get(group) or {}
        if kinds:
            parts = [
                f"{k} {v['count']}" + (f" ({format_size(v['bytes'])})" if v["bytes"] else "")
                for k, v in sorted(kinds.items())
            ]
            lines.append(f"  {group}: " + ", ".join(parts))
    return lines


def list_runs(runs_root: Path) -> list[dict[str, Any]]:
    """One row per run directory under ``runs_root`` (newest last)."""
    rows = []
    if not runs_root.is_dir():
        return rows
    for run_dir in sorted(p for p in runs_root.iterdir() if (p / rundir.MANIFEST).exists()):
        try:
            manifest = rundir.load_manifest(run_dir)
        except UserError as exc:
            rows.append({"run_id": run_dir.name, "status": "damaged", "error": str(exc)})
            continue
        containers = manifest.get("containers") or []
        row = {
            "run_id": run_dir.name,
            "status": manifest.get("status"),
            "image": ", ".join(sorted({str(c.get("image")) for c in containers})) or None,
            "containers": len(containers),
        }
        if (run_dir / rundir.SUMMARY).exists():
            try:
                summary = rundir.load_summary(run_dir)
            except UserError as exc:
                row.update(status="damaged", error=str(exc))
                rows.append(row)
                continue
            row["duration_s"] = summary.get("duration_s")
            row["steps"] = summary.get("steps")
            row["events"] = sum(
                v["count"] for g in ("syscalls", "block") for v in (summary.get(g) or {}).values()
            )
        rows.append(row)
    return rows
