"""The studies and experiment grids: ``stalls``, ``hfta``, ``sustain``, ``experiment run``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from commands.common import (
    data_option,
    err_console,
    fmt_s,
    json_option,
    numbers,
    out_option,
    parse_sets,
    set_option,
    styled,
    swarm_options,
    user_errors,
)
from core.errors import UserError
from core.units import parse_size


def _study_dir(out_dir: Path | None, kind: str, name: str, results: str | None = None) -> Path:
    """A study's ``--out``, by default ``runs/<kind>/<time>-<name>``; with ``results`` (its
    results file's name), refused when it already holds a result."""
    if out_dir is None:
        out_dir = Path("runs") / kind / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    if results is not None and (out_dir / results).exists():
        raise UserError(f"{out_dir} already holds a result: give another --out")
    return out_dir


@click.command()
@click.option("--workload", required=True, help="Workload to measure (see ./cli.py workloads).")
@data_option("Dataset directory.", dest="data")
@click.option(
    "--variant",
    type=click.Choice(["sleep", "instrumented"]),
    default="sleep",
    show_default=True,
    help="sleep: emulated accelerators; instrumented: the real model on this host.",
)
@click.option(
    "--accelerator",
    metavar="NAME",
    default=None,
    help="Emulate this accelerator (profile database; ./cli.py profiles). Default: the "
    "workload's shipped profile.",
)
@click.option(
    "--profile-model", metavar="MODEL", default=None, help="Image workloads: the emulated model."
)
@click.option("--accelerators", type=int, default=1, show_default=True, help="Accelerators (G).")
@click.option("--batch-size", type=int, default=None, help="Batch per accelerator.")
@click.option("--workers", type=int, default=None, help="Loader workers per accelerator.")
@click.option(
    "--max-steps", type=int, default=0, show_default=True, help="Steps per epoch (0: all)."
)
@set_option("Workload option KEY=VALUE (repeatable).")
@click.option("--cpus", type=float, default=None, help="CPU limit of the container.")
@click.option(
    "--read-rate",
    default=None,
    help="Cap the dataset disk's reads at this many bytes per second, e.g. 50MB: a slower "
    "storage device, emulated (the container's blkio throttle).",
)
@click.option(
    "--cache-fractions",
    default=None,
    help="Also sweep the cached fraction, e.g. 0.25,0.5,0.75 (memory limits, verified).",
)
@click.option(
    "--cores", default=None, help="Also sweep CPU cores per accelerator, e.g. 0.5,1,2 (warm cache)."
)
@out_option(
    "out_dir",
    "Results directory (stalls.json, stalls.html, runs/). Default: runs/stalls/<time>-<workload>.",
    kind="dir",
)
@json_option()
@user_errors
def stalls(
    read_rate: str | None,
    cache_fractions: str | None,
    cores: str | None,
    out_dir: Path | None,
    as_json: bool,
    **settings: Any,
) -> None:
    """Data stalls by DS-Analyzer's differential method: three traced runs (synthetic data in
    memory, real data fully cached, real data on a cold cache) split an epoch into compute,
    host-to-device, prep stall and fetch stall, with a what-if table for cached fractions.

    \b
    Examples:
      ./cli.py stalls --workload resnet18 --data data/img --accelerator v100 --batch-size 64
      ./cli.py stalls --workload resnet18 --data data/img --cache-fractions 0.25,0.5 --cores 1,2
    """

    from analysis.stalls import summary_lines
    from experiments.stalls import StallSettings, measure_stalls
    from experiments.study_state import sole_runner

    stall_settings = StallSettings(
        **settings, read_bps=parse_size(read_rate) if read_rate else None
    )
    name = settings["profile_model"] or settings["workload"]
    out_dir = _study_dir(out_dir, "stalls", name, "stalls.json")
    with sole_runner(out_dir):
        result = measure_stalls(
            stall_settings,
            out_dir,
            cache_fractions=numbers(cache_fractions, "--cache-fractions", float),
            cores=numbers(cores, "--cores", float),
            log=lambda line: err_console.print(styled(line)),
        )
    for line in summary_lines(result):
        err_console.print(line, highlight=False)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        click.echo(str(out_dir / "stalls.json"))


@click.command()
@click.option(
    "--workload", default="resnet18", show_default=True, help="resnet18, resnet50, alexnet."
)
@data_option("An image dataset (./cli.py datagen images).")
@click.option(
    "--array-sizes", default="1,2,4,8", show_default=True, help="Models per array B, e.g. 1,2,4,8."
)
@click.option(
    "--variant",
    type=click.Choice(["original", "sleep"]),
    default="original",
    show_default=True,
    help="original: real training here; sleep: compute emulated from this host's measured "
    "profiles (or --profiles).",
)
@click.option(
    "--epochs", type=int, default=3, show_default=True, help="At least 2 (the first is warm-up)."
)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--workers", type=int, default=1, show_default=True, help="Loader workers per job.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--learning-rates",
    default=None,
    help="One per model, comma-separated (default: 0.1 halved from model to model).",
)
@click.option("--set", "sets", multiple=True, help="Workload option KEY=VALUE (repeatable).")
@click.option("--memory-limit", default=None, help="Memory limit of each container, e.g. 2GiB.")
@click.option("--cpus", type=float, default=None, help="CPU limit of each container.")
@click.option("--timeout", type=float, default=None, help="Fail a run still going after this (s).")
@click.option(
    "--profiles",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="sleep: folder of cpu-<workload>-x<B>.json profiles (default: measure this host "
    "once, cached).",
)
@click.option(
    "--warm-cache", is_flag=True, help="Leave the page cache as it is (default: drop it first)."
)
@click.option(
    "--eval-every",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Evaluate every N epochs on the dataset's val split: each model's accuracy per "
    "epoch, alone, concurrent and fused (a --learnable dataset; 0: never).",
)
@click.option(
    "--no-share-cores",
    is_flag=True,
    help="Concurrent jobs compute with a thread per core each (default: their share).",
)
@out_option("out_dir", "Output directory (default: runs/hfta/<time>-<workload>).", kind="dir")
@json_option()
@user_errors
def hfta(
    workload: str,
    data_dir: Path,
    array_sizes: str,
    variant: str,
    epochs: int,
    batch_size: int,
    workers: int,
    seed: int,
    learning_rates: str | None,
    sets: tuple[str, ...],
    memory_limit: str | None,
    cpus: float | None,
    timeout: float | None,
    profiles: Path | None,
    warm_cache: bool,
    eval_every: int,
    no_share_cores: bool,
    out_dir: Path | None,
    as_json: bool,
) -> None:
    """Horizontally fused training arrays (HFTA): for each B, train B models (model k at its
    own learning rate) serially, concurrently (a container each) and as one fused array (one
    data pipeline), every run traced; print throughput normalised to serial and the I/O and
    CPU per model trained, write hfta.json and hfta.html (docs/hfta.md).

    \b
    Examples:
      ./cli.py hfta --workload resnet18 --data data/img --array-sizes 1,2,4,8
      ./cli.py hfta --workload alexnet --data data/img --variant sleep --set image_size=64
      ./cli.py hfta --data data/learn --array-sizes 1,2,4 --eval-every 1 --epochs 5
    """
    from experiments.hfta import RESULTS_NAME, load_results, parse_spec, run_hfta
    from experiments.study_state import sole_runner

    spec: dict[str, Any] = {
        "workload": workload,
        "variant": variant,
        "array_sizes": numbers(array_sizes, "--array-sizes", int),
        "epochs": epochs,
        "batch_size": batch_size,
        "workers": workers,
        "seed": seed,
        "cold_cache": not warm_cache,
        "share_cores": not no_share_cores,
        "memory_limit": memory_limit,
        "cpus": cpus,
        "timeout_s": timeout,
        "options": parse_sets(sets),
        "eval_every": eval_every,
    }
    if learning_rates is not None:
        spec["learning_rates"] = numbers(learning_rates, "--learning-rates", float)
    if profiles is not None:
        spec["profiles"] = profiles
    settings = parse_spec(spec, "hfta")
    out_dir = _study_dir(out_dir, "hfta", workload, RESULTS_NAME)
    with sole_runner(out_dir):
        path = run_hfta(
            settings, data_dir, out_dir, log=lambda line: err_console.print(line, highlight=False)
        )
    if as_json:
        click.echo(json.dumps(load_results(path), indent=2, sort_keys=True))
    else:
        click.echo(str(path))


@click.command()
@click.option("--workload", required=True, help="Workload (see ./cli.py workloads).")
@data_option("Its dataset (./cli.py datagen).", dest="data")
@click.option(
    "--variant",
    type=click.Choice(["sleep", "dlio", "both"]),
    default="sleep",
    show_default=True,
    help="What emulates the accelerators: the sleep variant, or DLIO (MLPerf Storage's engine) "
    "from the same settings and profile, on its own copy of the data; both: one search each "
    "(OUT/sleep, OUT/dlio), side by side.",
)
@click.option(
    "--accelerator",
    metavar="NAME",
    default=None,
    help="The accelerator emulated (profile database; ./cli.py profiles). Default: the "
    "workload's shipped profile.",
)
@click.option(
    "--profile-model", metavar="MODEL", default=None, help="Image workloads: the emulated model."
)
@click.option("--batch-size", type=int, default=None, help="Batch per accelerator.")
@click.option("--workers", type=int, default=None, help="Loader workers per accelerator.")
@click.option("--epochs", type=int, default=1, show_default=True, help="Epochs of each run.")
@click.option(
    "--max-steps", type=int, default=0, show_default=True, help="Steps per epoch (0: all)."
)
@click.option(
    "--au",
    type=float,
    default=None,
    help="The AU every count must keep, e.g. 0.9. Default: MLPerf Storage's rule for the "
    "workload (0.9 for unet3d and resnet50), else 0.9.",
)
@click.option(
    "--max-accelerators",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="The largest count the search tries.",
)
@click.option(
    "--read-rate",
    default=None,
    help="Cap the dataset disk's reads at this many bytes per second, e.g. 50MB: a slower "
    "storage, emulated (the containers' blkio throttle).",
)
@click.option(
    "--memory-limit",
    default=None,
    help="Memory limit of the containers (bounds their page cache), e.g. 2GiB.",
)
@click.option("--cpus", type=float, default=None, help="CPU limit of the container.")
@click.option(
    "--cache",
    type=click.Choice(["drop", "epochs", "keep"]),
    default="drop",
    show_default=True,
    help="drop: the dataset evicted from the page cache before each run, so each reads it "
    "cold; epochs: also between a run's epochs, every rank waiting meanwhile (our variants); "
    "keep: left as it is.",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=None,
    help="Spread each count's accelerators (a container each) over K nodes of a swarm, an "
    "agent tracing each (docs/cluster.md): the virtual cluster (./cli.py cluster up), or the "
    "one --engine names (then --cache keep).",
)
@swarm_options
@click.option("--seed", type=int, default=0, show_default=True, help="Training seed.")
@click.option("--timeout", type=float, default=None, help="Fail a run still going after this (s).")
@set_option("Workload option KEY=VALUE (repeatable).")
@out_option(
    "out_dir",
    "Results directory (sustain.json, sustain.html, runs/); run again with the same settings, "
    "the search keeps its runs. Default: runs/sustain/<time>-<workload>.",
    kind="dir",
)
@json_option()
@user_errors
def sustain(
    read_rate: str | None,
    memory_limit: str | None,
    timeout: float | None,
    out_dir: Path | None,
    as_json: bool,
    **settings: Any,
) -> None:
    """How many emulated accelerators this storage keeps at or above the AU threshold (MLPerf
    Storage's question): traced runs of the sleep variant with 1, 2, 4, ... accelerators, then
    a bisection; the answer, what limited it (the storage, the page cache, the clients' CPU),
    and the bandwidth per accelerator. Writes sustain.json and sustain.html (docs/sustain.md).

    \b
    Examples:
      ./cli.py sustain --workload unet3d --data data/unet3d --accelerator a100
      ./cli.py sustain --workload unet3d --data data/unet3d --read-rate 100MB --max-steps 20
      ./cli.py sustain --workload unet3d --data /shared/unet3d --nodes 3 --cache epochs --epochs 2
    """
    import dataclasses

    from analysis.sustain import compare_lines
    from experiments.study_state import sole_runner
    from experiments.sustain import SustainSettings, find_sustained, load_results

    both = settings["variant"] == "both"
    search = SustainSettings(
        **{**settings, "variant": "sleep" if both else settings["variant"]},
        read_bps=parse_size(read_rate) if read_rate else None,
        memory_limit=parse_size(memory_limit) if memory_limit else None,
        timeout_s=timeout,
    )
    if both:  # every setting DLIO's search will run with, checked before the first run
        dataclasses.replace(search, variant="dlio")
    out_dir = _study_dir(out_dir, "sustain", search.workload)

    def log(line: str) -> None:
        err_console.print(styled(line), highlight=False)

    with sole_runner(out_dir):
        if not both:
            paths = [find_sustained(search, out_dir, log)]
        else:
            paths = []
            for variant in ("sleep", "dlio"):
                log(f"the search with {variant}")
                chosen = dataclasses.replace(search, variant=variant)
                paths.append(find_sustained(chosen, out_dir / variant, log))
            for line in compare_lines(*(load_results(p) for p in paths)):
                log(line)
    if as_json:
        results = [load_results(p) for p in paths]
        click.echo(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        for path in paths:
            click.echo(str(path))


@click.group()
def experiment() -> None:
    """Experiment grids described in TOML files (see docs/experiments.md).

    Example: ./cli.py experiment run experiments/timelines.toml --dry-run
    """


@experiment.command("run")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@out_option(
    "out_root",
    "Experiments directory: runs, data and outputs go to OUT/NAME.",
    kind="dir",
    default=Path("runs/experiments"),
)
@click.option("--dry-run", is_flag=True, help="List the runs the grid makes and exit.")
@user_errors
def experiment_run(path: Path, out_root: Path, dry_run: bool) -> None:
    """Run (or resume) every run of an experiment grid, then write its timelines, breakdowns and
    comparisons; print a table of every run. Completed runs are skipped on a second run.

    Example: ./cli.py experiment run experiments/timelines.toml
    """
    from experiments.orchestrate import load_experiment, run_experiment
    from experiments.studies import is_study, load_study, run_study

    if is_study(path):  # a published method's procedure (docs/experiments.md, "Studies")
        study = load_study(path)
        if dry_run:
            click.echo(f"study {study.name} ({study.kind}): {study.description}")
            return
        result = run_study(
            study, out_root, log=lambda line: err_console.print(line, highlight=False)
        )
        click.echo(str(result))
        return
    exp = load_experiment(path)
    if dry_run:
        for i, spec in enumerate(exp.runs, 1):
            click.echo(f"[{i}/{len(exp.runs)}] {spec.key}")
        return
    outcomes = run_experiment(
        exp, out_root, log=lambda line: err_console.print(line, highlight=False)
    )
    table = Table("run", "status", "duration", "run directory / error")
    for o in outcomes:
        colour = {"completed": "green", "lossy": "yellow", "skipped": "cyan", "failed": "red"}[
            o.status
        ]
        table.add_row(
            o.key,
            f"[{colour}]{o.status}[/]",
            fmt_s(o.duration_s),
            Text(o.error or o.run_dir or ""),
        )
    Console(width=max(140, Console().width)).print(table)
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        raise UserError(
            f"{len(failed)} of {len(outcomes)} runs failed (see the table); run the experiment again to retry them"
        )
