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

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from store.rundir import (
    EVENTS_COLUMNS,
    PHASES_COLUMNS,
    SAMPLES_COLUMNS,
    SCHEMA_VERSION,
    arrow_schema,
    empty_frame,
)
from tracing.aggregates import BIN_NS, KIND_CODES, LINES_PER_BIN

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
    "latency_max_ns": None,  # same as latency_ns
    "dev": None,
    "in_container": True,
    "container": "main",
    "host": "test",
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
        if record["latency_max_ns"] is None:
            record["latency_max_ns"] = record["latency_ns"]
        if record["kind"] in ("read", "write", "pread64", "pwrite64", "readv", "writev"):
            record.setdefault("ret", record["bytes"])
        records.append(record)
    frame = pd.DataFrame(records, columns=list(EVENTS_COLUMNS))
    return frame.sort_values("ts_ns", kind="stable").astype(dict(EVENTS_COLUMNS))


def fold_calls(calls: pd.DataFrame) -> pd.DataFrame:
    """``calls`` (one row per call) as the tracer records them once a thread's rate is high
    (tracing/bpf/syscalls.bt): the first :data:`LINES_PER_BIN` reads and writes of each thread
    in each :data:`BIN_NS` bin (by exit time) and every failed one stay rows of their own; the
    rest are folded into aggregated rows, one per (pid, tid, fd, path, kind, bin, power-of-two
    size bucket, power-of-two latency bucket): ``count`` calls, their total ``bytes`` (also
    ``ret``), summed ``latency_ns``, longest ``latency_max_ns``, the last call's ``ts_ns`` and
    ``comm``, ``offset`` -1. Other rows are kept as they are."""
    calls = calls.sort_values("ts_ns", kind="stable").reset_index(drop=True)
    bin_ = calls["ts_ns"] // BIN_NS
    rw = calls["kind"].isin(KIND_CODES).to_numpy()
    rank = calls[rw].groupby([calls["tid"][rw], bin_[rw]]).cumcount()
    folded = np.zeros(len(calls), dtype=bool)
    folded[np.flatnonzero(rw)] = (rank >= LINES_PER_BIN).to_numpy()
    folded &= calls["ret"].to_numpy() >= 0
    rows = calls[folded]

    def bucket(values: pd.Series) -> np.ndarray:
        return np.frexp(np.maximum(values.to_numpy(dtype=np.float64), 1.0))[1] - 1

    keys = [rows[c] for c in ("pid", "tid", "fd", "path", "kind", "container")]
    keys += [bin_[folded], pd.Series(bucket(rows["bytes"]), index=rows.index)]
    keys += [pd.Series(bucket(rows["latency_ns"]), index=rows.index)]
    grouped = rows.groupby(keys, dropna=False, sort=False, observed=True)
    aggregated = grouped.agg(
        ts_ns=("ts_ns", "max"),
        comm=("comm", "last"),
        bytes=("bytes", "sum"),
        count=("count", "sum"),
        latency_ns=("latency_ns", "sum"),
        latency_max_ns=("latency_max_ns", "max"),
        in_container=("in_container", "first"),
        host=("host", "first"),
    ).reset_index(level=[0, 1, 2, 3, 4, 5])
    aggregated = aggregated.reset_index(drop=True).assign(
        ret=lambda f: f["bytes"], offset=-1, dev=None
    )
    merged = pd.concat([calls[~folded], aggregated[list(EVENTS_COLUMNS)]], ignore_index=True)
    merged = merged.sort_values("ts_ns", kind="stable").reset_index(drop=True)
    return merged.astype(dict(EVENTS_COLUMNS))


def samples_frame(rows: Iterable[tuple[Any, ...]]) -> pd.DataFrame:
    """Samples from (seconds after START_NS, metric, value, unit[, container]); without a
    container, ``main``, or none for host-wide metrics (:data:`HOST_METRIC_PREFIXES`)."""
    records = []
    for t, metric, value, unit, *container in rows:
        default = None if metric.startswith(HOST_METRIC_PREFIXES) else "main"
        role = container[0] if container else default
        records.append((START_NS + round(t * SEC), metric, value, unit, role, "test"))
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
                "host": row.get("host", "test"),
            }
        )
    return pd.DataFrame(records, columns=list(PHASES_COLUMNS)).astype(dict(PHASES_COLUMNS))


def in_containers(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One table from per-container tables (role -> frame): each row tagged with its role,
    sorted by time as the run format requires."""
    parts = [frame.assign(container=role) for role, frame in frames.items()]
    merged = pd.concat(parts, ignore_index=True).sort_values("ts_ns", kind="stable")
    return merged.reset_index(drop=True).astype({"container": "string"})


def container_entry(
    role: str, workload: str, index: int = 0, mounts: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """One entry of the manifest's ``containers`` list."""
    return {
        "role": role,
        "image": f"twintrace/{workload}:latest",
        "image_id": "sha256:" + "1" * 64,
        "command": ["python", "-m", f"workloads.{workload}"],
        "mounts": list(mounts),
        "container_id": f"{index:x}" * 64,
        "cgroup_id": 1234 + index,
        "main_pid": 100 + 1000 * index,
        "exit_code": 0,
    }


def manifest(
    run_id: str,
    containers: Sequence[str] = ("main",),
    mounts: Sequence[dict[str, Any]] = (),
    **changes: Any,
) -> dict[str, Any]:
    """A complete manifest of the current schema (docs/run-format.md), 10 s long, listing a
    container per role of ``containers``, each with ``mounts``."""
    workload, variant = run_id.split("-")[2:4]
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "twintrace_version": "0.1.0",
        "run_id": run_id,
        "status": "completed",
        "error": None,
        "git_revision": "0" * 40,
        "config": {"workload": workload, "variant": variant, "epochs": 1, "batch_size": 2},
        "source": None,
        "trace": {"enabled": True, "sample_interval_s": 1.0, "timeout_s": None, "network": "none"},
        "host": {"hostname": "test", "kernel": "6.8.0", "cpus": 2},
        "started_at": "2026-11-21T16:30:05Z",
        "ended_at": "2026-11-21T16:30:15Z",
        "start_ns": START_NS,
        "end_ns": START_NS + 10 * SEC,
        "exit_code": 0,
        "lost_events": 0,
        "containers": [container_entry(r, workload, i, mounts) for i, r in enumerate(containers)],
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


# ---------------------------------------------------------------------------------------------
# A run of two containers, with known numbers for every analysis

#: The roles of :func:`two_container_run`'s containers.
TWO_ROLES = ("rank0", "rank1")
#: Per role: dataset reads (count of 1 MiB reads by its loader worker) and their first time
#: (s, then one every 0.1 s), the checkpoint bytes its main process writes at 8.5 s (+ index *
#: 0.1), its CPU (% of one core) and rss (bytes), and its steps' load, compute and gap (s).
TWO: dict[str, dict[str, Any]] = {
    "rank0": {"reads": 10, "t_read": 1.0, "write": 4 * MIB, "cpu": 100.0, "rss": 2 * 2**30,
              "load": 0.2, "compute": 0.7, "gap": 0.1},
    "rank1": {"reads": 5, "t_read": 3.0, "write": 1 * MIB, "cpu": 50.0, "rss": 2**30,
              "load": 0.1, "compute": 0.3, "gap": 0.1},
}  # fmt: skip
#: Steps per container, in one epoch starting at 1 s.
TWO_STEPS = 5
#: A block read of 8 MiB issued by rank0 at 2 s; a block write of 1 MiB at 9 s by no container
#: (kernel writeback); host CPU samples (no container) of 40 %.
TWO_BLOCK_READ = 8 * MIB
TWO_WRITEBACK = MIB


def two_container_events() -> pd.DataFrame:
    """The events of :func:`two_container_run`: per container a main process (pid 100 + 100 i)
    forking a loader worker (pid + 1) that opens and reads its files under /data."""
    rows: list[dict[str, Any]] = []
    for i, role in enumerate(TWO_ROLES):
        spec, main = TWO[role], 100 + 100 * i
        worker = main + 1
        on = {"container": role}
        rows.append({"t": 0.5, "kind": "fork", "pid": main, "ret": worker, "fd": -1, **on})
        for k in range(spec["reads"]):
            t, path = spec["t_read"] + k / 10, f"/data/{role}_{k}.npy"
            rows.append({"t": t - 0.01, "kind": "openat", "pid": worker, "path": path, "ret": 3, **on,
                         "comm": "pt_data_worker"})  # fmt: skip
            rows.append({"t": t, "pid": worker, "path": path, "bytes": MIB, **on,
                         "comm": "pt_data_worker"})  # fmt: skip
        rows.append({"t": 8.5 + i / 10, "kind": "write", "pid": main, "bytes": spec["write"],
                     "path": "/twintrace/out/ckpt.pt", **on})  # fmt: skip
    rows.append({"t": 2.0, "kind": "block_read", "pid": 101, "fd": -1, "bytes": TWO_BLOCK_READ,
                 "latency_ns": 10**6, "dev": "259:0", "container": "rank0"})  # fmt: skip
    rows.append({"t": 9.0, "kind": "block_write", "pid": 0, "comm": "kworker/u8:1", "fd": -1,
                 "bytes": TWO_WRITEBACK, "dev": "259:0", "in_container": False,
                 "container": None})  # fmt: skip
    return events_frame(rows)


def two_container_samples() -> pd.DataFrame:
    rows: list[tuple[Any, ...]] = []
    for t in range(11):
        for role in TWO_ROLES:
            rows.append((t, "container_cpu", TWO[role]["cpu"], "percent", role))
            rows.append((t, "container_mem_rss", TWO[role]["rss"], "bytes", role))
        rows.append((t, "host_cpu_user", 40.0, "percent"))
    return samples_frame(rows)


def two_container_phases() -> pd.DataFrame:
    """Per container one epoch from 1 s of :data:`TWO_STEPS` steps, each ``load_batch_mem``,
    ``all_compute``, then ``step_end`` after the gap; the next step starts at that step_end.
    Both containers log rank 0 (each is a job of its own): only the container tells their
    steps apart. A ``checkpoint`` interval around each main process's write."""
    rows: list[dict[str, Any]] = []
    for i, role in enumerate(TWO_ROLES):
        spec, t = TWO[role], 1.0
        on = {"container": role, "rank": 0, "epoch": 0, "pid": 7}
        rows.append({"key": "epoch", "t0": 1.0, "t1": 8.0, **on})
        for step in range(TWO_STEPS):
            load_end = t + spec["load"]
            compute_end = load_end + spec["compute"]
            step_end = compute_end + spec["gap"]
            rows.append({"key": "load_batch_mem", "t0": t, "t1": load_end, "step": step, **on})
            rows.append({"key": "all_compute", "t0": load_end, "t1": compute_end, "step": step, **on})  # fmt: skip
            rows.append({"key": "step_end", "t0": step_end, "step": step, "value": 2, **on})
            t = step_end
        ckpt = 8.45 + i / 10
        rows.append({"key": "checkpoint", "t0": ckpt, "t1": ckpt + 0.1, **on})
    return phases_frame(rows)


def two_container_run(
    root: Path, run_id: str = "20261121-163005-unet3d-sleep-2c2c", **manifest_changes: Any
) -> Path:
    """A 10 s run of the containers :data:`TWO_ROLES` whose numbers are in :data:`TWO`, with
    the dataset mounted read-only at /data."""
    mounts = [{"source": "/srv/data", "target": "/data", "read_only": True}]
    return make_run(
        root,
        run_id,
        events=two_container_events(),
        samples=two_container_samples(),
        phases=two_container_phases(),
        containers=TWO_ROLES,
        mounts=mounts,
        **manifest_changes,
    )


# ---------------------------------------------------------------------------------------------
# A large run, built column by column in Arrow


def large_run(root: Path, events: int, seconds: float = 100.0, files: int = 10_000) -> Path:
    """A run of ``events`` events in two containers over ``seconds``: per container a main
    process and eight loader workers, each worker opening, reading (sizes from 0 to 1 MiB) and
    closing dataset files under /data in turn, the main processes writing a log; built in Arrow
    (no Python object per row), for the analyses' and pages' scale tests."""
    rng = np.random.default_rng(0)
    ts = START_NS + np.sort(rng.integers(0, int(seconds * SEC), events, dtype=np.int64))
    role = rng.integers(0, 2, events)
    worker = rng.integers(0, 9, events)  # 0: the main process
    pid = (100 + 100 * role + worker).astype(np.int32)
    kinds = ["read", "openat", "close", "lseek", "write"]
    kind = np.where(worker == 0, 4, rng.choice(4, events, p=[0.7, 0.1, 0.1, 0.1]))
    file = rng.integers(0, files, events)
    nbytes = np.where(np.isin(kind, (0, 4)), rng.integers(0, 2**20, events), 0)
    count = np.where((kind == 0) & (rng.random(events) < 0.2), 8, 1)
    paths = pa.array([f"/data/f{i:05d}.npy" for i in range(files)] + ["/twintrace/out/log"])
    path = np.where(kind == 4, files, file)
    comm = pa.array(["python", "pt_data_worker"])
    columns = {
        "ts_ns": pa.array(ts),
        "kind": pa.DictionaryArray.from_arrays(pa.array(kind.astype(np.int8)), pa.array(kinds)),
        "pid": pa.array(pid),
        "tid": pa.array(pid),
        "comm": pa.DictionaryArray.from_arrays(pa.array((worker > 0).astype(np.int32)), comm),
        "fd": pa.array(np.full(events, 3, dtype=np.int32)),
        "path": pa.DictionaryArray.from_arrays(pa.array(path.astype(np.int32)), paths),
        "bytes": pa.array(nbytes * count),
        "count": pa.array(count),
        "ret": pa.array(nbytes * count),
        "offset": pa.array(np.where(kind == 3, 0, -1)),
        "latency_ns": pa.array(rng.integers(500, 200_000, events) * count),
        "latency_max_ns": pa.array(rng.integers(500, 200_000, events)),
        "dev": pa.nulls(events, pa.string()),
        "in_container": pa.array(np.ones(events, dtype=bool)),
        "container": pa.DictionaryArray.from_arrays(
            pa.array(role.astype(np.int32)), pa.array(["rank0", "rank1"])
        ),
        "host": pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(events, np.int32)), pa.array(["test"])
        ),
    }
    schema = arrow_schema(EVENTS_COLUMNS)
    table = pa.table(
        {n: columns[n].cast(schema.field(n).type) for n in schema.names}, schema=schema
    )
    run_dir = make_run(
        root,
        f"20261121-163005-unet3d-sleep-{events % 0xFFFF:04x}",
        containers=("rank0", "rank1"),
        mounts=[{"source": "/srv/data", "target": "/data", "read_only": True}],
        skip=("events",),
        end_ns=START_NS + int(seconds * SEC),
    )
    pq.write_table(table, run_dir / "events.parquet", row_group_size=1_000_000)
    return run_dir
