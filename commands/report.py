"""``report``: a run's report page (analysis/run_report.py, docs/report.md)."""

from __future__ import annotations

from pathlib import Path

import click

from commands.common import err_console, out_option, runs_root_option, user_errors


@click.command()
@click.argument("run")
@out_option("out_path", "HTML file (default: report.html in the run directory).")
@runs_root_option
@user_errors
def report(run: str, out_path: Path | None, runs_root: Path) -> None:
    """Write a run's report: the job, I/O over time per process, the time per kind of call,
    request sizes, operations and access patterns, files and mount points, the training view
    and imbalance (docs/report.md). Prints the page's path last.

    Example: ./cli.py report runs/20261121-163005-unet3d-sleep-3f2a
    """
    from analysis.run_report import write_report
    from store.rundir import load_run, resolve_run

    loaded = load_run(resolve_run(run, runs_root))
    if loaded.status == "running":
        err_console.print(f"{loaded.run_id} is still running: the report shows it so far")
    with err_console.status("reading the run") as status:
        page = write_report(
            loaded, out_path, progress=lambda what: status.update(f"drawing {what}")
        )
    click.echo(str(page))
