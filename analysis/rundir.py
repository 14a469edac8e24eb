"""Load a run directory (``docs/run-format.md``) into typed DataFrames.

This module is the single source of truth for the column names and dtypes of the three tables
of a run (``events``, ``samples``, ``phases``): the ingest code that writes them imports
:data:`EVENTS_COLUMNS`, :data:`SAMPLES_COLUMNS` and :data:`PHASES_COLUMNS` (and
:func:`arrow_schema` for the Parquet schema), and every reader goes through :func:`load_run`,
which checks the manifest's ``schema_version`` and conforms each table to its documented dtypes.

Example::

    run = load_run("20261121-163005-unet3d-sleep-3f2a")     # resolved against ./runs
    reads = run.events[run.events["kind"] == "read"]
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from workloads import __version__ as TWINTRACE_VERSION
from workloads.errors import UserError

#: The manifest / table layout version this code reads and writes.
SCHEMA_VERSION = 1

# Column name -> pandas dtype string, in file order. 'string' is pandas' nullable string dtype,
# 'category' a dictionary-encoded string (Parquet dictionary), the integer widths are those of
# docs/run-format.md. Keep these three in step with that document.
EVENTS_COLUMNS: Mapping[str, str] = {
    "ts_ns": "int64",
    "kind": "category",
    "pid": "int32",
    "tid": "int32",
    "comm": "string",
    "fd": "int32",
    "path": "string",
    "bytes": "int64",
    "count": "int64",
    "ret": "int64",
    "offset": "int64",
    "latency_ns": "int64",
    "dev": "string",
    "in_container": "bool",
}

SAMPLES_COLUMNS: Mapping[str, str] = {
    "ts_ns": "int64",
    "metric": "string",
    "value": "float64",
    "unit": "string",
}

PHASES_COLUMNS: Mapping[str, str] = {
    "ts_ns": "int64",
    "end_ns": "int64",
    "duration_ns": "int64",
    "key": "string",
    "kind": "string",
    "rank": "int32",
    "pid": "int32",
    "epoch": "int32",
    "step": "int32",
    "value": "string",
}

#: Table name -> (file name, columns), in the order the run directory documents them.
TABLES: Mapping[str, tuple[str, Mapping[str, str]]] = {
    "events": ("events.parquet", EVENTS_COLUMNS),
    "samples": ("samples.parquet", SAMPLES_COLUMNS),
    "phases": ("phases.parquet", PHASES_COLUMNS),
}

MANIFEST = "manifest.json"

_ARROW_TYPES: Mapping[str, pa.DataType] = {
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    # int8 indices: a category column holds a small fixed vocabulary (20 event kinds).
    "category": pa.dictionary(pa.int8(), pa.string()),
}

# Arrow strings become pandas' nullable 'string' dtype directly, rather than Python objects that
# would then have to be converted one by one (slow on millions of rows).
_STRING_MAPPER = {
    pa.string(): pd.StringDtype(),
    pa.large_string(): pd.StringDtype(),
}.get


def arrow_schema(columns: Mapping[str, str]) -> pa.Schema:
    """The Parquet (Arrow) schema for a table described by ``columns``, for writers.

    ``'category'`` maps to ``dictionary<int8, string>``, ``'string'`` to ``string``; every
    column is declared non-nullable except strings (``path`` and ``dev`` are null by design).
    """
    fields = []
    for name, dtype in columns.items():
        arrow_type = _ARROW_TYPES[dtype]
        fields.append(pa.field(name, arrow_type, nullable=dtype == "string"))
    return pa.schema(fields)


def empty_frame(columns: Mapping[str, str]) -> pd.DataFrame:
    """An empty DataFrame with exactly the documented columns and dtypes."""
    return pd.DataFrame({name: pd.Series([], dtype=dtype) for name, dtype in columns.items()})


def conform(frame: pd.DataFrame, columns: Mapping[str, str], where: str) -> pd.DataFrame:
    """Return ``frame`` with the documented columns first, in order, cast to their dtypes.

    Extra columns are kept after the documented ones (a reader must not break on them). A
    missing column or a value that does not fit its dtype (e.g. a null in an integer column) is
    a :class:`UserError` naming ``where`` and the column: the file was not written by the
    schema this code reads.
    """
    missing = [name for name in columns if name not in frame.columns]
    if missing:
        raise UserError(
            f"{where} lacks column {missing[0]!r} required by run format schema_version "
            f"{SCHEMA_VERSION}: it was not written by a compatible twintrace; re-create the run"
        )
    # Cast only what differs and select columns by name: rebuilding the frame from a dict of
    # columns would copy every column (pandas consolidates them), a cost on millions of rows.
    casts = {name: dtype for name, dtype in columns.items() if str(frame[name].dtype) != dtype}
    if casts:
        frame = frame.copy(deep=False)  # copy-on-write: the caller's frame is left alone
        for name, dtype in casts.items():
            try:
                frame[name] = frame[name].astype(dtype)
            except (TypeError, ValueError) as exc:
                raise UserError(
                    f"{where}: column {name!r} cannot be read as {dtype}: {exc}"
                ) from None
    extras = [name for name in frame.columns if name not in columns]
    frame = frame[[*columns, *extras]]
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0:
        frame = frame.reset_index(drop=True)
    return frame


def read_table(path: Path, columns: Mapping[str, str]) -> pd.DataFrame:
    """Read one Parquet table of a run and conform it to ``columns``."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(
            f"cannot read {path}: {exc}; the run may have been interrupted while writing it"
        ) from None
    frame = table.to_pandas(types_mapper=_STRING_MAPPER, split_blocks=True, self_destruct=True)
    return conform(frame, columns, str(path))


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """One run directory: its manifest and its three tables.

    The tables are read lazily, on first access, and then kept: listing or comparing runs only
    needs the manifests, and ``events.parquet`` can hold millions of rows, so nothing pays for
    a table it does not use. A table whose file is absent (a failed or interrupted run) reads as
    an empty frame with the documented dtypes and its name is in :attr:`missing`.
    """

    path: Path
    manifest: dict[str, Any]
    missing: frozenset[str] = frozenset()

    def _table(self, name: str) -> pd.DataFrame:
        file_name, columns = TABLES[name]
        if name in self.missing:
            return empty_frame(columns)
        return read_table(self.path / file_name, columns)

    # cached_property writes to the instance __dict__ directly, so it works on a frozen
    # dataclass; eq=False keeps instances hashable by identity (the manifest is a dict).
    @functools.cached_property
    def events(self) -> pd.DataFrame:
        """``events.parquet`` conformed to :data:`EVENTS_COLUMNS`."""
        return self._table("events")

    @functools.cached_property
    def samples(self) -> pd.DataFrame:
        """``samples.parquet`` conformed to :data:`SAMPLES_COLUMNS`."""
        return self._table("samples")

    @functools.cached_property
    def phases(self) -> pd.DataFrame:
        """``phases.parquet`` conformed to :data:`PHASES_COLUMNS`."""
        return self._table("phases")

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.path.name)

    @property
    def status(self) -> str:
        return str(self.manifest.get("status") or "unknown")

    @property
    def incomplete(self) -> bool:
        """True when the run did not complete or a table is missing: plots are partial."""
        return self.status != "completed" or bool(self.missing)

    @property
    def start_ns(self) -> int | None:
        """CLOCK_MONOTONIC ns when the workload was released: the time origin of plots."""
        value = self.manifest.get("start_ns")
        return int(value) if value is not None else None

    @property
    def end_ns(self) -> int | None:
        value = self.manifest.get("end_ns")
        return int(value) if value is not None else None

    @property
    def workload(self) -> str:
        """The workload name from the config, else the image part of the run id."""
        config = self.manifest.get("config") or {}
        if config.get("workload"):
            return str(config["workload"])
        return _run_id_parts(self.run_id)[0]

    @property
    def variant(self) -> str:
        config = self.manifest.get("config") or {}
        if config.get("variant"):
            return str(config["variant"])
        return _run_id_parts(self.run_id)[1]

    @property
    def label(self) -> str:
        """``run id (workload, variant)``, the heading used by plots."""
        return f"{self.run_id} ({self.workload}, {self.variant})"


def _run_id_parts(run_id: str) -> tuple[str, str]:
    """(workload or image, variant) from ``<date>-<time>-<workload>-<variant>-<hex>``.

    The workload (an image tag for ``--image`` runs) may itself contain dashes; variants do not.
    """
    parts = run_id.split("-")
    if len(parts) < 5:
        return (run_id, "unknown")
    return ("-".join(parts[2:-2]), parts[-2])


def resolve_run(ref: str | Path, runs_root: Path = Path("runs")) -> Path:
    """The run directory that ``ref`` names: a path, a run id under ``runs_root``, or a unique
    prefix of one.

    Raises :class:`UserError` naming what was tried when nothing (or more than one run) matches.
    """
    path = Path(ref)
    if (path / MANIFEST).is_file():
        return path
    candidate = Path(runs_root) / str(ref)
    if (candidate / MANIFEST).is_file():
        return candidate
    # A bare prefix is convenient ("20261121-1630"), but only when it is unambiguous.
    if path.name == str(ref) and Path(runs_root).is_dir():
        matches = sorted(
            p
            for p in Path(runs_root).iterdir()
            if p.name.startswith(str(ref)) and (p / MANIFEST).is_file()
        )
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            names = ", ".join(p.name for p in matches[:5])
            more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
            raise UserError(
                f"run {str(ref)!r} is ambiguous: it matches {names}{more}; give the full run id"
            )
    if path.exists():
        raise UserError(
            f"{path} is not a run directory (it has no {MANIFEST}): "
            "list the runs with `./cli.py runs`"
        )
    raise UserError(
        f"no run {str(ref)!r}: neither {path} nor {candidate} is a run directory; "
        "list the runs with `./cli.py runs`"
    )


def load_manifest(run_dir: Path) -> dict[str, Any]:
    """Read ``manifest.json`` and check its ``schema_version``."""
    manifest_path = Path(run_dir) / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{run_dir} is not a run directory (it has no {MANIFEST}): "
            "list the runs with `./cli.py runs`"
        ) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{manifest_path} is not valid JSON ({exc}): the run is damaged") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{manifest_path} is not a JSON object: the run is damaged")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        made_by = manifest.get("twintrace_version")
        which = (
            f"use twintrace {made_by}, which made this run"
            if made_by
            else "use the twintrace version that made this run"
        )
        raise UserError(
            f"{manifest_path} has schema_version {version!r}, but twintrace "
            f"{TWINTRACE_VERSION} reads only schema_version {SCHEMA_VERSION}: {which}"
        )
    return manifest


def load_run(ref: str | Path, runs_root: Path = Path("runs")) -> Run:
    """Load the run that ``ref`` names (see :func:`resolve_run`); tables are read on first use.

    Example: ``load_run("runs/20261121-163005-unet3d-sleep-3f2a").phases``
    """
    run_dir = resolve_run(ref, runs_root)
    manifest = load_manifest(run_dir)
    missing = frozenset(
        name for name, (file_name, _) in TABLES.items() if not (run_dir / file_name).is_file()
    )
    return Run(path=run_dir, manifest=manifest, missing=missing)
