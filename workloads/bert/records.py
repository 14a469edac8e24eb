"""TFRecord files of ``tf.train.Example``: the framing, a checking reader, a parser.

Framing of one record (TensorFlow's ``core/lib/io/record_writer``), all little-endian::

    uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)

with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32)`` over CRC-32C (the
``crc32c`` package, hardware-accelerated). Parsing goes through protobuf
(``tfrecord.example_pb2``), the reference decoder.

This is the reader side, which the workload images carry. The writer, the BERT generator's
compiled encoder (:mod:`datagen.bert_encode`, host only), takes the framing constants and the
CRC masking from here, so that both sides share one definition.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import crc32c
import numpy as np

from core.errors import UserError

REGENERATE = "regenerate it with ./cli.py datagen bert"
HEADER_BYTES = 12  # uint64 length + uint32 masked CRC of the length
FOOTER_BYTES = 4  # uint32 masked CRC of the data
LENGTH_BYTES = 8  # the uint64 length that the header's CRC covers
# TensorFlow's TFRecordDataset reads through a 256 KiB buffer by default (buffer_size=None).
DEFAULT_BUFFER_SIZE = 256 * 1024
MASK_DELTA = 0xA282EAD8

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")

CRC = TypeVar("CRC", int, np.ndarray)


def mask_crc(crc: CRC) -> CRC:
    """TFRecord's masking of CRC-32C values: a Python int, or a uint32 array (element-wise)."""
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    return mask_crc(crc32c.crc32c(data))


def corrupt(path: str | Path, offset: int, what: str) -> UserError:
    """The error for a damaged TFRecord file: names the file, the byte offset and the fix."""
    return UserError(f"{path} is corrupt at byte {offset} ({what}): {REGENERATE}")


def read_header(header: bytes, path: str | Path, offset: int) -> int:
    """The data length from a record's 12-byte header, after checking its CRC."""
    if len(header) < HEADER_BYTES:
        raise corrupt(path, offset, f"truncated record header, {len(header)} of 12 bytes")
    (length,) = _LENGTH.unpack_from(header)
    (crc,) = _CRC.unpack_from(header, LENGTH_BYTES)
    if masked_crc(header[:LENGTH_BYTES]) != crc:
        raise corrupt(path, offset, "bad CRC of the record length")
    return length


def iter_records(path: str | Path, buffer_size: int = DEFAULT_BUFFER_SIZE) -> Iterator[bytes]:
    """The data of each record of the TFRecord file ``path``, both CRCs checked.

    Reads through a buffered reader of ``buffer_size`` bytes (TensorFlow's read size), so the
    system calls are those of ``TFRecordDataset``. A truncated record or a bad CRC raises
    UserError naming the file and the record's byte offset. The length is trusted only once its
    CRC matches, so a damaged header never makes the reader allocate or wait for gigabytes.
    """
    offset = 0
    try:
        f = open(path, "rb", buffering=buffer_size)  # noqa: SIM115 - closed in finally
    except OSError as exc:
        raise UserError(f"cannot open {path} ({exc.strerror}): {REGENERATE}") from None
    with f:
        while True:
            header = f.read(HEADER_BYTES)
            if not header:
                return
            length = read_header(header, path, offset)
            body = f.read(length + FOOTER_BYTES)
            if len(body) < length + FOOTER_BYTES:
                raise corrupt(
                    path,
                    offset,
                    f"truncated record, {len(body)} of {length + FOOTER_BYTES} bytes after "
                    "the header",
                )
            data = memoryview(body)[:length]
            (crc,) = _CRC.unpack_from(body, length)
            if masked_crc(data) != crc:
                raise corrupt(path, offset, "bad CRC of the record data")
            yield body[:length]
            offset += HEADER_BYTES + length + FOOTER_BYTES


@functools.cache
def _example_class() -> Any:
    # Imported on first use: the tfrecord package imports torch (seconds), which writers of
    # records (the generator's worker processes) do not need.
    from tfrecord import example_pb2

    return example_pb2.Example


def parse_example(
    data: bytes, where: str = "record", features: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Decode a serialized ``tf.train.Example`` into arrays: int64 lists as int64, floats float32.

    ``where`` names the record in errors (e.g. ``"data/part-00000-of-00010 record 17"``).
    ``features``: names that must be present (others are decoded too). Bytes features are
    not used by twintrace and are rejected.
    """
    try:
        example = _example_class().FromString(data)
    except Exception as exc:  # protobuf raises DecodeError, or RuntimeError from upb
        raise UserError(f"{where} is not a tf.train.Example ({exc}): {REGENERATE}") from None
    out: dict[str, np.ndarray] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "int64_list":
            out[name] = np.array(feature.int64_list.value, dtype=np.int64)
        elif kind == "float_list":
            out[name] = np.array(feature.float_list.value, dtype=np.float32)
        else:
            raise UserError(
                f"{where}: feature {name!r} holds {kind or 'no value'}, not an int64 or float "
                f"list: {REGENERATE}"
            )
    missing = [name for name in features or () if name not in out]
    if missing:
        raise UserError(f"{where} lacks the feature(s) {', '.join(missing)}: {REGENERATE}")
    return out
