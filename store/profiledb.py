"""The profile database: measured compute times keyed by (accelerator, model, batch size).

Host side only (``./cli.py profiles``; :mod:`tracing.request` turns ``--accelerator`` into a
sleep profile file mounted into the run), like the rest of :mod:`store`: the workload images
never carry it or its data. Its only third-party import is numpy (no pandas).

The tables and their sources are listed in ``store/profiles/profiledb.toml``:

- ``gpemu``: GPEmu's measurements of 36 torchvision models on 6 GPUs, batch 1-256: forward and
  backward time, host-to-device copy per batch, peak and persistent memory, model transfer
  (``gpemu-profiles.csv.gz``, ``gpemu-model-transfer.csv``; read by :mod:`store.gpemu`);
- ``mlperf-storage``: MLPerf Storage's per-step compute times (UNet3D batch 7, ResNet-50 batch
  400, on A100 and H100);
- ``discs-vldb``: the published V100 fits of UNet3D, BERT and DLRM, kept in the default profiles
  the images ship (``workloads/profiles/``: ``unet3d.json``, ``bert.json``, ``dlrm.json``), used
  as fits in (g, b);
- ``measured``: profiles measured with ``./cli.py profile measure --db`` (folder ``measured/``,
  one ``<accelerator>-<model>.json`` each; :func:`add_measured` files them): the shipped ones
  on a 2-thread AMD EPYC build machine (``epyc-2t``), phase by phase; this host's own CPU,
  ``cpu``, is measured here and cached by the host's record (:mod:`store.hostprofiles`);
- ``osre-2023``: the OSRE 2023 emulator's ResNet-18 batch-64 points (V100, P100).

Lookup (``lookup(accelerator, model, batch)``): a table of numbers is read at the batch by the
rules of :mod:`store.profiletables` (``exact``, ``interpolated`` or ``extrapolated`` along the
local slope, the same for every column); a published fit (``discs-vldb``) is evaluated as it is
(``fit``). When several tables cover one (accelerator, model), the lookup takes a table with a
row at the requested batch, else the first of ``default_order``; ``source=`` picks one.
:meth:`ProfileEntry.to_sleep_profile` turns an entry into a :class:`SleepProfile` (the
looked-up point in its ``table``, linear models along the local slope for other batch sizes).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from core import versioned
from core.errors import UserError
from store.gpemu import gpemu_tables
from store.hostprofiles import (
    HOST_CPU,
    host_coverage,
    host_cpu_profile,
    host_profiles_dir,
    measure_command,
)
from store.profiletables import (
    COLUMNS,
    Accelerator,
    Cards,
    Source,
    Table,
    estimate,
    table_values,
)
from workloads.profile import (
    PROFILES_DIR,
    Collective,
    Linear,
    Memory,
    Normal,
    SleepProfile,
    Split,
    TablePoint,
    load_profile,
)

SCHEMA_VERSION = 1
#: profiledb.toml's layout (:mod:`core.versioned`).
DATABASE_LAYOUT = versioned.Layout("profile database", SCHEMA_VERSION, remedy="restore it from git")
#: The folder of the shipped database: profiledb.toml, the tables it names, measured/.
DATABASE_DIR = Path(__file__).resolve().parent / "profiles"
DATABASE = DATABASE_DIR / "profiledb.toml"
METHODS = ("exact", "interpolated", "fit", "extrapolated")  # preference when tables compete

#: The zoo's image workloads: their sleep variant emulates any image model (the data pipeline
#: is the same; only the profile differs). Checked against the registry by the tests.
IMAGE_WORKLOADS = frozenset({"resnet18", "resnet50", "alexnet"})
#: Models that are a workload of their own and only emulate that workload.
NON_IMAGE_MODELS = frozenset({"unet3d", "bert", "dlrm"})


@dataclasses.dataclass(frozen=True)
class ProfileEntry:
    """What the database says for one (accelerator, model, batch): times in seconds, memory
    in bytes, None where the source has no such number.

    ``method``: ``exact``, ``interpolated``, ``extrapolated`` or ``fit``; ``rows``: the
    measured batch sizes the numbers come from (exact: the batch; interpolated: the two rows;
    extrapolated: the end row, then the first and last row of its slope; fit: the fitted
    range); ``slopes``: d(value)/d(batch) at this batch (the local slope of
    :mod:`store.profiletables`), used for the profile's linear models; ``notes``: caveats,
    repeated in :meth:`describe`.
    """

    accelerator: str
    accelerator_name: str
    model: str
    batch: int
    source_id: str
    source: str
    method: str
    rows: tuple[int, ...]
    compute_s: float
    compute_std_s: float = 0.0
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    h2d_s: float | None = None
    model_transfer_s: float | None = None
    peak_bytes: float | None = None
    persistent_bytes: float | None = None
    capacity_bytes: int | None = None
    capacity_source: str = ""
    interconnect: str | None = None
    slopes: Mapping[str, float] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    accelerators: int = 1
    fit: SleepProfile | None = dataclasses.field(default=None, repr=False)
    host: Mapping[str, Any] | None = None  # where a measured table was measured

    def describe(self) -> str:
        """One line: source, card, model, batch, method and the rows used."""
        if self.method == "exact":
            how = f"the row of batch {self.batch}"
        elif self.method == "interpolated":
            how = f"interpolated linearly between the rows of batch {self.rows[0]} and {self.rows[-1]}"
        elif self.method == "fit":
            how = f"the published fit at {self.accelerators} accelerator(s)"
        elif len(set(self.rows)) == 1:
            how = f"scaled proportionally from the only measured batch size, {self.rows[0]}"
        else:
            how = (
                f"extrapolated from the row of batch {self.rows[0]} along the least-squares "
                f"slope of the rows of batch {self.rows[1]}-{self.rows[-1]}"
            )
        text = f"{self.source}. {self.accelerator_name}, {self.model}, batch {self.batch}: {how}"
        return "; ".join([text, *self.notes])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the fit as its profile's source)."""
        data = dataclasses.asdict(self)
        data["fit"] = self.fit.source if self.fit is not None else None
        data["slopes"] = dict(self.slopes)
        data["description"] = self.describe()
        return data

    def to_sleep_profile(
        self, workload: str, accelerators: int | None = None, batch: int | None = None
    ) -> SleepProfile:
        """The sleep profile of ``workload`` on this entry's accelerator at this batch.

        A ``table`` point at (``accelerators``, batch) holds the looked-up compute time
        (forward + backward (+ optimizer)); other batch sizes follow the line through it along
        the local slope. ``h2d`` is the looked-up copy time (constant), ``split`` the
        forward/backward/optimizer fractions where the source separates them, ``memory`` the
        card's capacity with the persistent memory and the peak (along its local slope) where
        the source has them, ``model_transfer_s`` where it has one, the ``collective``
        interconnect of the card's form factor. A published fit is returned as it is (it is
        a model in (g, b) already). ``batch`` defaults to the entry's.
        """
        check_workload_model(workload, self.model)
        g = self.accelerators if accelerators is None else accelerators
        if batch is not None and batch != self.batch:
            raise UserError(
                f"this profile entry was looked up for batch {self.batch}, not {batch}: "
                "look the batch size up again"
            )
        if g < 1:
            raise UserError(f"accelerators must be at least 1, got {g}")
        record = {
            "method": f"profile database lookup: {self.method}",
            "database": "store/profiles/profiledb.toml",
            "source_id": self.source_id,
            "accelerator": self.accelerator,
            "model": self.model,
            "batch": self.batch,
            "rows": list(self.rows),
        }
        if self.fit is not None:
            return dataclasses.replace(
                self.fit,
                workload=workload,
                source=f"{self.fit.source} [profile database: {self.source_id}, {self.method}]",
                fit={**(self.fit.fit or {}), **record},
            )
        b = self.batch
        slope = self.slopes.get("compute_s", 0.0)
        std = max(0.0, self.compute_std_s)
        compute = Normal(
            mean=Linear(b=slope, const=self.compute_s - slope * b), std=Linear(const=std)
        )
        h2d = Normal(mean=Linear(const=self.h2d_s)) if self.h2d_s else Normal()
        split = None
        if self.forward_s is not None and self.backward_s is not None:
            optimizer = self.optimizer_s or 0.0
            total = self.forward_s + self.backward_s + optimizer
            if total > 0:
                forward, optimizer = self.forward_s / total, optimizer / total
                split = Split(forward, 1.0 - forward - optimizer, optimizer)
        memory = None
        if self.capacity_bytes is not None and self.peak_bytes is not None:
            peak_slope = self.slopes.get("peak_bytes", 0.0)
            memory = Memory(
                capacity_bytes=self.capacity_bytes,
                persistent_bytes=max(0.0, self.persistent_bytes or 0.0),
                peak_bytes=Linear(b=peak_slope, const=self.peak_bytes - peak_slope * b),
            )
        return SleepProfile(
            workload=workload,
            accelerator=self.accelerator_name,
            source=f"profile database ({self.method}): {self.describe()}",
            compute=compute,
            h2d=h2d,
            table=(TablePoint(g=g, b=b, mean=self.compute_s, std=std),),
            fit=record,
            split=split,
            memory=memory,
            model_transfer_s=self.model_transfer_s or 0.0,
            collective=Collective(interconnect=self.interconnect)
            if self.interconnect
            else Collective(),
            host=dict(self.host) if self.host is not None else None,
        )


def check_workload_model(workload: str, model: str) -> None:
    """A workload's sleep variant emulates its own model; an image workload any image model."""
    if model == workload or (workload in IMAGE_WORKLOADS and model not in NON_IMAGE_MODELS):
        return
    if workload in IMAGE_WORKLOADS:
        raise UserError(
            f"the {workload} workload reads images: it can emulate an image model, not {model}"
        )
    raise UserError(
        f"the {workload} workload emulates only its own model ({workload}), not {model}; "
        "other models are for the image workloads (resnet18, resnet50, alexnet)"
    )


class ProfileDatabase:
    """Every table of ``profiledb.toml``, indexed by (accelerator, model)."""

    def __init__(
        self,
        accelerators: Mapping[str, Accelerator],
        sources: Mapping[str, Source],
        tables: Iterable[Table],
        default_order: tuple[str, ...],
    ) -> None:
        self.accelerators = dict(accelerators)
        self.sources = dict(sources)
        self.default_order = default_order
        self.tables: dict[tuple[str, str], list[Table]] = {}
        for table in tables:
            self.tables.setdefault((table.accelerator, table.model), []).append(table)
        rank = {s: i for i, s in enumerate(default_order)}
        for tables_of in self.tables.values():
            tables_of.sort(key=lambda t: rank.get(t.source.id, len(rank)))

    # -- names -------------------------------------------------------------------------------

    def accelerator(self, name: str) -> Accelerator:
        """The accelerator a short name (``a100``) or a full name names; a UserError lists them."""
        found = next((a for a in self.accelerators.values() if a.matches(name)), None)
        if found is None:
            known = ", ".join(f"{a.key} ({a.name})" for a in self.accelerators.values())
            raise UserError(f"unknown accelerator {name!r}: choose one of {known}")
        return found

    def models(self, accelerator: str | None = None) -> list[str]:
        """Models covered (on one accelerator, given its key)."""
        return sorted({m for a, m in self.tables if accelerator in (None, a)})

    def accelerators_for(self, model: str) -> list[str]:
        return [a for a in self.accelerators if (a, model) in self.tables]

    # -- lookup ------------------------------------------------------------------------------

    def lookup(
        self,
        accelerator: str,
        model: str,
        batch: int,
        *,
        accelerators: int = 1,
        source: str | None = None,
    ) -> ProfileEntry:
        """The entry for ``model`` (or a workload's name) on ``accelerator`` at per-accelerator
        batch ``batch`` (see the module doc for the rules); a request the database does not
        cover is a UserError saying what it covers."""
        acc = self.accelerator(accelerator)
        model = model.strip().lower()
        if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or batch < 1:
            raise UserError(f"batch size must be a whole number of at least 1, got {batch!r}")
        if accelerators < 1:
            raise UserError(f"accelerators must be at least 1, got {accelerators}")
        candidates = self.tables.get((acc.key, model), [])
        if not candidates and acc.key == HOST_CPU:
            raise UserError(
                f"{HOST_CPU} is this host's CPU, measured here (not a table of the database): "
                f"`{measure_command(model, int(batch))}` measures it, and `trace --accelerator "
                f"{HOST_CPU}` does so once by itself"
            )
        if not candidates:
            raise UserError(self._uncovered(acc, model))
        if source is not None:
            if source not in self.sources:
                raise UserError(
                    f"unknown profile source {source!r}: choose one of {', '.join(self.sources)}"
                )
            chosen = [t for t in candidates if t.source.id == source]
            if not chosen:
                have = ", ".join(t.source.id for t in candidates)
                raise UserError(
                    f"source {source} has no {model} on {acc.key}: {model} on {acc.key} comes "
                    f"from {have}"
                )
            candidates = chosen
        entries = [self._entry(acc, t, int(batch), accelerators) for t in candidates]
        # A row at the batch beats an interpolation, which beats an extrapolation; then order.
        return min(entries, key=lambda e: METHODS.index(e.method))

    def _uncovered(self, acc: Accelerator, model: str) -> str:
        here = self.models(acc.key)
        elsewhere = self.accelerators_for(model)
        where = (
            f"{model} is covered on {', '.join(elsewhere)}"
            if elsewhere
            else f"{model} is in no table (models: {', '.join(self.models())})"
        )
        return (
            f"the profile database has no {model} on {acc.key} ({acc.name}): {where}; "
            f"{acc.key} covers {', '.join(here) or 'nothing'} (./cli.py profiles lists it all)"
        )

    def _entry(self, acc: Accelerator, table: Table, batch: int, g: int) -> ProfileEntry:
        common = {
            "accelerator": acc.key,
            "accelerator_name": table.card,
            "model": table.model,
            "batch": batch,
            "source_id": table.source.id,
            "source": f"{table.source.cite}: {table.origin}",
            "capacity_bytes": acc.capacity_bytes,
            "capacity_source": acc.capacity_source,
            "interconnect": acc.interconnect,
            "accelerators": g,
            "host": table.host,
        }
        if table.fit is not None:
            fit = table.fit
            b = fit.profile_batch(batch, g)
            mean, std = fit.compute_params(g, b)
            h2d, _ = fit.h2d.params(g, b)
            low, high = table.batch_range
            notes = (
                ()
                if low <= b <= high
                else (
                    f"outside the fitted batch range {low}-{high}"
                    + (" (global batch)" if fit.batch == "global" else ""),
                )
            )
            return ProfileEntry(
                **common,
                method="fit",
                rows=table.batch_range,
                compute_s=max(0.0, mean),
                compute_std_s=std,
                h2d_s=h2d,
                slopes={"compute_s": fit.compute.mean.b},
                notes=notes,
                fit=fit,
            )
        values, slopes, method, rows = estimate(table.batch, table.values, batch)
        named = dict(zip(COLUMNS, values.tolist(), strict=True))
        notes = []
        if table.measured_max is not None and batch > table.measured_max:
            notes.append(
                f"GPEmu measured this model on this card up to batch {table.measured_max}; "
                "its rows beyond continue the curve by regression"
            )
        if named["persistent_bytes"] < 0:
            notes.append(
                "the table's persistent memory is negative here (a regression row): taken as 0"
            )
        if (
            named["forward_s"] == named["forward_s"]
            and named["optimizer_s"] != named["optimizer_s"]
        ):
            # forward known (not NaN), optimizer not
            notes.append("optimizer step not in the data: compute = forward + backward")

        def known(name: str) -> float | None:
            value = named[name]
            return None if value != value else float(value)

        return ProfileEntry(
            **common,
            method=method,
            rows=rows,
            compute_s=float(named["compute_s"]),
            compute_std_s=known("compute_std_s") or 0.0,
            forward_s=known("forward_s"),
            backward_s=known("backward_s"),
            optimizer_s=known("optimizer_s"),
            h2d_s=known("h2d_s"),
            model_transfer_s=table.model_transfer_s,
            peak_bytes=known("peak_bytes"),
            persistent_bytes=known("persistent_bytes"),
            slopes={c: float(s) for c, s in zip(COLUMNS, slopes, strict=True) if s == s},
            notes=tuple(notes),
        )

    # -- coverage ----------------------------------------------------------------------------

    def describe_coverage(
        self, accelerator: str | None = None, model: str | None = None
    ) -> dict[str, Any]:
        """:meth:`coverage`, and this host's own ``cpu`` measurements (source ``host``), with
        the accelerators and sources they name and the default order (what ``./cli.py
        profiles --json`` prints)."""
        rows = self.coverage(accelerator, model)
        if accelerator is None or self.accelerator(accelerator).key == HOST_CPU:
            rows += host_coverage(model.strip().lower() if model is not None else None)
        accs = {r["accelerator"] for r in rows}
        sources = [dataclasses.asdict(s) for s in self.sources.values()]
        sources.append(
            {
                "id": "host",
                "title": "this host",
                "kind": "host",
                "text": "measured on this host by profile measure, cached by the host's "
                f"record in {host_profiles_dir()} (store/hostprofiles.py)",
                "cite": "profile measure on this host",
            }
        )
        used = {r["source_id"] for r in rows}
        return {
            "default_order": list(self.default_order),
            "accelerators": [
                dataclasses.asdict(a) for a in self.accelerators.values() if a.key in accs
            ],
            "sources": [s for s in sources if s["id"] in used],
            "coverage": rows,
        }

    def coverage(
        self, accelerator: str | None = None, model: str | None = None
    ) -> list[dict[str, Any]]:
        """One record per (accelerator, model, source): the card as the source names it, its
        capacity and whether the table has memory figures (else no memory is emulated), the
        batch range and number of measured sizes, kind (``table`` or ``fit``), whether it is
        the first choice for the pair, the source. Filters as ``lookup`` names them."""
        key = self.accelerator(accelerator).key if accelerator is not None else None
        wanted = model.strip().lower() if model is not None else None
        if wanted is not None and not any(m == wanted for _, m in self.tables):
            raise UserError(
                f"the profile database has no {wanted}: it covers {', '.join(self.models())}"
            )
        rows = []
        for acc in self.accelerators.values():
            if key not in (None, acc.key):
                continue
            for m in self.models(acc.key):
                if wanted not in (None, m):
                    continue
                for i, table in enumerate(self.tables[(acc.key, m)]):
                    low, high = table.batch_range
                    rows.append(
                        {
                            "accelerator": acc.key,
                            "accelerator_name": table.card,
                            "capacity_bytes": acc.capacity_bytes,
                            "memory": bool(
                                np.isfinite(table.values[:, COLUMNS.index("peak_bytes")]).any()
                            ),
                            "model": m,
                            "source_id": table.source.id,
                            "kind": "fit" if table.fit is not None else "table",
                            "batch_min": low,
                            "batch_max": high,
                            "batch_sizes": len(table.batch),
                            "measured_max": table.measured_max,
                            "default": i == 0,
                            "cite": table.source.cite,
                        }
                    )
        return rows


# ---------------------------------------------------------------------------------------------
# Loading


def _row_tables(source: Source, rows: list[Mapping[str, Any]], cards: Cards) -> list[Table]:
    """The tables of a ``rows`` source: its rows grouped by (accelerator, model)."""
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((cards(row["accelerator"]).key, row["model"]), []).append(row)
    tables = []
    for (acc, model), items in grouped.items():
        items = sorted(items, key=lambda r: r["batch"])
        values = table_values({"compute_std_s": 0.0, **r} for r in items)
        points = ", ".join(
            f"batch {r['batch']}: {r['compute_s']} s"
            + (f" + {r['h2d_s']} s host-to-device" if "h2d_s" in r else "")
            for r in items
        )
        tables.append(
            Table(
                source=source,
                accelerator=acc,
                card=str(items[0].get("card", acc.upper())),
                model=model,
                batch=np.array([r["batch"] for r in items], dtype=int),
                values=values,
                origin=f"{model} on {items[0].get('card', acc.upper())}: {points}",
            )
        )
    return tables


def _profile_tables(
    source: Source, items: list[Mapping[str, Any]], folder: Path, cards: Cards
) -> list[Table]:
    """The tables of a ``fits`` or ``measured`` source: one per profile file (``folder`` /
    the item's ``profile``), a published fit as it is, a measured profile by its
    single-accelerator table points."""
    tables = []
    for item in items:
        acc = cards(item["accelerator"])
        profile = load_profile(folder / item["profile"])
        table = functools.partial(
            Table,
            source=source,
            accelerator=acc.key,
            card=profile.accelerator,
            model=item["model"],
            origin=f"{item['profile']}: {profile.source}",
        )
        if source.kind == "fits":
            batch_range = np.array([item["batch_min"], item["batch_max"]], dtype=int)
            tables.append(table(batch=batch_range, values=np.empty((0, len(COLUMNS))), fit=profile))
            continue
        points = sorted((p for p in profile.table if p.g == 1), key=lambda p: p.b)
        if not points:
            raise UserError(f"{item['profile']} has no single-accelerator table points")
        values = table_values(
            {
                "compute_s": p.mean,
                "compute_std_s": p.std,
                "forward_s": p.forward,
                "backward_s": p.backward,
                "optimizer_s": p.optimizer,
                "h2d_s": profile.h2d.mean(1, p.b) if p.h2d is None else p.h2d,
                "peak_bytes": p.peak_bytes,
                "persistent_bytes": p.persistent_bytes,
            }
            for p in points
        )
        batch = np.array([p.b for p in points], dtype=int)
        tables.append(table(batch=batch, values=values, host=profile.host))
    return tables


def load_database(path: Path = DATABASE) -> ProfileDatabase:
    """Read ``profiledb.toml`` and the tables it names (see the module doc)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"profile database {path} does not exist: restore it from git") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"profile database {path} is not valid TOML: {exc}") from None
    data = versioned.upgrade(DATABASE_LAYOUT, data, f"profile database {path}")
    accelerators = {
        key: Accelerator(
            key=key,
            name=item["name"],
            names=tuple(item.get("names", ())),
            capacity_bytes=int(item["capacity_gib"] * 2**30) if "capacity_gib" in item else None,
            capacity_source=item.get("capacity_source", ""),
            interconnect=item.get("interconnect"),
        )
        for key, item in data["accelerators"].items()
    }

    def cards(name: str) -> Accelerator:
        found = next((a for a in accelerators.values() if a.matches(name)), None)
        if found is None:
            raise UserError(f"profile database {path}: accelerator {name!r} is not declared")
        return found

    sources: dict[str, Source] = {}
    tables: list[Table] = []
    for sid, item in data["sources"].items():
        source = Source(
            id=sid, title=item["title"], kind=item["kind"], text=item["source"], cite=item["cite"]
        )
        sources[sid] = source
        if source.kind == "gpemu":
            tables += gpemu_tables(source, item, path.parent, cards)
        elif source.kind == "rows":
            tables += _row_tables(source, item["rows"], cards)
        elif source.kind == "fits":
            # The published fits are kept in the default profiles the images ship.
            tables += _profile_tables(source, item["fits"], PROFILES_DIR, cards)
        elif source.kind == "measured":
            items = list(item.get("profiles", ()))
            if "folder" in item:
                items += _measured_items(path.parent, item["folder"], accelerators)
            tables += _profile_tables(source, items, path.parent, cards)
        else:
            raise UserError(
                f"profile database {path}: source {sid} has unknown kind {source.kind!r}"
            )
    order = tuple(data.get("default_order", sources))
    unknown = sorted(set(order) - set(sources))
    if unknown or set(order) != set(sources):
        raise UserError(
            f"profile database {path}: default_order must list every source once "
            f"(sources: {', '.join(sources)})"
        )
    return ProfileDatabase(accelerators, sources, tables, order)


def _measured_items(
    root: Path, folder: str, accelerators: dict[str, Accelerator]
) -> list[dict[str, Any]]:
    """The entries of a folder of measured profiles; accelerators not declared in the
    database are declared from the profile's ``measured.database`` record (its card and
    memory)."""
    items = []
    for file in sorted((root / folder).glob("*.json")):
        profile = load_profile(file)
        record = (profile.measured or {}).get("database")
        if not isinstance(record, dict) or not {"accelerator", "model"} <= set(record):
            raise UserError(
                f"measured profile {file} has no measured.database record naming its "
                "accelerator and model: file it again with ./cli.py profile measure --db"
            )
        key = str(record["accelerator"])
        if key not in accelerators:
            capacity = profile.memory.capacity_bytes if profile.memory is not None else None
            accelerators[key] = Accelerator(
                key=key,
                name=profile.accelerator,
                names=(profile.accelerator,),
                capacity_bytes=capacity,
                capacity_source=(
                    f"measured by profile measure ({file.name}): the device's total memory"
                    if capacity is not None
                    else "not measured"
                ),
            )
        items.append(
            {"accelerator": key, "model": record["model"], "profile": f"{folder}/{file.name}"}
        )
    return items


def check_fileable(options: Mapping[str, Any]) -> None:
    """Refuse (UserError) to file the profile of a fused array of models (the image option
    ``array_size`` above 1): the database keys one model, the array's profile is a file of its
    own."""
    try:
        size = int(options.get("array_size", 1) or 1)
    except (TypeError, ValueError):
        return  # the workload's options check says what is wrong
    if size > 1:
        raise UserError(
            f"a fused array's profile (array_size {size}) is not an entry of the profile "
            "database, which keys one model: write it with --out FILE and trace with "
            "--profile FILE"
        )


def add_measured(
    profile: SleepProfile, accelerator: str, replace: bool = False, path: Path = DATABASE
) -> Path:
    """File a measured profile in the database as ``(accelerator, profile.workload)``;
    returns the file written. An existing entry is only overwritten with ``replace``."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", accelerator):
        raise UserError(
            f"accelerator name {accelerator!r} for the profile database: use lower-case letters, "
            "digits, '-', '_' and '.', e.g. cpu-epyc or h100"
        )
    if accelerator == HOST_CPU:
        raise UserError(
            f"{HOST_CPU} is this host's CPU, cached per host, not a database entry: file a CPU "
            "measurement under another name (--accelerator cpu-NAME) to ship it"
        )
    if profile.measured is None:
        raise UserError("only profiles made by profile measure can be filed in the database")
    check_fileable(profile.measured.get("options") or {})
    db = load_database(path)
    declared = db.accelerators.get(accelerator)
    folder = path.parent / "measured"
    dest = folder / f"{accelerator}-{profile.workload}.json"
    if dest.exists() and not replace:
        raise UserError(
            f"the profile database already has a measured entry for {accelerator}/"
            f"{profile.workload} ({dest}): give --replace to overwrite it"
        )
    record = {
        "accelerator": accelerator,
        "model": profile.workload,
        "declared": declared.name if declared is not None else None,
    }
    filed = dataclasses.replace(profile, measured={**profile.measured, "database": record})
    folder.mkdir(parents=True, exist_ok=True)
    previous = dest.read_bytes() if dest.exists() else None
    filed.save(dest)
    try:
        load_database(path)
    except UserError:
        if previous is None:
            dest.unlink()
        else:
            dest.write_bytes(previous)
        raise
    default_database.cache_clear()
    return dest


@functools.cache
def default_database() -> ProfileDatabase:
    """The shipped database, read once per process."""
    return load_database(DATABASE)


def lookup(
    accelerator: str,
    workload_or_model: str,
    batch: int,
    *,
    accelerators: int = 1,
    source: str | None = None,
) -> ProfileEntry:
    """:meth:`ProfileDatabase.lookup` in the shipped database."""
    return default_database().lookup(
        accelerator, workload_or_model, batch, accelerators=accelerators, source=source
    )


def sleep_profile_for(
    workload: str,
    accelerator: str,
    batch: int,
    accelerators: int = 1,
    model: str | None = None,
    source: str | None = None,
    options: Mapping[str, Any] | None = None,
    threads: int | None = None,
) -> SleepProfile:
    """The sleep profile of ``workload`` emulating ``model`` (default: the workload's own) on
    ``accelerator`` at per-accelerator ``batch`` with ``accelerators`` ranks. ``cpu`` is this
    host's CPU (:func:`store.hostprofiles.host_cpu_profile`: this host's measurement with
    the workload ``options``, at ``threads`` torch threads a rank; a UserError with the command
    that measures it when there is none yet)."""
    model = (model or workload).strip().lower()
    check_workload_model(workload, model)
    if is_host_cpu(accelerator) and source is None:
        return host_cpu_profile(workload, batch, accelerators, model, options, threads)
    entry = lookup(accelerator, model, batch, accelerators=accelerators, source=source)
    return entry.to_sleep_profile(workload, accelerators, batch)


def is_host_cpu(accelerator: str | None) -> bool:
    """Whether ``accelerator`` names this host's CPU (``cpu``) in the shipped database."""
    return accelerator is not None and default_database().accelerator(accelerator).key == HOST_CPU
