"""Integration: the workload zoo (BERT, DLRM, image classification) traced in real containers by
real bpftrace on tiny datasets from our generators, checked against what the data and the
reference input pipelines imply (one read of batch x 160 bytes per DLRM step, one open per
group file for grouped images, one open per shard per epoch for BERT's interleaved reader).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import traced_events
from tracing.request import workload_request
from tracing.runner import trace

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.bpftrace]

READS = ["read", "pread64", "readv"]


def _phases(run_dir: Path) -> pd.DataFrame:
    df = pd.read_parquet(run_dir / "phases.parquet")
    df["key"] = df["key"].astype(str)
    return df


def _run(runs_root: Path, data: Path, workload: str, variant: str, **settings: object) -> Path:
    options = settings.pop("options", {})
    run_dir = trace(
        workload_request(
            workload,
            variant,
            data,
            runs_root,
            settings={"epochs": 1, "workers": 2, "checkpoint_every": 0, **settings},
            options=options,
        )
    ).check()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["lost_events"] == 0
    return run_dir


def _steps(run_dir: Path) -> int:
    return int(json.loads((run_dir / "summary.json").read_text())["steps"])


def _generated(
    factory: pytest.TempPathFactory,
    name: str,
    generate: Callable[..., object],
    size: int,
    seed: int,
    params: object = None,
) -> Path:
    """A dataset of the module: ``generate(out, size, seed=seed, params=params)`` into a new
    folder ``out`` (``params`` None: the generator's defaults)."""
    out = factory.mktemp(name)
    generate(out, size, seed=seed, params=params)
    return out


# -- DLRM --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dlrm_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datagen.dlrm import generate_dlrm

    return _generated(tmp_path_factory, "dlrm", generate_dlrm, 3_000_000, seed=3)


@pytest.mark.parametrize("variant", ["sleep", "original"])
def test_dlrm_reads_one_contiguous_batch_per_step(
    images, dlrm_data: Path, runs_root: Path, variant: str
) -> None:
    from workloads.dlrm.files import RECORD_BYTES, load_dataset

    data = load_dataset(dlrm_data)
    batch = 1024
    run_dir = _run(runs_root, dlrm_data, "dlrm", variant, batch_size=batch)
    batches = data.train_records // batch
    assert _steps(run_dir) == batches
    events = traced_events(run_dir)
    train = events[events["path"] == f"/data/{data.train.name}"]
    reads = train[train["kind"].isin(READS)]
    # Exactly one pread64 of batch x 160 bytes per step, each at a distinct batch-aligned offset.
    assert (reads["kind"] == "pread64").all()
    assert len(reads) == batches
    assert (reads["bytes"] == batch * RECORD_BYTES).all()
    offsets = reads["offset"].to_numpy()
    assert (offsets % (batch * RECORD_BYTES) == 0).all()
    assert sorted(offsets) == [i * batch * RECORD_BYTES for i in range(batches)]
    # The batches come in a shuffled order, not file order.
    assert list(reads.sort_values("ts_ns")["offset"]) != sorted(offsets)
    if variant == "sleep":
        phases = _phases(run_dir)
        assert (phases["key"] == "batch_load").sum() == batches
        assert (phases["key"] == "accelerator_busy").sum() == batches


# -- images ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datagen.images import ImageGenParams, generate_images

    params = ImageGenParams(classes=4)
    return _generated(
        tmp_path_factory, "img-folder", generate_images, 2_500_000, seed=4, params=params
    )


@pytest.fixture(scope="module")
def grouped_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datagen.images import ImageGenParams, generate_images

    params = ImageGenParams(classes=4, group_size=4)
    return _generated(
        tmp_path_factory, "img-grouped", generate_images, 4_000_000, seed=5, params=params
    )


@pytest.mark.parametrize(("workload", "variant"), [("resnet18", "sleep"), ("alexnet", "original")])
def test_image_folder_run_opens_and_reads_every_training_image_once(
    images, folder_data: Path, runs_root: Path, workload: str, variant: str
) -> None:
    from workloads.images.files import load_image_data

    data = load_image_data(folder_data)
    run_dir = _run(
        runs_root, folder_data, workload, variant, batch_size=4, options={"image_size": 64}
    )
    assert _steps(run_dir) == -(-len(data.train) // 4)
    events = traced_events(run_dir)
    for sample in data.train:
        path = f"/data/{sample.path.relative_to(folder_data)}"
        opens = events[(events["kind"] == "openat") & (events["path"] == path)]
        assert len(opens) == 1, path
        read = events.loc[events["kind"].isin(READS) & (events["path"] == path), "bytes"].sum()
        assert read == sample.path.stat().st_size, path


@pytest.mark.parametrize(
    ("workload", "variant"),
    [("resnet18", "sleep"), ("alexnet", "sleep"), ("resnet50", "sleep"), ("resnet50", "original")],
)
def test_grouped_images_open_each_group_once_and_no_image_file(
    images, grouped_data: Path, runs_root: Path, workload: str, variant: str
) -> None:
    from workloads.images.files import load_image_data

    data = load_image_data(grouped_data)
    assert data.layout == "grouped" and data.group_size == 4
    run_dir = _run(
        runs_root, grouped_data, workload, variant, batch_size=8, options={"image_size": 64}
    )
    # Each step takes batch_size / G = 2 groups: one open and one whole read per group file.
    assert _steps(run_dir) == -(-len(data.train) // 2)
    events = traced_events(run_dir)
    data_opens = events[
        (events["kind"] == "openat") & events["path"].str.startswith("/data/", na=False)
    ]
    groups = data_opens[data_opens["path"].str.endswith(".bin")]
    assert sorted(groups["path"]) == sorted(
        f"/data/{g.path.relative_to(grouped_data)}" for g in data.train
    )
    assert not data_opens["path"].str.upper().str.endswith((".JPEG", ".JPG")).any()
    for group in data.train:
        path = f"/data/{group.path.relative_to(grouped_data)}"
        read = events.loc[events["kind"].isin(READS) & (events["path"] == path), "bytes"].sum()
        assert read == group.path.stat().st_size, path
    if variant == "sleep":
        assert (_phases(run_dir)["key"] == "sample_load").sum() == len(data.train)


# -- BERT --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datagen.bert import BertGenParams, generate_bert

    params = BertGenParams(records_per_file=16)
    return _generated(tmp_path_factory, "bert", generate_bert, 450_000, seed=6, params=params)


@pytest.mark.parametrize("variant", ["sleep", "original"])
def test_bert_reads_every_shard_once_interleaved(
    images, bert_data: Path, runs_root: Path, variant: str
) -> None:
    from workloads.bert.files import count_records, list_shards

    shards = list_shards(bert_data)
    assert len(shards) >= 4
    records = sum(count_records(s) for s in shards)
    settings = {"max_steps": 3} if variant == "original" else {}
    options = (
        {"hidden": 32, "layers": 1, "heads": 2, "intermediate": 64} if variant == "original" else {}
    )
    run_dir = _run(runs_root, bert_data, "bert", variant, batch_size=8, options=options, **settings)
    events = traced_events(run_dir)
    opens = events[
        (events["kind"] == "openat") & events["path"].str.startswith("/data/part-", na=False)
    ]
    if variant == "sleep":
        # A whole epoch: every shard opened exactly once by the loader workers and read
        # completely, several shards open at once (interleaved), reads of up to 256 KiB. (The
        # main process also reads the first record of the first shard to learn the shapes.)
        workers = events["comm"].astype(str) == "pt_data_worker"
        opens = opens[workers[opens.index]]
        assert sorted(opens["path"]) == sorted(f"/data/{s.name}" for s in shards)
        reads = events[
            events["kind"].isin(READS)
            & events["path"].str.startswith("/data/part-", na=False)
            & workers
        ]
        for shard in shards:
            assert (
                reads.loc[reads["path"] == f"/data/{shard.name}", "bytes"].sum()
                == shard.stat().st_size
            )
        assert reads["bytes"].max() <= 256 * 1024
        closes = events[
            (events["kind"] == "close")
            & events["path"].str.startswith("/data/part-", na=False)
            & workers
        ]
        first_close = closes["ts_ns"].min()
        assert (
            opens["ts_ns"] < first_close
        ).sum() >= 2  # a second shard opened before the first closed
        # Every full batch of each worker's records is a step.
        assert _steps(run_dir) <= records // 8
        assert (_phases(run_dir)["key"] == "batch_load").sum() >= _steps(run_dir)
    else:
        assert _steps(run_dir) == 3
        assert len(opens) >= 1
