"""UNet3D-specific settings (the ``options`` table of a workload config)."""

from __future__ import annotations

import dataclasses

from core.errors import UserError
from workloads.config import WorkloadOptions, check_fraction, check_optimizer


@dataclasses.dataclass(frozen=True)
class UNet3DOptions(WorkloadOptions):
    """Settings of the UNet3D workload; unknown keys are rejected by :meth:`from_dict`.

    - ``patch_size``: edge of the cubic training crop (the reference uses 128); must be a
      multiple of ``2**depth``.
    - ``base_channels``, ``depth``, ``max_channels``: model width per level is
      ``min(base_channels * 2**i, max_channels)`` for ``depth`` levels plus a bottleneck. The
      MLCommons reference size is ``base_channels=32, depth=5, max_channels=320`` (31.2 M
      parameters; one step at batch 2, patch 64 took ~14 s on 2 CPU cores). The default
      (8, 4: 0.94 M parameters) took ~1.8 s per step at batch 2, patch 64 on 2 CPU cores
      (forward + Dice/CE loss + backward + SGD step; ~0.2 s at patch 32).
    - ``classes``: output classes; the generated data has labels {0, 1}.
    - ``eval_fraction``: share of cases held out for evaluation when ``eval_every`` > 0
      (at least one case, and at least one case left for training).
    - ``optimizer``: ``sgd`` (momentum 0.9, as the reference) or ``adam``;
      ``learning_rate`` for either.
    """

    TABLE = "unet3d options"

    patch_size: int = 64
    base_channels: int = 8
    depth: int = 4
    max_channels: int = 320
    classes: int = 2
    eval_fraction: float = 0.1
    optimizer: str = "sgd"
    learning_rate: float = 0.01

    def __post_init__(self) -> None:
        for name in ("patch_size", "base_channels", "depth", "max_channels"):
            if getattr(self, name) < 1:
                raise UserError(
                    f"unet3d option {name} must be at least 1, got {getattr(self, name)}"
                )
        if self.classes < 2:
            raise UserError(f"unet3d option classes must be at least 2, got {self.classes}")
        if self.patch_size % 2**self.depth:
            raise UserError(
                f"unet3d option patch_size {self.patch_size} must be a multiple of "
                f"2**depth = {2**self.depth}: choose e.g. patch_size {2**self.depth * max(1, self.patch_size // 2**self.depth)}"
            )
        if self.patch_size // 2**self.depth < 2:
            # Instance normalisation at the bottleneck needs more than one voxel.
            raise UserError(
                f"unet3d option patch_size {self.patch_size} leaves a 1-voxel bottleneck at depth "
                f"{self.depth}: use patch_size of at least {2 ** (self.depth + 1)} or a smaller depth"
            )
        check_fraction("unet3d option eval_fraction", self.eval_fraction)
        check_optimizer("unet3d option", self.optimizer, self.learning_rate, ("sgd", "adam"))
