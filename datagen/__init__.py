"""Synthetic datasets in each workload's real on-disk format, generated at disk speed.

One module per format (``unet3d``: KiTS19 ``.npy`` pairs; ``bert``: MLPerf TFRecord shards;
``dlrm``: Criteo Terabyte binary records; ``images``: ImageNet-layout JPEG folders or grouped
files), all built on ``datagen.common``: output-directory handling, atomic files, a parallel
writer with a byte progress callback, and the ``manifest.json`` that is written last. A dataset
directory without ``manifest.json`` is incomplete. ``datagen.registry`` names them for the CLI.
"""

from datagen.common import load_manifest, prepare_output_dir
from datagen.registry import GENERATORS, generate

__all__ = ["GENERATORS", "generate", "load_manifest", "prepare_output_dir"]
