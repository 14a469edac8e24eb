"""Similarity measures: each maps two summaries of runs to a similarity in [0, 1] (1: alike).

Each is an established measure from a maintained library (scipy, dtaidistance), wrapped so that
it is symmetric, exactly 1 for identical inputs and bounded; ``docs/similarity.md`` says why each
was chosen. They know nothing of runs: the aspects (:mod:`analysis.similarity.aspects`) feed them
what a run profile (:mod:`analysis.similarity.profile`) extracted.

Example::

    score, w1 = timing_similarity(bytes_per_bin_a, bytes_per_bin_b)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from dtaidistance import dtw
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy, kendalltau, ks_2samp, wasserstein_distance

#: Sakoe-Chiba band of the DTW, as a fraction of the series length: a burst may move by up to
#: 10 % of the run and still match, but the series cannot be warped end to end.
DTW_WINDOW = 0.1
#: Request sizes are bucketed by powers of two (bucket k holds [2**k, 2**(k+1)) bytes; 0 and 1
#: byte are bucket 0), as bcc's bitesize and biolatency do.
N_SIZE_BUCKETS = 64


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


def log2_buckets(nbytes: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
    """Counts per power-of-two bucket (:data:`N_SIZE_BUCKETS` long, int64) of request sizes.

    Bucket ``k`` holds sizes in ``[2**k, 2**(k+1))``; 0 (an EOF read) and 1 byte are bucket 0.
    ``np.frexp`` gives the exponent exactly, without the rounding of ``log2`` at powers of two.
    ``counts``: the calls each row stands for (the events' ``count``): a row is ``counts``
    requests of ``nbytes / counts`` bytes each. An aggregated row's calls all fall in one
    power-of-two bucket, so their mean size falls in it too and the histogram is exact.
    """
    sizes = np.asarray(nbytes, dtype=np.float64)
    if counts is not None:
        counts = np.asarray(counts, dtype=np.int64)
        sizes = sizes / np.maximum(counts, 1)
    _, exponent = np.frexp(np.maximum(sizes, 1.0))
    histogram = np.bincount(exponent - 1, weights=counts, minlength=N_SIZE_BUCKETS)
    return histogram[:N_SIZE_BUCKETS].astype(np.int64)


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

    ``a`` and ``b`` are amounts per bin over each run's own span (:func:`analysis.series.binned_sum`), so
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
    a: np.ndarray,
    b: np.ndarray,
    total_a: float,
    total_b: float,
    reference: float = 0.0,
    seconds_a: float = 0.0,
    seconds_b: float = 0.0,
    reference_rate: float = 0.0,
) -> tuple[float, dict[str, float]]:
    """Similarity of two runs' activity over time in [0, 1]: the mean of three terms, times a
    fourth.

    - timing: :func:`timing_similarity` (when, on each run's normalised time);
    - volume: :func:`volume_similarity` of the total amounts ``total_a``, ``total_b`` (bytes;
      totals over the whole run, the series only cover its span) on the scale ``reference``;
    - burstiness: :func:`burstiness_similarity` (how concentrated in time);
    - rate, the factor: :func:`volume_similarity` of the mean rates over each run's span (the
      series' sum over ``seconds_a``, ``seconds_b``) on the scale ``reference_rate``: what the
      storage is asked for per second. The same activity at half the rate is half as alike:
      the same bytes moved twice as fast score 0.5.

    Without the spans' lengths (0) there is no rate factor (the mean of three). Returns the
    score and the terms (``timing``, ``timing_w1``, ``volume``, ``rate``, ``rate_real``,
    ``rate_emulated`` (bytes per second), ``burstiness``, ``half_bytes_time_real``,
    ``half_bytes_time_emulated``).
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
    if seconds_a <= 0 or seconds_b <= 0:
        return (timing + volume + burstiness) / 3.0, terms
    rate_a = float(np.sum(a)) / seconds_a
    rate_b = float(np.sum(b)) / seconds_b
    rate = volume_similarity(rate_a, rate_b, reference_rate)
    terms.update(rate=rate, rate_real=rate_a, rate_emulated=rate_b)
    return (timing + volume + burstiness) / 3.0 * rate, terms


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
