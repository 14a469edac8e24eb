"""The SOPHON study: near-storage preprocessing offload, four modes x bandwidth caps x storage
CPUs, traced (docs/sophon.md).

Each run is a two-role topology (:mod:`tracing.remote`): a ``storage`` container serving the
dataset (``--prep-workers`` processes under a ``--storage-cpus`` limit) and a ``main`` container
training on it in one of the remote modes (``remote-nooff``, ``remote-alloff``,
``remote-partial``, ``remote-sophon``), every container's network capped at the bandwidth with
``tc`` (``--net-bandwidth``). The published result (SOPHON, HotStorage 2024, OpenImages on a
500 Mbit/s link measured at ~430): 1.2-2.2x less traffic and shorter training than the
alternatives (:data:`PUBLISHED`).

An experiment file with ``kind = "sophon"``::

    [experiment]
    name = "sophon"

    [study]
    kind = "sophon"
    workload = "resnet18"        # an image workload
    variant = "sleep"            # sleep: an emulated accelerator (the data path is the bottleneck)
    accelerator = "v100"         # optional: the profile database's accelerator (sleep only)
    batch_size = 16
    workers = 2                  # the training container's DataLoader workers
    epochs = 2                   # the last one is measured (the first starts the workers)
    modes = ["remote-nooff", "remote-alloff", "remote-partial", "remote-sophon"]
    bandwidths = ["40mbit", "80mbit"]   # --net-bandwidth caps
    storage_cpus = [0.5, 1.0]    # the storage container's CPU limit; its prep workers: ceil()
    train_cpus = 1.0             # optional: the training container's CPU limit
    seed = 0
    timeout_s = 900              # optional: a run still going after this fails
    options = {image_size = 224} # the workload's --set options (not dataset)

    [study.dataset]              # datagen.images' params: OpenImages-like sizes by default
    images = 192
    mean_kb = 317.0
    size_sigma = 0.7
    seed = 0

**Order.** For each (bandwidth, storage CPUs) cell, the four modes back to back, cells in the
order of the file; ``OUT/NAME/sophon-state.json`` records each completed run, so an interrupted
study resumes with the runs it lacks.

**What is measured**, over the last epoch interval of the training container
(:func:`analysis.sophon.run_figures`): ``epoch_s``; ``net_bytes``, the bytes the training
container received and sent (``container_net_rx`` + ``container_net_tx``, integrated over the epoch: the link's
traffic, headers included); ``storage_cpu_s`` and ``train_cpu_s`` (``container_cpu`` of each,
integrated); ``storage_read_bytes`` (the storage container's traced reads of the dataset, as
evidence that its file I/O is traced); for ``remote-sophon``, the plan
(``offload-plan.json``: samples offloaded, the measured bandwidth, the planned times).

**Output** in ``OUT/NAME/``: ``sophon.json`` (:data:`RESULTS`, ``kind: "sophon"``, stamped by
:mod:`core.versioned`: settings, dataset, runs, per-cell comparisons of SOPHON with the other
modes, the published claim; :func:`load_results` checks it) and ``sophon.html``
(:func:`analysis.sophon.sophon_figure`: per mode, bytes on the network per epoch, epoch time,
storage and training CPU seconds, per cell).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from analysis.sophon import (
    MODES,
    PUBLISHED,
    cell_name,
    compare_cells,
    run_figures,
    sophon_figure,
    table_lines,
)
from core.errors import UserError
from experiments import study_state
from experiments.study import Setting, validate
from experiments.study_state import IMAGE_WORKLOAD, IMAGE_WORKLOADS, Log
from store.rundir import Run

#: Version of the layout of ``sophon.json``; bump on any change, with a migration from the
#: old one in :data:`RESULTS`.
SCHEMA_VERSION = 1
KIND = "sophon"
#: ``sophon.json``: the study's results; its figure and state files.
RESULTS, RESULTS_NAME, FIGURE_NAME, STATE_NAME = study_state.study_files(KIND, SCHEMA_VERSION)
#: The ``[study]`` table's keys, with the defaults of :class:`SophonSpec`.
SETTINGS = (
    Setting("workload", "choice", "resnet18", choices=IMAGE_WORKLOADS, says=IMAGE_WORKLOAD),
    Setting("variant", "choice", "sleep", choices=("original", "instrumented", "sleep")),
    Setting("accelerator", "name"),
    Setting("batch_size", "whole", 16, low=1, high=4096),
    Setting("workers", "whole", 2, low=0, high=64),
    Setting("epochs", "whole", 2, low=1, high=100),
    Setting("modes", "choices", MODES, choices=MODES),
    Setting("bandwidths", "texts", ("40mbit", "80mbit"), why='caps such as "430mbit"'),
    Setting("storage_cpus", "numbers", (0.5, 1.0), low=0, high=64, why="CPU counts"),
    Setting("train_cpus", "positive", unit="CPUs"),
    Setting("seed", "whole", 0, low=0, high=2**31),
    Setting("timeout_s", "positive", unit="seconds"),
    Setting("options", "table", {}),
    Setting("dataset", "table", {}),
)
DATASET_KEYS = ("images", "mean_kb", "size_sigma", "min_kb", "quality", "classes", "seed")


@dataclasses.dataclass(frozen=True)
class SophonSpec:
    """A parsed ``[study]`` table (the module doc lists the keys)."""

    workload: str = "resnet18"
    variant: str = "sleep"
    accelerator: str | None = None
    batch_size: int = 16
    workers: int = 2
    epochs: int = 2
    modes: tuple[str, ...] = MODES
    bandwidths: tuple[str, ...] = ("40mbit", "80mbit")
    storage_cpus: tuple[float, ...] = (0.5, 1.0)
    train_cpus: float | None = None
    seed: int = 0
    timeout_s: float | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dataset: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def images(self) -> int:
        return int(self.dataset.get("images", 192))


def parse_spec(spec: Mapping[str, Any], where: str = "[study]") -> SophonSpec:
    """Validate a ``[study]`` table (one-line UserErrors naming the key)."""
    from tracing.shaper import parse_rate
    from workloads.images.options import ImageOptions

    s = validate(SETTINGS, spec, where)
    if s["accelerator"] is not None and s["variant"] != "sleep":
        raise UserError(f"{where}: accelerator is for the sleep variant")
    for bandwidth in s["bandwidths"]:
        parse_rate(bandwidth)
    if "dataset" in s["options"] or "storage_host" in s["options"]:
        raise UserError(f"{where}: options set dataset and storage_host per run: leave them out")
    ImageOptions.from_dict(s["options"])
    unknown = sorted(set(s["dataset"]) - set(DATASET_KEYS))
    if unknown:
        raise UserError(
            f"{where}.dataset: unknown key {unknown[0]!r}; known: {', '.join(DATASET_KEYS)}"
        )
    return SophonSpec(**s)


def check_study(study: Any) -> None:
    """Validate the study file (``experiments.studies`` calls it when loading)."""
    if study.datasets:
        raise UserError(f"{study.path}: a sophon study makes its own dataset ([study.dataset])")
    spec = parse_spec(study.spec, f"{study.path}: [study]")
    dataset_params(spec)  # the generator's params checked now too


def dataset_params(spec: SophonSpec) -> Any:
    """``datagen.images`` params of the study's dataset: OpenImages-like by default (mean
    317 kB, log spread 0.7: about three quarters of the files larger than a 224 crop), no val."""
    from datagen.images import ImageGenParams

    given = {k: v for k, v in spec.dataset.items() if k not in ("images", "seed")}
    params = {"mean_kb": 317.0, "size_sigma": 0.7, "classes": 100, **given, "val_fraction": 0.0}
    try:
        return ImageGenParams(**params)
    except TypeError as exc:
        raise UserError(f"[study.dataset]: {exc}") from None


def ensure_dataset(spec: SophonSpec, root: Path, log: Log) -> Path:
    """The study's dataset under ``root``: ``images`` images of :func:`dataset_params`, made
    once and reused while its manifest matches."""
    from datagen.images import generate_images, plan_images

    params = dataset_params(spec)
    seed = int(spec.dataset.get("seed", 0))
    # The size of the first `images` images of the plan: exactly that many are written.
    probe = plan_images(spec.images * int(params.mean_kb * 1000 * 4), seed, params)
    size = int(probe.sizes[: spec.images].sum())
    path = root / "images"
    manifest = path / "manifest.json"
    if manifest.exists():
        try:
            found = json.loads(manifest.read_text())
            made = found.get("params") or {}
            wanted = dataclasses.asdict(params)
            if (
                found.get("total_bytes") == size
                and found.get("seed") == seed
                and made.get("images") == spec.images
                and all(made.get(k) == v for k, v in wanted.items())
            ):
                return path
        except (OSError, ValueError):
            pass
    log(f"generating {spec.images} images ({size / 1e6:.1f} MB) in {path}")
    generate_images(path, size, seed=seed, force=path.exists(), params=params)
    return path


def dataset_summary(path: Path, image_size: int) -> dict[str, Any]:
    """Sizes of the dataset's training images against the crop's RGB size."""
    from workloads.images.files import load_image_data

    train = load_image_data(path).train
    sizes = np.array([s.path.stat().st_size for s in train])  # type: ignore[union-attr]
    crop = image_size * image_size * 3
    return {
        "images": int(len(sizes)),
        "bytes": int(sizes.sum()),
        "mean_bytes": float(sizes.mean()),
        "median_bytes": float(np.median(sizes)),
        "cropped_bytes": crop,
        "tensor_bytes": crop * 4,
        "shrink_fraction": float((sizes > crop).mean()),
    }


# ---------------------------------------------------------------------------------------------
# Results


def load_results(path: Path) -> dict[str, Any]:
    """Read ``sophon.json``, refusing another kind or schema version."""
    return study_state.load_results(path, RESULTS)


# ---------------------------------------------------------------------------------------------
# Running


def run_order(spec: SophonSpec) -> list[tuple[str, float, str]]:
    """(bandwidth, storage CPUs, mode) of every run, in the order they run."""
    return [(b, c, m) for b in spec.bandwidths for c in spec.storage_cpus for m in spec.modes]


def run_key(bandwidth: str, cpus: float, mode: str) -> str:
    return f"{bandwidth}-cpu{cpus:g}-{mode}"


def _key(run: tuple[str, float, str]) -> str:
    return run_key(*run)


def run_study(study: Any, out: Path, data: Mapping[str, Path], log: Log = print) -> Path:
    """Run the study (module doc) under ``out``; return the path of ``sophon.json``."""

    del data  # check_study refuses [[datasets]]
    spec = parse_spec(study.spec, f"{study.path}: [study]")
    out, runs_root, started = study_state.study_home(out)
    dataset_dir = ensure_dataset(spec, out / "data", log)
    image_size = int(spec.options.get("image_size", 224))
    dataset = dataset_summary(dataset_dir, image_size)
    log(
        f"{dataset['images']} images, mean {dataset['mean_bytes'] / 1e3:.0f} kB; "
        f"{dataset['shrink_fraction']:.0%} larger than the {image_size}x{image_size} crop "
        f"({dataset['cropped_bytes']} B)"
    )
    state_path = out / STATE_NAME
    state = study_state.load_state(
        state_path, study_state.fingerprint(dataclasses.asdict(spec)), log
    )
    order = run_order(spec)
    for step, key, (bandwidth, cpus, mode) in study_state.pending_runs(order, _key, state, log):
        log(f"{step} {key}")
        t0 = time.monotonic()
        request = study_state.study_request(
            spec,
            dataset_dir,
            runs_root,
            log,
            epochs=spec.epochs,
            seed=spec.seed,
            options={**{k: str(v) for k, v in spec.options.items()}, "dataset": mode},
            prep_workers=max(1, math.ceil(cpus)),
            storage_cpus=cpus,
            cpus=spec.train_cpus,
            net_bandwidth=bandwidth,
        )
        outcome = study_state.trace_run(request, key, state, state_path, t0)
        if outcome.error:
            log(f"{step} {key}: {outcome.status}: {outcome.error}")

    def row(item: tuple[str, float, str], entry: Mapping[str, Any], run: Run) -> dict[str, Any]:
        bandwidth, cpus, mode = item
        return {
            "cell": cell_name(bandwidth, cpus),
            "bandwidth": bandwidth,
            "storage_cpus": cpus,
            "mode": mode,
            "run_dir": entry["run_dir"],
            "status": entry["status"],
            "figures": run_figures(run),
        }

    runs, host = study_state.load_runs(order, _key, state, row)
    return study_state.finish(
        RESULTS,
        out,
        {
            "dataset": {**dataset, "path": str(dataset_dir), "params": dict(spec.dataset)},
            "runs": runs,
            "cells": compare_cells(runs),
            "published": PUBLISHED,
        },
        host=host,
        settings={k: v for k, v in dataclasses.asdict(spec).items() if k != "dataset"},
        started=started,
        figure=sophon_figure,
        table=table_lines,
        log=log,
    )
