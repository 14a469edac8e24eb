"""Sampled gauges: container CPU, memory and network traffic over the run, compared with DTW on a
common scale.

A run of several containers is compared on the sum over its containers
(:func:`~analysis.similarity.profile.run_profile`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from analysis.similarity.aspects.base import SHIFT, SPEED, Outcome, aspect, channels_outcome
from analysis.similarity.measures import dtw_similarity
from analysis.similarity.profile import RunProfile

_RUNS = ("real", "emulated")


def gauge_outcome(real: RunProfile, emulated: RunProfile, channels: Mapping[str, str]) -> Outcome:
    """Score of time-series channels (label -> profile series name): the mean of per-channel
    DTW similarities (level mode) over the channels either run has (0 for one that only one
    run has).

    Every channel is scaled by the larger peak of the two runs' channel *sum* (for memory:
    rss + page cache, the container's footprint), so a difference is judged as a fraction of
    the whole: 6 MiB more page cache in a 200 MiB container is a small difference, not, as
    against the channel's own maximum, a large one."""
    footprint = 0.0
    for profile in (real, emulated):
        parts = [profile.series[k] for k in channels.values() if k in profile.series]
        if parts:
            footprint = max(footprint, float(np.sum(parts, axis=0).max()))

    def score_pair(label: str, a: np.ndarray, b: np.ndarray) -> tuple[float, dict[str, Any]]:
        score, distance = dtw_similarity(a, b, level=True, scale=footprint)
        slug = label.replace(" ", "_")
        return score, {f"{slug}_score": score, f"{slug}_dtw": distance}

    plot = {"kind": "series", "level": True}
    return channels_outcome(real, emulated, channels, score_pair, plot)


def _with_means(
    outcome: Outcome, real: RunProfile, emulated: RunProfile, keys: dict[str, str]
) -> Outcome:
    """``outcome`` with each run's mean of the series ``keys`` (series -> detail name)."""
    for key, detail in keys.items():
        for who, profile in zip(_RUNS, (real, emulated), strict=True):
            outcome.details[detail.format(who=who)] = profile.totals.get(f"{key}_mean")
    return outcome


def host_cpu_accelerator(real: RunProfile, emulated: RunProfile) -> bool:
    """Whether one run computed its steps on the host's CPU and the other emulated them: the
    first run's container CPU then holds the model's compute, which the emulation replaces
    by design (it must not burn CPU), so only the data pipeline's CPU is comparable."""
    labels = [set(real.accelerators), set(emulated.accelerators)]

    def emulates(names: set[str]) -> bool:
        return bool(names) and all(n.startswith("emulated") for n in names)

    return any(mine == {"cpu"} and emulates(other) for mine, other in (labels, labels[::-1]))


@aspect(
    "cpu",
    "container CPU",
    "CPU",
    "DTW",
    0.5,
    (SHIFT, SPEED),
    ("CPU level (% of one core)", "its shape over the run"),
)
def cpu(real: RunProfile, emulated: RunProfile) -> Outcome:
    """Container CPU; between a run whose accelerator is the host's CPU and an emulated run,
    the data-loader workers' CPU (:func:`host_cpu_accelerator`), with the whole container's
    score kept as evidence. Without loader CPU in both (no workers, or runs sampled before
    it was recorded), the whole container, with a note saying what that includes."""
    whole = gauge_outcome(real, emulated, {"cpu": "cpu"})
    means = {"cpu": "mean_cpu_{who}"}
    if not host_cpu_accelerator(real, emulated):
        return _with_means(whole, real, emulated, means)
    loaders = [p.series.get("cpu_loader") for p in (real, emulated)]
    if any(s is None for s in loaders) or not any(float(s.sum()) > 0 for s in loaders):
        whole.details["compared"] = (
            "the whole container: one run's accelerator is the host's CPU, so its model "
            "compute is included, but the runs have no data-loader worker CPU to compare instead"
        )
        return _with_means(whole, real, emulated, means)
    outcome = gauge_outcome(real, emulated, {"loader workers": "cpu_loader"})
    outcome.details["compared"] = (
        "the data-loader workers' CPU: one run's accelerator is the host's CPU, whose model "
        "compute the emulation replaces (container CPU, compute included, in container_cpu_*)"
    )
    outcome.details["container_cpu_score"] = whole.score
    return _with_means(outcome, real, emulated, {**means, "cpu_loader": "mean_cpu_loader_{who}"})


@aspect(
    "memory",
    "container memory (rss, page cache, shared memory)",
    "memory",
    "DTW",
    1.0,
    (SHIFT, SPEED),
    ("memory level (bytes)", "its shape over the run"),
)
def memory(real: RunProfile, emulated: RunProfile) -> Outcome:
    """Anonymous memory, the page cache of files, and shared memory (/dev/shm, memfd: the
    loader's batches in flight) apart from it, where both runs sampled it (runs traced before
    it was sampled apart count it in their page cache)."""
    channels = {"rss": "mem_rss", "page cache": "mem_cache"}
    if all("mem_shm" in p.series for p in (real, emulated)):
        channels["shared memory"] = "mem_shm"
    outcome = gauge_outcome(real, emulated, channels)
    means = {key: f"mean_{key}_bytes_{{who}}" for key in ("mem_rss", "mem_cache", "mem_shm")}
    return _with_means(outcome, real, emulated, means)


@aspect(
    "network",
    "network traffic (received, sent)",
    "network",
    "DTW",
    1.0,
    (SHIFT, SPEED),
    ("bytes per second on the containers' network interfaces", "its shape over the run"),
)
def network(real: RunProfile, emulated: RunProfile) -> Outcome:
    """Bytes per second the containers received and sent (summed over them: with a storage
    node and a training node, each byte counts once received and once sent); skipped when
    neither run had a network (a run of one container has none)."""
    outcome = gauge_outcome(real, emulated, {"received": "net_rx", "sent": "net_tx"})
    means = {key: f"mean_{key}_bytes_s_{{who}}" for key in ("net_rx", "net_tx")}
    return _with_means(outcome, real, emulated, means)
