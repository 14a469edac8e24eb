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
    did not finish (its marker without its manifest), a UserError says how to generate the
    ``data`` (``"BERT"``) there: ``./cli.py datagen <generator>``. A directory twintrace did not
    write (no marker: real data) is taken as it is."""
    path = Path(data_dir)
    if not path.is_dir():
        raise UserError(
            f"{data} data directory {path} does not exist: generate a dataset there with "
            f"./cli.py datagen {generator}"
        )
    # twintrace's dataset is whole only once its manifest is (stat only: the readers call
    # this in the traced containers, where a read of the manifest would be in the trace)
    if (path / MARKER_NAME).is_file() and not (path / MANIFEST_NAME).is_file():
        raise UserError(
            f"{path} is a twintrace dataset whose generation did not finish (it has no "
            f"{MANIFEST_NAME}): {_again(path, generator)}"
        )
    return path


def _again(path: Path, generator: str) -> str:
    return f"generate it again with ./cli.py datagen {generator} --out {path} --force"


def check_manifest(data_dir: str | Path, generator: str) -> None:
    """On the host, before a run: a twintrace dataset in ``data_dir`` (its marker) has a
    manifest that is whole JSON and tells the truth about its files (each one there, of the
    size it lists, and their sum its ``total_bytes``: stat only), else a UserError names what
    differs and says to generate it again. A dataset changed after it was generated (a file
    truncated, replaced or removed; the manifest edited) would measure other data than it
    claims."""
    path = Path(data_dir)
    manifest = path / MANIFEST_NAME
    if not ((path / MARKER_NAME).is_file() and manifest.is_file()):
        return
    try:
        listed = json.loads(manifest.read_bytes())
    except ValueError:
        raise UserError(
            f"{manifest} is damaged (not valid JSON): {_again(path, generator)}"
        ) from None
    files = listed.get("files") if isinstance(listed, dict) else None
    if not isinstance(files, list):
        raise UserError(f"{manifest} lists no files: it was edited; {_again(path, generator)}")
    total = 0
    for entry in files:
        name, size = (entry.get("name"), entry.get("bytes")) if isinstance(entry, dict) else (0, 0)
        if not isinstance(name, str) or not isinstance(size, int):
            raise UserError(
                f"{manifest} has a file entry without its name and bytes ({entry!r}): it was "
                f"edited; {_again(path, generator)}"
            )
        try:
            found = (path / name).stat().st_size
        except OSError:
            raise UserError(
                f"{path / name} is missing, though {MANIFEST_NAME} lists it: the dataset was "
                f"changed after it was generated; {_again(path, generator)}"
            ) from None
        if found != size:
            raise UserError(
                f"{path / name} has {found} bytes, {MANIFEST_NAME} says {size}: the dataset "
                f"was changed after it was generated (a file cut short, replaced or the "
                f"manifest edited); {_again(path, generator)}"
            )
        total += size
    if listed.get("total_bytes") != total:
        raise UserError(
            f"{manifest} says its dataset holds {listed.get('total_bytes')} bytes, its files "
            f"sum to {total}: it was edited; {_again(path, generator)}"
        )
