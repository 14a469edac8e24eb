"""The training loop every workload shares, in one process or one process per rank.

A workload plugs in a :class:`Task`: how to build its model and optimizer, its data loaders,
how a batch goes to the device, the forward pass, the loss and the evaluation metrics. This
module does the rest, identically for every workload, so that runs of different workloads have
the same shape and the same events:

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
  same data-side events plus those of :class:`SleepCompute` (``load_batch_gpu``, the forward,
  backward and optimizer phases when its profile splits the compute, ``accelerator_busy``,
  ``sync_wait`` and ``all_reduce`` with several ranks).
- A ``step_end``'s value is the samples the step trained (:meth:`Task.trained_samples`: the
  batch's samples, times the models of a fused array).
- Emulated jobs in several containers can share one emulated accelerator: with
  ``TWINTRACE_SHARED_ACCELERATOR`` (:data:`SHARED_ACCELERATOR_ENV`) naming a lock file that
  they all see, a step's emulated compute holds the file's lock, so the jobs' computations run
  one at a time as B processes time-slice one GPU; the wait for it is ``accelerator_wait``.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import dataclasses
import fcntl
import mmap
import os
import queue
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader

from core.errors import UserError
from workloads.config import DEFAULT_MASTER_PORT, MASTER_ADDR_ENV, MASTER_PORT_ENV, WorkloadConfig
from workloads.events import ACCELERATOR_KEY, Emitter
from workloads.profile import SleepProfile, Stratified, default_profile, load_profile

Marks = list[tuple[str, int, int]]

#: The lock file of an emulated accelerator shared by the jobs of several containers (module
#: doc): a path every one of them sees.
SHARED_ACCELERATOR_ENV = "TWINTRACE_SHARED_ACCELERATOR"


@dataclasses.dataclass
class Loader:
    """A DataLoader and what to call before each pass (seeds the shuffling of that epoch)."""

    loader: DataLoader[Any]
    set_epoch: Callable[[int], None]


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


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a rank needs, resolved once in the parent (picklable for spawned ranks)."""

    config: WorkloadConfig
    task: Task
    out_dir: Path
    profile: SleepProfile | None
    master_port: int = 0
    master_addr: str = "127.0.0.1"


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


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota (v2
    ``cpu.max``, or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` on a host whose cpu
    controller is still on cgroup v1).

    Inside a container started with ``--cpus`` the affinity mask still lists every host core;
    only the quota tells how much CPU time there is.
    """
    cpus = len(os.sched_getaffinity(0))
    quota = _cpu_quota(cgroup_root)
    if quota is not None:
        cpus = min(cpus, max(1, int(quota)))
    return cpus


def _cpu_quota(root: Path) -> float | None:
    """The CPU quota of the cgroup mounted at ``root`` in cores, None when there is none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for controller in ("cpu", "cpu,cpuacct"):
        try:
            quota_us = int((root / controller / "cpu.cfs_quota_us").read_text())
            period_us = int((root / controller / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    return None


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
        result: dict[str, Any] = {
            name: sum(metrics[name] * n for metrics, n in done) / samples for name in names
        }
        result["samples"] = samples
        return result

    def save_checkpoint(self, path: Path) -> int:
        """``torch.save`` of the model's state_dict; returns the bytes written."""
        torch.save(self.model.state_dict(), path)
        return path.stat().st_size


class SleepCompute:
    """Emulated computation driven by a :class:`SleepProfile`; the model never runs.

    Per training step, in the order and under the names of a real (instrumented) step:

    - the batches reach the step through :meth:`feed`: a thread copies each into page-locked
      host memory (:class:`StagedBatches`) as it arrives from the loader, as a GPU job's
      DataLoader pins them in its pin-memory thread, off the step's path;
    - ``load_batch_gpu``: the step waits the profile's host-to-device time;
    - before the first step, ``framework_warmup``: one step of the real model on the meta
      device (no memory, no compute), so that the emulated run loads the framework code, and
      reads the library files, that a real job loads in its first step; ``model_transfer``:
      the profile's model copy time; and the card's memory is checked: a peak above its
      capacity fails like a real out-of-memory;
    - ``model_forward_pass``, ``model_backward_pass``, ``model_optim_step``: the compute time,
      split as the profile says (one ``accelerator_busy`` interval spans them all);
    - with several ranks, ``sync_wait``: a real all-reduce through torch.distributed (gloo), so
      every rank waits for the slowest, as DDP's gradient all-reduce makes it; then
      ``all_reduce``: the modelled time of the gradient all-reduce itself
      (:class:`workloads.profile.Collective`);
    - on an accelerator shared with other containers' jobs (:data:`SHARED_ACCELERATOR_ENV`),
      ``accelerator_wait`` before the compute: until the others' computations let go of it.

    ``model`` is only kept to write realistic checkpoints (``torch.save`` of its untrained
    state_dict) when the profile does not set ``checkpoint_bytes``.
    """

    def __init__(
        self,
        task: Task,
        profile: SleepProfile,
        accelerators: int,
        seed: int,
        rank: int,
        model: nn.Module | None,
        distributed: bool = False,
    ) -> None:
        self.task = task
        self.profile = profile
        self.accelerators = accelerators
        self.rng = emulation_rng(seed, rank)
        self.model = model
        self.distributed = distributed
        self.staging = PinnedStaging()  # resized by feed() to the loader's batches in flight
        self._shared = shared_accelerator()
        self._meta = self._meta_model()
        self._eval_batches = 0
        self._first = True
        self.gradient_bytes = 0
        if distributed:
            given = profile.collective.gradient_bytes
            if given is None:  # 4 bytes per parameter, counted on the meta model made above
                given = 4 * (
                    sum(p.numel() for p in self._meta[0].parameters())
                    if self._meta is not None
                    else parameter_count(task)
                )
            self.gradient_bytes = given

    def _batch(self, batch: Any) -> int:
        return self.profile.profile_batch(self.task.batch_samples(batch), self.accelerators)

    def _meta_model(self) -> tuple[nn.Module, torch.optim.Optimizer] | None:
        """The real model and optimizer on the meta device (shapes only: no memory), made
        where a real run makes its own (at start-up), so that the emulated run imports what
        the real one imports then (the optimizer's modules, for instance)."""
        try:
            with torch.device("meta"):
                model = self.task.build_model(0)
            return model, self.task.make_optimizer(model.parameters())
        except Exception as exc:  # any model: the emulation goes on without it
            self._meta_failed(exc)
            return None

    @staticmethod
    def _meta_failed(exc: BaseException) -> None:
        print(
            f"twintrace: the emulated model cannot run on the meta device ({exc!r}); the "
            "emulated run will not load the framework code a real step loads",
            file=sys.stderr,
            flush=True,
        )

    def _framework_step(self, batch: Any, marks: Marks) -> None:
        """One training step of the real model on the meta device (no compute), before the
        first step: the framework code a real first step runs, and the library files it
        reads, are loaded by the emulated run too (``framework_warmup``)."""
        if self._meta is None:
            return
        t0 = time.monotonic_ns()
        model, optimizer = self._meta
        try:
            on_meta = self.task.to_device(batch, torch.device("meta"))
            self.task.loss(self.task.forward(model, on_meta), on_meta).backward()
            optimizer.step()
        except Exception as exc:  # any model: the emulation goes on without this step
            self._meta_failed(exc)
        self._meta = None
        marks.append(("framework_warmup", t0, time.monotonic_ns()))

    def _first_step(self, b: int, marks: Marks) -> None:
        """Model transfer and the memory check, once, before the first step."""
        memory = self.profile.memory
        if memory is not None:
            need = memory.peak(self.accelerators, b)
            if need > memory.capacity_bytes:
                raise UserError(
                    f"out of memory on the emulated {self.profile.accelerator}: a training step "
                    f"of batch {b} needs {need / 2**30:.2f} GiB, the card has "
                    f"{memory.capacity_bytes / 2**30:.2f} GiB "
                    f"({memory.persistent_bytes / 2**30:.2f} GiB kept between steps): use a "
                    "smaller batch size or a card with more memory"
                )
        if self.profile.model_transfer_s > 0:
            t0 = time.monotonic_ns()
            time.sleep(self.profile.model_transfer_s)
            marks.append(("model_transfer", t0, time.monotonic_ns()))

    def feed(self, loader: DataLoader[Any]) -> Iterator[Any]:
        """``loader``'s batches, each staged in page-locked memory before the step takes it,
        where a GPU job's DataLoader pins it: with workers, by a thread that runs as far ahead
        as the loader's batches in flight (``prefetch_factor`` x workers;
        :class:`StagedBatches`); without, in the step's own thread as it takes the batch."""
        workers = loader.num_workers
        ahead = (loader.prefetch_factor or 2) * workers if workers else 0
        if self.staging.slots != ahead + 1:
            self.staging.close()
            self.staging = PinnedStaging(slots=ahead + 1)  # the step's batch, those ahead
        if not ahead:
            return _staged_inline(batches_of(loader), self.staging)
        return StagedBatches(batches_of(loader), self.staging, depth=ahead)

    def stage_once(self, batch: Any) -> None:
        """Stage the one batch of a synthetic run (pinned once, as the real loader pins it)."""
        self.staging.stage(batch)

    def train_step(self, batch: Any, marks: Marks) -> None:
        """Wait the host-to-device time, then the compute time (the batch is staged)."""
        b = self._batch(batch)
        first, self._first = self._first, False
        if first:
            self._framework_step(batch, marks)
            self._first_step(b, marks)
        t0 = time.monotonic_ns()
        h2d, compute = draw_step(self.profile, self.rng, self.accelerators, b, first)
        _sleep_until(t0 + int(h2d * 1e9))
        t1 = time.monotonic_ns()
        marks.append(("load_batch_gpu", t0, t1))
        with self._shared.hold(marks):
            t2 = self._compute(compute, marks)
        if self.distributed:
            # A real collective: the ranks meet here, and the fastest waits for the slowest;
            # then the modelled time of the gradient all-reduce itself.
            dist.all_reduce(torch.zeros(1))
            t3 = time.monotonic_ns()
            marks.append(("sync_wait", t2, t3))
            seconds = self.profile.collective.seconds(self.accelerators, self.gradient_bytes)
            _sleep_until(t3 + int(seconds * 1e9))
            marks.append(("all_reduce", t3, time.monotonic_ns()))

    def _compute(self, compute: float, marks: Marks) -> int:
        """Sleep the emulated compute of one step from now, split as the profile says; returns
        when it ended (ns)."""
        t1 = time.monotonic_ns()
        split = self.profile.split
        parts: list[tuple[str, float]] = []
        if split is not None:
            parts = [("model_forward_pass", split.forward), ("model_backward_pass", split.backward)]
            if split.optimizer > 0:
                parts.append(("model_optim_step", split.optimizer))
        end = t1 + int(compute * 1e9)
        start = t1
        for key, share in parts:
            stop = min(end, start + int(compute * share * 1e9))
            _sleep_until(stop)
            marks.append((key, start, stop))
            start = stop
        _sleep_until(end)
        t2 = time.monotonic_ns()
        marks.append(("accelerator_busy", t1, t2))
        return t2

    def eval_batch(self, batch: Any) -> None:
        """Sleep for the profile's evaluation time of one batch (0 unless it has one)."""
        seconds = self.profile.sample_eval(self.rng.eval, self.accelerators, self._batch(batch))
        if seconds > 0:
            with self._shared.hold([]):
                time.sleep(seconds)
        self._eval_batches += 1

    def eval_result(self) -> dict[str, Any] | None:
        done, self._eval_batches = self._eval_batches, 0
        return {"batches": done} if done else None

    def save_checkpoint(self, path: Path) -> int:
        """Write the model's state_dict, or ``checkpoint_bytes`` random bytes; returns bytes."""
        size = self.profile.checkpoint_bytes
        if size is None:
            assert self.model is not None, "SleepCompute needs a model to save its state_dict"
            torch.save(self.model.state_dict(), path)
            return path.stat().st_size
        # Fresh random chunks: constant data could be compressed or deduplicated by the
        # filesystem and would not cost the I/O a real checkpoint does.
        rng = np.random.default_rng()
        chunk = 8 << 20
        with path.open("wb") as f:
            for offset in range(0, size, chunk):
                f.write(rng.bytes(min(chunk, size - offset)))
        return size


@dataclasses.dataclass
class EmulationDraws:
    """A rank's emulated times (:class:`SleepCompute`): one stratified stream each for the
    host-to-device copies, the training steps' compute and the evaluation batches, so each
    kind of time covers its distribution evenly over a run (:class:`Stratified`)."""

    h2d: Stratified
    compute: Stratified
    eval: Stratified


def emulation_rng(seed: int, rank: int) -> EmulationDraws:
    """The draws of a rank's emulated times, reproducible from (seed, rank)."""
    h2d, compute, evaluation = np.random.default_rng([seed, rank]).spawn(3)
    return EmulationDraws(Stratified(h2d), Stratified(compute), Stratified(evaluation))


def draw_step(
    profile: SleepProfile, rng: EmulationDraws, accelerators: int, b: int, first: bool
) -> tuple[float, float]:
    """(host-to-device, compute) seconds of one emulated training step, in the order the
    emulator draws them; the run's ``first`` step adds the profile's one-off warm-up
    (``first_step_s``) to its compute. Replaying the draws with :func:`emulation_rng` and each
    step's ``b`` gives the times a run requested (``experiments/fidelity.py`` measures the
    emulator's precision against them)."""
    h2d = profile.sample_h2d(rng.h2d, accelerators, b)
    compute = profile.sample(rng.compute, accelerators, b)
    return h2d, compute + (profile.first_step_s if first else 0.0)


def parameter_count(task: Task) -> int:
    """Parameters of the task's model, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = task.build_model(0)
    return sum(p.numel() for p in model.parameters())


def _sleep_until(deadline_ns: int) -> None:
    """Sleep until CLOCK_MONOTONIC reaches ``deadline_ns`` (no-op when it has passed): the
    emulated phases end when the profile says, whatever the work done before took."""
    remaining = deadline_ns - time.monotonic_ns()
    if remaining > 0:
        time.sleep(remaining / 1e9)


class SharedAccelerator:
    """The emulated accelerator's lock when jobs of several containers share it
    (:data:`SHARED_ACCELERATOR_ENV` names a lock file all of them see; ``flock`` on it), or
    nothing to wait for when the variable is unset."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        if path:
            try:
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise UserError(
                    f"the shared accelerator's lock file {path} ({SHARED_ACCELERATOR_ENV}) "
                    f"cannot be opened: {exc.strerror}; mount a writable directory there"
                ) from None

    @contextlib.contextmanager
    def hold(self, marks: Marks) -> Iterator[None]:
        """Hold the accelerator for the block; the wait for it is marked ``accelerator_wait``."""
        if self._fd is None:
            yield
            return
        t0 = time.monotonic_ns()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        marks.append(("accelerator_wait", t0, time.monotonic_ns()))
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)


def shared_accelerator() -> SharedAccelerator:
    """The shared accelerator this process's environment names (module doc), if any."""
    return SharedAccelerator(os.environ.get(SHARED_ACCELERATOR_ENV) or None)


class PinnedStaging:
    """Page-locked host memory holding a batch, as pinned-memory staging buffers hold it
    before a real host-to-device copy (torch cannot pin without an accelerator backend).

    The buffer holds ``slots`` batches, grows to ``slots`` times the largest batch seen and
    stays locked (``mlock``), so the host's memory pressure is real; each :meth:`stage` copies
    the batch's tensors into the next slot (a loader's pinned batches are several: the one
    the step copies to the device and the next one). Where
    RLIMIT_MEMLOCK is lower than a batch (docker's default is 8 MiB, and a daemon without
    CAP_SYS_RESOURCE cannot grant more), as much as the limit allows is locked and the rest is
    resident but unlocked: one warning on stderr says so, and how to raise the limit, and
    :attr:`locked` / :attr:`size` record it.
    """

    def __init__(self, warn: Callable[[str], None] | None = None, slots: int = 1) -> None:
        self.buffer: mmap.mmap | None = None
        self.size = 0  # bytes of the buffer
        self.locked = 0  # bytes of it locked in memory
        self.slots = slots
        self._next = 0  # the slot the next batch goes to
        self.warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._warned = False

    @staticmethod
    def tensors(batch: Any) -> list[torch.Tensor]:
        """The tensors of a batch (nested tuples, lists and dicts)."""
        if isinstance(batch, torch.Tensor):
            return [batch]
        if isinstance(batch, dict):
            batch = list(batch.values())
        if isinstance(batch, list | tuple):
            return [t for item in batch for t in PinnedStaging.tensors(item)]
        return []

    def stage(self, batch: Any) -> int:
        """Copy the batch into the staging buffer; returns its bytes."""
        tensors = [t.detach().contiguous() for t in self.tensors(batch)]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if nbytes == 0:
            return 0
        if nbytes * self.slots > self.size:
            self._grow(nbytes * self.slots)
        assert self.buffer is not None
        slot = self.size // self.slots
        # torch's copy, as a real pin_memory's (parallel for large tensors), where numpy's
        # copies on one thread at a fraction of the speed.
        view = torch.frombuffer(self.buffer, dtype=torch.uint8)
        offset, self._next = self._next * slot, (self._next + 1) % self.slots
        for t in tensors:
            data = t.reshape(-1).view(torch.uint8)
            view[offset : offset + data.numel()].copy_(data)
            offset += data.numel()
        del view  # the mmap cannot be closed while a view of it exists
        return nbytes

    def _grow(self, nbytes: int) -> None:
        self.close()
        buffer = mmap.mmap(-1, nbytes)
        anchor = ctypes.c_char.from_buffer(buffer)
        address = ctypes.addressof(anchor)
        del anchor  # an exported pointer would keep the mmap from being closed
        libc = ctypes.CDLL(None, use_errno=True)
        locked = nbytes
        if libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(nbytes)) != 0:
            err = ctypes.get_errno()
            soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            if soft != hard:
                resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
            page = mmap.PAGESIZE
            locked = max(0, min(nbytes, hard - locked_bytes()) // page * page)
            if locked and libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(locked)) != 0:
                locked = 0
            if not self._warned:
                self._warned = True
                self.warn(
                    f"twintrace: locked {locked} of the {nbytes} bytes of the emulated "
                    f"host-to-device staging buffer ({os.strerror(err)}; RLIMIT_MEMLOCK is "
                    f"{hard} bytes); the rest is resident but not locked. To lock it all, "
                    "raise the limit: `docker run --ulimit memlock=-1` (./cli.py trace asks for "
                    "it; the Docker daemon must itself run with `ulimit -l unlimited`)"
                )
        self.buffer, self.size, self.locked = buffer, nbytes, locked

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()  # unmapping unlocks the pages
            self.buffer, self.size, self.locked = None, 0, 0


def locked_bytes() -> int:
    """Bytes this process has locked in memory now (VmLck)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmLck:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _staged_inline(batches: Iterator[Any], staging: PinnedStaging) -> Iterator[Any]:
    """``batches``, each staged as it is taken: a loader without workers pins in the thread
    that iterates it, on the step's path."""
    try:
        for batch in batches:
            staging.stage(batch)
            yield batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


class StagedBatches:
    """A GPU job's pin-memory thread, emulated: a thread takes the loader's batches as they
    come, copies each into page-locked memory (``staging``) and hands it on through a queue
    of ``depth``; the step takes staged batches only, so the copy is off its path, as a real
    DataLoader with ``pin_memory`` pins the next batch while the accelerator computes.

    A loader's error reaches the consumer at the batch where it happened. :meth:`close` stops
    the thread (after the batch it is waiting for, if any) and closes the source.
    """

    def __init__(self, source: Iterator[Any], staging: PinnedStaging, depth: int = 1) -> None:
        self._source = source
        self._staging = staging
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="twintrace-pin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for batch in self._source:
                self._staging.stage(batch)
                if not self._put(("batch", batch)):
                    return
            self._put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(("error", exc))

    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> StagedBatches:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "batch":
            return value
        self._done = True
        self._thread.join()
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the thread and close the source (its workers are shut down now)."""
        self._done = True
        self._stop.set()
        self._thread.join()
        close = getattr(self._source, "close", None)
        if close is not None:
            close()


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
        self.em.stop("eval", epoch=epoch, value=self.compute.eval_result())

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


def synthetic_batches(loader: DataLoader[Any], config: WorkloadConfig) -> tuple[Any, int]:
    """(the loader's first batch, steps per epoch) for ``config.synthetic``: the batch is read
    and prepared once, by the loader itself, and its workers shut down."""
    try:
        count = len(loader)
    except TypeError:  # an iterable dataset of unknown length
        count = 0
    if config.max_steps:
        count = min(count, config.max_steps) if count else config.max_steps
    if not count:
        raise UserError(
            f"synthetic data: the {config.workload} loader does not know its length; give "
            "--max-steps to say how many steps an epoch has"
        )
    batches = batches_of(loader)
    try:
        batch = next(batches, None)
    finally:
        batches.close()
    if batch is None:
        raise UserError("synthetic data: the dataset gave no batch to repeat")
    return batch, count


def _repeat(batch: Any, count: int) -> Iterator[Any]:
    for _ in range(count):
        yield batch


def batches_of(loader: DataLoader[Any]) -> Iterator[Any]:
    """Iterate ``loader``, turning a worker's UserError back into a one-line UserError.

    The DataLoader re-raises a worker's exception with the worker's whole traceback as its
    message; the original message is the text after ``UserError: `` on the last line.
    """
    iterator = iter(loader)
    try:
        while True:
            message = None
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except UserError as exc:
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                marker = f"{UserError.__module__}.{UserError.__name__}: "
                original = next(
                    (ln.split(marker, 1)[1] for ln in reversed(lines) if marker in ln), None
                )
                message = original or str(exc)
            if message is not None:
                # Raised outside the except block, so the new error does not keep the worker's
                # exception (and through its traceback the loader iterator) alive: the workers
                # are shut down now instead of timing out later when the iterator is collected.
                shutdown = getattr(iterator, "_shutdown_workers", None)
                if shutdown is not None:
                    shutdown()
                raise UserError(message)
            yield batch
    finally:
        del iterator


def sharded_loader(
    dataset: Any,
    config: WorkloadConfig,
    rank: int,
    device: torch.device,
    *,
    batch_size: int | None,
    shuffle: bool,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> Loader:
    """A DataLoader over this rank's share of a map-style ``dataset``.

    The share follows DistributedSampler semantics (shuffled with ``config.seed`` per epoch,
    padded to equal shares); ``batch_size`` None means each dataset item is already a batch.
    ``dataset.set_epoch`` (when it has one) is called with the sampler's.
    """
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(
        dataset, num_replicas=config.accelerators, rank=rank, shuffle=shuffle, seed=config.seed
    )
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=config.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=False,
        drop_last=False,
        collate_fn=collate_fn,
    )

    def set_epoch(epoch: int) -> None:
        sampler.set_epoch(epoch)
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)

    return Loader(loader, set_epoch)


def make_optimizer(params: Any, name: str, learning_rate: float) -> torch.optim.Optimizer:
    """``sgd`` (momentum 0.9), ``adam`` or ``adagrad`` over ``params``."""
    if name == "adam":
        return torch.optim.Adam(params, lr=learning_rate)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=learning_rate)
    if name == "sgd":
        return torch.optim.SGD(params, lr=learning_rate, momentum=0.9)
    raise UserError(f"optimizer must be sgd, adam or adagrad, got {name!r}")
