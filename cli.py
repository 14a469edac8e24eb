#!/usr/bin/env python3
"""twintrace command line: build images, generate data, trace runs, inspect and plot them.

Every command parses and validates its options, calls a typed function of workloads/, tracing/,
datagen/, analysis/ or images/, and prints. Expected failures (UserError) print one line and
exit 1; anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import os
import sys
import time
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
from collections.abc import Callable  # noqa: E402
from functools import wraps  # noqa: E402
from typing import Any  # noqa: E402

import click  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

from core.errors import UserError  # noqa: E402
from core.units import SIZE_HELP, format_size, parse_size  # noqa: E402
from workloads.config import PEER_VARIANTS, RUN_VARIANTS  # noqa: E402

# No markup: what we print to stderr holds text of others (a container's log lines, paths,
# errors) in which "[...]" is not markup; styled lines are built with _styled.
err_console = Console(stderr=True, highlight=False, markup=False)


def _styled(text: str, style: str = "dim", prefix: str = "") -> Text:
    """``prefix`` in ``style`` then ``text`` as it is; without a prefix, ``text`` in ``style``."""
    if prefix:
        return Text.assemble((prefix, style), text)
    return Text(text, style=style)


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn UserError into a one-line message and exit status 1."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except UserError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt as exc:
            err_console.print(str(exc) or "interrupted")
            sys.exit(130)

    return wrapper


def out_option(
    dest: str, help: str, *, kind: str = "file", required: bool = False, default: Any = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--out`` option of a command: a file (``kind="file"``), a directory (``"dir"``) or
    either (``"any"``), as a Path."""
    path_type = click.Path(
        file_okay=kind in ("file", "any"), dir_okay=kind in ("dir", "any"), path_type=Path
    )
    # No `default` unless there is one: click takes an explicit default=None as a given default
    # and would then no longer report a required option as missing.
    extra = {"default": default, "show_default": True} if default is not None else {}
    return click.option("--out", dest, type=path_type, required=required, help=help, **extra)


def runs_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--out",
        "runs_root",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("runs"),
        show_default=True,
        help="Directory holding run directories.",
    )(func)


def runs_root_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--runs-root``: where run ids given as arguments are looked up."""
    return click.option(
        "--runs-root",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("runs"),
        show_default=True,
        help="Directory where run ids given as arguments are looked up.",
    )(func)


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
    warnings.showwarning = _one_line_warning


def _one_line_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
    """The library's warnings (a foreign CPU profile, ...) as one plain line on stderr."""
    err_console.print(_styled(f" {message}", "yellow", "warning:"), soft_wrap=True)


@cli.command()
@runs_option
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
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
    _print_checks(checks, as_json)


def _print_checks(checks: list[Any], as_json: bool) -> None:
    """doctor's and cluster check's table (or JSON); exit status 1 when one fails."""
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        table = Table("check", "status", "detail", "fix")
        for c in checks:
            table.add_row(
                c.name,
                "[green]pass[/]" if c.ok else "[red]FAIL[/]",
                Text(c.detail),
                Text("" if c.ok else c.fix),
            )
        Console().print(table)
    if not all(c.ok for c in checks):
        sys.exit(1)


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
            err_console.print(_styled(line)) if verbose else None
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
@click.option("--json", "as_json", is_flag=True, help="Print the workloads as JSON.")
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
@user_errors
def datagen(
    generator: str,
    out: Path,
    size: str,
    seed: int,
    workers: int | None,
    force: bool,
    scale: float | None,
    group_size: int | None,
    mean_kb: float | None,
    size_sigma: float | None,
) -> None:
    """Generate a synthetic dataset in a workload's real on-disk format.

    GENERATOR is unet3d, bert, dlrm or images (read by resnet18, resnet50 and alexnet).

    Example: ./cli.py datagen images --out data/img --size 2GB --group-size 32
    """
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from datagen.registry import generate

    size_bytes = parse_size(size)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err_console,
    ) as bar:
        task = bar.add_task(f"{generator} -> {out}", total=size_bytes)
        manifest = generate(
            generator,
            out,
            size_bytes,
            seed=seed,
            workers=workers,
            force=force,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
            scale=scale,
            group_size=group_size,
            mean_kb=mean_kb,
            size_sigma=size_sigma,
        )
    click.echo(f"{len(manifest['files'])} files, {format_size(manifest['total_bytes'])} in {out}")


def _parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    options = {}
    for item in values:
        if "=" not in item:
            raise UserError(f"--set {item!r}: use KEY=VALUE, e.g. --set patch_size=64")
        key, value = item.split("=", 1)
        options[key.strip()] = value.strip()
    return options


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--workload", default=None, help="Workload to run (see ./cli.py workloads).")
@click.option(
    "--variant",
    type=click.Choice(RUN_VARIANTS),
    default="original",
    show_default=True,
    help="original, instrumented or sleep: the workload's own image; dlio: the DLIO benchmark "
    "configured from the same settings and sleep profile, on its own copy of the dataset "
    "(DIR-dlio, made by DLIO's generator; docs/dlio.md).",
)
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Dataset directory (mounted read-only at /data).",
)
@click.option("--epochs", type=int, default=None)
@click.option("--batch-size", type=int, default=None)
@click.option("--workers", type=int, default=None, help="DataLoader worker processes.")
@click.option(
    "--accelerators", type=int, default=None, help="Accelerators (ranks), real or emulated."
)
@click.option("--max-steps", type=int, default=None, help="Steps per epoch (0: whole dataset).")
@click.option("--seed", type=int, default=None)
@click.option(
    "--synthetic",
    is_flag=True,
    help="Synthetic data: one batch loaded at start-up feeds every step (no reads, no decode).",
)
@click.option("--eval-every", type=int, default=None, help="Evaluate every N epochs (0: never).")
@click.option(
    "--checkpoint-every", type=int, default=None, help="Checkpoint every N epochs (0: never)."
)
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Sleep profile JSON (sleep variant).",
)
@click.option(
    "--accelerator",
    "emulated",
    metavar="NAME",
    default=None,
    help="Sleep variant: emulate this accelerator (a100, v100, p100, rtx6000, k80, m40, h100, "
    "cpu) with its profile from the profile database at the run's batch size (./cli.py "
    "profiles). Default: the workload's shipped profile.",
)
@click.option(
    "--profile-model",
    metavar="MODEL",
    default=None,
    help="With --accelerator on an image workload: the model whose profile to emulate (any "
    "image model of ./cli.py profiles; default: the workload's own).",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    help="Workload option KEY=VALUE, e.g. --set patch_size=64 (repeatable).",
)
@click.option(
    "--rank-containers",
    is_flag=True,
    help="With --accelerators G: one container per data-parallel rank, joined by "
    "torch.distributed (gloo) over the run's private network (--variant dlio: MPI, mpirun in "
    "rank 0's container).",
)
@click.option(
    "--image", default=None, help="Trace any image instead of a workload; the command follows `--`."
)
@click.option(
    "--compose",
    "compose_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Trace the services of a compose file (a topology of several containers).",
)
@click.option(
    "--service",
    "services",
    multiple=True,
    help="With --compose: a service to run (repeatable; default: all of them).",
)
@click.option(
    "--mount",
    "mounts",
    multiple=True,
    help="Extra bind mount SRC:DST[:ro|:rw], read-only unless :rw is given (repeatable).",
)
@click.option(
    "--memory-limit",
    default=None,
    help="Memory limit of each container (bounds its page cache too), e.g. 2GiB or 500MB. "
    + SIZE_HELP,
)
@click.option("--cpus", type=float, default=None, help="CPU limit of each container, e.g. 1.5.")
@click.option(
    "--gpus",
    default=None,
    help="GPUs for each container, as docker's --gpus: all, a count (2), ids (0,1) or device=1 "
    "(GPU 1); needs the "
    "NVIDIA container runtime on the host (./cli.py doctor --gpus checks it).",
)
@click.option(
    "--sample-interval",
    type=float,
    default=0.1,
    show_default=True,
    help="Sampler interval in seconds.",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Stop the run after this many seconds (status failed).",
)
@click.option(
    "--quiet",
    is_flag=True,
    help="Do not show the containers' output (it is kept in raw/<role>/container.log).",
)
@click.option(
    "--net-bandwidth",
    metavar="RATE",
    default=None,
    help="Cap what each container receives at RATE (tc's units: 430mbit, 1gbit), with tc on "
    "the host side of its network interface; for runs with a network (docs/sophon.md).",
)
@click.option(
    "--storage-host",
    metavar="HOST:PORT",
    default=None,
    help="Remote dataset (--set dataset=remote-...): train on the samples of a storage server "
    "started elsewhere (./cli.py storage-server) instead of a storage container of the run.",
)
@click.option(
    "--prep-workers",
    type=int,
    default=None,
    help="Remote dataset: preprocessing processes of the run's storage container (default 1).",
)
@click.option(
    "--storage-cpus",
    type=float,
    default=None,
    help="Remote dataset: CPU limit of the run's storage container (default: --cpus).",
)
@click.option(
    "--nodes",
    metavar="K|NODE,NODE,...",
    default=None,
    help="Run across K nodes of a swarm, or across the nodes named: the containers dealt "
    "round-robin over them, an agent tracing each (docs/cluster.md). The swarm: the virtual "
    "cluster (./cli.py cluster up), or the one --engine names.",
)
@click.option(
    "--cluster",
    "cluster_name",
    default="twintrace",
    show_default=True,
    help="With --nodes: the virtual cluster's name.",
)
@click.option(
    "--engine",
    "swarm_engine",
    metavar="URL",
    default=None,
    help="With --nodes: a real swarm, by its manager's engine (unix:///..., tcp://..., "
    "ssh://user@manager); ./cli.py cluster check --engine URL checks it first.",
)
@click.option(
    "--registry",
    metavar="HOST:PORT",
    default=None,
    help="With --engine: the registry the swarm's nodes pull the run's images from (pushed "
    "there through the manager); without it the nodes must have them.",
)
@runs_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@user_errors
def trace(
    workload: str | None,
    variant: str,
    data_dir: Path | None,
    epochs: int | None,
    batch_size: int | None,
    workers: int | None,
    accelerators: int | None,
    max_steps: int | None,
    seed: int | None,
    synthetic: bool,
    eval_every: int | None,
    checkpoint_every: int | None,
    profile_path: Path | None,
    emulated: str | None,
    profile_model: str | None,
    sets: tuple[str, ...],
    rank_containers: bool,
    image: str | None,
    compose_file: Path | None,
    services: tuple[str, ...],
    mounts: tuple[str, ...],
    memory_limit: str | None,
    cpus: float | None,
    gpus: str | None,
    sample_interval: float,
    timeout: float | None,
    quiet: bool,
    net_bandwidth: str | None,
    storage_host: str | None,
    prep_workers: int | None,
    storage_cpus: float | None,
    nodes: str | None,
    cluster_name: str,
    swarm_engine: str | None,
    registry: str | None,
    runs_root: Path,
    command: tuple[str, ...],
) -> None:
    """Run a workload, an image or a compose topology under eBPF tracing; print the run
    directory. The containers' output is shown as it is written (--quiet hides it).

    \b
    Examples:
      ./cli.py trace --workload unet3d --variant sleep --data data/unet3d --epochs 1
      ./cli.py trace --workload resnet50 --variant sleep --data data/img --accelerator a100 --batch-size 64
      ./cli.py trace --workload unet3d --variant original --data data/unet3d --accelerators 2 --rank-containers
      ./cli.py trace --image twintrace/base:latest --mount /srv/data:/data -- python3 -c "print(1)"
      ./cli.py trace --compose topology.yml --service client --service server
      ./cli.py trace --workload unet3d --variant sleep --data data/unet3d --accelerators 3 --rank-containers --nodes 3
      ./cli.py trace --workload unet3d --variant dlio --data /shared/unet3d --accelerators 4 --rank-containers --nodes 2 --engine ssh://root@manager --registry registry.lan:5000
      ./cli.py trace --workload resnet18 --variant sleep --data data/oi --set dataset=remote-sophon --net-bandwidth 430mbit --prep-workers 2
    """
    from tracing.container import BindMount
    from tracing.remote import StorageNode
    from tracing.request import Limits, RunOptions, image_request, workload_request
    from tracing.runner import trace as run_trace
    from tracing.shaper import parse_rate

    if sum(x is not None for x in (workload, image, compose_file)) != 1:
        raise UserError("give exactly one of --workload NAME, --image IMAGE or --compose FILE")
    if rank_containers and workload is None:
        raise UserError("--rank-containers is for --workload runs")
    if services and compose_file is None:
        raise UserError("--service is for --compose runs")
    if command and image is None:
        raise UserError("a command after `--` is only for --image runs")
    if (emulated or profile_model) and workload is None:
        raise UserError("--accelerator and --profile-model are for --workload runs")
    remote_options = storage_host or prep_workers is not None or storage_cpus is not None
    if remote_options and (workload is None or variant in PEER_VARIANTS):
        raise UserError("--storage-host, --prep-workers and --storage-cpus are for --workload runs")
    if storage_host and (prep_workers is not None or storage_cpus is not None):
        raise UserError(
            "--prep-workers and --storage-cpus size the run's storage container, which "
            "--storage-host replaces: give them to ./cli.py storage-server there"
        )
    storage = None
    if prep_workers is not None or storage_cpus is not None:
        storage = StorageNode(prep_workers or 1, storage_cpus)
    run = RunOptions(
        limits=Limits.parse(memory_limit, cpus),
        gpus=gpus,
        sample_interval=sample_interval,
        timeout_s=timeout,
        echo=not quiet,
        net_bandwidth_bits_s=parse_rate(net_bandwidth) if net_bandwidth is not None else None,
        cluster=cluster_name,
        engine=swarm_engine,
        registry=registry,
        **_parse_nodes(nodes),
    )
    extra_mounts = [BindMount.parse(m) for m in mounts]
    if variant in PEER_VARIANTS and workload is None:
        raise UserError(f"--variant {variant} is for --workload runs")
    if variant in PEER_VARIANTS and (extra_mounts or gpus):
        raise UserError(
            f"--variant {variant} runs on its own dataset and without GPUs: leave out --mount "
            "and --gpus"
        )
    if workload is not None:
        given = {
            "epochs": epochs,
            "batch_size": batch_size,
            "workers": workers,
            "accelerators": accelerators,
            "max_steps": max_steps,
            "seed": seed,
            "eval_every": eval_every,
            "checkpoint_every": checkpoint_every,
            "synthetic": synthetic or None,
        }
        from experiments.hostprofile import prepare_emulation

        prepare_emulation(
            workload,
            emulated,
            data_dir,
            settings=given,
            options=_parse_sets(sets),
            log=lambda msg: err_console.print(_styled(msg)),
        )
        if variant in PEER_VARIANTS:
            from experiments.dlio import dlio_request

            request = dlio_request(
                workload,
                data_dir,
                runs_root,
                settings={k: v for k, v in given.items() if v is not None},
                options=_parse_sets(sets),
                profile=profile_path,
                accelerator=emulated,
                profile_model=profile_model,
                run=run,
                rank_containers=rank_containers,
                log=lambda msg: err_console.print(_styled(msg)),
            )
        else:
            options = _parse_sets(sets)
            if storage_host is not None:
                if "storage_host" in options:
                    raise UserError(
                        "give the storage node once: --storage-host or --set storage_host"
                    )
                options["storage_host"] = storage_host
            request = workload_request(
                workload,
                variant,
                data_dir,
                runs_root,
                settings={k: v for k, v in given.items() if v is not None},
                options=options,
                profile=profile_path,
                accelerator=emulated,
                profile_model=profile_model,
                rank_containers=rank_containers,
                mounts=extra_mounts,
                run=run,
                storage=storage,
            )
    elif image is not None:
        request = image_request(
            image,
            list(command) or None,
            runs_root,
            mounts=extra_mounts,
            data_dir=data_dir,
            run=run,
        )
    else:
        from tracing.topology import topology_request

        if data_dir is not None or extra_mounts:
            raise UserError("--data and --mount are not for --compose runs: mount in the file")
        request = topology_request(
            compose_file,
            runs_root,
            services=services,
            warn=lambda msg: err_console.print(f"warning: {msg}"),
            run=run,
        )
    outcome = run_trace(request, progress=lambda msg: err_console.print(_styled(msg)))
    _print_summary(outcome.run_dir)
    outcome.check()
    if outcome.status != "completed":  # finished, but the trace is not whole
        err_console.print(_styled(f": {outcome.error}", "yellow", "warning"))
    click.echo(str(outcome.run_dir))


def _parse_nodes(text: str | None) -> dict[str, Any]:
    """``--nodes K`` or ``--nodes NODE,NODE,...`` as RunOptions' ``nodes`` and ``node_names``."""
    if text is None:
        return {}
    text = text.strip()
    if text.isdigit():
        return {"nodes": int(text)}
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise UserError(f"--nodes {text!r}: give a count (3) or node names (node-1,node-3)")
    return {"nodes": len(names), "node_names": names}


@cli.command("storage-server")
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Image dataset to serve (the folder layout of ./cli.py datagen images).",
)
@click.option("--port", type=int, default=50051, show_default=True, help="Port (0: any free one).")
@click.option(
    "--prep-workers",
    type=int,
    default=1,
    show_default=True,
    help="Preprocessing processes: the storage node's CPUs.",
)
@user_errors
def storage_server(data_dir: Path, port: int, prep_workers: int) -> None:
    """Serve an image dataset's samples over gRPC to remote training (trace --storage-host), with
    part of their preprocessing done here as each request asks (docs/sophon.md); stops cleanly
    on Ctrl-C or SIGTERM.

    Example: ./cli.py storage-server --data data/oi --port 50051 --prep-workers 4
    """
    from workloads.sophon.server import ServerConfig, serve

    serve(ServerConfig(data_dir, port, prep_workers), announce=lambda line: click.echo(line))


def _print_summary(run_dir: Path) -> None:
    from analysis.report import run_summary_lines

    for line in run_summary_lines(run_dir):
        err_console.print(line, highlight=False)


@cli.command("runs")
@runs_option
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON records.")
@user_errors
def list_runs(runs_root: Path, as_json: bool) -> None:
    """List runs with their status, duration and steps. A run whose manifest.json or
    summary.json is damaged is listed as `damaged`, one error line names the file, and the exit
    status is 1.

    Example: ./cli.py runs --out runs
    """
    from analysis.report import list_runs as collect

    rows = collect(runs_root)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        err_console.print(f"no runs under {runs_root}: start one with `./cli.py trace`")
    else:
        table = Table("run", "status", "image", "duration", "steps", "events")
        for r in rows:
            table.add_row(
                r["run_id"],
                r["status"],
                r.get("image") or "",
                _fmt_s(r.get("duration_s")),
                str(r.get("steps", "")),
                str(r.get("events", "")),
            )
        Console().print(table)
    damaged = [r["error"] for r in rows if r["status"] == "damaged"]
    for error in damaged[:-1]:
        click.echo(f"Error: {error}", err=True)
    if damaged:
        raise UserError(damaged[-1])


def _fmt_s(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s"


@cli.command()
@click.argument("run")
@runs_option
@click.option(
    "--json", "as_json", is_flag=True, help="Print summary.json (with the manifest's status)."
)
@user_errors
def show(run: str, runs_root: Path, as_json: bool) -> None:
    """Print a run's summary.

    Example: ./cli.py show runs/20261121-163005-unet3d-sleep-3f2a
    """
    from analysis.report import load_summary
    from core.rundir import resolve_run

    run_dir = resolve_run(run, runs_root)
    if as_json:
        click.echo(json.dumps(load_summary(run_dir), indent=2))
    else:
        _print_summary(run_dir)


@cli.group()
def plot() -> None:
    """Plots of runs (self-contained HTML).

    Example: ./cli.py plot timeline runs/RUN_A runs/RUN_B
    """


@plot.command("timeline")
@click.argument("runs", nargs=-1, required=True)
@out_option("out_path", "HTML file (default: timeline.html in the first run directory).")
@runs_root_option
@user_errors
def plot_timeline(runs: tuple[str, ...], out_path: Path | None, runs_root: Path) -> None:
    """Write a timeline of one or more runs, stacked on a common time axis; print its path.

    Example: ./cli.py plot timeline runs/RUN_A runs/RUN_B --out compare.html
    """
    from analysis.timeline import write_timeline
    from core.rundir import load_run, resolve_run

    loaded = [load_run(resolve_run(r, runs_root)) for r in runs]
    target = out_path or (loaded[0].path / "timeline.html")
    with err_console.status("rendering timeline"):
        write_timeline(loaded, target)
    click.echo(str(target))


@cli.command()
@click.argument("real")
@click.argument("emulated")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the JSON breakdown on stdout (overall score under `overall`).",
)
@out_option(
    "out_dir",
    "Directory for compare.html and comparison.json (default: the emulated run's directory).",
    kind="dir",
)
@runs_root_option
@user_errors
def compare(real: str, emulated: str, as_json: bool, out_dir: Path | None, runs_root: Path) -> None:
    """Score how closely an emulated run stresses the storage stack like a real one: per
    resource and aspect in [0, 1] and overall (docs/similarity.md); write an HTML report.

    Example: ./cli.py compare runs/RUN_ORIGINAL runs/RUN_SLEEP --json
    """
    from analysis.compare_report import write_comparison_report
    from analysis.similarity import compare_runs
    from core.rundir import load_run, resolve_run

    real_run = load_run(resolve_run(real, runs_root))
    emulated_run = load_run(resolve_run(emulated, runs_root))
    with err_console.status("comparing runs"):
        comparison = compare_runs(real_run, emulated_run)
    target = out_dir or emulated_run.path
    target.mkdir(parents=True, exist_ok=True)
    name = "compare.html" if out_dir else f"compare-{real_run.run_id}.html"
    report = write_comparison_report(real_run, emulated_run, comparison, target / name)
    data = comparison.to_dict()
    from core.rundir import write_json

    write_json(target / name.replace(".html", ".json").replace("compare", "comparison", 1), data)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        table = Table("aspect", "resource", "score", "measure")
        for a in comparison.aspects:
            score = f"skipped: {a.skipped}" if a.score is None else f"{a.score:.3f}"
            table.add_row(a.title, a.resource, score, a.measure)
        Console().print(table)
        click.echo(f"overall {comparison.overall:.3f}")
    for warning in comparison.warnings:
        err_console.print(_styled(f" {warning}", "yellow", "warning:"))
    err_console.print(f"report: {report}")


@plot.command("breakdown")
@click.argument("runs", nargs=-1, required=True)
@out_option("out_path", "HTML file (default: breakdown.html in the first run directory).")
@click.option("--json", "as_json", is_flag=True, help="Print the breakdown table as JSON records.")
@runs_root_option
@user_errors
def plot_breakdown(
    runs: tuple[str, ...], out_path: Path | None, as_json: bool, runs_root: Path
) -> None:
    """Per-step overall, data-loading and compute time (median, IQR band) vs batch size, one line
    per accelerator count; throughputs, loader latencies and accelerator utilisation (AU), first
    step of each epoch excluded (docs/analysis.md). Needs instrumented or sleep runs.

    Example: ./cli.py plot breakdown runs/RUN_B1 runs/RUN_B2 runs/RUN_B4
    """
    from analysis.breakdown import breakdown_table, write_breakdown
    from core.rundir import load_run, resolve_run

    loaded = [load_run(resolve_run(r, runs_root)) for r in runs]
    target = out_path or (loaded[0].path / "breakdown.html")
    with err_console.status("rendering breakdown"):
        write_breakdown(loaded, target)
    if as_json:
        click.echo(breakdown_table(loaded).to_json(orient="records", indent=2))
    else:
        click.echo(str(target))


@cli.command("export")
@click.argument("run")
@click.option(
    "--format", "fmt", type=click.Choice(["perfetto", "csv"]), default="perfetto", show_default=True
)
@out_option(
    "out_path",
    "perfetto: the JSON file (default RUN/trace.json); csv: a directory (default RUN/csv).",
    kind="any",
)
@runs_root_option
@user_errors
def export(run: str, fmt: str, out_path: Path | None, runs_root: Path) -> None:
    """Export a run as a Chrome/Perfetto trace (open it at ui.perfetto.dev) or as CSV files;
    print what was written.

    Example: ./cli.py export runs/RUN --format perfetto
    """
    from analysis.export import export_csv, export_perfetto
    from core.rundir import load_run, resolve_run

    loaded = load_run(resolve_run(run, runs_root))
    with err_console.status(f"exporting {fmt}"):
        if fmt == "perfetto":
            paths = [export_perfetto(loaded, out_path or loaded.path / "trace.json")]
        else:
            paths = export_csv(loaded, out_path or loaded.path / "csv")
    for path in paths:
        click.echo(str(path))


@cli.command("profiles")
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
    from workloads.profiledb import default_database

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


@cli.group()
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
    from core.rundir import load_run, resolve_run

    fitted, warnings = fit_runs([load_run(resolve_run(r, runs_root)) for r in runs], accelerator)
    _report_profile(fitted, warnings, out_path)


@profile.command("measure")
@click.option(
    "--workload", required=True, help="Workload whose compute to measure (see ./cli.py workloads)."
)
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="A dataset of the workload (one batch is read).",
)
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
    device: str,
    sets: tuple[str, ...],
    cv_target: float,
    max_seconds: float,
    workers: int,
    out_path: Path | None,
    into_db: bool,
    db_name: str | None,
    replace: bool,
) -> None:
    """Measure a workload's host-to-device copy, forward, backward and optimizer step per
    step natively (warm-up excluded) and write a profile; with --db, file it in the profile
    database too.

    Example: ./cli.py profile measure --workload resnet18 --data data/img --batch-sizes 2,4,8 --db
    """
    from experiments.measure import MeasureSettings, database_name, measure
    from workloads.hostprofiles import HOST_CPU, save_host_profile
    from workloads.profiledb import add_measured, check_fileable

    if out_path is None and not into_db:
        raise UserError("give --out FILE, --db, or both: where the measured profile goes")
    if (db_name or replace) and not into_db:
        raise UserError("--accelerator and --replace name the database entry: add --db")
    if into_db:
        check_fileable(_parse_sets(sets))

    try:
        sizes = tuple(int(v) for v in batch_sizes.split(","))
    except ValueError:
        raise UserError(
            f"--batch-sizes {batch_sizes!r}: give whole numbers separated by commas, e.g. 1,2,4"
        ) from None
    settings = MeasureSettings(
        batch_sizes=sizes,
        device=device,
        cv_target=cv_target,
        max_seconds=max_seconds,
        workers=workers,
    )
    command = "./cli.py profile measure " + " ".join(
        sys.argv[3:] if sys.argv[1:3] == ["profile", "measure"] else sys.argv[1:]
    )
    measured, warnings = measure(
        workload,
        data_dir,
        settings,
        _parse_sets(sets),
        progress=lambda line: err_console.print(line, highlight=False),
        command=command,
    )
    if into_db:
        name = db_name or database_name(measured)
        if name == HOST_CPU:
            filed = save_host_profile(measured, _parse_sets(sets))
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
        err_console.print(_styled(f" {warning}", "yellow", "warning:"))
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


def _fractions(text: str | None, what: str) -> list[float]:
    if not text:
        return []
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what}: give numbers separated by commas, got {text!r}") from None


@cli.command()
@click.option("--workload", required=True, help="Workload to measure (see ./cli.py workloads).")
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Dataset directory.",
)
@click.option(
    "--variant",
    type=click.Choice(["sleep", "instrumented"]),
    default="sleep",
    show_default=True,
    help="sleep: emulated accelerators; instrumented: the real model on this host.",
)
@click.option(
    "--accelerator",
    "emulated",
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
@click.option("--set", "sets", multiple=True, help="Workload option KEY=VALUE (repeatable).")
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
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@user_errors
def stalls(
    workload: str,
    data_dir: Path,
    variant: str,
    emulated: str | None,
    profile_model: str | None,
    accelerators: int,
    batch_size: int | None,
    workers: int | None,
    max_steps: int,
    sets: tuple[str, ...],
    cpus: float | None,
    read_rate: str | None,
    cache_fractions: str | None,
    cores: str | None,
    out_dir: Path | None,
    as_json: bool,
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

    settings = StallSettings(
        workload=workload,
        data=data_dir,
        variant=variant,
        accelerator=emulated,
        profile_model=profile_model,
        accelerators=accelerators,
        batch_size=batch_size,
        workers=workers,
        max_steps=max_steps,
        options=_parse_sets(sets),
        cpus=cpus,
        read_bps=parse_size(read_rate) if read_rate else None,
    )
    if out_dir is None:
        out_dir = (
            Path("runs/stalls") / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile_model or workload}"
        )
    if (out_dir / "stalls.json").exists():
        raise UserError(f"{out_dir} already holds a result: give another --out")
    result = measure_stalls(
        settings,
        out_dir,
        cache_fractions=_fractions(cache_fractions, "--cache-fractions"),
        cores=_fractions(cores, "--cores"),
        log=lambda line: err_console.print(_styled(line)),
    )
    for line in summary_lines(result):
        err_console.print(line, highlight=False)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        click.echo(str(out_dir / "stalls.json"))


@cli.command()
@click.option(
    "--workload", default="resnet18", show_default=True, help="resnet18, resnet50, alexnet."
)
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="An image dataset (./cli.py datagen images).",
)
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
    "--no-share-cores",
    is_flag=True,
    help="Concurrent jobs compute with a thread per core each (default: their share).",
)
@out_option("out_dir", "Output directory (default: runs/hfta/<time>-<workload>).", kind="dir")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
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
    """
    from experiments.hfta import RESULTS_NAME, load_results, parse_spec, run_hfta

    spec: dict[str, Any] = {
        "workload": workload,
        "variant": variant,
        "array_sizes": _numbers(array_sizes, "--array-sizes", int),
        "epochs": epochs,
        "batch_size": batch_size,
        "workers": workers,
        "seed": seed,
        "cold_cache": not warm_cache,
        "share_cores": not no_share_cores,
        "memory_limit": memory_limit,
        "cpus": cpus,
        "timeout_s": timeout,
        "options": _parse_sets(sets),
    }
    if learning_rates is not None:
        spec["learning_rates"] = _numbers(learning_rates, "--learning-rates", float)
    if profiles is not None:
        spec["profiles"] = profiles
    settings = parse_spec(spec, "hfta")
    if out_dir is None:
        out_dir = Path("runs/hfta") / f"{time.strftime('%Y%m%d-%H%M%S')}-{workload}"
    if (out_dir / RESULTS_NAME).exists():
        raise UserError(f"{out_dir} already holds a result: give another --out")
    path = run_hfta(
        settings, data_dir, out_dir, log=lambda line: err_console.print(line, highlight=False)
    )
    if as_json:
        click.echo(json.dumps(load_results(path), indent=2, sort_keys=True))
    else:
        click.echo(str(path))


def _numbers(text: str, what: str, kind: type) -> list[Any]:
    """Comma-separated numbers of ``kind``; a one-line UserError otherwise."""
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(
            f"{what}: give {'whole ' if kind is int else ''}numbers separated by commas, "
            f"got {text!r}"
        ) from None


@cli.group()
def cluster() -> None:
    """A cluster of Docker hosts in a swarm: a virtual one on this host for tests and demos
    (`up`, `status`, `push`, `down`), and `check` for a real one (docs/cluster.md).

    \b
    Examples:
      ./cli.py cluster up --nodes 3 --share data
      ./cli.py cluster status
      ./cli.py cluster down
    """


name_option = click.option(
    "--name",
    default="twintrace",
    show_default=True,
    help="The virtual cluster's name (its containers are NAME-node-1 ...).",
)


@cluster.command("up")
@click.option("--nodes", "count", type=int, required=True, help="How many nodes (1 to 16).")
@click.option(
    "--share",
    "shares",
    multiple=True,
    type=click.Path(path_type=Path),
    help="A host folder every node sees at the same path, as a shared file system "
    "(repeatable; default: ./runs and, where it exists, ./data).",
)
@name_option
@user_errors
def cluster_up(count: int, shares: tuple[Path, ...], name: str) -> None:
    """Make a virtual cluster of Docker-in-Docker nodes on this host: a swarm (node-1 its
    manager), a registry the nodes pull from, the shared folders on every node. Builds
    twintrace/node first where it is missing (about a minute).

    Example: ./cli.py cluster up --nodes 3 --share data
    """
    from images.build import build_node
    from tracing import cluster as vc
    from tracing.container import client

    cli_ = client()
    if not shares:
        Path("runs").mkdir(exist_ok=True)
        shares = tuple(p for p in (Path("runs"), Path("data")) if p.is_dir())
    with err_console.status("building twintrace/node"):
        build_node(cli_, err_console.print)
    with err_console.status(f"starting {count} node(s)"):
        made = vc.up(cli_, count, shares, name, log=err_console.print)
    for node in made:
        role = "manager" if node.manager else "worker"
        click.echo(f"{node.hostname}\t{node.address}\t{role}\t{node.engine}")


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@name_option
@user_errors
def cluster_status(as_json: bool, name: str) -> None:
    """List the virtual cluster's nodes (container, swarm state, engine), the agents and the
    cluster images each holds, and the registry's images. Exit status 1 when it is not up.

    Example: ./cli.py cluster status --json
    """
    from tracing import cluster as vc
    from tracing.container import client

    found = vc.status(client(), name)
    if as_json:
        click.echo(json.dumps(found, indent=2))
    else:
        table = Table(
            "node", "container", "state", "address", "swarm", "engine", "agents", "images"
        )
        for row in found["nodes"]:
            swarm = row["swarm"] or {}
            table.add_row(
                row["node"],
                row["container"],
                row["state"],
                row["address"] or "",
                " ".join(str(swarm.get(k)) for k in ("role", "state", "availability") if swarm)
                or "not in the swarm",
                row["engine"] or "",
                str(len(row["agents"])),
                Text("\n".join(row["images"])),
            )
        Console(width=max(140, Console().width)).print(table)
        reg = found["registry"]
        click.echo(
            f"registry {reg['address']}: {reg['state'] or 'absent'}; "
            f"{len(reg['images'])} image(s){': ' if reg['images'] else ''}{', '.join(reg['images'])}"
        )
        click.echo(f"shared folders: {', '.join(found['shares']) or 'none'}")
    if not found["up"]:
        raise UserError(
            f"cluster {name!r} is not up"
            + (": `./cli.py cluster down`, then `cluster up`" if found["nodes"] else "")
        )


@cluster.command("push")
@click.argument("images", nargs=-1, required=True)
@name_option
@user_errors
def cluster_push(images: tuple[str, ...], name: str) -> None:
    """Put local images in the virtual cluster's registry, once; print the names the nodes
    pull them by.

    Example: ./cli.py cluster push twintrace/unet3d:sleep twintrace/tracer:latest
    """
    from tracing import cluster as vc
    from tracing.container import client

    for ref in vc.push(client(), images, name, log=err_console.print):
        click.echo(ref)


@cluster.command("down")
@name_option
@user_errors
def cluster_down(name: str) -> None:
    """Remove every node, network, volume, registry, cgroup and swarm state of the virtual
    cluster (also what a crashed `up` left).

    Example: ./cli.py cluster down
    """
    from tracing import cluster as vc
    from tracing.container import client

    removed = vc.down(client(), name)
    click.echo(f"removed {len(removed)} object(s)" if removed else f"no cluster {name!r} was up")


@cluster.command("check")
@click.option(
    "--engine",
    default=None,
    help="The swarm manager's engine (default: $DOCKER_HOST, else the virtual cluster's "
    "manager where one is up, else this host's engine).",
)
@click.option(
    "--image",
    default=None,
    help="Also run a probe on every node from this image, the tracer as the nodes pull it "
    "(kernel BTF, tracefs, bpftrace; on the virtual cluster registry:5000/twintrace/tracer:latest).",
)
@click.option(
    "--share",
    "shares",
    multiple=True,
    help="With --image: a path every node must have (the shared data; repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@name_option
@user_errors
def cluster_check(
    engine: str | None, image: str | None, shares: tuple[str, ...], as_json: bool, name: str
) -> None:
    """Check a swarm for twintrace, node by node, with the fix for each failure.

    Example: ./cli.py cluster check --engine ssh://root@manager
    """
    import docker

    from tracing import cluster as vc
    from tracing.container import client

    url = engine or os.environ.get("DOCKER_HOST")
    if url is None:
        try:
            url = vc.manager(client(), name).engine
        except UserError:
            url = None
    manager_engine = docker.DockerClient(base_url=url, timeout=30) if url else docker.from_env()
    if not as_json:
        err_console.print(f"checking the swarm through {url or 'this host'}")
    _print_checks(vc.check(manager_engine, image, shares, log=err_console.print), as_json)


@cli.group()
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
            _fmt_s(o.duration_s),
            Text(o.error or o.run_dir or ""),
        )
    Console(width=max(140, Console().width)).print(table)
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        raise UserError(
            f"{len(failed)} of {len(outcomes)} runs failed (see the table); run the experiment again to retry them"
        )


if __name__ == "__main__":
    cli()
