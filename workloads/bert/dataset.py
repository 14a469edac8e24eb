"""The BERT training input: TFRecord shards read like the MLPerf reference's tf.data pipeline.

The reference reads ``TFRecordDataset`` files through ``interleave(cycle_length=...,
block_length=1)``: several shards open at once, one record from each in turn. This
IterableDataset does the same, per DataLoader worker, and yields whole batches (the
reference batches before parsing), so a trace shows the same file access pattern: each shard
opened once per pass, read sequentially through a 256 KiB buffer, ``cycle_length`` shards
advancing together.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from core.errors import UserError
from workloads.bert.files import FEATURES
from workloads.bert.records import REGENERATE, iter_records, parse_example
from workloads.events import Emitter
from workloads.loaders import EpochDraws

__all__ = ["BertBatches", "interleave"]

Batch = dict[str, torch.Tensor]
_FEATURE_NAMES = list(FEATURES)


def interleave(files: Sequence[Path], cycle_length: int) -> Iterator[tuple[Path, int, bytes]]:
    """(file, record index in its file, record data) of ``files`` read like tf.data's interleave.

    Same order as ``Dataset.from_tensor_slices(files).interleave(TFRecordDataset,
    cycle_length, block_length=1)``: ``cycle_length`` slots visited in turn, each giving one
    record; a slot whose file is exhausted is emptied and moved past, and the next file is
    opened in an empty slot the next time the cycle reaches it.
    """
    if cycle_length < 1:
        raise UserError(f"cycle_length must be at least 1, got {cycle_length}")
    pending = iter(files)
    slots: list[tuple[Path, Iterator[bytes], int] | None] = [None] * cycle_length
    open_count = 0
    exhausted_input = False
    index = 0
    while not exhausted_input or open_count:
        slot = slots[index]
        if slot is None:
            if not exhausted_input:
                path = next(pending, None)
                if path is None:
                    exhausted_input = True
                else:
                    slots[index] = (path, iter_records(path), 0)
                    open_count += 1
                    continue  # read from the new file in this same turn
            index = (index + 1) % cycle_length
            continue
        path, records, count = slot
        data = next(records, None)
        if data is None:
            slots[index] = None
            open_count -= 1
        else:
            slots[index] = (path, records, count + 1)
            yield path, count, data
        index = (index + 1) % cycle_length


class BertBatches(EpochDraws, IterableDataset[Batch]):
    """Batches of BERT pre-training records: dict of tensors with leading dimension ``batch_size``.

    int64 features become int64 tensors (batch, length), ``masked_lm_weights`` float32. Use with
    ``DataLoader(dataset, batch_size=None, num_workers=W)``. Each pass shuffles the shard list
    by (seed, epoch) when ``shuffle`` and deals it round-robin to the ``world * W`` readers
    (rank-major); each reader interleaves its shards (see :func:`interleave`) and drops its
    final partial batch. Call :meth:`set_epoch` before each pass. With an instrumenting
    ``emitter`` every batch logs ``batch_load`` (reading its records) and ``batch_preproc``
    (parsing and stacking) from the worker, with metadata ``batch`` (its number in this
    worker's pass) and ``records``.
    """

    def __init__(
        self,
        shards: Sequence[Path],
        batch_size: int,
        *,
        cycle_length: int = 8,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world: int = 1,
        emitter: Emitter | None = None,
    ) -> None:
        if batch_size < 1:
            raise UserError(f"batch_size must be at least 1, got {batch_size}")
        if cycle_length < 1:
            raise UserError(f"cycle_length must be at least 1, got {cycle_length}")
        if not 0 <= rank < world:
            raise UserError(f"rank must be in [0, world) = [0, {world}), got {rank}")
        self.shards = [Path(p) for p in shards]
        self.batch_size = batch_size
        self.cycle_length = cycle_length
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world = world
        self.emitter = emitter

    def shards_for(self, worker: int, workers: int) -> list[Path]:
        """The shards DataLoader worker ``worker`` of ``workers`` reads in this epoch, in order."""
        order = list(self.shards)
        if self.shuffle:
            perm = self.rng().permutation(len(order))
            order = [order[i] for i in perm]
        slot = self.rank * workers + worker
        return order[slot :: self.world * workers]

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        records = interleave(self.shards_for(worker, workers), self.cycle_length)
        b = self.batch_size
        batch = 0
        while True:
            t0 = time.monotonic_ns()
            raw = [r for _, r in zip(range(b), records, strict=False)]
            t1 = time.monotonic_ns()
            if len(raw) < b:
                return
            out = self._collate(raw)
            t2 = time.monotonic_ns()
            if self.emitter is not None:
                meta = {"batch": batch, "records": b}
                self.emitter.duration("batch_load", t0, t1, epoch=self.epoch, **meta)
                self.emitter.duration("batch_preproc", t1, t2, epoch=self.epoch, **meta)
            batch += 1
            yield out

    def _collate(self, raw: list[tuple[Path, int, bytes]]) -> Batch:
        arrays: dict[str, np.ndarray] = {}
        for i, (path, index, data) in enumerate(raw):
            where = f"{path} record {index}"
            example = parse_example(data, where, _FEATURE_NAMES)
            if not arrays:
                arrays = {
                    name: np.empty((len(raw), len(example[name])), dtype=example[name].dtype)
                    for name in _FEATURE_NAMES
                }
            for name in _FEATURE_NAMES:
                value = example[name]
                target = arrays[name]
                if value.shape[0] != target.shape[1] or value.dtype != target.dtype:
                    raise UserError(
                        f"{where}: feature {name} holds {value.shape[0]} {value.dtype} values "
                        f"where the batch's first record has {target.shape[1]} "
                        f"{target.dtype}: {REGENERATE}"
                    )
                target[i] = value
        return {name: torch.from_numpy(a) for name, a in arrays.items()}
