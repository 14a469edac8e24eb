"""The SOPHON study's figures from its traces (docs/sophon.md; the study runs in
:mod:`experiments.sophon`): per run, the last epoch's time, the bytes on the network, the
storage and training containers' CPU seconds and the storage's traced reads
(:func:`run_figures`); per (bandwidth, storage CPUs) cell, SOPHON against the other modes
(:func:`compare_cells`); the table and the figure of a result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.samples import sampled_total
from core.errors import UserError
from store.rundir import READ_KINDS, Run

MODES = ("remote-nooff", "remote-alloff", "remote-partial", "remote-sophon")
MODE_LABELS = {
    "remote-nooff": "no offload",
    "remote-alloff": "all offload",
    "remote-partial": "partial offload",
    "remote-sophon": "SOPHON (selective)",
}
#: The published result (REFERENCE.md section 6; HotStorage 2024).
PUBLISHED = {
    "source": "SOPHON, HotStorage 2024 (mengwanguc/sophon)",
    "dataset": "OpenImages: raw mean 0.317 MB, 150,561 B after the crop, 75% of samples shrink",
    "link": "500 Mbit/s cap, measured ~430 Mbit/s",
    "traffic_reduction": [1.2, 2.2],
    "claim": "1.2-2.2x less data traffic and shorter training time than the alternatives",
}
_NS = 1e-9


# ---------------------------------------------------------------------------------------------
# Figures of one run


def epoch_interval(run: Run, role: str = "main") -> tuple[int, int, int]:
    """(epoch, start_ns, end_ns) of the last epoch ``role`` logged."""
    phases = run.phases
    rows = phases[
        (phases["key"].astype(str) == "epoch")
        & (phases["kind"].astype(str) == "interval")
        & (phases["container"].astype(str) == role)
    ]
    if rows.empty:
        raise UserError(f"run {run.run_id} logged no epoch for {role}")
    last = rows.sort_values("ts_ns").iloc[-1]
    return int(last["epoch"]), int(last["ts_ns"]), int(last["end_ns"])


def run_figures(run: Run) -> dict[str, Any]:
    """What the study measures in one run (module doc), over its last epoch."""
    epoch, t0, t1 = epoch_interval(run)
    s = run.samples
    rx = sampled_total(s, "container_net_rx", "main", t0, t1)
    tx = sampled_total(s, "container_net_tx", "main", t0, t1)
    events = run.events
    reads = events[
        events["kind"].astype(str).isin(READ_KINDS)
        & (events["container"].astype(str) == "storage")
        & events["path"].astype(str).str.startswith("/data/")
        & (events["ts_ns"] >= t0)
        & (events["ts_ns"] <= t1)
        & (events["ret"] >= 0)
    ]
    figures: dict[str, Any] = {
        "epoch": epoch,
        "epoch_s": (t1 - t0) * _NS,
        "net_bytes": rx + tx,
        "net_rx_bytes": rx,
        "net_tx_bytes": tx,
        "storage_cpu_s": sampled_total(s, "container_cpu", "storage", t0, t1) / 100,
        "train_cpu_s": sampled_total(s, "container_cpu", "main", t0, t1) / 100,
        "storage_read_bytes": int(reads["bytes"].sum()),
    }
    plan = run.path / "out" / "main" / "offload-plan.json"
    if plan.exists():
        data = json.loads(plan.read_text())
        figures["plan"] = {k: v for k, v in data.items() if k not in ("stages", "stage_names")}
    return figures


# ---------------------------------------------------------------------------------------------
# Results


def cell_name(bandwidth: str, cpus: float) -> str:
    return f"{bandwidth}, storage {cpus:g} CPU"


def compare_cells(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (bandwidth, storage CPUs) cell: each mode's figures, and SOPHON's traffic and epoch
    time as fractions of each other mode's (a value below 1: SOPHON less)."""
    cells: dict[str, dict[str, Any]] = {}
    for r in runs:
        cell = cells.setdefault(
            r["cell"],
            {
                "cell": r["cell"],
                "bandwidth": r["bandwidth"],
                "storage_cpus": r["storage_cpus"],
                "modes": {},
            },
        )
        cell["modes"][r["mode"]] = r["figures"]
    for cell in cells.values():
        sophon = cell["modes"].get("remote-sophon")
        if sophon is None:
            continue
        cell["sophon_vs"] = {
            mode: {
                "traffic_ratio": _ratio(f["net_bytes"], sophon["net_bytes"]),
                "epoch_ratio": _ratio(f["epoch_s"], sophon["epoch_s"]),
            }
            for mode, f in cell["modes"].items()
            if mode != "remote-sophon"
        }
    return list(cells.values())


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


SHORT_LABELS = {
    "remote-nooff": "no offload",
    "remote-alloff": "all offload",
    "remote-partial": "partial",
    "remote-sophon": "SOPHON",
}


def table_lines(result: Mapping[str, Any]) -> list[str]:
    """The per-mode figures of every cell, as text under 80 columns (what the study prints)."""
    lines = [
        f"{'cell':<16} {'mode':<11} {'net MB':>7} {'epoch s':>7} {'storage':>7} {'train':>6} "
        f"{'offload':>7}",
        f"{'':<16} {'':<11} {'/epoch':>7} {'':>7} {'CPU s':>7} {'CPU s':>6} {'':>7}",
    ]
    for cell in result["cells"]:
        name = f"{cell['bandwidth']}/{cell['storage_cpus']:g}cpu"
        for mode in MODES:
            f = cell["modes"].get(mode)
            if f is None:
                continue
            plan = f.get("plan") or {}
            offloaded = f"{plan['offloaded']}/{plan['samples']}" if plan else ""
            lines.append(
                f"{name:<16} {SHORT_LABELS[mode]:<11} {f['net_bytes'] / 1e6:>7.2f} "
                f"{f['epoch_s']:>7.2f} {f['storage_cpu_s']:>7.2f} {f['train_cpu_s']:>6.2f} "
                f"{offloaded:>7}"
            )
        for mode, ratio in (cell.get("sophon_vs") or {}).items():
            lines.append(
                f"{'':<16} {SHORT_LABELS[mode]} / SOPHON: traffic {ratio['traffic_ratio']:.2f}x, "
                f"epoch {ratio['epoch_ratio']:.2f}x"
            )
    lines.append("published: 1.2-2.2x less traffic and shorter training than the alternatives")
    return lines


def sophon_figure(result: Mapping[str, Any]) -> go.Figure:
    """Four panels, one bar group per cell, one bar per mode: network MB per epoch, epoch
    seconds, storage CPU seconds, training CPU seconds."""
    panels = (
        ("net_bytes", "bytes on the network per epoch (MB)", 1e-6),
        ("epoch_s", "epoch time (s)", 1.0),
        ("storage_cpu_s", "storage CPU (s per epoch)", 1.0),
        ("train_cpu_s", "training CPU (s per epoch)", 1.0),
    )
    fig = make_subplots(rows=2, cols=2, subplot_titles=[title for _, title, _ in panels])
    cells = [c["cell"] for c in result["cells"]]
    colors = dict(zip(MODES, ("#7f7f7f", "#d62728", "#1f77b4", "#2ca02c"), strict=True))
    for i, (field, _, scale) in enumerate(panels):
        row, col = divmod(i, 2)
        for mode in MODES:
            ys = [
                (c["modes"][mode][field] * scale) if mode in c["modes"] else None
                for c in result["cells"]
            ]
            if all(y is None for y in ys):
                continue
            fig.add_trace(
                go.Bar(
                    x=cells,
                    y=ys,
                    name=MODE_LABELS[mode],
                    marker_color=colors[mode],
                    legendgroup=mode,
                    showlegend=i == 0,
                ),
                row=row + 1,
                col=col + 1,
            )
    fig.update_layout(
        barmode="group",
        height=800,
        title=f"SOPHON study: {result['settings']['workload']} ({result['settings']['variant']}), "
        f"{result['dataset']['images']} images of {result['dataset']['mean_bytes'] / 1e3:.0f} kB "
        f"mean; published: {PUBLISHED['claim']}",
    )
    return fig
