"""The foundation every other package builds on: the version, the one error type, byte sizes,
atomic file writes (carried into the workload images with ``workloads/``) and the run-directory
format (:mod:`core.rundir`, host side only).

Layering (checked by tests/test_layering.py): ``core`` imports no other package of the
project; ``workloads`` imports only ``core``; ``datagen``, ``tracing`` and ``analysis`` import
``core`` and ``workloads``, never each other; ``images`` builds from ``core`` and ``workloads``;
``experiments`` (orchestration) and ``cli.py`` sit on top.
"""

__version__ = "0.1.0"
