"""The comparison report: every similarity aspect as a lane, the two runs overlaid, the score next
to its evidence.

One lane (subplot row) per aspect of :data:`analysis.similarity.ASPECTS`, in that order, whether
scored or skipped, so a report always has :data:`REPORT_LANES` lanes. Each lane draws what the
measure compared: for I/O activity, the share of the run's bytes transferred so far against the
fraction of each run elapsed (so a faster run lines up; the area between the two curves is the
Wasserstein distance the timing term uses), CPU and memory over the fraction elapsed,
request-size histograms, distributions as empirical CDFs, first-access ranks of shared files,
per-file shares, checkpoint figures. Its title reads ``read bandwidth — 0.93 (DTW)`` followed by
the evidence behind the score. The real run is drawn solid and dark, the emulated run dashed and
orange, in every lane.

Example::

    comparison = compare_runs(real, emulated)
    write_comparison_report(real, emulated, comparison, Path("runs/B/compare.html"))
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.figures import CONFIG, shared_plotly_js
from analysis.similarity import ASPECTS, AspectScore, Comparison
from core.atomic import atomic_write_text
from store.rundir import Run

#: Lanes in a report: one per aspect, skipped aspects included (they say why).
REPORT_LANES = len(ASPECTS)

REAL_STYLE: Mapping[str, Any] = {"color": "#222222", "width": 1.6}
EMULATED_STYLE: Mapping[str, Any] = {"color": "#ff7f0e", "width": 1.6, "dash": "dash"}
REAL_COLOR, EMULATED_COLOR = REAL_STYLE["color"], EMULATED_STYLE["color"]

_LANE_PX = 250
_GAP_PX = 110  # room for tick labels and a two-line title between lanes
GIB = float(2**30)

#: Level-mode series (compared in their own units): the y-axis title and the unit scale.
_LEVEL_UNITS: Mapping[str, tuple[str, float]] = {
    "cpu": ("% of one core", 1.0),
    "memory": ("GiB", 1.0 / GIB),
    "network": ("MiB/s", 1.0 / 2**20),
}


def report_lanes(comparison: Comparison) -> int:
    """Number of plot lanes the report of ``comparison`` has (one per aspect)."""
    return len(comparison.aspects)


def lane_title(aspect: AspectScore) -> str:
    """``read bandwidth — 0.93 (DTW)``, or the reason it was skipped."""
    if aspect.score is None:
        return f"{aspect.title} — skipped ({aspect.skipped})"
    return f"{aspect.title} — {aspect.score:.2f} ({aspect.measure})"


def evidence_text(aspect: AspectScore, limit: int = 7) -> str:
    """The first ``limit`` numeric or short facts of ``aspect.details``, formatted for a title."""
    parts: list[str] = []
    for key, value in aspect.details.items():
        if len(parts) >= limit:
            break
        text = _format_value(key, value)
        if text is not None:
            parts.append(f"{key.replace('_', ' ')} {text}")
    return " · ".join(parts)


def _format_value(key: str, value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None if value is None else str(value)
    if isinstance(value, int | float | np.integer | np.floating):
        number = float(value)
        if not np.isfinite(number):
            return None
        if "bytes" in key and abs(number) >= 1024:
            return _fmt_bytes(number)
        return f"{number:.3g}"
    if isinstance(value, str):
        return value if len(value) <= 60 else value[:57] + "..."
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return None  # nested evidence (ratios) is in the JSON, not the title


def _fmt_bytes(number: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2.0**20), ("KiB", 1024.0)):
        if abs(number) >= size:
            return f"{number / size:.3g} {unit}"
    return f"{number:.0f} B"


def comparison_figure(real: Run, emulated: Run, comparison: Comparison) -> go.Figure:
    """The report figure: one lane per aspect, the two runs overlaid (see the module doc).

    ``fig.layout.meta["lanes"]`` lists per row ``{"row", "aspect", "score", "measure"}``.
    """
    rows = len(comparison.aspects)
    height = rows * _LANE_PX + (rows - 1) * _GAP_PX + 160
    titles = [
        f"<b>{html.escape(lane_title(a))}</b><br><span style='font-size:10px'>"
        f"{html.escape(evidence_text(a))}</span>"
        for a in comparison.aspects
    ]
    fig = make_subplots(
        rows=rows,
        cols=1,
        subplot_titles=titles,
        vertical_spacing=_GAP_PX / height if rows > 1 else 0.0,
    )
    legend_shown: set[str] = set()
    for row, aspect in enumerate(comparison.aspects, start=1):
        # A lane with nothing to draw (a skipped aspect) gets an empty trace: plotly draws no
        # axes for a subplot without one, and the lane would vanish from the page.
        traces = _lane(aspect) or [go.Scatter(x=[], y=[], showlegend=False, hoverinfo="skip")]
        for trace in traces:
            who = trace.legendgroup
            if who is not None:
                trace.showlegend = who not in legend_shown
                legend_shown.add(who)
            fig.add_trace(trace, row=row, col=1)
        for axis, settings in axes_settings(aspect).items():
            fig.update_layout({f"{axis}axis{'' if row == 1 else row}": settings})
        note = _empty_note(aspect)
        if note:
            # In paper coordinates at the centre of the lane: an annotation referring to the
            # domain of an axis without data is not drawn.
            suffix = "" if row == 1 else str(row)
            x0, x1 = fig.layout[f"xaxis{suffix}"].domain
            y0, y1 = fig.layout[f"yaxis{suffix}"].domain
            fig.add_annotation(
                text=html.escape(note),
                xref="paper",
                yref="paper",
                x=(x0 + x1) / 2,
                y=(y0 + y1) / 2,
                showarrow=False,
                font={"color": "#888888", "size": 13},
            )
    for annotation in fig.layout.annotations[:rows]:
        annotation.update(x=0.0, xanchor="left", align="left", font={"size": 13})
    fig.update_layout(
        height=height,
        template="plotly_white",
        margin={"l": 80, "r": 40, "t": 110, "b": 50},
        legend={"orientation": "h", "x": 0.0, "y": 1.0, "yanchor": "bottom", "yref": "container"},
        title={
            "text": f"<b>overall similarity {comparison.overall:.2f}</b> — real "
            f"{html.escape(real.label)} vs emulated {html.escape(emulated.label)}",
            "x": 0.0,
            "font": {"size": 15},
        },
        barmode="group",
        meta={
            "lanes": [
                {"row": row, "aspect": a.name, "score": a.score, "measure": a.measure}
                for row, a in enumerate(comparison.aspects, start=1)
            ]
        },
    )
    return fig


def _empty_note(aspect: AspectScore) -> str:
    if aspect.score is None:
        return f"skipped: {aspect.skipped}"
    if aspect.details.get("note"):
        return str(aspect.details["note"])
    return ""


def _pair(x_real: Any, y_real: Any, x_emu: Any, y_emu: Any, kind: str, **extra: Any) -> list[Any]:
    """The real and emulated traces of one channel, styled the same way in every lane."""
    traces = []
    for who, x, y, style in (
        ("real", x_real, y_real, REAL_STYLE),
        ("emulated", x_emu, y_emu, EMULATED_STYLE),
    ):
        common = {"x": x, "y": y, "name": who, "legendgroup": who, **extra}
        if kind == "bar":
            traces.append(go.Bar(marker_color=style["color"], **common))
        else:
            mode = "markers" if kind == "markers" else "lines"
            marker = {"color": style["color"], "size": 4}
            traces.append(go.Scatter(mode=mode, line=dict(style), marker=marker, **common))
    return traces


def _cumulative(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Bin edges and each run's share of its bytes so far: the curves start at (0, 0)."""
    x = np.arange(len(a) + 1) / len(a)
    ya = np.concatenate([[0.0], np.cumsum(a) / a.sum()])
    yb = np.concatenate([[0.0], np.cumsum(b) / b.sum()])
    return x, ya, yb


def _channel_traces(
    channels: Mapping[str, tuple[Any, Any]],
    curve: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, ...]],
) -> list[Any]:
    """The two runs' lines of each channel both runs have, ``curve(a, b)`` -> (x, ya, yb);
    with several channels, named after them and the second drawn thinner."""
    traces: list[Any] = []
    for i, (label, (a, b)) in enumerate(channels.items()):
        if a is None or b is None:
            continue
        x, ya, yb = curve(a, b)
        pair = _pair(x, ya, x, yb, "lines")
        if len(channels) > 1:
            for trace in pair:
                trace.update(name=f"{trace.name} {label}", legendgroup=f"{trace.name} {label}")
                if i > 0:
                    trace.update(line_width=0.9, opacity=0.7)
        traces += pair
    return traces


def _lane(aspect: AspectScore) -> list[Any]:
    """Traces of one lane, drawn from ``aspect.plot`` (none for skipped or one-sided aspects)."""
    plot = aspect.plot
    kind = plot.get("kind")
    traces: list[Any] = []
    if kind == "cumulative":
        channels = plot["channels"]
        traces += _channel_traces(channels, _cumulative)
    elif kind == "series":
        scale = _LEVEL_UNITS.get(aspect.name, ("", 1.0))[1]
        channels = plot["channels"]
        level = plot["level"]

        def levels(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
            x = (np.arange(len(a)) + 0.5) / len(a)
            if level:
                return x, a * scale, b * scale
            # Shapes: relative to each run's own mean, as the score ignores scale.
            return x, a / max(a.mean(), 1e-300), b / max(b.mean(), 1e-300)

        traces += _channel_traces(channels, levels)
    elif kind == "histogram":
        traces += _pair(plot["x"], plot["real"], plot["x"], plot["emulated"], "bar")
    elif kind == "quantiles":
        (xa, ya), (xb, yb) = plot["real"], plot["emulated"]
        traces += _pair(xa, ya, xb, yb, "lines", line_shape="hv")
    elif kind == "ranks":
        shared = _pair(plot["real"], plot["emulated"], None, None, "markers")[0]
        traces.append(shared.update(name="shared file", legendgroup="shared file"))
    elif kind == "bars":
        names = [str(p).rsplit("/", 1)[-1][-24:] for p in plot["x"]]
        traces += _pair(names, plot["real"], names, plot["emulated"], "bar", hovertext=plot["x"])
    elif kind == "pairs":
        real = np.asarray(plot["real"], dtype=np.float64)
        emu = np.asarray(plot["emulated"], dtype=np.float64)
        top = np.maximum(np.maximum(real, emu), 1e-300)
        pair = _pair(plot["x"], real / top, plot["x"], emu / top, "bar")
        for trace, raw in zip(pair, (real, emu), strict=True):
            trace.update(text=[f"{v:.3g}" for v in raw], textposition="auto")
        traces += pair
    return traces


def axes_settings(aspect: AspectScore) -> dict[str, dict[str, Any]]:
    """x and y axis settings of the lane of ``aspect`` (titles, log scales)."""
    kind = aspect.plot.get("kind")
    if kind == "cumulative":
        return {
            "x": {"title": {"text": "fraction of run elapsed"}, "range": [0, 1]},
            "y": {"title": {"text": "share of bytes so far"}, "range": [0, 1.02]},
        }
    if kind == "series":
        unit = _LEVEL_UNITS.get(aspect.name, ("× run mean", 1.0))[0]
        return {
            "x": {"title": {"text": "fraction of run elapsed"}, "range": [0, 1]},
            "y": {"title": {"text": unit}, "rangemode": "tozero"},
        }
    if kind == "histogram":
        return {
            "x": {"title": {"text": "request size (power-of-two bucket)"}},
            "y": {"title": {"text": "share of requests"}},
        }
    if kind == "quantiles":
        unit = aspect.plot.get("unit", "")
        log = aspect.name == "read_interarrival"
        return {
            "x": {"title": {"text": unit}, "type": "log" if log else "linear"},
            "y": {"title": {"text": "fraction ≤ x"}, "range": [0, 1.02]},
        }
    if kind == "ranks":
        return {
            "x": {"title": {"text": "first-read rank, real"}},
            "y": {"title": {"text": "first-read rank, emulated"}},
        }
    if kind == "bars":
        # File names under the bars, small and slanted; the full path is in the hover text.
        return {"x": {"tickangle": 30, "tickfont": {"size": 8}}, "y": {"title": {"text": "share"}}}
    if kind == "pairs":
        return {"y": {"title": {"text": "relative to the larger"}, "range": [0, 1.1]}}
    # Not visible=False: an annotation placed in a hidden axis' domain is drawn at the top.
    bare = {"showticklabels": False, "showgrid": False, "zeroline": False}
    return {"x": bare, "y": bare}


def report_html(
    real: Run, emulated: Run, comparison: Comparison, plotly_js: str | bool = True
) -> str:
    """The whole report as one HTML page, nothing fetched from a network: plotly.js loaded from
    ``plotly_js`` (a relative path: :func:`analysis.figures.shared_plotly_js`), or inline
    (True)."""
    fig = comparison_figure(real, emulated, comparison)
    rows = []
    for a in comparison.aspects:
        score = "skipped" if a.score is None else f"{a.score:.3f}"
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(v))}</td>"
                for v in (
                    a.title,
                    a.resource,
                    score,
                    a.measure,
                    f"{a.weight:g}",
                    ", ".join(a.invariant_to),
                    ", ".join(a.sensitive_to),
                    a.skipped or a.details.get("note", ""),
                )
            )
            + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "aspect",
            "resource",
            "score",
            "measure",
            "weight",
            "invariant to",
            "sensitive to",
            "note",
        )
    )
    figure = fig.to_html(include_plotlyjs=plotly_js, full_html=False, config=dict(CONFIG))
    warnings = "".join(
        f"<p class='warning'>warning: {html.escape(w)}</p>" for w in comparison.warnings
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>similarity {html.escape(comparison.emulated)} vs {html.escape(comparison.real)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
.warning {{ color: #a04000; }}
</style></head><body>
<h1>Overall similarity {comparison.overall:.3f}</h1>
{warnings}
<p>real: <b>{html.escape(real.label)}</b><br>emulated: <b>{html.escape(emulated.label)}</b></p>
<p>Each score is in [0, 1] (1: alike); the overall score is their weighted mean over the aspects
that were not skipped. Measures and invariances are explained in docs/similarity.md.</p>
<table><thead><tr>{head}</tr></thead><tbody>
{"".join(rows)}
</tbody></table>
{figure}
</body></html>
"""


def write_comparison_report(
    real: Run, emulated: Run, comparison: Comparison, out_path: Path
) -> Path:
    """Write :func:`report_html` to ``out_path`` atomically (temporary file, then rename),
    loading the shared plotly.js beside it."""
    out_path = Path(out_path)
    text = report_html(real, emulated, comparison, shared_plotly_js(out_path))
    atomic_write_text(out_path, text, fsync=True)
    return out_path
