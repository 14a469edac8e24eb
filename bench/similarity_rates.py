"""Does the similarity analyzer see rates? Real traced pairs scored before and after the rate factor.

On one small UNet3D dataset (``--data-root``, generated once), with the page cache dropped
before every run (batch 2, 2 loader workers, ``--steps`` steps, one epoch):

1. ``instrumented`` -> ``profile fit``: this host's compute, as the job computes in its container;
2. ``original``: the real job;
3. ``sleep`` twice with the fitted profile (the same configuration run twice);
4. ``sleep`` with the fitted profile's times halved (the same bytes asked for twice as fast);
5. ``sleep`` with the shipped ``epyc-2t`` profile (another host's CPU: the case that went
   unseen, the emulation running 1.7-2.7x faster than the real job);
6. ``sleep`` of DLRM on its own small dataset (another workload).

Each pair is scored twice: *before* (activity aspects the mean of timing, volume and
burstiness; the overall the weighted arithmetic mean), reconstructed from the comparison's
evidence, and *after* (the rate factor and the weighted harmonic overall of
``analysis/similarity``). Printed: both overall scores, read bandwidth, step time and the median
steps of the two runs.

    python bench/similarity_rates.py                    # ~8 traced runs, ~8 min on 2 cores

Run as root (bpftrace, drop_caches) with the images built, on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from analysis.fidelity import step_times  # noqa: E402
from analysis.profiles import fit_runs  # noqa: E402
from analysis.similarity import Comparison, compare_runs  # noqa: E402
from datagen.registry import generate  # noqa: E402
from store.hostprofiles import ForeignProfileWarning  # noqa: E402
from store.profiledb import sleep_profile_for  # noqa: E402
from store.rundir import load_run  # noqa: E402
from tracing.host import drop_caches  # noqa: E402
from tracing.request import workload_request  # noqa: E402
from tracing.runner import trace  # noqa: E402

#: The activity aspects' channels: (prefix of their terms in the evidence, channel label).
ACTIVITY = {
    "read_bandwidth": (("", "read"),),
    "write_bandwidth": (("", "write"),),
    "block_io": (("block_read_", "block_read"), ("block_write_", "block_write")),
}


def before(comparison: Comparison) -> tuple[float, dict[str, float]]:
    """The overall and activity scores as they were before the rate term: each activity channel
    the mean of timing, volume and burstiness (0 for a channel one run lacks), the overall the
    weighted arithmetic mean."""
    scores: dict[str, float] = {}
    for aspect in comparison.aspects:
        if aspect.score is None or aspect.weight <= 0:
            continue
        score = float(aspect.score)
        if aspect.name in ACTIVITY:
            d = aspect.details
            channels = [
                (d[f"{p}timing"] + d[f"{p}volume"] + d[f"{p}burstiness"]) / 3
                if f"{p}timing" in d
                else 0.0
                for p, label in ACTIVITY[aspect.name]
                if f"{p}timing" in d or f"{label}_missing_in" in d
            ]
            score = float(np.mean(channels)) if channels else score
        scores[aspect.name] = score
    weights = {a.name: a.weight for a in comparison.aspects}
    total = sum(weights[n] for n in scores)
    return sum(weights[n] * s for n, s in scores.items()) / total, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=Path("/var/tmp/twintrace-rates"))
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    root = args.data_root
    unet3d, dlrm = root / "unet3d", root / "dlrm"
    if not (unet3d / "manifest.json").exists():
        generate("unet3d", unet3d, 200_000_000, seed=0, force=True, scale=0.25)
    if not (dlrm / "manifest.json").exists():
        generate("dlrm", dlrm, 100_000_000, seed=0, force=True)
    runs_root = root / "runs"
    profiles = root / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    settings = {
        "epochs": 1,
        "batch_size": 2,
        "workers": 2,
        "max_steps": args.steps,
        "checkpoint_every": 1,
    }

    def traced(variant: str, data: Path = unet3d, profile: Path | None = None, **more: Any) -> Any:
        request = workload_request(
            more.pop("workload", "unet3d"),
            variant,
            data,
            runs_root,
            settings={**settings, **more},
            profile=profile,
        )
        drop_caches()
        run = load_run(trace(request).check())
        print(
            f"  {run.run_id}: {variant}, median step {np.median(step_times(run)):.3f} s",
            file=sys.stderr,
        )
        return run

    print("tracing (one line per run):", file=sys.stderr)
    instrumented = traced("instrumented")
    fitted, _ = fit_runs([instrumented])
    fitted_path = profiles / "fitted.json"
    fitted.save(fitted_path)
    fast_path = profiles / "halved.json"
    fitted.scaled(0.5, "the same job at twice the rate").save(fast_path)
    foreign_path = profiles / "epyc-2t.json"
    sleep_profile_for("unet3d", "epyc-2t", 2).save(foreign_path)
    original = traced("original")
    sleep_a = traced("sleep", profile=fitted_path)
    sleep_b = traced("sleep", profile=fitted_path)
    fast = traced("sleep", profile=fast_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ForeignProfileWarning)  # that is the point of the pair
        foreign = traced("sleep", profile=foreign_path)
    other = traced("sleep", dlrm, workload="dlrm", batch_size=2048, max_steps=150)
    pairs = [
        ("original vs sleep, this host's fitted profile", original, sleep_a),
        ("original vs instrumented (two real runs)", original, instrumented),
        ("original vs sleep, epyc-2t (another host's CPU)", original, foreign),
        ("sleep vs sleep at twice the rate (times halved)", sleep_a, fast),
        ("same configuration twice, caches dropped", sleep_a, sleep_b),
        ("UNet3D vs DLRM (two workloads)", sleep_a, other),
    ]
    print(
        "| pair | median steps (s) | overall before | overall after | read bw before | "
        "read bw after | step time |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for label, a, b in pairs:
        comparison = compare_runs(a, b)
        old, old_scores = before(comparison)
        steps = f"{np.median(step_times(a)):.3f} / {np.median(step_times(b)):.3f}"
        step = comparison.aspect("step_time").score
        print(
            f"| {label} | {steps} | {old:.3f} | {comparison.overall:.3f} | "
            f"{old_scores['read_bandwidth']:.3f} | {comparison.aspect('read_bandwidth').score:.3f} | "
            f"{'-' if step is None else f'{step:.3f}'} |"
        )
    print(f"runs: {runs_root}", file=sys.stderr)


if __name__ == "__main__":
    main()
