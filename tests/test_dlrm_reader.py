"""Tests of the DLRM reader: dataset checks, decoding, and DLRMBatches under a DataLoader.

Most tests use a hand-built file whose record k is recognisable (categorical feature 0 holds k),
so that every batch a DataLoader returns can be matched to the records it must contain.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from core.errors import UserError
from datagen.dlrm import DLRMGenParams, counts_npz, generate_dlrm
from workloads.dlrm.dataset import DLRMBatches
from workloads.dlrm.files import (
    COUNTS_NAME,
    RECORD_BYTES,
    TEST_NAME,
    TRAIN_NAME,
    DLRMData,
    RecordError,
    check_dataset,
    decode_batch,
    load_dataset,
)
from workloads.events import Emitter

COUNTS = (1000,) + (50,) * 25
RECORDS = 103
BATCH = 10


def build_records(n: int) -> np.ndarray:
    """Records with known values: label k % 2, dense (k % 7) - 1 (so -1 occurs), sparse (k, j...)."""
    k = np.arange(n)
    r = np.zeros((n, 40), dtype="<i4")
    r[:, 0] = k % 2
    r[:, 1:14] = (k[:, None] % 7) - 1 + np.arange(13)
    r[:, 14] = k
    r[:, 15:] = (k[:, None] + np.arange(25)) % 50
    return r


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    build_records(RECORDS).tofile(tmp_path / TRAIN_NAME)
    build_records(2 * BATCH).tofile(tmp_path / TEST_NAME)
    (tmp_path / COUNTS_NAME).write_bytes(counts_npz(COUNTS))
    return tmp_path


# --------------------------------------------------------------------------------------------
# Decoding


def test_decode_matches_the_reference_transform_on_a_hand_built_record() -> None:
    record = np.array(
        [1, *range(-2, 11), *[0, 1, 2, 3, 49, 999_999, 7] + [5] * 19], dtype="<i4"
    ).tobytes()
    assert len(record) == RECORD_BYTES
    dense, sparse, labels = decode_batch(record * 2, counts=None)
    assert dense.dtype == np.float32 and dense.shape == (2, 13)
    assert sparse.dtype == np.int64 and sparse.shape == (2, 26)
    assert labels.dtype == np.float32 and labels.tolist() == [1.0, 1.0]
    # log(x + 1) with x clipped at 0: -2 and -1 become log(1) = 0.
    x = np.maximum(np.arange(-2, 11), 0)
    assert np.allclose(dense[0], np.log(x + 1.0), rtol=1e-6)
    assert dense[0, 0] == 0 and dense[0, 1] == 0 and dense[0, 2] == 0
    assert math.isclose(dense[0, 12], math.log(11), rel_tol=1e-6)
    assert sparse[0, :7].tolist() == [0, 1, 2, 3, 49, 999_999, 7]
    # Modulo max_ind_range, as the reference's --max-ind-range.
    _, hashed, _ = decode_batch(record, counts=None, max_ind_range=10)
    assert hashed[0, :7].tolist() == [0, 1, 2, 3, 9, 9, 7]
    # The reference's torch expression (numpy's and torch's float32 log may differ in the last
    # bit).
    ints = torch.from_numpy(np.frombuffer(record, dtype="<i4").copy()).view(-1, 40)
    reference = torch.log(ints[:, 1:14].clamp(min=0).type(torch.float) + 1)
    assert torch.allclose(torch.from_numpy(dense[:1]), reference, rtol=1e-6, atol=0)


def test_decode_checks_labels_and_indices_against_the_tables() -> None:
    records = build_records(20)
    counts = COUNTS
    decode_batch(records.tobytes(), counts)  # all valid
    bad = records.copy()
    bad[13, 14 + 3] = 50  # feature 3 has 50 categories: indices 0..49
    with pytest.raises(RecordError, match="feature 3 has index 50, outside its table of 50"):
        decode_batch(bad.tobytes(), counts)
    try:
        decode_batch(bad.tobytes(), counts)
    except RecordError as exc:
        assert exc.record == 13
    # With max_ind_range the index is reduced first, so it is valid in the capped table.
    decode_batch(bad.tobytes(), counts, max_ind_range=40)
    bad = records.copy()
    bad[4, 0] = 2
    with pytest.raises(RecordError, match="label 2 is not 0 or 1") as info:
        decode_batch(bad.tobytes(), counts)
    assert info.value.record == 4
    with pytest.raises(ValueError, match="not a whole number"):
        decode_batch(records.tobytes()[:-1], counts)


# --------------------------------------------------------------------------------------------
# Dataset checks


def test_load_and_check_dataset(data_dir: Path) -> None:
    data = load_dataset(data_dir)
    assert data == DLRMData(
        train=data_dir / TRAIN_NAME,
        test=data_dir / TEST_NAME,
        counts=COUNTS,
        train_records=RECORDS,
        test_records=2 * BATCH,
    )
    summary = check_dataset(data_dir)
    assert summary.items == RECORDS and summary.files == 3
    assert summary.bytes == sum(p.stat().st_size for p in data_dir.iterdir())


def test_dataset_errors_name_the_file_and_the_fix(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist.*datagen dlrm"):
        load_dataset(tmp_path / "nowhere")
    with open(data_dir / TRAIN_NAME, "ab") as f:
        f.write(b"\0" * 7)
    size = RECORDS * RECORD_BYTES + 7
    with pytest.raises(UserError, match=f"{TRAIN_NAME} is {size} bytes, not a positive multiple"):
        check_dataset(data_dir)
    (data_dir / TEST_NAME).unlink()
    os.truncate(data_dir / TRAIN_NAME, 0)
    with pytest.raises(UserError, match=f"{TRAIN_NAME} is 0 bytes"):
        check_dataset(data_dir)
    build_records(5).tofile(data_dir / TRAIN_NAME)
    with pytest.raises(UserError, match=f"{TEST_NAME} is missing: regenerate"):
        check_dataset(data_dir)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a zip file", "cannot read"),
        (None, "missing"),
        ("wrong_key", "has no 'counts' array"),
        ("wrong_shape", r"expected 26 integers"),
        ("zero_count", "outside 1..2\\^31-1"),
    ],
)
def test_bad_counts_file_is_reported(data_dir: Path, content: object, message: str) -> None:
    path = data_dir / COUNTS_NAME
    if content is None:
        path.unlink()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        buf = io.BytesIO()
        if content == "wrong_key":
            np.savez(buf, other=np.ones(26, dtype=np.int64))
        elif content == "wrong_shape":
            np.savez(buf, counts=np.ones(25, dtype=np.int64))
        else:
            np.savez(buf, counts=np.zeros(26, dtype=np.int64))
        path.write_bytes(buf.getvalue())
    with pytest.raises(UserError, match=message):
        load_dataset(data_dir)


# --------------------------------------------------------------------------------------------
# DLRMBatches


def expected_batch(i: int) -> np.ndarray:
    return build_records(RECORDS)[i * BATCH : (i + 1) * BATCH]


def test_len_counts_full_batches_only(data_dir: Path) -> None:
    ds = DLRMBatches.from_data(load_dataset(data_dir), BATCH)
    assert len(ds) == RECORDS // BATCH == 10
    with pytest.raises(IndexError):
        ds[10]
    with pytest.raises(UserError, match="fewer than one batch of 200: lower batch_size"):
        DLRMBatches(data_dir / TRAIN_NAME, RECORDS, 200)
    with pytest.raises(UserError, match="batch_size must be at least 1"):
        DLRMBatches(data_dir / TRAIN_NAME, RECORDS, 0)
    with pytest.raises(UserError, match=f"shorter than its {RECORDS + 1} records.*truncated"):
        DLRMBatches(data_dir / TRAIN_NAME, RECORDS + 1, BATCH)
    with pytest.raises(UserError, match="cannot open .*nowhere.bin.*regenerate"):
        DLRMBatches(data_dir / "nowhere.bin", RECORDS, BATCH)


def test_each_item_is_one_pread_of_one_whole_batch(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        calls.append((n, offset))
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    ds = DLRMBatches.from_data(load_dataset(data_dir), BATCH)
    loader = DataLoader(ds, batch_size=None, num_workers=0, shuffle=False)
    got = list(loader)
    assert calls == [(BATCH * RECORD_BYTES, i * BATCH * RECORD_BYTES) for i in range(len(ds))]
    for i, (dense, sparse, labels) in enumerate(got):
        want = expected_batch(i)
        assert sparse[:, 0].tolist() == want[:, 14].tolist()
        assert labels.tolist() == want[:, 0].tolist()
        assert torch.allclose(dense, torch.log(torch.from_numpy(want[:, 1:14]).clamp(min=0) + 1.0))


def test_dataloader_workers_return_each_batch_exactly(data_dir: Path) -> None:
    data = load_dataset(data_dir)
    ds = DLRMBatches.from_data(data, BATCH, max_ind_range=30)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=3)
    sampler.set_epoch(1)
    order = list(sampler)
    assert sorted(order) == list(range(len(ds))) and order != sorted(order)
    loader = DataLoader(ds, batch_size=None, sampler=sampler, num_workers=2)
    seen = []
    for i, (dense, sparse, labels) in zip(order, loader, strict=True):
        want = expected_batch(i)
        assert sparse.dtype == torch.int64 and dense.dtype == torch.float32
        assert sparse.shape == (BATCH, 26) and dense.shape == (BATCH, 13)
        assert labels.shape == (BATCH,)
        assert sparse.numpy().tolist() == (want[:, 14:] % 30).tolist()
        assert labels.numpy().tolist() == want[:, 0].tolist()
        seen.append(i)
    assert sorted(seen) == list(range(len(ds)))


def test_descriptor_is_per_process_and_not_pickled(data_dir: Path) -> None:
    ds = DLRMBatches.from_data(load_dataset(data_dir), BATCH)
    ds[0]
    assert ds._fd >= 0
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._fd == -1
    assert copy[3][1][:, 0].tolist() == expected_batch(3)[:, 14].tolist()
    # As after a fork: another pid reopens rather than using the inherited descriptor.
    fd = ds._fd
    ds._pid = -2
    ds[1]
    assert ds._fd != -1 and ds._pid == os.getpid()
    os.close(fd)
    ds.close()
    assert ds._fd == -1


def test_truncated_file_raises_a_user_error_with_file_and_offset(data_dir: Path) -> None:
    ds = DLRMBatches.from_data(load_dataset(data_dir), BATCH)
    # Cut the file in the middle of batch 7.
    os.truncate(data_dir / TRAIN_NAME, 7 * BATCH * RECORD_BYTES + 5 * RECORD_BYTES + 3)
    assert ds[6][1].shape == (BATCH, 26)
    offset = 7 * BATCH * RECORD_BYTES
    size = offset + 5 * RECORD_BYTES + 3
    with pytest.raises(
        UserError,
        match=rf"{TRAIN_NAME} is {size} bytes, too short for the batch at offset {offset} "
        rf"\({BATCH * RECORD_BYTES} bytes\): the file is truncated; regenerate",
    ):
        ds[7]
    with pytest.raises(UserError, match=f"too short for the batch at offset {offset + 1600}"):
        ds[8]
    # Through DataLoader workers the error reaches the training loop (and does not hang).
    loader = DataLoader(ds, batch_size=None, num_workers=2, timeout=60)
    with pytest.raises(UserError, match="truncated"):
        list(loader)


def test_corrupt_record_names_file_and_offset(data_dir: Path) -> None:
    records = build_records(RECORDS)
    records[2 * BATCH + 4, 14 + 7] = -1
    records.tofile(data_dir / TRAIN_NAME)
    ds = DLRMBatches.from_data(load_dataset(data_dir), BATCH)
    offset = (2 * BATCH + 4) * RECORD_BYTES
    with pytest.raises(
        UserError, match=rf"bad record at offset {offset} \(categorical feature 7 has index -1"
    ):
        ds[2]


def test_events_are_logged_per_batch(data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "mllog.log"
    with Emitter(log, instrumenting=True) as emitter:
        ds = DLRMBatches.from_data(load_dataset(data_dir), BATCH, emitter=emitter)
        ds.set_epoch(2)
        ds[4]
        ds[9]
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]
    keys = [(e["key"], e["metadata"]["batch"], e["metadata"]["epoch"]) for e in events]
    assert keys == [
        ("batch_load", 4, 2),
        ("batch_preproc", 4, 2),
        ("batch_load", 9, 2),
        ("batch_preproc", 9, 2),
    ]
    for e in events:
        assert e["value"] == e["metadata"]["ts_ns"] - e["metadata"]["start_ns"] >= 0


# --------------------------------------------------------------------------------------------
# With the generator


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "dlrm"
    generate_dlrm(out, 1_000_000, seed=5, workers=2, params=DLRMGenParams(min_records=200))
    return out


def test_reader_returns_what_the_generator_wrote(generated: Path) -> None:
    data = load_dataset(generated)
    ds = DLRMBatches.from_data(data, batch_size=100, max_ind_range=10_000)
    raw = (generated / TRAIN_NAME).read_bytes()
    assert len(ds) == data.train_records // 100
    for i in (0, 17, len(ds) - 1):
        dense, sparse, labels = ds[i]
        chunk = np.frombuffer(raw, dtype="<i4").reshape(-1, 40)[i * 100 : (i + 1) * 100].copy()
        assert labels.tolist() == chunk[:, 0].tolist()
        assert sparse.tolist() == (chunk[:, 14:] % 10_000).tolist()
        assert torch.allclose(dense, torch.log(torch.from_numpy(chunk[:, 1:14]) + 1.0))
    test = DLRMBatches.from_data(data, batch_size=200, test=True)
    assert len(test) == 1 and test[0][2].shape == (200,)
