"""What an aspect is: its spec (what it compares, how, its weight, its invariances) and its scorer,
defined together with :func:`aspect`; and the rules for missing data all aspects share.

Example::

    @aspect("read_sizes", "read request sizes", "syscall I/O", "JS", 2.0,
            invariant_to=(SHIFT, SPEED, COUNT), sensitive_to=("share of requests per size",))
    def read_sizes(real: RunProfile, emulated: RunProfile) -> Outcome:
        ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from analysis.similarity.profile import RunProfile

#: The vocabulary of invariances, shared by the aspects' specs.
SHIFT = "time shift"
SPEED = "uniform speed-up"
SCALE = "absolute scale"
COUNT = "number of requests"
JITTER = "burst timing jitter"

#: Quantiles kept per run for plotting distributions (the score uses every value).
N_QUANTILES = 101


class Outcome(NamedTuple):
    """What a scorer found: the score (None when skipped), the evidence (``details``), what the
    report draws (``plot``) and, when skipped, why."""

    score: float | None
    details: dict[str, Any]
    plot: dict[str, Any]
    skipped: str | None = None


Scorer = Callable[[RunProfile, RunProfile], Outcome]


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


@dataclasses.dataclass(frozen=True)
class Aspect(AspectSpec):
    """An aspect as one unit: its spec and the function that scores two run profiles."""

    scorer: Scorer = dataclasses.field(repr=False, compare=False)

    def __call__(self, real: RunProfile, emulated: RunProfile) -> Outcome:
        return self.scorer(real, emulated)


def aspect(
    name: str,
    title: str,
    resource: str,
    measure: str,
    weight: float,
    invariant_to: tuple[str, ...],
    sensitive_to: tuple[str, ...],
) -> Callable[[Scorer], Aspect]:
    """Decorator: the scorer below becomes an :class:`Aspect` with this spec."""

    def make(scorer: Scorer) -> Aspect:
        return Aspect(name, title, resource, measure, weight, invariant_to, sensitive_to, scorer)

    return make


# ---------------------------------------------------------------------------------------------
# Missing data: the general rule of docs/similarity.md


def one_sided(
    has_real: bool,
    has_emulated: bool,
    what: str,
    extra: Mapping[str, Any] | None = None,
    both: bool = False,
) -> Outcome | None:
    """The outcome when a run lacks ``what`` (None when both have it): skipped when neither has
    it, else 0 with the run lacking it named (``details.missing_in``); with ``both``, skipped
    whenever one lacks it (phases whose logging is a matter of instrumentation). ``extra`` is
    appended to the details."""
    if has_real and has_emulated:
        return None
    if not has_real and not has_emulated:
        return Outcome(None, {**(extra or {})}, {}, f"neither run has {what}")
    lacking = "real" if not has_real else "emulated"
    if both:
        return Outcome(
            None, {"missing_in": lacking}, {}, f"only one run has {what} (the {lacking} lacks it)"
        )
    present = "emulated" if lacking == "real" else "real"
    details = {"missing_in": lacking, "note": f"only the {present} run has {what}", **(extra or {})}
    return Outcome(0.0, details, {})


# ---------------------------------------------------------------------------------------------
# Distributions


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


def quantile_plot(a: np.ndarray, b: np.ndarray, unit_scale: float, unit: str) -> dict[str, Any]:
    """The report's empirical CDFs of two samples, in ``unit`` (values times ``unit_scale``)."""
    xa, fa = ecdf_points(a)
    xb, fb = ecdf_points(b)
    return {
        "kind": "quantiles",
        "unit": unit,
        "real": (xa * unit_scale, fa),
        "emulated": (xb * unit_scale, fb),
    }


def sample_details(a: np.ndarray, b: np.ndarray, unit_scale: float, unit: str) -> dict[str, Any]:
    """Evidence about two samples: their medians (in ``unit``), the ratio, their sizes."""
    median_a, median_b = float(np.median(a)) * unit_scale, float(np.median(b)) * unit_scale
    return {
        f"median_{unit}_real": median_a,
        f"median_{unit}_emulated": median_b,
        "median_ratio": median_b / median_a if median_a else None,
        "n_real": len(a),
        "n_emulated": len(b),
    }


# ---------------------------------------------------------------------------------------------
# Time series channels


SeriesPair = tuple[np.ndarray | None, np.ndarray | None]
PairScorer = Callable[[str, np.ndarray, np.ndarray], tuple[float, dict[str, Any]]]


def channels_outcome(
    real: RunProfile,
    emulated: RunProfile,
    channels: Mapping[str, str],
    score_pair: PairScorer,
    plot: Mapping[str, Any],
) -> Outcome:
    """The mean over ``channels`` (label -> profile series name) that either run has of
    ``score_pair(label, real series, emulated series)`` -> (score, details); a channel only one
    run has scores 0 (``<label>_missing_in`` names the other). Skipped when neither run has
    any. The report draws the pairs as ``plot`` with ``channels``: label -> (real, emulated)."""
    pairs = {
        label: (real.series.get(key), emulated.series.get(key)) for label, key in channels.items()
    }
    present = {k: v for k, v in pairs.items() if v[0] is not None or v[1] is not None}
    if not present:
        return Outcome(None, {}, {}, f"neither run has {' or '.join(channels)} data")
    details: dict[str, Any] = {}
    scores = []
    for label, (a, b) in present.items():
        if a is None or b is None:
            scores.append(0.0)
            details[f"{label.replace(' ', '_')}_missing_in"] = "real" if a is None else "emulated"
        else:
            score, more = score_pair(label, a, b)
            scores.append(score)
            details.update(more)
    return Outcome(float(np.mean(scores)), details, {**plot, "channels": present})
