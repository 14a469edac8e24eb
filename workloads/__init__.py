"""Workloads: the training jobs twintrace runs inside containers.

This package and ``core`` are what the workload images carry: it must import with only the
standard library, ``core`` and the packages of images/requirements.txt available (numpy, torch,
mlperf-logging, Pillow, crc32c, protobuf, tfrecord). Host-only code lives elsewhere.
"""

from core import __version__

__all__ = ["__version__"]
