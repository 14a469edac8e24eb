"""A study's result rows (a mapping of numbers per cell, as its results file has them) in its
text tables and figures, shared by the studies' analyses (``analysis/grouping.py``,
``analysis/hfta.py``): a missing number (None, as a results file writes NaN, or NaN) is "-" in
a table and a gap in a plot."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go


def missing(value: Any) -> bool:
    """None (NaN in a results file) or NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(value: Any, digits: int = 2, scale: float = 1.0) -> str:
    """``value / scale`` with ``digits`` decimals, or "-" when it is missing."""
    return "-" if missing(value) else f"{value / scale:.{digits}f}"


def series(rows: Sequence[Mapping[str, Any]], field: str, scale: float = 1.0) -> list[Any]:
    """A field of every row, scaled; None where it is missing or absent (a gap in the plot)."""
    return [None if missing(r.get(field)) else r[field] / scale for r in rows]


def add_line(
    fig: go.Figure,
    cell: tuple[int, int],
    x: Sequence[Any],
    y: Sequence[Any],
    name: str,
    **style: Any,
) -> None:
    """A line with markers through ``x``, ``y`` in subplot ``cell`` (row, column) of ``fig``;
    ``style``: the line's other properties (``line``, ``showlegend``, ``error_y``; ``mode``
    "markers" for markers alone)."""
    fig.add_trace(
        go.Scatter(x=x, y=y, name=name, **{"mode": "lines+markers", **style}),
        row=cell[0],
        col=cell[1],
    )
