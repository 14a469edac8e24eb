"""``./cli.py profile fit``: a sleep profile fitted to the compute times of instrumented runs.

Each instrumented run contributes the ``all_compute`` durations of its steps (every rank),
first step of each epoch excluded (it carries one-off warm-up costs, as in the published
method), at its configuration (accelerators g, batch size b from the run's config). The fit is
:func:`analysis.profile_fit.fit_points`: normal per configuration, least squares of mean and
std on (g, b), warnings for poor fits and negative std, every configuration kept as a table
point. Runs of one configuration are pooled.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from analysis.profile_fit import PointSamples, fit_points
from core.errors import UserError
from core.rundir import Run
from workloads.profile import SleepProfile


def step_durations(run: Run, key: str = "all_compute") -> np.ndarray:
    """Seconds of ``key`` per step, the first step of each epoch excluded."""
    phases = run.phases
    rows = phases[(phases["key"] == key) & (phases["step"] > 0)]
    return rows["duration_ns"].to_numpy(dtype=np.float64) / 1e9


def fit_runs(runs: Sequence[Run], accelerator: str | None = None) -> tuple[SleepProfile, list[str]]:
    """The fitted profile of ``runs`` and the fit's warnings (see the module doc)."""
    if not runs:
        raise UserError("give at least one instrumented run to fit")
    workloads = {r.workload for r in runs}
    if len(workloads) > 1:
        raise UserError(
            f"runs of several workloads ({', '.join(sorted(workloads))}): fit one workload at a time"
        )
    samples: dict[tuple[int, int], list[np.ndarray]] = {}
    devices = set()
    for run in runs:
        config = run.manifest.get("config") or {}
        if run.variant != "instrumented":
            raise UserError(
                f"run {run.run_id} is a {run.variant} run: fit instrumented runs (their all_compute "
                "durations are the real model's compute)"
            )
        durations = step_durations(run)
        if durations.size == 0:
            raise UserError(
                f"run {run.run_id} has no all_compute durations after the first step of each epoch: "
                "run more than one step per epoch"
            )
        key = (int(config["accelerators"]), int(config["batch_size"]))
        samples.setdefault(key, []).append(durations)
        host = run.manifest.get("host") or {}
        devices.add(f"{config.get('device', 'auto')} on {host.get('cpu_model') or 'unknown CPU'}")
    fit = fit_points([PointSamples(g, b, np.concatenate(v)) for (g, b), v in samples.items()])
    profile = SleepProfile(
        workload=workloads.pop(),
        accelerator=accelerator or "; ".join(sorted(devices)),
        source=(
            "fitted by ./cli.py profile fit to the all_compute durations of instrumented runs "
            + ", ".join(r.run_id for r in runs)
            + " (first step of each epoch excluded)"
        ),
        compute=fit.compute,
        table=fit.table,
        fit=fit.info(),
    )
    return profile, list(fit.warnings)
