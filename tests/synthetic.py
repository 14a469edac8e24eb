"""Synthetic run directories exactly as docs/run-format.md describes them (a manifest.json and
three Parquet files with the documented columns and types), for the analysis tests.

Rows belong to the container ``main`` unless they say otherwise (``"container": "rank1"`` in a
row, a fifth element of a sample tuple, or :func:`in_containers`); host-wide samples
(``host_*``, ``gpu*``) to none. ``make_run(..., containers=("rank0", "rank1"))`` lists several
containers in the manifest: a run of two containers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.rundir import (
    EVENTS_COLUMNS,
    PHASES_COLUMNS,
    SAMPLES_COLUMNS,
    SCHEMA_VERSION,
    arrow_schema,
    empty_frame,
)

START_NS = 5_000_000_000_000  # boot-relative, like CLOCK_MONOTONIC on a host up ~83 minutes
SEC = 1_000_000_000
MIB = 2**20

EVENT_DEFAULTS: dict[str, Any] = {
    "kind": "read",
    "pid": 100,
    "tid": None,  # same as pid
    "comm": "python",
    "fd": 3,
    "path": None,
    "bytes": 0,
    "count": 1,
    "ret": 0,
    "offset": -1,
    "latency_ns": 1000,
    "dev": None,
    "in_container": True,
    "container": "main",
}

#: Sample metrics that are host-wide (null ``container``) rather than a container's.
HOST_METRIC_PREFIXES = ("host_", "gpu")


# ---------------------------------------------------------------------------------------------
# Helpers


def events_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Events with documented defaults; ``t`` is seconds after START_NS (or give ``ts_ns``)."""
    records = []
    for row in rows:
        record = {**EVENT_DEFAULTS, **row}
        if "t" in record:
            record["ts_ns"] = START_NS + round(record.pop("t") * SEC)
        if record["tid"] is None:
            record["tid"] = record["pid"]
        if record["kind"] in ("read", "write", "pread64", "pwrite64", "readv", "writev"):
            record.setdefault("ret", record["bytes"])
        records.append(record)
    frame = pd.DataFrame(records, columns=list(EVENTS_COLUMNS))
    return frame.sort_values("ts_ns", kind="stable").astype(dict(EVENTS_COLUMNS))


def samples_frame(rows: Iterable[tuple[Any, ...]]) -> pd.DataFrame:
    """Samples from (seconds after START_NS, metric, value, unit[, container]); without a
    container, ``main``, or none for host-wide metrics (:data:`HOST_METRIC_PREFIXES`)."""
    records = []
    for t, metric, value, unit, *container in rows:
        default = None if metric.startswith(HOST_METRIC_PREFIXES) else "main"
        role = container[0] if container else default
        records.append((START_NS + round(t * SEC), metric, value, unit, role))
    frame = pd.DataFrame(records, columns=list(SAMPLES_COLUMNS))
    return frame.astype(dict(SAMPLES_COLUMNS))


def phases_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Phases from dicts with ``key``, ``t0``, ``t1`` (seconds), optional kind/rank/epoch/step."""
    records = []
    for row in rows:
        t0 = START_NS + round(row["t0"] * SEC)
        t1 = START_NS + round(row.get("t1", row["t0"]) * SEC)
        records.append(
            {
                "ts_ns": t0,
                "end_ns": t1,
                "duration_ns": t1 - t0,
                "key": row["key"],
                "kind": row.get("kind", "interval" if t1 > t0 else "point"),
                "rank": row.get("rank", -1),
                "pid": row.get("pid", 7),
                "epoch": row.get("epoch", -1),
                "step": row.get("step", -1),
                "value": json.dumps(row.get("value")),
                "container": row.get("container", "main"),
            }
        )
    return pd.DataFrame(records, columns=list(PHASES_COLUMNS)).astype(dict(PHASES_COLUMNS))


def in_containers(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One table from per-container tables (role -> frame): each row tagged with its role,
    sorted by time as the run format requires."""
    parts = [frame.assign(container=role) for role, frame in frames.items()]
    merged = pd.concat(parts, ignore_index=True).sort_values("ts_ns", kind="stable")
    return merged.reset_index(drop=True).astype({"container": "string"})


def container_entry(role: str, workload: str, index: int = 0) -> dict[str, Any]:
    """One entry of the manifest's ``containers`` list."""
    return {
        "role": role,
        "image": f"twintrace/{workload}:latest",
        "command": ["python", "-m", f"workloads.{workload}"],
        "container_id": f"{index:x}" * 64,
        "cgroup_id": 1234 + index,
        "main_pid": 100 + 1000 * index,
        "exit_code": 0,
    }


def manifest(run_id: str, containers: Sequence[str] = ("main",), **changes: Any) -> dict[str, Any]:
    """A complete manifest of the current schema (docs/run-format.md), 10 s long, listing a
    container per role of ``containers``."""
    workload, variant = run_id.split("-")[2:4]
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "twintrace_version": "0.1.0",
        "run_id": run_id,
        "status": "completed",
        "error": None,
        "git_revision": "0" * 40,
        "image": {"tag": f"twintrace/{workload}:latest", "id": "sha256:" + "1" * 64},
        "command": ["python", "-m", f"workloads.{workload}"],
        "config": {"workload": workload, "variant": variant, "epochs": 1, "batch_size": 2},
        "trace": {"sample_interval_s": 1.0, "memory_limit": None, "cpus": None, "mounts": []},
        "host": {"hostname": "test", "kernel": "6.8.0", "cpus": 2},
        "started_at": "2026-11-21T16:30:05Z",
        "ended_at": "2026-11-21T16:30:15Z",
        "start_ns": START_NS,
        "end_ns": START_NS + 10 * SEC,
        "exit_code": 0,
        "lost_events": 0,
        "containers": [container_entry(r, workload, i) for i, r in enumerate(containers)],
    }
    data.update(changes)
    return data


def make_run(
    root: Path,
    run_id: str = "20261121-163005-unet3d-sleep-3f2a",
    events: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    phases: pd.DataFrame | None = None,
    skip: Iterable[str] = (),
    containers: Sequence[str] = ("main",),
    **manifest_changes: Any,
) -> Path:
    """Write a run directory under ``root``; tables not given are written empty unless skipped.

    ``containers``: the roles the manifest lists (the rows say which is theirs)."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    data = manifest(run_id, containers, **manifest_changes)
    (run_dir / "manifest.json").write_text(json.dumps(data))
    tables = {
        "events": (events, EVENTS_COLUMNS),
        "samples": (samples, SAMPLES_COLUMNS),
        "phases": (phases, PHASES_COLUMNS),
    }
    for name, (frame, columns) in tables.items():
        if name in skip:
            continue
        frame = empty_frame(columns) if frame is None else frame
        table = pa.Table.from_pandas(frame, schema=arrow_schema(columns), preserve_index=False)
        pq.write_table(table, run_dir / f"{name}.parquet")
    return run_dir
