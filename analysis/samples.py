"""Figures of a run's samples over a window of it, shared by the studies (experiments/): the
total of a sampled rate (:func:`sampled_total`: bytes on the network, CPU seconds of a
container) and the CPU something outside the run used (:func:`other_cpu_cores`: whether another
job shared the host).

The samples table is that of ``store.rundir`` (``docs/run-format.md``): ``ts_ns``, ``metric``,
``value``, ``container`` (null for host-wide metrics such as ``host_cpu_idle``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.tables import is_value

_NS = 1e-9


def sampled_total(
    samples: pd.DataFrame, metric: str, container: str, start_ns: int, end_ns: int
) -> float:
    """The integral over ``[start_ns, end_ns]`` of a rate the sampler recorded (``metric`` of
    ``container``): each sample's value holds over the interval since the previous sample, and
    counts for the part of it inside the window. Bytes for a bytes/s metric; for a percent of one
    core, 100 x CPU seconds."""
    rows = samples[is_value(samples["metric"], metric) & is_value(samples["container"], container)]
    if len(rows) < 2:
        return 0.0
    rows = rows.sort_values("ts_ns")
    ts = rows["ts_ns"].to_numpy(dtype=np.int64)
    values = rows["value"].to_numpy(dtype=np.float64)
    lo = np.maximum(ts[:-1], start_ns)
    hi = np.minimum(ts[1:], end_ns)
    return float((values[1:] * np.clip(hi - lo, 0, None)).sum() * _NS)


def other_cpu_cores(samples: pd.DataFrame, cpus: int, start_ns: int, end_ns: int) -> float:
    """Cores busy with something else than the run between ``start_ns`` and ``end_ns``: the
    host's busy share of its ``cpus`` less the containers' (every one's), the tracer's and the
    sampler's (means of their samples; NaN without samples). On a shared host this says whether
    another job took the CPU from the run's loaders."""
    inside = samples[(samples["ts_ns"] > start_ns) & (samples["ts_ns"] <= end_ns)]
    if not len(inside) or not cpus:
        return math.nan
    # Each container's mean, summed over the containers (host-wide metrics have none).
    by_container = inside.groupby(
        [inside["metric"].astype(str), inside["container"].astype(str).fillna("")]
    )["value"].mean()
    means = by_container.groupby(level=0).sum()
    if "host_cpu_idle" not in means:
        return math.nan
    host = (100.0 - means["host_cpu_idle"] - means.get("host_cpu_iowait", 0.0)) / 100.0 * cpus
    ours = sum(
        v
        for k, v in means.items()
        if k in ("container_cpu", "sampler_cpu") or k.startswith("tracer_cpu_")
    )
    return float(host - ours / 100.0)


__all__ = ["other_cpu_cores", "sampled_total"]
