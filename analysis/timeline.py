"""The timeline plot: what a run did over time, one lane per resource, runs stacked.

For each run, top to bottom (the published study's timeline, reordered so that cause is above
effect): phases, accelerator, syscall I/O bandwidth, per-process I/O intervals, block I/O, page
cache, CPU, memory, network (bytes each container received and sent per second: runs of several
containers, or one reaching another host). All lanes share one x axis: seconds since the run's ``start_ns`` (the moment
the workload was released), so two runs (real vs emulated) line up from their starts. A run of
several containers gets one such group of lanes per container (:func:`lane_groups`), on the same
axis; host-wide rows (host CPU, block requests of no container) are drawn in every group.

Binning (:mod:`analysis.series`) and process classification (:mod:`analysis.processes`) are
shared with the other analyses; this module lays out lanes and figures.

Everything is a pure function from DataFrames (``docs/run-format.md``) to plotly objects, and is
vectorised: millions of events are binned with ``np.bincount`` and drawn as a few WebGL traces
whose segments are separated by NaN gaps (the vectorised form of plotly's ``None`` separators),
never as one shape or trace per event.

Units: bandwidths are MiB/s (2**20 bytes per second), memory GiB, CPU percent; every axis says so.

Aggregated syscall rows (``count`` reads or writes of one thread in one row, docs/run-format.md)
are drawn as their calls: in the bandwidth lane each call's share of the row's bytes goes to the
bin of its completion, the calls spread evenly over the stretch the row covers
(:func:`analysis.series.binned_calls`), so a bin finer than the tracer's 10 ms shows no comb; in
the process lane a row is one interval ending at its ``ts_ns`` and as long as its summed latency
(a thread's calls are sequential: the time the thread spent in them, drawn back to back); mean
latencies are per call (summed latency over summed ``count``).

Example::

    fig = timeline_figure([load_run("runs/A"), load_run("runs/B")])
    write_timeline([load_run("runs/A")], Path("runs/A/timeline.html"))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.basedatatypes import BaseTraceType

from analysis.figures import CONFIG, page_html
from analysis.processes import classify_processes
from analysis.series import (
    Bins,
    binned_calls,
    binned_mean,
    binned_rate,
    call_starts,
    default_bin_s,
)
from analysis.tables import (
    BLOCK_KINDS,
    container_rows,
    interval_rows,
    kind_mask,
    roles_by_host,
    step_intervals,
)
from core.atomic import atomic_write_text
from core.errors import UserError
from store.rundir import READ_KINDS, WRITE_KINDS, Run

#: Lane names, top to bottom, for each run.
LANES: tuple[str, ...] = (
    "phases",
    "accelerator",
    "syscall I/O",
    "processes",
    "block I/O",
    "page cache",
    "CPU",
    "memory",
    "network",
)

#: Above this many interval segments in one trace, adjacent segments are merged (see
#: :func:`merge_segments`): a browser stays responsive up to a few hundred thousand WebGL points.
MAX_SEGMENTS = 150_000
#: Step bars are drawn only up to this many per run (one bar per step; beyond it they are noise).
MAX_STEPS = 2_000
#: Page-cache rows are 100 ms intervals: a finer bin would show aliasing spikes, not detail.
CACHE_MIN_BIN_S = 0.1

MIB = float(2**20)
GIB = float(2**30)

# Reads blue and writes red, as in the published plots.
READ_COLOR = "#1f77b4"
WRITE_COLOR = "#d62728"
#: The phases drawn, in order: key -> (label, colour).
PHASES: Mapping[str, tuple[str, str]] = {
    "init": ("init", "#7f7f7f"),
    "epoch": ("training", "#2ca02c"),
    "eval": ("eval", "#9467bd"),
    "checkpoint": ("checkpoint", "#ff7f0e"),
}
STEP_COLORS = ("#98df8a", "#5fae57")
BUSY_COLOR = "#17becf"

# Lane geometry, in pixels.
_TITLE_GAP_PX = 34
_MARGIN = {"l": 170, "r": 230, "t": 40, "b": 60}


# ---------------------------------------------------------------------------------------------
# Segments


def segment_arrays(x0: np.ndarray, x1: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Interleave segments ``(x0, y) -> (x1, y)`` into one polyline with NaN gaps between them.

    One WebGL trace with ``3 n`` points draws ``n`` segments; NaN breaks the line like ``None``
    but keeps the arrays float64, so they are built without Python loops and sent base64-packed.
    """
    n = len(x0)
    xs = np.empty(3 * n)
    ys = np.empty(3 * n)
    xs[0::3], xs[1::3], xs[2::3] = x0, x1, np.nan
    ys[0::3], ys[1::3], ys[2::3] = y, y, np.nan
    return xs, ys


def merge_segments(
    key: np.ndarray, start: np.ndarray, end: np.ndarray, gap: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge, per ``key``, segments that overlap or are less than ``gap`` apart.

    This is how the timeline downsamples: at a gap below the width of a screen pixel the picture
    is unchanged (a run of back-to-back reads is one bar either way), unlike random sampling,
    which would drop isolated events. Vectorised: sort by (key, start), take a running maximum
    of the ends within each key, and start a new segment where a start lies beyond it.
    """
    if len(start) == 0:
        return key[:0], start[:0], end[:0]
    order = np.lexsort((start, key))
    k, s, e = key[order], start[order], end[order]
    new_key = np.empty(len(k), dtype=bool)
    new_key[0] = True
    new_key[1:] = k[1:] != k[:-1]
    # A running max that restarts at each key: offset each key's ends by a multiple of a span
    # larger than all times, so an earlier key's ends never exceed a later key's.
    rank = np.cumsum(new_key) - 1
    span = float(np.nanmax(e) - np.nanmin(s)) + gap + 1.0
    shift = rank * span
    running_end = np.maximum.accumulate(e - np.nanmin(s) + shift) - shift + np.nanmin(s)
    starts_new = new_key.copy()
    starts_new[1:] |= s[1:] > running_end[:-1] + gap
    first = np.flatnonzero(starts_new)
    return k[first], s[first], np.maximum.reduceat(e, first)


def _merged_segments(
    key: np.ndarray, start: np.ndarray, end: np.ndarray, span_s: float, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Segments, merged if there are more than ``limit``; the note says what was done."""
    n = len(start)
    if n <= limit:
        return key, start, end, ""
    gap = max(span_s, 1e-9) / 4000.0  # about one pixel of a wide screen at full zoom-out
    k, s, e = merge_segments(key, start, end, gap)
    # Still too many (hundreds of busy processes): coarser, a few times. Past the whole span
    # each key is one segment and merging cannot reduce further, so stop there.
    while len(s) > limit and gap < span_s:
        gap *= 4.0
        k, s, e = merge_segments(key, start, end, gap)
    return k, s, e, f"merged within {_fmt_s(gap)}: {n:,} → {len(s):,}"


def _segments_trace(
    key: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    span_s: float,
    name: str,
    color: str,
    width: float,
    hover: str,
) -> go.Scattergl:
    """One WebGL trace drawing the intervals ``[start, end]`` at height ``key``, merged when
    there are too many (:data:`MAX_SEGMENTS`; the trace's name then says so)."""
    key, start, end, note = _merged_segments(key, start, end, span_s, MAX_SEGMENTS)
    xs, ys = segment_arrays(start, end, key.astype(np.float64))
    return go.Scattergl(
        x=xs,
        y=ys,
        mode="lines",
        name=f"{name} ({note})" if note else name,
        line={"color": color, "width": width},
        hovertemplate=hover,
    )


def _fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


# ---------------------------------------------------------------------------------------------
# Lanes


@dataclasses.dataclass
class _Lane:
    """What one subplot row shows: traces (with a secondary-axis flag) and axis settings."""

    name: str
    height_px: int
    traces: list[tuple[BaseTraceType, bool]] = dataclasses.field(default_factory=list)
    yaxis: dict[str, Any] = dataclasses.field(default_factory=dict)
    yaxis2: dict[str, Any] | None = None  # secondary axis, when the lane has one
    empty_text: str = ""
    note: str = ""  # appended to the lane title

    def add(self, trace: BaseTraceType, secondary: bool = False) -> None:
        self.traces.append((trace, secondary))


@dataclasses.dataclass(frozen=True)
class _Clock:
    """A run's time base: seconds since ``origin_ns``; data extent and run duration."""

    origin_ns: int
    t0: float
    t1: float
    duration_s: float

    def seconds(self, ns: pd.Series | np.ndarray) -> np.ndarray:
        # Subtract in int64 first: float64 cannot hold boot-relative ns with ns precision.
        return (np.asarray(ns, dtype=np.int64) - self.origin_ns) * 1e-9


def _clock(run: Run) -> _Clock:
    events, samples, phases = run.events, run.samples, run.phases
    lows: list[int] = []
    highs: list[int] = []
    if len(events):
        lows.append(int((events["ts_ns"] - events["latency_ns"].clip(lower=0)).min()))
        highs.append(int(events["ts_ns"].max()))
    if len(samples):
        lows.append(int(samples["ts_ns"].min()))
        highs.append(int(samples["ts_ns"].max()))
    if len(phases):
        lows.append(int(phases["ts_ns"].min()))
        highs.append(int(phases["end_ns"].max()))
    origin = run.start_ns if run.start_ns is not None else (min(lows) if lows else 0)
    end = run.end_ns if run.end_ns is not None else (max(highs) if highs else origin)
    duration = max(0.0, (end - origin) * 1e-9)
    t0 = min([0.0] + [(v - origin) * 1e-9 for v in lows])
    t1 = max([duration] + [(v - origin) * 1e-9 for v in highs])
    return _Clock(origin, t0, t1, duration)


def _phase_lane(phases: pd.DataFrame, clock: _Clock) -> _Lane:
    lane = _Lane("phases", 120)
    categories: list[str] = []
    hover = "%{customdata[0]:.3f} – %{customdata[1]:.3f} s<extra>%{fullData.name}</extra>"
    for key, (label, colour) in PHASES.items():
        rows = interval_rows(phases, key)
        if len(rows) == 0:
            continue
        categories.append(label)
        start = clock.seconds(rows["ts_ns"])
        end = clock.seconds(rows["end_ns"])
        data = np.column_stack([start, end])
        lane.add(_bars(label, start, end, colour, data, hover))
    steps = step_intervals(phases)
    if len(steps) > MAX_STEPS:
        lane.note = f"{len(steps):,} steps not drawn (more than {MAX_STEPS:,})"
    elif len(steps):
        categories.append("steps")
        parity = (np.arange(len(steps)) % 2).astype(int)
        start = clock.seconds(steps["ts_ns"])
        end = clock.seconds(steps["end_ns"])
        # Alternate shades so that back-to-back steps stay distinguishable.
        colors = np.array(STEP_COLORS)[parity].tolist()
        data = np.column_stack([start, end, steps["epoch"], steps["step"]])
        hover = (
            "epoch %{customdata[2]} step %{customdata[3]}: "
            "%{customdata[0]:.3f} – %{customdata[1]:.3f} s<extra></extra>"
        )
        lane.add(_bars("steps", start, end, colors, data, hover))
    if not categories:
        lane.empty_text = "no phases (no MLLOG intervals)"
    lane.yaxis = {
        "type": "category",
        "categoryorder": "array",
        "categoryarray": categories,
        "autorange": "reversed",
    }
    return lane


def _bars(
    label: str, start: np.ndarray, end: np.ndarray, color: Any, data: np.ndarray, hover: str
) -> go.Bar:
    """Horizontal bars from ``start`` to ``end`` (s) in the category ``label``."""
    return go.Bar(
        base=start,
        x=end - start,
        y=[label] * len(start),
        orientation="h",
        name=label,
        marker={"color": color},
        customdata=data,
        hovertemplate=hover,
    )


def _accelerator_lane(phases: pd.DataFrame, samples: pd.DataFrame, clock: _Clock) -> _Lane:
    """Real GPU utilisation if sampled, else emulated busy intervals, else ``all_compute``."""
    lane = _Lane("accelerator", 130)
    metric = samples["metric"]
    util = samples[
        metric.str.fullmatch(r"gpu\d+_(?:util|mem_util)").to_numpy(dtype=bool, na_value=False)
    ]
    if len(util):
        for name, rows in util.sort_values("ts_ns").groupby("metric", sort=True):
            is_mem = str(name).endswith("_mem_util")
            lane.add(
                go.Scatter(
                    x=clock.seconds(rows["ts_ns"]),
                    y=rows["value"].to_numpy(),
                    mode="lines",
                    name=f"{name} %",
                    line={"dash": "dot" if is_mem else "solid", "width": 1.5},
                    # Memory-controller utilisation is secondary: one click away, not clutter.
                    visible="legendonly" if is_mem else True,
                )
            )
        lane.yaxis = {"title": {"text": "GPU %"}, "range": [0, 105]}
        return lane

    source = "accelerator_busy"
    busy = interval_rows(phases, source)
    if len(busy) == 0:
        source = "all_compute"
        busy = interval_rows(phases, source)
    if len(busy) == 0:
        lane.empty_text = "no accelerator data"
        lane.height_px = 70
        return lane
    rank = busy["rank"].to_numpy().clip(min=0).astype(np.int64)
    start = clock.seconds(busy["ts_ns"])
    end = clock.seconds(busy["end_ns"])
    ranks = np.unique(rank)
    # Busy fraction of the run per rank: the accelerator utilisation (AU) of DLIO/MLPerf Storage.
    busy_s = np.bincount(rank, weights=end - start, minlength=int(ranks.max()) + 1)
    lane.height_px = int(np.clip(24 * len(ranks) + 40, 70, 300))
    width = float(np.clip(0.5 * (lane.height_px - 30) / len(ranks), 2, 12))
    label = "busy" if source == "accelerator_busy" else "all_compute (busy)"
    span = clock.t1 - clock.t0
    hover = "%{x:.4f} s<extra>rank %{y}</extra>"
    lane.add(_segments_trace(rank, start, end, span, label, BUSY_COLOR, width, hover))
    ticktext = [
        f"rank {r} ({100 * busy_s[r] / clock.duration_s:.0f}% busy)"
        if clock.duration_s > 0
        else f"rank {r}"
        for r in ranks
    ]
    lane.yaxis = {
        "tickvals": ranks.tolist(),
        "ticktext": ticktext,
        "range": [ranks.max() + 0.7, ranks.min() - 0.7],
    }
    return lane


def _rate_trace(
    bins: Bins, clock: _Clock, rate: np.ndarray, name: str, color: str, dash: str = "solid"
) -> go.Scatter:
    """A step line: the value of each bin held over the bin (x = left edges, plus the end)."""
    return go.Scatter(
        x=bins.edges_s(clock.origin_ns),
        y=np.append(rate, rate[-1]),
        mode="lines",
        line={"shape": "hv", "color": color, "width": 1.2, "dash": dash},
        name=name,
        hovertemplate="%{x:.3f} s: %{y:.3g}<extra>%{fullData.name}</extra>",
    )


def _syscall_lane(events: pd.DataFrame, clock: _Clock, bins: Bins) -> _Lane:
    lane = _Lane("syscall I/O", 150)
    is_read = kind_mask(events, READ_KINDS)
    is_write = kind_mask(events, WRITE_KINDS)
    if not (is_read.any() or is_write.any()):
        lane.empty_text = "no read/write syscalls"
        return lane
    t = events["ts_ns"].to_numpy()
    nbytes = events["bytes"].to_numpy()
    calls = events["count"].to_numpy()
    starts = call_starts(events, is_read | is_write)  # an aggregated row's calls, spread
    for mask, name, color in ((is_read, "read", READ_COLOR), (is_write, "write", WRITE_COLOR)):
        total = binned_calls(t[mask], nbytes[mask], bins, starts[mask], calls[mask])
        rate = total / bins.width_s / MIB
        lane.add(_rate_trace(bins, clock, rate, name, color))
    lane.yaxis = {"title": {"text": "MiB/s"}, "rangemode": "tozero"}
    return lane


def _process_lane(events: pd.DataFrame, clock: _Clock) -> _Lane:
    lane = _Lane("processes", 120)
    io_mask = kind_mask(events, READ_KINDS + WRITE_KINDS)
    if not io_mask.any():
        lane.empty_text = "no per-process I/O (no read/write syscalls)"
        return lane
    procs = classify_processes(events)
    procs = procs[procs["io_events"] > 0].reset_index(drop=True)
    # Row of each event's process: look the pid up among the sorted pids (no per-event hashing).
    pids = procs["pid"].to_numpy()
    by_pid = np.argsort(pids)
    io_pid = events["pid"].to_numpy()[io_mask]
    row = by_pid[np.searchsorted(pids[by_pid], io_pid)]
    end = clock.seconds(events["ts_ns"].to_numpy()[io_mask])
    start = end - events["latency_ns"].to_numpy()[io_mask].clip(min=0) * 1e-9
    is_read = events["kind"].isin(READ_KINDS).to_numpy()[io_mask]

    n = len(procs)
    lane.height_px = int(np.clip(14 * n + 40, 110, 900))
    width = float(np.clip(0.6 * (lane.height_px - 30) / n, 1, 10))
    span = clock.t1 - clock.t0
    hover = "%{x:.4f} s<extra>%{fullData.name}</extra>"
    for mask, name, color in ((is_read, "read", READ_COLOR), (~is_read, "write", WRITE_COLOR)):
        if mask.any():
            trace = _segments_trace(
                row[mask], start[mask], end[mask], span, name, color, width, hover
            )
            lane.add(trace)
    ticktext = [
        f"{g} {p} {c}"
        for g, p, c in zip(procs["group"], procs["pid"], procs["comm"].fillna("?"), strict=True)
    ]
    lane.yaxis = {
        "tickvals": list(range(n)),
        "ticktext": ticktext,
        "range": [n - 0.5, -0.5],
        "tickfont": {"size": 9},
    }
    return lane


def _block_lane(events: pd.DataFrame, clock: _Clock, bins: Bins) -> _Lane:
    lane = _Lane("block I/O", 150)
    is_read = kind_mask(events, ("block_read",))
    is_write = kind_mask(events, ("block_write",))
    is_block = kind_mask(events, BLOCK_KINDS)
    if not is_block.any():
        lane.empty_text = "no block I/O events"
        return lane
    t = events["ts_ns"].to_numpy()
    nbytes = events["bytes"].to_numpy()
    for mask, name, color in (
        (is_read, "block read", READ_COLOR),
        (is_write, "block write", WRITE_COLOR),
    ):
        rate = binned_rate(t[mask], nbytes[mask], bins) / MIB
        lane.add(_rate_trace(bins, clock, rate, name, color))
    # Per request: a row's latency_ns is the sum over its ``count`` requests; 0: a request whose
    # completion no probe saw (docs/run-format.md), left out.
    latency = events["latency_ns"].to_numpy()
    timed = is_block & (latency > 0)
    latency_ms = latency[timed] * 1e-6
    mean = binned_mean(t[timed], latency_ms, bins, events["count"].to_numpy()[timed])
    trace = _rate_trace(bins, clock, mean, "mean latency (ms)", "#555555", dash="dot")
    lane.add(trace, secondary=True)
    lane.yaxis = {"title": {"text": "MiB/s (device)"}, "rangemode": "tozero"}
    lane.yaxis2 = {"title": {"text": "ms"}, "rangemode": "tozero", "showgrid": False}
    return lane


def _cache_lane(events: pd.DataFrame, clock: _Clock, bins: Bins) -> _Lane:
    lane = _Lane("page cache", 130)
    is_add = kind_mask(events, ("cache_add",))
    is_delete = kind_mask(events, ("cache_delete",))
    # pages of memory file systems (/dev/shm: the loader's batches), apart from file data
    is_shm_add = kind_mask(events, ("shm_add",))
    is_shm_delete = kind_mask(events, ("shm_delete",))
    if not (is_add.any() or is_delete.any() or is_shm_add.any() or is_shm_delete.any()):
        lane.empty_text = "no page-cache events"
        return lane
    cache_bins = bins
    if bins.width_ns < CACHE_MIN_BIN_S * 1e9:
        cache_bins = Bins.covering(clock.origin_ns, clock.t0, clock.t1, CACHE_MIN_BIN_S)
        lane.note = f"binned {CACHE_MIN_BIN_S * 1e3:.0f} ms (the tracer's interval)"
    t = events["ts_ns"].to_numpy()
    pages = events["count"].to_numpy()
    for mask, name, color, dash in (
        (is_add, "misses (cache_add)", READ_COLOR, "solid"),
        (is_delete, "evictions (cache_delete)", WRITE_COLOR, "solid"),
        (is_shm_add, "shared memory in (shm_add)", READ_COLOR, "dot"),
        (is_shm_delete, "shared memory freed (shm_delete)", WRITE_COLOR, "dot"),
    ):
        if dash != "solid" and not mask.any():
            continue  # runs traced before shared memory was counted apart
        rate = binned_rate(t[mask], pages[mask], cache_bins)
        lane.add(_rate_trace(cache_bins, clock, rate, name, color, dash=dash))
    lane.yaxis = {"title": {"text": "pages/s"}, "rangemode": "tozero"}
    return lane


def _sample_traces(
    samples: pd.DataFrame, clock: _Clock, metrics: Mapping[str, str], scale: float = 1.0
) -> dict[str, go.Scatter]:
    """One line per metric present in ``samples``; ``metrics`` maps metric -> legend name."""
    rows = samples[samples["metric"].isin(list(metrics))]
    traces: dict[str, go.Scatter] = {}
    for metric, group in rows.sort_values("ts_ns").groupby("metric", sort=False):
        traces[str(metric)] = go.Scatter(
            x=clock.seconds(group["ts_ns"]),
            y=group["value"].to_numpy() * scale,
            mode="lines",
            name=metrics[str(metric)],
            line={"width": 1.3},
            hovertemplate="%{x:.2f} s: %{y:.3g}<extra>%{fullData.name}</extra>",
        )
    return traces


def _cpu_lane(samples: pd.DataFrame, clock: _Clock) -> _Lane:
    lane = _Lane("CPU", 150)
    container = _sample_traces(samples, clock, {"container_cpu": "container (% of one core)"})
    host = _sample_traces(
        samples,
        clock,
        {
            "host_cpu_user": "host user",
            "host_cpu_system": "host system",
            "host_cpu_iowait": "host iowait",
            "host_cpu_idle": "host idle",
        },
    )
    if not container and not host:
        lane.empty_text = "no CPU samples"
        return lane
    for trace in container.values():
        trace.line.color = "#000000"
        lane.add(trace)
    for metric, trace in host.items():
        trace.line.dash = "dot"
        if metric == "host_cpu_idle":
            trace.visible = "legendonly"  # the complement of the others; shown on demand
        lane.add(trace, secondary=True)
    # The two scales differ (container: % of one core, up to 100 x cores; host: % of all cores).
    lane.yaxis = {"title": {"text": "% of one core"}, "rangemode": "tozero"}
    lane.yaxis2 = {"title": {"text": "host %"}, "range": [0, 105], "showgrid": False}
    return lane


def _samples_lane(
    name: str,
    samples: pd.DataFrame,
    clock: _Clock,
    metrics: Mapping[str, str],
    unit: tuple[str, float],
    empty_text: str,
    colors: Mapping[str, str] | None = None,
) -> _Lane:
    """A lane of a line per sampled metric (``metrics``: metric -> label), in ``unit`` (its
    name, and how many of the samples' units make one), coloured by ``colors`` where it names
    the metric."""
    lane = _Lane(name, 130)
    traces = _sample_traces(samples, clock, metrics, scale=1 / unit[1])
    if not traces:
        lane.empty_text = empty_text
        return lane
    for metric, trace in traces.items():
        if colors and metric in colors:
            trace.line.color = colors[metric]
        lane.add(trace)
    lane.yaxis = {"title": {"text": unit[0]}, "rangemode": "tozero"}
    return lane


def _memory_lane(samples: pd.DataFrame, clock: _Clock) -> _Lane:
    metrics = {
        "container_mem_rss": "rss (anon)",
        "container_mem_cache": "page cache (file)",
        "container_mem_shm": "shared memory (shm)",
    }
    return _samples_lane("memory", samples, clock, metrics, ("GiB", GIB), "no memory samples")


def _network_lane(samples: pd.DataFrame, clock: _Clock) -> _Lane:
    return _samples_lane(
        "network",
        samples,
        clock,
        {"container_net_rx": "received", "container_net_tx": "sent"},
        ("MiB/s", MIB),
        "no network samples (a run of one container has no network)",
        {"container_net_rx": READ_COLOR, "container_net_tx": WRITE_COLOR},
    )


@dataclasses.dataclass(frozen=True)
class LaneGroup:
    """What one group of lanes draws: the rows of one container of a run, with the host-wide
    rows (null ``container``: host CPU, block requests of no container) as context; or, for a
    run of one container, every row of the run (``role`` None)."""

    role: str | None
    events: pd.DataFrame
    samples: pd.DataFrame
    phases: pd.DataFrame
    #: The host the container ran on, in a run across several hosts (else None).
    host: str | None = None


def lane_groups(run: Run) -> list[LaneGroup]:
    """One :class:`LaneGroup` per container of ``run``, in the manifest's order; a single
    group of the whole run when it has one container (or none recorded). A run across
    several hosts has its groups grouped by host (the hosts in the manifest's order), each
    with the host-wide rows of its own host."""
    roles = roles_by_host(run)
    if len(roles) <= 1:
        return [LaneGroup(None, run.events, run.samples, run.phases)]
    placed = run.placement
    parts = {}
    for name, frame in (("events", run.events), ("samples", run.samples), ("phases", run.phases)):
        parts[name] = []
        for role, rows in container_rows(frame, roles, host=True):
            if role in placed:  # host-wide rows of the container's own host only
                rows = rows & (frame["host"] == placed[role]).fillna(False).to_numpy()
            parts[name].append(frame[rows])
    return [
        LaneGroup(
            role, parts["events"][i], parts["samples"][i], parts["phases"][i], placed.get(role)
        )
        for i, role in enumerate(roles)
    ]


def _group_lanes(group: LaneGroup, clock: _Clock, bin_s: float) -> list[_Lane]:
    bins = Bins.covering(clock.origin_ns, clock.t0, clock.t1, bin_s)
    events, samples, phases = group.events, group.samples, group.phases
    lanes = [
        _phase_lane(phases, clock),
        _accelerator_lane(phases, samples, clock),
        _syscall_lane(events, clock, bins),
        _process_lane(events, clock),
        _block_lane(events, clock, bins),
        _cache_lane(events, clock, bins),
        _cpu_lane(samples, clock),
        _memory_lane(samples, clock),
        _network_lane(samples, clock),
    ]
    assert tuple(lane.name for lane in lanes) == LANES
    lanes[2].note = f"binned {_fmt_s(bin_s)}, by completion time"
    device = (
        "whole device, incl. writeback"
        if group.role is None
        else f"issued by {group.role} or by no container (writeback)"
    )
    lanes[4].note = f"binned {_fmt_s(bin_s)}; {device}"
    return lanes


def _run_heading(run: Run, role: str | None, host: str | None = None) -> str:
    status = "" if run.status == "completed" else f" · status {run.status}"
    missing = f" · missing {', '.join(sorted(run.missing))}" if run.missing else ""
    where = "" if host is None else f" · host <b>{host}</b>"
    container = "" if role is None else f" · container <b>{role}</b>"
    return f"<b>{run.run_id}</b> ({run.workload}, {run.variant}){where}{container}{status}{missing}"


# ---------------------------------------------------------------------------------------------
# Figure


def timeline_figure(runs: Sequence[Run], bin_s: float | None = None) -> go.Figure:
    """The timeline of ``runs``, stacked top to bottom, sharing one x axis (see module doc).

    ``bin_s`` is the bin of the bandwidth lanes; by default one round size for all runs giving
    ~1000 bins over the longest run (see :func:`default_bin_s`), so runs compare bin for bin.
    ``fig.layout.meta`` records ``bin_s`` and ``lanes``: per subplot row, top to bottom,
    ``{"row", "run", "container", "host", "lane", "xaxis", "yaxis", "yaxis2"}`` (axis
    references such as ``"x3"``, ``yaxis2`` null when the lane has no secondary axis;
    ``container`` the role of the lane group, null for a run of one container; ``host`` its
    host in a run across hosts, else null). A run of several containers has
    one group of :data:`LANES` per container. Empty tables give labelled empty lanes; no runs
    gives an empty figure.
    """
    if not runs:
        layout = {
            "annotations": [{"text": "no runs", "showarrow": False}],
            "meta": {"lanes": [], "bin_s": None},
        }
        return go.Figure(layout=layout)
    clocks = [_clock(run) for run in runs]
    if bin_s is None:
        bin_s = default_bin_s(max(c.t1 - c.t0 for c in clocks))
    elif not bin_s > 0:
        raise UserError(f"bin size must be a positive number of seconds, got {bin_s!r}")
    lanes: list[_Lane] = []
    titles: list[str] = []
    owners: list[tuple[str, str | None, str | None]] = []
    for run, clock in zip(runs, clocks, strict=True):
        # A run of several containers: one group of lanes per container, on the run's clock.
        for group in lane_groups(run):
            heading = _run_heading(run, group.role, group.host)
            for i, lane in enumerate(_group_lanes(group, clock, bin_s)):
                title = f"{lane.name} · {lane.note}" if lane.note else lane.name
                titles.append(f"{heading} — {title}" if i == 0 else title)
                owners.append((run.run_id, group.role, group.host))
                lanes.append(lane)
    t0 = min(c.t0 for c in clocks)
    t1 = max(c.t1 for c in clocks)
    pad = 0.01 * max(t1 - t0, 1e-3)
    traces, layout = _stack_lanes(lanes, titles, owners, (t0 - pad, t1 + pad))
    layout["meta"]["bin_s"] = bin_s
    # One Figure built from plain dicts: plotly validates the whole layout once, which is many
    # times faster than make_subplots followed by per-row update calls.
    return go.Figure(data=traces, layout=layout)


def _stack_lanes(
    lanes: Sequence[_Lane],
    titles: Sequence[str],
    owners: Sequence[tuple[str, str | None, str | None]],
    x_range: tuple[float, float],
) -> tuple[list[BaseTraceType], dict[str, Any]]:
    """Lay lanes out as rows of one column: row ``r`` uses axes ``x<r>``/``y<r>``; secondary y
    axes are numbered after the rows. Row heights are in pixels, so a lane keeps its height
    whatever the number of runs. ``owners``: (run id, container role or None, host or None)
    per lane."""
    n = len(lanes)
    plot_px = sum(lane.height_px for lane in lanes) + _TITLE_GAP_PX * (n - 1)
    x_domain = [0.0, 0.94]  # room on the right for secondary axes, the same for every row
    per_run = len(LANES)
    layout: dict[str, Any] = {
        "height": plot_px + _MARGIN["t"] + _MARGIN["b"],
        "margin": _MARGIN,
        "barmode": "overlay",  # bars of different phases never share a slot
        "hovermode": "closest",
        "template": "plotly_white",
        "meta": {"lanes": []},
    }
    annotations: list[dict[str, Any]] = []
    traces: list[BaseTraceType] = []
    top = 1.0
    next_secondary = n + 1
    for row, lane in enumerate(lanes, start=1):
        high = top
        low = max(0.0, high - lane.height_px / plot_px)
        top = low - _TITLE_GAP_PX / plot_px
        x_ref, y_ref = _axis_ref("x", row), _axis_ref("y", row)
        x_axis: dict[str, Any] = {
            "domain": x_domain,
            "anchor": y_ref,
            "range": list(x_range),
            "showgrid": True,
            # Each lane group's bottom lane shows the time labels; the very bottom one names
            # the axis.
            "showticklabels": row % per_run == 0,
        }
        if row > 1:
            x_axis["matches"] = "x"  # one time axis: zooming any lane zooms them all
        if row == n:
            x_axis["title"] = {"text": "seconds since workload release (manifest start_ns)"}
        layout[_axis_name("x", row)] = x_axis
        # Zoom and pan along time only, except in the process lane (hundreds of rows possible).
        layout[_axis_name("y", row)] = {
            "domain": [low, high],
            "anchor": x_ref,
            "fixedrange": lane.name != "processes",
            **lane.yaxis,
        }
        y2_ref = None
        if lane.yaxis2 is not None:
            y2_ref = _axis_ref("y", next_secondary)
            layout[_axis_name("y", next_secondary)] = {
                "overlaying": y_ref,
                "anchor": x_ref,
                "side": "right",
                "fixedrange": True,
                **lane.yaxis2,
            }
            next_secondary += 1
        legend = "legend" if row == 1 else f"legend{row}"
        for trace, secondary in lane.traces:
            trace.update(xaxis=x_ref, yaxis=y2_ref if secondary else y_ref, legend=legend)
            traces.append(trace)
        if not lane.traces:
            # plotly draws no axes for a lane no trace refers to, and a note placed in them
            # lands elsewhere (over the first lane): an empty trace keeps the lane in its place
            traces.append(_PLACEHOLDER(xaxis=x_ref, yaxis=y_ref))
        # One legend per lane, beside it, so each legend only lists what its lane shows.
        layout[legend] = {
            "x": 1.0,
            "xanchor": "left",
            "y": high,
            "yanchor": "top",
            "font": {"size": 10},
            "bgcolor": "rgba(255,255,255,0)",
        }
        annotations.append(
            {
                "text": titles[row - 1],
                "xref": "paper",
                "yref": "paper",
                "x": 0.0,
                "y": high,
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"size": 12},
            }
        )
        if lane.empty_text:
            annotations.append(
                {
                    "text": lane.empty_text,
                    "xref": f"{x_ref} domain",
                    "yref": f"{y_ref} domain",
                    "x": 0.5,
                    "y": 0.5,
                    "showarrow": False,
                    "font": {"color": "#888888"},
                }
            )
        layout["meta"]["lanes"].append(
            {
                "row": row,
                "run": owners[row - 1][0],
                "container": owners[row - 1][1],
                "host": owners[row - 1][2],
                "lane": lane.name,
                "xaxis": x_ref,
                "yaxis": y_ref,
                "yaxis2": y2_ref,
            }
        )
    layout["annotations"] = annotations
    return traces, layout


def _PLACEHOLDER(**axes: str) -> go.Scatter:  # noqa: N802
    """A trace with no points, named ``placeholder``: it draws nothing and lists nothing."""
    return go.Scatter(x=[], y=[], name="placeholder", showlegend=False, hoverinfo="skip", **axes)


def _axis_ref(letter: str, index: int) -> str:
    """Plotly's trace-side axis reference: ``x``, ``x2``, ..."""
    return letter if index == 1 else f"{letter}{index}"


def _axis_name(letter: str, index: int) -> str:
    """Plotly's layout key for an axis: ``xaxis``, ``xaxis2``, ..."""
    return f"{letter}axis" if index == 1 else f"{letter}axis{index}"


def write_timeline(runs: Sequence[Run], out_path: Path, bin_s: float | None = None) -> Path:
    """Write the timeline of ``runs`` as an HTML page and return its path.

    The page loads the shared plotly.js beside it (:func:`analysis.figures.page_html`: no CDN,
    it opens offline); it is written to a temporary file in the same directory and renamed, so a
    reader never sees half a file.
    """
    out_path = Path(out_path)
    fig = timeline_figure(runs, bin_s=bin_s)
    html = page_html(fig, out_path, config={**CONFIG, "scrollZoom": True})
    atomic_write_text(out_path, html, fsync=True)
    return out_path
