"""Tests of the BERT TFRecord reader, dataset check and torch dataset.

Files are written with the ``tfrecord`` package's writer (the reference; the generator's encoder
is checked against it in tests/test_datagen_bert.py); the reader is checked against damaged
files, BertBatches against a real DataLoader with two workers.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import crc32c
import numpy as np
import pytest
import torch
from tfrecord.writer import TFRecordWriter
from torch.utils.data import DataLoader

from core.errors import UserError
from workloads.bert.dataset import BertBatches, interleave
from workloads.bert.files import FEATURES, check_dataset, count_records, list_shards, read_shape
from workloads.bert.records import iter_records, mask_crc, masked_crc, parse_example
from workloads.events import Emitter

SEQ, PRED = 16, 4


def test_masked_crc_matches_the_tfrecord_package() -> None:
    for data in (b"", b"\x00" * 8, b"twintrace", bytes(range(256)) * 3):
        assert masked_crc(data).to_bytes(4, "little") == TFRecordWriter.masked_crc(data)
    crcs = np.array([crc32c.crc32c(bytes(range(i))) for i in range(256)], dtype=np.uint32)
    assert mask_crc(crcs).dtype == np.uint32
    assert mask_crc(crcs).tolist() == [mask_crc(int(c)) for c in crcs]


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


def write_records(path: Path, block: dict[str, np.ndarray]) -> None:
    """The records of ``block`` (feature -> (records, values) array), with the tfrecord writer."""
    writer = TFRecordWriter(str(path))
    for i in range(len(next(iter(block.values())))):
        writer.write(
            {
                name: (array[i].tolist(), "float" if array.dtype.kind == "f" else "int")
                for name, array in block.items()
            }
        )
    writer.close()


def write_shards(directory: Path, counts: list[int], start: int = 0) -> list[Path]:
    """Shards part-*-of-N holding counts[i] records; input_ids[0] numbers records globally."""
    directory.mkdir(parents=True, exist_ok=True)
    paths, first = [], start
    for i, count in enumerate(counts):
        path = directory / f"part-{i:05d}-of-{len(counts):05d}"
        write_records(path, bert_block(count, first))
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
    data = TFRecordWriter.serialize_tf_example({"input_ids": ([1, 1, 1, 1], "int")})
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
    write_records(path, other)
    paths = sorted(tmp_path.glob("part-*"))
    with pytest.raises(UserError, match="input_ids holds 8 int64 values where the batch's first"):
        list(BertBatches(paths, 4, cycle_length=2, shuffle=False))
