"""The tracer's container: bpftrace from ``twintrace/tracer`` (images/build.py), run beside the
traced containers with the least it needs, so that a host needs nothing but a Docker engine.

What the container is allowed, and why (each checked on these machines, ``tests/test_agent.py``):

- ``--pid host``: bpftrace's ``pid``/``tid`` builtins and its user-space side see the host's
  processes (the traced containers' tasks), as the host's bpftrace does;
- capability ``SYS_ADMIN`` only: ``bpf()`` and ``perf_event_open()`` for tracepoints and raw
  tracepoints (Docker 20.10 rejects the narrower names ``CAP_BPF`` and ``CAP_PERFMON``;
  ``--privileged`` asks for every capability and fails where the host's bounding set lacks
  one, as ``CAP_SYS_RESOURCE`` here). Docker's default seccomp profile allows ``bpf()`` and
  ``perf_event_open()`` to a container with ``SYS_ADMIN``;
- read-only: ``/sys/kernel/tracing`` (tracepoint formats and ids), ``/sys/kernel/btf`` (the
  kernel's types, for typed arguments), ``/sys/fs/cgroup`` (``cgroupid()`` and the samplers'
  counters);
- one writable mount: the folder the tracer writes its output into (``out``), at the same path
  inside, so that paths in its output are the host's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import docker

#: The tracer's image (built by ``./cli.py build``).
TRACER_IMAGE = "twintrace/tracer:latest"
CAPABILITIES: tuple[str, ...] = ("SYS_ADMIN",)
READ_ONLY: tuple[str, ...] = ("/sys/kernel/tracing", "/sys/kernel/btf", "/sys/fs/cgroup")
#: The label that marks the tracer containers of twintrace (found and removed after a crash).
AGENT_LABEL = "org.twintrace.tracer"


def start_tracer(
    cli: docker.DockerClient,
    command: Sequence[str],
    out: Path,
    name: str,
    environment: dict[str, str] | None = None,
) -> docker.models.containers.Container:
    """Start ``command`` (a bpftrace command line) in a tracer container named ``name``, with
    ``out`` its only writable folder and working directory; returns the running container."""
    out = Path(out).resolve()
    volumes = {path: {"bind": path, "mode": "ro"} for path in READ_ONLY if Path(path).exists()}
    volumes[str(out)] = {"bind": str(out), "mode": "rw"}
    return cli.containers.run(
        TRACER_IMAGE,
        list(command),
        name=name,
        detach=True,
        pid_mode="host",
        cap_add=list(CAPABILITIES),
        volumes=volumes,
        working_dir=str(out),
        environment=environment or {},
        labels={AGENT_LABEL: "1"},
        network_mode="none",
    )
