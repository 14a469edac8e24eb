"""What the tests of the dataset generators (tests/test_datagen_*.py) share.

Light on purpose: the writers' fork server imports the test modules that define task functions,
and these with them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from core.errors import UserError
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


def dataset_fixture(name: str, generate: Generate, size: int, **request: Any) -> Any:
    """A module-scoped fixture (named by the module's variable it is assigned to) of a test
    module's dataset: ``generate(out, size, **request)`` into a new directory ``name``; its
    value ``(out, manifest)``."""

    @pytest.fixture(scope="module")
    def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
        out = tmp_path_factory.mktemp("ds") / name
        return out, generate(out, size, **request)

    return dataset


def _refused(message: str, call: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    with pytest.raises(UserError, match=message):
        call(*args, **kwargs)


def assert_bad_requests_refused(
    generate: Generate, out: Path, minimum: int, size: int, **request: Any
) -> None:
    """``generate`` refuses, before ``out`` exists, a size under its ``minimum``, a size of
    zero, one that is not a whole number of bytes, a negative seed and no writers (``size``:
    one it takes)."""
    _refused(f"at least {minimum} bytes", generate, out, minimum - 1, **request)
    _refused("greater than zero", generate, out, 0, **request)
    _refused("whole number of bytes", generate, out, float(size), **request)
    _refused("seed", generate, out, size, seed=-1, **request)
    _refused("workers", generate, out, size, workers=0, **request)
    assert not out.exists()


@contextlib.contextmanager
def user_directory(tmp: Path) -> Iterator[Path]:
    """A dataset directory ``tmp / "ds"`` that holds a file twintrace did not write; the file
    is still there as it was when the block ends."""
    out = tmp / "ds"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    yield out
    assert (out / "precious.txt").read_text() == "keep me"


def assert_same_with_one_writer(
    generate: Generate, dataset: tuple[Path, dict], tmp: Path, size: int, **request: Any
) -> dict[str, Any]:
    """``generate(tmp / "one", size, workers=1, **request)``, one writer, writes the files of
    ``dataset`` (the same request with several writers) byte for byte; returns its manifest."""
    out = tmp / "one"
    manifest = generate(out, size, workers=1, **request)
    assert_same_data(out, dataset[0])
    return manifest


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
