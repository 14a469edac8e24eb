"""The virtual cluster: N Docker-in-Docker nodes on this one host, joined in a Docker Swarm,
with a registry the nodes pull from and the host's shared folders at the same path on every
node (docs/cluster.md). ``./cli.py cluster up|status|push|down``; ``cluster check`` looks at a
real swarm through its manager's engine.

Every object is labelled ``org.twintrace.cluster=<name>`` and found again by that label alone,
so that ``down`` (and an ``up`` after a crash) removes everything, whatever state it was left
in: the node and registry containers, the cluster's network, the nodes' ``/var/lib/docker``
volumes, the host-side folders of the nodes' engine sockets and the cgroups the nodes' engines
made (``/sys/fs/cgroup/.../<cluster>-node-<i>``, the cgroup parent of each nested engine).

How a node runs (each setting checked on these machines, ``../shared/ENVIRONMENT.md``):
``--privileged`` fails here, so a node gets every capability but ``SYS_RESOURCE`` (which the
host's bounding set lacks), no seccomp, AppArmor or masked system paths, every device by cgroup
rule, ``/sys/fs/cgroup`` read-write (its containers' cgroups), ``/run`` on a tmpfs, and
``dockerd --cgroup-parent=/<cluster>-node-<i>`` (without its own parent the nested engine's
cgroups collide with the host engine's ``docker`` ones). A node shares the host's PID
namespace and sees its tracefs (read-only), as the engine of a real host does: an agent the
node's engine starts with ``--pid host`` sees the processes of the node's containers with the
PIDs bpftrace reports (bpftrace 0.23 in a nested PID namespace asks the kernel for PIDs in its
own namespace, ``get_ns_current_pid_tgid``, which refuses tasks of deeper namespaces: every PID
would be lost). Its engine listens on its own socket
and on one in a host folder (``/run/twintrace/cluster/<cluster>/<node>/docker.sock``): the host
reaches every node's engine through it, no port is opened. The nodes' network is a bridge of
their own, ``internal`` (no route out): every address a node can reach is one of the cluster's.

Images reach the nodes as on a real cluster, from a registry (Debian's ``docker-registry``
2.8, a container of the cluster at ``registry:5000`` on its network, the nodes' engines told
it is plain HTTP); a node pulls an image when a task placed on it needs it. ``push`` has this
host's engine push the image to the registry's port, published on this host's loopback only
(an engine takes a registry on 127.0.0.0/8 as plain HTTP unasked): only the layers the registry
lacks go, so a second image on the same base costs its own layers alone. Loading each image
into the manager's engine and pushing it from there (what a real swarm's ``--registry`` does,
:func:`tracing.swarm.push_images`) cost a 1.5 GB save and load per image (docs/cluster.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import docker
import docker.errors

from core.errors import UserError
from tracing import swarm
from tracing.container import AGENT_LABEL
from tracing.host import Check
from workloads.config import NODE_IMAGE

CLUSTER_LABEL = "org.twintrace.cluster"
#: What an object of the cluster is: ``node``, ``registry``, ``network``, ``volume``.
PART_LABEL = "org.twintrace.cluster.part"
NODE_LABEL = "org.twintrace.cluster.node"
#: On a node container: the host folders it shares, as a JSON list.
SHARES_LABEL = "org.twintrace.cluster.shares"
DEFAULT_NAME = "twintrace"
REGISTRY_ALIAS = "registry"
REGISTRY_PORT = 5000
REGISTRY = f"{REGISTRY_ALIAS}:{REGISTRY_PORT}"
#: The registry's configuration in the node image (images/build.py NODE_FILES) and its store.
REGISTRY_CONFIG = "/etc/twintrace/registry.yml"
REGISTRY_STORE = "/var/lib/docker-registry/docker/registry/v2/repositories"
SOCKETS = Path("/run/twintrace/cluster")
ENGINE_MOUNT = "/twintrace/engine"
CGROUP_ROOT = Path("/sys/fs/cgroup")
TRACEFS = Path("/sys/kernel/tracing")
MAX_NODES = 16
#: Seconds a node's engine may take to answer, and the swarm to list every node ready.
ENGINE_TIMEOUT_S = 60.0
SWARM_TIMEOUT_S = 60.0
#: Docker-in-Docker on a host where --privileged fails (module doc).
#: ``systempaths=unconfined`` of the docker CLI is, in the API, empty masked and read-only
#: path lists (the SDK has no parameter for them: _start_node sets them).
NODE_SECURITY = {
    "cap_add": ["ALL"],
    "cap_drop": ["SYS_RESOURCE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    "device_cgroup_rules": ["a *:* rmw"],
    "tmpfs": {"/run": ""},
}
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,23}$")

Log = Callable[[str], None]


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UserError(
            f"cluster name {name!r}: use 1 to 24 lower-case letters, digits and '-', "
            "starting with a letter"
        )
    return name


def node_hostname(index: int) -> str:
    """The i-th node's host name (1-based): what the swarm and a run's ``host`` column call it."""
    return f"node-{index}"


def node_container(name: str, index: int) -> str:
    """The i-th node's container on the host, also its engine's cgroup parent."""
    return f"{name}-node-{index}"


def network_name(name: str) -> str:
    return f"{name}-cluster"


def registry_container(name: str) -> str:
    return f"{name}-registry"


def socket_dir(name: str, hostname: str) -> Path:
    return SOCKETS / name / hostname


def engine_url(name: str, hostname: str) -> str:
    return f"unix://{socket_dir(name, hostname)}/docker.sock"


def registry_ref(tag: str) -> str:
    """The name the nodes pull a local image ``tag`` by (``registry:5000/<repository>:<tag>``)."""
    return swarm.registry_ref(tag, REGISTRY)


@dataclasses.dataclass(frozen=True)
class Node:
    """A node of a virtual cluster, as its container says."""

    hostname: str
    container: str
    address: str | None
    state: str
    manager: bool
    shares: tuple[str, ...]
    #: The node's engine, as the host reaches it.
    engine: str


def _labels(name: str, part: str, **extra: str) -> dict[str, str]:
    return {CLUSTER_LABEL: name, PART_LABEL: part, **extra}


def _objects(cli: docker.DockerClient, name: str) -> dict[str, list[Any]]:
    """Everything of cluster ``name`` the host's engine holds, found by label."""
    flt = {"label": f"{CLUSTER_LABEL}={name}"}
    return {
        "containers": cli.containers.list(all=True, filters=flt),
        "networks": cli.networks.list(filters=flt),
        "volumes": cli.volumes.list(filters=flt),
    }


def _cgroup_dirs(name: str) -> list[Path]:
    """The cgroup folders the nodes' engines of cluster ``name`` made (every hierarchy)."""
    pattern = f"{name}-node-*"
    found = list(CGROUP_ROOT.glob(pattern)) + list(CGROUP_ROOT.glob(f"*/{pattern}"))
    return sorted(p for p in found if p.is_dir() and re.fullmatch(rf"{name}-node-\d+", p.name))


def _cgroup_pids(top: Path) -> set[int]:
    pids: set[int] = set()
    for procs in top.rglob("cgroup.procs"):
        try:
            pids.update(int(p) for p in procs.read_text().split())
        except OSError:
            pass
    return pids


def _kill_processes(tops: list[Path]) -> set[int]:
    """SIGKILL every process in the cgroup trees ``tops`` (not this one); the pids signalled."""
    pids = set().union(*(_cgroup_pids(top) for top in tops)) - {os.getpid()}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _remove_cgroup_tree(top: Path, attempts: int = 50) -> bool:
    """Kill every process left in ``top`` (the nodes share the host's PID namespace, so their
    containers' processes outlive them), then rmdir it and its sub-folders, deepest first; a
    folder whose processes are still exiting is busy for a moment, so retry. True when gone."""
    for _ in range(attempts):
        _kill_processes([top])
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for path in [*dirs, top]:
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                break
        if not top.exists():
            return True
        time.sleep(0.1)
    return False


def crash(cli: docker.DockerClient, name: str, index: int) -> int:
    """Crash node ``index`` of cluster ``name`` the way a machine fails: every process of it
    (its engine, its containers, an agent's bpftrace) killed at once, not the node's
    container alone (the nodes share the host's PID namespace: its containers' processes
    would outlive it). Its container then exits; ``down`` removes it. Returns how many
    processes were killed."""
    check_name(name)
    ctr = cli.containers.get(node_container(name, index))
    tops = [
        *CGROUP_ROOT.glob(f"*/docker/{ctr.id}"),
        *CGROUP_ROOT.glob(f"*/{node_container(name, index)}"),
    ]
    killed: set[int] = set()
    for _ in range(50):  # forks racing the kill are killed on the next pass
        pids = _kill_processes(tops)
        if not pids:
            break
        killed |= pids
        time.sleep(0.05)
    return len(killed)


def node_client(node: Node, timeout: float = 120) -> docker.DockerClient:
    return docker.DockerClient(base_url=node.engine, timeout=timeout)


def nodes(cli: docker.DockerClient, name: str = DEFAULT_NAME) -> list[Node]:
    """The nodes of cluster ``name``, in order (node-1, the manager, first)."""
    found = []
    for ctr in cli.containers.list(
        all=True, filters={"label": [f"{CLUSTER_LABEL}={name}", f"{PART_LABEL}=node"]}
    ):
        labels = ctr.labels
        net = (ctr.attrs["NetworkSettings"]["Networks"] or {}).get(network_name(name)) or {}
        hostname = labels.get(NODE_LABEL, "")
        found.append(
            Node(
                hostname=hostname,
                container=ctr.name,
                address=net.get("IPAddress") or None,
                state=ctr.status,
                manager=hostname == node_hostname(1),
                shares=tuple(json.loads(labels.get(SHARES_LABEL, "[]"))),
                engine=engine_url(name, hostname),
            )
        )
    return sorted(found, key=lambda n: int(n.hostname.rsplit("-", 1)[-1] or 0))


def manager(cli: docker.DockerClient, name: str = DEFAULT_NAME) -> Node:
    """The running manager of cluster ``name``; a clear error when there is none."""
    for node in nodes(cli, name):
        if node.manager and node.state == "running":
            return node
    raise UserError(f"no cluster {name!r} is up: run `./cli.py cluster up --nodes N`")


def _wait_engine(cli: docker.DockerClient, node: Node, deadline: float) -> docker.DockerClient:
    """The node's engine, once it answers; its log's last lines if its container ends first."""
    last = ""
    while time.monotonic() < deadline:
        ctr = cli.containers.get(node.container)
        if ctr.status not in ("created", "running"):
            tail = ctr.logs(tail=5).decode(errors="replace").strip().splitlines()
            raise UserError(
                f"node {node.hostname}'s engine exited ({ctr.status}): "
                + (" | ".join(tail[-3:]) or "no log")
            )
        try:
            engine = node_client(node)
            engine.ping()
            return engine
        except (docker.errors.DockerException, OSError) as exc:
            last = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        time.sleep(0.2)
    raise UserError(f"node {node.hostname}'s engine did not answer in time ({last})")


def _shares(paths: Iterable[Path]) -> list[str]:
    out: list[str] = []
    for path in paths:
        resolved = Path(path).expanduser().resolve()
        if not resolved.is_dir():
            raise UserError(f"--share {path}: no such folder on this host (create it, or drop it)")
        if str(resolved) == "/":
            raise UserError("--share /: share a folder, not the host's root")
        if str(resolved) not in out:
            out.append(str(resolved))
    return out


def swarm_nodes(engine: docker.DockerClient) -> dict[str, dict[str, Any]]:
    """The swarm's nodes as its manager ``engine`` lists them, by host name: ``id``, ``state``
    (``ready`` ...), ``availability``, ``role``, ``address`` (what the node advertises) and
    ``attributes`` (what placement constraints name: tracing.placement.node_attributes)."""
    from tracing.placement import node_attributes

    return {
        n.attrs.get("Description", {}).get("Hostname", n.id[:12]): {
            "id": n.id,
            "state": n.attrs.get("Status", {}).get("State"),
            "availability": n.attrs.get("Spec", {}).get("Availability"),
            "role": n.attrs.get("Spec", {}).get("Role"),
            "address": _node_address(n.attrs),
            "attributes": node_attributes(n.attrs),
        }
        for n in engine.nodes.list()
    }


def _node_address(attrs: dict[str, Any]) -> str | None:
    """A swarm node's address: the one it advertises (a manager's may read 0.0.0.0 there, its
    address is then in its manager status)."""
    address = (attrs.get("Status") or {}).get("Addr")
    if address and address != "0.0.0.0":
        return str(address)
    manager = (attrs.get("ManagerStatus") or {}).get("Addr", "")
    return manager.rpartition(":")[0] or None


def _ready(engine: docker.DockerClient) -> list[str]:
    return sorted(h for h, n in swarm_nodes(engine).items() if n["state"] == "ready")


def _healthy(cli: docker.DockerClient, name: str) -> tuple[bool, list[Node]]:
    found = nodes(cli, name)
    if not found or any(n.state != "running" for n in found):
        return False, found
    try:
        if cli.containers.get(registry_container(name)).status != "running":
            return False, found
        with closing(node_client(found[0], timeout=10)) as engine:
            ready = _ready(engine)
    except (docker.errors.DockerException, OSError):
        return False, found
    return len(ready) == len(found), found


def up(
    cli: docker.DockerClient,
    count: int,
    shares: Sequence[Path] = (),
    name: str = DEFAULT_NAME,
    log: Log = lambda line: None,
) -> list[Node]:
    """Make cluster ``name`` of ``count`` nodes (module doc) and return its nodes. What an earlier
    cluster of that name left after a crash is removed first; a healthy one is an error."""
    check_name(name)
    if not 1 <= count <= MAX_NODES:
        raise UserError(f"--nodes {count}: give 1 to {MAX_NODES} (each node is a Docker engine)")
    shared = _shares(shares)
    try:
        cli.images.get(NODE_IMAGE)
    except docker.errors.ImageNotFound:
        raise UserError(
            f"image {NODE_IMAGE} is not built: `./cli.py cluster up` builds it"
        ) from None
    healthy, found = _healthy(cli, name)
    if healthy:
        raise UserError(
            f"cluster {name!r} is already up with {len(found)} nodes: "
            "`./cli.py cluster down` first (or give another --name)"
        )
    if any(_objects(cli, name).values()) or _cgroup_dirs(name) or (SOCKETS / name).exists():
        log(f"removing what an earlier cluster {name!r} left")
        down(cli, name, log)
    try:
        return _make(cli, count, shared, name, log)
    except BaseException as exc:
        log("cluster up failed: removing what it made")
        down(cli, name)
        if isinstance(exc, docker.errors.APIError):
            raise UserError(f"cluster up failed: {exc.explanation or exc}") from None
        raise


def _make(
    cli: docker.DockerClient, count: int, shared: list[str], name: str, log: Log
) -> list[Node]:
    started = time.monotonic()
    net = cli.networks.create(
        network_name(name), driver="bridge", internal=True, labels=_labels(name, "network")
    )
    # On the engine's default bridge, its port published on this host's loopback (a port is
    # published from a network with a route out, which the cluster's is not), for ``push``;
    # on the cluster's network as ``registry``, the name the nodes' engines pull by.
    cli.containers.run(
        NODE_IMAGE,
        ["docker-registry", "serve", REGISTRY_CONFIG],
        name=registry_container(name),
        detach=True,
        labels=_labels(name, "registry"),
        ports={f"{REGISTRY_PORT}/tcp": ("127.0.0.1", None)},
        restart_policy={"Name": "no"},
    )
    net.connect(registry_container(name), aliases=[REGISTRY_ALIAS])
    for index in range(1, count + 1):
        hostname, container = node_hostname(index), node_container(name, index)
        sockets = socket_dir(name, hostname)
        sockets.mkdir(parents=True, exist_ok=True)
        volume = cli.volumes.create(f"{container}-docker", labels=_labels(name, "volume"))
        mounts = {
            "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
            str(TRACEFS): {"bind": str(TRACEFS), "mode": "ro"},
            volume.name: {"bind": "/var/lib/docker", "mode": "rw"},
            str(sockets): {"bind": ENGINE_MOUNT, "mode": "rw"},
            **{path: {"bind": path, "mode": "rw"} for path in shared},
        }
        _start_node(
            cli,
            container,
            hostname,
            [
                "dockerd",
                f"--cgroup-parent=/{container}",
                "-H",
                "unix:///var/run/docker.sock",
                "-H",
                f"unix://{ENGINE_MOUNT}/docker.sock",
                "--insecure-registry",
                REGISTRY,
            ],
            _labels(name, "node", **{NODE_LABEL: hostname, SHARES_LABEL: json.dumps(shared)}),
            net.name,
            mounts,
        )
        log(f"node {hostname}: started ({container})")
    made = nodes(cli, name)  # with their addresses on the cluster's network
    lead = made[0]
    deadline = time.monotonic() + ENGINE_TIMEOUT_S
    engines: list[docker.DockerClient] = []
    try:
        for node in made:
            engines.append(_wait_engine(cli, node, deadline))
        engines[0].swarm.init(advertise_addr=lead.address, listen_addr=f"{lead.address}:2377")
        token = engines[0].swarm.attrs["JoinTokens"]["Worker"]
        for engine in engines[1:]:
            engine.swarm.join(remote_addrs=[f"{lead.address}:2377"], join_token=token)
        deadline = time.monotonic() + SWARM_TIMEOUT_S
        while len(ready := _ready(engines[0])) < count:
            if time.monotonic() > deadline:
                raise UserError(f"the swarm has {len(ready)} of {count} nodes ready: {ready}")
            time.sleep(0.2)
    finally:
        for engine in engines:
            engine.close()
    log(
        f"cluster {name!r} up: {count} node(s), manager {lead.hostname} ({lead.address}), "
        f"registry {REGISTRY}, shares {', '.join(shared) or 'none'} "
        f"({time.monotonic() - started:.1f} s)"
    )
    return made


def _start_node(
    cli: docker.DockerClient,
    container: str,
    hostname: str,
    command: list[str],
    labels: dict[str, str],
    network: str,
    mounts: dict[str, dict[str, str]],
) -> None:
    """Create and start a node's container (module doc: what it may do)."""
    api = cli.api
    host_config = api.create_host_config(
        binds=mounts,
        network_mode=network,
        pid_mode="host",
        restart_policy={"Name": "no"},
        **NODE_SECURITY,
    )
    host_config["MaskedPaths"] = []
    host_config["ReadonlyPaths"] = []
    created = api.create_container(
        NODE_IMAGE,
        command,
        name=container,
        hostname=hostname,
        labels=labels,
        host_config=host_config,
        volumes=[m["bind"] for m in mounts.values()],
    )
    api.start(created["Id"])


def down(
    cli: docker.DockerClient, name: str = DEFAULT_NAME, log: Log = lambda line: None
) -> list[str]:
    """Remove everything of cluster ``name`` (module doc); return what was removed. The nodes'
    containers, agents and tasks are processes of the host's PID namespace in the nodes'
    cgroups: they are killed there, whatever state the nodes were left in."""
    check_name(name)
    removed: list[str] = []
    objects = _objects(cli, name)
    for ctr in objects["containers"]:
        try:
            ctr.remove(force=True, v=True)
            removed.append(f"container {ctr.name}")
        except docker.errors.NotFound:
            pass
    for net in objects["networks"]:
        try:
            net.remove()
            removed.append(f"network {net.name}")
        except docker.errors.NotFound:
            pass
    for volume in objects["volumes"]:
        try:
            volume.remove(force=True)
            removed.append(f"volume {volume.name}")
        except docker.errors.NotFound:
            pass
    left = []
    for path in _cgroup_dirs(name):
        if _remove_cgroup_tree(path):
            removed.append(f"cgroup {path}")
        else:
            left.append(str(path))
    if (SOCKETS / name).exists():
        shutil.rmtree(SOCKETS / name, ignore_errors=True)
        removed.append(f"folder {SOCKETS / name}")
    if left:
        raise UserError(f"cgroups of cluster {name!r} are still busy: {', '.join(left)}")
    if removed:
        log(f"cluster {name!r} removed: {len(removed)} object(s)")
    return removed


def registry_images(cli: docker.DockerClient, name: str = DEFAULT_NAME) -> list[str]:
    """The images the cluster's registry holds (``repository:tag``), read from its store."""
    try:
        reg = cli.containers.get(registry_container(name))
    except docker.errors.NotFound:
        return []
    if reg.status != "running":
        return []
    code, out = reg.exec_run(
        [
            "sh",
            "-c",
            f"cd {REGISTRY_STORE} 2>/dev/null && find . -path '*/_manifests/tags/*/current/link'",
        ]
    )
    images = []
    for line in out.decode(errors="replace").split():
        repository, _, rest = line[2:].partition("/_manifests/tags/")
        images.append(f"{repository}:{rest.split('/')[0]}")
    return sorted(images)


def _registry_port(cli: docker.DockerClient, name: str) -> int:
    """The port on this host's loopback of the running registry of cluster ``name``."""
    try:
        reg = cli.containers.get(registry_container(name))
    except docker.errors.NotFound:
        reg = None
    ports = (reg.attrs["NetworkSettings"]["Ports"] or {}) if reg is not None else {}
    published = ports.get(f"{REGISTRY_PORT}/tcp") or []
    if reg is None or reg.status != "running" or not published:
        raise UserError(
            f"cluster {name!r} has no running registry on this host's loopback: run "
            f"`./cli.py cluster down --name {name}` then `./cli.py cluster up --name {name}`"
        )
    return int(published[0]["HostPort"])


def _held_id(port: int, repository: str, tag: str) -> str | None:
    """The image id (its config's digest) the registry at ``port`` holds as
    ``repository:tag``; None where it holds none."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/{repository}/manifests/{tag}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())["config"]["digest"]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return None


def push(
    cli: docker.DockerClient,
    tags: Sequence[str],
    name: str = DEFAULT_NAME,
    log: Log = lambda line: None,
) -> list[str]:
    """Put local images ``tags`` in the cluster's registry: this host's engine pushes each to
    the registry's loopback port (module doc), the layers the registry lacks only; an image the
    registry holds at the same id is skipped. Returns the references the nodes pull them by."""
    manager(cli, name)  # the cluster is up
    port = _registry_port(cli, name)
    refs = []
    for tag in tags:
        image = swarm.local_image(cli, tag)
        ref = registry_ref(tag)
        refs.append(ref)
        repository, _, version = ref.removeprefix(f"{REGISTRY}/").rpartition(":")
        if _held_id(port, repository, version) == image.id:
            log(f"{tag}: already in the registry")
            continue
        started = time.monotonic()
        local = f"127.0.0.1:{port}/{repository}:{version}"
        image.tag(local)
        try:
            swarm.push_ref(cli, local, tag, REGISTRY)
        finally:
            cli.api.remove_image(local, noprune=True)  # the tag only: the image stays
        log(f"{tag}: pushed as {ref} ({time.monotonic() - started:.1f} s)")
    return refs


def status(cli: docker.DockerClient, name: str = DEFAULT_NAME) -> dict[str, Any]:
    """What ``cluster status`` prints: per node its container's state, its swarm state, its
    engine, the agents and cluster images it holds; the registry and what it holds."""
    check_name(name)
    found = nodes(cli, name)
    swarm: dict[str, dict[str, Any]] = {}
    lead = next((n for n in found if n.manager and n.state == "running"), None)
    if lead is not None:
        try:
            with closing(node_client(lead, timeout=10)) as engine:
                swarm = swarm_nodes(engine)
        except (docker.errors.DockerException, OSError):
            pass
    rows = []
    for node in found:
        row: dict[str, Any] = {
            "node": node.hostname,
            "container": node.container,
            "state": node.state,
            "address": node.address,
            "swarm": swarm.get(node.hostname),
            "engine": None,
            "agents": [],
            "images": [],
        }
        if node.state == "running":
            try:
                with closing(node_client(node, timeout=10)) as engine:
                    row["engine"] = engine.version().get("Version")
                    row["agents"] = [
                        c.name for c in engine.containers.list(filters={"label": AGENT_LABEL})
                    ]
                    row["images"] = sorted(
                        t for i in engine.images.list() for t in i.tags if t.startswith(REGISTRY)
                    )
            except (docker.errors.DockerException, OSError):
                pass
        rows.append(row)
    try:
        reg = cli.containers.get(registry_container(name)).status
    except docker.errors.NotFound:
        reg = None
    return {
        "name": name,
        "up": bool(found) and all(r["state"] == "running" and r["swarm"] for r in rows),
        "nodes": rows,
        "registry": {"address": REGISTRY, "state": reg, "images": registry_images(cli, name)},
        "shares": list(found[0].shares) if found else [],
    }


#: What a node must have for the tracer, read on the node by a one-shot global service (its
#: file system at /host, read-only): one line per fact, "<node> <fact> <value>" (the node's
#: name from the service's template).
PROBE_SCRIPT = r"""
say() { echo "$NODE $*"; }
say kernel "$(uname -r)"
[ -r /host/sys/kernel/btf/vmlinux ] && say btf yes || say btf no
[ -r /host/sys/kernel/tracing/events/syscalls/sys_enter_openat/format ] && say tracefs yes \
  || say tracefs no
say bpftrace "$(bpftrace --version 2>/dev/null | head -n 1)"
for p in "$@"; do [ -d "/host$p" ] && say share "$p" || say noshare "$p"; done
say done
"""
PROBE_TIMEOUT_S = 180.0


def probe_nodes(
    engine: docker.DockerClient, image: str, shares: Sequence[str] = (), log: Log = lambda _: None
) -> dict[str, dict[str, Any]]:
    """Run :data:`PROBE_SCRIPT` on every node of the swarm, through the engine (a global
    service of one-shot tasks, no ssh), and return what each node said: ``{node: {kernel,
    btf, tracefs, bpftrace, shares: {path: bool}, error}}``. A node whose task failed (the
    image cannot be pulled there, say) has its error."""
    from docker.types import Mount, RestartPolicy, ServiceMode

    service = engine.services.create(
        image,
        ["sh", "-c", PROBE_SCRIPT, "probe", *shares],
        name=f"twintrace-check-{os.getpid()}-{int(time.time())}",
        mode=ServiceMode("global"),
        restart_policy=RestartPolicy(condition="none"),
        # The node's file system, read-only (recursive: its /sys mounts too): a bind of a
        # path a node lacks would fail the task instead of saying what is missing.
        mounts=[Mount("/host", "/", type="bind", read_only=True)],
        env=["NODE={{.Node.Hostname}}"],
        labels={CLUSTER_LABEL: "check"},
    )
    try:
        hosts = {n["id"]: host for host, n in swarm_nodes(engine).items()}
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        log(f"probing {len(hosts)} node(s) with {image}")
        while True:
            tasks = service.tasks()
            ended = [t for t in tasks if t["Status"]["State"] in ("complete", "failed", "rejected")]
            if len(ended) >= len(hosts) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        found: dict[str, dict[str, Any]] = {
            host: {"shares": {}, "error": "no answer in time"} for host in hosts.values()
        }
        for task in service.tasks():
            host = hosts.get(task.get("NodeID"), "?")
            state = task["Status"]["State"]
            if state != "complete":
                found.setdefault(host, {"shares": {}})["error"] = task["Status"].get("Err") or state
        text = b"".join(service.logs(stdout=True, stderr=False, follow=False)).decode(
            errors="replace"
        )
        for line in text.splitlines():
            host, _, rest = line.partition(" ")
            fact, _, value = rest.partition(" ")
            row = found.setdefault(host, {"shares": {}})
            if fact == "done":
                row["error"] = None
            elif fact in ("share", "noshare"):
                row["shares"][value] = fact == "share"
            elif fact:
                row[fact] = value
        return found
    finally:
        service.remove()


def _probe_checks(found: dict[str, dict[str, Any]], image: str) -> list[Check]:
    checks = []
    for host in sorted(found):
        row = found[host]
        problems, fixes = [], []
        if row.get("error"):
            problems.append(f"the probe did not run: {row['error']}")
            fixes.append(f"make {image} pullable on {host} (a registry every node reaches)")
        else:
            if row.get("btf") != "yes":
                problems.append("no /sys/kernel/btf/vmlinux")
                fixes.append("a kernel built with CONFIG_DEBUG_INFO_BTF")
            if row.get("tracefs") != "yes":
                problems.append("no tracefs at /sys/kernel/tracing")
                fixes.append(f"on {host}: `mount -t tracefs nodev /sys/kernel/tracing`")
            if not row.get("bpftrace"):
                problems.append(f"{image} has no bpftrace")
                fixes.append("use the tracer's image (twintrace/tracer, pushed to your registry)")
            for path, seen in row["shares"].items():
                if not seen:
                    problems.append(f"{path} is not there")
                    fixes.append(f"mount the shared data at {path} on {host}")
        shared = ", ".join(p for p, seen in row["shares"].items() if seen)
        checks.append(
            Check(
                f"tracing on {host}",
                not problems,
                "; ".join(problems)
                or f"kernel {row.get('kernel')}, BTF, tracefs, {row.get('bpftrace')}"
                + (f", {shared}" if shared else ""),
                "; ".join(fixes),
            )
        )
    return checks


def check(
    engine: docker.DockerClient,
    image: str | None = None,
    shares: Sequence[str] = (),
    log: Log = lambda _: None,
) -> list[Check]:
    """A real swarm, seen from its manager's engine: what is missing, node by node, with the
    fix for each. With ``image`` (the tracer, as the nodes pull it), a probe also runs on every
    node: kernel BTF, tracefs, bpftrace, the ``shares``."""
    checks = []
    try:
        info = engine.info()
    except (docker.errors.DockerException, OSError) as exc:
        return [
            Check(
                "engine",
                False,
                f"no Docker engine answers ({str(exc).splitlines()[0][:100]})",
                "point DOCKER_HOST at the manager's engine (unix socket, or ssh://user@manager)",
            )
        ]
    swarm = info.get("Swarm") or {}
    checks.append(
        Check(
            "engine",
            True,
            f"Docker {info.get('ServerVersion')} on {info.get('Name')} "
            f"({info.get('OperatingSystem')}, kernel {info.get('KernelVersion')})",
        )
    )
    active = swarm.get("LocalNodeState") == "active"
    checks.append(
        Check(
            "swarm",
            active,
            f"swarm state {swarm.get('LocalNodeState') or 'unknown'}",
            "on the manager: `docker swarm init --advertise-addr <its address>`",
        )
    )
    if not active:
        return checks
    is_manager = bool(swarm.get("ControlAvailable"))
    checks.append(
        Check(
            "manager",
            is_manager,
            "this engine is a manager" if is_manager else "this engine is a worker",
            "point DOCKER_HOST at a manager (`docker node ls` works there)",
        )
    )
    if not is_manager:
        return checks
    listed = engine.nodes.list()
    for node in sorted(listed, key=lambda n: n.attrs.get("Description", {}).get("Hostname", "")):
        desc = node.attrs.get("Description", {})
        host = desc.get("Hostname", node.id[:12])
        state = node.attrs.get("Status", {}).get("State")
        availability = node.attrs.get("Spec", {}).get("Availability")
        version = desc.get("Engine", {}).get("EngineVersion", "")
        major_minor = tuple(int(x) for x in re.findall(r"\d+", version)[:2]) or (0, 0)
        platform = desc.get("Platform", {})
        problems, fixes = [], []
        if state != "ready":
            problems.append(f"state {state}")
            fixes.append(
                f"start Docker on {host}, or on it `docker swarm join --token <worker token> <manager>:2377`"
            )
        if availability != "active":
            problems.append(f"availability {availability}")
            fixes.append(f"`docker node update --availability active {host}`")
        if major_minor < (20, 10):
            problems.append(f"engine {version}")
            fixes.append(f"install Docker 20.10 or newer on {host}")
        if platform.get("OS") != "linux":
            problems.append(f"OS {platform.get('OS')}")
            fixes.append("twintrace traces Linux nodes only")
        checks.append(
            Check(
                f"node {host}",
                not problems,
                "; ".join(problems)
                or f"ready, active, Docker {version}, {platform.get('Architecture')}",
                "; ".join(fixes),
            )
        )
    if image is not None and all(c.ok for c in checks):
        checks += _probe_checks(probe_nodes(engine, image, shares, log), image)
    return checks
