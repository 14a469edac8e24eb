"""The data side of a task: its loaders over this rank's share of the data, and their batches.

A :class:`workloads.training.Task` gives the training loop a :class:`Loader` per pass (most
through :func:`sharded_loader`); the loop, and the emulated accelerator's staging
(``workloads/emulation.py``), take the batches through :func:`batches_of`, which turns a loader
worker's :class:`~core.errors.UserError` back into one line; :func:`synthetic_batches` takes the
one batch a ``synthetic`` run repeats. The datasets draw their random choices per epoch through
:class:`EpochDraws`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from core.errors import UserError
from workloads.config import WorkloadConfig


class EpochDraws:
    """A dataset's epoch and its random draws: :meth:`set_epoch` before each pass (DataLoader
    workers see the dataset as it was when they started), and :meth:`rng`, the draws of an item
    from ``default_rng([seed, epoch, *keys])`` (epoch 0 before the first call), the same
    whatever the numbers of workers and ranks. The epoch is also the one its events report."""

    seed: int
    epoch: int = -1

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s random draws; call before iterating (workers see it per epoch)."""
        self.epoch = epoch

    def rng(self, *keys: int) -> np.random.Generator:
        """The random draws of the item named by ``keys`` (its index) in this epoch."""
        return np.random.default_rng([self.seed, max(self.epoch, 0), *keys])


@dataclasses.dataclass
class Loader:
    """A DataLoader and what to call before each pass (seeds the shuffling of that epoch)."""

    loader: DataLoader[Any]
    set_epoch: Callable[[int], None]


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
