"""The training loop every workload shares, in one process or one process per rank.

A workload plugs in a :class:`Task`: how to build its model and optimizer, its data loaders,
how a batch goes to the device, the forward pass, the loss and the evaluation metrics (a
:class:`SplitTask` gives one loader over its training or its evaluation items). This module does
the rest, identically for every workload, so that runs of different workloads have the same
shape and the same events:

- ``config.batch_size`` is the batch per accelerator; ``config.accelerators`` = G ranks. G == 1
  runs in the calling process; G > 1 starts G rank processes (torch.multiprocessing, forkserver),
  each with its own loaders (``config.workers`` DataLoader workers) over its 1/G share of the
  data. ``original``/``instrumented`` synchronise gradients with DistributedDataParallel (gloo
  on CPU, nccl on CUDA); ``sleep`` ranks meet in a gloo all-reduce at the end of every step.
  With ``config.rank`` set (one container per rank) the process runs that rank only.
- Epochs are numbered from 1, steps within an epoch from 0; ``max_steps`` > 0 ends an epoch
  after that many steps. With ``eval_every`` > 0 and evaluation data, the task's eval loader
  runs after every ``eval_every``-th epoch. Every ``checkpoint_every``-th epoch rank 0 writes
  ``out_dir/checkpoints/ckpt_epoch<E>.pt`` (temporary name, then rename).
- Events (``workloads/events.py``): every variant logs ``init``, ``run``, ``epoch``, ``eval``
  and ``checkpoint`` intervals and one ``step_end`` per step and rank. ``instrumented`` adds the
  per-step durations ``load_batch_mem``, ``load_batch_gpu``, ``model_forward_pass``,
  ``loss_tensor_calc``, ``model_backward_pass``, ``model_optim_step``, ``cum_loss_fn_calc``,
  ``all_compute`` and whatever the task's datasets log from the loader workers
  (``sample_load``/``sample_preproc`` or ``batch_load``/``batch_preproc``); ``sleep`` logs the
  same data-side events plus those of :class:`~workloads.emulation.SleepCompute`
  (``load_batch_gpu``, the forward, backward and optimizer phases when its profile splits the
  compute, ``accelerator_busy``, ``sync_wait`` and ``all_reduce`` with several ranks).
- A ``step_end``'s value is the samples the step trained (:meth:`Task.trained_samples`: the
  batch's samples, times the models of a fused array).
- Emulated jobs in several containers can share one emulated accelerator
  (``TWINTRACE_SHARED_ACCELERATOR``; ``workloads/emulation.py``); the wait for it is
  ``accelerator_wait``.

The sleep variant's emulated accelerator is in ``workloads/emulation.py``, the loaders' helpers
(:class:`~workloads.loaders.Loader`, :func:`~workloads.loaders.sharded_loader`) in
``workloads/loaders.py``.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader

from core.errors import UserError
from workloads.config import (
    DEFAULT_MASTER_PORT,
    EPOCH_BARRIER_DIR,
    EPOCH_BARRIER_WAIT_S,
    MASTER_ADDR_ENV,
    MASTER_PORT_ENV,
    PEERS_ENV,
    WorkloadConfig,
    epoch_ended_name,
    epoch_go_name,
)
from workloads.emulation import SleepCompute
from workloads.events import ACCELERATOR_KEY, EVAL_ACCURACY_KEY, Emitter
from workloads.hostrecord import available_cpus
from workloads.loaders import Loader, batches_of, synthetic_batches
from workloads.profile import SleepProfile, default_profile, load_profile

#: A step's phases as (event key, start ns, end ns), logged as duration events after the step.
Marks = list[tuple[str, int, int]]


class Task(abc.ABC):
    """One workload's part of a run. Instances are pickled to rank processes: keep them small
    (paths and settings, no open files or tensors)."""

    @abc.abstractmethod
    def build_model(self, seed: int) -> nn.Module:
        """The configured network, initialised from ``seed`` (identical on every rank)."""

    #: The workload's own options; every workload's carry ``optimizer`` and ``learning_rate``.
    options: Any

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The optimizer over ``params`` (the possibly DDP-wrapped model's parameters): the
        options' ``optimizer`` at their ``learning_rate``."""
        return make_optimizer(params, self.options.optimizer, self.options.learning_rate)

    @abc.abstractmethod
    def train_loader(
        self, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader:
        """This rank's training loader (shuffled per epoch with ``config.seed``)."""

    def eval_loader(
        self, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader | None:
        """This rank's evaluation loader, or None when the task has no evaluation data."""
        return None

    @abc.abstractmethod
    def to_device(self, batch: Any, device: torch.device) -> Any:
        """Move a batch from the loader to ``device`` (the host-to-device copy)."""

    @abc.abstractmethod
    def forward(self, net: nn.Module, batch: Any) -> Any:
        """The model's outputs for a device batch."""

    @abc.abstractmethod
    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        """The training loss (a scalar tensor)."""

    @abc.abstractmethod
    def eval_metrics(self, outputs: Any, batch: Any) -> dict[str, float]:
        """Metrics of one evaluation batch, as means over its samples."""

    @abc.abstractmethod
    def batch_samples(self, batch: Any) -> int:
        """Samples in a loader batch (the profile's batch size)."""

    def trained_samples(self, batch: Any) -> int:
        """Samples a step on ``batch`` trains (the ``step_end`` value): the batch's samples,
        or for a fused array of B models B times as many."""
        return self.batch_samples(batch)

    def prepare(self, config: WorkloadConfig, out_dir: Path, emitter: Emitter) -> Task:
        """One-time set-up in the run's first process, before any rank starts: may log events
        and write files to ``out_dir``; returns the task to train (by default itself)."""
        return self


class SplitTask(Task):
    """A task whose training and evaluation data are two sets of items (cases, shards, image
    files or groups) that one :meth:`loader` serves; with no evaluation items there is no
    evaluation loader."""

    @abc.abstractmethod
    def items(self, train: bool) -> Sequence[Any]:
        """The training items (``train``) or the evaluation ones (possibly none)."""

    @abc.abstractmethod
    def loader(
        self, train: bool, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader:
        """This rank's loader over :meth:`items` ``(train)``: shuffled when ``train``."""

    def train_loader(
        self, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader:
        return self.loader(True, config, rank, device, emitter)

    def eval_loader(
        self, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader | None:
        if not self.items(False):
            return None
        return self.loader(False, config, rank, device, emitter)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a rank needs, resolved once in the parent (picklable for spawned ranks)."""

    config: WorkloadConfig
    task: Task
    out_dir: Path
    profile: SleepProfile | None
    master_port: int = 0
    master_addr: str = "127.0.0.1"
    #: The rank containers' names, by rank (empty: the ranks are processes of one container).
    peers: tuple[str, ...] = ()


def sleep_profile(config: WorkloadConfig) -> SleepProfile | None:
    """The sleep variant's profile (the config's file or the workload's default), else None."""
    if config.variant != "sleep":
        return None
    profile = load_profile(config.profile) if config.profile else default_profile(config.workload)
    if profile.workload != config.workload:
        raise UserError(
            f"sleep profile {config.profile} is for workload {profile.workload!r}, not "
            f"{config.workload!r}: give a {config.workload} profile"
        )
    return profile


def run(config: WorkloadConfig, task: Task, out_dir: Path, emitter: Emitter) -> None:
    """Train ``task`` as ``config`` says, logging events through ``emitter`` (module doc)."""
    task = task.prepare(config, Path(out_dir), emitter)
    plan = Plan(config, task, Path(out_dir), sleep_profile(config))
    if config.rank is not None:  # one rank of several, each in its own container
        plan = dataclasses.replace(
            plan,
            master_addr=os.environ.get(MASTER_ADDR_ENV, "127.0.0.1"),
            master_port=int(os.environ.get(MASTER_PORT_ENV, DEFAULT_MASTER_PORT)),
            peers=tuple(filter(None, os.environ.get(PEERS_ENV, "").split(","))),
        )
        _rank_main(config.rank, plan, emitter)
        return
    if config.accelerators == 1:
        _rank_main(0, plan, emitter)
        return
    plan = dataclasses.replace(plan, master_port=_free_port())
    # Not fork: forking a process whose torch thread pools (or CUDA) are initialised can
    # deadlock. A fork server imports torch and the task's module once, before any thread pool
    # or CUDA context exists, and forks every rank from there.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, type(task).__module__, "torch._dynamo"])
    errors = ctx.SimpleQueue()
    try:
        mp.start_processes(
            _rank_entry,
            args=(plan, emitter, errors),
            nprocs=config.accelerators,
            join=True,
            start_method="forkserver",
        )
    except Exception:
        if not errors.empty():
            raise UserError(errors.get()) from None
        raise


def _rank_entry(rank: int, plan: Plan, emitter: Emitter, errors: Any) -> None:
    """Spawned rank: run, and pass a UserError's message to the parent before failing."""
    em = emitter.for_rank(rank)
    emitter.close()  # this process's unpickled copy; the rank writes through its own
    try:
        _rank_main(rank, plan, em)
    except UserError as exc:
        errors.put(str(exc))
        raise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resolve_device(config: WorkloadConfig, rank: int) -> torch.device:
    """``auto``: CUDA when available, else CPU; one GPU per rank.

    All ranks in one process tree (``config.rank`` None) need ``accelerators`` visible GPUs and
    rank r computes on ``cuda:r``. A rank in a container of its own (``config.rank`` set)
    computes on its own GPU: ``cuda:0`` when the container sees exactly one (the GPU it was
    given, whatever its index on the host), ``cuda:r`` when it sees them all (``--gpus all``).
    """
    if config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    available = torch.cuda.device_count()
    if available == 0 and torch.version.cuda is None:
        raise UserError(
            f"device {config.device}: this image's torch {torch.__version__} is the CPU build: "
            "rebuild the images with `./cli.py build --torch cuda`"
        )
    if config.rank is not None and available == 1:
        return torch.device("cuda", 0)
    if config.rank is not None and 1 < available < config.accelerators:
        raise UserError(
            f"rank {rank} of {config.accelerators} sees {available} GPUs: give each rank "
            "container one GPU of its own, or every GPU (--gpus all)"
        )
    if available < config.accelerators:
        raise UserError(
            f"device {config.device} with {config.accelerators} accelerator(s) needs as many "
            f"GPUs, {available} visible: start the container with --gpus or set device to cpu"
        )
    return torch.device("cuda", rank)


def _rank_main(rank: int, plan: Plan, emitter: Emitter) -> None:
    config = plan.config
    em = emitter if emitter.rank == rank else emitter.for_rank(rank)
    em.start("init")
    world = config.accelerators
    # Ranks share the CPUs (all of them when each rank has a container of its own, since
    # containers see every host core) unless the config says; DataLoader workers set
    # themselves to one thread each.
    torch.set_num_threads(config.threads or max(1, available_cpus() // world))
    device = resolve_device(config, rank)
    # Emulated ranks join a process group too: every step ends with a collective, as DDP's
    # gradient all-reduce, so the fastest rank waits for the slowest.
    distributed = world > 1
    if distributed:
        os.environ["MASTER_ADDR"] = plan.master_addr
        os.environ["MASTER_PORT"] = str(plan.master_port)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        wait_for_peers([p for r, p in enumerate(plan.peers) if r != rank], f"rank {rank}")
        dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        compute = _make_compute(plan, rank, device, distributed, em.instrumenting)
        em.point(ACCELERATOR_KEY, accelerator_label(compute, device))
        loop = _Loop(plan, rank, device, compute, em)
        em.stop("init")
        em.start("run")
        loop.run()
        em.stop("run")
    finally:
        if distributed:
            dist.destroy_process_group()


#: How long a rank container waits for the other ranks' containers to be reachable (s).
PEER_WAIT_S = 120.0
#: The port a rank knocks on to learn that a peer is reachable: nothing listens there, so a
#: peer the network routes to refuses at once, and one it cannot route to yet does not.
_KNOCK_PORT = 9


def wait_for_peers(peers: Sequence[str], who: str, timeout_s: float = PEER_WAIT_S) -> None:
    """Return once every one of ``peers`` (host names) is reachable: a TCP connection to it is
    refused (or accepted). Containers on different nodes of a swarm's overlay network can be
    out of each other's reach for a while after they start, until every node has learnt where
    the others are (the swarm spreads that by gossip, slower on a busy host); gloo tries a
    peer it cannot route to a few times only and fails the run (docs/cluster.md). A UserError
    naming the peers still out of reach once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    told = False
    waiting: dict[str, str] = dict.fromkeys(peers, "")
    while True:
        for peer in list(waiting):
            try:
                with socket.create_connection((peer, _KNOCK_PORT), timeout=1.0):
                    pass
            except ConnectionRefusedError:
                pass
            except OSError as exc:  # not resolved yet, no route yet, no answer
                waiting[peer] = exc.strerror or str(exc)
                continue
            del waiting[peer]
        if not waiting:
            return
        now = time.monotonic()
        if now > deadline:
            raise UserError(
                f"{who} could not reach "
                + ", ".join(f"{p} ({why})" for p, why in waiting.items())
                + f" within {timeout_s:g} s: the containers' network between the hosts "
                "does not carry their traffic (docs/cluster.md, step 2)"
            )
        if not told and now > deadline - timeout_s + 2.0:
            told = True
            print(f"{who}: waiting to reach {', '.join(waiting)}", file=sys.stderr, flush=True)
        time.sleep(0.2)


def accelerator_label(compute: ModelCompute | SleepCompute, device: torch.device) -> str:
    """``cpu`` or ``cuda:N`` where the model computes for real, ``emulated: CARD`` in the
    sleep variant: a comparison then knows whether a real run's accelerator was the host's
    CPU (whose compute the emulation replaces; analysis.similarity's ``cpu`` aspect)."""
    if isinstance(compute, SleepCompute):
        return f"emulated: {compute.profile.accelerator}"
    return str(device)


def _make_compute(
    plan: Plan, rank: int, device: torch.device, distributed: bool, instrumenting: bool
) -> ModelCompute | SleepCompute:
    config = plan.config
    if plan.profile is None:
        return ModelCompute(plan.task, config.seed, device, distributed, sync=instrumenting)
    # The sleep variant builds the model only to write checkpoints of the real size.
    needs_model = (
        rank == 0 and config.checkpoint_every > 0 and plan.profile.checkpoint_bytes is None
    )
    model = plan.task.build_model(config.seed) if needs_model else None
    return SleepCompute(
        plan.task, plan.profile, config.accelerators, config.seed, rank, model, distributed
    )


class ModelCompute:
    """Host-to-device copy, forward, loss, backward and optimizer step of the real model.

    With ``distributed`` the model is wrapped in DistributedDataParallel (process group already
    initialised by the caller). ``sync`` waits for the device after each phase so the marks
    measure GPU work (instrumented variant on CUDA only; a no-op on CPU).
    """

    def __init__(
        self, task: Task, seed: int, device: torch.device, distributed: bool, sync: bool
    ) -> None:
        self.task = task
        self.device = device
        self.distributed = distributed
        self.sync = sync and device.type == "cuda"
        self.model = task.build_model(seed).to(device)
        self.net: nn.Module = self.model
        if distributed:
            ids = [device.index] if device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.optimizer = task.make_optimizer(self.net.parameters())
        self.cum_loss = 0.0
        self._eval: list[tuple[dict[str, float], int]] = []

    def _now(self) -> int:
        if self.sync:
            torch.cuda.synchronize(self.device)
        return time.monotonic_ns()

    def feed(self, loader: DataLoader[Any]) -> Iterator[Any]:
        """The loader's batches as they come (a CUDA loader pins them itself)."""
        return batches_of(loader)

    def stage_once(self, batch: Any) -> None:
        """Nothing: the real loader pinned the synthetic batch when it made it."""

    def train_step(self, batch: Any, marks: Marks) -> None:
        """One optimisation step on a loader batch."""
        self.net.train()
        t0 = time.monotonic_ns()
        batch = self.task.to_device(batch, self.device)
        t1 = self._now()
        outputs = self.task.forward(self.net, batch)
        t2 = self._now()
        loss = self.task.loss(outputs, batch)
        t3 = self._now()
        loss.backward()
        t4 = self._now()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t5 = self._now()
        # The references average the loss over ranks for their logs; .item() also waits for
        # the device, so the step really ends here.
        value = loss.detach()
        if self.distributed:
            dist.all_reduce(value)
            value /= dist.get_world_size()
        self.cum_loss += float(value.item())
        t6 = time.monotonic_ns()
        marks += [
            ("load_batch_gpu", t0, t1),
            ("model_forward_pass", t1, t2),
            ("loss_tensor_calc", t2, t3),
            ("model_backward_pass", t3, t4),
            ("model_optim_step", t4, t5),
            ("cum_loss_fn_calc", t5, t6),
        ]

    @torch.no_grad()
    def eval_batch(self, batch: Any) -> None:
        """Metrics of one evaluation batch (this rank's share; no gradient)."""
        self.model.eval()
        samples = self.task.batch_samples(batch)
        batch = self.task.to_device(batch, self.device)
        outputs = self.task.forward(self.model, batch)
        self._eval.append((self.task.eval_metrics(outputs, batch), samples))

    def eval_result(self) -> dict[str, Any] | None:
        """Sample-weighted means of the metrics since the last call (None when nothing ran)."""
        done, self._eval = self._eval, []
        samples = sum(n for _, n in done)
        if not samples:
            return None
        names = done[0][0].keys()
        result: dict[str, Any] = {}
        for name in names:  # a number, or one per model of an array
            total = sum(np.asarray(metrics[name], dtype=np.float64) * n for metrics, n in done)
            mean = total / samples
            result[name] = mean.tolist() if mean.ndim else float(mean)
        result["samples"] = samples
        return result

    def save_checkpoint(self, path: Path) -> int:
        """``torch.save`` of the model's state_dict; returns the bytes written."""
        torch.save(self.model.state_dict(), path)
        return path.stat().st_size


class _Loop:
    """Epochs of one rank: training steps, evaluation and checkpoints."""

    def __init__(
        self,
        plan: Plan,
        rank: int,
        device: torch.device,
        compute: ModelCompute | SleepCompute,
        em: Emitter,
    ) -> None:
        self.plan = plan
        self.config = plan.config
        self.task = plan.task
        self.rank = rank
        self.compute = compute
        self.em = em
        self.train = plan.task.train_loader(plan.config, rank, device, em)
        # Synthetic data: one batch of the real loader, taken now (during init) and given to
        # every step of every epoch, as many steps as the real loader would make.
        self.synthetic: tuple[Any, int] | None = None
        if plan.config.synthetic:
            self.synthetic = synthetic_batches(self.train.loader, plan.config)
            self.compute.stage_once(self.synthetic[0])
        self.eval = None
        if plan.config.eval_every > 0:
            self.eval = plan.task.eval_loader(plan.config, rank, device, em)

    def run(self) -> None:
        config = self.config
        for epoch in range(1, config.epochs + 1):
            started = time.monotonic()
            self.em.start("epoch", epoch=epoch)
            steps, samples = self._train_epoch(epoch)
            self.em.stop("epoch", epoch=epoch, value={"steps": steps, "samples": samples})
            if self.rank == 0:
                print(
                    f"epoch {epoch}: {steps} steps, {samples} samples on rank 0 in "
                    f"{time.monotonic() - started:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
            if self.eval is not None and epoch % config.eval_every == 0:
                self._evaluate(epoch)
            if self.rank == 0 and config.checkpoint_every and epoch % config.checkpoint_every == 0:
                self._checkpoint(epoch)
            if config.epoch_barrier and epoch < config.epochs:
                self._barrier(epoch)

    def _barrier(self, epoch: int) -> None:
        """Say this rank ended ``epoch`` and wait until the coordinator lets the next one start
        (:data:`workloads.config.EPOCH_BARRIER_DIR`)."""
        folder = self.plan.out_dir / EPOCH_BARRIER_DIR
        folder.mkdir(parents=True, exist_ok=True)
        (folder / epoch_ended_name(epoch, self.rank)).touch()
        go = folder / epoch_go_name(epoch)
        deadline = time.monotonic() + EPOCH_BARRIER_WAIT_S
        while not go.exists():
            if time.monotonic() > deadline:
                raise UserError(
                    f"rank {self.rank} waited {EPOCH_BARRIER_WAIT_S:.0f} s after epoch {epoch} "
                    "for the coordinator to drop the page cache; it never said go"
                )
            time.sleep(0.01)

    def _train_epoch(self, epoch: int) -> tuple[int, int]:
        self.train.set_epoch(epoch)
        if self.synthetic is not None:
            batch, count = self.synthetic
            batches: Iterator[Any] = _repeat(batch, count)
        else:
            batches = self.compute.feed(self.train.loader)
        steps = samples = 0
        try:
            while not self.config.max_steps or steps < self.config.max_steps:
                t0 = time.monotonic_ns()
                batch = next(batches, None)
                if batch is None:
                    break
                t1 = time.monotonic_ns()
                marks: Marks = [("load_batch_mem", t0, t1)]
                size = self.task.trained_samples(batch)
                self.compute.train_step(batch, marks)
                marks.append(("all_compute", t1, time.monotonic_ns()))
                for key, start, end in marks:
                    self.em.duration(key, start, end, epoch=epoch, step=steps)
                self.em.step_end(epoch=epoch, step=steps, samples=size)
                steps += 1
                samples += size
        finally:
            # Shuts the workers (and a staging thread) down now when max_steps ended the
            # epoch early, or a step failed.
            getattr(batches, "close", lambda: None)()
        return steps, samples

    def _evaluate(self, epoch: int) -> None:
        assert self.eval is not None
        self.eval.set_epoch(epoch)
        self.em.start("eval", epoch=epoch)
        for batch in batches_of(self.eval.loader):
            self.compute.eval_batch(batch)
        result = self.compute.eval_result()
        self.em.stop("eval", epoch=epoch, value=result)
        if result is not None and "top1" in result:
            # MLPerf's key for the quality metric, once per evaluation and rank: top-1 as the
            # value, the rest of the evaluation in the metadata.
            extra = {k: v for k, v in result.items() if k != "top1"}
            self.em.point(EVAL_ACCURACY_KEY, result["top1"], epoch=epoch, **extra)

    def _checkpoint(self, epoch: int) -> None:
        directory = self.plan.out_dir / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"ckpt_epoch{epoch}.pt"
        # torch.save names the zip records after the file's stem, so the temporary name keeps
        # the stem: the bytes are exactly those of torch.save(state, path).
        tmp = path.with_suffix(".tmp")
        self.em.start("checkpoint", epoch=epoch)
        try:
            size = self.compute.save_checkpoint(tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.em.stop("checkpoint", epoch=epoch, value=size, path=str(path))


def _repeat(batch: Any, count: int) -> Iterator[Any]:
    for _ in range(count):
        yield batch


def make_optimizer(params: Any, name: str, learning_rate: float) -> torch.optim.Optimizer:
    """``sgd`` (momentum 0.9), ``adam`` or ``adagrad`` over ``params``."""
    if name == "adam":
        return torch.optim.Adam(params, lr=learning_rate)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=learning_rate)
    if name == "sgd":
        return torch.optim.SGD(params, lr=learning_rate, momentum=0.9)
    raise UserError(f"optimizer must be sgd, adam or adagrad, got {name!r}")
