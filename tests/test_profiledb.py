"""The profile database (store/profiledb.py): the shipped tables against their sources,
the lookup rules, the conversion to sleep profiles, and the CLI and request plumbing of
``--accelerator`` (no container is started)."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import cli as cli_module
from core.errors import UserError
from experiments.orchestrate import load_experiment
from store.profiledb import (
    DATABASE_DIR,
    IMAGE_WORKLOADS,
    default_database,
    load_database,
    lookup,
    sleep_profile_for,
)
from store.profiletables import local_slope
from workloads.profile import PROFILES_DIR, SleepProfile, load_profile
from workloads.registry import WORKLOADS

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "reference-data"
GIB = 2**30


def csv_rows() -> dict[tuple[str, str, int], dict[str, float]]:
    """The shipped GPEmu table, read independently of the module under test."""
    with gzip.open(DATABASE_DIR / "gpemu-profiles.csv.gz", "rt", newline="") as fh:
        return {
            (r["gpu"], r["model"], int(r["batch_size"])): {
                k: float(v) for k, v in r.items() if k not in ("gpu", "model", "batch_size")
            }
            for r in csv.DictReader(fh)
        }


@pytest.fixture(scope="module")
def rows() -> dict[tuple[str, str, int], dict[str, float]]:
    return csv_rows()


def _parsed_checksum(lines: list[list[str]]) -> tuple[int, str]:
    """(rows, sha256 of the names and the numbers parsed as float64)."""
    names = "\n".join(f"{r[0]},{r[1]}" for r in lines).encode()
    numbers = np.array([[float(v) for v in r[2:]] for r in lines], dtype=np.float64)
    return len(lines), hashlib.sha256(names + numbers.tobytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# The shipped data


@pytest.mark.skipif(
    not (SHARED / "gpemu-profiles.csv").exists(), reason="../shared/reference-data is not here"
)
def test_the_compressed_table_is_the_shared_reference_table() -> None:
    with gzip.open(DATABASE_DIR / "gpemu-profiles.csv.gz", "rt", newline="") as fh:
        shipped = list(csv.reader(fh))
    with (SHARED / "gpemu-profiles.csv").open(newline="") as fh:
        reference = list(csv.reader(fh))
    assert shipped[0] == reference[0]
    assert _parsed_checksum(shipped[1:]) == _parsed_checksum(reference[1:])
    assert len(shipped) - 1 == 6 * 36 * 256
    transfer = (DATABASE_DIR / "gpemu-model-transfer.csv").read_bytes()
    assert transfer == (SHARED / "gpemu-model-transfer.csv").read_bytes()


def test_the_database_covers_the_sources() -> None:
    db = default_database()
    assert {a: len(db.models(a)) for a in ("k80", "m40", "p100", "rtx6000")} == dict.fromkeys(
        ("k80", "m40", "p100", "rtx6000"), 36
    )
    assert db.models("h100") == ["resnet50", "unet3d"]
    assert db.models("epyc-2t") == ["alexnet", "bert", "dlrm", "resnet18", "resnet50", "unet3d"]
    assert db.models("h100-80gb") == db.models("epyc-2t")  # measured on an H100 (docs/gpus.md)
    assert db.models("cpu") == []  # this host's CPU: measured here, not a table
    assert {"bert", "dlrm", "unet3d", "vgg16", "resnet18"} <= set(db.models("v100"))
    # The card memory is the vendor's, in GiB; M40 is its 12 GB variant (docs/profiles.md).
    capacity = {k: a.capacity_bytes for k, a in db.accelerators.items()}
    assert capacity == {
        "a100": 40 * GIB,
        "v100": 32 * GIB,
        "p100": 16 * GIB,
        "rtx6000": 24 * GIB,
        "k80": 12 * GIB,
        "m40": 12 * GIB,
        "h100": None,
        "cpu": None,
        "epyc-2t": None,
        "h100-80gb": 85017493504,  # what CUDA reported as the card's total memory
    }
    for acc in db.accelerators.values():
        assert acc.capacity_source.startswith(("vendor specification", "not ", "measured by"))
    for source in db.sources.values():
        assert source.text and source.cite


def test_image_workloads_are_the_registry_image_workloads() -> None:
    assert {w for w, s in WORKLOADS.items() if s.datagen == "images"} == IMAGE_WORKLOADS


def test_the_database_stays_out_of_the_images() -> None:
    from images.build import context_files

    files = set(context_files())
    assert "workloads/profile.py" in files and "workloads/profiles/unet3d.json" in files
    assert not {f for f in files if f.startswith("store") or "profiledb" in f or "gpemu" in f}


# ---------------------------------------------------------------------------------------------
# Lookup


@pytest.mark.parametrize(
    ("accelerator", "gpu", "model", "batch"),
    [
        ("v100", "Tesla_V100-PCIE-32GB", "resnet18", 64),
        ("a100", "NVIDIA_A100-SXM4-40GB", "alexnet", 1),
        ("k80", "Tesla_K80", "vgg16", 256),
        ("rtx6000", "Quadro_RTX_6000", "mobilenet_v3_small", 37),
    ],
)
def test_an_exact_lookup_is_the_csv_row(
    rows: dict, accelerator: str, gpu: str, model: str, batch: int
) -> None:
    row = rows[(gpu, model, batch)]
    entry = lookup(accelerator, model, batch)
    assert (entry.method, entry.rows, entry.source_id) == ("exact", (batch,), "gpemu")
    assert entry.forward_s == row["forward_s"] and entry.backward_s == row["backward_s"]
    assert entry.compute_s == row["forward_s"] + row["backward_s"]
    assert entry.h2d_s == row["h2d_s"] and entry.optimizer_s is None
    assert entry.peak_bytes == row["peak_memory_mb"] * 2**20
    assert entry.persistent_bytes == row["persistent_memory_mb"] * 2**20
    with (DATABASE_DIR / "gpemu-model-transfer.csv").open() as fh:
        transfer = {
            (r["gpu"], r["model"]): float(r["model_transfer_s"]) for r in csv.DictReader(fh)
        }
    assert entry.model_transfer_s == transfer[(gpu, model)]
    assert "mengwanguc/gpemu" in entry.source and gpu in entry.source


@pytest.mark.parametrize(
    "name",
    ["v100", "V100", "Tesla_V100-PCIE-32GB", "Tesla V100-PCIE-32GB", " tesla v100 pcie 32gb"],
)
def test_accelerator_names_and_aliases(name: str) -> None:
    assert default_database().accelerator(name.strip()).key == "v100"


def test_every_short_alias_resolves() -> None:
    db = default_database()
    for alias in ("a100", "v100", "p100", "rtx6000", "k80", "m40", "h100", "cpu", "epyc-2t"):
        assert db.accelerator(alias).key == alias
    assert db.accelerator("Quadro RTX 6000").key == "rtx6000"
    assert db.accelerator("NVIDIA_A100-SXM4-40GB").name == "NVIDIA A100-SXM4-40GB"


TINY_DB = """
schema_version = 1
default_order = ["t"]

[accelerators.x1]
name = "X1"
capacity_gib = 1

[sources.t]
title = "test"
cite = "test rows"
kind = "rows"
source = "made up for the test"
rows = [
  { accelerator = "x1", model = "m", batch = 4, compute_s = 16.0, h2d_s = 1.0 },
  { accelerator = "x1", model = "m", batch = 8, compute_s = 64.0, h2d_s = 2.0 },
  { accelerator = "x1", model = "m", batch = 16, compute_s = 256.0, h2d_s = 3.0 },
  { accelerator = "x1", model = "m", batch = 32, compute_s = 1024.0, h2d_s = 5.0 },
  { accelerator = "x1", model = "one", batch = 10, compute_s = 2.0 },
]
"""


@pytest.fixture()
def tiny(tmp_path: Path):
    path = tmp_path / "db.toml"
    path.write_text(TINY_DB)
    return load_database(path)


def test_interpolation_is_linear_between_the_two_nearest_and_exact_at_the_ends(tiny) -> None:
    assert tiny.lookup("x1", "m", 8).compute_s == 64.0
    assert tiny.lookup("x1", "m", 16).compute_s == 256.0
    values = [tiny.lookup("x1", "m", b) for b in range(8, 17)]
    assert {e.method for e in values[1:-1]} == {"interpolated"}
    assert {e.rows for e in values[1:-1]} == {(8, 16)}
    expected = np.interp(np.arange(8, 17), [8, 16], [64.0, 256.0])
    assert [e.compute_s for e in values] == pytest.approx(expected.tolist())
    assert tiny.lookup("x1", "m", 12).h2d_s == pytest.approx(2.5)
    # Not along b^2 (the made-up curve), nor across a third row.
    assert tiny.lookup("x1", "m", 12).compute_s == pytest.approx(160.0)


def test_extrapolation_follows_the_stated_rule(tiny) -> None:
    # Beyond the largest size (32): from its row, along the least-squares slope of the rows
    # within a factor 2 of it (16 and 32): (1024 - 256) / 16 = 48 per sample.
    above = tiny.lookup("x1", "m", 40)
    assert above.method == "extrapolated" and above.rows == (32, 16, 32)
    assert above.compute_s == pytest.approx(1024 + 48 * 8)
    assert above.h2d_s == pytest.approx(5 + (5 - 3) / 16 * 8)
    # Below the smallest (4): the rows 4 and 8, slope 12, clipped at 0.
    assert tiny.lookup("x1", "m", 3).compute_s == pytest.approx(16 - 12)
    assert tiny.lookup("x1", "m", 1).compute_s == 0.0
    # One measured size: proportional.
    single = tiny.lookup("x1", "one", 25)
    assert single.method == "extrapolated" and single.compute_s == pytest.approx(5.0)
    assert "proportionally" in single.describe()


def test_extrapolation_of_the_real_table(rows: dict) -> None:
    sizes = np.arange(128, 257)
    compute = np.array(
        [
            rows[("NVIDIA_A100-SXM4-40GB", "resnet50", b)]["forward_s"]
            + rows[("NVIDIA_A100-SXM4-40GB", "resnet50", b)]["backward_s"]
            for b in sizes
        ]
    )
    slope = np.polyfit(sizes, compute, 1)[0]
    entry = lookup("a100", "resnet50", 320)
    assert entry.method == "extrapolated" and entry.rows == (256, 128, 256)
    assert entry.compute_s == pytest.approx(compute[-1] + slope * 64)
    # Persistent memory does not grow with the batch: held at the last row's.
    last = rows[("NVIDIA_A100-SXM4-40GB", "resnet50", 256)]
    assert entry.persistent_bytes == last["persistent_memory_mb"] * 2**20
    assert entry.peak_bytes > last["peak_memory_mb"] * 2**20


def test_local_slope_rule() -> None:
    sizes = np.array([1, 2, 4, 8, 64])
    values = (sizes.astype(float) ** 2)[:, None]
    # Within a factor 2 of 4: 2, 4, 8 -> least squares of (2,4), (4,16), (8,64).
    assert local_slope(sizes, values, 4)[0] == pytest.approx(
        np.polyfit([2, 4, 8], [4, 16, 64], 1)[0]
    )
    # Nothing else within a factor 2 of 64: the two nearest sizes, 8 and 64.
    assert local_slope(sizes, values, 64)[0] == pytest.approx((4096 - 64) / 56)
    assert local_slope(np.array([10]), np.array([[3.0]]), 99)[0] == pytest.approx(0.3)


def test_a_measured_row_beats_an_extrapolation_and_the_order_settles_ties() -> None:
    # ResNet-50 on A100: GPEmu (1-256) and MLPerf Storage (400).
    assert lookup("a100", "resnet50", 400).source_id == "mlperf-storage"
    assert lookup("a100", "resnet50", 400).compute_s == 0.435
    assert lookup("a100", "resnet50", 300).source_id == "gpemu"  # both extrapolate
    gpemu = lookup("a100", "resnet50", 400, source="gpemu")
    assert gpemu.method == "extrapolated" and 0.435 < gpemu.compute_s < 0.435 * 1.2
    # ResNet-18 on V100 at 64: both have the row; GPEmu is the default (docs/profiles.md).
    assert lookup("v100", "resnet18", 64).source_id == "gpemu"
    assert lookup("v100", "resnet18", 64).compute_s == pytest.approx(0.0664, abs=1e-4)
    osre = lookup("v100", "resnet18", 64, source="osre-2023")
    assert (osre.compute_s, osre.h2d_s, osre.method) == (0.197, 0.004, "exact")


def test_mlperf_storage_rows() -> None:
    expected = {("a100", "unet3d", 7): 0.636, ("h100", "unet3d", 7): 0.323}
    expected |= {("a100", "resnet50", 400): 0.435, ("h100", "resnet50", 400): 0.224}
    for (acc, model, batch), seconds in expected.items():
        entry = lookup(acc, model, batch)
        assert (entry.compute_s, entry.method, entry.source_id) == (
            seconds,
            "exact",
            "mlperf-storage",
        )


def test_published_fits_are_the_shipped_profiles() -> None:
    unet3d = lookup("v100", "unet3d", 4, accelerators=8)
    assert unet3d.method == "fit" and unet3d.source_id == "discs-vldb"
    assert unet3d.compute_s == pytest.approx(0.00211888 * 8 + 0.27448834 * 4 + 0.27738914)
    assert lookup("v100", "unet3d", 9).notes  # outside the fitted batch 1-5
    dlrm = lookup("v100", "dlrm", 2048)
    assert dlrm.compute_s == 0.0106  # the measured point the profile's table holds
    profile = dlrm.to_sleep_profile("dlrm", 1)
    shipped = load_profile(PROFILES_DIR / "dlrm.json")
    assert (profile.compute, profile.table, profile.batch) == (
        shipped.compute,
        shipped.table,
        "global",
    )
    assert "discs-vldb" in profile.source


@pytest.mark.parametrize(
    ("args", "messages"),
    [
        (("h100", "vgg16", 8), ["no vgg16 on h100", "h100 covers resnet50, unet3d", "a100"]),
        (
            ("epyc-2t", "vgg16", 8),
            [
                "epyc-2t covers alexnet, bert, dlrm, resnet18, resnet50, unet3d",
                "vgg16 is covered on a100",
            ],
        ),
        (("a100", "gpt3", 8), ["gpt3 is in no table", "vgg16"]),
        (("tpu", "resnet18", 8), ["unknown accelerator 'tpu'", "a100 (NVIDIA A100-SXM4-40GB)"]),
        (("a100", "resnet18", 0), ["at least 1"]),
    ],
)
def test_an_uncovered_request_says_what_is_covered(
    args: tuple[str, str, int], messages: list[str]
) -> None:
    with pytest.raises(UserError) as info:
        lookup(*args)
    for message in messages:
        assert message in str(info.value)


def test_a_source_that_does_not_cover_the_request() -> None:
    with pytest.raises(UserError, match="comes from gpemu"):
        lookup("a100", "vgg16", 8, source="mlperf-storage")
    with pytest.raises(UserError, match="unknown profile source"):
        lookup("a100", "vgg16", 8, source="nope")


def test_the_gpemu_regression_tail_is_flagged() -> None:
    db = default_database()
    table = next(t for t in db.tables[("k80", "resnet152")] if t.source.id == "gpemu")
    assert table.measured_max == 60
    assert not any("up to batch" in n for n in lookup("k80", "resnet152", 60).notes)
    entry = lookup("k80", "resnet152", 240)
    assert any("up to batch 60" in n for n in entry.notes)
    # Its persistent memory there is negative in the table: the profile takes 0.
    assert entry.persistent_bytes < 0
    assert entry.to_sleep_profile("resnet50").memory.persistent_bytes == 0.0
    # And its peak is beyond the card, so an emulated step fails like the real card would.
    memory = entry.to_sleep_profile("resnet50").memory
    assert memory.peak(1, 240) > memory.capacity_bytes
    assert all(t.measured_max is None for t in db.tables[("a100", "alexnet")])


# ---------------------------------------------------------------------------------------------
# Conversion to a sleep profile


def test_the_sleep_profile_of_an_exact_row(rows: dict) -> None:
    row = rows[("Tesla_V100-PCIE-32GB", "vgg16", 32)]
    entry = lookup("v100", "vgg16", 32)
    profile = entry.to_sleep_profile("resnet50", 2)
    assert profile.workload == "resnet50" and profile.accelerator == "Tesla V100-PCIE-32GB"
    assert profile.compute_params(2, 32) == (row["forward_s"] + row["backward_s"], 0.0)
    assert profile.table[0].g == 2 and profile.table[0].b == 32
    # Other batch sizes: the line through the point along the local slope.
    assert profile.compute.mean(2, 32) == pytest.approx(profile.table[0].mean)
    assert profile.compute.mean.b == pytest.approx(entry.slopes["compute_s"])
    assert profile.h2d.params(2, 32) == (row["h2d_s"], 0.0)
    assert profile.h2d.params(2, 8) == (row["h2d_s"], 0.0)  # constant
    total = row["forward_s"] + row["backward_s"]
    assert profile.split.forward == pytest.approx(row["forward_s"] / total)
    assert profile.split.backward == pytest.approx(row["backward_s"] / total)
    assert profile.split.optimizer == 0.0
    assert profile.memory.capacity_bytes == 32 * GIB
    assert profile.memory.persistent_bytes == row["persistent_memory_mb"] * 2**20
    assert profile.memory.peak(2, 32) == pytest.approx(row["peak_memory_mb"] * 2**20)
    assert profile.model_transfer_s == entry.model_transfer_s > 0
    assert profile.collective.interconnect == "pcie3"
    assert "exact" in profile.source and "vgg16" in profile.source
    assert "gpemu" in profile.source.lower()


@pytest.mark.parametrize(
    ("accelerator", "model", "batch", "workload"),
    [
        ("v100", "resnet18", 64, "resnet18"),
        ("a100", "vgg16", 100, "alexnet"),
        ("p100", "resnet50", 300, "resnet50"),
        ("h100", "unet3d", 4, "unet3d"),
        ("epyc-2t", "alexnet", 6, "alexnet"),
        ("v100", "bert", 4, "bert"),
    ],
)
def test_sleep_profiles_round_trip_and_compute_is_forward_plus_backward(
    accelerator: str, model: str, batch: int, workload: str
) -> None:
    entry = lookup(accelerator, model, batch)
    profile = entry.to_sleep_profile(workload, 1, batch)
    assert SleepProfile.from_dict(profile.to_dict()) == profile
    assert SleepProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile
    mean, _ = profile.compute_params(1, profile.profile_batch(batch, 1))
    if entry.forward_s is not None and entry.optimizer_s is None:
        assert mean == pytest.approx(entry.forward_s + entry.backward_s)
    elif entry.forward_s is not None:  # measured: + optimizer + the loss read-back
        parts = entry.forward_s + entry.backward_s + entry.optimizer_s
        assert 0.8 * mean <= parts <= mean
    assert mean == pytest.approx(entry.compute_s)
    assert entry.method in profile.source


def test_interpolated_and_extrapolated_profiles_say_so() -> None:
    assert "interpolated" in lookup("epyc-2t", "alexnet", 5).to_sleep_profile("alexnet").source
    profile = lookup("a100", "resnet50", 300).to_sleep_profile("resnet50")
    assert "extrapolated" in profile.source and "128-256" in profile.source


def test_a_workload_emulates_only_models_it_can() -> None:
    assert sleep_profile_for("resnet18", "a100", 8, model="densenet121").workload == "resnet18"
    with pytest.raises(UserError, match="emulates only its own model"):
        sleep_profile_for("unet3d", "a100", 8, model="vgg16")
    with pytest.raises(UserError, match="can emulate an image model, not bert"):
        sleep_profile_for("resnet50", "v100", 4, model="bert")
    with pytest.raises(UserError, match="looked up for batch 8"):
        lookup("a100", "vgg16", 8).to_sleep_profile("resnet50", 1, 16)


# ---------------------------------------------------------------------------------------------
# CLI, requests, experiments


def test_cli_profiles_json() -> None:
    result = CliRunner().invoke(cli_module.cli, ["profiles", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    cover = {(r["accelerator"], r["model"], r["source_id"]): r for r in data["coverage"]}
    # GPEmu's pairs, MLPerf Storage's three that GPEmu lacks, the three fits, the CPU's six,
    # the H100's six.
    assert len({(a, m) for a, m, _ in cover}) == 6 * 36 + 3 + 3 + 6 + 6
    assert cover[("a100", "resnet50", "gpemu")]["default"]
    assert not cover[("a100", "resnet50", "mlperf-storage")]["default"]
    assert cover[("v100", "resnet18", "gpemu")]["batch_min"] == 1
    assert cover[("v100", "resnet18", "gpemu")]["batch_max"] == 256
    assert cover[("v100", "unet3d", "discs-vldb")]["kind"] == "fit"
    assert data["default_order"][0] == "gpemu"
    assert {s["id"] for s in data["sources"]} == set(default_database().sources)


def test_cli_profiles_filters() -> None:
    runner = CliRunner()
    result = runner.invoke(cli_module.cli, ["profiles", "--json", "--accelerator", "H100"])
    assert {r["model"] for r in json.loads(result.output)["coverage"]} == {"unet3d", "resnet50"}
    result = runner.invoke(cli_module.cli, ["profiles", "--json", "--workload", "unet3d"])
    accelerators = {r["accelerator"] for r in json.loads(result.output)["coverage"]}
    assert accelerators == {"a100", "h100", "v100", "epyc-2t", "h100-80gb"}
    result = runner.invoke(cli_module.cli, ["profiles", "--accelerator", "tpu"])
    assert result.exit_code == 1 and "unknown accelerator 'tpu'" in result.output
    result = runner.invoke(cli_module.cli, ["profiles", "--accelerator", "k80"])
    assert result.exit_code == 0 and "Tesla K80" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--variant", "sleep", "--accelerator", "a100", "--profile", "p.json"], "give one of"),
        (["--variant", "original", "--accelerator", "a100"], "use --variant sleep"),
        (["--variant", "instrumented", "--accelerator", "a100"], "use --variant sleep"),
        (["--variant", "sleep", "--profile-model", "vgg16"], "give --accelerator too"),
        (["--variant", "sleep", "--accelerator", "tpu"], "unknown accelerator 'tpu'"),
        (["--variant", "sleep", "--accelerator", "h100", "--batch-size", "8"], "h100 covers"),
        (
            ["--variant", "sleep", "--accelerator", "a100", "--profile-model", "bert"],
            "not bert",
        ),
    ],
)
def test_cli_trace_accelerator_errors(tmp_path: Path, args: list[str], message: str) -> None:
    # Refused before the data is looked at or anything starts (no --data given).
    result = CliRunner().invoke(
        cli_module.cli,
        ["trace", "--workload", "resnet18", *args, "--out", str(tmp_path / "runs")],
    )
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_cli_trace_accelerator_is_for_workload_runs(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli_module.cli, ["trace", "--image", "x", "--accelerator", "a100", "--", "true"]
    )
    assert result.exit_code == 1 and "for --workload runs" in result.output


def test_workload_request_mounts_the_looked_up_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracing.request import PROFILE_MOUNT, PROFILES_SUBDIR, workload_request

    spec = WORKLOADS["resnet50"]
    monkeypatch.setitem(WORKLOADS, "resnet50", dataclasses.replace(spec, check_data=lambda p: None))
    runs = tmp_path / "runs"

    def request(**kwargs):
        return workload_request(
            "resnet50",
            "sleep",
            tmp_path,
            runs,
            settings={"batch_size": 32, "accelerators": 2},
            **kwargs,
        )

    made = request(accelerator="v100", profile_model="vgg16")
    (mount,) = [m for m in made.containers[0].mounts if m.target.startswith(PROFILE_MOUNT)]
    assert mount.source.parent == (runs / PROFILES_SUBDIR).resolve()
    assert made.config.profile == f"{PROFILE_MOUNT}/profile.json"
    written = load_profile(mount.source)
    assert written == sleep_profile_for("resnet50", "v100", 32, 2, "vgg16")
    assert written.table[0].g == 2 and written.table[0].b == 32
    # The same profile again: the same file, written once.
    again = request(accelerator="v100", profile_model="vgg16")
    assert [m.source for m in again.containers[0].mounts] == [
        m.source for m in made.containers[0].mounts
    ]
    assert len(list((runs / PROFILES_SUBDIR).iterdir())) == 1
    # No --accelerator: the workload's shipped profile, as before (no file, no mount).
    plain = request()
    assert plain.config.profile is None
    assert not [m for m in plain.containers[0].mounts if m.target.startswith(PROFILE_MOUNT)]


EXPERIMENT = """
[[datasets]]
name = "img"
generator = "images"
size = "10MB"

[grid]
workload = ["resnet50"]
variant = ["original", "sleep"]
batch_size = [16, 32]

[workloads.resnet50]
dataset = "img"
accelerator = "a100"
"""


def test_experiment_sleep_runs_take_the_accelerator(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT)
    keys = sorted(r.key for r in load_experiment(path).runs)
    assert keys == [
        "resnet50-original-b16-g1-w2-r1",
        "resnet50-original-b32-g1-w2-r1",
        "resnet50-sleep-a100-b16-g1-w2-r1",
        "resnet50-sleep-a100-b32-g1-w2-r1",
    ]
    path.write_text(EXPERIMENT + 'profile_model = "vgg16"\n')
    assert any(r.key.startswith("resnet50-sleep-a100-vgg16-") for r in load_experiment(path).runs)
    path.write_text(EXPERIMENT.replace('"a100"', '"h100"') + 'profile_model = "vgg16"\n')
    with pytest.raises(UserError, match="no vgg16 on h100"):
        load_experiment(path)
    path.write_text(EXPERIMENT.replace('accelerator = "a100"', "accelerator = 100"))
    with pytest.raises(UserError, match="must be a string"):
        load_experiment(path)


# -- measured entries (profile measure --db) ---------------------------------------------------

MEASURED_DB = """
schema_version = 1
default_order = ["measured"]

[accelerators.cpu-test]
name = "CPU: test"
names = ["CPU test"]

[sources.measured]
title = "measured"
cite = "measured in the test"
kind = "measured"
source = "made in the test"
folder = "measured"
"""


def measured_profile(workload: str = "unet3d", memory: bool = False) -> SleepProfile:
    from workloads.profile import Linear, Memory, Normal, TablePoint

    points = tuple(
        TablePoint(
            g=1,
            b=b,
            mean=0.1 * b,
            std=0.01,
            n=5,
            h2d=0.001 * b,
            forward=0.03 * b,
            backward=0.06 * b,
            optimizer=0.01 * b,
            peak_bytes=(1e9 + 1e8 * b) if memory else None,
            persistent_bytes=5e8 if memory else None,
        )
        for b in (1, 2, 4)
    )
    return SleepProfile(
        workload=workload,
        accelerator="GPU X" if memory else "CPU: test",
        source="made in the test",
        compute=Normal(mean=Linear(b=0.1)),
        table=points,
        measured={"command": "test", "device": "GPU X" if memory else "CPU: test"},
        memory=Memory(capacity_bytes=8 * GIB, persistent_bytes=5e8, peak_bytes=Linear(b=1e8))
        if memory
        else None,
    )


@pytest.fixture()
def measured_db(tmp_path: Path) -> Path:
    path = tmp_path / "db.toml"
    path.write_text(MEASURED_DB)
    return path


def test_table_points_keep_their_phases_through_json(tmp_path: Path) -> None:
    profile = measured_profile(memory=True)
    profile.save(tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again.table == profile.table
    data = json.loads((tmp_path / "p.json").read_text())
    data["table"][0]["forward"] = -1.0
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="not negative"):
        load_profile(tmp_path / "p.json")


def test_a_measured_profile_becomes_a_database_entry(measured_db: Path) -> None:
    from store.profiledb import add_measured

    written = add_measured(measured_profile(), "cpu-test", path=measured_db)
    assert written == measured_db.parent / "measured" / "cpu-test-unet3d.json"
    record = json.loads(written.read_text())["measured"]["database"]
    assert record == {"accelerator": "cpu-test", "model": "unet3d", "declared": "CPU: test"}
    db = load_database(measured_db)
    entry = db.lookup("cpu-test", "unet3d", 2)
    assert entry.method == "exact" and entry.source_id == "measured"
    assert (entry.compute_s, entry.h2d_s) == pytest.approx((0.2, 0.002))
    assert (entry.forward_s, entry.backward_s, entry.optimizer_s) == pytest.approx(
        (0.06, 0.12, 0.02)
    )
    assert not any("optimizer step not in the data" in n for n in entry.notes)
    mid = db.lookup("cpu-test", "unet3d", 3)
    assert mid.method == "interpolated" and mid.forward_s == pytest.approx(0.09)
    profile = entry.to_sleep_profile("unet3d")
    assert (profile.split.forward, profile.split.backward, profile.split.optimizer) == (
        pytest.approx(0.3),
        pytest.approx(0.6),
        pytest.approx(0.1),
    )
    assert profile.h2d.mean(1, 2) == pytest.approx(0.002)


def test_a_database_entry_is_replaced_only_when_asked(measured_db: Path) -> None:
    from store.profiledb import add_measured

    add_measured(measured_profile(), "cpu-test", path=measured_db)
    with pytest.raises(UserError, match="give --replace"):
        add_measured(measured_profile(), "cpu-test", path=measured_db)
    add_measured(measured_profile(), "cpu-test", replace=True, path=measured_db)
    for bad in ("CPU", "a b", "", "../x"):
        with pytest.raises(UserError, match="lower-case letters"):
            add_measured(measured_profile(), bad, path=measured_db)
    with pytest.raises(UserError, match="only profiles made by profile measure"):
        add_measured(
            dataclasses.replace(measured_profile(), measured=None), "cpu-test", path=measured_db
        )
    with pytest.raises(UserError, match="this host's CPU, cached per host"):
        add_measured(measured_profile(), "cpu", path=measured_db)
    assert sorted(p.name for p in (measured_db.parent / "measured").iterdir()) == [
        "cpu-test-unet3d.json"
    ]


def test_a_measured_gpu_declares_its_card_with_its_memory(measured_db: Path) -> None:
    from store.profiledb import add_measured

    add_measured(measured_profile("resnet18", memory=True), "gpu-x", path=measured_db)
    db = load_database(measured_db)
    assert db.accelerator("gpu-x").capacity_bytes == 8 * GIB
    entry = db.lookup("gpu-x", "resnet18", 4)
    assert (entry.peak_bytes, entry.persistent_bytes) == (1.4e9, 5e8)
    profile = entry.to_sleep_profile("resnet18")
    assert profile.memory is not None and profile.memory.capacity_bytes == 8 * GIB
    assert profile.memory.peak(1, 4) == pytest.approx(1.4e9)


def test_a_folder_profile_without_its_record_is_named(measured_db: Path) -> None:
    folder = measured_db.parent / "measured"
    folder.mkdir()
    measured_profile().save(folder / "stray.json")
    with pytest.raises(UserError, match="stray.json has no measured.database record"):
        load_database(measured_db)


def test_the_shipped_cpu_entries_are_measured_phase_by_phase() -> None:
    db = default_database()
    covered = set(db.models("epyc-2t"))
    assert covered >= {"unet3d", "bert", "dlrm", "resnet18", "resnet50", "alexnet"}
    for model in ("unet3d", "bert", "dlrm", "resnet18", "resnet50", "alexnet"):
        profile = load_profile(DATABASE_DIR / "measured" / f"epyc-2t-{model}.json")
        assert profile.measured["database"]["accelerator"] == "epyc-2t"
        # where they were measured: a CPU profile says so, and is foreign elsewhere
        assert profile.host is not None and profile.host["cpu_model"] == "AMD EPYC"
        assert profile.split is not None
        for point in profile.table:
            parts = point.forward + point.backward + point.optimizer
            # compute = forward + backward + optimizer + the loss read-back (small)
            assert parts <= point.mean + 1e-9 and parts >= 0.8 * point.mean
            entry = db.lookup("epyc-2t", model, point.b)
            assert entry.compute_s == point.mean and entry.h2d_s == point.h2d
            assert entry.to_sleep_profile(model).host == profile.host


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --out FILE, --db, or both"),
        (["--out", "x.json", "--accelerator", "cpu"], "add --db"),
        (["--out", "x.json", "--replace"], "add --db"),
    ],
)
def test_cli_profile_measure_says_where_the_profile_goes(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(
        cli_module.cli,
        ["profile", "measure", "--workload", "dlrm", "--data", str(tmp_path), "--batch-sizes", "2"]
        + args,
    )
    assert result.exit_code != 0 and message in result.output
