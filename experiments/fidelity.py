"""Fidelity of the emulated accelerator on this host: ``sleep`` against ``original``, measured.

For a workload, on small data generated once, with the page cache dropped before every run:

1. ``instrumented`` runs -> ``profile fit`` (the compute times of this CPU, same settings);
2. then ``original`` and ``sleep`` (with that profile) alternated, ``rounds`` pairs.

Per pair (:func:`analysis.fidelity.pair_figures`):

- ``step_error``: median step time of ``sleep`` / ``original`` - 1 (goal <= 2 %): the time
  between consecutive ``step_end`` points of rank 0 in epoch 1, the first step left out (it
  carries one-off warm-up costs);
- ``epoch_error``: training time of epoch 1, ``sleep`` / ``original`` - 1 (goal <= 5 %);
- ``overall``: ``./cli.py compare`` overall (goal >= 0.95), and the two lowest aspects;
- ``cost``: container CPU seconds of ``sleep`` / ``original`` while training (the epoch;
  interpreter start-up and imports are alike in both and left out; goal <= 0.15);
- sleep precision: the compute times the emulator requested, replayed from its generator
  (:func:`workloads.emulation.draw_step`), against the ``accelerator_busy`` intervals it
  logged: ``requested_s`` and ``busy_s`` (means per step) and ``late_ms`` (median of busy -
  requested per step; GPEmu reports 0.188 s -> 0.18824 s);
- ``own_step_error``: the emulated median step against the median of the steps it requested
  (host-to-device plus compute): what the step takes beyond them, whatever the host's speed:
  the data pipeline's time on the step's critical path (taking the batch from the loader,
  which the real job spends too) and the emulator's own overhead;
- ``fit_step_error``: the emulated median step against the median of every step of the
  ``instrumented`` runs the profile was fitted to (pooled, as the fit pools their compute
  times): how closely the emulation reproduces the runs it was made from. ``step_error``
  adds to it the difference between those runs and the ``original`` one (the host's drift
  between runs, and the instrumentation's own cost).

Per workload, the noise floor (:func:`analysis.fidelity.noise`): the spread (max - min over median) of the real
runs' median step and epoch time (and ``overall_noise``: the lowest ``compare`` overall of an
``original`` run against an ``instrumented`` one, the real job against its own rerun, which
the analyzer's rate factor lowers when the host's speed drifts between runs; beside it each
pair's ``closest_overall``, the emulated run against the real run closest to it), every
``instrumented`` and ``original`` run of the measurement: the same model computing on the
same data, run again minutes apart. The profile comes from some of those runs and the error is measured against others, so an error within
the spread cannot be told from the machine's own variation (on the 2-core build machines a
single-process compute loop varies by 10-20 % from one few-second window to the next).

``bench/emulation_fidelity.py`` runs every workload of the zoo and prints the table of
``docs/emulation.md``; ``tests/test_fidelity.py`` runs a reduced form in CI. As a study
(``[study] kind = "fidelity"``, ``experiments/fidelity.toml``, keys in :data:`SETTINGS`) the
runs resume through the study state and the results are ``fidelity.json`` (:data:`RESULTS`)
and ``fidelity.html`` (:func:`analysis.fidelity.fidelity_figure`). The figures of a run and of
a pair are computed in :mod:`analysis.fidelity`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from analysis.fidelity import (
    GOALS,
    fidelity_figure,
    noise,
    pair_figures,
    step_times,
    table_lines,
)
from analysis.profiles import fit_runs
from analysis.similarity import compare_runs
from core.errors import UserError
from datagen.registry import generate
from experiments import study_state
from experiments.request import TraceSettings, build_request
from experiments.study import Setting, validate
from experiments.study_state import Log
from store.rundir import Run, load_manifest, load_run
from tracing.host import drop_caches
from tracing.runner import trace


@dataclasses.dataclass(frozen=True)
class Setup:
    """A workload's small configuration: its dataset (generator, bytes, generator options),
    workload options and settings (the same for every variant)."""

    generator: str
    size: int
    options: Mapping[str, Any]
    settings: Mapping[str, Any]
    generator_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


#: Configurations that train on 2 CPU cores in tens of seconds, with 40-60 measured steps so
#: that a median step is known to about a percent.
SETUPS: Mapping[str, Setup] = {
    "unet3d": Setup(
        "unet3d",
        220_000_000,
        {"patch_size": 48},
        {"batch_size": 2, "workers": 1, "max_steps": 40},
        {"scale": 0.25},
    ),
    "dlrm": Setup("dlrm", 40_000_000, {}, {"batch_size": 2048, "workers": 1, "max_steps": 60}),
    "bert": Setup("bert", 60_000_000, {}, {"batch_size": 8, "workers": 1, "max_steps": 40}),
    "resnet18": Setup(
        "images", 100_000_000, {"image_size": 64}, {"batch_size": 16, "workers": 1, "max_steps": 50}
    ),
    "resnet50": Setup(
        "images",
        100_000_000,
        {"image_size": 64, "width": 32},
        {"batch_size": 16, "workers": 1, "max_steps": 40},
    ),
    "alexnet": Setup(
        "images", 100_000_000, {"image_size": 64}, {"batch_size": 16, "workers": 1, "max_steps": 50}
    ),
}


def dataset(root: Path, setup: Setup) -> Path:
    """The setup's dataset under ``root`` (generated once, keyed by generator and size)."""
    path = root / f"{setup.generator}-{setup.size}"
    if not (path / "manifest.json").exists():
        generate(
            setup.generator,
            path,
            setup.size,
            seed=0,
            force=path.exists(),
            **setup.generator_options,
        )
    return path


def traced(
    workload: str, setup: Setup, variant: str, data: Path, runs: Path, profile: Path | None
) -> Run:
    drop_caches()
    settings = {"epochs": 1, "checkpoint_every": 0, "seed": 0, **setup.settings}
    request = build_request(
        TraceSettings(
            workload=workload,
            variant=variant,
            data=data,
            options=dict(setup.options),
            profile=profile,
            quiet=True,
            **settings,
        ),
        runs,
    )
    return load_run(trace(request).check())


#: How a measurement gets each run: ``keep(key, make)`` returns the run ``key``, made by
#: ``make()`` (the study: or the one done before, :func:`study_state.kept_or_traced`).
Keep = Callable[[str, Callable[[], Run]], Run]


def measure_workload(
    workload: str,
    rounds: int,
    data_root: Path,
    work: Path,
    log: Callable[[str], None] = lambda line: None,
    setup: Setup | None = None,
    instrumented_runs: int = 2,
    keep: Keep = lambda key, make: make(),
) -> dict[str, Any]:
    """Fit a profile to ``instrumented_runs`` instrumented runs, then ``rounds`` alternated
    ``original``/``sleep`` pairs; returns every figure (module doc). ``keep`` gets each run
    (:data:`Keep`)."""
    setup = setup or SETUPS[workload]
    data = dataset(data_root, setup)
    runs = work / workload

    def run(key: str, variant: str, profile: Path | None = None) -> Run:
        make = functools.partial(traced, workload, setup, variant, data, runs, profile)
        return keep(f"{workload}-{key}", make)

    log(f"{workload}: {instrumented_runs} instrumented run(s) for the profile")
    instrumented = [run(f"instrumented{i}", "instrumented") for i in range(instrumented_runs)]
    profile, warnings = fit_runs(instrumented, accelerator="cpu")
    for warning in warnings:
        log(f"{workload}: profile fit: {warning}")
    profile_path = work / f"{workload}-profile.json"
    profile.save(profile_path)
    pairs, emulated = [], []
    real = list(instrumented)
    for i in range(rounds):
        order = ("original", "sleep") if i % 2 == 0 else ("sleep", "original")
        done = {v: run(f"round{i}-{v}", v, profile_path if v == "sleep" else None) for v in order}
        real.append(done["original"])
        emulated.append(done["sleep"])
        pair = pair_figures(done["original"], done["sleep"], profile)
        log(
            f"{workload} round {i + 1}/{rounds}: "
            + ", ".join(f"{k} {pair[k]:.3f}" for k in (*GOALS, "own_step_error", "late_ms"))
        )
        pairs.append(pair)
    source = float(np.median(np.concatenate([step_times(r) for r in instrumented])))
    for pair, run in zip(pairs, emulated, strict=True):
        pair["fit_step_error"] = pair["emulated_step_s"] / source - 1
        # The emulated run against the real run closest to it: the real job's runs drift
        # between themselves (BERT's median step 0.53-0.70 s minutes apart on 2 cores), so
        # one pair's overall carries that drift; ``overall_noise`` is its measure.
        pair["closest_overall"] = max(compare_runs(r, run).overall for r in real)
    originals = real[len(instrumented) :]
    return {
        "workload": workload,
        "profile": str(profile_path),
        "fit_warnings": warnings,
        "pairs": pairs,
        **noise(real),
        # The real job against its own other runs: what a perfect emulation would score.
        "overall_noise": min(
            compare_runs(original, other).overall
            for original in originals
            for other in instrumented
        ),
    }


# --------------------------------------------------------------------------------------------
# As a study: ``[study] kind = "fidelity"``

#: Version of the layout of ``fidelity.json``; bump on any change, with a migration from the
#: old one in :data:`RESULTS`.
SCHEMA_VERSION = 1
KIND = "fidelity"
#: ``fidelity.json``: the study's results; its figure and state files.
RESULTS, RESULTS_NAME, FIGURE_NAME, STATE_NAME = study_state.study_files(KIND, SCHEMA_VERSION)
#: The ``[study]`` table's keys: the workloads measured (each on its small setup,
#: :data:`SETUPS`), the alternated pairs per workload, the instrumented runs fitted to.
SETTINGS = (
    Setting("workloads", "choices", tuple(SETUPS), choices=tuple(SETUPS)),
    Setting("rounds", "whole", 3, low=1, high=50),
    Setting("instrumented_runs", "whole", 2, low=1, high=10),
)


def check_study(study: Any) -> None:
    """Validate a ``kind = "fidelity"`` study: its keys; it makes its own datasets."""
    if study.datasets:
        raise UserError(
            f"{study.path}: the fidelity study makes each workload's small dataset: remove "
            "[[datasets]]"
        )
    validate(SETTINGS, study.spec, f"{study.path}: [study]")


def run_study(study: Any, out: Path, data: Mapping[str, Path], log: Log = print) -> Path:
    """Measure every workload of the study under ``out`` (datasets in ``out/data``, runs in
    ``out/runs``), resuming the runs done before; write ``fidelity.json`` and ``fidelity.html``
    and return the results' path."""
    del data  # check_study refuses [[datasets]]
    spec = validate(SETTINGS, study.spec, f"{study.path}: [study]")
    out, runs_root, started = study_state.study_home(out)
    state_path = out / STATE_NAME
    state = study_state.load_state(state_path, study_state.fingerprint(spec), log)

    def keep(key: str, make: Callable[[], Run]) -> Run:
        return study_state.kept_or_traced(key, state, state_path, make, log)

    results = [
        measure_workload(
            name,
            spec["rounds"],
            out / "data",
            runs_root,
            log,
            instrumented_runs=spec["instrumented_runs"],
            keep=keep,
        )
        for name in spec["workloads"]
    ]
    first = load_manifest(Path(next(iter(state["runs"].values()))["run_dir"]))
    return study_state.finish(
        RESULTS,
        out,
        {"goals": dict(GOALS), "workloads": results},
        host=first.get("host") or {},
        settings=spec,
        started=started,
        figure=fidelity_figure,
        table=table_lines,
        log=log,
    )


def load_results(path: Path) -> dict[str, Any]:
    """Read ``fidelity.json``, refusing another kind or schema version."""
    return study_state.load_results(path, RESULTS)
