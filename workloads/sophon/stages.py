"""The image pipeline cut into stages, so that the storage node can run its first part and the
training node the rest, with the same result as running it all locally.

Training: RAW (the file) -decode-> DECODED -crop-> CROPPED -flip-> FLIPPED -normalise-> TENSOR,
the calls of :func:`workloads.images.transforms.train_transform` one by one. Evaluation: decode,
resize + centre crop (as ``CROPPED``), no flip (``FLIPPED`` is the same image), normalise.

The random draws of sample ``i`` come from ``default_rng([seed, epoch, i])``, as the local
dataset's: the crop's draws, then the flip's one. Whoever continues a sample that was cropped
elsewhere replays the crop's draws from the decoded image's size (:func:`skip_draws`, which is
why a sample on the wire carries its source size), so the flip sees the draw it would have seen
locally: every split gives the same pixels as the local pipeline, exactly.

On the wire (:func:`to_wire`, :func:`from_wire`): RAW is the file's bytes, the image stages
uint8 RGB rows (height x width x 3), TENSOR float32 3 x size x size in little-endian order.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from workloads.images.transforms import (
    center_crop,
    decode,
    hflip,
    random_resized_crop,
    resize_shorter,
    rrc_params,
    to_normalized_tensor,
)

RAW, DECODED, CROPPED, FLIPPED, TENSOR = range(5)
#: Stage names, by stage number (the proto's ``Stage`` enum has the same numbers).
STAGES: tuple[str, ...] = ("raw", "decoded", "cropped", "flipped", "tensor")
#: The transform that leads from stage k to stage k + 1.
TRANSFORMS: tuple[str, ...] = ("decode", "crop", "flip", "normalise")


@dataclasses.dataclass
class Piece:
    """A sample part-way through the pipeline: ``value`` is bytes (RAW), a Pillow RGB image
    (DECODED .. FLIPPED) or a float32 tensor (TENSOR); ``source`` the decoded image's
    (width, height), once known."""

    stage: int
    value: bytes | Image.Image | torch.Tensor
    source: tuple[int, int] | None = None


def stage_bytes(piece: Piece) -> int:
    """The sample's size at its stage, as sent on the wire."""
    value = piece.value
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, Image.Image):
        return value.width * value.height * 3
    return int(value.numel() * value.element_size())


def step(piece: Piece, size: int, train: bool, rng: np.random.Generator, where: str) -> Piece:
    """``piece`` one stage further (``where`` names the sample in a decoding error)."""
    stage, value = piece.stage, piece.value
    if stage == RAW:
        img = decode(bytes(value), where)  # type: ignore[arg-type]
        return Piece(DECODED, img, (img.width, img.height))
    if stage == DECODED:
        if train:
            img = random_resized_crop(value, size, rng)  # type: ignore[arg-type]
        else:
            shorter = round(size * 256 / 224)
            img = center_crop(resize_shorter(value, shorter), size)  # type: ignore[arg-type]
        return Piece(CROPPED, img, piece.source)
    if stage == CROPPED:
        img = hflip(value, rng) if train else value  # type: ignore[arg-type]
        return Piece(FLIPPED, img, piece.source)
    if stage == FLIPPED:
        return Piece(TENSOR, to_normalized_tensor(value), piece.source)  # type: ignore[arg-type]
    raise ValueError(f"stage {stage} is the last one")


def advance(
    piece: Piece,
    to: int,
    size: int,
    train: bool,
    rng: np.random.Generator,
    where: str,
    clock: Callable[[], int] = time.thread_time_ns,
) -> tuple[Piece, list[int]]:
    """``piece`` taken to stage ``to``, and the CPU time (ns, ``clock``) of each transform."""
    times = []
    while piece.stage < to:
        t0 = clock()
        piece = step(piece, size, train, rng, where)
        times.append(clock() - t0)
    return piece, times


def skip_draws(
    stage: int, source: tuple[int, int] | None, train: bool, rng: np.random.Generator
) -> None:
    """Consume the random draws of the transforms done elsewhere before ``stage``, so that the
    transforms after it draw what they would have drawn locally."""
    if not train:
        return
    if stage >= CROPPED:
        if source is None:
            raise ValueError("a cropped sample needs its source size to replay the crop's draws")
        rrc_params(source[0], source[1], rng)
    if stage >= FLIPPED:
        rng.random()


def to_wire(piece: Piece) -> tuple[bytes, int, int]:
    """(data, height, width) of ``piece`` as sent (height and width 0 for RAW)."""
    value = piece.value
    if piece.stage == RAW:
        return bytes(value), 0, 0  # type: ignore[arg-type]
    if piece.stage == TENSOR:
        array = value.numpy()  # type: ignore[union-attr]
        return array.astype("<f4", copy=False).tobytes(), int(array.shape[1]), int(array.shape[2])
    pixels = np.asarray(value, dtype=np.uint8)
    return pixels.tobytes(), int(pixels.shape[0]), int(pixels.shape[1])


def from_wire(
    stage: int, data: bytes, height: int, width: int, source: tuple[int, int] | None
) -> Piece:
    """The :class:`Piece` a sample's wire form stands for; ValueError when the sizes disagree."""
    if stage == RAW:
        return Piece(RAW, data, None)
    if stage == TENSOR:
        want = 3 * height * width * 4
        if len(data) != want:
            raise ValueError(f"a {height}x{width} tensor has {want} bytes, got {len(data)}")
        array = np.frombuffer(data, dtype="<f4").reshape(3, height, width).astype(np.float32)
        return Piece(TENSOR, torch.from_numpy(array), source)
    want = height * width * 3
    if len(data) != want:
        raise ValueError(f"a {height}x{width} RGB image has {want} bytes, got {len(data)}")
    pixels = np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)
    return Piece(stage, Image.fromarray(pixels, "RGB"), source)
