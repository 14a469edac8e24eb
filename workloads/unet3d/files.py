"""Listing and quick validation of a UNet3D dataset directory (numpy only, no torch).

Layout (KiTS19 as preprocessed by the MLCommons reference): pairs ``case_%05d_x.npy``
(float32, shape (1, s1, s2, s2)) and ``case_%05d_y.npy`` (uint8 labels {0, 1}, same shape, or
the same spatial shape without the channel axis). Other files in the directory are ignored.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from core.errors import UserError
from workloads.data import DataSummary, data_directory

CASE_RE = re.compile(r"^case_(\d{5})_([xy])\.npy$")
REGENERATE = "regenerate it with ./cli.py datagen unet3d"
DATA_FORMAT = (
    "directory of case_%05d_x.npy (float32, shape (1, s1, s2, s2)) and case_%05d_y.npy "
    "(uint8 labels {0,1}, same spatial shape) pairs, as the MLCommons UNet3D reference reads"
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One training case: the image and label files."""

    index: int
    x: Path
    y: Path


def list_cases(data_dir: str | Path) -> list[Case]:
    """The (x, y) pairs of ``data_dir`` sorted by case number; checks names and pairing only."""
    data_dir = data_directory(data_dir, "UNet3D", "unet3d")
    found: dict[int, dict[str, Path]] = {}
    for entry in data_dir.iterdir():
        match = CASE_RE.match(entry.name)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = entry
    if not found:
        raise UserError(
            f"UNet3D data directory {data_dir} has no case_NNNNN_x.npy files: {REGENERATE}"
        )
    cases = []
    for index in sorted(found):
        pair = found[index]
        for have, lack in (("x", "y"), ("y", "x")):
            if lack not in pair:
                raise UserError(
                    f"{pair[have]} has no matching {pair[have].name.replace(f'_{have}.', f'_{lack}.')}: "
                    f"{REGENERATE}"
                )
        cases.append(Case(index, pair["x"], pair["y"]))
    return cases


def _header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, expected file size) from an .npy header, without reading the data."""
    try:
        with path.open("rb") as f:
            version = np.lib.format.read_magic(f)
            # Version 3.0 (utf-8 field names) only occurs for structured dtypes, never ours.
            read = {
                (1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0,
            }.get(version)
            if read is None:
                raise ValueError(f"unsupported .npy format version {version}")
            shape, _fortran, dtype = read(f)
            offset = f.tell()
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"cannot read the .npy header of {path} ({exc}): {REGENERATE}") from None
    return tuple(shape), np.dtype(dtype), offset + int(np.prod(shape)) * np.dtype(dtype).itemsize


def check_dataset(data_dir: str | Path) -> DataSummary:
    """Validate ``data_dir`` quickly: names, pairs, non-empty files, readable headers.

    Checks dtypes (x float32, y uint8), shapes (x (1, s1, s2, s2); y the same spatial shape)
    and that each file is as long as its header says, so a truncated file is caught before a
    container starts; the data itself is not read.
    """
    cases = list_cases(data_dir)
    total = 0
    for case in cases:
        sizes = {}
        for path in (case.x, case.y):
            size = path.stat().st_size
            if size == 0:
                raise UserError(f"{path} is empty: {REGENERATE}")
            sizes[path] = size
            total += size
        x_shape, x_dtype, x_size = _header(case.x)
        y_shape, y_dtype, y_size = _header(case.y)
        if x_dtype != np.float32 or len(x_shape) != 4 or x_shape[0] != 1:
            raise UserError(
                f"{case.x} holds {x_dtype} {x_shape}, expected float32 (1, s1, s2, s2): {REGENERATE}"
            )
        if y_dtype != np.uint8 or y_shape not in (x_shape, x_shape[1:]):
            raise UserError(
                f"{case.y} holds {y_dtype} {y_shape}, expected uint8 {x_shape} to match "
                f"{case.x.name}: {REGENERATE}"
            )
        for path, expected in ((case.x, x_size), (case.y, y_size)):
            if sizes[path] < expected:
                raise UserError(
                    f"{path} is truncated ({sizes[path]} of {expected} bytes): {REGENERATE}"
                )
    return DataSummary(items=len(cases), files=2 * len(cases), bytes=total)
