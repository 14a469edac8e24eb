"""CLI behaviour through click's CliRunner: documentation, bad input, run listing."""

from __future__ import annotations

import inspect
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import cli as cli_module
from core.atomic import atomic_write_json
from store.rundir import SCHEMA_VERSION, initial_manifest, new_run_dir, write_json


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    """Every command and group under ``group``, by its path (``"plot timeline"``)."""
    out = []
    for name, cmd in group.commands.items():
        out.append((f"{prefix}{name}", cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, f"{prefix}{name} ")
    return out


def examples(cmd: click.Command) -> list[str]:
    """The command lines of the last paragraph of ``cmd``'s docstring, which must be
    ``Example: LINE`` or ``Examples:`` followed by one line each."""
    text = inspect.cleandoc(cmd.help or "")
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    assert paragraphs, "no docstring"
    lines = [line.strip() for line in paragraphs[-1].splitlines() if line.strip() not in ("", "\b")]
    head = lines[0]
    if head.startswith("Example:"):
        assert len(lines) == 1, "`Example:` is followed by one command line; use `Examples:`"
        return [head.removeprefix("Example:").strip()]
    assert head == "Examples:" and len(lines) > 1, f"the docstring ends with {head!r}"
    return lines[1:]


def _parse(argv: list[str], where: Path) -> click.Command:
    """Descend the groups along ``argv`` and parse the rest with the command it names (types,
    choices, required options), as click would before running it."""
    cmd: click.Command = cli_module.cli
    while isinstance(cmd, click.Group):
        assert argv and argv[0] in cmd.commands, f"no command {argv[:1]} under {cmd.name}"
        cmd, argv = cmd.commands[argv[0]], argv[1:]
    # Paths that must exist (--compose FILE) are made, empty, in a scratch directory.
    for param in cmd.params:
        kind = param.type
        if isinstance(kind, click.Path) and kind.exists:
            for opt in param.opts:
                if opt in argv[:-1]:
                    target = where / argv[argv.index(opt) + 1]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if kind.file_okay:
                        target.touch()
                    else:
                        target.mkdir()
    with cmd.make_context(cmd.name or "cli", list(argv)):
        pass
    return cmd


@pytest.mark.parametrize(
    "name,cmd",
    [("", cli_module.cli), *_commands(cli_module.cli)],
    ids=["cli", *(name for name, _ in _commands(cli_module.cli))],
)
def test_every_command_is_documented_with_an_example(
    name: str, cmd: click.Command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The house style: each command's docstring (its --help) ends with an example of its use, and the
    # example is a valid command line of this very command (a group: of one of its commands).
    monkeypatch.chdir(tmp_path)
    for line in examples(cmd):
        argv = shlex.split(line)
        assert argv[0] == "./cli.py", line
        assert argv[1 : 1 + len(name.split())] == name.split(), f"{line!r} is not `{name}`"
        leaf = _parse(argv[1:], tmp_path)
        assert not isinstance(cmd, click.Group) or leaf is not cmd
        if not isinstance(cmd, click.Group):
            assert leaf is cmd


def test_the_example_check_catches_a_wrong_example(tmp_path: Path) -> None:
    with pytest.raises(click.UsageError):
        _parse(["export", "runs/RUN", "--format", "pdf"], tmp_path)
    with pytest.raises(click.UsageError):
        _parse(["profile", "fit", "runs/RUN"], tmp_path)  # --out is required
    with pytest.raises(AssertionError):
        examples(click.Command("x", help="Do things.\n\nSee the docs."))


@pytest.mark.parametrize(
    "args,message",
    [
        (["datagen", "unet3d", "--out", "{tmp}/d", "--size", "lots"], "cannot parse size"),
        (["trace", "--workload", "nosuch", "--data", "{tmp}"], "unknown workload"),
        (
            ["trace", "--workload", "unet3d", "--variant", "fast", "--data", "{tmp}"],
            "Invalid value for '--variant'",
        ),
        (["trace", "--workload", "unet3d", "--data", "{tmp}/missing"], "{tmp}/missing"),
        (["trace", "--workload", "unet3d", "--data", "{tmp}"], "has no case_NNNNN_x.npy files"),
        (["trace", "--workload", "unet3d"], "--data is required"),
        (["trace", "--workload", "unet3d", "--image", "x"], "exactly one of"),
        (["show", "{tmp}"], "manifest.json"),
        (["plot", "timeline", "{tmp}/nope"], "nope"),
    ],
)
def test_bad_input_gets_one_clear_line_and_a_non_zero_exit(
    tmp_path: Path, args: list[str], message: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(cli_module.cli, args)
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert message.replace("{tmp}", str(tmp_path)).lower() in result.output.lower(), result.output
    assert "Traceback" not in result.output


def test_progress_off_a_terminal_is_plain_lines(tmp_path: Path) -> None:
    # `./cli.py datagen ... 2> log`: a start line and the result, no bar, no markup, no escapes.
    out = tmp_path / "d"
    result = subprocess.run(
        [sys.executable, str(Path(cli_module.__file__)), "datagen", "unet3d", "--out", str(out)]
        + ["--size", "2MB", "--scale", "0.25"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TWINTRACE_NO_REEXEC": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"generating unet3d -> {out} (1.9 MiB)"]
    assert result.stdout.splitlines()[-1].endswith(f"in {out}")
    assert "\x1b" not in result.stderr + result.stdout


def test_runs_and_show(tmp_path: Path) -> None:
    run_dir = new_run_dir(tmp_path, "unet3d", "sleep")
    manifest = initial_manifest(run_dir, image={"tag": "twintrace/unet3d:sleep", "id": "sha256:0"})
    manifest["status"] = "completed"
    manifest["containers"] = [{"role": "main", "image": "twintrace/unet3d:sleep"}]
    atomic_write_json(run_dir / "manifest.json", manifest)
    summary = {
        "run_id": run_dir.name,
        "status": "completed",
        "duration_s": 2.5,
        "steps": 4,
        "lost_events": 0,
        "syscalls": {"read": {"count": 3, "bytes": 300}},
        "block": {},
        "page_cache": {},
    }
    write_json(run_dir / "summary.json", summary)
    assert json.loads((run_dir / "summary.json").read_text())["schema_version"] == SCHEMA_VERSION
    runner = CliRunner()
    listed = runner.invoke(cli_module.cli, ["runs", "--out", str(tmp_path), "--json"])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.output)
    assert row["run_id"] == run_dir.name and row["steps"] == 4 and row["events"] == 3
    assert row["image"] == "twintrace/unet3d:sleep" and row["containers"] == 1
    shown = runner.invoke(cli_module.cli, ["show", run_dir.name, "--out", str(tmp_path), "--json"])
    assert shown.exit_code == 0 and json.loads(shown.output)["steps"] == 4
    # A second run directory in the same second never reuses the first.
    assert new_run_dir(tmp_path, "unet3d", "sleep") != run_dir
