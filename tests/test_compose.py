"""docker-compose.yml: generated from the workload registry (images/compose.py), and usable with
the docker-compose the set-up installs (checked for real: `config`, then `run` of a tiny job)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from images.build import (
    BASE_TAG,
    REPO,
    image_matrix,
    workload_build_args,
    workload_dockerfile,
)
from images.compose import COMPOSE_FILE, main, render
from tests.conftest import require
from workloads.config import image_tag

VOLUMES = [
    "${DATA:-./data}:/data:ro",
    "${OUT:-./out}:/twintrace/out",
    "${CONFIG_DIR:-./config}:/twintrace/ctl:ro",
]


def test_committed_compose_file_is_the_generated_one() -> None:
    assert COMPOSE_FILE == REPO / "docker-compose.yml"
    assert COMPOSE_FILE.read_text() == render(), (
        "docker-compose.yml is out of date: run `.venv/bin/python -m images.compose`"
    )


def test_every_image_is_a_service_built_like_cli_build() -> None:
    services = yaml.safe_load(render())["services"]
    assert list(services) == ["base"] + [f"{w}-{v}" for w, v in image_matrix()]
    assert services["base"]["image"] == BASE_TAG
    for workload, variant in image_matrix():
        service = services[f"{workload}-{variant}"]
        assert service["image"] == image_tag(workload, variant)
        assert service["build"] == {
            "context": ".",
            "dockerfile": workload_dockerfile(workload),
            "args": workload_build_args(workload, variant),
        }
        assert (REPO / service["build"]["dockerfile"]).is_file()
        assert service["volumes"] == VOLUMES  # from the x-workload anchor
        assert service["depends_on"] == ["base"] and service["shm_size"] == "1g"


def test_check_entry_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "compose.yml"
    assert main(["--check", "--out", str(out)]) == 1
    assert "out of date" in capsys.readouterr().out
    assert main(["--out", str(out)]) == 0
    assert out.read_text() == render()
    assert main(["--check", "--out", str(out)]) == 0


# -- integration: the real docker-compose ------------------------------------------------------


def _require_compose() -> str:
    """The docker-compose command; skips (fails in CI) without it or without a Docker engine."""
    from core.errors import UserError
    from tracing.container import client

    missing = []
    command = shutil.which("docker-compose")
    if command is None:
        missing.append("docker-compose is not installed (`make setup` installs it)")
    try:
        client()
    except UserError as exc:
        missing.append(str(exc))
    require(not missing, "; ".join(missing))
    assert command is not None
    return command


def _compose(command: str, project: str, env: dict[str, str], *args: str) -> tuple[str, str]:
    """Run docker-compose on the committed file; its (stdout, stderr)."""
    done = subprocess.run(
        [command, "--ansi", "never", "-p", project, "-f", str(COMPOSE_FILE), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    assert done.returncode == 0, f"docker-compose {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout, done.stderr


@pytest.mark.integration
@pytest.mark.docker
def test_compose_runs_a_tiny_dlrm_sleep_job(tmp_path: Path) -> None:
    from datagen.dlrm import generate_dlrm
    from images.build import build
    from tracing.container import client
    from workloads.registry import WORKLOADS

    command = _require_compose()
    data, out, ctl = tmp_path / "data", tmp_path / "out", tmp_path / "ctl"
    generate_dlrm(data, 3_000_000, seed=3)
    out.mkdir()
    ctl.mkdir()
    steps, batch = 3, 1024
    config = WORKLOADS["dlrm"].config(
        "sleep", epochs=1, workers=0, batch_size=batch, max_steps=steps, checkpoint_every=0
    )
    config.save(ctl / "config.json")
    env = {"DATA": str(data), "OUT": str(out), "CONFIG_DIR": str(ctl)}
    project = f"twintrace-test-{secrets.token_hex(4)}"

    # `config` resolves the file as compose reads it: the volumes interpolated from the environment.
    resolved = yaml.safe_load(_compose(command, project, env, "config")[0])["services"]
    assert set(resolved) == {"base"} | {f"{w}-{v}" for w, v in image_matrix()}
    service = resolved["dlrm-sleep"]
    assert service["image"] == "twintrace/dlrm:sleep"
    assert service["build"]["args"] == {
        "WORKLOAD": "dlrm",
        "VARIANT": "sleep",
        "BASE_TAG": BASE_TAG,
    }
    assert sorted(service["volumes"]) == sorted(
        [f"{data}:/data:ro", f"{out}:/twintrace/out:rw", f"{ctl}:/twintrace/ctl:ro"]
    )

    build(client(), ["dlrm"], ["sleep"])  # up to date after `make test`'s build: a no-op
    try:
        stdout, stderr = _compose(command, project, env, "run", "--rm", "--no-deps", "dlrm-sleep")
    finally:
        _compose(command, project, env, "down")
    # The workload's own report (it prints to stderr; compose passes both streams through).
    assert f"epoch 1: {steps} steps, {steps * batch} samples" in stdout + stderr
    events = [
        json.loads(line.removeprefix(":::MLLOG "))
        for line in (out / "mllog.log").read_text().splitlines()
    ]
    keys = [e["key"] for e in events]
    assert keys.count("step_end") == steps
    assert keys[0] == "init_start" and keys[-1] == "run_stop"
    assert all(e["metadata"]["file"].startswith("/opt/twintrace/workloads/") for e in events)


@pytest.mark.integration
@pytest.mark.docker
@pytest.mark.bpftrace
def test_trace_compose_runs_one_service_of_the_committed_file_traced(
    images, tmp_path: Path
) -> None:
    """`./cli.py trace --compose docker-compose.yml --service dlrm-sleep`: the service runs under
    the tracer, its reads and its MLLOG phases land in the run, and nothing is left running."""
    from datagen.dlrm import generate_dlrm
    from tracing.container import RUN_LABEL, client
    from workloads.registry import WORKLOADS

    _require_compose()
    data, out, ctl, runs = (tmp_path / d for d in ("data", "out", "ctl", "runs"))
    generate_dlrm(data, 3_000_000, seed=3)
    out.mkdir()
    ctl.mkdir()
    steps, batch = 3, 1024
    WORKLOADS["dlrm"].config(
        "sleep", epochs=1, workers=0, batch_size=batch, max_steps=steps, checkpoint_every=0
    ).save(ctl / "config.json")
    env = {"DATA": str(data), "OUT": str(out), "CONFIG_DIR": str(ctl)}
    done = subprocess.run(
        [sys.executable, str(REPO / "cli.py"), "trace", "--compose", str(COMPOSE_FILE)]
        + ["--service", "dlrm-sleep", "--out", str(runs), "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert [c["role"] for c in manifest["containers"]] == ["dlrm-sleep"]
    assert manifest["source"] == str(COMPOSE_FILE)
    events = pd.read_parquet(run_dir / "events.parquet")
    train = events[
        (events["kind"].astype(str) == "pread64")
        & events["path"].str.endswith("train_data.bin", na=False)
    ]
    # One pread64 of batch x 160 bytes per step, all from the service's container (a row may
    # stand for several calls: the tracer aggregates a thread's fast reads).
    assert train["count"].sum() == steps and (train["bytes"] == train["count"] * batch * 160).all()
    assert set(train["container"]) == {"dlrm-sleep"}
    phases = pd.read_parquet(run_dir / "phases.parquet")
    assert (phases["key"].astype(str) == "step_end").sum() == steps
    assert not client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"})
