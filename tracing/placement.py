"""Where a run's containers go: the hosts of a run, one (this host) or several (the nodes of a
cluster, ``trace --nodes K``: docs/cluster.md).

A :class:`Host` is what the runner (tracing/runner.py) needs of each: its name (the ``host``
column of the run's tables), an engine to start its containers and its agent through, the
address the agent's port is published on, and the subfolder of ``raw/`` its agent writes to.

On a cluster (:func:`cluster_hosts`): the first K ready nodes of a swarm, or the nodes named,
in order, the containers dealt round-robin (rank r on node r mod K, so uneven shares are
allowed); the run's images come from the registry the nodes pull from (pushed once, pulled by
every node that runs one); the run directory and every bind mount must be on a path the nodes
share: the run's files are written by each node's containers and agent in place, as on a
shared file system. The swarm is the virtual cluster (tracing/cluster.py: its registry and
shared folders known) or a real one, named by its manager's engine (``--engine``) and the
registry its nodes pull from (``--registry``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

from core.errors import UserError
from tracing.container import client

if TYPE_CHECKING:
    from tracing.request import RunOptions

Progress = Callable[[str], None]


@dataclasses.dataclass(eq=False)
class Host:
    """One host of a run (compared by identity)."""

    name: str
    cli: docker.DockerClient
    #: The address its agent's port is published on, and dialled.
    address: str = "127.0.0.1"
    #: Its agent's outputs: ``raw/<host_dir>/`` ("" on a run of one host: ``raw/``).
    host_dir: str = ""
    #: The image references its engine knows the run's images by (tag -> reference).
    refs: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Its engine's URL (None: this host's, from the environment).
    engine: str | None = None
    #: A node of a swarm: ``cli`` and ``engine`` are the manager's, which places its
    #: containers as services (tracing/swarm.py); its own engine is not asked.
    swarm: bool = False
    #: A swarm node's attributes, as placement constraints name them (:func:`node_attributes`).
    attributes: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Set by the runner: its agent (tracing.tracer_container.LocalAgent).
    agent: Any = None
    #: Set by the runner: what is added to its times to put them on the coordinator's clock
    #: (minus its clock offset; 0 on a run of one host, the coordinator's own clock).
    shift_ns: int = 0
    #: Set by the runner: why it left the run (its engine stopped answering, or its agent
    #: died), None while it is part of it.
    lost: str | None = None
    #: Set by the runner with ``lost``: its engine still answers (only its agent died), so
    #: the run's containers and agent there can still be removed.
    engine_alive: bool = True

    def ref(self, tag: str) -> str:
        return self.refs.get(tag, tag)

    def connect(self) -> docker.DockerClient:
        """A new client of its engine (one per thread that uses it at the same time)."""
        return client() if self.engine is None else docker.DockerClient(self.engine, timeout=120)


def _under(path: Path, shares: Sequence[str]) -> bool:
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(Path(share)) for share in shares)


def cluster_hosts(
    cli: docker.DockerClient,
    run: RunOptions,
    tags: Sequence[str],
    paths: Sequence[Path],
    progress: Progress,
) -> tuple[list[Host], Any]:
    """The nodes of the run (``run.nodes`` of them, or the nodes ``run.node_names``) as hosts,
    with the run's images (``tags``) pushed to the registry the nodes pull from, and the
    swarm manager's engine. ``run.engine`` names a swarm's manager (a real cluster, its
    registry ``run.registry``); without it the virtual cluster ``run.cluster`` is the swarm
    (tracing/cluster.py), and ``paths`` (the run directory's parent and the mounts, which
    every node must see) are checked against the folders it shares."""
    from tracing import cluster, swarm

    count = run.nodes or 0
    if run.engine is None:
        lead = next((n for n in cluster.nodes(cli, run.cluster) if n.manager), None)
        if lead is None or lead.state != "running":
            raise UserError(
                f"no cluster {run.cluster!r} is up: run `./cli.py cluster up --nodes {count}`"
            )
        for path in paths:
            if not _under(path, lead.shares):
                raise UserError(
                    f"{path} is not on a path the cluster's nodes share "
                    f"({', '.join(lead.shares)}): `./cli.py cluster up --share DIR` with a "
                    "folder that holds it"
                )
        engine, where = lead.engine, f"cluster {run.cluster!r}"
        fix = f"run `./cli.py cluster down` then `./cli.py cluster up --nodes {count}`"
    else:
        engine, where = run.engine, f"the swarm of {run.engine}"
        fix = f"`./cli.py cluster check --engine {run.engine}` says what is missing"
    manager = _manager(engine, where, fix)
    try:
        ready = ready_nodes(manager)
        names = list(run.node_names) or [n.hostname for n in ready[:count]]
        by_name = {n.hostname: n for n in ready}
        missing = [name for name in names if name not in by_name]
        if len(names) < count or missing:
            what = f"node {', '.join(missing)} is not" if missing else f"{len(ready)} node(s) are"
            raise UserError(
                f"--nodes {','.join(run.node_names) or count}: in {where} {what} ready and "
                f"active (ready: {', '.join(by_name) or 'none'}); {fix}"
            )
        chosen = [by_name[name] for name in names]
        progress(f"placing the run on {', '.join(names)} of {where}")
        refs: dict[str, str] = {}  # without a registry the nodes know the images by their tags
        if run.engine is None:
            pushed = cluster.push(cli, list(tags), run.cluster, progress)
            refs = dict(zip(tags, pushed, strict=True))
        elif run.registry is not None:
            lead_name = str(manager.info().get("Name") or "the manager")
            pushed = swarm.push_images(cli, manager, list(tags), run.registry, progress, lead_name)
            refs = dict(zip(tags, pushed, strict=True))
        for run_id in swarm.remove_orphans(manager):
            progress(f"removed the services of run {run_id}, left behind by a killed tracer")
    except BaseException:
        manager.close()
        raise
    # Each host a client of the manager's engine of its own (the runner's threads use them at
    # once); a node pulls an image from the registry as the swarm starts a task of it there.
    hosts = [
        Host(
            n.hostname, docker.DockerClient(engine, timeout=120), n.address, n.hostname,
            refs, engine, swarm=True, attributes=n.attributes,
        )
        for n in chosen
    ]  # fmt: skip
    return hosts, manager


@dataclasses.dataclass(frozen=True)
class SwarmNode:
    """A node a run can be placed on: ready and active in its swarm."""

    hostname: str
    address: str
    attributes: dict[str, str]


def ready_nodes(manager: docker.DockerClient) -> list[SwarmNode]:
    """The swarm's ready, active nodes with an address, by host name (``node-2`` before
    ``node-10``)."""
    from tracing.cluster import swarm_nodes

    def natural(name: str) -> list[Any]:
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

    found = [
        SwarmNode(host, node["address"], node["attributes"])
        for host, node in swarm_nodes(manager).items()
        if node["state"] == "ready" and node["availability"] == "active" and node["address"]
    ]
    return sorted(found, key=lambda n: natural(n.hostname))


def _manager(engine: str, where: str, fix: str) -> docker.DockerClient:
    """A client of swarm manager ``engine``; a UserError when it is not one."""
    manager = docker.DockerClient(engine, timeout=120)
    try:
        state = manager.info().get("Swarm") or {}
    except (docker.errors.DockerException, OSError) as exc:
        manager.close()
        first = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise UserError(f"the engine of {where} does not answer ({first}); {fix}") from None
    if state.get("LocalNodeState") != "active" or not state.get("ControlAvailable"):
        manager.close()
        raise UserError(f"the engine of {where} is not a swarm manager; {fix}")
    return manager


#: A swarm placement constraint (docs.docker.com/engine/swarm/services/#placement-constraints):
#: a node attribute, == or !=, a value.
CONSTRAINT = re.compile(
    r"^\s*(node\.id|node\.hostname|node\.role|node\.platform\.os|node\.platform\.arch"
    r"|node\.labels\.[^\s=!]+|engine\.labels\.[^\s=!]+)\s*(==|!=)\s*(\S+)\s*$"
)


def parse_constraint(text: str, where: str) -> tuple[str, str, str]:
    """(attribute, operator, value) of a placement constraint; a UserError naming ``where``."""
    found = CONSTRAINT.match(text)
    if found is None:
        raise UserError(
            f"{where}: {text!r} is not a swarm placement constraint (node.hostname, node.role, "
            "node.id, node.platform.os, node.platform.arch, node.labels.KEY or engine.labels.KEY, "
            "then == or !=, then a value)"
        )
    return found.group(1), found.group(2), found.group(3)


def node_attributes(node: dict) -> dict[str, str]:
    """What constraints name, of a swarm node as its manager describes it (``docker node
    inspect``)."""
    spec, desc = node.get("Spec", {}), node.get("Description", {})
    found = {
        "node.id": node.get("ID", ""),
        "node.hostname": desc.get("Hostname", ""),
        "node.role": spec.get("Role", ""),
        "node.platform.os": desc.get("Platform", {}).get("OS", ""),
        "node.platform.arch": desc.get("Platform", {}).get("Architecture", ""),
    }
    found |= {f"node.labels.{k}": v for k, v in (spec.get("Labels") or {}).items()}
    engine = desc.get("Engine", {}).get("Labels") or {}
    return found | {f"engine.labels.{k}": v for k, v in engine.items()}


def meets(attributes: dict[str, str], constraints: Sequence[str]) -> bool:
    """Whether a node meets every constraint, compared as the swarm compares (ignoring case;
    an attribute the node lacks equals nothing)."""
    for text in constraints:
        key, op, value = parse_constraint(text, "constraint")
        equal = attributes.get(key, "\0").casefold() == value.casefold()
        if equal != (op == "=="):
            return False
    return True


def deal(
    roles: Sequence[str],
    hosts: Sequence[Host],
    constraints: dict[str, Sequence[str]] | None = None,
) -> dict[str, Host]:
    """Role -> host: round-robin in the roles' order (rank r on host r mod K); a role with
    placement ``constraints`` goes to the least loaded host that meets them (by its
    ``attributes``), the first of them on a tie. The swarm enforces the constraints too: they
    go with the role's service."""
    constraints = constraints or {}
    placed: dict[str, Host] = {}
    load = dict.fromkeys(hosts, 0)
    free = iter(range(len(roles)))
    for role in roles:
        if constraints.get(role):
            fit = [h for h in hosts if meets(h.attributes, constraints[role])]
            if not fit:
                raise UserError(
                    f"no node of the run meets {role}'s placement constraints "
                    f"({', '.join(constraints[role])}): the run's nodes are "
                    f"{', '.join(h.name for h in hosts)}; change the constraints or --nodes"
                )
            host = min(fit, key=lambda h: load[h])
        else:
            host = hosts[next(free) % len(hosts)]
        placed[role] = host
        load[host] += 1
    return placed


def close(hosts: Sequence[Host], *more: Any) -> None:
    """Close the engine clients of a cluster's hosts (not this host's own)."""
    for cli in [h.cli for h in hosts if h.host_dir] + [m for m in more if m is not None]:
        try:
            cli.close()
        except Exception:
            pass
