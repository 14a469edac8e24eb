"""The tracer's container (tracing/tracer_container.py): bpftrace 0.23 from twintrace/tracer, with
``--pid host``, SYS_ADMIN and SYS_NICE alone and read-only kernel mounts, counts another container's system
calls exactly, by its cgroup, on tracepoints and on raw tracepoints."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import docker.errors
import pytest

from tests.conftest import reaped, require_tracing

pytestmark = [pytest.mark.integration, pytest.mark.docker]

#: The target's preads: this many, of this unusual size (nothing else in the container reads so).
PREADS = 1234
SIZE = 4321
JOB = f"""
import os
fd = os.open("/etc/os-release", os.O_RDONLY)
for _ in range({PREADS}):
    os.pread(fd, {SIZE}, 0)
"""


def test_a_host_without_bpftrace_traces_through_the_tracer_image(
    images: dict[str, str], tmp_path: Path
) -> None:
    """`./cli.py trace` with no bpftrace on the host's PATH (nor any other program but what the
    interpreter's folder holds): the run is traced from twintrace/tracer's container, exactly."""
    import json
    import os
    import subprocess
    import sys

    import pandas as pd

    from tests.conftest import REPO

    require_tracing()
    bare = tmp_path / "bin"
    bare.mkdir()
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, str(REPO / "cli.py"), "trace", "--out", str(runs)]
        + ["--image", "twintrace/base:latest", "--", "python3", "-c", JOB],
        env={**os.environ, "PATH": str(bare)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = runs.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["lost_events"] == 0
    assert manifest["host"]["bpftrace_version"].startswith("bpftrace v0.23.")
    assert manifest["host"]["tracer"].startswith("twintrace/tracer:latest sha256:")
    events = pd.read_parquet(run_dir / "events.parquet")
    preads = events[(events["kind"] == "pread64") & (events["path"] == "/etc/os-release")]
    assert preads["count"].sum() == PREADS


def test_the_tracer_image_carries_bpftrace_023(images: dict[str, str]) -> None:
    from tracing.container import client
    from workloads.config import BPFTRACE_LABEL, TRACER_IMAGE

    assert TRACER_IMAGE in images
    cli = client()
    printed = cli.containers.run(TRACER_IMAGE, remove=True).decode().strip()  # its CMD
    version = re.fullmatch(r"bpftrace v(\d+\.\d+\.\d+)", printed)
    assert version, printed
    assert version.group(1).startswith("0.23.")
    assert cli.images.get(TRACER_IMAGE).labels[BPFTRACE_LABEL] == version.group(1)


def test_the_tracer_container_counts_another_containers_calls(
    images: dict[str, str], tmp_path: Path
) -> None:
    require_tracing()
    from tracing import container as ctr
    from tracing.barrier import release
    from tracing.cgroups import cgroups_of
    from tracing.container import AGENT_LABEL
    from tracing.tracer_container import CAPABILITIES, start_tracer
    from workloads.config import BASE_TAG

    cli = ctr.client()
    run_id = f"agent-test-{uuid.uuid4().hex[:8]}"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    target = ctr.start_held(
        cli, ctr.Held(BASE_TAG, ["python3", "-c", JOB], barrier, [], run_id, "main"), network=None
    )
    tracer = None
    try:
        cgroup = cgroups_of(ctr.main_pid(target)).v2_id
        script = (
            f"tracepoint:syscalls:sys_enter_pread64 /cgroup == {cgroup} && args.count == {SIZE}/ "
            "{ @preads = count(); @bytes = sum(args.count); }\n"
            f"rawtracepoint:sys_exit /cgroup == {cgroup}/ {{ @exits = count(); }}\n"
            'BEGIN { printf("ATTACHED\\n"); }\n'
        )
        (out / "count.bt").write_text(script)
        tracer = start_tracer(cli, ["bpftrace", "count.bt"], out, f"{run_id}-tracer")
        attrs = tracer.attrs["HostConfig"]
        assert attrs["CapAdd"] == list(CAPABILITIES) and not attrs["Privileged"]
        assert tracer.labels[AGENT_LABEL] == "1"
        deadline = time.monotonic() + 60
        while b"ATTACHED" not in tracer.logs():
            tracer.reload()
            assert tracer.status == "running", tracer.logs().decode(errors="replace")
            assert time.monotonic() < deadline, "the tracer did not attach within 60 s"
            time.sleep(0.1)
        release(barrier)
        assert target.wait(timeout=120)["StatusCode"] == 0
        tracer.kill(signal=signal.SIGINT)  # bpftrace prints its maps as it exits
        assert tracer.wait(timeout=60)["StatusCode"] == 0
        printed = tracer.logs().decode()
        counts = {k: int(v) for k, v in re.findall(r"@(\w+): (\d+)", printed)}
        assert counts["preads"] == PREADS and counts["bytes"] == PREADS * SIZE, printed
        # Every system call of the container passes sys_exit: at least the preads.
        assert counts["exits"] > PREADS, printed
    finally:
        for c in (tracer, target):
            if c is not None:
                c.remove(force=True)
    left = cli.containers.list(all=True, filters={"label": AGENT_LABEL})
    assert not [c.name for c in left if c.name.startswith(run_id)]


def test_a_tracer_container_whose_owner_is_gone_is_removed(
    images: dict[str, str], tmp_path: Path
) -> None:
    """A tracer left by a process killed with -9 (its owner pid gone) is an orphan that the
    next run removes, as run containers are."""
    import subprocess

    from tracing.container import AGENT_LABEL, OWNER_LABEL, client, remove_orphans
    from tracing.tracer_container import start_tracer

    cli = client()
    gone = subprocess.Popen(["true"])
    gone.wait()
    name = f"agent-orphan-{uuid.uuid4().hex[:8]}"
    tracer = start_tracer(
        cli, ["sleep", "600"], tmp_path, name, labels={OWNER_LABEL: str(gone.pid)}
    )
    mine = start_tracer(cli, ["sleep", "600"], tmp_path, f"{name}-mine")  # owner: this process
    try:
        assert tracer.labels[AGENT_LABEL] == "1"
        removed = remove_orphans(cli)
        assert tracer.short_id in removed
        names = {c.name for c in cli.containers.list(all=True, filters={"label": AGENT_LABEL})}
        assert name not in names and f"{name}-mine" in names
    finally:
        for c in (tracer, mine):
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True)


def test_the_hooks_doctor_checks_are_the_scripts_hooks() -> None:
    from tracing.host import needed_hooks

    hooks = needed_hooks()
    assert {"rawtracepoint:sys_enter", "rawtracepoint:sys_exit"} <= set(hooks)
    assert {"tracepoint:block:block_rq_issue", "tracepoint:sched:sched_process_exit"} <= set(hooks)
    assert "tracepoint:filemap:mm_filemap_add_to_page_cache" in hooks
    # Hooks named only in the scripts' comments are not hooks.
    assert not [h for h in hooks if h.startswith("tracepoint:syscalls:")]


def test_doctor_attaches_every_hook_from_the_tracer_container(images: dict[str, str]) -> None:
    require_tracing()
    from tracing.host import _tracer, needed_hooks

    check = _tracer()
    assert check.ok, check
    assert f"all {len(needed_hooks())} hooks attach" in check.detail


def test_a_hook_bpftrace_did_not_find_is_named() -> None:
    from tracing.bpftrace import hooks_not_found

    said = (
        "stdin:1:1-32: WARNING: tracepoint not found: syscalls:sys_enter_X\n"
        "tracepoint:syscalls:sys_enter_X, tracepoint:syscalls:sys_enter_read { }\n"
        "Attaching 3 probes...\n"
    )
    assert hooks_not_found(said) == [said.splitlines()[0]]
    assert hooks_not_found("Attaching 6 probes...\nREADY 1\n") == []


def _agent_containers(run_id: str) -> list:
    from tracing.container import AGENT_LABEL, RUN_LABEL, client

    return [
        c
        for c in client().containers.list(all=True, filters={"label": AGENT_LABEL})
        if (c.labels or {}).get(RUN_LABEL) == run_id
    ]


def _traced_cli(runs: Path, command: str, *options: str) -> tuple[subprocess.Popen[str], Path]:
    """``./cli.py trace`` of ``python3 -c command`` in the base image, started in the
    background: (its process, the run directory once the workload is released)."""
    import json
    import sys

    from tests.conftest import REPO

    proc = subprocess.Popen(
        [sys.executable, str(REPO / "cli.py"), "trace", *options, "--out", str(runs), "--image"]
        + ["twintrace/base:latest", "--", "python3", "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while True:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            proc.wait()
            raise AssertionError("the run never started")
        for found in runs.glob("*/manifest.json") if runs.exists() else []:
            if json.loads(found.read_text()).get("start_ns"):
                return proc, found.parent  # released: the agent traces the workload
        time.sleep(0.1)


def test_a_run_whose_agent_dies_fails_and_leaves_nothing(
    images: dict[str, str], tmp_path: Path
) -> None:
    """The agent's container killed while the workload runs: the run fails saying the agent
    stopped answering; no container, no agent, no bpftrace is left; the manifest says failed."""
    import json

    from tests.conftest import bpftrace_running
    from tracing.container import RUN_LABEL, client

    require_tracing()
    proc, run_dir = _traced_cli(tmp_path / "runs", "import time; time.sleep(120)")
    with reaped(proc):
        (agent,) = _agent_containers(run_dir.name)
        assert bpftrace_running()
        agent.kill()
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "the tracer agent at 127.0.0.1:" in stderr and "stopped answering" in stderr, stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "stopped answering" in manifest["error"]
    assert not client().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_dir.name}"})
    assert bpftrace_running() == []


def test_an_agent_whose_coordinator_is_gone_stops_its_tracer_and_exits(
    images: dict[str, str], tmp_path: Path
) -> None:
    """A coordinator killed with -9 calls no more: after its lease the agent stops bpftrace and
    the samplers, keeps what they wrote, and its container goes."""
    from tests.conftest import bpftrace_running
    from tracing import container as ctr
    from tracing.bpftrace import TRACER_NICE
    from tracing.tracer_container import start_agent
    from workloads.config import BASE_TAG

    require_tracing()
    cli = ctr.client()
    run = tmp_path / f"lease-{uuid.uuid4().hex[:8]}"
    for sub in ("raw", "ctl/main"):
        (run / sub).mkdir(parents=True)
    target = ctr.start_held(
        cli,
        ctr.Held(BASE_TAG, ["python3", "-c", JOB], run / "ctl" / "main", [], run.name, "main"),
        network=None,
    )
    try:
        agent = start_agent(cli, run, lease_s=2.0)
        reply = agent.client.call(
            "Attach",
            {
                "run_id": run.name,
                "run_dir": str(run),
                "containers": [{"role": "main", "container_id": target.id, "barrier": "ctl/main"}],
            },
        )
        assert reply["containers"]["main"]["main_pid"] == ctr.main_pid(target)
        assert sorted(reply["tracer_pids"]) == ["block", "cache", "proc", "syscalls"]
        assert set(reply["tracer_pids"].values()) <= set(bpftrace_running())
        # Every thread of every script at the tracer's priority, above the workload's.
        for pid in reply["tracer_pids"].values():
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
            assert tasks and {os.getpriority(os.PRIO_PROCESS, int(t.name)) for t in tasks} == {
                TRACER_NICE
            }, pid
        agent.client.close()  # the coordinator is gone: no call from here on
        deadline = time.monotonic() + 60
        while _agent_containers(run.name) or bpftrace_running():
            assert time.monotonic() < deadline, "the agent outlived its lease by a minute"
            time.sleep(0.5)
        said = (run / "raw" / "agent.log").read_text()
        assert "lease expired" in said and "exited" in said, said
        assert (run / "raw" / "syscalls.txt").stat().st_size > 0
        assert (run / "raw" / "samples.csv").read_text().startswith("ts_ns,metric")
    finally:
        target.remove(force=True)


def test_a_tracer_stopped_for_a_second_says_it_fell_behind(
    images: dict[str, str], tmp_path: Path
) -> None:
    """bpftrace's user space prints and clears each 100 ms map some time after the interval
    probe asks; if it is 300 ms late the map is written again before its clear, and calls made
    then could vanish unprinted. The syscall tracer stopped (SIGSTOP) for a second while the
    container opens and closes a file every 5 ms: the script's mark finds the uncleared map,
    and the run is lossy, saying so, never completed with quietly missing calls."""
    import json
    import os

    from tests.conftest import bpftrace_running

    require_tracing()
    runs = tmp_path / "runs"
    job = (
        "import os, time\n"
        "end = time.monotonic() + 6\n"
        "while time.monotonic() < end:\n"
        "    os.close(os.open('/etc/os-release', os.O_RDONLY)); time.sleep(0.005)\n"
    )
    proc, run_dir = _traced_cli(runs, job, "--quiet")
    with reaped(proc):
        (tracer,) = [
            pid
            for pid in bpftrace_running()
            if b"syscalls" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        time.sleep(1)
        os.kill(tracer, signal.SIGSTOP)
        time.sleep(1.0)
        os.kill(tracer, signal.SIGCONT)
        _, stderr = proc.communicate(timeout=120)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "lossy", (manifest["status"], manifest["error"], stderr)
    assert manifest["tracer_behind"] >= 1
    assert "fell more than 300 ms behind" in manifest["error"]
    assert bpftrace_running() == []
