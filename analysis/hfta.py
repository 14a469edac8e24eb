"""Horizontally fused training arrays: the three ways to train B models, compared.

Pure functions of the figures :mod:`experiments.hfta` takes from each traced run (one dict per
run, :func:`experiments.hfta.run_figures`): for every array size B and mode (``serial``: B jobs
one after another; ``concurrent``: B jobs at once, one container each; ``fused``: one job
training a fused array of B models) one row (:func:`mode_rows`), the text tables
(:func:`table_lines`) and the figure (:func:`hfta_figure`).

**Throughput** is HFTA's (``hfta/workflow/timing.py``, ``_calculate_throughputs``): samples
trained across all models after each job's first epoch, divided by the span from the earliest
start of a second epoch to the latest end of a last epoch. For ``serial`` the B jobs run one
after another, so their measured spans add up: samples summed over the jobs, divided by the sum
of their spans. A fused step trains every model on its batch: it counts batch x B samples.
``speedup`` is a row's throughput over the serial throughput of the same B (HFTA normalises to
serial, whose throughput does not depend on B).

**Per model trained** (the run totals divided by B, over whole runs, first epoch included: the
data a job reads to train its model from start to end): ``read_bytes`` and ``opens`` (the
dataset's files in the containers' system calls), ``storage_bytes`` (block reads of the
dataset's blocks; where they cannot be placed, every read the containers issued),
``cache_hit_bytes`` (read-call bytes the storage did not serve: ``read_bytes`` less
``storage_bytes``, never below 0), ``cache_insert_bytes`` (pages the containers brought into
the page cache, every file), ``cpu_s`` (the containers' CPU seconds) and ``loader_cpu_s`` (the
part of it in DataLoader workers: reading and decoding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.studyrows import add_line, fmt, series

MODES = ("serial", "concurrent", "fused")
#: Run totals reported per model trained (divided by the models a mode trains).
PER_MODEL = (
    "opens",
    "read_calls",
    "read_bytes",
    "storage_bytes",
    "cache_hit_bytes",
    "cache_insert_bytes",
    "cpu_s",
    "loader_cpu_s",
)
#: HFTA's published headline (the project page in its repository).
PUBLISHED = {
    "max_speedup": 15.1,
    "source": (
        "HFTA (MLSys 2021), UofT-EcoSystem/hfta docs/index.html: 'up to 15.1x higher training "
        "throughput vs. the standard practice of running each job on a separate accelerator' "
        "(six models on V100, RTX6000, A100 GPUs and TPU v3)"
    ),
}
_NS = 1e-9


def throughput(jobs: Sequence[Mapping[str, Any]], serial: bool = False) -> float:
    """Samples per second after the first epoch of ``jobs`` (each: ``samples_measured``,
    ``measured_start_ns``, ``measured_end_ns``): HFTA's span from the first to the last, or, for
    jobs run one after another (``serial``), the sum of their spans. NaN without a measured
    epoch."""
    if not jobs or any(j["measured_start_ns"] is None for j in jobs):
        return math.nan
    samples = sum(j["samples_measured"] for j in jobs)
    if serial:
        span = sum(j["measured_end_ns"] - j["measured_start_ns"] for j in jobs) * _NS
    else:
        span = (
            max(j["measured_end_ns"] for j in jobs) - min(j["measured_start_ns"] for j in jobs)
        ) * _NS
    return samples / span if span > 0 else math.nan


def _sum(runs: Sequence[Mapping[str, Any]], field: str) -> float:
    values = [r[field] for r in runs]
    if any(v is None for v in values):
        return math.nan
    return float(sum(values))


def mode_row(mode: str, size: int, runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The row of one mode at array size ``size`` from the figures of its runs (serial: the
    first ``size`` jobs; concurrent and fused: one run)."""
    jobs = [job for run in runs for job in run["jobs"]]
    row: dict[str, Any] = {
        "mode": mode,
        "array_size": size,
        "runs": [r["key"] for r in runs],
        "containers": sum(len(r["jobs"]) for r in runs),
        "samples_measured": sum(j["samples_measured"] for j in jobs),
        "throughput": throughput(jobs, serial=mode == "serial"),
        "wall_s": _sum(runs, "duration_s"),
        "other_cpu_cores_max": max(
            (r["other_cpu_cores"] for r in runs if r["other_cpu_cores"] is not None),
            default=math.nan,
        ),
        "accelerator_wait_s": _sum(runs, "accelerator_wait_s"),
    }
    for field in PER_MODEL:
        row[f"{field}_per_model"] = _sum(runs, field) / size
    return row


def mode_rows(
    runs: Mapping[str, Mapping[str, Any]], array_sizes: Sequence[int]
) -> list[dict[str, Any]]:
    """A row per (array size, mode), from the runs' figures keyed by run key (``serial-j<k>``,
    ``concurrent-b<B>``, ``fused-b<B>``; at B = 1 every mode is the run ``serial-j0``), each
    with ``speedup`` over the serial row of its B."""
    rows = []
    for size in array_sizes:
        serial = [runs[f"serial-j{k}"] for k in range(size)]
        made = {"serial": mode_row("serial", size, serial)}
        for mode in MODES[1:]:
            made[mode] = mode_row(mode, size, serial if size == 1 else [runs[f"{mode}-b{size}"]])
        base = made["serial"]["throughput"]
        for mode in MODES:
            row = made[mode]
            row["speedup"] = row["throughput"] / base if base > 0 else math.nan
            rows.append(row)
    return rows


def _evals(job: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(e["epoch"]): e for e in job.get("evals") or []}


def convergence_rows(
    runs: Mapping[str, Mapping[str, Any]],
    array_sizes: Sequence[int],
    learning_rates: Sequence[float],
) -> list[dict[str, Any]]:
    """A row per (B > 1, model k, evaluated epoch): model k's validation top-1 and loss when
    trained alone (``serial``: job k's run), as one of B concurrent jobs (container ``job<k>``)
    and as model k of the fused array of B (its ``top1_models[k]``, ``loss_models[k]``)."""
    rows = []
    for size in array_sizes:
        if size < 2:
            continue
        fused = _evals(runs[f"fused-b{size}"]["jobs"][0])
        concurrent = runs[f"concurrent-b{size}"]["jobs"]
        for k in range(size):
            alone = _evals(runs[f"serial-j{k}"]["jobs"][0])
            beside = _evals(concurrent[k]) if k < len(concurrent) else {}
            for epoch in sorted(alone):
                row: dict[str, Any] = {
                    "array_size": size,
                    "model": k,
                    "learning_rate": learning_rates[k],
                    "epoch": epoch,
                }
                for metric in ("top1", "loss"):
                    f = fused.get(epoch, {}).get(f"{metric}_models") or []
                    row[f"serial_{metric}"] = alone[epoch].get(metric)
                    row[f"concurrent_{metric}"] = beside.get(epoch, {}).get(metric)
                    row[f"fused_{metric}"] = f[k] if k < len(f) else None
                rows.append(row)
    return rows


def convergence_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The largest differences from the model trained alone: top-1 (a share of the val images)
    and the loss relative to it, fused and concurrent."""

    def largest(mode: str, metric: str, relative: bool = False) -> float | None:
        diffs = [
            abs(r[f"{mode}_{metric}"] - r[f"serial_{metric}"])
            / (abs(r[f"serial_{metric}"]) if relative and r[f"serial_{metric}"] else 1.0)
            for r in rows
            if r.get(f"{mode}_{metric}") is not None and r.get(f"serial_{metric}") is not None
        ]
        return max(diffs) if diffs else None

    return {
        f"max_{mode}_{what}": largest(mode, metric, metric == "loss")
        for mode in ("fused", "concurrent")
        for metric, what in (("top1", "top1_diff"), ("loss", "loss_rel_diff"))
    }


def table_lines(
    rows: Sequence[Mapping[str, Any]], convergence: Mapping[str, Any] | None = None
) -> list[str]:
    """Two fixed-width tables (under 80 columns): throughput and speedup per mode and B, then
    what each model trained cost (MB read through the calls, from storage and from the page
    cache, CPU seconds in all and in the loaders, files opened); with ``convergence``, a third:
    each model's validation top-1 and loss per epoch, alone, concurrent and fused."""
    lines = [
        f"{'B':>3} {'mode':<10} {'samples/s':>10} {'speedup':>7} {'wall s':>7} "
        f"{'jobs':>4} {'acc wait s':>10}"
    ]
    for r in rows:
        lines.append(
            f"{r['array_size']:>3} {r['mode']:<10} {fmt(r['throughput'], 1):>10} "
            f"{fmt(r['speedup']):>7} {fmt(r['wall_s'], 1):>7} {r['containers']:>4} "
            f"{fmt(r['accelerator_wait_s'], 1):>10}"
        )
    lines.append(
        f"{'B':>3} {'mode':<10} {'opens':>6} {'read MB':>8} {'disk MB':>8} {'cache MB':>8} "
        f"{'CPU s':>7} {'loader s':>8}   (per model)"
    )
    for r in rows:
        lines.append(
            f"{r['array_size']:>3} {r['mode']:<10} {fmt(r['opens_per_model'], 0):>6} "
            f"{fmt(r['read_bytes_per_model'], 1, 1e6):>8} "
            f"{fmt(r['storage_bytes_per_model'], 1, 1e6):>8} "
            f"{fmt(r['cache_hit_bytes_per_model'], 1, 1e6):>8} "
            f"{fmt(r['cpu_s_per_model'], 1):>7} {fmt(r['loader_cpu_s_per_model'], 1):>8}"
        )
    if convergence:
        lines.append(
            f"{'B':>3} {'model':>5} {'lr':>7} {'epoch':>5} {'top-1 alone/conc/fused':>22} "
            f"{'loss alone/fused':>17}"
        )
        for r in convergence["rows"]:
            top1 = "/".join(fmt(r[f"{m}_top1"], 3) for m in MODES)
            loss = "/".join(fmt(r[f"{m}_loss"], 3) for m in ("serial", "fused"))
            lines.append(
                f"{r['array_size']:>3} {r['model']:>5} {r['learning_rate']:>7.4g} "
                f"{r['epoch']:>5} {top1:>22} {loss:>17}"
            )
        lines.append(
            "largest difference from the model alone: fused top-1 "
            f"{fmt(convergence['max_fused_top1_diff'], 3)}, loss "
            f"{fmt(convergence['max_fused_loss_rel_diff'], 4)} (relative); as a concurrent job "
            f"(float32's noise: other threads) top-1 "
            f"{fmt(convergence['max_concurrent_top1_diff'], 3)}, loss "
            f"{fmt(convergence['max_concurrent_loss_rel_diff'], 4)}"
        )
    return lines


_COLOURS = {"serial": "#d62728", "concurrent": "#2ca02c", "fused": "#9467bd"}


def hfta_figure(result: Mapping[str, Any]) -> go.Figure:
    """HFTA's speedup curves (throughput normalised to serial against B, one line per mode),
    and per model trained: bytes through the read calls, from storage and from the page cache,
    and CPU seconds (all, and the loaders')."""
    rows = result["rows"]
    convergence = result.get("convergence")
    largest = max((r["array_size"] for r in convergence["rows"]), default=0) if convergence else 0
    fig = make_subplots(
        rows=3 if largest else 2,
        cols=2,
        subplot_titles=(
            "throughput normalised to serial (HFTA's speedup curves)",
            "MB read per model trained: read calls (solid), storage (dash), page cache (dot)",
            "samples trained per second (all models)",
            "CPU seconds per model trained: all (solid), loader workers (dash)",
            *(
                (
                    f"validation top-1 per epoch, B = {largest}: each model alone (solid), "
                    "fused (markers)",
                    "validation loss per epoch: alone (solid), fused (markers)",
                )
                if largest
                else ()
            ),
        ),
        horizontal_spacing=0.08,
        vertical_spacing=0.1 if largest else 0.14,
    )
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        x = [r["array_size"] for r in mine]
        colour = _COLOURS[mode]

        add_line(fig, (1, 1), x, series(mine, "speedup"), mode, line={"color": colour})
        add_line(
            fig, (2, 1), x, series(mine, "throughput"), f"{mode} samples/s",
            line={"color": colour}, showlegend=False,
        )  # fmt: skip
        lanes = (
            (1, 1e6, (("read_bytes_per_model", "solid"), ("storage_bytes_per_model", "dash"),
                      ("cache_hit_bytes_per_model", "dot"))),
            (2, 1.0, (("cpu_s_per_model", "solid"), ("loader_cpu_s_per_model", "dash"))),
        )  # fmt: skip
        for row, scale, fields in lanes:
            for field, dash in fields:
                add_line(
                    fig, (row, 2), x, series(mine, field, scale), f"{mode}: {field}",
                    line={"color": colour, "dash": dash}, showlegend=False,
                )  # fmt: skip
    if largest:
        assert convergence is not None
        mine = [r for r in convergence["rows"] if r["array_size"] == largest]
        for k in sorted({r["model"] for r in mine}):
            model = [r for r in mine if r["model"] == k]
            x = [r["epoch"] for r in model]
            name = f"model {k} (lr {model[0]['learning_rate']:g})"
            for col, metric in ((1, "top1"), (2, "loss")):
                add_line(
                    fig, (3, col), x, series(model, f"serial_{metric}"), f"{name} alone",
                    showlegend=col == 1, legendgroup=name,
                )  # fmt: skip
                add_line(
                    fig, (3, col), x, series(model, f"fused_{metric}"), f"{name} fused",
                    mode="markers", showlegend=False, legendgroup=name,
                )  # fmt: skip
            fig.update_xaxes(title_text="epoch", row=3, col=1)
            fig.update_xaxes(title_text="epoch", row=3, col=2)
    sizes = sorted({r["array_size"] for r in rows})
    for row in (1, 2):
        for col in (1, 2):
            fig.update_xaxes(title_text="models B", tickvals=sizes, row=row, col=col)
    settings = result["settings"]
    fig.update_layout(
        title=(
            f"HFTA on this host: {settings['workload']} {settings['variant']}, batch "
            f"{settings['batch_size']}, {settings['workers']} loader workers per job, "
            f"{settings['epochs']} epochs (the first excluded from throughput); published: up "
            f"to {PUBLISHED['max_speedup']}x on accelerators"
        ),
        legend={"orientation": "h", "y": -0.12},
        height=1200 if largest else 820,
        width=1400,
    )
    return fig


__all__ = [
    "MODES",
    "PER_MODEL",
    "PUBLISHED",
    "convergence_rows",
    "convergence_summary",
    "hfta_figure",
    "mode_row",
    "mode_rows",
    "table_lines",
    "throughput",
]
