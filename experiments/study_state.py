"""What the studies share: checks of their ``[study]`` settings, a state file of the runs done
(to resume), results made JSON-ready, and a results file read back with its kind and schema
checked.

A study (grouping, sophon, hfta) records each finished run in ``OUT/NAME/<kind>-state.json``
with the fingerprint of its settings; run again with the same settings, it skips the runs
whose run directories still say they finished, and starts over when the settings changed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import UserError
from core.rundir import FINISHED, load_manifest


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


#: The version of a study's state file.
STATE_VERSION = 1


def load_state(path: Path, fingerprint: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The state at ``path`` when it is this version's and of these settings (``fingerprint``);
    else a fresh one (saying why, when a file was there)."""
    fresh = {"schema_version": STATE_VERSION, "fingerprint": fingerprint, "runs": {}}
    if not path.is_file():
        return fresh
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        log(f"{path} is damaged: starting the study's runs afresh")
        return fresh
    if not isinstance(state, dict) or state.get("schema_version") != STATE_VERSION:
        log(f"{path} is of another version: starting the study's runs afresh")
        return fresh
    if state.get("fingerprint") != fingerprint:
        log("the study's settings or dataset changed since its last runs: running them all again")
        return fresh
    return state


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


def load_results(path: Path, kind: str, schema_version: int) -> dict[str, Any]:
    """A study's results file (``grouping.json``, ``sophon.json``, ``hfta.json``), refusing
    another study's (``kind``) or another schema version with a line saying what to do."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path} does not exist: run the study first") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} cannot be read ({exc}): run the study again") from None
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise UserError(f"{path} is not the {kind} study's results")
    if data.get("schema_version") != schema_version:
        raise UserError(
            f"{path} has schema_version {data.get('schema_version')!r}; this twintrace reads "
            f"{schema_version}: use the twintrace version that made it "
            f"({data.get('twintrace_version', 'unknown')}) or run the study again"
        )
    return data
