"""The run report: one HTML page per run, what an I/O analyst reads first (docs/report.md).

``./cli.py report RUN`` writes ``RUN/report.html``. Its sections, each from the run directory
alone: the job; an I/O heat map (bytes over time x process, with the totals per slice and per
process beside it, as Darshan draws it); the time spent per kind of call per process; request
sizes; operation counts and access patterns; files and mount points; the training view
(steps, epochs, the step breakdown, accelerator utilisation, the data rate the accelerator
needed against what storage delivered, and a layered table in DFAnalyzer's manner); and
imbalance across hosts, ranks and loader workers. The I/O figures are
``analysis/io_profile.py``'s; this module adds the training view and draws the page.

The page loads the shared plotly.js (``analysis/figures.py``) and draws every figure from data
embedded in it: binned and summed figures, never the events themselves, so the report of a run
of ten million events opens as fast as that of a small one. When every figure is drawn the page
sets ``data-rendered-ms`` on its body (``performance.now()``) and each section's place
(``data-box-<section>``: top and height in pixels), which the tests read.

Example::

    write_report(load_run("runs/RUN"))       # runs/RUN/report.html
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from analysis import io_profile as iop
from analysis.breakdown import LOADER_KEYS, dataset_reads, step_table, storage_demand
from analysis.figures import shared_plotly_js
from analysis.tables import interval_rows, is_value
from core.atomic import atomic_write_text
from core.errors import UserError
from core.units import format_size
from store.rundir import READ_KINDS, WRITE_KINDS, Run

REPORT = "report.html"
#: The page's sections: (id, title), in order.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("job", "The job"),
    ("heatmap", "I/O over time"),
    ("cost", "Time per kind of call"),
    ("sizes", "Request sizes"),
    ("operations", "Operations and access patterns"),
    ("files", "Files"),
    ("training", "Training"),
    ("imbalance", "Imbalance"),
)
#: The layered table's layers, from the top (DFAnalyzer's view of a training job).
LAYERS: tuple[str, ...] = ("epoch", "step", "data loading", "reader calls", "system calls")

_NS = 1e-9


# ---------------------------------------------------------------------------------------------
# The job


def job_facts(run: Run) -> list[tuple[str, str]]:
    """(name, value) lines of the job: what ran, where, how long, how it ended."""
    m = run.manifest
    config = m.get("config") or {}
    settings = ", ".join(
        f"{k}={v}"
        for k, v in config.items()
        if k not in ("workload", "variant") and v not in (None, {}, "")
    )
    containers = [
        f"{c.get('role')} ({c.get('image', '?')}" + (f" on {c['host']})" if c.get("host") else ")")
        for c in m.get("containers") or []
    ]
    start, end = run.start_ns, run.end_ns
    duration = (
        f"{(end - start) * _NS:.2f} s" if start is not None and end is not None else "unknown"
    )
    host = m.get("host") or {}
    hosts = sorted((m.get("hosts") or {}).keys()) or [str(host.get("hostname", "?"))]
    lost = m.get("lost_events")
    facts = [
        ("run", run.run_id),
        ("workload", f"{run.workload} ({run.variant})"),
        ("settings", settings or "defaults"),
        ("containers", "; ".join(containers) or "none recorded"),
        ("hosts", ", ".join(hosts)),
        ("status", run.status + (f": {m['error']}" if m.get("error") else "")),
        ("duration", duration),
        ("started", str(m.get("started_at") or "unknown")),
        ("lost events", "none" if not lost else f"{lost:,} (counts and bytes are lower bounds)"),
        ("twintrace", f"{m.get('twintrace_version', '?')} ({m.get('git_revision') or 'no git'})"),
        ("command", str(m.get("command_line") or "not recorded (a run made before it was)")),
    ]
    if run.missing:
        facts.append(("missing tables", ", ".join(sorted(run.missing))))
    return facts


# ---------------------------------------------------------------------------------------------
# The training view


def step_parts(run: Run) -> pd.DataFrame:
    """Per step of every rank (``container``, ``rank``, ``epoch``, ``step``): seconds waiting
    for data (``load_batch_mem``), copying to the device (``load_batch_gpu``) and computing
    (``all_compute`` less the copy), from the phases a workload logs per step; empty for a run
    that logs none (the ``original`` variant, a user image)."""
    phases = run.phases
    keys = ("load_batch_mem", "load_batch_gpu", "all_compute")
    rows = phases[phases["key"].isin(keys) & is_value(phases["kind"], "interval")]
    if rows.empty:
        return pd.DataFrame(
            columns=["container", "rank", "epoch", "step", "waiting_s", "copy_s", "compute_s"]
        )
    table = (
        rows.assign(container=rows["container"].fillna(""))
        .pivot_table(
            index=["container", "rank", "epoch", "step"],
            columns="key",
            values="duration_ns",
            aggfunc="sum",
            observed=True,
        )
        .reindex(columns=list(keys))
        .fillna(0)
        * _NS
    )
    return pd.DataFrame(
        {
            "waiting_s": table["load_batch_mem"],
            "copy_s": table["load_batch_gpu"],
            "compute_s": table["all_compute"] - table["load_batch_gpu"],
        }
    ).reset_index()


def step_intervals(run: Run) -> pd.DataFrame:
    """Every rank's steps as intervals (``container``, ``rank``, ``epoch``, ``start_ns``,
    ``end_ns``): a step runs from the previous ``step_end`` of its rank and epoch, the first
    from the start of its epoch (analysis/breakdown.py's definition), for every variant."""
    phases = run.phases
    ends = phases[is_value(phases["key"], "step_end")]
    epochs = interval_rows(phases, "epoch")
    key = ["container", "rank", "epoch"]
    ends = ends.assign(container=ends["container"].fillna("")).sort_values([*key, "ts_ns"])
    starts = epochs.assign(container=epochs["container"].fillna("")).groupby(key)["ts_ns"].min()
    previous = ends.groupby(key)["ts_ns"].shift(1)
    first = pd.Series(
        starts.reindex(pd.MultiIndex.from_frame(ends[key])).to_numpy(), index=ends.index
    )
    begun = previous.fillna(first)
    table = pd.DataFrame(
        {
            "container": ends["container"],
            "rank": ends["rank"],
            "epoch": ends["epoch"],
            "start_ns": begun,
            "end_ns": ends["ts_ns"],
        }
    ).dropna()
    return table.astype({"start_ns": np.int64, "end_ns": np.int64}).reset_index(drop=True)


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted disjoint (starts, ends)."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    first = np.flatnonzero(np.append(True, s[1:] > reach[:-1]))
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


def covered(starts: np.ndarray, ends: np.ndarray, by: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """For each interval, how much of it the disjoint sorted intervals ``by`` cover (ns)."""
    u_start, u_end = by
    if len(u_start) == 0:
        return np.zeros(len(starts), dtype=np.float64)
    lengths = (u_end - u_start).astype(np.float64)
    before = np.concatenate([[0.0], np.cumsum(lengths)])

    def upto(t: np.ndarray) -> np.ndarray:  # covered length in (-inf, t]
        i = np.searchsorted(u_start, t, side="right")
        partial = np.clip(t - u_start[np.maximum(i - 1, 0)], 0, lengths[np.maximum(i - 1, 0)])
        return before[np.maximum(i - 1, 0)] + np.where(i > 0, partial, 0.0)

    return upto(np.asarray(ends, dtype=np.int64)) - upto(np.asarray(starts, dtype=np.int64))


def layers(run: Run) -> pd.DataFrame:
    """The layered table (:data:`LAYERS`): per layer, how many intervals, their seconds (a
    layer of several ranks or workers sums theirs), the bytes (system calls: the dataset's
    reads), and the share of its time that overlapped the layer above in the same container
    (a step inside its epoch: 100%; a read inside a reader call; a reader call while the
    training loop waited for data: the part of loading the accelerator saw). A layer the run
    did not log is absent."""
    phases = run.phases
    steps = step_intervals(run)
    reads = dataset_reads(run)
    read_rows = run.events.loc[reads.index, ["count"]] if len(reads) else None
    tables: dict[str, pd.DataFrame] = {
        "epoch": _spans(interval_rows(phases, "epoch")),
        "step": steps.rename(columns={"start_ns": "start", "end_ns": "end"})[
            ["container", "start", "end"]
        ],
        "data loading": _spans(interval_rows(phases, "load_batch_mem")),
        "reader calls": _spans(
            phases[phases["key"].isin(LOADER_KEYS) & is_value(phases["kind"], "interval")]
        ),
        "system calls": pd.DataFrame(
            {
                "container": reads["container"].to_numpy(),
                "start": (reads["ts_ns"] - reads["latency_ns"]).to_numpy(),
                "end": reads["ts_ns"].to_numpy(),
                "bytes": reads["bytes"].to_numpy(),
                "calls": read_rows["count"].to_numpy() if read_rows is not None else [],
            }
        ),
    }
    out: list[dict[str, Any]] = []
    above: pd.DataFrame | None = None
    above_name = ""
    for name in LAYERS:
        table = tables[name]
        if table.empty:
            continue
        seconds = float((table["end"] - table["start"]).sum()) * _NS
        share = float("nan")
        if above is not None and seconds > 0:
            inside = 0.0
            for role, mine in table.groupby("container", sort=False):
                theirs = above[above["container"] == role]
                union = _union(theirs["start"].to_numpy(np.int64), theirs["end"].to_numpy(np.int64))
                inside += covered(
                    mine["start"].to_numpy(np.int64), mine["end"].to_numpy(np.int64), union
                ).sum()
            share = inside * _NS / seconds
        out.append(
            {
                "layer": name,
                "count": int(table["calls"].sum()) if "calls" in table else len(table),
                "seconds": seconds,
                "bytes": int(table["bytes"].sum()) if "bytes" in table else None,
                "overlap": share,
                "above": above_name,
            }
        )
        above, above_name = table, name
    return pd.DataFrame(out, columns=["layer", "count", "seconds", "bytes", "overlap", "above"])


def _spans(rows: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "container": rows["container"].fillna("").to_numpy(),
            "start": rows["ts_ns"].to_numpy(np.int64),
            "end": rows["end_ns"].to_numpy(np.int64),
        }
    )


def training_facts(run: Run) -> list[tuple[str, str]]:
    """(name, value) lines of the training view: epochs, steps, the step breakdown, AU and the
    data rate needed against delivered; what the run does not log is said, not guessed."""
    phases = run.phases
    epochs = interval_rows(phases, "epoch")
    steps = step_intervals(run)
    if epochs.empty and steps.empty:
        return [("steps", "none logged (a workload that logs no phases: a user image, DLIO)")]
    per_rank = steps.groupby(["container", "rank"]).size()
    facts = [
        (
            "epochs",
            f"{epochs.groupby(['container', 'rank'])['epoch'].nunique().max() if len(epochs) else 0}",
        ),
        (
            "steps",
            f"{len(steps)} over {len(per_rank)} rank(s)"
            + (f", {per_rank.min()} to {per_rank.max()} per rank" if len(per_rank) > 1 else ""),
        ),
    ]
    if len(steps):
        step_s = (steps["end_ns"] - steps["start_ns"]) * _NS
        facts.append(("step time", f"median {step_s.median():.4f} s, max {step_s.max():.4f} s"))
    parts = step_parts(run)
    if parts.empty:
        facts.append(
            (
                "step breakdown",
                f"not logged by the {run.variant} variant (the instrumented and sleep variants log it)",
            )
        )
        return facts
    median = parts[["waiting_s", "copy_s", "compute_s"]].median()
    facts.append(
        (
            "step breakdown",
            f"median compute {median['compute_s']:.4f} s, waiting for data "
            f"{median['waiting_s']:.4f} s, host-to-device {median['copy_s']:.4f} s",
        )
    )
    try:
        table = step_table(run)
        demand = storage_demand(run, table)
    except UserError:
        return facts
    if demand["steps"]:
        rate = lambda v: f"{format_size(v)}/s" if np.isfinite(v) else "n/a"  # noqa: E731
        what = "accelerator" if run.variant == "instrumented" else "emulated accelerator"
        facts += [
            (
                "accelerator utilisation",
                f"{demand['au']:.1%} over {demand['steps']} measured steps (each epoch's first left out)",
            ),
            (
                "data rate",
                f"storage delivered {rate(demand['delivered_bytes_per_s'])}; the {what} needed {rate(demand['needed_bytes_per_s'])} never to wait",
            ),
        ]
        from analysis.sustain import page_cache_note

        note = page_cache_note(run, demand, table)
        if note:
            facts.append(("page cache", note))
    return facts


# ---------------------------------------------------------------------------------------------
# Figures


def heat_map_figure(heat: iop.HeatMap) -> go.Figure:
    fig = make_subplots(
        rows=2,
        cols=2,
        shared_xaxes="columns",
        shared_yaxes="rows",
        column_widths=[0.82, 0.18],
        row_heights=[0.22, 0.78],
        horizontal_spacing=0.01,
        vertical_spacing=0.02,
    )
    mid = (heat.edges_s[:-1] + heat.edges_s[1:]) / 2
    width = float(heat.edges_s[1] - heat.edges_s[0]) if len(heat.edges_s) > 1 else 1.0
    fig.add_trace(
        go.Bar(
            x=mid,
            y=heat.slice_totals,
            width=width,
            name="all processes",
            marker_color="#555",
            hovertemplate="%{x:.2f} s: %{y:.3s}B<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Heatmap(
            x=mid,
            y=heat.labels,
            z=heat.cells,
            colorscale="Viridis",
            colorbar={"title": "bytes", "x": 1.02, "len": 0.75, "y": 0.38},
            hovertemplate="%{y}<br>%{x:.2f} s: %{z:.3s}B<extra></extra>",
        ),
        row=2,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            x=heat.row_totals,
            y=heat.labels,
            orientation="h",
            marker_color="#555",
            name="per process",
            hovertemplate="%{y}: %{x:.3s}B<extra></extra>",
        ),
        row=2,
        col=2,
    )
    fig.update_layout(
        height=max(360, 140 + 22 * len(heat.labels)),
        showlegend=False,
        margin={"l": 10, "r": 10, "t": 20, "b": 40},
    )
    fig.update_xaxes(title_text="seconds since the release", row=2, col=1)
    fig.update_xaxes(title_text="bytes", row=2, col=2)
    fig.update_yaxes(title_text="bytes per slice", row=1, col=1)
    fig.update_yaxes(automargin=True, autorange="reversed", row=2, col=1)
    return fig


def cost_figure(cost: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for column, name, color in (
        ("read_s", "read", "#1f77b4"),
        ("write_s", "write", "#d62728"),
        ("metadata_s", "metadata", "#7f7f7f"),
    ):
        fig.add_trace(
            go.Bar(y=cost["label"], x=cost[column], name=name, orientation="h", marker_color=color)
        )
    fig.update_layout(
        barmode="stack",
        height=max(260, 80 + 22 * len(cost)),
        xaxis_title="seconds in the calls",
        margin={"l": 10, "r": 10, "t": 20, "b": 40},
    )
    fig.update_yaxes(automargin=True, autorange="reversed")
    return fig


def sizes_figure(reads: pd.Series, writes: pd.Series) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("reads", "writes"))
    fig.add_trace(
        go.Bar(x=list(reads.index), y=reads.to_numpy(), marker_color="#1f77b4", name="reads"),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(x=list(writes.index), y=writes.to_numpy(), marker_color="#d62728", name="writes"),
        row=1,
        col=2,
    )
    fig.update_layout(height=320, showlegend=False, margin={"l": 10, "r": 10, "t": 40, "b": 40})
    fig.update_yaxes(title_text="calls", row=1, col=1)
    return fig


def operations_figure(ops: pd.Series) -> go.Figure:
    fig = go.Figure(go.Bar(x=[str(k) for k in ops.index], y=ops.to_numpy(), marker_color="#2ca02c"))
    fig.update_layout(height=300, yaxis_title="calls", margin={"l": 10, "r": 10, "t": 20, "b": 40})
    return fig


# ---------------------------------------------------------------------------------------------
# The page


def write_report(
    run: Run, out_path: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """Write the report of ``run`` (default ``RUN/report.html``), atomically; return its path."""
    out_path = Path(out_path) if out_path is not None else run.path / REPORT
    atomic_write_text(out_path, report_html(run, out_path, progress or (lambda _: None)))
    return out_path


def report_html(run: Run, page: Path, progress: Callable[[str], None] = lambda _: None) -> str:
    """The report of ``run`` as the HTML of the page that will be at ``page``."""
    figures: list[tuple[str, go.Figure]] = []
    body: dict[str, list[str]] = {name: [] for name, _ in SECTIONS}
    body["job"].append(_facts(job_facts(run)))
    timeline = run.path / "timeline.html"
    body["job"].append(
        f'<p><a href="{html.escape(_rel(timeline, page))}">the timeline</a></p>'
        if timeline.is_file()
        else f"<p>No timeline yet: <code>./cli.py plot timeline {html.escape(run.run_id)}</code> draws it.</p>"
    )
    progress("the I/O heat map")
    heat = iop.heat_map(run)
    if heat.labels:
        figures.append(("heatmap", heat_map_figure(heat)))
        body["heatmap"].append(
            f"<p>{format_size(heat.cells.sum())} read and written by {len(heat.labels)} row(s) of processes, "
            f"in {len(heat.edges_s) - 1} slices of {heat.edges_s[1] - heat.edges_s[0]:.3g} s.</p>"
        )
    else:
        body["heatmap"].append("<p>No read or write call was traced.</p>")
    progress("the cost of the calls")
    cost = iop.io_cost(run)
    if len(cost):
        figures.append(("cost", cost_figure(cost)))
    else:
        body["cost"].append("<p>No call took any time.</p>")
    progress("request sizes")
    reads, writes = iop.size_histogram(run, READ_KINDS), iop.size_histogram(run, WRITE_KINDS)
    figures.append(("sizes", sizes_figure(reads, writes)))
    for what, kinds in (("reads", READ_KINDS), ("writes", WRITE_KINDS)):
        common = iop.common_sizes(run, kinds)
        body["sizes"].append(
            f"<p>Most common {what} (calls traced one by one): "
            + (", ".join(f"{size:,} B x {n:,}" for size, n in common) or "none")
            + "</p>"
        )
    progress("operations")
    ops = iop.operation_counts(run)
    if len(ops):
        figures.append(("operations", operations_figure(ops)))
    patterns = iop.access_patterns(run)
    body["operations"].append(
        _table(
            ["access", "calls", "consecutive", "sequential", "offset unknown"],
            [
                [
                    k,
                    f"{p.calls:,}",
                    _share(p.consecutive, p.calls),
                    _share(p.sequential, p.calls),
                    f"{p.unknown:,}",
                ]
                for k, p in patterns.items()
            ],
        )
    )
    progress("files")
    files = iop.file_table(run)
    kinds = iop.file_kinds(files)
    body["files"].append(
        _table(
            ["files", "count", "bytes read", "bytes written"],
            [
                [r.files, f"{r.count:,}", format_size(r.read_bytes), format_size(r.write_bytes)]
                for r in kinds.itertuples()
            ],
        )
    )
    for title, column in (("by bytes", None), ("by time", "io_s")):
        top = (
            files.assign(moved=files["read_bytes"] + files["write_bytes"])
            .sort_values(column or "moved", ascending=False)
            .head(10)
        )
        body["files"].append(f"<h3>Top files {title}</h3>")
        body["files"].append(
            _table(
                ["file", "opens", "reads", "writes", "bytes", "seconds"],
                [
                    [
                        r.path,
                        f"{r.opens:,}",
                        f"{r.reads:,}",
                        f"{r.writes:,}",
                        format_size(r.moved),
                        f"{r.io_s:.4f}",
                    ]
                    for r in top.itertuples()
                ],
            )
        )
    body["files"].append("<h3>Data volume by mount point</h3>")
    body["files"].append(
        _table(
            ["mount point", "bytes read", "bytes written", "reads", "writes"],
            [
                [
                    r.mount,
                    format_size(r.read_bytes),
                    format_size(r.write_bytes),
                    f"{r.reads:,}",
                    f"{r.writes:,}",
                ]
                for r in iop.volume_by_mount(run, files).itertuples()
            ],
        )
    )
    progress("the training view")
    body["training"].append(_facts(training_facts(run)))
    layered = layers(run)
    if len(layered):
        body["training"].append("<h3>Layers</h3>")
        body["training"].append(
            _table(
                ["layer", "count", "seconds", "bytes", "share inside the layer above"],
                [
                    [
                        r.layer,
                        f"{r.count:,}",
                        f"{r.seconds:.3f}",
                        "" if r.bytes is None or pd.isna(r.bytes) else format_size(r.bytes),
                        "" if pd.isna(r.overlap) else f"{r.overlap:.1%} of it inside {r.above}",
                    ]
                    for r in layered.itertuples()
                ],
            )
        )
    progress("imbalance")
    unbalanced = iop.imbalance(run)
    if len(unbalanced):
        flagged = int(unbalanced["flagged"].sum())
        body["imbalance"].append(
            f"<p>{flagged} flagged: bytes or I/O time more than {iop.IMBALANCE_FACTOR:g}x from the median of the others of their group, either way.</p>"
        )
        body["imbalance"].append(
            _table(
                ["group", "member", "bytes", "I/O seconds", "flag"],
                [
                    [
                        r.group,
                        r.member,
                        format_size(r.bytes),
                        f"{r.io_s:.4f}",
                        ("⚑ " + r.why) if r.flagged else "",
                    ]
                    for r in unbalanced.itertuples()
                ],
                flagged=[bool(f) for f in unbalanced["flagged"]],
            )
        )
    else:
        body["imbalance"].append(
            "<p>One host, one container, at most one loader worker each: nothing to compare.</p>"
        )
    return _page(run, page, body, figures)


def _rel(target: Path, page: Path) -> str:
    return os.path.relpath(target, Path(page).resolve().parent)


def _share(part: int, whole: int) -> str:
    return f"{part:,} ({part / whole:.0%})" if whole else "0"


def _facts(facts: Sequence[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts">{rows}</table>'


def _table(
    header: Sequence[str], rows: Sequence[Sequence[Any]], flagged: Sequence[bool] = ()
) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        ('<tr class="flagged">' if i < len(flagged) and flagged[i] else "<tr>")
        + "".join(f"<td>{html.escape(str(v))}</td>" for v in row)
        + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:0 2em 4em;color:#222;max-width:1400px}
nav{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:1px solid #ddd}
nav a{margin-right:1em}
section{margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0;font-size:90%}
th,td{border:1px solid #ddd;padding:.2em .6em;text-align:left;vertical-align:top}
table.facts th{background:#f4f4f4;white-space:nowrap}
tr.flagged td{background:#fff0e0}
.figure{width:100%}
"""


def _page(
    run: Run, page: Path, body: dict[str, list[str]], figures: list[tuple[str, go.Figure]]
) -> str:
    script = shared_plotly_js(page)
    nav = "".join(f'<a href="#{name}">{html.escape(title)}</a>' for name, title in SECTIONS)
    placed: dict[str, list[str]] = {name: [] for name, _ in SECTIONS}
    data = []
    for i, (section, fig) in enumerate(figures):
        placed[section].append(f'<div class="figure" id="fig{i}"></div>')
        spec = pio.to_json(fig, validate=False, remove_uids=True).replace("</", "<\\/")
        data.append(f'<script type="application/json" id="fig{i}-data">{spec}</script>')
    sections = "".join(
        f'<section id="{name}" data-section="{name}"><h2>{html.escape(title)}</h2>'
        + "".join(placed[name])
        + "".join(body[name])
        + "</section>"
        for name, title in SECTIONS
    )
    title = html.escape(f"{run.run_id}: report")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title><style>{_STYLE}</style>
<script src="{html.escape(script)}"></script></head>
<body><h1>{html.escape(run.label)}</h1><nav>{nav}</nav>{sections}{"".join(data)}
<script>
(function () {{
  var drawn = [];
  document.querySelectorAll("div.figure").forEach(function (el) {{
    var spec = JSON.parse(document.getElementById(el.id + "-data").textContent);
    drawn.push(Plotly.newPlot(el, spec.data, spec.layout, {json.dumps({"displaylogo": False, "responsive": True})}));
  }});
  Promise.all(drawn).then(function () {{
    document.body.setAttribute("data-rendered-ms", performance.now().toFixed(0));
    document.querySelectorAll("section").forEach(function (s) {{
      var box = s.getBoundingClientRect();
      document.body.setAttribute("data-box-" + s.id, Math.round(box.top + window.scrollY) + "," + Math.round(box.height));
    }});
  }});
}})();
</script></body></html>
"""
