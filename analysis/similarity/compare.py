"""Comparing two runs: every registered aspect scored on the two run profiles, the weighted
mean, and warnings about the runs' conditions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from analysis.similarity.aspects import ASPECTS, REGISTERED, Aspect, Outcome
from analysis.similarity.profile import N_POINTS, RunProfile, run_profile
from analysis.similarity.results import AspectScore, Comparison
from core.errors import UserError
from store.rundir import Run

#: Warn when the share of bytes read that missed the page cache differs by more than this
#: between the runs (one read mostly from the device, the other mostly from memory). A warning
#: only: no score depends on it.
CACHE_STATE_GAP = 0.5


#: The overall score is the weighted harmonic mean of the aspect scores, each counted at
#: least at this value: an aspect at 0 (one run lacks a resource the other uses) lowers the
#: overall as much as a score of 0.25 does, instead of making it 0. docs/similarity.md says why.
OVERALL_FLOOR = 0.25


def overall_score(weighted: Sequence[tuple[float, float]]) -> float:
    """The weighted harmonic mean of (weight, score) pairs, scores floored at
    :data:`OVERALL_FLOOR` for the mean only, and never above their weighted arithmetic mean
    (1 when every score is 1, 0 when every score is 0).

    An arithmetic mean lets many aspects that agree drown one that does not: a run whose steps
    are twice as short as the real job's (step time 0.5, weight 1) among 15 aspects near 1
    still scored 0.93-0.95. The harmonic mean weighs each aspect by how far it is from 1 in
    ratio terms (1/s): one aspect at 0.5 of weight 1 in 18.5 costs the overall 0.05 instead of
    0.027, one at 0.9 costs 0.006 as before."""
    total = sum(w for w, _ in weighted)
    if total <= 0:
        raise ValueError("no positive weight to average")
    inverse = sum(w / max(float(s), OVERALL_FLOOR) for w, s in weighted)
    arithmetic = sum(w * float(s) for w, s in weighted) / total
    # The floor can lift the harmonic mean above the arithmetic one only where most scores are
    # under it (every aspect 0: 0.25); the overall is never above the plain weighted mean.
    return float(min(total / inverse, arithmetic))


def _score(aspect: Aspect, outcome: Outcome, weights: Mapping[str, float] | None) -> AspectScore:
    weight = aspect.weight if not weights or aspect.name not in weights else weights[aspect.name]
    return AspectScore(
        name=aspect.name,
        title=aspect.title,
        resource=aspect.resource,
        measure=aspect.measure,
        # Rounded to 12 decimals: library float noise (Kendall's tau of identical ranks is
        # 0.9999999999999999) must not stop a run compared with itself from scoring exactly 1.
        score=None if outcome.score is None else round(float(outcome.score), 12),
        weight=float(weight),
        details=dict(outcome.details),
        invariant_to=aspect.invariant_to,
        sensitive_to=aspect.sensitive_to,
        skipped=outcome.skipped,
        plot=dict(outcome.plot or {}),
    )


def compare_profiles(
    real: RunProfile, emulated: RunProfile, weights: Mapping[str, float] | None = None
) -> Comparison:
    """Score every registered aspect (:data:`ASPECTS`) for two profiles and take their
    weighted harmonic mean (:func:`overall_score`).

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
    results = [_score(aspect, aspect(real, emulated), weights) for aspect in REGISTERED]
    scored = [a for a in results if a.score is not None and a.weight > 0]
    if not scored:
        raise UserError(
            f"runs {real.run_id} and {emulated.run_id} have no events, samples or phases to "
            "compare: check that both completed (`./cli.py runs`)"
        )
    overall = overall_score([(a.weight, float(a.score)) for a in scored])  # type: ignore[arg-type]
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
    """Differences between the runs' conditions that lower scores or blur them (see
    :attr:`Comparison.warnings`): the page-cache state each run started with, and runs made of
    different containers."""
    warnings: list[str] = []
    miss_a, miss_b = page_cache_miss_share(real), page_cache_miss_share(emulated)
    if miss_a is not None and miss_b is not None and abs(miss_a - miss_b) > CACHE_STATE_GAP:
        warnings.append(
            f"the runs started with different page-cache states (page-cache misses per byte "
            f"read: {miss_a:.2f} real, {miss_b:.2f} emulated), which lowers block I/O, memory "
            "and timing scores: drop the caches before each run "
            "(`sync; echo 3 > /proc/sys/vm/drop_caches` as root)"
        )
    if set(real.containers) != set(emulated.containers):
        warnings.append(
            f"the runs have different containers (real: {', '.join(real.containers) or 'none'}; "
            f"emulated: {', '.join(emulated.containers) or 'none'}): each run is scored as the "
            "sum of its containers, so how the work is split between containers is not "
            "compared: trace both with the same containers, or compare one container of each "
            "(compare_runs(..., containers=[role]))"
        )
    return tuple(warnings)


def compare_runs(
    real: Run,
    emulated: Run,
    points: int = N_POINTS,
    weights: Mapping[str, float] | None = None,
    file_scope: Sequence[str] | None = None,
    containers: Sequence[str] | None = None,
) -> Comparison:
    """How similarly ``emulated`` stresses the storage stack compared with ``real``.

    ``points``: length of the resampled time series; ``weights``: per-aspect weights replacing
    the defaults of the aspects' specs. ``file_scope``: directories the file aspects (access
    order, bytes per file, opens) look at; by default the read-only mounts (the dataset) of the
    two manifests, or every file when neither has one; ``()`` for every file. Library imports
    (thousands of ``.pyc`` files read once at start-up) would otherwise outweigh the dataset.
    ``containers``: the roles of the containers to compare in both runs; by default each run
    as a whole, aggregated over its containers (a warning says when the two runs' containers
    differ). See ``docs/similarity.md``.
    """
    if file_scope is None:
        file_scope = tuple(sorted(set(real.data_mounts) | set(emulated.data_mounts)))
    return compare_profiles(
        run_profile(real, points, file_scope, containers),
        run_profile(emulated, points, file_scope, containers),
        weights,
    )
