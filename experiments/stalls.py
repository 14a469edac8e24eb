"""Data stalls of a workload, measured: DS-Analyzer's differential method and its sweeps.

``./cli.py stalls --workload W --data DIR`` (:func:`measure_stalls`) makes the three traced
runs of ``analysis/stalls.py`` on the same settings, one epoch each:

1. ``synthetic``: ``WorkloadConfig.synthetic`` (one batch in memory feeds every step);
2. ``cold``: the page cache dropped (:func:`tracing.host.drop_caches`), then the run;
3. ``cached``: every file of the dataset read on the host first (:func:`tracing.host.warm_files`),
   then the run; its trace must show no block reads in the epoch (checked, else a warning).

Cold runs before cached, in DS-Analyzer's order: the cold run also faults in the code the real
pipeline runs (decoders the synthetic run never touched), so the cached run finds that in
memory too; in the cold run those faults are part of the fetch stall, as on a cold start.

Sweeps (optional, after the three runs):

- cached fraction (:func:`cache_sweep`): a container memory limit bounds the page cache the run
  may use. A limit is not a fraction, so it is set to what the cold run held that cannot be
  reclaimed (its peak of resident memory plus the page cache mapped into its processes or in
  shared memory) plus the requested fraction of the bytes an epoch reads, the cache is
  dropped, and two epochs run: the
  first fills the cache, the second is measured. The fraction is then VERIFIED two ways and
  both are reported beside the requested one: from the trace (``measured_fraction``: 1 - the
  block reads' bytes over the dataset reads' bytes of epoch 2) and with ``mincore(2)`` over the
  dataset's files after the run (``resident_fraction``). Each point also gets the what-if
  model's predictions at its measured fraction, and their errors.
- CPU cores per accelerator (:func:`cores_sweep`): ``--cpus`` = cores x accelerators and as many
  loader workers per accelerator as cores (at least one), on a warm cache (DS-Analyzer's CPU
  scaling runs), one epoch each; throughput per point.

Results: ``stalls.json`` (``analysis.stalls.STALLS``, ``kind: "stalls"``, stamped by
:mod:`core.versioned`; the settings, every run used with its directory, the differential, the
sweeps; :func:`load_results` reads it) and ``stalls.html`` in the results directory, whose
``runs/`` holds the run directories. The JSON is written last, atomically: a directory without
it is an unfinished measurement.

As a study (``[study] kind = "stalls"``, ``./cli.py experiment run FILE.toml``, keys in
:func:`check_study`), the measurement is repeated for every model of ``models`` (the emulated
model of an image workload, ``--profile-model``) and the study adds the figures across models:
fetch and prep stall per model and throughput vs cores per model.

Resuming: each measurement records its runs in ``stalls-state.json`` beside its results
(:mod:`experiments.study_state`); measured again into the same directory with the same settings
(an interrupted study run again), the runs whose directories say they finished are kept, and
only the rest are traced. Other settings start the runs afresh.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.figures import write_figure
from analysis.stalls import (
    PART_COLOURS,
    PART_NAMES,
    STALLS,
    STALLS_STUDY,
    differential,
    epoch_figures,
    stalls_figure,
)
from analysis.tables import interval_rows, kind_mask
from core import versioned
from core.errors import UserError
from core.units import parse_size
from experiments import study_state
from experiments.request import TraceSettings, build_request
from experiments.study import REQUIRED, Setting, validate
from store.rundir import READ_KINDS, Run, load_run
from tracing.container import DATA_MOUNT
from tracing.host import drop_caches, resident_fraction, warm_files
from tracing.runner import trace
from workloads.registry import WORKLOADS

Log = Callable[[str], None]

#: Added to the base of a cache-sweep memory limit: the kernel's own charges
#: (page tables, socket buffers) that the samplers' figures leave out.
MEMORY_MARGIN = 32 << 20
#: A measurement's state file (its runs so far), beside its results.
STATE_NAME = study_state.file_names("stalls")[2]


@dataclasses.dataclass(frozen=True)
class StallSettings:
    """What is measured: one workload configuration (settings as ``./cli.py trace``'s)."""

    workload: str
    data: Path
    variant: str = "sleep"
    accelerator: str | None = None
    profile_model: str | None = None
    accelerators: int = 1
    batch_size: int | None = None
    workers: int | None = None
    max_steps: int = 0
    seed: int = 0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    cpus: float | None = None
    # The dataset's disk read at most this many bytes per second (a slower device, emulated:
    # the cold run's fetch stall grows; cached runs read no disk).
    read_bps: int | None = None

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise UserError(
                f"unknown workload {self.workload!r}: choose one of {', '.join(WORKLOADS)}"
            )
        if self.variant not in ("sleep", "instrumented"):
            raise UserError(
                f"the differential method times each step's phases: use --variant sleep or "
                f"instrumented, not {self.variant}"
            )
        if not Path(self.data).is_dir():
            raise UserError(f"--data {self.data} is not a directory")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "data": str(self.data)}


def dataset_files(data: Path) -> list[Path]:
    """Every regular file of a dataset directory (the manifest included: it is small)."""
    return sorted(p for p in Path(data).rglob("*") if p.is_file())


def epoch_files(run: Run, data: Path, epoch: int) -> list[Path]:
    """The host paths of the dataset files ``run`` read during ``epoch`` (from its trace)."""
    phases = run.phases
    window = interval_rows(phases[phases["epoch"] == epoch], "epoch")
    start, end = int(window["ts_ns"].min()), int(window["end_ns"].max())
    events = run.events
    reads = events[kind_mask(events, READ_KINDS)]
    reads = reads[(reads["ts_ns"] > start) & (reads["ts_ns"] <= end)]
    prefix = DATA_MOUNT.rstrip("/") + "/"
    paths = reads["path"].dropna().unique()
    return sorted(Path(data) / p[len(prefix) :] for p in paths if p.startswith(prefix))


def traced_run(
    s: StallSettings,
    runs_root: Path,
    *,
    synthetic: bool = False,
    epochs: int = 1,
    memory_bytes: int | None = None,
    cpus: float | None = None,
    workers: int | None = None,
    prepare: Callable[[], object] | None = None,
) -> Run:
    """One traced run of ``s``. ``prepare`` (dropping or warming the page cache) is called
    once the request is built and just before the run starts: building it checks the dataset,
    which reads the start of its files."""
    settings: dict[str, Any] = {
        "epochs": epochs,
        "accelerators": s.accelerators,
        "max_steps": s.max_steps,
        "seed": s.seed,
        "checkpoint_every": 0,
        "eval_every": 0,
        "synthetic": synthetic,
    }
    if s.batch_size is not None:
        settings["batch_size"] = s.batch_size
    if workers is not None or s.workers is not None:
        settings["workers"] = workers if workers is not None else s.workers
    request = build_request(
        TraceSettings(
            workload=s.workload,
            variant=s.variant,
            data=Path(s.data),
            options={k: str(v) for k, v in s.options.items()},
            accelerator=s.accelerator,
            profile_model=s.profile_model,
            memory_limit=memory_bytes,
            cpus=cpus if cpus is not None else s.cpus,
            read_limit=s.read_bps,
            quiet=True,
            **settings,
        ),
        runs_root,
    )
    if prepare is not None:
        prepare()
    return load_run(trace(request).check())


def peak_memory(run: Run, metrics: Sequence[str]) -> int:
    """The run's peak of the sum of ``metrics`` (memory samples) over its containers (bytes)."""
    samples = run.samples
    mem = samples[samples["metric"].isin(list(metrics))]
    if not len(mem):
        raise UserError(f"run {run.run_id} has no memory samples: cannot size a memory limit")
    return int(mem.groupby(["container", "ts_ns"])["value"].sum().max())


def _run_entry(run: Run, kind: str, epoch: int = 1) -> dict[str, Any]:
    return {"kind": kind, "run_id": run.run_id, "path": str(run.path), "epoch": epoch}


def measure_stalls(
    s: StallSettings,
    out: Path,
    *,
    cache_fractions: Sequence[float] = (),
    cores: Sequence[float] = (),
    log: Log = print,
) -> dict[str, Any]:
    """The differential runs of ``s`` and the asked-for sweeps; results written under ``out``
    (``stalls.json``, ``stalls.html``, ``runs/``); returns the result."""
    for f in cache_fractions:
        if not 0 <= f <= 1:
            raise UserError(f"cached fractions are between 0 and 1, got {f}")
    for c in cores:
        if c <= 0:
            raise UserError(f"cores per accelerator must be positive, got {c}")
    out = Path(out)
    runs_root = out / "runs"
    runs_root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    files = dataset_files(s.data)
    label = s.profile_model or s.workload
    # Run again into the same directory with the same settings, the runs done are kept.
    state_path = out / STATE_NAME
    state = study_state.load_state(state_path, study_state.fingerprint(s.to_dict()), log)

    def run(key: str, **how: Any) -> Run:
        make = functools.partial(traced_run, s, runs_root, **how)
        return study_state.kept_or_traced(key, state, state_path, make, log)

    log(f"{label}: 1/3 synthetic data in memory (the accelerators' ingestion rate)")
    synthetic = run("synthetic", synthetic=True)
    # DS-Analyzer's order: cold before cached, so that the cold run also faults in the code
    # the real pipeline runs (decoders the synthetic run never touched) and the cached run
    # finds it in memory with the data.
    log(f"{label}: 2/3 real data, cold cache")
    cold = run("cold", prepare=drop_caches)
    log(f"{label}: 3/3 real data, fully cached (warming {len(files)} files first)")
    cached = run("cached", prepare=lambda: warm_files(files))
    figures = {
        k: epoch_figures(r)
        for k, r in zip(("synthetic", "cached", "cold"), (synthetic, cached, cold), strict=True)
    }
    result = versioned.stamp(
        STALLS,
        {
            "settings": s.to_dict(),
            "runs_used": [
                _run_entry(synthetic, "synthetic"),
                _run_entry(cached, "cached"),
                _run_entry(cold, "cold"),
            ],
            **differential(figures),
        },
    )
    if cache_fractions:
        result["sweep"] = cache_sweep(s, cache_fractions, result, cold, run, log)
        result["runs_used"] += [
            {"kind": "cache_sweep", "run_id": p["run_id"], "path": p["path"], "epoch": 2}
            for p in result["sweep"]
        ]
    if cores:
        result["cores"] = cores_sweep(s, cores, run, log)
        result["runs_used"] += [
            {"kind": "cores_sweep", "run_id": p["run_id"], "path": p["path"], "epoch": 1}
            for p in result["cores"]
        ]
    result["duration_s"] = time.monotonic() - started
    write_figure(stalls_figure(result, title=f"data stalls: {label}"), out / "stalls.html")
    versioned.write_json(out / "stalls.json", STALLS, result)
    return result


def load_results(path: Path) -> dict[str, Any]:
    """Read a measurement's ``stalls.json``, brought up to this version; another kind of file or
    a version this twintrace cannot read is a one-line UserError naming it."""
    return versioned.load_json(Path(path), STALLS, missing="measure the stalls first")


def _interpolate(table: Sequence[Mapping[str, float]], key: str, fraction: float) -> float:
    x = np.array([r["cached_percent"] for r in table], dtype=float) / 100
    y = np.array([r[key] for r in table], dtype=float)
    return float(np.interp(fraction, x, y))


def cache_sweep(
    s: StallSettings,
    fractions: Sequence[float],
    result: Mapping[str, Any],
    cold: Run,
    run: Callable[..., Run],
    log: Log = print,
) -> list[dict[str, Any]]:
    """One run per requested cached fraction (module doc); per point the requested, measured
    and resident fractions, the measured epoch, and the what-if predictions at the measured
    fraction with their errors.

    The limit's base is what the cold run held that the kernel cannot reclaim while it runs:
    its peak of resident memory plus pinned page cache (mapped code and libraries, shared
    memory: ``container_mem_pinned``). ``run(key, **how)`` traces a run of ``s`` (or keeps the
    one done before).
    """
    base = peak_memory(cold, ("container_mem_rss", "container_mem_pinned")) + MEMORY_MARGIN
    epoch_bytes = int(result["storage"]["dataset_bytes"])
    cached_s = float(result["runs"]["cached"]["epoch_s"])
    points = []
    for i, fraction in enumerate(fractions, 1):
        limit = base + int(fraction * epoch_bytes)
        log(
            f"cache sweep {i}/{len(fractions)}: {fraction:.0%} of {epoch_bytes / 1e6:.0f} MB "
            f"-> memory limit {limit / 2**20:.0f} MiB"
        )
        traced = run(f"cache-{fraction:g}", epochs=2, memory_bytes=limit, prepare=drop_caches)
        fig = epoch_figures(traced, epoch=2)
        read = epoch_files(traced, s.data, 2)
        hit = 1 - fig.block_read_bytes / fig.dataset_bytes if fig.dataset_bytes else 0.0
        measured = min(max(hit, 0.0), 1.0)
        throughput = fig.throughput
        predicted = _interpolate(result["what_if"], "predicted_throughput", measured)
        interpolated = _interpolate(result["what_if"], "interpolated_throughput", measured)
        points.append(
            {
                "requested_fraction": fraction,
                "memory_limit_bytes": limit,
                "measured_fraction": measured,
                "resident_fraction": resident_fraction(read),
                "run_id": traced.run_id,
                "path": str(traced.path),
                "epoch_s": fig.epoch_s,
                "throughput": throughput,
                "data_wait_s": fig.data_wait_s,
                "fetch_stall_s": max(fig.epoch_s - cached_s, 0.0),
                "block_read_bytes": fig.block_read_bytes,
                "dataset_bytes": fig.dataset_bytes,
                "predicted_throughput": predicted,
                "predicted_error": predicted / throughput - 1 if throughput else float("nan"),
                "interpolated_throughput": interpolated,
                "interpolated_error": interpolated / throughput - 1 if throughput else float("nan"),
            }
        )
    return points


def cores_sweep(
    s: StallSettings, cores: Sequence[float], run: Callable[..., Run], log: Log = print
) -> list[dict[str, Any]]:
    """Throughput per CPU cores per accelerator, warm cache (module doc); ``run`` as
    :func:`cache_sweep`'s."""
    files = dataset_files(s.data)
    points = []
    for i, c in enumerate(cores, 1):
        workers = max(1, math.ceil(c))  # per accelerator
        cpus = c * s.accelerators
        log(f"cores sweep {i}/{len(cores)}: {c:g} core(s) and {workers} worker(s) per accelerator")
        traced = run(f"cores-{c:g}", cpus=cpus, workers=workers, prepare=lambda: warm_files(files))
        fig = epoch_figures(traced)
        points.append(
            {
                "cores_per_accelerator": c,
                "cpus": cpus,
                "workers_per_accelerator": workers,
                "run_id": traced.run_id,
                "path": str(traced.path),
                "epoch_s": fig.epoch_s,
                "throughput": fig.throughput,
                "data_wait_s": fig.data_wait_s,
            }
        )
    return points


# Figures across models (the study)


def models_figure(results: Mapping[str, Mapping[str, Any]]) -> go.Figure:
    """Per model: the epoch split (stacked) and the stall fractions; throughput vs cores."""
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=(
            "epoch split per model (s)",
            "stall fraction of the cold epoch",
            "throughput vs cores per accelerator",
        ),
    )
    models = list(results)
    for key, colour in PART_COLOURS.items():
        fig.add_trace(
            go.Bar(
                x=models,
                y=[results[m]["epoch"][key] for m in models],
                name=PART_NAMES[key],
                marker_color=colour,
            ),
            row=1,
            col=1,
        )
    for key, colour in (("prep_stall", "#F58518"), ("fetch_stall", "#E45756")):
        fig.add_trace(
            go.Bar(
                x=models,
                y=[results[m]["fractions"][key] for m in models],
                name=key.replace("_", " ") + " fraction",
                marker_color=colour,
                opacity=0.6,
            ),
            row=1,
            col=2,
        )
    for m in models:
        points = results[m].get("cores") or []
        if points:
            fig.add_trace(
                go.Scatter(
                    x=[p["cores_per_accelerator"] for p in points],
                    y=[p["throughput"] for p in points],
                    name=f"{m} (samples/s)",
                    mode="lines+markers",
                ),
                row=1,
                col=3,
            )
    fig.update_layout(barmode="stack", height=450, width=1300)
    fig.update_xaxes(title_text="cores per accelerator", row=1, col=3)
    return fig


def cache_figure(result: Mapping[str, Any]) -> go.Figure:
    """Fetch stall vs cached fraction, stacked with compute and copy (GPEmu's figure shape):
    one bar per sweep point at its measured fraction, plus the fully cached and cold runs."""
    e = result["epoch"]
    points = sorted(result.get("sweep") or [], key=lambda p: p["measured_fraction"])
    labels = ["0% (cold)"] + [
        f"{100 * p['measured_fraction']:.0f}% (asked {100 * p['requested_fraction']:.0f}%)"
        for p in points
    ]
    labels.append("100% (cached)")
    fetch = [e["fetch_stall_s"]] + [p["fetch_stall_s"] for p in points] + [0.0]
    fig = go.Figure()
    for key in ("compute_s", "host_to_device_s", "other_s", "prep_stall_s"):
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[e[key]] * len(labels),
                name=PART_NAMES[key],
                marker_color=PART_COLOURS[key],
            )
        )
    fig.add_trace(
        go.Bar(x=labels, y=fetch, name="fetch stall", marker_color=PART_COLOURS["fetch_stall_s"])
    )
    fig.update_layout(
        barmode="stack",
        title="epoch time vs cached fraction (measured fraction; requested in brackets)",
        yaxis_title="seconds per epoch",
        height=450,
        width=1000,
    )
    return fig


#: A ``kind = "stalls"`` study's keys: ``dataset`` (a ``[[datasets]]`` name) and ``workload``,
#: the workload's ``variant``, ``accelerator``, ``models`` (emulated image models, with
#: ``accelerator``; default: the workload's own), ``accelerators``, ``batch_size``,
#: ``workers``, ``max_steps``, ``seed``, ``options`` (the workload's ``--set`` options),
#: ``cache_fractions`` (the sweep runs for the first model only), ``cores`` (cores per
#: accelerator; the sweep runs for every model) and ``read_rate`` (the dataset disk's reads
#: capped at so many bytes per second, e.g. ``"50MB"``).
SETTINGS = (
    Setting("dataset", "name", REQUIRED, says="a [[datasets]] name"),
    Setting("workload", "choice", REQUIRED, choices=tuple(sorted(WORKLOADS))),
    Setting("variant", "choice", "sleep", choices=("sleep", "instrumented")),
    Setting("accelerator", "name"),
    Setting("models", "texts"),
    Setting("accelerators", "whole", 1, low=1, high=1024),
    Setting("batch_size", "whole", low=1, high=1 << 16),
    Setting("workers", "whole", low=0, high=256),
    Setting("max_steps", "whole", 0, low=0, high=10**9),
    Setting("seed", "whole", 0, low=0, high=2**31 - 1),
    Setting("options", "table", {}),
    Setting("cache_fractions", "fractions", ()),
    Setting("cores", "numbers", (), low=0, high=math.inf, says="a list of positive numbers"),
    Setting("read_rate", "size"),
)


def parse_study(study: Any) -> dict[str, Any]:
    """A ``kind = "stalls"`` study's keys (:data:`SETTINGS`), validated; one-line UserErrors
    naming the file and the key."""
    where = f"{study.path}: [study]"
    s = validate(SETTINGS, study.spec, where)
    study.dataset(s["dataset"])
    WORKLOADS[s["workload"]].parse_options(s["options"])
    if s["models"] and not s["accelerator"]:
        raise UserError(f"{where} models are emulated models: give accelerator")
    s["read_bps"] = _read_bps(s.pop("read_rate"), f"{study.path}: read_rate")
    return s


def check_study(study: Any) -> None:
    """Validate a ``kind = "stalls"`` study (:func:`parse_study`)."""
    parse_study(study)


def _read_bps(text: Any, where: str) -> int | None:
    """A study's ``read_rate`` (bytes per second, as a size: ``"50MB"``) in bytes."""
    if text is None:
        return None
    try:
        value = parse_size(text)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    if value < 1:
        raise UserError(f"{where}: must be positive, got {text!r}")
    return value


def run_study(study: Any, out: Path, data: Mapping[str, Path], log: Log = print) -> Path:
    """Measure every model of the study, then write ``study.json`` and ``study.html``."""
    spec = parse_study(study)
    models = list(spec["models"] or [None])
    results: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    for i, model in enumerate(models):
        s = StallSettings(
            workload=spec["workload"],
            data=data[spec["dataset"]],
            variant=spec["variant"],
            accelerator=spec["accelerator"],
            profile_model=model,
            accelerators=spec["accelerators"],
            batch_size=spec["batch_size"],
            workers=spec["workers"],
            max_steps=spec["max_steps"],
            seed=spec["seed"],
            options=spec["options"],
            read_bps=spec["read_bps"],
        )
        name = model or spec["workload"]
        results[name] = measure_stalls(
            s,
            out / name,
            cache_fractions=spec["cache_fractions"] if i == 0 else (),
            cores=spec["cores"],
            log=log,
        )
        for line in _result_lines(name, results[name]):
            log(line)
    first = results[next(iter(results))]
    if first.get("sweep"):
        write_figure(cache_figure(first), out / "cache.html")
    write_figure(models_figure(results), out / "study.html")
    path = out / "study.json"
    versioned.write_json(
        path,
        STALLS_STUDY,
        {
            "name": study.name,
            "duration_s": time.monotonic() - started,
            "results": {m: str(out / m / "stalls.json") for m in results},
            "summary": {m: _summary(r) for m, r in results.items()},
        },
    )
    return path


def _summary(result: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "fetch_stall_fraction": result["fractions"]["fetch_stall"],
        "prep_stall_fraction": result["fractions"]["prep_stall"],
        "throughput": result["throughput"],
        "sweep": [
            {
                k: p[k]
                for k in (
                    "requested_fraction",
                    "measured_fraction",
                    "resident_fraction",
                    "fetch_stall_s",
                    "throughput",
                    "predicted_error",
                    "interpolated_error",
                )
            }
            for p in result.get("sweep", [])
        ],
        "cores": [
            {k: p[k] for k in ("cores_per_accelerator", "throughput")}
            for p in result.get("cores", [])
        ],
    }


def _result_lines(name: str, result: Mapping[str, Any]) -> list[str]:
    from analysis.stalls import summary_lines

    lines = [f"{name}: " + line for line in summary_lines(result)]
    for p in result.get("sweep", []):
        lines.append(
            f"{name}: cached {p['requested_fraction']:.0%} asked, {p['measured_fraction']:.0%} "
            f"measured ({p['resident_fraction']:.0%} resident after): {p['throughput']:.1f} "
            f"samples/s, fetch stall {p['fetch_stall_s']:.2f} s; model {p['predicted_error']:+.1%}, "
            f"interpolated {p['interpolated_error']:+.1%}"
        )
    for p in result.get("cores", []):
        lines.append(
            f"{name}: {p['cores_per_accelerator']:g} cores/accelerator: {p['throughput']:.1f} samples/s"
        )
    return lines
