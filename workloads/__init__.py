"""Workloads: the training jobs twintrace runs inside containers.

This package is the lowest layer of the project: it is copied into the workload images and must
import with only the standard library, numpy, torch and mlperf-logging available.
"""

__version__ = "0.1.0"
