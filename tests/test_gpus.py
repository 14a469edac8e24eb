"""GPUs for the run's containers (`trace --gpus`): what docker is asked for, and what a host
without the NVIDIA container runtime says. No GPU is on the build machines: the device request
the Docker SDK receives is checked, and the refusal of a real daemon without the runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from core.errors import UserError
from tracing import container
from tracing.request import ContainerSpec, RunOptions, image_request


@pytest.mark.parametrize(
    ("text", "count", "ids"),
    [("all", -1, []), ("2", 2, []), ("0,1", 0, ["0", "1"]), ("GPU-3f2a", 0, ["GPU-3f2a"])],
)
def test_gpus_are_parsed_as_docker_reads_them(text: str, count: int, ids: list[str]) -> None:
    request = container.gpu_request(text)
    assert request["Count"] == count and request["DeviceIDs"] == ids
    assert request["Capabilities"] == [["gpu"]]


@pytest.mark.parametrize("text", ["0", "", "1,,2"])
def test_bad_gpus_are_one_clear_error(text: str) -> None:
    with pytest.raises(UserError, match="gpus"):
        ContainerSpec(role="main", image="x", gpus=text)


class _FakeContainers:
    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}

    def run(self, image: str, **kwargs: Any) -> str:
        self.kwargs = kwargs
        return "started"


class _FakeClient:
    def __init__(self) -> None:
        self.containers = _FakeContainers()


def test_the_sdk_receives_the_device_request(tmp_path: Path) -> None:
    fake = _FakeClient()
    started = container.start_held(
        fake,  # type: ignore[arg-type]
        "twintrace/unet3d:original",
        ["python"],
        tmp_path,
        [],
        "run-id",
        "main",
        network=None,
        gpus="0,1",
    )
    assert started == "started"
    (request,) = fake.containers.kwargs["device_requests"]
    assert request["DeviceIDs"] == ["0", "1"] and request["Capabilities"] == [["gpu"]]
    assert fake.containers.kwargs["network_mode"] == "none"
    # No --gpus: no device request at all.
    container.start_held(fake, "x", ["python"], tmp_path, [], "r", "main", network=None)  # type: ignore[arg-type]
    assert "device_requests" not in fake.containers.kwargs


def test_builders_pass_gpus_to_every_container(tmp_path: Path) -> None:
    request = image_request("x", ["true"], tmp_path, run=RunOptions(gpus="all"))
    assert [c.gpus for c in request.containers] == ["all"]


@pytest.mark.integration
@pytest.mark.docker
def test_a_host_without_the_nvidia_runtime_refuses_with_one_line(images, tmp_path: Path) -> None:
    from cli import cli

    info = container.client().info()
    if "nvidia" in (info.get("Runtimes") or {}):
        pytest.skip("this host has the NVIDIA runtime: the refusal cannot be shown here")
    result = CliRunner().invoke(
        cli,
        ["trace", "--image", "twintrace/base:latest", "--gpus", "all", "--quiet"]
        + ["--out", str(tmp_path / "runs"), "--", "true"],
    )
    assert result.exit_code == 1
    assert "docker could not start twintrace/base:latest" in result.output
    assert "Traceback" not in result.output
    doctor = CliRunner().invoke(cli, ["doctor", "--gpus", "--json"])
    assert '"nvidia runtime"' in doctor.output
