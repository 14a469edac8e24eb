"""Listing and quick validation of an image-classification dataset (stdlib, numpy-free, no torch).

Two layouts, told apart by the presence of ``train/index.csv``:

- folder: ``train/<class>/<image>.JPEG`` (and optionally ``val/<class>/...``), as torchvision's
  ImageFolder reads ImageNet: the sorted class folder names of ``train`` give the labels
  0..K-1, and val images take the label of their folder's name among the train classes;
- grouped (gpufs "file grouping"): ``<split>/groups/group_%06d.bin``, each the concatenation
  of whole JPEG files, and ``<split>/index.csv`` with header ``group,offset,size,label,path``
  locating every image (``path``: its name in the folder layout, relative to the dataset
  directory; its folder gives the class name).
"""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path, PurePosixPath
from typing import Literal, cast

from core.errors import UserError
from workloads.data import DataSummary, data_directory

REGENERATE = "regenerate it with ./cli.py datagen images"
SPLITS = ("train", "val")
IMAGE_SUFFIXES = (".jpeg", ".jpg")
INDEX_HEADER = ("group", "offset", "size", "label", "path")
JPEG_MAGIC = b"\xff\xd8"
DATA_FORMAT = (
    "ImageNet layout: train/<class>/<name>.JPEG and val/<class>/<name>.JPEG (sorted class "
    "folder names give the labels), or grouped files: <split>/groups/group_%06d.bin "
    "(concatenated JPEGs) with <split>/index.csv (group,offset,size,label,path)"
)

Layout = Literal["folder", "grouped"]


@dataclasses.dataclass(frozen=True)
class ImageSample:
    """One JPEG file of the folder layout and its label."""

    path: Path
    label: int


@dataclasses.dataclass(frozen=True)
class GroupMember:
    """One image inside a group file: ``size`` bytes at ``offset``; ``name`` is its index path."""

    offset: int
    size: int
    label: int
    name: str


@dataclasses.dataclass(frozen=True)
class ImageGroup:
    """One group file and its images, in file order."""

    path: Path
    members: tuple[GroupMember, ...]


@dataclasses.dataclass(frozen=True)
class ImageData:
    """A dataset as listed: ``train``/``val`` hold ImageSample (folder) or ImageGroup (grouped).

    ``classes[label]`` is the class folder name; ``group_size`` is the largest number of images
    in a group (0 for the folder layout). ``val`` is empty when the dataset has no val split.
    """

    layout: Layout
    classes: tuple[str, ...]
    train: tuple[ImageSample, ...] | tuple[ImageGroup, ...]
    val: tuple[ImageSample, ...] | tuple[ImageGroup, ...]
    group_size: int

    @property
    def images(self) -> int:
        """Images in both splits."""
        if self.layout == "folder":
            return len(self.train) + len(self.val)
        groups = cast(tuple[ImageGroup, ...], (*self.train, *self.val))
        return sum(len(g.members) for g in groups)


def load_image_data(data_dir: str | Path) -> ImageData:
    """List the dataset in ``data_dir``, detecting its layout; UserError when it is unusable."""
    data_dir = data_directory(data_dir, "image", "images")
    if (data_dir / "train" / "index.csv").is_file():
        return _load_grouped(data_dir)
    if (data_dir / "train").is_dir():
        return _load_folders(data_dir)
    raise UserError(
        f"{data_dir} has neither train/<class>/ folders nor train/index.csv: it is not an image "
        f"dataset; {REGENERATE}"
    )


# --------------------------------------------------------------------------------------------
# Folder layout


def _subdirs(directory: Path) -> list[str]:
    return sorted(
        e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith(".")
    )


def _images_in(directory: Path, label: int) -> list[ImageSample]:
    names = sorted(
        e.name
        for e in os.scandir(directory)
        if e.name.lower().endswith(IMAGE_SUFFIXES) and not e.name.startswith(".") and e.is_file()
    )
    return [ImageSample(directory / name, label) for name in names]


def _load_folders(data_dir: Path) -> ImageData:
    classes = _subdirs(data_dir / "train")
    if not classes:
        raise UserError(f"{data_dir / 'train'} has no class folders: {REGENERATE}")
    train = [
        s for label, c in enumerate(classes) for s in _images_in(data_dir / "train" / c, label)
    ]
    if not train:
        raise UserError(
            f"{data_dir / 'train'} has no .JPEG/.jpg/.jpeg files in its class folders: {REGENERATE}"
        )
    val: list[ImageSample] = []
    if (data_dir / "val").is_dir():
        labels = {c: i for i, c in enumerate(classes)}
        for c in _subdirs(data_dir / "val"):
            if c not in labels:
                raise UserError(
                    f"{data_dir / 'val' / c} is a class that train/ does not have, so it has no "
                    f"label: remove it or {REGENERATE}"
                )
            val.extend(_images_in(data_dir / "val" / c, labels[c]))
    return ImageData("folder", tuple(classes), tuple(train), tuple(val), 0)


# --------------------------------------------------------------------------------------------
# Grouped layout


def _read_index(data_dir: Path, split: str) -> list[tuple[int, int, int, int, str]]:
    path = data_dir / split / "index.csv"
    rows: list[tuple[int, int, int, int, str]] = []
    try:
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or tuple(header) != INDEX_HEADER:
                raise UserError(
                    f"{path} starts with {header!r}, expected the header "
                    f"{','.join(INDEX_HEADER)}: {REGENERATE}"
                )
            for row in reader:
                if len(row) != len(INDEX_HEADER):
                    raise ValueError(f"{len(row)} fields")
                group, offset, size, label = (int(v) for v in row[:4])
                if group < 0 or offset < 0 or size <= 0 or label < 0:
                    raise ValueError("negative number or empty image")
                rows.append((group, offset, size, label, row[4]))
    except (OSError, UnicodeDecodeError) as exc:
        # Before ValueError, of which UnicodeDecodeError is a kind.
        raise UserError(f"cannot read {path} ({exc}): {REGENERATE}") from None
    except (ValueError, csv.Error) as exc:
        raise UserError(
            f"{path} line {reader.line_num} is not group,offset,size,label,path ({exc}): "
            f"{REGENERATE}"
        ) from None
    if not rows:
        raise UserError(f"{path} lists no images: {REGENERATE}")
    return rows


def _groups(
    data_dir: Path, split: str, rows: list[tuple[int, int, int, int, str]]
) -> list[ImageGroup]:
    by_group: dict[int, list[GroupMember]] = {}
    for group, offset, size, label, name in rows:
        by_group.setdefault(group, []).append(GroupMember(offset, size, label, name))
    groups = []
    for number in sorted(by_group):
        path = data_dir / split / "groups" / f"group_{number:06d}.bin"
        try:
            file_size = path.stat().st_size
        except OSError:
            raise UserError(
                f"{path} is listed in {split}/index.csv but cannot be found: {REGENERATE}"
            ) from None
        members = tuple(sorted(by_group[number], key=lambda m: m.offset))
        end = 0
        for m in members:
            if m.offset < end:
                raise UserError(
                    f"{split}/index.csv: images {m.name} and the one before it overlap in "
                    f"{path.name} (offset {m.offset} < {end}): {REGENERATE}"
                )
            end = m.offset + m.size
        if end > file_size:
            raise UserError(
                f"{path} is truncated: {members[-1].name} needs bytes up to offset {end} but "
                f"the file has {file_size}: {REGENERATE}"
            )
        groups.append(ImageGroup(path, members))
    return groups


def _class_names(rows: list[tuple[int, int, int, int, str]], where: Path) -> tuple[str, ...]:
    names: dict[int, str] = {}
    for _, _, _, label, name in rows:
        parts = PurePosixPath(name).parts
        cls = parts[-2] if len(parts) >= 2 else ""
        if names.setdefault(label, cls) != cls:
            raise UserError(
                f"{where}: label {label} is given to class folders {names[label]!r} and "
                f"{cls!r}: {REGENERATE}"
            )
    missing = [label for label in range(len(names)) if label not in names]
    if missing:
        raise UserError(
            f"{where}: labels must be 0..K-1 but {missing[0]} is never used "
            f"(labels go up to {max(names)}): {REGENERATE}"
        )
    return tuple(names[label] for label in range(len(names)))


def _load_grouped(data_dir: Path) -> ImageData:
    train_rows = _read_index(data_dir, "train")
    val_rows = _read_index(data_dir, "val") if (data_dir / "val" / "index.csv").is_file() else []
    classes = _class_names(train_rows + val_rows, data_dir / "*/index.csv")
    train = _groups(data_dir, "train", train_rows)
    val = _groups(data_dir, "val", val_rows) if val_rows else []
    group_size = max(len(g.members) for g in (*train, *val))
    return ImageData("grouped", classes, tuple(train), tuple(val), group_size)


# --------------------------------------------------------------------------------------------
# Check


def _starts_like_jpeg(path: Path, offset: int = 0) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(2) == JPEG_MAGIC
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc}): {REGENERATE}") from None


def check_dataset(data_dir: str | Path) -> DataSummary:
    """Validate ``data_dir`` quickly and count it: items = images, files = image/group files.

    Folder layout: every image file is non-empty, and the first and last of each split start
    like a JPEG. Grouped layout: the index files parse, every group file exists and holds the
    byte ranges its index gives (a truncated file is caught here), and each group's first image
    starts like a JPEG. No image is decoded.
    """
    data = load_image_data(data_dir)
    if data.layout == "folder":
        return _check_folder(data)
    return _check_grouped(data)


def _check_folder(data: ImageData) -> DataSummary:
    total = 0
    for split in (data.train, data.val):
        samples = cast(tuple[ImageSample, ...], split)
        for sample in samples:
            try:
                size = sample.path.stat().st_size
            except OSError as exc:
                raise UserError(f"cannot read {sample.path} ({exc}): {REGENERATE}") from None
            if size == 0:
                raise UserError(f"{sample.path} is empty: {REGENERATE}")
            total += size
        for sample in samples[:1] + samples[-1:]:
            if not _starts_like_jpeg(sample.path):
                raise UserError(f"{sample.path} is not a JPEG file: {REGENERATE}")
    return DataSummary(items=data.images, files=data.images, bytes=total)


def _check_grouped(data: ImageData) -> DataSummary:
    total = 0
    groups = cast(tuple[ImageGroup, ...], (*data.train, *data.val))
    for group in groups:
        first = group.members[0]
        if not _starts_like_jpeg(group.path, first.offset):
            raise UserError(
                f"{group.path} holds no JPEG at offset {first.offset} where its index places "
                f"{first.name}: {REGENERATE}"
            )
        total += group.path.stat().st_size
    return DataSummary(items=data.images, files=len(groups), bytes=total)
