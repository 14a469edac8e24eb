"""UNet3D's part of the shared training loop (``workloads/training.py``).

Data: every sample reads a whole image/label pair with ``np.load`` and crops a patch
(:class:`workloads.unet3d.dataset.UNet3DDataset`); batches come from a DataLoader over this
rank's share of the cases. With ``eval_every`` > 0, ``eval_fraction`` of the cases are held
out (chosen with ``config.seed``) and evaluated (centre crop, loss and Dice).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from core.errors import UserError
from workloads.config import WorkloadConfig
from workloads.events import Emitter
from workloads.loaders import Loader, sharded_loader
from workloads.training import SplitTask
from workloads.unet3d.dataset import Case, UNet3DDataset, list_cases
from workloads.unet3d.model import UNet3D, dice_ce_loss, dice_score
from workloads.unet3d.options import UNet3DOptions


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


@dataclasses.dataclass(frozen=True)
class UNet3DTask(SplitTask):
    options: UNet3DOptions
    train_cases: tuple[Case, ...]
    eval_cases: tuple[Case, ...]

    @classmethod
    def create(cls, config: WorkloadConfig, data_dir: Path) -> UNet3DTask:
        """Validate the options, list the cases and split off the evaluation cases."""
        options = UNet3DOptions.from_dict(config.options)
        cases = list_cases(data_dir)
        eval_cases: list[Case] = []
        if config.eval_every > 0:
            if len(cases) < 2:
                raise UserError(
                    f"evaluation needs at least 2 cases in {data_dir}, found {len(cases)}: "
                    "generate more or set eval_every to 0"
                )
            count = min(len(cases) - 1, max(1, round(len(cases) * options.eval_fraction)))
            rng = np.random.default_rng(config.seed)
            chosen = set(rng.permutation(len(cases))[:count].tolist())
            eval_cases = [c for i, c in enumerate(cases) if i in chosen]
            cases = [c for i, c in enumerate(cases) if i not in chosen]
        return cls(options, tuple(cases), tuple(eval_cases))

    def build_model(self, seed: int) -> nn.Module:
        return build_model(self.options, seed)

    def items(self, train: bool) -> tuple[Case, ...]:
        return self.train_cases if train else self.eval_cases

    def loader(
        self, train: bool, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader:
        cases = self.items(train)
        dataset = UNet3DDataset(
            cases, self.options.patch_size, seed=config.seed, augment=train, emitter=emitter
        )
        return sharded_loader(
            dataset, config, rank, device, batch_size=config.batch_size, shuffle=train
        )

    def to_device(self, batch: Any, device: torch.device) -> Any:
        x, y = batch
        # (N, 1, D, H, W) uint8 labels -> (N, D, H, W) int64 class indices for the loss.
        labels = y.to(device, non_blocking=True).squeeze(1).long()
        return x.to(device, non_blocking=True), labels

    def forward(self, net: nn.Module, batch: Any) -> Any:
        return net(batch[0])

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        return dice_ce_loss(outputs, batch[1])

    def eval_metrics(self, outputs: Any, batch: Any) -> dict[str, float]:
        return {
            "loss": float(dice_ce_loss(outputs, batch[1]).item()),
            "dice": float(dice_score(outputs, batch[1]).mean().item()),
        }

    def batch_samples(self, batch: Any) -> int:
        return int(batch[0].shape[0])
