"""Looking at runs: ``runs``, ``show``, ``plot timeline|breakdown``, ``compare``, ``export``."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from commands.common import (
    err_console,
    fmt_s,
    json_option,
    out_option,
    print_summary,
    runs_option,
    runs_root_option,
    styled,
    user_errors,
)
from core.errors import UserError


@click.command("runs")
@runs_option
@json_option("Print the runs as JSON records.")
@click.option(
    "--html",
    "as_html",
    is_flag=True,
    help="Also write index.html at the runs root (every run and study, sortable, with links to "
    "their pages) and print its path last.",
)
@user_errors
def list_runs(runs_root: Path, as_json: bool, as_html: bool) -> None:
    """List runs with their status, duration and steps; with --html also write the runs root's
    index.html (every run and every study's results, with links to their pages; opens from the
    file system) and print its path as the last line. A run whose manifest.json or summary.json
    is damaged is listed as `damaged`, one error line names the file, and the exit status is 1
    (the page is still written).

    Example: ./cli.py runs --out runs --html
    """
    from analysis.report import list_runs as collect

    if as_json and as_html:
        raise click.UsageError("--json and --html do not go together: give one of them")
    if as_html and not runs_root.is_dir():
        raise UserError(
            f"{runs_root} does not exist: start a run with `./cli.py trace` or give --out"
        )
    rows = collect(runs_root)
    page = None
    if as_html:
        from analysis.index_page import write_index

        page = write_index(runs_root, rows)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        err_console.print(f"no runs under {runs_root}: start one with `./cli.py trace`")
    else:
        table = Table("run", "status", "image", "duration", "steps", "events")
        for r in rows:
            table.add_row(
                r["run_id"],
                r["status"],
                r.get("image") or "",
                fmt_s(r.get("duration_s")),
                str(r.get("steps", "")),
                str(r.get("events", "")),
            )
        Console().print(table)
    if page is not None:
        click.echo(str(page))
    damaged = [r["error"] for r in rows if r["status"] == "damaged"]
    for error in damaged[:-1]:
        click.echo(f"Error: {error}", err=True)
    if damaged:
        raise UserError(damaged[-1])


@click.command()
@click.argument("run")
@runs_option
@json_option("Print summary.json (with the manifest's status).")
@user_errors
def show(run: str, runs_root: Path, as_json: bool) -> None:
    """Print a run's summary.

    Example: ./cli.py show runs/20261121-163005-unet3d-sleep-3f2a
    """
    from analysis.report import load_summary
    from store.rundir import resolve_run

    run_dir = resolve_run(run, runs_root)
    if as_json:
        click.echo(json.dumps(load_summary(run_dir), indent=2))
    else:
        print_summary(run_dir)


@click.group()
def plot() -> None:
    """Plots of runs (HTML pages that open offline).

    Example: ./cli.py plot timeline runs/RUN_A runs/RUN_B
    """


@plot.command("timeline")
@click.argument("runs", nargs=-1, required=True)
@out_option("out_path", "HTML file (default: timeline.html in the first run directory).")
@runs_root_option
@user_errors
def plot_timeline(runs: tuple[str, ...], out_path: Path | None, runs_root: Path) -> None:
    """Write a timeline of one or more runs, stacked on a common time axis; print its path.

    Example: ./cli.py plot timeline runs/RUN_A runs/RUN_B --out compare.html
    """
    from analysis.timeline import write_timeline
    from store.rundir import load_run, resolve_run

    loaded = [load_run(resolve_run(r, runs_root)) for r in runs]
    target = out_path or (loaded[0].path / "timeline.html")
    with err_console.status("rendering timeline"):
        write_timeline(loaded, target)
    click.echo(str(target))


@click.command()
@click.argument("real")
@click.argument("emulated")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the JSON breakdown on stdout (overall score under `overall`).",
)
@out_option(
    "out_dir",
    "Directory for compare.html and comparison.json (default: the emulated run's directory).",
    kind="dir",
)
@runs_root_option
@user_errors
def compare(real: str, emulated: str, as_json: bool, out_dir: Path | None, runs_root: Path) -> None:
    """Score how closely an emulated run stresses the storage stack like a real one: per
    resource and aspect in [0, 1] and overall (docs/similarity.md); write an HTML report.

    Example: ./cli.py compare runs/RUN_ORIGINAL runs/RUN_SLEEP --json
    """
    from analysis.compare_report import write_comparison_report
    from analysis.similarity import compare_runs
    from store.rundir import load_run, resolve_run

    real_run = load_run(resolve_run(real, runs_root))
    emulated_run = load_run(resolve_run(emulated, runs_root))
    with err_console.status("comparing runs"):
        comparison = compare_runs(real_run, emulated_run)
    target = out_dir or emulated_run.path
    target.mkdir(parents=True, exist_ok=True)
    name = "compare.html" if out_dir else f"compare-{real_run.run_id}.html"
    report = write_comparison_report(real_run, emulated_run, comparison, target / name)
    data = comparison.to_dict()
    from store.rundir import write_json

    write_json(target / name.replace(".html", ".json").replace("compare", "comparison", 1), data)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        table = Table("aspect", "resource", "score", "measure")
        for a in comparison.aspects:
            score = f"skipped: {a.skipped}" if a.score is None else f"{a.score:.3f}"
            table.add_row(a.title, a.resource, score, a.measure)
        Console().print(table)
        click.echo(f"overall {comparison.overall:.3f}")
    for warning in comparison.warnings:
        err_console.print(styled(f" {warning}", "yellow", "warning:"))
    err_console.print(f"report: {report}")


@plot.command("breakdown")
@click.argument("runs", nargs=-1, required=True)
@out_option("out_path", "HTML file (default: breakdown.html in the first run directory).")
@json_option("Print the breakdown table as JSON records.")
@runs_root_option
@user_errors
def plot_breakdown(
    runs: tuple[str, ...], out_path: Path | None, as_json: bool, runs_root: Path
) -> None:
    """Per-step overall, data-loading and compute time (median, IQR band) vs batch size, one line
    per accelerator count; throughputs, loader latencies and accelerator utilisation (AU), first
    step of each epoch excluded (docs/analysis.md). Needs instrumented or sleep runs.

    Example: ./cli.py plot breakdown runs/RUN_B1 runs/RUN_B2 runs/RUN_B4
    """
    from analysis.breakdown import breakdown_table, write_breakdown
    from store.rundir import load_run, resolve_run

    loaded = [load_run(resolve_run(r, runs_root)) for r in runs]
    target = out_path or (loaded[0].path / "breakdown.html")
    with err_console.status("rendering breakdown"):
        write_breakdown(loaded, target)
    if as_json:
        click.echo(breakdown_table(loaded).to_json(orient="records", indent=2))
    else:
        click.echo(str(target))


@click.command("export")
@click.argument("run")
@click.option(
    "--format", "fmt", type=click.Choice(["perfetto", "csv"]), default="perfetto", show_default=True
)
@out_option(
    "out_path",
    "perfetto: the JSON file (default RUN/trace.json); csv: a directory (default RUN/csv).",
    kind="any",
)
@runs_root_option
@user_errors
def export(run: str, fmt: str, out_path: Path | None, runs_root: Path) -> None:
    """Export a run as a Chrome/Perfetto trace (open it at ui.perfetto.dev) or as CSV files;
    print what was written.

    Example: ./cli.py export runs/RUN --format perfetto
    """
    from analysis.export import export_csv, export_perfetto
    from store.rundir import load_run, resolve_run

    loaded = load_run(resolve_run(run, runs_root))
    with err_console.status(f"exporting {fmt}"):
        if fmt == "perfetto":
            paths = [export_perfetto(loaded, out_path or loaded.path / "trace.json")]
        else:
            paths = export_csv(loaded, out_path or loaded.path / "csv")
    for path in paths:
        click.echo(str(path))
