"""Synthetic datasets in each workload's real on-disk format, generated at disk speed.

One module per format (``unet3d``: KiTS19 ``.npy`` pairs; more to come), all built on
``datagen.common``: output-directory handling, atomic files, a parallel writer with a byte
progress callback, and the ``manifest.json`` that is written last. A dataset directory without
``manifest.json`` is incomplete.
"""

from datagen.common import load_manifest, prepare_output_dir
from datagen.unet3d import UNet3DGenParams, generate_unet3d, plan_unet3d_cases

__all__ = [
    "UNet3DGenParams",
    "generate_unet3d",
    "load_manifest",
    "plan_unet3d_cases",
    "prepare_output_dir",
]
