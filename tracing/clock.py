"""One time base across hosts: each agent's CLOCK_MONOTONIC offset to the coordinator's,
estimated the way NTP does (RFC 5905, section 8) from exchanges of four timestamps.

An exchange: the coordinator reads its clock (``t0``) and calls the agent's ``Clock``; the agent
reads its clock when the call arrives (``t1``) and when it answers (``t2``); the coordinator
reads its clock when the answer is back (``t3``). Then

- ``offset = ((t1 - t0) + (t2 - t3)) / 2``: the agent's clock minus the coordinator's, exact when
  the two legs take as long;
- ``delay = (t3 - t0) - (t2 - t1)``: the round trip spent on the wire;
- the true offset lies within ``delay / 2`` of ``offset`` whatever the legs' asymmetry (the
  call arrives after ``t0`` and the answer leaves before ``t3``): that half is the **bound**.

Several exchanges are made and the one with the smallest delay is kept (its bound is the
tightest). A host's time ``t`` becomes the coordinator's ``t - offset``. Measured before and
after a run, the two offsets give the **drift** (ppm) over the run.

Docker-free (the agent's image carries it): standard library only.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

#: Exchanges per estimate: the smallest round trip of eight is within a few microseconds of
#: the floor on a loaded loopback (tests/test_clock.py).
ROUNDS = 8
#: A bound above this after ROUNDS exchanges (on a busy host every round trip of eight can
#: wait for a CPU: a CI run saw 1.2 ms) asks for more exchanges, up to MAX_ROUNDS (a round
#: trip costs well under a millisecond: at most a few tens of ms more, only when needed).
TARGET_BOUND_NS = 500_000
MAX_ROUNDS = 64


@dataclasses.dataclass(frozen=True)
class Exchange:
    """Four timestamps (ns): coordinator sends, agent receives, agent answers, coordinator
    receives."""

    t0: int
    t1: int
    t2: int
    t3: int

    @property
    def offset_ns(self) -> float:
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) / 2

    @property
    def delay_ns(self) -> int:
        return (self.t3 - self.t0) - (self.t2 - self.t1)


@dataclasses.dataclass(frozen=True)
class ClockEstimate:
    """A host's clock minus the coordinator's (ns), within ``bound_ns``; at ``at_ns`` (the
    coordinator's clock, mid-exchange)."""

    offset_ns: int
    bound_ns: int
    at_ns: int
    rounds: int

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def estimate(exchanges: Sequence[Exchange]) -> ClockEstimate:
    """The offset of the exchange with the smallest delay, and half that delay as its bound."""
    if not exchanges:
        raise ValueError("no exchange to estimate a clock offset from")
    best = min(exchanges, key=lambda e: e.delay_ns)
    if best.delay_ns < 0:
        raise ValueError(f"an exchange went back in time: {best}")
    return ClockEstimate(
        offset_ns=round(best.offset_ns),
        bound_ns=math.ceil(best.delay_ns / 2) + 1,  # + rounding of the offset
        at_ns=(best.t0 + best.t3) // 2,
        rounds=len(exchanges),
    )


def measure(
    ask: Callable[[], tuple[int, int]],
    rounds: int = ROUNDS,
    clock: Callable[[], int] = time.monotonic_ns,
    target_ns: int = TARGET_BOUND_NS,
    max_rounds: int = MAX_ROUNDS,
) -> ClockEstimate:
    """``rounds`` exchanges through ``ask`` (one call to the agent, returning its ``t1, t2``),
    and more while the bound is above ``target_ns``, up to ``max_rounds`` in all."""
    exchanges: list[Exchange] = []
    while len(exchanges) < rounds or (
        len(exchanges) < max_rounds and estimate(exchanges).bound_ns > target_ns
    ):
        t0 = clock()
        t1, t2 = ask()
        t3 = clock()
        exchanges.append(Exchange(t0, t1, t2, t3))
    return estimate(exchanges)


def drift_ppm(before: ClockEstimate, after: ClockEstimate) -> tuple[float, float]:
    """How fast the host's clock ran against the coordinator's between two estimates (parts per
    million; positive: the host's runs fast), and the bound of that figure."""
    elapsed = after.at_ns - before.at_ns
    if elapsed <= 0:
        raise ValueError("the second estimate is not later than the first")
    drift = (after.offset_ns - before.offset_ns) / elapsed * 1e6
    return drift, (before.bound_ns + after.bound_ns) / elapsed * 1e6


def host_clock(before: ClockEstimate, after: ClockEstimate | None) -> dict[str, object]:
    """What a run's manifest records of one host's clock: the offset and bound to apply (the
    tighter estimate), and both estimates with the drift between them."""
    best = before if after is None or before.bound_ns <= after.bound_ns else after
    record: dict[str, object] = {
        "offset_ns": best.offset_ns,
        "bound_ns": best.bound_ns,
        "before": before.to_json(),
        "after": after.to_json() if after else None,
        "drift_ppm": None,
        "drift_bound_ppm": None,
    }
    if after is not None and after.at_ns > before.at_ns:
        drift, bound = drift_ppm(before, after)
        record["drift_ppm"] = round(drift, 3)
        record["drift_bound_ppm"] = round(bound, 3)
    return record
