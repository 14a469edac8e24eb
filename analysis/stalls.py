"""Data stalls by the differential method of DS-Analyzer (Mohan et al., VLDB 2021).

Three runs of the same training epoch, each traced (``experiments/stalls.py`` makes them):

1. ``synthetic``: data already in memory (``WorkloadConfig.synthetic``): one batch fed to every
   step, nothing read or decoded: the accelerators' maximum ingestion rate;
2. ``cached``: the real data, every file in the page cache: ``prep stall`` = its epoch time
   beyond (1) (decoding and transforming on the host's CPUs);
3. ``cold``: the real data, page cache dropped: ``fetch stall`` = its epoch time beyond (2)
   (waiting for storage).

A run's figures come from its measured epoch (:func:`epoch_figures`): the epoch interval of
its lowest rank, the ``load_batch_gpu`` (host-to-device) and ``all_compute`` durations of its
steps, its ``load_batch_mem`` waits, and from the trace the dataset's read syscalls (files
under the run's read-only mounts) and the block reads its containers issued that completed
inside the epoch.

The epoch's time is split (:func:`differential`) into ``compute`` and ``host_to_device`` (run
1's sums), ``other`` (the rest of run 1's epoch: the loop's own time and its first batch),
``prep_stall`` and ``fetch_stall``; a negative difference (two runs the host's noise made
cross) counts as 0 and adds a warning. Stall fractions are of the cold epoch, DS-Analyzer's
denominator.

What-if (``what_if_tool -q cache``): throughput predicted for a cached fraction f of the
dataset, 0-95 % in 5 % steps and 100 %. DS-Analyzer's model: storage delivers the epoch's S
bytes in ``f*S/M + (1-f)*S/D`` seconds, ``M`` the page cache's and ``D`` the disk's
throughput, and the job runs at ``min(cached speed, samples / that)``. Here ``M`` is the
dataset read calls' bytes over their summed time in the cached run (one reader's copy rate, as
DS-Analyzer's single-threaded memory benchmark) and ``D`` the block reads' bytes over the time
the device was busy (the union of their issue-to-completion intervals, as ``iostat``'s
utilisation) in the cold run: both from the trace, no constant. A second column interpolates
the measured epochs instead, ``T(f) = T_cached + (1-f) * fetch stall`` (the fetch stall
proportional to the bytes that miss). The cached-fraction sweep measures which is closer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.breakdown import dataset_reads
from analysis.tables import interval_rows, is_value, kind_mask
from core.errors import UserError
from core.versioned import Layout
from store.rundir import Run

#: Version of the layout of a stalls result (``stalls.json``) and of a stalls study's summary
#: (``study.json``); bump on any change, with a migration from the old one in :data:`STALLS`
#: and :data:`STALLS_STUDY`.
STALLS_SCHEMA = 2


def _created_at(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 body as version 2: the time it was made, ``created``, is ``created_at`` as in
    every versioned file (version 1 already named its ``kind``)."""
    data["created_at"] = data.pop("created", None)
    return data


#: ``stalls.json``: one measurement's result (``experiments/stalls.py`` writes and reads it).
STALLS = Layout(
    "stalls result",
    STALLS_SCHEMA,
    {1: _created_at},
    remedy="measure the stalls again",
    kind="stalls",
)
#: ``study.json`` of a stalls study: every model's summary.
STALLS_STUDY = Layout(
    "stalls study summary",
    STALLS_SCHEMA,
    {1: _created_at},
    remedy="run the study again",
    kind="stalls-study",
)
#: The three runs of the differential method, in order.
RUN_KINDS: tuple[str, ...] = ("synthetic", "cached", "cold")
#: Cached run: block reads above this fraction of its dataset bytes, and above
#: :data:`CACHED_SLACK`, mean it was not all cached.
CACHED_TOLERANCE = 0.01
#: Block reads a fully cached run may still make: code its processes fault in (a decoder's
#: library pages, a few MB at most), which the block trace cannot tell from the dataset.
CACHED_SLACK = 8 << 20
#: Cached percentages of the what-if table (DS-Analyzer: 0-95 in steps of 5, plus the maximum).
WHAT_IF_PERCENTS: tuple[int, ...] = (*range(0, 100, 5), 100)
_NS = 1e-9


@dataclasses.dataclass(frozen=True)
class EpochFigures:
    """One run's measured epoch (seconds, bytes, samples)."""

    run_id: str
    epoch: int
    steps: int
    samples: int
    epoch_s: float
    h2d_s: float
    compute_s: float
    data_wait_s: float
    dataset_bytes: int  # read by the dataset's read syscalls in the epoch
    read_s: float  # the summed time of those calls
    block_read_bytes: int  # read from block devices in the epoch
    block_busy_s: float  # time some block read was in flight

    @property
    def throughput(self) -> float:
        return self.samples / self.epoch_s if self.epoch_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "throughput": self.throughput}


def union_s(start_ns: np.ndarray, end_ns: np.ndarray) -> float:
    """Length of the union of the intervals, in seconds."""
    if not len(start_ns):
        return 0.0
    order = np.argsort(start_ns, kind="stable")
    start, end = start_ns[order], end_ns[order]
    reach = np.maximum.accumulate(end)
    # An interval opens a new stretch when it starts after everything before it ended.
    new = np.concatenate([[True], start[1:] > reach[:-1]])
    group = np.cumsum(new) - 1
    first = start[new]
    last = np.zeros(len(first), dtype=np.int64)
    np.maximum.at(last, group, end)
    return float(np.sum(last - first)) * _NS


def epoch_figures(run: Run, epoch: int = 1) -> EpochFigures:
    """The figures of ``epoch`` of ``run`` (its lowest rank's epoch interval and steps)."""
    phases = run.phases
    if len(phases) == 0:
        raise UserError(f"run {run.run_id} has no application events: trace a workload run")
    rank = int(phases["rank"].min())
    mine = phases[(phases["rank"] == rank) & (phases["epoch"] == epoch)]
    window = interval_rows(mine, "epoch")
    if len(window) == 0:
        raise UserError(f"run {run.run_id} has no epoch {epoch}: run it with --epochs {epoch}")
    start, end = int(window["ts_ns"].min()), int(window["end_ns"].max())

    def total(key: str) -> float:
        return float(interval_rows(mine, key)["duration_ns"].sum()) * _NS

    if not len(interval_rows(mine, "all_compute")):
        raise UserError(
            f"run {run.run_id} ({run.variant}) logs no step durations: the differential method "
            "needs the sleep or instrumented variant"
        )
    ends = mine[is_value(mine["kind"], "point") & is_value(mine["key"], "step_end")]
    samples = int(pd.to_numeric(ends["value"], errors="coerce").fillna(0).sum())
    h2d = total("load_batch_gpu")
    events = run.events
    reads = dataset_reads(run)
    inside = (reads["ts_ns"] > start) & (reads["ts_ns"] <= end)
    # The run's own block reads: the block trace is host-wide, and reads (readahead included)
    # are issued in the reading task's context, so in its container's cgroup.
    blocks = events[
        kind_mask(events, ("block_read",))
        & events["in_container"].fillna(False).to_numpy(dtype=bool)
    ]
    ts = blocks["ts_ns"].to_numpy(dtype=np.int64)
    keep = (ts > start) & (ts <= end)
    done = ts[keep]
    began = done - blocks["latency_ns"].to_numpy(dtype=np.int64)[keep]
    return EpochFigures(
        run_id=run.run_id,
        epoch=epoch,
        steps=len(ends),
        samples=samples,
        epoch_s=(end - start) * _NS,
        h2d_s=h2d,
        compute_s=total("all_compute") - h2d,
        data_wait_s=total("load_batch_mem"),
        dataset_bytes=int(reads.loc[inside, "bytes"].sum()),
        read_s=float(reads.loc[inside, "latency_ns"].sum()) * _NS,
        block_read_bytes=int(blocks["bytes"].to_numpy()[keep].sum()),
        block_busy_s=union_s(began, done),
    )


def is_fully_cached(run: EpochFigures) -> bool:
    """Whether ``run``'s epoch found its data in memory: its block reads are within
    :data:`CACHED_TOLERANCE` of the dataset bytes it read, or within :data:`CACHED_SLACK`."""
    allowed = max(CACHED_TOLERANCE * run.dataset_bytes, CACHED_SLACK)
    return run.block_read_bytes <= allowed


def what_if(
    samples: int,
    dataset_bytes: float,
    cached_speed: float,
    memory_bps: float,
    disk_bps: float,
    cached_s: float,
    fetch_stall_s: float,
) -> list[dict[str, float]]:
    """The what-if table (module doc): per cached percentage, DS-Analyzer's predicted
    throughput and the interpolated one, in samples/s."""
    rows = []
    for percent in WHAT_IF_PERCENTS:
        f = percent / 100
        seconds = 0.0
        if memory_bps > 0:
            seconds += f * dataset_bytes / memory_bps
        if disk_bps > 0:
            seconds += (1 - f) * dataset_bytes / disk_bps
        store = samples / seconds if seconds > 0 else float("inf")
        interpolated = cached_s + (1 - f) * fetch_stall_s
        rows.append(
            {
                "cached_percent": percent,
                "predicted_throughput": min(cached_speed, store),
                "interpolated_throughput": samples / interpolated if interpolated > 0 else 0.0,
            }
        )
    return rows


def differential(runs: Mapping[str, EpochFigures]) -> dict[str, Any]:
    """The stall analysis of the three runs (``synthetic``, ``cached``, ``cold``)."""
    missing = [k for k in RUN_KINDS if k not in runs]
    if missing:
        raise UserError(f"the differential method needs a {missing[0]} run")
    syn, cached, cold = (runs[k] for k in RUN_KINDS)
    if len({r.steps for r in (syn, cached, cold)}) != 1:
        raise UserError(
            "the three runs trained different numbers of steps "
            f"({syn.steps}, {cached.steps}, {cold.steps}): run them with the same settings"
        )
    warnings = []
    prep = cached.epoch_s - syn.epoch_s
    fetch = cold.epoch_s - cached.epoch_s
    if prep < 0:
        warnings.append(
            f"the cached epoch ({cached.epoch_s:.2f} s) was shorter than the synthetic one "
            f"({syn.epoch_s:.2f} s): prep stall taken as 0 (host noise, or no preprocessing)"
        )
    if fetch < 0:
        warnings.append(
            f"the cold epoch ({cold.epoch_s:.2f} s) was shorter than the cached one "
            f"({cached.epoch_s:.2f} s): fetch stall taken as 0"
        )
    prep, fetch = max(prep, 0.0), max(fetch, 0.0)
    fully_cached = is_fully_cached(cached)
    if not fully_cached:
        warnings.append(
            f"the cached run read {cached.block_read_bytes} bytes from disk during its epoch "
            f"({cached.block_read_bytes / max(cached.dataset_bytes, 1):.1%} of the dataset "
            "bytes it read): it was not fully cached (not enough free memory?)"
        )
    if cold.block_read_bytes == 0:
        warnings.append(
            "the cold run read nothing from disk: the cache was not dropped, so there is no "
            "fetch stall to measure"
        )
    other = max(syn.epoch_s - syn.compute_s - syn.h2d_s, 0.0)
    total = syn.compute_s + syn.h2d_s + other + prep + fetch
    memory_bps = cached.dataset_bytes / cached.read_s if cached.read_s > 0 else 0.0
    disk_bps = cold.block_read_bytes / cold.block_busy_s if cold.block_busy_s > 0 else 0.0
    return {
        "epoch": {
            "compute_s": syn.compute_s,
            "host_to_device_s": syn.h2d_s,
            "other_s": other,
            "prep_stall_s": prep,
            "fetch_stall_s": fetch,
            "total_s": total,
        },
        "throughput": {
            "ingestion": syn.throughput,
            "cached": cached.throughput,
            "cold": cold.throughput,
        },
        "fractions": {
            "prep_stall": prep / cold.epoch_s if cold.epoch_s > 0 else 0.0,
            "fetch_stall": fetch / cold.epoch_s if cold.epoch_s > 0 else 0.0,
        },
        "cache_check": {
            "cached_block_read_bytes": cached.block_read_bytes,
            "cached_dataset_bytes": cached.dataset_bytes,
            "fully_cached": bool(fully_cached),
            "cold_block_read_bytes": cold.block_read_bytes,
        },
        "storage": {
            "dataset_bytes": cold.dataset_bytes,
            "samples": cold.samples,
            "memory_bytes_per_s": memory_bps,
            "disk_bytes_per_s": disk_bps,
        },
        "max_achievable_throughput": cached.throughput,
        "what_if": what_if(
            cold.samples,
            cold.dataset_bytes,
            cached.throughput,
            memory_bps,
            disk_bps,
            cached.epoch_s,
            fetch,
        ),
        "runs": {k: runs[k].to_dict() for k in RUN_KINDS},
        "warnings": warnings,
    }


#: Colours of the parts of an epoch, in stacking order.
PART_COLOURS: Mapping[str, str] = {
    "compute_s": "#4C78A8",
    "host_to_device_s": "#72B7B2",
    "other_s": "#BAB0AC",
    "prep_stall_s": "#F58518",
    "fetch_stall_s": "#E45756",
}
PART_NAMES: Mapping[str, str] = {
    "compute_s": "compute",
    "host_to_device_s": "host-to-device",
    "other_s": "other",
    "prep_stall_s": "prep stall",
    "fetch_stall_s": "fetch stall",
}


def stalls_figure(result: Mapping[str, Any], title: str = "") -> go.Figure:
    """Epoch split, throughput of each run, and the what-if curve of one stalls result."""
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=("epoch time split (s)", "throughput (samples/s)", "what-if: cached %"),
    )
    epoch = result["epoch"]
    for key, colour in PART_COLOURS.items():
        fig.add_trace(
            go.Bar(x=["epoch"], y=[epoch[key]], name=PART_NAMES[key], marker_color=colour),
            row=1,
            col=1,
        )
    speeds = result["throughput"]
    fig.add_trace(
        go.Bar(
            x=list(speeds),
            y=list(speeds.values()),
            marker_color=["#54A24B", "#F58518", "#E45756"],
            showlegend=False,
        ),
        row=1,
        col=2,
    )
    table = result["what_if"]
    x = [r["cached_percent"] for r in table]
    for key, name, dash in (
        ("predicted_throughput", "DS-Analyzer model", "solid"),
        ("interpolated_throughput", "interpolated", "dot"),
    ):
        fig.add_trace(
            go.Scatter(x=x, y=[r[key] for r in table], name=name, line={"dash": dash}),
            row=1,
            col=3,
        )
    measured = result.get("sweep") or []
    if measured:
        fig.add_trace(
            go.Scatter(
                x=[100 * m["measured_fraction"] for m in measured],
                y=[m["throughput"] for m in measured],
                mode="markers",
                name="measured (sweep)",
                marker={"size": 10, "color": "black"},
            ),
            row=1,
            col=3,
        )
    fig.update_layout(barmode="stack", title=title, height=420, width=1250)
    return fig


def what_if_lines(result: Mapping[str, Any]) -> list[str]:
    """The what-if table as text lines (DS-Analyzer prints percent / speed rows)."""
    table = result["what_if"]
    head = "cached %  " + " ".join(f"{r['cached_percent']:>6d}" for r in table)
    model = "model     " + " ".join(f"{r['predicted_throughput']:6.0f}" for r in table)
    interp = "interp.   " + " ".join(f"{r['interpolated_throughput']:6.0f}" for r in table)
    return [
        f"max achievable: {result['max_achievable_throughput']:.1f} samples/s",
        head,
        model,
        interp,
    ]


def summary_lines(result: Mapping[str, Any]) -> list[str]:
    """A human summary of one stalls result."""
    e, t, f = result["epoch"], result["throughput"], result["fractions"]
    lines = [
        "epoch split: "
        + ", ".join(f"{PART_NAMES[k]} {e[k]:.2f} s" for k in PART_COLOURS)
        + f" (total {e['total_s']:.2f} s)",
        "throughput (samples/s): " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()),
        f"stall fractions of the cold epoch: prep {f['prep_stall']:.1%}, fetch "
        f"{f['fetch_stall']:.1%}",
    ]
    lines += what_if_lines(result)
    lines += [f"warning: {w}" for w in result.get("warnings", [])]
    return lines
