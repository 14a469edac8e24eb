"""SOPHON's selective offload policy: which samples the storage node preprocesses, and how far.

From a profile of every sample (its size after each transform and each transform's CPU time,
:class:`SampleProfile`), each sample's best stage is its smallest intermediate (the first stage
strictly smaller than the raw file; none when no stage is), its saving the bytes that stage
saves, its cost the CPU time of the transforms up to it, and its efficiency saving / cost.

Samples are offloaded greedily, most efficient first, while the network time of the epoch (bytes
on the wire / link bandwidth) is above the storage node's CPU time (the offloaded samples'
cost / its cores). The sample that would cross over is offloaded only when that lowers the
larger of the two (the epoch's bound), which is where SOPHON's loop stops too (it leaves that
sample out). The training node's own CPU is not modelled, as in the paper: the policy assumes
that the network or the storage node is the bottleneck.

Pure Python; the profile file is CSV (:func:`write_profile`, :func:`read_profile`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from core.atomic import atomic_write_text
from core.errors import UserError
from workloads.sophon.stages import RAW, STAGES, TRANSFORMS

PROFILE_COLUMNS: tuple[str, ...] = (
    "index",
    *(f"{s}_bytes" for s in STAGES),
    *(f"{t}_cpu_ns" for t in TRANSFORMS),
)


@dataclasses.dataclass(frozen=True)
class SampleProfile:
    """One sample: ``bytes_after[k]`` its size at stage k (RAW .. TENSOR), ``cpu_ns[k]`` the CPU
    time of the transform from stage k to k + 1."""

    index: int
    bytes_after: tuple[int, ...]
    cpu_ns: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.bytes_after) != len(STAGES) or len(self.cpu_ns) != len(TRANSFORMS):
            raise ValueError(
                f"sample {self.index}: {len(STAGES)} sizes and {len(TRANSFORMS)} CPU times "
                f"needed, got {len(self.bytes_after)} and {len(self.cpu_ns)}"
            )

    def best_stage(self) -> int:
        """The first stage of the smallest size, RAW unless one is strictly smaller."""
        best = RAW
        for stage, size in enumerate(self.bytes_after):
            if size < self.bytes_after[best]:
                best = stage
        return best

    def saving(self, stage: int) -> int:
        return self.bytes_after[RAW] - self.bytes_after[stage]

    def cost_ns(self, stage: int) -> int:
        return sum(self.cpu_ns[:stage])


@dataclasses.dataclass(frozen=True)
class OffloadPlan:
    """The policy's decision: ``stages[index]`` the stage each sample is sent at, and what the
    policy expected (seconds per epoch): ``network_s`` without and ``planned_network_s`` with
    the offload, ``storage_cpu_s`` the offloaded CPU time over the storage cores."""

    stages: dict[int, int]
    bandwidth_bytes_s: float
    storage_cpus: float
    network_s: float
    planned_network_s: float
    storage_cpu_s: float

    @property
    def offloaded(self) -> int:
        return sum(1 for s in self.stages.values() if s != RAW)

    @property
    def planned_epoch_s(self) -> float:
        """The larger of the planned network time and the storage node's CPU time."""
        return max(self.planned_network_s, self.storage_cpu_s)

    def summary(self) -> dict[str, float | int]:
        counts = {f"at_{name}": 0 for name in STAGES}
        for stage in self.stages.values():
            counts[f"at_{STAGES[stage]}"] += 1
        return {
            "samples": len(self.stages),
            "offloaded": self.offloaded,
            **counts,
            "bandwidth_bytes_s": self.bandwidth_bytes_s,
            "storage_cpus": self.storage_cpus,
            "network_s": self.network_s,
            "planned_network_s": self.planned_network_s,
            "storage_cpu_s": self.storage_cpu_s,
        }


def plan_offload(
    profiles: Iterable[SampleProfile], storage_cpus: float, bandwidth_bytes_s: float
) -> OffloadPlan:
    """The selective plan for ``profiles`` on a storage node of ``storage_cpus`` cores behind a
    link of ``bandwidth_bytes_s`` (see the module doc)."""
    if not storage_cpus > 0 or not math.isfinite(storage_cpus):
        raise UserError(f"the storage node's CPUs must be positive, got {storage_cpus}")
    if not bandwidth_bytes_s > 0 or not math.isfinite(bandwidth_bytes_s):
        raise UserError(f"the link bandwidth must be positive, got {bandwidth_bytes_s} B/s")
    profiles = list(profiles)
    stages = {p.index: RAW for p in profiles}
    total = float(sum(p.bytes_after[RAW] for p in profiles))
    candidates = []
    for p in profiles:
        stage = p.best_stage()
        if stage != RAW:
            cost = p.cost_ns(stage) * 1e-9
            efficiency = p.saving(stage) / cost if cost > 0 else math.inf
            candidates.append((-efficiency, p.index, stage, p.saving(stage), cost))
    candidates.sort()
    network_s = total / bandwidth_bytes_s
    net, cpu = network_s, 0.0
    for _, index, stage, saving, cost in candidates:
        if net <= cpu / storage_cpus:
            break
        new_net = net - saving / bandwidth_bytes_s
        new_cpu = cpu + cost
        if new_net < new_cpu / storage_cpus and new_cpu / storage_cpus >= net:
            break  # crossing over would not shorten the epoch's bound
        net, cpu = new_net, new_cpu
        stages[index] = stage
    return OffloadPlan(stages, bandwidth_bytes_s, storage_cpus, network_s, net, cpu / storage_cpus)


def write_profile(path: Path, profiles: Sequence[SampleProfile]) -> None:
    """Write ``profiles`` as CSV (:data:`PROFILE_COLUMNS`), atomically."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(PROFILE_COLUMNS)
    for p in profiles:
        writer.writerow((p.index, *p.bytes_after, *p.cpu_ns))
    atomic_write_text(Path(path), buf.getvalue())


def read_profile(path: Path) -> list[SampleProfile]:
    """The profiles of a file written by :func:`write_profile`; UserError when it is not one."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"cannot read the offload profile {path}: {exc.strerror}") from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or tuple(rows[0]) != PROFILE_COLUMNS:
        raise UserError(
            f"{path} is not an offload profile (its header must be {','.join(PROFILE_COLUMNS)})"
        )
    n_sizes = len(STAGES)
    out = []
    for line, row in enumerate(rows[1:], start=2):
        try:
            values = [int(v) for v in row]
            out.append(
                SampleProfile(
                    values[0], tuple(values[1 : 1 + n_sizes]), tuple(values[1 + n_sizes :])
                )
            )
        except (ValueError, IndexError):
            raise UserError(
                f"{path}, line {line}: expected {len(PROFILE_COLUMNS)} whole numbers"
            ) from None
    return out
