"""Experiment grids: ``./cli.py experiment run experiments/NAME.toml``.

An experiment file describes, as data, the datasets to generate, a grid of traced runs and what
to produce from them (docs/experiments.md documents the format)::

    [experiment]
    name = "timelines"
    description = "real vs emulated timelines"

    [[datasets]]                       # generated when missing (a complete manifest.json)
    name = "unet3d"
    generator = "unet3d"
    size = "300MB"
    scale = 0.5

    [grid]                             # the cross product is the list of runs
    workload = ["unet3d"]
    variant = ["original", "sleep"]
    batch_size = [2]
    accelerators = [1]
    workers = [2]
    memory_limit = [""]                # "" = no limit
    repetitions = 1

    [settings]                         # fixed WorkloadConfig settings for every run
    epochs = 1
    accelerator = "v100"               # optional: the sleep runs emulate this accelerator
    gpus = "all"                       # optional: real GPUs for every container (--gpus)

    [workloads.unet3d]                 # per workload: its dataset, options, settings, and
    dataset = "unet3d"                 # optionally its own batch_size list (replaces the grid's)
    options = {patch_size = 64}

    [produce]
    timelines = true                   # one timeline per configuration, variants stacked
    breakdown = true                   # one breakdown plot per workload (instrumented/sleep)
    compare = true                     # original vs sleep (and vs dlio, sleep vs dlio, when
                                       # the grid has dlio runs), per configuration

``accelerator`` (in ``[settings]`` or ``[workloads.<name>]``, with ``profile_model`` for an
image workload) gives the sleep runs the profile database's profile of that accelerator at
their batch size (``./cli.py trace --accelerator``); original and instrumented runs compute for
real and ignore it. Without it, sleep runs use the workload's shipped profile.

``profile = "fit"`` (in ``[settings]`` or ``[workloads.<name>]``, instead of ``accelerator``)
gives the sleep and DLIO runs of a configuration the profile fitted (``./cli.py profile fit``)
to the ``instrumented`` run of the same configuration, made first on this host: the grid's
variants must list ``instrumented`` before them. The emulation is then of this host's CPU as
the real job computes on it, container, loader workers and all; the fitted profile is kept in
``<out>/<name>/profiles/``. ``accelerator = "cpu"`` instead measures this host's CPU natively
(``profile measure``, once per host) without an ``instrumented`` run.

``cold_cache = true`` (in ``[settings]`` or ``[workloads.<name>]``) drops the page cache before
every run (root), so that no run reads from the cache what the one before it read.

``gpus`` (in ``[settings]`` or ``[workloads.<name>]``, whose value wins) gives every container
of the runs real GPUs, as ``./cli.py trace --gpus`` does: ``"all"``, a count (``2`` or
``"2"``) or device ids (``"0,1"``). The workloads' ``device = auto`` then computes on them
(build the images with ``./cli.py build --torch cuda``; docs/gpus.md). A count or id list with
fewer GPUs than a run's ``accelerators`` is refused when the file is loaded.

Runs go to ``<out>/<name>/runs`` and outputs to ``<out>/<name>/``. The state of every run is
kept in ``<out>/<name>/state.json`` (written atomically after each run): a run whose state
says ``completed`` and whose run directory still says so is skipped when the experiment is run
again, so an interrupted experiment resumes where it stopped. A failed run is recorded with its
error and the others go on; the exit status is non-zero when any run failed.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.atomic import atomic_write_text
from core.errors import UserError
from core.units import parse_size
from experiments import study_state
from store.rundir import FINISHED, load_json, write_json
from workloads.config import RUN_VARIANTS
from workloads.registry import WORKLOADS

GRID_KEYS = ("workload", "variant", "batch_size", "accelerators", "workers", "memory_limit")
SETTINGS_KEYS = ("epochs", "max_steps", "seed", "eval_every", "checkpoint_every")
#: Settings of the sleep runs' emulated accelerator (profile database), not WorkloadConfig's.
EMULATION_KEYS = ("accelerator", "profile_model", "profile")
#: ``profile = "fit"``: sleep and DLIO runs use the profile fitted to their configuration's
#: instrumented run (module doc).
FIT = "fit"
#: Settings of how the runs' containers are run (RunOptions), not WorkloadConfig's.
RUN_KEYS = ("gpus", "cold_cache")
PRODUCE_KEYS = ("timelines", "breakdown", "compare")
#: The pairs ``compare`` reports on, (reference, emulation), where a configuration has both:
#: the real job against our emulation, against DLIO's, and the two emulations against each other.
COMPARED_PAIRS: tuple[tuple[str, str], ...] = (
    ("original", "sleep"),
    ("original", "dlio"),
    ("sleep", "dlio"),
)


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str
    generator: str
    size: str
    scale: float | None = None
    group_size: int | None = None
    mean_kb: float | None = None
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One cell of the grid (and one repetition)."""

    workload: str
    variant: str
    batch_size: int
    accelerators: int
    workers: int
    memory_limit: str
    repetition: int
    emulated: str = ""  # sleep runs: the emulated accelerator (and model), "" for the default

    @property
    def key(self) -> str:
        """A stable name for the state file and the outputs."""
        mem = f"-mem{self.memory_limit}" if self.memory_limit else ""
        emulated = f"-{self.emulated}" if self.emulated else ""
        return (
            f"{self.workload}-{self.variant}{emulated}-b{self.batch_size}-g{self.accelerators}"
            f"-w{self.workers}{mem}-r{self.repetition}"
        )

    @property
    def config_key(self) -> tuple[Any, ...]:
        """The configuration without the variant: runs that differ only in it are compared."""
        return (
            self.workload,
            self.batch_size,
            self.accelerators,
            self.workers,
            self.memory_limit,
            self.repetition,
        )


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    datasets: tuple[Dataset, ...]
    runs: tuple[RunSpec, ...]
    settings: Mapping[str, Any]
    workloads: Mapping[str, Mapping[str, Any]]
    produce: Mapping[str, bool]
    path: Path

    def dataset_for(self, workload: str) -> Dataset:
        name = self.workloads.get(workload, {}).get("dataset")
        for d in self.datasets:
            if d.name == name:
                return d
        raise UserError(
            f"{self.path}: workload {workload} has no dataset (set [workloads.{workload}] dataset)"
        )


def check_table(data: Any, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a table, got {type(data).__name__}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(known)}")
    return data


def check_list(value: Any, where: str, kind: type) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values or any(not isinstance(v, kind) or isinstance(v, bool) for v in values):
        raise UserError(f"{where}: expected a non-empty list of {kind.__name__}, got {value!r}")
    return values


def read_toml(path: Path) -> dict[str, Any]:
    """An experiment file's tables (one-line UserErrors for a missing or invalid file)."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"experiment file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"experiment file {path} is not valid TOML: {exc}") from None


def parse_datasets(data: Mapping[str, Any], path: Path) -> list[Dataset]:
    """The ``[[datasets]]`` of an experiment file, validated."""
    datasets = []
    names = set()
    for i, item in enumerate(data.get("datasets", [])):
        where = f"{path}: datasets[{i}]"
        item = check_table(item, where, tuple(f.name for f in dataclasses.fields(Dataset)))
        if not {"name", "generator", "size"} <= set(item):
            raise UserError(f"{where}: needs name, generator and size")
        if item["name"] in names:
            raise UserError(f"{where}: a second dataset named {item['name']!r}")
        names.add(item["name"])
        parse_size(item["size"])
        datasets.append(Dataset(**item))
    return datasets


def load_experiment(path: Path) -> Experiment:
    """Parse and validate an experiment file (every problem is a one-line UserError)."""
    path = Path(path)
    data = read_toml(path)
    check_table(
        data, str(path), ("experiment", "datasets", "grid", "settings", "workloads", "produce")
    )
    head = check_table(data.get("experiment", {}), f"{path}: [experiment]", ("name", "description"))
    name = head.get("name") or path.stem
    datasets = parse_datasets(data, path)
    grid = check_table(data.get("grid", {}), f"{path}: [grid]", (*GRID_KEYS, "repetitions"))
    axes = {
        "workload": check_list(grid.get("workload", []), f"{path}: grid.workload", str),
        "variant": check_list(
            grid.get("variant", ["original", "instrumented", "sleep"]), f"{path}: grid.variant", str
        ),
        "batch_size": check_list(grid.get("batch_size", [0]), f"{path}: grid.batch_size", int),
        "accelerators": check_list(
            grid.get("accelerators", [1]), f"{path}: grid.accelerators", int
        ),
        "workers": check_list(grid.get("workers", [2]), f"{path}: grid.workers", int),
        "memory_limit": check_list(
            grid.get("memory_limit", [""]), f"{path}: grid.memory_limit", str
        ),
    }
    for w in axes["workload"]:
        if w not in WORKLOADS:
            raise UserError(f"{path}: unknown workload {w!r}; known: {', '.join(WORKLOADS)}")
    for v in axes["variant"]:
        if v not in RUN_VARIANTS:
            raise UserError(f"{path}: unknown variant {v!r}; known: {', '.join(RUN_VARIANTS)}")
    for m in axes["memory_limit"]:
        if m:
            parse_size(m)
    repetitions = grid.get("repetitions", 1)
    if not isinstance(repetitions, int) or repetitions < 1:
        raise UserError(f"{path}: grid.repetitions must be a whole number >= 1")
    settings = check_table(
        data.get("settings", {}),
        f"{path}: [settings]",
        (*SETTINGS_KEYS, *EMULATION_KEYS, *RUN_KEYS),
    )
    workloads = check_table(data.get("workloads", {}), f"{path}: [workloads]", tuple(WORKLOADS))
    for w, table in workloads.items():
        check_table(
            table,
            f"{path}: [workloads.{w}]",
            ("dataset", "options", "batch_size", *SETTINGS_KEYS, *EMULATION_KEYS, *RUN_KEYS),
        )
    produce = check_table(data.get("produce", {}), f"{path}: [produce]", PRODUCE_KEYS)
    runs = []
    for values in itertools.product(*axes.values(), range(1, repetitions + 1)):
        spec = RunSpec(*values)
        own = workloads.get(spec.workload, {}).get("batch_size")
        if own is not None:
            # The workload's own batch sizes replace the grid's (records for DLRM, images...).
            if spec.batch_size != axes["batch_size"][0]:
                continue
            for b in check_list(own, f"{path}: workloads.{spec.workload}.batch_size", int):
                runs.append(dataclasses.replace(spec, batch_size=b))
            continue
        if spec.batch_size == 0:  # the workload's default
            spec = dataclasses.replace(
                spec, batch_size=WORKLOADS[spec.workload].config("original").batch_size
            )
        runs.append(spec)
    try:
        runs = [_emulated(spec, settings, workloads, path) for spec in runs]
    except UserError as exc:
        raise UserError(str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}") from None
    order = {spec.key: i for i, spec in enumerate(runs)}
    for spec in runs:
        if spec.emulated == "fitted":
            source = fit_source(spec)
            if order.get(source.key, len(runs)) > order[spec.key]:
                raise UserError(
                    f'{path}: {spec.key} is fitted (profile = "{FIT}") to the instrumented run '
                    f"of its configuration, {source.key}: list instrumented before "
                    f"{spec.variant} in grid.variant"
                )
    for spec in runs:
        _check_gpus(spec, run_gpus(spec.workload, settings, workloads, path), path)
        try:
            cold_cache(spec.workload, settings, workloads)
        except UserError as exc:
            raise UserError(f"{path}: {exc}") from None
    experiment = Experiment(
        name=name,
        description=head.get("description", ""),
        datasets=tuple(datasets),
        runs=tuple(runs),
        settings=settings,
        workloads=workloads,
        produce={k: bool(produce.get(k, False)) for k in PRODUCE_KEYS},
        path=path,
    )
    for w in axes["workload"]:
        experiment.dataset_for(w)
        WORKLOADS[w].parse_options(workloads.get(w, {}).get("options", {}))
    if len({r.key for r in runs}) != len(runs):
        raise UserError(f"{path}: the grid lists the same run twice (duplicate values on an axis)")
    return experiment


def fitted(
    workload: str, settings: Mapping[str, Any], workloads: Mapping[str, Mapping[str, Any]]
) -> bool:
    """Whether a workload's sleep and DLIO runs use the profile fitted to their
    configuration's instrumented run (``profile = "fit"``: its own table's, else
    ``[settings]``'s)."""
    value = workloads.get(workload, {}).get("profile", settings.get("profile"))
    if value is None:
        return False
    if value != FIT:
        raise UserError(f'profile of {workload} must be "{FIT}", got {value!r}')
    return True


def fit_source(spec: RunSpec) -> RunSpec:
    """The instrumented run a fitted sleep or DLIO run's profile comes from."""
    return dataclasses.replace(spec, variant="instrumented", emulated="")


def emulation(
    workload: str, settings: Mapping[str, Any], workloads: Mapping[str, Mapping[str, Any]]
) -> tuple[str | None, str | None]:
    """(accelerator, profile_model) of a workload's sleep runs: its own table's, else
    ``[settings]``'s; None where neither sets one."""
    own = workloads.get(workload, {})
    values = []
    for key in ("accelerator", "profile_model"):
        value = own.get(key, settings.get(key))
        if value is not None and not isinstance(value, str):
            raise UserError(f"{key} of {workload} must be a string, got {value!r}")
        values.append(value or None)
    return values[0], values[1]


def cold_cache(
    workload: str, settings: Mapping[str, Any], workloads: Mapping[str, Mapping[str, Any]]
) -> bool:
    """Whether a workload's runs start on a cold page cache (``cold_cache``: its own table's,
    else ``[settings]``'s; default false): the cache dropped before each run, so that no run
    finds the data a previous one read."""
    value = workloads.get(workload, {}).get("cold_cache", settings.get("cold_cache", False))
    if not isinstance(value, bool):
        raise UserError(f"cold_cache of {workload} must be true or false, got {value!r}")
    return value


def run_gpus(
    workload: str,
    settings: Mapping[str, Any],
    workloads: Mapping[str, Mapping[str, Any]],
    path: Path | str = "",
) -> str | None:
    """The ``gpus`` of a workload's runs (docker's ``--gpus`` text): its own table's, else
    ``[settings]``'s; None where neither sets one. A count may be a TOML integer."""
    from tracing.container import gpu_request

    value = workloads.get(workload, {}).get("gpus", settings.get("gpus"))
    if value is None:
        return None
    where = f"{path}: gpus of {workload}" if path else f"gpus of {workload}"
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise UserError(f'{where} must be "all", a count or ids such as "0,1", got {value!r}')
    text = str(value).strip()
    try:
        gpu_request(text)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    return text


def _check_gpus(spec: RunSpec, gpus: str | None, path: Path) -> None:
    """A run of ``accelerators`` ranks needs that many GPUs where it is given GPUs at all."""
    from tracing.request import gpu_count

    have = gpu_count(gpus) if gpus is not None else None
    if have is not None and have < spec.accelerators:
        raise UserError(
            f"{path}: {spec.key}: {spec.accelerators} accelerators need as many GPUs, "
            f'gpus = "{gpus}" gives {have}: use "all" or list more'
        )


def _emulated(
    spec: RunSpec,
    settings: Mapping[str, Any],
    workloads: Mapping[str, Mapping[str, Any]],
    path: Path,
) -> RunSpec:
    """A sleep (or DLIO) run's spec with its emulated accelerator, checked against the
    profile database (so a typo fails before any run starts): a DLIO run's computation time
    comes from the same profile as the sleep run's."""
    from store.hostprofiles import check_host_model
    from store.profiledb import is_host_cpu, sleep_profile_for

    accelerator, model = emulation(spec.workload, settings, workloads)
    if fitted(spec.workload, settings, workloads):
        if accelerator is not None or model is not None:
            raise UserError(
                f'{path}: {spec.workload}: profile = "{FIT}" and accelerator/profile_model both '
                "choose the sleep profile: give one"
            )
        if spec.variant not in ("sleep", "dlio"):
            return spec
        return dataclasses.replace(spec, emulated="fitted")
    if spec.variant not in ("sleep", "dlio") or (accelerator is None and model is None):
        return spec
    if accelerator is None:
        raise UserError(f"{path}: profile_model of {spec.workload} needs an accelerator too")
    try:
        if is_host_cpu(accelerator):
            # This host's CPU: measured when the run comes (it needs the dataset), once.
            check_host_model(spec.workload, model)
        else:
            sleep_profile_for(spec.workload, accelerator, spec.batch_size, spec.accelerators, model)
    except UserError as exc:
        raise UserError(f"{path}: {spec.key}: {exc}") from None
    name = accelerator if model is None else f"{accelerator}-{model}"
    return dataclasses.replace(spec, emulated=name)


# ---------------------------------------------------------------------------------------------
# Running


@dataclasses.dataclass
class Outcome:
    key: str
    status: str  # completed, failed, skipped (already completed)
    run_dir: str | None
    error: str | None
    duration_s: float | None


Log = Callable[[str], None]


def _load_state(path: Path) -> dict[str, Any]:
    """The experiment's state file (run outcomes so far), in the run format's versioning."""
    if not path.exists():
        return {"runs": {}}
    return load_json(path, "experiment state")


def _record(
    state: dict[str, Any],
    state_path: Path,
    spec: RunSpec,
    status: str,
    run_dir: Path | None,
    error: str | None,
    duration: float,
) -> None:
    """Record one run's outcome in the experiment's state file (atomically)."""
    state["runs"][spec.key] = {
        "status": status,
        "run_dir": str(run_dir) if run_dir else None,
        "error": error,
        "duration_s": round(duration, 2),
        "spec": dataclasses.asdict(spec),
    }
    write_json(state_path, {k: v for k, v in state.items() if k != "schema_version"})


def _completed(run_dir: str | None) -> bool:
    if not run_dir:
        return False
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return manifest.get("status") in FINISHED


def ensure_dataset(d: Dataset, data_root: Path, log: Log) -> Path:
    """``data_root/<name>``, generated unless a complete one (with ``manifest.json``) is there."""
    from datagen.registry import generate

    path = data_root / d.name
    if not (path / "manifest.json").exists():
        log(f"generating dataset {d.name} ({d.generator}, {d.size}) in {path}")
        generate(
            d.generator,
            path,
            parse_size(d.size),
            seed=d.seed,
            force=path.exists(),
            scale=d.scale,
            group_size=d.group_size,
            mean_kb=d.mean_kb,
        )
    return path


def ensure_datasets(experiment: Experiment, data_root: Path, log: Log) -> dict[str, Path]:
    """Generate every dataset the runs need that is not already complete; name -> path."""
    needed = {experiment.dataset_for(w).name for w in {r.workload for r in experiment.runs}}
    return {
        d.name: ensure_dataset(d, data_root, log) for d in experiment.datasets if d.name in needed
    }


def run_experiment(experiment: Experiment, out_root: Path, log: Log = print) -> list[Outcome]:
    """Run (or resume) every run of the grid, then produce the outputs; return the outcomes.
    One runner at a time in its directory (:func:`study_state.sole_runner`)."""
    home = Path(out_root) / experiment.name
    with study_state.sole_runner(home):
        return _run_experiment(experiment, home, log)


def _run_experiment(experiment: Experiment, home: Path, log: Log) -> list[Outcome]:
    import time

    from experiments.request import TraceSettings, build_request
    from tracing.runner import RunInterrupted, trace

    runs_root = home / "runs"
    runs_root.mkdir(parents=True, exist_ok=True)
    state_path = home / "state.json"
    state = _load_state(state_path)
    datasets = ensure_datasets(experiment, home / "data", log)
    outcomes = []
    total = len(experiment.runs)
    for i, spec in enumerate(experiment.runs, 1):
        entry = state["runs"].get(spec.key, {})
        if entry.get("status") in FINISHED and _completed(entry.get("run_dir")):
            log(f"[{i}/{total}] {spec.key}: already completed, skipped")
            outcomes.append(
                Outcome(spec.key, "skipped", entry["run_dir"], None, entry.get("duration_s"))
            )
            continue
        log(f"[{i}/{total}] {spec.key}")
        per_workload = experiment.workloads.get(spec.workload, {})
        fixed = {
            k: v for k, v in {**experiment.settings, **per_workload}.items() if k in SETTINGS_KEYS
        }
        data = datasets[experiment.dataset_for(spec.workload).name]
        accelerator, model = (
            emulation(spec.workload, experiment.settings, experiment.workloads)
            if spec.emulated and spec.emulated != "fitted"
            else (None, None)
        )
        started = time.monotonic()
        run_dir: Path | None = None
        settings = TraceSettings(
            workload=spec.workload,
            variant=spec.variant,
            data=data,
            batch_size=spec.batch_size,
            accelerators=spec.accelerators,
            workers=spec.workers,
            options=dict(per_workload.get("options", {})),
            accelerator=accelerator,
            profile_model=model,
            memory_limit=spec.memory_limit or None,
            gpus=None
            if spec.variant == "dlio"
            else run_gpus(spec.workload, experiment.settings, experiment.workloads),
            quiet=True,
            **fixed,
        )
        try:
            if spec.emulated == "fitted":
                settings = dataclasses.replace(
                    settings, profile=fit_profile(spec, state, home, log)
                )
            request = build_request(settings, runs_root, log)
            if cold_cache(spec.workload, experiment.settings, experiment.workloads):
                # after the request is built: building it checks (reads) the dataset
                from tracing.host import drop_caches

                drop_caches()
            outcome = trace(request)
            status, error, run_dir = outcome.status, outcome.error, outcome.run_dir
        except RunInterrupted as exc:
            _record(state, state_path, spec, exc.outcome.status, exc.outcome.run_dir, None, 0.0)
            raise
        except UserError as exc:  # refused before a run directory existed
            status, error = "failed", str(exc)
        if status not in FINISHED:
            log(f"[{i}/{total}] {spec.key} failed: {error}")
        elif error:
            log(f"[{i}/{total}] {spec.key} {status}: {error}")
        duration = time.monotonic() - started
        _record(state, state_path, spec, status, run_dir, error, duration)
        outcomes.append(
            Outcome(spec.key, status, str(run_dir) if run_dir else None, error, duration)
        )
    produce_outputs(experiment, state, home, log)
    return outcomes


def fit_profile(spec: RunSpec, state: Mapping[str, Any], home: Path, log: Log) -> Path:
    """The profile of a fitted sleep or DLIO run: fitted to its configuration's instrumented
    run (:func:`fit_source`), kept in ``home/profiles/<that run's directory name>.json``."""
    from analysis.profiles import fit_runs
    from store.rundir import load_run

    source = fit_source(spec)
    entry = state["runs"].get(source.key, {})
    if entry.get("status") not in FINISHED or not _completed(entry.get("run_dir")):
        raise UserError(
            f"{spec.key} is fitted to the instrumented run {source.key}, which did not "
            "complete: run the experiment again once it does"
        )
    # named by the run it is fitted to: a run made again gets its own fit
    path = home / "profiles" / f"{Path(entry['run_dir']).name}.json"
    if not path.exists():
        profile, warnings = fit_runs([load_run(Path(entry["run_dir"]))])
        for warning in warnings:
            log(f"warning: {source.key}'s fit: {warning}")
        path.parent.mkdir(parents=True, exist_ok=True)
        profile.save(path)
        log(f"fitted to {source.key} on this host: {path}")
    return path


def scores_table(scores: Mapping[str, Mapping[str, Any]]) -> str:
    """The overall and per-aspect similarity scores of each comparison, as a Markdown table
    (a row per comparison: its configuration and pair; a column per aspect, "-" where the
    aspect was skipped)."""
    aspects: list[str] = []
    for entry in scores.values():
        aspects += [a for a in entry["aspects"] if a not in aspects]
    head = ["comparison", "reference vs emulation", "overall", *aspects]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for label, entry in scores.items():
        pair = entry.get("pair") or ["original", "sleep"]
        cells = [label, f"{pair[0]} vs {pair[1]}", f"{entry['overall']:.3f}"]
        for name in aspects:
            score = (entry["aspects"].get(name) or {}).get("score")
            cells.append("-" if score is None else f"{score:.3f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def produce_outputs(
    experiment: Experiment, state: dict[str, Any], home: Path, log: Log
) -> list[Path]:
    """Timelines, breakdowns and comparisons of the completed runs, as the file asks."""
    from store.rundir import load_run

    done: dict[str, Any] = {}
    for spec in experiment.runs:
        entry = state["runs"].get(spec.key, {})
        if entry.get("status") in FINISHED and _completed(entry.get("run_dir")):
            done[spec.key] = (spec, load_run(Path(entry["run_dir"])))
    written: list[Path] = []
    by_config: dict[tuple[Any, ...], dict[str, Any]] = {}
    for spec, run in done.values():
        by_config.setdefault(spec.config_key, {})[spec.variant] = run
    order = ["original", "instrumented", "sleep", "dlio"]
    if experiment.produce.get("timelines"):
        from analysis.timeline import write_timeline

        for key, runs in by_config.items():
            ordered = [runs[v] for v in order if v in runs]
            name = "-".join(str(k) for k in key if k != "")
            written.append(write_timeline(ordered, home / "timelines" / f"{name}.html"))
    if experiment.produce.get("breakdown"):
        from analysis.breakdown import write_breakdown

        for workload in sorted({s.workload for s, _ in done.values()}):
            runs = [
                r
                for s, r in done.values()
                if s.workload == workload and s.variant in ("instrumented", "sleep")
            ]
            for variant in ("instrumented", "sleep"):
                chosen = [r for r in runs if r.variant == variant]
                if chosen:
                    written.append(
                        write_breakdown(chosen, home / "breakdowns" / f"{workload}-{variant}.html")
                    )
    if experiment.produce.get("compare"):
        from analysis.compare_report import write_comparison_report
        from analysis.similarity import compare_runs

        scores = {}
        for key, runs in by_config.items():
            name = "-".join(str(k) for k in key if k != "")
            for real, emulated in COMPARED_PAIRS:
                if real not in runs or emulated not in runs:
                    continue
                comparison = compare_runs(runs[real], runs[emulated])
                # original vs sleep keeps the plain name (the only pair before DLIO runs)
                label = (
                    name
                    if (real, emulated) == COMPARED_PAIRS[0]
                    else f"{name}-{real}-vs-{emulated}"
                )
                written.append(
                    write_comparison_report(
                        runs[real],
                        runs[emulated],
                        comparison,
                        home / "comparisons" / f"{label}.html",
                    )
                )
                scores[label] = {"pair": [real, emulated], **comparison.to_dict()}
        if scores:
            path = home / "comparisons" / "scores.json"
            write_json(path, {"scores": scores})
            written.append(path)
            table = scores_table(scores)
            path = home / "comparisons" / "scores.md"
            atomic_write_text(path, table)
            written.append(path)
            log(table.rstrip())
    for path in written:
        log(f"wrote {path}")
    return written
