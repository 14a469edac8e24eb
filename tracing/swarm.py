"""A run's roles and agents as services of a swarm (``trace --nodes K``, docs/cluster.md).

Across nodes the coordinator talks to one engine, the swarm manager's; the swarm places every
container. Each role of the run is a service of one task (restart: none) with a placement
constraint on its node (``node.hostname==NODE``), on the run's overlay network, reachable by its
role's name; held at its barrier like a container on one host (tracing/barrier.py: the barrier is
a FIFO in the run directory, which every node shares). :class:`RoleTask` is that task, as the
runner needs it: the container's id and first process (the task's status says both), its exit
code, its output (the service's logs) and its removal. The agent of each node comes from its
launcher service (tracing/launcher.py); :class:`RemoteAgent` is that agent, as the runner needs
it. Nothing here asks a node's own engine.

What a service cannot have that a container on one host has: a device's read rate cap (``docker
service create`` has no ``--device-read-bps``) and GPUs (a swarm node's GPUs are generic
resources its engine must declare); :func:`refuse` says so before a run begins. A service's
``/dev/shm`` is a tmpfs mount of the same size, and its memory limit has no swap limit beside it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import (
    ContainerSpec,
    EndpointSpec,
    Mount,
    NetworkAttachmentConfig,
    Placement,
    Resources,
    RestartPolicy,
    TaskTemplate,
)

from core.errors import UserError
from tracing.agent import LEASE_S, AgentClient
from tracing.container import (
    BARRIER_SCRIPT,
    OWNER_LABEL,
    ROLE_LABEL,
    RUN_LABEL,
    Held,
    barrier_mount,
    container_name,
)
from tracing.launcher import AGENT_FILE, SOCKET

#: How long a task may take to start: its image pulled by its node, its container started.
START_TIMEOUT_S = 300.0
#: A swarm node's engine listens here for the swarm's gossip (memberlist, TCP and UDP): a node
#: whose port refuses connections has no engine running.
GOSSIP_PORT = 7946
#: Task states after which a task runs no more.
ENDED = frozenset({"complete", "failed", "shutdown", "rejected", "orphaned", "remove"})
_BAD = re.compile(r"[^a-zA-Z0-9-]")


def registry_ref(tag: str, registry: str) -> str:
    """The name the nodes pull a local image ``tag`` by from ``registry`` (``HOST:PORT``):
    ``registry/<repository>:<tag>``."""
    repository, _, version = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "")
    return f"{registry}/{repository}:{version or 'latest'}"


def _in_registry(engine: docker.DockerClient, ref: str, held: Any) -> bool:
    """Whether the registry holds image ``held`` (the engine's copy of ``ref``) as ``ref``:
    the manifest digest the registry names for ``ref`` is one the engine recorded for it when
    it pushed it."""
    try:
        digest = engine.api.inspect_distribution(ref)["Descriptor"]["digest"]
    except (docker.errors.APIError, KeyError):
        return False
    return any(d.endswith("@" + digest) for d in held.attrs.get("RepoDigests") or [])


def local_image(local: docker.DockerClient, tag: str) -> Any:
    """Image ``tag`` of this host's engine ``local``; a UserError when it has none."""
    try:
        return local.images.get(tag)
    except docker.errors.ImageNotFound:
        raise UserError(f"image {tag} is not on this host: build it first") from None


def push_ref(engine: docker.DockerClient, ref: str, shown: str, registry: str) -> None:
    """Push ``ref`` through ``engine``; a failure is a UserError naming ``shown`` and
    ``registry``."""
    for line in engine.api.push(ref, stream=True, decode=True):
        if "error" in line:
            raise UserError(f"pushing {shown} to {registry} failed: {line['error']}")


def push_images(
    local: docker.DockerClient,
    engine: docker.DockerClient,
    tags: Sequence[str],
    registry: str,
    log: Callable[[str], None] = lambda line: None,
    where: str = "the manager",
) -> list[str]:
    """Put local images ``tags`` (this host's engine ``local``) in ``registry`` through engine
    ``engine`` (a swarm's manager, which reaches the registry as the nodes do): each is loaded
    there and pushed, unless the registry already holds it at the same id. Returns the
    references the nodes pull them by."""
    refs = []
    for tag in tags:
        image = local_image(local, tag)
        ref = registry_ref(tag, registry)
        refs.append(ref)
        try:
            held = engine.images.get(ref)
        except docker.errors.ImageNotFound:
            held = None
        if held is not None and held.id == image.id and _in_registry(engine, ref, held):
            log(f"{tag}: already in the registry")
            continue
        started = time.monotonic()
        log(f"{tag}: loading into {where}'s engine")
        engine.api.load_image(image.save(named=True))
        engine.images.get(tag).tag(ref)
        push_ref(engine, ref, ref, registry)
        log(f"{tag}: pushed as {ref} ({time.monotonic() - started:.1f} s)")
    return refs


def service_name(run_id: str, role: str) -> str:
    """A service's name: a DNS label (letters, digits, dashes, at most 63), unique per run."""
    return _BAD.sub("-", container_name(run_id, role))[:63].strip("-")


def refuse(device_read_bps: bool, gpus: bool) -> None:
    """A UserError naming what a run across nodes cannot have (module doc)."""
    if device_read_bps:
        raise UserError(
            "a device read rate cap is for runs on this host: swarm services have none "
            "(leave out --nodes, or the cap)"
        )
    if gpus:
        raise UserError(
            "GPUs are for runs on this host: a swarm gives GPUs to services only as generic "
            "resources each node's engine declares (leave out --nodes, or --gpus)"
        )


#: The host of the coordinator that made a service (with OWNER_LABEL, its pid there).
OWNER_HOST_LABEL = "twintrace.owner-host"


def _labels(run_id: str, **more: str) -> dict[str, str]:
    return {
        RUN_LABEL: run_id,
        OWNER_LABEL: str(os.getpid()),
        OWNER_HOST_LABEL: socket.gethostname(),
        **more,
    }


def remove_orphans(manager: docker.DockerClient) -> list[str]:
    """Remove the services of runs whose coordinator was this host's and is gone (killed with
    -9, say); returns their run ids. Another host's coordinator's services are left alone."""
    removed = set()
    for service in manager.services.list(filters={"label": RUN_LABEL}):
        labels = service.attrs["Spec"].get("Labels") or {}
        owner = labels.get(OWNER_LABEL, "")
        if labels.get(OWNER_HOST_LABEL) != socket.gethostname() or not owner.isdigit():
            continue
        if Path(f"/proc/{owner}").exists():
            continue
        try:
            service.remove()
            removed.add(labels[RUN_LABEL])
        except docker.errors.NotFound:
            pass
    return sorted(removed)


def _create(manager: docker.DockerClient, template: Any, name: str, run_id: str, what: str) -> Any:
    """A service of the run made from ``template``; a UserError naming ``what`` otherwise.

    Its name and aliases resolve to its task's own address (DNS round robin), not to a virtual
    IP the swarm balances: a virtual IP becomes reachable only once the node has programmed
    its load balancer, a moment after the task runs, and a rank connecting to a peer before
    then (gloo's rendezvous, right after the release) waited about 12 s for its retry
    (docs/cluster.md)."""
    try:
        created = manager.api.create_service(
            template, name=name, labels=_labels(run_id), endpoint_spec=EndpointSpec(mode="dnsrr")
        )
    except docker.errors.APIError as exc:
        raise UserError(f"the swarm could not create {what}: {exc.explanation or exc}") from None
    return manager.services.get(created["ID"])


def _task(service: Any) -> dict | None:
    """The service's one task (the newest, should the swarm have made another), or None."""
    tasks = service.tasks()
    return max(tasks, key=lambda t: t.get("CreatedAt", "")) if tasks else None


def _why(task: dict) -> str:
    status = task.get("Status", {})
    why = status.get("Err") or status.get("Message") or status.get("State", "?")
    if "bind source path does not exist" in why:  # a path the node does not have
        why += " (the run directory and every mount must be on a path every node shares)"
    return why


def _wait_running(service: Any, what: str, node: str, timeout: float) -> dict:
    """The service's task once it runs (its container id and PID known); a UserError should it
    end first or not start in time."""
    deadline = time.monotonic() + timeout
    while True:
        task = _task(service)
        if task is not None:
            status = task["Status"]
            ctr = status.get("ContainerStatus") or {}
            if status["State"] == "running" and ctr.get("ContainerID") and ctr.get("PID"):
                return task
            if status["State"] in ENDED:
                raise UserError(f"{what} did not start on {node}: {_why(task)}")
        if time.monotonic() > deadline:
            state = task["Status"]["State"] if task else "not scheduled"
            raise UserError(f"{what} did not start on {node} within {timeout:.0f} s ({state})")
        time.sleep(0.1)


class RoleTask:
    """A role of the run as the one task of its service (module doc)."""

    def __init__(
        self, service: Any, role: str, node: str, again: Callable[[], Any] | None = None
    ) -> None:
        self.service = service
        #: Makes its service again without the memlock limit (see :func:`start_role`).
        self._again = again
        self.role = role
        self.node = node
        self.name = service.name
        self.id = ""
        self.main_pid = 0
        self.memlock_raised = False

    def wait_running(self, timeout: float = START_TIMEOUT_S) -> None:
        try:
            task = _wait_running(self.service, f"container {self.role}", self.node, timeout)
        except UserError as exc:
            if "rlimit" not in str(exc) or self._again is None:
                raise
            self.remove()
            self.service, self._again = self._again(), None
            task = _wait_running(self.service, f"container {self.role}", self.node, timeout)
        self.id = task["Status"]["ContainerStatus"]["ContainerID"]
        self.main_pid = int(task["Status"]["ContainerStatus"]["PID"])
        limits = task["Spec"]["ContainerSpec"].get("Ulimits") or []
        self.memlock_raised = any(u.get("Name") == "memlock" and u["Hard"] == -1 for u in limits)

    def exit_code(self) -> int | None:
        """Its exit code once its task ended, else None; a UserError should the swarm have
        ended it without its process exiting (removed, rejected)."""
        try:
            task = _task(self.service)
        except docker.errors.NotFound:
            raise UserError(
                f"service {self.name} was removed while it ran (by something other than "
                "twintrace): the run is incomplete"
            ) from None
        if task is None or task["Status"]["State"] not in ENDED:
            return None
        code = (task["Status"].get("ContainerStatus") or {}).get("ExitCode")
        if code is None:
            raise UserError(f"the swarm ended container {self.role} on {self.node}: {_why(task)}")
        return int(code)

    def logs(self, tail: int | str = "all") -> bytes:
        """Its output (stdout and stderr), as the swarm gathers it from its node."""
        chunks = self.service.logs(stdout=True, stderr=True, follow=False, tail=tail)
        return b"".join(chunks)

    def echo(self, prefix: str, sink: Any) -> None:
        """Copy its output to ``sink`` as it is written, each line prefixed (a thread, which
        ends as the service is removed)."""

        def run() -> None:
            pending = b""
            try:
                for chunk in self.service.logs(stdout=True, stderr=True, follow=True):
                    *lines, pending = (pending + chunk).split(b"\n")
                    if lines:
                        sink(b"".join(prefix.encode() + line + b"\n" for line in lines))
            except Exception:  # the service removed while we read
                pass

        threading.Thread(target=run, name=f"echo-{self.role}", daemon=True).start()

    def save_logs(self, path: Path) -> None:
        """Its whole output into ``path`` (the run's raw/<role>/container.log)."""
        path.write_bytes(self.logs())

    def remove(self) -> None:
        """Remove its service (the swarm kills and removes its container: SIGKILL)."""
        try:
            self.service.remove()
        except docker.errors.NotFound:
            pass


def start_role(
    manager: docker.DockerClient,
    held: Held,
    node: str,
    *,
    constraints: Sequence[str] = (),
    network: str | None,
) -> RoleTask:
    """Create the service of role ``held.role`` on ``node`` (module doc); the task is started,
    not yet running: :meth:`RoleTask.wait_running`. The barrier is as
    :func:`tracing.container.start_held` makes it."""
    spec = ContainerSpec(
        held.image,
        command=["/bin/sh", "-c", BARRIER_SCRIPT, "twintrace-barrier"],
        args=list(held.command),
        hostname=held.role,
        env=dict(held.environment or {}),
        workdir=held.working_dir,
        labels=_labels(held.run_id, **{ROLE_LABEL: held.role}),
        mounts=[
            barrier_mount(held.barrier_dir).to_docker(),
            *(m.to_docker() for m in held.mounts),
            Mount("/dev/shm", None, type="tmpfs", tmpfs_size=int(held.shm_bytes)),
        ],
        stop_signal="SIGKILL",
    )
    # As on one host (tracing/container.py: start_held): an unlimited RLIMIT_MEMLOCK, which
    # the SDK's ContainerSpec does not name (the engine's API does, from version 1.41). Where
    # the node's engine may not raise it (its own limit is lower: no CAP_SYS_RESOURCE) the
    # task fails to start: its service is made again without it.
    unlimited = dict(spec, Ulimits=[{"Name": "memlock", "Soft": -1, "Hard": -1}])

    resources = Resources(
        cpu_limit=int(held.cpus * 1e9) if held.cpus else None,
        mem_limit=int(held.memory_bytes) if held.memory_bytes else None,
    )
    if held.pids_limit:  # the engine's API names it from version 1.41; the SDK does not
        resources.setdefault("Limits", {})["Pids"] = int(held.pids_limit)

    def create(container_spec: dict) -> Any:
        template = TaskTemplate(
            container_spec,
            resources=resources,
            restart_policy=RestartPolicy(condition="none"),
            placement=Placement(constraints=[f"node.hostname=={node}", *constraints]),
            networks=[NetworkAttachmentConfig(network, aliases=[held.role])] if network else [],
        )
        return _create(
            manager,
            template,
            service_name(held.run_id, held.role),
            held.run_id,
            f"container {held.role}'s service",
        )

    return RoleTask(create(unlimited), held.role, node, lambda: create(spec))


class RemoteAgent:
    """The agent of one node of the run, started by its launcher service (module doc): the
    same surface as tracing.tracer_container.LocalAgent."""

    def __init__(self, service: Any, log: Path, node: str) -> None:
        self.service = service
        self.client: AgentClient | None = None  # once its launcher said where it listens
        self.log = log
        self.node = node
        self.hello: dict = {}
        self.attached = False
        self.clock_before = None
        self._closing = threading.Event()

    def keep_alive(self, every_s: float = LEASE_S / 3) -> None:
        """Call it now and then until it is attached: the nodes' agents come up as their
        nodes pull the tracer's image, tens of seconds apart at a first run, and one idle
        for its lease ends itself (tracing/agent.py)."""

        def run() -> None:
            while not self._closing.wait(every_s) and not self.attached:
                try:
                    assert self.client is not None
                    self.client.call("Status", timeout=5.0)
                except Exception:  # gone: the coordinator's next call says so
                    return

        threading.Thread(target=run, name=f"keep-alive-{self.node}", daemon=True).start()

    def exited(self) -> str | None:
        """Why the agent is gone (its launcher's task ended: the agent's exit code is the
        launcher's), None while it runs."""
        from tracing.tracer_container import log_tail

        try:
            task = _task(self.service)
        except docker.errors.NotFound:
            return "its launcher's service is gone" + log_tail(self.log)
        if task is None or task["Status"]["State"] not in ENDED:
            return None
        code = (task["Status"].get("ContainerStatus") or {}).get("ExitCode")
        why = f"its container exited with code {code}" if code is not None else _why(task)
        return why + log_tail(self.log)

    def close(self, timeout: float = 30.0) -> None:
        """Shut the agent down, wait for its launcher to end, remove the launcher's service."""
        try:
            if self.client is not None:
                self.client.call("Shutdown", timeout=5.0)
        except UserError:
            pass
        self.abandon(timeout)

    def abandon(self, timeout: float = 0.0) -> None:
        """Close the client; remove the launcher's service (its task gone from a node that left
        the run once the node is back or removed), after ``timeout`` s for it to end."""
        self._closing.set()
        if self.client is not None:
            self.client.close()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                task = _task(self.service)
                if task is None or task["Status"]["State"] in ENDED:
                    break
                time.sleep(0.1)
            self.service.remove()
        except docker.errors.NotFound:
            pass


def launch_agent(
    manager: docker.DockerClient,
    node: str,
    address: str,
    run_dir: Path,
    node_dir: str,
    image: str,
    lease_s: float = LEASE_S,
    timeout: float = START_TIMEOUT_S,
    net_admin: bool = False,
) -> RemoteAgent:
    """Start node ``node``'s agent through its launcher service and wait until it answers;
    ``address``: the node's address, which the agent's port is published on and the
    coordinator dials; ``image``: the tracer's image as the node pulls it; ``net_admin``: the
    agent caps its containers' network."""
    from tracing.tracer_container import check_sources

    run_dir = Path(run_dir).resolve()
    log = run_dir / "raw" / node_dir / "agent.log"
    answer = run_dir / "ctl" / node_dir / AGENT_FILE
    spec = ContainerSpec(
        image,
        command=["sh", "-c", 'exec python3 -m tracing.launcher "$@" 2>> "$0"', str(log)],
        args=[
            *("--run-dir", str(run_dir), "--node-dir", node_dir, "--address", address),
            *("--image", image, "--lease", str(lease_s)),
            *(["--net-admin"] if net_admin else []),
        ],
        labels=_labels(run_dir.name),
        mounts=[
            Mount(SOCKET, SOCKET, type="bind"),
            Mount(str(run_dir), str(run_dir), type="bind"),
        ],
        workdir="/opt/twintrace",
    )
    template = TaskTemplate(
        spec,
        restart_policy=RestartPolicy(condition="none"),
        placement=Placement(constraints=[f"node.hostname=={node}"]),
    )
    service = _create(
        manager,
        template,
        service_name(run_dir.name, f"agent-{node}"),
        run_dir.name,
        f"{node}'s agent launcher",
    )
    agent = RemoteAgent(service, log, node)
    try:
        deadline = time.monotonic() + timeout
        while not answer.exists():
            if (gone := agent.exited()) is not None:  # the launcher's task ended
                raise UserError(f"the tracer agent of {node} did not start: {gone}")
            if time.monotonic() > deadline:
                raise UserError(f"the tracer agent of {node} did not start within {timeout:.0f} s")
            time.sleep(0.05)
        port = json.loads(answer.read_text())["port"]
        agent.client = AgentClient(f"{address}:{port}")
        agent.hello = agent.client.wait_ready(60.0, agent.exited)
        check_sources(agent.hello, image)
        agent.keep_alive()
        return agent
    except BaseException:
        agent.abandon()
        raise


#: How long the coordinator waits for the swarm to remove a run's tasks once their services are.
REMOVE_TIMEOUT_S = 15.0


def remove_run(manager: docker.DockerClient, run_id: str, gone: Sequence[str] = ()) -> list[str]:
    """Remove every service of run ``run_id`` (belt and braces on every exit path) and wait
    until the swarm has no task of them left (their containers removed from their nodes), but
    for tasks on nodes ``gone`` (they left the run): the swarm removes those once their node is
    back or removed. Returns those: "task NAME on NODE"."""
    for service in manager.services.list(filters={"label": f"{RUN_LABEL}={run_id}"}):
        try:
            service.remove()
        except docker.errors.NotFound:
            pass
    names = {n.id: n.attrs["Description"]["Hostname"] for n in manager.nodes.list()}
    deadline = time.monotonic() + REMOVE_TIMEOUT_S
    while True:
        # Every task of the swarm: a removed service's tasks cannot be asked for by service
        # or label, but their containers' labels name the run.
        left = [t for t in manager.api.tasks() if _run_of(t) == run_id]
        if all(names.get(t.get("NodeID")) in gone for t in left):
            return [f"task {t['ID'][:12]} on {names.get(t.get('NodeID'))}" for t in left]
        if time.monotonic() > deadline:
            raise UserError(
                f"the swarm did not remove {len(left)} task(s) of the run within "
                f"{REMOVE_TIMEOUT_S:.0f} s: `docker service ls` on the manager"
            )
        time.sleep(0.1)


def _run_of(task: dict) -> str | None:
    return (task.get("Spec", {}).get("ContainerSpec", {}).get("Labels") or {}).get(RUN_LABEL)


def engine_answers(address: str, timeout: float = 1.0) -> bool:
    """Whether a swarm node's engine listens at ``address`` (its gossip port)."""
    try:
        with socket.create_connection((address, GOSSIP_PORT), timeout=timeout):
            return True
    except OSError:
        return False
