"""What every workload's dataset check returns, and the check each starts with (numpy-free,
torch-free)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from core.errors import UserError


@dataclasses.dataclass(frozen=True)
class DataSummary:
    """What a ``check_dataset`` found: items (cases, records, images, groups), files and bytes."""

    items: int
    files: int
    bytes: int


def data_directory(data_dir: str | Path, data: str, generator: str) -> Path:
    """``data_dir`` as a Path; when it is no directory, a UserError says how to generate the
    ``data`` (``"BERT"``) there: ``./cli.py datagen <generator>``."""
    path = Path(data_dir)
    if not path.is_dir():
        raise UserError(
            f"{data} data directory {path} does not exist: generate a dataset there with "
            f"./cli.py datagen {generator}"
        )
    return path
