"""Time bins and binned series, shared by the timeline plot and the similarity scores.

A :class:`Bins` is ``count`` equal bins between two CLOCK_MONOTONIC times in nanoseconds, the
unit of every table of a run (``docs/run-format.md``). Two ways to make one:

- :meth:`Bins.covering`: bins of a round width (:func:`default_bin_s`) aligned on multiples of
  the width since a time origin, covering an extent; the timeline draws rates in them.
- :meth:`Bins.spanning`: a fixed number of bins over a span; the similarity scores resample
  each run over its own span, so bin ``i`` is at the same fraction of both runs.

Which bin a time falls in is decided in integer arithmetic (:meth:`Bins.index`), so it is exact:
a time on an edge goes to the bin that starts there, and a run whose times are all scaled by one
factor (a uniformly faster run) puts every event in the same bin. The end of the last bin
belongs to it (the last event of a run often completes at ``end_ns``).

Every function is vectorised (``np.bincount``): millions of events cost a few milliseconds.

Example::

    bins = Bins.covering(run.start_ns, 0.0, 60.0, default_bin_s(60.0))
    rate = binned_rate(events["ts_ns"], events["bytes"], bins)  # bytes per second, per bin
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import numpy.typing as npt

from core.errors import UserError

#: Refuse bin sizes that would make more bins than this.
MAX_BINS = 200_000

ArrayLike = npt.ArrayLike


@dataclasses.dataclass(frozen=True)
class Bins:
    """``count`` equal bins from ``start_ns`` to ``end_ns`` (ns): bin ``i`` holds the times in
    ``[start + i w, start + (i + 1) w)`` with ``w = (end - start) / count``; ``end`` itself is in
    the last bin."""

    start_ns: int
    end_ns: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or self.end_ns <= self.start_ns:
            raise ValueError(f"bins need count >= 1 and end > start, got {self}")

    @classmethod
    def spanning(cls, start_ns: int, end_ns: int, count: int) -> Bins:
        """``count`` bins over ``[start_ns, end_ns]`` (an empty span counts as 1 ns)."""
        return cls(int(start_ns), max(int(end_ns), int(start_ns) + 1), int(count))

    @classmethod
    def covering(cls, origin_ns: int, t0_s: float, t1_s: float, width_s: float) -> Bins:
        """Bins of ``width_s`` seconds, aligned on multiples of the width since ``origin_ns``,
        covering ``[t0_s, t1_s]`` (seconds since ``origin_ns``).

        The width is rounded to whole nanoseconds. A width that would make more than
        :data:`MAX_BINS` bins is a :class:`UserError` saying which width would do.
        """
        if not width_s > 0 or not math.isfinite(width_s):
            raise UserError(f"bin size must be a positive number of seconds, got {width_s!r}")
        width_ns = round(width_s * 1e9)
        if width_ns < 1:
            raise UserError(f"bin size must be at least 1 ns, got {width_s!r} s")
        first = math.floor(t0_s / width_s)
        count = max(1, math.floor((t1_s - first * width_s) / width_s) + 1)
        if count > MAX_BINS:
            raise UserError(
                f"a bin of {width_s:g} s makes {count:,} bins over {t1_s - t0_s:.1f} s; "
                f"use a bin of at least {(t1_s - t0_s) / MAX_BINS:.3g} s (or omit it for the "
                "default)"
            )
        start = int(origin_ns) + first * width_ns
        return cls(start, start + count * width_ns, count)

    @property
    def width_ns(self) -> float:
        """The width of a bin in nanoseconds (a whole number for :meth:`covering` bins)."""
        return (self.end_ns - self.start_ns) / self.count

    @property
    def width_s(self) -> float:
        """The width of a bin in seconds."""
        return self.width_ns / 1e9

    def edges_s(self, origin_ns: int) -> np.ndarray:
        """The ``count + 1`` bin edges in seconds since ``origin_ns``."""
        return (self.start_ns - int(origin_ns)) / 1e9 + self.width_s * np.arange(self.count + 1)

    def index(self, ts_ns: ArrayLike) -> np.ndarray:
        """The bin of each time (int64), -1 for times outside the bins.

        Exact: ``floor((t - start) * count / (end - start))`` in integers, with the ratio
        reduced first, so that bins of a whole number of nanoseconds divide without any
        multiplication (no overflow whatever the number of bins).
        """
        span = self.end_ns - self.start_ns
        divisor = math.gcd(span, self.count)
        num, den = span // divisor, self.count // divisor
        if span * den >= 2**63:
            raise UserError(
                f"{self.count:,} bins over {span * 1e-9:,.0f} s cannot be computed exactly: "
                "use fewer bins"
            )
        offset = np.asarray(ts_ns, dtype=np.int64) - np.int64(self.start_ns)
        inside = (offset >= 0) & (offset <= span)
        # Clip before multiplying: times far outside cannot overflow, and are dropped anyway.
        idx = np.clip(offset, 0, span) * np.int64(den) // np.int64(num)
        return np.where(inside, np.minimum(idx, self.count - 1), -1)


def default_bin_s(duration_s: float) -> float:
    """A round bin size (1, 2 or 5 times a power of ten) giving ~1000 bins over ``duration_s``.

    A 1-2-5 step is at most 2.5x, so the result always gives between 500 and 2000 bins.
    """
    if not duration_s > 0 or not math.isfinite(duration_s):
        return 1.0
    target = duration_s / 1000.0
    exponent = math.floor(math.log10(target))
    candidates = [m * 10.0**e for e in (exponent - 1, exponent, exponent + 1) for m in (1, 2, 5)]
    # Closest on a log scale, so 1000 bins is the centre of the allowed range.
    return min(candidates, key=lambda c: abs(math.log(c / target)))


def binned_sum(ts_ns: ArrayLike, weights: ArrayLike, bins: Bins) -> np.ndarray:
    """Sum of ``weights`` per bin (float64, ``bins.count`` long); times outside are dropped.

    Each value is attributed to the bin holding its time (for syscalls the completion time,
    as iostat counts a request when it completes).
    """
    return _totals(ts_ns, weights, bins)[0]


def binned_rate(ts_ns: ArrayLike, weights: ArrayLike, bins: Bins) -> np.ndarray:
    """:func:`binned_sum` divided by the bin width: a rate per second."""
    return binned_sum(ts_ns, weights, bins) / bins.width_s


def _totals(
    ts_ns: ArrayLike, values: ArrayLike, bins: Bins, counts: ArrayLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Sum of ``values`` and number of items per bin (``counts`` items per value, else 1)."""
    idx = bins.index(ts_ns)
    inside = idx >= 0
    total = np.bincount(
        idx[inside], weights=np.asarray(values, dtype=np.float64)[inside], minlength=bins.count
    )
    weights = None if counts is None else np.asarray(counts, dtype=np.float64)[inside]
    return total, np.bincount(idx[inside], weights=weights, minlength=bins.count)


def binned_mean(
    ts_ns: ArrayLike, values: ArrayLike, bins: Bins, counts: ArrayLike | None = None
) -> np.ndarray:
    """Mean of ``values`` per bin; NaN where a bin has none (a gap in a plotted line).

    ``counts``: how many items each value is the sum of (the events' ``count``: an aggregated
    row's ``latency_ns`` is the sum over its calls), so the mean is sum(values) / sum(counts)
    per bin, the mean per item.
    """
    total, count = _totals(ts_ns, values, bins, counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def filled_mean(ts_ns: ArrayLike, values: ArrayLike, bins: Bins) -> np.ndarray:
    """Mean of ``values`` per bin, empty bins linearly interpolated from their neighbours.

    For sampled gauges (CPU, memory) compared point by point: a sampler slower than the bins
    gives a smooth line, not a comb; bins before the first sample (after the last) take its
    value. An empty array when no value falls inside the bins.
    """
    total, count = _totals(ts_ns, values, bins)
    have = count > 0
    if not have.any():
        return np.zeros(0)
    centres = np.arange(bins.count, dtype=np.float64)
    return np.interp(centres, centres[have], total[have] / count[have])
