"""Synthetic MLPerf BERT pre-training data: TFRecord shards of ``tf.train.Example``.

Layout (as the MLCommons BERT reference reads it): files ``part-%05d-of-%05d`` in one directory,
each a TFRecord file of Examples with the features of :data:`workloads.bert.files.FEATURES`:
input_ids, input_mask, segment_ids (int64 x seq_length), masked_lm_positions, masked_lm_ids
(int64 x max_predictions), masked_lm_weights (float x max_predictions), next_sentence_labels
(int64 x 1). A default record is about 2.6 kB.

Content of one record, shaped like the output of BERT's ``create_pretraining_data.py``:

- a real length L uniform in [max(5, seq_length // 8), seq_length], then zero padding;
- ``[CLS] A [SEP] B [SEP]`` with the split uniform (A and B at least one token); segment_ids 0
  over ``[CLS] A [SEP]``, 1 over ``B [SEP]``, 0 in the padding; input_mask 1 over the L tokens;
- A and B are passages of the shard's text pool (:func:`make_pool`): word ids Zipf-like over
  the WordPiece vocabulary, rank r = floor((V' + 1)^u) - 1 for u uniform (P(r) ~ 1 / (r + 1.5),
  Zipf with exponent 1), id = 999 + r, so frequent words have small ids and take 2-byte
  varints, rare ones (ids >= 16384, ~6%) 3 bytes, as in the real files. B follows A in the pool
  when next_sentence_labels is 0, and is a random passage when it is 1 (equally likely). The
  pool holds a quarter of the tokens the shard's records use (at most 2^20), so a passage
  appears about four times per shard in different windows, as every document does dupe_factor
  (10) times in the reference's data;
- round(15%) of the non-special tokens masked, at most max_predictions, one drawn from each of k
  equal runs of candidates: sorted positions, the ids at those positions in masked_lm_ids,
  weights 1.0 then 0.0 padding. input_ids keep those tokens (the reference shows [MASK] at 80%
  of them, one byte instead of two or three: records ~1.5% smaller).

Determinism: record j of shard i is a function of (seed, i, j) and the params only (blocks of up to
:data:`BLOCK_RECORDS` records, each from its own generator), whatever the number of workers.

Size: every shard but the last holds ``records_per_file`` records; the last is filled with whole
records up to the bytes that remain, so the total is at most ``size_bytes`` and usually short of
it by less than one record. Record sizes vary (varints), so the number of shards is planned from
the mean record size measured on a calibration sample, keeping a reserve for sampling error (see
:func:`plan_bert_shards`); the full shards are written first, in parallel, then the last one.

Speed: records are drawn a block at a time with numpy (:func:`draw_arrays`); input_ids are runs
of the pool's pre-encoded bytes, so a record's text costs two slices rather than per-token work
(the pool, a quarter of the shard's tokens, is the only per-token work). A compiled kernel,
:func:`datagen.bert_encode.encode_block`, writes a block's framed records. One process draws
and encodes ~1.8 GB/s (~0.5 ms to draw and ~1 ms to encode a block of 1024 default records,
CRCs included), measured on a 2-vCPU AMD EPYC VM. Importing numba and loading the compiled
kernel costs ~1 s, paid once per run by the writers' fork server (:data:`WORKER_PRELOAD`),
never by the CLI or the planning (which sizes records with :func:`record_sizes`, in numpy); the
first run on a machine compiles it instead (~8 s) and caches it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from core.errors import UserError
from core.units import format_size
from datagen.common import FileSink, FileTask, check_seed, check_size_bytes
from datagen.driver import Job, Written, generator
from workloads.bert.files import FEATURES, SHARD_FORMAT
from workloads.bert.records import FOOTER_BYTES, HEADER_BYTES

GENERATOR = "bert"
# Imported by the writer processes' fork server (datagen.common.set_worker_preload): the kernel
# is loaded once there (~1 s: numba and its cache), not in every writer nor in the CLI.
WORKER_PRELOAD = ("datagen.bert_encode",)
# Bump when the content written for a given (seed, params) changes: recorded in the manifest so
# that two datasets from the same seed can be told apart.
CONTENT_VERSION = 2
# 2: masked positions drawn without int32 overflow; only records whose runs of masking
# candidates exceed 32768 tokens change (huge seq_length, few max_predictions), not the defaults.

# Records drawn and encoded together: ~2.7 MB of output, ~25 MB of temporaries.
BLOCK_RECORDS = 1024
CLS_ID, SEP_ID = 101, 102
# First id of the WordPiece vocabulary after [PAD], [unused*], [UNK], [CLS], [SEP], [MASK].
FIRST_WORD_ID = 999
MASKED_FRACTION = 0.15
# [CLS] a [SEP] b [SEP]: the shortest record with both segments.
MIN_TOKENS = 5
CALIBRATION_RECORDS = 4096
# Generator streams: a block of records is (seed, 0, shard, block), the calibration sample
# (seed, 1), a shard's text pool (seed, 2, shard).
_DATA_STREAM = 0
_CALIBRATION_STREAM = 1
_POOL_STREAM = 2
MAX_POOL_TOKENS = 1 << 20


@dataclasses.dataclass(frozen=True)
class BertGenParams:
    """Shape of the generated records and shards (defaults: MLPerf BERT, Wikipedia 2020-01-01).

    ``records_per_file`` is the record count of every shard but the last (the default keeps a
    shard near 40 MB; MLPerf's 500 shards are larger).
    """

    seq_length: int = 512
    max_predictions: int = 76
    records_per_file: int = 16384
    vocab_size: int = 30522

    def __post_init__(self) -> None:
        for name in ("seq_length", "max_predictions", "records_per_file", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"{name} must be a whole number, got {value!r}")
        if not MIN_TOKENS <= self.seq_length <= 0xFFFF:
            raise UserError(
                f"seq_length must be between {MIN_TOKENS} and 65535, got {self.seq_length}"
            )
        if not 1 <= self.max_predictions <= self.seq_length - 3:
            raise UserError(
                f"max_predictions must be between 1 and seq_length - 3 ({self.seq_length - 3}), "
                f"got {self.max_predictions}"
            )
        if self.records_per_file < 1:
            raise UserError(f"records_per_file must be at least 1, got {self.records_per_file}")
        if not FIRST_WORD_ID < self.vocab_size <= 2**31:
            raise UserError(
                f"vocab_size must be between {FIRST_WORD_ID + 1} and 2^31 (word ids start at "
                f"{FIRST_WORD_ID}, as in BERT's vocabulary), got {self.vocab_size}"
            )

    @property
    def min_tokens(self) -> int:
        """The shortest real length a record is drawn with."""
        return max(MIN_TOKENS, self.seq_length // 8)


# --------------------------------------------------------------------------------------------
# Content


@lru_cache(maxsize=8)
def zipf_table(vocab_size: int) -> np.ndarray:
    """The word id for each 16-bit random draw u: a Zipf-like law over the vocabulary.

    Inverse CDF of the continuous 1/x law on [1, V' + 1] (V' word ids from 999) at the middle
    of u's bucket: rank r = floor((V' + 1)^((u + 0.5) / 65536)) - 1, so P(r) ~ 1 / (r + 1.5)
    down to 1/65536, and the rarest ranks share buckets (every few-th rare word appears).
    A gather from this table costs a fraction of drawing a float and taking its exp.
    """
    words = vocab_size - FIRST_WORD_ID
    u = (np.arange(1 << 16) + 0.5) / (1 << 16)
    ranks = np.minimum(np.floor(np.exp(u * math.log(words + 1))).astype(np.int64) - 1, words - 1)
    return (FIRST_WORD_ID + ranks).astype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _uint16s(rng: np.random.Generator, count: int) -> np.ndarray:
    # Four draws per 64-bit output of the bit generator: the cheapest random numbers numpy has.
    return rng.bit_generator.random_raw((count + 3) // 4).view(np.uint16)[:count]


@lru_cache(maxsize=8)
def _ones_then_zeros(length: int) -> np.ndarray:
    """(length + 1, length) uint8 view: row i is length - i ones, then i zeros."""
    template = np.concatenate([np.ones(length, np.uint8), np.zeros(length, np.uint8)])
    return np.lib.stride_tricks.sliding_window_view(template, length)


def pool_tokens(params: BertGenParams) -> int:
    """Tokens in a shard's text pool: a quarter of what its records use, within bounds.

    So each passage appears about four times per shard, in windows that start and end at
    different tokens (the reference's create_pretraining_data.py writes every document
    dupe_factor = 10 times); at least 4 x seq_length, at most 2^20 (2 MB).
    """
    mean_tokens = (params.min_tokens + params.seq_length) // 2
    wanted = params.records_per_file * mean_tokens // 4
    return min(MAX_POOL_TOKENS, max(4 * params.seq_length, wanted))


@dataclasses.dataclass(frozen=True)
class TextPool:
    """The text a shard's records are cut from: Zipf-like word ids, pre-encoded as varints.

    ``source`` holds the tokens' varints (token i at ``offsets[i]:offsets[i + 1]``), then one
    [CLS] and one [SEP] (at ``cls_at`` and ``sep_at``), so that a record's input_ids are five
    runs of it, [CLS], A, [SEP], B, [SEP], and its padding. A pool made without an encoder has
    no ``source`` (None): its offsets are enough to size records (planning).
    """

    ids: np.ndarray
    offsets: np.ndarray
    cls_at: int
    sep_at: int
    source: np.ndarray | None


def make_pool(
    rng: np.random.Generator,
    tokens: int,
    params: BertGenParams,
    encode: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
) -> TextPool:
    """A pool of ``tokens`` word ids drawn from ``rng``.

    ``encode``: the compiled varint encoder (:func:`datagen.bert_encode.encode_varints`, the
    writers'), which gives the pool its ``source``; without it the offsets come from
    :func:`varint_sizes` and the pool only sizes records, so planning never loads numba.
    """
    ids = zipf_table(params.vocab_size).take(_uint16s(rng, tokens))
    if encode is None:
        offsets = np.zeros(ids.size + 1, dtype=np.int64)
        np.cumsum(varint_sizes(ids), out=offsets[1:])
        size, source = int(offsets[-1]), None
    else:
        encoded, offsets = encode(ids)
        size = encoded.size
        source = np.concatenate([encoded, np.array([CLS_ID, SEP_ID], dtype=np.uint8)])
    return TextPool(ids, offsets, size, size + 1, source)


@dataclasses.dataclass(frozen=True)
class Draws:
    """The drawn values of a block of records, before any encoding (see :func:`draw_arrays`).

    Per record: ``lengths`` (real tokens L), ``a`` (tokens of segment A), ``runs`` (5, 2): start
    and length in the pool's ``source`` of the input_ids' [CLS], A, [SEP], B, [SEP] bytes,
    ``labels`` (next_sentence_labels, uint8) and ``k`` (masked tokens); ``positions`` (uint16)
    and ``masked_ids`` hold the masked tokens of every record, one record after the other.
    """

    lengths: np.ndarray
    a: np.ndarray
    runs: np.ndarray
    labels: np.ndarray
    k: np.ndarray
    positions: np.ndarray
    masked_ids: np.ndarray


def draw_arrays(rng: np.random.Generator, n: int, params: BertGenParams, pool: TextPool) -> Draws:
    """``n`` records drawn from ``rng`` and cut from ``pool``, as the arrays that define them."""
    s, p = params.seq_length, params.max_predictions
    lengths = rng.integers(params.min_tokens, s, size=n, endpoint=True)
    # Tokens of segment A: uniform in [1, L - 4]; B gets the rest, at least one.
    a = 1 + (rng.random(n) * (lengths - 4)).astype(np.int64)
    b = lengths - 3 - a
    # As in create_pretraining_data.py, label 1 means B is a random passage; 0 that B follows A.
    random_next = rng.integers(0, 2, size=n, dtype=np.uint8)
    tokens = pool.ids.size
    start_a = rng.integers(0, tokens - (lengths - 3), endpoint=True)
    start_b = np.where(random_next == 1, rng.integers(0, tokens - b, endpoint=True), start_a + a)

    # input_ids: [CLS] A [SEP] B [SEP] as five runs of the pool's bytes (then zeros).
    offsets = pool.offsets
    byte_a, byte_b = offsets[start_a], offsets[start_b]
    runs = np.empty((n, 5, 2), dtype=np.int64)
    runs[:, :, 0] = [pool.cls_at, 0, pool.sep_at, 0, pool.sep_at]
    runs[:, :, 1] = [1, 0, 1, 0, 1]
    runs[:, 1, 0], runs[:, 1, 1] = byte_a, offsets[start_a + a] - byte_a
    runs[:, 3, 0], runs[:, 3, 1] = byte_b, offsets[start_b + b] - byte_b

    # Masked tokens: k = round(15%) of the L - 3 non-special ones, capped at max_predictions,
    # one drawn uniformly from each of k equal runs of candidates, hence distinct and sorted.
    candidates = lengths - 3
    k = np.clip(np.floor(candidates * MASKED_FRACTION + 0.5).astype(np.int64), 1, p)
    # Run j is [floor(j r), floor((j + 1) r)) with r = candidates / k >= 1: never empty. Float
    # rounding may move a boundary by one, consistently for both runs that share it.
    bounds = (np.arange(p + 1, dtype=np.float64) * (candidates / k)[:, None]).astype(np.int32)
    # int64: a run may hold up to 65532 candidates, and run length x 65535 overflows int32.
    u = _uint16s(rng, n * p).reshape(n, p).astype(np.int64)
    chosen = bounds[:, :-1] + ((bounds[:, 1:] - bounds[:, :-1]) * u >> 16)
    chosen = chosen[np.arange(p) < k[:, None]]
    in_a = chosen < np.repeat(a, k)
    # Candidate c is token 1 + c of A, or token 2 + c once past A's [SEP]; its id comes from
    # the pool. input_ids keep the original token there (the reference shows [MASK] at 80%).
    positions = 1 + chosen + ~in_a
    pool_index = np.where(in_a, np.repeat(start_a, k) + chosen, np.repeat(start_b - a, k) + chosen)
    return Draws(
        lengths=lengths,
        a=a,
        runs=runs,
        labels=random_next,
        k=k,
        positions=positions.astype(np.uint16),
        masked_ids=pool.ids.take(pool_index),
    )


# --------------------------------------------------------------------------------------------
# Sizes, without encoding (numpy: planning never loads the compiled encoder)


def varint_sizes(values: np.ndarray | int) -> np.ndarray:
    """Bytes of the protobuf varint of each non-negative integer, as int64."""
    values = np.asarray(values)
    sizes = np.ones(values.shape, dtype=np.int64)
    top = int(values.max(initial=0))
    k = 1
    while top >> (7 * k):
        sizes += values >= 1 << (7 * k)
        k += 1
    return sizes


def _entry_bytes(key: str, size: np.ndarray | int) -> np.ndarray:
    """Bytes of a map entry of Features whose packed list holds ``size`` bytes."""
    list_len = 1 + varint_sizes(size) + size
    feature_len = 1 + varint_sizes(list_len) + list_len
    entry_len = 2 + varint_sizes(len(key)) + len(key) + varint_sizes(feature_len) + feature_len
    return 1 + varint_sizes(entry_len) + entry_len


def framed_bytes(packed: dict[str, np.ndarray | int]) -> np.ndarray:
    """Bytes of framed records given each feature's packed bytes (per record, or for all)."""
    assert sorted(packed) == sorted(FEATURES)
    features = sum(_entry_bytes(name, size) for name, size in packed.items())
    return HEADER_BYTES + 1 + varint_sizes(features) + features + FOOTER_BYTES


def record_sizes(draws: Draws, params: BertGenParams) -> np.ndarray:
    """Bytes of each drawn record as :func:`datagen.bert_encode.encode_block` frames it.

    For planning, which must not load the kernel: the kernel sizes records in its own compiled
    pass (this one costs ~0.3 ms a block, a fifth of a writer's time for it);
    tests/test_datagen_bert.py checks that the two agree.
    """
    s, p = params.seq_length, params.max_predictions
    firsts = np.cumsum(draws.k) - draws.k  # every record has k >= 1 masked tokens
    padding = p - draws.k
    return framed_bytes(
        {
            "input_ids": draws.runs[:, :, 1].sum(axis=1) + s - draws.lengths,
            "input_mask": s,
            "segment_ids": s,
            "masked_lm_positions": np.add.reduceat(varint_sizes(draws.positions), firsts) + padding,
            "masked_lm_ids": np.add.reduceat(varint_sizes(draws.masked_ids), firsts) + padding,
            "masked_lm_weights": 4 * p,
            "next_sentence_labels": 1,
        }
    )


@lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of returning it to the kernel.

    A block allocates tens of MB of temporaries. By default glibc maps each large one afresh
    and unmaps it when freed, so every block pays ~1,600 page faults, 10-15% of its time on a
    VM. Called once in each writer process; returns False (and changes nothing) where the C
    library is not glibc.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # M_TRIM_THRESHOLD (-1): keep up to 1 GiB free at the top of the heap; M_MMAP_THRESHOLD
    # (-3): serve allocations up to 32 MiB (glibc's maximum) from the heap, not fresh mappings.
    return bool(mallopt(-1, 1 << 30)) and bool(mallopt(-3, 32 << 20))


def block_records(params: BertGenParams) -> int:
    """Records per block: a shard is written as blocks of this many records (the last cut)."""
    return min(BLOCK_RECORDS, params.records_per_file)


def write_shard(
    sink: FileSink,
    seed: int,
    shard: int,
    records: int,
    budget: int | None,
    params: BertGenParams,
) -> dict[str, Any]:
    """Write shard ``shard``: ``records`` records, or fewer if ``budget`` bytes are reached first.

    Blocks are always drawn whole, so a shard cut short holds a prefix of the same shard written
    in full.
    """
    # Imported here, not with this module: numba costs the CLI and planning nothing.
    from datagen import bert_encode

    keep_freed_memory()
    pool_rng = np.random.default_rng([seed, _POOL_STREAM, shard])
    pool = make_pool(pool_rng, pool_tokens(params), params, encode=bert_encode.encode_varints)
    block = block_records(params)
    written = 0
    remaining = budget
    for index in range(math.ceil(records / block)):
        rng = np.random.default_rng([seed, _DATA_STREAM, shard, index])
        buffer, ends = bert_encode.encode_block(draw_arrays(rng, block, params, pool), pool, params)
        keep = min(block, records - written)
        if remaining is not None:
            keep = min(keep, int(np.searchsorted(ends, remaining, side="right")))
        if keep:
            end = int(ends[keep - 1])
            sink.write(buffer[:end])
            written += keep
            if remaining is not None:
                remaining -= end
        if keep < block:
            break
    return {"records": written}


# --------------------------------------------------------------------------------------------
# Plan


def max_record_bytes(params: BertGenParams | None = None) -> int:
    """An upper bound of one record's size (every varint at its widest): the minimum dataset size.

    Varints and length prefixes grow with their values, so the record of the largest values
    (every token the last word id, every masked position the last one) is the largest.
    """
    params = params or BertGenParams()
    s, p = params.seq_length, params.max_predictions
    word = int(varint_sizes(params.vocab_size - 1))
    return int(
        framed_bytes(
            {
                "input_ids": s * word,
                "input_mask": s,
                "segment_ids": s,
                "masked_lm_positions": p * int(varint_sizes(s - 1)),
                "masked_lm_ids": p * word,
                "masked_lm_weights": 4 * p,
                "next_sentence_labels": 1,
            }
        )
    )


@dataclasses.dataclass(frozen=True)
class BertPlan:
    """How :func:`generate_bert` lays out a dataset.

    ``shards - 1`` shards of ``records_per_file`` records, then the last shard filled with
    whole records (at most ``records_per_file``) up to the requested size. ``mean_record_bytes``
    and ``record_bytes_std`` come from the calibration sample; ``reserve_bytes`` is what the
    full shards are planned to leave unused at least (sampling error, and room for one record),
    which bounds the shortfall when the last shard is full.
    """

    shards: int
    records_per_file: int
    mean_record_bytes: float
    record_bytes_std: float
    reserve_bytes: int


def calibrate(seed: int, params: BertGenParams) -> tuple[float, float]:
    """(mean, standard deviation) of the record size over a sample drawn like the dataset."""
    pool_rng, rng = np.random.default_rng([seed, _CALIBRATION_STREAM]).spawn(2)
    # Sizes without the encoder: planning (~0.1 s) never imports numba and loads the kernel.
    pool = make_pool(pool_rng, pool_tokens(params), params)
    sizes = record_sizes(draw_arrays(rng, CALIBRATION_RECORDS, params, pool), params)
    return float(sizes.mean()), float(sizes.std())


def plan_bert_shards(
    size_bytes: int, seed: int = 0, params: BertGenParams | None = None
) -> BertPlan:
    """The shard layout :func:`generate_bert` writes for this size, seed and params.

    With n records in the full shards, mean m and deviation s of a record's size measured on
    a sample of N = :data:`CALIBRATION_RECORDS`, the full shards must leave at least
    ``n * 4 s / sqrt(N) + 6 s sqrt(n) + max_record_bytes`` bytes (4 standard errors of the
    estimated mean, 6 standard deviations of the sum, one record for the last shard); shards
    are dropped from the estimate ``ceil(size / (records_per_file * m))`` until they do. So the
    total falls short by less than one record, unless the last shard is full, when it falls
    short by at most the reserve (well under 1% of the size for more than a few shards).
    """
    params = params or BertGenParams()
    check_seed(seed)
    _check_size(size_bytes, params)
    mean, std = calibrate(seed, params)
    per_shard = params.records_per_file * mean
    largest = max_record_bytes(params)

    def reserve(full: int) -> int:
        n = full * params.records_per_file
        return math.ceil(n * 4 * std / math.sqrt(CALIBRATION_RECORDS) + 6 * std * math.sqrt(n))

    full = max(0, math.ceil(size_bytes / per_shard) - 1)
    while full > 0 and size_bytes - full * per_shard < reserve(full) + largest:
        full -= 1
    return BertPlan(
        shards=full + 1,
        records_per_file=params.records_per_file,
        mean_record_bytes=mean,
        record_bytes_std=std,
        reserve_bytes=reserve(full) + largest,
    )


def _check_size(size_bytes: int, params: BertGenParams) -> None:
    check_size_bytes(size_bytes)
    minimum = max_record_bytes(params)
    if size_bytes < minimum:
        raise UserError(
            f"dataset size {size_bytes} bytes ({format_size(size_bytes)}) may not hold one BERT "
            f"record of seq_length {params.seq_length}: ask for at least {minimum} bytes "
            f"({format_size(minimum)})"
        )


# --------------------------------------------------------------------------------------------
# Generator


def shard_name(index: int, shards: int) -> str:
    """``part-%05d-of-%05d``, the name of shard ``index`` of ``shards``."""
    return SHARD_FORMAT % (index, shards)


@generator(GENERATOR, BertGenParams)
def generate_bert(job: Job, params: BertGenParams) -> dict[str, Any]:
    """Generate a BERT dataset of about ``size_bytes`` in ``out`` and return its manifest.

    The shards are those of :func:`plan_bert_shards` (the total never exceeds ``size_bytes``):
    the full ones in parallel, then the last one alone, filled with what they left.
    """
    rpf = params.records_per_file

    def write(plan: BertPlan) -> Written:
        full_hint = round(rpf * plan.mean_record_bytes)
        last_hint = min(full_hint, job.size_bytes - (plan.shards - 1) * full_hint)
        full_tasks = [
            FileTask(
                shard_name(i, plan.shards), write_shard, (job.seed, i, rpf, None, params), full_hint
            )
            for i in range(plan.shards - 1)
        ]

        def progress_full(done: int, total: int) -> None:
            if job.progress is not None:
                job.progress(done, total + last_hint)

        files = job.run(full_tasks, progress=progress_full)
        # The last shard gets what the full ones left; it is written alone, after them.
        used = sum(f["bytes"] for f in files)
        budget = job.size_bytes - used
        last = plan.shards - 1

        def progress_last(done: int, total: int) -> None:
            if job.progress is not None:
                job.progress(used + done, used + total)

        last_task = FileTask(
            shard_name(last, plan.shards), write_shard, (job.seed, last, rpf, budget, params)
        )
        files += job.run([last_task], workers=1, progress=progress_last)
        if files[-1]["records"] == 0:
            # The plan's reserve is many standard deviations wide: reaching this is a bug.
            raise RuntimeError(
                f"the full shards left {budget} bytes, too few for one record of the last shard"
            )
        return files, {
            **dataclasses.asdict(params),
            "records": sum(f["records"] for f in files),
            "shards": plan.shards,
            "content_version": CONTENT_VERSION,
        }

    return job.generate(lambda: plan_bert_shards(job.size_bytes, job.seed, params), write)
