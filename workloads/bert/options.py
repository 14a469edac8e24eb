"""BERT-specific settings (the ``options`` table of a workload config)."""

from __future__ import annotations

import dataclasses

from core.errors import UserError
from workloads.config import WorkloadOptions, check_fraction, check_optimizer


@dataclasses.dataclass(frozen=True)
class BertOptions(WorkloadOptions):
    """Settings of the BERT workload; unknown keys are rejected by :meth:`from_dict`.

    - ``size``: ``small`` (the model below: trains on 2 CPU cores) or ``large`` (MLPerf
      BERT-large: hidden 1024, 24 layers, 16 heads, intermediate 4096; the other model settings
      are then ignored).
    - ``hidden``, ``layers``, ``heads``, ``intermediate``: the small model's shape.
    - ``cycle_length``: shards read at once, one record from each in turn (the reference input
      pipeline's interleave).
    - ``eval_fraction``: share of the shards held out for evaluation when ``eval_every`` > 0
      (at least one shard, and at least one per accelerator left for training).
    - ``optimizer`` (``adam`` or ``sgd``; the reference uses LAMB) and ``learning_rate``.
    """

    TABLE = "bert options"

    size: str = "small"
    hidden: int = 128
    layers: int = 2
    heads: int = 2
    intermediate: int = 512
    cycle_length: int = 8
    eval_fraction: float = 0.1
    optimizer: str = "adam"
    learning_rate: float = 1e-4

    def __post_init__(self) -> None:
        if self.size not in ("small", "large"):
            raise UserError(f"bert option size must be small or large, got {self.size!r}")
        for name in ("hidden", "layers", "heads", "intermediate", "cycle_length"):
            if getattr(self, name) < 1:
                raise UserError(f"bert option {name} must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise UserError(
                f"bert option hidden ({self.hidden}) must be a multiple of heads ({self.heads})"
            )
        check_fraction("bert option eval_fraction", self.eval_fraction)
        check_optimizer("bert option", self.optimizer, self.learning_rate, ("adam", "sgd"))
