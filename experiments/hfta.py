"""Horizontally fused training arrays (HFTA, MLSys 2021): B models trained three ways, traced.

HFTA trains B same-shaped models of a hyper-parameter sweep as one fused model
(:mod:`workloads.images.fused`). For each array size B this study trains B models of an image
workload, model k at learning rate ``learning_rates[k]``, the same data, seed and settings
otherwise, three ways, every run traced:

- ``serial``: B jobs one after another, each its own run (``serial-j<k>``). The jobs are shared
  between the array sizes: serial at B is jobs 0 .. B-1, which run back to back;
- ``concurrent``: B jobs at once, one container each, in one run (``concurrent-b<B>``; roles
  ``job0`` .. ``job<B-1>``) over the same read-only dataset;
- ``fused``: one job, one data pipeline, training the fused array of the B models (the image
  option ``array_size`` B, ``learning_rates`` theirs) (``fused-b<B>``).

At B = 1 the three modes are one and the same job: run ``serial-j0`` stands for all three.

``variant = "original"`` trains for real on this host's CPU. ``variant = "sleep"`` emulates the
computation with profiles measured by ``./cli.py profile measure`` on the fused model of each
array size (one file per B in ``profiles``, :func:`profile_path`; the study refuses profiles
whose model, options or batch size differ from its own). Concurrent emulated jobs share one
emulated accelerator, as B processes share one GPU: their containers see one lock file
(:data:`workloads.emulation.SHARED_ACCELERATOR_ENV`) and compute one at a time
(``accelerator_wait``).

An experiment file with ``kind = "hfta"`` (or ``./cli.py hfta``, the same settings as
options)::

    [[datasets]]
    name = "images"
    generator = "images"
    size = "40MB"
    mean_kb = 16.0

    [study]
    kind = "hfta"
    dataset = "images"            # a [[datasets]] name (./cli.py hfta: --data DIR)
    workload = "resnet18"         # resnet18, resnet50 or alexnet
    variant = "original"          # original (real CPU training) or sleep (profiles)
    array_sizes = [1, 2, 4, 8]
    learning_rates = [0.1, 0.05, ...]  # optional: one per model, at least max(array_sizes)
    batch_size = 32
    workers = 1                   # DataLoader workers per job
    epochs = 3                    # at least 2: the first is excluded from throughput
    seed = 0
    cold_cache = true             # drop the page cache before serial's first job and before
                                  # every concurrent and fused run
    share_cores = true            # concurrent jobs: each computes with its share of the host's
                                  # cores (max(1, cores // B) torch threads); false: each with a
                                  # thread per core, as a job alone
    memory_limit = ""             # optional: each container's memory limit (its page cache)
    cpus = 0                      # optional: each container's CPU limit (0: none)
    timeout_s = 1800              # optional: a run still going after this fails
    options = {image_size = 64}   # the workload's --set options (not array_size, learning_*)
    profiles = "experiments/hfta-profiles"   # sleep only, optional: cpu-<workload>-x<B>.json
                                  # per B (default: this host's CPU, measured once, cached)
    eval_every = 0                # N > 0: evaluate on the val split every N epochs (original:
                                  # each model's accuracy per epoch, serial vs fused)

A serial or fused job computes with a torch thread per core of the host, as a job alone does.
B concurrent jobs that each did so would run B times as many threads as cores, and torch's
threads, which wait for one another at every operation, then lose most of their time to each
other (docs/hfta.md measures it): with ``share_cores`` each concurrent job computes with
``max(1, cores // B)`` threads (its ``threads`` setting), as one would configure B jobs on one
host, and the operating system shares the cores among them.

Every key but ``kind`` and ``dataset`` has the default shown (``learning_rates``: 0.1 halved
from model to model; ``memory_limit``, ``cpus``, ``timeout_s``: none; ``profiles``: none, each array's
compute measured on this host by :func:`check_profile`); unknown keys are refused when the file is loaded.

**Runs and the page cache.** The runs go in this order: the serial jobs 0 .. max(B) - 1, then
for each B > 1 the concurrent and the fused run. With ``cold_cache`` the page cache is dropped
(:func:`tracing.host.drop_caches`) before the first serial job and before every concurrent and
fused run, after the run's request is made; the dataset bytes still cached then are recorded
(``cached_before_bytes``). The later serial jobs find what the earlier ones left in the cache,
as jobs run back to back do. No checkpoints; with ``eval_every`` N > 0 every job evaluates
its model(s) on the dataset's val split after every N-th epoch, and the results hold each
model's accuracy and loss per epoch in each mode (``convergence``: HFTA's claim that a fused
array's models train as the separate ones do). ``hfta-state.json`` records each
finished run: an interrupted study resumes with the runs it lacks while its settings and
dataset are unchanged.

**What is measured** per run (:func:`run_figures`; per mode and B: :mod:`analysis.hfta`):
per job (container) the samples trained after its first epoch and the span of those epochs
(throughput as HFTA measures it); over the whole run, the dataset's training files in the
system calls of every container: successful ``openat`` calls (``opens``; and per epoch number,
each job's epoch window, the opens of every file summed over the jobs: ``opens_by_epoch``,
with the least and most opened file), read calls and bytes (weighted by ``count``); the block
reads of the dataset's blocks (where the file system can say where they lie, FIEMAP,
:func:`experiments.study_state.dataset_extents`, as for the grouping study; else the
containers' own block reads): ``storage_bytes``; pages brought into the page cache by the
containers (``cache_insert_bytes``); the containers' CPU seconds (``cpu_s``) and their loader
workers' (``loader_cpu_s``) from the samples; the time the emulated jobs waited for the shared
accelerator; the CPU something outside the run used (``other_cpu_cores``; the study warns
above :data:`experiments.study_state.BUSY_HOST_CORES`).

**Output** in the output directory: ``hfta.json`` (:data:`RESULTS`, ``kind: "hfta"``, stamped
by :mod:`core.versioned`: settings, dataset, every run with its directory and figures, a row
per mode and B, the published figure with its source; :func:`load_results` checks it),
``hfta.html`` (the speedup curves and the I/O and CPU per model trained against B), ``runs/``
and the state file.
``docs/hfta.md`` has a measured result.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.extents import DiskExtents
from analysis.hfta import (
    PUBLISHED,
    convergence_rows,
    convergence_summary,
    hfta_figure,
    mode_rows,
    table_lines,
)
from analysis.samples import other_cpu_cores, sampled_total
from analysis.tables import evaluations
from analysis.tables import is_value as _is
from core.errors import UserError
from experiments import study_state
from experiments.study import Setting, validate
from experiments.study_state import IMAGE_WORKLOAD, IMAGE_WORKLOADS, Log
from store.rundir import READ_KINDS, Run

#: Version of the layout of ``hfta.json``; bump on any change, with a migration from the
#: old one in :data:`RESULTS`. 2: ``convergence`` (None for a study without evaluations).
SCHEMA_VERSION = 2
KIND = "hfta"
#: ``hfta.json``: the study's results; its figure and state files.
RESULTS, RESULTS_NAME, FIGURE_NAME, STATE_NAME = study_state.study_files(
    KIND, SCHEMA_VERSION, migrations={1: lambda body: {**body, "convergence": None}}
)
#: Sleep profiles of a 2-thread AMD EPYC (experiments/hfta-profiles/README.md), for
#: ``profiles = "experiments/hfta-profiles"``; by default the study measures this host.
PROFILES_DIR = Path(__file__).resolve().parent / "hfta-profiles"
#: Where the containers of a concurrent emulated run see their shared accelerator's lock.
SHARED_MOUNT = "/twintrace/shared"
VARIANTS = ("original", "sleep")
#: Options the study sets itself, per job.
OWN_OPTIONS = ("array_size", "learning_rate", "learning_rates")

#: The ``[study]`` table's keys (and ``./cli.py hfta``'s options).
SETTINGS = (
    Setting("dataset", "name", says="a [[datasets]] name"),
    Setting("workload", "choice", "resnet18", choices=IMAGE_WORKLOADS, says=IMAGE_WORKLOAD),
    Setting("variant", "choice", "original", choices=VARIANTS),
    Setting("array_sizes", "wholes", (1, 2, 4, 8), low=1, high=64),
    Setting(
        "learning_rates",
        "numbers",
        low=0,
        high=math.inf,
        says="a list of positive numbers, one per model of the largest array",
    ),
    Setting("batch_size", "whole", 32, low=1, high=1 << 16),
    Setting("workers", "whole", 1, low=0, high=64),
    Setting("epochs", "whole", 3, low=2, high=1000),
    Setting("seed", "whole", 0, low=0, high=2**31 - 1),
    Setting("cold_cache", "flag", True),
    Setting("share_cores", "flag", True),
    Setting("memory_limit", "size"),
    Setting("cpus", "limit"),
    Setting("timeout_s", "limit"),
    Setting("options", "table", {}),
    Setting("profiles", "name"),
    Setting("eval_every", "whole", 0, low=0, high=1000),
)
_NS = 1e-9


# --------------------------------------------------------------------------------------------
# Settings


@dataclasses.dataclass(frozen=True)
class HftaSpec:
    """Validated settings of the study (module doc); ``dataset`` is the [[datasets]] name of a
    study file (None for ``./cli.py hfta``, which gives the directory)."""

    workload: str
    variant: str
    array_sizes: tuple[int, ...]
    learning_rates: tuple[float, ...]
    batch_size: int
    workers: int
    epochs: int
    seed: int
    cold_cache: bool
    share_cores: bool
    memory_limit: str | None
    cpus: float | None
    timeout_s: float | None
    options: Mapping[str, Any]
    profiles: Path | None
    dataset: str | None = None
    eval_every: int = 0

    @property
    def jobs(self) -> int:
        """Serial jobs: one per model of the largest array."""
        return max(self.array_sizes)

    def settings(self) -> dict[str, Any]:
        """Everything that makes the study's runs what they are (recorded, fingerprinted)."""
        return {
            "workload": self.workload,
            "variant": self.variant,
            "array_sizes": list(self.array_sizes),
            "learning_rates": list(self.learning_rates),
            "batch_size": self.batch_size,
            "workers": self.workers,
            "epochs": self.epochs,
            "seed": self.seed,
            "cold_cache": self.cold_cache,
            "share_cores": self.share_cores,
            "memory_limit": self.memory_limit,
            "cpus": self.cpus,
            "timeout_s": self.timeout_s,
            "options": dict(self.options),
            "profiles": str(self.profiles) if self.profiles else None,
            # Only when on: the studies run before it existed keep their fingerprints.
            **({"eval_every": self.eval_every} if self.eval_every else {}),
        }


def default_learning_rates(count: int) -> tuple[float, ...]:
    """0.1 halved from one model to the next: ``count`` learning rates of a sweep."""
    return tuple(round(0.1 * 0.5**k, 12) for k in range(count))


def parse_spec(spec: Mapping[str, Any], where: str = "[study]") -> HftaSpec:
    """Validate the study's settings (a ``[study]`` table without ``kind``, or the CLI's);
    one-line UserErrors naming the key."""
    from workloads.registry import WORKLOADS

    s = validate(SETTINGS, spec, where)
    models = max(s["array_sizes"])
    rates = s["learning_rates"]
    if rates is None:
        s["learning_rates"] = default_learning_rates(models)
    elif len(rates) < models:
        raise UserError(
            f"{where}: learning_rates must be a list of at least {models} positive numbers (one "
            f"per model of the largest array), got {list(rates)!r}"
        )
    own = sorted(set(s["options"]) & set(OWN_OPTIONS))
    if own:
        raise UserError(
            f"{where}: options must not set {own[0]}: the study sets each job's array_size and "
            "learning rate (use array_sizes and learning_rates)"
        )
    WORKLOADS[s["workload"]].parse_options(s["options"])
    if s["variant"] == "sleep":
        s["profiles"] = Path(s["profiles"]) if s["profiles"] else None  # None: measured here
    elif s["profiles"] is not None:
        raise UserError(f"{where}: profiles are for the sleep variant; the original one computes")
    parsed = HftaSpec(**s)
    if parsed.variant == "sleep" and parsed.profiles is not None:
        for size in sorted({1, *parsed.array_sizes}):
            check_profile(parsed, size)
    return parsed


def check_study(study: Any) -> None:
    """Validate a loaded study (:class:`experiments.studies.Study`) of kind ``hfta``."""
    spec = parse_spec(study.spec, f"{study.path}: [study]")
    if spec.dataset is None:
        raise UserError(f"{study.path}: [study] needs dataset, the name of an images [[datasets]]")
    dataset = study.dataset(spec.dataset)
    if dataset.generator != "images":
        raise UserError(
            f"{study.path}: study dataset {dataset.name!r} is made by {dataset.generator}; the "
            "image workloads read the images generator's datasets"
        )


# --------------------------------------------------------------------------------------------
# The sleep variant's profiles


def profile_path(spec: HftaSpec, array_size: int) -> Path:
    """The profile of the fused array of ``array_size`` models: ``cpu-<workload>-x<B>.json``
    in the study's profiles folder (B = 1: one model)."""
    assert spec.profiles is not None
    return spec.profiles / f"cpu-{spec.workload}-x{array_size}.json"


def measure_command(spec: HftaSpec, array_size: int, data: str = "DATA") -> str:
    """The ``profile measure`` command that makes :func:`profile_path`'s profile."""
    sets = " ".join(f"--set {k}={v}" for k, v in {**spec.options, "array_size": array_size}.items())
    return (
        f"./cli.py profile measure --workload {spec.workload} --data {data} --batch-sizes "
        f"{spec.batch_size} {sets} --out {profile_path(spec, array_size)}"
    )


def check_profile(
    spec: HftaSpec,
    array_size: int,
    data_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """The profile of an array of ``array_size`` models. Without a ``profiles`` folder, this
    host's CPU: measured once on ``data_dir`` (``experiments/hostprofile.py``), cached by the
    host's record. From a folder: refused (UserError saying how to measure it) unless
    ``profile measure`` made it for this workload, these options (image size, width,
    optimizer) and array size, at the study's batch size; a warning when it was measured on
    another host."""
    from workloads.images.options import ImageOptions
    from workloads.profile import load_profile

    if spec.profiles is None:
        from experiments.hostprofile import ensure_host_profile

        if data_dir is None:
            raise UserError("this host's profiles of the arrays are measured on the dataset")
        options = {**spec.options, "array_size": array_size}
        return ensure_host_profile(
            spec.workload, data_dir, spec.batch_size, options=options, log=log
        )
    path = profile_path(spec, array_size)
    how = f"measure it: {measure_command(spec, array_size)}"
    if not path.is_file():
        raise UserError(f"no sleep profile {path} for arrays of {array_size}: {how}")
    profile = load_profile(path)
    measured = profile.measured or {}
    if profile.workload != spec.workload or "options" not in measured:
        raise UserError(f"{path} is not a profile measure of {spec.workload}: {how}")
    theirs = ImageOptions.from_dict(dict(measured["options"]))
    ours = ImageOptions.from_dict({**spec.options, "array_size": array_size})
    for key in ("array_size", "image_size", "width", "optimizer"):
        if getattr(theirs, key) != getattr(ours, key):
            raise UserError(
                f"{path} was measured with {key} {getattr(theirs, key)}, the study trains with "
                f"{getattr(ours, key)}: {how}"
            )
    if not any(point.b == spec.batch_size for point in profile.table):
        measured_at = sorted({point.b for point in profile.table})
        raise UserError(
            f"{path} was measured at batch sizes {measured_at}, not the study's "
            f"{spec.batch_size}: {how}"
        )
    return path


# --------------------------------------------------------------------------------------------
# The runs' requests


def run_keys(spec: HftaSpec) -> list[str]:
    """Every run, in the order they run (module doc)."""
    keys = [f"serial-j{k}" for k in range(spec.jobs)]
    for size in spec.array_sizes:
        if size > 1:
            keys += [f"concurrent-b{size}", f"fused-b{size}"]
    return keys


def _parse_key(key: str) -> tuple[str, int]:
    mode, _, number = key.partition("-")
    return mode, int(number[1:])


def job_options(spec: HftaSpec, job: int) -> dict[str, Any]:
    """The options of serial or concurrent job ``job``: its learning rate, one model."""
    return {**spec.options, "learning_rate": spec.learning_rates[job]}


def fused_options(spec: HftaSpec, array_size: int) -> dict[str, Any]:
    """The options of the fused array of the first ``array_size`` jobs' models."""
    rates = ",".join(repr(r) for r in spec.learning_rates[:array_size])
    return {**spec.options, "array_size": array_size, "learning_rates": rates}


def concurrent_threads(spec: HftaSpec, array_size: int) -> int:
    """Torch threads of each of ``array_size`` concurrent jobs: with ``share_cores`` their
    share of the host's cores (at least one), else 0 (a thread per core, as a job alone)."""
    if not spec.share_cores:
        return 0
    return max(1, len(os.sched_getaffinity(0)) // array_size)


def run_request(
    spec: HftaSpec, key: str, data_dir: Path, out: Path, log: Callable[[str], None] = print
) -> Any:
    """The :class:`tracing.request.RunRequest` of run ``key`` (module doc)."""
    from tracing.container import BindMount
    from workloads.emulation import SHARED_ACCELERATOR_ENV

    mode, number = _parse_key(key)
    size = 1 if mode == "serial" else number
    options = fused_options(spec, size) if mode == "fused" else job_options(spec, 0)
    if mode == "serial":
        options = job_options(spec, number)
    request = study_state.study_request(
        spec,
        data_dir,
        out / "runs",
        log,
        epochs=spec.epochs,
        seed=spec.seed,
        options=options,
        profile=check_profile(spec, 1 if mode != "fused" else size, data_dir, log)
        if spec.variant == "sleep"
        else None,
        memory_limit=spec.memory_limit,
        cpus=spec.cpus,
        eval_every=spec.eval_every,
    )
    request = dataclasses.replace(request, label=f"{spec.workload}-{key}")
    if mode != "concurrent":
        return request
    (main,) = request.containers
    extra: dict[str, Any] = {}
    if spec.variant == "sleep":  # one emulated accelerator for the B jobs
        shared = out / "shared" / key
        shared.mkdir(parents=True, exist_ok=True)
        extra = {
            "mounts": (*main.mounts, BindMount(shared.resolve(), SHARED_MOUNT, False)),
            "environment": {
                **main.environment,
                SHARED_ACCELERATOR_ENV: f"{SHARED_MOUNT}/accelerator.lock",
            },
        }
    assert main.config is not None
    threads = concurrent_threads(spec, size)
    containers = tuple(
        dataclasses.replace(
            main,
            role=f"job{k}",
            config=main.config.replace(options=job_options(spec, k), threads=threads),
            **extra,
        )
        for k in range(size)
    )
    return dataclasses.replace(request, containers=containers)


# --------------------------------------------------------------------------------------------
# One run's figures


def training_files(data_dir: Path) -> list[str]:
    """The container paths (under /data) of the dataset's training files (JPEGs or group
    files), as the workload lists them."""
    from workloads.images.files import load_image_data

    data_dir = Path(data_dir)
    return sorted(
        f"/data/{item.path.relative_to(data_dir).as_posix()}"
        for item in load_image_data(data_dir).train
    )


def _jobs(run: Run) -> list[str]:
    return [c["role"] for c in run.manifest.get("containers", []) if not c.get("daemon")]


def job_figures(phases: pd.DataFrame, role: str) -> dict[str, Any]:
    """A job's epochs (their windows) and the samples it trained after its first epoch."""
    mine = phases[_is(phases["container"], role) & (phases["rank"] == 0)]
    epochs = mine[_is(mine["kind"], "interval") & _is(mine["key"], "epoch")].sort_values("epoch")
    ends = mine[_is(mine["kind"], "point") & _is(mine["key"], "step_end")]
    values = pd.to_numeric(ends["value"], errors="coerce").fillna(0)
    later = epochs[epochs["epoch"] >= 2]
    return {
        "role": role,
        "epochs": [
            {"epoch": int(e), "start_ns": int(s), "end_ns": int(t)}
            for e, s, t in zip(epochs["epoch"], epochs["ts_ns"], epochs["end_ns"], strict=True)
        ],
        "epoch_s": [float(d) * _NS for d in epochs["duration_ns"]],
        "samples": int(values.sum()),
        "samples_measured": int(values[ends["epoch"].to_numpy() >= 2].sum()),
        "measured_start_ns": int(later["ts_ns"].min()) if len(later) else None,
        "measured_end_ns": int(later["end_ns"].max()) if len(later) else None,
        # Each evaluation (eval_every): the epoch, and top-1, top-5, loss (of an array, the
        # means and each model's: top1_models, ...).
        "evals": evaluations(mine),
    }


def opens_by_epoch(
    events: pd.DataFrame, jobs: Sequence[Mapping[str, Any]], files: Sequence[str]
) -> list[dict[str, Any]]:
    """Per epoch number: how often each training file was opened in that epoch, summed over
    the jobs (each job's own epoch window, its own container's opens); the least and most
    opened file and the total."""
    paths = events["path"].astype("string")
    opened = (
        _is(events["kind"], "openat")
        & (events["ret"].to_numpy() >= 0)
        & paths.isin(set(files)).fillna(False).to_numpy(dtype=bool)
    )
    rows = events[opened]
    ts = rows["ts_ns"].to_numpy(dtype=np.int64)
    count = rows["count"].to_numpy(dtype=np.int64)
    numbers = sorted({e["epoch"] for job in jobs for e in job["epochs"]})
    out = []
    for number in numbers:
        per_file = pd.Series(0, index=pd.Index(files), dtype=np.int64)
        for job in jobs:
            for e in job["epochs"]:
                if e["epoch"] != number:
                    continue
                inside = (
                    _is(rows["container"], job["role"])
                    & (ts >= e["start_ns"])
                    & (ts <= e["end_ns"])
                )
                counted = pd.Series(count[inside]).groupby(paths[opened][inside].to_numpy()).sum()
                per_file = per_file.add(counted, fill_value=0).astype(np.int64)
        out.append(
            {
                "epoch": number,
                "opens": int(per_file.sum()),
                "least_opened": int(per_file.min()) if len(per_file) else 0,
                "most_opened": int(per_file.max()) if len(per_file) else 0,
            }
        )
    return out


def run_figures(
    run: Run, files: Sequence[str], extents: DiskExtents | None = None
) -> dict[str, Any]:
    """The figures of one traced run (module doc) over its whole duration; ``files`` are the
    container paths of the dataset's training files, ``extents`` where the dataset lies on the
    disk (None: the containers' own block reads count)."""
    events, phases, samples = run.events, run.phases, run.samples
    roles = _jobs(run)
    jobs = [job_figures(phases, role) for role in roles]
    start, end = int(run.manifest["start_ns"]), int(run.manifest["end_ns"])
    paths = events["path"].astype("string")
    ours = paths.isin(set(files)).fillna(False).to_numpy(dtype=bool)
    kind = events["kind"].astype("string")
    count = events["count"].to_numpy(dtype=np.int64)
    nbytes = events["bytes"].to_numpy(dtype=np.int64)
    opened = ours & _is(kind, "openat") & (events["ret"].to_numpy() >= 0)
    read = ours & kind.isin(READ_KINDS).fillna(False).to_numpy(dtype=bool)
    blocks = _is(kind, "block_read")
    ts = events["ts_ns"].to_numpy(dtype=np.int64)
    blocks &= (ts > start) & (ts <= end + int(1e9))  # completions just after the end count
    mine = blocks & events["in_container"].fillna(False).to_numpy(dtype=bool)
    if extents is not None:
        inside = extents.event_bytes(events, blocks)
        storage = int(inside.sum())
        other = int(nbytes[mine & (inside == 0)].sum())
    else:
        storage, other = int(nbytes[mine].sum()), None
    read_bytes = int(nbytes[read].sum())
    interval = _is(phases["kind"], "interval")

    def seconds(key: str) -> float:
        return float(phases.loc[interval & _is(phases["key"], key), "duration_ns"].sum()) * _NS

    cpus = int((run.manifest.get("host") or {}).get("cpus") or 0)
    return {
        "run_id": run.run_id,
        "run_dir": str(run.path),
        "status": run.status,
        "lost_events": run.manifest.get("lost_events", 0),
        "duration_s": (end - start) * _NS,
        "jobs": jobs,
        "opens": int(count[opened].sum()),
        "files_opened": int(paths[opened].nunique()),
        "opens_by_epoch": opens_by_epoch(events, jobs, files),
        "read_calls": int(count[read].sum()),
        "read_bytes": read_bytes,
        "storage_bytes": storage,
        "storage_other_bytes": other,
        "storage_from": "dataset extents" if extents is not None else "container block reads",
        "cache_hit_bytes": max(0, read_bytes - storage),
        "cache_insert_bytes": int(nbytes[_is(kind, "cache_add")].sum()),
        "cpu_s": sum(sampled_total(samples, "container_cpu", r, start, end) for r in roles) / 100,
        "loader_cpu_s": sum(
            sampled_total(samples, "container_cpu_loader", r, start, end) for r in roles
        )
        / 100,
        "compute_s": seconds("all_compute"),
        "accelerator_wait_s": seconds("accelerator_wait"),
        "other_cpu_cores": _finite(other_cpu_cores(samples, cpus, start, end)),
    }


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


# --------------------------------------------------------------------------------------------
# Running it


def _fingerprint(spec: HftaSpec, data_dir: Path) -> str:
    from datagen.common import load_manifest as load_data_manifest

    manifest = load_data_manifest(data_dir)
    return study_state.fingerprint(
        {
            "settings": spec.settings(),
            "data": str(Path(data_dir).resolve()),
            "dataset": [manifest.get("seed"), manifest.get("total_bytes"), manifest.get("params")],
        }
    )


def run_hfta(spec: HftaSpec, data_dir: Path, out: Path, log: Log = print) -> Path:
    """Run the study over the image dataset ``data_dir`` into ``out`` (module doc); returns
    the path of ``hfta.json``. Ctrl-C ends the current run cleanly and raises."""
    from tracing.host import drop_caches, resident_bytes
    from workloads.registry import WORKLOADS

    started = time.monotonic()
    data_dir = Path(data_dir).resolve()
    WORKLOADS[spec.workload].check_data(data_dir)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = training_files(data_dir)
    host_files = [data_dir / f.removeprefix("/data/") for f in files]
    dataset_bytes = sum(p.stat().st_size for p in host_files)
    extents = study_state.dataset_extents(data_dir)
    if extents is None:
        log("the dataset's place on the disk is unknown here: the containers' block reads count")
    state_path = out / STATE_NAME
    state = study_state.load_state(state_path, _fingerprint(spec, data_dir), log)
    keys = run_keys(spec)
    log(
        f"{len(keys)} runs: serial jobs 0-{spec.jobs - 1}, then concurrent and fused at B = "
        + ", ".join(str(b) for b in spec.array_sizes if b > 1)
        + f"; {len(files)} training files ({dataset_bytes / 1e6:.1f} MB), {spec.epochs} epochs"
    )
    for step, key, _ in study_state.pending_runs(keys, str, state, log):
        mode, number = _parse_key(key)
        request = run_request(spec, key, data_dir, out, log)
        cold = spec.cold_cache and (mode != "serial" or number == 0)
        if cold:  # after the request: making it checks the dataset
            drop_caches()
        cached = sum(resident_bytes(p)[0] for p in host_files)
        log(
            f"{step} {key}: {len(request.containers)} container(s)"
            + (", cold cache" if cold else f", {cached / 1e6:.1f} MB of the dataset cached")
        )
        t0 = time.monotonic()
        outcome = study_state.trace_run(
            request, key, state, state_path, t0, cached_before_bytes=cached
        )
        log(f"{step} {key}: {outcome.status} in {time.monotonic() - t0:.0f} s")

    def row(key: str, entry: Mapping[str, Any], run: Run) -> dict[str, Any]:
        return {
            "key": key,
            "cached_before_bytes": entry.get("cached_before_bytes"),
            **run_figures(run, files, extents),
        }

    rows, host = study_state.load_runs(keys, str, state, row)
    runs = dict(zip(keys, rows, strict=True))
    study_state.warn_busy({f"run {k}": runs[k]["other_cpu_cores"] for k in keys}, log)
    return study_state.finish(
        RESULTS,
        out,
        {
            "dataset": {
                "path": str(data_dir),
                "training_files": len(files),
                "bytes": dataset_bytes,
                "extents_bytes": extents.bytes if extents is not None else None,
            },
            "runs": runs,
            "rows": mode_rows(runs, spec.array_sizes),
            "convergence": _convergence(runs, spec),
            "published": PUBLISHED,
            # The runs' own time (over every invocation, when resumed) and this invocation's.
            "runs_s": round(sum(state["runs"][k].get("duration_s") or 0.0 for k in keys), 1),
        },
        host=host,
        settings=spec.settings(),
        started=started,
        figure=hfta_figure,
        table=lambda r: table_lines(r["rows"], r.get("convergence")),
        log=log,
    )


def _convergence(runs: Mapping[str, Mapping[str, Any]], spec: HftaSpec) -> dict[str, Any] | None:
    """Each model's validation accuracy and loss per evaluated epoch, serial, concurrent and
    fused (:func:`analysis.hfta.convergence_rows`), and the largest differences; None without
    evaluations."""
    if not spec.eval_every:
        return None
    rows = convergence_rows(runs, spec.array_sizes, spec.learning_rates)
    return {"rows": rows, **convergence_summary(rows)}


def run_study(study: Any, out: Path, data: Mapping[str, Path], log: Log = print) -> Path:
    """Run a study file's ``hfta`` study under ``out`` on its dataset; returns ``hfta.json``."""
    spec = parse_spec(study.spec, f"{study.path}: [study]")
    assert spec.dataset is not None  # check_study
    return run_hfta(spec, data[spec.dataset], out, log)


def load_results(path: Path) -> dict[str, Any]:
    """Read ``hfta.json``, refusing another kind or schema version."""
    return study_state.load_results(path, RESULTS)


__all__ = [
    "SCHEMA_VERSION",
    "HftaSpec",
    "run_request",
    "check_profile",
    "check_study",
    "job_figures",
    "load_results",
    "opens_by_epoch",
    "parse_spec",
    "run_figures",
    "run_hfta",
    "run_keys",
    "run_study",
]
