"""What the tests of the dataset generators (tests/test_datagen_*.py) share.

Light on purpose: the writers' fork server imports the test modules that define task functions,
and these with them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from datagen.common import MANIFEST_NAME, MARKER_NAME

Generate = Callable[..., dict[str, Any]]


def _data_names(directory: Path) -> Iterator[str]:
    for root, _, names in os.walk(directory):
        for name in names:
            rel = Path(root, name).relative_to(directory).as_posix()
            if rel not in (MANIFEST_NAME, MARKER_NAME):
                yield rel


def data_files(directory: Path) -> set[str]:
    """Every file below a dataset directory (relative POSIX names), except the manifest and the
    marker."""
    return set(_data_names(directory))


def data_bytes(directory: Path) -> dict[str, bytes]:
    """Every file below a dataset directory (relative name -> bytes, in the order os.walk finds
    them), except the manifest and the marker."""
    return {name: (directory / name).read_bytes() for name in _data_names(directory)}


def temp_files(directory: Path) -> list[str]:
    """Temporary files (core.atomic.temp_path's names) left in ``directory``."""
    return [n for n in os.listdir(directory) if n.startswith(".") and n.endswith(".tmp")]


def generated(
    factory: pytest.TempPathFactory, name: str, generate: Generate, size: int, **request: Any
) -> tuple[Path, dict]:
    """A test module's dataset: ``generate(out, size, **request)`` into a new directory ``name``;
    returns ``(out, manifest)``."""
    out = factory.mktemp("ds") / name
    return out, generate(out, size, **request)


def assert_same_data(actual: Path, expected: Path) -> None:
    """Both dataset directories hold the same data files, byte for byte."""
    assert data_files(actual) == data_files(expected)
    for name in data_files(expected):
        assert (actual / name).read_bytes() == (expected / name).read_bytes(), name


def assert_progress_reaches_the_total(
    generate: Generate, out: Path, size: int, **request: Any
) -> None:
    """``generate(out, size, **request)`` reports progress that never goes back and ends at the
    dataset's total, as done and as total."""
    calls: list[tuple[int, int]] = []
    manifest = generate(out, size, progress=lambda d, t: calls.append((d, t)), **request)
    assert calls[-1] == (manifest["total_bytes"], manifest["total_bytes"])
    done = [d for d, _ in calls]
    assert done == sorted(done)
