"""Synthetic datasets in each workload's real on-disk format, generated at disk speed.

One module per format (``unet3d``: KiTS19 ``.npy`` pairs; ``bert``: MLPerf TFRecord shards;
``dlrm``: Criteo Terabyte binary records; ``images``: ImageNet-layout JPEG folders or grouped
files), each run by one driver, ``datagen.driver.Job`` (check the request, plan, prepare the
directory, write, then the ``manifest.json``, last), on the machinery of ``datagen.common``:
output-directory handling, atomic files, a parallel writer with a byte progress callback. A
dataset directory without ``manifest.json`` is incomplete. ``datagen.registry`` names the
generators for the CLI.
"""

from datagen.common import load_manifest, prepare_output_dir
from datagen.registry import GENERATORS, generate

__all__ = ["GENERATORS", "generate", "load_manifest", "prepare_output_dir"]
