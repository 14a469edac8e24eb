"""The fidelity study's figures from its traces (the study runs in :mod:`experiments.fidelity`,
whose docstring defines each): the step and epoch times of a run, its CPU seconds while
training, the emulator's precision (requested vs logged compute), the noise floor of the real
runs, the figures of one ``original``/``sleep`` pair; a result's table and figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.similarity import compare_runs
from store.rundir import Run
from workloads.emulation import draw_step, emulation_rng
from workloads.profile import SleepProfile

#: The goals (errors: at most; overall: at least; cost: at most).
GOALS: Mapping[str, float] = {
    "step_error": 0.02,
    "epoch_error": 0.05,
    "overall": 0.95,
    "cost": 0.15,
}


def step_ends(run: Run) -> Any:
    """Rank 0's ``step_end`` rows of epoch 1, in step order."""
    phases = run.phases
    ends = phases[(phases["key"] == "step_end") & (phases["rank"] == 0) & (phases["epoch"] == 1)]
    return ends.sort_values("step")


def step_times(run: Run) -> np.ndarray:
    """Seconds between consecutive step ends of rank 0 in epoch 1 (first step excluded)."""
    ts = step_ends(run)["ts_ns"].to_numpy(dtype=np.int64)
    return np.diff(ts)[1:] / 1e9


def epoch_time(run: Run) -> float:
    epochs = run.phases[(run.phases["key"] == "epoch") & (run.phases["rank"] == 0)]
    return float(epochs["duration_ns"].sum()) / 1e9


def cpu_seconds(run: Run) -> float:
    """Container CPU time while training (the epoch interval): the sampler's percent of a
    core, integrated."""
    epochs = run.phases[(run.phases["key"] == "epoch") & (run.phases["rank"] == 0)]
    start, end = int(epochs["ts_ns"].min()), int(epochs["end_ns"].max())
    cpu = run.samples[run.samples["metric"] == "container_cpu"].sort_values("ts_ns")
    cpu = cpu[(cpu["ts_ns"] > start) & (cpu["ts_ns"] <= end)]
    if len(cpu) < 2:
        return float("nan")
    dt = np.diff(cpu["ts_ns"].to_numpy(dtype=np.int64)) / 1e9
    return float(np.sum(cpu["value"].to_numpy()[1:] / 100.0 * dt))


def precision(run: Run, profile: SleepProfile, seed: int = 0) -> dict[str, float]:
    """Requested vs measured emulated compute per step of rank 0, epoch 1, and the emulated
    median step against the requested one (module doc). The draws are replayed in step order;
    a run with evaluation would interleave other draws."""
    phases = run.phases
    busy = phases[
        (phases["key"] == "accelerator_busy") & (phases["rank"] == 0) & (phases["epoch"] == 1)
    ].sort_values("step")
    samples = step_ends(run)["value"].astype(float).astype(int).to_numpy()
    rng = emulation_rng(seed, 0)
    draws = np.array(
        [
            draw_step(profile, rng, 1, profile.profile_batch(int(n), 1), first=i == 0)
            for i, n in enumerate(samples)
        ]
    ).reshape(-1, 2)
    requested = draws[:, 1]
    measured = busy["duration_ns"].to_numpy(dtype=np.float64) / 1e9
    if len(measured) != len(requested):
        raise RuntimeError(
            f"{run.run_id}: {len(measured)} accelerator_busy intervals for {len(requested)} steps"
        )
    # step_times leaves the first step out: so does the requested step it is compared with.
    requested_step = float(np.median(draws[1:].sum(axis=1)))
    return {
        "requested_s": float(requested.mean()),
        "busy_s": float(measured.mean()),
        "late_ms": float(np.median(measured - requested) * 1e3),
        "requested_step_s": requested_step,
        "own_step_error": float(np.median(step_times(run))) / requested_step - 1,
    }


def spread(values: list[float]) -> float:
    """(max - min) / median of ``values``."""
    return (max(values) - min(values)) / statistics.median(values)


def noise(real_runs: list[Run]) -> dict[str, Any]:
    """The noise floor of the real runs (module doc): their median steps and epoch times, and
    the spread of each."""
    steps = [float(np.median(step_times(r))) for r in real_runs]
    epochs = [epoch_time(r) for r in real_runs]
    return {
        "real_steps_s": steps,
        "real_epochs_s": epochs,
        "step_noise": spread(steps),
        "epoch_noise": spread(epochs),
    }


def pair_figures(real: Run, emulated: Run, profile: SleepProfile) -> dict[str, Any]:
    """The figures of one ``original``/``sleep`` pair (module doc)."""
    comparison = compare_runs(real, emulated)
    scored = sorted((a for a in comparison.aspects if a.score is not None), key=lambda a: a.score)
    real_step, emulated_step = (float(np.median(step_times(r))) for r in (real, emulated))
    return {
        "step_error": emulated_step / real_step - 1,
        "epoch_error": epoch_time(emulated) / epoch_time(real) - 1,
        "real_step_s": real_step,
        "emulated_step_s": emulated_step,
        "real_epoch_s": epoch_time(real),
        "emulated_epoch_s": epoch_time(emulated),
        "overall": comparison.overall,
        "lowest": [(a.name, round(a.score, 3)) for a in scored[:2]],
        "cost": cpu_seconds(emulated) / cpu_seconds(real),
        **precision(emulated, profile),
        "runs": [str(real.path), str(emulated.path)],
    }


def summarize(result: Mapping[str, Any]) -> str:
    """One line: medians over the rounds with their min..max."""
    pairs = result["pairs"]

    def median_range(key: str, pct: bool = False) -> str:
        values = [p[key] for p in pairs]
        scale = 100 if pct else 1
        fmt = "{:+.1f}%" if pct else "{:.3f}"
        return (
            fmt.format(statistics.median(values) * scale)
            + " ("
            + fmt.format(min(values) * scale)
            + " .. "
            + fmt.format(max(values) * scale)
            + ")"
        )

    median = {
        k: statistics.median(p[k] for p in pairs) for k in ("requested_s", "busy_s", "late_ms")
    }
    lowest = pairs[len(pairs) // 2]["lowest"]
    return (
        f"{result['workload']:9s} step {median_range('step_error', True)}  "
        f"epoch {median_range('epoch_error', True)}  overall {median_range('overall')}  "
        f"cost {median_range('cost')}  own step {median_range('own_step_error', True)}  "
        f"against the fitted runs {median_range('fit_step_error', True)}  "
        f"noise of the real runs: step {result['step_noise']:.1%}, "
        f"epoch {result['epoch_noise']:.1%}, overall {result['overall_noise']:.3f}  "
        f"sleep {median['requested_s']:.4f} s -> {median['busy_s']:.4f} s "
        f"(late {median['late_ms']:.2f} ms)  lowest {lowest}"
    )


def table_lines(result: Mapping[str, Any]) -> list[str]:
    """A fidelity study's result: the goals, then a line per workload (:func:`summarize`)."""
    goals = ", ".join(f"{k} {v}" for k, v in result["goals"].items())
    return [
        f"goals: {goals} (errors: at most; overall: at least)",
        *(summarize(w) for w in result["workloads"]),
    ]


def fidelity_figure(result: Mapping[str, Any]) -> go.Figure:
    """Per workload, the median over the rounds (bars; min..max as error bars) of the step and
    epoch errors (%) beside the real runs' own spread, and of the overall score and the CPU
    cost, with the goals drawn."""
    names = [w["workload"] for w in result["workloads"]]
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("error of the emulation (%)", "overall score and cost")
    )

    def bars(key: str, scale: float, col: int, label: str) -> None:
        values = [[p[key] * scale for p in w["pairs"]] for w in result["workloads"]]
        middle = [statistics.median(v) for v in values]
        fig.add_trace(
            go.Bar(
                name=label,
                x=names,
                y=middle,
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [max(v) - m for v, m in zip(values, middle, strict=True)],
                    "arrayminus": [m - min(v) for v, m in zip(values, middle, strict=True)],
                },
            ),
            row=1,
            col=col,
        )

    bars("step_error", 100, 1, "step error")
    bars("epoch_error", 100, 1, "epoch error")
    for key, label in (("step_noise", "real runs' step spread"), ("epoch_noise", "epoch spread")):
        fig.add_trace(
            go.Bar(name=label, x=names, y=[w[key] * 100 for w in result["workloads"]]),
            row=1,
            col=1,
        )
    bars("overall", 1, 2, "overall")
    bars("cost", 1, 2, "CPU cost")
    goals = result["goals"]
    for value, col, text in (
        (goals["step_error"] * 100, 1, "step goal"),
        (-goals["step_error"] * 100, 1, ""),
        (goals["overall"], 2, "overall goal"),
        (goals["cost"], 2, "cost goal"),
    ):
        fig.add_hline(y=value, line_dash="dot", row=1, col=col, annotation_text=text)
    fig.update_layout(barmode="group", title="emulation fidelity on this host")
    return fig
