#!/usr/bin/env python3
"""Benchmark: tracer overhead on training step throughput.

Method: the same UNet3D run (same image, data, config and seed) is run traced (bpftrace + samplers)
and untraced (the same container started the same way, with tracing off), alternated A/B for
--rounds rounds. Throughput is steps/s between the first and the last `step_end` event of the
run (the first step, which includes worker start-up, is excluded). The page cache is dropped
before every run so both see the same cold-storage behaviour.

By default the `sleep` variant runs with a 5 ms compute profile: the step is then dominated by
the data pipeline (file reads in the loader workers), the part that tracing can slow down, so
this is a worst case. Prints the median traced/untraced throughput ratio (goal: >= 0.98).

Usage: python bench/tracer_overhead.py --data data/unet3d-demo [--rounds 3] [--variant sleep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from tracing.host import drop_caches  # noqa: E402
from tracing.request import RunOptions, workload_request  # noqa: E402
from tracing.runner import trace  # noqa: E402


def throughput(run_dir: Path) -> float:
    phases = pd.read_parquet(run_dir / "phases.parquet")
    steps = phases[(phases["key"] == "step_end") & (phases["rank"].isin([0, -1]))].sort_values(
        "ts_ns"
    )
    if len(steps) < 3:
        raise SystemExit(f"{run_dir}: only {len(steps)} steps; use more data or epochs")
    span = (steps["ts_ns"].iloc[-1] - steps["ts_ns"].iloc[0]) / 1e9
    return (len(steps) - 1) / span


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", default="sleep")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--compute-s", type=float, default=0.005, help="sleep profile mean (sleep variant)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="twintrace-overhead-"))
    try:
        profile = None
        if args.variant == "sleep":
            profile = work / "profile.json"
            profile.write_text(
                json.dumps(
                    {
                        "schema_version": 1,
                        "workload": "unet3d",
                        "accelerator": "none",
                        "source": "bench/tracer_overhead.py: constant compute time, data pipeline dominates",
                        "compute": {
                            "mean": {"g": 0.0, "b": 0.0, "const": args.compute_s},
                            "std": {"g": 0.0, "b": 0.0, "const": 0.0},
                        },
                    }
                )
            )
        settings = {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "workers": args.workers,
            "checkpoint_every": 0,
        }
        ratios = []
        for i in range(args.rounds):
            result = {}
            for traced in (True, False) if i % 2 == 0 else (False, True):
                drop_caches()
                run_dir = trace(
                    workload_request(
                        "unet3d",
                        args.variant,
                        args.data,
                        work / "runs",
                        settings=settings,
                        profile=profile,
                        run=RunOptions(tracing=traced),
                    )
                ).check()
                result[traced] = throughput(run_dir)
            ratios.append(result[True] / result[False])
            print(
                f"round {i + 1}: traced {result[True]:.3f} steps/s, untraced {result[False]:.3f} steps/s, "
                f"ratio {ratios[-1]:.3f}"
            )
        print(
            f"traced/untraced step throughput = {statistics.median(ratios):.3f} (median of {args.rounds}; goal >= 0.98)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
