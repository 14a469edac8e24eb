"""What the studies share: checks of their ``[study]`` settings, a state file of the runs done
(to resume), results made JSON-ready, and a results file read back with its kind and schema
checked (both versioned files, :mod:`core.versioned`).

A study (grouping, sophon, hfta) records each finished run in ``OUT/NAME/<kind>-state.json``
(:data:`STATE`) with the fingerprint of its settings; run again with the same settings, it
skips the runs whose run directories still say they finished, and starts over when the
settings changed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from core import versioned
from core.errors import UserError
from core.rundir import FINISHED, load_manifest
from core.versioned import Layout


def whole_number(value: Any, key: str, where: str, low: int, high: int) -> int:
    """``value`` when it is a whole number from ``low`` to ``high``, else a one-line UserError
    naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(
            f"{where}: {key} must be a whole number from {low} to {high}, got {value!r}"
        )
    return value


def distinct_whole_numbers(
    value: Any, key: str, where: str, low: int, high: int
) -> tuple[int, ...]:
    """``value`` sorted, when it is a non-empty list of distinct whole numbers from ``low`` to
    ``high``, else a one-line UserError naming ``key``."""
    if (
        not isinstance(value, list | tuple)
        or not value
        or any(isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high for v in value)
        or len(set(value)) != len(value)
    ):
        raise UserError(
            f"{where}: {key} must be a non-empty list of distinct whole numbers from {low} to "
            f"{high}, got {value!r}"
        )
    return tuple(sorted(value))


#: A study's state file: the runs done, under the fingerprint of the settings they ran with.
STATE = Layout("study state", 1)


def load_state(path: Path, fingerprint: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The state at ``path`` when it is this version's and of these settings (``fingerprint``);
    else a fresh one (saying why, when a file was there)."""
    fresh = versioned.stamp(STATE, {"fingerprint": fingerprint, "runs": {}})
    if not path.is_file():
        return fresh
    try:
        state = versioned.read_json(path, STATE.what)
    except UserError:
        log(f"{path} is damaged: starting the study's runs afresh")
        return fresh
    try:
        state = versioned.upgrade(STATE, state, str(path))
    except UserError:
        log(f"{path} is of another version: starting the study's runs afresh")
        return fresh
    if state.get("fingerprint") != fingerprint:
        log("the study's settings or dataset changed since its last runs: running them all again")
        return fresh
    return state


def save_state(path: Path, state: Mapping[str, Any]) -> None:
    """Write a study's state (:func:`load_state`) to ``path``, stamped, atomically."""
    versioned.write_json(path, STATE, state)


def run_done(entry: Mapping[str, Any] | None) -> bool:
    """Whether a state entry's run directory still says the run finished."""
    if not entry or not entry.get("run_dir"):
        return False
    try:
        return load_manifest(Path(entry["run_dir"])).get("status") in FINISHED
    except (UserError, OSError):
        return False


def json_ready(value: Any) -> Any:
    """``value`` with NaN (no reads, say) as null, numpy scalars as Python's, tuples as lists:
    JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, np.generic):
        return json_ready(value.item())
    return value


def load_results(path: Path, layout: Layout) -> dict[str, Any]:
    """A study's results file (``grouping.json``, ``sophon.json``, ``hfta.json``) of ``layout``,
    refusing another study's (its ``kind``) or a version this twintrace cannot bring up to date
    with a line saying what to do."""
    return versioned.load_json(Path(path), layout, missing="run the study first")
