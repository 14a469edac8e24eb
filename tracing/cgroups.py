"""Locate a process's cgroups (v2 id for the bpftrace filter, v1/v2 files for the samplers).

Works on hybrid hosts (v1 controllers plus the unified hierarchy at /sys/fs/cgroup/unified)
and on pure cgroup-v2 hosts (unified hierarchy at /sys/fs/cgroup).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from core.errors import UserError

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclasses.dataclass(frozen=True)
class ProcessCgroups:
    """Where the cgroup files of one process live."""

    v2_dir: Path  # unified-hierarchy directory (its inode number is the bpftrace cgroup id)
    cpuacct_dir: Path | None  # v1 cpuacct controller directory, None on pure v2
    memory_dir: Path | None  # v1 memory controller directory, None on pure v2
    # Where pids.current and pids.events are: the v1 pids controller's directory, or the
    # unified one (pure v2); None where the host has no pids controller.
    pids_dir: Path | None = None
    # The v1 blkio controller's directory (None on pure v2): the block cgroup its bios carry.
    blkio_dir: Path | None = None

    @property
    def v2_id(self) -> int:
        """The cgroup-v2 id, as bpftrace's `cgroup` builtin and `cgroupid()` report it."""
        return os.stat(self.v2_dir).st_ino

    @property
    def block_id(self) -> int:
        """The id of the cgroup its block I/O is charged to (a bio's ``bi_blkg``, which the
        read throttle queues by): the v1 blkio controller's where the host has one, else the
        cgroup-v2 id."""
        return os.stat(self.blkio_dir).st_ino if self.blkio_dir is not None else self.v2_id

    @property
    def is_v1(self) -> bool:
        return self.memory_dir is not None


def unified_root() -> Path:
    """The mount point of the cgroup-v2 hierarchy."""
    if (CGROUP_ROOT / "unified" / "cgroup.procs").exists():
        return CGROUP_ROOT / "unified"
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return CGROUP_ROOT
    raise UserError(
        "no cgroup-v2 hierarchy found under /sys/fs/cgroup: twintrace scopes tracing by "
        "cgroup-v2 id; boot with a kernel that has cgroup v2 (hybrid or unified)"
    )


def cgroups_of(pid: int) -> ProcessCgroups:
    """Read /proc/PID/cgroup and map it to directories under /sys/fs/cgroup."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except FileNotFoundError:
        raise UserError(f"process {pid} ended before its cgroup could be read") from None
    v2_rel = None
    v1: dict[str, str] = {}
    for line in lines:
        hier, controllers, rel = line.split(":", 2)
        if hier == "0":
            v2_rel = rel
        for controller in controllers.split(","):
            if controller:
                v1[controller] = rel
    if v2_rel is None:
        raise UserError(f"process {pid} has no cgroup-v2 membership; twintrace needs cgroup v2")
    root = unified_root()
    v2_dir = root / v2_rel.lstrip("/")
    cpuacct = memory = blkio = None
    pids: Path | None = v2_dir
    if root != CGROUP_ROOT:
        if "cpuacct" in v1:
            cpuacct = _v1_dir("cpuacct", v1["cpuacct"])
        if "memory" in v1:
            memory = _v1_dir("memory", v1["memory"])
        pids = _v1_dir("pids", v1["pids"]) if "pids" in v1 else None
        blkio = _v1_dir("blkio", v1["blkio"]) if "blkio" in v1 else None
    return ProcessCgroups(v2_dir, cpuacct, memory, pids, blkio)


def _v1_dir(controller: str, rel: str) -> Path:
    # The cpuacct controller is usually co-mounted as "cpu,cpuacct" with symlinks for each name.
    return CGROUP_ROOT / controller / rel.lstrip("/")
