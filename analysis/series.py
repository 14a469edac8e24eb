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

Aggregated syscall rows (``count`` reads or writes of one thread in one row, docs/run-format.md)
are placed as calls: :func:`call_starts` says when a row's calls began, and its ``count`` calls
complete evenly spaced from there to its ``ts_ns`` (:func:`call_times`); :func:`binned_calls`
bins a row's bytes by those completion times, without making a row per call.

Example::

    bins = Bins.covering(run.start_ns, 0.0, 60.0, default_bin_s(60.0))
    rate = binned_rate(events["ts_ns"], events["bytes"], bins)  # bytes per second, per bin
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import numpy.typing as npt
import pandas as pd

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

    def edges_ns(self) -> np.ndarray:
        """The ``count + 1`` bin edges in whole nanoseconds, as :meth:`index` draws them: bin
        ``i`` holds the times ``edges[i] <= t < edges[i + 1]``; the last edge is ``end + 1``
        (``end`` is in the last bin)."""
        span = self.end_ns - self.start_ns
        self.index(np.zeros(0, dtype=np.int64))  # the same overflow check
        divisor = math.gcd(span, self.count)
        num, den = span // divisor, self.count // divisor
        # The first time t with (t - start) * den // num >= i: start + ceil(i * num / den).
        edges = self.start_ns - (-np.arange(self.count + 1, dtype=np.int64) * num // den)
        edges[-1] += 1
        return edges

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


def call_starts(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Per row of ``events`` (sorted by ``ts_ns``), when the calls it stands for began: its
    ``ts_ns`` except for the aggregated rows among ``rows`` (bool mask: the run's reads and
    writes, the kinds the tracer aggregates), whose calls began at the later of

    - the exit of the thread's latest earlier call traced one by one (``count`` 1): the tracer
      prints a thread's first calls of each 10 ms bin one by one and aggregates only the rest
      of the bin, so the aggregated calls come after it;
    - the ``ts_ns`` of the thread's latest earlier aggregated row on another file (``fd`` or
      ``path``): a thread reads its files one after the other;

    so rows of one file in one bin (other size or latency buckets, whose calls interleave)
    share their start, and rows of successive files follow each other. The start is never later
    than ``ts_ns - latency_ns`` (the calls, one after the other, took that long), which is also
    the start when neither exists. Vectorised: running maxima over the rows sorted by thread.
    """
    ts = events["ts_ns"].to_numpy(dtype=np.int64)
    starts = ts.copy()
    if not (events["count"].to_numpy()[rows] > 1).any():
        return starts
    columns = ["ts_ns", "tid", "fd", "path", "count", "latency_ns"]
    rw = events.loc[rows, columns]
    ts, count = ts[rows], rw["count"].to_numpy(dtype=np.int64)
    none = np.iinfo(np.int64).min
    order = np.argsort(rw["tid"].to_numpy(), kind="stable")  # by thread, then by time
    tid, ts_o = rw["tid"].to_numpy()[order], ts[order]
    # The thread's latest call traced one by one, at or before each row.
    single = np.maximum.accumulate(np.where(count[order] == 1, np.arange(len(order)), -1))
    at = np.maximum(single, 0)
    anchor = np.where((single >= 0) & (tid[at] == tid), ts_o[at], none)
    # The aggregated row before the run of the thread's aggregated rows on one file.
    agg = order[count[order] > 1]
    path, fd = pd.factorize(rw["path"].iloc[agg])[0], rw["fd"].to_numpy()[agg]
    tid_a, ts_a = rw["tid"].to_numpy()[agg], ts[agg]
    same = (tid_a[1:] == tid_a[:-1]) & (path[1:] == path[:-1]) & (fd[1:] == fd[:-1])
    first = np.maximum.accumulate(np.where(np.append(True, ~same), np.arange(len(agg)), 0))
    before = np.maximum(first - 1, 0)
    other = np.where((first > 0) & (tid_a[before] == tid_a), ts_a[before], none)
    anchored = np.empty(len(order), dtype=np.int64)
    anchored[order] = anchor
    anchored[agg] = np.maximum(anchored[agg], other)
    latest = ts - np.maximum(rw["latency_ns"].to_numpy(dtype=np.int64), 0)
    mine = np.where(anchored > none, np.minimum(anchored, latest), latest)
    starts[rows] = np.where(count > 1, mine, ts)
    return starts


def call_times(ts_ns: ArrayLike, start_ns: ArrayLike, count: ArrayLike) -> np.ndarray:
    """The completion time of each call of the rows, row after row: a row's ``n = count``
    calls complete at ``start + floor(k (ts - start) / n)`` for ``k = 1..n``, evenly spaced
    after its start, the last at its ``ts_ns`` (a row of one call: at ``ts_ns``). Integer
    arithmetic, so calls evenly spaced in whole nanoseconds come back exactly."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    start = np.asarray(start_ns, dtype=np.int64)
    n = np.maximum(np.asarray(count, dtype=np.int64), 1)
    k = np.arange(1, int(n.sum()) + 1) - np.repeat(np.cumsum(n) - n, n)
    return np.repeat(start, n) + k * np.repeat(ts - start, n) // np.repeat(n, n)


def first_calls(ts_ns: ArrayLike, start_ns: ArrayLike, count: ArrayLike) -> np.ndarray:
    """The completion time of each row's first call (:func:`call_times` with ``k = 1``)."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    start = np.asarray(start_ns, dtype=np.int64)
    return start + (ts - start) // np.maximum(np.asarray(count, dtype=np.int64), 1)


def call_completions(
    ts_ns: np.ndarray, start_ns: np.ndarray, count: np.ndarray, keep: np.ndarray
) -> np.ndarray:
    """The completion times of every call of the rows ``keep`` (:func:`call_times`), sorted:
    one per call, not per row. Rows of one call need no copy of their own beyond ``ts_ns``."""
    folded = keep & (np.asarray(count) > 1)
    if not folded.any():
        return np.asarray(ts_ns)[keep]
    spread = call_times(ts_ns[folded], start_ns[folded], count[folded])
    return np.sort(np.concatenate([ts_ns[keep & ~folded], spread]), kind="stable")


def binned_calls(
    ts_ns: ArrayLike, weights: ArrayLike, bins: Bins, start_ns: ArrayLike, count: ArrayLike
) -> np.ndarray:
    """:func:`binned_sum` with each row's weight shared equally by its ``count`` calls, each
    in the bin of its completion time (:func:`call_times`).

    Exact and without a row per call: per (row, bin it touches), the number of its calls in
    the bin is a difference of two counts ``#{k: start + floor(k span / n) < edge}``, each a
    ceiling division. An aggregated row spans at most a tracer bin (10 ms), so few pieces.
    """
    ts = np.asarray(ts_ns, dtype=np.int64)
    values = np.asarray(weights, dtype=np.float64)
    start = np.asarray(start_ns, dtype=np.int64)
    n = np.asarray(count, dtype=np.int64)
    spread = (n > 1) & (start < ts)
    if not spread.any():
        return binned_sum(ts, values, bins)
    total = binned_sum(ts[~spread], values[~spread], bins)
    first = first_calls(ts, start, n)
    spread &= (ts >= bins.start_ns) & (first <= bins.end_ns)
    if not spread.any():
        return total
    ts, start, n, values, first = (a[spread] for a in (ts, start, n, values, first))
    lo = bins.index(np.clip(first, bins.start_ns, bins.end_ns))
    hi = bins.index(np.clip(ts, bins.start_ns, bins.end_ns))
    pieces = hi - lo + 1
    row = np.repeat(np.arange(len(lo)), pieces)
    at = lo[row] + np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    edges = bins.edges_ns()
    s, span, calls = start[row], (ts - start)[row], n[row]

    def before(edge: np.ndarray) -> np.ndarray:
        """Calls of each piece's row completing before ``edge``: ceil(d n / span) - 1."""
        d = np.clip(edge - s, 0, span + 1)
        return np.clip(-(-d * calls // span) - 1, 0, calls)

    inside = before(edges[at + 1]) - before(edges[at])
    return total + np.bincount(at, weights=values[row] / calls * inside, minlength=bins.count)


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
