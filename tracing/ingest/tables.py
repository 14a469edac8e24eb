"""The samples and phases tables, and the run's summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from store.rundir import (
    PHASES_COLUMNS,
    PROCESS_KINDS,
    SAMPLES_COLUMNS,
    conform,
    empty_frame,
)
from tracing.ingest.stats import EventTotals, ParseStats


def build_samples(raw_dir: Path, host: str | None = None, shift_ns: int = 0) -> pd.DataFrame:
    """Read raw/samples.csv (long format) written by tracing.samplers. ``container`` is the
    role of a container's metric, null for host-wide metrics; ``host`` the host column;
    ``shift_ns`` is added to every time (as :func:`write_events`)."""
    path = raw_dir / "samples.csv"
    columns = SAMPLES_COLUMNS
    if not path.exists() or path.stat().st_size == 0:
        return empty_frame(columns)
    # The sampler may have been stopped mid-line: on_bad_lines drops a cut-off last line.
    df = pd.read_csv(
        path,
        dtype={"ts_ns": "Int64", "metric": "string", "unit": "string", "container": "string"},
        keep_default_na=False,
        na_values={"ts_ns": [""], "value": [""]},
        on_bad_lines="skip",
    )
    if "container" not in df.columns:
        df["container"] = pd.Series(pd.NA, index=df.index, dtype="string")
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    df = df.dropna(subset=["ts_ns", "metric", "value", "unit"])
    df["container"] = df["container"].where(df["container"] != "", pd.NA)
    df["host"] = pd.Series(host, index=df.index, dtype="string")
    if shift_ns:
        df["ts_ns"] = df["ts_ns"] + shift_ns
    return df.astype(columns)


def build_phases(
    raw_dir: Path,
    roles: Sequence[str] = (),
    realtime_offset_ns: int | None = None,
    peer: Mapping[str, Any] | None = None,
    host: str | None = None,
    placement: Mapping[str, tuple[str, int]] | None = None,
) -> pd.DataFrame:
    """Parse each container's MLLOG events (``raw/<role>/mllog.log``), or ``raw/mllog.log``
    when no roles are given, into one phases table with the ``container`` column and the
    ``host`` column (``host``, or a role's host from ``placement``: role -> (host, ns added to
    its times, as :func:`write_events`)). A container
    that ran DLIO has its outputs in ``raw/<role>/dlio/`` instead (:mod:`tracing.dlio`: its
    wall-clock times placed with ``realtime_offset_ns``, CLOCK_REALTIME - CLOCK_MONOTONIC;
    ``peer``: the manifest's record of the DLIO run)."""
    from tracing.dlio import parse_dlio
    from tracing.mllog import parse_mllog

    sources = [(raw_dir / role / "mllog.log", role) for role in roles] or [
        (raw_dir / "mllog.log", None)
    ]
    frames = []
    for path, role in sources:
        outputs = path.parent / "dlio"
        if not path.exists() and realtime_offset_ns is not None and outputs.is_dir():
            scale = int((peer or {}).get("samples_per_dlio_sample") or 1)
            frame = parse_dlio(outputs, realtime_offset_ns, scale)
            path = outputs / "dlio.log"
        else:
            frame = parse_mllog(path)
        frame["container"] = pd.Series(role, index=frame.index, dtype="string")
        where, shift = (placement or {}).get(role or "", (host, 0))
        frame["host"] = pd.Series(where, index=frame.index, dtype="string")
        if shift:
            frame[["ts_ns", "end_ns"]] += shift
        frames.append(conform(frame, PHASES_COLUMNS, str(path.relative_to(raw_dir.parent))))
    phases = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return phases.sort_values("ts_ns", kind="stable", ignore_index=True)


def summarize(events: EventTotals | pa.Table, phases: pd.DataFrame, stats: ParseStats) -> dict:
    """Counts and bytes per kind, grouped as in summary.json (docs/run-format.md); with
    several containers also per container (``containers``). ``events``: the totals
    :func:`write_events` returns (or an events table)."""
    totals = events if isinstance(events, EventTotals) else EventTotals.of_table(events)
    result = {
        "steps": _steps(phases),
        "lost_events": stats.lost_events,
        "tracer_behind": stats.behind,
        "skipped_lines": stats.skipped_lines,
        **_kind_groups(totals.per_kind()),
    }
    roles = sorted(totals.containers | set(phases["container"].dropna()))
    if len(roles) > 1:
        result["containers"] = {
            role: {
                "steps": _steps(phases[(phases["container"] == role).fillna(False).to_numpy()]),
                **_kind_groups(totals.per_kind(role)),
            }
            for role in roles
        }
    return result


def _steps(phases: pd.DataFrame) -> int:
    """Training steps: ``step_end`` events of rank 0 (or of a run without ranks)."""
    if not len(phases):
        return 0
    return int(((phases["key"] == "step_end") & phases["rank"].isin([0, -1])).sum())


def _kind_groups(per_kind: Mapping[str, tuple[int, int]]) -> dict[str, dict]:
    groups: dict[str, dict] = {"syscalls": {}, "block": {}, "page_cache": {}, "processes": {}}
    for kind in sorted(per_kind):
        count, nbytes = per_kind[kind]
        entry = {"count": int(count), "bytes": int(nbytes)}
        if kind.startswith("block_"):
            groups["block"][kind] = entry
        elif kind.startswith(("cache_", "shm_")):
            groups["page_cache"][kind] = entry
        elif kind in PROCESS_KINDS:
            groups["processes"][kind] = int(count)
        else:
            groups["syscalls"][kind] = entry
    return groups
