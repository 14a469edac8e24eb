"""The DLRM dataset on disk (Criteo Terabyte, MLPerf binary format): layout, checks, decoding.

numpy and the standard library only, so the host can check a dataset without torch. Layout of a
dataset directory, as the MLPerf reference's binary loader (``CriteoBinDataset``) reads it:

- ``train_data.bin``: fixed 160-byte records, no header; each record is 40 little-endian int32:
  the label (0 or 1), 13 dense integer features, 26 categorical indices;
- ``test_data.bin``: the same format (the evaluation split);
- ``day_fea_count.npz``: key ``counts``, an int64 array of the 26 per-feature category counts
  (the embedding table sizes before ``max_ind_range``).

A training step reads ``batch_size`` consecutive records with one read at a batch-aligned offset
and decodes them as the reference does: dense features ``log(x + 1)`` (x clipped at 0),
categorical indices modulo ``max_ind_range`` when it is positive, labels as float.
"""

from __future__ import annotations

import dataclasses
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from core.errors import UserError
from workloads.data import DataSummary, data_directory

DENSE = 13
SPARSE = 26
FIELDS = 1 + DENSE + SPARSE
RECORD_DTYPE = np.dtype("<i4")
RECORD_BYTES = FIELDS * RECORD_DTYPE.itemsize  # 160
TRAIN_NAME = "train_data.bin"
TEST_NAME = "test_data.bin"
COUNTS_NAME = "day_fea_count.npz"
COUNTS_KEY = "counts"
REGENERATE = "regenerate it with ./cli.py datagen dlrm"
DATA_FORMAT = (
    f"{TRAIN_NAME} and {TEST_NAME}: 160-byte records of 40 little-endian int32 (label, "
    f"13 dense features, 26 categorical indices); {COUNTS_NAME}: int64 'counts' of the 26 "
    "categorical features, as the MLPerf DLRM binary loader (Criteo Terabyte) reads"
)


@dataclasses.dataclass(frozen=True)
class DLRMData:
    """A checked DLRM dataset: its two record files, category counts and record numbers."""

    train: Path
    test: Path
    counts: tuple[int, ...]
    train_records: int
    test_records: int


def load_counts(path: Path) -> tuple[int, ...]:
    """The 26 category counts from ``day_fea_count.npz``; a UserError when it is unusable."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            if COUNTS_KEY not in npz:
                raise UserError(f"{path} has no '{COUNTS_KEY}' array: {REGENERATE}")
            counts = npz[COUNTS_KEY]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise UserError(f"cannot read {path} ({exc}): {REGENERATE}") from None
    if counts.shape != (SPARSE,) or counts.dtype.kind not in "iu":
        raise UserError(
            f"{path} holds {counts.dtype} {counts.shape} counts, expected {SPARSE} integers: "
            f"{REGENERATE}"
        )
    if counts.min() < 1 or counts.max() > np.iinfo(np.int32).max:
        raise UserError(
            f"{path} has a category count outside 1..2^31-1 ({counts.min()}..{counts.max()}): "
            f"{REGENERATE}"
        )
    return tuple(int(c) for c in counts)


def _records(path: Path) -> int:
    if not path.is_file():
        raise UserError(f"DLRM data file {path} is missing: {REGENERATE}")
    size = path.stat().st_size
    if size == 0 or size % RECORD_BYTES:
        raise UserError(
            f"{path} is {size} bytes, not a positive multiple of the {RECORD_BYTES}-byte record "
            f"(truncated or not DLRM data): {REGENERATE}"
        )
    return size // RECORD_BYTES


def load_dataset(data_dir: str | Path) -> DLRMData:
    """Check the files of the DLRM dataset in ``data_dir`` (sizes and counts; no data read)."""
    data_dir = data_directory(data_dir, "DLRM", "dlrm")
    counts_path = data_dir / COUNTS_NAME
    if not counts_path.is_file():
        raise UserError(f"DLRM category counts {counts_path} are missing: {REGENERATE}")
    counts = load_counts(counts_path)
    train, test = data_dir / TRAIN_NAME, data_dir / TEST_NAME
    return DLRMData(
        train=train,
        test=test,
        counts=counts,
        train_records=_records(train),
        test_records=_records(test),
    )


def check_dataset(data_dir: str | Path) -> DataSummary:
    """Validate ``data_dir`` quickly (see :func:`load_dataset`); items are the train records."""
    data = load_dataset(data_dir)
    files = (data.train, data.test, Path(data_dir) / COUNTS_NAME)
    return DataSummary(
        items=data.train_records,
        files=len(files),
        bytes=sum(p.stat().st_size for p in files),
    )


class RecordError(ValueError):
    """A decoded record holds an impossible value; ``record`` is its index in the batch."""

    def __init__(self, record: int, message: str) -> None:
        super().__init__(message)
        self.record = record


def table_sizes(counts: Sequence[int], max_ind_range: int = 0) -> np.ndarray:
    """Rows of each embedding table: the counts, capped at ``max_ind_range`` when positive."""
    sizes = np.asarray(counts, dtype=np.int64)
    return np.minimum(sizes, max_ind_range) if max_ind_range > 0 else sizes


def decode_batch(
    raw: bytes | bytearray | memoryview,
    counts: Sequence[int] | None,
    max_ind_range: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode whole records as the MLPerf binary loader does: (dense, sparse, labels).

    ``dense`` float32 (B, 13) = log(x + 1) of the features clipped at 0; ``sparse`` int64
    (B, 26), modulo ``max_ind_range`` when it is positive (0 or negative: as stored, like the
    reference's -1); ``labels`` float32 (B,). With ``counts``, labels are checked to be 0 or 1
    and every index to fall in its table (:func:`table_sizes`), so corrupt data fails here,
    with :class:`RecordError` (the caller turns its record number into a file offset) rather
    than as an index error deep in the model.
    """
    if len(raw) % RECORD_BYTES:
        raise ValueError(f"{len(raw)} bytes is not a whole number of {RECORD_BYTES}-byte records")
    records = np.frombuffer(raw, dtype=RECORD_DTYPE).reshape(-1, FIELDS)
    # float32 like the reference's torch.float; x + 1 is exact below 2^24.
    dense = np.maximum(records[:, 1 : 1 + DENSE], 0).astype(np.float32)
    np.log(np.add(dense, 1, out=dense), out=dense)
    sparse = records[:, 1 + DENSE :].astype(np.int64)
    if max_ind_range > 0:
        np.remainder(sparse, max_ind_range, out=sparse)
    labels = records[:, 0].astype(np.float32)
    if counts is not None:
        not_binary = (labels != 0) & (labels != 1)
        if not_binary.any():
            row = int(np.argmax(not_binary))
            raise RecordError(row, f"label {records[row, 0]} is not 0 or 1")
        limit = table_sizes(counts, max_ind_range)
        bad = (sparse < 0) | (sparse >= limit)
        if bad.any():
            row, col = (int(v) for v in np.argwhere(bad)[0])
            raise RecordError(
                row,
                f"categorical feature {col} has index {sparse[row, col]}, outside its table of "
                f"{limit[col]} rows",
            )
    return dense, sparse, labels
