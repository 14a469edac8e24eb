"""DLRM in plain torch, shaped like the MLPerf (Criteo Terabyte) reference, and its metrics.

Dense features go through a bottom MLP; each categorical feature selects a row of its own
embedding table (``nn.EmbeddingBag``, sum mode, one index per sample); the dot interaction
takes the pairwise dot products of the bottom output and the embeddings (strict lower
triangle, i.e. each pair once, no self products) and concatenates them with the bottom output;
a top MLP maps that to one logit. The small default keeps a CPU step short;
:meth:`DLRMConfig.mlperf` is the reference size (its tables need about 100 GB of float32 for
the Terabyte counts, so build it only where that fits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import UserError


@dataclass(frozen=True)
class DLRMConfig:
    """Sizes of a DLRM; ``max_ind_range`` caps each table's rows (0 = use the counts as is)."""

    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (64, 16)
    top_mlp: tuple[int, ...] = (64, 32, 1)
    max_ind_range: int = 10000

    def __post_init__(self) -> None:
        # Accept lists (as a JSON/TOML loader gives them) but store tuples, so the config
        # stays hashable and immutable.
        object.__setattr__(self, "bottom_mlp", tuple(self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(self.top_mlp))
        if not isinstance(self.embedding_dim, int) or self.embedding_dim < 1:
            raise UserError(
                f"DLRM embedding_dim is {self.embedding_dim!r}: set it to a positive integer"
            )
        for name in ("bottom_mlp", "top_mlp"):
            sizes = getattr(self, name)
            if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
                raise UserError(
                    f"DLRM {name} is {sizes!r}: give a non-empty list of positive layer widths"
                )
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise UserError(
                f"DLRM bottom_mlp ends in {self.bottom_mlp[-1]} but embedding_dim is "
                f"{self.embedding_dim}: make the last bottom_mlp width equal embedding_dim"
            )
        if self.top_mlp[-1] != 1:
            raise UserError(
                f"DLRM top_mlp ends in {self.top_mlp[-1]}: its last width must be 1 (one logit)"
            )
        if not isinstance(self.max_ind_range, int) or self.max_ind_range < 0:
            raise UserError(
                f"DLRM max_ind_range is {self.max_ind_range!r}: set it to 0 (no cap) or a "
                "positive integer"
            )

    @classmethod
    def mlperf(cls) -> DLRMConfig:
        """The MLPerf Criteo Terabyte reference sizes."""
        return cls(
            embedding_dim=128,
            bottom_mlp=(512, 256, 128),
            top_mlp=(1024, 1024, 512, 256, 1),
            max_ind_range=40_000_000,
        )


def interaction_features(embedding_dim: int, sparse_features: int) -> int:
    """Width of the interaction output: the bottom output plus one dot product per pair."""
    vectors = sparse_features + 1
    return embedding_dim + vectors * (vectors - 1) // 2


def _mlp(in_features: int, sizes: Sequence[int], relu_last: bool) -> nn.Sequential:
    """Linear layers with ReLU between them (and after the last one if ``relu_last``)."""
    layers: list[nn.Module] = []
    for i, size in enumerate(sizes):
        linear = nn.Linear(in_features, size)
        # The reference initialiser: Xavier-normal weights, normal(0, sqrt(1/out)) biases.
        nn.init.normal_(linear.weight, 0.0, math.sqrt(2.0 / (in_features + size)))
        nn.init.normal_(linear.bias, 0.0, math.sqrt(1.0 / size))
        layers.append(linear)
        if relu_last or i < len(sizes) - 1:
            layers.append(nn.ReLU())
        in_features = size
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Bottom MLP, one embedding table per categorical feature, dot interaction, top MLP.

    ``counts[i]`` is the number of distinct values of categorical feature ``i``; its table has
    ``min(counts[i], max_ind_range)`` rows (``counts[i]`` when ``max_ind_range`` is 0).
    Indices are reduced modulo the table size inside :meth:`forward`, which is what the
    reference's ``index % max_ind_range`` does for in-range data and keeps any index valid.
    """

    def __init__(
        self, config: DLRMConfig | None = None, counts: Sequence[int] = (), dense_features: int = 13
    ) -> None:
        super().__init__()
        config = config or DLRMConfig()
        counts = list(counts)
        if not counts or any(int(c) < 1 for c in counts):
            smallest = min(counts) if counts else None
            raise UserError(
                f"DLRM got {len(counts)} embedding counts (smallest {smallest}); it needs one "
                "positive count per categorical feature: read them from the dataset's manifest"
            )
        if dense_features < 1:
            raise UserError(f"DLRM dense_features is {dense_features}: set it to at least 1")
        self.config = config
        self.dense_features = dense_features
        cap = config.max_ind_range
        rows = [min(int(c), cap) if cap > 0 else int(c) for c in counts]
        self.register_buffer("rows", torch.tensor(rows, dtype=torch.int64), persistent=False)
        self.embeddings = nn.ModuleList()
        for n in rows:
            table = nn.EmbeddingBag(n, config.embedding_dim, mode="sum")
            bound = math.sqrt(1.0 / n)  # the reference's uniform(-sqrt(1/n), sqrt(1/n))
            nn.init.uniform_(table.weight, -bound, bound)
            self.embeddings.append(table)
        self.bottom = _mlp(dense_features, config.bottom_mlp, relu_last=True)
        width = interaction_features(config.embedding_dim, len(rows))
        self.interaction_width = width
        self.top = _mlp(width, config.top_mlp, relu_last=False)
        # Each unordered pair of the (features + 1) vectors once, without self products.
        li, lj = torch.tril_indices(len(rows) + 1, len(rows) + 1, offset=-1)
        self.register_buffer("pair_i", li, persistent=False)
        self.register_buffer("pair_j", lj, persistent=False)

    def interact(self, bottom: torch.Tensor, embedded: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate ``bottom`` (B, D) with the pairwise dot products of it and ``embedded``."""
        vectors = torch.stack([bottom, *embedded], dim=1)  # (B, F+1, D)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))
        return torch.cat([bottom, dots[:, self.pair_i, self.pair_j]], dim=1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """Logits (B,) from ``dense`` (B, dense_features) floats and ``sparse`` (B, F) indices."""
        if sparse.dim() != 2 or sparse.shape[1] != len(self.embeddings):
            raise ValueError(
                f"sparse has shape {tuple(sparse.shape)}, expected (B, {len(self.embeddings)})"
            )
        indices = sparse.long() % self.rows
        bottom = self.bottom(dense)
        embedded = [
            table(indices[:, i : i + 1]) for i, table in enumerate(self.embeddings)
        ]  # one index per bag: (B, 1) -> (B, D)
        return self.top(self.interact(bottom, embedded)).squeeze(1)


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy on logits (the reference's sigmoid + BCE, fused for stability)."""
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype).view_as(logits))


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Fraction of samples whose predicted click (probability > 0.5) equals the label."""
    predicted = logits > 0  # sigmoid(x) > 0.5 exactly when x > 0
    return (predicted == labels.view_as(logits).bool()).to(torch.float32).mean()
