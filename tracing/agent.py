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

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import docker
import docker.errors

from tracing.container import AGENT_LABEL, OWNER_LABEL
from tracing.procs import WaitsUntil
from workloads.config import TRACER_IMAGE

CAPABILITIES: tuple[str, ...] = ("SYS_ADMIN",)
READ_ONLY: tuple[str, ...] = ("/sys/kernel/tracing", "/sys/kernel/btf", "/sys/fs/cgroup")


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
        working_dir=str(Path(workdir).resolve() if workdir else out),
        environment=environment or {},
        # The owner's pid: a container whose owner is gone is removed by remove_orphans.
        labels={AGENT_LABEL: "1", OWNER_LABEL: str(os.getpid()), **(labels or {})},
        network_mode="none",
    )


class ContainerChild(WaitsUntil):
    """A bpftrace in a tracer container, with :class:`tracing.procs.ChildProcess`'s interface
    (its pid is the host's: the container shares the host's PID namespace); its output is
    written to ``stdout_path`` and ``stderr_path`` when it stops."""

    def __init__(
        self,
        cli: docker.DockerClient,
        argv: Sequence[str],
        stdout_path: Path,
        stderr_path: Path,
        out: Path,
        name: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.stdout_path = Path(stdout_path)
        self.stderr_path = Path(stderr_path)
        self.returncode: int | None = None
        self.container = start_tracer(
            cli, argv, out, f"{out.name}-{name.split()[-1].replace('.', '-')}", env, cwd, labels
        )
        self.container.reload()
        self._pid = int(self.container.attrs["State"]["Pid"] or 0)
        self._saved = False

    @property
    def pid(self) -> int:
        return self._pid

    def poll(self) -> int | None:
        """The exit code if bpftrace has ended, else None."""
        if self.returncode is None:
            try:
                self.container.reload()
            except docker.errors.NotFound:
                self.returncode = -1
                return self.returncode
            state = self.container.attrs["State"]
            if state.get("Status") in ("exited", "dead"):
                self.returncode = int(state.get("ExitCode", -1))
                self._save()
        return self.returncode

    def stop(self, timeout: float = 10.0) -> int:
        """SIGINT (bpftrace prints its maps), wait up to ``timeout`` seconds, then kill; the
        container is removed. Returns the exit code."""
        if self.poll() is None:
            try:
                self.container.kill(signal="SIGINT")
                self.returncode = int(self.container.wait(timeout=timeout)["StatusCode"])
            except docker.errors.APIError:
                pass
            except Exception:  # the wait timed out
                self.container.kill()
                self.returncode = int(self.container.wait(timeout=30)["StatusCode"])
        self._save()
        try:
            self.container.remove(force=True)
        except docker.errors.APIError:
            pass
        return self.returncode if self.returncode is not None else -1

    def _save(self) -> None:
        if self._saved:
            return
        try:
            self.stdout_path.write_bytes(self.container.logs(stdout=True, stderr=False))
            self.stderr_path.write_bytes(self.container.logs(stdout=False, stderr=True))
            self._saved = True
        except docker.errors.APIError:
            pass

    def stderr_tail(self, lines: int = 10) -> str:
        """The last lines of bpftrace's stderr, for error messages."""
        try:
            text = self.container.logs(stdout=False, stderr=True).decode(errors="replace")
        except docker.errors.APIError:
            text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return "\n".join(text.strip().splitlines()[-lines:])
