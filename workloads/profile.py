"""Compute-time profiles for the ``sleep`` variant (schema_version 1).

The sleep variant keeps the real data pipeline and replaces each step's computation by
``time.sleep(t)``, with ``t`` drawn from Normal(mean, std) where mean and std are linear in the
number of accelerators ``g`` and the per-accelerator batch size ``b`` (the fit published for the
McGill DISCS VLDB real-vs-emulated training I/O study, artifact "vldb-reproduce"; see docs/profiles.md). Fits can make std negative at small
configurations, so std is clipped at 0, and a drawn time is clipped at 0.

File format (JSON), every key optional except ``workload``, ``accelerator``, ``source`` and
``compute``; unknown keys are rejected::

    {
      "schema_version": 1,
      "workload": "unet3d",
      "accelerator": "V100",
      "source": "where the numbers come from",
      "compute": {"mean": {"g": 0.0021, "b": 0.2745, "const": 0.2774},
                  "std":  {"g": 0.0043, "b": 0.0071, "const": -0.0241}},
      "h2d":     {"mean": {...}, "std": {...}},   # host-to-device copy per step, default 0
      "eval":    {"mean": {...}, "std": {...}},   # per evaluation batch, default 0
      "checkpoint_bytes": null,                   # null: torch.save of the model's state_dict
      "batch": "per_accelerator",                 # or "global": b is the batch of all ranks
      "table": [{"g": 1, "b": 2048, "mean": 0.0106, "std": 0.001, "n": 40,
                 "h2d": 0.0004, "forward": 0.003, "backward": 0.0066, "optimizer": 0.001,
                 "peak_bytes": null, "persistent_bytes": null}, ...],  # phases optional
      "fit": {"mean_r2": 0.9996, "std_r2": 0.93, "warnings": [...]},
      "measured": {"command": ..., "device": ..., "versions": {...}},
      "split": {"forward": 0.27, "backward": 0.73, "optimizer": 0.0},
      "memory": {"capacity_bytes": 42949672960, "persistent_bytes": 734003200,
                 "peak_bytes": {"g": 0, "b": 4194304, "const": 883000000}},
      "model_transfer_s": 0.054,
      "first_step_s": 0.15,
      "host": {"cpu_model": "AMD EPYC", "cpus": 2, "threads": 2, "torch": "2.13.0",
               "accelerator": "cpu", "reference_s": 0.061, "reference": "..."}
    }

``split`` divides each step's compute time into the phases a real step has (forward,
backward, optimizer; fractions summing to 1), so an emulated run logs the same phases as an
``instrumented`` one. ``memory`` describes the emulated card: its capacity, the memory kept
between steps and the peak of a step (linear in the per-accelerator batch); a configuration
whose peak exceeds the capacity fails at the first step like a real out-of-memory.
``model_transfer_s``: copying the model to the card once, before the first step.
``first_step_s``: the extra compute of a run's first training step (one-off warm-up: the
allocator, kernel or primitive selection), added once to the first emulated step: measured by
``profile fit`` (the first step of epoch 1 against the median of the others) and ``profile
measure`` (its first warm-up step against the timed ones).
``collective``: the data-parallel all-reduce of each step with several accelerators
(:class:`Collective`: a ring all-reduce over an interconnect; PCIe 3.0 x16 by default).

``table`` holds measured (accelerators, batch) points of the compute time: a step whose
configuration is in the table draws from that point's Normal(mean, std), any other from the
linear model (so a poor fit never overrides a measurement). ``fit`` and ``measured`` are
free-form records of how the profile was made (``./cli.py profile fit`` / ``profile measure``).
``host``: where it was measured (:class:`workloads.hostrecord.HostRecord`: CPU model, CPUs,
torch threads, torch version, accelerator, a reference measurement of the host's speed); a CPU
profile used on a host whose record differs is foreign, and the run says so.

All times are in seconds.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from core import versioned
from core.atomic import atomic_write_json
from core.errors import UserError

SCHEMA_VERSION = 1
#: A profile's layout (:mod:`core.versioned`): a profile without ``schema_version`` is of
#: version 1, as every profile was before the field; a newer one is refused by name.
PROFILE = versioned.Layout(
    "sleep profile", SCHEMA_VERSION, unversioned=1, remedy="convert the profile"
)
BATCH_BASES = ("per_accelerator", "global")
PROFILES_DIR = Path(__file__).parent / "profiles"


@dataclasses.dataclass(frozen=True)
class Linear:
    """``g * accelerators + b * batch + const`` (seconds)."""

    g: float = 0.0
    b: float = 0.0
    const: float = 0.0

    def __call__(self, accelerators: int, batch: int) -> float:
        return self.g * accelerators + self.b * batch + self.const


class Draws(Protocol):
    """Where a profile's times are drawn from: ``numpy.random.Generator`` or
    :class:`Stratified`."""

    def random(self) -> float: ...

    def normal(self, loc: float, scale: float) -> float: ...


_STANDARD_NORMAL = statistics.NormalDist()


class Stratified:
    """Uniform and normal draws stratified in blocks: every ``block`` consecutive draws hold
    one from each of ``block`` equal-probability strata, in a random order, and each is uniform
    within its stratum (normal draws are the inverse normal CDF of such a uniform).

    Each draw still has the distribution it is drawn from, but a run's draws cover it evenly:
    the median of 40-60 i.i.d. draws from a measured step-time distribution varies by a few
    percent from seed to seed (AlexNet on the build machine: 0.2614 s over many draws, 0.2685 s
    over one run's 49), which would show as emulation error; stratified, a run's median is
    within a stratum's width of the distribution's."""

    def __init__(self, rng: np.random.Generator, block: int = 20) -> None:
        self.rng = rng
        self.block = block
        self._queue: list[float] = []

    def random(self) -> float:
        if not self._queue:
            strata = self.rng.permutation(self.block) + self.rng.random(self.block)
            self._queue = list(strata / self.block)
        return float(self._queue.pop())

    def normal(self, loc: float, scale: float) -> float:
        u = min(max(self.random(), 1e-12), 1 - 1e-12)
        return loc + scale * _STANDARD_NORMAL.inv_cdf(u)


@dataclasses.dataclass(frozen=True)
class Normal:
    """A normal distribution whose mean and std are linear models (std clipped at 0)."""

    mean: Linear = Linear()
    std: Linear = Linear()

    def params(self, accelerators: int, batch: int) -> tuple[float, float]:
        """(mean, std) at this configuration, std clipped at 0."""
        return self.mean(accelerators, batch), max(0.0, self.std(accelerators, batch))

    def sample(self, rng: Draws, accelerators: int, batch: int) -> float:
        """One draw, clipped at 0 (seconds)."""
        mean, std = self.params(accelerators, batch)
        value = rng.normal(mean, std) if std > 0 else mean
        return max(0.0, float(value))

    @property
    def is_zero(self) -> bool:
        return self == Normal()

    def scaled(self, factor: float) -> Normal:
        """Every time multiplied by ``factor``."""

        def times(line: Linear) -> Linear:
            return Linear(line.g * factor, line.b * factor, line.const * factor)

        return Normal(times(self.mean), times(self.std))


#: The optional parts of a table point measured phase by phase (``profile measure``).
POINT_PARTS = ("h2d", "forward", "backward", "optimizer", "peak_bytes", "persistent_bytes")


@dataclasses.dataclass(frozen=True)
class TablePoint:
    """A measured configuration: ``g`` accelerators, batch ``b``, compute time mean/std (s).

    Measured phase by phase (``profile measure``), a point also holds the mean seconds of the
    host-to-device copy (``h2d``, not part of ``mean``), ``forward``, ``backward`` (with the
    loss) and ``optimizer`` (their sum is ``mean``, up to the loss read-back), and on a GPU
    the step's peak and the persistent (between-step) device memory in bytes; None where not
    measured.

    ``quantiles``: the measured compute times' quantiles at evenly spaced levels (0, 1/(k-1),
    ..., 1), kept by fitted and measured profiles. A step of this configuration draws from them
    (inverse transform, linear between levels), so emulated steps have the measured
    distribution, skew included, not only its mean and std: a right-skewed step time has a
    median below its mean, which a normal draw would not reproduce.
    """

    g: int
    b: int
    mean: float
    std: float = 0.0
    n: int = 0
    h2d: float | None = None
    forward: float | None = None
    backward: float | None = None
    optimizer: float | None = None
    peak_bytes: float | None = None
    persistent_bytes: float | None = None
    quantiles: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.quantiles is not None:
            q = np.asarray(self.quantiles, dtype=np.float64)
            if q.size < 2 or (q < 0).any() or (np.diff(q) < 0).any():
                raise UserError(
                    f"sleep profile table point g={self.g} b={self.b}: quantiles must be at "
                    "least two non-negative seconds in ascending order"
                )
        parts = [getattr(self, name) for name in POINT_PARTS]
        if (
            self.g < 1
            or self.b < 1
            or self.mean < 0
            or self.std < 0
            or self.n < 0
            or any(v is not None and v < 0 for v in parts)
        ):
            raise UserError(
                f"sleep profile table point {dataclasses.asdict(self)} is invalid: g and b must "
                "be at least 1, the times, memory and n not negative"
            )


@dataclasses.dataclass(frozen=True)
class Split:
    """Fractions of a step's compute time: forward, backward, optimizer (summing to 1)."""

    forward: float
    backward: float
    optimizer: float = 0.0

    def __post_init__(self) -> None:
        parts = (self.forward, self.backward, self.optimizer)
        if min(parts) < 0 or abs(sum(parts) - 1.0) > 1e-6:
            raise UserError(
                f"sleep profile split {dataclasses.asdict(self)} is invalid: fractions must not "
                "be negative and must sum to 1"
            )


@dataclasses.dataclass(frozen=True)
class Memory:
    """The emulated card's memory (bytes): capacity, kept between steps, peak of a step."""

    capacity_bytes: int
    persistent_bytes: float = 0.0
    peak_bytes: Linear = Linear()

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0 or self.persistent_bytes < 0:
            raise UserError(
                f"sleep profile memory {dataclasses.asdict(self)} is invalid: capacity must be "
                "positive and persistent memory not negative"
            )

    def peak(self, accelerators: int, batch: int) -> float:
        """Peak bytes of one training step of ``batch`` samples on one card."""
        return max(self.persistent_bytes, self.peak_bytes(accelerators, batch))


#: Interconnects of the all-reduce model: one-direction bandwidth per GPU, bytes/s. Vendor
#: specification peaks (real collectives reach less; measure and override with a profile's
#: ``collective.bandwidth_bytes_per_s``): PCIe 3.0/4.0 x16 per direction (PCI-SIG: 8/16 GT/s
#: x 16 lanes, 128b/130b); NVLink totals halved per direction (NVIDIA datasheets: V100 SXM2
#: 300 GB/s, A100 SXM4 600 GB/s, H100 SXM5 900 GB/s).
INTERCONNECTS: dict[str, float] = {
    "pcie3": 15.75e9,
    "pcie4": 31.5e9,
    "nvlink-v100": 150e9,
    "nvlink-a100": 300e9,
    "nvlink-h100": 450e9,
}


@dataclasses.dataclass(frozen=True)
class Collective:
    """The data-parallel gradient all-reduce of one step, as the ring algorithm's cost model
    (Patarasuk & Yuan 2009; the model behind NCCL's "bus bandwidth"):
    ``2 (G-1)/G x gradient_bytes / bandwidth + 2 (G-1) x latency_s``.

    ``gradient_bytes`` None: 4 bytes per parameter of the workload's model (counted without
    allocating it). ``interconnect`` names a bandwidth of :data:`INTERCONNECTS`;
    ``bandwidth_bytes_per_s`` overrides it. ``latency_s`` (per ring step) defaults to 0: not
    modelled unless measured."""

    interconnect: str = "pcie3"
    bandwidth_bytes_per_s: float | None = None
    latency_s: float = 0.0
    gradient_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s is None and self.interconnect not in INTERCONNECTS:
            raise UserError(
                f"unknown interconnect {self.interconnect!r}: choose one of "
                f"{', '.join(INTERCONNECTS)} or give bandwidth_bytes_per_s"
            )
        if (self.bandwidth_bytes_per_s or 1) <= 0 or self.latency_s < 0:
            raise UserError("collective bandwidth must be positive and latency not negative")

    def seconds(self, accelerators: int, gradient_bytes: int) -> float:
        """Modelled all-reduce time of one step (0 for one accelerator)."""
        g = accelerators
        if g < 2:
            return 0.0
        bandwidth = self.bandwidth_bytes_per_s or INTERCONNECTS[self.interconnect]
        return 2 * (g - 1) / g * gradient_bytes / bandwidth + 2 * (g - 1) * self.latency_s


@dataclasses.dataclass(frozen=True)
class SleepProfile:
    """Per-step compute (and optional host-to-device and eval) times for the sleep variant.

    ``checkpoint_bytes``: size of each emulated checkpoint; None writes ``torch.save`` of the
    configured (untrained) model's state_dict instead.
    """

    workload: str
    accelerator: str
    source: str
    compute: Normal
    h2d: Normal = Normal()
    eval: Normal = Normal()
    checkpoint_bytes: int | None = None
    batch: str = "per_accelerator"
    table: tuple[TablePoint, ...] = ()
    fit: dict[str, Any] | None = None
    measured: dict[str, Any] | None = None
    split: Split | None = None
    memory: Memory | None = None
    model_transfer_s: float = 0.0
    first_step_s: float = 0.0
    collective: Collective = Collective()
    host: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise UserError(
                f"sleep profile schema_version {self.schema_version} is not supported: build it "
                f"with from_dict, which brings an older one up to {SCHEMA_VERSION}"
            )
        if self.checkpoint_bytes is not None and self.checkpoint_bytes < 0:
            raise UserError(f"checkpoint_bytes must not be negative, got {self.checkpoint_bytes}")
        if self.model_transfer_s < 0 or self.first_step_s < 0:
            raise UserError(
                "model_transfer_s and first_step_s must not be negative, got "
                f"{self.model_transfer_s} and {self.first_step_s}"
            )
        if self.batch not in BATCH_BASES:
            raise UserError(
                f"sleep profile batch must be one of {', '.join(BATCH_BASES)}, got {self.batch!r}"
            )

    def profile_batch(self, samples: int, accelerators: int) -> int:
        """The ``b`` of the linear models for a step of ``samples`` per accelerator.

        Fits made against the global batch (DLRM's, whose batch is split over the GPUs) set
        ``batch`` to ``global``.
        """
        return samples * accelerators if self.batch == "global" else samples

    def compute_params(self, accelerators: int, batch: int) -> tuple[float, float]:
        """(mean, std) of the compute time: the measured table point, else the linear model."""
        for point in self.table:
            if point.g == accelerators and point.b == batch:
                return point.mean, point.std
        return self.compute.params(accelerators, batch)

    def sample(self, rng: Draws, accelerators: int, batch: int) -> float:
        """Seconds of emulated computation for one training step (clipped at 0): from the
        measured quantiles of a table point of this configuration, else Normal(mean, std)."""
        for point in self.table:
            if point.g == accelerators and point.b == batch and point.quantiles is not None:
                levels = np.linspace(0.0, 1.0, len(point.quantiles))
                return float(np.interp(rng.random(), levels, point.quantiles))
        mean, std = self.compute_params(accelerators, batch)
        value = rng.normal(mean, std) if std > 0 else mean
        return max(0.0, float(value))

    def sample_h2d(self, rng: Draws, accelerators: int, batch: int) -> float:
        """Seconds of emulated host-to-device copy for one step (0 unless the profile has one)."""
        return self.h2d.sample(rng, accelerators, batch)

    def sample_eval(self, rng: Draws, accelerators: int, batch: int) -> float:
        """Seconds of emulated computation for one evaluation batch."""
        return self.eval.sample(rng, accelerators, batch)

    def scaled(self, factor: float, why: str) -> SleepProfile:
        """This profile with every time multiplied by ``factor`` (compute, copy, evaluation,
        the table points with their parts and quantiles, the first step, the model transfer):
        an accelerator ``1 / factor`` times as fast. ``why`` is added to the source."""

        def times(value: float | None) -> float | None:
            return None if value is None else value * factor

        table = tuple(
            dataclasses.replace(
                p,
                mean=p.mean * factor,
                std=p.std * factor,
                h2d=times(p.h2d),
                forward=times(p.forward),
                backward=times(p.backward),
                optimizer=times(p.optimizer),
                quantiles=None if p.quantiles is None else tuple(q * factor for q in p.quantiles),
            )
            for p in self.table
        )
        return dataclasses.replace(
            self,
            compute=self.compute.scaled(factor),
            h2d=self.h2d.scaled(factor),
            eval=self.eval.scaled(factor),
            table=table,
            first_step_s=self.first_step_s * factor,
            model_transfer_s=self.model_transfer_s * factor,
            source=f"{self.source}; every time x {factor:g}: {why}",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON (atomically: temporary name, then rename)."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, where: str = "sleep profile") -> SleepProfile:
        """Build a profile from parsed JSON, rejecting unknown keys by name."""
        data = _table(data, where, {f.name for f in dataclasses.fields(cls)})
        data = versioned.upgrade(PROFILE, data, where)  # before anything can fail on a new layout
        missing = sorted({"workload", "accelerator", "source", "compute"} - set(data))
        if missing:
            raise UserError(f"{where}: missing {', '.join(missing)}")
        values: dict[str, Any] = {}
        for name in ("workload", "accelerator", "source"):
            if not isinstance(data[name], str):
                raise UserError(f"{where}: {name} must be a string, got {data[name]!r}")
            values[name] = data[name]
        for name in ("compute", "h2d", "eval"):
            if name in data:
                values[name] = _normal(data[name], f"{where}: {name}")
        ckpt = data.get("checkpoint_bytes")
        if ckpt is not None and (not isinstance(ckpt, int) or isinstance(ckpt, bool)):
            raise UserError(
                f"{where}: checkpoint_bytes must be a whole number or null, got {ckpt!r}"
            )
        batch = data.get("batch", "per_accelerator")
        if not isinstance(batch, str):
            raise UserError(f"{where}: batch must be a string, got {batch!r}")
        table = tuple(
            _point(item, f"{where}: table[{i}]") for i, item in enumerate(data.get("table") or ())
        )
        for name in ("fit", "measured"):
            if data.get(name) is not None and not isinstance(data[name], dict):
                raise UserError(f"{where}: {name} must be a JSON object, got {data[name]!r}")
        if data.get("split") is not None:
            values["split"] = Split(**_numbers(data["split"], f"{where}: split", Split))
        if data.get("memory") is not None:
            memory = _table(
                data["memory"], f"{where}: memory", {f.name for f in dataclasses.fields(Memory)}
            )
            if "capacity_bytes" not in memory:
                raise UserError(f"{where}: memory: missing capacity_bytes")
            values["memory"] = Memory(
                capacity_bytes=int(_number(memory["capacity_bytes"], f"{where}: memory")),
                persistent_bytes=float(
                    _number(memory.get("persistent_bytes", 0.0), f"{where}: memory")
                ),
                peak_bytes=_linear(memory.get("peak_bytes", {}), f"{where}: memory.peak_bytes"),
            )
        if data.get("collective") is not None:
            collective = _table(
                data["collective"],
                f"{where}: collective",
                {f.name for f in dataclasses.fields(Collective)},
            )
            for name, value in collective.items():
                if name != "interconnect" and value is not None:
                    _number(value, f"{where}: collective.{name}")
            values["collective"] = Collective(**collective)
        for name in ("model_transfer_s", "first_step_s"):
            values[name] = float(_number(data.get(name, 0.0), f"{where}: {name}"))
        host = data.get("host")
        if host is not None:
            from workloads.hostrecord import HostRecord

            host = HostRecord.from_dict(host, f"{where}: host").to_dict()
        return cls(
            **values,
            checkpoint_bytes=ckpt,
            batch=batch,
            table=table,
            fit=data.get("fit"),
            measured=data.get("measured"),
            host=host,
            schema_version=data["schema_version"],
        )


def _table(data: Any, where: str, known: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(sorted(known))}"
        )
    return data


def _point(data: Any, where: str) -> TablePoint:
    data = _table(data, where, {f.name for f in dataclasses.fields(TablePoint)})
    missing = sorted({"g", "b", "mean"} - set(data))
    if missing:
        raise UserError(f"{where}: missing {', '.join(missing)}")
    quantiles = data.get("quantiles")
    numbers = isinstance(quantiles, list) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in quantiles
    )
    if quantiles is not None and not numbers:
        raise UserError(f"{where}.quantiles: expected a list of numbers, got {quantiles!r}")
    for name, value in data.items():
        if name == "quantiles" or (value is None and name in POINT_PARTS):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"{where}.{name}: expected a number, got {value!r}")
        if name in ("g", "b", "n") and int(value) != value:
            raise UserError(f"{where}.{name}: expected a whole number, got {value!r}")
    parts = {name: float(data[name]) for name in POINT_PARTS if data.get(name) is not None}
    return TablePoint(
        g=int(data["g"]),
        b=int(data["b"]),
        mean=float(data["mean"]),
        std=float(data.get("std", 0.0)),
        n=int(data.get("n", 0)),
        quantiles=tuple(float(v) for v in quantiles) if quantiles is not None else None,
        **parts,
    )


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{where}: expected a number, got {value!r}")
    return value


def _numbers(data: Any, where: str, cls: type) -> dict[str, float]:
    data = _table(data, where, {f.name for f in dataclasses.fields(cls)})
    return {name: float(_number(value, f"{where}.{name}")) for name, value in data.items()}


def _normal(data: Any, where: str) -> Normal:
    data = _table(data, where, {"mean", "std"})
    return Normal(**{name: _linear(data[name], f"{where}.{name}") for name in data})


def _linear(data: Any, where: str) -> Linear:
    data = _table(data, where, {"g", "b", "const"})
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"{where}.{name}: expected a number, got {value!r}")
    return Linear(**{name: float(value) for name, value in data.items()})


def load_profile(path: str | Path) -> SleepProfile:
    """Load a sleep profile JSON file (see the module doc for the format)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"sleep profile {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"sleep profile {path} is not valid JSON: {exc}") from None
    return SleepProfile.from_dict(data, where=str(path))


def default_profile(workload: str) -> SleepProfile:
    """The profile shipped in ``workloads/profiles/<workload>.json``."""
    path = PROFILES_DIR / f"{workload}.json"
    if not path.exists():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.json"))
        raise UserError(
            f"no default sleep profile for workload {workload!r} (shipped: "
            f"{', '.join(known) or 'none'}): give one with the config's profile setting"
        )
    return load_profile(path)
