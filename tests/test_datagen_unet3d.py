"""Tests of the UNet3D dataset generator and the shared datagen machinery.

Shapes are shrunk (SMALL) so that a dataset of a few hundred kB has dozens of cases and the
whole file runs in a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from core.atomic import temp_path
from core.errors import UserError
from core.units import parse_size
from datagen import common
from datagen.common import (
    MANIFEST_NAME,
    MARKER_NAME,
    FileSink,
    FileTask,
    atomic_file,
    load_manifest,
    prepare_output_dir,
    run_file_tasks,
)
from datagen.unet3d import (
    UNet3DGenParams,
    case_bytes,
    generate_unet3d,
    minimum_dataset_bytes,
    plan_unet3d_cases,
)
from tests.datagen_helpers import (
    assert_progress_reaches_the_total,
    assert_same_with_one_writer,
    data_files,
    dataset_fixture,
    temp_files,
)
from workloads.data import check_manifest
from workloads.unet3d.files import check_dataset

SMALL = UNet3DGenParams(s1_range=(8, 20), s2_range=(10, 24), min_dim=6)
SIZE = 400_000


dataset = dataset_fixture("unet3d", generate_unet3d, SIZE, seed=7, workers=2, params=SMALL)


# --------------------------------------------------------------------------------------------
# Format


def test_pairs_shapes_dtypes_and_labels(dataset: tuple[Path, dict]) -> None:
    out, manifest = dataset
    n_cases = manifest["params"]["cases"]
    assert n_cases > 10
    fg_sum = fg_count = bg_sum = bg_count = 0.0
    assert data_files(out) == {f"case_{i:05d}_{s}.npy" for i in range(n_cases) for s in ("x", "y")}
    for i in range(n_cases):
        x = np.load(out / f"case_{i:05d}_x.npy")
        y = np.load(out / f"case_{i:05d}_y.npy")
        assert x.dtype == np.float32 and y.dtype == np.uint8
        assert x.ndim == 4 and x.shape[0] == 1 and x.shape[2] == x.shape[3]
        assert y.shape == x.shape
        assert set(np.unique(y)) <= {0, 1}
        assert y.any(), f"case {i} has no foreground"
        assert np.isfinite(x).all()
        fg_sum += float(x[y == 1].sum())
        fg_count += int(y.sum())
        bg_sum += float(x[y == 0].sum())
        bg_count += int(y.size - y.sum())
    # The blob is brighter than the background (by 1.0 on noise of unit scale), so the labels
    # are learnable.
    assert fg_sum / fg_count > bg_sum / bg_count + 0.7


def test_shapes_follow_the_ranges_and_only_the_last_case_is_shrunk(
    dataset: tuple[Path, dict],
) -> None:
    _, manifest = dataset
    shapes = [f["shape"] for f in manifest["files"] if f["name"].endswith("_x.npy")]
    for _, s1, s2, s2b in shapes[:-1]:
        assert SMALL.s1_range[0] <= s1 <= SMALL.s1_range[1]
        assert SMALL.s2_range[0] <= s2 == s2b <= SMALL.s2_range[1]
    _, s1, s2, _ = shapes[-1]
    assert s1 >= SMALL.min_dim and s2 >= SMALL.min_dim


def test_files_are_exactly_what_numpy_save_writes(dataset: tuple[Path, dict]) -> None:
    out, _ = dataset
    for name in ("case_00000_x.npy", "case_00003_y.npy"):
        path = out / name
        saved = out.parent / ("resaved_" + name)
        np.save(saved, np.load(path))
        assert saved.read_bytes() == path.read_bytes()
        saved.unlink()


def test_mmap_reading_works(dataset: tuple[Path, dict]) -> None:
    # DLIO and some loaders memory-map .npy files: the header must be standard.
    out, _ = dataset
    x = np.load(out / "case_00001_x.npy", mmap_mode="r")
    assert x.dtype == np.float32 and x.shape[0] == 1


# --------------------------------------------------------------------------------------------
# Manifest


def test_manifest_lists_exactly_the_files_with_their_sizes(dataset: tuple[Path, dict]) -> None:
    out, manifest = dataset
    loaded = load_manifest(out)
    assert loaded == json.loads(json.dumps(manifest))
    assert loaded["schema_version"] == 1
    assert loaded["generator"] == "unet3d"
    assert loaded["seed"] == 7
    assert loaded["requested_bytes"] == SIZE
    assert loaded["params"]["s1_range"] == list(SMALL.s1_range)
    assert loaded["params"]["min_dim"] == SMALL.min_dim
    names = [f["name"] for f in loaded["files"]]
    assert len(names) == len(set(names))
    assert set(names) == data_files(out)
    for entry in loaded["files"]:
        path = out / entry["name"]
        assert entry["bytes"] == path.stat().st_size
        array = np.load(path, mmap_mode="r")
        assert list(array.shape) == entry["shape"]
        assert str(array.dtype) == entry["dtype"]
    assert loaded["total_bytes"] == sum(f["bytes"] for f in loaded["files"])
    assert loaded["duration_s"] >= 0
    assert "T" in loaded["created_at"]


def test_total_lands_close_below_the_requested_size(dataset: tuple[Path, dict]) -> None:
    _, manifest = dataset
    assert manifest["total_bytes"] <= SIZE
    assert SIZE - manifest["total_bytes"] < 5 * SMALL.s2_range[1] ** 2 + 256


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planned_total_is_within_one_slice_or_one_minimum_case(seed: int) -> None:
    rng = np.random.default_rng(seed)
    minimum = minimum_dataset_bytes(SMALL)
    one_slice = 5 * SMALL.s2_range[1] ** 2 + 256
    for size in rng.integers(minimum, 1_000_000, size=60):
        cases = plan_unet3d_cases(int(size), seed, SMALL)
        total = sum(case_bytes(s1, s2) for s1, s2 in cases)
        assert total <= size
        assert size - total < max(one_slice, minimum), (size, cases[-1])


def test_load_manifest_rejects_unknown_schema_and_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no manifest.json.*regenerate"):
        load_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"schema_version": 99, "files": []}))
    with pytest.raises(UserError, match="schema_version 99.*reads schema_version 1.*regenerate"):
        load_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(UserError, match="damaged.*regenerate"):
        load_manifest(tmp_path)


# --------------------------------------------------------------------------------------------
# Determinism


def test_same_seed_gives_identical_bytes_whatever_the_worker_count(
    tmp_path: Path, dataset: tuple[Path, dict]
) -> None:
    assert_same_with_one_writer(generate_unet3d, dataset, tmp_path, SIZE, seed=7, params=SMALL)


def test_different_seed_gives_different_content(tmp_path: Path, dataset: tuple[Path, dict]) -> None:
    seed7, _ = dataset
    other = tmp_path / "other"
    generate_unet3d(other, SIZE, seed=8, workers=2, params=SMALL)
    assert (other / "case_00000_x.npy").read_bytes() != (seed7 / "case_00000_x.npy").read_bytes()
    assert (other / "case_00000_y.npy").read_bytes() != (seed7 / "case_00000_y.npy").read_bytes()


def test_case_content_does_not_depend_on_dataset_size(
    tmp_path: Path, dataset: tuple[Path, dict]
) -> None:
    # A smaller dataset from the same seed is a prefix of the larger one (except its shrunk
    # last case): each case derives from (seed, index) only.
    full, _ = dataset
    small = tmp_path / "small"
    manifest = generate_unet3d(small, SIZE // 3, seed=7, workers=2, params=SMALL)
    n = manifest["params"]["cases"]
    for i in range(n - 1):
        for s in ("x", "y"):
            name = f"case_{i:05d}_{s}.npy"
            assert (small / name).read_bytes() == (full / name).read_bytes()


# --------------------------------------------------------------------------------------------
# Output directory and validation


def test_non_empty_directory_is_refused_without_force(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(UserError, match="is not empty: choose an empty directory or pass --force"):
        generate_unet3d(out, SIZE, params=SMALL)
    # Not written by twintrace: even --force leaves it alone.
    with pytest.raises(UserError, match="not written by twintrace"):
        generate_unet3d(out, SIZE, params=SMALL, force=True)
    assert (out / "precious.txt").read_text() == "keep me"


def test_force_replaces_a_previous_dataset(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    big = generate_unet3d(out, 2 * SIZE, seed=1, params=SMALL)
    with pytest.raises(UserError, match="not empty"):
        generate_unet3d(out, SIZE, seed=1, params=SMALL)
    small = generate_unet3d(out, SIZE, seed=1, params=SMALL, force=True)
    assert small["params"]["cases"] < big["params"]["cases"]
    # No stale case of the larger dataset survives.
    assert data_files(out) == {f["name"] for f in small["files"]}


def test_force_removes_only_inside_the_directory(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    out = prepare_output_dir(tmp_path / "ds", force=False)
    (out / "sub").mkdir()
    (out / "link").symlink_to(outside, target_is_directory=True)
    prepare_output_dir(out, force=True)
    assert sorted(os.listdir(out)) == [MARKER_NAME]
    assert (outside / "keep.txt").exists()


def test_invalid_sizes_are_rejected_with_the_minimum(tmp_path: Path) -> None:
    minimum = minimum_dataset_bytes(SMALL)
    with pytest.raises(UserError, match="greater than zero"):
        generate_unet3d(tmp_path / "a", 0, params=SMALL)
    with pytest.raises(UserError, match="whole number of bytes"):
        generate_unet3d(tmp_path / "a", 1.5e9, params=SMALL)  # type: ignore[arg-type]
    with pytest.raises(UserError, match=f"at least {minimum} bytes"):
        generate_unet3d(tmp_path / "b", minimum - 1, params=SMALL)
    # A rejected request does not create or clear anything.
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with pytest.raises(UserError, match="seed"):
        generate_unet3d(tmp_path / "a", SIZE, seed=-1, params=SMALL)
    default_min = minimum_dataset_bytes()
    assert default_min == case_bytes(128, 128)
    with pytest.raises(UserError, match=r"\(1, 128, 128, 128\)"):
        plan_unet3d_cases(10_000_000)


def test_invalid_params_are_rejected() -> None:
    with pytest.raises(UserError, match="s1_range"):
        UNet3DGenParams(s1_range=(20, 10))
    with pytest.raises(UserError, match="min_dim"):
        UNet3DGenParams(s1_range=(8, 20), s2_range=(10, 24), min_dim=9)
    scaled = UNet3DGenParams.scaled(0.1)
    assert scaled.s1_range == (13, 47) and scaled.min_dim == 13


# --------------------------------------------------------------------------------------------
# Failures and interruption


def _write_then_fail(sink: FileSink, n: int) -> dict:
    sink.write(b"\0" * n)
    time.sleep(0.05)
    raise RuntimeError("simulated disk failure")


def _write_slowly(sink: FileSink, chunks: int) -> dict:
    for _ in range(chunks):
        sink.write(b"\1" * 1024)
        time.sleep(0.01)
    return {}


def _write_quickly(sink: FileSink, n: int) -> dict:
    sink.write(b"\2" * n)
    return {}


def test_failing_task_cancels_the_rest_and_leaves_no_partial_file(tmp_path: Path) -> None:
    out = prepare_output_dir(tmp_path / "ds", force=False)
    tasks = [
        # ~60 s unless cancelled (twice the bound below, which leaves a loaded host time to
        # start the workers); its size hint (16 MiB) closes a batch of tasks sent to one
        # worker, so the failing task runs at the same time on the other worker.
        FileTask("slow.bin", _write_slowly, (6000,), 16 << 20),
        FileTask("fails.bin", _write_then_fail, (4096,), 4096),
        *[FileTask(f"later_{i}.bin", _write_quickly, (10,), 10) for i in range(20)],
    ]
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="simulated disk failure"):
        run_file_tasks(out, tasks, workers=2)
    assert time.monotonic() - started < 30, "the running task was not cancelled"
    assert temp_files(out) == []
    assert not (out / "slow.bin").exists() and not (out / "fails.bin").exists()
    assert not (out / MANIFEST_NAME).exists()


def test_ctrl_c_as_the_pool_shuts_down_after_the_last_file_is_not_swallowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that lands while the pool shuts down, every file already written (a busy host
    makes that moment longer), still stops the generation: the files stay whole, none is a
    temporary one, and the KeyboardInterrupt reaches the caller, who writes no manifest."""
    from concurrent.futures import ProcessPoolExecutor

    shutdown = ProcessPoolExecutor.shutdown
    calls = []

    def interrupted_once(self: ProcessPoolExecutor, *args: object, **kw: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            shutdown(self, *args, **kw)  # the pool goes down, then the signal arrives
            raise KeyboardInterrupt
        shutdown(self, *args, **kw)

    monkeypatch.setattr(ProcessPoolExecutor, "shutdown", interrupted_once)
    out = prepare_output_dir(tmp_path / "ds", force=False)
    tasks = [FileTask(f"f{i}.bin", _write_quickly, (10,), 10) for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        run_file_tasks(out, tasks, workers=2)
    assert len(calls) == 2  # shut down again, as a Ctrl-C during the clean-up asks
    assert temp_files(out) == []
    assert sorted(p.name for p in out.glob("*.bin")) == ["f0.bin", "f1.bin", "f2.bin"]


def test_interrupted_generation_leaves_only_whole_files_and_no_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C reaches the parent while it reports progress; poll fast so that it lands mid-run.
    monkeypatch.setattr(common, "_POLL_S", 0.001)
    params = UNet3DGenParams(s1_range=(40, 60), s2_range=(80, 100), min_dim=40)
    size = 60_000_000

    def interrupt(done: int, total: int) -> None:
        if done > 0:
            raise KeyboardInterrupt

    out = tmp_path / "ds"
    with pytest.raises(KeyboardInterrupt):
        generate_unet3d(out, size, workers=2, params=params, progress=interrupt)
    planned = 2 * len(plan_unet3d_cases(size, 0, params))
    present = data_files(out)
    assert temp_files(out) == []
    assert not (out / MANIFEST_NAME).exists()
    assert len(present) < planned, "nothing was cancelled"
    for name in present:
        array = np.load(out / name)  # a truncated file would fail to load
        assert array.size > 0
    with pytest.raises(UserError, match="did not finish"):
        load_manifest(out)
    # No command takes it for a dataset: the workload's check (trace's, the reader's) refuses it.
    with pytest.raises(UserError, match=f"{out} is a twintrace dataset whose generation did not"):
        check_dataset(out)
    # The incomplete dataset is replaced with --force.
    generate_unet3d(out, SIZE, workers=2, params=SMALL, force=True)
    assert load_manifest(out)["params"]["cases"] > 0
    check_dataset(out)
    # A manifest cut short is refused as damaged; data twintrace did not write (no marker) is
    # taken as it is.
    manifest = (out / MANIFEST_NAME).read_bytes()
    (out / MANIFEST_NAME).write_bytes(manifest[: len(manifest) // 2])
    with pytest.raises(UserError, match=f"{out / MANIFEST_NAME} is damaged"):
        check_manifest(out, "unet3d")  # on the host before a run (tracing/request.py)
    (out / MANIFEST_NAME).unlink()
    (out / MARKER_NAME).unlink()
    assert check_dataset(out).items > 0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_on_the_process_group_stops_promptly_and_cleans_up(tmp_path: Path) -> None:
    # The real thing: SIGINT to the whole process group, as a terminal's Ctrl-C does, reaching
    # the parent and the worker processes at once. 3 GB takes seconds to write (300 MB took
    # 0.8 s here): a loaded host that delays the signal (this process descheduled between
    # seeing the first temporary file and sending it) must not let the whole dataset be
    # written first, as it once did with 300 MB.
    out = tmp_path / "ds"
    code = (
        "from datagen.unet3d import UNet3DGenParams, generate_unet3d\n"
        "if __name__ == '__main__':\n"
        f"    generate_unet3d({str(out)!r}, 3_000_000_000, workers=2,\n"
        "                    params=UNet3DGenParams.scaled(0.5))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, env=env, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while not (out.is_dir() and temp_files(out)):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "generation never started writing"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
        # Nothing is left running: the workers, fork server and resource tracker exit too.
        deadline = time.monotonic() + 10
        while _group_alive(proc.pid):
            assert time.monotonic() < deadline, "processes of the generator outlived it"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode != 0
    assert b"KeyboardInterrupt" in stderr
    assert temp_files(out) == []
    assert not (out / MANIFEST_NAME).exists()
    for name in data_files(out):
        np.load(out / name)


def test_atomic_file_leaves_nothing_on_error(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    with pytest.raises(ValueError), atomic_file(target) as f:
        f.write(b"half")
        raise ValueError("boom")
    assert os.listdir(tmp_path) == []
    with atomic_file(target, fsync=True) as f:
        f.write(b"whole")
    assert target.read_bytes() == b"whole" and os.listdir(tmp_path) == ["f.bin"]
    with pytest.raises(ValueError), atomic_file(target, fsync=True) as f:
        f.write(b"half")
        raise ValueError("boom")
    assert target.read_bytes() == b"whole" and os.listdir(tmp_path) == ["f.bin"]


def test_temp_files_of_a_dead_writer_are_removed(tmp_path: Path) -> None:
    # What a killed worker leaves: core.atomic's temporary names next to the files it wrote.
    (tmp_path / "sub").mkdir()
    left = [temp_path(tmp_path / "a.npy"), temp_path(tmp_path / "sub" / "b.v1.bin")]
    kept = [tmp_path / ".a.npy.notmine.tmp", temp_path(tmp_path / "other.npy"), tmp_path / "a.npy"]
    for path in left + kept:
        path.write_bytes(b"x")
    common.remove_temp_files(tmp_path, ["a.npy", "sub/b.v1.bin"])
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(kept)


def test_progress_reports_reach_the_total(tmp_path: Path) -> None:
    assert_progress_reaches_the_total(
        generate_unet3d, tmp_path / "ds", SIZE, workers=2, params=SMALL
    )


# --------------------------------------------------------------------------------------------
# Sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500MB", 500 * 10**6), ("2GiB", 2 * 2**30), ("1.5e9", 1_500_000_000), ("2g", 2 * 2**30)],
)
def test_parse_size_accepts_the_documented_formats(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "12 parsecs",
        "5 M B",
        "-5MB",
        "0",
        "1e-9",
    ],
)
def test_parse_size_rejects_junk_clearly(text: str) -> None:
    with pytest.raises(UserError, match="cannot parse size|at least one byte"):
        parse_size(text)


def test_small_files_are_batched_and_parts_stay_alone() -> None:
    small = [FileTask(f"f{i}.bin", _write_quickly, (10,), 100_000) for i in range(130)]
    batches = common.task_batches(small)
    assert [len(b) for b in batches] == [64, 64, 2]
    assert [t.name for b in batches for t in b] == [t.name for t in small]
    big = [FileTask(f"big{i}.bin", _write_quickly, (10,), 100 << 20) for i in range(3)]
    assert [len(b) for b in common.task_batches(big)] == [1, 1, 1]
    parts = [FileTask("one.bin", _write_quickly, (10,), 10, part=(i * 10, 10)) for i in range(2)]
    assert [len(b) for b in common.task_batches([*small[:3], *parts, *small[3:5]])] == [3, 1, 1, 2]


# --------------------------------------------------------------------------------------------
# Scratch files (intermediate files that dataset files are made from)


def _write_scratch(sink: FileSink, payload: bytes, delay: float) -> dict:
    time.sleep(delay)
    sink.write(payload)
    return {}


def _copy_scratch(sink: FileSink, path: str) -> dict:
    # Fails (FileNotFoundError) if it runs before its scratch file is complete.
    sink.write(Path(path).read_bytes() * 2)
    return {"copied": os.path.basename(path)}


def test_tasks_wait_for_their_scratch_files_and_scratch_is_not_counted(tmp_path: Path) -> None:
    scratch_dir = tmp_path / "scratch"
    scratch_dir.mkdir()
    # The first scratch file is slow: tasks on the second must not wait for it, tasks on the
    # first must.
    scratch = [
        FileTask("a.bin", _write_scratch, (b"A" * 1000, 0.5), 1000),
        FileTask("b.bin", _write_scratch, (b"B" * 10, 0.0), 10),
    ]
    tasks = [
        FileTask(f"d/{i}.bin", _copy_scratch, (str(scratch_dir / n),), 20, after=(n,))
        for i, n in enumerate(["a.bin", "b.bin", "a.bin", "b.bin"])
    ]
    calls: list[tuple[int, int]] = []
    out = prepare_output_dir(tmp_path / "ds", force=False)
    records = run_file_tasks(
        out,
        tasks,
        workers=2,
        progress=lambda d, t: calls.append((d, t)),
        scratch=scratch,
        scratch_dir=scratch_dir,
    )
    assert [r["name"] for r in records] == [t.name for t in tasks]
    assert [r["bytes"] for r in records] == [2000, 20, 2000, 20]
    assert (out / "d" / "0.bin").read_bytes() == b"A" * 2000
    assert sorted(os.listdir(scratch_dir)) == ["a.bin", "b.bin"]
    # Progress counts the dataset's bytes only.
    assert calls[-1] == (4040, 4040)
    assert max(d for d, _ in calls) == 4040


def test_a_failing_scratch_task_stops_the_run_and_leaves_no_temporary_file(
    tmp_path: Path,
) -> None:
    scratch_dir = tmp_path / "scratch"
    scratch_dir.mkdir()
    scratch = [FileTask("bad.bin", _write_then_fail, (100,), 100)]
    tasks = [
        FileTask("x.bin", _copy_scratch, (str(scratch_dir / "bad.bin"),), 10, after=("bad.bin",))
    ]
    out = prepare_output_dir(tmp_path / "ds", force=False)
    with pytest.raises(RuntimeError, match="simulated disk failure"):
        run_file_tasks(out, tasks, workers=2, scratch=scratch, scratch_dir=scratch_dir)
    assert os.listdir(scratch_dir) == []
    assert temp_files(out) == [] and not (out / "x.bin").exists()


def test_scratch_tasks_are_checked() -> None:
    task = FileTask("x.bin", _write_quickly, (1,), 1, after=("missing.bin",))
    with pytest.raises(ValueError, match="no scratch task writes"):
        run_file_tasks(Path("/nonexistent"), [task], scratch=[], scratch_dir=Path("/tmp"))
    scratch = [FileTask("s.bin", _write_quickly, (1,), 1)]
    with pytest.raises(ValueError, match="scratch_dir"):
        run_file_tasks(Path("/nonexistent"), [task], scratch=scratch)
    with pytest.raises(ValueError, match="distinct names"):
        run_file_tasks(Path("/nonexistent"), [task], scratch=scratch * 2, scratch_dir=Path("/tmp"))


_PROBE = """
import sys

WORKER_PRELOAD = ("core.units",)


def probe(sink, _):
    sink.write(b"x")
    return {"preloaded": "core.units" in sys.modules}
"""

_PROBE_MAIN = """
import json, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from datagen.common import FileTask, run_file_tasks
import probe_module
if __name__ == "__main__":
    records = run_file_tasks(Path("out"), [FileTask("x.bin", probe_module.probe, (0,), 1)], workers=1)
    print(json.dumps(records[0]))
"""


def test_workers_get_the_preload_from_any_working_directory(tmp_path: Path) -> None:
    # The fork server imports the writers' modules and their WORKER_PRELOAD once, for every
    # worker: also when the program runs outside the repository and PYTHONPATH is unset.
    (tmp_path / "probe_module.py").write_text(_PROBE)
    (tmp_path / "main.py").write_text(
        _PROBE_MAIN.format(repo=str(Path(__file__).resolve().parent.parent))
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "main.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["preloaded"] is True
