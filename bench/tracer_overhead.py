#!/usr/bin/env python3
"""Benchmark: the tracer's effect on training step throughput, per zoo workload and variant.

Method: for each workload, the small configuration of ``experiments/fidelity.py`` (``SETUPS``,
DLRM's longer here, :data:`BENCH_SETUPS`:
fixed data generated once under ``--data-root``, 40-60 steps, one loader worker), each variant
(``sleep`` with its shipped profile, ``original``) is run traced (bpftrace and the samplers) and
untraced (the same container started the same way, tracing off), alternated A/B then B/A for
``--rounds`` rounds, with the page cache dropped before every run. A run's step time is the
MEDIAN time between consecutive ``step_end`` events of rank 0 (first step excluded): a host stall
of a few seconds, common on this shared machine, moves a mean or an epoch time but not a median
of 40 steps. Per round: traced/untraced step throughput = untraced median step / traced median
step. Printed per workload and variant: the median ratio over the rounds, a bootstrap 90 %
confidence interval of that median (:func:`median_ci`: what supports or refutes the goal), the
spread (min..max), and the tracer's own CPU time per step of the epoch (bpftrace's user space
and the sampling process, from their ``tracer_cpu_*`` and ``sampler_cpu`` samples). A traced
run that is not ``completed`` (events lost) is reported.

Goal (issue "Tracing at any event rate"): traced/untraced step throughput >= 0.98.

    python bench/tracer_overhead.py --workloads unet3d,resnet50 --variants sleep,original --rounds 3

Run as root with the images built, on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from core.rundir import Run, load_run, load_summary  # noqa: E402
from experiments.fidelity import SETUPS, dataset, step_ends, step_times  # noqa: E402
from tracing.host import drop_caches  # noqa: E402
from tracing.request import RunOptions, workload_request  # noqa: E402
from tracing.runner import trace  # noqa: E402

GOAL = 0.98

#: The fidelity setups, but DLRM's 60 steps of ~13 ms are too short for a ratio known to a
#: percent: here it reads 160 MB for 300 steps.
BENCH_SETUPS = {
    **SETUPS,
    "dlrm": dataclasses.replace(
        SETUPS["dlrm"], size=160_000_000, settings={**SETUPS["dlrm"].settings, "max_steps": 300}
    ),
}


def run_once(workload: str, variant: str, data: Path, runs: Path, traced: bool) -> Run:
    """One run of the workload's small configuration, traced or not, on a cold cache."""
    setup = BENCH_SETUPS[workload]
    drop_caches()
    request = workload_request(
        workload,
        variant,
        data,
        runs,
        settings={"epochs": 1, "checkpoint_every": 0, "seed": 0, **setup.settings},
        options=dict(setup.options),
        run=RunOptions(tracing=traced),
    )
    return load_run(trace(request).check())


def median_step(run: Run) -> float:
    steps = step_times(run)
    if len(steps) < 5:
        raise SystemExit(f"{run.path}: only {len(steps)} step intervals; use more steps")
    return float(np.median(steps))


def tracer_cpu_per_step(run: Run) -> tuple[float, float]:
    """CPU seconds per training step of bpftrace (all scripts) and of the sampling process,
    over the epoch's steps (from the first ``step_end`` to the last: start-up, when the
    workload imports its modules, is left out); nan when not sampled."""
    ends = step_ends(run)["ts_ns"].to_numpy(dtype=np.int64)
    samples = run.samples
    cost = []
    for prefix in ("tracer_cpu_", "sampler_cpu"):
        cpu = samples[samples["metric"].str.startswith(prefix)]
        if not len(cpu) or len(ends) < 2:
            cost.append(float("nan"))
            continue
        total = 0.0
        for _, series in cpu.sort_values("ts_ns").groupby("metric"):
            ts = series["ts_ns"].to_numpy(dtype=np.int64)
            inside = (ts > ends[0]) & (ts <= ends[-1])
            dt = np.diff(ts, prepend=ts[0]) / 1e9
            total += float(np.sum(series["value"].to_numpy()[inside] / 100.0 * dt[inside]))
        cost.append(total / (len(ends) - 1))
    return cost[0], cost[1]


def median_ci(values: list[float], level: float = 0.9, draws: int = 10_000) -> tuple[float, float]:
    """A bootstrap confidence interval of the median of ``values`` (percentile method)."""
    rng = np.random.default_rng(0)
    data = np.asarray(values, dtype=float)
    medians = np.median(rng.choice(data, size=(draws, len(data)), replace=True), axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(BENCH_SETUPS))
    parser.add_argument("--variants", default="sleep,original")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-root", type=Path, default=Path("/var/tmp/twintrace-fidelity"))
    args = parser.parse_args()
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in BENCH_SETUPS]
    if unknown:
        raise SystemExit(f"unknown workload {unknown[0]!r}: choose from {', '.join(BENCH_SETUPS)}")
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in ("sleep", "original", "instrumented")]
    if bad:
        raise SystemExit(f"unknown variant {bad[0]!r}: choose from sleep, original, instrumented")
    runs = args.data_root / "runs" / time.strftime("overhead-%Y%m%d-%H%M%S")
    runs.mkdir(parents=True)
    started = time.monotonic()
    lines = []
    for workload in names:
        data = dataset(args.data_root, BENCH_SETUPS[workload])
        for variant in variants:
            ratios, costs, sampler_costs = [], [], []
            for i in range(args.rounds):
                step = {}
                for traced in (True, False) if i % 2 == 0 else (False, True):
                    run = run_once(workload, variant, data, runs, traced)
                    step[traced] = median_step(run)
                    if traced:
                        tracer_cost, sampler_cost = tracer_cpu_per_step(run)
                        costs.append(tracer_cost)
                        sampler_costs.append(sampler_cost)
                        summary = load_summary(run.path)
                        if summary.get("status") != "completed" or summary.get("lost_events"):
                            print(
                                f"{workload} {variant}: traced run {run.path.name} is "
                                f"{summary.get('status')} (lost {summary.get('lost_events')})",
                                file=sys.stderr,
                            )
                ratios.append(step[False] / step[True])
                print(
                    f"{workload} {variant} round {i + 1}: median step traced {step[True]:.4f} s, "
                    f"untraced {step[False]:.4f} s, traced/untraced throughput {ratios[-1]:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
            cost = statistics.median(costs) if costs else float("nan")
            sampler_cost = statistics.median(sampler_costs) if sampler_costs else float("nan")
            low, high = median_ci(ratios)
            lines.append(
                f"{workload:9s} {variant:9s} traced/untraced step throughput "
                f"{statistics.median(ratios):.3f} (median of {args.rounds}; 90 % CI "
                f"{low:.3f} .. {high:.3f}; spread {min(ratios):.3f} .. {max(ratios):.3f}); "
                f"CPU per step: bpftrace {cost * 1e3:.2f} ms, sampler {sampler_cost * 1e3:.2f} ms"
            )
    print(f"goal: >= {GOAL}; {time.monotonic() - started:.0f} s; runs under {runs}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
