"""BERT's part of the shared training loop (``workloads/training.py``).

Data: the TFRecord shards are shared out between ranks and DataLoader workers; each worker keeps
``cycle_length`` shards open and takes one record from each in turn, as the reference's
interleaved TFRecordDataset pipeline does, and hands whole batches to the loop. With
``eval_every`` > 0, ``eval_fraction`` of the shards (at least one) are held out for evaluation
(masked-LM accuracy).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from core.errors import UserError
from workloads.bert.dataset import BertBatches
from workloads.bert.files import list_shards, read_shape
from workloads.bert.model import BertConfig, BertPretraining, mlm_accuracy, pretraining_loss
from workloads.bert.options import BertOptions
from workloads.config import WorkloadConfig
from workloads.events import Emitter
from workloads.loaders import Loader
from workloads.training import SplitTask


@dataclasses.dataclass(frozen=True)
class BertTask(SplitTask):
    options: BertOptions
    model_config: BertConfig
    train_shards: tuple[Path, ...]
    eval_shards: tuple[Path, ...]

    @classmethod
    def create(cls, config: WorkloadConfig, data_dir: Path) -> BertTask:
        options = BertOptions.from_dict(config.options)
        shards = list_shards(data_dir)
        seq_length, _ = read_shape(data_dir)
        eval_shards: list[Path] = []
        if config.eval_every > 0:
            count = max(1, round(len(shards) * options.eval_fraction))
            eval_shards, shards = shards[-count:], shards[:-count]
        if len(shards) < config.accelerators:
            raise UserError(
                f"{data_dir} has {len(shards)} training shard(s) for {config.accelerators} "
                "accelerator(s) (each rank reads its own shards): generate more shards "
                "(a larger --size) or use fewer accelerators"
                + (" or set eval_every to 0" if eval_shards else "")
            )
        if options.size == "large":
            model_config = BertConfig.large()
        else:
            model_config = BertConfig(
                hidden=options.hidden,
                layers=options.layers,
                heads=options.heads,
                intermediate=options.intermediate,
            )
        if seq_length > model_config.max_position:
            raise UserError(
                f"records of {data_dir} have {seq_length} tokens, more than the model's "
                f"{model_config.max_position} positions: regenerate with a shorter seq_length"
            )
        return cls(options, model_config, tuple(shards), tuple(eval_shards))

    def build_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return BertPretraining(self.model_config)

    def items(self, train: bool) -> tuple[Path, ...]:
        return self.train_shards if train else self.eval_shards

    def loader(
        self, train: bool, config: WorkloadConfig, rank: int, device: torch.device, emitter: Emitter
    ) -> Loader:
        if not train:  # evaluation reads every held-out shard on every rank: shards are few
            config, rank = config.replace(accelerators=1), 0
        dataset = BertBatches(
            self.items(train),
            config.batch_size,
            cycle_length=self.options.cycle_length,
            seed=config.seed,
            shuffle=train,
            rank=rank,
            world=config.accelerators,
            emitter=emitter,
        )
        loader = DataLoader(
            dataset, batch_size=None, num_workers=config.workers, pin_memory=device.type == "cuda"
        )
        return Loader(loader, dataset.set_epoch)

    def to_device(self, batch: Any, device: torch.device) -> Any:
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    def forward(self, net: nn.Module, batch: Any) -> Any:
        return net(
            batch["input_ids"],
            batch["input_mask"],
            batch["segment_ids"],
            batch["masked_lm_positions"],
        )

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        mlm_logits, nsp_logits = outputs
        return pretraining_loss(
            mlm_logits,
            nsp_logits,
            batch["masked_lm_ids"],
            batch["masked_lm_weights"],
            batch["next_sentence_labels"],
        )

    def eval_metrics(self, outputs: Any, batch: Any) -> dict[str, float]:
        mlm_logits, _ = outputs
        return {
            "loss": float(self.loss(outputs, batch).item()),
            "mlm_accuracy": float(
                mlm_accuracy(mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"]).item()
            ),
        }

    def batch_samples(self, batch: Any) -> int:
        return int(batch["input_ids"].shape[0])
