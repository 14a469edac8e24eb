"""Workloads: the training jobs twintrace runs inside containers.

This package is the lowest layer of the project: it is copied into the workload images and must
import with only the standard library and the packages of images/requirements.txt available
(numpy, torch, mlperf-logging, Pillow, crc32c, protobuf, tfrecord).
"""

__version__ = "0.1.0"
