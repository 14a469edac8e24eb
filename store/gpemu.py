"""GPEmu's published table in the profile database: the reader of its CSV files and the
:class:`~store.profiletables.Table` of each (GPU, model) in it.

GPEmu measured 36 torchvision models on 6 GPUs at batch 1-256: forward and backward time,
host-to-device copy per batch, peak and persistent memory (``gpemu-profiles.csv.gz``), and the
model's transfer to the card (``gpemu-model-transfer.csv``); ``store/profiles/gpemu-profiles.md``
says where the numbers come from. Past the largest batch its authors could measure on a card,
its table continues the curve by regression (:func:`linear_tail_start` finds where).
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import UserError
from store.profiletables import Cards, Source, Table, table_values

GPEMU_COLUMNS = (
    "gpu",
    "model",
    "batch_size",
    "forward_s",
    "backward_s",
    "h2d_s",
    "peak_memory_mb",
    "persistent_memory_mb",
)
#: GPEmu's "MB" are MiB: AlexNet's 700.2 persistent = 3 x 61.1 M parameters x 4 bytes.
MB = 2**20


def read_gpemu(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPEmu's table: (gpu names, model names, numbers) with the numbers' columns
    batch_size, forward_s, backward_s, h2d_s, peak_memory_mb, persistent_memory_mb."""
    try:
        with gzip.open(path, "rt", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader)
            rows = np.array(list(reader), dtype=str)
    except (OSError, EOFError, StopIteration, csv.Error) as exc:
        raise UserError(
            f"profile table {path} cannot be read ({exc}): restore it from git"
        ) from None
    if tuple(header) != GPEMU_COLUMNS or rows.ndim != 2 or rows.shape[1] != len(GPEMU_COLUMNS):
        raise UserError(
            f"profile table {path} has columns {header}, expected {', '.join(GPEMU_COLUMNS)}: "
            "restore it from git"
        )
    try:
        numbers = rows[:, 2:].astype(float)
    except ValueError as exc:
        raise UserError(f"profile table {path} holds a value that is not a number: {exc}") from None
    return rows[:, 0], rows[:, 1], numbers


def gpemu_tables(
    source: Source, spec: Mapping[str, Any], folder: Path, cards: Cards
) -> list[Table]:
    """The tables of the ``gpemu`` source ``spec`` (its ``file`` and ``model_transfer_file`` in
    ``folder``), one per (GPU, model); ``cards`` names a GPU's accelerator."""
    gpus, models, numbers = read_gpemu(folder / spec["file"])
    transfer: dict[tuple[str, str], float] = {}
    text = (folder / spec["model_transfer_file"]).read_text()
    for row in csv.DictReader(io.StringIO(text)):
        transfer[(row["gpu"], row["model"])] = float(row["model_transfer_s"])
    order = np.lexsort((numbers[:, 0], models, gpus))
    gpus, models, numbers = gpus[order], models[order], numbers[order]
    starts = np.flatnonzero(
        np.r_[True, (gpus[1:] != gpus[:-1]) | (models[1:] != models[:-1])]
    ).tolist()
    tables = []
    for start, stop in zip(starts, [*starts[1:], len(gpus)], strict=True):
        gpu, model = str(gpus[start]), str(models[start])
        block = numbers[start:stop]
        values = table_values(
            {
                "compute_s": row[1] + row[2],
                "compute_std_s": 0.0,
                "forward_s": row[1],
                "backward_s": row[2],
                "h2d_s": row[3],
                "peak_bytes": row[4] * MB,
                "persistent_bytes": row[5] * MB,
            }
            for row in block
        )
        batch = block[:, 0].astype(int)
        tables.append(
            Table(
                source=source,
                accelerator=cards(gpu).key,
                card=gpu.replace("_", " "),
                model=model,
                batch=batch,
                values=values,
                model_transfer_s=transfer.get((gpu, model)),
                measured_max=linear_tail_start(batch, block[:, 1:3]),
                origin=f"rows of {gpu}, {model}",
            )
        )
    return tables


def linear_tail_start(batch: np.ndarray, series: np.ndarray) -> int | None:
    """The last batch size before a run of rows that lie exactly on one line (second
    differences zero to rounding) in every column of ``series``: GPEmu continues a curve by
    regression past the largest batch its authors could measure. None when there is none."""
    if len(batch) < 4:
        return None
    second = np.abs(np.diff(series, n=2, axis=0))
    scale = np.abs(series).max(axis=0) + 1e-30
    flat = (second <= 1e-9 * scale).all(axis=1)
    if not flat[-1]:
        return None
    k = len(flat)
    while k > 0 and flat[k - 1]:
        k -= 1
    # flat[j] covers rows j..j+2: rows k+1.. lie on the line through rows k+1, k+2.
    return int(batch[k + 1]) if k + 1 < len(batch) - 2 else None
