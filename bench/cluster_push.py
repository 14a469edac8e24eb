#!/usr/bin/env python3
"""Benchmark: getting a run's images onto the nodes of a virtual cluster, the two ways
its code can push them.

- A, through the manager (``tracing.swarm.push_images``, what a real swarm's ``--registry``
  does): each image saved from this host's engine, loaded into the manager's engine and pushed
  from there to the cluster's registry.
- B, from this host (``tracing.cluster.push``, what the virtual cluster does): this host's engine
  pushes each image to the registry's port on its loopback, the layers the registry lacks only.

Per round: a fresh 2-node cluster (its registry and nodes empty), then the two images of a run
and of the next run on the same base (default ``twintrace/unet3d:sleep``, then
``twintrace/unet3d:original``) pushed one way, then pulled by every node that lacks them (A
leaves them on the manager; B on no node). The two ways alternate, their order flipping every
round. Prints each round's times (push of each image, pulls, total) and the median and spread
of each way's totals and of the ratio B / A of the rounds' totals (paired by round).

Measured on this project's 2-vCPU VM (``--rounds 2``): host / manager 0.99 (spread 0.84-1.15)
end to end; B pushes faster (49-51 s against 68-85 s, and 0.1-0.2 s against 12-15 s for the
second image) but every node then pulls, where A left the images on the manager. See
docs/cluster.md, "The virtual cluster" (Registry).

Usage: python bench/cluster_push.py [--rounds 2] [--images TAG TAG ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import closing
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import docker  # noqa: E402

from bench.spread import median_spread  # noqa: E402
from tracing import cluster as vc  # noqa: E402
from tracing import swarm  # noqa: E402

NAME = "twbench"


def one_way(cli: docker.DockerClient, way: str, tags: list[str]) -> dict[str, float]:
    """A fresh cluster, ``tags`` pushed ``way`` (``manager`` or ``host``) one after the other,
    then pulled by every node that lacks them: the seconds of each step."""
    vc.down(cli, NAME)
    vc.up(cli, 2, [], NAME)
    times: dict[str, float] = {}
    try:
        lead = vc.manager(cli, NAME)
        for tag in tags:
            started = time.monotonic()
            if way == "manager":
                with closing(vc.node_client(lead, timeout=900)) as engine:
                    swarm.push_images(cli, engine, [tag], vc.REGISTRY, where=lead.hostname)
            else:
                vc.push(cli, [tag], NAME)
            times[f"push {tag}"] = time.monotonic() - started
        started = time.monotonic()
        for node in vc.nodes(cli, NAME):
            with closing(vc.node_client(node, timeout=900)) as engine:
                for tag in tags:
                    ref = vc.registry_ref(tag)
                    try:
                        engine.images.get(ref)
                    except docker.errors.ImageNotFound:
                        engine.images.pull(ref)
        times["pulls"] = time.monotonic() - started
    finally:
        vc.down(cli, NAME)
    times["total"] = sum(times.values())
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--images", nargs="+", default=["twintrace/unet3d:sleep", "twintrace/unet3d:original"]
    )
    args = parser.parse_args()
    cli = docker.from_env()
    totals: dict[str, list[float]] = {"manager": [], "host": []}
    for i in range(args.rounds):
        order = ["manager", "host"] if i % 2 == 0 else ["host", "manager"]
        for way in order:
            times = one_way(cli, way, args.images)
            totals[way].append(times["total"])
            shown = ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
            print(f"round {i + 1} {way}: {shown}", flush=True)
    for way, values in totals.items():
        print(f"{way}: total {median_spread(values, '.1f')} s")
    ratios = [b / a for a, b in zip(totals["manager"], totals["host"], strict=True)]
    print(f"host / manager: {median_spread(ratios)} ({len(ratios)} rounds)")
    print(
        f"median saving: {statistics.median(totals['manager']) - statistics.median(totals['host']):.1f} s"
    )


if __name__ == "__main__":
    main()
