"""Measure this host's CPU once where a run emulates it (``--accelerator cpu``).

``trace``, the experiment runner and the studies call :func:`ensure_host_profile` before they
build a run whose emulated accelerator is this host's CPU: when the host cache
(:mod:`store.hostprofiles`) has no measurement of the workload with the run's options at
its batch size, ``profile measure`` (:mod:`experiments.measure`) measures it now on the run's
own dataset, at the batch and half of it, with the torch threads a rank of the run computes
with, and files it; later runs on this host find it. Each step is said: what is measured, on
which host, where it is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from store.hostprofiles import (
    current_host,
    find_host_profile,
    measure_batches,
    measure_command,
    rank_threads,
    save_host_profile,
)
from store.profiledb import is_host_cpu

#: Seconds of timed steps per batch size (after two warm-up steps): enough for the step's
#: mean to 2-3 % on the zoo's default configurations, short enough for the first run of a day.
MAX_SECONDS = 25.0

#: At least this many timed steps per batch size (stratified draws need a spread).
MIN_STEPS = 8


def ensure_host_profile(
    workload: str,
    data_dir: Path,
    batch_size: int,
    accelerators: int = 1,
    options: Mapping[str, Any] | None = None,
    threads: int | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Measure ``workload`` on this host's CPU at ``batch_size`` unless that is cached; return
    the cached profile's file."""
    threads = rank_threads(accelerators, threads)
    host = current_host(threads)
    cached = find_host_profile(workload, batch_size, options, host)
    if cached is not None:
        return cached
    from experiments.measure import MeasureSettings, measure  # torch: only when measuring

    sizes = measure_batches(batch_size)
    log(
        f"measuring this host's CPU for {workload} at batch {', '.join(map(str, sizes))} "
        f"({host.describe()}), once: later runs on this host use it"
    )
    settings = MeasureSettings(
        batch_sizes=sizes, threads=threads, max_seconds=MAX_SECONDS, min_steps=MIN_STEPS
    )
    profile, warnings = measure(
        workload,
        Path(data_dir),
        settings,
        dict(options or {}),
        progress=log,
        command=measure_command(workload, batch_size, str(data_dir)),
    )
    for warning in warnings:
        log(f"warning: {warning}")
    path = save_host_profile(profile, options)
    log(f"this host's CPU profile of {workload}: {path}")
    return path


def prepare_emulation(
    workload: str,
    accelerator: str | None,
    data_dir: Path | None,
    settings: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> None:
    """Before a sleep or DLIO run of ``workload`` emulating ``accelerator`` is built: when that
    is this host's CPU, make sure the host has measured it (:func:`ensure_host_profile`) at
    the run's batch size, ranks and threads (``settings``: WorkloadConfig fields, defaults the
    workload's). Nothing for any other accelerator, or without a dataset (the request then
    says what is missing)."""
    if data_dir is None or not is_host_cpu(accelerator):
        return
    from workloads.registry import WORKLOADS

    if workload not in WORKLOADS:
        return  # the request names the known workloads
    known = {k: v for k, v in (settings or {}).items() if v is not None}
    config = WORKLOADS[workload].config("sleep", **known)
    ensure_host_profile(
        workload,
        Path(data_dir),
        config.batch_size,
        config.accelerators,
        options,
        config.threads,
        log,
    )
