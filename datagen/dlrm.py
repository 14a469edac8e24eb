"""Synthetic DLRM dataset in the MLPerf binary format of Criteo Terabyte.

Files (see :mod:`workloads.dlrm.files`): ``train_data.bin`` and ``test_data.bin``, 160-byte
records of 40 little-endian int32 (label, 13 dense features, 26 categorical indices), and
``day_fea_count.npz`` (int64 ``counts`` of the 26 categorical features). The size is split in
whole records: the test file gets ``test_fraction`` of them (at least ``min_records``), the
train file the rest; what remains is less than one record.

Content, drawn independently per record:

- label: Bernoulli(``positive_rate``), 3.4 % by default (Criteo Terabyte's clicks are a few %);
- dense feature j: floor of a Lomax (Pareto II) variable with median ``dense_medians[j]`` and
  tail index ``dense_tail``, drawn from 16 random bits: non-negative, heavy-tailed counts (the
  largest about 1600 times the median by default) with many zeros where the median is at most 1,
  as Criteo's missing values; magnitudes loosely follow Criteo's integer features;
- categorical feature j: ``floor((counts[j] + 1) ** u) - 1`` for u uniform in [0, 1): log-uniform
  over [0, counts[j]), i.e. P(i) proportional to log(1 + 1/(i + 1)), about 1/(i + 1) - a Zipf
  skew with exponent 1 where small indices are the popular categories (the MLPerf preprocessing
  numbers categories in order of first appearance, so frequent ones tend to get small indices).

Each file is written in parts of ``part_records`` records by several processes at once (one
shared file, see :func:`datagen.common.run_file_tasks`). A part's bytes are a function of
(seed, file, part index) only: its own SFC64 stream, 17 raw 64-bit words per record consumed in
record order, so the output does not depend on the number of workers or the chunk size. The
floating-point steps use numpy's exp and log, whose last bit may differ between CPUs (SIMD
paths), so byte-identical output is promised on one machine, not across machines.

Speed: the random words come straight from the bit generator (no per-value conversion); every
step is one vectorised numpy operation over a chunk of records small enough to stay in cache.
About 370 MB/s of records per process on a 2.5 GHz Xeon core (the bit generator is a quarter of
it), 320 MB/s with the writes, so two processes keep up with a disk of ~500 MB/s.
"""

from __future__ import annotations

import dataclasses
import io
import math
import zipfile
from typing import Any

import numpy as np

from core.errors import UserError
from core.units import format_size
from datagen.common import FileSink, FileTask, check_size_bytes
from datagen.driver import Job, Written, generator
from workloads.dlrm.files import (
    COUNTS_KEY,
    COUNTS_NAME,
    DENSE,
    FIELDS,
    RECORD_BYTES,
    RECORD_DTYPE,
    SPARSE,
    TEST_NAME,
    TRAIN_NAME,
)

GENERATOR = "dlrm"
# Bump when the content written for a given (seed, params) changes: recorded in the manifest.
CONTENT_VERSION = 1

# Criteo Terabyte per-feature category counts as MLPerf uses them (max_ind_range 40M).
CRITEO_TB_COUNTS: tuple[int, ...] = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
    2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)  # fmt: skip
# Medians of the continuous dense variables before flooring (the features' medians are about
# floor(m)): orders of magnitude loosely after Criteo's integer features, one in the thousands.
DENSE_MEDIANS: tuple[float, ...] = (
    1.0, 3.0, 6.0, 4.0, 2800.0, 33.0, 3.0, 8.0, 40.0, 0.7, 1.0, 0.3, 4.0,
)  # fmt: skip

# Streams of the two record files (part of each part's seed).
_TRAIN_STREAM, _TEST_STREAM = 1, 2
# Raw 64-bit words per record, read as: uint32 0 the label draw; uint16 2-14 the 13 dense draws
# (uint16 15 unused); uint32 8-33 the 26 categorical draws. 16 bits are plenty for the dense
# quantiles, and every word saved is ~4 ns per record (the bit generator is the largest cost).
_WORDS = 17
_DENSE_U16 = 2
_SPARSE_U32 = 8
# Levels of a dense draw.
_DENSE_LEVELS = 2**16
# Dense values stay below this, so a float32 rounding error cannot push one past int32.
_DENSE_LIMIT = 2**30
# Records per chunk: the working arrays (~600 kB with the tiled constants) stay in L2 cache.
_CHUNK_RECORDS = 1024


@dataclasses.dataclass(frozen=True)
class DLRMGenParams:
    """What the generated DLRM data looks like (see the module docstring).

    - ``counts``: categories of each of the 26 categorical features (written to the .npz);
    - ``test_fraction``: share of the records in the test file, in (0, 0.5];
    - ``min_records``: each file holds at least this many records: make it at least the largest
      batch size you will train or evaluate with (a file shorter than one batch is refused);
    - ``positive_rate``: probability of label 1;
    - ``dense_medians`` (13 values > 0) and ``dense_tail`` (> 0; lower is heavier): the Lomax
      distributions of the dense features;
    - ``part_records``: records per part, the unit of parallel writing and of determinism.
    """

    counts: tuple[int, ...] = CRITEO_TB_COUNTS
    test_fraction: float = 1 / 64
    min_records: int = 4096
    positive_rate: float = 0.034
    dense_medians: tuple[float, ...] = DENSE_MEDIANS
    dense_tail: float = 1.5
    part_records: int = 1 << 18

    def __post_init__(self) -> None:
        # Accept lists (from JSON/TOML) but store tuples: the params stay hashable.
        for name in ("counts", "dense_medians"):
            value = getattr(self, name)
            if not isinstance(value, tuple | list):
                raise UserError(f"{name} must be a list of numbers, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        for name in ("test_fraction", "positive_rate", "dense_tail"):
            if not _is_number(getattr(self, name)):
                raise UserError(f"{name} must be a number, got {getattr(self, name)!r}")
        if len(self.counts) != SPARSE or not all(_is_int(c) for c in self.counts):
            raise UserError(f"counts must be {SPARSE} whole numbers, got {self.counts!r}")
        if not all(1 <= c <= 2**31 - 1 for c in self.counts):
            raise UserError(
                f"each of counts must be between 1 and 2^31-1 (int32 indices), got {self.counts!r}"
            )
        if not 0 < self.test_fraction <= 0.5:
            raise UserError(f"test_fraction must be in (0, 0.5], got {self.test_fraction!r}")
        if not _is_int(self.min_records) or self.min_records < 1:
            raise UserError(f"min_records must be a whole number >= 1, got {self.min_records!r}")
        if not 0 <= self.positive_rate <= 1:
            raise UserError(f"positive_rate must be in [0, 1], got {self.positive_rate!r}")
        if len(self.dense_medians) != DENSE or not all(
            _is_number(m) and 0 < m < 1e9 for m in self.dense_medians
        ):
            raise UserError(
                f"dense_medians must be {DENSE} numbers in (0, 1e9), got {self.dense_medians!r}"
            )
        if not 0.1 <= self.dense_tail <= 100:
            raise UserError(f"dense_tail must be in [0.1, 100], got {self.dense_tail!r}")
        if dense_max(self) >= _DENSE_LIMIT:
            raise UserError(
                f"dense_medians up to {max(self.dense_medians)} with dense_tail "
                f"{self.dense_tail} reach {dense_max(self):.3g}, beyond int32 dense features: "
                "lower the medians or raise dense_tail"
            )
        if not _is_int(self.part_records) or self.part_records < 1:
            raise UserError(f"part_records must be a whole number >= 1, got {self.part_records!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------------
# Sizes and plan


def counts_npz(counts: tuple[int, ...]) -> bytes:
    """The bytes of ``day_fea_count.npz``: what ``np.savez(f, counts=...)`` holds, byte-stable.

    Written by hand because ``np.savez`` stamps the current time into the zip entry, which
    would make two datasets from the same seed differ.
    """
    npy = io.BytesIO()
    np.lib.format.write_array(npy, np.asarray(counts, dtype="<i8"), allow_pickle=False)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(
            zipfile.ZipInfo(f"{COUNTS_KEY}.npy", date_time=(1980, 1, 1, 0, 0, 0)), npy.getvalue()
        )
    return buf.getvalue()


@dataclasses.dataclass(frozen=True)
class DLRMPlan:
    """Records of each file and the size of the counts file for one request."""

    train_records: int
    test_records: int
    counts_bytes: int

    @property
    def total_bytes(self) -> int:
        """Bytes of the three files together."""
        return (self.train_records + self.test_records) * RECORD_BYTES + self.counts_bytes


def minimum_dataset_bytes(params: DLRMGenParams | None = None) -> int:
    """The smallest size that holds ``min_records`` records in each file, and the counts."""
    params = params or DLRMGenParams()
    return 2 * params.min_records * RECORD_BYTES + len(counts_npz(params.counts))


def plan_dlrm(size_bytes: int, params: DLRMGenParams | None = None) -> DLRMPlan:
    """How :func:`generate_dlrm` splits ``size_bytes``: at most it, short of it by < 160 bytes."""
    params = params or DLRMGenParams()
    check_size_bytes(size_bytes)
    minimum = minimum_dataset_bytes(params)
    if size_bytes < minimum:
        raise UserError(
            f"dataset size {size_bytes} bytes ({format_size(size_bytes)}) cannot hold "
            f"{params.min_records} records in both the train and the test file: ask for at "
            f"least {minimum} bytes ({format_size(minimum)}), or lower min_records"
        )
    counts_bytes = len(counts_npz(params.counts))
    records = (size_bytes - counts_bytes) // RECORD_BYTES
    # test_fraction <= 0.5 and records >= 2 * min_records leave train >= min_records.
    test = max(params.min_records, round(records * params.test_fraction))
    return DLRMPlan(train_records=records - test, test_records=test, counts_bytes=counts_bytes)


# --------------------------------------------------------------------------------------------
# Content


def _dense_scales(params: DLRMGenParams) -> np.ndarray:
    # Lomax: y = scale * (w^(-1/tail) - 1) for w in (0, 1]; its median is
    # scale * (2^(1/tail) - 1).
    medians = np.asarray(params.dense_medians, dtype=np.float64)
    return medians / (2 ** (1 / params.dense_tail) - 1)


def dense_max(params: DLRMGenParams) -> float:
    """The largest dense value the params can produce (w = 2^-16, the smallest 16-bit draw)."""
    return float(_dense_scales(params).max() * (_DENSE_LEVELS ** (1 / params.dense_tail) - 1))


class _RecordMaker:
    """Turns raw random words into records, reusing its buffers from chunk to chunk.

    Each step is one numpy operation over a whole chunk. Per-feature constants are tiled to the
    chunk's shape: an operation between two arrays of the same shape runs as one long loop,
    where broadcasting a (13,) or (26,) row makes numpy run one short loop per record (several
    times slower).
    """

    def __init__(self, params: DLRMGenParams, chunk: int) -> None:
        scale = _dense_scales(params)
        a = -1 / params.dense_tail
        # w = (v + 1) / 2^16 for a 16-bit draw v, so a * log(w) + log(scale) is
        # a * log(v + 1) + (log(scale) - a * log(2^16)).
        self.dense_a = np.float32(a)
        self.dense_b = np.tile(np.log(scale) - a * math.log(_DENSE_LEVELS), (chunk, 1)).astype(
            np.float32
        )
        self.dense_scale = np.tile(scale, (chunk, 1)).astype(np.float32)
        # (1 - 1e-12) keeps exp(u * log(count + 1)) below count + 1 for every u < 2^32 despite
        # rounding (float64 errors are ~1e-16 relative), so no index reaches count.
        counts = np.asarray(params.counts, dtype=np.float64)
        self.sparse_scale = np.tile(np.log(counts + 1) * (1 - 1e-12) / 2**32, (chunk, 1))
        # uint64: a rate of 1 needs the threshold 2^32, above every uint32 draw.
        self.label_threshold = np.uint64(round(params.positive_rate * 2**32))
        self.out = np.empty((chunk, FIELDS), dtype=RECORD_DTYPE)
        self.dense = np.empty((chunk, DENSE), dtype=np.float32)
        self.sparse = np.empty((chunk, SPARSE), dtype=np.float64)

    def make(self, bitgen: np.random.BitGenerator, n: int) -> np.ndarray:
        """The next ``n`` records of ``bitgen``'s stream, as an (n, 40) int32 array."""
        words = bitgen.random_raw(n * _WORDS)
        u32 = words.view(np.uint32).reshape(n, 2 * _WORDS)
        u16 = words.view(np.uint16).reshape(n, 4 * _WORDS)
        out, dense, sparse = self.out[:n], self.dense[:n], self.sparse[:n]
        np.less(u32[:, 0], self.label_threshold, out=out[:, 0], casting="unsafe")
        # Dense: Lomax of w = (v + 1) / 2^16, values in [0, dense_max] (checked to fit int32).
        dense[...] = u16[:, _DENSE_U16 : _DENSE_U16 + DENSE]
        np.add(dense, 1, out=dense)
        np.log(dense, out=dense)
        np.multiply(dense, self.dense_a, out=dense)
        np.add(dense, self.dense_b[:n], out=dense)
        np.exp(dense, out=dense)
        np.subtract(dense, self.dense_scale[:n], out=dense)
        # The cast truncates toward zero: the floor of y >= 0, and 0 for the rounding error
        # (|y| < 1) of w = 1.
        out[:, 1 : 1 + DENSE] = dense
        # Categorical: floor(exp(u * log(count + 1)) - 1), in [0, count). exp(x) - 1 is exact
        # for exp(x) >= 1, so truncating it is floor(exp(x)) - 1.
        sparse[...] = u32[:, _SPARSE_U32 : _SPARSE_U32 + SPARSE]
        np.multiply(sparse, self.sparse_scale[:n], out=sparse)
        np.exp(sparse, out=sparse)
        np.subtract(sparse, 1, out=sparse)
        out[:, 1 + DENSE :] = sparse
        return out


def part_bitgen(seed: int, stream: int, part: int) -> np.random.BitGenerator:
    """The bit generator of one part of one file: a function of these three numbers only."""
    return np.random.SFC64(np.random.SeedSequence([seed, stream, part]))


def write_records(
    sink: FileSink, seed: int, stream: int, part: int, records: int, params: DLRMGenParams
) -> dict[str, Any]:
    """Write ``records`` records of part ``part`` of file ``stream`` through ``sink``."""
    bitgen = part_bitgen(seed, stream, part)
    maker = _RecordMaker(params, min(records, _CHUNK_RECORDS))
    for start in range(0, records, _CHUNK_RECORDS):
        sink.write(maker.make(bitgen, min(_CHUNK_RECORDS, records - start)))
    return {}


def write_counts(sink: FileSink, counts: tuple[int, ...]) -> dict[str, Any]:
    """Write ``day_fea_count.npz`` through ``sink``."""
    sink.write(counts_npz(counts))
    return {}


# --------------------------------------------------------------------------------------------
# Generator


def dlrm_tasks(plan: DLRMPlan, seed: int, params: DLRMGenParams) -> list[FileTask]:
    """The file-writing tasks for a plan: each record file in parts, then the counts."""
    tasks = []
    for name, stream, records in (
        (TRAIN_NAME, _TRAIN_STREAM, plan.train_records),
        (TEST_NAME, _TEST_STREAM, plan.test_records),
    ):
        for part, start in enumerate(range(0, records, params.part_records)):
            n = min(params.part_records, records - start)
            tasks.append(
                FileTask(
                    name=name,
                    write=write_records,
                    args=(seed, stream, part, n, params),
                    size_hint=n * RECORD_BYTES,
                    part=(start * RECORD_BYTES, n * RECORD_BYTES),
                )
            )
    tasks.append(FileTask(COUNTS_NAME, write_counts, (params.counts,), size_hint=plan.counts_bytes))
    return tasks


@generator(GENERATOR, DLRMGenParams)
def generate_dlrm(job: Job, params: DLRMGenParams) -> dict[str, Any]:
    """Generate a DLRM dataset of about ``size_bytes`` in ``out`` and return its manifest.

    The split is that of :func:`plan_dlrm` (at most ``size_bytes``, short of it by less than
    one record); the record files are written in parts, by all the workers at once.
    """

    def write(plan: DLRMPlan) -> Written:
        files = job.run(dlrm_tasks(plan, job.seed, params))
        for entry in files:
            if entry["name"] in (TRAIN_NAME, TEST_NAME):
                entry["records"] = entry["bytes"] // RECORD_BYTES
        return files, {
            **dataclasses.asdict(params),
            "train_records": plan.train_records,
            "test_records": plan.test_records,
            "record_bytes": RECORD_BYTES,
            "parts": math.ceil(plan.train_records / params.part_records)
            + math.ceil(plan.test_records / params.part_records),
            "content_version": CONTENT_VERSION,
        }

    return job.generate(lambda: plan_dlrm(job.size_bytes, params), write)
