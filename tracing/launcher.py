"""The agent's container, and its launcher on a node of a swarm.

:func:`agent_container` starts a run's tracer agent (tracing/agent.py) in its container through
an engine, with the least it needs (tracing/tracer_container.py says what and why). The
coordinator calls it with this host's engine (a run on one host); across nodes
(``trace --nodes K``, docs/cluster.md) the coordinator has only the swarm manager's engine, and a
swarm cannot run a service with the agent's settings (``--pid host``, ``--cgroupns host``, a
port published on the node's address). So each node of the run gets one launcher: a service of
one task, placed on that node (``node.hostname==NODE``), in the tracer's image, given its
node's Docker socket. It runs :func:`main` here: starts the agent container through its own
node's engine, writes where the agent listens to ``ctl/<node>/agent.json`` in the run directory
(which every node shares), waits for the agent to exit and exits with its code. Removing the
service (SIGTERM) removes the agent too; an agent whose coordinator went away ends by its lease.

Why a service per node and not one global service: a global service also starts a task on every
node outside the run, and each launcher must know its node's address and output folder, which
one task template cannot say for every node.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors

from core.errors import UserError
from tracing.agent import LEASE_S, PORT
from tracing.container import AGENT_LABEL, OWNER_LABEL, RUN_LABEL, gpu_request

CAPABILITIES: tuple[str, ...] = ("SYS_ADMIN", "SYS_NICE")
#: Added for a run across hosts whose network is capped: the agent puts the caps in its
#: containers' network namespaces (tracing/shaper.py: EgressShaper).
NET_CAPABILITY = "NET_ADMIN"
READ_ONLY: tuple[str, ...] = ("/sys/kernel/tracing", "/sys/kernel/btf", "/sys/fs/cgroup")
#: Where the tracing code is in the tracer's image.
IMAGE_ROOT = "/opt/twintrace"
#: The launcher's answer, in ``ctl/<node>/`` of the run directory.
AGENT_FILE = "agent.json"
#: Where a launcher finds its node's engine.
SOCKET = "/var/run/docker.sock"


def volumes(out: Path) -> dict[str, dict[str, str]]:
    """The tracer's mounts: the kernel's tracing and cgroup trees read-only, ``out`` writable."""
    found = {path: {"bind": path, "mode": "ro"} for path in READ_ONLY if Path(path).exists()}
    found[str(out)] = {"bind": str(out), "mode": "rw"}
    return found


def agent_container(
    cli: docker.DockerClient,
    run_dir: Path,
    *,
    image: str,
    address: str,
    log: Path,
    lease_s: float = LEASE_S,
    gpus: str | None = None,
    args: Sequence[str] = (),
    net_admin: bool = False,
) -> tuple[Any, int]:
    """Start the agent of run ``run_dir`` through engine ``cli``, its port published on
    ``address`` (a port the engine picks), its stderr appended to ``log``; returns the container
    and the port. ``gpus``: the run's GPUs (NVML's counters only). ``net_admin``: it caps its
    containers' network (:data:`NET_CAPABILITY`)."""
    kwargs: dict[str, Any] = {}
    if gpus:
        kwargs["device_requests"] = [gpu_request(gpus)]
        kwargs["environment"] = {"NVIDIA_DRIVER_CAPABILITIES": "utility"}
    try:
        ctr = cli.containers.run(
            image,
            # Its stderr (its log, and a traceback should it fail) into the run directory: the
            # container removes itself as it exits, its own log with it.
            [
                "sh", "-c", 'exec python3 -m tracing.agent "$@" 2>> "$0"', str(log),
                "--listen", f"0.0.0.0:{PORT}",
                "--lease", str(lease_s),
                *args,
            ],
            name=f"{run_dir.name}-agent",
            detach=True,
            auto_remove=True,
            pid_mode="host",
            cgroupns="host",
            cap_add=[*CAPABILITIES, *([NET_CAPABILITY] if net_admin else [])],
            volumes=volumes(run_dir),
            working_dir=IMAGE_ROOT,
            ports={f"{PORT}/tcp": (address, None)},
            labels={AGENT_LABEL: "1", OWNER_LABEL: str(os.getpid()), RUN_LABEL: run_dir.name},
            **kwargs,
        )  # fmt: skip
    except docker.errors.ImageNotFound:
        raise UserError(f"{image} is not built: run `./cli.py build`") from None
    try:
        ctr.reload()
        bound = (ctr.attrs["NetworkSettings"]["Ports"] or {}).get(f"{PORT}/tcp") or []
        if not bound:
            raise UserError("the tracer agent's port was not published")
        return ctr, int(bound[0]["HostPort"])
    except BaseException:
        ctr.remove(force=True)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tracing.launcher", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--node-dir", required=True, help="the node's folder in raw/ and ctl/")
    parser.add_argument("--address", required=True, help="the node's address to publish on")
    parser.add_argument("--image", required=True, help="the tracer's image, as the node knows it")
    parser.add_argument("--lease", type=float, default=LEASE_S)
    parser.add_argument("--gpus", default=None)
    parser.add_argument("--net-admin", action="store_true", help="the agent caps the network")
    opts = parser.parse_args(argv)
    cli = docker.DockerClient(base_url=f"unix://{SOCKET}", timeout=120)
    ctr, port = agent_container(
        cli,
        opts.run_dir,
        image=opts.image,
        address=opts.address,
        log=opts.run_dir / "raw" / opts.node_dir / "agent.log",
        lease_s=opts.lease,
        gpus=opts.gpus,
        net_admin=opts.net_admin,
    )

    def removed(signum: int, frame: Any) -> None:  # the service removed: the agent with it
        try:
            ctr.remove(force=True)
        except docker.errors.APIError:
            pass
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, removed)
    answer = opts.run_dir / "ctl" / opts.node_dir / AGENT_FILE
    partial = answer.with_suffix(".partial")
    partial.write_text(json.dumps({"port": port, "container_id": ctr.id}))
    partial.replace(answer)  # whole or absent: the coordinator polls for it
    try:
        return int(ctr.wait(condition="removed").get("StatusCode", -1))
    except docker.errors.NotFound:  # it exited and was removed before the wait began
        print(
            "the agent exited before its launcher waited: its exit code is unknown", file=sys.stderr
        )
        return 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
