"""Trace similarity: does the emulated run stress the storage stack like the real one?

:func:`compare_runs` scores a pair of runs (``docs/run-format.md``) aspect by aspect, each with
an established measure from a maintained library, and combines the scores into one weighted
mean. ``docs/similarity.md`` justifies every measure and weight and says, per aspect, what the
score is invariant to (a time shift, a uniformly faster run, absolute scale) and what it is
sensitive to.

Every aspect score is in [0, 1], is 1 for a run compared with itself, and is symmetric (swapping
the two runs gives the same score). An aspect is skipped, with the reason, when neither run has
its data, and scores 0 when only one has it (the step-time and data-loading aspects need both:
whether a workload logs those phases is a matter of instrumentation, not of behaviour).

Measures are chosen to be robust on real traces, where two runs of one configuration differ
by timing jitter (a burst a few milliseconds later), start-up noise and small samples: activity
over time is compared with the Wasserstein distance between "when did the bytes flow"
distributions (not point by point), durations with a Wasserstein distance relative to the
run's step time (not a Kolmogorov-Smirnov test on ten steps), block I/O only from requests the
container issued. :attr:`Comparison.warnings` flags differences of host state (page cache)
that lower scores without being differences of the workload.

The work is in two steps: :func:`run_profile` reduces one run to small summaries (fixed-length
series, histograms, per-file tables; vectorised, one pass over each column), then
:func:`compare_profiles` scores two profiles. A profile can be reused to compare one run with
several others.

Example::

    comparison = compare_runs(load_run("runs/A"), load_run("runs/B"))
    print(comparison.overall, comparison.to_dict()["aspects"]["read_sizes"]["score"])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from dtaidistance import dtw
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy, kendalltau, ks_2samp, wasserstein_distance

from analysis.timeline import READ_KINDS, WRITE_KINDS, step_intervals
from core.errors import UserError
from core.rundir import Run

#: Points each time series is resampled to over its run's own [start, end].
N_POINTS = 400
#: Sakoe-Chiba band of the DTW, as a fraction of the series length: a burst may move by up to
#: 10 % of the run and still match, but the series cannot be warped end to end.
DTW_WINDOW = 0.1
#: Request sizes are bucketed by powers of two (bucket k holds [2**k, 2**(k+1)) bytes; 0 and 1
#: byte are bucket 0), as bcc's bitesize and biolatency do.
N_SIZE_BUCKETS = 64
#: Quantiles kept per run for plotting distributions (the score uses every value).
N_QUANTILES = 101
#: At most this many files are kept for the per-file plots (the largest by combined share).
TOP_FILES = 30
#: At most this many shared files are kept for the access-order scatter plot.
MAX_RANK_POINTS = 5_000

SHIFT = "time shift"
SPEED = "uniform speed-up"
SCALE = "absolute scale"
COUNT = "number of requests"
JITTER = "burst timing jitter"

#: Measure names shown in tables and lane titles.
ACTIVITY = "W1 time + volume + burstiness"
RELATIVE_W1 = "W1 / step"

#: Warn when the share of bytes read that missed the page cache differs by more than this
#: between the runs (one read mostly from the device, the other mostly from memory). A warning
#: only: no score depends on it.
CACHE_STATE_GAP = 0.5


@dataclasses.dataclass(frozen=True)
class AspectSpec:
    """What one aspect compares, how, and how much it counts in the overall score."""

    name: str
    title: str
    resource: str
    measure: str
    weight: float
    invariant_to: tuple[str, ...]
    sensitive_to: tuple[str, ...]


#: The aspects, in report order. Weights favour the read path and the device (what a training
#: job's input pipeline stresses most); CPU is a cause of I/O timing, not I/O, so it counts half.
SPECS: tuple[AspectSpec, ...] = (
    AspectSpec(
        "read_bandwidth",
        "read bandwidth",
        "syscall I/O",
        ACTIVITY,
        2.0,
        (SHIFT, SPEED, JITTER),
        ("when in the run bytes are read", "bytes read", "burstiness"),
    ),
    AspectSpec(
        "write_bandwidth",
        "write bandwidth",
        "syscall I/O",
        ACTIVITY,
        1.0,
        (SHIFT, SPEED, JITTER),
        ("when in the run bytes are written", "bytes written", "burstiness"),
    ),
    AspectSpec(
        "block_io",
        "block I/O issued by the container (read, write)",
        "block I/O",
        ACTIVITY,
        2.0,
        (SHIFT, SPEED, JITTER, "other processes' and kernel writeback requests"),
        ("when the device reads and writes", "bytes", "page-cache hits (cache state)"),
    ),
    AspectSpec(
        "read_sizes",
        "read request sizes",
        "syscall I/O",
        "JS",
        2.0,
        (SHIFT, SPEED, COUNT),
        ("share of requests per power-of-two size",),
    ),
    AspectSpec(
        "write_sizes",
        "write request sizes",
        "syscall I/O",
        "JS",
        1.0,
        (SHIFT, SPEED, COUNT),
        ("share of requests per power-of-two size",),
    ),
    AspectSpec(
        "read_parallelism",
        "dataset reader threads",
        "syscall I/O",
        "effective readers ratio",
        2.0,
        (SHIFT, SPEED, SCALE, "threads or processes"),
        ("number of threads reading the data", "their shares of the bytes"),
    ),
    AspectSpec(
        "read_interarrival",
        "read inter-arrival times",
        "syscall I/O",
        "KS",
        1.0,
        (SHIFT, COUNT),
        ("request rate", "burstiness", "parallelism of readers", "uniform speed-up"),
    ),
    AspectSpec(
        "file_order",
        "file access order",
        "files",
        "Kendall τ × Jaccard",
        1.0,
        (SHIFT, SPEED, SCALE),
        ("which files are read", "order of first reads (shuffling seed)"),
    ),
    AspectSpec(
        "file_bytes",
        "bytes read per file",
        "files",
        "JS",
        1.0,
        (SHIFT, SPEED, SCALE),
        ("which files are read", "share of bytes per file"),
    ),
    AspectSpec(
        "open_close",
        "open/close pattern",
        "files",
        "JS + count ratio",
        1.0,
        (SHIFT, SPEED),
        ("opens per file", "number of opens"),
    ),
    AspectSpec(
        "cpu",
        "container CPU",
        "CPU",
        "DTW",
        0.5,
        (SHIFT, SPEED),
        ("CPU level (% of one core)", "its shape over the run"),
    ),
    AspectSpec(
        "memory",
        "container memory (rss, page cache)",
        "memory",
        "DTW",
        1.0,
        (SHIFT, SPEED),
        ("memory level (bytes)", "its shape over the run"),
    ),
    AspectSpec(
        "step_time",
        "step time",
        "phases",
        RELATIVE_W1,
        1.0,
        (SHIFT, "number of steps"),
        ("step durations", "uniform speed-up"),
    ),
    AspectSpec(
        "load_time",
        "data-loading time (load_batch_mem)",
        "phases",
        RELATIVE_W1,
        1.0,
        (SHIFT, "number of batches"),
        ("batch load durations, as a fraction of a step", "uniform speed-up"),
    ),
    AspectSpec(
        "checkpoints",
        "checkpoint bursts",
        "phases",
        "ratios + W1/step",
        1.0,
        (SHIFT,),
        ("number of checkpoints", "bytes written per checkpoint", "checkpoint duration"),
    ),
)

#: Aspect names, in report order.
ASPECTS: tuple[str, ...] = tuple(spec.name for spec in SPECS)
_SPEC_BY_NAME: Mapping[str, AspectSpec] = {spec.name: spec for spec in SPECS}


# ---------------------------------------------------------------------------------------------
# Results


@dataclasses.dataclass(frozen=True, eq=False)
class AspectScore:
    """The score of one aspect, the measure used and the evidence behind it.

    ``score`` is None when the aspect was skipped (``skipped`` says why). ``details`` is a short
    JSON-able dict of evidence (totals, medians, distances); ``plot`` holds the arrays the report
    draws (what the measure compared) and is left out of :meth:`Comparison.to_dict`.
    """

    name: str
    title: str
    resource: str
    measure: str
    score: float | None
    weight: float
    details: Mapping[str, Any]
    invariant_to: tuple[str, ...]
    sensitive_to: tuple[str, ...]
    skipped: str | None = None
    plot: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)


@dataclasses.dataclass(frozen=True, eq=False)
class Comparison:
    """The comparison of a real and an emulated run: the weighted mean and every aspect.

    ``warnings``: differences between the runs' conditions (not their workloads) that lower
    some scores, each ending with how to avoid it, e.g. different page-cache states.
    """

    real: str
    emulated: str
    overall: float
    aspects: list[AspectScore]
    warnings: tuple[str, ...] = ()

    def aspect(self, name: str) -> AspectScore:
        """The aspect called ``name`` (one of :data:`ASPECTS`)."""
        for aspect in self.aspects:
            if aspect.name == name:
                return aspect
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict: ``overall``, the run ids, ``warnings`` (list of strings) and
        ``aspects`` mapping name to
        ``{score, measure, resource, weight, invariant_to, sensitive_to, skipped, details}``."""
        return {
            "real": self.real,
            "emulated": self.emulated,
            "overall": self.overall,
            "warnings": list(self.warnings),
            "aspects": {
                a.name: {
                    "score": a.score,
                    "measure": a.measure,
                    "resource": a.resource,
                    "weight": a.weight,
                    "invariant_to": list(a.invariant_to),
                    "sensitive_to": list(a.sensitive_to),
                    "skipped": a.skipped,
                    "details": _jsonable(a.details),
                }
                for a in self.aspects
            },
        }


def comparison_table(comparison: Comparison) -> pd.DataFrame:
    """One row per aspect (aspect, resource, score, measure, weight, note), for printing.

    ``note`` is the skip reason, or empty. Skipped aspects have a null score.
    """
    return pd.DataFrame(
        {
            "aspect": [a.title for a in comparison.aspects],
            "resource": [a.resource for a in comparison.aspects],
            "score": pd.array([a.score for a in comparison.aspects], dtype="Float64"),
            "measure": [a.measure for a in comparison.aspects],
            "weight": [a.weight for a in comparison.aspects],
            "note": [a.skipped or "" for a in comparison.aspects],
        }
    )


def _jsonable(value: Any) -> Any:
    """Plain Python types for json.dumps: numpy scalars and arrays become floats and lists."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating | float):
        return None if not math.isfinite(float(value)) else float(value)
    return value


# ---------------------------------------------------------------------------------------------
# Measures: each maps two summaries to a similarity in [0, 1] (1: identical).


def resample_sum(
    ts_ns: np.ndarray, weights: np.ndarray, span: tuple[int, int], n: int
) -> np.ndarray:
    """Sum of ``weights`` in each of ``n`` equal bins of ``span`` (ns); values outside dropped.

    Each run gets ``n`` bins over its own ``[start, end]``, so a run that does the same thing
    twice as fast, or later on the clock, gives the same bins.
    """
    start, end = span
    t = np.asarray(ts_ns, dtype=np.int64)
    # Subtract in int64: float64 cannot hold boot-relative ns exactly.
    rel = (t - start).astype(np.float64) / float(max(end - start, 1))
    idx = np.floor(rel * n)
    # The end itself (the last event of a run often completes at end_ns) is in the last bin.
    idx[rel == 1.0] = n - 1
    inside = (idx >= 0) & (idx < n)
    return np.bincount(
        idx[inside].astype(np.int64),
        weights=np.asarray(weights, dtype=np.float64)[inside],
        minlength=n,
    )


def resample_mean(
    ts_ns: np.ndarray, values: np.ndarray, span: tuple[int, int], n: int
) -> np.ndarray:
    """Mean of ``values`` in each of ``n`` equal bins of ``span``; empty bins interpolated.

    For sampled gauges (CPU, memory): a bin without a sample takes the linear interpolation of
    its neighbours, so a sampler slower than the bins gives a smooth line, not a comb. Returns
    an empty array when no sample falls inside ``span``.
    """
    total = resample_sum(ts_ns, values, span, n)
    count = resample_sum(ts_ns, np.ones(len(ts_ns)), span, n)
    have = count > 0
    if not have.any():
        return np.zeros(0)
    centres = np.arange(n, dtype=np.float64)
    return np.interp(centres, centres[have], total[have] / count[have])


def dtw_similarity(
    a: np.ndarray, b: np.ndarray, level: bool = False, scale: float | None = None
) -> tuple[float, float]:
    """(similarity, DTW distance) of two non-negative series of equal length.

    ``level=False`` (shape): each series is divided by its L2 norm, so the score ignores
    absolute scale; two non-negative unit vectors are at most sqrt(2) apart, and DTW is at most
    the Euclidean distance (the diagonal is one of its paths), so ``1 - d / sqrt(2)`` is in
    [0, 1]. ``level=True``: both are divided by their common maximum, so a run using twice the
    CPU scores lower; points are then in [0, 1] and ``1 - d / sqrt(n)`` (one minus the RMS
    difference along the warping path) is in [0, 1]. ``scale`` (level mode) replaces the
    common maximum when larger: differences are then fractions of ``scale`` (e.g. of the
    container's whole memory for its page-cache channel). The DTW (dtaidistance, C) uses a
    Sakoe-Chiba band of :data:`DTW_WINDOW` of the length.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if len(a) != len(b) or len(a) == 0:
        raise ValueError("dtw_similarity needs two non-empty series of equal length")
    if level:
        top = max(float(a.max()), float(b.max()), float(scale or 0.0))
        if top <= 0:
            return 1.0, 0.0
        a, b, bound = a / top, b / top, math.sqrt(len(a))
    else:
        na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
        if na == 0 or nb == 0:
            return (1.0, 0.0) if na == nb else (0.0, math.sqrt(2.0))
        a, b, bound = a / na, b / nb, math.sqrt(2.0)
    window = max(1, round(DTW_WINDOW * len(a)))
    # No pruning: dtaidistance prunes with the Euclidean distance as an upper bound and returns
    # inf when the DTW equals it (the diagonal is optimal, e.g. identical sparse spikes). At a
    # few hundred points the full band costs well under a millisecond anyway.
    distance = float(
        dtw.distance_fast(
            np.ascontiguousarray(a), np.ascontiguousarray(b), window=window, use_pruning=False
        )
    )
    return float(np.clip(1.0 - distance / bound, 0.0, 1.0)), distance


def log2_buckets(nbytes: np.ndarray) -> np.ndarray:
    """Counts per power-of-two bucket (:data:`N_SIZE_BUCKETS` long) of byte sizes.

    Bucket ``k`` holds sizes in ``[2**k, 2**(k+1))``; 0 (an EOF read) and 1 byte are bucket 0.
    ``np.frexp`` gives the exponent exactly, without the rounding of ``log2`` at powers of two.
    """
    sizes = np.maximum(np.asarray(nbytes, dtype=np.float64), 1.0)
    _, exponent = np.frexp(sizes)
    return np.bincount(exponent - 1, minlength=N_SIZE_BUCKETS)[:N_SIZE_BUCKETS]


def js_similarity(p: np.ndarray, q: np.ndarray) -> float:
    """``1 -`` the Jensen-Shannon distance (base 2, so in [0, 1]) of two count vectors.

    The vectors are normalised to sum 1 (scipy does this), so only the shares matter. Two
    empty vectors are identical (1); one empty vector shares nothing (0).
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    sp, sq = p.sum(), q.sum()
    if sp == 0 or sq == 0:
        return 1.0 if sp == sq else 0.0
    distance = float(jensenshannon(p, q, base=2))
    return float(np.clip(1.0 - distance, 0.0, 1.0))


def ks_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """``1 -`` the two-sample Kolmogorov-Smirnov statistic (largest gap between the two
    empirical CDFs; scipy.stats.ks_2samp), in [0, 1]. Needs one value in each sample."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError("ks_similarity needs at least one value in each sample")
    statistic = float(ks_2samp(a, b, method="asymp").statistic)
    return float(np.clip(1.0 - statistic, 0.0, 1.0))


def bin_centres(n: int) -> np.ndarray:
    """Centres of ``n`` equal bins of [0, 1]: the normalised time of each resampled point."""
    return (np.arange(n, dtype=np.float64) + 0.5) / n


def timing_similarity(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(``1 - W1``, ``W1``): when did the bytes flow, compared as distributions over the run.

    ``a`` and ``b`` are amounts per bin over each run's own span (:func:`resample_sum`), so
    bin ``i`` is at normalised time ``(i + 0.5) / n`` in both. W1 is the 1-D Wasserstein
    (earth mover's) distance between the two byte-weighted distributions of normalised time
    (``scipy.stats.wasserstein_distance``): the fraction of the run by which the bytes would
    have to be moved, on average, to make one profile the other. It lies in [0, 1] because
    both live in [0, 1], equals the area between the two cumulative curves, and moves by only
    ``d / n`` when a burst moves by ``d`` bins (a point-by-point or DTW distance of spiky
    series jumps to its maximum). Needs both series non-empty with a positive sum.
    """
    a, b = _positive_pair(a, b, "timing_similarity")
    x = bin_centres(len(a))
    distance = float(wasserstein_distance(x, x, a, b))
    return float(np.clip(1.0 - distance, 0.0, 1.0)), distance


def burstiness_similarity(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(``1 - 2 W1``, ``W1``) of the two runs' bins sorted busiest first: how concentrated.

    Sorting each run's bins from busiest to idlest removes *when* and keeps *how*: the
    cumulative curve of the sorted bins is the Lorenz curve of the run's activity (the share of
    its bytes carried by its busiest x % of time). W1 between the two sorted profiles, as in
    :func:`timing_similarity`, is the area between the two Lorenz curves; it is at most 1/2
    (all bytes in one bin against a perfectly steady stream), hence ``1 - 2 W1`` in [0, 1].
    A steady stream against bursts active a fraction ``d`` of the time scores ``d``; bursts
    active ``d1`` and ``d2`` of the time score ``1 - |d1 - d2|``. Moving or splitting a burst
    between bins changes the score by about ``1 / n``.
    """
    a, b = _positive_pair(a, b, "burstiness_similarity")
    x = bin_centres(len(a))
    distance = float(wasserstein_distance(x, x, np.sort(a)[::-1], np.sort(b)[::-1]))
    return float(np.clip(1.0 - 2.0 * distance, 0.0, 1.0)), distance


def half_bytes_time(series: np.ndarray) -> float:
    """Fraction of the run's time (its busiest bins) that carries half of its bytes.

    0.5 for a steady stream; about 1/n when one bin carries half. Evidence for
    :func:`burstiness_similarity`.
    """
    shares = np.cumsum(np.sort(np.asarray(series, dtype=np.float64))[::-1])
    return float((np.searchsorted(shares, shares[-1] / 2) + 1) / len(shares))


def _positive_pair(a: np.ndarray, b: np.ndarray, who: str) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if len(a) != len(b) or len(a) == 0 or not (a.sum() > 0 and b.sum() > 0):
        raise ValueError(f"{who} needs two series of equal length with positive sums")
    return a, b


def volume_similarity(a: float, b: float, reference: float = 0.0) -> float:
    """``1 - |a - b| / max(a, b, reference)`` of two non-negative amounts.

    Without ``reference`` (or when it is smaller than both) this is :func:`ratio_similarity`,
    ``min / max``. A larger ``reference`` judges the difference on that scale instead: block
    traffic of 1 MiB against 8 MiB while the application read 215 MiB is a difference of 3 %
    of the I/O, not a factor of 8.
    """
    top = max(float(a), float(b), float(reference))
    if a == b:
        return 1.0
    return float(np.clip(1.0 - abs(float(a) - float(b)) / top, 0.0, 1.0))


def activity_similarity(
    a: np.ndarray, b: np.ndarray, total_a: float, total_b: float, reference: float = 0.0
) -> tuple[float, dict[str, float]]:
    """Similarity of two runs' activity over time: the mean of three terms in [0, 1].

    - timing: :func:`timing_similarity` (when, on each run's normalised time);
    - volume: :func:`volume_similarity` of the total amounts ``total_a``, ``total_b`` (bytes;
      totals over the whole run, the series only cover its span) on the scale ``reference``;
    - burstiness: :func:`burstiness_similarity` (how concentrated in time).

    Returns the score and the terms (``timing``, ``timing_w1``, ``volume``, ``burstiness``,
    ``half_bytes_time_real``, ``half_bytes_time_emulated``).
    """
    timing, w1 = timing_similarity(a, b)
    burstiness, _ = burstiness_similarity(a, b)
    volume = volume_similarity(total_a, total_b, reference)
    terms = {
        "timing": timing,
        "timing_w1": w1,
        "volume": volume,
        "burstiness": burstiness,
        "half_bytes_time_real": half_bytes_time(a),
        "half_bytes_time_emulated": half_bytes_time(b),
    }
    return (timing + volume + burstiness) / 3.0, terms


def relative_wasserstein_similarity(
    a: np.ndarray, b: np.ndarray, scale: float
) -> tuple[float, float]:
    """(``max(0, 1 - W1 / scale)``, ``W1``) of two samples of durations (same unit as scale).

    W1 (``scipy.stats.wasserstein_distance``) is the mean absolute difference between matched
    quantiles: the typical difference between a duration of one run and its counterpart in the
    other, in the unit of the samples, whatever their sizes (ten steps each, or 10 and 12). It
    moves smoothly with the data where the Kolmogorov-Smirnov statistic of ten values jumps in
    steps of 0.1 at ties of negligible size. Dividing by ``scale`` (the run's time scale, e.g.
    its median step) makes it a fraction: a difference of 0.5 ms in 840 ms steps scores 0.9994.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if len(a) == 0 or len(b) == 0:
        raise ValueError("relative_wasserstein_similarity needs a value in each sample")
    distance = float(wasserstein_distance(a, b))
    if distance == 0.0:
        return 1.0, 0.0
    if not scale > 0:
        return 0.0, distance
    return float(np.clip(1.0 - distance / scale, 0.0, 1.0)), distance


def ks_noise(n: int, m: int) -> float:
    """KS statistic that two samples of sizes ``n`` and ``m`` from one distribution exceed
    with probability 5 % (the asymptotic critical value ``1.358 sqrt((n + m) / (n m))``).

    Evidence for :func:`ks_similarity`: a statistic below it is sampling noise.
    """
    return float(1.358 * math.sqrt((n + m) / (n * m))) if n and m else float("nan")


def ratio_similarity(a: float, b: float) -> float:
    """``min / max`` of two non-negative amounts: 1 when equal, 0 when one is zero."""
    if a == b:
        return 1.0
    return float(min(a, b) / max(a, b))


def order_similarity(files_a: pd.Index, files_b: pd.Index) -> tuple[float, dict[str, Any]]:
    """Similarity of two file-access orders, each an index of paths in first-access order.

    Score = Jaccard index of the two file sets x max(0, Kendall's tau-b) of the first-access
    ranks of the shared files: 1 when the same files are first read in the same order; a
    reversed or unrelated (independently shuffled) order gives ~0. Returns the score and the
    evidence (``jaccard``, ``kendall_tau``, ``shared``, ``only_real``, ``only_emulated``) with
    the shared files' ranks under ``ranks`` (for plots).
    """
    pos_in_b = files_b.get_indexer(files_a)
    shared = pos_in_b >= 0
    n_shared = int(shared.sum())
    union = len(files_a) + len(files_b) - n_shared
    jaccard = n_shared / union if union else 1.0
    rank_a = np.flatnonzero(shared)
    rank_b = pos_in_b[shared]
    if n_shared >= 2:
        tau = float(kendalltau(rank_a, rank_b).statistic)
    else:
        tau = 1.0 if n_shared == 1 else 0.0  # one shared file has no order to disagree on
    details = {
        "jaccard": jaccard,
        "kendall_tau": tau,
        "shared": n_shared,
        "only_real": len(files_a) - n_shared,
        "only_emulated": len(files_b) - n_shared,
        "ranks": (rank_a, rank_b),
    }
    return float(jaccard * max(0.0, tau)), details


def aligned_shares(a: pd.Series, b: pd.Series) -> tuple[pd.Index, np.ndarray, np.ndarray]:
    """The union of two per-file Series' indexes and both value vectors over it (0 if absent)."""
    union = a.index.union(b.index, sort=False)
    va = a.reindex(union, fill_value=0).to_numpy(dtype=np.float64)
    vb = b.reindex(union, fill_value=0).to_numpy(dtype=np.float64)
    return union, va, vb


# ---------------------------------------------------------------------------------------------
# Profiles: one pass over a run, everything the measures need, small except the gaps.


@dataclasses.dataclass(frozen=True, eq=False)
class RunProfile:
    """A run reduced to what :func:`compare_profiles` needs.

    ``series``: name -> :data:`N_POINTS`-long array over the run's [start, end] (bytes per bin
    for I/O, mean per bin for samples); absent when the run has no such data inside its span.
    Block series and totals (``block_read``, ``block_write``) count only requests the container
    issued (``in_container``); ``totals["block_<kind>_other_bytes"]`` holds the rest
    (other processes on the device, kernel writeback), which is evidence only. ``read_gaps_ns``:
    every read inter-arrival time. ``files_read``: bytes read per path (non-empty reads), in
    first-read order; ``opens``: successful opens per path; ``readers``: bytes of those reads
    per thread id; all three limited to ``file_scope``. Durations are seconds.
    """

    run_id: str
    span: tuple[int, int]
    points: int
    series: Mapping[str, np.ndarray]
    totals: Mapping[str, float]
    read_sizes: np.ndarray
    write_sizes: np.ndarray
    read_gaps_ns: np.ndarray
    files_read: pd.Series
    opens: pd.Series
    readers: pd.Series
    step_s: np.ndarray
    load_batch_s: np.ndarray
    checkpoints: pd.DataFrame
    file_scope: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float:
        return (self.span[1] - self.span[0]) * 1e-9


def run_span(run: Run) -> tuple[int, int]:
    """The stretch of the run its time series cover, ``(start_ns, end_ns)``.

    The workload's own activity when it logged phases: from its first MLLOG event to the end of
    its last, so that what happens before (container start, interpreter and torch imports:
    seconds on a short run) and after (exit, teardown) does not shift one run's timeline against
    the other's. Otherwise (a traced user container) ``[start_ns, end_ns]`` from the manifest,
    else the extent of the run's data (an interrupted run ends at its last event, sample or
    phase).
    """
    if len(run.phases):
        start = int(run.phases["ts_ns"].min())
        return start, max(int(run.phases["end_ns"].max()), start + 1)
    lows: list[int] = []
    highs: list[int] = []
    for frame in (run.events, run.samples):
        if len(frame):
            lows.append(int(frame["ts_ns"].min()))
            highs.append(int(frame["ts_ns"].max()))
    start = run.start_ns if run.start_ns is not None else min(lows, default=0)
    end = run.end_ns if run.end_ns is not None else max(highs, default=start)
    return start, max(end, start + 1)


class _KindMask:
    """Boolean row masks for sets of event kinds, from the category codes (no string compares)."""

    def __init__(self, kind: pd.Series) -> None:
        kind = kind.astype("category") if not isinstance(kind.dtype, pd.CategoricalDtype) else kind
        self._codes = kind.cat.codes.to_numpy()
        self._categories = kind.cat.categories.astype(str)

    def __call__(self, kinds: Sequence[str]) -> np.ndarray:
        # Code -1 (a null kind) indexes the appended False.
        lookup = np.append(np.isin(self._categories, list(kinds)), False)
        return lookup[self._codes]


def _per_path(paths: pd.Series, weights: np.ndarray | None = None) -> pd.Series:
    """Sum of ``weights`` (or count) per path, indexed by path in order of first appearance.

    ``pd.factorize`` numbers paths in order of appearance (rows are sorted by time, so this is
    first-access order) through pyarrow's hash table: no per-row Python.
    """
    codes, uniques = pd.factorize(paths, use_na_sentinel=True)
    keep = codes >= 0
    sums = np.bincount(
        codes[keep], weights=None if weights is None else weights[keep], minlength=len(uniques)
    )
    return pd.Series(sums, index=pd.Index(uniques, dtype="string", name="path"))


def _reader_bytes(tids: np.ndarray, weights: np.ndarray) -> pd.Series:
    """Bytes read per thread id (index), largest first."""
    codes, uniques = pd.factorize(tids)
    sums = np.bincount(codes, weights=weights, minlength=len(uniques))
    return pd.Series(sums, index=pd.Index(uniques, name="tid")).sort_values(ascending=False)


def effective_readers(bytes_per_reader: np.ndarray) -> float:
    """The effective number of readers: ``exp`` of the entropy of the readers' byte shares.

    The Hill number of order 1 (the perplexity of the shares): ``k`` threads reading equal
    shares give ``k``; a thread that reads a small share adds little (one reader of 99 % and
    one of 1 % give 1.06). 0 without bytes.
    """
    weights = np.asarray(bytes_per_reader, dtype=np.float64)
    if not weights.sum() > 0:
        return 0.0
    return float(np.exp(entropy(weights)))


def reads_in_flight(end_ns: np.ndarray, latency_ns: np.ndarray, weights: np.ndarray) -> float:
    """Byte-weighted mean number of reads in flight (itself included) when each read ends.

    A read is in flight from ``end - latency`` to ``end``; the count at ``t`` is the number of
    starts at or before ``t`` minus the ends before it (two ``searchsorted``). Evidence of the
    queue depth the storage saw; 0 without reads. ``end_ns`` must be sorted.
    """
    if len(end_ns) == 0 or not weights.sum() > 0:
        return 0.0
    starts = np.sort(end_ns - np.maximum(latency_ns, 0))
    depth = np.searchsorted(starts, end_ns, side="right") - np.searchsorted(
        end_ns, end_ns, side="left"
    )
    return float(np.average(depth, weights=weights))


def data_mounts(run: Run) -> tuple[str, ...]:
    """Container paths of the run's read-only mounts (the dataset), from ``manifest.trace``."""
    mounts = (run.manifest.get("trace") or {}).get("mounts") or []
    return tuple(
        sorted(
            {
                str(m["target"]).rstrip("/") or "/"
                for m in mounts
                if isinstance(m, Mapping) and m.get("read_only") and m.get("target")
            }
        )
    )


def in_scope(paths: pd.Index, scope: Sequence[str]) -> np.ndarray:
    """Which ``paths`` lie under one of the directories ``scope`` (all when it is empty)."""
    if not scope:
        return np.ones(len(paths), dtype=bool)
    prefixes = tuple(d if d.endswith("/") else d + "/" for d in scope)
    values = pd.Series(paths, dtype="string")
    under = values.str.startswith(prefixes) | values.isin([d.rstrip("/") for d in scope])
    return under.to_numpy(dtype=bool, na_value=False)


def run_profile(run: Run, points: int = N_POINTS, file_scope: Sequence[str] = ()) -> RunProfile:
    """Reduce ``run`` to the summaries the comparison needs (see :class:`RunProfile`).

    ``file_scope``: directories whose files the per-file tables keep (all files when empty);
    the per-file work is done on the distinct paths, so the filter costs nothing per event.

    Vectorised over the events: kind masks from category codes, ``np.bincount`` for bins and
    histograms, ``pd.factorize`` for paths. Time series use only rows inside the run's span
    (the sampler runs a little before the release and after the exit); the distributions and
    per-file tables use every row.
    """
    if points < 2:
        raise UserError(f"a comparison needs at least 2 points per series, got {points}")
    span = run_span(run)
    events = run.events
    ts = events["ts_ns"].to_numpy()
    if not events["ts_ns"].is_monotonic_increasing:  # the format says sorted; do not rely on it
        order = np.argsort(ts, kind="stable")
        events = events.iloc[order].reset_index(drop=True)
        ts = events["ts_ns"].to_numpy()
    mask = _KindMask(events["kind"])
    nbytes = events["bytes"].to_numpy()
    ok = events["ret"].to_numpy() >= 0
    # The block tables cover the whole device: on a shared machine, other jobs' requests (GBs)
    # would swamp the container's. Kernel writeback of the container's own writes is not
    # attributable either (issued by kernel threads), so only the container's requests count.
    own = events["in_container"].to_numpy(dtype=bool, na_value=False)

    series: dict[str, np.ndarray] = {}
    totals: dict[str, float] = {}
    groups = {
        "read": mask(READ_KINDS),
        "write": mask(WRITE_KINDS),
        "block_read": mask(("block_read",)),
        "block_write": mask(("block_write",)),
    }
    for name in ("block_read", "block_write"):
        totals[f"{name}_other_bytes"] = float(nbytes[groups[name] & ~own].sum())
        groups[name] &= own
    for name, rows in groups.items():
        totals[f"{name}_bytes"] = float(nbytes[rows].sum())
        totals[f"{name}_count"] = float(rows.sum())
        if totals[f"{name}_bytes"] > 0:
            binned = resample_sum(ts[rows], nbytes[rows], span, points)
            if binned.sum() > 0:  # not all of it outside the span
                series[name] = binned
    # Page-cache inserts (misses) in the container's context: with the bytes read, evidence
    # of the cache state the run started with (see compare_profiles' warnings).
    totals["cache_add_bytes"] = float(nbytes[mask(("cache_add",))].sum())

    samples = run.samples
    metric = samples["metric"]
    for name, metric_name in (
        ("cpu", "container_cpu"),
        ("mem_rss", "container_mem_rss"),
        ("mem_cache", "container_mem_cache"),
    ):
        rows = metric.eq(metric_name).to_numpy(dtype=bool, na_value=False)
        if rows.any():
            values = resample_mean(
                samples["ts_ns"].to_numpy()[rows], samples["value"].to_numpy()[rows], span, points
            )
            if len(values):
                series[name] = values
                totals[f"{name}_mean"] = float(values.mean())

    reads, writes = groups["read"], groups["write"]
    read_ts = ts[reads]
    has_path = events["path"].notna().to_numpy()
    data_reads = reads & ok & (nbytes > 0) & has_path
    is_open = mask(("openat",)) & ok & has_path
    totals["opens"] = float(is_open.sum())
    totals["failed_opens"] = float((mask(("openat",)) & ~ok).sum())
    totals["closes"] = float((mask(("close",)) & ok).sum())

    phases = run.phases
    steps = step_intervals(phases)
    step_s = (
        steps["end_ns"].to_numpy(dtype=np.int64) - steps["ts_ns"].to_numpy(dtype=np.int64)
    ) * 1e-9
    is_interval = phases["kind"].eq("interval").to_numpy(dtype=bool, na_value=False)
    key = phases["key"]
    loads = phases[is_interval & key.eq("load_batch_mem").to_numpy(dtype=bool, na_value=False)]
    ckpt = phases[is_interval & key.eq("checkpoint").to_numpy(dtype=bool, na_value=False)]
    # Paths factorised once (pyarrow hash, first-read order); the scope is decided per
    # distinct path and mapped back to the rows through the codes.
    codes, uniques = pd.factorize(events["path"][data_reads], use_na_sentinel=True)
    data_bytes = nbytes[data_reads].astype(np.float64)
    files_read = pd.Series(
        np.bincount(codes, weights=data_bytes, minlength=len(uniques)),
        index=pd.Index(uniques, dtype="string", name="path"),
    )
    scoped = in_scope(files_read.index, file_scope)
    files_read = files_read[scoped]
    rows = scoped[codes]
    readers = _reader_bytes(events["tid"].to_numpy()[data_reads][rows], data_bytes[rows])
    totals["reads_in_flight"] = reads_in_flight(
        ts[data_reads][rows], events["latency_ns"].to_numpy()[data_reads][rows], data_bytes[rows]
    )
    opens = _per_path(events["path"][is_open])
    opens = opens[in_scope(opens.index, file_scope)]
    return RunProfile(
        run_id=run.run_id,
        span=span,
        points=points,
        series=series,
        totals=totals,
        read_sizes=log2_buckets(nbytes[reads & ok]),
        write_sizes=log2_buckets(nbytes[writes & ok]),
        read_gaps_ns=np.diff(read_ts),
        files_read=files_read,
        opens=opens,
        readers=readers,
        step_s=step_s,
        load_batch_s=loads["duration_ns"].to_numpy(dtype=np.int64) * 1e-9,
        checkpoints=_checkpoint_table(ckpt, ts[writes], nbytes[writes]),
        file_scope=tuple(file_scope),
    )


def _checkpoint_table(
    ckpt: pd.DataFrame, write_ts: np.ndarray, write_bytes: np.ndarray
) -> pd.DataFrame:
    """Per checkpoint interval: its duration (s) and the syscall bytes written during it.

    Bytes written in ``[ts_ns, end_ns]`` are a difference of the cumulative sum at the two
    ``searchsorted`` positions (write times are sorted), so intervals cost O(log n) each.
    """
    cumulative = np.concatenate([[0.0], np.cumsum(write_bytes, dtype=np.float64)])
    lo = np.searchsorted(write_ts, ckpt["ts_ns"].to_numpy(dtype=np.int64), side="left")
    hi = np.searchsorted(write_ts, ckpt["end_ns"].to_numpy(dtype=np.int64), side="right")
    return pd.DataFrame(
        {
            "duration_s": ckpt["duration_ns"].to_numpy(dtype=np.int64) * 1e-9,
            "write_bytes": cumulative[hi] - cumulative[lo],
        }
    )


# ---------------------------------------------------------------------------------------------
# Aspects


def _score(
    name: str,
    score: float | None,
    details: Mapping[str, Any],
    plot: Mapping[str, Any] | None = None,
    skipped: str | None = None,
    weights: Mapping[str, float] | None = None,
) -> AspectScore:
    spec = _SPEC_BY_NAME[name]
    weight = spec.weight if weights is None or name not in weights else float(weights[name])
    return AspectScore(
        name=name,
        title=spec.title,
        resource=spec.resource,
        measure=spec.measure,
        # Rounded to 12 decimals: library float noise (Kendall's tau of identical ranks is
        # 0.9999999999999999) must not stop a run compared with itself from scoring exactly 1.
        score=None if score is None else round(float(score), 12),
        weight=weight,
        details=dict(details),
        invariant_to=spec.invariant_to,
        sensitive_to=spec.sensitive_to,
        skipped=skipped,
        plot=dict(plot or {}),
    )


def _presence(has_real: bool, has_emulated: bool, what: str) -> tuple[str | None, dict[str, Any]]:
    """(skip reason, details) for data that may be missing: the general rule of the module."""
    if not has_real and not has_emulated:
        return f"neither run has {what}", {}
    if not has_real:
        return None, {"missing_in": "real", "note": f"only the emulated run has {what}"}
    if not has_emulated:
        return None, {"missing_in": "emulated", "note": f"only the real run has {what}"}
    return None, {}


def _series_aspect(
    name: str, real: RunProfile, emulated: RunProfile, channels: Mapping[str, str], level: bool
) -> tuple[float | None, dict[str, Any], dict[str, Any], str | None]:
    """Score of time-series channels (channel -> profile series name): the mean of per-channel
    DTW similarities over the channels either run has (0 for one that only one run has).

    In level mode, every channel is scaled by the larger peak of the two runs' channel *sum*
    (for memory: rss + page cache, the container's footprint), so a difference is judged as a
    fraction of the whole: 6 MiB more page cache in a 200 MiB container is a small difference,
    not, as against the channel's own maximum, a large one."""
    present = {
        label: (real.series.get(key), emulated.series.get(key)) for label, key in channels.items()
    }
    present = {k: v for k, v in present.items() if v[0] is not None or v[1] is not None}
    if not present:
        return None, {}, {}, f"neither run has {' or '.join(channels)} data"
    footprint = 0.0
    for profile in (real, emulated):
        parts = [profile.series[k] for k in channels.values() if k in profile.series]
        if parts:
            footprint = max(footprint, float(np.sum(parts, axis=0).max()))
    details: dict[str, Any] = {}
    scores = []
    plot_channels: dict[str, tuple[np.ndarray | None, np.ndarray | None]] = {}
    for label, (a, b) in present.items():
        slug = label.replace(" ", "_")
        if a is None or b is None:
            scores.append(0.0)
            details[f"{slug}_missing_in"] = "real" if a is None else "emulated"
        else:
            score, distance = dtw_similarity(a, b, level=level, scale=footprint)
            scores.append(score)
            details[f"{slug}_score"] = score
            details[f"{slug}_dtw"] = distance
        plot_channels[label] = (a, b)
    plot = {"kind": "series", "level": level, "channels": plot_channels}
    return float(np.mean(scores)), details, plot, None


def _activity_aspect(
    real: RunProfile,
    emulated: RunProfile,
    channels: Mapping[str, str],
    references: Mapping[str, str] | None = None,
) -> tuple[float | None, dict[str, Any], dict[str, Any], str | None]:
    """Score of I/O activity channels (label -> profile series name): the mean over the
    channels either run has of :func:`activity_similarity` (0 for a channel only one run has).

    ``references``: series name -> name of the totals whose larger value of the two runs is the
    scale of that channel's volume term (block reads are judged against the bytes read by
    syscalls: a few MiB of device reads in a run whose data is cached are noise, not a factor).

    The evidence gives, per channel, the three terms, then each run's total bytes and mean
    MiB/s.
    """
    present = {
        label: (real.series.get(key), emulated.series.get(key)) for label, key in channels.items()
    }
    present = {k: v for k, v in present.items() if v[0] is not None or v[1] is not None}
    if not present:
        return None, {}, {}, f"neither run has {' or '.join(channels)} data"
    details: dict[str, Any] = {}
    scores = []
    plot_channels: dict[str, tuple[np.ndarray | None, np.ndarray | None]] = {}
    for label, (a, b) in present.items():
        slug = label.replace(" ", "_")
        if a is None or b is None:
            scores.append(0.0)
            details[f"{slug}_missing_in"] = "real" if a is None else "emulated"
        else:
            key = channels[label]
            ref_key = (references or {}).get(key)
            reference = (
                max(real.totals[f"{ref_key}_bytes"], emulated.totals[f"{ref_key}_bytes"])
                if ref_key
                else 0.0
            )
            score, terms = activity_similarity(
                a, b, real.totals[f"{key}_bytes"], emulated.totals[f"{key}_bytes"], reference
            )
            scores.append(score)
            prefix = f"{slug}_" if len(channels) > 1 else ""
            details.update({f"{prefix}{term}": value for term, value in terms.items()})
        plot_channels[label] = (a, b)
    for key in channels.values():
        for who, profile in (("real", real), ("emulated", emulated)):
            total = profile.totals.get(f"{key}_bytes", 0.0)
            details[f"{key}_bytes_{who}"] = total
            details[f"{key}_mib_s_{who}"] = total / 2**20 / max(profile.duration_s, 1e-9)
    plot = {"kind": "cumulative", "channels": plot_channels}
    return float(np.mean(scores)), details, plot, None


def _size_aspect(a: np.ndarray, b: np.ndarray, what: str) -> tuple[Any, ...]:
    skipped, details = _presence(a.sum() > 0, b.sum() > 0, what)
    if skipped or details:
        return (None if skipped else 0.0), details, {}, skipped
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
    return score, details, plot, None


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


def ecdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) points of the empirical CDF of ``values``, at most :data:`N_QUANTILES` + 1.

    Small samples give every value (a step at each); large ones their quantiles on an even
    grid, which is all a plot can show.
    """
    values = np.asarray(values, dtype=np.float64)
    if len(values) <= N_QUANTILES:
        x = np.sort(values)
        return np.concatenate([x[:1], x]), np.arange(len(x) + 1) / max(len(x), 1)
    q = np.linspace(0, 1, N_QUANTILES)
    return np.quantile(values, q), q


def _both_or_skip(
    a: np.ndarray, b: np.ndarray, what: str, both: bool
) -> tuple[float | None, dict[str, Any], str | None] | None:
    """The outcome for missing samples (None when both runs have some): skipped when neither
    has any, or when ``both`` is required; else 0 with the run lacking them named."""
    if len(a) and len(b):
        return None
    if both:
        if len(a) == 0 and len(b) == 0:
            return None, {}, f"neither run has {what}"
        lacking = "real" if len(a) == 0 else "emulated"
        return None, {"missing_in": lacking}, f"only one run has {what} (the {lacking} lacks it)"
    skipped, details = _presence(len(a) > 0, len(b) > 0, what)
    return (None if skipped else 0.0), details, skipped


def _quantile_plot(a: np.ndarray, b: np.ndarray, unit_scale: float, unit: str) -> dict[str, Any]:
    xa, fa = ecdf_points(a)
    xb, fb = ecdf_points(b)
    return {
        "kind": "quantiles",
        "unit": unit,
        "real": (xa * unit_scale, fa),
        "emulated": (xb * unit_scale, fb),
    }


def _ks_aspect(a: np.ndarray, b: np.ndarray, what: str, unit_scale: float, unit: str) -> Any:
    """KS similarity of two large samples (inter-arrival times: thousands of values)."""
    missing = _both_or_skip(a, b, what, both=False)
    if missing:
        score, details, skipped = missing
        return score, details, {}, skipped
    score = ks_similarity(a, b)
    median_a, median_b = float(np.median(a)) * unit_scale, float(np.median(b)) * unit_scale
    details = {
        "ks_statistic": 1.0 - score,
        "ks_noise_95": ks_noise(len(a), len(b)),
        f"median_{unit}_real": median_a,
        f"median_{unit}_emulated": median_b,
        "median_ratio": median_b / median_a if median_a else None,
        "n_real": len(a),
        "n_emulated": len(b),
    }
    return score, details, _quantile_plot(a, b, unit_scale, unit), None


def _time_scale_s(step_scale_s: float | None, a: np.ndarray, b: np.ndarray) -> float:
    """The scale durations are compared on: the larger median step time of the two runs, or the
    larger median of the durations themselves when that is longer (or there are no steps)."""
    return max(step_scale_s or 0.0, float(np.median(a)), float(np.median(b)))


def _duration_aspect(
    a: np.ndarray,
    b: np.ndarray,
    what: str,
    unit_scale: float,
    unit: str,
    step_scale_s: float | None,
) -> Any:
    """Relative-Wasserstein similarity of two samples of durations (seconds), both needed.

    ``step_scale_s``: the larger median step time of the two runs (None without steps).
    """
    missing = _both_or_skip(a, b, what, both=True)
    if missing:
        score, details, skipped = missing
        return score, details, {}, skipped
    scale = _time_scale_s(step_scale_s, a, b)
    score, distance = relative_wasserstein_similarity(a, b, scale)
    median_a, median_b = float(np.median(a)) * unit_scale, float(np.median(b)) * unit_scale
    details = {
        f"wasserstein_{unit}": distance * unit_scale,
        f"scale_{unit}": scale * unit_scale,
        "scale_is": "median step" if scale == step_scale_s else f"median {what}",
        f"median_{unit}_real": median_a,
        f"median_{unit}_emulated": median_b,
        "median_ratio": median_b / median_a if median_a else None,
        "n_real": len(a),
        "n_emulated": len(b),
    }
    return score, details, _quantile_plot(a, b, unit_scale, unit), None


def _file_order_aspect(real: RunProfile, emulated: RunProfile) -> tuple[Any, ...]:
    a, b = real.files_read.index, emulated.files_read.index
    skipped, details = _presence(len(a) > 0, len(b) > 0, "reads of named files")
    if skipped or details:
        return (None if skipped else 0.0), details, {}, skipped
    score, details = order_similarity(a, b)
    rank_a, rank_b = details.pop("ranks")
    step = max(1, len(rank_a) // MAX_RANK_POINTS)
    plot = {"kind": "ranks", "real": rank_a[::step], "emulated": rank_b[::step]}
    return score, details, plot, None


def _per_file_aspect(
    a: pd.Series, b: pd.Series, what: str, extra: Mapping[str, Any]
) -> tuple[float | None, dict[str, Any], dict[str, Any], str | None]:
    """JS similarity of per-file shares over the union of files (0 when one run has none)."""
    skipped, details = _presence(len(a) > 0, len(b) > 0, what)
    if skipped or details:
        return (None if skipped else 0.0), {**details, **extra}, {}, skipped
    union, va, vb = aligned_shares(a, b)
    score = js_similarity(va, vb)
    pa, pb = va / va.sum(), vb / vb.sum()
    top = np.argsort(-(pa + pb), kind="stable")[:TOP_FILES]
    details = {
        "js_distance": 1.0 - score,
        "files_real": len(a),
        "files_emulated": len(b),
        "files_union": len(union),
        **extra,
    }
    plot = {"kind": "bars", "x": union[top].tolist(), "real": pa[top], "emulated": pb[top]}
    return score, details, plot, None


def _parallelism_aspect(real: RunProfile, emulated: RunProfile) -> tuple[Any, ...]:
    """Ratio of the effective numbers of threads reading the data (files in scope)."""
    a, b = real.readers, emulated.readers
    skipped, details = _presence(len(a) > 0, len(b) > 0, "reads of named files")
    if skipped or details:
        return (None if skipped else 0.0), details, {}, skipped
    eff_a, eff_b = effective_readers(a.to_numpy()), effective_readers(b.to_numpy())
    details = {
        "effective_readers_real": eff_a,
        "effective_readers_emulated": eff_b,
        "reader_threads_real": len(a),
        "reader_threads_emulated": len(b),
        "reads_in_flight_real": real.totals["reads_in_flight"],
        "reads_in_flight_emulated": emulated.totals["reads_in_flight"],
        "file_scope": list(real.file_scope) or "all files",
    }
    # Bars: each run's readers' shares, busiest first (thread ids differ between runs).
    n = max(len(a), len(b))
    plot = {
        "kind": "bars",
        "x": [f"reader {i + 1}" for i in range(n)],
        "real": np.pad(a.to_numpy() / a.sum(), (0, n - len(a))),
        "emulated": np.pad(b.to_numpy() / b.sum(), (0, n - len(b))),
    }
    return ratio_similarity(eff_a, eff_b), details, plot, None


def _checkpoint_aspect(
    real: RunProfile, emulated: RunProfile, step_scale_s: float | None
) -> tuple[Any, ...]:
    a, b = real.checkpoints, emulated.checkpoints
    skipped, details = _presence(len(a) > 0, len(b) > 0, "checkpoint phases")
    if skipped or details:
        return (None if skipped else 0.0), details, {}, skipped
    measures = {
        "checkpoints": (float(len(a)), float(len(b))),
        "MiB per checkpoint": (a["write_bytes"].mean() / 2**20, b["write_bytes"].mean() / 2**20),
        "seconds per checkpoint": (a["duration_s"].mean(), b["duration_s"].mean()),
    }
    terms = {k: ratio_similarity(x, y) for k, (x, y) in list(measures.items())[:2]}
    # A duration, like a step, is compared as a fraction of the run's time scale: 35 ms
    # against 66 ms to write a small checkpoint between 0.84 s steps is noise (a ratio would
    # say 0.53); for checkpoints longer than a step the scale is their own duration.
    da, db = a["duration_s"].to_numpy(), b["duration_s"].to_numpy()
    terms["seconds per checkpoint"] = relative_wasserstein_similarity(
        da, db, _time_scale_s(step_scale_s, da, db)
    )[0]
    details = {
        "count_real": len(a),
        "count_emulated": len(b),
        "mean_write_bytes_real": float(a["write_bytes"].mean()),
        "mean_write_bytes_emulated": float(b["write_bytes"].mean()),
        "mean_duration_s_real": float(a["duration_s"].mean()),
        "mean_duration_s_emulated": float(b["duration_s"].mean()),
        "terms": terms,
    }
    plot = {
        "kind": "pairs",
        "x": list(measures),
        "real": [float(x) for x, _ in measures.values()],
        "emulated": [float(y) for _, y in measures.values()],
    }
    return float(np.mean(list(terms.values()))), details, plot, None


def compare_profiles(
    real: RunProfile, emulated: RunProfile, weights: Mapping[str, float] | None = None
) -> Comparison:
    """Score every aspect of :data:`SPECS` for two profiles and take the weighted mean.

    ``weights`` overrides the default weight of the aspects it names (unknown names are a
    :class:`UserError`). Skipped aspects do not count. Raises :class:`UserError` when every
    aspect is skipped (neither run has any data).
    """
    if weights:
        unknown = sorted(set(weights) - set(ASPECTS))
        if unknown:
            raise UserError(
                f"unknown similarity aspect {unknown[0]!r}: use one of {', '.join(ASPECTS)}"
            )
        if any(not (float(w) >= 0) for w in weights.values()):
            raise UserError("similarity weights must be non-negative numbers")
    if real.points != emulated.points or real.file_scope != emulated.file_scope:
        raise UserError(
            "the two profiles were built with different points or file scopes: build both with "
            "the same (compare_runs does)"
        )
    results: list[AspectScore] = []

    def add(name: str, score: Any, details: Any, plot: Any, skipped: Any) -> None:
        results.append(_score(name, score, details, plot, skipped, weights))

    for name, channels in (
        ("read_bandwidth", {"read": "read"}),
        ("write_bandwidth", {"write": "write"}),
        ("block_io", {"block read": "block_read", "block write": "block_write"}),
    ):
        # The device's traffic is judged against what the application asked for.
        references = {"block_read": "read", "block_write": "write"}
        score, details, plot, skipped = _activity_aspect(real, emulated, channels, references)
        if name == "block_io":
            if skipped:
                skipped = "neither run has block I/O issued by the container"
            for kind in channels.values():
                for who, p in (("real", real), ("emulated", emulated)):
                    details[f"{kind}_not_container_bytes_{who}"] = p.totals[f"{kind}_other_bytes"]
        add(name, score, details, plot, skipped)
    add("read_sizes", *_size_aspect(real.read_sizes, emulated.read_sizes, "reads"))
    add("write_sizes", *_size_aspect(real.write_sizes, emulated.write_sizes, "writes"))
    add("read_parallelism", *_parallelism_aspect(real, emulated))
    add(
        "read_interarrival",
        *_ks_aspect(real.read_gaps_ns, emulated.read_gaps_ns, "two or more reads", 1e-6, "ms"),
    )
    scope = {"file_scope": list(real.file_scope) or "all files"}
    score, details, plot, skipped = _file_order_aspect(real, emulated)
    add("file_order", score, {**details, **scope}, plot, skipped)
    score, details, plot, skipped = _per_file_aspect(
        real.files_read, emulated.files_read, "reads of named files", scope
    )
    add("file_bytes", score, details, plot, skipped)
    # Opens in scope for the score; all opens, closes and failures as evidence.
    opens_a, opens_b = float(real.opens.sum()), float(emulated.opens.sum())
    counts = {
        "opens_real": int(opens_a),
        "opens_emulated": int(opens_b),
        "all_opens_real": int(real.totals["opens"]),
        "all_opens_emulated": int(emulated.totals["opens"]),
        "closes_real": int(real.totals["closes"]),
        "closes_emulated": int(emulated.totals["closes"]),
        "failed_opens_real": int(real.totals["failed_opens"]),
        "failed_opens_emulated": int(emulated.totals["failed_opens"]),
        **scope,
    }
    score, details, plot, skipped = _per_file_aspect(
        real.opens, emulated.opens, "successful opens", counts
    )
    if opens_a > 0 and opens_b > 0:
        count_ratio = ratio_similarity(opens_a, opens_b)
        details["open_count_ratio"] = count_ratio
        score = (score + count_ratio) / 2  # where opens go, and how many there are
    add("open_close", score, details, plot, skipped)
    score, details, plot, skipped = _series_aspect("cpu", real, emulated, {"cpu": "cpu"}, True)
    details.update(
        {
            f"mean_cpu_{w}": p.totals.get("cpu_mean")
            for w, p in (("real", real), ("emulated", emulated))
        }
    )
    add("cpu", score, details, plot, skipped)
    score, details, plot, skipped = _series_aspect(
        "memory", real, emulated, {"rss": "mem_rss", "page cache": "mem_cache"}, True
    )
    for key in ("mem_rss", "mem_cache"):
        for who, p in (("real", real), ("emulated", emulated)):
            details[f"mean_{key}_bytes_{who}"] = p.totals.get(f"{key}_mean")
    add("memory", score, details, plot, skipped)
    # Durations are compared as a fraction of the run's step time (the larger median of the
    # two): a difference that is small against a step does not change the training run.
    step_scale_s = (
        max(float(np.median(real.step_s)), float(np.median(emulated.step_s)))
        if len(real.step_s) and len(emulated.step_s)
        else None
    )
    add(
        "step_time",
        *_duration_aspect(real.step_s, emulated.step_s, "training steps", 1.0, "s", step_scale_s),
    )
    add(
        "load_time",
        *_duration_aspect(
            real.load_batch_s,
            emulated.load_batch_s,
            "load_batch_mem phases",
            1e3,
            "ms",
            step_scale_s,
        ),
    )
    add("checkpoints", *_checkpoint_aspect(real, emulated, step_scale_s))

    scored = [a for a in results if a.score is not None and a.weight > 0]
    if not scored:
        raise UserError(
            f"runs {real.run_id} and {emulated.run_id} have no events, samples or phases to "
            "compare: check that both completed (`./cli.py runs`)"
        )
    total_weight = sum(a.weight for a in scored)
    overall = sum(a.weight * float(a.score) for a in scored) / total_weight  # type: ignore[arg-type]
    return Comparison(
        real.run_id, emulated.run_id, float(overall), results, condition_warnings(real, emulated)
    )


def page_cache_miss_share(profile: RunProfile) -> float | None:
    """Bytes inserted into the page cache (misses, ``cache_add``) per byte read by syscalls,
    at most 1; None without reads. About 1 for a run started with a cold cache (every byte
    read came from the device), near 0 for one whose data was already cached."""
    read = profile.totals.get("read_bytes", 0.0)
    if read <= 0:
        return None
    return min(1.0, profile.totals.get("cache_add_bytes", 0.0) / read)


def condition_warnings(real: RunProfile, emulated: RunProfile) -> tuple[str, ...]:
    """Differences between the runs' host conditions that lower scores (see
    :attr:`Comparison.warnings`): at present, the page-cache state each run started with."""
    warnings: list[str] = []
    miss_a, miss_b = page_cache_miss_share(real), page_cache_miss_share(emulated)
    if miss_a is not None and miss_b is not None and abs(miss_a - miss_b) > CACHE_STATE_GAP:
        warnings.append(
            f"the runs started with different page-cache states (page-cache misses per byte "
            f"read: {miss_a:.2f} real, {miss_b:.2f} emulated), which lowers block I/O, memory "
            "and timing scores: drop the caches before each run "
            "(`sync; echo 3 > /proc/sys/vm/drop_caches` as root)"
        )
    return tuple(warnings)


def compare_runs(
    real: Run,
    emulated: Run,
    points: int = N_POINTS,
    weights: Mapping[str, float] | None = None,
    file_scope: Sequence[str] | None = None,
) -> Comparison:
    """How similarly ``emulated`` stresses the storage stack compared with ``real``.

    ``points``: length of the resampled time series; ``weights``: per-aspect weights replacing
    the defaults of :data:`SPECS`. ``file_scope``: directories the file aspects (access order,
    bytes per file, opens) look at; by default the read-only mounts (the dataset) of the two
    manifests, or every file when neither has one; ``()`` for every file. Library imports
    (thousands of ``.pyc`` files read once at start-up) would otherwise outweigh the dataset.
    See the module doc and ``docs/similarity.md``.
    """
    if file_scope is None:
        file_scope = tuple(sorted(set(data_mounts(real)) | set(data_mounts(emulated))))
    return compare_profiles(
        run_profile(real, points, file_scope), run_profile(emulated, points, file_scope), weights
    )
