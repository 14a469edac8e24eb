"""The UNet3D training loop of the three variants, in one process or one process per rank.

``run(config, data_dir, out_dir, emitter)``:

- ``config.batch_size`` is the batch per accelerator (as in the reference's per-GPU batch);
  ``config.accelerators`` = G ranks. G == 1 runs in the calling process; G > 1 starts G rank
  processes (torch.multiprocessing, forkserver start method), each with its own DataLoader (``config.workers`` workers) over a 1/G shard
  (DistributedSampler semantics: shuffled with ``config.seed`` per epoch, padded to equal
  shards). ``original``/``instrumented`` synchronise gradients with DistributedDataParallel
  (gloo on CPU, nccl on CUDA); ``sleep`` ranks run independently, without a process group.
- Epochs are numbered from 1, steps within an epoch from 0. ``max_steps`` > 0 stops an epoch
  after that many steps. With ``eval_every`` > 0, ``eval_fraction`` of the cases are held out
  (chosen with ``config.seed``) and evaluated after every ``eval_every``-th epoch.
  Every ``checkpoint_every``-th epoch rank 0 writes ``out_dir/checkpoints/ckpt_epoch<E>.pt``
  (temporary name, then rename).
- Events (see ``workloads/events.py``): every variant logs ``init``, ``run``, ``epoch``,
  ``eval`` and ``checkpoint`` intervals and one ``step_end`` per step and rank.
  ``instrumented`` adds per-step durations ``load_batch_mem``, ``load_batch_gpu``,
  ``model_forward_pass``, ``loss_tensor_calc``, ``model_backward_pass``, ``model_optim_step``,
  ``cum_loss_fn_calc``, ``all_compute`` and per-sample ``sample_load``/``sample_preproc`` from
  the workers; ``sleep`` logs the same data-side events plus ``accelerator_busy``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from workloads.config import WorkloadConfig
from workloads.errors import UserError
from workloads.events import Emitter
from workloads.profile import SleepProfile, default_profile, load_profile
from workloads.unet3d.compute import (
    Marks,
    ModelCompute,
    SleepCompute,
    available_cpus,
    build_model,
)
from workloads.unet3d.dataset import Case, UNet3DDataset, list_cases
from workloads.unet3d.options import UNet3DOptions

WORKLOAD = "unet3d"


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a rank needs, resolved once in the parent (picklable for spawned ranks)."""

    config: WorkloadConfig
    options: UNet3DOptions
    train_cases: tuple[Case, ...]
    eval_cases: tuple[Case, ...]
    out_dir: Path
    profile: SleepProfile | None
    master_port: int = 0


def make_plan(config: WorkloadConfig, data_dir: Path, out_dir: Path) -> Plan:
    """Validate the settings, list the data, split train/eval cases and load the profile."""
    options = UNet3DOptions.from_dict(config.options)
    cases = list_cases(data_dir)
    eval_cases: list[Case] = []
    if config.eval_every > 0:
        if len(cases) < 2:
            raise UserError(
                f"evaluation needs at least 2 cases in {data_dir}, found {len(cases)}: "
                "generate more or set eval_every to 0"
            )
        count = min(len(cases) - 1, max(1, round(len(cases) * options.eval_fraction)))
        chosen = set(np.random.default_rng(config.seed).permutation(len(cases))[:count].tolist())
        eval_cases = [c for i, c in enumerate(cases) if i in chosen]
        cases = [c for i, c in enumerate(cases) if i not in chosen]
    profile = None
    if config.variant == "sleep":
        profile = load_profile(config.profile) if config.profile else default_profile(WORKLOAD)
        if profile.workload != WORKLOAD:
            raise UserError(
                f"sleep profile {config.profile} is for workload {profile.workload!r}, not "
                f"{WORKLOAD!r}: give a {WORKLOAD} profile"
            )
    return Plan(config, options, tuple(cases), tuple(eval_cases), out_dir, profile)


def run(config: WorkloadConfig, data_dir: Path, out_dir: Path, emitter: Emitter) -> None:
    """Train UNet3D as ``config`` says, logging events through ``emitter`` (see module doc)."""
    plan = make_plan(config, Path(data_dir), Path(out_dir))
    if config.accelerators == 1:
        _rank_main(0, plan, emitter)
        return
    plan = dataclasses.replace(plan, master_port=_free_port())
    # Not fork: forking a process whose torch thread pools (or CUDA) are initialised can
    # deadlock. A fork server imports torch and this module once, before any thread pool or
    # CUDA context exists, and forks every rank from there: G ranks cost one torch import.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "torch._dynamo"])  # torch.optim imports dynamo
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
    """``auto``: CUDA when available, else CPU; one GPU per rank."""
    if config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    available = torch.cuda.device_count()
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
    # Ranks share the CPUs; DataLoader workers set themselves to one thread each.
    torch.set_num_threads(max(1, available_cpus() // world))
    device = resolve_device(config, rank)
    distributed = world > 1 and plan.profile is None
    if distributed:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(plan.master_port)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        compute = _make_compute(plan, rank, device, distributed, em.instrumenting)
        loop = _Loop(plan, rank, device, compute, em)
        em.stop("init")
        em.start("run")
        loop.run()
        em.stop("run")
    finally:
        if distributed:
            dist.destroy_process_group()


def _make_compute(
    plan: Plan, rank: int, device: torch.device, distributed: bool, instrumenting: bool
) -> ModelCompute | SleepCompute:
    config = plan.config
    if plan.profile is None:
        return ModelCompute(plan.options, config.seed, device, distributed, sync=instrumenting)
    # The sleep variant builds the model only to write checkpoints of the real size.
    needs_model = (
        rank == 0 and config.checkpoint_every > 0 and plan.profile.checkpoint_bytes is None
    )
    model = build_model(plan.options, config.seed) if needs_model else None
    return SleepCompute(plan.profile, config.accelerators, config.seed, rank, model)


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
        self.rank = rank
        self.compute = compute
        self.em = em
        self.train_set, self.train_loader = self._loader(plan.train_cases, True, device)
        self.eval_loader = None
        if plan.eval_cases:
            self.eval_set, self.eval_loader = self._loader(plan.eval_cases, False, device)

    def _loader(
        self, cases: tuple[Case, ...], train: bool, device: torch.device
    ) -> tuple[UNet3DDataset, DataLoader[Any]]:
        config = self.config
        dataset = UNet3DDataset(
            cases, self.plan.options.patch_size, seed=config.seed, augment=train, emitter=self.em
        )
        sampler = DistributedSampler(
            dataset,
            num_replicas=config.accelerators,
            rank=self.rank,
            shuffle=train,
            seed=config.seed,
        )
        loader = DataLoader(
            dataset,
            batch_size=config.batch_size,
            sampler=sampler,
            num_workers=config.workers,
            pin_memory=device.type == "cuda",
            persistent_workers=False,
            drop_last=False,
        )
        return dataset, loader

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
            if self.eval_loader is not None and epoch % config.eval_every == 0:
                self._evaluate(epoch)
            if self.rank == 0 and config.checkpoint_every and epoch % config.checkpoint_every == 0:
                self._checkpoint(epoch)

    def _train_epoch(self, epoch: int) -> tuple[int, int]:
        self.train_set.set_epoch(epoch)
        self.train_loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        batches = _batches(self.train_loader)
        steps = samples = 0
        while not self.config.max_steps or steps < self.config.max_steps:
            t0 = time.monotonic_ns()
            batch = next(batches, None)
            if batch is None:
                break
            t1 = time.monotonic_ns()
            marks: Marks = [("load_batch_mem", t0, t1)]
            self.compute.train_step(batch[0], batch[1], marks)
            marks.append(("all_compute", t1, time.monotonic_ns()))
            for key, start, end in marks:
                self.em.duration(key, start, end, epoch=epoch, step=steps)
            size = int(batch[0].shape[0])
            self.em.step_end(epoch=epoch, step=steps, samples=size)
            steps += 1
            samples += size
        batches.close()  # shuts the workers down now when max_steps ended the epoch early
        return steps, samples

    def _evaluate(self, epoch: int) -> None:
        assert self.eval_loader is not None
        self.eval_set.set_epoch(epoch)
        self.em.start("eval", epoch=epoch)
        for x, y in _batches(self.eval_loader):
            self.compute.eval_batch(x, y)
        self.em.stop("eval", epoch=epoch, value=self.compute.eval_result())

    def _checkpoint(self, epoch: int) -> None:
        directory = self.plan.out_dir / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"ckpt_epoch{epoch}.pt"
        # torch.save names the zip records after the file's stem, so the temporary name keeps
        # the stem: the bytes are exactly those of torch.save(state, path).
        tmp = path.with_suffix(".tmp")
        self.em.start("checkpoint", epoch=epoch)
        size = self.compute.save_checkpoint(tmp)
        os.replace(tmp, path)
        self.em.stop("checkpoint", epoch=epoch, value=size, path=str(path))


def _batches(loader: DataLoader[Any]) -> Iterator[Any]:
    """Iterate ``loader``, turning a worker's UserError back into a one-line UserError.

    The DataLoader re-raises a worker's exception with the worker's whole traceback as its
    message; the original message is the text after ``UserError: `` on the last line.
    """
    iterator = iter(loader)
    try:
        while True:
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
                raise UserError(original or str(exc)) from None
            yield batch
    finally:
        del iterator
