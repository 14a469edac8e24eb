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
container issued. :attr:`Comparison.warnings` flags differences of conditions (page cache,
containers) that lower or blur scores without being differences of the workload.

The package, by concern:

- :mod:`~analysis.similarity.measures`: the distance and score functions (know nothing of runs);
- :mod:`~analysis.similarity.profile`: :func:`run_profile` reduces one run to small summaries
  (fixed-length series, histograms, per-file tables; vectorised, one pass over each column). A
  run of several containers is profiled as a whole (their I/O together, CPU and memory summed);
- :mod:`~analysis.similarity.aspects`: each aspect as one unit, its spec and its scorer,
  registered in report order;
- :mod:`~analysis.similarity.compare`: :func:`compare_profiles` scores two profiles on every
  registered aspect; :func:`compare_runs` profiles two runs and compares them;
- :mod:`~analysis.similarity.results`: :class:`Comparison` and :class:`AspectScore`.

Example::

    comparison = compare_runs(load_run("runs/A"), load_run("runs/B"))
    print(comparison.overall, comparison.to_dict()["aspects"]["read_sizes"]["score"])
"""

from analysis.similarity.aspects import ASPECTS, REGISTERED, Aspect, AspectSpec, Outcome
from analysis.similarity.aspects.activity import ACTIVITY
from analysis.similarity.aspects.base import (
    COUNT,
    JITTER,
    N_QUANTILES,
    SCALE,
    SHIFT,
    SPEED,
    ecdf_points,
)
from analysis.similarity.aspects.files import MAX_RANK_POINTS, TOP_FILES
from analysis.similarity.aspects.phases import RELATIVE_W1
from analysis.similarity.compare import (
    CACHE_STATE_GAP,
    OVERALL_FLOOR,
    compare_profiles,
    compare_runs,
    condition_warnings,
    overall_score,
    page_cache_miss_share,
)
from analysis.similarity.measures import (
    DTW_WINDOW,
    N_SIZE_BUCKETS,
    activity_similarity,
    aligned_shares,
    bin_centres,
    burstiness_similarity,
    dtw_similarity,
    effective_readers,
    half_bytes_time,
    js_similarity,
    ks_noise,
    ks_similarity,
    log2_buckets,
    order_similarity,
    ratio_similarity,
    relative_wasserstein_similarity,
    timing_similarity,
    volume_similarity,
)
from analysis.similarity.profile import (
    N_POINTS,
    RunProfile,
    in_scope,
    reads_in_flight,
    run_profile,
    run_span,
)
from analysis.similarity.results import AspectScore, Comparison, comparison_table

#: The aspects' specs, in report order (each registered aspect is its own spec).
SPECS: tuple[AspectSpec, ...] = REGISTERED

__all__ = [
    "ACTIVITY",
    "ASPECTS",
    "CACHE_STATE_GAP",
    "COUNT",
    "DTW_WINDOW",
    "JITTER",
    "MAX_RANK_POINTS",
    "N_POINTS",
    "N_QUANTILES",
    "N_SIZE_BUCKETS",
    "OVERALL_FLOOR",
    "REGISTERED",
    "RELATIVE_W1",
    "SCALE",
    "SHIFT",
    "SPECS",
    "SPEED",
    "TOP_FILES",
    "Aspect",
    "AspectScore",
    "AspectSpec",
    "Comparison",
    "Outcome",
    "RunProfile",
    "activity_similarity",
    "aligned_shares",
    "bin_centres",
    "burstiness_similarity",
    "compare_profiles",
    "compare_runs",
    "comparison_table",
    "condition_warnings",
    "dtw_similarity",
    "ecdf_points",
    "effective_readers",
    "half_bytes_time",
    "in_scope",
    "js_similarity",
    "ks_noise",
    "ks_similarity",
    "log2_buckets",
    "order_similarity",
    "overall_score",
    "page_cache_miss_share",
    "ratio_similarity",
    "reads_in_flight",
    "relative_wasserstein_similarity",
    "run_profile",
    "run_span",
    "timing_similarity",
    "volume_similarity",
]
