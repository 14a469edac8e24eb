"""The pieces every command shares: the error console, one-line user errors (settings named
by their flags), the ``--out`` options, ``--set`` parsing and the summary of a run.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from core.errors import SettingError, UserError, no_room

# No markup: what we print to stderr holds text of others (a container's log lines, paths,
# errors) in which "[...]" is not markup; styled lines are built with styled(). Lines are not
# cut to a width: in a log file (not a terminal, 80 columns to rich) a path stays whole.
err_console = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def styled(text: str, style: str = "dim", prefix: str = "") -> Text:
    """``prefix`` in ``style`` then ``text`` as it is; without a prefix, ``text`` in ``style``."""
    if prefix:
        return Text.assemble((prefix, style), text)
    return Text(text, style=style)


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn UserError into a one-line message and exit status 1."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SettingError as exc:  # the settings named as this command's flags
            raise click.ClickException(exc.render(flags())) from None
        except UserError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            if not no_room(exc):
                raise
            where = f" writing {exc.filename}" if exc.filename else ""
            raise click.ClickException(
                f"{os.strerror(exc.errno)}{where}: free some space (df -h) or write less, then "
                "run the command again"
            ) from None
        except KeyboardInterrupt as exc:
            err_console.print(str(exc) or "interrupted")
            sys.exit(130)

    return wrapper


def flags() -> dict[str, str]:
    """The running command's settings as its flags (``rank_containers`` -> ``--rank-containers``;
    the command after ``--`` for ``trace --image``)."""
    context = click.get_current_context(silent=True)
    names = {"command": "command after `--`"}
    if context is not None:
        for param in context.command.params:
            if isinstance(param, click.Option) and param.name:
                names[param.name] = max(param.opts, key=len)
    return names


def out_option(
    dest: str, help: str, *, kind: str = "file", required: bool = False, default: Any = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--out`` option of a command: a file (``kind="file"``), a directory (``"dir"``) or
    either (``"any"``), as a Path."""
    path_type = click.Path(
        file_okay=kind in ("file", "any"), dir_okay=kind in ("dir", "any"), path_type=Path
    )
    # No `default` unless there is one: click takes an explicit default=None as a given default
    # and would then no longer report a required option as missing.
    extra = {"default": default, "show_default": True} if default is not None else {}
    return click.option("--out", dest, type=path_type, required=required, help=help, **extra)


def _directory_option(flag: str, dest: str, help: str) -> Callable[..., Any]:
    return click.option(
        flag,
        dest,
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("runs"),
        show_default=True,
        help=help,
    )


#: ``--out``: the directory holding run directories (where a run is written).
runs_option = _directory_option("--out", "runs_root", "Directory holding run directories.")
#: ``--runs-root``: where run ids given as arguments are looked up.
runs_root_option = _directory_option(
    "--runs-root", "runs_root", "Directory where run ids given as arguments are looked up."
)


def json_option(help: str = "Print the result as JSON on stdout.") -> Callable[..., Any]:
    """``--json`` (as ``as_json``): print what the command found as JSON instead of a table."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def set_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--set KEY=VALUE`` (repeatable): the workload's options, as ``options``, a dict."""
    return click.option(
        "--set",
        "options",
        multiple=True,
        callback=lambda ctx, param, values: parse_sets(values),
        help=help,
    )


def swarm_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--cluster``, ``--engine`` and ``--registry``: which swarm a run across ``--nodes``
    uses (docs/cluster.md)."""
    for option in reversed(
        (
            click.option(
                "--cluster",
                default="twintrace",
                show_default=True,
                help="With --nodes: the virtual cluster's name.",
            ),
            click.option(
                "--engine",
                metavar="URL",
                default=None,
                help="With --nodes: a real swarm, by its manager's engine (unix:///..., "
                "tcp://..., ssh://user@manager); ./cli.py cluster check --engine URL checks it "
                "first.",
            ),
            click.option(
                "--registry",
                metavar="HOST:PORT",
                default=None,
                help="With --engine: the registry the swarm's nodes pull the run's images from "
                "(pushed there through the manager); without it the nodes must have them.",
            ),
        )
    ):
        func = option(func)
    return func


def data_option(
    help: str, *, required: bool = True, dest: str = "data_dir"
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--data``: a dataset directory, as a Path."""
    return click.option(
        "--data",
        dest,
        type=click.Path(file_okay=False, path_type=Path),
        required=required,
        help=help,
    )


def one_line_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
    """The library's warnings (a foreign CPU profile, ...) as one plain line on stderr."""
    err_console.print(styled(f" {message}", "yellow", "warning:"), soft_wrap=True)


def print_checks(checks: list[Any], as_json: bool) -> None:
    """doctor's and cluster check's table (or JSON); exit status 1 when one fails."""
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        table = Table("check", "status", "detail", "fix")
        for c in checks:
            table.add_row(
                c.name,
                "[green]pass[/]" if c.ok else "[red]FAIL[/]",
                Text(c.detail),
                Text("" if c.ok else c.fix),
            )
        Console().print(table)
    if not all(c.ok for c in checks):
        sys.exit(1)


def parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    options = {}
    for item in values:
        if "=" not in item:
            raise UserError(f"--set {item!r}: use KEY=VALUE, e.g. --set patch_size=64")
        key, value = item.split("=", 1)
        options[key.strip()] = value.strip()
    return options


def print_summary(run_dir: Path) -> None:
    from analysis.report import run_summary_lines

    for line in run_summary_lines(run_dir):
        err_console.print(line, highlight=False)


def fmt_s(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s"


def numbers(text: str | None, what: str, kind: type) -> list[Any]:
    """Comma-separated numbers of ``kind`` (none for no text); a one-line UserError naming the
    option ``what`` otherwise."""
    try:
        return [kind(v) for v in (text or "").split(",") if v.strip()]
    except ValueError:
        raise UserError(
            f"{what}: give {'whole ' if kind is int else ''}numbers separated by commas, "
            f"got {text!r}"
        ) from None
