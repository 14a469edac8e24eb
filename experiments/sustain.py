"""How many accelerators can this storage feed? MLPerf Storage's question, answered by traced
runs (``./cli.py sustain``, docs/sustain.md).

The search runs the workload's ``sleep`` variant (emulated accelerators driven by the profile
database), or with ``--variant dlio`` the DLIO benchmark (MLPerf Storage's engine) configured
from the same settings and profile, with 1, 2, 4, ... accelerators (ranks) until one count's AU falls below the threshold,
then bisects between the last count that passed and the first that failed
(:func:`analysis.sustain.search_counts`): about 2 log2(N) runs for an answer N. The threshold is
MLPerf Storage's rule for the workload (:data:`AU_RULES`: 90 % for UNet3D and ResNet-50), else
90 %, or ``--au``. Each run is traced; the dataset is evicted from the page cache before each
(``--cache drop``, the default: :func:`tracing.host.evict_files`, the libraries the run maps
stay cached), so that every run reads it cold; ``--cache epochs`` also between a run's epochs.
With ``--nodes K`` a count of N is N containers of one rank each, dealt over K nodes of a swarm
(the virtual cluster, or the one ``--engine`` names: then ``--cache keep``, since this host
cannot reach the nodes' page caches).

Before the first run the dataset is checked against MLPerf Storage's sizing rules
(:func:`check_sizing`): at least :data:`SIZING_FACTOR` times the clients' memory (the host's, or
the containers' ``--memory-limit``: the page cache cannot hold it) and at least
:data:`MIN_STEPS` steps in a run; each broken rule is a warning with the size or setting that
satisfies it.

The answer says what limited it (:func:`analysis.sustain.limiter`, from the first count that
failed): the storage, the page cache, the clients' CPU, the data pipeline, or the largest count
the search may try (``--max-accelerators``). Results in ``OUT/``: ``sustain.json``
(:data:`RESULTS`, versioned), ``sustain.html`` (AU and bandwidth against accelerators),
``runs/``, and ``sustain-state.json``: run again with the same settings, the search keeps the
runs it has and runs only what it lacks.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analysis.sustain import (
    REMEDIES,
    cached,
    limiter,
    percent,
    run_figures,
    search_counts,
    sustain_figure,
    table_lines,
)
from core.errors import UserError
from core.units import format_size
from experiments import study_state
from experiments.study_state import Log
from store.rundir import Run, load_run

SCHEMA_VERSION = 1
KIND = "sustain"
#: What emulates the accelerators: our sleep variant, or DLIO (MLPerf Storage's engine),
#: configured from the same settings and profile (experiments/dlio.py).
VARIANTS = ("sleep", "dlio")
RESULTS, RESULTS_NAME, FIGURE_NAME, STATE_NAME = study_state.study_files(KIND, SCHEMA_VERSION)
#: MLPerf Storage's AU thresholds for the workloads of its rules (CosmoFlow's 70 % has no
#: workload here); any other workload: :data:`DEFAULT_AU`, twintrace's.
AU_RULES: Mapping[str, float] = {"unet3d": 0.9, "resnet50": 0.9}
DEFAULT_AU = 0.9
#: The dataset's pages in the page cache: ``drop`` evicted before each run, ``epochs`` before
#: each run and between its epochs (every rank waits meanwhile), ``keep`` left as they are.
CACHE_CHOICES = ("drop", "epochs", "keep")
#: MLPerf Storage's sizing rules: the dataset at least this many times the clients' memory,
SIZING_FACTOR = 5
#: and at least this many steps in a run.
MIN_STEPS = 500


@dataclasses.dataclass(frozen=True)
class SustainSettings:
    """The search's settings (``./cli.py sustain``'s options)."""

    workload: str
    data: Path
    variant: str = "sleep"
    accelerator: str | None = None
    profile_model: str | None = None
    batch_size: int | None = None
    workers: int | None = None
    epochs: int = 1
    max_steps: int = 0
    au: float | None = None
    max_accelerators: int = 16
    read_bps: int | None = None
    memory_limit: int | None = None
    cpus: float | None = None
    cache: str = "drop"
    nodes: int | None = None
    cluster: str = "twintrace"
    engine: str | None = None
    registry: str | None = None
    seed: int = 0
    timeout_s: float | None = None
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        from workloads.registry import WORKLOADS

        if self.workload not in WORKLOADS:
            raise UserError(
                f"unknown workload {self.workload!r}; known: {', '.join(sorted(WORKLOADS))}"
            )
        if self.variant not in VARIANTS:
            raise UserError(f"--variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.au is not None and not 0 < self.au <= 1:
            raise UserError(f"--au must be above 0 and at most 1, got {self.au}")
        if self.max_accelerators < 1:
            raise UserError(f"--max-accelerators must be 1 or more, got {self.max_accelerators}")
        if self.cache not in CACHE_CHOICES:
            raise UserError(
                f"--cache must be one of {', '.join(CACHE_CHOICES)}, got {self.cache!r}"
            )
        if self.cache == "epochs" and self.variant == "dlio":
            raise UserError(
                "--cache epochs pauses our ranks between epochs, and DLIO's epochs cannot be "
                "paused: use --cache drop with --epochs 1, or a --memory-limit"
            )
        if self.cache != "keep" and self.engine is not None:
            raise UserError(
                f"--cache {self.cache} evicts the dataset from this host's page cache, not from "
                "the nodes' of the swarm "
                "--engine names: use --cache keep with a --memory-limit on the containers (or "
                "a dataset 5x their memory)"
            )
        if self.nodes is not None and self.nodes < 1:
            raise UserError(f"--nodes must be 1 or more, got {self.nodes}")
        if self.nodes is None and (self.engine or self.registry):
            raise UserError("--engine and --registry are for a search across --nodes")
        if self.epochs < 1:
            raise UserError(f"--epochs must be 1 or more, got {self.epochs}")

    @property
    def threshold(self) -> float:
        """The AU every count must keep: ``au``, else the workload's rule."""
        return self.au if self.au is not None else AU_RULES.get(self.workload, DEFAULT_AU)

    @property
    def rule(self) -> str:
        if self.au is not None:
            return "--au"
        return "MLPerf Storage" if self.workload in AU_RULES else "twintrace's default"

    def recorded(self) -> dict[str, Any]:
        """The settings as the results and the state's fingerprint record them."""
        return {
            **{k: v for k, v in dataclasses.asdict(self).items() if k != "data"},
            "data": str(Path(self.data).resolve()),
            "au": self.threshold,
            "au_rule": self.rule,
        }


def check_sizing(s: SustainSettings, log: Log) -> dict[str, Any]:
    """The dataset against MLPerf Storage's sizing rules (module doc): its bytes and items, the
    clients' memory, the steps of a run of one accelerator; a warning for each rule broken,
    saying what satisfies it."""
    from workloads.config import WorkloadConfig
    from workloads.registry import WORKLOADS

    spec = WORKLOADS[s.workload]
    summary = spec.check_data(Path(s.data))
    host_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    memory = s.memory_limit or host_memory
    whose = "the containers' --memory-limit" if s.memory_limit else "the host's memory"
    config: WorkloadConfig = spec.config(
        s.variant, **({"batch_size": s.batch_size} if s.batch_size else {})
    )
    steps = summary.items // max(1, config.batch_size)
    if s.max_steps:
        steps = min(steps, s.max_steps)
    warnings = []
    need = SIZING_FACTOR * memory
    if s.engine is not None and not s.memory_limit:
        warnings.append(
            "the memory of the swarm's nodes is not known here, so the dataset cannot be "
            f"checked against it: give the containers a --memory-limit (the dataset "
            f"{format_size(summary.bytes)} is 5x of {summary.bytes // SIZING_FACTOR})"
        )
    elif summary.bytes < need:
        warnings.append(
            f"the dataset ({format_size(summary.bytes)}) is {summary.bytes / memory:.2f}x "
            f"{whose} ({format_size(memory)}); MLPerf Storage asks for at least "
            f"{SIZING_FACTOR}x ({format_size(need)}) so that the page cache cannot hold it: "
            f"generate a larger one (--size {need}), or give the containers a memory limit "
            f"(--memory-limit {summary.bytes // SIZING_FACTOR}); with more than one epoch, "
            "the epochs after the first may read memory"
        )
    if steps * s.epochs < MIN_STEPS:
        warnings.append(
            f"a run of one accelerator has {steps * s.epochs} steps ({steps} per epoch x "
            f"{s.epochs}), fewer with more accelerators; MLPerf Storage asks for at least "
            f"{MIN_STEPS}: a larger dataset or more --epochs gives more"
        )
    for line in warnings:
        log(f"warning: {line}")
    return {
        "bytes": summary.bytes,
        "items": summary.items,
        "files": summary.files,
        "memory_bytes": None if s.engine and not s.memory_limit else memory,
        "memory_of": "the swarm's nodes (not known)" if s.engine and not s.memory_limit else whose,
        "steps_one_accelerator": steps * s.epochs,
        "warnings": warnings,
    }


def load_results(path: Path) -> dict[str, Any]:
    """Read ``sustain.json``, refusing another kind or schema version."""
    return study_state.load_results(path, RESULTS)


def _trace(s: SustainSettings, count: int, runs_root: Path, log: Log) -> Run:
    from tracing.host import evict_files
    from tracing.request import dataset_dirs
    from tracing.runner import trace

    request = study_state.study_request(
        s,
        Path(s.data),
        runs_root,
        log,
        epochs=s.epochs,
        seed=s.seed,
        accelerators=count,
        max_steps=s.max_steps or None,
        memory_limit=s.memory_limit,
        cpus=s.cpus,
        read_limit=s.read_bps,
        options=dict(s.options),
        cold_epochs=s.cache == "epochs",
        **(
            {
                "nodes": min(s.nodes, count),
                "rank_containers": count > 1,  # one accelerator: its one container
                "cluster": s.cluster,
                "engine": s.engine,
                "registry": s.registry,
            }
            if s.nodes
            else {}
        ),
    )
    if s.cache != "keep":  # after the request: DLIO's copy of the dataset is made with it
        evict_files(dataset_dirs(request))
    return load_run(trace(request).check())


def find_sustained(s: SustainSettings, out: Path, log: Log = print) -> Path:
    """Run the search (module doc) under ``out``; return the path of ``sustain.json``."""
    out, runs_root, started = study_state.study_home(out)
    sizing = check_sizing(s, log)
    state_path = out / STATE_NAME
    state = study_state.load_state(state_path, study_state.fingerprint(s.recorded()), log)
    threshold = s.threshold
    passes: dict[int, bool] = {}
    rows: dict[int, dict[str, Any]] = {}
    host: dict[str, Any] = {}  # the first run's, as every study's results record it
    while True:
        count, _, done = search_counts(passes, s.max_accelerators)
        if done or count is None:
            break
        key = f"accelerators-{count}"
        log(f"{count} accelerator(s)")
        run = study_state.kept_or_traced(
            key, state, state_path, lambda n=count: _trace(s, n, runs_root, log), log
        )
        host = host or dict(run.manifest.get("host") or {})
        figures = run_figures(run)
        au = figures.get("au")
        passes[count] = au is not None and not math.isnan(au) and au >= threshold
        rows[count] = {
            "accelerators": count,
            "run_dir": str(run.path),
            "status": run.status,
            "passed": passes[count],
            "figures": figures,
        }
        log(
            f"{count} accelerator(s): AU {percent(au)} "
            f"({'at' if passes[count] else 'below'} the {threshold:.0%} threshold)"
            + ("; its reads mostly came from the page cache" if cached(figures) else "")
        )
    _, best, _ = search_counts(passes, s.max_accelerators)
    best = best or 0
    # What the accelerators need at AU 100 %: the count times one accelerator's demand alone
    # (the rate a run's own reads imply is what it got, at the AU it had).
    one = rows[1]["figures"].get("needed_bytes_per_s") if 1 in rows else None
    for count, row in rows.items():
        row["figures"]["demand_bytes_per_s"] = count * one if one else None
    failed = min((n for n, ok in passes.items() if not ok and n > best), default=None)
    code, sentence = limiter(
        rows[failed]["figures"] if failed else rows[best]["figures"], threshold
    )
    at_best = rows[best]["figures"] if best else {}
    answer = {
        "accelerators": best,
        "limit": code,
        "limit_text": sentence,
        "limited_at": failed,
        "bytes_per_s": at_best.get("delivered_bytes_per_s"),
        "bytes_per_s_per_accelerator": (at_best.get("delivered_bytes_per_s") or 0) / best
        if best
        else None,
        "needed_bytes_per_s": at_best.get("needed_bytes_per_s"),
        "cached_runs": sorted(n for n, r in rows.items() if cached(r["figures"])),
    }
    if answer["cached_runs"]:
        log(
            f"warning: the runs of {', '.join(map(str, answer['cached_runs']))} accelerator(s) "
            f"read mostly from the page cache: they measured memory, not storage; {REMEDIES}"
        )
    runs = [rows[n] for n in sorted(rows)]
    return study_state.finish(
        RESULTS,
        out,
        {"dataset": sizing, "threshold": threshold, "runs": runs, "answer": answer},
        host=host,
        settings=s.recorded(),
        started=started,
        figure=sustain_figure,
        table=table_lines,
        log=log,
    )


__all__ = [
    "AU_RULES",
    "DEFAULT_AU",
    "MIN_STEPS",
    "SIZING_FACTOR",
    "SustainSettings",
    "check_sizing",
    "find_sustained",
    "load_results",
]
