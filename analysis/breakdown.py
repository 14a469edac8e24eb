"""Per-step breakdowns and accelerator utilisation (AU) of instrumented and sleep runs.

Everything comes from a run's application events (``phases``, docs/run-format.md), which the
shared training loop (``workloads/training.py``) logs for every step of every rank:
``load_batch_mem`` (waiting for the next batch from the loader), ``all_compute`` (from having
the batch to the end of the optimisation step: host-to-device copy, forward, backward,
optimiser, loss), ``step_end`` (a point, value = samples in the step), and in the loader
workers ``sample_load``/``batch_load``. The ``original`` variant logs no durations, so it has
no breakdown (:class:`UserError`).

Definitions (docs/analysis.md explains them with the reasons):

- **step time**: from the previous ``step_end`` of the same rank and epoch to this one, so the
  steps of an epoch tile its wall time (loader waits, compute and the loop's own overhead).
  The first step of an epoch has no previous ``step_end``; it runs from the start of its
  ``load_batch_mem`` to the end of its ``all_compute``.
- **data-loading time**: the ``load_batch_mem`` duration; **compute time**: the
  ``all_compute`` duration. Sleep runs log ``all_compute`` too (their emulated
  ``load_batch_gpu`` + ``accelerator_busy`` and the microseconds between them), so real and
  emulated runs are measured alike; a run without ``all_compute`` falls back to
  ``load_batch_gpu`` + ``accelerator_busy``.
- **first steps**: the first step of each (rank, epoch) is flagged ``first_in_epoch`` in
  :func:`step_table` and left out of every statistic and of AU: it includes the loader
  workers' start-up and the first batch's fetch, which are not the steady state, as MLPerf
  Storage (DLIO) excludes them.
- **AU** (:func:`accelerator_utilisation`): total compute time / total step time over the
  remaining steps of all ranks and epochs, i.e. the fraction of the training loop's wall time
  (from the end of each epoch's first step to its last ``step_end``) the accelerators computed.
- **throughputs**, in samples/s, per step: data loading = samples / data-loading time;
  compute = samples / compute time; file reads = the bytes of the dataset's read syscalls
  (files under the run's read-only mounts) completing within the step, in samples (divided by
  the mean sample size: bytes read over samples trained in the measured steps), over the time
  spent in those reads (their summed latency): how fast readers get samples while they read.
  Reads cannot be attributed to ranks, so with several ranks the slices are the lowest rank's
  steps and count every reader's reads; they can be attributed to containers, so each
  container's steps count its own reads. Per-step values are summarised by median and quartiles.
- **containers**: a step belongs to a (container, rank): the containers of a run may each
  number their ranks from 0. Statistics and AU pool the steps of all containers.
- **loader latencies**: durations of ``sample_load`` / ``batch_load`` events that end within
  the measured steps of their rank and epoch (so evaluation and first-step loads are out).

Example::

    runs = [load_run(r) for r in ("runs/A", "runs/B")]
    breakdown_table(runs)
    write_breakdown(runs, Path("breakdown.html"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.figures import write_figure
from analysis.tables import kind_mask
from core.errors import UserError
from store.rundir import READ_KINDS, Run

LOADER_KEYS: tuple[str, ...] = ("sample_load", "batch_load")

#: Columns of :func:`step_table`.
STEP_COLUMNS: tuple[str, ...] = (
    "container",
    "rank",
    "epoch",
    "step",
    "start_ns",
    "end_ns",
    "step_s",
    "load_s",
    "compute_s",
    "samples",
    "first_in_epoch",
)

#: Per-step metrics of :func:`breakdown_table`: name -> (unit, label for plots).
METRICS: dict[str, tuple[str, str]] = {
    "step_time": ("s", "step time"),
    "load_time": ("s", "data-loading time (load_batch_mem)"),
    "compute_time": ("s", "compute time (all_compute)"),
    "read_throughput": ("samples/s", "file reads"),
    "load_throughput": ("samples/s", "data loading"),
    "compute_throughput": ("samples/s", "compute"),
    "sample_load": ("s", "sample_load latency"),
    "batch_load": ("s", "batch_load latency"),
    "accelerator_utilisation": ("fraction", "accelerator utilisation"),
}

TABLE_COLUMNS: tuple[str, ...] = (
    "run",
    "workload",
    "variant",
    "accelerators",
    "batch_size",
    "metric",
    "unit",
    "n",
    "median",
    "q1",
    "q3",
)

_NS = 1e-9
#: A step is one of a rank of a container: the containers of a run may each number their ranks
#: from 0.
_RANK = ["container", "rank"]
_KEY = [*_RANK, "epoch", "step"]


# ---------------------------------------------------------------------------------------------
# Steps


def _intervals(phases: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Per (rank, epoch, step): earliest start, latest end and summed duration of ``keys``."""
    rows = phases[
        phases["kind"].eq("interval").to_numpy(dtype=bool, na_value=False)
        & phases["key"].isin(list(keys)).to_numpy(dtype=bool, na_value=False)
        & (phases["step"].to_numpy() >= 0)
    ]
    return rows.groupby(_KEY).agg(
        start_ns=("ts_ns", "min"), end_ns=("end_ns", "max"), duration_ns=("duration_ns", "sum")
    )


def _has(phases: pd.DataFrame, key: str) -> bool:
    return bool(phases["key"].eq(key).any())


def _phases(run: Run) -> pd.DataFrame:
    """The run's phases, a null ``container`` as ``""`` (grouping keys cannot be null)."""
    phases = run.phases
    return phases.assign(container=phases["container"].fillna(""))


def step_table(run: Run) -> pd.DataFrame:
    """One row per (container, rank, epoch, step) of ``run`` with its times (module doc).

    Columns :data:`STEP_COLUMNS`: ``container`` the role of the container the step ran in,
    ``start_ns``/``end_ns`` the step's interval (CLOCK_MONOTONIC ns), ``step_s``, ``load_s``,
    ``compute_s`` in seconds, ``samples`` (the ``step_end`` value, else the configured batch
    size), ``first_in_epoch`` (True for the first step of its rank and epoch: kept here,
    excluded from statistics). Sorted by container, rank, epoch, step.
    """
    phases = _phases(run)
    compute_keys = ["all_compute"] if _has(phases, "all_compute") else []
    if not compute_keys and _has(phases, "accelerator_busy"):
        compute_keys = ["load_batch_gpu", "accelerator_busy"]
    load = _intervals(phases, ["load_batch_mem"])
    compute = _intervals(phases, compute_keys) if compute_keys else load.iloc[:0]
    if len(load) == 0 or len(compute) == 0:
        raise UserError(
            f"run {run.run_id} ({run.variant} variant) has no per-step durations "
            "(load_batch_mem, all_compute): trace the instrumented or sleep variant "
            "for a step breakdown"
        )
    steps = load.add_suffix("_load").join(compute.add_suffix("_compute"), how="inner")
    ends = phases[
        phases["key"].eq("step_end").to_numpy(dtype=bool, na_value=False)
        & (phases["step"].to_numpy() >= 0)
    ]
    ends = ends.drop_duplicates(_KEY, keep="last").set_index(_KEY)
    steps = steps.join(
        pd.DataFrame(
            {
                # Nullable integers keep boot-relative ns exact through the join and shift.
                "step_end_ns": ends["ts_ns"].astype("Int64"),
                "samples": pd.to_numeric(ends["value"], errors="coerce"),
            }
        ),
        how="left",
    ).reset_index()
    steps = steps.sort_values(_KEY, kind="stable").reset_index(drop=True)

    group = steps.groupby([*_RANK, "epoch"], sort=False)
    previous_end = group["step_end_ns"].shift(1)
    consecutive = group["step"].shift(1).eq(steps["step"] - 1)
    tiled = consecutive & previous_end.notna() & steps["step_end_ns"].notna()
    start = previous_end.where(tiled, steps["start_ns_load"]).to_numpy(dtype=np.int64)
    end = steps["step_end_ns"].where(tiled, steps["end_ns_compute"]).to_numpy(dtype=np.int64)
    config = run.manifest.get("config") or {}
    batch = config.get("batch_size")
    samples = steps["samples"]
    if batch is not None:
        samples = samples.fillna(float(batch))
    out = pd.DataFrame(
        {
            "container": steps["container"].astype("string"),
            "rank": steps["rank"].astype("int32"),
            "epoch": steps["epoch"].astype("int32"),
            "step": steps["step"].astype("int32"),
            "start_ns": start,
            "end_ns": end,
            "step_s": (end - start).astype(np.float64) * _NS,
            "load_s": steps["duration_ns_load"].to_numpy(dtype=np.float64) * _NS,
            "compute_s": steps["duration_ns_compute"].to_numpy(dtype=np.float64) * _NS,
            "samples": samples.to_numpy(dtype=np.float64),
            "first_in_epoch": steps["step"].eq(group["step"].transform("min")).to_numpy(),
        }
    )
    return out[list(STEP_COLUMNS)]


def accelerator_utilisation(run: Run, steps: pd.DataFrame | None = None) -> float:
    """AU of ``run``: compute time / step time over all steps but each epoch's first (module
    doc), between 0 and 1; NaN when no step is left (every epoch had a single step).

    ``steps`` is the run's :func:`step_table`, when already computed.
    """
    steps = step_table(run) if steps is None else steps
    kept = steps[~steps["first_in_epoch"]]
    total = float(kept["step_s"].sum())
    return float(kept["compute_s"].sum()) / total if total > 0 else float("nan")


def storage_demand(run: Run, steps: pd.DataFrame | None = None) -> dict[str, float]:
    """What the run's data pipeline delivered and what keeping its accelerators busy needs,
    over the measured steps (each epoch's first left out, as for AU):

    - ``steps``, ``au``; ``step_s``, ``compute_s``, ``load_s``: medians per step;
    - ``samples_per_s``: samples trained per second of wall time (all ranks);
    - ``read_bytes``: the dataset's read syscalls within the measured steps (all readers);
    - ``delivered_bytes_per_s``: ``read_bytes`` over the wall time of those steps;
    - ``needed_bytes_per_s``: ``read_bytes`` over the time the accelerators computed in them
      (one rank's compute: ranks compute in parallel), i.e. the rate at which the pipeline
      would have to deliver the same bytes for the accelerators never to wait (AU 100%).

    Cached reads count as delivered bytes: this is the rate the readers must see, from the
    page cache or the storage. Rates are NaN when the run has no measured step.
    """
    steps = step_table(run) if steps is None else steps
    kept = steps[~steps["first_in_epoch"]]
    nan = float("nan")
    if len(kept) == 0:
        return {"steps": 0, "au": nan, "needed_bytes_per_s": nan, "delivered_bytes_per_s": nan}
    reads = dataset_reads(run)
    read_bytes = wall = compute = 0.0
    for role, mine in kept.groupby("container", sort=False):
        theirs = reads[reads["container"] == role]
        lowest = mine[mine["rank"] == mine["rank"].min()]
        nbytes, _ = _reads_in(theirs, lowest["start_ns"].to_numpy(), lowest["end_ns"].to_numpy())
        read_bytes += float(nbytes.sum())
        wall = max(wall, float(lowest["step_s"].sum()))
        compute = max(compute, float(lowest["compute_s"].sum()))
    return {
        "steps": len(kept),
        "au": accelerator_utilisation(run, steps),
        "step_s": float(kept["step_s"].median()),
        "compute_s": float(kept["compute_s"].median()),
        "load_s": float(kept["load_s"].median()),
        "samples_per_s": float(kept["samples"].sum()) / wall if wall > 0 else nan,
        "read_bytes": read_bytes,
        "delivered_bytes_per_s": read_bytes / wall if wall > 0 else nan,
        "needed_bytes_per_s": read_bytes / compute if compute > 0 else nan,
    }


# ---------------------------------------------------------------------------------------------
# Per-step values and the table


def run_config(run: Run, steps: pd.DataFrame) -> tuple[int, int]:
    """(accelerators, batch size per accelerator) from the manifest's config; for runs without
    one (``--image``), the number of ranks (of all containers) and the median samples per
    step."""
    config = run.manifest.get("config") or {}
    accelerators = config.get("accelerators") or len(steps[_RANK].drop_duplicates())
    batch = config.get("batch_size") or int(np.nanmedian(steps["samples"]))
    return int(accelerators), int(batch)


def dataset_prefixes(run: Run) -> tuple[str, ...]:
    """Container paths of the run's read-only mounts (the dataset), with a trailing ``/``."""
    return tuple(d.rstrip("/") + "/" for d in run.data_mounts)


def dataset_reads(run: Run) -> pd.DataFrame:
    """The dataset's read syscalls (``ts_ns``, ``bytes``, ``latency_ns``, ``container``), sorted
    by time: reads of files under the run's read-only mounts (imports, ``/proc`` and pipes are
    not the storage being measured); without recorded mounts, every read."""
    events = run.events
    mask = kind_mask(events, READ_KINDS)
    prefixes = dataset_prefixes(run)
    if prefixes:
        mask = mask & events["path"].str.startswith(prefixes).to_numpy(dtype=bool, na_value=False)
    reads = events.loc[mask, ["ts_ns", "bytes", "latency_ns", "container"]]
    reads = reads.assign(container=reads["container"].fillna(""))
    return reads.sort_values("ts_ns", kind="stable")


def _reads_in(
    reads: pd.DataFrame, start_ns: np.ndarray, end_ns: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Bytes and summed latency (s) of ``reads`` (sorted by time) completing in each
    ``(start, end]``, by prefix sums (vectorised). Both are totals, so an aggregated row (its
    calls' bytes and summed latency, docs/run-format.md) counts as its calls would; it falls
    in the slice holding its time, its last call's exit."""
    ts = reads["ts_ns"].to_numpy()
    nbytes = np.concatenate([[0], np.cumsum(reads["bytes"].to_numpy())])
    latency = np.concatenate([[0], np.cumsum(reads["latency_ns"].to_numpy())])
    hi = np.searchsorted(ts, end_ns, side="right")
    lo = np.searchsorted(ts, start_ns, side="right")
    return (nbytes[hi] - nbytes[lo]).astype(np.float64), (latency[hi] - latency[lo]) * _NS


def _read_throughput(run: Run, kept: pd.DataFrame) -> np.ndarray:
    """Per measured step, samples/s of the dataset's reads while reading (module doc).

    Reads cannot be told apart by rank (loader workers are separate processes), so within a
    container the time is sliced by the steps of one rank, whose steps tile each epoch, and
    every reader's reads in a slice count: no read is counted twice. Reads are told apart by
    container: each container's steps count its own reads.
    """
    reads = dataset_reads(run)
    values = [np.zeros(0)]
    for role, mine in kept.groupby("container", sort=False):  # one per container: a handful
        theirs = reads[reads["container"] == role]
        spans = mine.groupby("epoch").agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
        epoch_bytes, _ = _reads_in(theirs, spans["lo"].to_numpy(), spans["hi"].to_numpy())
        mean_sample = epoch_bytes.sum() / float(mine["samples"].sum())
        slices = mine[mine["rank"] == mine["rank"].min()]
        nbytes, read_s = _reads_in(
            theirs, slices["start_ns"].to_numpy(), slices["end_ns"].to_numpy()
        )
        if mean_sample > 0:
            values.append(nbytes / mean_sample / read_s)
    return np.concatenate(values)


def _loader_latencies(phases: pd.DataFrame, kept: pd.DataFrame) -> pd.DataFrame:
    """``metric``/``value`` rows of loader events ending within their rank's measured steps."""
    if len(kept) == 0:
        return pd.DataFrame({"metric": pd.Series([], dtype=str), "value": []})
    windows = kept.groupby([*_RANK, "epoch"]).agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    loads = phases[phases["key"].isin(list(LOADER_KEYS)).to_numpy(dtype=bool, na_value=False)]
    loads = loads.join(windows, on=[*_RANK, "epoch"], how="inner")
    inside = (loads["end_ns"] > loads["lo"]) & (loads["end_ns"] <= loads["hi"])
    loads = loads[inside]
    return pd.DataFrame(
        {
            "metric": loads["key"].astype(str).to_numpy(),
            "value": loads["duration_ns"].to_numpy(dtype=np.float64) * _NS,
        }
    )


def step_values(run: Run, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Long frame ``metric, value`` of ``run``'s per-step metrics and loader latencies, first
    steps excluded; plus one ``accelerator_utilisation`` row (module doc). ``steps`` is the
    run's :func:`step_table`, when already computed."""
    steps = step_table(run) if steps is None else steps
    kept = steps[~steps["first_in_epoch"]].reset_index(drop=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_step: dict[str, np.ndarray] = {
            "step_time": kept["step_s"].to_numpy(),
            "load_time": kept["load_s"].to_numpy(),
            "compute_time": kept["compute_s"].to_numpy(),
            "load_throughput": (kept["samples"] / kept["load_s"]).to_numpy(),
            "compute_throughput": (kept["samples"] / kept["compute_s"]).to_numpy(),
        }
        throughput = _read_throughput(run, kept)
        if len(throughput):
            per_step["read_throughput"] = throughput
    frames = [pd.DataFrame({"metric": name, "value": v}) for name, v in per_step.items()]
    frames.append(_loader_latencies(_phases(run), kept))
    frames.append(
        pd.DataFrame(
            {"metric": ["accelerator_utilisation"], "value": [accelerator_utilisation(run, steps)]}
        )
    )
    values = pd.concat(frames, ignore_index=True)
    # A zero duration makes an infinite rate: not a measurement, leave it out.
    return values[np.isfinite(values["value"].to_numpy(dtype=np.float64))]


def _summarise(values: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Median and quartiles of ``value`` per ``by`` + metric (vectorised groupby quantiles)."""
    grouped = values.groupby([*by, "metric"], sort=False)["value"]
    stats = grouped.quantile([0.25, 0.5, 0.75]).unstack()
    stats.columns = ["q1", "median", "q3"]
    stats["n"] = grouped.size()
    return stats.reset_index()


def _runs_values(runs: Sequence[Run]) -> pd.DataFrame:
    frames = []
    for run in runs:  # one per run: the work inside is vectorised
        steps = step_table(run)
        values = step_values(run, steps)
        accelerators, batch = run_config(run, steps)
        frames.append(
            values.assign(
                run=run.run_id,
                workload=run.workload,
                variant=run.variant,
                accelerators=accelerators,
                batch_size=batch,
            )
        )
    return pd.concat(frames, ignore_index=True)


def breakdown_table(runs: Sequence[Run]) -> pd.DataFrame:
    """Long table, one row per (run, metric): columns :data:`TABLE_COLUMNS`.

    ``metric`` is one of :data:`METRICS` (loader latencies only for the loader events a run
    has; ``read_throughput`` only when it read files); ``median``, ``q1``, ``q3`` over the
    run's measured steps (loader latencies: over its loader events), ``n`` how many. AU is a
    single value per run (``n`` 1, quartiles equal to it). A run without step durations is a
    :class:`UserError`.
    """
    if not runs:
        return pd.DataFrame({c: [] for c in TABLE_COLUMNS})
    values = _runs_values(runs)
    by = ["run", "workload", "variant", "accelerators", "batch_size"]
    table = _summarise(values, by)
    table["unit"] = table["metric"].map(lambda m: METRICS[m][0])
    order = {name: i for i, name in enumerate(METRICS)}
    table = table.sort_values(
        ["run", "metric"], key=lambda c: c.map(order) if c.name == "metric" else c, kind="stable"
    )
    return table[list(TABLE_COLUMNS)].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Figure

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")

#: Subplots: (row, col, metrics drawn in it, y-axis title).
PANELS: tuple[tuple[int, int, tuple[str, ...], str], ...] = (
    (1, 1, ("step_time",), "step time (s)"),
    (1, 2, ("load_time",), "data loading (s)"),
    (1, 3, ("compute_time",), "compute (s)"),
    (2, 1, ("read_throughput",), "file reads (samples/s)"),
    (2, 2, ("load_throughput",), "data loading (samples/s)"),
    (2, 3, ("compute_throughput",), "compute (samples/s)"),
    (3, 1, LOADER_KEYS, "loader latency (s)"),
    (3, 2, ("accelerator_utilisation",), "AU (%)"),
)
_TITLES = (
    "overall step time",
    "data-loading time (load_batch_mem)",
    "compute time (all_compute)",
    "file-read throughput (while reading)",
    "data-loading throughput",
    "compute throughput",
    "loader latency (sample_load / batch_load)",
    "accelerator utilisation per run",
)


def _rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def breakdown_figure(runs: Sequence[Run]) -> go.Figure:
    """Per-step breakdown of ``runs`` against batch size (module doc).

    Row 1: overall step, data-loading and compute time; row 2: file-read, data-loading and
    compute throughput; row 3: loader latency and AU. One line per (workload, variant,
    accelerator count) through the median of each batch size's measured steps (runs of the same
    configuration pooled), with the interquartile range as a band; AU is one marker per run.
    ``fig.layout.meta["panels"]`` lists the subplots' titles.
    """
    fig = make_subplots(
        rows=3,
        cols=3,
        specs=[[{}, {}, {}], [{}, {}, {}], [{}, {}, None]],
        subplot_titles=_TITLES,
        horizontal_spacing=0.07,
        vertical_spacing=0.1,
    )
    fig.update_layout(
        height=1100,
        template="plotly_white",
        hovermode="closest",
        meta={"panels": list(_TITLES)},
        legend={"title": {"text": "workload · variant · accelerators"}},
        margin={"t": 60, "l": 70, "r": 20, "b": 60},
    )
    if not runs:
        fig.add_annotation(
            text="no runs", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5
        )
        return fig
    values = _runs_values(runs)
    values["series"] = (
        values["workload"]
        + " · "
        + values["variant"]
        + " · "
        + values["accelerators"].astype(str)
        + " acc"
    )
    series_names = sorted(values["series"].unique())
    colors = {s: _COLORS[i % len(_COLORS)] for i, s in enumerate(series_names)}
    pooled = _summarise(values, ["series", "batch_size"]).sort_values("batch_size")
    shown: set[str] = set()
    dashes = {"sample_load": "solid", "batch_load": "dot"}
    for row, col, metrics, ytitle in PANELS:
        if metrics == ("accelerator_utilisation",):
            au = values[values["metric"] == "accelerator_utilisation"]
            for series, points in au.groupby("series", sort=True):
                fig.add_trace(
                    go.Scatter(
                        x=points["batch_size"],
                        y=points["value"] * 100,
                        mode="markers",
                        marker={"color": colors[series], "size": 9},
                        name=series,
                        legendgroup=series,
                        showlegend=series not in shown,
                        text=points["run"],
                        hovertemplate="%{text}: AU %{y:.1f}%<extra></extra>",
                    ),
                    row=row,
                    col=col,
                )
                shown.add(series)
            fig.update_yaxes(range=[0, 105], row=row, col=col)
        for metric in metrics if metrics != ("accelerator_utilisation",) else ():
            rows = pooled[pooled["metric"] == metric]
            for series, line in rows.groupby("series", sort=True):
                color = colors[series]
                x = line["batch_size"].to_numpy()
                # The band: q3 forwards, then q1 backwards, filled as one closed shape.
                fig.add_trace(
                    go.Scatter(
                        x=np.concatenate([x, x[::-1]]),
                        y=np.concatenate([line["q3"].to_numpy(), line["q1"].to_numpy()[::-1]]),
                        mode="lines",
                        fill="toself",
                        fillcolor=_rgba(color, 0.2),
                        line={"width": 0},
                        hoverinfo="skip",
                        legendgroup=series,
                        showlegend=False,
                    ),
                    row=row,
                    col=col,
                )
                label = series if len(metrics) == 1 else f"{series} ({metric})"
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=line["median"],
                        mode="lines+markers",
                        line={"color": color, "dash": dashes.get(metric, "solid")},
                        # Bars as well as the band: a single batch size has a band of no width.
                        error_y={
                            "type": "data",
                            "symmetric": False,
                            "array": line["q3"] - line["median"],
                            "arrayminus": line["median"] - line["q1"],
                            "color": _rgba(color, 0.6),
                            "thickness": 1,
                            "width": 4,
                        },
                        name=label,
                        legendgroup=series,
                        showlegend=series not in shown,
                        customdata=np.column_stack([line["q1"], line["q3"], line["n"]]),
                        hovertemplate=f"{METRICS[metric][1]}<br>batch %{{x}}: median %{{y:.4g}} "
                        "(IQR %{customdata[0]:.4g} – %{customdata[1]:.4g}, n %{customdata[2]})"
                        "<extra>%{fullData.name}</extra>",
                    ),
                    row=row,
                    col=col,
                )
                shown.add(series)
        fig.update_yaxes(title_text=ytitle, rangemode="tozero", row=row, col=col)
    batches = sorted(values["batch_size"].unique().tolist())
    fig.update_xaxes(
        type="log",
        tickvals=batches,
        ticktext=[str(b) for b in batches],
        title_text="batch size per accelerator",
    )
    return fig


def write_breakdown(runs: Sequence[Run], out_path: Path) -> Path:
    """Write :func:`breakdown_figure` of ``runs`` as an HTML page (the shared plotly.js beside
    it, :mod:`analysis.figures`: it opens offline), atomically; return its path."""
    return write_figure(breakdown_figure(runs), out_path)
