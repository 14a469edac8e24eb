"""DLRM-specific settings (the ``options`` table of a workload config)."""

from __future__ import annotations

import dataclasses

from core.errors import UserError
from workloads.config import WorkloadOptions, check_optimizer


def parse_layers(text: str, where: str) -> tuple[int, ...]:
    """``"512-256-128"`` -> (512, 256, 128); a UserError says what is wrong."""
    try:
        layers = tuple(int(part) for part in str(text).split("-"))
    except ValueError:
        raise UserError(
            f"{where} must be layer widths joined by '-', e.g. 512-256-128, got {text!r}"
        ) from None
    if not layers or min(layers) < 1:
        raise UserError(f"{where} must list positive layer widths, got {text!r}")
    return layers


@dataclasses.dataclass(frozen=True)
class DLRMOptions(WorkloadOptions):
    """Settings of the DLRM workload; unknown keys are rejected by :meth:`from_dict`.

    - ``size``: ``small`` (the shape below: trains on 2 CPU cores) or ``mlperf`` (embedding
      dimension 128, bottom 512-256-128, top 1024-1024-512-256-1, tables of up to 40 M rows,
      about 100 GB of float32 parameters with the Terabyte counts; the other model settings
      are then ignored).
    - ``embedding_dim``, ``bottom_mlp``, ``top_mlp`` (widths joined by ``-``; the bottom MLP ends
      at ``embedding_dim``, the top MLP at 1), ``max_ind_range``: rows per embedding table at
      most (indices are taken modulo it, as the reference's ``--max-ind-range``).
    - ``eval_batches``: test-file batches per evaluation (0: the whole test file).
    - ``optimizer`` (``sgd`` as the reference, ``adagrad`` or ``adam``) and ``learning_rate``.
    """

    TABLE = "dlrm options"

    size: str = "small"
    embedding_dim: int = 16
    bottom_mlp: str = "64-16"
    top_mlp: str = "64-32-1"
    max_ind_range: int = 10000
    eval_batches: int = 0
    optimizer: str = "sgd"
    learning_rate: float = 0.1

    def __post_init__(self) -> None:
        if self.size not in ("small", "mlperf"):
            raise UserError(f"dlrm option size must be small or mlperf, got {self.size!r}")
        bottom = parse_layers(self.bottom_mlp, "dlrm option bottom_mlp")
        top = parse_layers(self.top_mlp, "dlrm option top_mlp")
        if self.embedding_dim < 1:
            raise UserError(
                f"dlrm option embedding_dim must be at least 1, got {self.embedding_dim}"
            )
        if bottom[-1] != self.embedding_dim:
            raise UserError(
                f"dlrm option bottom_mlp must end at embedding_dim ({self.embedding_dim}), got "
                f"{self.bottom_mlp!r}"
            )
        if top[-1] != 1:
            raise UserError(f"dlrm option top_mlp must end at 1 (one logit), got {self.top_mlp!r}")
        if self.max_ind_range < 0 or self.eval_batches < 0:
            raise UserError("dlrm options max_ind_range and eval_batches must not be negative")
        optimizers = ("sgd", "adagrad", "adam")
        check_optimizer("dlrm option", self.optimizer, self.learning_rate, optimizers)
