"""What a comparison returns: a score per aspect with its evidence, and the weighted mean.

:class:`Comparison` is what :func:`analysis.similarity.compare_runs` returns; ``to_dict()`` is
its JSON form (``docs/similarity.md``), :func:`comparison_table` one row per aspect.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd


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
