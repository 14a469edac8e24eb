"""The dataset generators by name, with the options each one takes (used by ``./cli.py datagen``).

Every generator has the same core signature (``out, size_bytes, seed, workers, force, progress,
params, fsync``, given by :func:`datagen.driver.generator`); the few generator-specific options
(``scale`` for unet3d, ``group_size`` and the image sizes for images) are turned into that
generator's params here, and refused for the others.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from core.errors import UserError

# name -> (module, function, workloads that read it)
GENERATORS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "unet3d": ("datagen.unet3d", "generate_unet3d", ("unet3d",)),
    "bert": ("datagen.bert", "generate_bert", ("bert",)),
    "dlrm": ("datagen.dlrm", "generate_dlrm", ("dlrm",)),
    "images": ("datagen.images", "generate_images", ("resnet18", "resnet50", "alexnet")),
}


def generate(
    name: str,
    out: Path,
    size_bytes: int,
    *,
    scale: float | None = None,
    group_size: int | None = None,
    mean_kb: float | None = None,
    size_sigma: float | None = None,
    learnable: bool = False,
    classes: int | None = None,
    val_fraction: float | None = None,
    **run: Any,
) -> dict[str, Any]:
    """Run generator ``name`` and return its manifest (see each generator's module). ``run``:
    what every generator takes besides (``seed``, ``workers``, ``force``, ``progress``,
    ``fsync``; :func:`datagen.driver.generator`).
    ``mean_kb`` (images): the mean file size in kB (ImageNet's is about 110); ``size_sigma``
    (images): the log standard deviation of the file sizes (0.5 by default; OpenImages-like
    sizes, mean 317 kB with a quarter of the files under a 224 x 224 crop's 150 kB, take
    0.7); ``learnable`` (images): pixels that depend on the class, of ``classes`` classes (10
    by default when learnable, else ImageNet's 1000); ``val_fraction`` (images): the share of
    the images in the val split (0.2 by default when learnable, else 0.02)."""
    if name not in GENERATORS:
        raise UserError(f"unknown generator {name!r}: choose one of {', '.join(GENERATORS)}")
    if scale is not None and name != "unet3d":
        raise UserError(f"--scale applies to unet3d only, not {name}: leave it out")
    if group_size is not None and name != "images":
        raise UserError(f"--group-size applies to images only, not {name}: leave it out")
    if mean_kb is not None and name != "images":
        raise UserError(f"--mean-kb applies to images only, not {name}: leave it out")
    if size_sigma is not None and name != "images":
        raise UserError(f"--size-sigma applies to images only, not {name}: leave it out")
    if (learnable or classes is not None or val_fraction is not None) and name != "images":
        raise UserError(
            f"--learnable, --classes and --val-fraction apply to images only, not {name}: "
            "leave them out"
        )
    params: Any = None
    if name == "unet3d" and scale is not None and scale != 1.0:
        from datagen.unet3d import UNet3DGenParams

        params = UNet3DGenParams.scaled(scale)
    if name == "images" and (
        (group_size, mean_kb, size_sigma, classes, val_fraction) != (None,) * 5 or learnable
    ):
        from datagen.images import ImageGenParams

        image: dict[str, Any] = {"group_size": group_size or 0}
        if mean_kb is not None:
            image["mean_kb"] = float(mean_kb)
        if size_sigma is not None:
            image["size_sigma"] = float(size_sigma)
        if learnable:
            image.update(learnable=True, classes=10, val_fraction=0.2)
        if val_fraction is not None:
            image["val_fraction"] = float(val_fraction)
        if classes is not None:
            image["classes"] = classes
        params = ImageGenParams(**image)
    module, function, _ = GENERATORS[name]
    generator = getattr(importlib.import_module(module), function)
    return generator(Path(out), size_bytes, params=params, **run)
