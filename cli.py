#!/usr/bin/env python3
"""twintrace command line: build images, generate data, trace runs, inspect and plot them.

Every command parses its options, calls a typed function of the packages below (workloads/,
tracing/, datagen/, analysis/, images/, experiments/), and prints. This module holds the group,
the set-up commands (doctor, build, workloads, datagen) and the entry point; the other commands
live in commands/ by subject. Expected failures (UserError) print one line and exit 1 (the
run's settings named by their flags); anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent
_VENV = REPO / ".venv"

# Run under the project's virtualenv, so `./cli.py ...` works from the repo root after set-up.
if Path(sys.prefix).resolve() != _VENV.resolve() and os.environ.get("TWINTRACE_NO_REEXEC") != "1":
    _venv_python = _VENV / "bin" / "python"
    if not _venv_python.exists():
        sys.stderr.write("error: twintrace is not set up here: run `make setup` (as root) first\n")
        sys.exit(1)
    os.execv(str(_venv_python), [str(_venv_python), str(Path(__file__).resolve()), *sys.argv[1:]])

import json  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import click  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from commands.cluster import cluster  # noqa: E402
from commands.common import (  # noqa: E402
    err_console,
    json_option,
    one_line_warning,
    print_checks,
    runs_option,
    styled,
    user_errors,
)
from commands.profiles import list_profiles, profile  # noqa: E402
from commands.report import report  # noqa: E402
from commands.runs import compare, export, list_runs, plot, show  # noqa: E402
from commands.studies import experiment, hfta, stalls, sustain  # noqa: E402
from commands.trace import ingest, storage_server, trace  # noqa: E402
from core.errors import UserError  # noqa: E402
from core.units import format_size, parse_size  # noqa: E402
from workloads.config import RUN_VARIANTS  # noqa: E402


@click.group()
@click.version_option(
    package_name=None, version=__import__("core").__version__, prog_name="twintrace"
)
def cli() -> None:
    """twintrace: does your storage keep the GPUs fed, and does your benchmark behave like the
    real training job? Containerized ML-training workloads traced with eBPF.

    \b
    Examples:
      ./cli.py doctor
      ./cli.py trace --workload unet3d --variant sleep --data data/unet3d
      ./cli.py plot timeline runs/RUN
    """
    warnings.showwarning = one_line_warning


@cli.command()
@runs_option
@json_option("Print the checks as JSON.")
@click.option(
    "--gpus", is_flag=True, help="Also check that containers can get GPUs (trace --gpus)."
)
@user_errors
def doctor(runs_root: Path, as_json: bool, gpus: bool) -> None:
    """Check every prerequisite and print a pass/fail table with the fix for each failure.

    Example: ./cli.py doctor --gpus
    """
    from tracing.host import doctor as run_doctor

    checks = run_doctor(runs_root, gpus=gpus)
    torch_check = _base_torch_check(gpus)
    if torch_check is not None:
        checks.append(torch_check)
    print_checks(checks, as_json)


def _base_torch_check(gpus: bool) -> Any:
    """doctor's row for the torch build of twintrace/base (None when the image or the daemon
    is missing: the base image check says so); with ``gpus`` a CPU build fails it."""
    from images.build import base_torch
    from tracing.container import client
    from tracing.host import Check
    from workloads.config import BASE_TAG

    try:
        torch = base_torch(client())
    except UserError:
        return None
    if torch is None:
        return None
    ok = not gpus or torch.build == "cuda"
    return Check(
        "base torch",
        ok,
        f"{BASE_TAG}: {torch.describe()}",
        "GPU runs need the CUDA build of torch: run `./cli.py build --torch cuda`",
    )


@cli.command()
@click.option(
    "--workload", "workloads", multiple=True, help="Workload to build (repeatable; default: all)."
)
@click.option(
    "--variant",
    "variants",
    multiple=True,
    type=click.Choice(RUN_VARIANTS),
    help="Variant (repeatable; default: all; dlio: the one DLIO image, twintrace/dlio).",
)
@click.option(
    "--base-image",
    default=None,
    help="OS image under twintrace/base (default: python:3.11-slim if available, else bootstrapped).",
)
@click.option(
    "--bootstrap-base",
    is_flag=True,
    help="Make the OS image locally with debootstrap (no registry needed).",
)
@click.option(
    "--torch",
    "torch_build",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="The torch build of twintrace/base: cpu, or cuda (CUDA 13.0 and its nvidia-* wheels, "
    "about 2.7 GB, for `trace --gpus`; docs/gpus.md). Switching rebuilds every image.",
)
@click.option("-v", "--verbose", is_flag=True, help="Show the docker build output.")
@user_errors
def build(
    workloads: tuple[str, ...],
    variants: tuple[str, ...],
    base_image: str | None,
    bootstrap_base: bool,
    torch_build: str,
    verbose: bool,
) -> None:
    """Build the images that are missing or out of date and print their tags.

    Example: ./cli.py build --workload unet3d --variant sleep --torch cpu
    """
    from images.build import build as build_images
    from tracing.container import client

    def log(line: str) -> None:
        if verbose or not line.startswith(
            (" ---> ", "Step ", "Removing intermediate", "Successfully")
        ):
            err_console.print(styled(line)) if verbose else None
        if not verbose and line.startswith(
            ("building ", "bootstrapping", "importing", "downloading", "pulling", "no registry")
        ):
            err_console.print(line)

    with err_console.status("building images"):
        results = build_images(
            client(),
            workloads or None,
            variants or None,
            log,
            base_image,
            bootstrap_base,
            torch_build,
        )
    for r in results:
        click.echo(f"{r.tag}\t{r.image_id[7:19]}\t{'built' if r.built else 'up to date'}")


@cli.command("workloads")
@json_option("Print the workloads as JSON.")
@user_errors
def list_workloads(as_json: bool) -> None:
    """List the workloads: variants, data format, generator and default parameters.

    Example: ./cli.py workloads
    """
    from workloads.registry import WORKLOADS

    rows = [
        {
            "name": s.name,
            "description": s.description,
            "variants": list(s.variants),
            "datagen": s.datagen,
            "data_format": s.data_format,
            "defaults": s.default_settings(),
        }
        for s in WORKLOADS.values()
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(
        "workload", "variants", "data (./cli.py datagen ...)", "defaults", show_lines=True
    )
    for r in rows:
        defaults = {k: v for k, v in r["defaults"].items() if k != "options"}
        table.add_row(
            f"[bold]{r['name']}[/]\n{r['description']}",
            "\n".join(r["variants"]),
            f"[bold]{r['datagen']}[/]: {r['data_format']}",
            " ".join(f"{k}={v}" for k, v in defaults.items())
            + "\noptions (--set): "
            + " ".join(f"{k}={v}" for k, v in r["defaults"]["options"].items()),
        )
    Console(width=max(120, Console().width)).print(table)


@cli.command()
@click.argument("generator", type=click.Choice(["unet3d", "bert", "dlrm", "images"]))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Output directory (empty, or use --force).",
)
@click.option("--size", required=True, help="Total size, e.g. 500MB, 2GiB, 1.5e9.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=int, default=None, help="Processes (default: all cores).")
@click.option("--force", is_flag=True, help="Replace the contents of a non-empty output directory.")
@click.option(
    "--scale",
    type=float,
    default=None,
    help="unet3d: multiply KiTS19 case dimensions by this (e.g. 0.5 for demos: ~8x smaller files).",
)
@click.option(
    "--group-size",
    type=int,
    default=None,
    help="images: write the grouped format, G JPEGs per group file plus an index.",
)
@click.option(
    "--mean-kb",
    type=float,
    default=None,
    help="images: mean JPEG size in kB (default 110, ImageNet's); small images make I/O matter.",
)
@click.option(
    "--size-sigma",
    type=float,
    default=None,
    help="images: log standard deviation of the JPEG sizes (default 0.5; OpenImages-like: "
    "--mean-kb 317 --size-sigma 0.7).",
)
@click.option(
    "--learnable",
    is_flag=True,
    help="images: pixels that depend on the class (a hue per class), so that a model can learn "
    "the labels (accuracy studies); every file its own image.",
)
@click.option(
    "--classes",
    type=int,
    default=None,
    help="images: how many classes (default 10 with --learnable, else 1000).",
)
@click.option(
    "--val-fraction",
    type=float,
    default=None,
    help="images: the share of the images in the val split (default 0.2 with --learnable, "
    "else 0.02).",
)
@user_errors
def datagen(generator: str, out: Path, size: str, **options: Any) -> None:
    """Generate a synthetic dataset in a workload's real on-disk format.

    GENERATOR is unet3d, bert, dlrm or images (read by resnet18, resnet50 and alexnet).

    Examples:
      ./cli.py datagen images --out data/img --size 2GB --group-size 32
      ./cli.py datagen images --out data/learn --size 20MB --learnable --classes 10
    """
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from datagen.registry import generate

    size_bytes = parse_size(size)
    description = f"{generator} -> {out}"
    # A bar on a terminal; elsewhere (a log file, a pipe) plain lines: a start, the result.
    live = err_console.is_terminal
    if not live:
        err_console.print(f"generating {description} ({format_size(size_bytes)})")
    with Progress(
        TextColumn("{task.description}", style="progress.description"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=not live,
    ) as bar:
        task = bar.add_task(description, total=size_bytes)
        manifest = generate(
            generator,
            out,
            size_bytes,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
            **options,
        )
    click.echo(f"{len(manifest['files'])} files, {format_size(manifest['total_bytes'])} in {out}")


for _command in (
    trace,
    ingest,
    storage_server,
    list_runs,
    show,
    report,
    plot,
    compare,
    export,
    list_profiles,
    profile,
    stalls,
    hfta,
    sustain,
    experiment,
    cluster,
):
    cli.add_command(_command)


if __name__ == "__main__":
    cli()
