"""DLRM's part of the shared training loop (``workloads/training.py``).

Each loader item is one whole batch: one ``pread`` of batch_size x 160 bytes at a batch-aligned
offset of the train file, the batch indices shuffled per epoch and shared out between ranks
(DistributedSampler), as the MLPerf binary loader does. Evaluation reads the test file in order.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.errors import UserError
from workloads.config import WorkloadConfig
from workloads.dlrm.dataset import DLRMBatches
from workloads.dlrm.files import DLRMData, load_dataset
from workloads.dlrm.model import DLRM, DLRMConfig
from workloads.dlrm.options import DLRMOptions, parse_layers
from workloads.events import Emitter
from workloads.loaders import Loader, sharded_loader
from workloads.training import Task


@dataclasses.dataclass(frozen=True)
class DLRMTask(Task):
    options: DLRMOptions
    model_config: DLRMConfig
    data: DLRMData

    @classmethod
    def create(cls, config: WorkloadConfig, data_dir: Path) -> DLRMTask:
        options = DLRMOptions.from_dict(config.options)
        data = load_dataset(data_dir)
        if data.train_records < config.batch_size * config.accelerators:
            raise UserError(
                f"{data.train} holds {data.train_records} records, fewer than one batch for each "
                f"of {config.accelerators} accelerator(s) at batch_size {config.batch_size}: "
                "lower the batch size or generate a larger dataset"
            )
        if options.size == "mlperf":
            model_config = DLRMConfig.mlperf()
        else:
            model_config = DLRMConfig(
                embedding_dim=options.embedding_dim,
                bottom_mlp=parse_layers(options.bottom_mlp, "bottom_mlp"),
                top_mlp=parse_layers(options.top_mlp, "top_mlp"),
                max_ind_range=options.max_ind_range,
            )
        return cls(options, model_config, data)

    def build_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return DLRM(self.model_config, self.data.counts)

    def _dataset(self, path: Path, records: int, batch_size: int, emitter: Emitter) -> DLRMBatches:
        # With the counts, a corrupt index or label is an error naming the file and offset
        # rather than an embedding IndexError deep in the model.
        return DLRMBatches(
            path,
            records,
            batch_size,
            max_ind_range=self.model_config.max_ind_range,
            emitter=emitter,
            counts=self.data.counts,
        )

    def train_loader(
        self, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader:
        dataset = self._dataset(
            self.data.train, self.data.train_records, config.batch_size, emitter
        )
        return sharded_loader(dataset, config, rank, device, batch_size=None, shuffle=True)

    def eval_loader(
        self, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader | None:
        if self.data.test_records < config.batch_size:
            return None
        dataset: Any = self._dataset(
            self.data.test, self.data.test_records, config.batch_size, emitter
        )
        if self.options.eval_batches:
            dataset = torch.utils.data.Subset(
                dataset, range(min(len(dataset), self.options.eval_batches))
            )
        return sharded_loader(dataset, config, rank, device, batch_size=None, shuffle=False)

    def to_device(self, batch: Any, device: torch.device) -> Any:
        return tuple(t.to(device, non_blocking=True) for t in batch)

    def forward(self, net: nn.Module, batch: Any) -> Any:
        dense, sparse, _ = batch
        return net(dense, sparse)

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(outputs, batch[2])

    def eval_metrics(self, outputs: Any, batch: Any) -> dict[str, float]:
        labels = batch[2]
        return {
            "loss": float(nn.functional.binary_cross_entropy_with_logits(outputs, labels).item()),
            "accuracy": float(((outputs > 0).float() == labels).float().mean().item()),
        }

    def batch_samples(self, batch: Any) -> int:
        return int(batch[0].shape[0])
