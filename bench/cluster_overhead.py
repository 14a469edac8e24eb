#!/usr/bin/env python3
"""Benchmark: a run across nodes, traced against untraced, and the coordinator's own time,
against the same roles on this one host and against the number of nodes.

Method: a virtual cluster of 3 nodes (``tracing/cluster.py``, made here under the name
``ttbench`` and removed at the end) sharing a temporary folder that holds a small UNet3D
dataset (6 cases, as the tests' ``tiny_unet3d``). The run: ``unet3d`` ``sleep``, 3 ranks in
rank containers, ``--epochs`` epochs, the default profile, on this host without a cluster
(``host``) and on 1, 2 and 3 nodes. Per round, every placement (its order rotating every
round) runs untraced and traced, their order flipped every round. Prints per placement:

- the workload's time (release to last exit, the manifest's ``end_ns - start_ns``) traced
  over untraced, median and spread over the rounds: what tracing every node costs the job;
- the coordinator's ``call_to_release`` (checks, placement, pulls, containers and agents
  started, probes attached, clocks estimated) and ``exit_to_processed`` (stops, collection,
  each host's ingest, the merge), traced, median and spread (manifest ``coordinator_s``).

The images are pushed to the cluster's registry and pulled by the nodes before the first
round (one untraced and one traced run on 3 nodes, not kept), as a cluster in use holds them.

    python bench/cluster_overhead.py [--rounds 3] [--epochs 4]

Measured on the 2-vCPU AMD EPYC VM of the project: docs/cluster.md, "What a run across nodes
costs". Every node is a container of the same 2 vCPUs: the figures are of the coordinator's
and the tracer's work, not of a real cluster's network.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.spread import median_spread  # noqa: E402
from datagen.unet3d import UNet3DGenParams, generate_unet3d  # noqa: E402
from tracing import cluster, container  # noqa: E402
from tracing.request import RunOptions, workload_request  # noqa: E402
from tracing.runner import trace  # noqa: E402

NAME = "ttbench"
PLACEMENTS = ("host", "1", "2", "3")


def one(data: Path, runs: Path, placement: str, traced: bool, epochs: int) -> dict:
    """The figures of one run (module doc); its directory removed."""
    nodes = None if placement == "host" else int(placement)
    request = workload_request(
        "unet3d",
        "sleep",
        data,
        runs,
        settings={"epochs": epochs, "batch_size": 1, "workers": 1, "accelerators": 3, "seed": 0},
        options={"patch_size": "32"},
        rank_containers=True,
        run=RunOptions(nodes=nodes, cluster=NAME, tracing=traced),
    )
    outcome = trace(request)
    if outcome.status != "completed":
        raise SystemExit(f"{placement} traced={traced}: the run did not complete: {outcome.error}")
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    shutil.rmtree(outcome.run_dir)
    return {
        "job_s": (manifest["end_ns"] - manifest["start_ns"]) / 1e9,
        **manifest.get("coordinator_s", {}),
        "skew_ms": manifest.get("release_skew_ns", 0) / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    cli = container.client()
    share = Path(tempfile.mkdtemp(prefix="twintrace-cluster-bench-"))
    try:
        data = share / "unet3d"
        generate_unet3d(
            data,
            8_000_000,
            seed=1,
            params=UNet3DGenParams(s1_range=(40, 48), s2_range=(48, 56), min_dim=40),
        )
        cluster.down(cli, NAME)
        t = time.monotonic()
        cluster.up(cli, 3, [share], NAME)
        print(f"cluster {NAME} of 3 nodes up in {time.monotonic() - t:.0f} s", flush=True)
        for traced in (False, True):  # warm: the registry and the nodes hold the images
            one(data, share / "runs", "3", traced, 1)
        results: dict[tuple[str, bool], list[dict]] = {
            (p, t): [] for p in PLACEMENTS for t in (False, True)
        }
        for r in range(args.rounds):
            order = PLACEMENTS[r % len(PLACEMENTS) :] + PLACEMENTS[: r % len(PLACEMENTS)]
            for placement in order:
                for traced in (r % 2 == 0, r % 2 != 0):
                    results[placement, traced].append(
                        one(data, share / "runs", placement, traced, args.epochs)
                    )
                pair = [results[placement, t][-1]["job_s"] for t in (False, True)]
                print(
                    f"round {r + 1} {placement:>4}: job untraced {pair[0]:.2f} s, traced "
                    f"{pair[1]:.2f} s, ratio {pair[1] / pair[0]:.3f}; to release "
                    f"{results[placement, True][-1]['call_to_release']:.2f} s, exit to processed "
                    f"{results[placement, True][-1]['exit_to_processed']:.2f} s",
                    flush=True,
                )
        print(f"\n{args.rounds} rounds, {args.epochs} epochs, 3 ranks; medians (spread min .. max)")
        for placement in PLACEMENTS:
            untraced, traced = results[placement, False], results[placement, True]
            ratios = [b["job_s"] / a["job_s"] for a, b in zip(untraced, traced, strict=True)]
            where = "this host" if placement == "host" else f"{placement} node(s)"
            print(f"{where}:")
            print(f"  job traced / untraced       {median_spread(ratios)}")
            print(
                f"  job traced (s)              {median_spread([x['job_s'] for x in traced], '.2f')}"
            )
            for key in ("call_to_release", "exit_to_processed"):
                print(
                    f"  {key + ' traced (s)':<27} {median_spread([x[key] for x in traced], '.2f')}"
                )
            for key in ("call_to_release", "exit_to_processed"):
                print(
                    f"  {key + ' untraced (s)':<27} "
                    f"{median_spread([x[key] for x in untraced], '.2f')}"
                )
            if placement != "host":
                skews = [x["skew_ms"] for x in traced]
                print(f"  release skew (ms)           {median_spread(skews, '.2f')}")
    finally:
        cluster.down(cli, NAME)
        shutil.rmtree(share, ignore_errors=True)


if __name__ == "__main__":
    main()
