"""The grouping study's figures from its runs' traces (experiments/grouping.py runs the study
and says what it measures): one epoch's evidence (:func:`epoch_evidence`, :func:`run_evidence`),
the medians per layout (:func:`layout_rows`), and the results' table and figure
(:func:`table_lines`, :func:`grouping_figure`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.extents import DiskExtents
from analysis.samples import other_cpu_cores
from analysis.stalls import union_s
from analysis.studyrows import add_line, fmt, series
from analysis.tables import evaluations
from core.errors import UserError
from store.rundir import READ_KINDS, Run

_NS = 1e-9


# --------------------------------------------------------------------------------------------
# One epoch's evidence (pure functions of a run's tables)


def sequential_requests(blocks: pd.DataFrame) -> tuple[int, int]:
    """(sequential, with a predecessor) among block requests (``ts_ns``, ``latency_ns``,
    ``offset``, ``bytes``, ``dev``): in issue order per device, a request is sequential when
    it starts at the byte where the previous one ended; the first of each device has no
    predecessor."""
    if not len(blocks):
        return 0, 0
    frame = pd.DataFrame(
        {
            "dev": blocks["dev"].astype("string").fillna("").to_numpy(),
            "issue": blocks["ts_ns"].to_numpy(dtype=np.int64)
            - blocks["latency_ns"].to_numpy(dtype=np.int64),
            "offset": blocks["offset"].to_numpy(dtype=np.int64),
            "end": blocks["offset"].to_numpy(dtype=np.int64)
            + blocks["bytes"].to_numpy(dtype=np.int64),
        }
    ).sort_values(["dev", "issue"], kind="stable")
    same_dev = frame["dev"].eq(frame["dev"].shift(1)).to_numpy()
    follows = frame["offset"].to_numpy() == frame["end"].shift(1).to_numpy()
    return int((same_dev & follows).sum()), int(same_dev.sum())


def _is(series: pd.Series, value: str) -> np.ndarray:
    return (series.astype("string") == value).fillna(False).to_numpy(dtype=bool)


def epoch_evidence(
    events: pd.DataFrame,
    phases: pd.DataFrame,
    files: Iterable[str],
    extents: DiskExtents | None = None,
    epoch: int = 1,
) -> dict[str, Any]:
    """The figures of ``epoch`` (see the module doc) from a run's ``events`` and ``phases``;
    ``files`` are the container paths of the dataset's files (``/data/train/...``), ``extents``
    where they lie on the disk (None: the ``block_dataset_*`` figures are None)."""
    if not len(phases) or not (phases["rank"] >= 0).any():
        raise UserError("the run logged no training steps: trace the sleep or instrumented variant")
    rank = int(phases.loc[phases["rank"] >= 0, "rank"].min())
    mine = phases[(phases["rank"] == rank) & (phases["epoch"] == epoch)]
    interval = _is(mine["kind"], "interval")

    def durations(key: str) -> pd.DataFrame:
        return mine[interval & _is(mine["key"], key)]

    window = durations("epoch")
    if not len(window):
        raise UserError(f"the run has no epoch {epoch} of rank {rank}: it did not finish it")
    start, end = int(window["ts_ns"].min()), int(window["end_ns"].max())
    waits = durations("load_batch_mem").sort_values("step")
    compute = durations("all_compute")
    if not len(compute):
        raise UserError(
            "the run logs no all_compute intervals: trace the sleep or instrumented variant"
        )
    ends = mine[_is(mine["kind"], "point") & _is(mine["key"], "step_end")]
    samples = pd.to_numeric(ends["value"], errors="coerce").fillna(0).sum()

    ts = events["ts_ns"].to_numpy(dtype=np.int64)
    inside = (ts > start) & (ts <= end)
    paths = events["path"].astype("string")
    ours = paths.isin(set(files)).fillna(False).to_numpy(dtype=bool) & inside
    kind = events["kind"].astype("string")
    count = events["count"].to_numpy(dtype=np.int64)
    opened = ours & _is(kind, "openat") & (events["ret"].to_numpy() >= 0)
    read = ours & kind.isin(READ_KINDS).fillna(False).to_numpy(dtype=bool)
    reads = int(count[read].sum())
    read_bytes = int(events["bytes"].to_numpy(dtype=np.int64)[read].sum())
    # The container's block reads: those its processes issued, and (where the dataset's place
    # on the disk is known) any that read the dataset's blocks, since requests are also
    # dispatched from the block layer's worker threads (kblockd), outside the container.
    candidates = inside & _is(kind, "block_read")
    block = candidates & events["in_container"].fillna(False).to_numpy(dtype=bool)
    in_extents = np.zeros(len(events), dtype=np.int64)
    if extents is not None:
        in_extents = extents.event_bytes(events, candidates)
        block |= in_extents > 0
    blocks = events[block]
    block_reads = int(count[block].sum())
    block_bytes = int(blocks["bytes"].sum())
    sequential, paired = sequential_requests(blocks)
    issued = blocks["ts_ns"].to_numpy(dtype=np.int64) - blocks["latency_ns"].to_numpy(np.int64)
    latency = events["latency_ns"].to_numpy(dtype=np.int64)
    open_s, read_s = float(latency[opened].sum()) * _NS, float(latency[read].sum()) * _NS
    on_disk: dict[str, Any] = dict.fromkeys(
        ("block_dataset_reads", "block_dataset_bytes", "block_other_bytes"), None
    )
    on_disk["dataset_sequential_fraction"] = None
    if extents is not None:
        data_rows = in_extents > 0
        data_seq, data_paired = sequential_requests(events[data_rows])
        dataset_bytes = int(in_extents.sum())
        on_disk = {
            "block_dataset_reads": int(count[data_rows].sum()),
            "block_dataset_bytes": dataset_bytes,
            "block_other_bytes": block_bytes - dataset_bytes,
            "dataset_sequential_fraction": data_seq / data_paired if data_paired else math.nan,
        }
    runs = block_reads - sequential
    return {
        "epoch": epoch,
        "rank": rank,
        "steps": len(ends),
        "samples": int(samples),
        "epoch_s": (end - start) * _NS,
        "data_stall_s": float(waits["duration_ns"].sum()) * _NS,
        "first_wait_s": float(waits["duration_ns"].iloc[0]) * _NS if len(waits) else 0.0,
        "compute_s": float(compute["duration_ns"].sum()) * _NS,
        "opens": int(count[opened].sum()),
        "files_opened": int(paths[opened].nunique()),
        "reads": reads,
        "read_bytes": read_bytes,
        "open_s": open_s,
        "read_s": read_s,
        "io_s": open_s + read_s,
        "mean_read_bytes": read_bytes / reads if reads else math.nan,
        "block_reads": block_reads,
        "block_read_bytes": block_bytes,
        "mean_block_read_bytes": block_bytes / block_reads if block_reads else math.nan,
        "block_busy_s": union_s(issued, blocks["ts_ns"].to_numpy(dtype=np.int64)),
        "sequential_reads": sequential,
        "block_successors": paired,
        "sequential_fraction": sequential / paired if paired else math.nan,
        "mean_sequential_run_bytes": block_bytes / runs if runs else math.nan,
        **on_disk,
    }


def run_evidence(
    run: Run, files: Iterable[str], extents: DiskExtents | None = None
) -> dict[str, Any]:
    """:func:`epoch_evidence` of a loaded run's epoch 1, and :func:`other_cpu_cores` over it."""
    figures = epoch_evidence(run.events, run.phases, files, extents)
    phases = run.phases
    rank = phases[(phases["rank"] == figures["rank"]) & (phases["epoch"] == 1)]
    window = rank[_is(rank["kind"], "interval") & _is(rank["key"], "epoch")]
    cpus = int((run.manifest.get("host") or {}).get("cpus") or 0)
    figures["other_cpu_cores"] = other_cpu_cores(
        run.samples, cpus, int(window["ts_ns"].min()), int(window["end_ns"].max())
    )
    return figures


def accuracy_by_epoch(run: Run, files: Iterable[str]) -> list[dict[str, Any]]:
    """Per epoch of an accuracy run (rank 0): its seconds, the validation top-1, top-5 and loss
    after it (:func:`analysis.tables.evaluations`), and what it read of the training files
    (``files``, container paths) in the system calls of every process: successful opens, read
    calls and bytes."""
    phases, events = run.phases, run.events
    rank = phases[(phases["rank"] == 0).to_numpy(dtype=bool)]
    epochs = rank[_is(rank["kind"], "interval") & _is(rank["key"], "epoch")].sort_values("epoch")
    evals = {e["epoch"]: e for e in evaluations(phases)}
    ours = events["path"].astype("string").isin(set(files)).fillna(False).to_numpy(dtype=bool)
    kind = events["kind"].astype("string")
    ts = events["ts_ns"].to_numpy(dtype=np.int64)
    count = events["count"].to_numpy(dtype=np.int64)
    nbytes = events["bytes"].to_numpy(dtype=np.int64)
    opened = ours & _is(kind, "openat") & (events["ret"].to_numpy() >= 0)
    read = ours & kind.isin(READ_KINDS).fillna(False).to_numpy(dtype=bool)
    rows = []
    for epoch, start, end in zip(epochs["epoch"], epochs["ts_ns"], epochs["end_ns"], strict=True):
        inside = (ts >= start) & (ts <= end)
        result = evals.get(int(epoch), {})
        rows.append(
            {
                "epoch": int(epoch),
                "epoch_s": (int(end) - int(start)) * _NS,
                "top1": result.get("top1"),
                "top5": result.get("top5"),
                "loss": result.get("loss"),
                "opens": int(count[opened & inside].sum()),
                "reads": int(count[read & inside].sum()),
                "read_bytes": int(nbytes[read & inside].sum()),
            }
        )
    return rows


def accuracy_lines(accuracy: Sequence[Mapping[str, Any]]) -> list[str]:
    """The accuracy runs as a table (under 80 columns): per layout and epoch the validation
    top-1, top-5 and loss, the epoch's seconds and its opens and reads of the training files."""
    lines = [
        f"{'layout':>6} {'epoch':>5} {'top-1':>6} {'top-5':>6} {'loss':>7} {'epoch s':>8} "
        f"{'opens':>6} {'reads':>6} {'read MB':>8}"
    ]
    for run in accuracy:
        for e in run["epochs"]:
            lines.append(
                f"{run['layout']:>6} {e['epoch']:>5} {fmt(e['top1'], 3):>6} "
                f"{fmt(e['top5'], 3):>6} {fmt(e['loss'], 3):>7} {e['epoch_s']:>8.2f} "
                f"{e['opens']:>6} {e['reads']:>6} {e['read_bytes'] / 1e6:>8.1f}"
            )
    return lines


# --------------------------------------------------------------------------------------------
# Per layout, normalised, published

#: Figures of a layout: the median over its epochs (each run is one epoch).
MEAN_FIELDS = (
    "epoch_s",
    "data_stall_s",
    "first_wait_s",
    "compute_s",
    "steps",
    "samples",
    "opens",
    "reads",
    "read_bytes",
    "open_s",
    "read_s",
    "io_s",
    "block_reads",
    "block_read_bytes",
    "block_busy_s",
)
#: Medians per layout when every run has them (None without the dataset's extents).
OPTIONAL_MEAN_FIELDS = (
    "block_dataset_reads",
    "block_dataset_bytes",
    "block_other_bytes",
    "dataset_sequential_fraction",
)


def layout_rows(
    runs: Sequence[Mapping[str, Any]], layouts: Sequence[tuple[str, int]]
) -> list[dict[str, Any]]:
    """Per layout (in ``layouts`` order: (name, group size)), the medians of its runs'
    figures over its epochs (one disturbed epoch does not move them), the stall's spread, mean
    request sizes and sequentiality from the summed counts, the most CPU another job took
    (``other_cpu_cores_max``), and ``normalised_stall`` and ``normalised_io`` (its stall and its time in the
    dataset's opens and reads over the folder layout's)."""
    frame = pd.DataFrame(list(runs))
    rows = []
    for name, group_size in layouts:
        mine = frame[frame["layout"] == name] if len(frame) else frame
        if not len(mine):
            continue
        row: dict[str, Any] = {"layout": name, "group_size": group_size, "epochs": len(mine)}
        for field in MEAN_FIELDS:
            row[field] = float(mine[field].median())
        for field in OPTIONAL_MEAN_FIELDS:
            values = mine[field] if field in mine else pd.Series([None])
            known = values.notna().all()
            row[field] = float(pd.to_numeric(values).median()) if known else None
        other = mine["other_cpu_cores"] if "other_cpu_cores" in mine else pd.Series([math.nan])
        row["other_cpu_cores_max"] = float(other.max())
        row["data_stall_min_s"] = float(mine["data_stall_s"].min())
        row["data_stall_max_s"] = float(mine["data_stall_s"].max())
        reads, blocks = mine["reads"].sum(), mine["block_reads"].sum()
        row["mean_read_bytes"] = float(mine["read_bytes"].sum() / reads) if reads else math.nan
        row["mean_block_read_bytes"] = (
            float(mine["block_read_bytes"].sum() / blocks) if blocks else math.nan
        )
        sequential, paired = mine["sequential_reads"].sum(), mine["block_successors"].sum()
        row["sequential_fraction"] = float(sequential / paired) if paired else math.nan
        runs = blocks - sequential
        row["mean_sequential_run_bytes"] = (
            float(mine["block_read_bytes"].sum() / runs) if runs else math.nan
        )
        rows.append(row)
    folder = next((r for r in rows if r["group_size"] == 0), None)
    for row in rows:
        for field, key in (("data_stall_s", "normalised_stall"), ("io_s", "normalised_io")):
            base = folder[field] if folder else math.nan
            row[key] = row[field] / base if base > 0 else math.nan
    return rows


# --------------------------------------------------------------------------------------------
# Results file, table, figure


def _category(group_size: int) -> str:
    return "folder" if group_size == 0 else str(group_size)


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f}"


def table_lines(result: Mapping[str, Any]) -> list[str]:
    """Two per-layout tables (fixed-width text, under 80 columns): per epoch the seconds (data
    stall, normalised beside gpufs' and GPEmu's, compute, epoch, time in the dataset's opens
    and reads), then the evidence (opens, reads and their mean size, block read requests and
    their mean size, MB of the dataset's files and of anything else from the disk, the
    sequential fraction of the requests)."""
    published = {
        key: {p["group_size"]: p["normalised_stall"] for p in curve["points"]}
        for key, curve in result["published"].items()
    }
    rows = result["layouts"]
    lines = [
        f"{'layout':>6} {'files':>5} {'stall s':>8} {'norm':>5} {'gpufs':>5} {'GPEmu':>5} "
        f"{'compute s':>9} {'epoch s':>8} {'io s':>6} {'io norm':>7}"
    ]
    for row in rows:
        g = row["group_size"]
        lines.append(
            f"{row['layout']:>6} {result['dataset']['layouts'][row['layout']]['files']:>5} "
            f"{row['data_stall_s']:>8.2f} {fmt(row['normalised_stall']):>5} "
            f"{fmt(published['gpufs'].get(g, math.nan)):>5} "
            f"{fmt(published['gpemu'].get(g, math.nan)):>5} "
            f"{row['compute_s']:>9.2f} {row['epoch_s']:>8.2f} {row['io_s']:>6.2f} "
            f"{fmt(row['normalised_io']):>7}"
        )
    lines.append(
        f"{'layout':>6} {'opens':>5} {'reads':>5} {'read kB':>8} {'blk reqs':>8} {'blk kB':>7} "
        f"{'data MB':>7} {'else MB':>7} {'seq':>5} {'run kB':>7}"
    )
    for row in rows:
        lines.append(
            f"{row['layout']:>6} {row['opens']:>5.0f} {row['reads']:>5.0f} "
            f"{fmt(row['mean_read_bytes'] / 1e3, 1):>8} {row['block_reads']:>8.0f} "
            f"{fmt(row['mean_block_read_bytes'] / 1e3, 1):>7} "
            f"{_mb(row['block_dataset_bytes']):>7} {_mb(row['block_other_bytes']):>7} "
            f"{fmt(row['sequential_fraction']):>5} "
            f"{fmt(row['mean_sequential_run_bytes'] / 1e3, 1):>7}"
        )
    if result.get("accuracy"):
        lines.extend(accuracy_lines(result["accuracy"]))
    return lines


def grouping_figure(result: Mapping[str, Any]) -> go.Figure:
    """Normalised data stall against G (ours beside the published curves) and the evidence."""
    rows = result["layouts"]
    cats = [_category(r["group_size"]) for r in rows]
    accuracy = result.get("accuracy")
    fig = make_subplots(
        rows=3 if accuracy else 2,
        cols=3,
        subplot_titles=(
            "data stall per epoch, normalised to ungrouped",
            "seconds per epoch (ours)",
            "dataset opens and reads, block requests per epoch",
            "mean request size (kB)",
            "MB per epoch",
            "sequential block read requests (fraction)",
            *(
                (
                    "validation top-1 after each epoch",
                    "validation top-5 after each epoch",
                    "training files opened per epoch",
                )
                if accuracy
                else ()
            ),
        ),
        horizontal_spacing=0.08,
        vertical_spacing=0.1 if accuracy else 0.14,
    )
    base = next((r["data_stall_s"] for r in rows if r["group_size"] == 0), math.nan)
    error = {
        "type": "data",
        "symmetric": False,
        "array": [(r["data_stall_max_s"] - r["data_stall_s"]) / base for r in rows],
        "arrayminus": [(r["data_stall_s"] - r["data_stall_min_s"]) / base for r in rows],
    }
    add_line(
        fig, (1, 1), cats, series(rows, "normalised_stall"), "ours (normalised to folder)",
        error_y=error,
    )  # fmt: skip
    add_line(
        fig, (1, 1), cats, series(rows, "normalised_io"),
        "ours: time in dataset opens + reads (normalised)", line={"dash": "dashdot"},
    )  # fmt: skip
    shown = set(cats)
    for key, dash in (("gpufs", "dash"), ("gpemu", "dot")):
        curve = result["published"][key]
        points = [p for p in curve["points"] if _category(p["group_size"]) in shown]
        x = [_category(p["group_size"]) for p in points]
        y = [p["normalised_stall"] for p in points]
        add_line(fig, (1, 1), x, y, curve["label"], line={"dash": dash})
    for field, label in (
        ("data_stall_s", "data stall"),
        ("compute_s", "compute"),
        ("epoch_s", "epoch"),
        ("io_s", "in dataset opens + reads (all workers)"),
    ):
        fig.add_trace(go.Bar(x=cats, y=series(rows, field), name=f"{label} (s)"), row=1, col=2)
    for field, label in (
        ("opens", "opens"),
        ("reads", "read calls"),
        ("block_reads", "block read requests"),
    ):
        add_line(fig, (1, 3), cats, series(rows, field), label)
    for field, label in (
        ("mean_read_bytes", "read call"),
        ("mean_block_read_bytes", "block request"),
        ("mean_sequential_run_bytes", "sequential run of requests"),
    ):
        add_line(fig, (2, 1), cats, series(rows, field, 1e3), f"mean {label} (kB)")
    fig.add_trace(
        go.Bar(x=cats, y=series(rows, "read_bytes", 1e6), name="read calls (MB)", offsetgroup=0),
        row=2,
        col=2,
    )
    # From the disk: the dataset's files with the rest stacked on them, where a run tells them
    # apart (field, name, the field stacked on).
    if all(r.get("block_dataset_bytes") is not None for r in rows):
        disk = [
            ("block_dataset_bytes", "from disk: the dataset's files (MB)", None),
            ("block_other_bytes", "from disk: metadata, libraries (MB)", "block_dataset_bytes"),
        ]
    else:
        disk = [("block_read_bytes", "from disk (MB)", None)]
    for field, name, below in disk:
        fig.add_trace(
            go.Bar(
                x=cats,
                y=series(rows, field, 1e6),
                name=name,
                offsetgroup=1,
                base=None if below is None else series(rows, below, 1e6),
            ),
            row=2,
            col=2,
        )
    for field, label in (
        ("sequential_fraction", "all the container's requests"),
        ("dataset_sequential_fraction", "the dataset's requests"),
    ):
        add_line(fig, (2, 3), cats, series(rows, field), f"sequential: {label}")
    for run in accuracy or ():
        x = [e["epoch"] for e in run["epochs"]]
        name = _category(run["group_size"])
        for col, field in ((1, "top1"), (2, "top5"), (3, "opens")):
            add_line(
                fig, (3, col), x, series(run["epochs"], field), f"{name}: {field}",
                legendgroup=f"accuracy {name}", showlegend=col == 1,
            )  # fmt: skip
            fig.update_xaxes(title_text="epoch", row=3, col=col)
    fig.update_yaxes(type="log", row=1, col=3)
    fig.update_yaxes(type="log", row=2, col=1)
    fig.update_yaxes(range=[0, 1.05], row=2, col=3)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="group size G", row=2, col=col)
    settings = result["settings"]
    emulated = f" on an emulated {settings['accelerator']}" if settings["accelerator"] else ""
    fig.update_layout(
        title=(
            f"File grouping: {settings['workload']} {settings['variant']}{emulated}, batch "
            f"{settings['batch_size']}, {settings['workers']} workers, cold cache, "
            f"{result['dataset']['images']} images ({result['dataset']['bytes'] / 1e6:.0f} MB)"
        ),
        barmode="group",
        height=1150 if accuracy else 800,
        width=1500,
    )
    return fig
