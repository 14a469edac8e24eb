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

The step time measured is ``all_compute`` as the training loop defines it: host-to-device copy,
forward, loss, backward, optimizer step and the loss read-back.
"""

from __future__ import annotations

import dataclasses
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis.profile_fit import PointSamples, fit_points
from core import __version__ as TWINTRACE_VERSION
from core.errors import UserError
from workloads.events import Emitter
from workloads.profile import SleepProfile
from workloads.registry import get_workload
from workloads.training import ModelCompute, batches_of, resolve_device


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
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    except OSError:
        pass
    return f"CPU: {platform.processor() or 'unknown'} ({torch.get_num_threads()} threads)"


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
    compute = ModelCompute(task, settings.seed, device, distributed=False, sync=True)
    points, notes = [], []
    for b in sorted(set(settings.batch_sizes)):
        sub = slice_batch(batch, b)
        times, cv, met = _time_steps(compute, sub, settings)
        points.append(PointSamples(1, b, times))
        progress(
            f"batch {b}: {times.mean():.4f} s +- {times.std():.4f} over {times.size} steps "
            f"(cv of the mean {cv:.3f}, of a step {times.std() / times.mean():.3f})"
        )
        if not met:
            notes.append(
                f"batch {b}: cv {cv:.3f} above the target {settings.cv_target} after {times.size} steps"
            )
    fit = fit_points(points)
    measured = {
        "command": command or " ".join(sys.argv),
        "device": device_name(device),
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
        accelerator=device_name(device),
        source=(
            f"measured natively by profile measure on {device_name(device)}: all_compute per "
            f"step at batch sizes {', '.join(map(str, sorted(set(settings.batch_sizes))))}, warm-up "
            "excluded (see 'measured')"
        ),
        compute=fit.compute,
        table=fit.table,
        fit=fit.info(),
        measured=measured,
    )
    return profile, [*fit.warnings, *notes]


def _time_steps(
    compute: ModelCompute, batch: Any, s: MeasureSettings
) -> tuple[np.ndarray, float, bool]:
    for _ in range(s.warmup):
        compute.train_step(batch, [])
    times: list[float] = []
    started = time.monotonic()
    cv = float("inf")
    while len(times) < s.max_steps:
        t0 = time.monotonic_ns()
        compute.train_step(batch, [])
        times.append((time.monotonic_ns() - t0) / 1e9)
        if len(times) >= s.min_steps:
            values = np.array(times)
            cv = float(values.std(ddof=1) / values.mean() / np.sqrt(values.size))
            if cv < s.cv_target:
                return values, cv, True
        if time.monotonic() - started > s.max_seconds and len(times) >= s.min_steps:
            break
    return np.array(times), cv, False
