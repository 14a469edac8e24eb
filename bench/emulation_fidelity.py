"""Fidelity of the emulated accelerator on this host: `sleep` against `original`, per workload.

For each workload, on small data generated once (``--data-root``), with the page cache dropped
before every run:

1. ``instrumented`` runs -> ``profile fit`` (the compute times of this CPU, same settings);
2. then ``original`` and ``sleep`` (with that profile) alternated, ``--rounds`` pairs.

Printed per workload (medians over the rounds, with min-max spread):

- step-time error: median step time of ``sleep`` vs ``original`` (goal <= 2 %), steps of
  epoch 1 after the first (the first carries one-off warm-up costs);
- epoch-time error: training time of the epoch (goal <= 5 %);
- ``compare`` overall (goal >= 0.95) and its two lowest aspects;
- emulation cost: container CPU seconds of ``sleep`` / ``original`` while training (the epoch;
  goal <= 0.15);
- sleep precision: mean emulated compute (``accelerator_busy``) vs the profile's mean.

    python bench/emulation_fidelity.py --workloads unet3d,dlrm --rounds 3
    python bench/emulation_fidelity.py --json out.json      # everything, machine-readable

Run as root (bpftrace, drop_caches) with the images built (``./cli.py build``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from analysis.profiles import fit_runs  # noqa: E402
from analysis.similarity import compare_runs  # noqa: E402
from core.rundir import Run, load_run  # noqa: E402
from datagen.registry import generate  # noqa: E402
from tracing.request import workload_request  # noqa: E402
from tracing.runner import trace  # noqa: E402

#: Small configurations that train on 2 CPU cores in tens of seconds; (generator, size, options,
#: settings). The same settings serve every variant of a workload.
CONFIGS: dict[str, dict[str, Any]] = {
    "unet3d": {
        "data": ("unet3d", 60_000_000, {"scale": 0.4}),
        "options": {"patch_size": 48},
        "settings": {"batch_size": 2, "workers": 1, "max_steps": 12},
    },
    "dlrm": {
        "data": ("dlrm", 40_000_000, {}),
        "options": {},
        "settings": {"batch_size": 2048, "workers": 1, "max_steps": 30},
    },
    "bert": {
        "data": ("bert", 40_000_000, {}),
        "options": {},
        "settings": {"batch_size": 8, "workers": 1, "max_steps": 15},
    },
    "resnet18": {
        "data": ("images", 40_000_000, {}),
        "options": {"image_size": 64},
        "settings": {"batch_size": 16, "workers": 1, "max_steps": 15},
    },
    "resnet50": {
        "data": ("images", 40_000_000, {}),
        "options": {"image_size": 64, "width": 32},
        "settings": {"batch_size": 16, "workers": 1, "max_steps": 10},
    },
    "alexnet": {
        "data": ("images", 40_000_000, {}),
        "options": {"image_size": 64},
        "settings": {"batch_size": 16, "workers": 1, "max_steps": 15},
    },
}
GOALS = {"step_error": 0.02, "epoch_error": 0.05, "overall": 0.95, "cost": 0.15}


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def dataset(root: Path, workload: str) -> Path:
    generator, size, extra = CONFIGS[workload]["data"]
    path = root / generator
    if not (path / "manifest.json").exists():
        generate(generator, path, size, seed=0, force=path.exists(), **extra)
    return path


def traced(workload: str, variant: str, data: Path, runs: Path, profile: Path | None) -> Run:
    config = CONFIGS[workload]
    drop_caches()
    settings = {"epochs": 1, "checkpoint_every": 0, **config["settings"]}
    request = workload_request(
        workload,
        variant,
        data,
        runs,
        settings=settings,
        options=config["options"],
        profile=profile,
    )
    return load_run(trace(request).check())


def step_times(run: Run) -> np.ndarray:
    """Seconds between consecutive step ends of rank 0 in epoch 1 (first step excluded)."""
    phases = run.phases
    ends = phases[(phases["key"] == "step_end") & (phases["rank"] == 0) & (phases["epoch"] == 1)]
    ts = np.sort(ends["ts_ns"].to_numpy(dtype=np.int64))
    return np.diff(ts)[1:] / 1e9


def epoch_time(run: Run) -> float:
    epochs = run.phases[(run.phases["key"] == "epoch") & (run.phases["rank"] == 0)]
    return float(epochs["duration_ns"].sum()) / 1e9


def cpu_seconds(run: Run) -> float:
    """Container CPU time while training (the epoch interval; interpreter start-up and imports
    are the same in both variants and left out): the sampler's percent-of-a-core, integrated."""
    epochs = run.phases[(run.phases["key"] == "epoch") & (run.phases["rank"] == 0)]
    start, end = int(epochs["ts_ns"].min()), int(epochs["end_ns"].max())
    cpu = run.samples[run.samples["metric"] == "container_cpu"].sort_values("ts_ns")
    cpu = cpu[(cpu["ts_ns"] > start) & (cpu["ts_ns"] <= end)]
    if len(cpu) < 2:
        return float("nan")
    dt = np.diff(cpu["ts_ns"].to_numpy(dtype=np.int64)) / 1e9
    return float(np.sum(cpu["value"].to_numpy()[1:] / 100.0 * dt))


def busy_mean(run: Run) -> float:
    busy = run.phases[(run.phases["key"] == "accelerator_busy") & (run.phases["step"] > 0)]
    return float(busy["duration_ns"].mean()) / 1e9


def measure(workload: str, rounds: int, data_root: Path, work: Path, log: Any) -> dict[str, Any]:
    data = dataset(data_root, workload)
    runs = work / workload
    log(f"{workload}: instrumented runs for the profile")
    instrumented = [traced(workload, "instrumented", data, runs, None) for _ in range(2)]
    profile, warnings = fit_runs(instrumented, accelerator="cpu")
    profile_path = work / f"{workload}-profile.json"
    profile.save(profile_path)
    b = CONFIGS[workload]["settings"]["batch_size"]
    requested = profile.compute_params(1, profile.profile_batch(b, 1))[0]
    pairs = []
    for i in range(rounds):
        order = ("original", "sleep") if i % 2 == 0 else ("sleep", "original")
        done = {
            v: traced(workload, v, data, runs, profile_path if v == "sleep" else None)
            for v in order
        }
        real, emulated = done["original"], done["sleep"]
        comparison = compare_runs(real, emulated)
        scored = sorted(
            (a for a in comparison.aspects if a.score is not None), key=lambda a: a.score
        )
        pair = {
            "step_error": float(np.median(step_times(emulated)) / np.median(step_times(real)) - 1),
            "epoch_error": epoch_time(emulated) / epoch_time(real) - 1,
            "overall": comparison.overall,
            "lowest": [(a.name, round(a.score, 3)) for a in scored[:2]],
            "cost": cpu_seconds(emulated) / cpu_seconds(real),
            "busy_mean_s": busy_mean(emulated),
            "requested_s": requested,
            "runs": [str(real.path), str(emulated.path)],
        }
        log(f"{workload} round {i + 1}: " + json.dumps({k: pair[k] for k in GOALS}))
        pairs.append(pair)
    return {
        "workload": workload,
        "profile": str(profile_path),
        "fit_warnings": warnings,
        "pairs": pairs,
    }


def summarize(result: dict[str, Any]) -> str:
    pairs = result["pairs"]

    def spread(key: str, pct: bool = False) -> str:
        values = [p[key] for p in pairs]
        scale = 100 if pct else 1
        fmt = "{:+.1f}%" if pct else "{:.3f}"
        return (
            fmt.format(statistics.median(values) * scale)
            + " ("
            + fmt.format(min(values) * scale)
            + " .. "
            + fmt.format(max(values) * scale)
            + ")"
        )

    busy = statistics.median(p["busy_mean_s"] for p in pairs)
    requested = pairs[0]["requested_s"]
    lowest = pairs[len(pairs) // 2]["lowest"]
    return (
        f"{result['workload']:9s} step {spread('step_error', True)}  "
        f"epoch {spread('epoch_error', True)}  overall {spread('overall')}  "
        f"cost {spread('cost')}  sleep {requested:.4f} s -> {busy:.4f} s  lowest {lowest}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-root", type=Path, default=Path("/var/tmp/twintrace-fidelity"))
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown workload {unknown[0]!r}: choose from {', '.join(CONFIGS)}")
    results = []
    work = args.data_root / "runs" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    started = time.monotonic()
    for name in names:
        results.append(
            measure(name, args.rounds, args.data_root, work, lambda m: print(m, file=sys.stderr))
        )
    elapsed = time.monotonic() - started
    print(f"goals: step <= 2%, epoch <= 5%, overall >= 0.95, cost <= 0.15; {elapsed:.0f} s")
    print(f"runs and profiles: {work}")
    for result in results:
        print(summarize(result))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
