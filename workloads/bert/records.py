"""TFRecord files of ``tf.train.Example``: a vectorised block encoder, a checking reader, a parser.

Framing of one record (TensorFlow's ``core/lib/io/record_writer``), all little-endian::

    uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)

with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32)`` over CRC-32C.

Why a hand-written encoder: the ``tfrecord`` package's ``TFRecordWriter`` runs at ~7 MB/s per
core and building ``Example`` messages with protobuf at ~21 MB/s, far below disk speed. A BERT
record is nearly all packed integer lists, so a whole block of records is encoded at once with
numpy: length prefixes as per-record arrays, varint bytes from lookup tables scattered into
place one byte plane at a time, fixed-size features as (records, size) arrays, pre-encoded text
(:class:`Encoded`) as slices; then one join lays out every record and one call per record takes
its data CRC (``crc32c``, hardware-accelerated), the only per-record Python work. Parsing goes
through protobuf (``tfrecord.example_pb2``), the reference decoder.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from core.errors import UserError

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
    """Writes one piece of every record at a time into ``out``, at a per-record cursor.

    Pieces must be written in record order, since a varint piece may scribble zeros up to 9
    bytes past its end (see :func:`_scatter_varints`): the caller leaves slack after each
    record's region.
    """

    def __init__(self, out: np.ndarray, starts: np.ndarray) -> None:
        self.out = out
        self.cursor = starts.copy()

    def const(self, data: bytes) -> None:
        row = np.frombuffer(data, dtype=np.uint8)
        self.out[self.cursor[:, None] + np.arange(row.size)] = row
        self.cursor += row.size

    def varint(self, values: np.ndarray) -> None:
        values = _unsigned(values)
        widths = _varint_widths(values)
        _scatter_varints(self.out, self.cursor, values, widths)
        self.cursor += widths

    def header(self, parts: Sequence[bytes | np.ndarray]) -> None:
        """Constant bytes and per-record varints, one after the other (see :func:`_header_rows`)."""
        rows = _header_rows(parts, self.cursor.size)
        if rows is not None:
            self.out[self.cursor[:, None] + np.arange(rows.shape[1])] = rows
            self.cursor += rows.shape[1]
            return
        for part in parts:
            if isinstance(part, bytes):
                self.const(part)
            else:
                self.varint(part)

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


def _header_rows(parts: Sequence[bytes | np.ndarray], records: int) -> np.ndarray | None:
    """Constant bytes and per-record varints as one (records, size) uint8 array.

    None when a varint's width differs between records, so that the header's size does too
    (length prefixes straddling 128 or 16384).
    """
    columns: list[np.ndarray] = []
    for part in parts:
        if isinstance(part, bytes):
            row = np.frombuffer(part, dtype=np.uint8)
            columns.append(np.broadcast_to(row, (records, row.size)))
            continue
        values = _unsigned(part)
        widths = _varint_widths(values)
        width = int(widths[0])
        if not (widths == width).all():
            return None
        columns += [_varint_plane(values, widths, k)[:, None] for k in range(width)]
    return np.concatenate(columns, axis=1)


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


# Bytes left after each record's region in a scatter buffer, for the zeros a varint scatter may
# write past it (at most 9: a 10-byte varint's planes).
_SLACK = 16


class _Assembly:
    """The pieces of every record, in order, joined into the framed records at the end.

    A piece is either a (records, width) uint8 array (one row per record; consecutive ones are
    merged) or byte runs of a buffer: ``buffer[starts[i, j] : starts[i, j] + lengths[i, j]]``
    for each column j. Joining costs one memoryview slice per piece and record and one copy of
    the bytes, much less than copying each record's pieces with numpy.
    """

    def __init__(self, records: int) -> None:
        self.records = records
        # Lists of row arrays (concatenated when joining), constant bytes, or runs.
        self.pieces: list[list[np.ndarray] | bytes | tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def rows(self, rows: np.ndarray | bytes) -> None:
        """A (records, width) uint8 array, or bytes that every record has."""
        if isinstance(rows, bytes):
            rows = np.broadcast_to(np.frombuffer(rows, dtype=np.uint8), (self.records, len(rows)))
        if self.pieces and isinstance(self.pieces[-1], list):
            self.pieces[-1].append(rows)
        else:
            self.pieces.append([rows])

    def runs(self, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Runs of ``buffer`` (starts and lengths: (records,) or (records, runs) arrays).

        A run that is the same in every record (a separator token) is a constant piece: joined
        without slicing, and merged into the rows before it when there are any.
        """
        starts = starts.reshape(self.records, -1)
        lengths = lengths.reshape(self.records, -1)
        for j in range(starts.shape[1]):
            begin, size = starts[:, j], lengths[:, j]
            if (begin == begin[0]).all() and (size == size[0]).all():
                const = buffer[begin[0] : begin[0] + size[0]].tobytes()
                if self.pieces and isinstance(self.pieces[-1], list):
                    self.rows(const)
                else:
                    self.pieces.append(const)
            else:
                self.pieces.append((buffer, begin, size))

    def header(self, parts: Sequence[bytes | np.ndarray]) -> None:
        rows = _header_rows(parts, self.records)
        if rows is not None:
            self.rows(rows)
            return
        sizes = sum(
            (len(p) if isinstance(p, bytes) else _vsize(p.astype(np.int64)) for p in parts),
            start=np.zeros(self.records, dtype=np.int64),
        )
        starts = np.cumsum(sizes + _SLACK) - (sizes + _SLACK)
        out = np.zeros(int(starts[-1] + sizes[-1]) + _SLACK, dtype=np.uint8)
        _Writer(out, starts).header(parts)
        self.runs(out, starts, sizes)

    def join(self) -> bytearray:
        columns: list[Sequence[memoryview | bytes]] = []
        n = self.records
        for piece in self.pieces:
            if isinstance(piece, bytes):
                columns.append([piece] * n)
            elif isinstance(piece, list):
                rows = np.concatenate(piece, axis=1)
                view, width = memoryview(rows).cast("B"), rows.shape[1]
                columns.append([view[i : i + width] for i in range(0, n * width, width)])
            else:
                buffer, starts, lengths = piece
                view = memoryview(buffer)
                ends = (starts + lengths).tolist()
                columns.append([view[b:e] for b, e in zip(starts.tolist(), ends, strict=True)])
        return bytearray().join(itertools.chain.from_iterable(zip(*columns, strict=True)))


@dataclasses.dataclass(frozen=True)
class Encoded:
    """An int64 list feature whose packed varint bytes the caller already has, as runs of a buffer.

    Record i's packed bytes are ``source[starts[i, j] : starts[i, j] + lengths[i, j]]`` for
    j = 0, 1, ... one after the other, then ``zeros[i]`` zero bytes (zero values: padding); the
    caller guarantees the runs are whole varints and that no record's bytes are empty. The
    cheapest way to pass text drawn from a pre-encoded corpus (BERT's input_ids): the encoder
    only copies the runs, and the zeros of the last Encoded feature cost nothing.
    """

    source: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    zeros: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.source.ndim != 1 or self.source.dtype != np.uint8:
            raise ValueError("Encoded source must be a 1-D uint8 array")
        if self.starts.ndim != 2 or self.starts.shape != self.lengths.shape:
            raise ValueError("Encoded starts and lengths must be (records, runs) arrays")
        if self.starts.size and (
            self.starts.min() < 0
            or self.lengths.min() < 0
            or (self.starts + self.lengths).max() > self.source.size
        ):
            raise ValueError("Encoded runs must lie inside the source")
        if self.zeros is not None and (
            self.zeros.shape != (self.starts.shape[0],) or self.zeros.min(initial=0) < 0
        ):
            raise ValueError("Encoded zeros must be a (records,) array of counts >= 0")
        if (self.payload_len == 0).any():
            raise ValueError("Encoded records must have at least one byte")

    @property
    def payload_len(self) -> np.ndarray:
        """Packed bytes per record."""
        runs = self.lengths.sum(axis=1)
        return runs if self.zeros is None else runs + self.zeros

    @property
    def records(self) -> int:
        return self.starts.shape[0]


def encode_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The protobuf varints of ``values`` (1-D integers) one after the other, and where each starts.

    Returns (bytes, offsets) with ``offsets`` of size ``values.size + 1``: value i's varint is
    ``bytes[offsets[i]:offsets[i + 1]]``, so any run of values is a slice (see :class:`Encoded`).
    """
    values = _unsigned(np.asarray(values).ravel())
    widths = _varint_widths(values)
    offsets = np.zeros(values.size + 1, dtype=np.int64)
    np.cumsum(widths, out=offsets[1:])
    out = np.zeros(int(offsets[-1]) + _SLACK, dtype=np.uint8)
    _scatter_varints(out, offsets[:-1], values, widths)
    return out[: offsets[-1]], offsets


Feature = np.ndarray | Padded | Encoded
"""What :func:`encode_examples_buffer` takes for one feature."""


def encode_examples_buffer(features: Mapping[str, Feature]) -> tuple[np.ndarray, np.ndarray]:
    """Framed TFRecords of a block of ``tf.train.Example``: (bytes as uint8 array, record ends).

    ``features`` maps each feature name to a 2-D array (records, values), a :class:`Padded` or
    an :class:`Encoded`: integers become ``int64_list`` features, floating point ``float_list``
    (float32). Record ``i`` of the result is ``buffer[ends[i - 1]:ends[i]]`` (``ends[-1]`` is
    the buffer's size), framing and CRCs included, so a caller may keep any prefix of whole
    records.

    How: the length prefixes are computed for all records at once; features whose entries have
    the same size in every record (floats, integers whose varints all have one width) become
    (records, size) arrays; the other arrays' varints are scattered byte plane by byte plane
    into a zeroed buffer (zero values, such as padding, cost nothing); then every record's
    pieces are joined in one pass and its data CRC taken, the only per-record Python work.
    Protobuf allows map entries in any order: fixed-size entries come first, then Encoded ones,
    then the scattered ones.
    """
    if not features:
        raise ValueError("an Example needs at least one feature")
    counts = {_records(f) for f in features.values()}
    if len(counts) != 1 or -1 in counts:
        raise ValueError(
            "every feature must be a 2-D array, a Padded or an Encoded, all of one record count"
        )
    n = counts.pop()
    if n == 0:
        return np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.int64)

    fixed: list[np.ndarray | bytes] = []  # entries of the same size in every record
    scattered: list[tuple[list[bytes | np.ndarray], Callable[[_Writer], None]]] = []
    encoded: list[tuple[list[bytes | np.ndarray], Encoded]] = []
    scattered_len = np.zeros(n, dtype=np.int64)
    features_len = np.zeros(n, dtype=np.int64)
    for name, feature in features.items():
        key = name.encode()
        tag, payload_len, payload = _prepare(name, feature, n)
        key_part = bytes([_TAG_1]) + _varint(len(key)) + key + bytes([_TAG_2])
        if isinstance(payload, np.ndarray):
            header = _fixed_header(key_part, tag, payload.shape[1])
            fixed += [header, payload]
            features_len += len(header) + payload.shape[1]
            continue
        list_len = 1 + _vsize(payload_len) + payload_len  # never empty, see _prepare
        feature_len = 1 + _vsize(list_len) + list_len
        entry_len = len(key_part) + _vsize(feature_len) + feature_len
        features_len += 1 + _vsize(entry_len) + entry_len
        parts: list[bytes | np.ndarray] = [bytes([_TAG_1]), entry_len, key_part, feature_len]
        parts += [bytes([tag]), list_len, bytes([_TAG_1]), payload_len]
        if isinstance(payload, Encoded):
            encoded.append((parts, payload))
        else:
            scattered.append((parts, payload))
            scattered_len += 1 + _vsize(entry_len) + entry_len
    example_len = 1 + _vsize(features_len) + features_len
    sizes = HEADER_BYTES + example_len + FOOTER_BYTES
    ends = np.cumsum(sizes)
    starts = ends - sizes

    assembly = _Assembly(n)
    lengths = example_len.astype(np.uint64)
    length_crcs = _mask_crcs(_crc32c_of_lengths(lengths))
    assembly.rows(lengths.astype("<u8").view(np.uint8).reshape(n, 8))
    assembly.rows(length_crcs.astype("<u4").view(np.uint8).reshape(n, 4))
    assembly.header([bytes([_TAG_1]), features_len])
    for rows in fixed:
        assembly.rows(rows)
    # The rest of each record goes through one zeroed buffer: the last Encoded feature's zero
    # padding, the scattered entries, room for the data CRC (filled in below), then slack.
    lead = np.zeros(n, dtype=np.int64)
    for i, (header, feature) in enumerate(encoded):
        assembly.header(header)
        assembly.runs(feature.source, feature.starts, feature.lengths)
        if feature.zeros is not None:
            if i == len(encoded) - 1:
                lead = feature.zeros.astype(np.int64)
            else:
                zero_bytes = np.zeros(int(feature.zeros.max()), dtype=np.uint8)
                assembly.runs(zero_bytes, np.zeros(n, dtype=np.int64), feature.zeros)
    region = lead + scattered_len + FOOTER_BYTES + _SLACK
    at = np.cumsum(region) - region
    out = np.zeros(int(at[-1] + region[-1]), dtype=np.uint8)
    writer = _Writer(out, at + lead)
    for header, write in scattered:
        writer.header(header)
        write(writer)
    assembly.runs(out, at, region - _SLACK)
    data = assembly.join()

    view = memoryview(data)
    crc = crc32c.crc32c
    data_crcs = np.array(
        [
            crc(view[begin:end])
            for begin, end in zip(
                (starts + HEADER_BYTES).tolist(), (ends - FOOTER_BYTES).tolist(), strict=True
            )
        ],
        dtype=np.uint32,
    )
    buffer = np.frombuffer(data, dtype=np.uint8)
    crc_bytes = _mask_crcs(data_crcs).astype("<u4").view(np.uint8).reshape(n, 4)
    buffer[(ends - FOOTER_BYTES)[:, None] + np.arange(4)] = crc_bytes
    return buffer, ends


def _fixed_header(key_part: bytes, tag: int, payload_len: int) -> bytes:
    """The bytes before a payload of ``payload_len`` bytes in a map entry of Features."""
    # Like protobuf, an empty list has no packed field at all.
    packed = bytes([_TAG_1]) + _varint(payload_len) if payload_len else b""
    value = bytes([tag]) + _varint(len(packed) + payload_len) + packed
    entry = key_part + _varint(len(value) + payload_len) + value
    return bytes([_TAG_1]) + _varint(len(entry) + payload_len) + entry


def _records(feature: Feature) -> int:
    if isinstance(feature, Padded):
        return feature.counts.size
    if isinstance(feature, Encoded):
        return feature.records
    return np.shape(feature)[0] if np.ndim(feature) == 2 else -1


def _prepare(
    name: str, feature: Feature, n: int
) -> tuple[int, np.ndarray, np.ndarray | Encoded | Callable[[_Writer], None]]:
    """(tag, packed bytes per record, payload): (n, size) bytes, an Encoded, or a writer."""
    if isinstance(feature, Encoded):
        return _TAG_3, feature.payload_len, feature
    if isinstance(feature, Padded) and feature.length == 0:
        return _TAG_3, np.zeros(n, dtype=np.int64), np.empty((n, 0), dtype=np.uint8)
    if isinstance(feature, Padded):
        values = _unsigned(feature.values)
        widths = _varint_widths(values)
        ends = np.cumsum(widths, dtype=np.int64)
        first = np.cumsum(feature.counts) - feature.counts
        from_zero = np.concatenate(([0], ends))
        before = from_zero[first]
        payload_len = from_zero[first + feature.counts] - before + (feature.length - feature.counts)
        layout = _PaddedLayout(feature.counts, ends, before, payload_len)
        return _TAG_3, payload_len, lambda w: w.padded(values, widths, layout)
    array = np.asarray(feature)
    if np.issubdtype(array.dtype, np.floating):
        payload = np.ascontiguousarray(array, dtype="<f4").view(np.uint8).reshape(n, -1)
        return _TAG_2, np.full(n, payload.shape[1], dtype=np.int64), payload
    if not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
        raise TypeError(f"feature {name!r} of dtype {array.dtype} is neither integer nor float")
    values = _unsigned(array)
    if values.size == 0 or values.max() < 0x80:
        # One byte per value, the value itself (0/1 masks and labels).
        return _TAG_3, np.full(n, values.shape[1], dtype=np.int64), values.astype(np.uint8)
    widths = _varint_widths(values)
    payload_len = widths.sum(axis=1, dtype=np.int64)
    lo, hi = int(widths.min()), int(widths.max())
    if lo == hi:
        planes = [_varint_plane(values, widths, k) for k in range(lo)]
        return _TAG_3, payload_len, np.stack(planes, axis=-1).reshape(n, -1)
    return _TAG_3, payload_len, lambda w: w.packed(values, widths)


def encode_examples(features: Mapping[str, Feature]) -> bytes:
    """Framed TFRecord bytes of a block of ``tf.train.Example`` records, one per row.

    ``features`` maps names to 2-D arrays (records, values), :class:`Padded` or
    :class:`Encoded`; see :func:`encode_examples_buffer`.
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
