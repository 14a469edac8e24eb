"""Writing plotly figures: one self-contained HTML file (plotly.js embedded, opens offline)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from core.atomic import atomic_path


def write_figure(fig: go.Figure, out_path: Path) -> Path:
    """Write ``fig`` as one self-contained HTML file, atomically; return its path."""
    html = fig.to_html(include_plotlyjs=True, full_html=True, config={"displaylogo": False})
    out_path = Path(out_path)
    with atomic_path(out_path) as tmp, open(tmp, "x", encoding="utf-8") as handle:
        handle.write(html)
    return out_path
