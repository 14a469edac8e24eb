"""The UNet3D training dataset: whole-file ``np.load`` of each case, random crop and flips.

Like the MLCommons reference, every ``__getitem__`` reads both files of a case completely
(``np.load``, no memory mapping) and then crops a ``patch_size``^3 patch, so the I/O per sample
is the full case size however small the patch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import UserError
from workloads.events import Emitter
from workloads.loaders import EpochDraws
from workloads.unet3d.files import REGENERATE, Case, DataSummary, check_dataset, list_cases

__all__ = ["UNet3DDataset", "check_dataset", "list_cases", "Case", "DataSummary", "load_npy"]


def load_npy(path: Path) -> np.ndarray:
    """``np.load`` of a whole file; a missing or unreadable file becomes a UserError."""
    try:
        return np.load(path)
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"cannot load {path} ({exc}): {REGENERATE}") from None


def random_patch(
    x: np.ndarray, y: np.ndarray, patch: int, rng: np.random.Generator, augment: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Crop a ``patch``^3 patch of (1, D, H, W) arrays ``x``, ``y``; zero-pad smaller dims.

    ``augment``: random crop position and a flip along each spatial axis with probability
    1/2; otherwise the centre crop, unflipped (evaluation).
    """
    short = [max(0, patch - s) for s in x.shape[1:]]
    if any(short):
        pad = [(0, 0)] + [(n // 2, n - n // 2) for n in short]
        x, y = np.pad(x, pad), np.pad(y, pad)
    starts = [
        int(rng.integers(0, s - patch + 1)) if augment else (s - patch) // 2 for s in x.shape[1:]
    ]
    region = (slice(None),) + tuple(slice(s, s + patch) for s in starts)
    x, y = x[region], y[region]
    if augment:
        for axis in (1, 2, 3):
            if rng.random() < 0.5:
                x, y = np.flip(x, axis), np.flip(y, axis)
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


class UNet3DDataset(EpochDraws, Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Cases of a UNet3D dataset; item ``i`` is (image float32 (1,p,p,p), labels uint8 (1,p,p,p)).

    Random choices are seeded by (seed, epoch, case index), so a run is reproducible whatever
    the number of workers. Call :meth:`set_epoch` before iterating an epoch: DataLoader workers
    are forked per epoch and see the dataset as it was then. With an instrumenting ``emitter``
    each item logs ``sample_load`` (the two ``np.load`` calls) and ``sample_preproc`` (crop and
    flips) from the worker process that loads it.
    """

    def __init__(
        self,
        cases: Sequence[Case],
        patch_size: int,
        *,
        seed: int = 0,
        augment: bool = True,
        emitter: Emitter | None = None,
    ) -> None:
        self.cases = list(cases)
        self.patch_size = patch_size
        self.seed = seed
        self.augment = augment
        self.emitter = emitter

    @classmethod
    def from_dir(cls, data_dir: str | Path, patch_size: int, **kwargs: object) -> UNet3DDataset:
        """All cases of ``data_dir`` (checked with :func:`list_cases`)."""
        return cls(list_cases(data_dir), patch_size, **kwargs)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        case = self.cases[i]
        t0 = time.monotonic_ns()
        x = load_npy(case.x)
        y = load_npy(case.y)
        t1 = time.monotonic_ns()
        if y.ndim == x.ndim - 1:
            y = y[None]
        rng = self.rng(case.index, int(self.augment))
        x, y = random_patch(x, y, self.patch_size, rng, self.augment)
        t2 = time.monotonic_ns()
        if self.emitter is not None:
            self.emitter.duration("sample_load", t0, t1, epoch=self.epoch, case=case.index)
            self.emitter.duration("sample_preproc", t1, t2, epoch=self.epoch, case=case.index)
        return torch.from_numpy(x), torch.from_numpy(y)
