"""``./cli.py profile fit``: a sleep profile fitted to the compute times of instrumented runs.

Each instrumented run contributes the ``all_compute`` durations of its steps (every rank),
first step of each epoch excluded (it carries one-off warm-up costs, as in the published
method), at its configuration (accelerators g, batch size b from the run's config). The fit is
:func:`analysis.profile_fit.fit_points`: normal per configuration, least squares of mean and
std on (g, b), warnings for poor fits and negative std, every configuration kept as a table
point. Runs of one configuration are pooled. The profile's ``split`` is the share of the
forward, backward (with the loss) and optimizer phases in those steps, so that a sleep run
logs the phases of an instrumented one; its ``first_step_s`` the extra compute of the first
step of epoch 1 (:func:`first_step_extra`), which the sleep run adds to its first step once.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis.profile_fit import PointSamples, fit_points
from core.errors import UserError
from store.rundir import Run
from workloads.hostrecord import HostRecord, this_host, torch_version
from workloads.profile import SleepProfile, Split


def step_durations(run: Run, key: str = "all_compute") -> np.ndarray:
    """Seconds of ``key`` per step, the first step of each epoch excluded."""
    phases = run.phases
    rows = phases[(phases["key"] == key) & (phases["step"] > 0)]
    return rows["duration_ns"].to_numpy(dtype=np.float64) / 1e9


#: The instrumented phases of a step's compute, grouped as the sleep profile's split has them.
SPLIT_PHASES: dict[str, tuple[str, ...]] = {
    "forward": ("model_forward_pass",),
    "backward": ("loss_tensor_calc", "model_backward_pass"),
    "optimizer": ("model_optim_step",),
}


def compute_split(runs: Sequence[Run]) -> Split | None:
    """Fractions of the compute in forward, backward (with the loss) and optimizer phases:
    the summed durations of the runs' steps (first step of each epoch excluded), so that an
    emulated step logs the phases of an instrumented one. None when the runs have none."""
    totals = {part: 0.0 for part in SPLIT_PHASES}
    for run in runs:
        for part, keys in SPLIT_PHASES.items():
            for key in keys:
                totals[part] += float(step_durations(run, key).sum())
    return split_of(totals)


def split_of(totals: dict[str, float]) -> Split | None:
    """The split of summed forward, backward and optimizer seconds (None when all are 0)."""
    whole = sum(totals[part] for part in SPLIT_PHASES)
    if whole <= 0:
        return None
    forward, backward = totals["forward"] / whole, totals["backward"] / whole
    return Split(forward=forward, backward=backward, optimizer=max(0.0, 1.0 - forward - backward))


def first_step_extra(runs: Sequence[Run]) -> float:
    """The median over runs of the first step's extra compute: ``all_compute`` of epoch 1's
    first step minus the median of the run's later steps (0 when not longer)."""
    extras = []
    for run in runs:
        phases = run.phases
        rows = phases[(phases["key"] == "all_compute") & (phases["epoch"] == 1)]
        first = rows[rows["step"] == 0]["duration_ns"].to_numpy(dtype=np.float64) / 1e9
        later = step_durations(run)
        if first.size and later.size:
            extras.append(max(0.0, float(np.median(first)) - float(np.median(later))))
    return float(np.median(extras)) if extras else 0.0


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
        split=compute_split(runs),
        first_step_s=first_step_extra(runs),
        host=runs_host(runs),
    )
    return profile, list(fit.warnings)


def runs_host(runs: Sequence[Run]) -> dict[str, Any] | None:
    """The host record (:class:`workloads.hostrecord.HostRecord`) of the runs a profile is
    fitted to, from their manifests: the CPU model, the CPUs the container could use (the
    host's, capped by the run's ``--cpus``), the torch threads it computed with (the config's
    ``threads``, else those CPUs, as the workloads set them) and torch's version (the images
    pin the host's); when the fit runs on the host that made the runs, that host's reference
    measurement, taken now. None when the runs come from different hosts or do not say."""
    records = set()
    for run in runs:
        host = run.manifest.get("host") or {}
        config = run.manifest.get("config") or {}
        if not host.get("cpu_model") or not host.get("cpus"):
            return None
        cpus = int(host["cpus"])
        limits = [c.get("cpus") for c in run.manifest.get("containers") or () if c.get("cpus")]
        if limits:
            cpus = max(1, min(cpus, int(min(float(x) for x in limits))))
        world = max(1, int(config.get("accelerators") or 1))
        threads = int(config.get("threads") or max(1, cpus // world))
        device = str(config.get("device") or "auto")
        accelerator = "cpu" if device in ("cpu", "auto") else device
        records.add(HostRecord(str(host["cpu_model"]), cpus, threads, torch_version(), accelerator))
    if len(records) != 1:
        return None
    record = records.pop()
    if record.on_cpu and runs_here(runs):
        # Fitted where the runs were made: this host's reference speed, taken now, tells a
        # later user of the profile whether their host computes alike.
        here = this_host(threads=record.threads)
        if here.identity() == record.identity():
            record = dataclasses.replace(record, reference_s=here.reference_s)
    return record.to_dict()


def runs_here(runs: Sequence[Run]) -> bool:
    """Whether every run was made on this host (its name in the runs' manifests)."""
    name = socket.gethostname()
    return all((run.manifest.get("host") or {}).get("hostname") == name for run in runs)
