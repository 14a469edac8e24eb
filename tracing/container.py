"""Containers through the Docker SDK: start one held at a barrier, release it, stop it.

The barrier is a FIFO in the run's control directory, mounted read-only at /twintrace/ctl. The
container's entry point is ``/bin/sh -c 'read _ < /twintrace/ctl/release && exec "$@"'``: the
shell blocks opening the FIFO's read end until the tracer writes a line into it, then replaces
itself with the real command. Everything the workload does, from its first exec on, happens
after every probe is attached. Aborting before the release (closing without writing) makes
``read`` fail, so the command never runs.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from pathlib import Path

import docker
import docker.errors
from docker.types import Mount

from core.errors import UserError

CTL_MOUNT = "/twintrace/ctl"
OUT_MOUNT = "/twintrace/out"
DATA_MOUNT = "/data"
RELEASE_FIFO = "release"
RUN_LABEL = "twintrace.run"
OWNER_LABEL = "twintrace.owner-pid"
BARRIER_SCRIPT = f'read line < {CTL_MOUNT}/{RELEASE_FIFO} && exec "$@"'


@dataclasses.dataclass(frozen=True)
class BindMount:
    """A host path mounted into the container."""

    source: Path
    target: str
    read_only: bool = True

    @classmethod
    def parse(cls, text: str) -> BindMount:
        """Parse ``SRC:DST[:ro|rw]`` as docker's -v does (read-only unless ``rw``)."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1].startswith("/"):
            raise UserError(f"bad mount {text!r}: use SRC:DST[:ro|rw] with an absolute DST")
        mode = parts[2] if len(parts) == 3 else "ro"
        if mode not in ("ro", "rw"):
            raise UserError(f"bad mount mode {mode!r} in {text!r}: use ro or rw")
        source = Path(parts[0]).resolve()
        if not source.exists():
            raise UserError(f"mount source {source} does not exist")
        return cls(source, parts[1], mode == "ro")

    def to_docker(self) -> Mount:
        return Mount(
            target=self.target, source=str(self.source), type="bind", read_only=self.read_only
        )


def client() -> docker.DockerClient:
    """A Docker SDK client; a clear error when the daemon is not reachable."""
    try:
        cli = docker.from_env(timeout=120)
        cli.ping()
        return cli
    except docker.errors.DockerException as exc:
        raise UserError(
            "the Docker daemon is not reachable: start it with `make setup` (or `dockerd &`) as root "
            f"({str(exc).splitlines()[0][:120]})"
        ) from None


def image_id(cli: docker.DockerClient, tag: str) -> str:
    """The id of a local image; a clear error when it is missing."""
    try:
        return cli.images.get(tag).id
    except docker.errors.ImageNotFound:
        raise UserError(f"image {tag} is not built: run `./cli.py build`") from None


def default_command(cli: docker.DockerClient, tag: str) -> list[str]:
    """The image's own ENTRYPOINT + CMD, used when tracing an image without a command."""
    config = cli.images.get(tag).attrs.get("Config") or {}
    command = list(config.get("Entrypoint") or []) + list(config.get("Cmd") or [])
    if not command:
        raise UserError(f"image {tag} has no ENTRYPOINT or CMD: give a command after `--`")
    return command


def start_held(
    cli: docker.DockerClient,
    image: str,
    command: list[str],
    ctl_dir: Path,
    mounts: list[BindMount],
    run_id: str,
    memory_limit: str | None = None,
    cpus: float | None = None,
    environment: dict[str, str] | None = None,
) -> docker.models.containers.Container:
    """Create and start a container that waits at the barrier before running ``command``."""
    fifo = ctl_dir / RELEASE_FIFO
    if not fifo.exists():
        os.mkfifo(fifo, 0o600)
    all_mounts = [BindMount(ctl_dir, CTL_MOUNT, True), *mounts]
    kwargs: dict = {}
    if memory_limit:
        kwargs["mem_limit"] = memory_limit
        kwargs["memswap_limit"] = memory_limit  # no swap: the limit bounds memory and page cache
    if cpus:
        kwargs["nano_cpus"] = int(cpus * 1e9)
    try:
        container = cli.containers.run(
            image,
            command=command,
            entrypoint=["/bin/sh", "-c", BARRIER_SCRIPT, "twintrace-barrier"],
            mounts=[m.to_docker() for m in all_mounts],
            labels={RUN_LABEL: run_id, OWNER_LABEL: str(os.getpid())},
            environment=environment or {},
            detach=True,
            # Loader workers share tensors through /dev/shm; docker's 64 MB default is too small.
            shm_size="1g",
            **kwargs,
        )
    except docker.errors.ImageNotFound:
        raise UserError(f"image {image} is not built: run `./cli.py build`") from None
    except docker.errors.APIError as exc:
        raise UserError(f"docker could not start {image}: {exc.explanation or exc}") from None
    return container


def main_pid(container: docker.models.containers.Container, timeout: float = 30.0) -> int:
    """The host pid of the container's first process (once it is running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        container.reload()
        state = container.attrs["State"]
        if state.get("Pid"):
            return int(state["Pid"])
        if state.get("Status") in ("exited", "dead"):
            raise UserError(
                f"container exited before it could be traced: {container.logs(tail=5).decode(errors='replace')}"
            )
        time.sleep(0.05)
    raise UserError(f"container {container.short_id} did not start within {timeout:.0f} s")


def release(ctl_dir: Path, timeout: float = 30.0) -> None:
    """Let the held container go: write one line into its barrier FIFO."""
    fifo = ctl_dir / RELEASE_FIFO
    deadline = time.monotonic() + timeout
    while True:
        try:
            # O_NONBLOCK: fail with ENXIO instead of blocking while the reader is not there yet.
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise UserError(
                    f"the container never reached its start barrier ({exc.strerror})"
                ) from None
            time.sleep(0.01)
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)


def exit_code(container: docker.models.containers.Container) -> int | None:
    """The exit code when the container has stopped, else None."""
    state = container.client.api.inspect_container(container.id)["State"]
    if state.get("Status") in ("exited", "dead"):
        return int(state.get("ExitCode", -1))
    return None


def stop_and_remove(container: docker.models.containers.Container, log_path: Path | None) -> None:
    """Stop the container (if running), save its logs, and remove it. Safe to call twice."""
    try:
        container.kill()
    except docker.errors.APIError:
        pass  # already stopped
    if log_path is not None:
        try:
            log_path.write_bytes(container.logs(stdout=True, stderr=True))
        except docker.errors.APIError:
            pass
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise


def remove_orphans(cli: docker.DockerClient) -> list[str]:
    """Remove twintrace containers whose tracer process is gone (e.g. it was killed with -9).

    Returns the run ids of the removed containers."""
    removed = []
    for ctr in cli.containers.list(all=True, filters={"label": RUN_LABEL}):
        owner = (ctr.labels or {}).get(OWNER_LABEL, "")
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            continue
        try:
            ctr.remove(force=True)
            removed.append(ctr.labels.get(RUN_LABEL, ctr.short_id))
        except docker.errors.APIError:
            pass
    return removed


def remove_run_containers(cli: docker.DockerClient, run_id: str) -> None:
    """Remove any container left with this run's label (belt and braces on every exit path)."""
    for container in cli.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
        try:
            container.remove(force=True)
        except docker.errors.APIError:
            pass
