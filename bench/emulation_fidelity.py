"""Fidelity of the emulated accelerator on this host: `sleep` against `original`, per workload.

For each workload (``experiments/fidelity.py`` has the procedure and the definitions), on small
data generated once (``--data-root``), with the page cache dropped before every run:

1. ``instrumented`` runs -> ``profile fit`` (the compute times of this CPU, same settings);
2. then ``original`` and ``sleep`` (with that profile) alternated, ``--rounds`` pairs.

Printed per workload (medians over the rounds, with min-max spread): step-time error (goal
<= 2 %), epoch-time error (goal <= 5 %), ``compare`` overall (goal >= 0.95) and its two lowest
aspects, emulation cost (CPU seconds of ``sleep`` / ``original`` while training, goal <= 0.15),
and sleep precision (requested vs measured emulated compute per step).

    python bench/emulation_fidelity.py --workloads unet3d,dlrm --rounds 3
    python bench/emulation_fidelity.py --json out.json      # everything, machine-readable

Run as root (bpftrace, drop_caches) with the images built (``./cli.py build``), on an otherwise
idle machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from analysis.fidelity import GOALS, summarize  # noqa: E402
from experiments.fidelity import SETUPS, measure_workload  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(SETUPS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-root", type=Path, default=Path("/var/tmp/twintrace-fidelity"))
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in SETUPS]
    if unknown:
        raise SystemExit(f"unknown workload {unknown[0]!r}: choose from {', '.join(SETUPS)}")
    work = args.data_root / "runs" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    started = time.monotonic()
    results = [
        measure_workload(
            name, args.rounds, args.data_root, work, lambda m: print(m, file=sys.stderr)
        )
        for name in names
    ]
    elapsed = time.monotonic() - started
    goals = ", ".join(f"{k} {v}" for k, v in GOALS.items())
    print(f"goals: {goals} (errors: at most; overall: at least); {elapsed:.0f} s")
    print(f"runs and profiles: {work}")
    for result in results:
        print(summarize(result))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
