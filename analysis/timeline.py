"""The timeline plot: what a run did over time, one lane per resource, runs stacked.

For each run, top to bottom (the published study's timeline, reordered so that cause is above
effect): phases, accelerator, syscall I/O bandwidth, per-process I/O intervals, block I/O, page
cache, CPU, memory. All lanes share one x axis: seconds since the run's ``start_ns`` (the moment
the workload was released), so two runs (real vs emulated) line up from their starts.

Everything is a pure function from DataFrames (``docs/run-format.md``) to plotly objects, and is
vectorised: millions of events are binned with ``np.bincount`` and drawn as a few WebGL traces
whose segments are separated by NaN gaps (the vectorised form of plotly's ``None`` separators),
never as one shape or trace per event.

Units: bandwidths are MiB/s (2**20 bytes per second), memory GiB, CPU percent; every axis says so.

Example::

    fig = timeline_figure([load_run("runs/A"), load_run("runs/B")])
    write_timeline([load_run("runs/A")], Path("runs/A/timeline.html"))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.basedatatypes import BaseTraceType

from core.atomic import atomic_write_text
from core.errors import UserError
from core.rundir import Run

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
)

READ_KINDS: tuple[str, ...] = ("read", "pread64", "readv")
WRITE_KINDS: tuple[str, ...] = ("write", "pwrite64", "writev")
BLOCK_KINDS: tuple[str, ...] = ("block_read", "block_write", "block_other")
PROCESS_GROUPS: tuple[str, ...] = ("main", "loader worker", "other")

#: Process names that identify a data-loader worker (comm is at most 15 characters).
#: PyTorch names its DataLoader worker processes ``pt_data_worker``.
WORKER_COMM_PREFIXES: tuple[str, ...] = ("pt_data_worker",)

#: Above this many interval segments in one trace, adjacent segments are merged (see
#: :func:`merge_segments`): a browser stays responsive up to a few hundred thousand WebGL points.
MAX_SEGMENTS = 150_000
#: Step bars are drawn only up to this many per run (one bar per step; beyond it they are noise).
MAX_STEPS = 2_000
#: Refuse bin sizes that would make more bins than this per run.
MAX_BINS = 200_000
#: Page-cache rows are 100 ms intervals: a finer bin would show aliasing spikes, not detail.
CACHE_MIN_BIN_S = 0.1

MIB = float(2**20)
GIB = float(2**30)

# Reads blue and writes red, as in the published plots.
READ_COLOR = "#1f77b4"
WRITE_COLOR = "#d62728"
PHASE_COLORS: Mapping[str, str] = {
    "init": "#7f7f7f",
    "epoch": "#2ca02c",
    "eval": "#9467bd",
    "checkpoint": "#ff7f0e",
}
PHASE_LABELS: Mapping[str, str] = {
    "init": "init",
    "epoch": "training",
    "eval": "eval",
    "checkpoint": "checkpoint",
}
STEP_COLORS = ("#98df8a", "#5fae57")
BUSY_COLOR = "#17becf"

# Lane geometry, in pixels.
_TITLE_GAP_PX = 34
_MARGIN = {"l": 170, "r": 230, "t": 40, "b": 60}


# ---------------------------------------------------------------------------------------------
# Binning


@dataclasses.dataclass(frozen=True)
class Bins:
    """Equal-width time bins ``[start_s + i * width_s, start_s + (i + 1) * width_s)``."""

    start_s: float
    width_s: float
    count: int

    @property
    def edges(self) -> np.ndarray:
        """``count + 1`` bin edges in seconds."""
        return self.start_s + self.width_s * np.arange(self.count + 1)

    @classmethod
    def covering(cls, t0: float, t1: float, width_s: float) -> Bins:
        """Bins of ``width_s`` aligned on multiples of the width, covering ``[t0, t1]``."""
        if not width_s > 0 or not math.isfinite(width_s):
            raise UserError(f"bin size must be a positive number of seconds, got {width_s!r}")
        start = math.floor(t0 / width_s) * width_s
        count = max(1, math.floor((t1 - start) / width_s) + 1)
        if count > MAX_BINS:
            raise UserError(
                f"a bin of {width_s:g} s makes {count:,} bins over {t1 - t0:.1f} s; "
                f"use a bin of at least {(t1 - t0) / MAX_BINS:.3g} s (or omit it for the default)"
            )
        return cls(start, width_s, count)


def default_bin_s(duration_s: float) -> float:
    """A round bin size (1, 2 or 5 times a power of ten) giving ~1000 bins over ``duration_s``.

    A 1-2-5 step is at most 2.5x, so the result always gives between 500 and 2000 bins.
    """
    if not duration_s > 0 or not math.isfinite(duration_s):
        return 1.0
    target = duration_s / 1000.0
    exponent = math.floor(math.log10(target))
    candidates = [m * 10.0**e for e in (exponent - 1, exponent, exponent + 1) for m in (1, 2, 5)]
    # Closest on a log scale, so 1000 bins is the centre of the allowed range.
    return min(candidates, key=lambda c: abs(math.log(c / target)))


def binned_rate(t_s: np.ndarray, weights: np.ndarray, bins: Bins) -> np.ndarray:
    """Sum of ``weights`` per bin divided by the bin width: a rate per second.

    Each value is attributed to the bin holding its time ``t_s`` (for syscalls the completion
    time, like iostat counts a request when it completes). Values outside the bins are dropped.
    """
    if len(t_s) == 0:
        return np.zeros(bins.count)
    idx = np.floor((np.asarray(t_s, dtype=np.float64) - bins.start_s) / bins.width_s)
    inside = (idx >= 0) & (idx < bins.count)
    sums = np.bincount(
        idx[inside].astype(np.int64),
        weights=np.asarray(weights, dtype=np.float64)[inside],
        minlength=bins.count,
    )
    return sums / bins.width_s


def _binned_mean(t_s: np.ndarray, values: np.ndarray, bins: Bins) -> np.ndarray:
    """Mean of ``values`` per bin; NaN (a gap in the line) where a bin has none."""
    total = binned_rate(t_s, values, bins) * bins.width_s
    count = binned_rate(t_s, np.ones(len(t_s)), bins) * bins.width_s
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


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


def _fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


# ---------------------------------------------------------------------------------------------
# Processes


def classify_processes(
    events: pd.DataFrame, worker_prefixes: Sequence[str] = WORKER_COMM_PREFIXES
) -> pd.DataFrame:
    """One row per process seen in ``events``, grouped as main, loader worker or other.

    The process tree comes from ``fork`` rows (``pid`` = parent, ``ret`` = child pid). Rules,
    in order:

    1. **loader worker** by name: a process any of whose threads has a comm starting with one
       of ``worker_prefixes`` (PyTorch names its DataLoader workers ``pt_data_worker``).
    2. **main**: the fork parents of those workers (the training processes, one per rank).
       Without named workers: the process that writes the most bytes (checkpoints, logs), or,
       if nothing is written, the one that reads the most.
    3. **loader worker**: a child forked by a main process that reads something and at least
       as many bytes as it writes, i.e. a dataset reader started under a generic name
       (multiprocessing, a DataLoader in an older PyTorch).
    4. **main**: a remaining process with the same comm as a main process that is neither a
       child nor the parent of one: the other ranks of a job whose ranks are siblings rather
       than children of rank 0 (Horovod/MPI); a launcher (torchrun) is a parent of mains and a
       writing helper forked by a main is its child, so both stay "other".
    5. **other**: everything else (launcher, shell, helpers such as nvidia-smi).

    Block rows are ignored (they are device-wide and their pid is whoever issued the request).
    Returns columns ``pid, comm, parent, group, read_bytes, write_bytes, io_events, first_ns``,
    sorted by group (main, loader worker, other) then by first appearance. The per-event work
    is vectorised; only the per-process rules (a few hundred processes at most) are Python.
    """
    columns = {
        "pid": "int32",
        "comm": "string",
        "parent": "int64",
        "group": pd.CategoricalDtype(list(PROCESS_GROUPS), ordered=True),
        "read_bytes": "int64",
        "write_bytes": "int64",
        "io_events": "int64",
        "first_ns": "int64",
    }
    empty = pd.DataFrame({c: pd.Series([], dtype=d) for c, d in columns.items()})
    if len(events) == 0:
        return empty
    # Work on column arrays filtered once, not on a filtered copy of the whole frame, and
    # aggregate with numpy over the inverse of np.unique (a few processes, millions of rows).
    kind = events["kind"]
    keep = ~kind.isin(BLOCK_KINDS).to_numpy()
    if not keep.any():
        return empty
    pid = events["pid"].to_numpy()[keep]
    is_read = kind.isin(READ_KINDS).to_numpy()[keep]
    is_write = kind.isin(WRITE_KINDS).to_numpy()[keep]
    nbytes = events["bytes"].to_numpy()[keep]
    ts = events["ts_ns"].to_numpy()[keep]
    uniq, inv = np.unique(pid, return_inverse=True)
    k = len(uniq)

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(inv, weights=values, minlength=k).round().astype(np.int64)

    def last_row(mask: np.ndarray) -> np.ndarray:
        """Per process, the index of its last row where ``mask`` holds, or -1."""
        last = np.full(k, -1, dtype=np.int64)
        rows = np.flatnonzero(mask)
        np.maximum.at(last, inv[rows], rows)
        return last

    first_ns = np.full(k, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_ns, inv, ts)
    # A run has a handful of distinct names: factorise them once, so that prefix tests and
    # "which name" work on integer codes instead of millions of strings (-1: no name).
    codes, names = pd.factorize(events["comm"])
    codes = codes[keep]
    names = pd.Index(names, dtype="string")
    # A process's name is its main thread's comm (other threads have names like pt_autograd_0);
    # fall back to the last comm seen when the main thread never appears.
    named_row = codes >= 0
    main_thread = events["tid"].to_numpy()[keep] == pid
    row = last_row(named_row & main_thread)
    row = np.where(row >= 0, row, last_row(named_row))
    code = np.where(row >= 0, codes[row], -1)
    comm = pd.array([pd.NA] * k, dtype="string")
    comm[code >= 0] = names.take(code[code >= 0]).to_numpy()
    procs = pd.DataFrame(
        {
            "read_bytes": total(np.where(is_read, nbytes, 0)),
            "write_bytes": total(np.where(is_write, nbytes, 0)),
            "io_events": total((is_read | is_write).astype(np.float64)),
            "first_ns": first_ns,
            "comm": comm,
        },
        index=pd.Index(uniq, name="pid"),
    )

    is_fork = (kind == "fork").to_numpy()[keep] & (events["ret"].to_numpy()[keep] > 0)
    # Later fork rows for the same child pid (pid reuse) do not override the first parent.
    parent_of: dict[int, int] = {}
    children = events["ret"].to_numpy()[keep][is_fork].tolist()
    for child, parent in zip(children, pid[is_fork].tolist(), strict=True):
        parent_of.setdefault(int(child), int(parent))
    worker_name = names.str.startswith(tuple(worker_prefixes)).to_numpy(dtype=bool, na_value=False)
    named = np.append(worker_name, False)[codes]  # code -1 picks the appended False
    workers = set(np.unique(pid[named]).tolist())

    # The rules below run once per process (a few hundred at most), not per event.
    pids = procs.index.to_numpy().tolist()
    mains = {parent_of[w] for w in workers if w in parent_of} - workers
    mains &= set(pids)
    if not mains:
        candidates = procs.drop(index=list(workers), errors="ignore")
        if len(candidates):
            column = "write_bytes" if candidates["write_bytes"].max() > 0 else "read_bytes"
            mains = {int(candidates[column].idxmax())}
    read_bytes = procs["read_bytes"].to_dict()
    write_bytes = procs["write_bytes"].to_dict()
    for p in pids:
        if (
            p not in mains
            and p not in workers
            and parent_of.get(p) in mains
            and read_bytes[p] > 0
            and read_bytes[p] >= write_bytes[p]
        ):
            workers.add(p)
    comm_of = {p: c for p, c in procs["comm"].items() if c is not pd.NA}
    main_comms = {comm_of[m] for m in mains if m in comm_of}
    parents_of_mains = {parent_of.get(m) for m in mains}
    for p in pids:
        if (
            p not in mains
            and p not in workers
            and p not in parents_of_mains
            and parent_of.get(p) not in mains
            and comm_of.get(p) in main_comms
        ):
            mains.add(p)

    group = np.full(len(pids), "other", dtype=object)
    pid_array = np.asarray(pids)
    group[np.isin(pid_array, list(workers))] = "loader worker"
    group[np.isin(pid_array, list(mains))] = "main"
    procs["group"] = group
    procs["parent"] = [parent_of.get(p, -1) for p in pids]
    out = procs.reset_index()
    out = out.astype({c: d for c, d in columns.items()})[list(columns)]
    return out.sort_values(["group", "first_ns", "pid"], kind="stable").reset_index(drop=True)


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


def _is(series: pd.Series, value: str) -> np.ndarray:
    """``series == value`` as a plain bool array (a null string is simply not equal)."""
    return series.eq(value).to_numpy(dtype=bool, na_value=False)


def _interval_rows(phases: pd.DataFrame, key: str) -> pd.DataFrame:
    return phases[_is(phases["kind"], "interval") & _is(phases["key"], key)]


def step_intervals(phases: pd.DataFrame) -> pd.DataFrame:
    """Step intervals (``ts_ns``, ``end_ns``, ``epoch``, ``step``) of the lowest rank.

    ``step`` interval rows when the workload logs them; otherwise derived from ``step_end``
    points: a step runs from the previous ``step_end`` of its epoch (for the first step, from the
    epoch's start; without one it is dropped) to its own ``step_end``.
    """
    cols = ["ts_ns", "end_ns", "epoch", "step"]
    steps = _interval_rows(phases, "step")
    if len(steps) == 0:
        ends = phases[_is(phases["kind"], "point") & _is(phases["key"], "step_end")]
        if len(ends) == 0:
            return pd.DataFrame(columns=cols)
        ends = ends[ends["rank"] == ends["rank"].min()].sort_values("ts_ns")
        # Nullable Int64 keeps boot-relative nanoseconds exact through the shift's gaps.
        start = ends["ts_ns"].astype("Int64").groupby(ends["epoch"]).shift(1)
        epoch_start = _interval_rows(phases, "epoch").groupby("epoch")["ts_ns"].min()
        start = start.fillna(ends["epoch"].map(epoch_start))
        steps = pd.DataFrame(
            {"ts_ns": start, "end_ns": ends["ts_ns"], "epoch": ends["epoch"], "step": ends["step"]}
        ).dropna(subset=["ts_ns"])
        return steps.astype({"ts_ns": "int64", "end_ns": "int64"})[cols]
    return steps[steps["rank"] == steps["rank"].min()][cols]


def _phase_lane(phases: pd.DataFrame, clock: _Clock) -> _Lane:
    lane = _Lane("phases", 120)
    categories: list[str] = []
    hover = "%{customdata[0]:.3f} – %{customdata[1]:.3f} s<extra>%{fullData.name}</extra>"
    for key, label in PHASE_LABELS.items():
        rows = _interval_rows(phases, key)
        if len(rows) == 0:
            continue
        categories.append(label)
        start = clock.seconds(rows["ts_ns"])
        end = clock.seconds(rows["end_ns"])
        lane.add(
            go.Bar(
                base=start,
                x=end - start,
                y=[label] * len(rows),
                orientation="h",
                name=label,
                marker={"color": PHASE_COLORS[key]},
                customdata=np.column_stack([start, end]),
                hovertemplate=hover,
            )
        )
    steps = step_intervals(phases)
    if len(steps) > MAX_STEPS:
        lane.note = f"{len(steps):,} steps not drawn (more than {MAX_STEPS:,})"
    elif len(steps):
        categories.append("steps")
        parity = (np.arange(len(steps)) % 2).astype(int)
        start = clock.seconds(steps["ts_ns"])
        end = clock.seconds(steps["end_ns"])
        lane.add(
            go.Bar(
                base=start,
                x=end - start,
                y=["steps"] * len(steps),
                orientation="h",
                name="steps",
                # Alternate shades so that back-to-back steps stay distinguishable.
                marker={"color": np.array(STEP_COLORS)[parity].tolist()},
                customdata=np.column_stack([start, end, steps["epoch"], steps["step"]]),
                hovertemplate="epoch %{customdata[2]} step %{customdata[3]}: "
                "%{customdata[0]:.3f} – %{customdata[1]:.3f} s<extra></extra>",
            )
        )
    if not categories:
        lane.empty_text = "no phases (no MLLOG intervals)"
    lane.yaxis = {
        "type": "category",
        "categoryorder": "array",
        "categoryarray": categories,
        "autorange": "reversed",
    }
    return lane


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
    busy = _interval_rows(phases, source)
    if len(busy) == 0:
        source = "all_compute"
        busy = _interval_rows(phases, source)
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
    key, start, end, note = _merged_segments(rank, start, end, clock.t1 - clock.t0, MAX_SEGMENTS)
    xs, ys = segment_arrays(start, end, key.astype(np.float64))
    lane.height_px = int(np.clip(24 * len(ranks) + 40, 70, 300))
    width = float(np.clip(0.5 * (lane.height_px - 30) / len(ranks), 2, 12))
    label = "busy" if source == "accelerator_busy" else "all_compute (busy)"
    lane.add(
        go.Scattergl(
            x=xs,
            y=ys,
            mode="lines",
            name=f"{label} ({note})" if note else label,
            line={"color": BUSY_COLOR, "width": width},
            hovertemplate="%{x:.4f} s<extra>rank %{y}</extra>",
        )
    )
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


def _kind_mask(events: pd.DataFrame, kinds: Sequence[str]) -> np.ndarray:
    if len(events) == 0:
        return np.zeros(0, dtype=bool)
    return events["kind"].isin(kinds).to_numpy()


def _rate_trace(
    bins: Bins, rate: np.ndarray, name: str, color: str, dash: str = "solid"
) -> go.Scatter:
    """A step line: the value of each bin held over the bin (x = left edges, plus the end)."""
    return go.Scatter(
        x=bins.edges,
        y=np.append(rate, rate[-1]),
        mode="lines",
        line={"shape": "hv", "color": color, "width": 1.2, "dash": dash},
        name=name,
        hovertemplate="%{x:.3f} s: %{y:.3g}<extra>%{fullData.name}</extra>",
    )


def _syscall_lane(events: pd.DataFrame, clock: _Clock, bins: Bins) -> _Lane:
    lane = _Lane("syscall I/O", 150)
    is_read = _kind_mask(events, READ_KINDS)
    is_write = _kind_mask(events, WRITE_KINDS)
    if not (is_read.any() or is_write.any()):
        lane.empty_text = "no read/write syscalls"
        return lane
    t = clock.seconds(events["ts_ns"])
    nbytes = events["bytes"].to_numpy()
    for mask, name, color in ((is_read, "read", READ_COLOR), (is_write, "write", WRITE_COLOR)):
        lane.add(_rate_trace(bins, binned_rate(t[mask], nbytes[mask], bins) / MIB, name, color))
    lane.yaxis = {"title": {"text": "MiB/s"}, "rangemode": "tozero"}
    return lane


def _process_lane(events: pd.DataFrame, clock: _Clock) -> _Lane:
    lane = _Lane("processes", 120)
    io_mask = _kind_mask(events, READ_KINDS + WRITE_KINDS)
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
    for mask, name, color in ((is_read, "read", READ_COLOR), (~is_read, "write", WRITE_COLOR)):
        if not mask.any():
            continue
        key, s, e, note = _merged_segments(row[mask], start[mask], end[mask], span, MAX_SEGMENTS)
        xs, ys = segment_arrays(s, e, key.astype(np.float64))
        lane.add(
            go.Scattergl(
                x=xs,
                y=ys,
                mode="lines",
                name=f"{name} ({note})" if note else name,
                line={"color": color, "width": width},
                hovertemplate="%{x:.4f} s<extra>%{fullData.name}</extra>",
            )
        )
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
    is_read = _kind_mask(events, ("block_read",))
    is_write = _kind_mask(events, ("block_write",))
    is_block = _kind_mask(events, BLOCK_KINDS)
    if not is_block.any():
        lane.empty_text = "no block I/O events"
        return lane
    t = clock.seconds(events["ts_ns"])
    nbytes = events["bytes"].to_numpy()
    for mask, name, color in (
        (is_read, "block read", READ_COLOR),
        (is_write, "block write", WRITE_COLOR),
    ):
        lane.add(_rate_trace(bins, binned_rate(t[mask], nbytes[mask], bins) / MIB, name, color))
    latency_ms = events["latency_ns"].to_numpy()[is_block] * 1e-6
    mean = _binned_mean(t[is_block], latency_ms, bins)
    lane.add(_rate_trace(bins, mean, "mean latency (ms)", "#555555", dash="dot"), secondary=True)
    lane.yaxis = {"title": {"text": "MiB/s (device)"}, "rangemode": "tozero"}
    lane.yaxis2 = {"title": {"text": "ms"}, "rangemode": "tozero", "showgrid": False}
    return lane


def _cache_lane(events: pd.DataFrame, clock: _Clock, bins: Bins) -> _Lane:
    lane = _Lane("page cache", 130)
    is_add = _kind_mask(events, ("cache_add",))
    is_delete = _kind_mask(events, ("cache_delete",))
    if not (is_add.any() or is_delete.any()):
        lane.empty_text = "no page-cache events"
        return lane
    cache_bins = bins
    if bins.width_s < CACHE_MIN_BIN_S:
        cache_bins = Bins.covering(clock.t0, clock.t1, CACHE_MIN_BIN_S)
        lane.note = f"binned {CACHE_MIN_BIN_S * 1e3:.0f} ms (the tracer's interval)"
    t = clock.seconds(events["ts_ns"])
    pages = events["count"].to_numpy()
    for mask, name, color in (
        (is_add, "misses (cache_add)", READ_COLOR),
        (is_delete, "evictions (cache_delete)", WRITE_COLOR),
    ):
        lane.add(
            _rate_trace(cache_bins, binned_rate(t[mask], pages[mask], cache_bins), name, color)
        )
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


def _memory_lane(samples: pd.DataFrame, clock: _Clock) -> _Lane:
    lane = _Lane("memory", 130)
    traces = _sample_traces(
        samples,
        clock,
        {"container_mem_rss": "rss (anon)", "container_mem_cache": "page cache (file)"},
        scale=1 / GIB,
    )
    if not traces:
        lane.empty_text = "no memory samples"
        return lane
    for trace in traces.values():
        lane.add(trace)
    lane.yaxis = {"title": {"text": "GiB"}, "rangemode": "tozero"}
    return lane


def _run_lanes(run: Run, clock: _Clock, bin_s: float) -> list[_Lane]:
    bins = Bins.covering(clock.t0, clock.t1, bin_s)
    events, samples, phases = run.events, run.samples, run.phases
    lanes = [
        _phase_lane(phases, clock),
        _accelerator_lane(phases, samples, clock),
        _syscall_lane(events, clock, bins),
        _process_lane(events, clock),
        _block_lane(events, clock, bins),
        _cache_lane(events, clock, bins),
        _cpu_lane(samples, clock),
        _memory_lane(samples, clock),
    ]
    assert tuple(lane.name for lane in lanes) == LANES
    lanes[2].note = f"binned {_fmt_s(bin_s)}, by completion time"
    lanes[4].note = f"binned {_fmt_s(bin_s)}; whole device, incl. writeback"
    return lanes


def _run_heading(run: Run) -> str:
    status = "" if run.status == "completed" else f" · status {run.status}"
    missing = f" · missing {', '.join(sorted(run.missing))}" if run.missing else ""
    return f"<b>{run.run_id}</b> ({run.workload}, {run.variant}){status}{missing}"


# ---------------------------------------------------------------------------------------------
# Figure


def timeline_figure(runs: Sequence[Run], bin_s: float | None = None) -> go.Figure:
    """The timeline of ``runs``, stacked top to bottom, sharing one x axis (see module doc).

    ``bin_s`` is the bin of the bandwidth lanes; by default one round size for all runs giving
    ~1000 bins over the longest run (see :func:`default_bin_s`), so runs compare bin for bin.
    ``fig.layout.meta`` records ``bin_s`` and ``lanes``: per subplot row, top to bottom,
    ``{"row", "run", "lane", "xaxis", "yaxis", "yaxis2"}`` (axis references such as ``"x3"``,
    ``yaxis2`` null when the lane has no secondary axis). Empty tables give labelled empty
    lanes; no runs gives an empty figure.
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
    run_ids: list[str] = []
    for run, clock in zip(runs, clocks, strict=True):
        heading = _run_heading(run)
        for i, lane in enumerate(_run_lanes(run, clock, bin_s)):
            title = f"{lane.name} · {lane.note}" if lane.note else lane.name
            titles.append(f"{heading} — {title}" if i == 0 else title)
            run_ids.append(run.run_id)
            lanes.append(lane)
    t0 = min(c.t0 for c in clocks)
    t1 = max(c.t1 for c in clocks)
    pad = 0.01 * max(t1 - t0, 1e-3)
    traces, layout = _stack_lanes(lanes, titles, run_ids, (t0 - pad, t1 + pad))
    layout["meta"]["bin_s"] = bin_s
    # One Figure built from plain dicts: plotly validates the whole layout once, which is many
    # times faster than make_subplots followed by per-row update calls.
    return go.Figure(data=traces, layout=layout)


def _stack_lanes(
    lanes: Sequence[_Lane],
    titles: Sequence[str],
    run_ids: Sequence[str],
    x_range: tuple[float, float],
) -> tuple[list[BaseTraceType], dict[str, Any]]:
    """Lay lanes out as rows of one column: row ``r`` uses axes ``x<r>``/``y<r>``; secondary y
    axes are numbered after the rows. Row heights are in pixels, so a lane keeps its height
    whatever the number of runs."""
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
            # Each run's bottom lane shows the time labels; the very bottom one names the axis.
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
                "run": run_ids[row - 1],
                "lane": lane.name,
                "xaxis": x_ref,
                "yaxis": y_ref,
                "yaxis2": y2_ref,
            }
        )
    layout["annotations"] = annotations
    return traces, layout


def _axis_ref(letter: str, index: int) -> str:
    """Plotly's trace-side axis reference: ``x``, ``x2``, ..."""
    return letter if index == 1 else f"{letter}{index}"


def _axis_name(letter: str, index: int) -> str:
    """Plotly's layout key for an axis: ``xaxis``, ``xaxis2``, ..."""
    return f"{letter}axis" if index == 1 else f"{letter}axis{index}"


def write_timeline(runs: Sequence[Run], out_path: Path, bin_s: float | None = None) -> Path:
    """Write the timeline of ``runs`` as one self-contained HTML file and return its path.

    plotly.js is embedded (no CDN), so the file opens offline; it is written to a temporary file
    in the same directory and renamed, so a reader never sees half a file.
    """
    fig = timeline_figure(runs, bin_s=bin_s)
    html = fig.to_html(
        include_plotlyjs=True,
        full_html=True,
        config={"displaylogo": False, "scrollZoom": True},
    )
    out_path = Path(out_path)
    atomic_write_text(out_path, html, fsync=True)
    return out_path
