"""Where files lie on the disk: their extents (FIEMAP) as byte ranges of the block device a
block trace names, so that block requests can be told to read those files or something else.

:func:`disk_extents` places a set of files of one file system on its disk (:class:`DiskExtents`,
sorted and disjoint ranges, and :meth:`DiskExtents.overlap`, the bytes of each request inside
them; :meth:`DiskExtents.event_bytes`, the same for rows of a run's events); it returns None where that cannot be known: a file system on no disk or partition
(device mapper, network, tmpfs) or without FIEMAP. The studies place their datasets with it
(``experiments.study_state.dataset_extents``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

# FIEMAP (linux/fiemap.h): the header (start, length, flags, mapped, count, reserved), then
# extents (logical, physical, length, 2 reserved, flags, 3 reserved).
_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 0x1
_FIEMAP_EXTENT_LAST = 0x1
_FIEMAP_EXTENT_UNKNOWN = 0x2
_FIEMAP_EXTENT_INLINE = 0x200
_FIEMAP_HEAD = struct.Struct("=QQIIII")
_FIEMAP_EXTENT = struct.Struct("=QQQQQIIII")
_FIEMAP_BATCH = 64


@dataclasses.dataclass(frozen=True)
class DiskExtents:
    """Byte ranges ``[starts[i], ends[i])`` of block device ``dev`` (``major:minor``, as block
    events name it) holding a set of files' data: sorted, disjoint."""

    dev: str
    starts: np.ndarray
    ends: np.ndarray

    @property
    def bytes(self) -> int:
        return int((self.ends - self.starts).sum())

    def overlap(self, offset: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Bytes of each request ``[offset, offset + size)`` that lie in the extents."""
        lengths = self.ends - self.starts
        below = np.concatenate([[0], np.cumsum(lengths)])

        def covered(x: np.ndarray) -> np.ndarray:
            # Bytes of the extents below device byte x.
            i = np.searchsorted(self.starts, x, side="right") - 1
            inside = np.minimum(x - self.starts[np.maximum(i, 0)], lengths[np.maximum(i, 0)])
            return np.where(i >= 0, below[np.maximum(i, 0)] + inside, 0)

        return covered(offset + size) - covered(offset)

    def event_bytes(self, events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
        """Bytes in the extents of each of ``events``' rows: of the block requests of this
        disk (``dev``, ``offset``, ``bytes``) among ``rows`` (a bool mask), 0 for any other."""
        rows = rows & events["dev"].eq(self.dev).to_numpy(dtype=bool, na_value=False)
        found = np.zeros(len(events), dtype=np.int64)
        found[rows] = self.overlap(
            events["offset"].to_numpy(dtype=np.int64)[rows],
            events["bytes"].to_numpy(dtype=np.int64)[rows],
        )
        return found


def file_extents(path: Path) -> list[tuple[int, int]]:
    """(physical byte offset on the file system's device, length) of each extent of ``path``
    (FIEMAP, after writing the file back); extents without a location are left out."""
    extents: list[tuple[int, int]] = []
    start = 0
    with open(path, "rb") as f:
        while True:
            buf = bytearray(_FIEMAP_HEAD.size + _FIEMAP_BATCH * _FIEMAP_EXTENT.size)
            _FIEMAP_HEAD.pack_into(
                buf, 0, start, (1 << 64) - 1, _FIEMAP_FLAG_SYNC, 0, _FIEMAP_BATCH, 0
            )
            fcntl.ioctl(f.fileno(), _FS_IOC_FIEMAP, buf, True)
            mapped = _FIEMAP_HEAD.unpack_from(buf)[3]
            last = mapped == 0
            for k in range(mapped):
                logical, physical, length, _, _, flags, *_ = _FIEMAP_EXTENT.unpack_from(
                    buf, _FIEMAP_HEAD.size + k * _FIEMAP_EXTENT.size
                )
                if not flags & (_FIEMAP_EXTENT_UNKNOWN | _FIEMAP_EXTENT_INLINE):
                    extents.append((physical, length))
                start = logical + length
                last = last or bool(flags & _FIEMAP_EXTENT_LAST)
            if last:
                return extents


def _device_of(path: Path) -> tuple[str, int] | None:
    """(the whole disk's ``major:minor``, the byte offset of the file system on it) for a file
    system on a disk or a partition; None for anything else (device mapper, network, tmpfs),
    where file offsets cannot be placed on a device the block trace names."""
    st = os.stat(path)
    sys_dir = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if (
        not sys_dir.exists()
        or (sys_dir / "dm").exists()
        or (sys_dir / "slaves").exists()
        and any((sys_dir / "slaves").iterdir())
    ):
        return None
    if (sys_dir / "partition").exists():
        start = int((sys_dir / "start").read_text()) * 512
        return (sys_dir.resolve().parent / "dev").read_text().strip(), start
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", 0


def disk_extents(root: Path, files: Iterable[Path]) -> DiskExtents | None:
    """Where ``files`` (on the file system of ``root``) lie on the disk: :func:`file_extents`
    of each, merged; None where that cannot be known (see :func:`_device_of`, or a file
    system without FIEMAP) or when they hold no located extent."""
    device = _device_of(root)
    if device is None:
        return None
    dev, base = device
    pieces: list[tuple[int, int]] = []
    try:
        for path in files:
            pieces.extend(file_extents(path))
    except OSError:  # no FIEMAP on this file system
        return None
    if not pieces:
        return None
    spans = np.array(sorted(pieces), dtype=np.int64)
    starts, ends = spans[:, 0] + base, spans[:, 0] + spans[:, 1] + base
    # Merge touching and overlapping extents: disjoint, sorted ranges.
    reach = np.maximum.accumulate(ends)
    new = np.concatenate([[True], starts[1:] > reach[:-1]])
    group = np.cumsum(new) - 1
    merged_ends = np.zeros(int(new.sum()), dtype=np.int64)
    np.maximum.at(merged_ends, group, ends)
    return DiskExtents(dev, starts[new], merged_ends)


__all__ = ["DiskExtents", "disk_extents", "file_extents"]
