"""Writing plotly figures as HTML pages that open from the file system, offline.

plotly.js (~4.8 MB) is not embedded in every page: one copy, the one the plotly package ships
(pinned with it in requirements.lock; never fetched from a network), is written beside the
pages as :data:`PLOTLY_JS`, and each page loads it by a relative path. A page in a run
directory shares the copy of its runs root, so a root of a hundred runs holds one copy, not a
hundred; a page elsewhere (a study's, an experiment's) shares the copy of its folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs, get_plotlyjs_version

from core.atomic import atomic_path

#: The shared plotly.js's file name, with its version: pages of another plotly keep theirs.
PLOTLY_JS = f"plotly-{get_plotlyjs_version()}.min.js"
#: Plotly's page configuration for every figure we write.
CONFIG: Mapping[str, Any] = {"displaylogo": False}


def shared_plotly_js(page: Path) -> str:
    """The relative path by which the page at ``page`` loads the shared plotly.js, written (at
    once, whole) where it is missing: in the runs root above a run directory (one with a
    ``manifest.json``), else in the page's own folder."""
    folder = Path(page).resolve().parent
    home = folder.parent if (folder / "manifest.json").is_file() else folder
    script = home / PLOTLY_JS
    if not script.is_file():
        home.mkdir(parents=True, exist_ok=True)
        with atomic_path(script) as tmp, open(tmp, "x", encoding="utf-8") as handle:
            handle.write(get_plotlyjs())
    return os.path.relpath(script, folder)


def page_html(
    fig: go.Figure, page: Path, *, full_html: bool = True, config: Mapping[str, Any] = CONFIG
) -> str:
    """``fig`` as the HTML of the page that will be at ``page`` (a whole page, or with
    ``full_html`` False the part to put in one), loading the shared plotly.js."""
    return fig.to_html(
        include_plotlyjs=shared_plotly_js(page), full_html=full_html, config=dict(config)
    )


def write_figure(fig: go.Figure, out_path: Path, config: Mapping[str, Any] = CONFIG) -> Path:
    """Write ``fig`` as an HTML page at ``out_path`` (:func:`page_html`), atomically; return its
    path."""
    out_path = Path(out_path)
    html = page_html(fig, out_path, config=config)
    with atomic_path(out_path) as tmp, open(tmp, "x", encoding="utf-8") as handle:
        handle.write(html)
    return out_path
