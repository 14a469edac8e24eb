"""Integration: the analysis on real traced runs (real containers, bpftrace, torch).

- similarity: a run against itself scores 1; two runs of one configuration (page cache dropped
  before each) score >= 0.9; 1 vs 4 loader workers, UNet3D vs DLRM, and the same job at twice
  the rate score clearly lower;
  the HTML report renders in headless Chromium with one plot lane per aspect;
- profiles: instrumented runs -> ``profile fit`` -> a profile file the sleep variant reads;
- export and breakdown of a real run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analysis.compare_report import REPORT_LANES, write_comparison_report
from analysis.similarity import compare_runs
from store.rundir import load_run
from tests.browser import dom, subplot_count
from tests.conftest import unet3d_cases
from tracing.host import drop_caches
from tracing.request import workload_request
from tracing.runner import trace
from workloads.profile import default_profile

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.bpftrace]


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("analysis-runs")


@pytest.fixture(scope="module")
def unet3d_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("u3d")
    return unet3d_cases(out, 24_000_000, seed=2, s1_range=(40, 64), s2_range=(48, 72))


def traced(
    runs_dir: Path,
    data: Path,
    workload: str,
    variant: str,
    profile: Path | None = None,
    **settings: object,
) -> Path:
    options = settings.pop("options", {"patch_size": 32} if workload == "unet3d" else {})
    drop_caches()
    return trace(
        workload_request(
            workload,
            variant,
            data,
            runs_dir,
            settings={"epochs": 1, "checkpoint_every": 1, **settings},
            options=options,
            profile=profile,
        )
    ).check()


@pytest.fixture(scope="module")
def sleep_runs(
    images, runs_dir: Path, unet3d_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from datagen.dlrm import generate_dlrm

    dlrm = tmp_path_factory.mktemp("dlrm")
    generate_dlrm(dlrm, 6_000_000, seed=2)
    fast = tmp_path_factory.mktemp("profiles") / "fast.json"
    default_profile("unet3d").scaled(0.5, "the same job at twice the rate").save(fast)
    return {
        "a": traced(runs_dir, unet3d_data, "unet3d", "sleep", batch_size=2, workers=2),
        "b": traced(runs_dir, unet3d_data, "unet3d", "sleep", batch_size=2, workers=2),
        "fast": traced(runs_dir, unet3d_data, "unet3d", "sleep", fast, batch_size=2, workers=2),
        "w1": traced(runs_dir, unet3d_data, "unet3d", "sleep", batch_size=2, workers=1),
        "w4": traced(runs_dir, unet3d_data, "unet3d", "sleep", batch_size=2, workers=4),
        "dlrm": traced(runs_dir, dlrm, "dlrm", "sleep", batch_size=1024, workers=2),
    }


def test_similarity_separates_configurations_on_real_traces(
    sleep_runs: dict[str, Path], tmp_path: Path
) -> None:
    runs = {name: load_run(path) for name, path in sleep_runs.items()}

    def score(x: str, y: str) -> float:
        return compare_runs(runs[x], runs[y]).overall

    assert score("a", "a") == 1.0
    same = score("a", "b")
    workers = score("w1", "w4")
    workloads = score("a", "dlrm")
    rate = compare_runs(runs["a"], runs["fast"])
    print(
        f"same configuration {same:.3f}; 1 vs 4 workers {workers:.3f}; unet3d vs dlrm "
        f"{workloads:.3f}; the same job at twice the rate {rate.overall:.3f} (read bandwidth "
        f"{rate.aspect('read_bandwidth').score:.3f})"
    )
    assert same >= 0.9
    assert workers <= same - 0.05
    assert workloads <= same - 0.2
    # The same bytes asked for twice as fast are, to the storage, another workload.
    assert rate.aspect("read_bandwidth").score < 0.9
    assert rate.overall < 0.9 and rate.overall <= same - 0.05
    assert score("b", "a") == pytest.approx(same)

    comparison = compare_runs(runs["a"], runs["dlrm"])
    report = write_comparison_report(runs["a"], runs["dlrm"], comparison, tmp_path / "compare.html")
    html = dom(report)
    assert subplot_count(html) == REPORT_LANES == len(comparison.aspects)


def test_compare_cli_json_has_overall_and_aspects(
    sleep_runs: dict[str, Path], tmp_path: Path
) -> None:
    from cli import cli

    result = CliRunner().invoke(
        cli,
        [
            "compare",
            str(sleep_runs["a"]),
            str(sleep_runs["b"]),
            "--json",
            "--out",
            str(tmp_path / "cmp"),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert 0.9 <= data["overall"] <= 1.0
    assert {"read_bandwidth", "file_order", "step_time"} <= set(data["aspects"])
    assert (tmp_path / "cmp" / "compare.html").exists() and (
        tmp_path / "cmp" / "comparison.json"
    ).exists()


def test_export_and_breakdown_of_a_real_run(sleep_runs: dict[str, Path], tmp_path: Path) -> None:
    from analysis.breakdown import accelerator_utilisation, step_table
    from analysis.export import export_perfetto

    run = load_run(sleep_runs["a"])
    trace_json = json.loads(export_perfetto(run, tmp_path / "trace.json").read_text())
    slices = [e for e in trace_json["traceEvents"] if e.get("ph") == "X"]
    reads = run.events[run.events["kind"].isin(["read", "pread64", "readv"])]
    assert len(slices) >= len(reads)
    assert any(e.get("ph") == "C" for e in trace_json["traceEvents"])
    steps = step_table(run)
    summary = json.loads((sleep_runs["a"] / "summary.json").read_text())
    assert len(steps) == summary["steps"]
    assert 0.5 < accelerator_utilisation(run) <= 1.0  # sleep steps dominate these tiny I/O loads


def test_profile_fit_from_instrumented_runs_drives_a_sleep_run(
    images, runs_dir: Path, unet3d_data: Path, tmp_path: Path
) -> None:
    from cli import cli

    instrumented = [
        traced(
            runs_dir,
            unet3d_data,
            "unet3d",
            "instrumented",
            batch_size=b,
            workers=1,
            max_steps=4,
            options={"patch_size": 32},
        )
        for b in (1, 2)
    ]
    profile_path = tmp_path / "unet3d-cpu.json"
    result = CliRunner().invoke(
        cli, ["profile", "fit", *map(str, instrumented), "--out", str(profile_path)]
    )
    assert result.exit_code == 0, result.output
    profile = json.loads(profile_path.read_text())
    assert profile["workload"] == "unet3d" and profile["schema_version"] == 1
    assert sorted((p["g"], p["b"]) for p in profile["table"]) == [(1, 1), (1, 2)]
    # The sleep variant reads the fitted profile: its emulated compute follows the table.
    result = CliRunner().invoke(
        cli,
        [
            "trace",
            "--workload",
            "unet3d",
            "--variant",
            "sleep",
            "--data",
            str(unet3d_data),
            "--batch-size",
            "2",
            "--workers",
            "1",
            "--max-steps",
            "4",
            "--set",
            "patch_size=32",
            "--profile",
            str(profile_path),
            "--out",
            str(runs_dir),
        ],
    )
    assert result.exit_code == 0, result.output
    sleep_run = load_run(Path(result.stdout.strip().splitlines()[-1]))
    busy = sleep_run.phases[sleep_run.phases["key"] == "accelerator_busy"]["duration_ns"] / 1e9
    point = next(p for p in profile["table"] if p["b"] == 2)
    assert len(busy) == 4
    assert abs(busy.median() - point["mean"]) <= 3 * point["std"] + 0.02
    # The fit carries the instrumented steps' split, and the emulated steps log those phases.
    split = profile["split"]
    assert split["forward"] > 0 and split["backward"] > 0
    assert abs(sum(split.values()) - 1) < 1e-9
    keys = sleep_run.phases["key"].astype(str)
    for key in ("model_forward_pass", "model_backward_pass", "model_optim_step"):
        assert (keys == key).sum() == 4, key


def test_the_report_of_a_real_run_agrees_with_its_trace_and_renders(
    sleep_runs: dict[str, Path], unet3d_data: Path
) -> None:
    """The run report of a real traced run (4 loader workers): every dataset file is in its
    file table, read under the /data mount; the heat map holds every byte the summary counts
    for read and write calls; the layered table's system calls are the dataset's reads; the
    four workers are compared with each other; the page renders every section in Chromium."""
    from analysis import io_profile as iop
    from analysis import run_report as rr
    from store.rundir import READ_KINDS, WRITE_KINDS

    run = load_run(sleep_runs["w4"])
    files = iop.file_table(run)
    on_disk = {p.name: p.stat().st_size for p in unet3d_data.glob("case_*.npy")}
    data = files[files["path"].str.startswith("/data/")]
    read = data[data["path"].str.endswith(".npy")]  # the cases (the dataset's manifest aside)
    assert {p.removeprefix("/data/") for p in read["path"]} == set(on_disk)
    assert len(on_disk) >= 8
    assert (read["read_bytes"] >= read["path"].map(lambda p: on_disk[p[6:]])).all()
    mounts = iop.volume_by_mount(run, files).set_index("mount")
    assert mounts.loc["/data", "read_bytes"] == data["read_bytes"].sum()
    summary = json.loads((sleep_runs["w4"] / "summary.json").read_text())["syscalls"]
    moved = sum(v["bytes"] for k, v in summary.items() if k in (*READ_KINDS, *WRITE_KINDS))
    assert iop.heat_map(run).cells.sum() == pytest.approx(moved)
    layers = rr.layers(run).set_index("layer")
    assert layers.loc["system calls", "bytes"] == data["read_bytes"].sum()
    assert layers.loc["step", "overlap"] == pytest.approx(1.0)
    workers = iop.imbalance(run)
    assert (workers["group"] == "loader workers of main").sum() == 4
    page = rr.write_report(run)
    text = dom(page)
    assert 'data-rendered-ms="' in text
    for name, _ in rr.SECTIONS:
        assert f'data-section="{name}"' in text
