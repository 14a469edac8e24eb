"""The UNet3D workload: dataset checks, the three variants in-process and with two ranks.

Runs the real torch training on a tiny generated dataset (6 cases of (1, 40, 48, 48), patch 32)
and checks the MLLOG events against what must have happened: steps, files loaded, checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from core.errors import UserError
from tests.conftest import STEP_KEYS
from tracing.mllog import parse_mllog
from workloads.__main__ import main
from workloads.config import WorkloadConfig
from workloads.events import INSTRUMENTED_VARIANTS, Emitter
from workloads.registry import WORKLOADS, get_workload
from workloads.unet3d.dataset import UNet3DDataset, check_dataset, list_cases
from workloads.unet3d.model import UNet3D
from workloads.unet3d.options import UNet3DOptions
from workloads.unet3d.task import build_model

pytestmark = pytest.mark.integration

CASES = 6
SHAPE = (1, 40, 48, 48)
OPTIONS = {"patch_size": 32, "base_channels": 4, "depth": 3}  # ~0.1 s per step


def make_dataset(directory: Path, cases: int = CASES, shape: tuple[int, ...] = SHAPE) -> Path:
    """Write ``cases`` KiTS19-shaped pairs (float32 image, uint8 {0,1} labels)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(cases):
        np.save(directory / f"case_{i:05d}_x.npy", rng.standard_normal(shape, dtype=np.float32))
        np.save(directory / f"case_{i:05d}_y.npy", (rng.random(shape) > 0.8).astype(np.uint8))
    return directory


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("unet3d") / "data")


def run_variant(tmp_path: Path, data_dir: Path, variant: str, **settings: object) -> pd.DataFrame:
    """Run the workload like the container entry point does; returns the parsed events."""
    config = WorkloadConfig.from_dict(
        {
            "workload": "unet3d",
            "variant": variant,
            "epochs": 1,
            "batch_size": 2,
            "workers": 2,
            "options": OPTIONS,
            **settings,
        }
    )
    out = tmp_path / "out"
    with Emitter(out / "mllog.log", instrumenting=variant in INSTRUMENTED_VARIANTS) as em:
        get_workload("unet3d").run(config, data_dir, out, em)
    return parse_mllog(out / "mllog.log")


def keys(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    return frame[frame.key == key]


def sleep_profile(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(
        json.dumps(
            {
                "workload": "unet3d",
                "accelerator": "test",
                "source": "test: 50 ms per step",
                "compute": {"mean": {"const": 0.05}, "std": {}},
                **extra,
            }
        )
    )
    return path


def test_original_logs_phases_and_steps_only(tmp_path: Path, data_dir: Path) -> None:
    frame = run_variant(tmp_path, data_dir, "original")
    for name in ("init", "run", "epoch", "checkpoint"):
        assert len(keys(frame, name)) == 1, name
    assert len(keys(frame, "step_end")) == 3  # 6 cases, batch 2
    assert keys(frame, "step_end").step.tolist() == [0, 1, 2]
    assert not set(frame.key) & (STEP_KEYS | {"sample_load"})  # not instrumented
    assert (tmp_path / "out/checkpoints/ckpt_epoch1.pt").stat().st_size > 0
    state = torch.load(tmp_path / "out/checkpoints/ckpt_epoch1.pt")
    assert state.keys() == build_model(UNet3DOptions(**OPTIONS), 0).state_dict().keys()


def test_instrumented_logs_every_step_phase_and_every_file(tmp_path: Path, data_dir: Path) -> None:
    frame = run_variant(tmp_path, data_dir, "instrumented", eval_every=1)
    steps = keys(frame, "step_end")
    # eval_fraction 0.1 of 6 cases holds out 1: 5 training cases in batches 2, 2, 1
    assert steps.value.tolist() == ["2", "2", "1"]
    for key in STEP_KEYS:
        assert keys(frame, key).step.tolist() == [0, 1, 2], key
    # every case was read exactly once: 5 for training, 1 for evaluation, in worker processes
    loads = keys(frame, "sample_load")
    assert len(loads) == CASES == len(keys(frame, "sample_preproc"))
    assert set(loads.pid) != set(steps.pid)
    eval_ = keys(frame, "eval")
    assert len(eval_) == 1 and json.loads(eval_.value.iloc[0])["samples"] == 1
    compute = keys(frame, "all_compute").set_index("step")
    forward = keys(frame, "model_forward_pass").set_index("step")
    assert (compute.ts_ns <= forward.ts_ns).all() and (forward.end_ns <= compute.end_ns).all()
    assert (tmp_path / "out/checkpoints/ckpt_epoch1.pt").exists()


def test_sleep_never_runs_the_model(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(self: UNet3D, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the sleep variant ran the model")

    monkeypatch.setattr(UNet3D, "forward", forbidden)
    frame = run_variant(tmp_path, data_dir, "sleep", profile=str(sleep_profile(tmp_path)))
    assert len(keys(frame, "step_end")) == 3
    assert len(keys(frame, "sample_load")) == CASES  # the same data pipeline as the real run
    busy = keys(frame, "accelerator_busy").duration_ns / 1e9
    assert len(busy) == 3 and busy.between(0.05, 0.09).all()
    for key in ("load_batch_mem", "load_batch_gpu", "all_compute"):
        assert len(keys(frame, key)) == 3
    # the checkpoint is the configured model's state_dict, as torch.save writes it
    expected = tmp_path / "expected" / "ckpt_epoch1.pt"
    expected.parent.mkdir()
    torch.save(build_model(UNet3DOptions(**OPTIONS), 0).state_dict(), expected)
    written = tmp_path / "out/checkpoints/ckpt_epoch1.pt"
    assert written.read_bytes() == expected.read_bytes()


def test_sleep_checkpoint_bytes_and_max_steps(tmp_path: Path, data_dir: Path) -> None:
    h2d = {"mean": {"const": 0.02}, "std": {}}
    profile = sleep_profile(tmp_path, checkpoint_bytes=12345, h2d=h2d)
    frame = run_variant(tmp_path, data_dir, "sleep", profile=str(profile), max_steps=2, epochs=2)
    assert keys(frame, "step_end")[["epoch", "step"]].values.tolist() == [
        [1, 0],
        [1, 1],
        [2, 0],
        [2, 1],
    ]
    assert (keys(frame, "load_batch_gpu").duration_ns >= 20_000_000).all()  # h2d sleep
    for epoch in (1, 2):
        path = tmp_path / f"out/checkpoints/ckpt_epoch{epoch}.pt"
        assert path.stat().st_size == 12345
    assert json.loads(keys(frame, "checkpoint").value.iloc[0]) == 12345


@pytest.mark.parametrize("variant", ["sleep", "original"])
def test_two_ranks(tmp_path: Path, data_dir: Path, variant: str) -> None:
    extra = {"profile": str(sleep_profile(tmp_path))} if variant == "sleep" else {"max_steps": 1}
    frame = run_variant(tmp_path, data_dir, variant, accelerators=2, **extra)
    steps = keys(frame, "step_end")
    per_rank = steps.groupby("rank").size().to_dict()
    # each rank reads a 3-case shard: batches 2, 1 (or max_steps 1)
    assert per_rank == ({0: 2, 1: 2} if variant == "sleep" else {0: 1, 1: 1})
    assert steps.groupby("rank").pid.nunique().to_dict() == {0: 1, 1: 1}
    assert steps.pid.nunique() == 2
    assert sorted(keys(frame, "init")["rank"]) == [0, 1]
    if variant == "sleep":
        loads = keys(frame, "sample_load")
        assert len(loads) == CASES and sorted(loads["rank"].value_counts().tolist()) == [3, 3]
    assert keys(frame, "checkpoint")["rank"].tolist() == [0]
    assert (tmp_path / "out/checkpoints/ckpt_epoch1.pt").exists()


def test_check_dataset_and_errors(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data", cases=2, shape=(1, 8, 8, 8))
    summary = check_dataset(data)
    assert (summary.items, summary.files) == (2, 4)
    assert summary.bytes == sum(p.stat().st_size for p in data.iterdir())
    with pytest.raises(UserError, match="does not exist.*datagen unet3d"):
        check_dataset(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no case_NNNNN_x.npy"):
        check_dataset(tmp_path / "empty")
    truncated = data / "case_00001_x.npy"
    truncated.write_bytes(truncated.read_bytes()[:-10])
    with pytest.raises(UserError, match="case_00001_x.npy is truncated.*regenerate"):
        check_dataset(data)
    (data / "case_00001_y.npy").unlink()
    with pytest.raises(UserError, match="case_00001_x.npy has no matching case_00001_y.npy"):
        list_cases(data)


def test_unloadable_file_in_a_worker_is_a_one_line_user_error(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data", cases=2)
    (data / "case_00001_x.npy").write_bytes(b"not numpy")
    with pytest.raises(UserError) as info:
        run_variant(tmp_path, data, "original", workers=1, checkpoint_every=0)
    message = str(info.value)
    assert "\n" not in message and "case_00001_x.npy" in message and "datagen unet3d" in message


def test_dataset_item_shapes_and_padding(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data", cases=1, shape=(1, 20, 40, 40))
    dataset = UNet3DDataset.from_dir(data, 32)
    x, y = dataset[0]
    assert x.shape == (1, 32, 32, 32) and x.dtype == torch.float32
    assert y.shape == (1, 32, 32, 32) and y.dtype == torch.uint8
    assert set(y.unique().tolist()) <= {0, 1}


def test_options_and_registry_reject_mistakes() -> None:
    with pytest.raises(UserError, match="unknown setting 'patch'"):
        WORKLOADS["unet3d"].parse_options({"patch": 64})
    with pytest.raises(UserError, match="multiple of 2\\*\\*depth = 16"):
        UNet3DOptions(patch_size=40)
    with pytest.raises(UserError, match="unknown workload 'bert3d'.*unet3d"):
        get_workload("bert3d")


def test_entry_point_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = make_dataset(tmp_path / "data", cases=2, shape=(1, 8, 8, 8))
    assert main(["check-data", "--workload", "unet3d", "--data", str(data)]) == 0
    assert "2 items, 4 files" in capsys.readouterr().out
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"workload": "unet3d", "variant": "sleep", "options": {"x": 1}}))
    code = main(["run", "--config", str(config), "--data", str(data), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: unet3d options: unknown setting 'x'")
    assert err.count("\n") == 1
