"""Listing and quick validation of a BERT dataset directory (no torch).

Layout (MLPerf BERT pre-training, as the reference's TFRecordDataset reads it): TFRecord files
``part-%05d-of-%05d`` of serialized ``tf.train.Example`` with the features of :data:`FEATURES`.
Other files in the directory are ignored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from core.errors import UserError
from workloads.bert.records import (
    FOOTER_BYTES,
    HEADER_BYTES,
    REGENERATE,
    corrupt,
    iter_records,
    parse_example,
    read_header,
)
from workloads.data import DataSummary, data_directory

SHARD_RE = re.compile(r"^part-(\d{5})-of-(\d{5})$")
SHARD_FORMAT = "part-%05d-of-%05d"
DATA_FORMAT = (
    "directory of TFRecord shards part-%05d-of-%05d holding tf.train.Example records with "
    "input_ids, input_mask, segment_ids (int64 x seq_length), masked_lm_positions, masked_lm_ids "
    "(int64 x max_predictions), masked_lm_weights (float x max_predictions) and "
    "next_sentence_labels (int64 x 1), as the MLPerf BERT reference reads"
)
# Feature name -> (kind, length key): the MLPerf reference's FixedLenFeature spec; the length is
# seq_length or max_predictions (see read_shape), or one.
FEATURES: dict[str, tuple[str, str]] = {
    "input_ids": ("int64", "seq_length"),
    "input_mask": ("int64", "seq_length"),
    "segment_ids": ("int64", "seq_length"),
    "masked_lm_positions": ("int64", "max_predictions"),
    "masked_lm_ids": ("int64", "max_predictions"),
    "masked_lm_weights": ("float", "max_predictions"),
    "next_sentence_labels": ("int64", "one"),
}


def list_shards(data_dir: str | Path) -> list[Path]:
    """The ``part-NNNNN-of-NNNNN`` files of ``data_dir``, sorted by name."""
    data_dir = data_directory(data_dir, "BERT", "bert")
    shards = sorted(p for p in data_dir.iterdir() if SHARD_RE.match(p.name) and p.is_file())
    if not shards:
        raise UserError(
            f"BERT data directory {data_dir} has no part-NNNNN-of-NNNNN files: {REGENERATE}"
        )
    return shards


def count_records(path: Path) -> int:
    """Records of the TFRecord file ``path``, from its headers alone (one 12-byte read each).

    Checks each length's CRC and that the file ends exactly where its last record does; the
    data and its CRC are not read.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise UserError(f"cannot open {path} ({exc.strerror}): {REGENERATE}") from None
    try:
        size = os.fstat(fd).st_size
        offset = count = 0
        while offset < size:
            length = read_header(os.pread(fd, HEADER_BYTES, offset), path, offset)
            end = offset + HEADER_BYTES + length + FOOTER_BYTES
            if end > size:
                raise corrupt(
                    path,
                    offset,
                    f"truncated record: it needs {end - size} bytes more than the file has",
                )
            offset = end
            count += 1
    finally:
        os.close(fd)
    return count


def check_dataset(data_dir: str | Path) -> DataSummary:
    """Validate ``data_dir`` quickly: shard names, completeness, record framing; count records.

    Every shard's record headers are walked (12 bytes read per record, CRC of each length
    checked), so a truncated or padded file is caught before a container starts; record data
    is not read. The shards must all say the same total and all be present.
    """
    shards = list_shards(data_dir)
    totals = {int(SHARD_RE.match(p.name).group(2)) for p in shards}  # type: ignore[union-attr]
    if len(totals) > 1:
        raise UserError(
            f"{data_dir} mixes shards of different datasets (part-*-of-{sorted(totals)}): "
            f"{REGENERATE}"
        )
    total = totals.pop()
    indices = {int(SHARD_RE.match(p.name).group(1)) for p in shards}  # type: ignore[union-attr]
    missing = sorted(set(range(total)) - indices)
    if missing or len(shards) != total:
        detail = f"missing {SHARD_FORMAT % (missing[0], total)}" if missing else "numbered past it"
        raise UserError(
            f"{data_dir} has {len(shards)} of the {total} shards its file names announce "
            f"({detail}): {REGENERATE}"
        )
    records = size = 0
    for path in shards:
        records += count_records(path)
        size += path.stat().st_size
    return DataSummary(items=records, files=len(shards), bytes=size)


def read_shape(data_dir: str | Path) -> tuple[int, int]:
    """(seq_length, max_predictions) of the dataset, from its first record."""
    first = list_shards(data_dir)[0]
    for data in iter_records(first):
        example = parse_example(data, f"{first} record 0", features=list(FEATURES))
        return len(example["input_ids"]), len(example["masked_lm_positions"])
    raise UserError(f"{first} holds no record: {REGENERATE}")
