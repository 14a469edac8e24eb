"""Application phases: step durations, batch-load durations and checkpoints.

Durations are compared with W1 as a fraction of the runs' step time: a difference that is
small against a step does not change the training run. They need both runs to log the phases
(whether a workload logs ``load_batch_mem`` is a matter of instrumentation, not behaviour).
"""

from __future__ import annotations

import numpy as np

from analysis.similarity.aspects.base import (
    SHIFT,
    Outcome,
    aspect,
    one_sided,
    quantile_plot,
    sample_details,
)
from analysis.similarity.measures import ratio_similarity, relative_wasserstein_similarity
from analysis.similarity.profile import RunProfile

RELATIVE_W1 = "W1 / step"


def step_scale_s(real: RunProfile, emulated: RunProfile) -> float | None:
    """The larger median step time (s) of the two runs; None unless both have steps."""
    if len(real.step_s) and len(emulated.step_s):
        return max(float(np.median(real.step_s)), float(np.median(emulated.step_s)))
    return None


def time_scale_s(step_s: float | None, a: np.ndarray, b: np.ndarray) -> float:
    """The scale durations are compared on: the larger median step time of the two runs, or the
    larger median of the durations themselves when that is longer (or there are no steps)."""
    return max(step_s or 0.0, float(np.median(a)), float(np.median(b)))


def duration_outcome(
    real: RunProfile,
    emulated: RunProfile,
    a: np.ndarray,
    b: np.ndarray,
    what: str,
    unit_scale: float,
    unit: str,
) -> Outcome:
    """Relative-Wasserstein similarity of two samples of durations (seconds), both needed."""
    missing = one_sided(len(a) > 0, len(b) > 0, what, both=True)
    if missing:
        return missing
    step_s = step_scale_s(real, emulated)
    scale = time_scale_s(step_s, a, b)
    score, distance = relative_wasserstein_similarity(a, b, scale)
    details = {
        f"wasserstein_{unit}": distance * unit_scale,
        f"scale_{unit}": scale * unit_scale,
        "scale_is": "median step" if scale == step_s else f"median {what}",
        **sample_details(a, b, unit_scale, unit),
    }
    return Outcome(score, details, quantile_plot(a, b, unit_scale, unit))


@aspect(
    "step_time",
    "step time",
    "phases",
    RELATIVE_W1,
    1.0,
    (SHIFT, "number of steps"),
    ("step durations", "uniform speed-up"),
)
def step_time(real: RunProfile, emulated: RunProfile) -> Outcome:
    return duration_outcome(
        real, emulated, real.step_s, emulated.step_s, "training steps", 1.0, "s"
    )


@aspect(
    "load_time",
    "data-loading time (load_batch_mem)",
    "phases",
    RELATIVE_W1,
    1.0,
    (SHIFT, "number of batches"),
    ("batch load durations, as a fraction of a step", "uniform speed-up"),
)
def load_time(real: RunProfile, emulated: RunProfile) -> Outcome:
    a, b = real.load_batch_s, emulated.load_batch_s
    return duration_outcome(real, emulated, a, b, "load_batch_mem phases", 1e3, "ms")


@aspect(
    "checkpoints",
    "checkpoint bursts",
    "phases",
    "ratios + W1/step",
    1.0,
    (SHIFT,),
    ("number of checkpoints", "bytes written per checkpoint", "checkpoint duration"),
)
def checkpoints(real: RunProfile, emulated: RunProfile) -> Outcome:
    """The mean of: min/max of the counts, min/max of the mean bytes written, W1/step of the
    durations."""
    a, b = real.checkpoints, emulated.checkpoints
    missing = one_sided(len(a) > 0, len(b) > 0, "checkpoint phases")
    if missing:
        return missing
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
        da, db, time_scale_s(step_scale_s(real, emulated), da, db)
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
    return Outcome(float(np.mean(list(terms.values()))), details, plot)
