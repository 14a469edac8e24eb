"""TFRecord files of ``tf.train.Example``: a vectorised block encoder, a checking reader, a parser.

Framing of one record (TensorFlow's ``core/lib/io/record_writer``), all little-endian::

    uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)

with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32)`` over CRC-32C.

Why a hand-written encoder: the ``tfrecord`` package's ``TFRecordWriter`` runs at ~7 MB/s per
core and building ``Example`` messages with protobuf at ~21 MB/s, far below disk speed. A BERT
record is nearly all packed integer lists, so a whole block of records is encoded at once with
numpy: length prefixes as per-record arrays, varint bytes from lookup tables scattered into
place one byte plane at a time, fixed-size features copied as one run per record. Only the data
CRCs are computed per record (by the ``crc32c`` package, hardware-accelerated). Parsing goes
through protobuf (``tfrecord.example_pb2``), the reference decoder.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
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


@dataclasses.dataclass(frozen=True)
class Padded:
    """An int64 list feature given as each record's leading values, then zeros up to ``length``.

    ``values`` (1-D) holds the leading values of every record, one record after the other, and
    ``counts[i]`` how many belong to record i. The cheap way to pass zero-padded sequences such
    as BERT's input_ids: the encoder does no work for the padding (one zero byte per value).
    """

    values: np.ndarray
    counts: np.ndarray
    length: int

    def __post_init__(self) -> None:
        if self.values.ndim != 1 or self.counts.ndim != 1:
            raise ValueError("Padded values and counts must be 1-D arrays")
        if self.values.dtype.kind not in "biu":
            raise ValueError(f"Padded values must be integers, not {self.values.dtype}")
        if int(self.counts.sum()) != self.values.size:
            raise ValueError("Padded counts must add up to the number of values")
        if self.counts.size and (self.counts.min() < 0 or self.counts.max() > self.length):
            raise ValueError(f"Padded counts must be between 0 and length ({self.length})")

    def dense(self) -> np.ndarray:
        """The (records, length) int64 array this stands for."""
        out = np.zeros((self.counts.size, self.length), dtype=np.int64)
        out[np.arange(self.length) < self.counts[:, None]] = self.values
        return out


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


def _unsigned(values: np.ndarray) -> np.ndarray:
    """Integers as the unsigned values protobuf encodes: a view when they are non-negative.

    Negative values become two's complement 64-bit, as in protobuf (10-byte varints).
    """
    if values.dtype.kind == "u":
        return values
    if values.dtype.kind == "b":
        return values.view(np.uint8)
    if values.size == 0 or values.min() >= 0:
        return values.view(values.dtype.str.replace("i", "u"))
    return values.astype(np.int64).view(np.uint64)


def _build_luts() -> tuple[np.ndarray, np.ndarray]:
    values = np.arange(1 << 16, dtype=np.uint32)
    widths = (1 + (values >= 1 << 7) + (values >= 1 << 14)).astype(np.uint8)
    planes = np.zeros((3, values.size), dtype=np.uint8)
    for k in range(3):
        byte = ((values >> (7 * k)) & 0x7F) | ((widths > k + 1) << 7)
        planes[k] = np.where(widths > k, byte, 0)
    return widths, planes


# Varint widths and bytes (one table per byte plane, 0 past a value's last byte) of every value
# below 2^16: a gather from a 64 KiB table costs less than the shifts, masks and compares that
# compute a plane.
_LUT_WIDTHS, _LUT_PLANES = _build_luts()


def _varint_widths(values: np.ndarray) -> np.ndarray:
    """Varint size (uint8) of each unsigned value."""
    if values.dtype.itemsize <= 2:
        return _LUT_WIDTHS.take(values)
    widths = np.ones(values.shape, dtype=np.uint8)
    for k in range(1, varint_size(int(values.max(initial=0)))):
        widths += (values >= values.dtype.type(1 << (7 * k))).view(np.uint8)
    return widths


def _varint_plane(values: np.ndarray, widths: np.ndarray, k: int) -> np.ndarray:
    """Byte k of each value's varint, 0 where the varint is shorter."""
    if values.dtype.itemsize <= 2:
        return _LUT_PLANES[k].take(values)
    byte = (values >> values.dtype.type(7 * k)).astype(np.uint8)
    byte &= np.uint8(0x7F)
    byte |= (widths > k + 1).view(np.uint8) << np.uint8(7)
    return byte


def _scatter_varints(
    out: np.ndarray, positions: np.ndarray, values: np.ndarray, widths: np.ndarray
) -> None:
    """Write varint ``values`` (any shape) starting at ``positions`` into the zeroed ``out``.

    One scatter per byte plane, highest first. Plane k of a value narrower than k + 1 bytes is
    a zero byte, landing either on a later value's plane m < k (rewritten after it) or at most
    width - 1 bytes past the last value, which the caller writes afterwards (see
    :class:`_Writer`); so a plane that most values have is written for all of them, which costs
    less than selecting them. Zero values are skipped: their one byte is already 0.
    """
    positions, values, widths = positions.ravel(), values.ravel(), widths.ravel()
    if np.count_nonzero(values) < values.size:
        keep = np.flatnonzero(values)
        positions, values, widths = positions.take(keep), values.take(keep), widths.take(keep)
    for k in reversed(range(int(widths.max(initial=0)))):
        at, these, sizes = positions, values, widths
        if k and np.count_nonzero(widths > k) * 4 < widths.size:
            keep = np.flatnonzero(widths > k)
            at, these, sizes = positions.take(keep), values.take(keep), widths.take(keep)
        # Through a view starting k bytes in: no temporary positions + k array.
        out[k:][at] = _varint_plane(these, sizes, k)


class _Writer:
    """Writes one piece of every record of a block at a time, at a per-record cursor.

    Pieces must be written in record order, since a varint piece may scribble zeros up to 9
    bytes past its end (see :func:`_scatter_varints`); a record's last piece spills at most
    into its CRC and the next record's 12-byte header, which the caller writes last.
    """

    def __init__(self, out: np.ndarray, starts: np.ndarray) -> None:
        self.out = out
        self.cursor = starts.copy()

    def const(self, data: bytes) -> None:
        for j, byte in enumerate(data):
            if byte:
                self.out[j:][self.cursor] = byte
        self.cursor += len(data)

    def varint(self, values: np.ndarray) -> None:
        values = _unsigned(values)
        widths = _varint_widths(values)
        _scatter_varints(self.out, self.cursor, values, widths)
        self.cursor += widths

    def packed(self, values: np.ndarray, widths: np.ndarray) -> None:
        """Varints of a (records, count) array, each record's one after the other."""
        records, count = widths.shape
        if not count:
            return
        # A value's position: its record's cursor plus the widths before it in the record, from
        # one flat cumulative sum (numpy's cumsum along axis 1 is many times slower).
        ends = np.cumsum(widths.ravel(), dtype=np.int64).reshape(records, count)
        before = np.empty(records, dtype=np.int64)
        before[0] = 0
        before[1:] = ends[:-1, -1]
        positions = ends - widths
        positions += (self.cursor - before)[:, None]
        _scatter_varints(self.out, positions, values, widths)
        self.cursor += ends[:, -1] - before

    def padded(self, values: np.ndarray, widths: np.ndarray, feature: _PaddedLayout) -> None:
        """Varints of a :class:`Padded` feature: its values, then its zeros (left as they are)."""
        positions = feature.ends - widths
        positions += np.repeat(self.cursor - feature.before, feature.counts)
        _scatter_varints(self.out, positions, values, widths)
        self.cursor += feature.payload_len

    def header(self, parts: Sequence[bytes | np.ndarray]) -> None:
        """Constant bytes and per-record varints (``(records,)`` arrays), one after the other.

        When every varint has one width across the block, as length prefixes nearly always do,
        the header is the same size in every record: built as a (records, size) array and
        written with one scatter instead of one per part.
        """
        columns: list[np.ndarray] = []
        records = self.cursor.size
        for part in parts:
            if isinstance(part, bytes):
                row = np.frombuffer(part, dtype=np.uint8)
                columns.append(np.broadcast_to(row, (records, row.size)))
                continue
            values = _unsigned(part)
            widths = _varint_widths(values)
            width = int(widths[0])
            if not (widths == width).all():
                break
            columns += [_varint_plane(values, widths, k)[:, None] for k in range(width)]
        else:
            block = np.concatenate(columns, axis=1)
            self.out[self.cursor[:, None] + np.arange(block.shape[1])] = block
            self.cursor += block.shape[1]
            return
        for part in parts:
            if isinstance(part, bytes):
                self.const(part)
            else:
                self.varint(part)

    def skip(self, n: int | np.ndarray) -> np.ndarray:
        """Leave ``n`` bytes to be filled later; returns where they start in each record."""
        where = self.cursor.copy()
        self.cursor += n
        return where


@dataclasses.dataclass(frozen=True)
class _PaddedLayout:
    counts: np.ndarray  # values given per record
    ends: np.ndarray  # cumulative varint bytes of the values, over the whole block
    before: np.ndarray  # that sum before each record's first value
    payload_len: np.ndarray  # packed bytes per record, padding included


def _vsize(lengths: np.ndarray) -> np.ndarray:
    """Varint sizes of non-negative int64 lengths, as int64."""
    sizes = np.ones(lengths.shape, dtype=np.int64)
    for k in range(1, varint_size(int(lengths.max(initial=0)))):
        sizes += lengths >= 1 << (7 * k)
    return sizes


def _crc32c_table() -> np.ndarray:
    crc = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        crc = np.where(crc & 1, (crc >> 1) ^ np.uint32(0x82F63B78), crc >> 1)
    return crc.astype(np.uint32)


_CRC_TABLE = _crc32c_table()


def _crc32c_of_lengths(lengths: np.ndarray) -> np.ndarray:
    """CRC-32C of each length's 8 little-endian bytes, all at once (table-driven)."""
    crc = np.full(lengths.shape, 0xFFFFFFFF, dtype=np.uint32)
    for j in range(8):
        byte = ((lengths >> np.uint64(8 * j)) & np.uint64(0xFF)).astype(np.uint32)
        crc = _CRC_TABLE[(crc ^ byte) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


def encode_examples_buffer(
    features: Mapping[str, np.ndarray | Padded],
) -> tuple[np.ndarray, np.ndarray]:
    """Framed TFRecords of a block of ``tf.train.Example``: (bytes as uint8 array, record ends).

    ``features`` maps each feature name to a 2-D array (records, values) or a :class:`Padded`:
    integers become ``int64_list`` features, floating point ``float_list`` (float32). Record
    ``i`` of the result is ``buffer[ends[i - 1]:ends[i]]`` (``ends[-1]`` is the buffer's size),
    framing and CRCs included, so a caller may keep any prefix of whole records.

    Layout of an Example: features whose encoded size is the same in every record of the block
    (floats, integers whose varints all have one width) first, as one run of bytes per record
    copied in place; then the others, their varints scattered byte plane by byte plane into a
    zeroed buffer (zero values, such as padding, cost nothing). Protobuf allows map entries in
    any order.
    """
    if not features:
        raise ValueError("an Example needs at least one feature")
    records = {
        f.counts.size if isinstance(f, Padded) else (np.shape(f)[0] if np.ndim(f) == 2 else -1)
        for f in features.values()
    }
    if len(records) != 1 or -1 in records:
        raise ValueError("every feature must be a 2-D array or a Padded, all of one record count")
    n = records.pop()
    if n == 0:
        return np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.int64)

    fixed: list[np.ndarray] = []  # (n, W) bytes of each fixed-size entry, header included
    variable: list[tuple[bytes, np.ndarray, Callable[[_Writer], None]]] = []
    features_len = np.zeros(n, dtype=np.int64)
    for name, feature in features.items():
        key = name.encode()
        tag, payload_len, payload, write = _prepare(name, feature, n)
        key_part = bytes([_TAG_1]) + _varint(len(key)) + key + bytes([_TAG_2])
        # Like protobuf, an empty list has no packed field at all.
        list_len = np.where(payload_len > 0, 1 + _vsize(payload_len) + payload_len, 0)
        feature_len = 1 + _vsize(list_len) + list_len
        entry_len = len(key_part) + _vsize(feature_len) + feature_len
        features_len += 1 + _vsize(entry_len) + entry_len
        if payload is not None:
            header = (
                bytes([_TAG_1])
                + _varint(int(entry_len[0]))
                + key_part
                + _varint(int(feature_len[0]))
                + bytes([tag])
                + _varint(int(list_len[0]))
                + (bytes([_TAG_1]) + _varint(int(payload_len[0])) if payload_len[0] else b"")
            )
            row = np.frombuffer(header, dtype=np.uint8)
            fixed += [np.broadcast_to(row, (n, row.size)), payload]
        else:
            assert write is not None
            lengths = (entry_len, feature_len, list_len, payload_len)
            variable.append((key_part, np.stack(lengths), write))
    example_len = 1 + _vsize(features_len) + features_len
    sizes = HEADER_BYTES + example_len + FOOTER_BYTES
    ends = np.cumsum(sizes)
    starts = ends - sizes

    # Slack for what the last record's varints may scribble past its end (see _Writer).
    out = np.zeros(int(ends[-1]) + 16, dtype=np.uint8)
    w = _Writer(out, starts + HEADER_BYTES)
    w.header([bytes([_TAG_1]), features_len])
    fixed_block = np.concatenate(fixed, axis=1) if fixed else np.empty((n, 0), np.uint8)
    fixed_at = w.skip(fixed_block.shape[1])
    for key_part, (entry_len, feature_len, list_len, payload_len), write in variable:
        # Only integer features have varying sizes: tag 3, int64_list.
        w.header(
            [
                bytes([_TAG_1]),
                entry_len,
                key_part,
                feature_len,
                bytes([_TAG_3]),
                list_len,
                bytes([_TAG_1]),
                payload_len,
            ]
        )
        write(w)

    # Written after the varints, which may have scribbled zeros over them: the fixed runs, then
    # the frames. The only per-record Python work: copying the fixed run and one call into the
    # (hardware) CRC-32C.
    view = memoryview(out)
    width = fixed_block.shape[1]
    data_starts = (starts + HEADER_BYTES).tolist()
    data_ends = (ends - FOOTER_BYTES).tolist()
    data_crcs = np.empty(n, dtype=np.uint32)
    for i, (row, at, begin, end) in enumerate(
        zip(fixed_block, fixed_at.tolist(), data_starts, data_ends, strict=True)
    ):
        out[at : at + width] = row
        data_crcs[i] = crc32c.crc32c(view[begin:end])
    four = np.arange(4)
    lengths = example_len.astype(np.uint64)
    out[starts[:, None] + np.arange(8)] = lengths.astype("<u8").view(np.uint8).reshape(n, 8)
    length_crcs = _mask_crcs(_crc32c_of_lengths(lengths))
    out[(starts + 8)[:, None] + four] = length_crcs.astype("<u4").view(np.uint8).reshape(n, 4)
    crc_bytes = _mask_crcs(data_crcs).astype("<u4").view(np.uint8).reshape(n, 4)
    out[(ends - FOOTER_BYTES)[:, None] + four] = crc_bytes
    return out[: ends[-1]], ends


def _prepare(
    name: str, feature: np.ndarray | Padded, n: int
) -> tuple[int, np.ndarray, np.ndarray | None, Callable[[_Writer], None] | None]:
    """(tag, packed bytes per record, fixed payload (n, W) or None, writer of a varying one)."""
    if isinstance(feature, Padded) and feature.length == 0:
        return _TAG_3, np.zeros(n, dtype=np.int64), np.empty((n, 0), dtype=np.uint8), None
    if isinstance(feature, Padded):
        values = _unsigned(feature.values)
        widths = _varint_widths(values)
        ends = np.cumsum(widths, dtype=np.int64)
        first = np.cumsum(feature.counts) - feature.counts
        from_zero = np.concatenate(([0], ends))
        before = from_zero[first]
        payload_len = from_zero[first + feature.counts] - before + (feature.length - feature.counts)
        layout = _PaddedLayout(feature.counts, ends, before, payload_len)
        return _TAG_3, payload_len, None, lambda w: w.padded(values, widths, layout)
    array = np.asarray(feature)
    if np.issubdtype(array.dtype, np.floating):
        payload = np.ascontiguousarray(array, dtype="<f4").view(np.uint8).reshape(n, -1)
        return _TAG_2, np.full(n, payload.shape[1], dtype=np.int64), payload, None
    if not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
        raise TypeError(f"feature {name!r} of dtype {array.dtype} is neither integer nor float")
    values = _unsigned(array)
    if values.size == 0 or values.max() < 0x80:
        # One byte per value, the value itself (0/1 masks and labels).
        return _TAG_3, np.full(n, values.shape[1], dtype=np.int64), values.astype(np.uint8), None
    widths = _varint_widths(values)
    payload_len = widths.sum(axis=1, dtype=np.int64)
    lo, hi = int(widths.min()), int(widths.max())
    if lo == hi:
        planes = [_varint_plane(values, widths, k) for k in range(lo)]
        return _TAG_3, payload_len, np.stack(planes, axis=-1).reshape(n, -1), None
    return _TAG_3, payload_len, None, lambda w: w.packed(values, widths)


def encode_examples(features: Mapping[str, np.ndarray | Padded]) -> bytes:
    """Framed TFRecord bytes of a block of ``tf.train.Example`` records, one per row.

    ``features`` maps names to 2-D arrays (records, values) or :class:`Padded`; see
    :func:`encode_examples_buffer`.
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
