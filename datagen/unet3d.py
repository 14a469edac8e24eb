"""Synthetic UNet3D dataset in the on-disk format of preprocessed KiTS19.

Each case is a pair of NumPy ``.npy`` files, exactly what the MLPerf UNet3D training reads:

- ``case_%05d_x.npy``: float32, shape (1, s1, s2, s2), the image;
- ``case_%05d_y.npy``: uint8, same shape, the label mask with values {0, 1}.

Shapes follow KiTS19 by default (s1 uniform in [128, 471], s2 in [186, 444]; mean file about
146 MB); :class:`UNet3DGenParams` makes them smaller for tests and demos.

Content is a deterministic function of (seed, case index) only: the case's shape comes from
``numpy.random.default_rng((seed, index))`` and its voxels from two child streams spawned from it,
so the bytes do not depend on the number of worker processes, the chunk size or the order in
which files are written.

- y is one ellipsoid-like blob (an ellipsoid whose in-plane boundary is perturbed by smooth
  noise), about 1-5 % of the voxels.
- x is smooth-ish noise of unit scale: each depth slice is an s2 x s2 window of one per-case
  field of 3x3 box-filtered uniform noise (2*s2 rows), the window moving by 1-3 rows from one
  slice to the next, so neighbouring slices are correlated; the voxels under the blob are 1.0
  brighter, so a model can learn the labels.

x does not compress (deflate on 128 KiB blocks, as a file system would compress, keeps 93 % of
the bytes), so a compressing file system stores what it would store for real float32 CT data; y
compresses very well, as real label masks (mostly zeros) do.

Generation is built to run at disk speed: per case, the random numbers drawn are one small
noise field and a few geometry parameters; the voxels are produced by copying windows of the
field and one comparison per voxel for the mask (1.1-1.6 GB/s of x and more of y per process on
a 2.5 GHz Xeon core, where drawing every float32 from the generator runs at about 300 MB/s). Files are written in chunks of about
16 MiB, so memory per worker stays bounded (~25 MiB) whatever the case size.
"""

from __future__ import annotations

import dataclasses
import io
import math
from functools import lru_cache
from typing import Any

import numpy as np

from core.errors import UserError
from core.units import format_size
from datagen.common import FileSink, FileTask, check_seed, check_size_bytes
from datagen.driver import Job, Written, generator

GENERATOR = "unet3d"
# Bump when the content written for a given (seed, params) changes: recorded in the manifest so
# that two datasets from the same seed can be told apart.
CONTENT_VERSION = 1

X_DTYPE = np.dtype("<f4")
Y_DTYPE = np.dtype("|u1")
# Bytes per voxel of a case: 4 (x) + 1 (y).
_VOXEL_BYTES = X_DTYPE.itemsize + Y_DTYPE.itemsize
_CHUNK_BYTES = 16 << 20
# Knots of the smooth profiles that perturb the blob's boundary, and their weight.
_BLOB_GRID = 6
_BLOB_ROUGHNESS = 0.35


@dataclasses.dataclass(frozen=True)
class UNet3DGenParams:
    """Shapes of the generated cases.

    ``s1_range`` and ``s2_range`` are inclusive bounds of the uniform draws for the depth s1 and
    the in-plane size s2 of shape (1, s1, s2, s2). ``min_dim`` is the smallest s1 or s2 the last
    case may be shrunk to so that the total lands close to the requested size; it defaults to
    128 because the reference training crops 128^3 patches and its random crop fails on a
    smaller case.
    """

    s1_range: tuple[int, int] = (128, 471)
    s2_range: tuple[int, int] = (186, 444)
    min_dim: int = 128

    def __post_init__(self) -> None:
        for name in ("s1_range", "s2_range"):
            lo_hi = getattr(self, name)
            if len(lo_hi) != 2 or not all(isinstance(v, int) for v in lo_hi):
                raise UserError(f"{name} must be two whole numbers (low, high), got {lo_hi!r}")
            lo, hi = lo_hi
            if not 1 <= lo <= hi:
                raise UserError(f"{name} must satisfy 1 <= low <= high, got {lo_hi!r}")
        if not 1 <= self.min_dim <= min(self.s1_range[0], self.s2_range[0]):
            raise UserError(
                f"min_dim must be between 1 and the smallest low bound "
                f"({min(self.s1_range[0], self.s2_range[0])}), got {self.min_dim}"
            )

    @classmethod
    def scaled(cls, factor: float) -> UNet3DGenParams:
        """The KiTS19 defaults with every dimension multiplied by ``factor`` (e.g. 0.1 for demos).

        Each dimension is rounded and kept at least 1; file sizes scale by about factor^3.
        """
        if not factor > 0:
            raise UserError(f"scale factor must be greater than zero, got {factor}")
        base = cls()

        def scale(v: int) -> int:
            return max(1, round(v * factor))

        return cls(
            s1_range=(scale(base.s1_range[0]), scale(base.s1_range[1])),
            s2_range=(scale(base.s2_range[0]), scale(base.s2_range[1])),
            min_dim=scale(base.min_dim),
        )


# --------------------------------------------------------------------------------------------
# Sizes and plan


@lru_cache(maxsize=4096)
def npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    """The ``.npy`` header ``numpy.save`` writes for a C-ordered array of this shape and dtype."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf,
        {
            "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
            "fortran_order": False,
            "shape": tuple(int(v) for v in shape),
        },
    )
    return buf.getvalue()


def case_bytes(s1: int, s2: int) -> int:
    """Total size in bytes of the x and y files of one case of shape (1, s1, s2, s2)."""
    shape = (1, s1, s2, s2)
    return (
        len(npy_header(shape, X_DTYPE.str))
        + len(npy_header(shape, Y_DTYPE.str))
        + _VOXEL_BYTES * s1 * s2 * s2
    )


def minimum_dataset_bytes(params: UNet3DGenParams | None = None) -> int:
    """The smallest size that holds one case: shape (1, min_dim, min_dim, min_dim)."""
    params = params or UNet3DGenParams()
    return case_bytes(params.min_dim, params.min_dim)


def case_shape(seed: int, index: int, params: UNet3DGenParams) -> tuple[int, int]:
    """The drawn (s1, s2) of case ``index``: a function of (seed, index) and the ranges only."""
    rng = np.random.default_rng((seed, index))
    s1 = int(rng.integers(params.s1_range[0], params.s1_range[1], endpoint=True))
    s2 = int(rng.integers(params.s2_range[0], params.s2_range[1], endpoint=True))
    return s1, s2


def plan_unet3d_cases(
    size_bytes: int, seed: int = 0, params: UNet3DGenParams | None = None
) -> list[tuple[int, int]]:
    """The (s1, s2) of every case :func:`generate_unet3d` writes for this size, seed and params.

    Cases are drawn in order while they fit; the first that does not is shrunk to fill what
    remains (depth s1 first; then also s2, both never below ``min_dim``) and is the last one.
    The total never exceeds ``size_bytes`` and falls short of it by less than about one depth
    slice of the last case (5*s2^2 bytes: under 1 MB with the default shapes), except when what
    remains after the last full case is less than a minimum case (5*min_dim^3 bytes plus
    headers: 10.5 MB by default), which is then left unused.
    """
    params = params or UNet3DGenParams()
    check_seed(seed)
    _check_size(size_bytes, params)
    cases: list[tuple[int, int]] = []
    remaining = size_bytes
    index = 0
    while True:
        s1, s2 = case_shape(seed, index, params)
        need = case_bytes(s1, s2)
        if need <= remaining:
            cases.append((s1, s2))
            remaining -= need
            index += 1
            continue
        last = _shrink_to_fit(remaining, s1, s2, params.min_dim)
        if last is not None:
            cases.append(last)
        return cases


def _shrink_to_fit(remaining: int, s1: int, s2: int, min_dim: int) -> tuple[int, int] | None:
    depth = _max_depth(remaining, s2, s1)
    if depth >= min_dim:
        return depth, s2
    # Even min_dim slices of the drawn size do not fit: shrink the slices too.
    side = min(s2, math.isqrt(max(0, remaining) // (_VOXEL_BYTES * min_dim)))
    while side >= min_dim and case_bytes(min_dim, side) > remaining:
        side -= 1
    if side < min_dim:
        return None
    return _max_depth(remaining, side, s1), side


def _max_depth(remaining: int, s2: int, cap: int) -> int:
    # Start from the estimate without headers and step down: headers are ~128 bytes each.
    depth = min(cap, remaining // (_VOXEL_BYTES * s2 * s2))
    while depth > 0 and case_bytes(depth, s2) > remaining:
        depth -= 1
    return depth


def _check_size(size_bytes: int, params: UNet3DGenParams) -> None:
    check_size_bytes(size_bytes)
    minimum = minimum_dataset_bytes(params)
    if size_bytes < minimum:
        m = params.min_dim
        raise UserError(
            f"dataset size {size_bytes} bytes ({format_size(size_bytes)}) is smaller than one "
            f"UNet3D case of the minimum shape (1, {m}, {m}, {m}): ask for at least "
            f"{minimum} bytes ({format_size(minimum)}), or use smaller shapes"
        )


# --------------------------------------------------------------------------------------------
# Content


@dataclasses.dataclass(frozen=True)
class _Blob:
    depth_level: np.ndarray  # (s1,) float32: slice z holds voxels with plane_dist < level[z]
    plane_dist: np.ndarray  # (s2, s2) float32: in-plane distance to the blob axis, perturbed


def _streams(seed: int, index: int) -> tuple[np.random.Generator, np.random.Generator]:
    # Children of the case's generator: independent of how many draws the shape took (integer
    # draws use rejection sampling, so that count depends on the ranges).
    geometry, noise = np.random.default_rng((seed, index)).spawn(2)
    return geometry, noise


def _blob(rng: np.random.Generator, s1: int, s2: int) -> _Blob:
    dims = np.array([s1, s2, s2], dtype=np.float64)
    centre = rng.uniform(0.35, 0.65, 3) * dims
    radii = np.maximum(rng.uniform(0.12, 0.3, 3) * dims, 1.0)
    z = (np.arange(s1) + 0.5 - centre[0]) / radii[0]
    y = (np.arange(s2) + 0.5 - centre[1]) / radii[1]
    x = (np.arange(s2) + 0.5 - centre[2]) / radii[2]
    # The boundary is perturbed by one smooth 1D profile per in-plane axis: an outer sum costs
    # one pass over the slice, where a full 2D smooth field costs many (and BLAS is slow at
    # these thin shapes).
    rough_y = _smooth_profile(rng, s2) * _BLOB_ROUGHNESS
    rough_x = _smooth_profile(rng, s2) * _BLOB_ROUGHNESS
    plane = (y**2 + rough_y).astype(np.float32)[:, None] + (x**2 + rough_x).astype(np.float32)
    return _Blob(depth_level=(1.0 - z**2).astype(np.float32), plane_dist=plane)


def _smooth_profile(rng: np.random.Generator, n: int) -> np.ndarray:
    # Linear interpolation of a few random knots: values in [0, 1), smooth at voxel scale.
    knots = rng.random(_BLOB_GRID + 1)
    return np.interp(np.arange(n) + 0.5, np.linspace(0, n, _BLOB_GRID + 1), knots)


def _noise_field(rng: np.random.Generator, s2: int) -> np.ndarray:
    u = rng.random((2 * s2 + 2, s2 + 2), dtype=np.float32)
    rows = u[:-2] + u[1:-1] + u[2:]
    box = rows[:, :-2] + rows[:, 1:-1] + rows[:, 2:]
    # Sum of 9 U(0,1): mean 4.5, standard deviation 3/sqrt(12) = sqrt(0.75): rescale to unit.
    field = (box - np.float32(4.5)) * np.float32(1.0 / math.sqrt(0.75))
    return np.ascontiguousarray(field, dtype=X_DTYPE)


def _window_offsets(rng: np.random.Generator, s1: int, s2: int) -> np.ndarray:
    start = int(rng.integers(0, s2 + 1))
    steps = rng.integers(1, 4, size=s1)
    return (start + np.cumsum(steps) - steps[0]) % (s2 + 1)


def _chunk_slices(s2: int, itemsize: int) -> int:
    return max(1, _CHUNK_BYTES // (s2 * s2 * itemsize))


def write_case_x(sink: FileSink, seed: int, index: int, s1: int, s2: int) -> dict[str, Any]:
    """Write the image ``case_<index>_x.npy`` of shape (1, s1, s2, s2) through ``sink``."""
    geometry, noise = _streams(seed, index)
    blob = _blob(geometry, s1, s2)
    field = _noise_field(noise, s2)
    offsets = _window_offsets(noise, s1, s2)
    shape = (1, s1, s2, s2)
    sink.write(npy_header(shape, X_DTYPE.str))
    k = min(s1, _chunk_slices(s2, X_DTYPE.itemsize))
    buf = np.empty((k, s2, s2), dtype=X_DTYPE)
    mask = np.empty((k, s2, s2), dtype=np.bool_)
    for z0 in range(0, s1, k):
        n = min(k, s1 - z0)
        for j in range(n):
            o = offsets[z0 + j]
            buf[j] = field[o : o + s2]
        np.less(blob.plane_dist, blob.depth_level[z0 : z0 + n, None, None], out=mask[:n])
        np.add(buf[:n], mask[:n], out=buf[:n])
        sink.write(buf[:n])
    return {"shape": list(shape), "dtype": "float32"}


def write_case_y(sink: FileSink, seed: int, index: int, s1: int, s2: int) -> dict[str, Any]:
    """Write the label mask ``case_<index>_y.npy`` of shape (1, s1, s2, s2) through ``sink``."""
    geometry, _ = _streams(seed, index)
    blob = _blob(geometry, s1, s2)
    shape = (1, s1, s2, s2)
    sink.write(npy_header(shape, Y_DTYPE.str))
    k = min(s1, _chunk_slices(s2, Y_DTYPE.itemsize))
    mask = np.empty((k, s2, s2), dtype=np.bool_)
    for z0 in range(0, s1, k):
        n = min(k, s1 - z0)
        np.less(blob.plane_dist, blob.depth_level[z0 : z0 + n, None, None], out=mask[:n])
        # bool and uint8 share the byte values 0 and 1: the bytes are the uint8 labels.
        sink.write(mask[:n].view(np.uint8))
    return {"shape": list(shape), "dtype": "uint8"}


# --------------------------------------------------------------------------------------------
# Generator


def unet3d_tasks(cases: list[tuple[int, int]], seed: int) -> list[FileTask]:
    """The file-writing tasks (x then y, case by case) for a plan from :func:`plan_unet3d_cases`."""
    tasks = []
    for index, (s1, s2) in enumerate(cases):
        voxels = s1 * s2 * s2
        shape = (1, s1, s2, s2)
        for suffix, write, dtype in (("x", write_case_x, X_DTYPE), ("y", write_case_y, Y_DTYPE)):
            tasks.append(
                FileTask(
                    name=f"case_{index:05d}_{suffix}.npy",
                    write=write,
                    args=(seed, index, s1, s2),
                    size_hint=len(npy_header(shape, dtype.str)) + voxels * dtype.itemsize,
                )
            )
    return tasks


@generator(GENERATOR, UNet3DGenParams)
def generate_unet3d(job: Job, params: UNet3DGenParams) -> dict[str, Any]:
    """Generate a UNet3D dataset of about ``size_bytes`` in ``out`` and return its manifest.

    The cases are those of :func:`plan_unet3d_cases` (the total is at most ``size_bytes`` and
    short of it by at most about one depth slice, see there), one file task per array.
    """

    def write(cases: list[tuple[int, int]]) -> Written:
        files = job.run(unet3d_tasks(cases, job.seed))
        return files, {
            **dataclasses.asdict(params),
            "cases": len(cases),
            "content_version": CONTENT_VERSION,
        }

    return job.generate(lambda: plan_unet3d_cases(job.size_bytes, job.seed, params), write)
