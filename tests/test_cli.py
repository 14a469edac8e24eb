"""CLI behaviour through click's CliRunner: documentation, bad input, run listing."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from tracing.rundir import atomic_write_json, initial_manifest, new_run_dir

import cli as cli_module


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out = []
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out += _commands(cmd, f"{prefix}{name} ")
        else:
            out.append((f"{prefix}{name}", cmd))
    return out


@pytest.mark.parametrize("name,cmd", _commands(cli_module.cli))
def test_every_command_is_documented_with_an_example(name: str, cmd: click.Command) -> None:
    assert cmd.help and "Example" in cmd.help, name


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


def test_runs_and_show(tmp_path: Path) -> None:
    run_dir = new_run_dir(tmp_path, "unet3d", "sleep")
    manifest = initial_manifest(run_dir, image={"tag": "twintrace/unet3d:sleep", "id": "sha256:0"})
    manifest["status"] = "completed"
    atomic_write_json(run_dir / "manifest.json", manifest)
    summary = {
        "schema_version": 1,
        "run_id": run_dir.name,
        "status": "completed",
        "duration_s": 2.5,
        "steps": 4,
        "lost_events": 0,
        "syscalls": {"read": {"count": 3, "bytes": 300}},
        "block": {},
        "page_cache": {},
    }
    atomic_write_json(run_dir / "summary.json", summary)
    runner = CliRunner()
    listed = runner.invoke(cli_module.cli, ["runs", "--out", str(tmp_path), "--json"])
    assert listed.exit_code == 0
    (row,) = json.loads(listed.output)
    assert row["run_id"] == run_dir.name and row["steps"] == 4 and row["events"] == 3
    shown = runner.invoke(cli_module.cli, ["show", run_dir.name, "--out", str(tmp_path), "--json"])
    assert shown.exit_code == 0 and json.loads(shown.output)["steps"] == 4
    # A second run directory in the same second never reuses the first.
    assert new_run_dir(tmp_path, "unet3d", "sleep") != run_dir
