"""The gpufs "file grouping" study: data stall per epoch against the group size G, traced.

Image classification on a cold page cache, the same images stored in the folder layout (one
JPEG per file, ImageNet's class folders) and in grouped layouts (G JPEGs concatenated per group
file plus an index; a loader item is one group, a step reads ``batch_size / G`` of them). The
published result (AlexNet, cold cache, 8 loader workers): 419 s of data stall per epoch
ungrouped -> 261 (G=2) -> 176 (4) -> 117 (8) -> 66 (16) -> 47 s (32), compute unchanged;
GPEmu's plot of the same experiment: 410, 265, 174, 114, 67, 35 s (:data:`PUBLISHED`).

An experiment file with ``kind = "grouping"``::

    [experiment]
    name = "grouping"

    [study]
    kind = "grouping"
    workload = "alexnet"          # an image workload: alexnet, resnet18, resnet50
    variant = "sleep"             # sleep (emulated accelerator) or instrumented (real CPU steps)
    accelerator = "v100"          # sleep only: the profile database's accelerator ...
    profile_model = "alexnet"     # ... and model (default: the workload's own)
    batch_size = 32               # a multiple of every group size
    workers = 2                   # DataLoader workers
    epochs = 2                    # cold epochs measured per layout (see below)
    group_sizes = [1, 2, 4, 8, 16, 32]
    seed = 0                      # the runs' seed (shuffling); round r uses seed + r
    timeout_s = 600               # optional: a run still going after this is stopped, failed
    options = {image_size = 112}  # the workload's --set options
    accuracy_epochs = 0           # N > 0: also train each layout N epochs for real, evaluating
                                  # after each (needs learnable and val_images below)

    [study.dataset]               # the images every layout holds (datagen.images' params)
    images = 2048                 # a multiple of batch_size and of the largest group size
    val_images = 0                # a val split every layout shares (a multiple of every G)
    mean_kb = 110.0               # optional: mean_kb, size_sigma, min_kb, quality, classes,
    seed = 0                      # distinct_images, learnable (ImageGenParams), seed

Every key but ``kind`` has the default shown (``timeout_s``: none, ``options``: none,
``profile_model``: the workload, ``[study.dataset]``: 2048 images, the generator's defaults
otherwise); unknown keys are refused when the file is loaded, and so is ``[[datasets]]``: the
study generates its own layouts.

**The layouts hold exactly the same images.** :func:`plan_layouts` draws the image plan of
``datagen.images`` for the folder layout, takes its first ``images + val_images`` sizes and asks
every layout for exactly their total: the folder layout then writes those images (no shrunk
last one) and a grouped one the same images in whole groups of G (the generator writes only
full groups, and the same seed with a rounded size would give each G a different set). The val
split is the last ``val_images`` images in every layout (none by default): its share,
``val_images / (images + val_images)``, is whole groups of every G because ``val_images`` is a
multiple of every group size. They are written under ``OUT/NAME/data/<layout>``
(``folder``, ``g1``, ``g2``, ...) and reused while their manifest matches;
:func:`check_same_images` then lists each layout as the workload does and refuses to go on
unless every one holds the same image names, sizes and labels.

**Runs.** Each measured epoch is a traced run of one epoch after the page cache is dropped
(``tracing.host.drop_caches``): a second epoch in the same run would read from the page cache.
``epochs`` rounds, each tracing every layout once (in reverse order every other round, so that
a drift of the host does not favour one end of the curve), round ``r`` with seed ``seed + r``.
The cache is dropped after the run's request is made (making it checks the dataset, which
reads the start of every group file), and the dataset's bytes still cached then are recorded
(``cached_before_bytes``, ``tracing.host.resident_bytes``). No evaluation, no checkpoint.

**Accuracy** (``accuracy_epochs`` N > 0, a ``learnable`` dataset with ``val_images``): what
grouping costs in what the model learns. After the stall runs, each layout gets one more traced
run on a cold cache: the ``original`` variant (the real model; the study's ``options``, e.g.
its learning rate) trains N epochs with the study's seed, shuffling as the layout's loader
does (gpufs' way: the group files shuffled each epoch, a group's images together in one batch;
the folder layout shuffles images), and evaluates on the val split after every epoch (MLPerf's
``eval_accuracy``). Per epoch (:func:`analysis.grouping.accuracy_by_epoch`): top-1, top-5 and
the loss on the val split, the epoch's seconds, and its opens, read calls and bytes of the
training files. Shuffling the samples within a batch is not a variant of its own: a step's
gradient is the mean over its batch, and the batch norms' statistics are over the batch too,
whatever order its samples come in.

Runs go to ``OUT/NAME/runs``; ``OUT/NAME/grouping-state.json`` records each completed one, so an
interrupted study resumes with the runs it lacks (while the settings and dataset are
unchanged).

**What is measured** (:func:`analysis.grouping.epoch_evidence`, over the epoch interval of the
lowest rank):

- ``data_stall_s``: the sum of its ``load_batch_mem`` durations, the time the training loop
  waited for the loader (the first step's wait, the workers' start-up included, is also
  reported alone: ``first_wait_s``); ``compute_s``: its ``all_compute`` durations (emulated
  host-to-device copy and compute); ``epoch_s``: the epoch's wall time;
- from the syscall trace, the dataset's files only (the JPEGs or group files, by path under the
  data mount): ``opens`` (successful ``openat``), ``reads`` and ``read_bytes`` (calls weighted by
  ``count``), ``mean_read_bytes``, and the time in those calls summed over the loader workers
  (``open_s``, ``read_s``, ``io_s`` their sum);
- from the block trace, the read requests that completed in the epoch and that the run's
  container issued (``in_container``) or that read the dataset's blocks (the block layer also
  dispatches requests from its own worker threads, outside the container): ``block_reads``,
  ``block_read_bytes``, ``mean_block_read_bytes``, ``block_busy_s`` (time some read was in
  flight), ``sequential_fraction`` (of the requests that have a predecessor on their device,
  in issue order, the fraction starting at the byte where it ended) and
  ``mean_sequential_run_bytes`` (bytes per run of such requests);
- where the layout's files lie on the disk (:func:`experiments.study_state.dataset_extents`,
  FIEMAP; a file system on a disk or partition), the part of those bytes that is the
  dataset's files (``block_dataset_bytes``, in ``block_dataset_reads`` requests, and their own
  ``dataset_sequential_fraction``) and the rest (``block_other_bytes``: file-system metadata
  such as inode tables, and library pages the loader workers fault in).

Each run also records ``other_cpu_cores`` (:func:`analysis.samples.other_cpu_cores`): the
cores something outside the run kept busy during its epoch, from the samples; above
:data:`experiments.study_state.BUSY_HOST_CORES` the study warns that the run was disturbed (on
a 2-core host another job halves the loaders).

A layout's figures are the medians over its epochs (:func:`analysis.grouping.layout_rows`: one
disturbed epoch does not move them; ``data_stall_min_s`` and ``_max_s`` give the spread).
``normalised_stall`` divides by the folder layout's stall, ``normalised_io`` its time in the
dataset's opens and reads by the folder layout's; the published curves are divided by their own
ungrouped value.

**Output** in ``OUT/NAME/``: ``grouping.json`` (:data:`RESULTS`, ``kind: "grouping"``, stamped
by :mod:`core.versioned`: settings, dataset, every run with its directory and figures,
per-layout figures, the published curves with their sources, the accuracy runs (``accuracy``,
None without them); :func:`load_results` checks it)
and ``grouping.html`` (:func:`analysis.grouping.grouping_figure`: normalised data stall against
G beside both published curves, and the evidence: stall and compute seconds, opens and reads per
epoch, mean request sizes, bytes from disk, sequentiality). ``docs/grouping.md`` has a
measured result.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.grouping import (
    accuracy_by_epoch,
    grouping_figure,
    layout_rows,
    run_evidence,
    table_lines,
)
from core.errors import UserError
from experiments import study_state
from experiments.study import Setting, validate
from experiments.study_state import IMAGE_WORKLOAD, IMAGE_WORKLOADS, Log, dataset_files
from store.rundir import Run

#: Version of the layout of ``grouping.json``; bump on any change, with a migration from the
#: old one in :data:`RESULTS`.
SCHEMA_VERSION = 2
KIND = "grouping"
#: ``grouping.json``: the study's results; its figure and state files. 2: ``accuracy`` (None
#: for a study without accuracy runs).
RESULTS, RESULTS_NAME, FIGURE_NAME, STATE_NAME = study_state.study_files(
    KIND, SCHEMA_VERSION, migrations={1: lambda body: {**body, "accuracy": None}}
)

#: The ``[study]`` table's keys (``[study.dataset]``'s are :data:`DATASET_SETTINGS`).
SETTINGS = (
    Setting("workload", "choice", "alexnet", choices=IMAGE_WORKLOADS, says=IMAGE_WORKLOAD),
    Setting(
        "variant",
        "choice",
        "sleep",
        choices=("sleep", "instrumented"),
        why="their training loop logs the loader waits",
    ),
    Setting("accelerator", "name", "v100"),
    Setting("profile_model", "name"),
    Setting("batch_size", "whole", 32, low=1, high=1 << 16),
    Setting("workers", "whole", 2, low=0, high=256),
    Setting("epochs", "whole", 2, low=1, high=1000),
    Setting("group_sizes", "wholes", (1, 2, 4, 8, 16, 32), low=1, high=65536),
    Setting("seed", "whole", 0, low=0, high=2**31 - 1),
    Setting("timeout_s", "positive", unit="seconds"),
    Setting("options", "table", {}),
    Setting("dataset", "table", {}),
    Setting("accuracy_epochs", "whole", 0, low=0, high=1000),
)
DEFAULT_IMAGES = 2048
#: ``[study.dataset]``: the image count and the generator's seed ...
DATASET_SETTINGS = (
    Setting("images", "whole", DEFAULT_IMAGES, low=1, high=100_000_000),
    Setting("seed", "whole", 0, low=0, high=2**32 - 1),
    Setting("val_images", "whole", 0, low=0, high=100_000_000),
)
#: ... and ImageGenParams fields, checked by the generator's own rules.
IMAGE_PARAMS = (
    "mean_kb",
    "size_sigma",
    "min_kb",
    "quality",
    "classes",
    "distinct_images",
    "learnable",
)
FOLDER = "folder"
#: Variants whose training loop logs ``load_batch_mem`` and ``all_compute``.
STALL_VARIANTS = ("sleep", "instrumented")

#: The published curves: data stall per epoch (s) by group size, 0 standing for the ungrouped
#: layout (one JPEG per file).
PUBLISHED: Mapping[str, Mapping[str, Any]] = {
    "gpufs": {
        "label": "gpufs (published)",
        "source": (
            "gpufs file grouping, as summarised in the project's reference notes "
            "(shared/REFERENCE.md section 2): AlexNet, cold cache, 8 loader workers, data stall "
            "per epoch, compute unchanged"
        ),
        "points": {0: 419.0, 2: 261.0, 4: 176.0, 8: 117.0, 16: 66.0, 32: 47.0},
    },
    "gpemu": {
        "label": "GPEmu (plot data)",
        "source": (
            "GPEmu repository mengwanguc/gpemu, plots/new/group/perf/perf.csv at commit "
            "4d83544275187a760912f4172eaf42afd0236652 (column Stall, s; its File Group Size 1, "
            "one image per file, is the ungrouped baseline; Compute 95 s and Transfer 3 s at "
            "every size; size 64: 35 s)"
        ),
        "points": {0: 410.0, 2: 265.0, 4: 174.0, 8: 114.0, 16: 67.0, 32: 35.0, 64: 35.0},
        "compute_s": 95.0,
        "transfer_s": 3.0,
    },
}


# --------------------------------------------------------------------------------------------
# The study file


@dataclasses.dataclass(frozen=True)
class GroupingSpec:
    """A validated ``[study]`` table (see the module docstring)."""

    workload: str
    variant: str
    accelerator: str | None
    profile_model: str | None
    batch_size: int
    workers: int
    epochs: int
    group_sizes: tuple[int, ...]
    seed: int
    timeout_s: float | None
    options: Mapping[str, Any]
    images: int
    dataset_seed: int
    image_params: Mapping[str, Any]
    accuracy_epochs: int = 0
    val_images: int = 0

    @property
    def layouts(self) -> tuple[tuple[str, int], ...]:
        """(name, group size) of every layout, the folder layout (group size 0) first."""
        return ((FOLDER, 0), *((layout_name(g), g) for g in self.group_sizes))

    def settings(self) -> dict[str, Any]:
        """Everything that makes the study's runs what they are (recorded, fingerprinted)."""
        return {
            "workload": self.workload,
            "variant": self.variant,
            "accelerator": self.accelerator,
            "profile_model": self.profile_model,
            "batch_size": self.batch_size,
            "workers": self.workers,
            "epochs": self.epochs,
            "group_sizes": list(self.group_sizes),
            "seed": self.seed,
            "timeout_s": self.timeout_s,
            "options": dict(self.options),
            "dataset": {
                "images": self.images,
                "seed": self.dataset_seed,
                **({"val_images": self.val_images} if self.val_images else {}),
                **self.image_params,
            },
            # Only when on: the studies run before it existed keep their fingerprints.
            **({"accuracy_epochs": self.accuracy_epochs} if self.accuracy_epochs else {}),
        }


def layout_name(group_size: int) -> str:
    """``folder`` for group size 0, else ``g<G>``."""
    return f"g{group_size}" if group_size else FOLDER


def parse_spec(spec: Mapping[str, Any], where: str = "[study]") -> GroupingSpec:
    """Validate a ``[study]`` table (without ``kind``); one-line UserErrors naming the key."""
    from workloads.registry import WORKLOADS

    s = validate(SETTINGS, spec, where)
    if s["variant"] != "sleep" and "accelerator" not in spec:
        s["accelerator"] = None  # the default emulated card applies to the sleep variant only
    odd = [g for g in s["group_sizes"] if s["batch_size"] % g]
    if odd:
        raise UserError(
            f"{where}: batch_size {s['batch_size']} is not a multiple of group size {odd[0]} (a "
            "loader item is one group): use a batch size that every group size divides"
        )
    WORKLOADS[s["workload"]].parse_options(s["options"])
    images, dataset_seed, val_images, params = _parse_dataset(
        s.pop("dataset"), where, s["batch_size"], s["group_sizes"]
    )
    if s["accuracy_epochs"] and not (params.get("learnable") and val_images):
        raise UserError(
            f"{where}: accuracy_epochs needs labels a model can learn and images to evaluate "
            "it on: set learnable = true and val_images in [study.dataset]"
        )
    parsed = GroupingSpec(
        **s,
        images=images,
        dataset_seed=dataset_seed,
        image_params=params,
        val_images=val_images,
    )
    if parsed.accelerator is not None or parsed.profile_model is not None:
        from tracing.request import accelerator_profile

        # The profile database's lookup, now: a card or model it lacks fails at load time.
        accelerator_profile(
            WORKLOADS[parsed.workload].config(
                parsed.variant, batch_size=parsed.batch_size, workers=parsed.workers
            ),
            parsed.accelerator,
            parsed.profile_model,
        )
    return parsed


def _parse_dataset(
    table: Any, where: str, batch_size: int, group_sizes: Sequence[int]
) -> tuple[int, int, int, dict[str, Any]]:
    from datagen.images import ImageGenParams

    where = f"{where} dataset"
    if not isinstance(table, dict):
        raise UserError(f"{where}: must be a table, got {table!r}")
    own = [s.name for s in DATASET_SETTINGS]
    unknown = sorted(set(table) - {*own, *IMAGE_PARAMS})
    if unknown:
        known = ", ".join([*own, *IMAGE_PARAMS])
        raise UserError(f"{where}: unknown key {unknown[0]!r}; known keys: {known}")
    checked = validate(DATASET_SETTINGS, {k: v for k, v in table.items() if k in own}, where)
    images, seed, val = checked["images"], checked["seed"], checked["val_images"]
    unit = math.lcm(batch_size, *group_sizes)
    if images % unit:
        low, high = images // unit * unit, (images // unit + 1) * unit
        nearest = f"{low} or {high}" if low else str(high)
        raise UserError(
            f"{where}: images {images} is not a multiple of {unit} (the batch size and every "
            f"group size must divide it, so that every layout holds the same images in whole "
            f"steps): use {nearest}"
        )
    groups = math.lcm(*group_sizes)
    if val % groups:
        up = (val // groups + 1) * groups
        raise UserError(
            f"{where}: val_images {val} is not a multiple of {groups} (every group size must "
            f"divide it, so that every layout holds the same val images): use {up}"
        )
    params = {k: v for k, v in table.items() if k not in own}
    ImageGenParams(**params)  # the generator's own checks (ranges), as one-line UserErrors
    return images, seed, val, params


def check_study(study: Any) -> None:
    """Validate a loaded study (:class:`experiments.studies.Study`) of kind ``grouping``."""
    if study.datasets:
        raise UserError(
            f"{study.path}: the grouping study generates its own layouts from [study.dataset]: "
            "remove [[datasets]]"
        )
    parse_spec(study.spec, f"{study.path}: [study]")


# --------------------------------------------------------------------------------------------
# The layouts


def image_params(spec: GroupingSpec, group_size: int) -> Any:
    """The generator's params of one layout: the study's, ``group_size``, and the val split
    of ``val_images`` (none by default): a share that gives every layout the same last
    ``val_images`` images, as whole groups."""
    from datagen.images import ImageGenParams

    fraction = spec.val_images / (spec.images + spec.val_images)
    return ImageGenParams(**spec.image_params, group_size=group_size, val_fraction=fraction)


def plan_layouts(spec: GroupingSpec) -> tuple[int, np.ndarray]:
    """(dataset bytes, image sizes): the first ``spec.images`` images of the folder layout's
    plan, which every layout asked for exactly these bytes writes (see the module doc)."""
    from datagen.images import plan_images

    params = image_params(spec, 0)
    count = spec.images + spec.val_images
    guess = int(count * params.mean_kb * 1000 * 2) + 10**6
    while True:
        plan = plan_images(guess, spec.dataset_seed, params)
        if plan.images > count:
            sizes = plan.sizes[:count].copy()
            return int(sizes.sum()), sizes
        guess *= 2


def _matches(manifest: Mapping[str, Any], spec: GroupingSpec, size: int, group_size: int) -> bool:
    params = dataclasses.asdict(image_params(spec, group_size))
    # The manifest records the pool actually drawn: at most one distinct image per file.
    count = spec.images + spec.val_images
    params["distinct_images"] = (
        count if spec.image_params.get("learnable") else min(params["distinct_images"], count)
    )
    have = manifest.get("params", {})
    return (
        manifest.get("seed") == spec.dataset_seed
        and manifest.get("requested_bytes") == size
        and have.get("images") == count
        and all(have.get(k) == v for k, v in params.items())
    )


def ensure_layouts(spec: GroupingSpec, data_root: Path, log: Log) -> dict[str, Path]:
    """Generate every layout under ``data_root`` (reusing one whose manifest matches); name ->
    path, folder first."""
    from datagen.common import load_manifest as load_data_manifest
    from datagen.images import generate_images

    size, _ = plan_layouts(spec)
    paths = {}
    for name, group_size in spec.layouts:
        path = Path(data_root) / name
        manifest = None
        if (path / "manifest.json").is_file():
            manifest = load_data_manifest(path)
        if manifest is None or not _matches(manifest, spec, size, group_size):
            log(
                f"generating layout {name}: {spec.images + spec.val_images} images, "
                f"{size / 1e6:.1f} MB in {path}"
            )
            generate_images(
                path,
                size,
                seed=spec.dataset_seed,
                force=path.exists(),
                params=image_params(spec, group_size),
            )
        paths[name] = path
    return paths


def layout_images(path: Path, split: str = "train") -> list[tuple[str, int, int]]:
    """(name in the folder layout, bytes, label) of every image of ``split`` (train or val) of
    the dataset at ``path``, sorted, as the workload lists it (``workloads.images.files``)."""
    from workloads.images.files import load_image_data

    data = load_image_data(path)
    items = data.train if split == "train" else data.val
    if data.layout == "folder":
        return sorted(
            (s.path.relative_to(path).as_posix(), s.path.stat().st_size, s.label)
            for s in items  # type: ignore[union-attr]
        )
    return sorted(
        (m.name, m.size, m.label)
        for g in items  # type: ignore[union-attr]
        for m in g.members  # type: ignore[union-attr]
    )


def check_same_images(layouts: Mapping[str, Path]) -> dict[str, Any]:
    """Refuse (UserError) unless every layout holds the same images (names, sizes, labels, as
    the workload lists them) and its files' bytes add up to theirs; return the dataset's
    description (images, bytes, files per layout)."""
    from datagen.common import load_manifest as load_data_manifest

    reference: list[tuple[str, int, int]] | None = None
    first = ""
    described: dict[str, Any] = {}
    val_reference: list[tuple[str, int, int]] | None = None
    for name, path in layouts.items():
        images = layout_images(path)
        val = layout_images(path, "val")
        files = train_files(path)
        total = sum(size for _, size, _ in images)
        if val_reference is None:
            val_reference = val
        elif val != val_reference:
            raise UserError(
                f"layouts {first} and {name} do not hold the same val images ({len(val_reference)}"
                f" and {len(val)}): delete {path} and run the study again"
            )
        if reference is None:
            reference, first = images, name
        elif images != reference:
            ours, theirs = set(images), set(reference)
            differ = sorted(ours ^ theirs)[:1] or ["their order"]
            raise UserError(
                f"layouts {first} and {name} do not hold the same images ({len(reference)} and "
                f"{len(images)} images; first difference: {differ[0]}): delete {path} and run "
                "the study again"
            )
        if sum(size for _, size in files) != total:
            raise UserError(
                f"{path}: its files hold {sum(s for _, s in files)} bytes, its images {total}: "
                f"delete it and run the study again"
            )
        manifest = load_data_manifest(path)
        described[name] = {
            "path": str(path),
            "group_size": int(manifest["params"]["group_size"]),
            "files": len(files),
            "bytes": total,
        }
    assert reference is not None
    return {
        "images": len(reference),
        "val_images": len(val_reference or []),
        "bytes": sum(size for _, size, _ in reference),
        "mean_image_bytes": sum(size for _, size, _ in reference) / len(reference),
        "layouts": described,
    }


# --------------------------------------------------------------------------------------------
# Paths, published curves, results file


def train_files(path: Path) -> list[tuple[str, int]]:
    """(name, bytes) of the training split's image or group files (:func:`dataset_files`
    without the val split's: an epoch reads these)."""
    return [(n, b) for n, b in dataset_files(path) if n.startswith("train/")]


def container_paths(files: Iterable[tuple[str, int]], mount: str = "/data") -> list[str]:
    """The paths inside the container of a dataset's files (``dataset_files`` names)."""
    return [f"{mount.rstrip('/')}/{name}" for name, _ in files]


def published_curves() -> dict[str, Any]:
    """:data:`PUBLISHED` with each curve normalised to its ungrouped value (JSON-ready: group
    sizes as numbers, 0 = ungrouped)."""
    out = {}
    for key, curve in PUBLISHED.items():
        points = curve["points"]
        base = points[0]
        out[key] = {
            **{k: v for k, v in curve.items() if k != "points"},
            "points": [
                {"group_size": g, "data_stall_s": s, "normalised_stall": s / base}
                for g, s in sorted(points.items())
            ],
        }
    return out


def load_results(path: Path) -> dict[str, Any]:
    """Read ``grouping.json``, refusing another kind or schema version."""
    return study_state.load_results(path, RESULTS)


# --------------------------------------------------------------------------------------------
# Running it


#: The round of an accuracy run in :func:`run_order`.
ACCURACY = -1
#: What trains in the accuracy runs: the real model (the sleep variant has none to evaluate).
ACCURACY_VARIANT = "original"


def run_order(spec: GroupingSpec) -> list[tuple[int, str, int]]:
    """(round, layout, group size) of every run, in the order they run: every layout once per
    round, reversed every other round; then, with ``accuracy_epochs``, each layout's accuracy
    run (round :data:`ACCURACY`)."""
    order = []
    for r in range(spec.epochs):
        layouts = spec.layouts if r % 2 == 0 else tuple(reversed(spec.layouts))
        order.extend((r, name, g) for name, g in layouts)
    if spec.accuracy_epochs:
        order.extend((ACCURACY, name, g) for name, g in spec.layouts)
    return order


def run_key(run: tuple[int, str, int]) -> str:
    """The state's name of a run of :func:`run_order`: ``<layout>-e<round>``, or
    ``<layout>-accuracy``."""
    r, name, _ = run
    return f"{name}-accuracy" if r == ACCURACY else f"{name}-e{r}"


def run_study(study: Any, out: Path, data: Mapping[str, Path], log: Log = print) -> Path:
    """Run the study (see the module doc) under ``out``; return the path of ``grouping.json``.

    ``data`` (the file's ``[[datasets]]``) is empty: the layouts are generated here."""
    from tracing.host import drop_caches, resident_bytes

    del data  # check_study refuses [[datasets]]
    spec = parse_spec(study.spec, f"{study.path}: [study]")
    out, runs_root, started = study_state.study_home(out)
    layouts = ensure_layouts(spec, out / "data", log)
    dataset = check_same_images(layouts)
    log(
        f"{dataset['images']} images ({dataset['bytes'] / 1e6:.1f} MB) in every layout: "
        + ", ".join(f"{n} {d['files']} files" for n, d in dataset["layouts"].items())
    )
    files = {name: container_paths(train_files(path)) for name, path in layouts.items()}
    extents = {name: study_state.dataset_extents(path) for name, path in layouts.items()}
    host_files = {name: [path / n for n, _ in train_files(path)] for name, path in layouts.items()}
    if any(e is None for e in extents.values()):
        log("the dataset's place on the disk is unknown here: no block_dataset_* figures")
    state_path = out / STATE_NAME
    state = study_state.load_state(state_path, study_state.fingerprint(spec.settings()), log)
    order = run_order(spec)
    for step, key, (r, name, _) in study_state.pending_runs(order, run_key, state, log):
        t0 = time.monotonic()
        if r == ACCURACY:
            log(
                f"{step} {key}: cold cache, training {spec.accuracy_epochs} epochs "
                f"({ACCURACY_VARIANT}), evaluating after each"
            )
            request = study_state.study_request(
                spec, layouts[name], runs_root, log, epochs=spec.accuracy_epochs,
                seed=spec.seed, options=spec.options, variant=ACCURACY_VARIANT,
                accelerator=None, profile_model=None, eval_every=1,
            )  # fmt: skip
        else:
            log(f"{step} {key}: cold cache, tracing one epoch")
            request = study_state.study_request(
                spec, layouts[name], runs_root, log, epochs=1, seed=spec.seed + r,
                options=spec.options,
            )  # fmt: skip
        # After the request is made: making it checks the dataset, which reads the start of
        # every group file and would leave them in the page cache.
        drop_caches()
        cached = sum(resident_bytes(f)[0] for f in host_files[name])
        outcome = study_state.trace_run(
            request, key, state, state_path, t0, cached_before_bytes=cached
        )
        if outcome.error:
            log(f"{step} {key}: {outcome.status}: {outcome.error}")

    def row(item: tuple[int, str, int], entry: Mapping[str, Any], run: Run) -> dict[str, Any]:
        r, name, g = item
        return {
            "layout": name,
            "group_size": g,
            "round": r,
            "run_id": run.run_id,
            "run_dir": str(run.path),
            "status": run.status,
            "lost_events": run.manifest.get("lost_events", 0),
            "duration_s": entry.get("duration_s"),
            "cached_before_bytes": entry.get("cached_before_bytes"),
            **run_evidence(run, files[name], extents[name]),
        }

    stalls = [item for item in order if item[0] != ACCURACY]
    runs, host = study_state.load_runs(stalls, run_key, state, row)

    def trained(item: tuple[int, str, int], entry: Mapping[str, Any], run: Run) -> dict[str, Any]:
        _, name, g = item
        return {
            "layout": name,
            "group_size": g,
            "run_id": run.run_id,
            "run_dir": str(run.path),
            "status": run.status,
            "duration_s": entry.get("duration_s"),
            "epochs": accuracy_by_epoch(run, files[name]),
        }

    accuracy = None
    if spec.accuracy_epochs:
        learned = [item for item in order if item[0] == ACCURACY]
        accuracy = study_state.load_runs(learned, run_key, state, trained)[0]
    study_state.warn_busy(
        {f"{r['layout']} epoch {r['round']}": r["other_cpu_cores"] for r in runs},
        log,
        why="each layout's median over its epochs leaves one such epoch out; ",
    )
    return study_state.finish(
        RESULTS,
        out,
        {
            "name": study.name,
            "description": study.description,
            "dataset": dataset,
            "runs": runs,
            "layouts": layout_rows(runs, spec.layouts),
            "published": published_curves(),
            "accuracy": accuracy,
        },
        host=host,
        settings=spec.settings(),
        started=started,
        figure=grouping_figure,
        table=table_lines,
        log=log,
    )


__all__ = [
    "PUBLISHED",
    "SCHEMA_VERSION",
    "GroupingSpec",
    "check_same_images",
    "check_study",
    "load_results",
    "parse_spec",
    "plan_layouts",
    "run_study",
]
