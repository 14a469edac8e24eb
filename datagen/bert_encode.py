"""The BERT generator's encoder: a block of drawn records as framed TFRecords, compiled.

The bytes of one record: TFRecord framing (:mod:`workloads.bert.records`) around a
``tf.train.Example`` whose ``Features`` map holds the seven MLPerf features as packed lists,
its entries in :data:`ENTRY_ORDER` (protobuf allows any order; each entry is the bytes protobuf
writes for it, see tests/test_datagen_bert.py, which checks whole files against the
``tfrecord`` package's writer). :func:`encode_block` writes a block of records drawn by
:func:`datagen.bert.draw_arrays` record after record straight into the output buffer, with no
per-record Python work and no block-sized temporaries (~0.45 ms for 1024 default records,
2.6 MB), then takes both CRCs of every record with the ``crc32c`` package (~0.5 ms, two calls
per record). CRCs in the kernel (the CRC32 instruction) would save ~0.25 ms a block, ~18% of a
writer's throughput, and ~9% of the generator's where the CPU limits it (2 vCPUs): measured by
bench/bert_crc.py, which keeps that variant; one CRC implementation, shared with the reader,
was preferred while the generator still outruns the disk.

The kernel is compiled by numba when this module is imported, and cached (see :func:`_jit`):
importing it costs ~1 s (numba's import, ~0.4 s, and the load of the cached machine code),
~8 s the first time on a machine, when it compiles. :mod:`datagen.bert` imports it only in the
processes that write shards, so that the CLI and planning never pay it (planning sizes records
with :func:`datagen.bert.record_sizes`, in numpy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import crc32c
import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from workloads.bert.files import FEATURES
from workloads.bert.records import FOOTER_BYTES, HEADER_BYTES, LENGTH_BYTES, mask_crc

if TYPE_CHECKING:
    from datagen.bert import BertGenParams, Draws, TextPool

# The order of the Features map entries in every record (any order is valid protobuf; this one
# keeps the bytes of the generator's first versions): those of the same size in every record
# first (0/1 arrays and floats, in feature order), then input_ids, then the masked tokens.
ENTRY_ORDER = (
    "input_mask",
    "segment_ids",
    "masked_lm_weights",
    "next_sentence_labels",
    "input_ids",
    "masked_lm_positions",
    "masked_lm_ids",
)
_ONE_FLOAT32 = np.array([1.0], dtype="<f4").view(np.uint8)


def _entry_table() -> tuple[np.ndarray, np.ndarray]:
    """The keys of ENTRY_ORDER one after the other, and per entry (key start, key end, tag)."""
    keys, rows = b"", []
    for name in ENTRY_ORDER:
        # Feature.float_list = 2 or Feature.int64_list = 3, length-delimited.
        tag = 0x12 if FEATURES[name][0] == "float" else 0x1A
        rows.append((len(keys), len(keys) + len(name), tag))
        keys += name.encode()
    return np.frombuffer(keys, dtype=np.uint8), np.array(rows, dtype=np.int64)


_KEYS, _ENTRIES = _entry_table()


def _jit(*signature: str) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit``, the machine code cached on disk for the next processes.

    In ``__pycache__`` next to this file, else numba's user-wide cache directory (or
    ``NUMBA_CACHE_DIR``); where none is writable numba refuses to cache, and the function is
    compiled in memory in each process instead (seconds), without a word.
    """

    def decorate(function: Callable[..., Any]) -> Any:
        try:
            return numba.njit(*signature, cache=True, nogil=True)(function)
        except RuntimeError as exc:
            if "no locator available" not in str(exc):
                raise
            return numba.njit(*signature, nogil=True)(function)

    return decorate


# --------------------------------------------------------------------------------------------
# memcpy, which numba has no word for


@intrinsic
def _memcpy(typingctx: Any, dst: Any, dst_at: Any, src: Any, src_at: Any, size: Any) -> Any:
    """Copy ``src[src_at : src_at + size]`` to ``dst[dst_at:]`` (uint8 arrays, in bounds)."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        dst_arr = context.make_array(sig.args[0])(context, builder, args[0])
        src_arr = context.make_array(sig.args[2])(context, builder, args[2])
        to = builder.gep(dst_arr.data, [args[1]])
        cgutils.raw_memcpy(builder, to, builder.gep(src_arr.data, [args[3]]), args[4], 1)
        return context.get_dummy_value()

    return types.none(dst, dst_at, src, src_at, size), codegen


# --------------------------------------------------------------------------------------------
# Protobuf pieces


@_jit()
def _vsize(value: int) -> int:
    """Bytes of the varint of a non-negative value."""
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


@_jit()
def _put_varint(out: np.ndarray, at: int, value: int) -> int:
    while value >= 0x80:
        out[at] = (value & 0x7F) | 0x80
        value >>= 7
        at += 1
    out[at] = value
    return at + 1


@_jit()
def _entry_lengths(entry: np.ndarray, size: int) -> tuple[int, int, int, int]:
    """(key, packed list, Feature, map entry) lengths of an entry of ``size`` packed bytes."""
    key_len = entry[1] - entry[0]
    list_len = 1 + _vsize(size) + size
    feature_len = 1 + _vsize(list_len) + list_len
    entry_len = 2 + _vsize(key_len) + key_len + _vsize(feature_len) + feature_len
    return key_len, list_len, feature_len, entry_len


@_jit()
def _entry_bytes(entry: np.ndarray, size: int) -> int:
    """Bytes of a map entry of Features whose packed list holds ``size`` bytes."""
    entry_len = _entry_lengths(entry, size)[3]
    return 1 + _vsize(entry_len) + entry_len


@_jit()
def _put_entry_header(out: np.ndarray, at: int, entry: np.ndarray, size: int) -> int:
    """A map entry's bytes before its ``size`` packed bytes: entry, key, Feature, list tags."""
    key_len, list_len, feature_len, entry_len = _entry_lengths(entry, size)
    out[at] = 0x0A  # Features.feature (a map entry)
    at = _put_varint(out, at + 1, entry_len)
    out[at] = 0x0A  # the entry's key
    at = _put_varint(out, at + 1, key_len)
    _memcpy(out, at, _KEYS, entry[0], key_len)
    out[at + key_len] = 0x12  # the entry's value, a Feature
    at = _put_varint(out, at + key_len + 1, feature_len)
    out[at] = entry[2]  # the Feature's list
    at = _put_varint(out, at + 1, list_len)
    out[at] = 0x0A  # the list's packed values
    return _put_varint(out, at + 1, size)


@_jit()
def _put_padded(out: np.ndarray, at: int, values: np.ndarray, first: int, k: int, p: int) -> int:
    """Varints of ``values[first : first + k]``, then p - k zeros."""
    for j in range(first, first + k):
        at = _put_varint(out, at, values[j])
    out[at : at + p - k] = 0
    return at + p - k


# --------------------------------------------------------------------------------------------
# The text pool


@_jit("Tuple((u1[::1], i8[::1]))(u8[::1])")
def _encode_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = values.size
    offsets = np.empty(n + 1, dtype=np.int64)
    offsets[0] = 0
    for i in range(n):
        offsets[i + 1] = offsets[i] + _vsize(values[i])
    out = np.empty(offsets[n], dtype=np.uint8)
    for i in range(n):
        _put_varint(out, offsets[i], values[i])
    return out, offsets


def encode_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The protobuf varints of non-negative integers one after the other, and where each starts.

    Returns (bytes, offsets), ``offsets`` of size ``values.size + 1``: value i's varint is
    ``bytes[offsets[i]:offsets[i + 1]]``, so a run of values is a slice (a shard's text pool,
    2^20 word ids, in ~3 ms).
    """
    values = np.asarray(values).ravel()
    if values.dtype.kind not in "ui" or (values.size and values.min() < 0):
        raise ValueError("encode_varints takes non-negative integers")
    return _encode_varints(values.astype(np.uint64))


# --------------------------------------------------------------------------------------------
# The block

# Compiled (or loaded from the cache) when this module is imported, for these types only: a
# process that imports the module has the kernel ready.
_ENCODE_SIGNATURE = (
    "Tuple((u1[::1], i8[::1]))(u1[::1], i8[:, :, ::1], i8[::1], i8[::1], u1[::1], i8[::1], "
    "i8[::1], i8[::1], i8, i8)"
)


@_jit()
def _record_sizes(
    runs: np.ndarray,
    lengths: np.ndarray,
    k: np.ndarray,
    positions: np.ndarray,
    masked_ids: np.ndarray,
    s: int,
    p: int,
    head: int,
) -> np.ndarray:
    """(n, 4): packed bytes of input_ids, masked_lm_positions, masked_lm_ids; Features bytes.

    ``head``: bytes of the entries of the same size in every record.
    """
    entries = _ENTRIES
    sizes = np.empty((lengths.size, 4), dtype=np.int64)
    first = 0
    for i in range(lengths.size):
        sizes[i, 0] = runs[i, :, 1].sum() + s - lengths[i]
        sizes[i, 1] = sizes[i, 2] = p - k[i]
        for j in range(first, first + k[i]):
            sizes[i, 1] += _vsize(positions[j])
            sizes[i, 2] += _vsize(masked_ids[j])
        first += k[i]
        sizes[i, 3] = head
        for e in range(3):
            sizes[i, 3] += _entry_bytes(entries[4 + e], sizes[i, e])
    return sizes


@_jit(_ENCODE_SIGNATURE)
def _encode(
    source: np.ndarray,
    runs: np.ndarray,
    lengths: np.ndarray,
    a: np.ndarray,
    labels: np.ndarray,
    k: np.ndarray,
    positions: np.ndarray,
    masked_ids: np.ndarray,
    s: int,
    p: int,
) -> tuple[np.ndarray, np.ndarray]:
    # Packed bytes of the fixed-size entries: input_mask, segment_ids, weights, labels.
    fixed = np.array((s, s, 4 * p, 1))
    head = 0
    for e in range(4):
        head += _entry_bytes(_ENTRIES[e], fixed[e])
    sizes = _record_sizes(runs, lengths, k, positions, masked_ids, s, p, head)
    framed = np.empty(lengths.size, dtype=np.int64)
    for i in range(lengths.size):
        framed[i] = HEADER_BYTES + 1 + _vsize(sizes[i, 3]) + sizes[i, 3] + FOOTER_BYTES
    ends = np.cumsum(framed)
    starts = ends - framed
    firsts = np.cumsum(k) - k  # each record's first masked token in positions and masked_ids
    out = np.empty(ends[-1] if lengths.size else 0, dtype=np.uint8)
    entries = _ENTRIES
    for i in range(lengths.size):
        start, length, split, count, first = starts[i], lengths[i], a[i] + 2, k[i], firsts[i]
        example_len = framed[i] - HEADER_BYTES - FOOTER_BYTES
        for j in range(LENGTH_BYTES):
            out[start + j] = (example_len >> (8 * j)) & 0xFF
        # The length's CRC (out[start + 8 : start + 12]) and the data's: see _put_crcs.
        out[start + HEADER_BYTES] = 0x0A  # Example.features
        at = _put_varint(out, start + HEADER_BYTES + 1, sizes[i, 3])

        at = _put_entry_header(out, at, entries[0], fixed[0])  # input_mask
        out[at : at + length] = 1
        out[at + length : at + s] = 0
        at = _put_entry_header(out, at + s, entries[1], fixed[1])  # segment_ids
        out[at : at + split] = 0
        out[at + split : at + length] = 1
        out[at + length : at + s] = 0
        at = _put_entry_header(out, at + s, entries[2], fixed[2])  # masked_lm_weights
        for j in range(4 * count):
            out[at + j] = _ONE_FLOAT32[j & 3]
        out[at + 4 * count : at + 4 * p] = 0
        at = _put_entry_header(out, at + 4 * p, entries[3], fixed[3])  # next_sentence_labels
        out[at] = labels[i]

        at = _put_entry_header(out, at + 1, entries[4], sizes[i, 0])  # input_ids
        for r in range(runs.shape[1]):
            _memcpy(out, at, source, runs[i, r, 0], runs[i, r, 1])
            at += runs[i, r, 1]
        out[at : at + s - length] = 0
        at += s - length
        at = _put_entry_header(out, at, entries[5], sizes[i, 1])  # masked_lm_positions
        at = _put_padded(out, at, positions, first, count, p)
        at = _put_entry_header(out, at, entries[6], sizes[i, 2])  # masked_lm_ids
        _put_padded(out, at, masked_ids, first, count, p)
    return out, ends


def _put_crcs(out: np.ndarray, ends: np.ndarray) -> None:
    """Write every record's two masked CRCs (of its length, of its data), which _encode leaves.

    Two calls of the ``crc32c`` package per record (hardware-accelerated): ~0.5 ms for a
    block of 1024 default records, masking included.
    """
    n = ends.size
    if n == 0:
        return
    starts = np.concatenate(([0], ends[:-1]))
    view = memoryview(out)
    crc = crc32c.crc32c
    begins, stops = starts.tolist(), ends.tolist()
    length_crcs = [crc(view[b : b + LENGTH_BYTES]) for b in begins]
    data_crcs = [
        crc(view[b + HEADER_BYTES : e - FOOTER_BYTES]) for b, e in zip(begins, stops, strict=True)
    ]
    for at, crcs in ((starts + LENGTH_BYTES, length_crcs), (ends - FOOTER_BYTES, data_crcs)):
        masked = mask_crc(np.array(crcs, dtype=np.uint32)).astype("<u4")
        out[at[:, None] + np.arange(4)] = masked.view(np.uint8).reshape(n, 4)


def encode_block(
    draws: Draws, pool: TextPool, params: BertGenParams
) -> tuple[np.ndarray, np.ndarray]:
    """Framed TFRecords of drawn records: (bytes as a uint8 array, end of each record).

    ``pool`` is the one the records were drawn from, made with :func:`encode_varints` (its
    ``source`` holds the bytes that the input_ids' runs point into). Record i is
    ``bytes[ends[i - 1]:ends[i]]``, so a caller may keep any prefix of whole records.
    """
    source = pool.source
    if source is None:
        raise ValueError("the pool has no source: make it with encode=encode_varints")
    runs = draws.runs
    if runs.size and (runs.min() < 0 or (runs[..., 0] + runs[..., 1]).max() > source.size):
        raise ValueError("input_ids runs must lie inside the source")
    if draws.positions.size != draws.masked_ids.size or draws.k.sum() != draws.positions.size:
        raise ValueError("masked tokens must number k in all")

    def ints(values: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(values, dtype=np.int64)

    out, ends = _encode(
        np.ascontiguousarray(source, dtype=np.uint8),
        ints(draws.runs),
        ints(draws.lengths),
        ints(draws.a),
        np.ascontiguousarray(draws.labels, dtype=np.uint8),
        ints(draws.k),
        ints(draws.positions),
        ints(draws.masked_ids),
        params.seq_length,
        params.max_predictions,
    )
    _put_crcs(out, ends)
    return out, ends
