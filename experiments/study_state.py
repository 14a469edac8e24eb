"""What the studies share to resume and to write their results: a state file of the runs done,
and results made JSON-ready.

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
