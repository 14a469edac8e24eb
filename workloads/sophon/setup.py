"""The training side's set-up of a remote dataset, once per run before the ranks start.

Every remote mode lists the dataset (``Describe``). ``remote-sophon`` also runs the profiling
epoch (the storage node measures every training sample's size after each transform and each
transform's CPU time, ``Profile``), measures the link's bandwidth (``Probe``), and plans the
offload (:func:`workloads.sophon.policy.plan_offload`, with the storage node's usable CPUs).
Written to the run's output directory: ``offload-profile.csv`` (the profile,
:func:`workloads.sophon.policy.write_profile`) and ``offload-plan.json`` (the plan's figures and
the stage of every sample). Logged: the interval ``remote_setup`` and the point
``offload_plan`` (the plan's figures).
"""

from __future__ import annotations

from pathlib import Path

from core.atomic import atomic_write_json
from core.errors import UserError
from workloads.config import WorkloadConfig
from workloads.events import Emitter
from workloads.images.options import ImageOptions
from workloads.images.task import RemoteData
from workloads.sophon.client import in_subprocess, setup_remote
from workloads.sophon.policy import plan_offload, write_profile
from workloads.sophon.stages import STAGES

PROFILE_NAME = "offload-profile.csv"
PLAN_NAME = "offload-plan.json"


def plan_remote(
    config: WorkloadConfig, options: ImageOptions, out_dir: Path, emitter: Emitter
) -> RemoteData:
    """List (and for ``remote-sophon`` profile and plan) the remote dataset (module doc)."""
    selective = options.dataset == "remote-sophon"
    address = options.storage_host
    emitter.start("remote_setup", value={"mode": options.dataset, "storage": address})
    setup = in_subprocess(setup_remote, address, selective, config.seed, options.image_size, ())
    listing = setup.listing
    n = len(listing.labels["train"])
    if n == 0:
        raise UserError(f"the storage server at {address} has no training images")
    stages = None
    if selective:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_profile(out_dir / PROFILE_NAME, setup.profiles)
        if sorted(p.index for p in setup.profiles) != list(range(n)):
            raise UserError(f"the storage server at {address} profiled a different sample set")
        plan = plan_offload(setup.profiles, listing.cpus, setup.bandwidth_bytes_s)
        stages = tuple(plan.stages[i] for i in range(n))
        summary = {**plan.summary(), "profile_s": setup.profile_s}
        atomic_write_json(
            out_dir / PLAN_NAME,
            {**summary, "stage_names": list(STAGES), "stages": list(stages)},
        )
        emitter.point("offload_plan", summary)
        print(
            f"offload plan: {plan.offloaded} of {n} samples offloaded; link "
            f"{plan.bandwidth_bytes_s * 8e-6:.0f} Mbit/s, storage {listing.cpus:g} CPUs: "
            f"network {plan.network_s:.2f} s -> {plan.planned_network_s:.2f} s, storage CPU "
            f"{plan.storage_cpu_s:.2f} s per epoch",
            flush=True,
        )
    emitter.stop("remote_setup", value={"samples": n, "storage_cpus": listing.cpus})
    return RemoteData(
        classes=listing.classes,
        train_labels=listing.labels["train"],
        val_labels=listing.labels["val"],
        stages=stages,
    )
