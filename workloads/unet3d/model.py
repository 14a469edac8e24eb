"""A 3D U-Net in plain torch, shaped like the MLCommons UNet3D reference, and its loss.

The reference (KiTS19 segmentation) uses five levels with 32, 64, 128, 256 and 320 channels,
an extra stride-2 bottleneck at the deepest width, instance normalisation, ReLU and a
Dice + cross-entropy loss. ``UNet3D(base_channels=32, depth=5, max_channels=320)`` builds that
size; the small default in :class:`workloads.unet3d.options.UNet3DOptions` keeps a CPU step
short, since what twintrace studies is the I/O around the computation, not the model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def level_channels(base_channels: int, depth: int, max_channels: int) -> list[int]:
    """Channel width of each encoder level: ``base * 2**i`` capped at ``max_channels``."""
    return [min(base_channels * 2**i, max_channels) for i in range(depth)]


class ConvBlock(nn.Sequential):
    """Conv3d (3x3x3) -> InstanceNorm3d -> ReLU; ``stride`` 2 halves each spatial dimension."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__(
            nn.Conv3d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
            nn.InstanceNorm3d(out_channels, affine=True),
            nn.ReLU(inplace=True),
        )


class Down(nn.Sequential):
    """Encoder level: a stride-2 block followed by a stride-1 block."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(
            ConvBlock(in_channels, out_channels, stride=2), ConvBlock(out_channels, out_channels)
        )


class Up(nn.Module):
    """Decoder level: transposed-conv upsampling, concatenation with the skip, two blocks."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.upsample = nn.ConvTranspose3d(in_channels, out_channels, 2, stride=2)
        self.conv = nn.Sequential(
            ConvBlock(2 * out_channels, out_channels), ConvBlock(out_channels, out_channels)
        )

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([self.upsample(x), skip], dim=1))


class UNet3D(nn.Module):
    """Encoder/decoder with skip connections over ``depth`` levels plus a bottleneck.

    The input's spatial dimensions must be divisible by ``2**depth`` (``depth`` stride-2
    stages: ``depth - 1`` encoder levels and the bottleneck). Output: per-voxel logits with
    ``classes`` channels.
    """

    def __init__(
        self,
        in_channels: int = 1,
        classes: int = 2,
        base_channels: int = 8,
        depth: int = 3,
        max_channels: int = 320,
    ) -> None:
        super().__init__()
        widths = level_channels(base_channels, depth, max_channels)
        self.depth = depth
        self.input_block = nn.Sequential(
            ConvBlock(in_channels, widths[0]), ConvBlock(widths[0], widths[0])
        )
        self.down = nn.ModuleList(Down(i, o) for i, o in zip(widths[:-1], widths[1:], strict=True))
        self.bottleneck = Down(widths[-1], widths[-1])
        ups = [Up(widths[-1], widths[-1])]
        ups += [Up(i, o) for i, o in zip(reversed(widths[1:]), reversed(widths[:-1]), strict=True)]
        self.up = nn.ModuleList(ups)
        self.output = nn.Conv3d(widths[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.input_block(x)]
        for block in self.down:
            skips.append(block(skips[-1]))
        out = self.bottleneck(skips[-1])
        for block, skip in zip(self.up, reversed(skips), strict=True):
            out = block(out, skip)
        return self.output(out)


def dice_ce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy plus soft Dice loss over the foreground classes, as in the reference.

    ``logits``: (N, C, D, H, W); ``labels``: (N, D, H, W) integer class indices.
    Loss = CE + (1 - mean Dice of classes 1..C-1), Dice computed per sample from softmax
    probabilities with a smoothing term so empty foregrounds do not divide by zero.
    """
    ce = F.cross_entropy(logits, labels)
    return ce + (1.0 - dice_score(logits, labels, soft=True).mean())


def dice_score(logits: torch.Tensor, labels: torch.Tensor, soft: bool = False) -> torch.Tensor:
    """Per-sample, per-foreground-class Dice coefficient, shape (N, C-1).

    ``soft`` uses softmax probabilities (differentiable, for the loss); otherwise the argmax
    prediction (for evaluation).
    """
    classes = logits.shape[1]
    if soft:
        pred = torch.softmax(logits, dim=1)
    else:
        pred = F.one_hot(logits.argmax(dim=1), classes).movedim(-1, 1).to(logits.dtype)
    target = F.one_hot(labels, classes).movedim(-1, 1).to(logits.dtype)
    dims = tuple(range(2, logits.dim()))
    smooth = 1e-6
    intersection = (pred * target).sum(dims)
    total = pred.sum(dims) + target.sum(dims)
    dice = (2 * intersection + smooth) / (total + smooth)
    return dice[:, 1:]
