"""JPEG decoding and the ImageNet training/evaluation transforms, without torchvision.

The algorithms are torchvision's (``RandomResizedCrop``, ``RandomHorizontalFlip``,
``Resize`` + ``CenterCrop``, ``ToTensor`` + ``Normalize``) on Pillow images, so the CPU cost per
sample is that of the reference pipelines; random draws come from a numpy Generator passed in,
so that a sample's augmentation depends on (seed, epoch, index) only, whatever the worker.
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import torch
from PIL import Image

from core.errors import UserError
from workloads.images.files import REGENERATE

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Per-channel factors of ((x / 255) - mean) / std = x * scale - shift, computed once.
_SCALE = (1.0 / (255.0 * np.array(IMAGENET_STD))).astype(np.float32)
_SHIFT = (np.array(IMAGENET_MEAN) / np.array(IMAGENET_STD)).astype(np.float32)


def decode(data: bytes, where: str) -> Image.Image:
    """Decode JPEG (or any Pillow-readable) ``data`` to an RGB image.

    ``where`` names the data's origin (a file, or a group file and member) in the UserError
    raised for undecodable or truncated data.
    """
    try:
        with warnings.catch_warnings():
            # Pillow warns (DecompressionBombWarning) on very large images: a dataset matter,
            # not ours to silence globally, but never a reason to print from a worker.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            img.load()
        return img if img.mode == "RGB" else img.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise UserError(f"cannot decode the image {where} ({exc}): {REGENERATE}") from None


def rrc_params(
    width: int,
    height: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """The crop (top, left, height, width) of torchvision's ``RandomResizedCrop.get_params``.

    Up to 10 draws of an area fraction in ``scale`` and a log-uniform aspect ratio in ``ratio``;
    the first crop that fits is placed uniformly; otherwise the centre crop of the image clamped
    to ``ratio``.
    """
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_resized_crop(
    img: Image.Image,
    size: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Image.Image:
    """Crop with :func:`rrc_params` and resize to ``size`` x ``size`` (bilinear)."""
    top, left, h, w = rrc_params(img.width, img.height, rng, scale, ratio)
    # resize(box=...) crops and scales in one pass, cheaper than crop() then resize(); only
    # the edge pixels may differ, the filter reading just outside the box.
    return img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))


def hflip(img: Image.Image, rng: np.random.Generator, p: float = 0.5) -> Image.Image:
    """Mirror ``img`` left-right with probability ``p``."""
    if rng.random() < p:
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return img


def to_normalized_tensor(img: Image.Image) -> torch.Tensor:
    """RGB image -> float32 tensor (3, H, W): /255, minus ImageNet mean, over ImageNet std."""
    pixels = np.asarray(img, dtype=np.uint8)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected an RGB image, got array shape {pixels.shape}")
    chw = pixels.transpose(2, 0, 1).astype(np.float32)
    chw *= _SCALE[:, None, None]
    chw -= _SHIFT[:, None, None]
    return torch.from_numpy(chw)


def resize_shorter(img: Image.Image, shorter: int) -> Image.Image:
    """Resize (bilinear) so that the shorter side is ``shorter``, as torchvision ``Resize(int)``."""
    w, h = img.size
    new = (shorter, int(shorter * h / w)) if w <= h else (int(shorter * w / h), shorter)
    if new == (w, h):
        return img
    return img.resize(new, Image.Resampling.BILINEAR)


def center_crop(img: Image.Image, size: int) -> Image.Image:
    """The central ``size`` x ``size`` region (torchvision's rounding); the image must be as big."""
    w, h = img.size
    top = int(round((h - size) / 2.0))
    left = int(round((w - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def eval_transform(img: Image.Image, size: int) -> torch.Tensor:
    """Evaluation: shorter side to round(size * 256 / 224), centre ``size`` crop, normalise."""
    img = resize_shorter(img, round(size * 256 / 224))
    return to_normalized_tensor(center_crop(img, size))


def train_transform(img: Image.Image, size: int, rng: np.random.Generator) -> torch.Tensor:
    """Training: random resized crop to ``size``, horizontal flip (p=0.5), normalise."""
    return to_normalized_tensor(hflip(random_resized_crop(img, size, rng), rng))
