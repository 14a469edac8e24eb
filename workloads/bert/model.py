"""BERT pre-training (masked LM + next-sentence prediction) in plain torch, as in MLPerf.

The architecture follows the MLCommons BERT reference: word + position + token-type
embeddings with LayerNorm, post-LN transformer layers with exact GELU, an MLM head
(dense + GELU + LayerNorm, decoder tied to the word embeddings plus a bias) evaluated only at
the ``masked_lm_positions``, and an NSP head on the pooled first token. The small default
keeps a CPU step short; :meth:`BertConfig.large` is the MLPerf BERT-large size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import UserError

# BERT's TF checkpoints use 1e-12; torch's default 1e-5 would change the numerics.
LAYER_NORM_EPS = 1e-12
# Truncated-normal std of the reference initialiser (``initializer_range``).
INIT_STD = 0.02


@dataclass(frozen=True)
class BertConfig:
    """Sizes of a BERT encoder; the defaults are a small CPU-friendly model."""

    vocab_size: int = 30522
    hidden: int = 128
    layers: int = 2
    heads: int = 2
    intermediate: int = 512
    max_position: int = 512
    type_vocab: int = 2
    dropout: float = 0.1

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden",
            "layers",
            "heads",
            "intermediate",
            "max_position",
            "type_vocab",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"BERT {name} is {value!r}: set it to a positive integer")
        if self.hidden % self.heads:
            raise UserError(
                f"BERT hidden size {self.hidden} is not divisible by heads {self.heads}: "
                "choose a hidden size that is a multiple of the number of heads"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"BERT dropout is {self.dropout!r}: set it in [0, 1)")

    @classmethod
    def large(cls) -> BertConfig:
        """MLPerf BERT-large: 24 layers, hidden 1024, 16 heads, intermediate 4096."""
        return cls(hidden=1024, layers=24, heads=16, intermediate=4096)


class BertEmbeddings(nn.Module):
    """Sum of word, position and token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden)
        self.position = nn.Embedding(config.max_position, config.hidden)
        self.token_type = nn.Embedding(config.type_vocab, config.hidden)
        self.norm = nn.LayerNorm(config.hidden, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word(input_ids) + self.position(positions) + self.token_type(segment_ids)
        return self.dropout(self.norm(x))


class BertPretraining(nn.Module):
    """BERT encoder with the masked-LM and next-sentence-prediction heads.

    ``forward(input_ids, input_mask, segment_ids, masked_lm_positions)`` takes (B, S) integer
    tensors (``input_mask`` 1 for real tokens, 0 for padding) and (B, P) positions, and returns
    ``(mlm_logits (B, P, vocab), nsp_logits (B, 2))``. Padding is excluded from attention, so
    the outputs at real positions do not depend on what the padded tokens are.
    """

    def __init__(self, config: BertConfig | None = None) -> None:
        super().__init__()
        config = config or BertConfig()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        # A plain ModuleList rather than nn.TransformerEncoder: the latter's nested-tensor
        # fast path (eval only) zeroes padded positions, so train and eval would differ there.
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                config.hidden,
                config.heads,
                dim_feedforward=config.intermediate,
                dropout=config.dropout,
                activation="gelu",
                layer_norm_eps=LAYER_NORM_EPS,
                batch_first=True,
                norm_first=False,
            )
            for _ in range(config.layers)
        )
        self.pooler = nn.Linear(config.hidden, config.hidden)
        self.nsp = nn.Linear(config.hidden, 2)
        self.mlm_transform = nn.Linear(config.hidden, config.hidden)
        self.mlm_norm = nn.LayerNorm(config.hidden, eps=LAYER_NORM_EPS)
        # The decoder weight is the word-embedding matrix (tied); only its bias is separate.
        self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.apply(_init_weights)

    def encode(
        self, input_ids: torch.Tensor, input_mask: torch.Tensor, segment_ids: torch.Tensor
    ) -> torch.Tensor:
        """Final hidden states (B, S, hidden) of the encoder."""
        x = self.embeddings(input_ids, segment_ids)
        padding = input_mask == 0  # True where attention must ignore the key
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding)
        return x

    def forward(
        self,
        input_ids: torch.Tensor,
        input_mask: torch.Tensor,
        segment_ids: torch.Tensor,
        masked_lm_positions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.encode(input_ids, input_mask, segment_ids)
        # Only the masked positions need the (large) vocabulary projection.
        index = masked_lm_positions.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        masked = torch.gather(hidden, 1, index)
        masked = self.mlm_norm(F.gelu(self.mlm_transform(masked)))
        mlm_logits = F.linear(masked, self.embeddings.word.weight, self.mlm_bias)
        pooled = torch.tanh(self.pooler(hidden[:, 0]))
        return mlm_logits, self.nsp(pooled)


def _init_weights(module: nn.Module) -> None:
    """The reference initialiser: truncated normal (std 0.02) weights, zero biases."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.trunc_normal_(module.weight, std=INIT_STD, a=-2 * INIT_STD, b=2 * INIT_STD)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.MultiheadAttention):
        # Its packed Q/K/V projection is a bare parameter, not an nn.Linear.
        nn.init.trunc_normal_(module.in_proj_weight, std=INIT_STD, a=-2 * INIT_STD, b=2 * INIT_STD)
        nn.init.zeros_(module.in_proj_bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def pretraining_loss(
    mlm_logits: torch.Tensor,
    nsp_logits: torch.Tensor,
    masked_lm_ids: torch.Tensor,
    masked_lm_weights: torch.Tensor,
    next_sentence_labels: torch.Tensor,
) -> torch.Tensor:
    """MLPerf pre-training loss: weighted masked-LM cross-entropy plus mean NSP cross-entropy.

    MLM term = sum(w * CE) / (sum(w) + 1e-5) over the (B, P) prediction slots, so padded
    slots (weight 0) do not count; NSP term = mean CE over the batch.
    """
    weights = masked_lm_weights.to(mlm_logits.dtype)
    ce = F.cross_entropy(
        mlm_logits.flatten(0, 1), masked_lm_ids.long().flatten(), reduction="none"
    ).view_as(weights)
    mlm = (weights * ce).sum() / (weights.sum() + 1e-5)
    nsp = F.cross_entropy(nsp_logits, next_sentence_labels.long().flatten())
    return mlm + nsp


def mlm_accuracy(
    mlm_logits: torch.Tensor, masked_lm_ids: torch.Tensor, masked_lm_weights: torch.Tensor
) -> torch.Tensor:
    """Weighted masked-LM accuracy: sum(w * [argmax == id]) / sum(w), as MLPerf evaluates.

    Returns 0 when every weight is 0. To combine batches, weight each result by
    ``masked_lm_weights.sum()``.
    """
    weights = masked_lm_weights.to(torch.float32)
    correct = (mlm_logits.argmax(dim=-1) == masked_lm_ids.long()).to(torch.float32)
    return (weights * correct).sum() / weights.sum().clamp_min(1e-12)
