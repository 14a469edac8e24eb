"""DLRM batches read as the MLPerf binary loader reads them: one ``pread`` per batch.

Item ``i`` of :class:`DLRMBatches` is the whole batch ``i``: ``batch_size`` consecutive records
at byte offset ``i * batch_size * 160``, read with exactly one ``os.pread`` and decoded with
:func:`workloads.dlrm.files.decode_batch`. The training loop wraps it in
``DataLoader(ds, batch_size=None, sampler=DistributedSampler(ds, shuffle=True))``, so each step
is one contiguous read at a random batch-aligned offset of one large file, like the reference.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from core.errors import UserError
from workloads.dlrm.files import RECORD_BYTES, REGENERATE, DLRMData, RecordError, decode_batch
from workloads.events import Emitter

__all__ = ["DLRMBatches"]

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class DLRMBatches(Dataset[Batch]):
    """Whole batches of a DLRM record file; item ``i`` is (dense (B,13) float32, sparse (B,26)
    int64, labels (B,) float32) of records ``[i*B, (i+1)*B)``.

    ``records`` is the number of records in ``path`` (from :func:`load_dataset`). Only full
    batches are used (the reference also reads a partial last batch), so that every step reads
    the same number of bytes. ``counts``, when given, lets the decoder check labels and every
    categorical index against its table.

    The file is opened lazily, once per process (``O_RDONLY | O_CLOEXEC``), and reopened when
    the dataset is used in another process (a DataLoader worker), so each process reads through
    its own descriptor. With an instrumenting ``emitter`` each item logs ``batch_load`` (the
    ``pread``) and ``batch_preproc`` (decoding), with metadata ``batch=i`` and the epoch set by
    :meth:`set_epoch`.
    """

    def __init__(
        self,
        path: Path,
        records: int,
        batch_size: int,
        *,
        max_ind_range: int = 0,
        emitter: Emitter | None = None,
        counts: Sequence[int] | None = None,
    ) -> None:
        # First, so that __del__ works even when a check below fails.
        self._fd = -1
        self._pid = -1
        self.path = Path(path)
        if batch_size < 1:
            raise UserError(f"DLRM batch_size must be at least 1, got {batch_size}")
        if records < batch_size:
            raise UserError(
                f"{self.path} has {records} records, fewer than one batch of {batch_size}: "
                f"lower batch_size or {REGENERATE} with a larger size"
            )
        try:
            size = self.path.stat().st_size
        except OSError as exc:
            raise UserError(f"cannot open {self.path} ({exc.strerror}): {REGENERATE}") from None
        if size < records * RECORD_BYTES:
            raise UserError(
                f"{self.path} is {size} bytes, shorter than its {records} records of "
                f"{RECORD_BYTES} bytes: the file is truncated; {REGENERATE}"
            )
        self.records = records
        self.batch_size = batch_size
        self.batch_bytes = batch_size * RECORD_BYTES
        self.max_ind_range = max_ind_range
        self.emitter = emitter
        self.counts = tuple(counts) if counts is not None else None
        self.epoch = -1

    @classmethod
    def from_data(
        cls,
        data: DLRMData,
        batch_size: int,
        *,
        test: bool = False,
        max_ind_range: int = 0,
        emitter: Emitter | None = None,
    ) -> DLRMBatches:
        """Batches of the train (or, with ``test``, the test) file of a checked dataset."""
        return cls(
            data.test if test else data.train,
            data.test_records if test else data.train_records,
            batch_size,
            max_ind_range=max_ind_range,
            emitter=emitter,
            counts=data.counts,
        )

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch reported in events (call before iterating an epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.records // self.batch_size

    def _descriptor(self) -> int:
        pid = os.getpid()
        if self._pid != pid:
            # Inherited through fork, the parent's descriptor would work for pread, but a
            # descriptor of our own keeps each process's reads attributable to it, and an
            # unpickled copy (spawn) has none.
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise UserError(f"cannot open {self.path} ({exc.strerror}): {REGENERATE}") from None
            self._pid = pid
        return self._fd

    def _read(self, offset: int) -> bytes:
        fd = self._descriptor()
        try:
            data = os.pread(fd, self.batch_bytes, offset)
            # A regular file returns less only at its end; retry once the rare partial read.
            while 0 < len(data) < self.batch_bytes:
                more = os.pread(fd, self.batch_bytes - len(data), offset + len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            raise UserError(
                f"cannot read {self.path} at offset {offset} ({exc.strerror}): {REGENERATE}"
            ) from None
        if len(data) != self.batch_bytes:
            raise UserError(
                f"{self.path} is {os.fstat(fd).st_size} bytes, too short for the batch at offset "
                f"{offset} ({self.batch_bytes} bytes): the file is truncated; {REGENERATE}"
            )
        return data

    def __getitem__(self, i: int) -> Batch:
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} out of range 0..{len(self) - 1}")
        offset = i * self.batch_bytes
        t0 = time.monotonic_ns()
        raw = self._read(offset)
        t1 = time.monotonic_ns()
        try:
            dense, sparse, labels = decode_batch(raw, self.counts, self.max_ind_range)
        except RecordError as exc:
            raise UserError(
                f"{self.path}: bad record at offset {offset + exc.record * RECORD_BYTES} "
                f"({exc}): {REGENERATE}"
            ) from None
        t2 = time.monotonic_ns()
        if self.emitter is not None:
            self.emitter.duration("batch_load", t0, t1, epoch=self.epoch, batch=i)
            self.emitter.duration("batch_preproc", t1, t2, epoch=self.epoch, batch=i)
        return torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(labels)

    def close(self) -> None:
        """Close this process's descriptor (it is reopened on the next read)."""
        if self._fd >= 0 and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._pid = -1, -1

    def __getstate__(self) -> dict[str, Any]:
        # A descriptor number means nothing in another process.
        return {**self.__dict__, "_fd": -1, "_pid": -1}

    def __del__(self) -> None:
        # At interpreter exit the os module may already be torn down: nothing left to do then.
        with contextlib.suppress(Exception):
            self.close()
