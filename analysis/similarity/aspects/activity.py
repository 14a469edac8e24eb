"""Activity over time: read, write and block bandwidth (timing, volume, burstiness).

Each run's bytes per bin over its own span (:attr:`RunProfile.series`) are compared with
:func:`~analysis.similarity.measures.activity_similarity`: the mean of 1 - W1 on normalised time,
min/max of the total bytes and 1 - 2 W1 of the bins sorted busiest first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from analysis.similarity.aspects.base import (
    JITTER,
    SHIFT,
    SPEED,
    Outcome,
    SeriesPair,
    aspect,
    channel_pairs,
    lacking,
)
from analysis.similarity.measures import activity_similarity
from analysis.similarity.profile import RunProfile

ACTIVITY = "W1 time + volume + burstiness"

#: The device's traffic is judged against what the application asked for in its direction.
REFERENCES: Mapping[str, str] = {"block_read": "read", "block_write": "write"}


def activity_outcome(
    real: RunProfile, emulated: RunProfile, channels: Mapping[str, str]
) -> Outcome:
    """Score of I/O activity channels (label -> profile series name): the mean over the
    channels either run has of :func:`activity_similarity` (0 for a channel only one run has).

    A channel in :data:`REFERENCES` has its volume term on the scale of the larger of the two
    runs' totals of its reference (block reads are judged against the bytes read by syscalls: a
    few MiB of device reads in a run whose data is cached are noise, not a factor).

    The evidence gives, per channel, the three terms, then each run's total bytes and mean
    MiB/s.
    """
    present = channel_pairs(real, emulated, channels)
    if not present:
        return Outcome(None, {}, {}, f"neither run has {' or '.join(channels)} data")
    details: dict[str, Any] = {}
    scores = []
    plot_channels: dict[str, SeriesPair] = {}
    for label, (a, b) in present.items():
        slug = label.replace(" ", "_")
        if a is None or b is None:
            scores.append(0.0)
            details[f"{slug}_missing_in"] = lacking(a)
        else:
            key = channels[label]
            ref_key = REFERENCES.get(key)
            reference = (
                max(real.totals[f"{ref_key}_bytes"], emulated.totals[f"{ref_key}_bytes"])
                if ref_key
                else 0.0
            )
            score, terms = activity_similarity(
                a, b, real.totals[f"{key}_bytes"], emulated.totals[f"{key}_bytes"], reference
            )
            scores.append(score)
            prefix = f"{slug}_" if len(channels) > 1 else ""
            details.update({f"{prefix}{term}": value for term, value in terms.items()})
        plot_channels[label] = (a, b)
    for key in channels.values():
        for who, profile in (("real", real), ("emulated", emulated)):
            total = profile.totals.get(f"{key}_bytes", 0.0)
            details[f"{key}_bytes_{who}"] = total
            details[f"{key}_mib_s_{who}"] = total / 2**20 / max(profile.duration_s, 1e-9)
    plot = {"kind": "cumulative", "channels": plot_channels}
    return Outcome(float(np.mean(scores)), details, plot)


@aspect(
    "read_bandwidth",
    "read bandwidth",
    "syscall I/O",
    ACTIVITY,
    2.0,
    (SHIFT, SPEED, JITTER),
    ("when in the run bytes are read", "bytes read", "burstiness"),
)
def read_bandwidth(real: RunProfile, emulated: RunProfile) -> Outcome:
    return activity_outcome(real, emulated, {"read": "read"})


@aspect(
    "write_bandwidth",
    "write bandwidth",
    "syscall I/O",
    ACTIVITY,
    1.0,
    (SHIFT, SPEED, JITTER),
    ("when in the run bytes are written", "bytes written", "burstiness"),
)
def write_bandwidth(real: RunProfile, emulated: RunProfile) -> Outcome:
    return activity_outcome(real, emulated, {"write": "write"})


@aspect(
    "block_io",
    "block I/O issued by the container (read, write)",
    "block I/O",
    ACTIVITY,
    2.0,
    (SHIFT, SPEED, JITTER, "other processes' and kernel writeback requests"),
    ("when the device reads and writes", "bytes", "page-cache hits (cache state)"),
)
def block_io(real: RunProfile, emulated: RunProfile) -> Outcome:
    """Block requests the containers issued; the others' bytes are evidence only."""
    channels = {"block read": "block_read", "block write": "block_write"}
    outcome = activity_outcome(real, emulated, channels)
    skipped = outcome.skipped and "neither run has block I/O issued by the container"
    for kind in channels.values():
        for who, profile in (("real", real), ("emulated", emulated)):
            outcome.details[f"{kind}_not_container_bytes_{who}"] = profile.totals[
                f"{kind}_other_bytes"
            ]
    return outcome._replace(skipped=skipped or None)
