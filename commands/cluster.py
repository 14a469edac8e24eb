"""The virtual cluster and real swarms: ``cluster up|status|push|down|check``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from commands.common import (
    err_console,
    json_option,
    print_checks,
    user_errors,
)
from core.errors import UserError


@click.group()
def cluster() -> None:
    """A cluster of Docker hosts in a swarm: a virtual one on this host for tests and demos
    (`up`, `status`, `push`, `down`), and `check` for a real one (docs/cluster.md).

    \b
    Examples:
      ./cli.py cluster up --nodes 3 --share data
      ./cli.py cluster status
      ./cli.py cluster down
    """


name_option = click.option(
    "--name",
    default="twintrace",
    show_default=True,
    help="The virtual cluster's name (its containers are NAME-node-1 ...).",
)


@cluster.command("up")
@click.option("--nodes", "count", type=int, required=True, help="How many nodes (1 to 16).")
@click.option(
    "--share",
    "shares",
    multiple=True,
    type=click.Path(path_type=Path),
    help="A host folder every node sees at the same path, as a shared file system "
    "(repeatable; default: ./runs and, where it exists, ./data).",
)
@name_option
@user_errors
def cluster_up(count: int, shares: tuple[Path, ...], name: str) -> None:
    """Make a virtual cluster of Docker-in-Docker nodes on this host: a swarm (node-1 its
    manager), a registry the nodes pull from, the shared folders on every node. Builds
    twintrace/node first where it is missing (about a minute).

    Example: ./cli.py cluster up --nodes 3 --share data
    """
    from images.build import build_node
    from tracing import cluster as vc
    from tracing.container import client

    cli_ = client()
    if not shares:
        Path("runs").mkdir(exist_ok=True)
        shares = tuple(p for p in (Path("runs"), Path("data")) if p.is_dir())
    with err_console.status("building twintrace/node"):
        build_node(cli_, err_console.print)
    with err_console.status(f"starting {count} node(s)"):
        made = vc.up(cli_, count, shares, name, log=err_console.print)
    for node in made:
        role = "manager" if node.manager else "worker"
        click.echo(f"{node.hostname}\t{node.address}\t{role}\t{node.engine}")


@cluster.command("status")
@json_option("Print the status as JSON.")
@name_option
@user_errors
def cluster_status(as_json: bool, name: str) -> None:
    """List the virtual cluster's nodes (container, swarm state, engine), the agents and the
    cluster images each holds, and the registry's images. Exit status 1 when it is not up.

    Example: ./cli.py cluster status --json
    """
    from tracing import cluster as vc
    from tracing.container import client

    found = vc.status(client(), name)
    if as_json:
        click.echo(json.dumps(found, indent=2))
    else:
        table = Table(
            "node", "container", "state", "address", "swarm", "engine", "agents", "images"
        )
        for row in found["nodes"]:
            swarm = row["swarm"] or {}
            table.add_row(
                row["node"],
                row["container"],
                row["state"],
                row["address"] or "",
                " ".join(str(swarm.get(k)) for k in ("role", "state", "availability") if swarm)
                or "not in the swarm",
                row["engine"] or "",
                str(len(row["agents"])),
                Text("\n".join(row["images"])),
            )
        Console(width=max(140, Console().width)).print(table)
        reg = found["registry"]
        click.echo(
            f"registry {reg['address']}: {reg['state'] or 'absent'}; "
            f"{len(reg['images'])} image(s){': ' if reg['images'] else ''}{', '.join(reg['images'])}"
        )
        click.echo(f"shared folders: {', '.join(found['shares']) or 'none'}")
    if not found["up"]:
        raise UserError(
            f"cluster {name!r} is not up"
            + (": `./cli.py cluster down`, then `cluster up`" if found["nodes"] else "")
        )


@cluster.command("push")
@click.argument("images", nargs=-1, required=True)
@name_option
@user_errors
def cluster_push(images: tuple[str, ...], name: str) -> None:
    """Put local images in the virtual cluster's registry, once; print the names the nodes
    pull them by.

    Example: ./cli.py cluster push twintrace/unet3d:sleep twintrace/tracer:latest
    """
    from tracing import cluster as vc
    from tracing.container import client

    for ref in vc.push(client(), images, name, log=err_console.print):
        click.echo(ref)


@cluster.command("down")
@name_option
@user_errors
def cluster_down(name: str) -> None:
    """Remove every node, network, volume, registry, cgroup and swarm state of the virtual
    cluster (also what a crashed `up` left).

    Example: ./cli.py cluster down
    """
    from tracing import cluster as vc
    from tracing.container import client

    removed = vc.down(client(), name)
    click.echo(f"removed {len(removed)} object(s)" if removed else f"no cluster {name!r} was up")


@cluster.command("check")
@click.option(
    "--engine",
    default=None,
    help="The swarm manager's engine (default: $DOCKER_HOST, else the virtual cluster's "
    "manager where one is up, else this host's engine).",
)
@click.option(
    "--image",
    default=None,
    help="Also run a probe on every node from this image, the tracer as the nodes pull it "
    "(kernel BTF, tracefs, bpftrace; on the virtual cluster registry:5000/twintrace/tracer:latest).",
)
@click.option(
    "--share",
    "shares",
    multiple=True,
    help="With --image: a path every node must have (the shared data; repeatable).",
)
@json_option("Print the checks as JSON.")
@name_option
@user_errors
def cluster_check(
    engine: str | None, image: str | None, shares: tuple[str, ...], as_json: bool, name: str
) -> None:
    """Check a swarm for twintrace, node by node, with the fix for each failure.

    Example: ./cli.py cluster check --engine ssh://root@manager
    """
    import docker

    from tracing import cluster as vc
    from tracing.container import client

    url = engine or os.environ.get("DOCKER_HOST")
    if url is None:
        try:
            url = vc.manager(client(), name).engine
        except UserError:
            url = None
    manager_engine = docker.DockerClient(base_url=url, timeout=30) if url else docker.from_env()
    if not as_json:
        err_console.print(f"checking the swarm through {url or 'this host'}")
    print_checks(vc.check(manager_engine, image, shares, log=err_console.print), as_json)
