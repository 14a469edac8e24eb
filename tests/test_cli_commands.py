"""The analysis commands end to end through click's CliRunner, on synthetic run directories
(tests/synthetic.py): what they print, the files they write (which must exist and parse) and
their exit codes; and the one-line errors of ``runs`` and ``show`` on damaged run files.

The synthetic runs follow the training loop's pattern with round numbers, so the expected values
are known: per step ``load_batch_mem`` 0.2 s then ``all_compute`` 0.3 s, the next step starting
at this one's ``step_end`` (a 0.5 s step, AU 0.6); per step one dataset file opened, read in two
64 KiB reads and closed, with one 128 KiB block read; samples every 0.1 s.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import cli as cli_module
from analysis.figures import PLOTLY_JS
from store.rundir import EVENTS_COLUMNS, PHASES_COLUMNS, SAMPLES_COLUMNS, SCHEMA_VERSION
from tests import synthetic
from tests.synthetic import START_NS

REPO = Path(__file__).resolve().parent.parent
LOAD_S, COMPUTE_S, STEPS, EPOCHS = 0.2, 0.3, 5, 2
READ = 64 * 2**10

ORIGINAL = "20261121-163005-unet3d-instrumented-0a01"
BATCH4 = "20261121-163105-unet3d-instrumented-0a02"
SLEEP = "20261121-163205-unet3d-sleep-0a03"


def training_run(root: Path, run_id: str, batch: int = 2) -> Path:
    """A 10 s run of EPOCHS epochs of STEPS steps on one rank (see the module doc)."""
    phases: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    t = 1.0
    for epoch in range(1, EPOCHS + 1):
        phases.append({"key": "epoch", "t0": t, "t1": t + STEPS * 0.5, "epoch": epoch, "rank": 0})
        for step in range(STEPS):
            key = {"epoch": epoch, "step": step, "rank": 0}
            phases.append({"key": "load_batch_mem", "t0": t, "t1": t + LOAD_S, **key})
            phases.append(
                {"key": "all_compute", "t0": t + LOAD_S, "t1": t + LOAD_S + COMPUTE_S, **key}
            )
            phases.append({"key": "step_end", "t0": t + 0.5, "value": batch, **key})
            path = f"/data/case_{(epoch - 1) * STEPS + step:05d}_x.npy"
            events += [
                {"t": t + 0.01, "kind": "openat", "path": path, "fd": 5, "ret": 5},
                {"t": t + 0.02, "path": path, "fd": 5, "bytes": READ},
                {"t": t + 0.03, "path": path, "fd": 5, "bytes": READ},
                {"t": t + 0.04, "kind": "close", "path": path, "fd": 5},
                {"t": t + 0.025, "kind": "block_read", "pid": 0, "tid": -1, "fd": -1,
                 "bytes": 2 * READ, "offset": 4096, "dev": "254:0"},
            ]  # fmt: skip
            t += 0.5
    samples = []
    for i in range(100):
        samples += [
            (i / 10, "container_cpu", 100.0, "percent"),
            (i / 10, "container_mem_rss", 2.0e8, "bytes"),
            (i / 10, "container_mem_cache", 1.0e8, "bytes"),
        ]
    workload, variant = run_id.split("-")[2:4]
    return synthetic.make_run(
        root,
        run_id,
        events=synthetic.events_frame(events),
        samples=synthetic.samples_frame(samples),
        phases=synthetic.phases_frame(phases),
        config={"workload": workload, "variant": variant, "batch_size": batch, "accelerators": 1},
        trace={"enabled": True, "sample_interval_s": 0.1, "timeout_s": None, "network": "none"},
        mounts=[{"source": "/srv/data", "target": "/data", "read_only": True}],
    )


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A runs directory holding ORIGINAL, BATCH4 (batch 4) and SLEEP (same tables as ORIGINAL)."""
    root = tmp_path / "runs"
    training_run(root, ORIGINAL)
    training_run(root, BATCH4, batch=4)
    training_run(root, SLEEP)
    return root


def invoke(*args: str | Path) -> Result:
    result = CliRunner().invoke(cli_module.cli, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def ok(*args: str | Path) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert result.exception is None, result.exception
    return result


def plotly_figures(text: str) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """(traces, layout) of every ``Plotly.newPlot(id, data, layout, config)`` call in a page."""
    decoder = json.JSONDecoder()
    figures = []
    at = text.find("Plotly.newPlot(")
    while at >= 0:
        pos = at + len("Plotly.newPlot(")
        values = []
        for _ in range(3):  # the div id, the traces, the layout
            while text[pos] in " \n\t,":
                pos += 1
            value, pos = decoder.raw_decode(text, pos)
            values.append(value)
        figures.append((values[1], values[2]))
        at = text.find("Plotly.newPlot(", pos)
    return figures


def assert_self_contained_html(path: Path, *mentions: str) -> list[dict[str, Any]]:
    """The page is whole, loads the shared plotly.js beside it (opens offline, nothing from a
    network) and has one figure with traces; return the traces."""
    text = path.read_text(encoding="utf-8")
    assert text.lstrip().lower().startswith("<!doctype html>")
    assert text.rstrip().endswith("</html>")
    assert '<script src="http' not in text  # no CDN
    (src,) = re.findall(r'<script[^>]*\bsrc="([^"]+)"', text)
    assert Path(src).name == PLOTLY_JS and (path.parent / src).is_file()
    ((traces, layout),) = plotly_figures(text)
    assert traces and isinstance(layout, dict)
    for mention in mentions:
        assert mention in text, mention
    return traces


# ---------------------------------------------------------------------------------------------
# plot timeline, plot breakdown


def test_plot_timeline_writes_one_html_file_for_stacked_runs(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "plots" / "both.html"
    result = ok("plot", "timeline", ORIGINAL, SLEEP, "--runs-root", runs, "--out", out)
    assert result.stdout.strip() == str(out)
    both = assert_self_contained_html(out)
    # Without --out: timeline.html in the first run's directory; a run given by its path.
    result = ok("plot", "timeline", runs / BATCH4)
    default = runs / BATCH4 / "timeline.html"
    assert result.stdout.strip() == str(default)
    one = assert_self_contained_html(default)
    # Stacked: each run's panels, headed by its run id, in the order given.
    assert len(both) == 2 * len(one)
    assert [t["name"] for t in both] == 2 * [t["name"] for t in one]
    assert {"read", "block read", "container (% of one core)"} <= {t["name"] for t in one}
    (_, layout), *_ = plotly_figures(out.read_text(encoding="utf-8"))
    headings = [a["text"] for a in layout["annotations"] if a["text"].startswith("<b>")]
    assert [h.split("</b>")[0].removeprefix("<b>") for h in headings] == [ORIGINAL, SLEEP]


def test_plot_breakdown_json_has_the_known_step_times(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "breakdown.html"
    result = ok("plot", "breakdown", ORIGINAL, BATCH4, "--runs-root", runs, "--out", out, "--json")
    rows = json.loads(result.stdout)
    assert {r["run"] for r in rows} == {ORIGINAL, BATCH4}
    value = {(r["run"], r["metric"]): r for r in rows}
    for run, batch in ((ORIGINAL, 2), (BATCH4, 4)):
        assert {r["batch_size"] for r in rows if r["run"] == run} == {batch}
        # The first step of each epoch is excluded: (STEPS - 1) measured steps per epoch.
        assert value[run, "step_time"]["n"] == EPOCHS * (STEPS - 1)
        assert value[run, "step_time"]["median"] == pytest.approx(LOAD_S + COMPUTE_S)
        assert value[run, "load_time"]["median"] == pytest.approx(LOAD_S)
        assert value[run, "compute_time"]["median"] == pytest.approx(COMPUTE_S)
        assert value[run, "compute_throughput"]["median"] == pytest.approx(batch / COMPUTE_S)
        assert value[run, "accelerator_utilisation"]["median"] == pytest.approx(
            COMPUTE_S / (LOAD_S + COMPUTE_S)
        )
    assert_self_contained_html(out)
    # Without --json it prints the path of the HTML file (default: in the first run).
    result = ok("plot", "breakdown", runs / ORIGINAL)
    assert result.stdout.strip() == str(runs / ORIGINAL / "breakdown.html")
    assert (runs / ORIGINAL / "breakdown.html").is_file()


def test_plot_breakdown_of_a_run_without_steps_is_one_line(tmp_path: Path) -> None:
    bare = synthetic.make_run(tmp_path, "20261121-163005-unet3d-original-0b01")
    result = invoke("plot", "breakdown", bare)
    assert result.exit_code == 1
    assert "no per-step durations" in result.output and len(result.output.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# export


def test_export_perfetto_json(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    result = ok("export", ORIGINAL, "--runs-root", runs, "--format", "perfetto", "--out", out)
    assert result.stdout.strip() == str(out)
    trace = json.loads(out.read_text())
    assert trace["metadata"]["run_id"] == ORIGINAL
    assert trace["metadata"]["start_ns"] == START_NS
    counts = trace["metadata"]["events"]
    n_steps = EPOCHS * STEPS
    assert counts["syscall"] == 4 * n_steps  # openat, 2 reads, close per step
    assert counts["block"] == n_steps
    assert counts["counter"] == 3 * 100
    names = [e.get("name") for e in trace["traceEvents"]]
    assert names.count("all_compute") == n_steps
    # Default: trace.json in the run directory.
    result = ok("export", runs / SLEEP)
    assert result.stdout.strip() == str(runs / SLEEP / "trace.json")
    assert json.loads((runs / SLEEP / "trace.json").read_text())["metadata"]["run_id"] == SLEEP


def test_export_csv(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "csv"
    result = ok("export", ORIGINAL, "--runs-root", runs, "--format", "csv", "--out", out)
    written = [Path(line) for line in result.stdout.splitlines()]
    assert [p.name for p in written] == ["events.csv", "samples.csv", "phases.csv"]
    assert all(p.parent == out for p in written)

    def read(name: str) -> list[dict[str, str]]:
        with open(out / name, newline="") as fh:
            return list(csv.DictReader(fh))

    events, samples, phases = read("events.csv"), read("samples.csv"), read("phases.csv")
    n_steps = EPOCHS * STEPS
    assert list(events[0]) == list(EVENTS_COLUMNS)
    assert list(samples[0]) == list(SAMPLES_COLUMNS)
    assert list(phases[0]) == list(PHASES_COLUMNS)
    assert len(events) == 5 * n_steps and len(samples) == 300
    reads = [e for e in events if e["kind"] == "read"]
    assert len(reads) == 2 * n_steps and {int(e["bytes"]) for e in reads} == {READ}
    assert [e["path"] for e in reads[:2]] == ["/data/case_00000_x.npy"] * 2
    assert sum(1 for p in phases if p["key"] == "step_end") == n_steps


# ---------------------------------------------------------------------------------------------
# compare


def test_compare_json_of_identical_runs_scores_one(runs: Path) -> None:
    result = ok("compare", ORIGINAL, SLEEP, "--runs-root", runs, "--json")
    data = json.loads(result.stdout)
    assert data["real"] == ORIGINAL and data["emulated"] == SLEEP
    assert data["overall"] == pytest.approx(1.0, abs=1e-9)
    assert isinstance(data["warnings"], list) and data["aspects"]
    for name, aspect in data["aspects"].items():
        assert set(aspect) >= {"score", "measure", "resource", "weight", "skipped", "details"}
        if aspect["skipped"] is None:
            assert aspect["score"] == pytest.approx(1.0, abs=1e-9), name
    # The report and the JSON go to the emulated run's directory, named after the real run.
    saved = json.loads((runs / SLEEP / f"comparison-{ORIGINAL}.json").read_text())
    assert saved["schema_version"] == SCHEMA_VERSION
    assert saved["overall"] == pytest.approx(data["overall"])
    assert_self_contained_html(runs / SLEEP / f"compare-{ORIGINAL}.html")


def test_compare_with_out_dir(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = ok("compare", runs / ORIGINAL, runs / BATCH4, "--out", out)
    saved = json.loads((out / "comparison.json").read_text())
    assert saved["real"] == ORIGINAL and saved["emulated"] == BATCH4
    # The table, then the overall score of the saved comparison on the last line.
    assert result.stdout.splitlines()[-1] == f"overall {saved['overall']:.3f}"
    assert "read bandwidth" in result.stdout
    assert str(out / "compare.html") in result.stderr.replace("\n", "")
    assert_self_contained_html(out / "compare.html", ORIGINAL, BATCH4)


# ---------------------------------------------------------------------------------------------
# experiment run --dry-run


def test_experiment_dry_run_lists_the_grid_and_runs_nothing(tmp_path: Path) -> None:
    out = tmp_path / "experiments"
    result = ok(
        "experiment", "run", REPO / "experiments" / "timelines.toml", "--out", out, "--dry-run"
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 9  # 3 workloads x 3 variants
    assert lines[0] == "[1/9] unet3d-original-b2-g1-w2-r1"  # unet3d's default batch size
    assert all(line.startswith(f"[{i}/9] ") for i, line in enumerate(lines, 1))
    keys = {line.split(" ", 1)[1] for line in lines}
    assert {k.split("-")[0] for k in keys} == {"unet3d", "bert", "dlrm"}
    assert {k.split("-")[1] for k in keys} == {"original", "instrumented", "sleep"}
    assert not out.exists()  # no dataset generated, no run directory, no state file


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "experiments").glob("*.toml")))
def test_every_shipped_experiment_dry_runs(name: str, tmp_path: Path) -> None:
    result = ok("experiment", "run", REPO / "experiments" / name, "--out", tmp_path, "--dry-run")
    assert result.stdout.splitlines() and not any(tmp_path.iterdir())


def test_experiment_with_a_bad_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[grid\n")
    result = invoke("experiment", "run", path, "--dry-run")
    assert result.exit_code == 1
    assert "not valid TOML" in result.output and str(path) in result.output
    assert len(result.output.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# runs and show on damaged files


def _summary(run_id: str) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "duration_s": 10.0,
        "steps": 10,
        "lost_events": 0,
        "syscalls": {"read": {"count": 20, "bytes": 20 * READ}},
        "block": {"block_read": {"count": 10, "bytes": 10 * 2 * READ}},
        "page_cache": {},
    }


def _truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])  # cut short, as by a full disk or a crash


def test_runs_and_show_of_healthy_runs(runs: Path) -> None:
    (runs / ORIGINAL / "summary.json").write_text(json.dumps(_summary(ORIGINAL)))
    rows = json.loads(ok("runs", "--out", runs, "--json").stdout)
    assert [r["run_id"] for r in rows] == [ORIGINAL, BATCH4, SLEEP]
    first = rows[0]
    assert first["status"] == "completed" and first["steps"] == 10 and first["events"] == 30
    shown = json.loads(ok("show", ORIGINAL, "--out", runs, "--json").stdout)
    assert shown["steps"] == 10 and shown["status"] == "completed"
    text = ok("show", ORIGINAL, "--out", runs).output
    assert f"run {ORIGINAL}: completed" in text and "10 steps" in text


@pytest.mark.parametrize("damaged", ["manifest.json", "summary.json"])
@pytest.mark.parametrize(
    "command",
    [["runs"], ["runs", "--json"], ["show", ORIGINAL], ["show", ORIGINAL, "--json"]],
)
def test_a_truncated_run_file_is_one_line_naming_it(
    runs: Path, damaged: str, command: list[str]
) -> None:
    (runs / ORIGINAL / "summary.json").write_text(json.dumps(_summary(ORIGINAL), indent=2))
    _truncate(runs / ORIGINAL / damaged)
    result = invoke(*command, "--out", runs)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert str(runs / ORIGINAL / damaged) in errors[0]
    assert "damaged" in errors[0] or "not valid JSON" in errors[0]
    if command[0] == "runs" and "--json" in command:
        # The listing still lists every run, the damaged one flagged.
        rows = {r["run_id"]: r for r in json.loads(result.stdout)}
        assert set(rows) == {ORIGINAL, BATCH4, SLEEP}
        assert rows[ORIGINAL]["status"] == "damaged"
        assert rows[BATCH4]["status"] == "completed"
