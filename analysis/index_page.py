"""The runs root's index page, ``index.html`` (``./cli.py runs --html``): one page for every run
and every study's results under a runs root, with links to the pages that exist.

Runs are the rows of :func:`analysis.report.list_runs` (what ``./cli.py runs`` prints), most
recent first, each with its status, workload, variant, duration, key figures and links to the
pages in its run directory (:func:`run_pages`). Studies are found by their results files
(:func:`find_studies`): JSON files anywhere under the root, outside run directories, whose
versioned header (:mod:`core.versioned`) names a ``kind``; each is listed with the HTML figures
of its folder and the JSON itself.

The page is one file: no network, no external script or style, every link relative, so it
opens from the file system; any column sorts on a click (a small inline script). Everything
taken from run or study data is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from core.atomic import atomic_write_text
from core.units import format_size
from core.versioned import STAMP
from store.rundir import MANIFEST

#: The page's file name, at the runs root.
INDEX = "index.html"
#: The pages a run directory may hold, in the order they are linked: (label, file name). The
#: report is made by ``./cli.py report RUN``; the others by ``plot`` and ``compare``.
RUN_PAGES: tuple[tuple[str, str], ...] = (
    ("report", "report.html"),
    ("timeline", "timeline.html"),
    ("breakdown", "breakdown.html"),
)
#: A JSON file larger than this is not read when looking for studies (results are small).
STUDY_JSON_MAX_BYTES = 16 << 20

_STATUS_CLASS = {
    "completed": "ok",
    "lossy": "warn",
    "running": "busy",
    "failed": "bad",
    "interrupted": "bad",
    "damaged": "bad",
    "incomplete": "bad",
}


def run_pages(run_dir: Path) -> list[tuple[str, str]]:
    """(label, file name) of every page in ``run_dir`` (:data:`RUN_PAGES`, then each
    ``compare*.html`` by name), only those that exist."""
    pages = [(label, name) for label, name in RUN_PAGES if (run_dir / name).is_file()]
    for path in sorted(run_dir.glob("compare*.html")):
        if path.is_file():
            pages.append((path.stem, path.name))
    return pages


def find_studies(runs_root: Path) -> list[dict[str, Any]]:
    """Every study's results under ``runs_root``, outside run directories (and datasets: any
    folder with a manifest.json): JSON files whose versioned header (``schema_version``,
    ``twintrace_version``, ``created_at``) names a ``kind``. One dict per file: ``kind``,
    ``path`` (relative to the root), ``created_at``, ``runs`` (how many its results list, or
    None), ``duration_s``, ``workload`` and ``figures`` (the folder's HTML pages, relative)."""
    runs_root = Path(runs_root)
    found: list[dict[str, Any]] = []
    for folder, dirs, files in os.walk(runs_root):
        here = Path(folder)
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and not (here / d / MANIFEST).exists()
        )
        for name in sorted(f for f in files if f.endswith(".json")):
            data = _study_results(here / name)
            if data is not None:
                found.append(_study_row(runs_root, here / name, data))
    return sorted(found, key=lambda s: str(s["created_at"]), reverse=True)


def _study_results(path: Path) -> dict[str, Any] | None:
    """The body of ``path`` when it is a study's results (see :func:`find_studies`), else None."""
    try:
        if path.stat().st_size > STUDY_JSON_MAX_BYTES:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # not ours to judge: only a readable, stamped file is a study's results
    if not isinstance(data, dict) or not all(key in data for key in STAMP):
        return None
    if not isinstance(data.get("kind"), str) or isinstance(data["schema_version"], bool):
        return None
    return data if isinstance(data["schema_version"], int) else None


def _study_row(runs_root: Path, path: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    listed = data.get("runs") if isinstance(data.get("runs"), list) else data.get("runs_used")
    workload = settings.get("workload") or settings.get("workloads") or data.get("name")
    if isinstance(workload, list | tuple):
        workload = ", ".join(map(str, workload))
    duration = data.get("study_s", data.get("duration_s"))
    figures = [p for p in sorted(path.parent.glob("*.html")) if p.name != INDEX]
    return {
        "kind": data["kind"],
        "path": path.relative_to(runs_root).as_posix(),
        "created_at": data.get("created_at"),
        "runs": len(listed) if isinstance(listed, list) else None,
        "duration_s": duration if isinstance(duration, int | float) else None,
        "workload": None if workload is None else str(workload),
        "figures": [p.relative_to(runs_root).as_posix() for p in figures],
    }


def _cell(text: Any, sort: Any = None, cls: str = "") -> str:
    """One ``<td>``, its text and sort key (``data-sort``, when not the text) escaped."""
    shown = "" if text is None else str(text)
    attrs = f' class="{cls}"' if cls else ""
    if sort is not None:
        attrs += f' data-sort="{html.escape(str(sort))}"'
    return f"<td{attrs}>{html.escape(shown)}</td>"


def _link(href: str, label: str) -> str:
    return f'<a href="{html.escape(quote(href))}">{html.escape(label)}</a>'


def _number(value: Any, shown: str | None = None) -> str:
    if value is None:
        return _cell("", "")
    return _cell(shown if shown is not None else value, value)


def _run_row(runs_root: Path, row: Mapping[str, Any]) -> str:
    run_id = str(row["run_id"])
    run_dir = runs_root / run_id
    pages = run_pages(run_dir)
    links = [_link(f"{run_id}/{name}", label) for label, name in pages]
    if not any(name == "report.html" for _, name in pages):
        command = f"./cli.py report {shlex.quote(str(run_dir))}"
        links.insert(0, f'<code class="make">{html.escape(command)}</code>')
    status = str(row.get("status") or "unknown")
    duration = row.get("duration_s")
    nbytes = row.get("bytes_read")
    lost = row.get("lost_events") or None  # shown only where there were any
    return (
        f'<tr data-status="{html.escape(status)}">'
        + _cell(run_id, cls="id")
        + _cell((row.get("started_at") or "").replace("T", " ")[:19], row.get("started_at") or "")
        + _cell(status, cls=f"status {_STATUS_CLASS.get(status, '')}")
        + _cell(row.get("workload"))
        + _cell(row.get("variant"))
        + _number(duration, None if duration is None else f"{duration:.1f} s")
        + _number(row.get("steps"))
        + _number(row.get("events"))
        + _number(nbytes, None if nbytes is None else format_size(nbytes))
        + _number(lost)
        + f'<td class="pages">{" ".join(links)}</td>'
        + _cell(row.get("error") or "", cls="note")
        + "</tr>"
    )


def _study_row_html(study: Mapping[str, Any]) -> str:
    duration = study.get("duration_s")
    links = [_link(f, Path(f).name) for f in study["figures"]]
    links.append(_link(study["path"], Path(study["path"]).name))
    return (
        "<tr>"
        + _cell(study["kind"])
        + _cell(str(Path(study["path"]).parent), cls="id")
        + _cell(str(study.get("created_at") or "").replace("T", " ")[:19], study.get("created_at"))
        + _cell(study.get("workload"))
        + _number(study.get("runs"))
        + _number(duration, None if duration is None else f"{duration:.1f} s")
        + f'<td class="pages">{" ".join(links)}</td>'
        + "</tr>"
    )


def _table(
    table_id: str, heads: Sequence[tuple[str, bool]], rows: Sequence[str], first: int
) -> str:
    """A sortable table: ``heads`` (title, numeric), sorted now by column ``first``, descending."""
    cells = "".join(
        f'<th data-num="{int(num)}"'
        + (' aria-sort="descending"' if i == first else "")
        + f">{html.escape(title)}</th>"
        for i, (title, num) in enumerate(heads)
    )
    body = "\n".join(rows) or f'<tr><td colspan="{len(heads)}">none</td></tr>'
    return (
        f'<table id="{table_id}"><thead><tr>{cells}</tr></thead><tbody>\n{body}\n</tbody></table>'
    )


# Sorts a table on a click on a heading: by data-sort (else the text), numerically under a
# data-num heading (empty cells last); a second click reverses the order.
_SCRIPT = """
document.querySelectorAll("table").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var down = th.getAttribute("aria-sort") !== "descending";
      var num = th.dataset.num === "1";
      var key = function (tr) {
        var td = tr.children[col];
        return td ? (td.dataset.sort !== undefined ? td.dataset.sort : td.textContent) : "";
      };
      var rows = Array.from(table.tBodies[0].rows).filter(function (tr) { return tr.children.length > 1; });
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (num) {
          if (x === "" || y === "") { return (x === "") - (y === ""); }
          x = parseFloat(x); y = parseFloat(y);
        }
        var order = x < y ? -1 : x > y ? 1 : 0;
        return down ? -order : order;
      });
      rows.forEach(function (tr) { table.tBodies[0].appendChild(tr); });
      table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", down ? "descending" : "ascending");
    });
  });
});
"""

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; }
table { border-collapse: collapse; font-size: 13px; margin-bottom: 2em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { cursor: pointer; background: #f4f4f4; user-select: none; }
th[aria-sort="descending"]::after { content: " \\25BC"; }
th[aria-sort="ascending"]::after { content: " \\25B2"; }
td.id { font-family: monospace; }
.ok { color: #1a7f37; } .warn { color: #a04000; } .bad { color: #c0392b; font-weight: bold; }
.busy { color: #1f5fbf; } .note { color: #a04000; max-width: 40em; }
code.make { color: #666; font-size: 11px; }
"""

_RUN_HEADS = (
    ("run", False),
    ("started (UTC)", False),
    ("status", False),
    ("workload", False),
    ("variant", False),
    ("duration", True),
    ("steps", True),
    ("events", True),
    ("bytes read", True),
    ("lost events", True),
    ("pages", False),
    ("note", False),
)
_STUDY_HEADS = (
    ("study", False),
    ("folder", False),
    ("created (UTC)", False),
    ("workload", False),
    ("runs", True),
    ("duration", True),
    ("figures and results", False),
)


def index_html(
    runs_root: Path, rows: Sequence[Mapping[str, Any]], studies: Sequence[Mapping[str, Any]]
) -> str:
    """The index page of ``runs_root``: ``rows`` (:func:`analysis.report.list_runs`, newest
    last) shown most recent first, then ``studies`` (:func:`find_studies`)."""
    runs_root = Path(runs_root)
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row.get("status"))] = counts.get(str(row.get("status")), 0) + 1
    tally = ", ".join(f"{n} {html.escape(s)}" for s, n in sorted(counts.items()))
    runs = _table("runs", _RUN_HEADS, [_run_row(runs_root, r) for r in reversed(rows)], 0)
    found = _table("studies", _STUDY_HEADS, [_study_row_html(s) for s in studies], 2)
    title = html.escape(f"twintrace runs: {runs_root}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{title}</title>
<style>{_STYLE}</style></head><body>
<h1>{title}</h1>
<p>{len(rows)} runs{f" ({tally})" if tally else ""}, {len(studies)} study results. Click a
column heading to sort by it. Made by <code>./cli.py runs --html</code>; run it again after new
runs or pages.</p>
<h2>Runs</h2>
{runs}
<h2>Studies</h2>
{found}
<script>{_SCRIPT}</script>
</body></html>
"""


def write_index(runs_root: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write :func:`index_html` of ``rows`` and the studies under ``runs_root`` to
    ``runs_root/index.html``, atomically; return its path."""
    runs_root = Path(runs_root)
    target = runs_root / INDEX
    atomic_write_text(target, index_html(runs_root, rows, find_studies(runs_root)))
    return target
