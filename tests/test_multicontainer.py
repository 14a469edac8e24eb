"""Integration: runs of several containers (roles) traced by one tracer set, checked against
ground truth: each container's opens and bytes, a joint release, and a clean stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pandas as pd
import pytest

from store.rundir import load_run
from tests.conftest import (
    REPO,
    assert_failed_run,
    bpftrace_running,
    left_behind,
    reaped,
    run_label,
    start_cli,
    traced_events,
)
from tracing.container import BindMount, client
from tracing.request import ContainerSpec, RunRequest, workload_request
from tracing.runner import trace
from workloads.config import BASE_TAG as BASE

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.bpftrace]

READ_KINDS = ["read", "pread64", "readv"]
READER = (
    "import os, sys\n"
    "root = sys.argv[1]\n"
    "for name in sorted(os.listdir(root)):\n"
    "    with open(os.path.join(root, name), 'rb') as fh:\n"
    "        fh.read()\n"
)


def test_two_containers_each_show_exactly_their_own_opens_and_bytes(
    images, tmp_path: Path, runs_root: Path
) -> None:
    shards = {}
    for role, sizes in (("left", [1, 5000, 70_001]), ("right", [4096, 123_457, 2, 300_000])):
        shard = tmp_path / role
        shard.mkdir()
        for i, size in enumerate(sizes):
            (shard / f"{role}{i}.bin").write_bytes(os.urandom(size))
        shards[role] = shard
    request = RunRequest(
        label="pair",
        runs_root=runs_root,
        containers=tuple(
            ContainerSpec(
                role=role,
                image=BASE,
                command=("python3", "-c", READER, "/data"),
                mounts=(BindMount(shard, "/data", True),),
            )
            for role, shard in shards.items()
        ),
    )
    outcome = trace(request)
    run_dir = outcome.check()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [c["role"] for c in manifest["containers"]] == ["left", "right"]
    assert all(c["exit_code"] == 0 for c in manifest["containers"])
    assert manifest["trace"]["network"] == "internal" and manifest["lost_events"] == 0
    events = traced_events(run_dir)
    for role, shard in shards.items():
        mine = events[events["container"] == role]
        data_opens = mine[(mine["kind"] == "openat") & mine["path"].str.startswith("/data/")]
        assert sorted(data_opens["path"]) == sorted(f"/data/{p.name}" for p in shard.iterdir())
        for path in shard.iterdir():
            reads = mine[mine["kind"].isin(READ_KINDS) & (mine["path"] == f"/data/{path.name}")]
            assert reads["bytes"].sum() == path.stat().st_size, (role, path.name)
    # Every /data open is attributed to one of the two containers, none to nobody.
    all_opens = events[(events["kind"] == "openat") & events["path"].str.startswith("/data/")]
    assert len(all_opens) == 7 and all_opens["container"].notna().all()
    # Both released at once: their first exec (the barrier shell becoming python) within ms.
    execs = events[events["kind"] == "exec"].groupby("container")["ts_ns"].min()
    assert set(execs.index) == {"left", "right"}
    gap_ms = abs(int(execs["left"]) - int(execs["right"])) / 1e6
    print(f"release gap between the two containers: {gap_ms:.2f} ms")
    assert gap_ms < 25
    samples = pd.read_parquet(run_dir / "samples.parquet")
    cpu_roles = set(samples.loc[samples["metric"] == "container_cpu", "container"])
    assert cpu_roles == {"left", "right"}
    for role in shards:
        assert (run_dir / "raw" / role / "container.log").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["containers"]) == {"left", "right"}
    assert summary["containers"]["left"]["syscalls"]["openat"]["count"] >= 3
    assert left_behind(run_dir.name) == []


def _expected_shards(n_cases: int, world: int, seed: int) -> dict[str, list[int]]:
    from torch.utils.data.distributed import DistributedSampler

    shards = {}
    for rank in range(world):
        sampler = DistributedSampler(
            range(n_cases), num_replicas=world, rank=rank, shuffle=True, seed=seed
        )
        sampler.set_epoch(1)  # the training loop counts epochs from 1
        shards[f"rank{rank}"] = sorted(set(sampler))
    return shards


@pytest.mark.parametrize("variant", ["sleep", "original"])
def test_rank_containers_read_disjoint_shards(
    images, tiny_unet3d: Path, runs_root: Path, variant: str
) -> None:
    settings = {"epochs": 1, "batch_size": 1, "workers": 1, "accelerators": 2, "seed": 0}
    if variant == "original":
        settings["checkpoint_every"] = 0  # gloo all-reduces every step: the ranks must meet
    request = workload_request(
        "unet3d",
        variant,
        tiny_unet3d,
        runs_root,
        settings=settings,
        options={"patch_size": "32"},
        rank_containers=True,
    )
    assert [c.role for c in request.containers] == ["rank0", "rank1"]
    run_dir = trace(request).check()
    events = traced_events(run_dir)
    cases = sorted(p.name[: -len("_x.npy")] for p in tiny_unet3d.glob("case_*_x.npy"))
    shards = _expected_shards(len(cases), 2, seed=0)
    for role, indices in shards.items():
        mine = events[(events["container"] == role) & events["path"].str.startswith("/data/case_")]
        expected = {f"/data/{cases[i]}_{xy}.npy" for i in indices for xy in "xy"}
        opened = set(mine.loc[mine["kind"] == "openat", "path"])
        assert opened == expected, role
        for path in expected:
            size = (tiny_unet3d / path.removeprefix("/data/")).stat().st_size
            read = mine.loc[mine["kind"].isin(READ_KINDS) & (mine["path"] == path), "bytes"].sum()
            assert size <= read <= size + 16384, (role, path)
    if len(cases) % 2 == 0:
        assert not set(shards["rank0"]) & set(shards["rank1"])
    assert load_run(run_dir).data_mounts == ("/data",)  # not the config, not the profile
    phases = pd.read_parquet(run_dir / "phases.parquet")
    ends = phases[phases["key"] == "step_end"]
    steps = ends.groupby("container").size()
    assert dict(steps) == {"rank0": -(-len(cases) // 2), "rank1": -(-len(cases) // 2)}
    # The ranks meet in an all-reduce at every step (DDP's gradients, or the emulated one):
    # each step ends on both containers within a few ms.
    per_step = ends.pivot_table(index=["epoch", "step"], columns="container", values="ts_ns")
    gaps_ms = (per_step["rank0"] - per_step["rank1"]).abs() / 1e6
    print(f"{variant}: step-end gaps between the rank containers {gaps_ms.round(2).tolist()} ms")
    if variant == "sleep":
        assert (gaps_ms < 20).all()  # the emulated step ends right after the meeting
    else:
        # A real step logs its end after the loss's own all-reduce and .item(): one rank can be
        # descheduled in between on 2 cores (4 processes), so only the typical step is tight.
        assert gaps_ms.median() < 20 and (gaps_ms < 500).all()
    assert left_behind(run_dir.name) == []


#: A service's command (YAML flow form) that runs until it is stopped.
FOREVER = '["python3", "-c", "import time\\nwhile True: time.sleep(0.1)"]'


def _pair(tmp_path: Path, commands: dict[str, str]) -> Path:
    """A compose file at ``tmp_path/pair.yml``: a service of the base image per entry of
    ``commands`` (name -> its command in YAML flow form)."""
    services = "".join(
        f"  {name}:\n    image: {BASE}\n    command: {command}\n"
        for name, command in commands.items()
    )
    compose = tmp_path / "pair.yml"
    compose.write_text(f'version: "3.7"\nservices:\n{services}')
    return compose


def test_ctrl_c_stops_every_container_of_a_compose_topology(
    images, tmp_path: Path, runs_root: Path
) -> None:
    compose = _pair(tmp_path, {"ping": FOREVER, "pong": FOREVER})
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "cli.py"), "trace", "--compose", str(compose)]
        + ["--out", str(runs_root), "--quiet"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    run_dir = None
    with reaped(proc):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            dirs = list(runs_root.glob("*")) if runs_root.exists() else []
            if dirs and (dirs[0] / "manifest.json").exists():
                manifest = json.loads((dirs[0] / "manifest.json").read_text())
                if manifest.get("start_ns"):
                    run_dir = dirs[0]
                    assert bpftrace_running()
                    # two containers, one network, the run's tracer agent
                    assert len(left_behind(run_dir.name)) == 3 + 1
                    break
            time.sleep(0.2)
        assert run_dir is not None, "the trace never started"
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr.decode()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert [c["role"] for c in manifest["containers"]] == ["ping", "pong"]
    assert left_behind(run_dir.name) == []
    assert bpftrace_running() == []


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ('["sh", "-c", "exit 4"]', "container quits exited with code 4"),
        ('["no-such-program"]', "no-such-program: not found"),
    ],
    ids=["exits-at-once", "cannot-start"],
)
def test_a_compose_service_that_exits_at_once_fails_the_run_naming_it(
    images, tmp_path: Path, runs_root: Path, command: str, says: str
) -> None:
    """A service that exits the moment it starts, or whose program does not exist: the run
    fails in one line naming the service, the other service is stopped, nothing is left."""
    compose = _pair(tmp_path, {"waits": FOREVER, "quits": command})
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(REPO / "cli.py"), "trace", "--compose", str(compose)]
        + ["--out", str(runs_root), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert time.monotonic() - started < 120  # the waiting service did not hold the run up
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    # The error, then (its last lines) what the service printed before it ended.
    error = done.stderr[done.stderr.rindex("Error: ") :]
    assert error.startswith("Error: container quits exited with code ") and says in error, error
    (run_dir,) = runs_root.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and says in manifest["error"]
    assert left_behind(run_dir.name) == []
    assert bpftrace_running() == []


def test_a_network_removed_by_someone_else_fails_the_run_saying_so(
    images, tmp_path: Path, runs_root: Path
) -> None:
    """While a two-service run runs, someone else disconnects its containers from the run's
    network and removes it (`docker network disconnect -f`, `docker network rm`): the run
    ends as its services do, failed, saying what happened, with its trace processed and
    nothing of it left."""
    wait = '["python3", "-c", "import time; time.sleep(6)"]'
    compose = _pair(tmp_path, {"ping": wait, "pong": wait})
    proc = start_cli("trace", "--compose", str(compose), "--out", str(runs_root), "--quiet")
    cli = client()
    with reaped(proc):
        deadline = time.monotonic() + 120
        label = run_label(runs_root, proc, deadline)
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not start"
            nets = cli.networks.list(filters={"label": label})
            if len(nets) == 1 and len(cli.networks.get(nets[0].id).containers) == 2:
                break
            time.sleep(0.2)
        net = cli.networks.get(nets[0].id)
        while net.attrs.get("Containers"):  # the engine may still be making an endpoint
            assert time.monotonic() < deadline, net.attrs["Containers"]
            for ctr_id in net.attrs["Containers"]:
                with contextlib.suppress(docker.errors.APIError):
                    net.disconnect(ctr_id, force=True)
            time.sleep(0.1)
            net.reload()
        net.remove()
        _, err = proc.communicate(timeout=120)
    says = (
        f"the run's network {net.name} was removed while it ran (by something other than "
        "twintrace): its containers could no longer reach each other"
    )
    run_dir = assert_failed_run(runs_root, proc.returncode, err, says)
    assert (run_dir / "events.parquet").is_file()


def test_one_failing_container_fails_the_run_and_stops_the_others(images, runs_root: Path) -> None:
    forever = ("python3", "-c", "import time\nwhile True: time.sleep(0.1)")
    request = RunRequest(
        label="fail",
        runs_root=runs_root,
        containers=(
            ContainerSpec(role="waits", image=BASE, command=forever),
            ContainerSpec(role="dies", image=BASE, command=("sh", "-c", "sleep 1; exit 3")),
        ),
    )
    started = time.monotonic()
    outcome = trace(request)
    assert time.monotonic() - started < 60  # the waiting peer did not hold the run up
    assert outcome.status == "failed" and "container dies exited with code 3" in outcome.error
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    codes = {c["role"]: c["exit_code"] for c in manifest["containers"]}
    assert codes == {"waits": None, "dies": 3} and manifest["exit_code"] == 3
    assert left_behind(outcome.run_dir.name) == []
    assert bpftrace_running() == []


def test_a_daemon_runs_until_the_others_are_done(images, runs_root: Path) -> None:
    """A storage-server-like role: reachable by its role name on the run's private network,
    stopped once the client is done; the run completes."""
    server = ("python3", "-m", "http.server", "8000", "--bind", "0.0.0.0", "--directory", "/")
    client_script = (
        "import time, urllib.request\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        print(len(urllib.request.urlopen('http://server:8000/etc/hostname').read()))\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "else:\n"
        "    raise SystemExit('server unreachable')\n"
    )
    request = RunRequest(
        label="daemon",
        runs_root=runs_root,
        containers=(
            ContainerSpec(role="server", image=BASE, command=server, daemon=True),
            ContainerSpec(role="client", image=BASE, command=("python3", "-c", client_script)),
        ),
    )
    run_dir = trace(request).check()
    assert (run_dir / "raw" / "client" / "container.log").read_text().strip() == str(
        len("server\n")
    )
    events = traced_events(run_dir)
    served = events[(events["container"] == "server") & (events["path"] == "/etc/hostname")]
    assert (served["kind"] == "openat").sum() >= 1
    assert left_behind(run_dir.name) == []
