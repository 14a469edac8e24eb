"""Data stalls (analysis/stalls.py, experiments/stalls.py, ./cli.py stalls): the differential
arithmetic on synthetic runs with known answers, the cached-fraction measurement against a
known resident set, bad input, and one reduced traced measurement (tiny images, one epoch)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from analysis.stalls import (
    CACHED_SLACK,
    CACHED_TOLERANCE,
    STALLS,
    STALLS_SCHEMA,
    WHAT_IF_PERCENTS,
    EpochFigures,
    differential,
    epoch_figures,
    is_fully_cached,
    union_s,
    what_if,
)
from core import versioned
from core.errors import UserError
from store.rundir import load_run
from tests.synthetic import MIB, SEC, events_frame, make_run, phases_frame
from tracing.host import resident_bytes, resident_fraction

MOUNTS = [{"source": "/srv/data", "target": "/data", "read_only": True}]


def _steps(t0: float, n: int, wait: float, h2d: float, compute: float, samples: int) -> list:
    """An epoch of ``n`` steps from ``t0``: each waits ``wait`` for its batch, copies for
    ``h2d`` and computes for ``compute`` (s); returns phases rows and the epoch's end."""
    rows = []
    t = t0
    for step in range(n):
        common = {"rank": 0, "epoch": 1, "step": step}
        rows.append({"key": "load_batch_mem", "t0": t, "t1": t + wait, **common})
        t += wait
        rows.append({"key": "load_batch_gpu", "t0": t, "t1": t + h2d, **common})
        rows.append({"key": "all_compute", "t0": t, "t1": t + h2d + compute, **common})
        t += h2d + compute
        rows.append({"key": "step_end", "t0": t, "value": samples, **common})
    rows.append({"key": "epoch", "t0": t0, "t1": t, "rank": 0, "epoch": 1})
    return rows


def test_union_of_intervals() -> None:
    start = np.array([0, 5, 2, 20], dtype=np.int64) * SEC
    end = np.array([3, 6, 4, 21], dtype=np.int64) * SEC
    # [0, 4] + [5, 6] + [20, 21] = 6 s
    assert union_s(start, end) == pytest.approx(6.0)
    assert union_s(np.array([], dtype=np.int64), np.array([], dtype=np.int64)) == 0.0


def test_epoch_figures_of_a_known_run(tmp_path: Path) -> None:
    # 5 steps from 1 s: wait 0.2, copy 0.1, compute 0.7 -> the epoch ends at 6 s.
    phases = phases_frame(_steps(1.0, 5, 0.2, 0.1, 0.7, 16))
    events = events_frame(
        [
            # ten 1 MiB dataset reads in the epoch (two of them folded into one row), 10 ms each
            *({"t": 1.5 + 0.1 * i, "path": "/data/f", "bytes": MIB, "latency_ns": 10**7}
              for i in range(8)),
            {"t": 2.5, "path": "/data/g", "bytes": 2 * MIB, "count": 2, "latency_ns": 2 * 10**7},
            # outside the epoch, and not the dataset: left out
            {"t": 7.0, "path": "/data/f", "bytes": MIB},
            {"t": 2.0, "path": "/usr/lib/x.so", "bytes": MIB},
            # block reads: [2.0, 2.5] and [2.4, 3.0] overlap -> 1.0 s busy; one after the epoch
            {"t": 2.5, "kind": "block_read", "bytes": 4 * MIB, "latency_ns": SEC // 2, "fd": -1},
            {"t": 3.0, "kind": "block_read", "bytes": 4 * MIB, "latency_ns": 6 * SEC // 10,
             "fd": -1},
            {"t": 6.5, "kind": "block_read", "bytes": MIB, "latency_ns": 1000, "fd": -1},
            # another container's (or the host's) block read: not this run's
            {"t": 4.0, "kind": "block_read", "bytes": MIB, "latency_ns": 1000, "fd": -1,
             "in_container": False},
        ]
    )  # fmt: skip
    run = load_run(make_run(tmp_path, events=events, phases=phases, mounts=MOUNTS))
    fig = epoch_figures(run)
    assert fig.steps == 5 and fig.samples == 80
    assert fig.epoch_s == pytest.approx(5.0)
    assert fig.h2d_s == pytest.approx(0.5)
    assert fig.compute_s == pytest.approx(3.5)
    assert fig.data_wait_s == pytest.approx(1.0)
    assert fig.dataset_bytes == 10 * MIB
    assert fig.read_s == pytest.approx(0.1)
    assert fig.block_read_bytes == 8 * MIB
    assert fig.block_busy_s == pytest.approx(1.0)
    assert fig.throughput == pytest.approx(16.0)
    with pytest.raises(UserError, match="no epoch 2"):
        epoch_figures(run, epoch=2)


def _figures(epoch_s: float, **changes: float) -> EpochFigures:
    base = EpochFigures(
        run_id="r",
        epoch=1,
        steps=10,
        samples=100,
        epoch_s=epoch_s,
        h2d_s=1.0,
        compute_s=7.0,
        data_wait_s=0.0,
        dataset_bytes=100 * MIB,
        read_s=0.5,
        block_read_bytes=0,
        block_busy_s=0.0,
    )
    return dataclasses.replace(base, **changes)


def test_differential_splits_the_epoch() -> None:
    runs = {
        "synthetic": _figures(10.0),
        "cached": _figures(14.0),
        "cold": _figures(20.0, block_read_bytes=100 * MIB, block_busy_s=4.0),
    }
    result = differential(runs)
    e = result["epoch"]
    assert e["compute_s"] == 7.0 and e["host_to_device_s"] == 1.0
    assert e["other_s"] == pytest.approx(2.0)
    assert e["prep_stall_s"] == pytest.approx(4.0)
    assert e["fetch_stall_s"] == pytest.approx(6.0)
    assert e["total_s"] == pytest.approx(20.0)  # the cold epoch, split
    assert result["fractions"] == pytest.approx({"prep_stall": 0.2, "fetch_stall": 0.3})
    assert result["throughput"] == pytest.approx({"ingestion": 10.0, "cached": 100 / 14, "cold": 5})
    assert result["cache_check"]["fully_cached"] is True
    assert result["warnings"] == []
    storage = result["storage"]
    assert storage["memory_bytes_per_s"] == pytest.approx(200 * MIB)  # 100 MiB in 0.5 s
    assert storage["disk_bytes_per_s"] == pytest.approx(25 * MIB)  # 100 MiB in 4 s busy
    table = {r["cached_percent"]: r for r in result["what_if"]}
    assert sorted(table) == sorted(WHAT_IF_PERCENTS)
    # Interpolated: the cached epoch plus the uncached share of the fetch stall.
    assert table[0]["interpolated_throughput"] == pytest.approx(100 / 20)
    assert table[50]["interpolated_throughput"] == pytest.approx(100 / 17)
    assert table[100]["interpolated_throughput"] == pytest.approx(100 / 14)
    # DS-Analyzer's model: 0 % -> 100 MiB from disk in 4 s -> 25 samples/s, capped by the
    # cached speed (7.1); 100 % is the cached speed.
    assert table[0]["predicted_throughput"] == pytest.approx(100 / 14)
    assert table[100]["predicted_throughput"] == pytest.approx(100 / 14)


def test_what_if_model_below_the_cap() -> None:
    # 1000 samples of 100 MB: disk 10 MB/s (10 s), memory 1000 MB/s (0.1 s), cap 500/s.
    rows = {r["cached_percent"]: r for r in what_if(1000, 100e6, 500.0, 1e9, 1e7, 1.0, 9.0)}
    assert rows[0]["predicted_throughput"] == pytest.approx(100.0)
    assert rows[50]["predicted_throughput"] == pytest.approx(1000 / (0.05 + 5.0))
    assert rows[100]["predicted_throughput"] == pytest.approx(500.0)


def test_differential_warns_and_clamps() -> None:
    runs = {
        "synthetic": _figures(10.0),
        "cached": _figures(9.0, block_read_bytes=50 * MIB),
        "cold": _figures(8.0),
    }
    result = differential(runs)
    assert result["epoch"]["prep_stall_s"] == 0.0
    assert result["epoch"]["fetch_stall_s"] == 0.0
    text = " ".join(result["warnings"])
    assert "prep stall taken as 0" in text and "fetch stall taken as 0" in text
    assert "not fully cached" in text and "read nothing from disk" in text
    assert result["cache_check"]["fully_cached"] is False
    # Within the tolerance (1 % of the dataset, at least 8 MiB: code faulted in), cached.
    runs["cached"] = _figures(9.0, block_read_bytes=CACHED_SLACK)
    assert differential(runs)["cache_check"]["fully_cached"] is True
    big = 2000 * MIB
    runs["cached"] = _figures(9.0, dataset_bytes=big, block_read_bytes=int(CACHED_TOLERANCE * big))
    assert differential(runs)["cache_check"]["fully_cached"] is True
    runs["cached"] = _figures(9.0, dataset_bytes=big, block_read_bytes=int(0.02 * big))
    assert differential(runs)["cache_check"]["fully_cached"] is False
    with pytest.raises(UserError, match="different numbers of steps"):
        differential({**runs, "cold": _figures(8.0, steps=9)})
    with pytest.raises(UserError, match="needs a cold run"):
        differential({k: runs[k] for k in ("synthetic", "cached")})


def test_resident_fraction_of_a_known_resident_set(tmp_path: Path) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    path = tmp_path / "f"
    path.write_bytes(os.urandom(16 * page + 100))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert resident_bytes(path) == (0, 16 * page + 100)
        # No readahead: exactly the pages read come in (every other one, and the tail).
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for i in range(0, 16, 2):
            os.pread(fd, 1, i * page)
        assert resident_bytes(path)[0] == 8 * page
        os.pread(fd, 1, 16 * page)
        assert resident_bytes(path)[0] == 8 * page + 100
        assert resident_fraction([path]) == pytest.approx((8 * page + 100) / (16 * page + 100))
    finally:
        os.close(fd)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert resident_bytes(empty) == (0, 0)
    assert resident_fraction([empty]) == 0.0


def test_a_read_throttle_names_the_datasets_whole_disk(tmp_path: Path) -> None:
    from tracing.host import block_device
    from tracing.request import Limits, read_throttle

    dev = os.stat(tmp_path).st_dev
    disk = block_device(tmp_path)
    # The named device is a whole disk (no partition) holding tmp_path's filesystem.
    name = disk.removeprefix("/dev/")
    assert Path(f"/sys/class/block/{name}").exists()
    assert not Path(f"/sys/class/block/{name}/partition").exists()
    mine = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    assert mine.name == name or mine.parent.name == name
    assert read_throttle(tmp_path, None) == ()
    assert read_throttle(tmp_path, 5_000_000) == ((disk, 5_000_000),)
    with pytest.raises(UserError, match="on no block device"):
        block_device(Path("/dev/shm"))
    with pytest.raises(UserError, match="read rate limit must be positive"):
        Limits(read_bps=0)


def test_cli_rejects_bad_input(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cli import cli

    runner = CliRunner()
    missing = tmp_path / "nope"
    result = runner.invoke(cli, ["stalls", "--workload", "resnet18", "--data", str(missing)])
    assert result.exit_code != 0
    assert f"--data {missing} is not a directory" in result.output
    result = runner.invoke(
        cli, ["stalls", "--workload", "resnet18", "--data", str(tmp_path), "--variant", "original"]
    )
    assert result.exit_code != 0 and "original" in result.output
    result = runner.invoke(
        cli,
        ["stalls", "--workload", "resnet18", "--data", str(tmp_path), "--cache-fractions", "x"],
    )
    assert result.exit_code != 0 and "--cache-fractions" in result.output
    result = runner.invoke(
        cli, ["stalls", "--workload", "resnet18", "--data", str(tmp_path), "--read-rate", "fast"]
    )
    assert result.exit_code != 0 and "fast" in result.output


def test_study_file_is_validated(tmp_path: Path) -> None:
    from experiments.studies import load_study

    base = '[[datasets]]\nname = "img"\ngenerator = "images"\nsize = "10MB"\n'
    cases = {
        '[study]\nkind = "nope"\n': "study kind must be one of",
        '[study]\nkind = "stalls"\nworkload = "resnet18"\n': "needs dataset",
        '[study]\nkind = "stalls"\ndataset = "x"\nworkload = "resnet18"\n': "not a [[datasets]]",
        '[study]\nkind = "stalls"\ndataset = "img"\nworkload = "resnet18"\ncores = [0]\n': (
            "cores must be a list of positive numbers"
        ),
        '[study]\nkind = "stalls"\ndataset = "img"\nworkload = "resnet18"\nread_rate = "x"\n': (
            "read_rate"
        ),
        '[study]\nkind = "stalls"\ndataset = "img"\nworkload = "resnet18"\nbogus = 1\n': (
            "unknown key 'bogus'"
        ),
        '[study]\nkind = "stalls"\ndataset = "img"\nworkload = "resnet18"\nmodels = ["alexnet"]\n': (
            "give accelerator"
        ),
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"s{i}.toml"
        path.write_text(base + text)
        with pytest.raises(UserError, match=message.replace("[", r"\[")):
            load_study(path)
    path = tmp_path / "ok.toml"
    path.write_text(
        base + '[study]\nkind = "stalls"\ndataset = "img"\nworkload = "resnet18"\n'
        'accelerator = "v100"\nmodels = ["alexnet", "resnet18"]\ncache_fractions = [0.5]\n'
    )
    study = load_study(path)
    assert study.kind == "stalls" and study.spec["models"] == ["alexnet", "resnet18"]


# ---------------------------------------------------------------------------------------------
# The real thing, reduced


def test_a_version_1_result_loads_as_version_2_and_an_unknown_version_is_refused(
    tmp_path: Path,
) -> None:
    from experiments.stalls import load_results

    path = tmp_path / "stalls.json"
    created = "2024-05-01T10:00:00.000+00:00"
    old = {"schema_version": 1, "kind": "stalls", "created": created, "settings": {"seed": 0}}
    path.write_text(json.dumps(old))
    result = load_results(path)
    assert (result["schema_version"], result["kind"]) == (2, "stalls")
    assert result["created_at"] == created and "created" not in result
    assert result["settings"] == {"seed": 0}
    path.write_text(json.dumps({**old, "schema_version": 99}))
    with pytest.raises(UserError, match="schema_version 99") as refused:
        load_results(path)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)
    path.write_text(json.dumps({**old, "kind": "stalls-study"}))
    with pytest.raises(UserError, match="not a stalls result"):
        load_results(path)
    with pytest.raises(UserError, match="does not exist: measure the stalls first"):
        load_results(tmp_path / "none.json")
    # As this version writes it (experiments/stalls.py): read back as it is.
    versioned.write_json(path, STALLS, {"settings": {"seed": 0}})
    result = load_results(path)
    assert result["schema_version"] == STALLS_SCHEMA and result["created_at"]


@pytest.fixture(scope="module")
def tiny_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datagen.registry import generate

    out = tmp_path_factory.mktemp("stall-images")
    generate("images", out, 12_000_000, seed=3)
    return out


#: The test dataset's disk read at 40 MB/s: the cold epoch's 12 MB cost about 0.3 s more than
#: the cached one's, well above the host's noise between two epochs (tens of ms); unthrottled,
#: this host's disk (1.9 GB/s) read them in about 6 ms, a stall smaller than that noise.
READ_BPS = 40_000_000


@pytest.mark.integration
@pytest.mark.docker
@pytest.mark.bpftrace
def test_reduced_stalls_run(images: dict[str, str], tiny_images: Path, tmp_path: Path) -> None:
    """Cold cache: a fetch stall; fully cached: none. Every run traced; results written."""
    from experiments.stalls import StallSettings, measure_stalls, traced_run
    from tracing.host import block_device, warm_files

    settings = StallSettings(
        workload="alexnet",
        data=tiny_images,
        accelerator="v100",
        batch_size=16,
        workers=1,
        options={"image_size": 32},
        read_bps=READ_BPS,
    )
    out = tmp_path / "stalls"
    result = measure_stalls(settings, out, log=lambda line: None)
    saved = json.loads((out / "stalls.json").read_text())
    assert saved["schema_version"] == STALLS_SCHEMA and saved["kind"] == "stalls"
    assert saved["created_at"] and "created" not in saved
    assert [r["kind"] for r in saved["runs_used"]] == ["synthetic", "cached", "cold"]
    assert all(Path(r["path"], "manifest.json").exists() for r in saved["runs_used"])
    assert (out / "stalls.html").stat().st_size > 0
    runs = result["runs"]
    # The synthetic epoch read nothing; the cached one read the dataset from memory only.
    assert runs["synthetic"]["dataset_bytes"] == 0
    assert runs["cached"]["dataset_bytes"] > 0
    assert result["cache_check"]["fully_cached"], result["warnings"]
    assert runs["cold"]["block_read_bytes"] >= 0.9 * runs["cold"]["dataset_bytes"]
    # The throttle was on the dataset's disk, and the cold epoch paid for it.
    manifest = json.loads(Path(saved["runs_used"][2]["path"], "manifest.json").read_text())
    throttle = manifest["containers"][0]["device_read_bps"]
    assert throttle == [[block_device(tiny_images), READ_BPS]]
    assert result["epoch"]["fetch_stall_s"] > 0.1
    # Measured again into the same directory (an interrupted study run again): the three runs
    # are kept, none is traced again, and the figures are those of the same runs.
    said: list[str] = []
    resumed = measure_stalls(settings, out, log=said.append)
    assert sum("done before, kept" in line for line in said) == 3, said
    assert [r["path"] for r in resumed["runs_used"]] == [r["path"] for r in saved["runs_used"]]
    assert len(list((out / "runs").glob("*/manifest.json"))) == 3
    assert resumed["epoch"] == result["epoch"]
    # Fully cached, the "cold" run's place taken by a second cached run: no fetch stall.
    warm_files(sorted(p for p in tiny_images.rglob("*") if p.is_file()))
    again = epoch_figures(traced_run(settings, out / "runs"))
    assert is_fully_cached(again)
    cached = EpochFigures(**{k: v for k, v in runs["cached"].items() if k != "throughput"})
    synthetic = EpochFigures(**{k: v for k, v in runs["synthetic"].items() if k != "throughput"})
    warm = differential({"synthetic": synthetic, "cached": cached, "cold": again})
    assert warm["epoch"]["fetch_stall_s"] < 0.25 * result["epoch"]["fetch_stall_s"]
