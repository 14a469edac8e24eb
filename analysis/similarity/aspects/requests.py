"""Requests: their sizes (Jensen-Shannon of power-of-two histograms) and the time between read
completions (Kolmogorov-Smirnov)."""

from __future__ import annotations

import numpy as np
from scipy.stats import wasserstein_distance

from analysis.similarity.aspects.base import (
    COUNT,
    SHIFT,
    SPEED,
    Aspect,
    Outcome,
    aspect,
    one_sided,
    quantile_plot,
    sample_details,
)
from analysis.similarity.measures import N_SIZE_BUCKETS, js_similarity, ks_noise, ks_similarity
from analysis.similarity.profile import RunProfile


def size_outcome(a: np.ndarray, b: np.ndarray, what: str) -> Outcome:
    """JS similarity of two request-size histograms (:func:`log2_buckets` counts)."""
    missing = one_sided(a.sum() > 0, b.sum() > 0, what)
    if missing:
        return missing
    score = js_similarity(a, b)
    octaves = np.arange(N_SIZE_BUCKETS, dtype=np.float64)
    # Wasserstein in octaves says how far apart the sizes are (JS only says that they differ).
    details = {
        "js_distance": 1.0 - score,
        "wasserstein_octaves": float(wasserstein_distance(octaves, octaves, a, b)),
        "median_bytes_real": _bucket_median(a),
        "median_bytes_emulated": _bucket_median(b),
        "requests_real": int(a.sum()),
        "requests_emulated": int(b.sum()),
    }
    used = np.flatnonzero((a > 0) | (b > 0))
    lo, hi = int(used.min()), int(used.max()) + 1
    plot = {
        "kind": "histogram",
        "x": [_bucket_label(k) for k in range(lo, hi)],
        "real": a[lo:hi] / a.sum(),
        "emulated": b[lo:hi] / b.sum(),
    }
    return Outcome(score, details, plot)


def _bucket_median(counts: np.ndarray) -> int:
    """Lower bound (bytes) of the bucket holding the median request."""
    k = int(np.searchsorted(np.cumsum(counts), counts.sum() / 2))
    return 0 if k == 0 else 2**k


def _bucket_label(k: int) -> str:
    low = 2**k
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if low >= size:
            return f"{low // size} {unit}"
    return "0-1 B" if k == 0 else f"{low} B"


def _sizes(direction: str, weight: float) -> Aspect:
    """The ``read_sizes`` or ``write_sizes`` aspect: histograms of successful requests."""

    @aspect(
        f"{direction}_sizes",
        f"{direction} request sizes",
        "syscall I/O",
        "JS",
        weight,
        (SHIFT, SPEED, COUNT),
        ("share of requests per power-of-two size",),
    )
    def sizes(real: RunProfile, emulated: RunProfile) -> Outcome:
        name = f"{direction}_sizes"
        return size_outcome(getattr(real, name), getattr(emulated, name), f"{direction}s")

    return sizes


read_sizes = _sizes("read", 2.0)
write_sizes = _sizes("write", 1.0)


@aspect(
    "read_interarrival",
    "read inter-arrival times",
    "syscall I/O",
    "KS",
    1.0,
    (SHIFT, COUNT),
    ("request rate", "burstiness", "parallelism of readers", "uniform speed-up"),
)
def read_interarrival(real: RunProfile, emulated: RunProfile) -> Outcome:
    """KS similarity of the gaps between read completions (thousands of values), in ms."""
    a, b = real.read_gaps_ns, emulated.read_gaps_ns
    missing = one_sided(len(a) > 0, len(b) > 0, "two or more reads")
    if missing:
        return missing
    score = ks_similarity(a, b)
    details = {
        "ks_statistic": 1.0 - score,
        "ks_noise_95": ks_noise(len(a), len(b)),
        **sample_details(a, b, 1e-6, "ms"),
    }
    return Outcome(score, details, quantile_plot(a, b, 1e-6, "ms"))
