"""Sleep profiles: ``profiles`` (the database), ``profile fit`` and ``profile measure``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from commands.common import (
    data_option,
    err_console,
    numbers,
    out_option,
    parse_sets,
    runs_root_option,
    styled,
    user_errors,
)
from core.errors import UserError
from core.units import format_size


@click.command("profiles")
@click.option("--accelerator", default=None, help="Only this accelerator (a100, v100, ...).")
@click.option(
    "--workload", default=None, help="Only this workload or model (resnet50, vgg16, ...)."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: the accelerators, the sources and one record per accelerator, model and "
    "source.",
)
@user_errors
def list_profiles(accelerator: str | None, workload: str | None, as_json: bool) -> None:
    """List what the profile database covers (docs/profiles.md): accelerators, models, batch
    ranges and sources; `trace --accelerator` picks from it.

    Example: ./cli.py profiles --accelerator a100 --workload resnet50
    """
    from store.profiledb import default_database

    db = default_database()
    data = db.describe_coverage(accelerator, workload)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = Table("accelerator", "memory", "source", "models (batch sizes)", show_lines=True)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in data["coverage"]:
        groups.setdefault((r["accelerator"], r["source_id"]), []).append(r)
    for (acc, source), items in groups.items():
        spans: dict[str, list[str]] = {}
        for r in items:
            span = (
                f"{r['batch_min']}-{r['batch_max']}"
                if r["batch_sizes"] > 1
                else f"{r['batch_min']}"
            )
            spans.setdefault(f"{span} ({r['kind']})", []).append(r["model"])
        memory = items[0]["capacity_bytes"] if items[0]["memory"] else None
        table.add_row(
            f"[bold]{acc}[/]\n{items[0]['accelerator_name']}",
            format_size(memory) if memory else "not emulated",
            source + ("" if all(r["default"] for r in items) else "\n(not the default)"),
            "\n".join(f"{span}: {', '.join(models)}" for span, models in spans.items()),
        )
    Console(width=max(120, Console().width)).print(table)
    if not any(r["source_id"] == "host" for r in data["coverage"]):
        err_console.print(
            "cpu (this host's CPU): nothing measured here yet; `./cli.py trace --variant sleep "
            "--accelerator cpu ...` measures it once, or `./cli.py profile measure --workload W "
            "--data D --batch-sizes B --db`.",
            highlight=False,
        )
    err_console.print(
        "Where sources overlap, a lookup takes one with a row at the batch size, else the "
        f"first of {', '.join(data['default_order'])} (docs/profiles.md).",
        highlight=False,
    )


@click.group()
def profile() -> None:
    """Sleep profiles: fit them to instrumented runs or measure a workload's compute natively.

    Example: ./cli.py profile fit runs/RUN_B2 runs/RUN_B4 --out profiles/unet3d-cpu.json
    """


@profile.command("fit")
@click.argument("runs", nargs=-1, required=True)
@out_option("out_path", "Profile JSON to write.", required=True)
@click.option(
    "--accelerator", default=None, help="Accelerator name to record (default: from the runs)."
)
@runs_root_option
@user_errors
def profile_fit(
    runs: tuple[str, ...], out_path: Path, accelerator: str | None, runs_root: Path
) -> None:
    """Fit a sleep profile to the all_compute times of instrumented runs; print its path.

    Example: ./cli.py profile fit runs/RUN_B2 runs/RUN_B4 --out profiles/unet3d-cpu.json
    """
    from analysis.profiles import fit_runs
    from store.rundir import load_run, resolve_run

    fitted, warnings = fit_runs([load_run(resolve_run(r, runs_root)) for r in runs], accelerator)
    _report_profile(fitted, warnings, out_path)


@profile.command("measure")
@click.option(
    "--workload", required=True, help="Workload whose compute to measure (see ./cli.py workloads)."
)
@data_option("A dataset of the workload (one batch is read).")
@click.option("--batch-sizes", required=True, help="Comma-separated batch sizes, e.g. 1,2,4,8.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--set", "sets", multiple=True, help="Workload option KEY=VALUE (repeatable).")
@click.option(
    "--cv",
    "cv_target",
    type=float,
    default=0.05,
    show_default=True,
    help="Stop when the mean's coefficient of variation is under this.",
)
@click.option(
    "--max-seconds", type=float, default=60.0, show_default=True, help="Time limit per batch size."
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Loader workers reading beside the timed steps, as in the job.",
)
@out_option("out_path", "Profile JSON to write (with --db: optional).")
@click.option(
    "--db",
    "into_db",
    is_flag=True,
    help="Also file the profile in the profile database (then: trace --accelerator NAME).",
)
@click.option(
    "--accelerator",
    "db_name",
    default=None,
    help="Accelerator name of the database entry (default on a CPU: cpu, this host's CPU, "
    "cached per host; on a GPU a declared card matching its name, else a name made from it).",
)
@click.option("--replace", is_flag=True, help="Overwrite an existing database entry.")
@user_errors
def profile_measure(
    workload: str,
    data_dir: Path,
    batch_sizes: str,
    sets: tuple[str, ...],
    out_path: Path | None,
    into_db: bool,
    db_name: str | None,
    replace: bool,
    **measuring: Any,
) -> None:
    """Measure a workload's host-to-device copy, forward, backward and optimizer step per
    step natively (warm-up excluded) and write a profile; with --db, file it in the profile
    database too.

    Example: ./cli.py profile measure --workload resnet18 --data data/img --batch-sizes 2,4,8 --db
    """
    from experiments.measure import MeasureSettings, database_name, measure
    from store.hostprofiles import HOST_CPU, save_host_profile
    from store.profiledb import add_measured, check_fileable

    if out_path is None and not into_db:
        raise UserError("give --out FILE, --db, or both: where the measured profile goes")
    if (db_name or replace) and not into_db:
        raise UserError("--accelerator and --replace name the database entry: add --db")
    if into_db:
        check_fileable(parse_sets(sets))

    sizes = tuple(numbers(batch_sizes, "--batch-sizes", int))
    settings = MeasureSettings(batch_sizes=sizes, **measuring)
    command = "./cli.py profile measure " + " ".join(
        sys.argv[3:] if sys.argv[1:3] == ["profile", "measure"] else sys.argv[1:]
    )
    measured, warnings = measure(
        workload,
        data_dir,
        settings,
        parse_sets(sets),
        progress=lambda line: err_console.print(line, highlight=False),
        command=command,
    )
    if into_db:
        name = db_name or database_name(measured)
        if name == HOST_CPU:
            filed = save_host_profile(measured, parse_sets(sets))
            err_console.print(
                f"filed as this host's CPU ({filed}): ./cli.py trace --workload {workload} "
                f"--variant sleep --accelerator {HOST_CPU} ...",
                highlight=False,
            )
        else:
            filed = add_measured(measured, name, replace=replace)
            err_console.print(
                f"filed in the profile database as {name}/{workload}: ./cli.py trace --workload "
                f"{workload} --variant sleep --accelerator {name} ...",
                highlight=False,
            )
    _report_profile(measured, warnings, out_path)
    if out_path is None:
        click.echo(str(filed))


def _report_profile(prof: Any, warnings: list[str], out_path: Path | None) -> None:
    """Print the fit's warnings and the model; write the profile to ``out_path`` (if given)
    and print its path."""
    for warning in warnings:
        err_console.print(styled(f" {warning}", "yellow", "warning:"))
    mean, std = prof.compute.mean, prof.compute.std
    err_console.print(
        f"mean = {mean.g:.6g} g + {mean.b:.6g} b + {mean.const:.6g} s (R^2 {prof.fit.get('mean_r2')}); "
        f"std = {std.g:.6g} g + {std.b:.6g} b + {std.const:.6g} s; {len(prof.table)} table point(s)",
        highlight=False,
    )
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        prof.save(out_path)
        click.echo(str(out_path))
