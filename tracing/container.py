"""Containers through the Docker SDK: start them held at a barrier, release them, stop them.

The barrier is a FIFO in the container's own barrier directory of the run (``ctl/<role>/``),
mounted read-only at /twintrace/barrier (apart from /twintrace/ctl, which a user topology may
mount itself). The container's entry point is
``/bin/sh -c 'read _ < /twintrace/barrier/release && exec "$@"'``: the shell blocks opening the
FIFO's read end until the tracer writes a line into it, then replaces itself with the real
command. Everything the workload does, from its first exec on, happens after every probe is
attached. Aborting before the release (closing without writing) makes ``read`` fail, so the
command never runs.

A run of several containers gets a private internal network of its own (no route out; the
containers reach each other by role name); a single-container run gets no network at all.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import DeviceRequest, EndpointConfig, Mount, Ulimit

from core.errors import SettingError, UserError
from tracing.barrier import RELEASE_FIFO

CTL_MOUNT = "/twintrace/ctl"
BARRIER_MOUNT = "/twintrace/barrier"
OUT_MOUNT = "/twintrace/out"
DATA_MOUNT = "/data"
RUN_LABEL = "twintrace.run"
ROLE_LABEL = "twintrace.role"
OWNER_LABEL = "twintrace.owner-pid"
#: A tracer container (tracing/tracer_container.py: the agent of a run, or a bare bpftrace).
AGENT_LABEL = "org.twintrace.tracer"
BARRIER_SCRIPT = f'read line < {BARRIER_MOUNT}/{RELEASE_FIFO} && exec "$@"'
#: docker's default network, for a container that must reach another host.
DEFAULT_BRIDGE = "bridge"


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


def local_image(cli: docker.DockerClient, tag: str) -> docker.models.images.Image:
    """A local image; a clear error when it is missing."""
    try:
        return cli.images.get(tag)
    except docker.errors.ImageNotFound:
        raise UserError(f"image {tag} is not built: run `./cli.py build`") from None


def default_command(image: docker.models.images.Image, tag: str) -> list[str]:
    """The image's own ENTRYPOINT + CMD, used when tracing an image without a command."""
    config = image.attrs.get("Config") or {}
    command = list(config.get("Entrypoint") or []) + list(config.get("Cmd") or [])
    if not command:
        raise UserError(f"image {tag} has no ENTRYPOINT or CMD: give a command after `--`")
    return command


def gpu_request(text: str) -> DeviceRequest:
    """``--gpus`` as docker reads it: ``all``, a count ``N``, device ids ``0,1`` (or UUIDs),
    or docker's explicit form ``device=ID[,ID...]`` (``device=1`` is GPU 1, where ``1`` alone
    is a count of one GPU).

    The request goes to the NVIDIA container runtime of the host (the NVIDIA Container Toolkit);
    without it docker refuses to start the container, and the run says so."""
    text = text.strip().strip("\"'")
    if text.startswith("device="):
        ids = [part.strip() for part in text[len("device=") :].split(",")]
        if not all(ids):
            raise SettingError(
                "bad {gpus} {text!r}: name the GPUs, e.g. device=1 or device=0,2", text=text
            )
        return DeviceRequest(device_ids=ids, capabilities=[["gpu"]])
    if text == "all":
        return DeviceRequest(count=-1, capabilities=[["gpu"]])
    if text.isdigit():
        if int(text) < 1:
            raise SettingError("{gpus} 0 asks for no GPU: leave the option out")
        return DeviceRequest(count=int(text), capabilities=[["gpu"]])
    ids = [part.strip() for part in text.split(",")]
    if not text or not all(ids):
        raise SettingError(
            "bad {gpus} {text!r}: use all, a count such as 2, or ids such as 0,1", text=text
        )
    return DeviceRequest(device_ids=ids, capabilities=[["gpu"]])


def create_network(cli: docker.DockerClient, run_id: str, overlay: bool = False) -> Any:
    """A private, internal network for the run's containers (no route out): a bridge on one
    host; with ``overlay``, a swarm's overlay network that containers of every node can join
    (``cli``: a manager's engine)."""
    try:
        return cli.networks.create(
            network_name(run_id),
            driver="overlay" if overlay else "bridge",
            internal=True,
            attachable=overlay or None,
            labels={RUN_LABEL: run_id, OWNER_LABEL: str(os.getpid())},
        )
    except docker.errors.APIError as exc:
        raise UserError(
            f"docker could not create the run's network: {exc.explanation or exc}"
        ) from None


def network_name(run_id: str) -> str:
    return f"twintrace-{run_id}"


def container_name(run_id: str, role: str) -> str:
    """A container's name: unique per run, and resolvable by its role on the run network."""
    return f"{run_id}-{role}"


def barrier_mount(barrier_dir: Path) -> BindMount:
    """The barrier's mount of a held container: its folder, with the release FIFO made."""
    fifo = barrier_dir / RELEASE_FIFO
    if not fifo.exists():
        os.mkfifo(fifo, 0o600)
    return BindMount(barrier_dir, BARRIER_MOUNT, True)


@dataclasses.dataclass(frozen=True)
class Held:
    """A container to start held at its barrier: what :func:`start_held` (on one engine) and
    :func:`tracing.swarm.start_role` (as a service on a swarm node) both take."""

    image: str
    command: Sequence[str]
    barrier_dir: Path
    mounts: Sequence[BindMount]
    run_id: str
    role: str
    memory_bytes: int | None = None
    cpus: float | None = None
    pids_limit: int | None = None
    environment: Mapping[str, str] | None = None
    shm_bytes: int = 1 << 30
    working_dir: str | None = None


def start_held(
    cli: docker.DockerClient,
    held: Held,
    *,
    network: str | None,
    device_read_bps: Sequence[tuple[str, int]] = (),
    gpus: str | None = None,
) -> docker.models.containers.Container:
    """Create and start a container that waits at the barrier before running ``held.command``.

    ``network`` None: no network at all (least privilege for a single-container run);
    :data:`DEFAULT_BRIDGE`: docker's default bridge network (a route out of the host)."""
    all_mounts = [barrier_mount(held.barrier_dir), *held.mounts]
    kwargs: dict[str, Any] = {}
    if held.memory_bytes:
        kwargs["mem_limit"] = int(held.memory_bytes)
        kwargs["memswap_limit"] = int(held.memory_bytes)  # no swap: bounds memory and page cache
    if held.cpus:
        kwargs["nano_cpus"] = int(held.cpus * 1e9)
    if held.pids_limit:
        kwargs["pids_limit"] = int(held.pids_limit)
    if device_read_bps:
        kwargs["device_read_bps"] = [{"Path": p, "Rate": int(r)} for p, r in device_read_bps]
    if held.working_dir:
        kwargs["working_dir"] = held.working_dir
    if gpus:
        kwargs["device_requests"] = [gpu_request(gpus)]
    # Emulated host-to-device copies lock the batch in host memory (mlock), as pinned staging
    # buffers are; docker's default RLIMIT_MEMLOCK (8 MiB) is less than a batch.
    kwargs["ulimits"] = [Ulimit(name="memlock", soft=-1, hard=-1)]
    if network is None:
        kwargs["network_mode"] = "none"
    elif network == DEFAULT_BRIDGE:
        kwargs["network_mode"] = DEFAULT_BRIDGE  # docker's own network: a route out
    else:
        kwargs["network"] = network
        kwargs["hostname"] = held.role
        # Reachable by role too (rank0, storage, ...), not only by the run-specific name.
        kwargs["networking_config"] = {
            network: EndpointConfig(cli.api._version, aliases=[held.role])
        }
    name = container_name(held.run_id, held.role)

    def run() -> docker.models.containers.Container:
        return cli.containers.run(
            held.image,
            command=list(held.command),
            entrypoint=["/bin/sh", "-c", BARRIER_SCRIPT, "twintrace-barrier"],
            name=name,
            mounts=[m.to_docker() for m in all_mounts],
            labels={RUN_LABEL: held.run_id, ROLE_LABEL: held.role, OWNER_LABEL: str(os.getpid())},
            environment=dict(held.environment or {}),
            detach=True,
            shm_size=int(held.shm_bytes),
            **kwargs,
        )

    try:
        try:
            container = run()
        except docker.errors.APIError as exc:
            if "rlimit" not in str(exc):
                raise
            # The daemon's own locked-memory limit is lower than asked (it cannot be raised
            # without CAP_SYS_RESOURCE): run with its default; the emulation says what it
            # could lock (workloads.emulation.PinnedStaging).
            _remove_named(cli, name)
            kwargs.pop("ulimits")
            container = run()
    except docker.errors.ImageNotFound:
        raise UserError(f"image {held.image} is not built: run `./cli.py build`") from None
    except docker.errors.APIError as exc:
        raise UserError(f"docker could not start {held.image}: {exc.explanation or exc}") from None
    return container


def memlock_raised(container: docker.models.containers.Container) -> bool:
    """Whether the container runs with an unlimited RLIMIT_MEMLOCK (see :func:`start_held`;
    the container as :func:`start_held` returns it is freshly inspected)."""
    limits = container.attrs.get("HostConfig", {}).get("Ulimits") or []
    return any(u.get("Name") == "memlock" and u.get("Hard") == -1 for u in limits)


def _remove_named(cli: docker.DockerClient, name: str) -> None:
    try:
        cli.containers.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass


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


def exit_code(container: docker.models.containers.Container) -> int | None:
    """The exit code when the container has stopped, else None. A container removed by
    someone else while it ran is a UserError saying so."""
    try:
        state = container.client.api.inspect_container(container.id)["State"]
    except docker.errors.NotFound:
        raise UserError(
            f"container {container.name} was removed while it ran (by something other than "
            "twintrace): the run is incomplete"
        ) from None
    if state.get("Status") in ("exited", "dead"):
        return int(state.get("ExitCode", -1))
    return None


def killed_for_memory(container: docker.models.containers.Container) -> bool:
    """Whether the kernel killed a process of the (stopped) container for memory: the engine
    records an out-of-memory kill in its cgroup (``State.OOMKilled``)."""
    try:
        state = container.client.api.inspect_container(container.id)["State"]
    except docker.errors.NotFound:
        return False
    return bool(state.get("OOMKilled"))


def stop_and_remove(container: docker.models.containers.Container) -> None:
    """Stop the container (if running) and remove it. Safe to call twice."""
    try:
        container.kill()
    except docker.errors.APIError:
        pass  # already stopped
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise


class LogFollower:
    """Copies a container's stdout and stderr, as they are written, to a file in the run
    directory and (``echo``) to our stderr, each line prefixed with the role when a run has
    several containers. The file is complete once :meth:`join` returns."""

    def __init__(
        self,
        container: docker.models.containers.Container,
        path: Path,
        echo: bool,
        prefix: str = "",
        sink: Callable[[bytes], None] | None = None,
        ended: threading.Event | None = None,
    ) -> None:
        self.container = container
        #: Set when the log stream ends: the container has stopped (or was removed).
        self.ended = ended or threading.Event()
        self.path = path
        self.prefix = prefix.encode()
        self.echo = echo
        self.sink = sink or stderr_sink
        self._thread = threading.Thread(target=self._run, name=f"logs-{path.stem}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending = b""
        try:
            with open(self.path, "wb") as out:
                stream = self.container.logs(stdout=True, stderr=True, stream=True, follow=True)
                for chunk in stream:
                    out.write(chunk)
                    out.flush()
                    if self.echo:
                        pending = self._echo(pending + chunk)
        except (docker.errors.APIError, OSError, ValueError):
            pass  # the container was removed while we read: what was read is kept
        finally:
            if self.echo and pending:
                self._echo(pending + b"\n")
            self.ended.set()

    def _echo(self, data: bytes) -> bytes:
        *lines, rest = data.split(b"\n")
        if lines:
            self.sink(b"".join(self.prefix + line + b"\n" for line in lines))
        return rest

    def join(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)


def stderr_sink(data: bytes) -> None:
    """Write a container's output lines to our stderr through its text layer, not its bytes:
    a display that takes stderr over while the run goes (trace's progress line on a terminal,
    a rich ``Live``) then shows them above itself. Bytes that are not UTF-8 show as U+FFFD
    (``raw/<role>/container.log`` keeps them as written)."""
    sys.stderr.write(data.decode(errors="replace"))
    sys.stderr.flush()


def labelled(cli: docker.DockerClient, label: str) -> list[dict[str, Any]]:
    """The containers with ``label`` (``key`` or ``key=value``), as the engine lists them (id,
    labels, state): one request, so a container that removes itself meanwhile (a run's agent
    as it exits) cannot fail it, as a lookup of each one would."""
    return cli.api.containers(all=True, filters={"label": label})


def remove_orphans(cli: docker.DockerClient) -> list[str]:
    """Remove twintrace containers (run containers and tracer containers) whose tracing process
    is gone (e.g. it was killed with -9).

    Returns the run ids of the removed containers (a tracer container of no run: its id)."""
    removed = []
    found = {c["Id"]: c for label in (RUN_LABEL, AGENT_LABEL) for c in labelled(cli, label)}
    for ctr_id, ctr in found.items():
        labels = ctr.get("Labels") or {}
        owner = labels.get(OWNER_LABEL, "")
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            continue
        try:
            cli.api.remove_container(ctr_id, force=True)
            removed.append(labels.get(RUN_LABEL, ctr_id[:12]))
        except docker.errors.APIError:
            pass
    for net in cli.networks.list(filters={"label": RUN_LABEL}):
        owner = (net.attrs.get("Labels") or {}).get(OWNER_LABEL, "")
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            continue
        try:
            net.remove()
        except docker.errors.APIError:
            pass
    return sorted(set(removed))


def remove_run_resources(cli: docker.DockerClient, run_id: str) -> None:
    """Remove any container and network left with this run's label (belt and braces on every
    exit path)."""
    for ctr in labelled(cli, f"{RUN_LABEL}={run_id}"):
        try:
            cli.api.remove_container(ctr["Id"], force=True)
        except docker.errors.APIError:
            pass
    for net in run_networks(cli, run_id):
        try:
            net.remove()
        except docker.errors.APIError:
            pass


def run_networks(cli: docker.DockerClient, run_id: str) -> list[Any]:
    """The networks of run ``run_id`` on engine ``cli``."""
    return cli.networks.list(filters={"label": f"{RUN_LABEL}={run_id}"})


def run_to_completion(
    cli: docker.DockerClient,
    image: str,
    command: Sequence[str],
    mounts: Sequence[BindMount],
    *,
    label: str,
    log_path: Path,
    environment: dict[str, str] | None = None,
    working_dir: str | None = None,
    echo: bool = False,
) -> int:
    """Run ``command`` in a fresh container of ``image`` (no network, untraced) until it exits;
    return its exit code. Its output goes to ``log_path`` (and to our stderr with ``echo``).
    The container is removed on every exit path, Ctrl-C included; one left by a killed process
    is removed by :func:`remove_orphans` (it carries our labels)."""
    kwargs: dict[str, Any] = {"working_dir": working_dir} if working_dir else {}
    try:
        ctr = cli.containers.run(
            image,
            command=list(command),
            mounts=[m.to_docker() for m in mounts],
            labels={RUN_LABEL: label, ROLE_LABEL: "main", OWNER_LABEL: str(os.getpid())},
            environment=environment or {},
            network_mode="none",
            detach=True,
            **kwargs,
        )
    except docker.errors.ImageNotFound:
        raise UserError(f"image {image} is not built: run `./cli.py build`") from None
    except docker.errors.APIError as exc:
        raise UserError(f"docker could not start {image}: {exc.explanation or exc}") from None
    try:
        follower = LogFollower(ctr, log_path, echo)
        code = int(ctr.wait().get("StatusCode", -1))
        follower.join()
        return code
    finally:
        stop_and_remove(ctr)
