"""Studies: experiment files whose runs follow a published method rather than a grid.

``./cli.py experiment run FILE.toml`` runs a study when the file has a ``[study]`` table::

    [experiment]
    name = "datastall-cache"
    description = "fetch stall vs cached fraction (DS-Analyzer, GPEmu)"

    [[datasets]]                  # as in grid experiments: generated when missing
    name = "images"
    generator = "images"
    size = "150MB"

    [study]
    kind = "stalls"               # a key of STUDIES; the other keys are the kind's own
    dataset = "images"
    ...

The kind's module validates its keys when the file is loaded (``check_study``) and runs the
study (``run_study``), writing under ``OUT/NAME/``: ``data/`` (the datasets), ``runs/`` and its
results (a versioned JSON file and plots); it returns the path of the results JSON.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.errors import UserError
from experiments import study_state
from experiments.orchestrate import Dataset, check_table, ensure_dataset, parse_datasets, read_toml

Log = Callable[[str], None]

#: Study kind -> its module (``check_study(study)`` and ``run_study(study, out, data, log)``).
STUDIES: Mapping[str, str] = {
    "stalls": "experiments.stalls",
    "grouping": "experiments.grouping",
    "sophon": "experiments.sophon",
    "hfta": "experiments.hfta",
    "fidelity": "experiments.fidelity",
}


@dataclasses.dataclass(frozen=True)
class Study:
    """A parsed study file: its name, datasets and the kind's own keys (``spec``)."""

    name: str
    description: str
    kind: str
    datasets: tuple[Dataset, ...]
    spec: Mapping[str, Any]
    path: Path

    def dataset(self, name: str) -> Dataset:
        for d in self.datasets:
            if d.name == name:
                return d
        known = ", ".join(d.name for d in self.datasets) or "none"
        raise UserError(f"{self.path}: study dataset {name!r} is not a [[datasets]] name ({known})")


def is_study(path: Path) -> bool:
    """True when the experiment file at ``path`` has a ``[study]`` table."""
    return "study" in read_toml(path)


def _module(kind: str) -> Any:
    return importlib.import_module(STUDIES[kind])


def load_study(path: Path) -> Study:
    """Parse and validate a study file (one-line UserErrors)."""
    path = Path(path)
    data = read_toml(path)
    check_table(data, str(path), ("experiment", "datasets", "study"))
    head = check_table(data.get("experiment", {}), f"{path}: [experiment]", ("name", "description"))
    spec = data.get("study")
    if not isinstance(spec, dict):
        raise UserError(f"{path}: [study] must be a table")
    kind = spec.get("kind")
    if kind not in STUDIES:
        raise UserError(f"{path}: study kind must be one of {', '.join(STUDIES)}, got {kind!r}")
    study = Study(
        name=head.get("name") or path.stem,
        description=head.get("description", ""),
        kind=kind,
        datasets=tuple(parse_datasets(data, path)),
        spec={k: v for k, v in spec.items() if k != "kind"},
        path=path,
    )
    _module(kind).check_study(study)
    return study


def run_study(study: Study, out_root: Path, log: Log = print) -> Path:
    """Generate the study's datasets when missing, run it under ``out_root/<name>``; return the
    path of its results JSON."""
    out = Path(out_root) / study.name
    with study_state.sole_runner(out):
        data = {d.name: ensure_dataset(d, out / "data", log) for d in study.datasets}
        return Path(_module(study.kind).run_study(study, out, data, log))
