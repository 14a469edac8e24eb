"""The tracer's container: ``twintrace/tracer`` (images/build.py: bpftrace 0.23, Python, grpcio
and the tracing code) run beside the traced containers with the least it needs, so that a host
needs nothing but a Docker engine. A traced run starts one per host, the agent
(tracing/agent.py: :func:`start_agent`); ``doctor`` and the benchmarks run bpftrace in it
directly (:func:`start_tracer`).

What the container is allowed, and why (each checked on these machines, ``tests/test_agent.py``):

- ``--pid host``: bpftrace's ``pid``/``tid`` builtins and its user-space side see the host's
  processes (the traced containers' tasks), and the agent finds a container's processes by
  their cgroups in ``/proc``;
- ``--cgroupns host``: ``/proc/PID/cgroup`` names the host's cgroup paths, which the samplers
  read under ``/sys/fs/cgroup``;
- capabilities ``SYS_ADMIN`` and ``SYS_NICE`` only: ``bpf()`` and ``perf_event_open()`` for
  tracepoints and raw tracepoints (Docker 20.10 rejects the narrower names ``CAP_BPF`` and
  ``CAP_PERFMON``; ``--privileged`` asks for every capability and fails where the host's
  bounding set lacks one, as ``CAP_SYS_RESOURCE`` here). Docker's default seccomp profile
  allows ``bpf()`` and ``perf_event_open()`` to a container with ``SYS_ADMIN``. ``SYS_NICE``:
  bpftrace runs above the traced containers' priority (``tracing.bpftrace.TRACER_NICE``), so
  that a busy host does not leave it behind its probes;
- read-only: ``/sys/kernel/tracing`` (tracepoint formats and ids), ``/sys/kernel/btf`` (the
  kernel's types, for typed arguments), ``/sys/fs/cgroup`` (``cgroupid()`` and the samplers'
  counters);
- one writable mount: the run directory (or, for ``start_tracer``, the folder its output goes
  to), at the same path inside, so that paths in its output are the host's;
- the agent's network: its own (Docker's bridge), its gRPC port published on the host's
  loopback only (a port Docker picks); no Docker socket (the coordinator names the run's
  containers by id).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors

from core.errors import UserError
from tracing.agent import LEASE_S, AgentClient, sources_digest
from tracing.clock import ClockEstimate
from tracing.container import AGENT_LABEL, OWNER_LABEL
from tracing.launcher import CAPABILITIES, agent_container, volumes
from workloads.config import TRACER_IMAGE

#: The project's root in this checkout.
ROOT = Path(__file__).resolve().parent.parent


def start_tracer(
    cli: docker.DockerClient,
    command: Sequence[str],
    out: Path,
    name: str,
    environment: dict[str, str] | None = None,
    workdir: Path | None = None,
    labels: Mapping[str, str] | None = None,
) -> docker.models.containers.Container:
    """Start ``command`` (a bpftrace command line) in a tracer container named ``name``, with
    ``out`` its only writable folder and its working directory ``workdir`` (default ``out``);
    returns the running container."""
    out = Path(out).resolve()
    return cli.containers.run(
        TRACER_IMAGE,
        list(command),
        name=name,
        detach=True,
        pid_mode="host",
        cap_add=list(CAPABILITIES),
        volumes=volumes(out),
        working_dir=str(Path(workdir).resolve() if workdir else out),
        environment=environment or {},
        # The owner's pid: a container whose owner is gone is removed by remove_orphans.
        labels={AGENT_LABEL: "1", OWNER_LABEL: str(os.getpid()), **(labels or {})},
        network_mode="none",
    )


def log_tail(path: Path, lines: int = 8) -> str:
    """ "; its log ends with: ..." (the last lines of the agent's log), or nothing."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return "; its log ends with:\n" + "\n".join(text.splitlines()[-lines:]) if text else ""


class LocalAgent:
    """The agent of one run on this host: its container and a client for it."""

    def __init__(self, ctr: Any, client: AgentClient, log: Path) -> None:
        self.container = ctr
        self.client = client
        self.log = log
        self.hello: dict = {}
        self.attached = False  # set by its coordinator once Attach answered
        #: The host's clock offset estimated before the release (tracing/clock.py)
        self.clock_before: ClockEstimate | None = None

    def exited(self) -> str | None:
        """Why the agent's container is gone (None while it runs), with its log's last lines."""
        try:
            self.container.reload()
            state = self.container.attrs["State"]
            if state.get("Status") not in ("exited", "dead"):
                return None
            why = f"its container exited with code {state.get('ExitCode')}"
        except docker.errors.NotFound:
            why = "its container is gone"
        return why + log_tail(self.log)

    def abandon(self) -> None:
        """Close the client only (the agent's host left the run: nothing there to ask)."""
        self.client.close()

    def close(self, timeout: float = 30.0) -> None:
        """Shut the agent down and make sure its container is gone (it removes itself)."""
        try:
            self.client.call("Shutdown", timeout=5.0)
        except UserError:
            pass
        self.client.close()
        try:
            self.container.wait(timeout=timeout)
        except Exception:  # gone already, or it did not exit in time
            pass
        try:
            self.container.remove(force=True)
        except docker.errors.APIError:
            pass  # auto-removed: the usual case


def check_sources(hello: dict, image: str) -> None:
    """A UserError unless the agent that said ``hello`` runs this checkout's tracing code."""
    mine = sources_digest(ROOT)
    if hello.get("sources") != mine:
        raise UserError(
            f"{image} holds other tracing code than this checkout (image "
            f"{hello.get('sources')}, checkout {mine}): run `./cli.py build`"
        )


def start_agent(
    cli: docker.DockerClient,
    run_dir: Path,
    lease_s: float = LEASE_S,
    gpus: str | None = None,
    timeout: float = 60.0,
    *,
    image: str = TRACER_IMAGE,
    address: str = "127.0.0.1",
    args: Sequence[str] = (),
) -> LocalAgent:
    """Start the agent of run ``run_dir`` on the host of engine ``cli`` and wait until it
    answers; its log goes to ``raw/agent.log``. ``gpus``: give it the run's GPUs (utility
    only: NVML's counters). ``address``: the host's address its port is published on, and the
    coordinator dials (this host's loopback; a cluster node's address on the cluster's network,
    ``image`` then the name the node pulls the tracer by). ``args``: more agent options."""
    run_dir = Path(run_dir).resolve()
    log = run_dir / "raw" / "agent.log"
    ctr, port = agent_container(
        cli, run_dir, image=image, address=address, log=log, lease_s=lease_s, gpus=gpus, args=args
    )
    agent = None
    try:
        client = AgentClient(f"{address}:{port}")
        agent = LocalAgent(ctr, client, log)
        agent.hello = client.wait_ready(timeout, agent.exited)
        check_sources(agent.hello, image)
        return agent
    except BaseException:
        if agent is not None:
            agent.close(timeout=5.0)
        else:
            ctr.remove(force=True)
        raise
