"""Torch datasets of image-classification samples: one JPEG file, or one group file, per item.

I/O per item, as the access patterns being compared require: the folder layout opens each JPEG
and reads it whole with one ``read``; the grouped layout opens a group file and reads it whole
with one ``read``, then decodes its G images from memory. So a DataLoader over groups uses
``batch_size // G`` groups per batch, with :func:`collate_groups`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import UserError
from workloads.events import Emitter
from workloads.images.files import REGENERATE, ImageData, ImageGroup, ImageSample
from workloads.images.transforms import decode, eval_transform, train_transform
from workloads.loaders import EpochDraws

__all__ = [
    "GroupedImageDataset",
    "ImageFolderDataset",
    "collate_groups",
    "make_dataset",
    "read_whole",
]

Item = TypeVar("Item", ImageSample, ImageGroup)


def read_whole(path: Path) -> bytes:
    """The whole file: one ``open``, one ``fstat`` and, for a regular file, one ``read``.

    (``Path.read_bytes`` issues a second read to find the end of file.) A missing or unreadable
    file becomes a UserError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            data = os.read(fd, size)
            # A regular file returns everything at once; loop only for the odd file system.
            while len(data) < size:
                more = os.read(fd, size - len(data))
                if not more:
                    break
                data += more
            return data
        finally:
            os.close(fd)
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc}): {REGENERATE}") from None


class _Base(EpochDraws, Generic[Item]):
    """Items of one split (image files or group files) and their transforms."""

    def __init__(
        self,
        items: Sequence[Item],
        *,
        image_size: int = 224,
        train: bool = True,
        seed: int = 0,
        emitter: Emitter | None = None,
    ) -> None:
        if image_size < 1:
            raise UserError(f"image_size must be at least 1, got {image_size}")
        self.items = list(items)
        self.image_size = image_size
        self.train = train
        self.seed = seed
        self.emitter = emitter

    def __len__(self) -> int:
        return len(self.items)

    def _transform(self, data: bytes, where: str, rng: np.random.Generator) -> torch.Tensor:
        img = decode(data, where)
        if self.train:
            return train_transform(img, self.image_size, rng)
        return eval_transform(img, self.image_size)


class ImageFolderDataset(_Base[ImageSample], Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """JPEG files; item ``i`` is (float32 tensor (3, S, S), int64 label).

    ``train``: random resized crop and flip drawn from ``default_rng([seed, epoch, i])``;
    otherwise the evaluation resize and centre crop. With an instrumenting ``emitter`` each
    item logs ``sample_load`` (open + read) and ``sample_preproc`` (decode + transform), with
    metadata ``index=i``, from the worker process that loads it.
    """

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample = self.items[i]
        t0 = time.monotonic_ns()
        data = read_whole(sample.path)
        t1 = time.monotonic_ns()
        image = self._transform(data, str(sample.path), self.rng(i))
        t2 = time.monotonic_ns()
        if self.emitter is not None:
            self.emitter.duration("sample_load", t0, t1, epoch=self.epoch, index=i)
            self.emitter.duration("sample_preproc", t1, t2, epoch=self.epoch, index=i)
        return image, torch.tensor(sample.label, dtype=torch.int64)


class GroupedImageDataset(_Base[ImageGroup], Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Group files; item ``i`` is (float32 tensor (G, 3, S, S), int64 labels (G,)) of group i.

    One open and one read of the whole group file per item, then every member is decoded and
    transformed (draws from ``default_rng([seed, epoch, i])``, member after member). Events as
    :class:`ImageFolderDataset`, with metadata ``group=i, samples=G``.
    """

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        group = self.items[i]
        t0 = time.monotonic_ns()
        data = read_whole(group.path)
        t1 = time.monotonic_ns()
        for m in group.members:
            # Checked before decoding anything: a short read means a truncated or replaced file.
            if m.offset + m.size > len(data):
                raise UserError(
                    f"{group.path} is truncated: {m.name} needs bytes {m.offset}.."
                    f"{m.offset + m.size} but the file has {len(data)}: {REGENERATE}"
                )
        rng = self.rng(i)
        images = []
        for m in group.members:
            where = f"{m.name} in {group.path} (offset {m.offset})"
            images.append(self._transform(data[m.offset : m.offset + m.size], where, rng))
        batch = torch.stack(images)
        labels = torch.tensor([m.label for m in group.members], dtype=torch.int64)
        t2 = time.monotonic_ns()
        if self.emitter is not None:
            n = len(group.members)
            self.emitter.duration("sample_load", t0, t1, epoch=self.epoch, group=i, samples=n)
            self.emitter.duration("sample_preproc", t1, t2, epoch=self.epoch, group=i, samples=n)
        return batch, labels


def collate_groups(
    items: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """DataLoader ``collate_fn`` for groups: concatenate images and labels along dim 0."""
    return torch.cat([x for x, _ in items]), torch.cat([y for _, y in items])


def make_dataset(
    data: ImageData,
    split: str,
    *,
    image_size: int = 224,
    train: bool = True,
    seed: int = 0,
    emitter: Emitter | None = None,
) -> ImageFolderDataset | GroupedImageDataset:
    """The dataset of ``split`` ("train" or "val") for ``data``'s layout."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    items = data.train if split == "train" else data.val
    kwargs = {"image_size": image_size, "train": train, "seed": seed, "emitter": emitter}
    if data.layout == "grouped":
        return GroupedImageDataset(items, **kwargs)  # type: ignore[arg-type]
    return ImageFolderDataset(items, **kwargs)  # type: ignore[arg-type]
