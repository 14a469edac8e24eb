"""What every workload's dataset check returns, and the check each starts with (numpy-free,
torch-free)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from core.errors import UserError

#: What a twintrace generator writes into a dataset directory: the marker first, the manifest
#: last (datagen/common.py); a directory with the marker and no whole manifest is a
#: generation that did not finish.
MANIFEST_NAME = "manifest.json"
MARKER_NAME = ".twintrace-dataset"


@dataclasses.dataclass(frozen=True)
class DataSummary:
    """What a ``check_dataset`` found: items (cases, records, images, groups), files and bytes."""

    items: int
    files: int
    bytes: int


def data_directory(data_dir: str | Path, data: str, generator: str) -> Path:
    """``data_dir`` as a Path; when it is no directory, or a twintrace dataset whose generation
    did not finish (its marker without a whole manifest), a UserError says how to generate the
    ``data`` (``"BERT"``) there: ``./cli.py datagen <generator>``. A directory twintrace did not
    write (no marker: real data) is taken as it is."""
    path = Path(data_dir)
    if not path.is_dir():
        raise UserError(
            f"{data} data directory {path} does not exist: generate a dataset there with "
            f"./cli.py datagen {generator}"
        )
    if (path / MARKER_NAME).is_file():  # twintrace's: whole only once its manifest is
        again = f"generate it again with ./cli.py datagen {generator} --out {path} --force"
        manifest = path / MANIFEST_NAME
        if not manifest.is_file():
            raise UserError(
                f"{path} is a twintrace dataset whose generation did not finish (it has no "
                f"{MANIFEST_NAME}): {again}"
            )
        try:
            json.loads(manifest.read_bytes())
        except ValueError:
            raise UserError(f"{manifest} is damaged (not valid JSON): {again}") from None
    return path
