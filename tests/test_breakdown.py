"""Tests for analysis.breakdown: step tables, per-run breakdowns, AU and the breakdown figure.

Synthetic runs follow the training loop's event pattern (workloads/training.py): per step and
rank ``load_batch_mem`` [t, t+L], ``all_compute`` [t+L, t+L+C], ``step_end`` at t+L+C+gap (the
loop's logging), and the next step starts at that ``step_end``. With chosen L, C and gap every
expected number below is computed by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.breakdown import (
    METRICS,
    STEP_COLUMNS,
    TABLE_COLUMNS,
    accelerator_utilisation,
    breakdown_figure,
    breakdown_table,
    step_table,
    write_breakdown,
)
from analysis.figures import PLOTLY_JS
from core.errors import UserError
from store.rundir import (
    load_run,
)
from tests import synthetic
from tests.browser import dom, render, subplot_count
from tests.synthetic import SEC, START_NS, TWO, TWO_ROLES, TWO_STEPS, events_frame, phases_frame

COMPUTE_S = 0.3
GAP_S = 0.01  # logging between the end of all_compute and step_end
LOADS_S = (0.5, 0.1, 0.2, 0.3, 0.4)  # per step; step 0 (the slow first batch) is excluded
BATCH = 4
READ_BYTES = 4_000  # one dataset read per measured step: 1 000 bytes per sample
READ_LATENCY_S = 0.01


# ---------------------------------------------------------------------------------------------
# Helpers (run directories from tests/synthetic.py)


def make_run(
    root: Path,
    run_id: str,
    phases: pd.DataFrame,
    events: pd.DataFrame | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    """A 100 s run with the dataset at /data, batch ``BATCH`` on one accelerator."""
    workload, variant = run_id.split("-")[2:4]
    base = {"workload": workload, "variant": variant, "batch_size": BATCH, "accelerators": 1}
    return synthetic.make_run(
        root,
        run_id,
        events=events,
        phases=phases,
        config=base | (config or {}),
        mounts=[
            {"source": "/srv/data", "target": "/data", "read_only": True},
            {"source": "/srv/out", "target": "/twintrace/out", "read_only": False},
        ],
        end_ns=START_NS + 100 * SEC,
    )


def training(
    epochs: int = 2,
    ranks: int = 1,
    loads: tuple[float, ...] = LOADS_S,
    compute_s: float = COMPUTE_S,
    sleep: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(phase rows, event rows) of ``epochs`` epochs of ``len(loads)`` steps on ``ranks`` ranks.

    ``sleep``: compute logged as load_batch_gpu (0.05 s) + accelerator_busy, no all_compute.
    Each measured step has one dataset read (and one library read, which must not count) and
    one sample_load; every epoch ends with an eval sample_load (outside the steps).
    """
    phases: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for rank in range(ranks):
        t = 1.0 + 0.05 * rank  # ranks are not in lockstep
        for epoch in range(1, epochs + 1):
            phases.append({"key": "epoch", "t0": t - 0.01, "t1": t + 10, "epoch": epoch, "rank": rank})  # fmt: skip
            for step, load in enumerate(loads):
                key = {"epoch": epoch, "step": step, "rank": rank}
                compute_end = t + load + compute_s
                phases.append({"key": "load_batch_mem", "t0": t, "t1": t + load, **key})
                if sleep:
                    gpu_end = t + load + 0.05
                    phases.append({"key": "load_batch_gpu", "t0": t + load, "t1": gpu_end, **key})
                    phases.append({"key": "accelerator_busy", "t0": gpu_end, "t1": compute_end, **key})  # fmt: skip
                else:
                    phases.append({"key": "all_compute", "t0": t + load, "t1": compute_end, **key})
                step_end = compute_end + GAP_S
                phases.append({"key": "step_end", "t0": step_end, "value": BATCH, **key})
                loader = {"epoch": epoch, "rank": rank, "pid": 20 + rank}
                phases.append({"key": "sample_load", "t0": t + 0.01, "t1": t + 0.03, **loader})
                events.append({"t": t + 0.02, "path": "/data/case_0.npy", "bytes": READ_BYTES,
                               "latency_ns": round(READ_LATENCY_S * SEC)})  # fmt: skip
                events.append({"t": t + 0.02, "path": "/usr/lib/x.so", "bytes": 10**6})
                t = step_end
            phases.append({"key": "sample_load", "t0": t + 1, "t1": t + 1.5, "epoch": epoch, "rank": rank, "pid": 30})  # fmt: skip
            t += 2.0
    return phases, events


def run_dir_of(
    tmp_path: Path, run_id: str = "20261121-163005-unet3d-instrumented-0001", **kwargs: Any
) -> Path:
    config = kwargs.pop("config", None)
    phases, events = training(**kwargs)
    return make_run(tmp_path, run_id, phases_frame(phases), events_frame(events), config)


# ---------------------------------------------------------------------------------------------
# Step table and AU


def test_step_table_known_times(tmp_path: Path) -> None:
    steps = step_table(load_run(run_dir_of(tmp_path)))
    assert list(steps.columns) == list(STEP_COLUMNS)
    assert len(steps) == 10  # 2 epochs x 5 steps
    assert steps["first_in_epoch"].tolist() == [True, False, False, False, False] * 2
    first = steps.iloc[0]
    # The first step has no previous step_end: load_batch_mem start to all_compute end.
    assert first["step_s"] == pytest.approx(LOADS_S[0] + COMPUTE_S)
    # Later steps tile the epoch: step_end to step_end, the logging gap included.
    np.testing.assert_allclose(
        steps["step_s"].iloc[1:5], np.array(LOADS_S[1:]) + COMPUTE_S + GAP_S, rtol=1e-9
    )
    np.testing.assert_allclose(steps["load_s"].iloc[:5], LOADS_S, rtol=1e-9)
    np.testing.assert_allclose(steps["compute_s"], COMPUTE_S, rtol=1e-9)
    assert steps["samples"].tolist() == [BATCH] * 10
    assert (steps["end_ns"].iloc[:-1].to_numpy() <= steps["start_ns"].iloc[1:].to_numpy()).all()


def test_accelerator_utilisation_excludes_first_steps(tmp_path: Path) -> None:
    run = load_run(run_dir_of(tmp_path))
    # Per epoch: 4 measured steps, compute 4 x 0.3 over (0.1+0.2+0.3+0.4) + 4 x (0.3 + 0.01).
    expected = 4 * COMPUTE_S / (sum(LOADS_S[1:]) + 4 * (COMPUTE_S + GAP_S))
    assert accelerator_utilisation(run) == pytest.approx(expected)
    assert expected == pytest.approx(0.5357142857)
    # Including the slow first steps would have given a different (lower) number.
    steps = step_table(run)
    assert steps["compute_s"].sum() / steps["step_s"].sum() < expected - 0.02


def test_sleep_runs_without_all_compute_count_busy_and_gpu(tmp_path: Path) -> None:
    run = load_run(run_dir_of(tmp_path, "20261121-163005-unet3d-sleep-0002", sleep=True))
    steps = step_table(run)
    # load_batch_gpu (0.05 s) + accelerator_busy (0.25 s): the same 0.3 s of compute.
    np.testing.assert_allclose(steps["compute_s"], COMPUTE_S, rtol=1e-9)
    assert accelerator_utilisation(run) == pytest.approx(0.5357142857)


def test_two_ranks_pool_their_steps(tmp_path: Path) -> None:
    run = load_run(run_dir_of(tmp_path, ranks=2, config={"accelerators": 2}))
    steps = step_table(run)
    assert len(steps) == 20 and steps["first_in_epoch"].sum() == 4  # per (rank, epoch)
    assert accelerator_utilisation(run) == pytest.approx(0.5357142857)
    rows = breakdown_table([run]).set_index("metric")
    assert rows.loc["load_time", "n"] == 16 and (rows["accelerators"] == 2).all()
    # Both ranks' reads, counted once each, in the slices of rank 0's steps.
    read = rows.loc["read_throughput"]
    assert (read["n"], read["median"], read["q1"]) == pytest.approx((8, 400, 400))


def test_missing_step_end_falls_back_to_the_durations(tmp_path: Path) -> None:
    phases, events = training(epochs=1)
    dropped = [p for p in phases if not (p["key"] == "step_end" and p["step"] == 2)]
    run = load_run(make_run(tmp_path, "20261121-1-unet3d-instrumented-3", phases_frame(dropped)))
    steps = step_table(run).set_index("step")
    # Step 2 (no step_end) and step 3 (no previous step_end): load start to compute end.
    assert steps.loc[2, "step_s"] == pytest.approx(LOADS_S[2] + COMPUTE_S)
    assert steps.loc[3, "step_s"] == pytest.approx(LOADS_S[3] + COMPUTE_S)
    assert steps.loc[4, "step_s"] == pytest.approx(LOADS_S[4] + COMPUTE_S + GAP_S)
    assert steps.loc[2, "samples"] == BATCH  # the configured batch size


def test_original_variant_is_a_user_error(tmp_path: Path) -> None:
    phases, _ = training(epochs=1)
    only_points = [p for p in phases if p["key"] in ("epoch", "step_end")]
    run = load_run(make_run(tmp_path, "20261121-1-unet3d-original-4", phases_frame(only_points)))
    with pytest.raises(UserError, match="no per-step durations.*instrumented or sleep variant"):
        step_table(run)
    with pytest.raises(UserError, match="original variant"):
        breakdown_table([run])


# ---------------------------------------------------------------------------------------------
# Table


def test_breakdown_table_known_medians(tmp_path: Path) -> None:
    table = breakdown_table([load_run(run_dir_of(tmp_path))])
    assert list(table.columns) == list(TABLE_COLUMNS)
    assert set(table["metric"]) <= set(METRICS)
    rows = table.set_index("metric")
    assert (rows["accelerators"] == 1).all() and (rows["batch_size"] == BATCH).all()
    # 8 measured steps: loads 0.1 0.2 0.3 0.4 twice.
    load = rows.loc["load_time"]
    assert (load["n"], load["median"], load["q1"], load["q3"]) == pytest.approx(
        (8, 0.25, 0.175, 0.325)
    )
    assert rows.loc["step_time", "median"] == pytest.approx(0.25 + COMPUTE_S + GAP_S)
    assert rows.loc["compute_time", "median"] == pytest.approx(COMPUTE_S)
    assert rows.loc["compute_throughput", "median"] == pytest.approx(BATCH / COMPUTE_S)
    # samples / load time: 40, 20, 13.3, 10 -> median (20 + 13.3) / 2.
    assert rows.loc["load_throughput", "median"] == pytest.approx((BATCH / 0.2 + BATCH / 0.3) / 2)
    # 4 000 dataset bytes per step = 4 samples, read in 10 ms: 400 samples/s. The 1 MB library
    # reads are not the dataset's and do not count.
    assert rows.loc["read_throughput", "median"] == pytest.approx(BATCH / READ_LATENCY_S)
    # sample_load: 20 ms in the measured steps; first-step and eval loads are left out.
    loads = rows.loc["sample_load"]
    assert (loads["n"], loads["median"]) == pytest.approx((8, 0.02))
    au = rows.loc["accelerator_utilisation"]
    assert (au["n"], au["median"], au["unit"]) == (1, pytest.approx(0.5357142857), "fraction")


def test_breakdown_table_one_block_per_run(tmp_path: Path) -> None:
    runs = [
        load_run(run_dir_of(tmp_path, "20261121-1-unet3d-instrumented-a")),
        load_run(run_dir_of(tmp_path, "20261121-2-unet3d-sleep-b", sleep=True,
                            config={"batch_size": 8}, loads=(0.5, 0.2, 0.2))),
    ]  # fmt: skip
    table = breakdown_table(runs)
    assert table["run"].unique().tolist() == [r.run_id for r in runs]
    second = table[table["run"] == runs[1].run_id].set_index("metric")
    assert (second["batch_size"] == 8).all() and (second["variant"] == "sleep").all()
    assert second.loc["load_time", "median"] == pytest.approx(0.2)
    assert breakdown_table([]).empty


# ---------------------------------------------------------------------------------------------
# Figure


def three_runs(tmp_path: Path) -> list[Any]:
    return [
        load_run(run_dir_of(tmp_path, "20261121-1-unet3d-sleep-a", sleep=True)),
        load_run(run_dir_of(tmp_path, "20261121-2-unet3d-sleep-b", sleep=True,
                            config={"batch_size": 8}, loads=(0.5, 0.3, 0.3))),
        load_run(run_dir_of(tmp_path, "20261121-3-unet3d-sleep-c", sleep=True, ranks=2,
                            config={"accelerators": 2})),
    ]  # fmt: skip


def test_breakdown_figure_lines_and_bands(tmp_path: Path) -> None:
    fig = breakdown_figure(three_runs(tmp_path))
    assert len(fig.layout.meta["panels"]) == 8
    axes = {t.xaxis for t in fig.data}
    assert len(axes) == 8  # every panel has data
    # Step time panel (x): per series a band and a median line; 1 accelerator has 2 batch sizes.
    medians = {t.name: t for t in fig.data if t.xaxis == "x" and t.mode == "lines+markers"}
    assert set(medians) == {"unet3d · sleep · 1 acc", "unet3d · sleep · 2 acc"}
    one = medians["unet3d · sleep · 1 acc"]
    assert list(one.x) == [4, 8]
    np.testing.assert_allclose(one.y, [0.25 + COMPUTE_S + GAP_S, 0.3 + COMPUTE_S + GAP_S])
    bands = [t for t in fig.data if t.xaxis == "x" and t.fill == "toself"]
    assert len(bands) == 2
    # AU panel: one marker per run.
    au = [t for t in fig.data if t.xaxis == "x8"]
    assert sum(len(t.x) for t in au) == 3


def test_breakdown_html_renders_in_chromium(tmp_path: Path) -> None:
    out = write_breakdown(three_runs(tmp_path), tmp_path / "report" / "breakdown.html")
    # no temporary left; plotly.js beside the page, loaded from there (the browser draws it)
    assert sorted(p.name for p in out.parent.iterdir()) == ["breakdown.html", PLOTLY_JS]
    html = dom(out)
    assert subplot_count(html) == 8  # every panel drawn by plotly.js in the browser
    assert html.count('class="trace scatter') >= 8
    png = tmp_path / "breakdown.png"
    render(out, png, width=1400, height=1200)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# Several containers


def test_two_containers_keep_their_steps_apart(tmp_path: Path) -> None:
    """tests/synthetic.py's two-container run: both containers log rank 0; rank0's steps are
    0.2 + 0.7 + 0.1 s, rank1's 0.1 + 0.3 + 0.1 s. Only the container tells them apart."""
    run = load_run(synthetic.two_container_run(tmp_path))
    steps = step_table(run)
    assert steps.groupby("container").size().to_dict() == dict.fromkeys(TWO_ROLES, TWO_STEPS)
    for role in TWO_ROLES:
        mine = steps[steps["container"] == role]
        spec = TWO[role]
        # The first step runs from its load to the end of its compute (no step_end before it).
        tiled = spec["load"] + spec["compute"] + spec["gap"]
        first = spec["load"] + spec["compute"]
        assert mine["step_s"].to_numpy() == pytest.approx([first] + [tiled] * (TWO_STEPS - 1))
        assert mine["load_s"].to_numpy() == pytest.approx([spec["load"]] * TWO_STEPS)
        assert mine["first_in_epoch"].tolist() == [True] + [False] * (TWO_STEPS - 1)
    # AU pools the measured steps of both: (4 x 0.7 + 4 x 0.3) / (4 x 1.0 + 4 x 0.5).
    assert accelerator_utilisation(run) == pytest.approx(4.0 / 6.0)
    table = breakdown_table([run]).set_index("metric")
    assert table.at["step_time", "n"] == 2 * (TWO_STEPS - 1)
    assert table.at["step_time", "median"] == pytest.approx(0.75)
    assert table.at["load_time", "q1"] == pytest.approx(0.1)
    assert table.at["load_time", "q3"] == pytest.approx(0.2)
    # Reads are a container's own: rank1's 5 MiB over its measured steps' 8 samples, read in
    # the two steps that hold them at 1 µs per read: 1.6 M samples/s in both.
    assert table.at["read_throughput", "n"] == 2
    assert table.at["read_throughput", "median"] == pytest.approx(1.6e6)


# ---------------------------------------------------------------------------------------------
# Storage demand


def test_storage_demand_of_known_steps(tmp_path: Path) -> None:
    from analysis.breakdown import storage_demand
    from analysis.report import demand_lines

    run = load_run(run_dir_of(tmp_path))
    d = storage_demand(run)
    # 2 epochs x 4 measured steps; one dataset read each (the library reads do not count).
    wall = 2 * sum(load + COMPUTE_S + GAP_S for load in LOADS_S[1:])
    assert d["steps"] == 8 and d["read_bytes"] == 8 * READ_BYTES
    assert d["delivered_bytes_per_s"] == pytest.approx(8 * READ_BYTES / wall)
    assert d["needed_bytes_per_s"] == pytest.approx(8 * READ_BYTES / (8 * COMPUTE_S))
    assert d["samples_per_s"] == pytest.approx(8 * BATCH / wall)
    assert d["au"] == pytest.approx(8 * COMPUTE_S / wall)
    assert d["compute_s"] == pytest.approx(COMPUTE_S)
    assert d["load_s"] == pytest.approx(np.median(LOADS_S[1:]))
    lines = demand_lines(run)
    assert "steps: 8 measured" in lines[0] and f"AU {d['au']:.1%}" in lines[0]
    assert "keeping the accelerator busy needs 13.0 KiB/s" in lines[1]
