"""Selecting rows of a run's tables: event kinds, containers, phase intervals and steps.

The event kinds and the tables' columns are those of ``store.rundir`` (``docs/run-format.md``).
Schema version 2 tags every row with ``container``, the role of the run's container it came
from (``main`` for an ordinary run; ``rank0``, ``rank1``... for a run of several containers),
null for host-wide rows (host CPU samples, block requests no container issued). The helpers
here are what every analysis uses to split a run by container, so they agree on what a
container's rows are.

Example::

    reads = kind_mask(run.events, READ_KINDS)
    for role, rows in container_rows(run.events, run_roles(run)):
        ...
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from store.rundir import FD_KINDS, Run

BLOCK_KINDS: tuple[str, ...] = ("block_read", "block_write", "block_other")
#: Every traced system call (the page-cache, block and process rows are not calls).
SYSCALL_KINDS: tuple[str, ...] = (*FD_KINDS, "openat")


class KindMask:
    """Boolean row masks for sets of event kinds, from the category codes (no string compares).

    Built once per events table, then called for each set of kinds: ``mask(READ_KINDS)``.
    """

    def __init__(self, kind: pd.Series) -> None:
        kind = kind.astype("category") if not isinstance(kind.dtype, pd.CategoricalDtype) else kind
        self._codes = kind.cat.codes.to_numpy()
        self._categories = kind.cat.categories.astype(str)

    def __call__(self, kinds: Sequence[str]) -> np.ndarray:
        # Code -1 (a null kind) indexes the appended False.
        lookup = np.append(np.isin(self._categories, list(kinds)), False)
        return lookup[self._codes]


def kind_mask(events: pd.DataFrame, kinds: Sequence[str]) -> np.ndarray:
    """Which rows of ``events`` have one of ``kinds`` (a plain bool array)."""
    return KindMask(events["kind"])(kinds)


def is_value(series: pd.Series, value: str) -> np.ndarray:
    """``series == value`` as a plain bool array (a null is simply not equal)."""
    return series.eq(value).to_numpy(dtype=bool, na_value=False)


# ---------------------------------------------------------------------------------------------
# Containers


def run_roles(run: Run) -> list[str]:
    """The roles of ``run``'s containers: the manifest's, in its order; for a manifest without
    them, the distinct non-null ``container`` values of the tables, sorted."""
    if run.containers:
        return list(run.containers)
    seen: set[str] = set()
    for frame in (run.events, run.samples, run.phases):
        seen.update(str(v) for v in frame["container"].dropna().unique())
    return sorted(seen)


def roles_by_host(run: Run) -> list[str]:
    """:func:`run_roles`, those of a run across hosts grouped by host (the hosts in the
    manifest's order; a role with no host last)."""
    roles, placed = run_roles(run), run.placement
    hosts = list(dict.fromkeys(placed.values()))
    return sorted(roles, key=lambda r: hosts.index(placed[r]) if r in placed else len(hosts))


def container_codes(frame: pd.DataFrame, roles: Sequence[str]) -> np.ndarray:
    """Per row, the position of its container in ``roles``; ``len(roles)`` for a null or an
    unknown container (host-wide rows)."""
    codes = pd.Index(list(roles), dtype="string").get_indexer(frame["container"])
    return np.where(codes < 0, len(roles), codes)


def container_rows(
    frame: pd.DataFrame, roles: Sequence[str], host: bool = False
) -> Iterator[tuple[str, np.ndarray]]:
    """``(role, bool mask)`` for each of ``roles``: the rows of that container, and, with
    ``host``, also the host-wide rows (null ``container``), which belong to no container and
    are context for each."""
    codes = container_codes(frame, roles)
    shared = codes == len(roles) if host else np.zeros(len(frame), dtype=bool)
    for i, role in enumerate(roles):
        yield role, (codes == i) | shared


def select_containers(frame: pd.DataFrame, roles: Sequence[str]) -> pd.DataFrame:
    """The rows of ``frame`` from the containers ``roles`` (host-wide rows left out)."""
    codes = container_codes(frame, roles)
    return frame[codes < len(roles)].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Phases


def interval_rows(phases: pd.DataFrame, key: str) -> pd.DataFrame:
    """The ``interval`` rows of ``phases`` called ``key``."""
    return phases[is_value(phases["kind"], "interval") & is_value(phases["key"], key)]


def step_intervals(phases: pd.DataFrame) -> pd.DataFrame:
    """Step intervals (``ts_ns``, ``end_ns``, ``epoch``, ``step``) of the lowest rank.

    ``step`` interval rows when the workload logs them; otherwise derived from ``step_end``
    points: a step runs from the previous ``step_end`` of its epoch (for the first step, from the
    epoch's start; without one it is dropped) to its own ``step_end``. The phases of one
    container: two containers' steps interleave (see :func:`container_rows`).
    """
    cols = ["ts_ns", "end_ns", "epoch", "step"]
    steps = interval_rows(phases, "step")
    if len(steps) == 0:
        ends = phases[is_value(phases["kind"], "point") & is_value(phases["key"], "step_end")]
        if len(ends) == 0:
            return pd.DataFrame(columns=cols)
        ends = ends[ends["rank"] == ends["rank"].min()].sort_values("ts_ns")
        # Nullable Int64 keeps boot-relative nanoseconds exact through the shift's gaps.
        start = ends["ts_ns"].astype("Int64").groupby(ends["epoch"]).shift(1)
        epoch_start = interval_rows(phases, "epoch").groupby("epoch")["ts_ns"].min()
        start = start.fillna(ends["epoch"].map(epoch_start))
        steps = pd.DataFrame(
            {"ts_ns": start, "end_ns": ends["ts_ns"], "epoch": ends["epoch"], "step": ends["step"]}
        ).dropna(subset=["ts_ns"])
        return steps.astype({"ts_ns": "int64", "end_ns": "int64"})[cols]
    return steps[steps["rank"] == steps["rank"].min()][cols]


def evaluations(phases: pd.DataFrame, role: str | None = None) -> list[dict[str, Any]]:
    """Each evaluation of rank 0 (of container ``role``; None: any), in epoch order: the epoch
    and what the workload logged (``top1``, ``top5``, ``loss``, ``samples``; of a fused array
    also each model's: ``top1_models``, ...)."""
    mine = phases[(phases["rank"] == 0).to_numpy(dtype=bool)]
    if role is not None:
        mine = mine[is_value(mine["container"], role)]
    rows = mine[is_value(mine["kind"], "interval") & is_value(mine["key"], "eval")]
    rows = rows.sort_values("epoch")
    return [
        {"epoch": int(e), **json.loads(v)}
        for e, v in zip(rows["epoch"], rows["value"], strict=True)
        if isinstance(v, str) and v.startswith("{")
    ]
