"""Tests of the BERT dataset generator.

Records are shrunk (SMALL: 64 tokens, ~300 bytes each) and shards hold 60 records, so a dataset
of 100 kB has several shards and the whole file runs in seconds.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from tfrecord import example_pb2
from tfrecord.writer import TFRecordWriter

from core.errors import UserError
from datagen.bert import (
    CLS_ID,
    CONTENT_VERSION,
    FIRST_WORD_ID,
    SEP_ID,
    BertGenParams,
    Draws,
    TextPool,
    block_records,
    calibrate,
    draw_arrays,
    generate_bert,
    make_pool,
    max_record_bytes,
    plan_bert_shards,
    pool_tokens,
    record_sizes,
    varint_sizes,
)
from datagen.bert_encode import ENTRY_ORDER, encode_block, encode_varints
from datagen.common import load_manifest
from tests.datagen_helpers import (
    assert_bad_requests_refused,
    assert_progress_reaches_the_total,
    assert_same_with_one_writer,
    data_files,
    dataset_fixture,
    user_directory,
)
from workloads.bert.files import FEATURES, check_dataset, count_records, list_shards, read_shape
from workloads.bert.records import iter_records, parse_example

SMALL = BertGenParams(seq_length=64, max_predictions=10, records_per_file=60)
SIZE = 100_000


def decoded(directory: Path) -> list[dict[str, np.ndarray]]:
    """Every record of the dataset, shard by shard, decoded by protobuf."""
    return [
        parse_example(data, path.name, list(FEATURES))
        for path in list_shards(directory)
        for data in iter_records(path)
    ]


dataset = dataset_fixture("bert", generate_bert, SIZE, seed=7, workers=2, params=SMALL)


# --------------------------------------------------------------------------------------------
# Layout, sizes, manifest


def test_shards_hold_records_per_file_except_the_last(dataset: tuple[Path, dict]) -> None:
    out, manifest = dataset
    shards = manifest["params"]["shards"]
    assert shards >= 4
    names = [f"part-{i:05d}-of-{shards:05d}" for i in range(shards)]
    assert data_files(out) == set(names)
    assert [f["name"] for f in manifest["files"]] == names
    counts = [count_records(out / name) for name in names]
    assert counts[:-1] == [SMALL.records_per_file] * (shards - 1)
    assert 1 <= counts[-1] <= SMALL.records_per_file
    assert [f["records"] for f in manifest["files"]] == counts
    summary = check_dataset(out)
    assert summary.items == manifest["params"]["records"] == sum(counts)
    assert summary.files == shards
    assert summary.bytes == manifest["total_bytes"]
    assert read_shape(out) == (SMALL.seq_length, SMALL.max_predictions)


def test_total_lands_just_under_the_requested_size(dataset: tuple[Path, dict]) -> None:
    _, manifest = dataset
    total = manifest["total_bytes"]
    assert total <= SIZE
    last = manifest["files"][-1]
    if last["records"] < SMALL.records_per_file:
        # The last shard was cut by the size: the next record would not have fitted.
        assert SIZE - total < max_record_bytes(SMALL)
    else:
        assert SIZE - total <= plan_bert_shards(SIZE, 7, SMALL).reserve_bytes


@pytest.mark.parametrize("size", [3_000, 17_777, 45_000, 250_000])
def test_size_is_never_exceeded(tmp_path: Path, size: int) -> None:
    params = BertGenParams(seq_length=32, max_predictions=5, records_per_file=40)
    manifest = generate_bert(tmp_path / "ds", size, seed=size, workers=2, params=params)
    assert manifest["total_bytes"] <= size
    plan = plan_bert_shards(size, size, params)
    assert size - manifest["total_bytes"] <= plan.reserve_bytes
    assert check_dataset(tmp_path / "ds").items == manifest["params"]["records"]


def test_manifest_records_the_generation(dataset: tuple[Path, dict]) -> None:
    out, manifest = dataset
    loaded = load_manifest(out)
    assert loaded == json.loads(json.dumps(manifest))
    assert loaded["generator"] == "bert"
    assert loaded["seed"] == 7 and loaded["requested_bytes"] == SIZE
    params = loaded["params"]
    assert params["seq_length"] == 64 and params["max_predictions"] == 10
    assert params["records_per_file"] == 60 and params["vocab_size"] == 30522
    assert params["content_version"] == CONTENT_VERSION == 2
    for entry in loaded["files"]:
        assert entry["bytes"] == (out / entry["name"]).stat().st_size
    assert loaded["total_bytes"] == sum(f["bytes"] for f in loaded["files"])


def test_default_records_are_the_size_of_real_ones() -> None:
    mean, std = calibrate(0, BertGenParams())
    assert 2300 < mean < 2800  # MLPerf's records are ~2.5 kB
    assert 0 < std < 400
    assert 3000 < max_record_bytes() < 4000


# --------------------------------------------------------------------------------------------
# Content


def test_records_are_shaped_like_create_pretraining_data(dataset: tuple[Path, dict]) -> None:
    out, _ = dataset
    records = decoded(out)
    s, p = SMALL.seq_length, SMALL.max_predictions
    labels = set()
    for r in records:
        ids, mask, seg = r["input_ids"], r["input_mask"], r["segment_ids"]
        assert ids.shape == mask.shape == seg.shape == (s,)
        length = int(mask.sum())
        assert mask[:length].all() and not mask[length:].any()
        assert SMALL.min_tokens <= length <= s
        assert ids[0] == CLS_ID and ids[length - 1] == SEP_ID and not ids[length:].any()
        seps = np.flatnonzero(ids[:length] == SEP_ID)
        assert len(seps) == 2
        # segment_ids: 0 over [CLS] A [SEP], 1 over B [SEP], 0 in the padding.
        assert seg.tolist() == [0] * (seps[0] + 1) + [1] * (length - seps[0] - 1) + [0] * (
            s - length
        )
        assert ((ids >= FIRST_WORD_ID) | np.isin(ids, [0, CLS_ID, SEP_ID])).all()
        assert (ids < SMALL.vocab_size).all()

        k = int(r["masked_lm_weights"].sum())
        assert k == min(p, max(1, int(np.floor((length - 3) * 0.15 + 0.5))))
        assert r["masked_lm_weights"].tolist() == [1.0] * k + [0.0] * (p - k)
        positions = r["masked_lm_positions"][:k]
        assert (np.diff(positions) > 0).all()  # sorted, distinct
        assert not r["masked_lm_positions"][k:].any() and not r["masked_lm_ids"][k:].any()
        assert ((positions > 0) & (positions < length - 1) & (positions != seps[0])).all()
        # The labels are the ids at those positions (input_ids keep them: no [MASK]).
        assert r["masked_lm_ids"][:k].tolist() == ids[positions].tolist()
        assert (ids[positions] >= FIRST_WORD_ID).all()
        labels.add(int(r["next_sentence_labels"][0]))
    assert labels == {0, 1}


def encoded_block(
    params: BertGenParams, pool_seed: Any, seed: Any
) -> tuple[TextPool, Draws, bytes]:
    """A pool, the first block drawn from it, and that block's framed records."""
    pool = make_pool(np.random.default_rng(pool_seed), pool_tokens(params), params, encode_varints)
    draws = draw_arrays(np.random.default_rng(seed), block_records(params), params, pool)
    return pool, draws, encode_block(draws, pool, params)[0].tobytes()


def test_masked_ids_are_the_tokens_at_their_positions_in_the_longest_records() -> None:
    # Runs of masking candidates longer than 32768 tokens (the int32 overflow of version 1).
    params = BertGenParams(seq_length=65535, max_predictions=1, records_per_file=50)
    _, _, data = encoded_block(params, 3, 4)
    for payload in iter_bytes(data):
        r = parse_example(payload)
        position = int(r["masked_lm_positions"][0])
        assert r["masked_lm_ids"][0] == r["input_ids"][position] >= FIRST_WORD_ID


def test_passages_come_from_the_pool_and_b_follows_a_unless_labelled_random() -> None:
    params = BertGenParams(seq_length=48, max_predictions=8, records_per_file=200)
    pool, _, data = encoded_block(params, 1, 2)

    def in_pool(tokens: np.ndarray) -> bool:
        windows = np.lib.stride_tricks.sliding_window_view(pool.ids, tokens.size)
        return bool((windows == tokens).all(axis=1).any())

    follows = random = 0
    for payload in iter_bytes(data):
        r = parse_example(payload, "record", list(FEATURES))
        length = int(r["input_mask"].sum())
        sep = int(np.flatnonzero(r["input_ids"] == SEP_ID)[0])
        a, b = r["input_ids"][1:sep], r["input_ids"][sep + 1 : length - 1]
        assert in_pool(a) and in_pool(b)
        if r["next_sentence_labels"][0] == 0:
            assert in_pool(np.concatenate([a, b]))
            follows += 1
        else:
            random += 1
    assert follows > 50 and random > 50


def iter_bytes(data: bytes) -> list[bytes]:
    """The payloads of framed records (CRCs are checked elsewhere)."""
    out, offset = [], 0
    while offset < len(data):
        length = int.from_bytes(data[offset : offset + 8], "little")
        out.append(data[offset + 12 : offset + 12 + length])
        offset += 16 + length
    return out


def test_word_ids_follow_a_zipf_like_law_over_the_whole_vocabulary(
    dataset: tuple[Path, dict],
) -> None:
    out, _ = dataset
    ids = np.concatenate([r["input_ids"] for r in decoded(out)])
    words = ids[ids >= FIRST_WORD_ID] - FIRST_WORD_ID
    n = SMALL.vocab_size - FIRST_WORD_ID
    # P(rank < r) = log(r + 1) / log(n + 1) for the continuous 1/x law.
    for r in (1, 10, 1000, 15_385):
        expected = np.log(r + 1) / np.log(n + 1)
        assert abs((words < r).mean() - expected) < 0.03, r
    # Ids >= 16384 (3-byte varints) occur, as in real data.
    assert 0.03 < (words >= 16384 - FIRST_WORD_ID).mean() < 0.09


# --------------------------------------------------------------------------------------------
# Determinism


def test_same_seed_gives_identical_bytes_whatever_the_worker_count(
    tmp_path: Path, dataset: tuple[Path, dict]
) -> None:
    again = assert_same_with_one_writer(
        generate_bert, dataset, tmp_path, SIZE, seed=7, params=SMALL
    )
    assert again["files"] == dataset[1]["files"]


def test_other_seed_other_content_and_smaller_size_a_prefix(
    tmp_path: Path, dataset: tuple[Path, dict]
) -> None:
    full, manifest = dataset
    name = manifest["files"][0]["name"]
    other = tmp_path / "other"
    generate_bert(other, SIZE, seed=8, workers=2, params=SMALL)
    assert (other / name).read_bytes() != (full / name).read_bytes()
    # A smaller dataset from the same seed: shard i holds the first records of shard i.
    small = tmp_path / "small"
    smaller = generate_bert(small, SIZE // 3, seed=7, workers=2, params=SMALL)
    assert smaller["params"]["shards"] < manifest["params"]["shards"]
    for i, entry in enumerate(smaller["files"]):
        mine = (small / entry["name"]).read_bytes()
        theirs = (full / manifest["files"][i]["name"]).read_bytes()
        assert theirs.startswith(mine) and mine


def test_content_of_a_seed_is_pinned(dataset: tuple[Path, dict]) -> None:
    """The bytes of a shard never change for a given seed without a new CONTENT_VERSION."""
    out, manifest = dataset
    assert manifest["params"]["content_version"] == CONTENT_VERSION
    data = (out / manifest["files"][0]["name"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == (
        "38d42cf4028808457e98e8446fcb636876b967d785ac19c5f63a92ef141378d6"
    )


# --------------------------------------------------------------------------------------------
# The encoder, against the tfrecord package's writer and protobuf

ENCODER_PARAMS = {
    "mlperf": BertGenParams(),
    "5-tokens": BertGenParams(seq_length=5, max_predictions=1, records_per_file=50),
    "8-tokens": BertGenParams(seq_length=8, max_predictions=2, records_per_file=50),
    "16-tokens": BertGenParams(seq_length=16, max_predictions=3, records_per_file=300),
    # input_ids' packed length straddles 128: its length prefixes differ in width in a block.
    "100-tokens": BertGenParams(seq_length=100, max_predictions=20, records_per_file=500),
    # Features straddle 16384 bytes: so does the Example's length prefix.
    "3500-tokens": BertGenParams(seq_length=3500, max_predictions=500, records_per_file=40),
    # Word ids of up to 3, 4 and 5 bytes.
    "vocab-2^17": BertGenParams(seq_length=64, max_predictions=10, vocab_size=1 << 17),
    "vocab-2^24": BertGenParams(seq_length=64, max_predictions=10, vocab_size=1 << 24),
    "vocab-2^31": BertGenParams(seq_length=128, max_predictions=20, vocab_size=1 << 31),
    "1-record-blocks": BertGenParams(seq_length=64, max_predictions=10, records_per_file=1),
}

_SERIALIZE = TFRecordWriter.serialize_tf_example


def serialize_in_order(datum: dict[str, tuple[list, str]]) -> bytes:
    """The writer's Example, its map entries in ``datum``'s order.

    protobuf (upb) writes map entries in the order of its hash table, which no encoder can
    follow; every entry here is protobuf's own bytes (a one-entry Features), in a fixed order,
    and the message is the writer's (checked).
    """
    features = b"".join(
        example_pb2.Example.FromString(_SERIALIZE({name: value})).features.SerializeToString()
        for name, value in datum.items()
    )
    example = b"\n" + _VarintBytes(len(features)) + features  # Example.features, field 1
    assert example_pb2.Example.FromString(example) == example_pb2.Example.FromString(
        _SERIALIZE(datum)
    )
    return example


def writer_data(pool: TextPool, draws: Draws, params: BertGenParams) -> list[dict]:
    """Each drawn record's features as the tfrecord writer takes them, in ENTRY_ORDER.

    Values from the draws' definition (see :class:`datagen.bert.Draws`), not from any encoder:
    input_ids are [CLS] A [SEP] B [SEP] and zeros, A and B the pool tokens whose varints the
    runs cover.
    """
    s, p = params.seq_length, params.max_predictions

    def tokens(start: int, size: int) -> list[int]:
        first, last = np.searchsorted(pool.offsets, [start, start + size])
        assert pool.offsets[first] == start and pool.offsets[last] == start + size
        return pool.ids[first:last].tolist()

    records, first = [], 0
    for i, length in enumerate(draws.lengths.tolist()):
        runs, k, a = draws.runs[i].tolist(), int(draws.k[i]), int(draws.a[i])
        assert runs[0] == [pool.cls_at, 1] and runs[2] == runs[4] == [pool.sep_at, 1]
        ids = [CLS_ID, *tokens(*runs[1]), SEP_ID, *tokens(*runs[3]), SEP_ID]
        assert len(ids) == length
        masked = slice(first, first + k)
        first += k
        values = {
            "input_ids": ids + [0] * (s - length),
            "input_mask": [1] * length + [0] * (s - length),
            "segment_ids": [0] * (a + 2) + [1] * (length - a - 2) + [0] * (s - length),
            "masked_lm_positions": draws.positions[masked].tolist() + [0] * (p - k),
            "masked_lm_ids": draws.masked_ids[masked].tolist() + [0] * (p - k),
            "masked_lm_weights": [1.0] * k + [0.0] * (p - k),
            "next_sentence_labels": [int(draws.labels[i])],
        }
        kinds = {name: "float" if FEATURES[name][0] == "float" else "int" for name in ENTRY_ORDER}
        records.append({name: (values[name], kinds[name]) for name in ENTRY_ORDER})
    return records


@pytest.mark.parametrize("params", ENCODER_PARAMS.values(), ids=ENCODER_PARAMS.keys())
def test_encoder_writes_the_files_of_the_tfrecord_writer(
    params: BertGenParams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(TFRecordWriter, "serialize_tf_example", staticmethod(serialize_in_order))
    for block in range(3):
        pool, draws, data = encoded_block(params, 3, [5, block])
        path = tmp_path / f"block{block}.tfrecord"
        writer = TFRecordWriter(str(path))
        for datum in writer_data(pool, draws, params):
            writer.write(datum)
        writer.close()
        assert data == path.read_bytes()


@pytest.mark.parametrize("params", ENCODER_PARAMS.values(), ids=ENCODER_PARAMS.keys())
def test_planning_sizes_records_as_the_encoder_writes_them(params: BertGenParams) -> None:
    pool = make_pool(np.random.default_rng(3), pool_tokens(params), params, encode_varints)
    plain = make_pool(np.random.default_rng(3), pool_tokens(params), params)
    assert plain.source is None and plain.offsets.tolist() == pool.offsets.tolist()
    for block in range(3):
        draws = draw_arrays(np.random.default_rng([5, block]), block_records(params), params, pool)
        _, ends = encode_block(draws, pool, params)
        assert record_sizes(draws, params).tolist() == np.diff(ends, prepend=0).tolist()
        assert np.diff(ends, prepend=0).max() <= max_record_bytes(params)


def test_encoder_params_reach_the_varint_widths_they_are_named_for() -> None:
    """Length prefixes of two widths in one block, word ids of 3 to 5 bytes: see ENCODER_PARAMS."""

    def block(name: str) -> tuple[Draws, np.ndarray]:
        """The first block's draws and record sizes (framed)."""
        params = ENCODER_PARAMS[name]
        pool = make_pool(np.random.default_rng(3), pool_tokens(params), params)
        draws = draw_arrays(np.random.default_rng([5, 0]), block_records(params), params, pool)
        return draws, record_sizes(draws, params)

    draws, _ = block("100-tokens")
    text = draws.runs[:, :, 1].sum(axis=1) + 100 - draws.lengths
    assert text.min() < 128 <= text.max()
    _, records = block("3500-tokens")
    assert records.min() < 16384 < records.max()
    for vocab, widest in [("2^17", 3), ("2^24", 4), ("2^31", 5)]:
        draws, _ = block(f"vocab-{vocab}")
        assert draws.masked_ids.max() >= 1 << (7 * (widest - 1))


def test_entry_order_names_every_feature() -> None:
    assert sorted(ENTRY_ORDER) == sorted(FEATURES)


def test_importing_the_generator_and_planning_leave_numba_for_the_writers() -> None:
    code = (
        "import sys, datagen.bert as b\n"
        "b.plan_bert_shards(10**7, 0, b.BertGenParams(records_per_file=100))\n"
        "assert 'numba' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


# --------------------------------------------------------------------------------------------
# Validation


def test_non_empty_directory_is_refused_without_force(tmp_path: Path) -> None:
    message = "is not empty: choose an empty directory or pass --force"
    with user_directory(tmp_path) as out, pytest.raises(UserError, match=message):
        generate_bert(out, SIZE, params=SMALL)
    first = generate_bert(tmp_path / "again", SIZE, params=SMALL)
    with pytest.raises(UserError, match="not empty"):
        generate_bert(tmp_path / "again", SIZE // 2, params=SMALL)
    second = generate_bert(tmp_path / "again", SIZE // 2, params=SMALL, force=True)
    assert second["params"]["shards"] < first["params"]["shards"]
    assert data_files(tmp_path / "again") == {f["name"] for f in second["files"]}


def test_sizes_too_small_or_not_whole_are_rejected_before_touching_anything(
    tmp_path: Path,
) -> None:
    minimum = max_record_bytes(SMALL)
    assert_bad_requests_refused(generate_bert, tmp_path / "a", minimum, SIZE, params=SMALL)
    # The smallest size holds one record.
    manifest = generate_bert(tmp_path / "b", minimum, params=SMALL)
    assert manifest["params"]["records"] == 1 and manifest["total_bytes"] <= minimum


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_length": 4}, "seq_length must be between 5"),
        ({"seq_length": 70_000}, "seq_length must be between 5"),
        ({"seq_length": 64, "max_predictions": 62}, r"max_predictions must be between 1 and .*61"),
        ({"max_predictions": 0}, "max_predictions"),
        ({"records_per_file": 0}, "records_per_file must be at least 1"),
        ({"vocab_size": 999}, "vocab_size must be between 1000"),
        ({"seq_length": 12.5}, "seq_length must be a whole number"),
    ],
)
def test_invalid_params_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        BertGenParams(**kwargs)


def test_progress_reports_reach_the_total(tmp_path: Path) -> None:
    assert_progress_reaches_the_total(generate_bert, tmp_path / "ds", SIZE, workers=2, params=SMALL)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int64])
def test_pool_varints_are_protobufs(dtype: type) -> None:
    high = min(np.iinfo(dtype).max, 2**31)
    values = np.random.default_rng(5).integers(0, high, 10_000, endpoint=True).astype(dtype)
    values[:4] = [0, 127, 128, high]
    source, offsets = encode_varints(values)
    assert source.tobytes() == b"".join(_VarintBytes(v) for v in values.tolist())
    assert np.diff(offsets).tolist() == varint_sizes(values).tolist()
    assert offsets[0] == 0 and offsets[-1] == source.size
    empty = encode_varints(np.empty(0, dtype=dtype))
    assert empty[0].size == 0 and empty[1].tolist() == [0]
    with pytest.raises(ValueError, match="non-negative"):
        encode_varints(np.array([-1]))
