"""Experiment grids: parsing and validation (unit), and a real resumable run with a failure
(integration: real containers and bpftrace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import UserError
from experiments.orchestrate import load_experiment, run_experiment

REPO = Path(__file__).resolve().parent.parent

TINY = """
[experiment]
name = "tiny"

[[datasets]]
name = "u"
generator = "unet3d"
size = "12MB"
scale = 0.25

[grid]
workload = ["unet3d"]
variant = ["sleep"]
batch_size = [2]
workers = [1]
memory_limit = ["", "6m"]

[settings]
epochs = 1
checkpoint_every = 0

[workloads.unet3d]
dataset = "u"
options = {patch_size = 32}

[produce]
timelines = true
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def test_shipped_experiments_parse_and_expand() -> None:
    timelines = load_experiment(REPO / "experiments" / "timelines.toml")
    assert len(timelines.runs) == 9
    assert {r.variant for r in timelines.runs} == {"original", "instrumented", "sleep"}
    assert {r.batch_size for r in timelines.runs if r.workload == "dlrm"} == {2048}  # its default
    grid = load_experiment(REPO / "experiments" / "instrumentation.toml")
    assert len(grid.runs) == 3 * 2 + 3 * 2 + 3 * 2
    assert {r.batch_size for r in grid.runs if r.workload == "dlrm"} == {1024, 2048, 4096}
    assert len({r.key for r in grid.runs}) == len(grid.runs)
    study = load_experiment(REPO / "experiments" / "dlio-study.toml")
    assert {r.variant for r in study.runs} == {"instrumented", "original", "sleep", "dlio"}
    # the sleep and DLIO runs emulate this host's CPU as fitted to the instrumented run
    emulated = {r.variant: r.emulated for r in study.runs}
    assert emulated == {"instrumented": "", "original": "", "sleep": "fitted", "dlio": "fitted"}
    assert study.settings["cold_cache"] is True


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('workload = ["unet3d"]', 'workload = ["unet4d"]'), "unknown workload 'unet4d'"),
        (('variant = ["sleep"]', 'variant = ["fast"]'), "unknown variant 'fast'"),
        (("epochs = 1", "epoch = 1"), "unknown key 'epoch'"),
        (('dataset = "u"', 'dataset = "nope"'), "has no dataset"),
        (("patch_size = 32", "patch = 32"), "unknown setting 'patch'"),
        (("workers = [1]", "workers = [1, 1]"), "same run twice"),
        (('memory_limit = ["", "6m"]', 'memory_limit = ["lots"]'), "lots"),
        (("epochs = 1", 'epochs = 1\ncold_cache = "yes"'), "cold_cache of unet3d must be true"),
        (("epochs = 1", 'epochs = 1\nprofile = "fitted"'), 'profile of unet3d must be "fit"'),
        (
            ("epochs = 1", 'epochs = 1\nprofile = "fit"'),
            "fitted .* to the instrumented run of its configuration, "
            "unet3d-instrumented-b2-g1-w1-r1: list instrumented before sleep",
        ),
        (
            ("epochs = 1", 'epochs = 1\nprofile = "fit"\naccelerator = "v100"'),
            "accelerator/profile_model both choose",
        ),
        (("epochs = 1", 'epochs = 1\naccelerator = "cpu"\nprofile_model = "vgg16"'), "own model"),
    ],
)
def test_bad_experiment_files_fail_with_one_clear_line(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    old, new = edit
    assert old in TINY
    with pytest.raises(UserError, match=message):
        load_experiment(write(tmp_path, TINY.replace(old, new)))


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_experiment(tmp_path / "none.toml")
    with pytest.raises(UserError, match="not valid TOML"):
        load_experiment(write(tmp_path, "[grid\n"))


@pytest.mark.integration
@pytest.mark.docker
@pytest.mark.bpftrace
def test_experiment_records_failures_continues_and_resumes(images, tmp_path: Path) -> None:
    experiment = load_experiment(write(tmp_path, TINY))
    lines: list[str] = []
    out = tmp_path / "out"
    outcomes = run_experiment(experiment, out, log=lines.append)
    by_key = {o.key: o for o in outcomes}
    ok = by_key["unet3d-sleep-b2-g1-w1-r1"]
    starved = by_key["unet3d-sleep-b2-g1-w1-mem6m-r1"]
    assert ok.status == "completed" and starved.status == "failed" and starved.error
    assert any(line.startswith("[1/2]") for line in lines) and any(
        line.startswith("[2/2]") for line in lines
    )
    state = json.loads((out / "tiny" / "state.json").read_text())
    assert state["runs"][starved.key]["status"] == "failed"
    assert json.loads((Path(starved.run_dir) / "manifest.json").read_text())["status"] == "failed"
    assert list((out / "tiny" / "timelines").glob("*.html"))
    # Second invocation: the completed run is skipped, the failed one is tried again.
    again = {o.key: o for o in run_experiment(experiment, out, log=lines.append)}
    assert again[ok.key].status == "skipped" and again[ok.key].run_dir == ok.run_dir
    assert again[starved.key].status == "failed"


@pytest.mark.integration
@pytest.mark.docker
@pytest.mark.bpftrace
def test_a_fitted_sleep_run_emulates_the_instrumented_run_of_its_configuration(
    images, tmp_path: Path
) -> None:
    """profile = "fit": the sleep run's profile is fitted, on this host, to the instrumented
    run made before it, and says so (its source, its host record)."""
    text = TINY.replace('variant = ["sleep"]', 'variant = ["instrumented", "sleep"]')
    text = text.replace('memory_limit = ["", "6m"]', 'memory_limit = [""]')
    text = text.replace("epochs = 1", 'epochs = 1\nprofile = "fit"\nmax_steps = 4')
    experiment = load_experiment(write(tmp_path, text))
    assert [r.key for r in experiment.runs] == [
        "unet3d-instrumented-b2-g1-w1-r1",
        "unet3d-sleep-fitted-b2-g1-w1-r1",
    ]
    lines: list[str] = []
    outcomes = run_experiment(experiment, tmp_path / "out", log=lines.append)
    assert [o.status for o in outcomes] == ["completed", "completed"]
    instrumented, emulated = (Path(o.run_dir) for o in outcomes)
    fitted = tmp_path / "out" / "tiny" / "profiles" / f"{instrumented.name}.json"
    profile = json.loads(fitted.read_text())
    assert instrumented.name in profile["source"] and profile["host"]["accelerator"] == "cpu"
    mounted = json.loads((emulated / "manifest.json").read_text())["containers"][0]["mounts"]
    assert any(Path(m["source"]) == fitted.resolve() for m in mounted)
    assert any(line.startswith("fitted to unet3d-instrumented") for line in lines)


def test_the_scores_table_has_a_row_per_comparison_and_a_column_per_aspect() -> None:
    from experiments.orchestrate import scores_table

    scores = {
        "unet3d-2": {"overall": 0.9, "aspects": {"cpu": {"score": 0.8}, "memory": {"score": None}}},
        "unet3d-2-original-vs-dlio": {
            "pair": ["original", "dlio"],
            "overall": 0.7,
            "aspects": {"cpu": {"score": 0.5}, "file_order": {"score": 0.25}},
        },
    }
    lines = scores_table(scores).splitlines()
    assert (
        lines[0] == "| comparison | reference vs emulation | overall | cpu | memory | file_order |"
    )
    assert lines[2] == "| unet3d-2 | original vs sleep | 0.900 | 0.800 | - | - |"
    assert (
        lines[3] == "| unet3d-2-original-vs-dlio | original vs dlio | 0.700 | 0.500 | - | 0.250 |"
    )
