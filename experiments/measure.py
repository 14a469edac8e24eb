"""``profile measure``: a workload's real compute time per step, measured natively, as a profile.

For each batch size, one batch of real data (read once through the workload's own loader,
without workers) is trained on repeatedly with the workload's model, loss and optimizer
(:class:`workloads.training.ModelCompute`, synchronising the device after each phase on CUDA).
The first ``warmup`` steps are discarded (allocator, autotuning, caches); then steps are timed
until the coefficient of variation of their mean (std / mean / sqrt(n), the relative standard
error: it shrinks as steps are added, where a single step's std / mean does not) is under
``cv_target``
with at least ``min_steps`` steps, or until ``max_steps`` or ``max_seconds`` per batch size
(then the profile's ``measured`` record says the target was not met). The times are fitted
with :func:`analysis.profile_fit.fit_points`.

Each step is timed phase by phase, as the ``instrumented`` variant marks it:

- ``h2d``: the host-to-device copy of the batch (``load_batch_gpu``; the profile's ``h2d``);
- ``compute`` (the profile's ``compute``): forward, loss, backward, optimizer step and the loss
  read-back, split into ``forward``, ``backward`` (with the loss) and ``optimizer``: each
  table point keeps their means and the profile's ``split`` their shares of the total;
- ``first_step_s``: the very first step's extra time (one-off warm-up) over the median step;
- on CUDA: the peak device memory of the timed steps and the memory kept between steps (the
  model, its gradients' absence after ``zero_grad(set_to_none=True)``, the optimizer state),
  the card's capacity, and the model's one-off host-to-device transfer
  (``model_transfer_s``).

With ``database_key``, :func:`store.profiledb.add_measured` also files the profile in the
profile database under that accelerator (``./cli.py trace --accelerator KEY`` then uses it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis.profile_fit import PointSamples, fit_points
from analysis.profiles import SPLIT_PHASES, split_of
from core import __version__ as TWINTRACE_VERSION
from core.errors import UserError
from store.profiledb import default_database
from workloads.events import Emitter
from workloads.hostrecord import available_cpus, cpu_model, this_host
from workloads.loaders import batches_of
from workloads.profile import Linear, Memory, Normal, SleepProfile, Split
from workloads.registry import get_workload
from workloads.training import ModelCompute, resolve_device


@dataclasses.dataclass(frozen=True)
class MeasureSettings:
    batch_sizes: tuple[int, ...]
    device: str = "cpu"
    warmup: int = 2
    min_steps: int = 5
    max_steps: int = 100
    max_seconds: float = 60.0
    cv_target: float = 0.05
    seed: int = 0
    threads: int | None = None  # torch threads; None: the CPUs this process may use, as a job
    workers: int = 0  # loader workers running beside the timed steps, as in the job (0: none)

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise UserError("give batch sizes of at least 1, e.g. --batch-sizes 1,2,4")
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"device must be cpu or cuda, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise UserError(
                "device cuda asked for, but no GPU is visible to torch: use --device cpu"
            )
        if self.warmup < 0 or self.min_steps < 2 or self.max_steps < self.min_steps:
            raise UserError("need warmup >= 0, min_steps >= 2 and max_steps >= min_steps")
        if self.workers < 0:
            raise UserError(f"workers must be 0 or more, got {self.workers}")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"threads must be at least 1, got {self.threads}")
        if not 0 < self.cv_target < 1:
            raise UserError(f"cv_target must be in (0, 1), got {self.cv_target}")


def slice_batch(batch: Any, n: int) -> Any:
    """The first ``n`` samples of a loader batch (tensors, tuples, lists and dicts of them)."""
    if isinstance(batch, torch.Tensor):
        return batch[:n]
    if isinstance(batch, dict):
        return {k: slice_batch(v, n) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(slice_batch(v, n) for v in batch)
    return batch


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU: {cpu_model()} ({torch.get_num_threads()} threads)"


def measure(
    workload: str,
    data_dir: Path,
    settings: MeasureSettings,
    options: dict[str, Any] | None = None,
    progress: Callable[[str], None] = lambda line: None,
    command: str | None = None,
) -> tuple[SleepProfile, list[str]]:
    """Measure ``workload``'s compute per step at each batch size; return the profile and
    the fit's warnings (see the module doc)."""
    spec = get_workload(workload)
    if settings.device == "cpu":
        # As the zoo's jobs compute (workloads.training): one thread per CPU they may use.
        torch.set_num_threads(settings.threads or available_cpus())
    largest = max(settings.batch_sizes)
    config = spec.config(
        "instrumented",
        batch_size=largest,
        workers=0,
        device=settings.device,
        seed=settings.seed,
        options=options or {},
    )
    task = spec.task_of(config, Path(data_dir))
    device = resolve_device(config, 0)
    with Emitter("/dev/null") as emitter:
        loader = task.train_loader(config, 0, device, emitter)
        loader.set_epoch(1)
        batch = next(batches_of(loader.loader), None)
    if batch is None or task.batch_samples(batch) < largest:
        got = 0 if batch is None else task.batch_samples(batch)
        raise UserError(
            f"{data_dir} gave a first batch of {got} samples, fewer than the largest batch size "
            f"{largest}: use smaller batch sizes or a larger dataset"
        )
    transfer_s = _model_transfer_s(task, settings.seed, device)
    compute = ModelCompute(task, settings.seed, device, distributed=False, sync=True)
    steps: dict[int, StepTimes] = {}
    notes = []
    for b in sorted(set(settings.batch_sizes)):
        sub = slice_batch(batch, b)
        with _loader_beside(spec, task, config, b, settings, device) as fetch:
            timed = _time_steps(compute, sub, settings, fetch)
        steps[b] = timed
        times = timed.compute
        progress(
            f"batch {b}: {times.mean():.4f} s +- {times.std():.4f} over {times.size} steps "
            f"(cv of the mean {timed.cv:.3f}, of a step {times.std() / times.mean():.3f}); "
            + ", ".join(f"{k} {v:.4f} s" for k, v in timed.part_means().items())
        )
        if not timed.met:
            notes.append(
                f"batch {b}: cv {timed.cv:.3f} above the target {settings.cv_target} after "
                f"{times.size} steps"
            )
    fit = fit_points([PointSamples(1, b, t.compute) for b, t in steps.items()])
    h2d_fit = fit_points([PointSamples(1, b, t.h2d) for b, t in steps.items()])
    table = tuple(dataclasses.replace(point, **steps[point.b].point_parts()) for point in fit.table)
    name = device_name(device)
    host = this_host(
        accelerator="cpu" if device.type == "cpu" else name, threads=torch.get_num_threads()
    )
    progress(f"host: {host.describe()}")
    measured: dict[str, Any] = {
        "command": command or " ".join(sys.argv),
        "device": name,
        "versions": {
            "twintrace": TWINTRACE_VERSION,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "host": platform.node(),
        "settings": dataclasses.asdict(settings),
        "options": options or {},
        "notes": notes,
    }
    profile = SleepProfile(
        workload=workload,
        accelerator=name,
        source=(
            f"measured natively by profile measure on {name}: host-to-device copy and compute "
            "(forward, loss, backward, optimizer step, loss read-back) per step at batch sizes "
            f"{', '.join(map(str, sorted(steps)))}, warm-up excluded (see 'measured')"
        ),
        compute=fit.compute,
        h2d=Normal(mean=h2d_fit.compute.mean) if _any_positive(h2d_fit.compute.mean) else Normal(),
        table=table,
        fit=fit.info(),
        measured=measured,
        split=_split(steps.values()),
        memory=_memory(device, steps),
        model_transfer_s=transfer_s,
        first_step_s=_first_step_extra(steps),
        host=host.to_dict(),
    )
    return profile, [*fit.warnings, *notes]


@dataclasses.dataclass
class StepTimes:
    """The timed steps of one batch size: seconds per step of each part, and the device
    memory (CUDA only)."""

    h2d: np.ndarray
    compute: np.ndarray
    parts: dict[str, np.ndarray]
    cv: float
    met: bool
    first_s: float | None = None  # the first warm-up step (copy + compute), untimed by phase
    peak_bytes: float | None = None
    persistent_bytes: float | None = None

    def part_means(self) -> dict[str, float]:
        return {
            "h2d": float(self.h2d.mean()),
            **{k: float(v.mean()) for k, v in self.parts.items()},
        }

    def point_parts(self) -> dict[str, float | None]:
        """The table point's phase means and memory."""
        return {
            **self.part_means(),
            "peak_bytes": self.peak_bytes,
            "persistent_bytes": self.persistent_bytes,
        }


#: The mark of the host-to-device copy; the other parts are grouped as the profile's split
#: groups an instrumented run's phases (the loss read-back counts in the compute total only).
PARTS = SPLIT_PHASES
H2D_MARK = "load_batch_gpu"


def _any_positive(model: Linear) -> bool:
    return any(v > 0 for v in (model.g, model.b, model.const))


def _split(steps: Any) -> Split | None:
    return split_of({part: sum(float(t.parts[part].sum()) for t in steps) for part in PARTS})


def _memory(device: torch.device, steps: dict[int, StepTimes]) -> Memory | None:
    """The card's memory (CUDA): its capacity, the largest between-step memory and the peak
    as a least-squares line in the batch size."""
    if device.type != "cuda" or not steps:
        return None
    sizes = np.array(sorted(steps), dtype=float)
    peaks = np.array([steps[int(b)].peak_bytes or 0.0 for b in sizes])
    slope = float(np.polyfit(sizes, peaks, 1)[0]) if sizes.size > 1 else 0.0
    const = float(peaks.mean() - slope * sizes.mean())
    return Memory(
        capacity_bytes=int(torch.cuda.get_device_properties(device).total_memory),
        persistent_bytes=max(t.persistent_bytes or 0.0 for t in steps.values()),
        peak_bytes=Linear(b=slope, const=const),
    )


def _first_step_extra(steps: dict[int, StepTimes]) -> float:
    """The first step's extra time (one-off warm-up): the very first (warm-up) step, at the
    smallest batch size, against the median timed step there; 0 without warm-up steps."""
    first = steps[min(steps)]
    if first.first_s is None:
        return 0.0
    median = float(np.median(first.compute + first.h2d))
    return max(0.0, first.first_s - median)


def _model_transfer_s(task: Any, seed: int, device: torch.device) -> float:
    """Seconds to copy the model to the device once (0 on CPU: nothing is copied)."""
    if device.type != "cuda":
        return 0.0
    model = task.build_model(seed)
    torch.cuda.synchronize(device)
    t0 = time.monotonic_ns()
    model.to(device)
    torch.cuda.synchronize(device)
    seconds = (time.monotonic_ns() - t0) / 1e9
    del model
    torch.cuda.empty_cache()
    return seconds


@contextlib.contextmanager
def _loader_beside(
    spec: Any, task: Any, config: Any, batch_size: int, s: MeasureSettings, device: Any
) -> Iterator[Callable[[], None]]:
    """With ``s.workers``: the workload's training loader at ``batch_size`` with that many
    workers, and a function that takes one batch from it (starting a new epoch at the end),
    called between timed steps: the workers read and decode beside the compute, competing for
    the cores as in the job, while the timed step computes on the fixed batch. Without
    workers, a function that does nothing."""
    if s.workers == 0:
        yield lambda: None
        return
    beside = config.replace(batch_size=batch_size, workers=s.workers)
    with Emitter("/dev/null") as emitter:
        loader = task.train_loader(beside, 0, device, emitter)
        epoch = [1]
        loader.set_epoch(epoch[0])
        batches = [batches_of(loader.loader)]

        def fetch() -> None:
            if next(batches[0], None) is None:
                epoch[0] += 1
                loader.set_epoch(epoch[0])
                batches[0] = batches_of(loader.loader)
                next(batches[0], None)

        try:
            yield fetch
        finally:
            batches[0].close()  # ends the workers


def _time_steps(
    compute: ModelCompute,
    batch: Any,
    s: MeasureSettings,
    fetch: Callable[[], None] = lambda: None,
) -> StepTimes:
    first_s = None
    for i in range(s.warmup):
        fetch()
        t0 = time.monotonic_ns()
        compute.train_step(batch, [])
        if i == 0:
            first_s = (time.monotonic_ns() - t0) / 1e9
    cuda = compute.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(compute.device)
        torch.cuda.reset_peak_memory_stats(compute.device)
    rows: list[dict[str, float]] = []
    started = time.monotonic()
    cv = float("inf")
    met = False
    while len(rows) < s.max_steps:
        marks: list[tuple[str, int, int]] = []
        fetch()
        compute.train_step(batch, marks)
        seconds = {key: (end - start) / 1e9 for key, start, end in marks}
        row = {part: sum(seconds.get(k, 0.0) for k in keys) for part, keys in PARTS.items()}
        row["h2d"] = seconds.get(H2D_MARK, 0.0)
        # compute: from the end of the copy to the end of the step (loss read-back included)
        copied = next(end for key, _, end in marks if key == H2D_MARK)
        row["compute"] = (max(end for _, _, end in marks) - copied) / 1e9
        rows.append(row)
        if len(rows) >= s.min_steps:
            values = np.array([r["compute"] for r in rows])
            cv = float(values.std(ddof=1) / values.mean() / np.sqrt(values.size))
            if cv < s.cv_target:
                met = True
                break
        if time.monotonic() - started > s.max_seconds and len(rows) >= s.min_steps:
            break
    peak = persistent = None
    if cuda:
        peak = float(torch.cuda.max_memory_allocated(compute.device))
        persistent = float(torch.cuda.memory_allocated(compute.device))

    def column(name: str) -> np.ndarray:
        return np.array([r[name] for r in rows])

    return StepTimes(
        first_s=first_s,
        h2d=column("h2d"),
        compute=column("compute"),
        parts={part: column(part) for part in PARTS},
        cv=cv,
        met=met,
        peak_bytes=peak,
        persistent_bytes=persistent,
    )


def database_name(profile: SleepProfile) -> str:
    """The default accelerator name of a measured profile's database entry: ``cpu`` on a CPU;
    on a GPU a declared card whose names match the device's, else a name made from it."""
    device = str((profile.measured or {}).get("device", profile.accelerator))
    if device.startswith("CPU"):
        return "cpu"
    for acc in default_database().accelerators.values():
        if acc.matches(device):
            return acc.key
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "gpu"
