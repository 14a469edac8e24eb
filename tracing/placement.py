"""Where a run's containers go: the hosts of a run, one (this host) or several (the nodes of a
cluster, ``trace --nodes K``: docs/cluster.md).

A :class:`Host` is what the runner (tracing/runner.py) needs of each: its name (the ``host``
column of the run's tables), an engine to start its containers and its agent through, the
address the agent's port is published on, and the subfolder of ``raw/`` its agent writes to.

On a cluster (:func:`cluster_hosts`): the first K running nodes of the virtual cluster
(tracing/cluster.py) in order, the containers dealt round-robin (rank r on node r mod K, so
uneven shares are allowed); the run's images come from the cluster's registry (pushed once,
pulled by every node that runs one); the run directory and every bind mount must be on a path
the nodes share (``cluster up --share``): the run's files are written by each node's
containers and agent in place, as on a shared file system.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors

from core.errors import UserError
from tracing.container import client

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
    count: int,
    cluster_name: str,
    tags: Sequence[str],
    paths: Sequence[Path],
    progress: Progress,
) -> tuple[list[Host], Any]:
    """The first ``count`` nodes of cluster ``cluster_name`` as hosts, with the run's images
    (``tags``) pushed to its registry and pulled on every node, and the manager's engine.
    ``paths``: the run directory's parent and the mounts, which every node must see."""
    from tracing import cluster, swarm

    found = [n for n in cluster.nodes(cli, cluster_name) if n.state == "running"]
    lead = next((n for n in found if n.manager), None)
    if lead is None:
        raise UserError(
            f"no cluster {cluster_name!r} is up: run `./cli.py cluster up --nodes {count}`"
        )
    if count < 1 or count > len(found):
        raise UserError(
            f"--nodes {count}: cluster {cluster_name!r} has {len(found)} node(s) up; "
            f"run `./cli.py cluster down` then `./cli.py cluster up --nodes {count}`"
        )
    shares = found[0].shares
    for path in paths:
        if not _under(path, shares):
            raise UserError(
                f"{path} is not on a path the cluster's nodes share ({', '.join(shares)}): "
                f"`./cli.py cluster up --share DIR` with a folder that holds it"
            )
    chosen = found[:count]
    progress(f"placing the run on {', '.join(n.hostname for n in chosen)} of {cluster_name}")
    refs = dict(zip(tags, cluster.push(cli, list(tags), cluster_name, progress), strict=True))
    # Each host a client of the manager's engine of its own (the runner's threads use them at
    # once); a node pulls an image from the registry as the swarm starts a task of it there.
    hosts = [
        Host(
            n.hostname, cluster.node_client(lead), str(n.address), n.hostname, refs,
            lead.engine, swarm=True,
        )
        for n in chosen
    ]  # fmt: skip
    manager = cluster.node_client(lead)
    described = {n["Description"]["Hostname"]: node_attributes(n) for n in manager.api.nodes()}
    for h in hosts:
        h.attributes = described.get(h.name, {})
    for run_id in swarm.remove_orphans(manager):
        progress(f"removed the services of run {run_id}, left behind by a killed tracer")
    return hosts, manager


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
