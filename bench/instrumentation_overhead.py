"""Cost of the instrumentation: median step of `instrumented` runs / `original` runs, traced.

The two variants train the same model on the same data; `instrumented` also logs per-phase
durations (nine events a step in the training process, one or two per sample or batch in the
loader workers). A profile fitted to `instrumented` runs carries whatever that costs, so the
ratio bounds how close an emulation fitted to them can come to `original`. Runs alternate
(A/B, then B/A), caches dropped before each, on the data and settings of the fidelity benchmark
(``experiments/fidelity.py``); printed per workload: the ratio per round, its median and spread.

    python bench/instrumentation_overhead.py --workloads alexnet,resnet18 --rounds 3

Run as root with the images built, on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from experiments.fidelity import SETUPS, dataset, step_times, traced  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="alexnet,resnet18")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-root", type=Path, default=Path("/var/tmp/twintrace-fidelity"))
    args = parser.parse_args()
    for workload in [w for w in args.workloads.split(",") if w]:
        if workload not in SETUPS:
            raise SystemExit(f"unknown workload {workload!r}: choose from {', '.join(SETUPS)}")
        setup = SETUPS[workload]
        data = dataset(args.data_root, setup)
        runs = args.data_root / "overhead-runs"
        ratios = []
        for i in range(args.rounds):
            order = ("instrumented", "original") if i % 2 == 0 else ("original", "instrumented")
            median = {
                v: float(np.median(step_times(traced(workload, setup, v, data, runs, None))))
                for v in order
            }
            ratios.append(median["instrumented"] / median["original"])
            print(f"{workload} round {i + 1}: {median} ratio {ratios[-1]:.3f}", file=sys.stderr)
        print(
            f"{workload:9s} instrumented/original median step {statistics.median(ratios):.3f} "
            f"(spread {min(ratios):.3f} .. {max(ratios):.3f}; rounds "
            + " ".join(f"{r:.3f}" for r in ratios)
            + ")"
        )


if __name__ == "__main__":
    main()
