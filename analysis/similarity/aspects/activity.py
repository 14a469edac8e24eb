"""Activity over time: read, write and block bandwidth (timing, volume, burstiness).

Each run's bytes per bin over its own span (:attr:`RunProfile.series`) are compared with
:func:`~analysis.similarity.measures.activity_similarity`: the mean of 1 - W1 on normalised time,
min/max of the total bytes and 1 - 2 W1 of the bins sorted busiest first, times min/max of the
mean rates over the spans.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from analysis.similarity.aspects.base import (
    JITTER,
    SHIFT,
    SPEED,
    Aspect,
    Outcome,
    aspect,
    channels_outcome,
)
from analysis.similarity.measures import activity_similarity
from analysis.similarity.profile import RunProfile

ACTIVITY = "(W1 time + volume + burstiness) x rate"

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

    def score_pair(label: str, a: np.ndarray, b: np.ndarray) -> tuple[float, dict[str, Any]]:
        key = channels[label]
        ref_key = REFERENCES.get(key)
        reference = (
            max(real.totals[f"{ref_key}_bytes"], emulated.totals[f"{ref_key}_bytes"])
            if ref_key
            else 0.0
        )
        # The reference's rate: the larger of the two runs' syscall bytes per second of span.
        reference_rate = (
            max(
                real.series[ref_key].sum() / max(real.duration_s, 1e-9),
                emulated.series[ref_key].sum() / max(emulated.duration_s, 1e-9),
            )
            if ref_key and ref_key in real.series and ref_key in emulated.series
            else 0.0
        )
        score, terms = activity_similarity(
            a,
            b,
            real.totals[f"{key}_bytes"],
            emulated.totals[f"{key}_bytes"],
            reference,
            real.duration_s,
            emulated.duration_s,
            reference_rate,
        )
        prefix = f"{label.replace(' ', '_')}_" if len(channels) > 1 else ""
        return score, {f"{prefix}{term}": value for term, value in terms.items()}

    outcome = channels_outcome(real, emulated, channels, score_pair, {"kind": "cumulative"})
    if outcome.skipped:
        return outcome
    for key in channels.values():
        for who, profile in (("real", real), ("emulated", emulated)):
            total = profile.totals.get(f"{key}_bytes", 0.0)
            outcome.details[f"{key}_bytes_{who}"] = total
            outcome.details[f"{key}_mib_s_{who}"] = total / 2**20 / max(profile.duration_s, 1e-9)
    return outcome


def _bandwidth(direction: str, done: str, weight: float) -> Aspect:
    """The ``read_bandwidth`` or ``write_bandwidth`` aspect: syscall bytes per bin."""

    @aspect(
        f"{direction}_bandwidth",
        f"{direction} bandwidth",
        "syscall I/O",
        ACTIVITY,
        weight,
        (SHIFT, JITTER),
        (
            f"when in the run bytes are {done}",
            f"bytes {done}",
            f"bytes {done} per second ({SPEED})",
            "burstiness",
        ),
    )
    def bandwidth(real: RunProfile, emulated: RunProfile) -> Outcome:
        return activity_outcome(real, emulated, {direction: direction})

    return bandwidth


read_bandwidth = _bandwidth("read", "read", 2.0)
write_bandwidth = _bandwidth("write", "written", 1.0)


@aspect(
    "block_io",
    "block I/O issued by the container (read, write)",
    "block I/O",
    ACTIVITY,
    2.0,
    (SHIFT, JITTER, "other processes' and kernel writeback requests"),
    (
        "when the device reads and writes",
        "bytes",
        f"bytes per second ({SPEED})",
        "page-cache hits (cache state)",
    ),
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
