"""A run asked for by its settings (experiments/request.py): the rules between settings hold
whoever asks, and what is wrong names the settings as the asker spells them (a file's
``rank_containers``, the CLI's ``--rank-containers``)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from core.errors import SettingError, UserError
from experiments.request import TraceSettings, build_request, check_settings

REPO = Path(__file__).resolve().parent.parent


def test_a_setting_error_names_settings_by_name_or_as_the_caller_spells_them() -> None:
    error = SettingError("{rank_containers} needs {accelerators} 2 or more, got {got}", got="{x}")
    assert str(error) == "rank_containers needs accelerators 2 or more, got {x}"
    assert error.settings == ["rank_containers", "accelerators"]
    flags = {"rank_containers": "--rank-containers", "accelerators": "--accelerators"}
    assert error.render(flags) == "--rank-containers needs --accelerators 2 or more, got {x}"
    assert isinstance(error, UserError)


#: (settings, the same run asked for on the command line, the message by setting name).
WRONG: list[tuple[dict[str, Any], list[str], str]] = [
    (
        {"workload": "unet3d", "image": "x"},
        ["--workload", "unet3d", "--image", "x"],
        "give exactly one of workload NAME, image IMAGE or compose FILE",
    ),
    (
        {"image": "x", "rank_containers": True},
        ["--image", "x", "--rank-containers"],
        "rank_containers is for workload runs",
    ),
    (
        {"image": "x", "services": ("a",)},
        ["--image", "x", "--service", "a"],
        "services is for compose runs",
    ),
    (
        {"image": "x", "accelerator": "a100"},
        ["--image", "x", "--accelerator", "a100"],
        "accelerator and profile_model are for workload runs",
    ),
    (
        {"workload": "unet3d", "variant": "dlio", "gpus": "all"},
        ["--workload", "unet3d", "--variant", "dlio", "--gpus", "all"],
        "variant dlio runs on its own dataset and without GPUs: leave out mounts and gpus",
    ),
    (
        {"workload": "unet3d", "storage_host": "h:1", "prep_workers": 2},
        ["--workload", "unet3d", "--storage-host", "h:1", "--prep-workers", "2"],
        "prep_workers and storage_cpus size the run's storage container, which storage_host "
        "replaces",
    ),
    (
        {"image": "x", "nodes": "a,,b"},
        ["--image", "x", "--nodes", "a,,b"],
        "nodes 'a,,b': give a count (3) or node names (node-1,node-3)",
    ),
    (
        {"image": "x", "engine": "unix:///x.sock"},
        ["--image", "x", "--engine", "unix:///x.sock"],
        "engine and registry are for runs across nodes: give nodes",
    ),
    (
        {"image": "x", "sample_interval": 0.0},
        ["--image", "x", "--sample-interval", "0"],
        "sample_interval must be positive, got 0.0",
    ),
    (
        {"image": "x", "net_bandwidth": "fast"},
        ["--image", "x", "--net-bandwidth", "fast"],
        "bad net_bandwidth 'fast'",
    ),
    ({"workload": "unet3d"}, ["--workload", "unet3d"], "data is required"),
]


@pytest.mark.parametrize(("settings", "args", "message"), WRONG, ids=[w[2][:30] for w in WRONG])
def test_wrong_settings_are_named_by_setting_and_on_the_command_line_by_flag(
    tmp_path: Path, settings: dict[str, Any], args: list[str], message: str
) -> None:
    from cli import cli

    with pytest.raises(SettingError) as caught:
        build_request(TraceSettings(**settings), tmp_path, log=lambda msg: None)
    assert str(caught.value).startswith(message), str(caught.value)
    result = CliRunner().invoke(cli, ["trace", *args, "--out", str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    flags = {"mounts": "--mount", "services": "--service"}
    expected = caught.value.render(
        {name: flags.get(name, "--" + name.replace("_", "-")) for name in caught.value.settings}
    )
    assert result.output.strip() == f"Error: {expected}"
    assert not list(tmp_path.iterdir())  # refused before anything was made


def test_the_settings_rules_need_nothing_but_the_settings() -> None:
    # What may run is decided before anything is read: no dataset, engine or image needed.
    check_settings(TraceSettings(image="x", command=("true",)))
    with pytest.raises(SettingError, match="a command is only for image runs"):
        check_settings(TraceSettings(workload="unet3d", command=("true",)))


def _setting_error_templates() -> list[tuple[str, list[str]]]:
    """(file:line, the settings it names) of every ``SettingError("...")`` in the packages."""
    found = []
    for package in ("core", "workloads", "tracing", "experiments", "commands", "store"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", None) == "SettingError"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    values = dict.fromkeys((k.arg for k in node.keywords if k.arg), "v")
                    error = SettingError(node.args[0].value, **values)
                    found.append((f"{path.relative_to(REPO)}:{node.lineno}", error.settings))
    return found


def test_every_setting_an_error_names_is_a_setting_and_an_option_of_trace() -> None:
    from cli import cli

    fields = {f.name for f in dataclasses.fields(TraceSettings)}
    options = {p.name for p in cli.commands["trace"].params}
    templates = _setting_error_templates()
    assert len(templates) >= 30  # the scan sees them
    unknown = [(where, s) for where, names in templates for s in names if s not in fields]
    assert not unknown, unknown
    # Each setting of a run is an option of trace (or its command), but the read throttle of the
    # studies, which the command line does not offer.
    assert fields - options == {"read_limit"}
