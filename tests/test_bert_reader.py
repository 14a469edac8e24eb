"""Tests of the BERT TFRecord encoder, reader, dataset check and torch dataset.

The encoder is checked against protobuf (``tfrecord.example_pb2``), the ``tfrecord`` package's
writer (byte for byte where map order cannot differ) and reader; the reader against damaged
files; BertBatches against a real DataLoader with two workers.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from tfrecord import example_pb2
from tfrecord.reader import tfrecord_loader
from tfrecord.writer import TFRecordWriter
from torch.utils.data import DataLoader

from core.errors import UserError
from workloads.bert.dataset import BertBatches, interleave
from workloads.bert.files import FEATURES, check_dataset, count_records, list_shards, read_shape
from workloads.bert.records import (
    Encoded,
    Padded,
    _varint,
    encode_examples,
    encode_examples_buffer,
    encode_varints,
    iter_records,
    masked_crc,
    parse_example,
)
from workloads.events import Emitter

SEQ, PRED = 16, 4


class Runs:
    """An Encoded feature and the values it stands for (the encoder cannot tell them)."""

    def __init__(self, rng: np.random.Generator, n: int) -> None:
        corpus = rng.integers(0, 2**35, 300)
        corpus[::5] = rng.integers(0, 128, 60)  # some one-byte values, some zeros
        source, offsets = encode_varints(corpus)
        begin = rng.integers(0, 200, (n, 2))
        count = rng.integers(1, 40, (n, 2))
        # A separator (the same run in every record), then two runs of the corpus.
        starts = np.concatenate([np.full((n, 1), offsets[3]), offsets[begin]], axis=1)
        ends = np.concatenate([np.full((n, 1), offsets[4]), offsets[begin + count]], axis=1)
        zeros = rng.integers(0, 4, n)  # zero values after the runs (padding)
        self.feature = Encoded(source, starts, ends - starts, zeros=zeros)
        self.values = [
            np.concatenate(
                [corpus[3:4]]
                + [corpus[b : b + c] for b, c in zip(bs, cs, strict=True)]
                + [np.zeros(z, dtype=np.int64)]
            )
            for bs, cs, z in zip(begin, count, zeros, strict=True)
        ]


def reference_example(features: dict, i: int) -> example_pb2.Example:
    """Record ``i`` built with protobuf, the slow reference."""
    example = example_pb2.Example()
    for name, array in features.items():
        if isinstance(array, Runs):
            row = array.values[i]
        else:
            row = (array.dense() if isinstance(array, Padded) else array)[i]
        if row.dtype.kind == "f":
            example.features.feature[name].float_list.value.extend(row.tolist())
        else:
            example.features.feature[name].int64_list.value.extend(row.tolist())
    return example


def split_frames(data: bytes) -> list[tuple[bytes, bytes, bytes]]:
    """(length bytes, length CRC, payload) of each framed record, plus its data CRC check."""
    frames, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        header, crc = data[offset : offset + 8], data[offset + 8 : offset + 12]
        payload = data[offset + 12 : offset + 12 + length]
        assert data[offset + 12 + length : offset + 16 + length] == TFRecordWriter.masked_crc(
            payload
        )
        frames.append((header, crc, payload))
        offset += 16 + length
    assert offset == len(data)
    return frames


def random_features(rng: np.random.Generator, n: int) -> dict:
    counts = rng.integers(0, 9, n)
    return {
        "runs": Runs(rng, n),
        "more_runs": Runs(rng, n),  # a second Encoded: its zeros are copied, not left in place
        "small": rng.integers(0, 2, (n, 7)),  # one byte per value
        "ids": rng.integers(0, 40_000, (n, 9)).astype(np.int32),  # 1-3 byte varints
        "two_bytes": rng.integers(128, 16_384, (n, 3)),  # one width >1: fixed-size entry
        "wide": rng.integers(0, 2**62, (n, 2)),  # up to 9-byte varints
        "negative": rng.integers(-(2**40), 2**40, (n, 3)),  # 10-byte varints
        "weights": rng.random((n, 5)).astype(np.float32),
        "empty": np.zeros((n, 0), dtype=np.int64),
        "padded": Padded(rng.integers(1, 70_000, int(counts.sum())), counts, 8),
        "padded16": Padded(rng.integers(0, 65_536, int(counts.sum())).astype(np.uint16), counts, 8),
    }


# --------------------------------------------------------------------------------------------
# Encoder


@pytest.mark.parametrize("seed", range(5))
def test_encoder_matches_protobuf_record_by_record(seed: int) -> None:
    rng = np.random.default_rng(seed)
    features = random_features(rng, 40)
    buffer, ends = encode_examples_buffer(
        {k: v.feature if isinstance(v, Runs) else v for k, v in features.items()}
    )
    frames = split_frames(buffer.tobytes())
    assert len(frames) == 40
    assert ends.tolist() == np.cumsum([16 + len(p) for _, _, p in frames]).tolist()
    for i, (header, crc, payload) in enumerate(frames):
        reference = reference_example(features, i)
        assert example_pb2.Example.FromString(payload) == reference
        # Same size as protobuf's own encoding: canonical varints, empty lists left out.
        assert len(payload) == reference.ByteSize()
        assert struct.unpack("<Q", header)[0] == len(payload)
        assert crc == TFRecordWriter.masked_crc(header)


def test_single_feature_records_are_byte_identical_to_the_tfrecord_writer(
    tmp_path: Path,
) -> None:
    # With one feature, map order cannot differ: the bytes must be exactly the writer's.
    rng = np.random.default_rng(0)
    for kind, array in (
        ("int", rng.integers(0, 100_000, (6, 12))),
        ("float", rng.random((6, 12)).astype(np.float32)),
    ):
        path = tmp_path / f"{kind}.tfrecord"
        writer = TFRecordWriter(str(path))
        for row in array:
            writer.write({"x": (row.tolist(), kind)})
        writer.close()
        assert encode_examples({"x": array}) == path.read_bytes()


def test_masked_crc_matches_the_tfrecord_package() -> None:
    for data in (b"", b"\x00" * 8, b"twintrace", bytes(range(256)) * 3):
        assert masked_crc(data).to_bytes(4, "little") == TFRecordWriter.masked_crc(data)


def test_padded_stands_for_its_dense_array() -> None:
    padded = Padded(np.array([5, 300, 7]), np.array([2, 0, 1]), 3)
    assert padded.dense().tolist() == [[5, 300, 0], [0, 0, 0], [7, 0, 0]]
    assert encode_examples({"a": padded}) == encode_examples({"a": padded.dense()})
    with pytest.raises(ValueError, match="add up"):
        Padded(np.array([1, 2]), np.array([1]), 3)
    with pytest.raises(ValueError, match="between 0 and length"):
        Padded(np.array([1, 2, 3, 4]), np.array([4]), 3)


def test_encoded_runs_are_copied_as_varints() -> None:
    # A corpus of values, pre-encoded; each record takes a constant run (the same separator
    # in every record) and two variable runs of it. The result must equal the dense encoding.
    rng = np.random.default_rng(9)
    corpus = rng.integers(0, 3_000_000, 500)
    source, offsets = encode_varints(corpus)
    assert source.tobytes() == b"".join(_varint(int(v)) for v in corpus)
    n = 30
    first = rng.integers(0, 400, n)
    count = rng.integers(1, 50, n)
    second = rng.integers(0, 450, n)
    starts = np.stack([np.full(n, offsets[7]), offsets[first], offsets[second]], axis=1)
    ends = np.stack([np.full(n, offsets[8]), offsets[first + count], offsets[second + 50]], axis=1)
    encoded = Encoded(source, starts, ends - starts)
    dense = Padded(
        np.concatenate(
            [np.concatenate([[corpus[7]], corpus[f : f + c], corpus[s : s + 50]])
             for f, c, s in zip(first, count, second, strict=True)]
        ),
        count + 51,
        120,
    )  # fmt: skip
    other = rng.random((n, 3)).astype(np.float32)
    ours = encode_examples({"x": encoded, "w": other})
    for i, (_, _, payload) in enumerate(split_frames(ours)):
        example = example_pb2.Example.FromString(payload)
        assert (
            list(example.features.feature["x"].int64_list.value)
            == dense.dense()[i][: count[i] + 51].tolist()
        )
        assert np.array_equal(example.features.feature["w"].float_list.value, other[i])
    with pytest.raises(ValueError, match="inside the source"):
        Encoded(source, starts + source.size, ends - starts)


def test_tfrecord_package_reads_our_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    features = {
        "ids": rng.integers(0, 30_522, (20, 10)),
        "w": rng.random((20, 4)).astype(np.float32),
    }
    path = tmp_path / "part-00000-of-00001"
    path.write_bytes(encode_examples(features))
    rows = list(tfrecord_loader(str(path), None, {"ids": "int", "w": "float"}))
    assert len(rows) == 20
    for i, row in enumerate(rows):
        assert row["ids"].tolist() == features["ids"][i].tolist()
        assert np.array_equal(row["w"], features["w"][i])


# --------------------------------------------------------------------------------------------
# Reader


def bert_block(n: int, first_id: int = 0) -> dict[str, np.ndarray]:
    """``n`` small BERT-shaped records; record i has input_ids[0] = first_id + i."""
    ids = np.tile(np.arange(SEQ), (n, 1)) + 1000
    ids[:, 0] = first_id + np.arange(n)
    return {
        "input_ids": ids,
        "input_mask": np.ones((n, SEQ), dtype=np.int64),
        "segment_ids": np.zeros((n, SEQ), dtype=np.int64),
        "masked_lm_positions": np.tile(np.arange(1, PRED + 1), (n, 1)),
        "masked_lm_ids": np.full((n, PRED), 2000),
        "masked_lm_weights": np.ones((n, PRED), dtype=np.float32),
        "next_sentence_labels": (np.arange(n) % 2)[:, None],
    }


def write_shards(directory: Path, counts: list[int], start: int = 0) -> list[Path]:
    """Shards part-*-of-N holding counts[i] records; input_ids[0] numbers records globally."""
    directory.mkdir(parents=True, exist_ok=True)
    paths, first = [], start
    for i, count in enumerate(counts):
        path = directory / f"part-{i:05d}-of-{len(counts):05d}"
        path.write_bytes(encode_examples(bert_block(count, first)))
        paths.append(path)
        first += count
    return paths


def test_iter_records_and_parse_example_round_trip(tmp_path: Path) -> None:
    (path,) = write_shards(tmp_path, [5])
    block = bert_block(5)
    records = list(iter_records(path, buffer_size=64))  # a buffer smaller than a record
    assert len(records) == 5
    for i, data in enumerate(records):
        example = parse_example(data, f"record {i}", list(FEATURES))
        for name in FEATURES:
            assert example[name].tolist() == block[name][i].tolist()
        assert example["input_ids"].dtype == np.int64
        assert example["masked_lm_weights"].dtype == np.float32


def test_truncated_file_names_file_and_offset(tmp_path: Path) -> None:
    (path,) = write_shards(tmp_path, [3])
    data = path.read_bytes()
    record = len(data) // 3
    path.write_bytes(data[: 2 * record + 20])
    with pytest.raises(UserError, match=rf"{path} is corrupt at byte {2 * record} \(truncated"):
        list(iter_records(path))
    path.write_bytes(data[: 2 * record + 5])  # inside the header
    with pytest.raises(UserError, match=rf"at byte {2 * record} \(truncated record header"):
        list(iter_records(path))
    with pytest.raises(UserError, match=rf"{path} is corrupt at byte {2 * record}.*regenerate"):
        count_records(path)


@pytest.mark.parametrize(("where", "what"), [(3, "length"), (9, "length"), (40, "data")])
def test_flipped_byte_is_caught_by_a_crc(tmp_path: Path, where: int, what: str) -> None:
    (path,) = write_shards(tmp_path, [3])
    data = bytearray(path.read_bytes())
    record = len(data) // 3
    data[record + where] ^= 0x40  # second record: in its length, length CRC, or data
    path.write_bytes(bytes(data))
    with pytest.raises(
        UserError, match=rf"{path} is corrupt at byte {record} \(bad CRC of the record {what}\)"
    ):
        list(iter_records(path))


def test_a_huge_corrupt_length_fails_fast_without_reading(tmp_path: Path) -> None:
    path = tmp_path / "part-00000-of-00001"
    header = struct.pack("<Q", 1 << 60)
    path.write_bytes(header + b"\0\0\0\0" + b"x" * 100)
    with pytest.raises(UserError, match="bad CRC of the record length"):
        list(iter_records(path))


def test_parse_example_rejects_garbage_and_missing_features() -> None:
    with pytest.raises(UserError, match=r"shard 7 record 3 is not a tf.train.Example"):
        parse_example(b"\xff\xff\xff\xff", "shard 7 record 3")
    data = encode_examples({"input_ids": np.ones((1, 4), dtype=np.int64)})[12:-4]
    with pytest.raises(UserError, match="lacks the feature.*input_mask"):
        parse_example(data, "r", list(FEATURES))


# --------------------------------------------------------------------------------------------
# Dataset directory


def test_check_dataset_counts_records_files_and_bytes(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, [3, 5, 1])
    (tmp_path / "manifest.json").write_text("{}")  # other files are ignored
    summary = check_dataset(tmp_path)
    assert summary.items == 9 and summary.files == 3
    assert summary.bytes == sum(p.stat().st_size for p in paths)
    assert list_shards(tmp_path) == paths
    assert read_shape(tmp_path) == (SEQ, PRED)


def test_check_dataset_rejects_damage_and_gaps(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist: generate"):
        check_dataset(tmp_path / "nowhere")
    with pytest.raises(UserError, match="no part-NNNNN-of-NNNNN files"):
        check_dataset(tmp_path)
    paths = write_shards(tmp_path, [2, 2, 2])
    with open(paths[1], "ab") as f:
        f.write(b"\0" * 7)  # trailing bytes: not a whole record
    with pytest.raises(UserError, match=rf"{paths[1]} is corrupt at byte"):
        check_dataset(tmp_path)
    paths[1].unlink()
    with pytest.raises(UserError, match=r"2 of the 3 shards.*missing part-00001-of-00003"):
        check_dataset(tmp_path)


# --------------------------------------------------------------------------------------------
# BertBatches


def first_ids(batch: dict[str, torch.Tensor]) -> list[int]:
    return batch["input_ids"][:, 0].tolist()


def test_interleave_follows_tf_data_order(tmp_path: Path) -> None:
    # Files of 2, 3 and 1 records, cycle_length 2: tf.data's interleave gives
    # f0r0 f1r0 f0r1 f1r1 f1r2 f2r0 (f2 opens in f0's slot when the cycle returns to it).
    paths = write_shards(tmp_path, [2, 3, 1])
    order = [(p.name[5:10], i) for p, i, _ in interleave(paths, 2)]
    assert order == [
        ("00000", 0), ("00001", 0), ("00000", 1), ("00001", 1), ("00001", 2), ("00002", 0),
    ]  # fmt: skip
    dataset = BertBatches(paths, 1, cycle_length=2, shuffle=False)
    assert [first_ids(b)[0] for b in dataset] == [0, 2, 1, 3, 4, 5]
    # cycle_length 1 reads the files one after the other.
    assert [first_ids(b)[0] for b in BertBatches(paths, 1, cycle_length=1, shuffle=False)] == [
        0, 1, 2, 3, 4, 5,
    ]  # fmt: skip


def test_batches_have_the_reference_shapes_and_dtypes(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, [7, 6])
    batches = list(BertBatches(paths, 4, cycle_length=2, shuffle=False))
    assert len(batches) == 3  # 13 records: the last partial batch is dropped
    batch = batches[0]
    assert set(batch) == set(FEATURES)
    for name in FEATURES:
        assert batch[name].shape[0] == 4
        expected = torch.float32 if name == "masked_lm_weights" else torch.int64
        assert batch[name].dtype == expected, name
    assert batch["input_ids"].shape == (4, SEQ)
    assert batch["masked_lm_positions"].shape == (4, PRED)
    assert batch["next_sentence_labels"].shape == (4, 1)
    assert batch["input_ids"][1, 1:].tolist() == list(range(1001, 1000 + SEQ))


def test_every_record_once_per_epoch_across_two_workers(tmp_path: Path) -> None:
    counts = [6, 4, 8, 5, 7]
    paths = write_shards(tmp_path, counts)
    dataset = BertBatches(paths, 2, cycle_length=2, seed=1)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    seen_per_epoch = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        seen = [i for batch in loader for i in first_ids(batch)]
        seen_per_epoch.append(seen)
        # Worker w reads shards w, w+2, ... of the epoch's order, dropping a partial batch
        # (at most one record each here): every record at most once, nearly all of them.
        assert len(seen) == len(set(seen))
        assert set(seen) <= set(range(sum(counts)))
        expected = 0
        for worker in range(2):
            shard_counts = [counts[paths.index(p)] for p in dataset.shards_for(worker, 2)]
            expected += sum(shard_counts) // 2 * 2
        assert len(seen) == expected
    assert seen_per_epoch[0] != seen_per_epoch[1]  # shuffled per epoch


def test_shards_are_dealt_to_ranks_and_workers_without_overlap(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, [1] * 12)
    taken: list[Path] = []
    for rank in range(2):
        dataset = BertBatches(paths, 1, rank=rank, world=2, seed=5)
        dataset.set_epoch(3)
        for worker in range(3):
            taken += dataset.shards_for(worker, 3)
    assert sorted(taken) == paths  # 2 ranks x 3 workers: each shard to exactly one reader
    # The order is a function of (seed, epoch) only, so every rank agrees on it.
    again = BertBatches(paths, 1, rank=0, world=2, seed=5)
    again.set_epoch(3)
    assert taken[:2] == again.shards_for(0, 3)
    again.set_epoch(4)
    assert taken[:2] != again.shards_for(0, 3)


def test_each_shard_is_opened_once_per_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_shards(tmp_path, [3, 3, 3])
    opened: list[str] = []
    real_open = open

    def counting_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    assert sum(len(first_ids(b)) for b in BertBatches(paths, 3, cycle_length=2)) == 9
    assert sorted(opened) == sorted(p.name for p in paths)


def test_batch_events_are_logged_when_instrumenting(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "data", [5, 4])
    log = tmp_path / "mllog.log"
    with Emitter(log, instrumenting=True) as emitter:
        dataset = BertBatches(paths, 3, cycle_length=2, emitter=emitter)
        dataset.set_epoch(2)
        assert len(list(dataset)) == 3
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]
    for key in ("batch_load", "batch_preproc"):
        mine = [e for e in events if e["key"] == key]
        assert [e["metadata"]["batch"] for e in mine] == [0, 1, 2]
        assert all(e["metadata"]["records"] == 3 and e["metadata"]["epoch"] == 2 for e in mine)
        assert all(e["value"] == e["metadata"]["ts_ns"] - e["metadata"]["start_ns"] for e in mine)


def test_corrupt_shard_fails_the_epoch_naming_the_file(tmp_path: Path) -> None:
    paths = write_shards(tmp_path, [4, 4])
    data = bytearray(paths[1].read_bytes())
    data[-3] ^= 0xFF  # the last record's data CRC
    paths[1].write_bytes(bytes(data))
    with pytest.raises(UserError, match=rf"{paths[1]} is corrupt at byte \d+ \(bad CRC"):
        list(BertBatches(paths, 2, shuffle=False))


def test_records_of_another_shape_are_rejected(tmp_path: Path) -> None:
    write_shards(tmp_path, [2])
    other = bert_block(2, 100)
    other["input_ids"] = other["input_ids"][:, :8]
    path = tmp_path / "part-00001-of-00002"
    path.write_bytes(encode_examples(other))
    paths = sorted(tmp_path.glob("part-*"))
    with pytest.raises(UserError, match="input_ids holds 8 int64 values where the batch's first"):
        list(BertBatches(paths, 4, cycle_length=2, shuffle=False))
