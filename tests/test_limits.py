"""Per-container limits from every place a run is described (the CLI's settings, a compose
service) to the engine's request, one host or a swarm's service; a bad one refused in one line.
The limits at work, for real: test_trace_integration.py (memory, processes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core.errors import UserError
from experiments.request import TraceSettings, run_options
from tests.test_gpus import _FakeClient
from tracing import container
from tracing.request import ContainerSpec, RunOptions, image_request
from tracing.topology import service_spec


def test_the_pids_limit_reaches_the_engine_from_settings_and_compose(tmp_path: Path) -> None:
    run = run_options(TraceSettings(image="x", pids_limit=64))
    (spec,) = image_request("x", ["true"], tmp_path, run=run).containers
    assert spec.pids_limit == 64
    fake = _FakeClient()
    held = container.Held("x", ["true"], tmp_path, [], "r", "main")
    container.start_held(fake, dataclasses.replace(held, pids_limit=64), network=None)  # type: ignore[arg-type]
    assert fake.containers.kwargs["pids_limit"] == 64
    container.start_held(fake, held, network=None)  # type: ignore[arg-type]
    assert "pids_limit" not in fake.containers.kwargs  # none given: the engine's default
    # A compose service's own limit, or the run's.
    own = service_spec("s", {"image": "x", "pids_limit": 32}, run, Path("."))
    deploy = {"image": "x", "deploy": {"resources": {"limits": {"pids": 16}}}}
    assert own.pids_limit == 32 and service_spec("s", deploy, run, Path(".")).pids_limit == 16
    assert service_spec("s", {"image": "x"}, RunOptions(), Path(".")).pids_limit is None


def test_a_swarm_service_gets_the_pids_limit_in_its_task_resources(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tracing import swarm

    made: list = []

    def create(_manager: object, template: dict, *_: object) -> object:
        made.append(template)
        return type("Service", (), {"name": "s", "id": "0"})()

    monkeypatch.setattr(swarm, "_create", create)
    held = container.Held("x", ["true"], tmp_path, [], "r", "main", pids_limit=8)
    swarm.start_role(None, held, "node-1", network=None)  # type: ignore[arg-type]
    assert made[0]["Resources"]["Limits"]["Pids"] == 8


def test_a_bad_pids_limit_is_one_clear_line() -> None:
    with pytest.raises(UserError, match=r"^pids_limit must be 1 or more, got 0$"):
        ContainerSpec(role="main", image="x", pids_limit=0)
