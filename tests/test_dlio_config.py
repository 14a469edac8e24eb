"""The DLIO configuration derived from our datasets and workload configs (workloads/dlio.py):
known answers from hand-made manifests and profiles."""

from __future__ import annotations

import dataclasses
import math

import pytest

from core.errors import UserError
from workloads import dlio
from workloads.config import WorkloadConfig
from workloads.profile import Collective, Linear, Normal, SleepProfile, TablePoint


def unet3d_manifest() -> dict:
    files = []
    for case, (x, y) in enumerate([(3000, 1000), (5000, 1000), (7000, 3000)]):
        files += [
            {"name": f"case_{case:05d}_x.npy", "bytes": x},
            {"name": f"case_{case:05d}_y.npy", "bytes": y},
        ]
    return {"generator": "unet3d", "files": files, "total_bytes": 20000}


def test_unet3d_is_one_npz_per_case_of_the_pair_size() -> None:
    spec = dlio.dataset_spec(unet3d_manifest())
    assert (spec.format, spec.num_files, spec.samples_per_file) == ("npz", 3, 1)
    sizes = [4000, 6000, 10000]
    mean = sum(sizes) / 3
    std = math.sqrt(sum((s - mean) ** 2 for s in sizes) / 3)
    assert spec.record_length == round(mean) and spec.record_length_stdev == round(std)
    assert spec.target_bytes == pytest.approx(mean)
    section = spec.generator_section()
    assert section["data_folder"] == "/data" and section["keep_files"] is True
    assert section["num_files_eval"] == 0 and section["format"] == "npz"


def test_dlrm_is_one_indexed_binary_file_of_batches() -> None:
    """As DLIO's own DLRM configuration: a DLIO sample is a batch of records, read at once as
    our loader reads it; DLIO's batch is then 1 sample."""
    manifest = {
        "generator": "dlrm",
        "files": [
            {"name": "train_data.bin", "bytes": 160 * 5120, "records": 5120},
            {"name": "test_data.bin", "bytes": 160 * 100, "records": 100},
        ],
    }
    spec = dlio.dataset_spec(manifest, batch_size=1024)
    assert (spec.format, spec.num_files, spec.samples_per_file) == ("indexed_binary", 1, 5)
    assert spec.record_length == 163_840 and spec.batch_samples == 1024
    # DLIO's samples are squares: int(sqrt(163840)) = 404, 404^2 = 163216 bytes
    assert any("163216 bytes" in s for s in spec.substitutions)
    config = WorkloadConfig("dlrm", "dlio", batch_size=1024)
    assert dlio.dlio_batch(config, spec) == 1
    assert dlio.dlio_batch(config.replace(batch_size=3072), spec) == 3
    with pytest.raises(UserError, match="--batch-size 1024"):
        dlio.dlio_batch(config.replace(batch_size=1500), spec)
    with pytest.raises(UserError, match="fewer than a batch"):
        dlio.dataset_spec(manifest, batch_size=6000)


def test_bert_shards_become_npz_files_of_equal_sample_counts() -> None:
    manifest = {
        "generator": "bert",
        "files": [
            {"name": "part-00000-of-00002", "bytes": 400_000, "records": 200},
            {"name": "part-00001-of-00002", "bytes": 300_000, "records": 150},
        ],
    }
    spec = dlio.dataset_spec(manifest)
    assert (spec.format, spec.num_files, spec.samples_per_file) == ("npz", 2, 150)
    assert spec.record_length == 2000  # 700 kB over 350 records
    assert any("TensorFlow" in s for s in spec.substitutions)


def test_images_are_jpegs_sized_by_the_measured_bytes_per_pixel() -> None:
    manifest = {
        "generator": "images",
        "params": {"group_size": 0},
        "files": [
            {"name": "train/n0/a.JPEG", "bytes": 1000},
            {"name": "train/n1/b.JPEG", "bytes": 3000},
            {"name": "val/n0/c.JPEG", "bytes": 50_000},  # not a training image
        ],
    }
    spec = dlio.dataset_spec(manifest, jpeg_bytes_per_pixel=0.5)
    assert (spec.format, spec.num_files) == ("jpeg", 2)
    assert spec.record_length == 4000  # mean 2000 B at 0.5 B per pixel
    assert spec.record_length_stdev == 2000
    grouped = {
        "generator": "images",
        "params": {"group_size": 4, "train_images": 8},
        "files": [
            {"name": "train/group_0000.bin", "bytes": 4000},
            {"name": "train/g1", "bytes": 4000},
        ],
    }
    spec = dlio.dataset_spec(grouped, jpeg_bytes_per_pixel=1.0)
    assert (spec.num_files, spec.record_length) == (8, 1000)
    assert any("group files" in s for s in spec.substitutions)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"generator": "parquet", "files": [{"name": "x", "bytes": 1}]}, "cannot emulate"),
        ({"generator": "unet3d", "files": []}, "lists no files"),
        ({"generator": "dlrm", "files": [{"name": "x.bin", "bytes": 1}]}, "train_data.bin"),
        ({"generator": "bert", "files": [{"name": "part-0", "bytes": 1}]}, "records"),
    ],
)
def test_what_dlio_cannot_express_is_one_clear_error(manifest: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        dlio.dataset_spec(manifest)


def profile(**changes) -> SleepProfile:
    base = SleepProfile(
        workload="unet3d",
        accelerator="a100",
        source="test",
        compute=Normal(mean=Linear(b=0.01, const=0.1), std=Linear(const=0.02)),
        h2d=Normal(mean=Linear(const=0.005)),
    )
    return dataclasses.replace(base, **changes)


def test_computation_is_the_sleep_profiles_step() -> None:
    config = WorkloadConfig("unet3d", "dlio", batch_size=4, accelerators=1)
    got = dlio.computation(profile(), config)
    assert got.mean_s == pytest.approx(0.1 + 0.04 + 0.005)
    assert got.stdev_s == pytest.approx(0.02)
    assert got.parts["all_reduce_s"] == 0
    # a measured table point wins over the linear model, as for the sleep variant
    table = (TablePoint(g=1, b=4, mean=0.3, std=0.05),)
    got = dlio.computation(profile(table=table), config)
    assert (got.mean_s, got.stdev_s) == (pytest.approx(0.305), pytest.approx(0.05))
    # several ranks: the modelled all-reduce is folded in
    many = config.replace(accelerators=2)
    collective = Collective(bandwidth_bytes_per_s=1e9, latency_s=0.001)
    got = dlio.computation(profile(collective=collective), many, gradient_bytes=10**8)
    assert got.parts["all_reduce_s"] == pytest.approx(2 * 0.5 * 1e8 / 1e9 + 2 * 0.001)
    assert got.mean_s == pytest.approx(0.145 + got.parts["all_reduce_s"])


def test_workload_config_carries_the_runs_settings() -> None:
    config = WorkloadConfig(
        "unet3d", "dlio", epochs=3, batch_size=1, workers=2, max_steps=2, seed=7,
        checkpoint_every=2,
    )  # fmt: skip
    spec = dlio.dataset_spec(unet3d_manifest())
    compute = dlio.Computation(0.25, 0.03, {})
    section = dlio.workload_config(config, spec, compute, checkpoint_bytes=123_456)
    assert section["framework"] == "pytorch" and section["model"] == "unet3d"
    assert section["workflow"] == {
        "generate_data": False,
        "train": True,
        "evaluation": False,
        "checkpoint": True,
        "profiling": False,
    }
    assert section["reader"]["batch_size"] == 1 and section["reader"]["read_threads"] == 2
    assert section["train"] == {
        "epochs": 3,
        "computation_time": 0.25,
        "computation_time_stdev": 0.03,
        "seed": 7,
        "total_training_steps": 2,
    }
    assert section["checkpoint"]["model_size"] == 123_456
    assert section["checkpoint"]["epochs_between_checkpoints"] == 2
    assert section["dataset"] == spec.generator_section()
    assert section["output"]["folder"] == dlio.OUTPUT_DIR
    # 3 files over 2 ranks: DLIO 2.0.0 needs the samples to divide evenly, so it reads 2
    two = dlio.workload_config(config.replace(accelerators=2), spec, compute, 10)
    assert two["dataset"]["num_files_train"] == 2
    assert dlio.files_for_ranks(spec, 3) == 3
    with pytest.raises(UserError, match="cannot be shared evenly"):
        dlio.files_for_ranks(spec, 4)
    # max_steps beyond what the files give: DLIO would refuse to run; no cap then
    assert (
        "total_training_steps"
        not in dlio.workload_config(config.replace(max_steps=4), spec, compute, 10)["train"]
    )
    # no checkpoints, no stdev, every step: none of those keys
    quiet = dlio.workload_config(
        config.replace(checkpoint_every=0, max_steps=0), spec, dlio.Computation(0.1, 0.0, {}), 10
    )
    assert quiet["workflow"]["checkpoint"] is False
    assert "total_training_steps" not in quiet["train"]
    assert "computation_time_stdev" not in quiet["train"]
    assert quiet["checkpoint"]["model_size"] == 1024  # never DLIO's multi-GB default


def test_generator_config_only_generates() -> None:
    spec = dlio.dataset_spec(unet3d_manifest())
    section = dlio.generator_config(spec)
    assert section["workflow"] == {"generate_data": True, "train": False, "checkpoint": False}
    assert section["dataset"] == spec.generator_section()


def test_dataset_spec_round_trips_through_its_dict() -> None:
    spec = dlio.dataset_spec(unet3d_manifest())
    assert dlio.DatasetSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(UserError, match="unknown key 'color'"):
        dlio.DatasetSpec.from_dict({**spec.to_dict(), "color": 1})
