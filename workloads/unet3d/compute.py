"""What one training step computes: the real model (``original``, ``instrumented``) or a sleep.

Both classes expose the same three operations to the training loop in ``train.py``:
``train_step`` (appending ``(key, start_ns, end_ns)`` marks for the duration events),
``eval_batch`` / ``eval_result`` and ``save_checkpoint``. The loop logs the marks after the
step, so the cost of writing events never falls inside a measured interval.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from workloads.profile import SleepProfile
from workloads.unet3d.model import UNet3D, dice_ce_loss, dice_score
from workloads.unet3d.options import UNet3DOptions

Marks = list[tuple[str, int, int]]


def build_model(options: UNet3DOptions, seed: int) -> UNet3D:
    """The configured network, initialised from ``seed`` (identical on every rank)."""
    torch.manual_seed(seed)
    return UNet3D(
        in_channels=1,
        classes=options.classes,
        base_channels=options.base_channels,
        depth=options.depth,
        max_channels=options.max_channels,
    )


def _labels(y: torch.Tensor) -> torch.Tensor:
    """(N, 1, D, H, W) uint8 labels -> (N, D, H, W) int64 class indices for the loss."""
    return y.squeeze(1).long()


class ModelCompute:
    """Forward, Dice+CE loss, backward and optimizer step of the real model.

    With ``distributed`` the model is wrapped in DistributedDataParallel (process group already
    initialised by the caller). ``sync`` waits for the device after each phase so the marks
    measure GPU work (instrumented variant on CUDA only; a no-op on CPU).
    """

    def __init__(
        self,
        options: UNet3DOptions,
        seed: int,
        device: torch.device,
        distributed: bool,
        sync: bool,
    ) -> None:
        self.device = device
        self.distributed = distributed
        self.sync = sync and device.type == "cuda"
        self.model = build_model(options, seed).to(device)
        self.net: nn.Module = self.model
        if distributed:
            ids = [device.index] if device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        params = self.net.parameters()
        if options.optimizer == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(
                params, lr=options.learning_rate
            )
        else:
            self.optimizer = torch.optim.SGD(params, lr=options.learning_rate, momentum=0.9)
        self.cum_loss = 0.0
        self._eval: list[tuple[float, float, int]] = []

    def _now(self) -> int:
        if self.sync:
            torch.cuda.synchronize(self.device)
        return time.monotonic_ns()

    def train_step(self, x: torch.Tensor, y: torch.Tensor, marks: Marks) -> None:
        """One optimisation step on batch (x, y)."""
        self.net.train()
        t0 = time.monotonic_ns()
        x = x.to(self.device, non_blocking=True)
        labels = _labels(y.to(self.device, non_blocking=True))
        t1 = self._now()
        logits = self.net(x)
        t2 = self._now()
        loss = dice_ce_loss(logits, labels)
        t3 = self._now()
        loss.backward()
        t4 = self._now()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t5 = self._now()
        # The reference averages the loss over ranks for its log; .item() also waits for the
        # device, so the step really ends here.
        value = loss.detach()
        if self.distributed:
            dist.all_reduce(value)
            value /= dist.get_world_size()
        self.cum_loss += float(value.item())
        t6 = time.monotonic_ns()
        marks += [
            ("load_batch_gpu", t0, t1),
            ("model_forward_pass", t1, t2),
            ("loss_tensor_calc", t2, t3),
            ("model_backward_pass", t3, t4),
            ("model_optim_step", t4, t5),
            ("cum_loss_fn_calc", t5, t6),
        ]

    @torch.no_grad()
    def eval_batch(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Loss and Dice of one evaluation batch (this rank's shard; no gradient)."""
        self.model.eval()
        x = x.to(self.device)
        labels = _labels(y.to(self.device))
        logits = self.model(x)
        loss = float(dice_ce_loss(logits, labels).item())
        dice = float(dice_score(logits, labels).mean().item())
        self._eval.append((loss, dice, x.shape[0]))

    def eval_result(self) -> dict[str, Any] | None:
        """Sample-weighted mean loss and Dice since the last call (None when nothing ran)."""
        done, self._eval = self._eval, []
        samples = sum(n for _, _, n in done)
        if not samples:
            return None
        return {
            "loss": sum(loss * n for loss, _, n in done) / samples,
            "dice": sum(dice * n for _, dice, n in done) / samples,
            "samples": samples,
        }

    def save_checkpoint(self, path: Path) -> int:
        """``torch.save`` of the model's state_dict; returns the bytes written."""
        torch.save(self.model.state_dict(), path)
        return path.stat().st_size


class SleepCompute:
    """Emulated computation: sleeps drawn from a :class:`SleepProfile`; the model never runs.

    ``model`` is only kept to write realistic checkpoints (``torch.save`` of its untrained
    state_dict) when the profile does not set ``checkpoint_bytes``.
    """

    def __init__(
        self,
        profile: SleepProfile,
        accelerators: int,
        seed: int,
        rank: int,
        model: nn.Module | None,
    ) -> None:
        self.profile = profile
        self.accelerators = accelerators
        self.rng = np.random.default_rng([seed, rank])
        self.model = model
        self._eval_batches = 0

    def train_step(self, x: torch.Tensor, y: torch.Tensor, marks: Marks) -> None:
        """Sleep for the profile's host-to-device time, then its compute time."""
        batch = int(x.shape[0])
        t0 = time.monotonic_ns()
        h2d = self.profile.sample_h2d(self.rng, self.accelerators, batch)
        if h2d > 0:
            time.sleep(h2d)
        t1 = time.monotonic_ns()
        compute = self.profile.sample(self.rng, self.accelerators, batch)
        t2 = time.monotonic_ns()
        time.sleep(compute)
        t3 = time.monotonic_ns()
        marks += [("load_batch_gpu", t0, t1), ("accelerator_busy", t2, t3)]

    def eval_batch(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Sleep for the profile's evaluation time of one batch (0 unless it has one)."""
        seconds = self.profile.sample_eval(self.rng, self.accelerators, int(x.shape[0]))
        if seconds > 0:
            time.sleep(seconds)
        self._eval_batches += 1

    def eval_result(self) -> dict[str, Any] | None:
        done, self._eval_batches = self._eval_batches, 0
        return {"batches": done} if done else None

    def save_checkpoint(self, path: Path) -> int:
        """Write the model's state_dict, or ``checkpoint_bytes`` random bytes; returns bytes."""
        size = self.profile.checkpoint_bytes
        if size is None:
            assert self.model is not None, "SleepCompute needs a model to save its state_dict"
            torch.save(self.model.state_dict(), path)
            return path.stat().st_size
        # Fresh random chunks: constant data could be compressed or deduplicated by the
        # filesystem and would not cost the I/O a real checkpoint does.
        rng = np.random.default_rng()
        chunk = 8 << 20
        with path.open("wb") as f:
            for offset in range(0, size, chunk):
                f.write(rng.bytes(min(chunk, size - offset)))
        return size


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 ``cpu.max`` quota.

    Inside a container started with ``--cpus`` the affinity mask still lists every host core;
    only the quota tells how much CPU time there is.
    """
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus
