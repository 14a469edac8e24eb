"""TFRecord files of ``tf.train.Example``: a vectorised block encoder, a checking reader, a parser.

Framing of one record (TensorFlow's ``core/lib/io/record_writer``), all little-endian::

    uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)

with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32)`` over CRC-32C.

Why a hand-written encoder: the ``tfrecord`` package's ``TFRecordWriter`` runs at ~7 MB/s per
core and building ``Example`` messages with protobuf at ~21 MB/s, far below disk speed. A BERT
record is nearly all packed integer lists, so a whole block of records can be encoded with a
few numpy passes: varint bytes of every value at once, per-record length prefixes as arrays, and
one boolean-mask compaction that lays the records out end to end. Only the CRCs are computed per
record (by the ``crc32c`` package, hardware-accelerated). Parsing goes through protobuf
(``tfrecord.example_pb2``), the reference decoder.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import crc32c
import numpy as np
from tfrecord import example_pb2

from workloads.errors import UserError

REGENERATE = "regenerate it with ./cli.py datagen bert"
HEADER_BYTES = 12  # uint64 length + uint32 masked CRC of the length
FOOTER_BYTES = 4  # uint32 masked CRC of the data
# TensorFlow's TFRecordDataset reads through a 256 KiB buffer by default (buffer_size=None).
DEFAULT_BUFFER_SIZE = 256 * 1024

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")

# Protobuf tags (field number << 3 | wire type 2 = length-delimited) of the Example schema:
# Example.features = 1, Features.feature (map entry) = 1, entry key = 1, entry value = 2,
# Feature.float_list = 2, Feature.int64_list = 3, {Float,Int64}List.value (packed) = 1.
_TAG_1 = 0x0A
_TAG_2 = 0x12
_TAG_3 = 0x1A


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _mask_crcs(crcs: np.ndarray) -> np.ndarray:
    crcs = crcs.astype(np.uint32)
    return ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(_MASK_DELTA)


# --------------------------------------------------------------------------------------------
# Encoding


def varint_size(value: int) -> int:
    """Bytes of the protobuf varint of a non-negative ``value``."""
    return max(1, (int(value).bit_length() + 6) // 7)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _varint_widths(values: np.ndarray) -> np.ndarray:
    """Varint size of each uint64 value: 1 + the number of 7-bit thresholds it reaches."""
    widths = np.ones(values.shape, dtype=np.int64)
    top = int(values.max(initial=0))
    for k in range(1, varint_size(top)):
        widths += values >= np.uint64(1 << (7 * k))
    return widths


def _varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Varint bytes of uint64 ``values`` (shape S): (bytes (*S, W), mask (*S, W), widths S).

    Byte k of a value is kept where ``k < width``; all but the last kept byte carry the
    continuation bit. W is the widest varint present, so narrow data costs a single plane.
    """
    widths = _varint_widths(values)
    planes = varint_size(int(values.max(initial=0)))
    if planes == 1:
        return values.astype(np.uint8)[..., None], np.ones((*values.shape, 1), bool), widths
    out = np.empty((*values.shape, planes), dtype=np.uint8)
    keep = np.empty((*values.shape, planes), dtype=bool)
    for k in range(planes):
        byte = (values >> np.uint64(7 * k)).astype(np.uint8) & np.uint8(0x7F)
        # Continuation bit on every byte but the last of the value.
        byte |= (widths > k + 1).astype(np.uint8) << np.uint8(7)
        out[..., k] = byte
        keep[..., k] = widths > k
    return out, keep, widths


class _Pieces:
    """Per-record byte pieces laid side by side, compacted into consecutive records at the end.

    Each piece is a (records, W) uint8 array with a (records, W) mask of the bytes that belong
    to the record; concatenating the pieces along axis 1 and taking the masked bytes in row-major
    order gives every record's bytes in piece order, records one after the other.
    """

    def __init__(self, records: int) -> None:
        self.records = records
        self.data: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []

    def fixed(self, data: bytes | np.ndarray) -> None:
        """Bytes that every record has (``bytes``) or a (records, W) array kept in full."""
        if isinstance(data, bytes | bytearray):
            row = np.frombuffer(bytes(data), dtype=np.uint8)
            data = np.broadcast_to(row, (self.records, row.size))
        self.data.append(data)
        self.masks.append(np.broadcast_to(np.True_, data.shape))

    def varint(self, values: np.ndarray) -> None:
        """One varint per record, ``values`` of shape (records,)."""
        data, keep, _ = _varint_bytes(values.astype(np.uint64))
        self.data.append(data)
        self.masks.append(keep)

    def packed(self, data: np.ndarray, keep: np.ndarray) -> None:
        """The varint bytes of a (records, n) array, from :func:`_varint_bytes`."""
        self.data.append(data.reshape(self.records, -1))
        self.masks.append(keep.reshape(self.records, -1))

    def compact(self) -> np.ndarray:
        return np.concatenate(self.data, axis=1)[np.concatenate(self.masks, axis=1)]


def _payload(array: np.ndarray) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(kind, bytes, mask, byte length per record) of one feature's packed values."""
    records = array.shape[0]
    if np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
        # int64 varints are two's complement: a negative value takes 10 bytes, like protobuf.
        values = array.astype(np.int64, copy=False).view(np.uint64)
        data, keep, widths = _varint_bytes(values)
        return "int64", data, keep, widths.sum(axis=1)
    if np.issubdtype(array.dtype, np.floating):
        data = np.ascontiguousarray(array, dtype="<f4").view(np.uint8).reshape(records, -1)
        lengths = np.full(records, data.shape[1], dtype=np.int64)
        return "float", data, np.broadcast_to(np.True_, data.shape), lengths
    raise TypeError(f"feature of dtype {array.dtype} is neither integer nor floating point")


def _vsize(lengths: np.ndarray) -> np.ndarray:
    return _varint_widths(lengths.astype(np.uint64))


def encode_examples_buffer(features: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Framed TFRecords of a block of ``tf.train.Example``: (bytes as uint8 array, record ends).

    ``features`` maps each feature name to a 2-D array (records, values): integer arrays become
    ``int64_list`` features, floating-point arrays ``float_list`` (float32). Record ``i`` of the
    result is ``buffer[ends[i - 1]:ends[i]]`` (``ends[-1]`` is the buffer's size), framing and
    CRCs included, so a caller may keep any prefix of whole records.
    """
    if not features:
        raise ValueError("an Example needs at least one feature")
    arrays = {name: np.asarray(a) for name, a in features.items()}
    records = {a.shape[0] if a.ndim == 2 else -1 for a in arrays.values()}
    if len(records) != 1 or -1 in records:
        raise ValueError("every feature must be a 2-D array with the same number of records")
    n = records.pop()
    if n == 0:
        return np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.int64)

    # Lengths first, innermost out, all as (records,) arrays.
    encoded = []
    features_len = np.zeros(n, dtype=np.int64)
    for name, array in arrays.items():
        kind, data, keep, payload_len = _payload(array)
        key = name.encode()
        key_part = bytes([_TAG_1]) + _varint(len(key)) + key + bytes([_TAG_2])
        list_len = 1 + _vsize(payload_len) + payload_len
        feature_len = 1 + _vsize(list_len) + list_len
        entry_len = len(key_part) + _vsize(feature_len) + feature_len
        features_len += 1 + _vsize(entry_len) + entry_len
        encoded.append((kind, key_part, data, keep, payload_len, list_len, feature_len, entry_len))
    example_len = 1 + _vsize(features_len) + features_len

    pieces = _Pieces(n)
    pieces.fixed(example_len.astype("<u8").view(np.uint8).reshape(n, 8))
    pieces.fixed(np.zeros((n, 4), dtype=np.uint8))  # CRC of the length, filled in below
    pieces.fixed(bytes([_TAG_1]))
    pieces.varint(features_len)
    for kind, key_part, data, keep, payload_len, list_len, feature_len, entry_len in encoded:
        pieces.fixed(bytes([_TAG_1]))
        pieces.varint(entry_len)
        pieces.fixed(key_part)
        pieces.varint(feature_len)
        pieces.fixed(bytes([_TAG_3 if kind == "int64" else _TAG_2]))
        pieces.varint(list_len)
        pieces.fixed(bytes([_TAG_1]))
        pieces.varint(payload_len)
        pieces.packed(data, keep)
    pieces.fixed(np.zeros((n, 4), dtype=np.uint8))  # CRC of the data, filled in below
    buffer = pieces.compact()

    sizes = HEADER_BYTES + example_len + FOOTER_BYTES
    ends = np.cumsum(sizes)
    starts = ends - sizes
    view = memoryview(buffer)
    # The only per-record Python work: two calls into the (hardware) CRC-32C.
    length_crcs = [crc32c.crc32c(view[s : s + 8]) for s in starts.tolist()]
    data_crcs = [
        crc32c.crc32c(view[s + HEADER_BYTES : e - FOOTER_BYTES])
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
    ]
    four = np.arange(4)
    length_bytes = _mask_crcs(np.array(length_crcs)).astype("<u4").view(np.uint8).reshape(n, 4)
    data_bytes = _mask_crcs(np.array(data_crcs)).astype("<u4").view(np.uint8).reshape(n, 4)
    buffer[(starts + 8)[:, None] + four] = length_bytes
    buffer[(ends - FOOTER_BYTES)[:, None] + four] = data_bytes
    return buffer, ends


def encode_examples(features: Mapping[str, np.ndarray]) -> bytes:
    """Framed TFRecord bytes of a block of ``tf.train.Example`` records, one per row.

    ``features`` maps names to 2-D arrays (records, values); see
    :func:`encode_examples_buffer`. Map field order in each Example is the order of
    ``features``.
    """
    return encode_examples_buffer(features)[0].tobytes()


# --------------------------------------------------------------------------------------------
# Reading


def corrupt(path: str | Path, offset: int, what: str) -> UserError:
    """The error for a damaged TFRecord file: names the file, the byte offset and the fix."""
    return UserError(f"{path} is corrupt at byte {offset} ({what}): {REGENERATE}")


def read_header(header: bytes, path: str | Path, offset: int) -> int:
    """The data length from a record's 12-byte header, after checking its CRC."""
    if len(header) < HEADER_BYTES:
        raise corrupt(path, offset, f"truncated record header, {len(header)} of 12 bytes")
    (length,) = _LENGTH.unpack_from(header)
    (crc,) = _CRC.unpack_from(header, 8)
    if masked_crc(header[:8]) != crc:
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


def parse_example(
    data: bytes, where: str = "record", features: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Decode a serialized ``tf.train.Example`` into arrays: int64 lists as int64, floats float32.

    ``where`` names the record in errors (e.g. ``"data/part-00000-of-00010 record 17"``).
    ``features``: names that must be present (others are decoded too). Bytes features are
    not used by twintrace and are rejected.
    """
    try:
        example = example_pb2.Example.FromString(data)
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
