#!/usr/bin/env python3
"""Benchmark: comparing two runs of N events each with analysis.similarity.compare_runs.

Method: write two synthetic run directories (docs/run-format.md) of N events each (default
10,000,000): reads (80 %) of power-of-two sizes from 4 KiB to 4 MiB spread over N / 5000 dataset
files under /data read in a shuffled order, writes, opens and closes of those files, block
requests, page-cache rows; 10 Hz CPU and memory samples; step_end, load_batch_mem and checkpoint
phases. The second run is 10 % faster, reads larger requests and shuffles with another seed, so
no aspect is trivially identical. Then, timed separately:
  load:    load_run + first access to events, samples and phases (Parquet -> pandas)
  compare: compare_runs(real, emulated) on the loaded runs
and prints both times, the events/s of the comparison (2 x N events / compare time) and the
peak RSS of the process.
The target is compare < 60 s for 2 x 10 M events on 2 cores.

Usage: python bench/compare_speed.py [--events 10000000] [--dir /tmp/compare-bench] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from analysis.similarity import compare_runs, comparison_table  # noqa: E402
from store.rundir import (  # noqa: E402
    EVENTS_COLUMNS,
    PHASES_COLUMNS,
    SAMPLES_COLUMNS,
    SCHEMA_VERSION,
    arrow_schema,
    load_run,
)

START_NS = 5_000_000_000_000
SEC = 1_000_000_000
EVENTS_PER_S = 50_000  # a busy loader: 10 M events make a 200 s run
KINDS = ["read", "pread64", "write", "openat", "close", "block_read", "block_write", "cache_add"]
SHARES = [0.70, 0.10, 0.05, 0.05, 0.05, 0.025, 0.015, 0.01]


def _dict(codes: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int8)), pa.array(values))


def make_run(root: Path, name: str, n: int, seed: int, speed: float, size_shift: int) -> Path:
    """One synthetic run directory of ``n`` events; ``speed`` > 1 makes it shorter."""
    rng = np.random.default_rng(seed)
    duration_ns = int(n / EVENTS_PER_S / speed * SEC)
    run_dir = root / name
    run_dir.mkdir(parents=True)
    kind = rng.choice(len(KINDS), size=n, p=SHARES)
    ts = START_NS + np.sort(rng.integers(0, duration_ns, n))
    pid = rng.integers(1000, 1004, n).astype(np.int32)
    n_files = max(10, n // 5000)
    # Files are read in a shuffled order (each its own slice of the run), like a DataLoader.
    order = rng.permutation(n_files)
    file_of = order[np.minimum((ts - START_NS) * n_files // duration_ns, n_files - 1)]
    is_rw = kind <= 2
    is_block = (kind == 5) | (kind == 6)
    sizes = 2 ** (rng.integers(12, 23, n) + size_shift)
    nbytes = np.where(is_rw | is_block, sizes, 0).astype(np.int64)
    nbytes[kind == 7] = 4096 * 25
    path_codes = np.where(kind <= 4, file_of, -1)
    paths = pa.DictionaryArray.from_arrays(
        pa.array(path_codes.astype(np.int32), mask=path_codes < 0),
        pa.array([f"/data/case_{i:06d}.npy" for i in range(n_files)]),
    ).cast(pa.string())
    fd = np.where(kind <= 4, 5, -1).astype(np.int32)
    columns = {
        "ts_ns": ts,
        "kind": _dict(kind, KINDS),
        "pid": pid,
        "tid": pid,
        "comm": _dict((pid != 1000).astype(np.int8), ["python", "pt_data_worker"]).cast(
            pa.string()
        ),
        "fd": fd,
        "path": paths,
        "bytes": nbytes,
        "count": np.where(kind == 7, 25, 1).astype(np.int64),
        "ret": np.where(kind == 3, 5, nbytes).astype(np.int64),
        "offset": np.full(n, -1, dtype=np.int64),
        "latency_ns": (latency := rng.integers(1_000, 200_000, n)),
        "latency_max_ns": latency,
        "dev": pa.nulls(n, pa.string()),
        "in_container": np.ones(n, dtype=bool),
        "container": _dict(np.zeros(n), ["main"]).cast(pa.string()),
        "host": _dict(np.zeros(n), ["bench"]).cast(pa.string()),
    }
    pq.write_table(
        pa.table(columns, schema=arrow_schema(EVENTS_COLUMNS)), run_dir / "events.parquet"
    )

    t = START_NS + np.arange(0, duration_ns, SEC // 10)
    metrics = {
        "container_cpu": 150 + 50 * np.sin(np.arange(len(t)) / 20),
        "container_mem_rss": np.full(len(t), 2.0 * 2**30),
        "container_mem_cache": np.linspace(0, 8 * 2**30, len(t)),
    }
    samples = pa.table(
        {
            "ts_ns": np.tile(t, len(metrics)),
            "metric": np.repeat(list(metrics), len(t)),
            "value": np.concatenate(list(metrics.values())),
            "unit": np.repeat(["percent", "bytes", "bytes"], len(t)),
            "container": np.repeat(["main"], len(metrics) * len(t)),
            "host": np.repeat(["bench"], len(metrics) * len(t)),
        },
        schema=arrow_schema(SAMPLES_COLUMNS),
    )
    pq.write_table(samples, run_dir / "samples.parquet")

    step_ns = int(0.5 * SEC / speed)
    ends = START_NS + np.arange(step_ns, duration_ns, step_ns)
    load_ns = (rng.gamma(4.0, 0.02, len(ends)) * SEC / speed).astype(np.int64)
    ckpt = START_NS + np.arange(1, 4) * duration_ns // 4
    rows = {
        "ts_ns": np.concatenate([ends, ends - step_ns, ckpt]),
        "end_ns": np.concatenate([ends, ends - step_ns + load_ns, ckpt + SEC]),
        "key": ["step_end"] * len(ends) + ["load_batch_mem"] * len(ends) + ["checkpoint"] * 3,
        "kind": ["point"] * len(ends) + ["interval"] * (len(ends) + 3),
    }
    m = len(rows["key"])
    phases = pa.table(
        {
            "ts_ns": rows["ts_ns"],
            "end_ns": rows["end_ns"],
            "duration_ns": rows["end_ns"] - rows["ts_ns"],
            "key": rows["key"],
            "kind": rows["kind"],
            "rank": np.zeros(m, dtype=np.int32),
            "pid": np.full(m, 7, dtype=np.int32),
            "epoch": np.zeros(m, dtype=np.int32),
            "step": np.concatenate(
                [np.arange(len(ends)), np.arange(len(ends)), -np.ones(3)]
            ).astype(np.int32),
            "value": ["null"] * m,
            "container": ["main"] * m,
            "host": ["bench"] * m,
        },
        schema=arrow_schema(PHASES_COLUMNS),
    )
    pq.write_table(phases, run_dir / "phases.parquet")
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "twintrace_version": "0.1.0",
        "run_id": name,
        "status": "completed",
        "config": {"workload": "bench", "variant": name.split("-")[-2]},
        "trace": {"mounts": [{"source": "/x", "target": "/data", "read_only": True}]},
        "start_ns": START_NS,
        "end_ns": START_NS + duration_ns,
        "lost_events": 0,
        "containers": [{"role": "main", "image": "bench", "command": [], "container_id": None,
                        "cgroup_id": None, "main_pid": 1000, "exit_code": 0}],
    }  # fmt: skip
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000, help="events per run")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the two runs")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="twintrace-compare-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        real_dir = make_run(base, "20261121-000000-bench-real-0001", args.events, 1, 1.0, 0)
        emu_dir = make_run(base, "20261121-000000-bench-emulated-0002", args.events, 2, 1.1, 1)
        print(f"wrote 2 x {args.events:,} events in {time.perf_counter() - t:.1f} s", flush=True)

        t = time.perf_counter()
        runs = [load_run(real_dir), load_run(emu_dir)]
        for run in runs:
            _ = run.events, run.samples, run.phases
        load_s = time.perf_counter() - t

        t = time.perf_counter()
        comparison = compare_runs(*runs)
        compare_s = time.perf_counter() - t

        print(comparison_table(comparison).to_string(index=False))
        print(f"overall {comparison.overall:.3f}")
        print(f"cpus available: {len(os.sched_getaffinity(0))}")
        print(f"load:    {load_s:.1f} s (2 runs, Parquet -> pandas)")
        print(
            f"compare: {compare_s:.1f} s, {2 * args.events / compare_s:,.0f} events/s "
            f"({'within' if compare_s < 60 else 'OVER'} the 60 s target)"
        )
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        print(f"peak RSS: {peak_kib / 2**20:.1f} GiB (writing, loading and comparing)")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
