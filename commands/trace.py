"""``trace``: a run under eBPF tracing, from its settings (:mod:`experiments.request`); and
``storage-server``, the storage node of a remote dataset started by hand.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.live import Live

from commands.common import (
    data_option,
    err_console,
    print_summary,
    runs_option,
    runs_root_option,
    set_option,
    styled,
    swarm_options,
    user_errors,
)
from core.units import SIZE_HELP
from workloads.config import RUN_VARIANTS

if TYPE_CHECKING:
    from tracing.progress import TrainingStatus


@click.command(context_settings={"allow_interspersed_args": False})
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
@data_option("Dataset directory (mounted read-only at /data).", required=False, dest="data")
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
@click.option(
    "--cold-epochs",
    is_flag=True,
    help="Evict the dataset from the page cache between epochs, every rank waiting meanwhile: "
    "every epoch reads it from the storage, not from memory.",
)
@click.option("--eval-every", type=int, default=None, help="Evaluate every N epochs (0: never).")
@click.option(
    "--checkpoint-every", type=int, default=None, help="Checkpoint every N epochs (0: never)."
)
@click.option(
    "--profile",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Sleep profile JSON (sleep variant).",
)
@click.option(
    "--accelerator",
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
@set_option("Workload option KEY=VALUE, e.g. --set patch_size=64 (repeatable).")
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
    "--pids-limit",
    type=click.IntRange(min=1),
    default=None,
    help="The most processes and threads of each container at once (docker's --pids-limit); "
    "past it fork and clone fail (EAGAIN), and a failed run says so.",
)
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
@swarm_options
@runs_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@user_errors
def trace(runs_root: Path, **settings: Any) -> None:
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
    from experiments.request import TraceSettings, build_request
    from tracing.runner import trace as run_trace

    def log(msg: str) -> None:
        err_console.print(styled(msg))

    request = build_request(TraceSettings(**settings), runs_root, log)
    with training_line(err_console) as show:
        outcome = run_trace(request, progress=log, training=show)
    print_summary(outcome.run_dir)
    outcome.check()
    if outcome.status != "completed":  # finished, but the trace is not whole
        err_console.print(styled(f": {outcome.error}", "yellow", "warning"))
    click.echo(str(outcome.run_dir))


@contextlib.contextmanager
def training_line(
    console: Console,
) -> Iterator[Callable[[TrainingStatus | None], None] | None]:
    """On a terminal, a report for :func:`tracing.runner.trace`'s ``training``: its status as
    one line at the bottom, redrawn in place, the run's other output (its messages, the
    containers' lines) above it, gone once the containers have ended (None). Elsewhere (a log
    file, a pipe) None: no progress lines, and no file is watched."""
    if not console.is_terminal:
        yield None
        return
    line = _TrainingLine(console)
    try:
        yield line.show
    finally:
        line.close()


class _TrainingLine:
    """The line of :func:`training_line`: a rich ``Live`` started at the first status (a run
    that shows none, DLIO's, is left as it was) and stopped at None; called from the watch's
    thread, closed from the command's."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self.closed = False
        self.lock = threading.Lock()

    def show(self, status: TrainingStatus | None) -> None:
        with self.lock:
            if status is None or self.closed:
                self._stop()
                return
            if self.live is None:
                # redirect_stderr: what is written to sys.stderr meanwhile (the containers'
                # output) goes above the line instead of through it; stdout is left alone.
                self.live = Live(
                    console=self.console,
                    auto_refresh=False,
                    transient=True,
                    redirect_stderr=True,
                    redirect_stdout=False,
                )
                self.live.start()
            self.live.update(styled(status.line()), refresh=True)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self._stop()

    def _stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


@click.command("storage-server")
@data_option("Image dataset to serve (the folder layout of ./cli.py datagen images).")
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


@click.command()
@click.argument("run")
@runs_root_option
@user_errors
def ingest(run: str, runs_root: Path) -> None:
    """Process a run's raw trace (raw/) again into its tables and summary: a run whose
    processing failed, or whose process was killed while it ran (`runs` lists it as
    `incomplete`). Prints the summary, then the run directory.

    Example: ./cli.py ingest runs/20261121-163005-unet3d-sleep-3f2a
    """
    from store.rundir import resolve_run
    from tracing.runner import reingest

    def log(msg: str) -> None:
        err_console.print(styled(msg))

    outcome = reingest(resolve_run(run, runs_root), progress=log)
    print_summary(outcome.run_dir)
    outcome.check()
    if outcome.status != "completed":
        err_console.print(styled(f": {outcome.error}", "yellow", "warning"))
    click.echo(str(outcome.run_dir))
