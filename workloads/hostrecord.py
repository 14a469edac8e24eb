"""Where a measured profile was measured: the host record, and whether this host matches it.

A profile measured on a CPU describes that CPU: the same model on another processor, with
another number of cores or another torch build, computes at another speed (the AMD EPYC
profiles of the zoo were 1.7-2.7x faster than the real job on an Intel Xeon of as many
threads). :class:`HostRecord` is what a measured or fitted profile keeps of its host (the
profile's ``host``):

- ``cpu_model``: ``/proc/cpuinfo``'s model name;
- ``cpus``: the CPUs the job could use (affinity mask capped by the cgroup's quota);
- ``threads``: the torch threads the job computed with;
- ``torch``: torch's version;
- ``accelerator``: ``cpu``, or the GPU's name;
- ``reference_s``: a short reference measurement of the host's speed, taken with the profile
  (:func:`reference_seconds`: a fixed convolution and matrix product, forward and backward, at
  the job's threads; the shortest of seven repetitions), and ``reference``, its name.

A record's *identity* (:meth:`HostRecord.identity`: model, CPUs, threads, torch, accelerator)
keys the host's own measurements (``experiments/hostprofile.py``); :func:`foreign_warning`
says, in one line with the fix, when a CPU profile is used on a host whose identity differs or
whose reference speed differs by more than :data:`REFERENCE_TOLERANCE`. Profiles of GPUs do not
depend on the host's CPU and are never foreign.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from core.errors import UserError

#: The reference measurement's name; a change of the reference's work changes it, and records
#: of other references are not compared.
REFERENCE = "conv3x3-64ch-56px+matmul-512:fwd-bwd:min7:v2"

#: A reference time this much slower or faster than the record's makes the host another one,
#: even with the same identity: a shared virtual machine's neighbours, a throttled CPU. Two
#: measurements on one idle host differ by a few percent; more than 25 % is another machine.
REFERENCE_TOLERANCE = 0.25


def cpu_model() -> str:
    """``/proc/cpuinfo``'s first model name, else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def torch_version() -> str:
    """torch's version without importing torch (the host CLI need not load it to compare)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"


@dataclasses.dataclass(frozen=True)
class HostRecord:
    """The host a profile was measured on (see the module doc)."""

    cpu_model: str
    cpus: int
    threads: int
    torch: str
    accelerator: str = "cpu"
    reference_s: float | None = None
    reference: str = REFERENCE

    @property
    def on_cpu(self) -> bool:
        return self.accelerator == "cpu"

    def identity(self) -> tuple[str, int, int, str, str]:
        """What must be equal for two hosts to compute alike (the reference aside)."""
        return (self.cpu_model, self.cpus, self.threads, self.torch, self.accelerator)

    def key(self) -> str:
        """A short name of :meth:`identity`, for folder names."""
        text = json.dumps(self.identity())
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def describe(self) -> str:
        where = self.cpu_model if self.on_cpu else f"{self.accelerator} (host CPU {self.cpu_model})"
        text = f"{where}, {self.cpus} CPUs, {self.threads} torch threads, torch {self.torch}"
        if self.reference_s is not None:
            text += f", reference {self.reference_s * 1000:.1f} ms"
        return text

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "host record") -> HostRecord:
        if not isinstance(data, Mapping):
            raise UserError(f"{where}: must be a JSON object, got {data!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UserError(
                f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(names))}"
            )
        missing = sorted({"cpu_model", "cpus", "threads", "torch"} - set(data))
        if missing:
            raise UserError(f"{where}: missing {', '.join(missing)}")
        try:
            return cls(
                cpu_model=str(data["cpu_model"]),
                cpus=int(data["cpus"]),
                threads=int(data["threads"]),
                torch=str(data["torch"]),
                accelerator=str(data.get("accelerator", "cpu")),
                reference_s=(
                    None if data.get("reference_s") is None else float(data["reference_s"])
                ),
                reference=str(data.get("reference", REFERENCE)),
            )
        except (TypeError, ValueError) as exc:
            raise UserError(f"{where}: {exc}") from None

    def differences(self, here: HostRecord) -> list[str]:
        """How ``here`` differs from this record, as short phrases (empty: the same host).
        Only the parts that set a CPU's speed count for a CPU record; a GPU record is never
        different (its compute is the card's)."""
        if not self.on_cpu:
            return []
        found = []
        for name, label in (
            ("cpu_model", "CPU"),
            ("cpus", "CPUs"),
            ("threads", "torch threads"),
            ("torch", "torch"),
        ):
            mine, theirs = getattr(self, name), getattr(here, name)
            if mine != theirs:
                found.append(f"{label} {theirs} here, {mine} there")
        if found or not here.reference_s:
            return found
        if not self.reference_s or self.reference != here.reference:
            # One model name covers CPUs of other clocks, caches and neighbours: two hosts
            # called "AMD EPYC" with 2 threads computed UNet3D's step in 0.51 and 0.97 s.
            found.append("its record has no reference measurement of the host's speed to compare")
            return found
        ratio = here.reference_s / self.reference_s
        if abs(ratio - 1.0) > REFERENCE_TOLERANCE:
            found.append(f"the reference runs {ratio:.2f}x as long here")
        return found


def reference_seconds(repetitions: int = 7) -> float:
    """The shortest time of the reference work (:data:`REFERENCE`) over ``repetitions``, at
    torch's current threads: a 3x3 convolution of 64 channels on 8 images of 56x56 and a
    512x512 matrix product, each forward and backward; one warm-up first. About 30 ms a
    repetition on a 2-core host. The shortest, not the median: another job on the host only
    ever lengthens a repetition (the median of five was once 1.55x the idle host's while a
    study's containers were being torn down)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(8, 64, 56, 56, generator=generator)
    weight = torch.randn(64, 64, 3, 3, generator=generator, requires_grad=True)
    a = torch.randn(512, 512, generator=generator, requires_grad=True)
    b = torch.randn(512, 512, generator=generator)

    def once() -> float:
        start = time.perf_counter()
        out = torch.nn.functional.conv2d(images, weight, padding=1).square().mean()
        out = out + (a @ b).square().mean()
        out.backward()
        weight.grad = None
        a.grad = None
        return time.perf_counter() - start

    once()
    return min(once() for _ in range(max(1, repetitions)))


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota (v2
    ``cpu.max``, or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` on a host whose cpu
    controller is still on cgroup v1).

    Inside a container started with ``--cpus`` the affinity mask still lists every host core;
    only the quota tells how much CPU time there is.
    """
    cpus = len(os.sched_getaffinity(0))
    quota = _cpu_quota(cgroup_root)
    if quota is not None:
        cpus = min(cpus, max(1, int(quota)))
    return cpus


def _cpu_quota(root: Path) -> float | None:
    """The CPU quota of the cgroup mounted at ``root`` in cores, None when there is none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for controller in ("cpu", "cpu,cpuacct"):
        try:
            quota_us = int((root / controller / "cpu.cfs_quota_us").read_text())
            period_us = int((root / controller / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    return None


def this_host(
    accelerator: str = "cpu", threads: int | None = None, reference: bool = True
) -> HostRecord:
    """This host's record. ``threads``: the job's torch threads (default: the CPUs it may
    use, as the zoo's workloads set them); ``reference``: take the reference measurement (at
    those threads) too."""
    cpus = available_cpus()
    threads = threads or cpus
    seconds = None
    if reference:
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            seconds = reference_seconds()
        finally:
            torch.set_num_threads(before)
    return HostRecord(
        cpu_model=cpu_model(),
        cpus=cpus,
        threads=threads,
        torch=torch_version(),
        accelerator=accelerator,
        reference_s=seconds,
    )


def foreign_warning(
    host: Mapping[str, Any] | None, what: str, here: HostRecord, fix: str
) -> str | None:
    """The one-line warning for using a profile (``what``) measured on ``host`` (its record;
    None: not recorded) on ``here``, ending with ``fix``; None when it is not foreign (a GPU's
    profile, or the same host)."""
    if host is None:
        return None
    record = HostRecord.from_dict(host, f"{what}: host")
    differences = record.differences(here)
    if not differences:
        return None
    return (
        f"{what} was measured on another host ({record.describe()}): {'; '.join(differences)}, "
        f"so its emulated steps are that host's, not this one's: {fix}"
    )
