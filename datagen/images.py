"""Generator of ImageNet-like image-classification datasets: JPEG class folders or grouped files.

Layouts (read by :mod:`workloads.images.files`):

- folder (``group_size=0``), the ImageNet layout torchvision's ImageFolder reads:
  ``train/<wnid>/<wnid>_<k>.JPEG`` and ``val/<wnid>/ILSVRC2012_val_<j>.JPEG``, with class
  folders named like ImageNet wnids (``n%08d``, so that sorted names give the label order);
- grouped (``group_size=G``, the gpufs "file grouping"): per split, ``<split>/groups/
  group_%06d.bin``, each the concatenation of G whole JPEG files, and ONE ``<split>/index.csv``
  (header ``group,offset,size,label,path``; ``path`` is the name relative to the dataset
  directory the image would have had in the folder layout). Only full groups are written: the
  number of images of each split is a multiple of G.

Sizes: file sizes are drawn from a lognormal distribution of mean ``mean_kb`` (ImageNet's
training JPEGs average ~110 kB) and log-spread ``size_sigma``, raised to at least ``min_kb``.
Every file has exactly its drawn size, so the total is known before anything is encoded: the
folder layout fills ``size_bytes`` up to less than ``min_kb`` (the last image is shrunk to
fit); the grouped layout falls short by less than one group. Images are split into train and
val (the last ``val_fraction`` of them, whole groups in the grouped layout; at least one when
there are two or more); labels go round-robin over the classes in each split, so every class
has a val image as soon as the val split has as many images as there are classes. Only the
classes that receive an image get a folder.

Why a pool of distinct images: Pillow encodes a 500x375 JPEG at ~2-4 ms per image (25-50 MB/s
per core), far below disk speed (~400-700 MB/s here). So ``distinct_images`` (P, at most one per
file) images are drawn and encoded once per dataset, in parallel (scratch files of 8 images each in
a temporary directory of the system's, removed at the end), and every file is
one of them made unique: after the JFIF APP0 segment it carries JPEG COM (comment) segments
holding the file's index and random bytes (a slice, at an offset that depends on the index, of 8
MiB drawn once per seed), sized so that the file has exactly its drawn size. The result is still
a valid JPEG that Pillow/libjpeg decode to the pool image. Pool image ``j`` is made for a size
cap c_j (the (j+0.5)/P quantile of the size distribution, a little under it) and never exceeds
it; a file of size T uses one of the few largest pool images with c_j <= T - overhead, so the
padding is a small part of a typical file (~13% on average) and decoding costs what a real file
of that size would (the pixels come from an image of about that size). Consequences worth
knowing: files are byte-unique (whole-file dedup and fixed-block dedup see different data, since
the padding shifts the image data by an unaligned amount), but a content-defined-chunking
deduplicator or a compressor of the whole dataset would find the repeated pool images. The
manifest records ``distinct_images``.

Image content: a smooth random colour field (a coarse random grid upscaled, bilinear), random
ellipses and rectangles, and a detail layer (per-pixel noise plus a mid-frequency texture)
whose strength sets the bytes per pixel. The detail layer is a window of a 1024x1024 bank that
each process draws once per seed, so an image costs a few passes of Pillow's C code (~2x the
encoding) rather than fresh random numbers for every pixel. Resolutions are ImageNet-like
(aspect 3:4..4:3, sides mostly 250-600, larger for the largest files), RGB, baseline JPEG with
4:2:0 subsampling at ``quality``.

Cost: the pool is ~5-10 ms of CPU per image (P=256: 1.3-2.6 s of CPU, spread over the
workers). It overlaps with writing: a dataset file is written as soon as the pool chunk it uses
is ready, while the workers encode the next chunks (:func:`datagen.common.run_file_tasks`'s
scratch files), so the disk is busy from the first chunk on. Writing a folder-layout file costs
~0.2 ms of CPU (creating the file dominates: the file system's speed for small files).

Learnable (``learnable``): the labels above are noise, since a pool image serves files of every
class. A learnable dataset gives every file its own image (the pool is the files: encoding
costs 5-10 ms of CPU per file, so it is made at encoding speed, not disk speed), drawn for the
file's label: the colour field and the shapes take colours of the class's hue (``label /
classes`` of the colour wheel, moved per image by a normal draw of :data:`HUE_SPREAD` of the
distance between two classes; saturation and brightness drawn), the detail layer as above.
A crop of any part of an image keeps its hue, so a small CNN learns the classes in a few
epochs (its accuracy climbing epoch by epoch: shapes of other shades and the detail noise are
in every crop).
Labels are drawn at random per image (a block-wise stream: image i's label is the same whatever
the dataset's size or layout), so the folder layout and every grouped layout of one seed and
size hold the same images with the same labels wherever their splits agree, and a group mixes
classes as the groups of a shuffled dataset do (gpufs groups a shuffled file list). File sizes
are those of the other datasets; train and val images are distinct images.

Determinism: the plan (sizes, splits, labels, which pool image each file uses) is drawn in the
calling process from streams seeded by ``seed``; pool image ``j`` depends on (seed, j, its cap,
quality) only; the random bytes of file ``i`` on (seed, i). The output is identical whatever the
number of workers.
"""

from __future__ import annotations

import colorsys
import csv
import dataclasses
import io
import math
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageChops, ImageDraw

from core.atomic import atomic_write_bytes
from core.errors import UserError
from core.units import format_size
from datagen.common import FileSink, FileTask, check_seed, check_size_bytes
from datagen.driver import Job, Written, generator

GENERATOR = "images"
# Bump when the content written for a given (seed, params) changes.
CONTENT_VERSION = 1

INDEX_HEADER = ("group", "offset", "size", "label", "path")
# COM segment: marker (2 bytes) + length (2 bytes, counting itself) + payload.
_COM_MARKER = b"\xff\xfe"
_COM_MAX_PAYLOAD = 65535 - 2
_TAG_FORMAT = "twintrace image {:012d}\n"
_TAG_BYTES = len(_TAG_FORMAT.format(0))
# The smallest addition to a pool image: one COM segment holding the tag.
OVERHEAD_BYTES = 4 + _TAG_BYTES
# A file uses one of the _PICK_SPREAD largest pool images that fit its size, so that files of
# similar sizes do not all repeat the same image.
_PICK_SPREAD = 4
# Pool images encoded per pool task (tasks are spread over the workers).
_POOL_CHUNK = 8
# Draws per block of the plan's random streams: block-wise drawing keeps image i's draws the
# same whatever the dataset size.
_BLOCK = 1 << 16
# Pool images are made for ~this fraction of their cap, so that most land under it first time.
_AIM = 0.9
_MIN_CAP = 2_000
# Seeds of the independent random streams (the second entry of the seed sequence).
_SIZES, _PICKS, _POOL, _PADDING, _BANK, _LABELS = 1, 2, 3, 4, 5, 6
#: Learnable images: the spread of an image's hue around its class's, as a share of the hue
#: distance between two neighbouring classes (a normal's standard deviation): the midpoint
#: between two classes is 3.3 of them away, so the classes are separable by hue; what a model
#: must learn is to see it through crops, flips, shapes of other shades and the detail noise.
#: Measured with a ResNet-18 of the zoo's size (224 pixels, width 64; SGD at 0.001, batch 8)
#: after 3 epochs of a 20 MB set (37 val images): 51 % top-1 with 0.3, 73 % with 0.15.
HUE_SPREAD = 0.15

# Bytes per pixel of our content at quality 90 as a function of the strength of the detail
# layer (measured with Pillow 13 / libjpeg-turbo 3 on 460x345 images): used to choose the
# detail that gives a pool image the bytes per pixel drawn for it.
_BPP_TABLE = np.array([0.086, 0.183, 0.295, 0.377, 0.45, 0.561, 0.639, 0.7, 0.749, 0.826, 0.884])
_DETAIL_TABLE = np.array([0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0])
# Side of the square detail bank each process draws once per seed (3 MiB).
_BANK_SIDE = 1024
# Pool images have at least this many pixels (about 250x190): the smallest files get smoother
# images rather than thumbnails.
_MIN_PIXELS = 48_000


@dataclasses.dataclass(frozen=True)
class ImageGenParams:
    """What the generated images look like.

    ``mean_kb``, ``size_sigma``, ``min_kb``: the file sizes (kB = 1000 bytes) are lognormal with
    this mean and log standard deviation, raised to ``min_kb``. ``quality``: JPEG quality of the
    pool images. ``group_size``: 0 for the folder layout, G > 0 for grouped files of G images.
    ``val_fraction``: share of the images in the val split (0 to 0.5). ``distinct_images``:
    how many distinct images are encoded (see the module docstring); at most one per file.
    ``learnable``: every image its own, its colours drawn around its class's (module docstring,
    "Learnable"): a model can learn the labels; ``distinct_images`` is then ignored.
    """

    classes: int = 1000
    mean_kb: float = 110.0
    size_sigma: float = 0.5
    min_kb: float = 8.0
    quality: int = 90
    group_size: int = 0
    val_fraction: float = 0.02
    distinct_images: int = 256
    learnable: bool = False

    def __post_init__(self) -> None:
        whole = (
            ("classes", 1, 99_999_999),  # n%08d folder names
            ("quality", 1, 100),
            ("group_size", 0, 65_536),
            ("distinct_images", 1, 10_000_000),
        )
        for name, low, high in whole:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UserError(
                    f"{name} must be a whole number from {low} to {high}, got {value!r}"
                )
        real = (
            ("min_kb", 4.0, 1e6),
            ("mean_kb", 2.0 * self.min_kb if _is_real(self.min_kb) else 8.0, 1e6),
            ("size_sigma", 0.0, 1.5),
            ("val_fraction", 0.0, 0.5),
        )
        for name, low, high in real:
            value = getattr(self, name)
            if not (_is_real(value) and low <= value <= high):
                raise UserError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}")


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# --------------------------------------------------------------------------------------------
# Plan


@dataclasses.dataclass(frozen=True)
class ImagePlan:
    """Every image of a dataset, in order: train images first, then val.

    ``sizes[i]`` is the exact size of image ``i`` in bytes, ``pool[i]`` the pool image it uses;
    ``caps[j]`` the size cap of pool image ``j``. ``group_size`` is 0 (folder layout) or G.
    ``labels``: each image's label (learnable datasets: drawn); None: round-robin over the
    classes in each split. ``pool_labels``: the class each pool image is drawn for (learnable:
    pool image ``i`` is image ``i``'s own), else None.
    """

    sizes: np.ndarray
    pool: np.ndarray
    caps: np.ndarray
    n_train: int
    classes: int
    group_size: int
    labels: np.ndarray | None = None

    @property
    def pool_labels(self) -> np.ndarray | None:
        return self.labels

    @property
    def images(self) -> int:
        return len(self.sizes)

    @property
    def n_val(self) -> int:
        return self.images - self.n_train

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    def split_of(self, i: int) -> tuple[str, int]:
        """(split, index within the split) of image ``i``."""
        return ("train", i) if i < self.n_train else ("val", i - self.n_train)

    def label(self, i: int) -> int:
        if self.labels is not None:
            return int(self.labels[i])
        return self.split_of(i)[1] % self.classes

    def relative_path(self, i: int) -> str:
        """The image's name in the folder layout, relative to the dataset directory."""
        split, k = self.split_of(i)
        wnid = class_name(self.label(i))
        if split == "train":
            return f"train/{wnid}/{wnid}_{k}.JPEG"
        return f"val/{wnid}/ILSVRC2012_val_{k + 1:08d}.JPEG"


def class_name(label: int) -> str:
    """The wnid-like folder name of class ``label``: sorted names give the label order."""
    return f"n{label:08d}"


def _lognormal_mu(params: ImageGenParams) -> float:
    # The mean of a lognormal is exp(mu + sigma^2 / 2).
    return math.log(params.mean_kb * 1000) - params.size_sigma**2 / 2


def _draw_blocks(stream: np.random.Generator, n: int, draw: Any) -> np.ndarray:
    blocks = [draw(stream, _BLOCK) for _ in range(-(-n // _BLOCK))]
    return np.concatenate(blocks)[:n] if blocks else np.empty(0)


def pool_caps(params: ImageGenParams, count: int) -> np.ndarray:
    """Size caps of ``count`` pool images: quantiles of the size distribution, a bit under.

    The smallest cap leaves room for the tag in a file of ``min_kb``, so every file has a pool
    image that fits.
    """
    dist = statistics.NormalDist(_lognormal_mu(params), max(params.size_sigma, 1e-9))
    q = [dist.inv_cdf((j + 0.5) / count) for j in range(count)]
    caps = np.exp(np.array(q)) * 0.97
    floor = params.min_kb * 1000 - OVERHEAD_BYTES
    caps = np.clip(caps, _MIN_CAP, None)
    caps[0] = min(caps[0], floor)
    return np.maximum.accumulate(caps).astype(np.int64)


def plan_images(size_bytes: int, seed: int = 0, params: ImageGenParams | None = None) -> ImagePlan:
    """The images :func:`generate_images` writes for this size, seed and params.

    Sizes are drawn in order while they fit. Folder layout: the first that does not fit is
    shrunk to what remains if that is at least ``min_kb``, and is the last image. Grouped
    layout: whole groups of G consecutive images are taken while they fit.
    """
    params = params or ImageGenParams()
    check_seed(seed)
    check_size_bytes(size_bytes)
    floor = round(params.min_kb * 1000)
    mu, sigma = _lognormal_mu(params), params.size_sigma
    unit = max(1, params.group_size)
    # Blocks are drawn until they hold more than the requested size (and one group).
    size_stream = np.random.default_rng([seed, _SIZES])
    sizes_parts: list[np.ndarray] = []
    total = drawn_count = 0
    while total <= size_bytes or drawn_count < unit:
        block = size_stream.lognormal(mu, sigma, _BLOCK)
        block = np.maximum(np.rint(block), floor).astype(np.int64)
        sizes_parts.append(block)
        total += int(block.sum())
        drawn_count += len(block)
    drawn = np.concatenate(sizes_parts)
    if params.group_size:
        usable = len(drawn) // unit * unit
        group_totals = drawn[:usable].reshape(-1, unit).sum(axis=1)
        n_groups = int(np.searchsorted(np.cumsum(group_totals), size_bytes, side="right"))
        if n_groups == 0:
            need = int(group_totals[0])
            raise UserError(
                f"dataset size {size_bytes} bytes ({format_size(size_bytes)}) is smaller than "
                f"one group of {unit} images ({need} bytes for this seed): ask for at least "
                f"{need} bytes or use a smaller group_size"
            )
        sizes = drawn[: n_groups * unit].copy()
        units = n_groups
    else:
        count = int(np.searchsorted(np.cumsum(drawn), size_bytes, side="right"))
        sizes = drawn[:count].copy()
        remaining = size_bytes - int(sizes.sum())
        if remaining >= floor:
            sizes = np.append(sizes, remaining)
        if len(sizes) == 0:
            raise UserError(
                f"dataset size {size_bytes} bytes is smaller than one image of min_kb "
                f"({floor} bytes): ask for at least {floor} bytes"
            )
        units = len(sizes)
    val_units = round(units * params.val_fraction)
    if params.val_fraction > 0 and units >= 2:
        val_units = min(max(val_units, 1), units - 1)
    n_train = (units - val_units) * unit

    count = len(sizes)
    if params.learnable:
        # Every image its own pool image, drawn for its label: labels at random (drawn in
        # blocks, so image i's is the same whatever the dataset's size or layout), so that a
        # group of consecutive images mixes classes as a shuffled dataset's groups do.
        label_stream = np.random.default_rng([seed, _LABELS])
        labels = _draw_blocks(
            label_stream, count, lambda g, n: g.integers(0, params.classes, n, dtype=np.int64)
        ).astype(np.int64)
        return ImagePlan(
            sizes=sizes,
            pool=np.arange(count, dtype=np.int64),
            caps=(sizes - OVERHEAD_BYTES).astype(np.int64),
            n_train=n_train,
            classes=params.classes,
            group_size=params.group_size,
            labels=labels,
        )
    caps = pool_caps(params, min(params.distinct_images, count))
    largest_fitting = np.searchsorted(caps, sizes - OVERHEAD_BYTES, side="right") - 1
    pick_stream = np.random.default_rng([seed, _PICKS])
    jitter = _draw_blocks(
        pick_stream, count, lambda g, n: g.integers(0, _PICK_SPREAD, n, dtype=np.int64)
    )
    pool = np.maximum(largest_fitting - jitter.astype(np.int64), 0)
    # Never a much smaller image than the largest that fits (the pool is coarse at the tails).
    too_small = caps[pool] < 0.75 * caps[largest_fitting]
    pool[too_small] = largest_fitting[too_small]
    return ImagePlan(
        sizes=sizes,
        pool=pool,
        caps=caps,
        n_train=n_train,
        classes=params.classes,
        group_size=params.group_size,
    )


# --------------------------------------------------------------------------------------------
# Pool images


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random bytes (uint8 array): the raw 64-bit draws, ~4x faster than ``rng.bytes``."""
    return rng.bit_generator.random_raw(-(-n // 8)).view(np.uint8)[:n]


# Detail banks of this process, by seed: drawn once, then every pool image crops a window.
_banks: dict[int, Image.Image] = {}


def detail_bank(seed: int) -> Image.Image:
    """The dataset's detail layer: per-pixel noise plus a mid-frequency texture, RGB, centred
    on 128, ``_BANK_SIDE`` pixels square; a function of ``seed`` only."""
    bank = _banks.get(seed)
    if bank is None:
        rng = np.random.default_rng([seed, _BANK])
        side = _BANK_SIDE
        detail = _random_bytes(rng, side * side * 3).view(np.int8).astype(np.int16)
        detail = detail.reshape(side, side, 3)
        coarse = _random_bytes(rng, (side // 4) ** 2).reshape(side // 4, side // 4)
        texture = Image.fromarray(coarse, "L").resize((side, side), Image.Resampling.BILINEAR)
        detail += np.asarray(texture).astype(np.int16)[:, :, None] - 128
        np.clip(detail, -128, 127, out=detail)
        detail += 128
        bank = _banks[seed] = Image.fromarray(detail.astype(np.uint8), "RGB")
    return bank


def _detail_window(seed: int, rng: np.random.Generator, width: int, height: int) -> Image.Image:
    bank = detail_bank(seed)
    if width > bank.width or height > bank.height:
        # Rare (very large images): repeat the bank to cover them.
        reps = (-(-height // bank.height), -(-width // bank.width), 1)
        bank = Image.fromarray(np.tile(np.asarray(bank), reps), "RGB")
    left = int(rng.integers(0, bank.width - width + 1))
    top = int(rng.integers(0, bank.height - height + 1))
    return bank.crop((left, top, left + width, top + height))


def _class_colour(rng: np.random.Generator, hue: float, value: tuple[float, float]) -> np.ndarray:
    """An RGB colour (0-255) of ``hue`` (0-1), saturation and value drawn."""
    rgb = colorsys.hsv_to_rgb(hue % 1.0, rng.uniform(0.55, 0.95), rng.uniform(*value))
    return np.array(rgb) * 255


def pool_image(
    seed: int,
    j: int,
    width: int,
    height: int,
    detail: float,
    label: int | None = None,
    classes: int = 1,
) -> Image.Image:
    """Pool image ``j``: a smooth colour field, shapes, and the detail layer times ``detail``.

    The field is a coarse random grid upscaled (bilinear); ``detail`` (0-1) scales the window
    of :func:`detail_bank` added to it, which sets how many bytes a pixel costs. Every step is
    one pass of Pillow's C code: about as cheap as the JPEG encoding itself. With ``label``
    (a learnable dataset of ``classes`` classes) the field and the shapes take colours of one
    hue, the class's (``label / classes`` of the colour wheel) moved by a normal draw of
    :data:`HUE_SPREAD` classes' distance; else every colour is drawn at random.
    """
    rng = np.random.default_rng([seed, _POOL, j])
    gh, gw = (int(v) for v in rng.integers(2, 7, 2))
    hue = None if label is None else (label + rng.normal(0.0, HUE_SPREAD)) / classes
    if hue is None:
        grid = _random_bytes(rng, gh * gw * 3).reshape(gh, gw, 3)
    else:
        base = _class_colour(rng, hue, (0.45, 0.9))
        jitter = rng.uniform(-30, 30, (gh, gw, 3))
        grid = np.clip(np.rint(base + jitter), 0, 255).astype(np.uint8)
    img = Image.fromarray(grid, "RGB").resize((width, height), Image.Resampling.BILINEAR)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 12))):
        xs = np.sort(rng.integers(-width // 4, width + width // 4, 2))
        ys = np.sort(rng.integers(-height // 4, height + height // 4, 2))
        box = (int(xs[0]), int(ys[0]), int(xs[1]), int(ys[1]))
        if hue is None:
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        else:
            colour = tuple(int(c) for c in np.rint(_class_colour(rng, hue, (0.25, 1.0))))
        if rng.random() < 0.5:
            draw.ellipse(box, fill=colour)
        else:
            draw.rectangle(box, fill=colour)
    lut = np.clip(np.rint(128 + (np.arange(256) - 128) * detail), 0, 255).astype(int).tolist()
    window = _detail_window(seed, rng, width, height).point(lut * 3)
    # img + window - 128, clipped to 0..255.
    return ImageChops.add(img, window, 1.0, -128)


def _encode(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def encode_pool_image(
    seed: int, j: int, cap: int, quality: int, label: int | None = None, classes: int = 1
) -> bytes:
    """The JPEG bytes of pool image ``j``: about ``_AIM`` x ``cap`` bytes, never above ``cap``.

    The bytes per pixel and aspect ratio are drawn for ``j``; the resolution follows from the
    cap. When the encoded size misses (the shapes and field vary), the resolution is scaled and
    the image encoded again: a handful of tries, then smaller and smaller images until it fits.
    """
    rng = np.random.default_rng([seed, _POOL, j, 1])
    bpp = float(rng.uniform(0.32, 0.8))
    aspect = float(np.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3))))
    pixels = _AIM * cap / bpp
    if pixels < _MIN_PIXELS:
        # A small cap: fewer bytes per pixel (smoother content) instead of a tiny image.
        pixels = _MIN_PIXELS
        bpp = max(float(_BPP_TABLE[0]), _AIM * cap / pixels)
    detail = float(np.interp(bpp, _BPP_TABLE, _DETAIL_TABLE))
    best = b""
    for _ in range(6):
        width = max(8, round(math.sqrt(pixels * aspect)))
        height = max(8, round(width / aspect))
        data = _encode(pool_image(seed, j, width, height, detail, label, classes), quality)
        if len(data) <= cap and len(data) > len(best):
            best = data
        ratio = len(data) / cap
        if 0.8 <= ratio <= 1.0:
            return data
        pixels *= _AIM / ratio
    if best:
        return best
    side = 64
    while True:
        # Only reached for very small caps: a plain image is a few hundred bytes.
        data = _encode(Image.new("RGB", (side, side), (128, 128, 128)), quality)
        if len(data) <= cap or side == 8:
            return data
        side //= 2


def write_pool_chunk(
    sink: FileSink,
    seed: int,
    quality: int,
    first: int,
    caps: tuple[int, ...],
    labels: tuple[int, ...] | None = None,
    classes: int = 1,
) -> dict[str, Any]:
    """Write pool images ``first``, ``first + 1``, ... (one per cap; of a learnable dataset,
    each drawn for its label of ``labels``): a chunk file.

    Layout: the image count and each image's size (little-endian uint32s), then the images back
    to back, so a reader finds image k from the file alone (see :func:`pool_chunk_images`).
    """
    images = [
        encode_pool_image(
            seed, first + k, cap, quality, None if labels is None else labels[k], classes
        )
        for k, cap in enumerate(caps)
    ]
    sink.write(np.array([len(images), *map(len, images)], dtype="<u4").tobytes())
    for data in images:
        sink.write(data)
    return {}


def pool_chunk_sizes(header: bytes) -> list[int]:
    """The image sizes a pool chunk file starts with (its first 4 + 4 x count bytes or more)."""
    count = int.from_bytes(header[:4], "little")
    return np.frombuffer(header, dtype="<u4", count=count, offset=4).tolist()


def pool_chunk_images(data: bytes) -> list[memoryview]:
    """The images of a pool chunk file's bytes (see :func:`write_pool_chunk`)."""
    sizes = pool_chunk_sizes(data)
    view = memoryview(data)
    offset = 4 * (1 + len(sizes))
    images = []
    for size in sizes:
        images.append(view[offset : offset + size])
        offset += size
    return images


# --------------------------------------------------------------------------------------------
# Dataset files

PoolRef = tuple[str, int]
"""Where a pool image lies: (pool chunk file, position in the chunk)."""

# Pool chunk files read by this worker process: each is read once, then sliced.
_chunk_cache: dict[str, list[memoryview]] = {}


def _pool_bytes(ref: PoolRef) -> memoryview:
    path, k = ref
    images = _chunk_cache.get(path)
    if images is None:
        images = _chunk_cache[path] = pool_chunk_images(Path(path).read_bytes())
    return images[k]


_WRITE_BYTES = 16 << 20

# Random padding bytes of this process, by seed: 8 MiB drawn once, then sliced per file.
_PADDING_BANK_BYTES = 8 << 20
_padding_banks: dict[int, bytes] = {}


def _padding(seed: int, index: int, n: int) -> memoryview | bytes:
    """``n`` random bytes for file ``index``: a slice of the process's bank at an offset that
    depends on ``index`` (no generator to seed per file, no copy); drawn afresh when large."""
    if n > _PADDING_BANK_BYTES // 2:
        return _random_bytes(np.random.default_rng([seed, _PADDING, index]), n).tobytes()
    bank = _padding_banks.get(seed)
    if bank is None:
        rng = np.random.default_rng([seed, _PADDING])
        bank = _padding_banks[seed] = _random_bytes(rng, _PADDING_BANK_BYTES).tobytes()
    # Golden-ratio hashing spreads consecutive files over the bank at unaligned offsets, so
    # equal 4 KiB blocks do not recur in neighbouring files.
    start = (index * 0x9E3779B97F4A7C15 >> 17) % (len(bank) - n)
    return memoryview(bank)[start : start + n]


def unique_jpeg(jpeg: bytes | memoryview, size: int, seed: int, index: int) -> list[Any]:
    """``jpeg`` with COM segments (tag of ``index`` + random bytes) inserted: ``size`` bytes.

    Returned as pieces (bytes-like) to write or join in order. The segments go after the JFIF
    APP0 segment, which must stay first; ``size - len(jpeg)`` must be at least
    :data:`OVERHEAD_BYTES`.
    """
    jpeg = memoryview(jpeg)
    pad = size - len(jpeg)
    if pad < OVERHEAD_BYTES:
        raise ValueError(f"image {index}: {pad} bytes of padding, need {OVERHEAD_BYTES}")
    at = 2
    if jpeg[2:4] == b"\xff\xe0":
        at = 4 + int.from_bytes(jpeg[4:6], "big")
    # Split the padding evenly over as few segments as the 64 KiB segment limit allows.
    n_seg = -(-pad // (4 + _COM_MAX_PAYLOAD))
    base, extra = divmod(pad, n_seg)
    noise = _padding(seed, index, pad - 4 * n_seg - _TAG_BYTES)
    pieces: list[Any] = [jpeg[:at]]
    start = -_TAG_BYTES  # the first segment's payload starts with the tag
    for s in range(n_seg):
        length = base + (1 if s < extra else 0) - 4
        pieces.append(_COM_MARKER + (length + 2).to_bytes(2, "big"))
        if s == 0:
            pieces.append(_TAG_FORMAT.format(index).encode())
        pieces.append(noise[max(start, 0) : start + length])
        start += length
    pieces.append(jpeg[at:])
    return pieces


def write_image_file(
    sink: FileSink, seed: int, index: int, size: int, ref: PoolRef
) -> dict[str, Any]:
    """Write image ``index`` (``size`` bytes, made from pool image ``ref``) as one JPEG file."""
    sink.write(b"".join(unique_jpeg(_pool_bytes(ref), size, seed, index)))
    return {}


def write_group_file(
    sink: FileSink, seed: int, members: tuple[tuple[int, int, PoolRef], ...]
) -> dict[str, Any]:
    """Write a group file: the JPEGs of ``members`` ((index, size, pool ref), ...) back to back."""
    pieces: list[Any] = []
    pending = 0
    for index, size, ref in members:
        pieces.extend(unique_jpeg(_pool_bytes(ref), size, seed, index))
        pending += size
        # Few large writes (one per ~16 MiB) rather than several small ones per image.
        if pending >= _WRITE_BYTES:
            sink.write(b"".join(pieces))
            pieces, pending = [], 0
    if pieces:
        sink.write(b"".join(pieces))
    return {"images": len(members)}


def _pool_tasks(plan: ImagePlan, seed: int, quality: int) -> list[FileTask]:
    caps, labels = plan.caps, plan.pool_labels

    def chunk_labels(first: int) -> tuple[int, ...] | None:
        if labels is None:
            return None
        return tuple(int(v) for v in labels[first : first + _POOL_CHUNK])

    return [
        FileTask(
            name=_pool_chunk_name(first),
            write=write_pool_chunk,
            args=(
                seed,
                quality,
                first,
                tuple(int(c) for c in caps[first : first + _POOL_CHUNK]),
                chunk_labels(first),
                plan.classes,
            ),
            size_hint=int(caps[first : first + _POOL_CHUNK].sum() * _AIM),
        )
        for first in range(0, len(caps), _POOL_CHUNK)
    ]


def _pool_chunk_name(j: int) -> str:
    """The chunk file that holds pool image ``j``."""
    return f"pool_{j // _POOL_CHUNK:05d}.bin"


def image_tasks(plan: ImagePlan, seed: int, pool_dir: Path) -> list[FileTask]:
    """The file-writing tasks of a plan: one per image, or one per group of G images.

    Each waits for the pool chunk files (in ``pool_dir``) of its images.
    """
    sizes = plan.sizes.tolist()
    pool = plan.pool.tolist()
    # Per pool image, built once: a plan has tens of thousands of files but a few hundred images.
    chunks = [_pool_chunk_name(j) for j in range(len(plan.caps))]
    refs = [(os.path.join(pool_dir, chunks[j]), j % _POOL_CHUNK) for j in range(len(chunks))]
    if not plan.group_size:
        return [
            FileTask(
                name=plan.relative_path(i),
                write=write_image_file,
                args=(seed, i, sizes[i], refs[pool[i]]),
                size_hint=sizes[i],
                after=(chunks[pool[i]],),
            )
            for i in range(plan.images)
        ]
    tasks = []
    g = plan.group_size
    for first in range(0, plan.images, g):
        split, k = plan.split_of(first)
        members = range(first, first + g)
        tasks.append(
            FileTask(
                name=group_name(split, k // g),
                write=write_group_file,
                args=(seed, tuple((i, sizes[i], refs[pool[i]]) for i in members)),
                size_hint=sum(sizes[first : first + g]),
                after=tuple(sorted({chunks[pool[i]] for i in members})),
            )
        )
    return tasks


def group_name(split: str, group: int) -> str:
    """The name of group file ``group`` of ``split``, relative to the dataset directory."""
    return f"{split}/groups/group_{group:06d}.bin"


def write_index(out: Path, plan: ImagePlan, split: str, fsync: bool) -> dict[str, Any]:
    """Write ``<split>/index.csv`` of a grouped plan; return its manifest record."""
    g = plan.group_size
    first, stop = (0, plan.n_train) if split == "train" else (plan.n_train, plan.images)
    sizes = plan.sizes[first:stop]
    # Offsets restart at 0 in every group: the exclusive cumulative sum within each row of G.
    within = sizes.reshape(-1, g)
    offsets = (np.cumsum(within, axis=1) - within).ravel()
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(INDEX_HEADER)
    for n, i in enumerate(range(first, stop)):
        writer.writerow(
            (n // g, int(offsets[n]), int(sizes[n]), plan.label(i), plan.relative_path(i))
        )
    name = f"{split}/index.csv"
    data = buf.getvalue().encode()
    atomic_write_bytes(out / name, data, fsync=fsync)
    return {"name": name, "bytes": len(data), "rows": stop - first}


# --------------------------------------------------------------------------------------------
# Generator


@generator(GENERATOR, ImageGenParams)
def generate_images(job: Job, params: ImageGenParams) -> dict[str, Any]:
    """Generate an image-classification dataset of about ``size_bytes`` in ``out``.

    The images are those of :func:`plan_images` (see there and the module docstring for the
    layouts and the total). The workers encode the pool of distinct images into a temporary
    directory (removed at the end) and write each dataset file once its pool images are ready;
    then (grouped layout) the index files are written.
    """

    def write(plan: ImagePlan) -> Written:
        if job.progress is not None:
            # The first pool chunk is encoded before any dataset byte is written: show the total.
            job.progress(0, plan.total_bytes)
        pool_dir = Path(tempfile.mkdtemp(prefix="twintrace-image-pool-"))
        try:
            files = job.run(
                image_tasks(plan, job.seed, pool_dir),
                scratch=_pool_tasks(plan, job.seed, params.quality),
                scratch_dir=pool_dir,
            )
            pool_sizes = []
            for chunk in sorted(pool_dir.glob("pool_*.bin")):
                with open(chunk, "rb") as f:
                    pool_sizes += pool_chunk_sizes(f.read(4 * (1 + _POOL_CHUNK)))
        finally:
            shutil.rmtree(pool_dir, ignore_errors=True)
        if plan.group_size:
            files.append(write_index(job.out, plan, "train", job.fsync))
            if plan.n_val:
                files.append(write_index(job.out, plan, "val", job.fsync))
        return files, {
            **dataclasses.asdict(params),
            "layout": "grouped" if plan.group_size else "folder",
            "images": plan.images,
            "train_images": plan.n_train,
            "val_images": plan.n_val,
            "classes_used": int(len(np.unique(plan.labels[: plan.n_train])))
            if plan.labels is not None
            else min(plan.classes, plan.n_train),
            "groups": plan.images // plan.group_size if plan.group_size else 0,
            "mean_image_bytes": round(plan.total_bytes / plan.images, 1),
            "distinct_images": len(plan.caps),
            "mean_distinct_image_bytes": round(sum(pool_sizes) / len(pool_sizes), 1),
            "content_version": CONTENT_VERSION,
        }

    return job.generate(lambda: plan_images(job.size_bytes, job.seed, params), write)
