"""Fitting sleep profiles from measured compute times (numpy only: used on the host by
``./cli.py profile fit`` and wherever ``profile measure`` runs).

The method is the published one (real-vs-emulated study): a normal distribution per
(accelerators g, batch b) configuration, then ordinary least squares of its mean and of its std
on (g, b) with an intercept. Two problems of the published fits are checked and reported rather
than shipped silently: a poor fit (R^2 below :data:`MIN_R2`) and a std model that goes negative
at a measured configuration. Every measured configuration is also kept as a table point, which
the sleep variant prefers to the linear model (``SleepProfile.compute_params``); with at least
:data:`MIN_QUANTILE_SAMPLES` samples, a point keeps :data:`N_QUANTILES` quantiles of them, from
which the sleep variant draws (the measured distribution, skew included).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from core.errors import UserError
from workloads.profile import Linear, Normal, TablePoint

MIN_R2 = 0.9
#: Quantiles a table point keeps (every 5 %), and the samples it needs to keep them.
N_QUANTILES = 21
MIN_QUANTILE_SAMPLES = 10
#: A compute time this many times its configuration's median is reported as a stall.
STALL_FACTOR = 3.0


@dataclasses.dataclass(frozen=True)
class PointSamples:
    """Compute times (seconds) measured at ``g`` accelerators and batch ``b``."""

    g: int
    b: int
    seconds: np.ndarray


@dataclasses.dataclass(frozen=True)
class Fit:
    """A fitted compute model, its table and its diagnostics."""

    compute: Normal
    table: tuple[TablePoint, ...]
    mean_r2: float | None
    std_r2: float | None
    warnings: tuple[str, ...]

    def info(self) -> dict[str, Any]:
        """The profile's ``fit`` record."""
        return {
            "method": "normal per (g, b); least squares of mean and std on (g, b)",
            "mean_r2": self.mean_r2,
            "std_r2": self.std_r2,
            "warnings": list(self.warnings),
        }


def normal_fit(seconds: np.ndarray) -> tuple[float, float]:
    """Maximum-likelihood normal parameters (mean, std with ddof 0) of a sample."""
    values = np.asarray(seconds, dtype=np.float64)
    if values.size == 0:
        raise UserError("no compute times to fit: give runs with instrumented steps")
    return float(values.mean()), float(values.std())


def linear_fit(g: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[Linear, float | None]:
    """Least squares of ``y`` on (g, b, 1); a term without variation gets coefficient 0.

    Returns the model and its R^2 (None when there are no more points than coefficients, so
    R^2 would say nothing).
    """
    columns, names = [], []
    for name, values in (("g", g), ("b", b)):
        if np.unique(values).size > 1:
            columns.append(values.astype(np.float64))
            names.append(name)
    design = np.column_stack([*columns, np.ones(len(y))])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    fitted = design @ coef
    terms = dict(zip([*names, "const"], (float(c) for c in coef), strict=True))
    model = Linear(g=terms.get("g", 0.0), b=terms.get("b", 0.0), const=terms["const"])
    if len(y) <= design.shape[1]:
        return model, None
    total = float(((y - y.mean()) ** 2).sum())
    residual = float(((y - fitted) ** 2).sum())
    return model, (1.0 - residual / total) if total > 0 else 1.0


def stall_warning(point: PointSamples) -> str | None:
    """A warning when compute times of ``point`` exceed :data:`STALL_FACTOR` times their
    median: a machine busy with other work (or paused) while the runs were measured stretches
    single steps by seconds, and a profile drawn from those times reproduces the stalls."""
    seconds = np.asarray(point.seconds, dtype=np.float64)
    if seconds.size < MIN_QUANTILE_SAMPLES:
        return None
    median = float(np.median(seconds))
    stalls = seconds[seconds > STALL_FACTOR * median]
    if not stalls.size:
        return None
    return (
        f"g={point.g} b={point.b}: {stalls.size} of {seconds.size} compute times exceed "
        f"{STALL_FACTOR:g}x the median ({stalls.max():.3f} s against {median:.3f} s): the "
        "machine likely stalled while the runs were measured, and emulated steps will draw "
        "those stalls; measure again on an otherwise idle machine"
    )


def fit_points(points: Sequence[PointSamples]) -> Fit:
    """Fit the compute model to measured points (see the module doc)."""
    if not points:
        raise UserError("no measured configurations to fit: give at least one run or batch size")
    table = []
    for p in sorted(points, key=lambda p: (p.g, p.b)):
        mean, std = normal_fit(p.seconds)
        n = int(np.size(p.seconds))
        quantiles = None
        if n >= MIN_QUANTILE_SAMPLES:
            levels = np.linspace(0.0, 1.0, N_QUANTILES)
            quantiles = tuple(float(q) for q in np.quantile(p.seconds, levels))
        table.append(TablePoint(g=p.g, b=p.b, mean=mean, std=std, n=n, quantiles=quantiles))
    g = np.array([t.g for t in table])
    b = np.array([t.b for t in table])
    mean_model, mean_r2 = linear_fit(g, b, np.array([t.mean for t in table]))
    std_model, std_r2 = linear_fit(g, b, np.array([t.std for t in table]))
    warnings = []
    if len(table) == 1:
        warnings.append(
            "one configuration only: the linear model is a constant; measure several batch sizes"
        )
    for name, r2 in (("mean", mean_r2), ("std", std_r2)):
        if r2 is not None and r2 < MIN_R2:
            warnings.append(
                f"the {name} fit is poor (R^2 {r2:.3f} < {MIN_R2}): measured configurations "
                "use the table; others are extrapolated from a weak model"
            )
    negative = [(t.g, t.b) for t in table if std_model(t.g, t.b) < 0]
    if negative:
        warnings.append(
            "the std model is negative (clipped at 0) at measured configuration(s) "
            + ", ".join(f"g={gg} b={bb}" for gg, bb in negative)
            + ": the table is used there"
        )
    for p in points:
        warning = stall_warning(p)
        if warning:
            warnings.append(warning)
    if any(mean_model(t.g, t.b) < 0 for t in table):
        warnings.append(
            "the mean model is negative at a measured configuration: the table is used there"
        )
    return Fit(Normal(mean_model, std_model), tuple(table), mean_r2, std_r2, tuple(warnings))
