"""Image classification's part of the shared training loop (``workloads/training.py``).

One task serves the resnet18, resnet50 and alexnet workloads (the model is the workload's
name). Folder datasets: each loader item is one JPEG (open, read, decode, RandomResizedCrop,
flip, normalise). Grouped datasets: each item is one group file of G JPEGs read at once, so a
step of ``batch_size`` images reads ``batch_size / G`` groups.

With the option ``array_size`` B > 1 the model is a horizontally fused array of B models
(:mod:`workloads.images.fused`), each at its own learning rate: one data pipeline, every batch
trains all B, and a step counts batch x B trained samples (:meth:`ImageTask.trained_samples`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.errors import UserError
from workloads.config import WorkloadConfig
from workloads.events import Emitter
from workloads.images.dataset import GroupedImageDataset, ImageFolderDataset, collate_groups
from workloads.images.files import ImageData, load_image_data
from workloads.images.fused import array_loss, array_optimizer, per_model_losses
from workloads.images.models import build_image_model
from workloads.images.options import ImageOptions
from workloads.loaders import Loader, sharded_loader
from workloads.training import SplitTask


@dataclasses.dataclass(frozen=True)
class RemoteData:
    """A remote dataset (``options.dataset`` ``remote-*``): what the storage node listed and,
    for ``remote-sophon``, the stage each training sample is asked at (the policy's plan)."""

    classes: tuple[str, ...]
    train_labels: tuple[int, ...]
    val_labels: tuple[int, ...]
    stages: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ImageTask(SplitTask):
    model_name: str
    options: ImageOptions
    data: ImageData | None
    remote: RemoteData | None = None

    @classmethod
    def create(cls, config: WorkloadConfig, data_dir: Path) -> ImageTask:
        options = ImageOptions.from_dict(config.options)
        if options.remote:
            return cls(config.workload, options, None)  # listed by prepare(), from the server
        data = load_image_data(data_dir)
        if data.layout == "grouped" and config.batch_size % data.group_size:
            raise UserError(
                f"batch_size {config.batch_size} is not a multiple of the group size "
                f"{data.group_size} of {data_dir} (each loader item is one group): use a batch "
                f"size of {data.group_size * max(1, round(config.batch_size / data.group_size))}"
            )
        return cls(config.workload, options, data)

    def prepare(self, config: WorkloadConfig, out_dir: Path, emitter: Emitter) -> ImageTask:
        """A remote dataset: list it (and for ``remote-sophon`` profile it and plan the offload,
        :func:`workloads.sophon.setup.plan_remote`) once, before the ranks start."""
        if not self.options.remote:
            return self
        from workloads.sophon.setup import plan_remote

        remote = plan_remote(config, self.options, out_dir, emitter)
        return dataclasses.replace(self, remote=remote)

    @property
    def classes(self) -> int:
        if self.remote is not None:
            return len(self.remote.classes)
        assert self.data is not None
        return len(self.data.classes)

    @property
    def array_size(self) -> int:
        return self.options.array_size

    def build_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return build_image_model(
            self.model_name,
            self.classes,
            width=self.options.width,
            array_size=self.array_size,
            seed=seed,
        )

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        if self.array_size == 1:
            return super().make_optimizer(params)
        return array_optimizer(params, self.options.optimizer, self.options.model_learning_rates)

    def items(self, train: bool) -> tuple[Any, ...]:
        """Local: the split's samples or groups; remote: the split's labels."""
        if self.remote is not None:
            return self.remote.train_labels if train else self.remote.val_labels
        assert self.data is not None
        return self.data.train if train else self.data.val

    def loader(
        self, train: bool, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader:
        items = self.items(train)
        common = {
            "image_size": self.options.image_size,
            "train": train,
            "seed": config.seed,
            "emitter": emitter,
        }
        if self.remote is not None:
            from workloads.sophon.client import RemoteImageDataset

            # Evaluation is not planned: its samples come whole (no offload) in the selective
            # mode, as the other modes send them.
            mode = self.options.dataset
            stages = self.remote.stages if train else None
            if not train and mode == "remote-sophon":
                mode = "remote-nooff"
            remote = RemoteImageDataset(
                self.options.storage_host,
                "train" if train else "val",
                items,
                mode,
                stages=stages,
                **common,
            )
            return sharded_loader(
                remote, config, rank, device, batch_size=config.batch_size, shuffle=train
            )
        assert self.data is not None
        if self.data.layout == "grouped":
            dataset: Any = GroupedImageDataset(items, **common)
            return sharded_loader(
                dataset,
                config,
                rank,
                device,
                batch_size=config.batch_size // self.data.group_size,
                shuffle=train,
                collate_fn=collate_groups,
            )
        dataset = ImageFolderDataset(items, **common)
        return sharded_loader(
            dataset, config, rank, device, batch_size=config.batch_size, shuffle=train
        )

    def to_device(self, batch: Any, device: torch.device) -> Any:
        x, y = batch
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def forward(self, net: nn.Module, batch: Any) -> Any:
        return net(batch[0])

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        if self.array_size > 1:  # the sum of the models' losses: each gets its own gradient
            return array_loss(outputs, batch[1])
        return nn.functional.cross_entropy(outputs, batch[1])

    def eval_metrics(self, outputs: Any, batch: Any) -> dict[str, Any]:
        """Loss, top-1 and top-5 accuracy (top-k: the label among the k highest scores; k at
        most the classes); of an array, the means over its models and each model's
        (``loss_models``, ``top1_models``, ``top5_models``: HFTA's convergence, model by
        model)."""
        labels = batch[1]
        k = min(5, outputs.shape[-1])
        if self.array_size > 1:  # outputs [N, B, classes]
            top1 = (outputs.argmax(2) == labels.unsqueeze(1)).float().mean(0)
            top5 = (outputs.topk(k, 2).indices == labels[:, None, None]).any(2).float().mean(0)
            losses = per_model_losses(outputs, labels)
            return {
                "loss": float(losses.mean().item()),
                "top1": float(top1.mean().item()),
                "top5": float(top5.mean().item()),
                "loss_models": losses.tolist(),
                "top1_models": top1.tolist(),
                "top5_models": top5.tolist(),
            }
        return {
            "loss": float(nn.functional.cross_entropy(outputs, labels).item()),
            "top1": float((outputs.argmax(1) == labels).float().mean().item()),
            "top5": float((outputs.topk(k, 1).indices == labels[:, None]).any(1).float().mean()),
        }

    def batch_samples(self, batch: Any) -> int:
        return int(batch[0].shape[0])

    def trained_samples(self, batch: Any) -> int:
        """Images x models: an array trains each of its B models on every image."""
        return self.batch_samples(batch) * self.array_size
