"""The runs root's index page (``./cli.py runs --html``, analysis/index_page.py) on a runs root
of synthetic runs (tests/synthetic.py) of known statuses, workloads and figures, plus one
study's results written by ``study_state.finish``: every run and study listed with its figures,
links only to pages that exist, most recent first, run data escaped, a damaged run listed with
exit status 1, and the page's sorting in Chromium.
"""

from __future__ import annotations

import itertools
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import plotly.graph_objects as go
import pytest
from click.testing import CliRunner

import cli as cli_module
from analysis.index_page import INDEX, find_studies, write_index
from analysis.report import list_runs
from experiments import study_state
from store.rundir import write_json
from tests.synthetic import SEC, START_NS, make_run

MIB = 2**20
#: Oldest first: (run id, manifest changes, summary or None, pages in its directory).
COMPLETED = "20261121-163005-unet3d-sleep-0a01"
LOSSY = "20261121-170000-resnet18-original-0a02"
FAILED = "20261122-080000-bert-instrumented-0a03"
HOSTILE_WORKLOAD = "<img src=x onerror=alert(1)>&\"'"
HOSTILE = f"20261122-090000-{HOSTILE_WORKLOAD}-sleep-0a04"
HOSTILE_ERROR = "<script>alert('run')</script>"
STUDY_FOLDER = "hfta/20261122-100000-resnet18"


def _summary(run_id: str, duration_s: float, steps: int, read_bytes: int, lost: int) -> dict:
    return {
        "run_id": run_id,
        "status": "completed",
        "duration_s": duration_s,
        "steps": steps,
        "lost_events": lost,
        "syscalls": {
            "read": {"count": 80, "bytes": read_bytes},
            "pread64": {"count": 4, "bytes": MIB},
            "write": {"count": 3, "bytes": 5 * MIB},  # written, not read
            "openat": {"count": 12, "bytes": 0},
        },
        "block": {"block_read": {"count": 10, "bytes": 40960}},
        "page_cache": {"cache_add": {"count": 300, "bytes": 1228800}},
    }


def build_root(root: Path) -> Path:
    """A runs root of four runs and one hfta study (see the module doc); returns it."""
    done = make_run(root, COMPLETED, started_at="2026-11-21T16:30:05.000+00:00")
    write_json(done / "summary.json", _summary(COMPLETED, 12.5, 40, 3 * MIB, 0))
    for name in ("report.html", "timeline.html", f"compare-{LOSSY}.html"):
        (done / name).write_text("<html></html>")
    (done / "comparison-x.json").write_text("{}")  # not a page
    lossy = make_run(root, LOSSY, status="lossy", started_at="2026-11-21T17:00:00.000+00:00")
    write_json(lossy / "summary.json", _summary(LOSSY, 61.25, 200, 64 * MIB, 7))
    (lossy / "breakdown.html").write_text("<html></html>")
    make_run(
        root,
        FAILED,
        status="failed",
        error="container main exited with status 1",
        started_at="2026-11-22T08:00:00.000+00:00",
        end_ns=START_NS + 3 * SEC,
        skip=("events", "samples", "phases"),
    )
    hostile = make_run(
        root, HOSTILE, status="failed", error=HOSTILE_ERROR, started_at="2026-11-22T09:00:00Z"
    )
    (hostile / "timeline.html").write_text("<html></html>")
    # A study as the studies write one: its folder, its runs under runs/, its results.
    out, study_runs, started = study_state.study_home(root / STUDY_FOLDER)
    make_run(study_runs, "20261122-100100-resnet18-sleep-0b01")
    study_state.save_state(out / "hfta-state.json", {"fingerprint": "f", "runs": {}})
    study_state.finish(
        study_state.results_layout("hfta", 1),
        out,
        {"runs": [{"mode": "serial"}, {"mode": "concurrent"}, {"mode": "fused"}]},
        host={"hostname": "test"},
        settings={"workload": "resnet18", "array_sizes": [1, 2]},
        started=started - 42.0,
        figure=lambda result: go.Figure(),
        table=lambda result: [],
        log=lambda line: None,
    )
    return root


class _Tables(HTMLParser):
    """Each table's body rows: per row, its cells' text and the hrefs and code in them."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[dict[str, Any]]]] = {}
        self.heads: dict[str, list[str]] = {}
        self._table: str | None = None
        self._cell: dict[str, Any] | None = None
        self._in_body = False
        self._in_code = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = str(a["id"])
            self.tables[self._table], self.heads[self._table] = [], []
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th"):
            self._cell = {"text": "", "hrefs": [], "code": "", "sort": a.get("data-sort")}
        elif tag == "a" and self._cell is not None:
            self._cell["hrefs"].append(a["href"])
        elif tag == "code":
            self._in_code = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table, self._in_body = None, False
        elif tag == "code":
            self._in_code = False
        elif tag in ("td", "th") and self._cell is not None and self._table:
            if tag == "th":
                self.heads[self._table].append(self._cell["text"])
            else:
                self.tables[self._table][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell["text"] += data
            if self._in_code:
                self._cell["code"] += data


def parse(text: str) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[str]]]:
    """Each table's rows as {heading: cell}, and each table's headings."""
    parser = _Tables()
    parser.feed(text)
    rows = {
        # A table's "none" row is one cell: under the first heading.
        table: [dict(zip(parser.heads[table], cells, strict=False)) for cells in body]
        for table, body in parser.tables.items()
    }
    return rows, parser.heads


def texts(row: dict[str, dict[str, Any]], columns: tuple[str, ...]) -> list[str]:
    """The text a row of the page shows in each of ``columns``."""
    return [row[c]["text"] for c in columns]


#: What a run was and how it went: the first columns of a run's row.
RUN_HEAD = ("status", "workload", "variant", "duration")


def cli_html(root: Path) -> tuple[Any, Path]:
    result = CliRunner().invoke(cli_module.cli, ["runs", "--out", str(root), "--html"])
    assert "Traceback" not in result.output, result.output
    return result, root / INDEX


def test_every_run_is_listed_most_recent_first_with_its_figures(tmp_path: Path) -> None:
    root = build_root(tmp_path / "runs")
    result, page = cli_html(root)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == str(page)
    rows, _ = parse(page.read_text())
    runs = {r["run"]["text"]: r for r in rows["runs"]}
    # The study's own run lives in its folder: not a run of this root.
    assert [r["run"]["text"] for r in rows["runs"]] == [HOSTILE, FAILED, LOSSY, COMPLETED]
    done, lossy, failed = runs[COMPLETED], runs[LOSSY], runs[FAILED]
    assert texts(done, RUN_HEAD) == ["completed", "unet3d", "sleep", "12.5 s"]
    assert texts(done, ("steps", "events", "bytes read", "lost events")) == [
        "40",
        str(80 + 4 + 3 + 12 + 10),  # syscalls and block requests
        "4.0 MiB",  # read and pread64, not write
        "",  # none lost: nothing shown
    ]
    assert done["started (UTC)"]["text"] == "2026-11-21 16:30:05"
    assert texts(lossy, RUN_HEAD) == ["lossy", "resnet18", "original", "61.2 s"]
    assert lossy["bytes read"]["sort"] == str(65 * MIB) and lossy["lost events"]["text"] == "7"
    assert lossy["steps"]["text"] == "200"
    # No summary: the manifest's duration, no counts, its error.
    assert texts(failed, RUN_HEAD) == ["failed", "bert", "instrumented", "3.0 s"]
    assert failed["steps"]["text"] == failed["bytes read"]["text"] == ""
    assert failed["note"]["text"] == "container main exited with status 1"


def test_links_go_only_to_pages_that_exist(tmp_path: Path) -> None:
    root = build_root(tmp_path / "runs")
    page = write_index(root, list_runs(root))
    rows, _ = parse(page.read_text())
    hrefs = {r["run"]["text"]: r["pages"]["hrefs"] for r in rows["runs"]}
    assert hrefs[COMPLETED] == [
        f"{COMPLETED}/report.html",
        f"{COMPLETED}/timeline.html",
        f"{COMPLETED}/compare-{LOSSY}.html",
    ]
    assert hrefs[LOSSY] == [f"{LOSSY}/breakdown.html"]
    assert hrefs[FAILED] == []
    # No report yet: the command that makes it, not a link.
    codes = {r["run"]["text"]: r["pages"]["code"] for r in rows["runs"]}
    assert codes[COMPLETED] == ""
    assert codes[LOSSY] == f"./cli.py report {root / LOSSY}"
    every = [h for r in rows["runs"] + rows["studies"] for c in r.values() for h in c["hrefs"]]
    assert len(every) == 3 + 1 + 1 + 2  # the hostile run's timeline, the study's figure and JSON
    for href in every:
        assert "://" not in href and not href.startswith("/")  # opens from the file system
        assert (root / unquote(href)).is_file(), href


def test_a_study_is_listed_with_its_figure_and_results(tmp_path: Path) -> None:
    root = build_root(tmp_path / "runs")
    (study,) = find_studies(root)  # not its state file, not its run's files
    assert study["kind"] == "hfta" and study["path"] == f"{STUDY_FOLDER}/hfta.json"
    rows, heads = parse(write_index(root, list_runs(root)).read_text())
    (row,) = rows["studies"]
    assert heads["studies"][0] == "study"
    assert texts(row, ("study", "folder", "workload", "runs")) == [
        "hfta",
        STUDY_FOLDER,
        "resnet18",
        "3",
    ]
    assert float(row["duration"]["sort"]) >= 42.0
    assert row["figures and results"]["hrefs"] == [
        f"{STUDY_FOLDER}/hfta.html",
        f"{STUDY_FOLDER}/hfta.json",
    ]
    created = json.loads((root / STUDY_FOLDER / "hfta.json").read_text())["created_at"]
    assert row["created (UTC)"]["sort"] == created


def test_studies_are_most_recent_first_and_foreign_json_is_not_a_study(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for stamp in ("2026-11-20T10:00:00.000+00:00", "2026-11-23T10:00:00.000+00:00"):
        folder = root / "stalls" / stamp[:10]
        folder.mkdir(parents=True)
        header = {"schema_version": 2, "twintrace_version": "0.1.0", "created_at": stamp}
        (folder / "stalls.json").write_text(json.dumps({**header, "kind": "stalls"}))
        (folder / "other.json").write_text(json.dumps(header))  # no kind: not a study's
        (folder / "broken.json").write_text('{"schema_version": 1, "kind"')
    assert [s["path"] for s in find_studies(root)] == [
        "stalls/2026-11-23/stalls.json",
        "stalls/2026-11-20/stalls.json",
    ]


def test_run_data_is_escaped(tmp_path: Path) -> None:
    root = build_root(tmp_path / "runs")
    text = write_index(root, list_runs(root)).read_text()
    for hostile in (HOSTILE_WORKLOAD, HOSTILE_ERROR, "<img", "<script>alert"):
        assert hostile not in text
    assert text.count("<script>") == 1  # the page's own sorting script
    rows, _ = parse(text)
    (row,) = [r for r in rows["runs"] if r["run"]["text"] == HOSTILE]
    assert row["workload"]["text"] == HOSTILE_WORKLOAD and row["note"]["text"] == HOSTILE_ERROR
    (href,) = row["pages"]["hrefs"]
    assert href.startswith("20261122-090000-%3Cimg%20src%3Dx") and unquote(href) == (
        f"{HOSTILE}/timeline.html"
    )


def test_a_damaged_run_is_listed_and_the_command_exits_1(tmp_path: Path) -> None:
    root = build_root(tmp_path / "runs")
    manifest = root / LOSSY / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])  # cut short
    result, page = cli_html(root)
    assert result.exit_code == 1, result.output
    assert str(manifest) in result.stderr
    assert result.stdout.splitlines()[-1] == str(page)
    rows, _ = parse(page.read_text())
    listed = {r["run"]["text"]: r for r in rows["runs"]}
    assert set(listed) == {COMPLETED, LOSSY, FAILED, HOSTILE}
    damaged = listed[LOSSY]
    assert damaged["status"]["text"] == "damaged" and str(manifest) in damaged["note"]["text"]
    assert damaged["workload"]["text"] == "resnet18"  # from its run id
    assert listed[COMPLETED]["status"]["text"] == "completed"


def test_an_empty_root_gets_a_page_and_json_with_html_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    result, page = cli_html(root)
    assert result.exit_code == 0 and result.stdout.splitlines()[-1] == str(page)
    rows, _ = parse(page.read_text())
    assert [r["run"]["text"] for r in rows["runs"]] == ["none"]
    both = CliRunner().invoke(cli_module.cli, ["runs", "--out", str(root), "--html", "--json"])
    assert both.exit_code == 2 and "--json and --html" in both.output
    missing = CliRunner().invoke(cli_module.cli, ["runs", "--out", str(tmp_path / "x"), "--html"])
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_the_page_sorts_in_chromium(tmp_path: Path) -> None:
    """The rows as Chromium draws them, then sorted by clicks on a heading (a script appended
    to a copy of the page clicks them): a first click sorts descending, a second ascending; a
    numeric column's empty cells stay last."""
    from tests.browser import dom

    root = build_root(tmp_path / "runs")
    page = write_index(root, list_runs(root))
    drawn, _ = parse(dom(page))
    assert [r["run"]["text"] for r in drawn["runs"]] == [HOSTILE, FAILED, LOSSY, COMPLETED]
    assert drawn["studies"][0]["study"]["text"] == "hfta"

    probes = itertools.count()

    def clicked(*headings: int) -> list[str]:
        clicks = "".join(f'document.querySelectorAll("#runs th")[{i}].click();' for i in headings)
        text = page.read_text().replace("</body>", f"<script>{clicks}</script></body>")
        probe = root / f"probe-{next(probes)}.html"
        probe.write_text(text)
        rows, _ = parse(dom(probe))
        return [r["run"]["text"] for r in rows["runs"]]

    # HOSTILE has a manifest duration (10 s), FAILED 3 s.
    assert clicked(5) == [LOSSY, COMPLETED, HOSTILE, FAILED]
    assert clicked(6) == [LOSSY, COMPLETED, HOSTILE, FAILED]  # steps; none: last, in order
    assert clicked(6, 6) == [COMPLETED, LOSSY, HOSTILE, FAILED]  # ascending, none still last
    assert clicked(0) == [COMPLETED, LOSSY, FAILED, HOSTILE]  # was descending: now ascending
    assert clicked(2) == [LOSSY, HOSTILE, FAILED, COMPLETED]  # status, descending


@pytest.mark.parametrize("status", ["completed", "lossy"])
def test_list_runs_adds_the_figures_the_page_shows(tmp_path: Path, status: str) -> None:
    root = tmp_path / "runs"
    run = make_run(root, COMPLETED, status=status)
    write_json(run / "summary.json", _summary(COMPLETED, 1.5, 3, MIB, 2))
    (row,) = list_runs(root)
    assert row["workload"] == "unet3d" and row["variant"] == "sleep" and row["status"] == status
    assert row["bytes_read"] == 2 * MIB and row["lost_events"] == 2 and row["duration_s"] == 1.5
    assert row["started_at"] == "2026-11-21T16:30:05Z" and "error" not in row
