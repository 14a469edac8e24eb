"""The aspects of a comparison, each one unit (:class:`~.base.Aspect`: its spec and its scorer),
registered here in report order.

To add an aspect: write it with :func:`~.base.aspect` in the module of its resource and add it
to :data:`REGISTERED`; the comparison, the JSON, the table and the report pick it up.
"""

from __future__ import annotations

from analysis.similarity.aspects import activity, files, gauges, phases, requests
from analysis.similarity.aspects.base import Aspect, AspectSpec, Outcome

#: The aspects, in report order. Weights favour the read path and the device (what a training
#: job's input pipeline stresses most); CPU is a cause of I/O timing, not I/O, so it counts half.
REGISTERED: tuple[Aspect, ...] = (
    activity.read_bandwidth,
    activity.write_bandwidth,
    activity.block_io,
    requests.read_sizes,
    requests.write_sizes,
    files.read_parallelism,
    requests.read_interarrival,
    files.file_order,
    files.file_bytes,
    files.open_close,
    gauges.cpu,
    gauges.memory,
    gauges.network,
    phases.step_time,
    phases.load_time,
    phases.checkpoints,
)

#: Aspect names, in report order.
ASPECTS: tuple[str, ...] = tuple(a.name for a in REGISTERED)
BY_NAME: dict[str, Aspect] = {a.name: a for a in REGISTERED}

__all__ = ["ASPECTS", "BY_NAME", "REGISTERED", "Aspect", "AspectSpec", "Outcome"]
