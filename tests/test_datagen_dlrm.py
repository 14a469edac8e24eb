"""Tests of the DLRM dataset generator and of files written in parts by several processes.

No torch here: the worker processes' fork server imports this module (its task functions), and
importing torch there would cost seconds per session. The reader's tests are in
test_dlrm_reader.py.

Parts are shrunk (SMALL: 1500 records each) so that a dataset of about 2 MB has several parts
per file and the whole file runs in a few seconds.
"""

from __future__ import annotations

import io
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from core.errors import UserError
from datagen import common
from datagen.common import (
    MANIFEST_NAME,
    MARKER_NAME,
    FileSink,
    FileTask,
    load_manifest,
    prepare_output_dir,
    run_file_tasks,
)
from datagen.dlrm import (
    CRITEO_TB_COUNTS,
    DLRMGenParams,
    counts_npz,
    dense_max,
    generate_dlrm,
    minimum_dataset_bytes,
    plan_dlrm,
)
from tests.datagen_helpers import (
    assert_bad_requests_refused,
    assert_progress_reaches_the_total,
    assert_same_with_one_writer,
    data_files,
    dataset_fixture,
    temp_files,
    user_directory,
)
from workloads.dlrm.files import (
    COUNTS_NAME,
    RECORD_BYTES,
    TEST_NAME,
    TRAIN_NAME,
    check_dataset,
    load_dataset,
)

SMALL = DLRMGenParams(min_records=128, part_records=1500)
SIZE = 2_000_000
# 8 MB parts: an interruption lands in the middle of the train file.
BIG_PARTS = DLRMGenParams(min_records=256, part_records=50_000)


def records(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<i4").reshape(-1, 40)


dataset = dataset_fixture("dlrm", generate_dlrm, SIZE, seed=7, workers=2, params=SMALL)


# --------------------------------------------------------------------------------------------
# Sizes and layout


def test_files_sizes_and_record_counts(dataset: tuple[Path, dict]) -> None:
    out, manifest = dataset
    assert data_files(out) == {TRAIN_NAME, TEST_NAME, COUNTS_NAME}
    npz = len(counts_npz(SMALL.counts))
    total_records = (SIZE - npz) // RECORD_BYTES
    test = round(total_records / 64)
    assert test > SMALL.min_records  # the fraction applies, not the minimum
    train = total_records - test
    assert (manifest["params"]["train_records"], manifest["params"]["test_records"]) == (
        train,
        test,
    )
    assert (out / TRAIN_NAME).stat().st_size == train * RECORD_BYTES
    assert (out / TEST_NAME).stat().st_size == test * RECORD_BYTES
    assert (out / COUNTS_NAME).stat().st_size == npz
    # As close as whole records allow, never above.
    assert 0 <= SIZE - manifest["total_bytes"] < RECORD_BYTES
    entries = {f["name"]: f for f in manifest["files"]}
    assert entries[TRAIN_NAME]["records"] == train
    assert entries[TRAIN_NAME]["parts"] == math.ceil(train / SMALL.part_records) > 1
    assert entries[TEST_NAME]["records"] == test
    assert manifest["params"]["parts"] == entries[TRAIN_NAME]["parts"] + 1
    for name, entry in entries.items():
        assert entry["bytes"] == (out / name).stat().st_size


def test_manifest_round_trips_and_check_dataset_agrees(dataset: tuple[Path, dict]) -> None:
    out, manifest = dataset
    loaded = load_manifest(out)
    assert loaded["generator"] == "dlrm" and loaded["seed"] == 7
    assert loaded["params"]["counts"] == list(CRITEO_TB_COUNTS)
    assert loaded["params"]["record_bytes"] == 160
    summary = check_dataset(out)
    assert summary.items == manifest["params"]["train_records"]
    assert summary.files == 3 and summary.bytes == manifest["total_bytes"]
    data = load_dataset(out)
    assert data.counts == CRITEO_TB_COUNTS
    assert data.test_records == manifest["params"]["test_records"]


def test_counts_file_is_what_numpy_savez_holds(dataset: tuple[Path, dict]) -> None:
    out, _ = dataset
    with np.load(out / COUNTS_NAME) as npz:
        assert list(npz.keys()) == ["counts"]
        assert npz["counts"].dtype == np.int64
        assert npz["counts"].tolist() == list(CRITEO_TB_COUNTS)
    buf = io.BytesIO()
    np.savez(buf, counts=np.asarray(CRITEO_TB_COUNTS, dtype=np.int64))
    with np.load(io.BytesIO(buf.getvalue())) as theirs:
        assert theirs["counts"].tolist() == list(CRITEO_TB_COUNTS)


@pytest.mark.parametrize("size", [minimum_dataset_bytes(SMALL), 1_000_003, 77_777_777])
def test_plan_is_within_one_record_of_the_size(size: int) -> None:
    plan = plan_dlrm(size, SMALL)
    assert 0 <= size - plan.total_bytes < RECORD_BYTES
    assert plan.test_records >= SMALL.min_records and plan.train_records >= SMALL.min_records


# --------------------------------------------------------------------------------------------
# Content


def test_values_are_in_range_and_distributed_as_documented(dataset: tuple[Path, dict]) -> None:
    out, _ = dataset
    r = np.concatenate([records(out / TRAIN_NAME), records(out / TEST_NAME)])
    n = len(r)
    labels, dense, sparse = r[:, 0], r[:, 1:14], r[:, 14:]
    assert set(np.unique(labels)) == {0, 1}
    rate = labels.mean()
    assert abs(rate - SMALL.positive_rate) < 5 * math.sqrt(0.034 * 0.966 / n)
    # dense_max is exact arithmetic; float32 rounding may add a unit or two.
    assert dense.min() >= 0 and dense.max() <= dense_max(SMALL) * (1 + 1e-6)
    # Many zeros where the median is at most 1 (as Criteo's missing values), few elsewhere.
    zeros = (dense == 0).mean(axis=0)
    small_median = np.asarray(SMALL.dense_medians) <= 1
    assert (zeros[small_median] > 0.3).all() and (zeros[~small_median] < 0.3).all(), zeros
    medians = np.median(dense, axis=0)
    expected = np.floor(SMALL.dense_medians)
    assert (np.abs(medians - expected) <= np.maximum(1, 0.05 * expected)).all(), medians
    # Heavy tail: the 99.9th percentile is far above the median.
    assert np.percentile(dense[:, 4], 99.9) > 50 * medians[4]
    counts = np.asarray(SMALL.counts)
    assert sparse.min() >= 0 and (sparse < counts).all()
    # Log-uniform: P(0) = log(2) / log(count + 1), about 6.5 % for 39043 categories.
    p0 = (sparse == 0).mean(axis=0)
    expected_p0 = np.log(2) / np.log(counts + 1)
    assert (np.abs(p0 - expected_p0) < 5 * np.sqrt(expected_p0 / n) + 0.002).all()
    # A feature with 3 categories uses all of them; the 40M ones reach past 1M.
    assert set(np.unique(sparse[:, 5])) == {0, 1, 2}
    assert sparse[:, 0].max() > 1_000_000


# --------------------------------------------------------------------------------------------
# Determinism


def test_same_seed_gives_identical_bytes_whatever_the_worker_count(
    tmp_path: Path, dataset: tuple[Path, dict]
) -> None:
    assert_same_with_one_writer(generate_dlrm, dataset, tmp_path, SIZE, seed=7, params=SMALL)


def test_different_seed_differs_and_smaller_size_is_a_prefix(
    tmp_path: Path, dataset: tuple[Path, dict]
) -> None:
    full, _ = dataset
    other = tmp_path / "other"
    generate_dlrm(other, SIZE, seed=8, workers=2, params=SMALL)
    assert (other / TRAIN_NAME).read_bytes() != (full / TRAIN_NAME).read_bytes()
    # Each part is a function of (seed, file, part index) only: a smaller train file is a
    # prefix of the larger one (its last part cut short).
    small = tmp_path / "small"
    generate_dlrm(small, SIZE // 3, seed=7, workers=2, params=SMALL)
    head = (small / TRAIN_NAME).read_bytes()
    assert len(head) > SMALL.part_records * RECORD_BYTES
    assert (full / TRAIN_NAME).read_bytes()[: len(head)] == head


# --------------------------------------------------------------------------------------------
# Validation


def test_too_small_and_invalid_requests_touch_nothing(tmp_path: Path) -> None:
    minimum = minimum_dataset_bytes(SMALL)
    target = tmp_path / "a"
    assert_bad_requests_refused(generate_dlrm, target, minimum, SIZE, params=SMALL)
    # The default minimum holds 4096 records in each file.
    assert minimum_dataset_bytes() == 2 * 4096 * 160 + len(counts_npz(CRITEO_TB_COUNTS))
    generate_dlrm(target, minimum, params=SMALL)
    assert load_dataset(target).train_records == SMALL.min_records


def test_non_empty_directory_is_refused_without_force(tmp_path: Path) -> None:
    with user_directory(tmp_path) as out, pytest.raises(UserError, match="not empty"):
        generate_dlrm(out, SIZE, params=SMALL)
    generate_dlrm(tmp_path / "ok", SIZE, params=SMALL)
    manifest = generate_dlrm(tmp_path / "ok", SIZE // 2, params=SMALL, force=True)
    assert load_dataset(tmp_path / "ok").train_records == manifest["params"]["train_records"]


def test_extreme_positive_rates(tmp_path: Path) -> None:
    for rate, expected in ((0.0, 0), (1.0, 1)):
        out = tmp_path / f"rate{rate}"
        generate_dlrm(out, 200_000, params=DLRMGenParams(min_records=64, positive_rate=rate))
        assert set(np.unique(records(out / TRAIN_NAME)[:, 0])) == {expected}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"counts": (10,) * 25}, "counts must be 26"),
        ({"counts": (10,) * 25 + (0,)}, "between 1 and 2"),
        ({"counts": (10,) * 25 + (2**31,)}, "between 1 and 2"),
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"test_fraction": 0.6}, "test_fraction"),
        ({"min_records": 0}, "min_records"),
        ({"positive_rate": 1.5}, "positive_rate"),
        ({"dense_medians": (1.0,) * 12}, "dense_medians"),
        ({"dense_medians": (1e6,) * 13, "dense_tail": 0.5}, "beyond int32"),
        ({"dense_tail": 0}, "dense_tail"),
        ({"part_records": 0}, "part_records"),
    ],
)
def test_invalid_params_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        DLRMGenParams(**kwargs)


# --------------------------------------------------------------------------------------------
# Files written in parts


def _write_part(sink: FileSink, value: int, length: int) -> dict:
    # Two writes, to check that a part continues where its previous write ended.
    sink.write(bytes([value]) * (length // 2))
    sink.write(bytes([value]) * (length - length // 2))
    return {"kind": "part"}


def _write_part_then_fail(sink: FileSink, value: int, length: int) -> dict:
    sink.write(bytes([value]) * (length // 2))
    time.sleep(0.05)
    raise RuntimeError("simulated disk failure")


def _write_short(sink: FileSink, value: int, length: int) -> dict:
    sink.write(bytes([value]) * (length - 1))
    return {}


def _write_slowly(sink: FileSink, value: int, length: int) -> dict:
    for _ in range(length // 1024):
        sink.write(bytes([value]) * 1024)
        time.sleep(0.01)
    return {}


def _parts(name: str, sizes: list[int], write=_write_part) -> list[FileTask]:  # noqa: ANN001
    tasks, offset = [], 0
    for i, size in enumerate(sizes):
        tasks.append(FileTask(name, write, (i + 1, size), size, part=(offset, size)))
        offset += size
    return tasks


def test_parts_land_at_their_offsets_in_any_order(tmp_path: Path) -> None:
    out = prepare_output_dir(tmp_path / "ds", force=False)
    sizes = [1000, 3, 70_000, 1, 5000]
    tasks = [*reversed(_parts("big.bin", sizes)), FileTask("small.bin", _write_part, (9, 10))]
    records_ = run_file_tasks(out, tasks, workers=3, fsync=True)
    expected = b"".join(bytes([i + 1]) * s for i, s in enumerate(sizes))
    assert (out / "big.bin").read_bytes() == expected
    assert records_ == [
        {"name": "big.bin", "bytes": sum(sizes), "parts": 5, "kind": "part"},
        {"name": "small.bin", "bytes": 10, "kind": "part"},
    ]
    assert temp_files(out) == []


def test_failing_part_leaves_neither_temporary_nor_final_file(tmp_path: Path) -> None:
    out = prepare_output_dir(tmp_path / "ds", force=False)
    tasks = _parts("big.bin", [4096] * 6)
    tasks[3] = FileTask("big.bin", _write_part_then_fail, (4, 4096), 4096, part=tasks[3].part)
    # ~60 s unless cancelled: twice the bound below, which leaves a loaded host time to start
    # the workers.
    tasks.append(FileTask("slow.bin", _write_slowly, (1, 6_144_000)))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="simulated disk failure"):
        run_file_tasks(out, tasks, workers=2)
    assert time.monotonic() - started < 30, "the running task was not cancelled"
    assert sorted(os.listdir(out)) == [MARKER_NAME]


def test_part_writing_the_wrong_length_fails_cleanly(tmp_path: Path) -> None:
    out = prepare_output_dir(tmp_path / "ds", force=False)
    with pytest.raises(ValueError, match="wrote 99 bytes instead of 100"):
        run_file_tasks(out, _parts("f.bin", [100, 100], write=_write_short), workers=2)
    assert sorted(os.listdir(out)) == [MARKER_NAME]
    # Writing past the part would overwrite the next one: refused at the write.
    # g.bin is complete before f.bin fails (one worker runs the tasks in order): it stays.
    too_long = [
        *_parts("g.bin", [5]),
        FileTask("f.bin", _write_part, (1, 200), part=(0, 100)),
        FileTask("f.bin", _write_part, (2, 100), part=(100, 100)),
    ]
    with pytest.raises(ValueError, match="goes past the part"):
        run_file_tasks(out, too_long, workers=1)
    assert sorted(os.listdir(out)) == [MARKER_NAME, "g.bin"]
    assert (out / "g.bin").read_bytes() == b"\1" * 5


def test_inconsistent_parts_are_rejected_before_anything_is_written(tmp_path: Path) -> None:
    out = prepare_output_dir(tmp_path / "ds", force=False)
    gap = [FileTask("f.bin", _write_part, (1, 10), part=(0, 10)),
           FileTask("f.bin", _write_part, (1, 10), part=(11, 10))]  # fmt: skip
    overlap = [FileTask("f.bin", _write_part, (1, 10), part=(0, 10)),
               FileTask("f.bin", _write_part, (1, 10), part=(5, 10))]  # fmt: skip
    mixed = [FileTask("f.bin", _write_part, (1, 10), part=(0, 10)),
             FileTask("f.bin", _write_part, (1, 10))]  # fmt: skip
    for tasks, message in ((gap, "gap or overlap"), (overlap, "gap or overlap"),
                           (mixed, "both whole and in parts")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            run_file_tasks(out, tasks, workers=1)
    with pytest.raises(ValueError, match="same file"):
        run_file_tasks(out, [FileTask("f.bin", _write_part, (1, 1))] * 2, workers=1)
    with pytest.raises(ValueError, match="invalid part"):
        FileTask("f.bin", _write_part, (1, 1), part=(0, 0))
    assert sorted(os.listdir(out)) == [MARKER_NAME]


def test_interrupted_generation_leaves_no_partial_record_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C reaches the parent while it reports progress; poll fast so that it lands mid-run.
    monkeypatch.setattr(common, "_POLL_S", 0.001)

    def interrupt(done: int, total: int) -> None:
        if done > 0:
            raise KeyboardInterrupt

    out = tmp_path / "ds"
    with pytest.raises(KeyboardInterrupt):
        generate_dlrm(out, 60_000_000, workers=2, params=BIG_PARTS, progress=interrupt)
    assert temp_files(out) == []
    assert TRAIN_NAME not in data_files(out), "the train file appeared before all its parts"
    assert not (out / MANIFEST_NAME).exists()
    with pytest.raises(UserError, match="did not finish"):
        load_manifest(out)
    generate_dlrm(out, SIZE, workers=2, params=SMALL, force=True)
    assert load_dataset(out).train_records > 0


def test_progress_reaches_the_total(tmp_path: Path) -> None:
    assert_progress_reaches_the_total(generate_dlrm, tmp_path / "ds", SIZE, workers=2, params=SMALL)
