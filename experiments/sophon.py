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
(:func:`run_figures`): ``epoch_s``; ``net_bytes``, the bytes the training container received
and sent (``container_net_rx`` + ``container_net_tx``, integrated over the epoch: the link's
traffic, headers included); ``storage_cpu_s`` and ``train_cpu_s`` (``container_cpu`` of each,
integrated); ``storage_read_bytes`` (the storage container's traced reads of the dataset, as
evidence that its file I/O is traced); for ``remote-sophon``, the plan
(``offload-plan.json``: samples offloaded, the measured bandwidth, the planned times).

**Output** in ``OUT/NAME/``: ``sophon.json`` (:data:`RESULTS`, ``kind: "sophon"``, stamped by
:mod:`core.versioned`: settings, dataset, runs, per-cell comparisons of SOPHON with the other
modes, the published claim; :func:`load_results` checks it) and ``sophon.html``
(:func:`sophon_figure`: per mode, bytes on the network per epoch, epoch time, storage and
training CPU seconds, per cell).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.samples import sampled_total
from core import versioned
from core.atomic import atomic_write_json, atomic_write_text
from core.errors import UserError
from experiments import study_state
from experiments.study_state import Log, whole_number
from store.rundir import READ_KINDS, Run, git_revision

#: Version of the layout of ``sophon.json``; bump on any change, with a migration from the
#: old one in :data:`RESULTS`.
SCHEMA_VERSION = 1
KIND = "sophon"
#: ``sophon.json``: the study's results.
RESULTS = study_state.results_layout(KIND, SCHEMA_VERSION)
RESULTS_NAME, FIGURE_NAME, STATE_NAME = study_state.file_names(KIND)
MODES = ("remote-nooff", "remote-alloff", "remote-partial", "remote-sophon")
MODE_LABELS = {
    "remote-nooff": "no offload",
    "remote-alloff": "all offload",
    "remote-partial": "partial offload",
    "remote-sophon": "SOPHON (selective)",
}
STUDY_KEYS = (
    "workload",
    "variant",
    "accelerator",
    "batch_size",
    "workers",
    "epochs",
    "modes",
    "bandwidths",
    "storage_cpus",
    "train_cpus",
    "seed",
    "timeout_s",
    "options",
    "dataset",
)
DATASET_KEYS = ("images", "mean_kb", "size_sigma", "min_kb", "quality", "classes", "seed")
#: The published result (REFERENCE.md section 6; HotStorage 2024).
PUBLISHED = {
    "source": "SOPHON, HotStorage 2024 (mengwanguc/sophon)",
    "dataset": "OpenImages: raw mean 0.317 MB, 150,561 B after the crop, 75% of samples shrink",
    "link": "500 Mbit/s cap, measured ~430 Mbit/s",
    "traffic_reduction": [1.2, 2.2],
    "claim": "1.2-2.2x less data traffic and shorter training time than the alternatives",
}
_NS = 1e-9


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
    from workloads.registry import WORKLOADS

    unknown = sorted(set(spec) - set(STUDY_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(STUDY_KEYS)}")
    s = SophonSpec()
    workload = str(spec.get("workload", s.workload))
    if workload not in WORKLOADS or WORKLOADS[workload].datagen != "images":
        image = sorted(n for n, w in WORKLOADS.items() if w.datagen == "images")
        raise UserError(f"{where}: workload must be an image workload ({', '.join(image)})")
    variant = str(spec.get("variant", s.variant))
    if variant not in ("original", "instrumented", "sleep"):
        raise UserError(f"{where}: variant must be original, instrumented or sleep")
    accelerator = spec.get("accelerator")
    if accelerator is not None and variant != "sleep":
        raise UserError(f"{where}: accelerator is for the sleep variant")
    modes = tuple(spec.get("modes", s.modes))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise UserError(f"{where}: modes must be distinct ones of {', '.join(MODES)}")
    bandwidths = tuple(str(b) for b in spec.get("bandwidths", s.bandwidths))
    if not bandwidths:
        raise UserError(f'{where}: bandwidths needs at least one cap, e.g. ["430mbit"]')
    for b in bandwidths:
        parse_rate(b)
    cpus = spec.get("storage_cpus", list(s.storage_cpus))
    if not cpus or not all(
        isinstance(c, int | float) and not isinstance(c, bool) and 0 < c <= 64 for c in cpus
    ):
        raise UserError(f"{where}: storage_cpus must be a list of CPU counts in (0, 64]")
    train_cpus = spec.get("train_cpus")
    if train_cpus is not None and not (isinstance(train_cpus, int | float) and train_cpus > 0):
        raise UserError(f"{where}: train_cpus must be a positive number of CPUs")
    options = dict(spec.get("options") or {})
    if "dataset" in options or "storage_host" in options:
        raise UserError(f"{where}: options set dataset and storage_host per run: leave them out")
    ImageOptions.from_dict(options)
    timeout = spec.get("timeout_s")
    if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
        raise UserError(f"{where}: timeout_s must be a positive number of seconds")
    dataset = dict(spec.get("dataset") or {})
    unknown = sorted(set(dataset) - set(DATASET_KEYS))
    if unknown:
        raise UserError(
            f"{where}.dataset: unknown key {unknown[0]!r}; known: {', '.join(DATASET_KEYS)}"
        )
    return SophonSpec(
        workload=workload,
        variant=variant,
        accelerator=str(accelerator) if accelerator is not None else None,
        batch_size=whole_number(spec.get("batch_size", s.batch_size), "batch_size", where, 1, 4096),
        workers=whole_number(spec.get("workers", s.workers), "workers", where, 0, 64),
        epochs=whole_number(spec.get("epochs", s.epochs), "epochs", where, 1, 100),
        modes=modes,
        bandwidths=bandwidths,
        storage_cpus=tuple(float(c) for c in cpus),
        train_cpus=float(train_cpus) if train_cpus is not None else None,
        seed=whole_number(spec.get("seed", s.seed), "seed", where, 0, 2**31),
        timeout_s=float(timeout) if timeout is not None else None,
        options=options,
        dataset=dataset,
    )


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
# Figures of one run


def epoch_interval(run: Run, role: str = "main") -> tuple[int, int, int]:
    """(epoch, start_ns, end_ns) of the last epoch ``role`` logged."""
    phases = run.phases
    rows = phases[
        (phases["key"].astype(str) == "epoch")
        & (phases["kind"].astype(str) == "interval")
        & (phases["container"].astype(str) == role)
    ]
    if rows.empty:
        raise UserError(f"run {run.run_id} logged no epoch for {role}")
    last = rows.sort_values("ts_ns").iloc[-1]
    return int(last["epoch"]), int(last["ts_ns"]), int(last["end_ns"])


def run_figures(run: Run) -> dict[str, Any]:
    """What the study measures in one run (module doc), over its last epoch."""
    epoch, t0, t1 = epoch_interval(run)
    s = run.samples
    rx = sampled_total(s, "container_net_rx", "main", t0, t1)
    tx = sampled_total(s, "container_net_tx", "main", t0, t1)
    events = run.events
    reads = events[
        events["kind"].astype(str).isin(READ_KINDS)
        & (events["container"].astype(str) == "storage")
        & events["path"].astype(str).str.startswith("/data/")
        & (events["ts_ns"] >= t0)
        & (events["ts_ns"] <= t1)
        & (events["ret"] >= 0)
    ]
    figures: dict[str, Any] = {
        "epoch": epoch,
        "epoch_s": (t1 - t0) * _NS,
        "net_bytes": rx + tx,
        "net_rx_bytes": rx,
        "net_tx_bytes": tx,
        "storage_cpu_s": sampled_total(s, "container_cpu", "storage", t0, t1) / 100,
        "train_cpu_s": sampled_total(s, "container_cpu", "main", t0, t1) / 100,
        "storage_read_bytes": int(reads["bytes"].sum()),
    }
    plan = run.path / "out" / "main" / "offload-plan.json"
    if plan.exists():
        data = json.loads(plan.read_text())
        figures["plan"] = {k: v for k, v in data.items() if k not in ("stages", "stage_names")}
    return figures


# ---------------------------------------------------------------------------------------------
# Results


def cell_name(bandwidth: str, cpus: float) -> str:
    return f"{bandwidth}, storage {cpus:g} CPU"


def compare_cells(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (bandwidth, storage CPUs) cell: each mode's figures, and SOPHON's traffic and epoch
    time as fractions of each other mode's (a value below 1: SOPHON less)."""
    cells: dict[str, dict[str, Any]] = {}
    for r in runs:
        cell = cells.setdefault(
            r["cell"],
            {
                "cell": r["cell"],
                "bandwidth": r["bandwidth"],
                "storage_cpus": r["storage_cpus"],
                "modes": {},
            },
        )
        cell["modes"][r["mode"]] = r["figures"]
    for cell in cells.values():
        sophon = cell["modes"].get("remote-sophon")
        if sophon is None:
            continue
        cell["sophon_vs"] = {
            mode: {
                "traffic_ratio": _ratio(f["net_bytes"], sophon["net_bytes"]),
                "epoch_ratio": _ratio(f["epoch_s"], sophon["epoch_s"]),
            }
            for mode, f in cell["modes"].items()
            if mode != "remote-sophon"
        }
    return list(cells.values())


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def load_results(path: Path) -> dict[str, Any]:
    """Read ``sophon.json``, refusing another kind or schema version."""
    return study_state.load_results(path, RESULTS)


SHORT_LABELS = {
    "remote-nooff": "no offload",
    "remote-alloff": "all offload",
    "remote-partial": "partial",
    "remote-sophon": "SOPHON",
}


def table_lines(result: Mapping[str, Any]) -> list[str]:
    """The per-mode figures of every cell, as text under 80 columns (what the study prints)."""
    lines = [
        f"{'cell':<16} {'mode':<11} {'net MB':>7} {'epoch s':>7} {'storage':>7} {'train':>6} "
        f"{'offload':>7}",
        f"{'':<16} {'':<11} {'/epoch':>7} {'':>7} {'CPU s':>7} {'CPU s':>6} {'':>7}",
    ]
    for cell in result["cells"]:
        name = f"{cell['bandwidth']}/{cell['storage_cpus']:g}cpu"
        for mode in MODES:
            f = cell["modes"].get(mode)
            if f is None:
                continue
            plan = f.get("plan") or {}
            offloaded = f"{plan['offloaded']}/{plan['samples']}" if plan else ""
            lines.append(
                f"{name:<16} {SHORT_LABELS[mode]:<11} {f['net_bytes'] / 1e6:>7.2f} "
                f"{f['epoch_s']:>7.2f} {f['storage_cpu_s']:>7.2f} {f['train_cpu_s']:>6.2f} "
                f"{offloaded:>7}"
            )
        for mode, ratio in (cell.get("sophon_vs") or {}).items():
            lines.append(
                f"{'':<16} {SHORT_LABELS[mode]} / SOPHON: traffic {ratio['traffic_ratio']:.2f}x, "
                f"epoch {ratio['epoch_ratio']:.2f}x"
            )
    lines.append("published: 1.2-2.2x less traffic and shorter training than the alternatives")
    return lines


def sophon_figure(result: Mapping[str, Any]) -> go.Figure:
    """Four panels, one bar group per cell, one bar per mode: network MB per epoch, epoch
    seconds, storage CPU seconds, training CPU seconds."""
    panels = (
        ("net_bytes", "bytes on the network per epoch (MB)", 1e-6),
        ("epoch_s", "epoch time (s)", 1.0),
        ("storage_cpu_s", "storage CPU (s per epoch)", 1.0),
        ("train_cpu_s", "training CPU (s per epoch)", 1.0),
    )
    fig = make_subplots(rows=2, cols=2, subplot_titles=[title for _, title, _ in panels])
    cells = [c["cell"] for c in result["cells"]]
    colors = dict(zip(MODES, ("#7f7f7f", "#d62728", "#1f77b4", "#2ca02c"), strict=True))
    for i, (field, _, scale) in enumerate(panels):
        row, col = divmod(i, 2)
        for mode in MODES:
            ys = [
                (c["modes"][mode][field] * scale) if mode in c["modes"] else None
                for c in result["cells"]
            ]
            if all(y is None for y in ys):
                continue
            fig.add_trace(
                go.Bar(
                    x=cells,
                    y=ys,
                    name=MODE_LABELS[mode],
                    marker_color=colors[mode],
                    legendgroup=mode,
                    showlegend=i == 0,
                ),
                row=row + 1,
                col=col + 1,
            )
    fig.update_layout(
        barmode="group",
        height=800,
        title=f"SOPHON study: {result['settings']['workload']} ({result['settings']['variant']}), "
        f"{result['dataset']['images']} images of {result['dataset']['mean_bytes'] / 1e3:.0f} kB "
        f"mean; published: {PUBLISHED['claim']}",
    )
    return fig


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
    result = versioned.stamp(
        RESULTS,
        {
            "git_revision": git_revision(),
            "host": host,
            "settings": {k: v for k, v in dataclasses.asdict(spec).items() if k != "dataset"},
            "dataset": {**dataset, "path": str(dataset_dir), "params": dict(spec.dataset)},
            "runs": runs,
            "cells": compare_cells(runs),
            "published": PUBLISHED,
            "study_s": round(time.monotonic() - started, 1),
        },
    )
    path = out / RESULTS_NAME
    atomic_write_json(path, result)
    atomic_write_text(out / FIGURE_NAME, sophon_figure(result).to_html(include_plotlyjs=True))
    for line in table_lines(result):
        log(line)
    return path
